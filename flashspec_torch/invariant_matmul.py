"""The batch-invariant product: y = x w^T for any number of rows with a row's bits independent of
how many rows are computed with it and of what they hold (``Engine(batch_invariant=True)`` runs
every product of the target by it). Kernel in ``flashspec_torch/kernels/invariant_matmul.py``; the
entries below take the prologues of ``flashspec_torch.gemv`` (add + RMSNorm, SwiGLU) and round at
the same places, so ``flashspec_torch.gemv``'s ``*_reference`` functions are their references
(re-exported here as ``*_reference``), and its argument checks are theirs.

The tiling (``invariant_tiling``) depends on N, K and the dtype, never on M: 16 rows per program,
no split-K, one K chunk size (``INVARIANT_CONFIGS`` holds measured ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .device import interpreting
from .gemv import PROLOGUES, check, check_norm, gemv_add_rms_norm_reference, gemv_reference, gemv_silu_mul_reference
from .layers import pdl_on

invariant_matmul_reference = gemv_reference  # x [..., K]; w [N, K] -> [..., N]
invariant_matmul_add_rms_norm_reference = gemv_add_rms_norm_reference
invariant_matmul_silu_mul_reference = gemv_silu_mul_reference


def kernels():
    from .kernels import invariant_matmul

    return invariant_matmul


@dataclass(frozen=True)
class InvariantTiling:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3  # software pipelining of the loads; the sum order is the chunk order whatever it is


BLOCK_M = 16  # tl.dot's least M: a decode row pays 16 rows of arithmetic but reads the weights once

# (n, k, dtype) -> InvariantTiling: tilings measured on the target GPU (benchmarks/invariant_tune_gpu.py
# writes this table as its "configs"), the default below elsewhere. Empty until that script has run on an H100.
INVARIANT_CONFIGS: dict[tuple[int, int, torch.dtype], InvariantTiling] = {}


def invariant_tiling(n: int, k: int, dtype: torch.dtype) -> InvariantTiling:
    """A function of (N, K, dtype) only, so that it is the same for every M: ``INVARIANT_CONFIGS``'s
    entry, else wider N tiles for wide products (the LM head) so that the grid stays a few hundred
    programs, K chunks of 128 (64 in float32, whose tiles take twice the registers)."""
    if (n, k, dtype) in INVARIANT_CONFIGS:
        return INVARIANT_CONFIGS[(n, k, dtype)]
    block_n = 64 if n >= 16384 else 32 if n >= 8192 else 16
    return InvariantTiling(BLOCK_M, block_n, 64 if dtype == torch.float32 else 128)


def invariant_matmul(
    x: torch.Tensor,  # [..., K], any number of rows
    w: torch.Tensor,  # [N, K]
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = x w^T
    k = x.shape[-1]
    check(x, "x", w, k, max_rows=None)
    y = launch("none", x.reshape(-1, k).contiguous(), None, None, w, None, 0.0, pdl)
    return y.reshape(*x.shape[:-1], w.shape[0])


def invariant_matmul_add_rms_norm(
    h: torch.Tensor,  # [..., K]: the residual stream (read only)
    d: torch.Tensor | None,  # [..., K]: what the last sub-layer adds to it, or None
    g: torch.Tensor,  # [K]: the norm weight
    eps: float,
    w: torch.Tensor,  # [N, K]
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (rms_norm(h + d) * g @ w^T [..., N], h + d [..., K])
    k = h.shape[-1]
    check(h, "h", w, k, max_rows=None)
    check_norm(h, d, g)
    hn = h if d is None else torch.empty_like(h)
    d2 = None if d is None else d.reshape(-1, k).contiguous()
    y = launch("add_rms_norm", h.reshape(-1, k).contiguous(), d2, g.contiguous(), w, None if d is None else hn, eps, pdl)
    return y.reshape(*h.shape[:-1], w.shape[0]), hn


def invariant_matmul_silu_mul(
    gu: torch.Tensor,  # [..., 2K]: gate then up (the fused gate_up projection)
    w: torch.Tensor,  # [N, K]
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = (silu(gate) * up) w^T
    k2 = gu.shape[-1]
    if k2 % 2:
        raise ValueError(f"gu's last dimension {k2} must be even (gate then up)")
    check(gu, "gu", w, k2 // 2, max_rows=None)
    y = launch("silu_mul", gu.reshape(-1, k2).contiguous(), None, None, w, None, 0.0, pdl)
    return y.reshape(*gu.shape[:-1], w.shape[0])


def launch(prologue: str, x, d, g, w, h_out, eps: float, pdl: bool, tiling: InvariantTiling | None = None) -> torch.Tensor:
    """x [M, K] (gu [M, 2K] for silu_mul); d, h_out [M, K] or None; g [K] or None; w [N, K] -> y [M, N].
    ``tiling`` None: ``invariant_tiling`` (the engine); given: that one (benchmarks/invariant_tune_gpu.py)."""
    m, (n, k) = x.shape[0], w.shape
    t = invariant_tiling(n, k, x.dtype) if tiling is None else tiling
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    use_pdl = pdl_on(pdl, x)
    kernels().invariant_matmul_kernel[(-(-m // t.block_m), -(-n // t.block_n))](
        x, x if d is None else d, x if g is None else g, w, y, x if h_out is None else h_out,
        m, n, k, eps,
        PROLOGUE=PROLOGUES.index(prologue), HAS_D=d is not None, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        BLOCK_K=t.block_k, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", USE_DOT=not interpreting(),
        USE_PDL=use_pdl, num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=use_pdl,
    )
    return y
