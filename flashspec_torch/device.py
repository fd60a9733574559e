"""Device helpers shared by the Triton kernels' launchers (verify, model layers, GEMV, decode steps):
the interpreter switch, powers of two, a GPU's SM count and its programmatic dependent launch (PDL)."""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:  # the Triton interpreter (TRITON_INTERPRET=1): kernels run on the CPU
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(k: int) -> int:
    return 1 << max(0, k - 1).bit_length()


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def has_pdl(device_index: int) -> bool:  # programmatic dependent launch: compute capability 9.0 or newer
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def cuda_index(device: torch.device) -> int:  # a CUDA device's index ("cuda" alone: the current one)
    return device.index if device.index is not None else torch.cuda.current_device()


def pdl_possible(device: torch.device) -> bool:  # never in the interpreter
    if device.type != "cuda" or interpreting():
        return False
    return has_pdl(cuda_index(device))


def device_sms(device: torch.device) -> int:  # SMs of a GPU; 1 in the interpreter (its grids are small)
    if device.type != "cuda" or interpreting():
        return 1
    return sm_count(cuda_index(device))
