"""Skinny products for decode (``@triton.jit`` code only; wrappers in ``flashspec_torch.gemv``).

``gemv_kernel``: y = x w^T for M <= 8 rows, w [N, K] in nn.Linear's layout (each program streams
BLOCK_N rows of w along K, coalesced), with an optional prologue that builds x itself:

* ``PROLOGUE == NONE``: x is the input.
* ``PROLOGUE == ADD_RMS_NORM``: hn = round(h + d); x = round(round(hn * rsqrt(mean(hn^2) + eps)) * g).
  Every program computes the row statistics itself (a first pass over h, d, read from L2); the
  program with pid 0 alone writes hn to ``h_out`` (h is never written: other programs read it).
* ``PROLOGUE == SILU_MUL``: x = round(round(silu(gate)) * up) from gu = [gate | up] [M, 2K].

Rows are independent and their reduction order does not depend on M: products accumulate
elementwise in a [BLOCK_M, BLOCK_N, BLOCK_K] float32 tile over the K chunks (in chunk order),
and the tile is summed over BLOCK_K by ``tree_sum``, a fixed pairwise tree (an add of two floats
is commutative, so the tree gives the same bits whatever layout the compiler picks). A row thus
gets the same bits for any M and BLOCK_N, given the same BLOCK_K.

``PRELOAD`` (K a constexpr): the first PRELOAD [BLOCK_N, BLOCK_K] chunks of the program's weight
slice (never written by any kernel) are loaded into registers first, then consumed in chunk order
before the rest streams with one chunk in flight: more bytes in flight per SM, and with ``USE_PDL``
(Hopper programmatic dependent launch) all of them load before ``gdc_wait``, overlapping the
previous kernel's tail. Everything the previous kernel wrote is read after the wait, and nothing is
written before it. PRELOAD changes neither the chunk order nor ``tree_sum``: a row's bits depend on
BLOCK_K only.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

NONE = tl.constexpr(0)
ADD_RMS_NORM = tl.constexpr(1)
SILU_MUL = tl.constexpr(2)


@triton.jit
def rounded(x, DTYPE: tl.constexpr):  # float32 -> float32, rounded through the activation dtype
    return x.to(DTYPE).to(tl.float32)


@triton.jit
def swiglu(gate, up, DTYPE: tl.constexpr):
    """silu(gate) * up of float32 gate and up (each already a DTYPE value), float32: silu rounded to DTYPE, the
    product rounded to DTYPE. The one SwiGLU formula of every kernel (gemv's prologue, ``silu_mul_kernel``, the
    batch-invariant product's epilogue), so that they round alike."""
    return rounded(rounded(gate / (1.0 + tl.exp(-gate)), DTYPE) * up, DTYPE)


@triton.jit
def rope_rotate(x, partner, cos, sin, DTYPE: tl.constexpr):
    """x cos + partner sin of float32 lanes (partner: -x_{j + D/2} for the first half, x_{j - D/2} for the
    second), each product rounded to DTYPE, then the sum. The one RoPE formula of ``rope_kv_kernel`` and the
    batch-invariant qkv product's epilogue, so that they round alike."""
    return rounded(rounded(x * cos, DTYPE) + rounded(partner * sin, DTYPE), DTYPE)


@triton.jit
def tree_sum(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_M, BLOCK_N, BLOCK_K] -> [BLOCK_M, BLOCK_N]: adjacent pairs, then pairs of pairs, ..."""
    for i in tl.static_range(16):
        if (BLOCK_K >> i) > 1:
            x = tl.sum(tl.reshape(x, [BLOCK_M, BLOCK_N, BLOCK_K >> (i + 1), 2]), axis=3)
    return tl.reshape(x, [BLOCK_M, BLOCK_N])


@triton.jit
def residual_chunk(h_ptr, d_ptr, offs, mask, HAS_D: tl.constexpr, DTYPE: tl.constexpr):  # hn = round(h + d), fp32
    h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        h = rounded(h + tl.load(d_ptr + offs, mask=mask, other=0.0).to(tl.float32), DTYPE)
    return h


@triton.jit
def row_rms(x_ptr, d_ptr, h_out_ptr, m, m_ok, kk, write, K: tl.constexpr, eps, HAS_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr):
    """rsqrt(mean(hn^2) + eps) [BM, 1] of rows m [BM, 1] (hn = round(h + d)), summed over the K chunks in
    order and then by ``tree_sum``; with HAS_D, hn goes to h_out where ``write``."""
    squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk[None, :]
        mask = m_ok & (k < K)
        hn = residual_chunk(x_ptr, d_ptr, m * K + k, mask, HAS_D, DTYPE)
        if HAS_D:
            tl.store(h_out_ptr + m * K + k, hn.to(DTYPE), mask=mask & write)
        squares += hn * hn
    total = tree_sum(tl.reshape(squares, [BLOCK_M, 1, BLOCK_K]), BLOCK_M, 1, BLOCK_K)  # [BM, 1]
    return tl.math.rsqrt(total / K + eps)


@triton.jit
def chunk_x(x_ptr, d_ptr, g_ptr, m, k, mask, rms, K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_D: tl.constexpr, DTYPE: tl.constexpr):
    """The prologue's activations for one K chunk: m [BM, 1], k [1, BK], rms [BM, 1] -> x [BM, BK] float32."""
    if PROLOGUE == ADD_RMS_NORM:
        hn = residual_chunk(x_ptr, d_ptr, m * K + k, mask, HAS_D, DTYPE)
        g = tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        x = rounded(rounded(hn * rms, DTYPE) * g, DTYPE)
    elif PROLOGUE == SILU_MUL:
        gate = tl.load(x_ptr + m * 2 * K + k, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + m * 2 * K + K + k, mask=mask, other=0.0).to(tl.float32)
        x = swiglu(gate, up, DTYPE)
    else:
        x = tl.load(x_ptr + m * K + k, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def gemv_kernel(
    x_ptr,  # [M, K] x; ADD_RMS_NORM: h [M, K]; SILU_MUL: gu [M, 2K]
    d_ptr,  # [M, K] (ADD_RMS_NORM with HAS_D; else unused)
    g_ptr,  # [K] norm weight (ADD_RMS_NORM; else unused)
    w_ptr,  # [N, K]
    y_ptr,  # [M, N]
    h_out_ptr,  # [M, K] hn (ADD_RMS_NORM with HAS_D; else unused)
    M, N, K: tl.constexpr, eps,
    PROLOGUE: tl.constexpr, HAS_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
    PRELOAD: tl.constexpr,  # K chunks of this program's weight slice loaded before the wait, 1 <= PRELOAD <= cdiv(K, BLOCK_K)
):
    pid = tl.program_id(0)
    dtype = y_ptr.dtype.element_ty
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    m = tl.arange(0, BLOCK_M)[:, None]  # [BM, 1]
    m_ok = m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K  # [BN, 1]
    n_ok = (n < N)[:, None]
    # the first PRELOAD chunks of w [BN, K] (never written by any kernel): in flight before the wait
    ws = (tl.load(w_rows + kk[None, :], mask=n_ok & (kk[None, :] < K), other=0.0),)  # [BN, BK] each
    for i in tl.static_range(1, PRELOAD):
        k_pre = i * BLOCK_K + kk[None, :]
        ws = ws + (tl.load(w_rows + k_pre, mask=n_ok & (k_pre < K), other=0.0),)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()

    rms = tl.zeros([BLOCK_M, 1], tl.float32)
    if PROLOGUE == ADD_RMS_NORM:
        rms = row_rms(x_ptr, d_ptr, h_out_ptr, m, m_ok, kk, pid == 0, K, eps, HAS_D, BLOCK_M, BLOCK_K, dtype)

    # chunks in order 0, 1, ...: the preloaded ones, then the rest streamed (chunk c + 1 in flight during c)
    acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    STREAM: tl.constexpr = PRELOAD * BLOCK_K < K
    for i in tl.static_range(PRELOAD):
        k = i * BLOCK_K + kk[None, :]  # [1, BK]
        if STREAM and i == PRELOAD - 1:
            k_next = k + BLOCK_K
            w = tl.load(w_rows + k_next, mask=n_ok & (k_next < K), other=0.0)
        x = chunk_x(x_ptr, d_ptr, g_ptr, m, k, m_ok & (k < K), rms, K, PROLOGUE, HAS_D, dtype)
        acc += ws[i].to(tl.float32)[None, :, :] * x[:, None, :]
    if STREAM:
        for k0 in range(PRELOAD * BLOCK_K, K, BLOCK_K):
            k = k0 + kk[None, :]  # [1, BK]
            k_next = k + BLOCK_K
            w_next = tl.load(w_rows + k_next, mask=n_ok & (k_next < K), other=0.0)  # in flight during this chunk
            x = chunk_x(x_ptr, d_ptr, g_ptr, m, k, m_ok & (k < K), rms, K, PROLOGUE, HAS_D, dtype)
            acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
            w = w_next
    y = tree_sum(acc, BLOCK_M, BLOCK_N, BLOCK_K)  # [BM, BN]
    tl.store(y_ptr + m * N + n[None, :], y.to(dtype), mask=m_ok & (n < N)[None, :])
