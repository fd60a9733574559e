"""Plain decoding's sampled pick (T > 0): the fault screen, then one Gumbel-max draw from the target's
filtered distribution on the FINAL stream at position 0, per row.

``sample_next_reference`` is the torch version (``faults.screen`` then ``sampling.sample``: some thirty
[B, V] ops); ``sample_next_triton`` is the same as one kernel launch (``kernels/sample.py``), with the
top-k / top-p cut as one threshold per row computed in torch beforehand (``verify.filter_thresholds``,
as the verify kernels take it). Both return what ``commit`` takes: nothing accepted, one token emitted.
"""

from __future__ import annotations

import numpy as np
import torch

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult
from flashspec.random import FINAL

from .device import next_pow2
from .faults import screen
from .sampling import sample
from .verify import counter_args, filter_thresholds, load_kernels

LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def next_token_result(y: torch.Tensor) -> VerifyResult:  # y [B] int -> num_accepted [B] zeros, tokens [B, 2] (y, -1)
    """A plain decoding step as ``commit`` takes it: nothing accepted, one token emitted."""
    tokens = torch.stack([y, torch.full_like(y, -1)], 1).to(torch.int32)
    return VerifyResult(torch.zeros_like(tokens[:, 0]), tokens)


def sample_next_reference(
    z: torch.Tensor,  # [B, V] float logits
    cfg: SamplingConfig,  # T > 0
    seed,  # int or [B] int64 tensor (per-row seeds)
    offset,  # int or [] / [B] int64 tensor
    bad: torch.Tensor,  # [B] uint8, written: flashspec.faults bits of this step
) -> VerifyResult:  # num_accepted [B] zeros; tokens [B, 2] int32: (draw, -1)
    screen(bad, z[:, None])
    return next_token_result(sample(z, cfg, seed, offset, position=0, stream=FINAL)[0])


def check_sample_next(z: torch.Tensor, cfg: SamplingConfig, seed, offset) -> None:
    """What the kernel covers; anything else is refused (use ``sample_next_reference``)."""
    if cfg.greedy:
        raise ValueError("sample_next_triton: temperature=0 is greedy decoding; use greedy_next_triton")
    if z.dim() != 2 or z.dtype not in LOGIT_DTYPES or z.stride(-1) != 1:
        raise ValueError(f"sample_next_triton: z must be [B, V] float32/float16/bfloat16 with unit stride along V, "
                         f"got shape {tuple(z.shape)} {z.dtype} strides {z.stride()}")
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, torch.Tensor) and not (value.ndim == 0 or value.shape == (z.shape[0],)):
            raise ValueError(f"sample_next_triton: {name} must be an int or an int64 tensor [] or [B={z.shape[0]}], "
                             f"got shape {tuple(value.shape)}")


def sample_next_triton(z: torch.Tensor, cfg: SamplingConfig, seed, offset, bad: torch.Tensor) -> VerifyResult:
    """``sample_next_reference`` as one kernel launch (two more torch ops per row for a top-k / top-p cut)."""
    from flashspec.faults import TARGET_LOGITS

    check_sample_next(z, cfg, seed, offset)
    load_kernels(z.device)  # on the CPU only with the interpreter (a clear error otherwise)
    from .kernels.sample import sample_next_kernel

    b, v = z.shape
    filtered = cfg.filtered
    thr, tid = (t[:, 0] for t in filter_thresholds(z[:, None], cfg)) if filtered else (z, z)
    s_ptr, s_lo, s_stride = counter_args(seed, b)
    o_ptr, o_lo, o_stride = counter_args(offset, b)
    seed_hi = (seed >> 32) & 0xFFFFFFFF if isinstance(seed, int) else 0
    seed_hi = seed_hi - 2**32 if seed_hi >= 2**31 else seed_hi
    tokens = torch.empty((b, 2), dtype=torch.int32, device=z.device)
    num = torch.empty((b,), dtype=torch.int32, device=z.device)
    block = min(4096, next_pow2(v)) if z.is_cuda else min(1024, next_pow2(v))
    sample_next_kernel[(b,)](
        z, thr, tid, z if s_ptr is None else s_ptr, z if o_ptr is None else o_ptr, s_lo, seed_hi, o_lo,
        s_stride, o_stride, tokens, num, bad, v, z.stride(0), float(np.float32(cfg.temperature)),
        FILTER=filtered, SEED_TENSOR=s_ptr is not None, OFFSET_TENSOR=o_ptr is not None,
        PER_ROW_SEED=isinstance(seed, torch.Tensor) and seed.ndim == 1, FLAG=TARGET_LOGITS, BLOCK_V=block,
        num_warps=8 if block >= 2048 else 4)
    return VerifyResult(num, tokens)
