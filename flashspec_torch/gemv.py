"""Fused skinny products for decode: y = x w^T for M <= 8 rows, optionally with the layer's
elementwise prologue (add + RMSNorm, or SwiGLU) fused into the product, so a layer is 6 launches
instead of 9-10. Each wrapper has its plain torch ``*_reference`` beside it; the kernel
(``flashspec_torch/kernels/gemv.py``) rounds to the activation dtype at the same places.

Tilings: ``gemv_config(n, k, m, prologue)`` returns ``GEMV_CONFIGS[(n, k, m, prologue)]`` if the
caller (benchmarks/gemv_sweep.py's winners) put one there, else a default. A row's bits do not
depend on M for configs with the same block_k (the defaults' block_k depends on K only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .layers import add_rms_norm_reference, pdl_on, silu_mul_reference
from .device import interpreting, next_pow2

MAX_ROWS = 8
PROLOGUES = ("none", "add_rms_norm", "silu_mul")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def kernels():
    from .kernels import gemv

    return gemv


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8  # output columns (rows of w) per program
    block_k: int = 512  # K chunk per loop step
    num_warps: int = 4
    num_stages: int = 1
    # K chunks of each program's weight slice loaded up front (before the PDL wait), clamped to the
    # chunks there are; None: default_preload (preload * block_n * block_k * 2 bytes <= 16 KB)
    preload: int | None = None

    def __post_init__(self):
        if not (1 <= self.block_n <= 256 and self.block_n & (self.block_n - 1) == 0):
            raise ValueError(f"{self.block_n=} must be a power of two in [1, 256]")
        if not (16 <= self.block_k <= 4096 and self.block_k & (self.block_k - 1) == 0):
            raise ValueError(f"{self.block_k=} must be a power of two in [16, 4096]")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self.num_warps=} must be one of 1, 2, 4, 8, 16")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"{self.num_stages=} must be in [1, 8]")
        if self.preload is None:
            object.__setattr__(self, "preload", default_preload(self.block_n, self.block_k, self.num_warps))
        if not (isinstance(self.preload, int) and 1 <= self.preload <= MAX_PRELOAD):
            raise ValueError(f"{self.preload=} must be in [1, {MAX_PRELOAD}]")
        if self.preload > 1 and self.preload * self.block_n * self.block_k * 2 > PRELOAD_BYTES_PER_WARP * self.num_warps:
            raise ValueError(f"{self.preload=} x block_n {self.block_n} x block_k {self.block_k} x 2 bytes exceeds "
                             f"{PRELOAD_BYTES_PER_WARP // 1024} KB per warp x {self.num_warps} warps (registers)")


MAX_PRELOAD = 16
PRELOAD_BYTES_PER_WARP = 16 << 10  # bf16 bytes of preloaded weights: 128 registers per thread at most


def default_preload(block_n: int, block_k: int, num_warps: int) -> int:
    """The most chunks (<= 4) whose bf16 tiles fit in 16 KB per program (4 KB per warp below 4 warps).
    ptxas for sm_90, 4 warps, bf16, 1 row, block_n 8: 116 registers with 1 chunk of 512 preloaded,
    152 with 2 (16 KB), 168 with 4 (32 KB); 8 rows, block_n 1, K 5632: 4 chunks spill, 2 do not."""
    budget = min(16 << 10, (4 << 10) * num_warps)
    return max(1, min(4, budget // (2 * block_n * block_k)))


# (n, k, m, prologue) -> GemvConfig: tilings measured on the target GPU, the defaults elsewhere.
# Shipped: the H200 winners for TinyLlama-1.1B's projections at 1 row (benchmarks/gemv_sweep.py,
# benchmarks/results/gemv_sweep.json, 2026-12-01). A row's bits equal those of another row count
# only at the same block_k (the head's 256 is not the default 512).
GEMV_CONFIGS: dict[tuple[int, int, int, str], GemvConfig] = {
    (2560, 2048, 1, "add_rms_norm"): GemvConfig(block_n=4, block_k=512, num_warps=4, preload=1),
    (2048, 2048, 1, "none"): GemvConfig(block_n=4, block_k=512, num_warps=4, preload=2),
    (11264, 2048, 1, "add_rms_norm"): GemvConfig(block_n=4, block_k=512, num_warps=4, preload=2),
    (2048, 5632, 1, "silu_mul"): GemvConfig(block_n=4, block_k=512, num_warps=8, preload=2),
    (32000, 2048, 1, "add_rms_norm"): GemvConfig(block_n=16, block_k=256, num_warps=8, preload=4),
}


def default_block_k(k: int) -> int:
    """The largest chunk in {512, 256, 128, 64} that wastes <= 1/8 of the last chunk's loads."""
    for bk in (512, 256, 128, 64):
        if bk <= next_pow2(k) and -(-k // bk) * bk - k <= k // 8:
            return bk
    return min(64, next_pow2(max(k, 16)))


def gemv_config(n: int, k: int, m: int, prologue: str = "none") -> GemvConfig:
    if (n, k, m, prologue) in GEMV_CONFIGS:
        return GEMV_CONFIGS[(n, k, m, prologue)]
    block_k = default_block_k(k)
    block_m = next_pow2(m)
    block_n = max(1, min(8, 4096 // (block_m * block_k)))  # ~32 float32 accumulators per thread at 4 warps
    preload = default_preload(block_n, block_k, 4)
    if block_m > 2:  # the [BM, BK] activations take registers too (8 rows, block_n 1: 4 chunks spill)
        preload = min(2, preload)
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=1, preload=preload)


def fits(m: int, x: torch.Tensor) -> bool:
    """Whether the fused product serves this many rows of this activation."""
    return m <= MAX_ROWS and x.dtype in DTYPES and (x.is_cuda or interpreting())


# ----------------------------------------------------------------------------- references


def gemv_reference(x, w):  # x [..., K]; w [N, K] -> [..., N]
    return F.linear(x, w)


def gemv_add_rms_norm_reference(h, d, g, eps: float, w):  # h, d [..., K] (d may be None); g [K]; w [N, K]
    hn, x = add_rms_norm_reference(h, d, g, eps)
    return F.linear(x, w), hn


def gemv_silu_mul_reference(gu, w):  # gu [..., 2K]; w [N, K] -> [..., N]
    return F.linear(silu_mul_reference(gu), w)


# ----------------------------------------------------------------------------- kernels


def gemv(
    x: torch.Tensor,  # [..., K], at most 8 rows
    w: torch.Tensor,  # [N, K]
    config: GemvConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = x w^T
    k = x.shape[-1]
    check(x, "x", w, k)
    x2 = x.reshape(-1, k).contiguous()
    y = launch("none", x2, None, None, w, None, 0.0, config, pdl)
    return y.reshape(*x.shape[:-1], w.shape[0])


def gemv_add_rms_norm(
    h: torch.Tensor,  # [..., K]: the residual stream (read only)
    d: torch.Tensor | None,  # [..., K]: what the last sub-layer adds to it, or None
    g: torch.Tensor,  # [K]: the norm weight
    eps: float,
    w: torch.Tensor,  # [N, K]
    config: GemvConfig | None = None,
    pdl: bool = False,
    h_out: torch.Tensor | None = None,  # [..., K]: where hn goes (not h itself); None: a new tensor
) -> tuple[torch.Tensor, torch.Tensor]:  # (rms_norm(h + d) * g @ w^T [..., N], h + d [..., K])
    k = h.shape[-1]
    check(h, "h", w, k)
    check_norm(h, d, g)
    h2 = h.reshape(-1, k).contiguous()
    d2 = None if d is None else d.reshape(-1, k).contiguous()
    hn = h
    if d is not None:
        if h_out is None:
            h_out = torch.empty_like(h)
        if h_out.shape != h.shape or h_out.dtype != h.dtype or not h_out.is_contiguous():
            raise ValueError(f"h_out {tuple(h_out.shape)} {h_out.dtype} must be a contiguous tensor like h")
        if h_out.data_ptr() in (h.data_ptr(), d.data_ptr()):
            raise ValueError("h_out must not be h or d: other programs still read them")
        hn = h_out
    y = launch("add_rms_norm", h2, d2, g.contiguous(), w, None if d is None else hn, eps, config, pdl)
    return y.reshape(*h.shape[:-1], w.shape[0]), hn


def gemv_silu_mul(
    gu: torch.Tensor,  # [..., 2K]: gate then up (the fused gate_up projection)
    w: torch.Tensor,  # [N, K]
    config: GemvConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = (silu(gate) * up) w^T
    k2 = gu.shape[-1]
    if k2 % 2:
        raise ValueError(f"gu's last dimension {k2} must be even (gate then up)")
    check(gu, "gu", w, k2 // 2)
    y = launch("silu_mul", gu.reshape(-1, k2).contiguous(), None, None, w, None, 0.0, config, pdl)
    return y.reshape(*gu.shape[:-1], w.shape[0])


def check_norm(h: torch.Tensor, d: torch.Tensor | None, g: torch.Tensor) -> None:  # the add + RMSNorm prologue's operands
    k = h.shape[-1]
    if d is not None and (d.shape != h.shape or d.dtype != h.dtype):
        raise ValueError(f"d {tuple(d.shape)} {d.dtype} must match h {tuple(h.shape)} {h.dtype}")
    if g.shape != (k,) or g.dtype != h.dtype:
        raise ValueError(f"g {tuple(g.shape)} {g.dtype} must be [{k}] of h's dtype {h.dtype}")


def check(x: torch.Tensor, name: str, w: torch.Tensor, k: int, max_rows: int | None = MAX_ROWS) -> None:
    """The product's operands; ``max_rows`` None: any number of rows (the batch-invariant product)."""
    if x.dtype not in DTYPES:
        raise ValueError(f"{name}.dtype={x.dtype} must be one of {DTYPES}")
    if w.dtype != x.dtype:
        raise ValueError(f"w.dtype={w.dtype} must equal {name}.dtype={x.dtype}")
    if w.dim() != 2 or w.shape[1] != k or not w.is_contiguous():
        raise ValueError(f"w {tuple(w.shape)} must be a contiguous [N, {k}] (nn.Linear) weight for {name} {tuple(x.shape)}")
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"{name} {tuple(x.shape)} must have at least one row")
    m = x.numel() // x.shape[-1]
    if max_rows is not None and m > max_rows:
        raise ValueError(f"{name} has {m} rows; the fused product takes at most {max_rows} (use F.linear)")
    if x.device != w.device:
        raise ValueError(f"w is on {w.device}, {name} on {x.device}")
    if not x.is_cuda and not interpreting():
        raise RuntimeError("the fused product on the CPU needs TRITON_INTERPRET=1 set before flashspec_torch is imported")


def launch(prologue: str, x, d, g, w, h_out, eps: float, config: GemvConfig | None, pdl: bool) -> torch.Tensor:
    """x [M, K] (gu [M, 2K] for silu_mul); d, h_out [M, K] or None; g [K] or None; w [N, K] -> y [M, N]."""
    m, (n, k) = x.shape[0], w.shape
    if config is None:
        config = gemv_config(n, k, m, prologue)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    use_pdl = pdl_on(pdl, x)
    kernels().gemv_kernel[(-(-n // config.block_n),)](
        x, x if d is None else d, x if g is None else g, w, y, x if h_out is None else h_out,
        m, n, k, eps,
        PROLOGUE=PROLOGUES.index(prologue), HAS_D=d is not None, BLOCK_M=next_pow2(m), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        USE_PDL=use_pdl, PRELOAD=min(config.preload, -(-k // config.block_k)), num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=use_pdl,
    )
    return y
