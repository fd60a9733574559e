"""The batch-invariant product (``@triton.jit`` code only; wrappers in ``flashspec_torch.invariant_matmul``).

``invariant_matmul_kernel``: y = x w^T for any number of rows M, w [N, K] in nn.Linear's layout.

A row's output bits do not depend on M or on the other rows. The grid is (row groups, N tiles,
SPLITS) with a tiling chosen from (N, K, dtype) alone: K is cut into SPLITS fixed slices of CHUNKS
chunks of BLOCK_K each; a program reduces its slice in chunk order for each of its ROW_TILES row
tiles of BLOCK_M rows (ROW_TILES <= 4, fewer when M is small), each chunk one ``tl.dot`` of a
[BLOCK_M, BLOCK_K] by [BLOCK_K, BLOCK_N] tile per row tile, the weight chunk loaded once for all of
them; each row tile's float32 partial goes to a workspace. The last program of a (row group, column
tile) to finish (a counter, taken with acquire-release semantics and reset by that program) adds the
SPLITS partials in slice order 0, 1, ... and writes y. Which program finishes last changes nothing:
the sum order is the slice order. SPLITS == 1 skips the workspace. A row tile's dots, chunk order and
sums are the same whatever ROW_TILES is, so a row's bits are those of its row tile alone.

PRELOAD chunks of the program's weight slice (never written by any kernel) are loaded before
``gdc_wait``; everything written by the previous kernel is read after it.

``dot_nt`` is the chunk product: ``tl.dot`` on a GPU (an MMA computes every element of its tile
the same way, whatever row it sits in), and under the interpreter (``USE_DOT`` False) float32
products summed by ``tree_sum``, because the interpreter's ``tl.dot`` is NumPy's matmul, whose
OpenBLAS result for a row depends on the row's place in the tile (and which multiplies bfloat16
tiles as raw 16-bit integers).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .gemv import tree_sum


@triton.jit
def dot_nt(a, b, acc, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
           USE_DOT: tl.constexpr):
    """acc + a b^T: a [BM, BK], b [BN, BK] of one dtype, acc [BM, BN] float32."""
    if USE_DOT:
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    else:
        acc += tree_sum(a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :], BM, BN, BK)
    return acc


@triton.jit
def tile_dot(x_ptr, w, m, k, M, acc, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """acc + x[m, k] w^T for one row tile: m [BM, 1], k [1, BK], w [BN, BK], acc [BM, BN] float32."""
    x = tl.load(x_ptr + m * K + k, mask=(m < M) & (k < K), other=0.0)
    return dot_nt(x.to(w.dtype), w, acc, BM, BN, BK, PRECISION, USE_DOT)


@triton.jit
def tiles_dot(x_ptr, w, m, k, M, acc0, acc1, acc2, acc3, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, ROW_TILES: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """One weight chunk w [BN, BK] applied to each of the program's ROW_TILES row tiles (rows m, m + BM, ...)."""
    acc0 = tile_dot(x_ptr, w, m, k, M, acc0, K, BM, BN, BK, PRECISION, USE_DOT)
    if ROW_TILES > 1:
        acc1 = tile_dot(x_ptr, w, m + BM, k, M, acc1, K, BM, BN, BK, PRECISION, USE_DOT)
    if ROW_TILES > 2:
        acc2 = tile_dot(x_ptr, w, m + 2 * BM, k, M, acc2, K, BM, BN, BK, PRECISION, USE_DOT)
    if ROW_TILES > 3:
        acc3 = tile_dot(x_ptr, w, m + 3 * BM, k, M, acc3, K, BM, BN, BK, PRECISION, USE_DOT)
    return acc0, acc1, acc2, acc3


