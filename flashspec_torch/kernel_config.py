"""``KernelConfig``: the tiling of the Triton verify kernels (``flashspec_torch/kernels/verify.py``), with the
checks of each field, and ``choose_config``, the one picked per shape (docs/kernel_notes.md says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .device import device_sms, interpreting, next_pow2


@dataclass(frozen=True)
class KernelConfig:
    """Tiling of the verify kernels: one fused launch if ``num_chunks`` is 1, else a stats launch and a final
    launch (kernels/verify.py)."""

    block_b: int = 1  # batch rows per program
    block_v: int = 1024  # vocabulary entries per row per step of the normaliser pass
    sweep_v: int = 4096  # vocabulary entries per step of the row-n sweep
    num_chunks: int = 1  # programs per batch row along V; 1: the single fused launch
    num_warps: int = 4
    prune: bool = True  # the row-n sweep skips the keys of logits that cannot win (exact)
    sweep_slots: int = 0  # prune: votes per sweep tile, one per slot of sweep_v / S logits (kernels/slots.py); 0: one
    pdl: bool = False  # two launches on Hopper+: the final launch starts during the stats launch's tail (PDL)
    sweep_chunks: int = 0  # two launches: programs per batch row of the sweep of row n; 0: num_chunks
    sweep_warps: int = 0  # two launches: warps of the final launch; 0: num_warps
    bf16_pairs: bool = False  # the slot-vote sweep, bfloat16 rows of unit stride: read as int32 pairs

    def __post_init__(self):
        for name in ("block_b", "block_v", "sweep_v"):
            val = getattr(self, name)
            if not (isinstance(val, int) and val >= 1 and val & (val - 1) == 0):
                raise ValueError(f"{name}={val!r} must be a power of two >= 1")
        if self.block_v < 16 or self.sweep_v < 16:
            raise ValueError(f"{self.block_v=} and {self.sweep_v=} must be >= 16")
        if not (isinstance(self.num_chunks, int) and self.num_chunks >= 1):
            raise ValueError(f"{self.num_chunks=} must be an int >= 1")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self.num_warps=} must be one of 1, 2, 4, 8, 16")
        if self.sweep_slots not in (0, 1, 2, 4, 8, 16) or self.sweep_v % max(1, self.sweep_slots):
            raise ValueError(f"{self.sweep_slots=} must be 0 (one vote per tile) or one of 1, 2, 4, 8, 16 dividing "
                             f"{self.sweep_v=}")
        if not (isinstance(self.sweep_chunks, int) and self.sweep_chunks >= 0):
            raise ValueError(f"{self.sweep_chunks=} must be an int >= 0 (0: as num_chunks)")
        if self.sweep_warps not in (0, 1, 2, 4, 8, 16):
            raise ValueError(f"{self.sweep_warps=} must be 0 (num_warps) or one of 1, 2, 4, 8, 16")
        for name in ("prune", "pdl", "bf16_pairs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")


def choose_config(batch: int, gamma: int, vocab: int, device: torch.device, itemsize: int = 2) -> KernelConfig:
    """The tiling for a shape. Interpreter: few, large programs and the fused launch. GPU: V split over
    programs until ~16 programs per SM (B < 32), ~8 (B < 128) or ~4 (B >= 128), 8 KB per program per step of
    the normaliser pass; PDL; the sweep pruned by the slot vote (4 slots) from B = 32 or ~8 sweep tiles per
    program, else not pruned; from B = 128 the sweep split 8x finer into one-warp programs of 256 logits per
    tile, reading bfloat16 rows as int32 pairs. docs/kernel_notes.md has the measurements behind each rule."""
    rows = next_pow2(gamma + 1)
    if device.type != "cuda" or interpreting():  # the interpreter: few, large programs
        block_v = max(16, min(next_pow2(vocab), 4096 // rows))
        block_b = min(next_pow2(batch), max(1, 2**18 // (rows * block_v)))
        return KernelConfig(block_b=block_b, block_v=block_v, sweep_v=max(16, min(next_pow2(vocab), 4096)))
    per_sm = 16 if batch < 32 else 8 if batch < 128 else 4
    target_programs = per_sm * device_sms(device)
    wanted = min(math.ceil(target_programs / batch), 128 if batch < 8 else 32 if batch < 32 else 16)
    block_v = min(8192 // itemsize, max(256, next_pow2(math.ceil(vocab / wanted))))
    chunks = min(math.ceil(vocab / block_v), wanted)
    tiles = vocab / chunks / 1024  # sweep tiles per program
    prune = tiles >= 7.5 or batch >= 32
    config = KernelConfig(block_b=1, block_v=block_v, sweep_v=1024, num_chunks=chunks, num_warps=4, prune=prune,
                          sweep_slots=4 if prune else 0, pdl=True)
    if batch >= 128:
        config = replace(config, sweep_chunks=8 * chunks, sweep_warps=1, sweep_v=256, bf16_pairs=True)
    return config
