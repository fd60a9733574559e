"""The batch-invariant product (``@triton.jit`` code only; wrappers in ``flashspec_torch.invariant_matmul``).

``invariant_matmul_kernel``: y = x w^T for any number of rows M, w [N, K] in nn.Linear's layout, with
the prologues of ``kernels/gemv.py`` (none, add + RMSNorm, SwiGLU) building x chunk by chunk.

A row's output bits do not depend on M or on the other rows: the grid is (M tiles, N tiles) with a
tiling chosen from (N, K, dtype) alone, every program reduces the whole of K itself (no split-K) in
chunks of BLOCK_K taken in order, each chunk one ``tl.dot`` of a [BLOCK_M, BLOCK_K] by
[BLOCK_K, BLOCK_N] tile, and a row only ever meets its own activations. The RMSNorm statistics are
summed over the same chunks by ``tree_sum``, a fixed pairwise tree. For M <= BLOCK_M there is one
row tile, so the weights are read once.

``dot_nt`` is that chunk product: ``tl.dot`` on a GPU (an MMA computes every element of its tile
the same way, whatever row it sits in), and under the interpreter (``USE_DOT`` False) float32
products summed by ``tree_sum``, because the interpreter's ``tl.dot`` is NumPy's matmul, whose
OpenBLAS result for a row depends on the row's place in the tile (and which multiplies bfloat16
tiles as raw 16-bit integers).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .gemv import ADD_RMS_NORM, chunk_x, row_rms, tree_sum


@triton.jit
def dot_nt(a, b, acc, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
           USE_DOT: tl.constexpr):
    """acc + a b^T: a [BM, BK], b [BN, BK] of one dtype, acc [BM, BN] float32."""
    if USE_DOT:
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    else:
        acc += tree_sum(a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :], BM, BN, BK)
    return acc


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every M (Triton would specialize M == 1)
def invariant_matmul_kernel(
    x_ptr,  # [M, K] x; ADD_RMS_NORM: h [M, K]; SILU_MUL: gu [M, 2K]
    d_ptr,  # [M, K] (ADD_RMS_NORM with HAS_D; else unused)
    g_ptr,  # [K] norm weight (ADD_RMS_NORM; else unused)
    w_ptr,  # [N, K]
    y_ptr,  # [M, N]
    h_out_ptr,  # [M, K] hn (ADD_RMS_NORM with HAS_D; else unused)
    M, N, K: tl.constexpr, eps,
    PROLOGUE: tl.constexpr, HAS_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    USE_DOT: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid_n = tl.program_id(1)  # row tiles vary fastest: the programs reading one weight tile run together (L2)
    dtype = y_ptr.dtype.element_ty
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]  # [BM, 1]
    kk = tl.arange(0, BLOCK_K)
    m_ok = m < M
    n_ok = (n < N)[:, None]  # [BN, 1]
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K  # [BN, 1]
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()

    rms = tl.zeros([BLOCK_M, 1], tl.float32)
    if PROLOGUE == ADD_RMS_NORM:
        rms = row_rms(x_ptr, d_ptr, h_out_ptr, m, m_ok, kk, pid_n == 0, K, eps, HAS_D, BLOCK_M, BLOCK_K, dtype)

    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # the chunks in order, whatever M is
        k = k0 + kk[None, :]  # [1, BK]
        w = tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0)  # [BN, BK]
        x = chunk_x(x_ptr, d_ptr, g_ptr, m, k, m_ok & (k < K), rms, K, PROLOGUE, HAS_D, dtype)  # [BM, BK] float32
        acc = dot_nt(x.to(w.dtype), w, acc, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, USE_DOT)
    tl.store(y_ptr + m * N + n[None, :], acc.to(dtype), mask=m_ok & (n < N)[None, :])
