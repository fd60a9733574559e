"""The batch-invariant product: y = x w^T for any number of rows with a row's bits independent of
how many rows are computed with it and of what they hold (``Engine(batch_invariant=True)`` runs
every product of the target by it). Kernel in ``flashspec_torch/kernels/invariant_matmul.py``; the
entries below take the prologues of ``flashspec_torch.gemv`` (add + RMSNorm, SwiGLU) and its argument
checks; the plain and SwiGLU products round at gemv's places (its ``*_reference`` functions,
re-exported here as ``*_reference``, are theirs).

The tiling (``invariant_tiling``) depends on N, K and the dtype, never on M: 16 rows per program,
one K chunk size, and a fixed split of K into slices whose float32 partial sums are added in slice
order. The add + RMSNorm product applies the row's 1 / rms to the float32 sum (its reference,
``invariant_matmul_add_rms_norm_reference``, rounds at the same places).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .device import interpreting
from .gemv import PROLOGUES, check, check_norm, gemv_reference, gemv_silu_mul_reference
from .layers import pdl_on

invariant_matmul_reference = gemv_reference  # x [..., K]; w [N, K] -> [..., N]
invariant_matmul_silu_mul_reference = gemv_silu_mul_reference


def invariant_matmul_add_rms_norm_reference(h, d, g, eps: float, w):  # h, d [..., K] (d may be None); g [K]; w [N, K]
    """(round(rsqrt(mean(hn^2) + eps) * (round(hn * g) w^T)), hn) with hn = round(h + d): RMSNorm's scale
    applied after the product, in float32, as the kernel does."""
    hn = h if d is None else h + d
    hf = hn.float()
    x = (hf * g.float()).to(h.dtype).float()
    return (torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * F.linear(x, w.float())).to(h.dtype), hn


def kernels():
    from .kernels import invariant_matmul

    return invariant_matmul


@dataclass(frozen=True)
class InvariantTiling:
    block_m: int
    block_n: int
    block_k: int
    chunks: int  # K chunks per split: K is cut into cdiv(cdiv(K, block_k), chunks) slices, added in order
    preload: int  # weight chunks of a slice loaded before the PDL wait, 1 <= preload <= chunks
    num_warps: int = 4
    num_stages: int = 2  # software pipelining of the loads; the sum order is the chunk order whatever it is
    row_tiles: int = 4  # row tiles of block_m per program at most (1-4): each weight chunk is loaded once for them

    def splits(self, k: int) -> int:
        return -(-(-(-k // self.block_k)) // self.chunks)


BLOCK_M = 16  # tl.dot's least M: a decode row pays 16 rows of arithmetic but reads the weights once
ROW_TILES = 4  # a program computes up to 4 row tiles (64 rows) per weight chunk it loads
TARGET_PROGRAMS = 1024  # programs per launch at M <= 16: ~8 per SM of an H100 (132 SMs)
MAX_SPLIT_COLUMNS = 65536  # splits x N at most: the float32 partials of a row stay <= 256 KB


def invariant_tiling(n: int, k: int, dtype: torch.dtype) -> InvariantTiling:
    """A function of (N, K, dtype) only, so that it is the same for every M: wider N tiles for wide
    products (the LM head), K chunks of 128 (64 in float32, whose tiles take twice the registers), and
    a split of K into slices of 8, 4, 2 or 1 chunks, the longest that still gives ~``TARGET_PROGRAMS``
    programs at M <= 16, lengthened while the partials would exceed ``MAX_SPLIT_COLUMNS``."""
    block_n = 64 if n >= 16384 else 32 if n >= 8192 else 16
    block_k = 64 if dtype == torch.float32 else 128
    tiles, chunks_k = -(-n // block_n), -(-k // block_k)
    chunks = 8
    while chunks > 1 and tiles * -(-chunks_k // chunks) < TARGET_PROGRAMS:
        chunks //= 2
    while -(-chunks_k // chunks) > 1 and -(-chunks_k // chunks) * n > MAX_SPLIT_COLUMNS:
        chunks *= 2
    chunks = min(chunks, chunks_k)
    return InvariantTiling(BLOCK_M, block_n, block_k, chunks, min(chunks, max(1, 32 // block_n)), row_tiles=ROW_TILES)


def invariant_matmul(
    x: torch.Tensor,  # [..., K], any number of rows
    w: torch.Tensor,  # [N, K]
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = x w^T
    k = x.shape[-1]
    check(x, "x", w, k, max_rows=None)
    y = launch_plain(x.reshape(-1, k).contiguous(), w, pdl)
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


def launch_plain(x, w, pdl: bool, tiling: InvariantTiling | None = None) -> torch.Tensor:
    """x [M, K]; w [N, K] -> y [M, N] by ``invariant_matmul_kernel``: a program computes up to
    ``row_tiles`` row tiles of one column tile and one K slice, each weight chunk loaded once for all of
    them (a row's bits are those of its row tile alone: the same chunk order, slices and sum order).
    ``tiling`` None: ``invariant_tiling`` (the engine); given: that one (benchmarks, tests)."""
    m, (n, k) = x.shape[0], w.shape
    t = invariant_tiling(n, k, x.dtype) if tiling is None else tiling
    row_tiles = min(t.row_tiles, -(-m // t.block_m))  # fewer when M is small: no program computes an empty tile
    rows_per_program = row_tiles * t.block_m
    splits, grid = t.splits(k), (-(-m // rows_per_program), -(-n // t.block_n))
    rows = COUNTERS // grid[1] * rows_per_program  # the most rows one launch's counters cover
    if splits > 1 and m > rows:  # pieces of whole row groups: a row's bits do not depend on its launch
        return torch.cat([launch_plain(x[i : i + rows], w, pdl, t) for i in range(0, m, rows)])
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    part = count = y
    if splits > 1:
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        count = counters(x.device, grid[0] * grid[1])
    use_pdl = pdl_on(pdl, x)
    kernels().invariant_matmul_kernel[(*grid, splits)](
        x, w, y, part, count, m, n, k,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, CHUNKS=t.chunks, SPLITS=splits, PRELOAD=t.preload,
        ROW_TILES=row_tiles, PRECISION="ieee" if x.dtype == torch.float32 else "tf32", USE_DOT=not interpreting(),
        USE_PDL=use_pdl, num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=use_pdl,
    )
    return y


def launch(prologue: str, x, d, g, w, h_out, eps: float, pdl: bool, tiling: InvariantTiling | None = None) -> torch.Tensor:
    """x [M, K] (gu [M, 2K] for silu_mul); d, h_out [M, K] or None; g [K] or None; w [N, K] -> y [M, N].
    ``tiling`` None: ``invariant_tiling`` (the engine); given: that one (benchmarks)."""
    m, (n, k) = x.shape[0], w.shape
    t = invariant_tiling(n, k, x.dtype) if tiling is None else tiling
    splits, grid = t.splits(k), (-(-m // t.block_m), -(-n // t.block_n))
    rows = COUNTERS // grid[1] * t.block_m  # the most rows one launch's counters cover
    if splits > 1 and m > rows:  # pieces of whole row tiles: a row's bits do not depend on its launch
        cut = lambda a, i: None if a is None else a.view(m, -1)[i : i + rows]  # noqa: E731
        return torch.cat([launch(prologue, x[i : i + rows], cut(d, i), g, w, cut(h_out, i), eps, pdl, t) for i in range(0, m, rows)])
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    part = sq = count = y
    if splits > 1:
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        sq = torch.empty((grid[1], splits, m), dtype=torch.float32, device=x.device)
        count = counters(x.device, grid[0] * grid[1])
    use_pdl = pdl_on(pdl, x)
    kernels().invariant_matmul_prologue_kernel[(*grid, splits)](
        x, x if d is None else d, x if g is None else g, w, y, x if h_out is None else h_out, part, sq, count,
        m, n, k, eps,
        PROLOGUE=PROLOGUES.index(prologue), HAS_D=d is not None, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
        BLOCK_K=t.block_k, CHUNKS=t.chunks, SPLITS=splits, PRELOAD=t.preload,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", USE_DOT=not interpreting(),
        USE_PDL=use_pdl, num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=use_pdl,
    )
    return y


COUNTERS = 1 << 20  # tiles per launch at most (4 MB): 2978 row tiles (M 47648) of TinyLlama's gate_up (352 column tiles)
_counters: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The split product's per-tile counters on ``device`` ([COUNTERS] int32, zero between launches: the
    program that adds a tile's partials resets its counter). Made at the first launch on the device
    (an eager one: the engine warms up before it captures a CUDA graph) and shared by every launch,
    which run one after another on one stream."""
    assert tiles <= COUNTERS, tiles  # launch cuts larger grids into pieces
    if device not in _counters:
        _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[device]