@triton.jit
def tile_out(acc, part_ptr, y_ptr, m, n, M, N, pid_s, LAST: tl.constexpr, SPLITS: tl.constexpr):
    """One row tile's result: with one slice, y = round(acc); else (LAST False) this slice's float32
    partial to the workspace, or (LAST True, the last program of the tile) y = round(sum of the slices'
    partials in slice order 0, 1, ...)."""
    mask = (m < M) & (n < N)[None, :]
    if SPLITS == 1:
        tl.store(y_ptr + m * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)
    elif not LAST:
        tl.store(part_ptr + (pid_s * M + m) * N + n[None, :], acc, mask=mask)
    else:
        total = tl.zeros_like(acc)
        for s in tl.static_range(SPLITS):
            total += tl.load(part_ptr + (s * M + m) * N + n[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + m * N + n[None, :], total.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n, M, N, pid_s, BM: tl.constexpr, ROW_TILES: tl.constexpr,
              LAST: tl.constexpr, SPLITS: tl.constexpr):
    tile_out(acc0, part_ptr, y_ptr, m, n, M, N, pid_s, LAST, SPLITS)
    if ROW_TILES > 1:
        tile_out(acc1, part_ptr, y_ptr, m + BM, n, M, N, pid_s, LAST, SPLITS)
    if ROW_TILES > 2:
        tile_out(acc2, part_ptr, y_ptr, m + 2 * BM, n, M, N, pid_s, LAST, SPLITS)
    if ROW_TILES > 3:
        tile_out(acc3, part_ptr, y_ptr, m + 3 * BM, n, M, N, pid_s, LAST, SPLITS)


@triton.jit(do_not_specialize=["M"])  # one compiled kernel per ROW_TILES for every M (Triton would specialize M == 1)
def invariant_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    y_ptr,  # [M, N]
    part_ptr,  # [SPLITS, M, N] float32 partial sums (SPLITS > 1)
    count_ptr,  # [row groups * N tiles] int32, zero on entry and on exit (SPLITS > 1)
    M, N, K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr,
    SPLITS: tl.constexpr, PRELOAD: tl.constexpr, ROW_TILES: tl.constexpr, PRECISION: tl.constexpr,
    USE_DOT: tl.constexpr, USE_PDL: tl.constexpr,
):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (pid_m * (ROW_TILES * BLOCK_M) + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]  # [BM, 1]: the first row tile
    kk = tl.arange(0, BLOCK_K)
    n_ok = (n < N)[:, None]  # [BN, 1]
    w_rows = w_ptr + n.to(tl.int64)[:, None] * K  # [BN, 1]
    k_lo = pid_s * (CHUNKS * BLOCK_K)
    # the slice's first PRELOAD weight chunks (never written by any kernel): in flight before the wait
    k = k_lo + kk[None, :]
    ws = (tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0),)  # [BN, BK] each
    for i in tl.static_range(1, PRELOAD):
        k = k_lo + i * BLOCK_K + kk[None, :]
        ws = ws + (tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0),)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()

    acc0 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0
    for i in tl.static_range(PRELOAD):  # the slice's chunks in order, each loaded once for every row tile
        k = k_lo + i * BLOCK_K + kk[None, :]  # [1, BK]
        acc0, acc1, acc2, acc3 = tiles_dot(x_ptr, ws[i], m, k, M, acc0, acc1, acc2, acc3, K, BLOCK_M, BLOCK_N,
                                           BLOCK_K, ROW_TILES, PRECISION, USE_DOT)
    for c in range(PRELOAD, CHUNKS):
        k = k_lo + c * BLOCK_K + kk[None, :]
        w = tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0)
        acc0, acc1, acc2, acc3 = tiles_dot(x_ptr, w, m, k, M, acc0, acc1, acc2, acc3, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                           ROW_TILES, PRECISION, USE_DOT)

    tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n, M, N, pid_s, BLOCK_M, ROW_TILES, False, SPLITS)
    if SPLITS > 1:
        counter = count_ptr + pid_m * tl.num_programs(1) + pid_n
        tl.debug_barrier()  # every thread's partials stored before the (one-thread) release below
        if tl.atomic_add(counter, 1, sem="acq_rel") == SPLITS - 1:  # the last of the slices: add them in order
            tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n, M, N, pid_s, BLOCK_M, ROW_TILES, True, SPLITS)
            tl.atomic_xchg(counter, 0, sem="relaxed")
