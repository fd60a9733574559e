"""The batch-invariant product (``@triton.jit`` code only; wrappers in ``flashspec_torch.invariant_matmul``).

``invariant_matmul_kernel``: y = x w^T for any number of rows M, w [N, K] in nn.Linear's layout, or an
epilogue of the product's own rounded outputs (``store_y``; the sums are the product's, element by element):
EPILOGUE "swiglu" (w = [w_gate; w_up]) y = silu(x w_gate^T) * (x w_up^T) [M, N / 2], "rope_kv" (qkv's w) RoPE
and the KV write of ``rope_kv_kernel``. For these a column tile holds the two members of each pair the
epilogue combines in adjacent columns (``weight_rows``).

A row's output bits do not depend on M or on the other rows. The reduction order along K is fixed by
(BLOCK_K, CHUNKS) and K alone: K is cut into SLICES slices of CHUNKS chunks of BLOCK_K (chunks past K
add nothing), each slice one float32 sum from zero of its chunks' ``tl.dot`` in chunk order; y =
round(the sum from zero of the slices' sums in slice order). Which program computes which part is
free, and the launcher chooses it by M: a program takes ROW_TILES row tiles of BLOCK_M rows (each its
own ``tl.dot``s, the weight chunk loaded once for all of them), one column tile of BLOCK_N and SPAN
consecutive slices (1 or SLICES), summed as above. With SPAN 1 (and more than one slice) each program
writes its float32 partial to a workspace; the last program of a (row group, column tile) to finish
(a counter, taken with acquire-release semantics and reset by that program) adds the PARTIALS
partials in slice order and writes y. Which program finishes last changes nothing. SPAN == SLICES
needs no workspace and no counter, and walks its chunks in one loop (``span_sum``: the slices' sums restarted
from zero at each slice's end), so the loads are pipelined across the slices' boundaries. None of the free choices (BLOCK_M, BLOCK_N, ROW_TILES, SPAN, warps,
stages) changes an element's sequence of dots and additions; whether the GPU's MMA rounds a [16, BK]
and a [64, BK] ``tl.dot`` alike (sm_90: ``mma.sync`` and a warpgroup MMA) is measured, not assumed
(``flashspec_torch.invariant_matmul``).

PRELOAD chunks of the program's first slice (weights are never written by any kernel) are loaded
before ``gdc_wait``; everything written by the previous kernel is read after it.

``dot_nt`` is the chunk product: ``tl.dot`` on a GPU (an MMA computes every element of its tile
the same way, whatever row it sits in), and under the interpreter (``USE_DOT`` False) float32
products summed by ``tree_sum``, because the interpreter's ``tl.dot`` is NumPy's matmul, whose
OpenBLAS result for a row depends on the row's place in the tile (and which multiplies bfloat16
tiles as raw 16-bit integers).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .gemv import rope_rotate, rounded, swiglu, tree_sum


@triton.jit
def dot_nt(a, b, acc, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
           USE_DOT: tl.constexpr):
    """acc + a b^T: a [BM, BK], b [BN, BK] of one dtype, acc [BM, BN] float32."""
    if USE_DOT:
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    else:
        acc += tree_dot(a.to(tl.float32), b.to(tl.float32), BM, BN, BK)
    return acc


@triton.jit
def tree_dot(a, b, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """The interpreter's a b^T: a [BM, BK], b [BN, BK] float32 -> [BM, BN], each element's BK products
    summed by ``tree_sum``. Where [BM, BN, BK] would pass the interpreter's 2^20 elements a tensor (128-row
    tiles), the trees of K's two halves added: the same tree (its last step adds those two)."""
    if BM * BN * BK <= 1 << 20:
        return tree_sum(a[:, None, :] * b[None, :, :], BM, BN, BK)
    else:
        a_lo, a_hi = tl.split(tl.permute(tl.reshape(a, [BM, 2, BK // 2]), (0, 2, 1)))  # [BM, BK / 2] each
        b_lo, b_hi = tl.split(tl.permute(tl.reshape(b, [BN, 2, BK // 2]), (0, 2, 1)))
        return tree_dot(a_lo, b_lo, BM, BN, BK // 2) + tree_dot(a_hi, b_hi, BM, BN, BK // 2)


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
def add_kept(a, b, USE_DOT: tl.constexpr):
    """a + b, float32, rounded once. On a GPU an opaque ``add.rn.f32``: Triton's combine pass rewrites
    ``a + tl.dot(x, w, 0)`` into ``tl.dot(x, w, a)`` (the products then accumulate onto ``a`` inside the MMA,
    rounding otherwise), which would change a slice's sum from zero wherever a slice is one chunk."""
    if USE_DOT:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return a + b


@triton.jit
def tiles_add(a0, a1, a2, a3, b0, b1, b2, b3, ROW_TILES: tl.constexpr, USE_DOT: tl.constexpr):
    """(a0 + b0, ...) for the program's ROW_TILES row tiles, float32, each add kept (``add_kept``)."""
    a0 = add_kept(a0, b0, USE_DOT)
    if ROW_TILES > 1:
        a1 = add_kept(a1, b1, USE_DOT)
    if ROW_TILES > 2:
        a2 = add_kept(a2, b2, USE_DOT)
    if ROW_TILES > 3:
        a3 = add_kept(a3, b3, USE_DOT)
    return a0, a1, a2, a3


@triton.jit
def slice_dots(x_ptr, w_rows, n_ok, m, kk, k_lo, M, acc0, acc1, acc2, acc3, FIRST: tl.constexpr, K: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNKS: tl.constexpr, ROW_TILES: tl.constexpr,
               PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """acc + chunks FIRST, ..., CHUNKS - 1 of the slice starting at k_lo, in chunk order (chunks past K add
    nothing: their loads are masked to zero), each weight chunk loaded once for every row tile."""
    for c in range(FIRST, CHUNKS):
        k = k_lo + c * BK + kk[None, :]  # [1, BK]
        w = tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0)
        acc0, acc1, acc2, acc3 = tiles_dot(x_ptr, w, m, k, M, acc0, acc1, acc2, acc3, K, BM, BN, BK, ROW_TILES,
                                           PRECISION, USE_DOT)
    return acc0, acc1, acc2, acc3


@triton.jit
def span_sum(x_ptr, w_rows, n_ok, m, kk, k_lo, M, acc0, acc1, acc2, acc3, FIRST: tl.constexpr, K: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CHUNKS: tl.constexpr, SPAN: tl.constexpr,
             ROW_TILES: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr):
    """The sum from zero, in slice order, of the sums of the SPAN slices from k_lo (acc: the first slice's
    first FIRST chunks' dots). One loop over the SPAN x CHUNKS chunks, each slice's sum added to the total
    and restarted from zero after its last chunk: the dots and additions of a loop per slice, in the same
    order, but the loads are software-pipelined across the slices' boundaries (a loop per slice of
    CHUNKS = 2-4 chunks had no chunk of the next slice in flight)."""
    z = tl.zeros([BM, BN], tl.float32)
    t0, t1, t2, t3 = z, z, z, z
    if FIRST == CHUNKS:  # the first slice is done
        t0, t1, t2, t3 = tiles_add(t0, t1, t2, t3, acc0, acc1, acc2, acc3, ROW_TILES, USE_DOT)
        acc0, acc1, acc2, acc3 = z, z, z, z
    for c in range(FIRST, SPAN * CHUNKS):
        k = k_lo + c * BK + kk[None, :]  # [1, BK]
        w = tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0)
        if CHUNKS == 1:  # every chunk a slice: each dot from the zero constant (compile_invariant_sm90.py)
            a0, a1, a2, a3 = tiles_dot(x_ptr, w, m, k, M, z, z, z, z, K, BM, BN, BK, ROW_TILES, PRECISION, USE_DOT)
            t0, t1, t2, t3 = tiles_add(t0, t1, t2, t3, a0, a1, a2, a3, ROW_TILES, USE_DOT)
        else:
            acc0, acc1, acc2, acc3 = tiles_dot(x_ptr, w, m, k, M, acc0, acc1, acc2, acc3, K, BM, BN, BK, ROW_TILES,
                                               PRECISION, USE_DOT)
            if c % CHUNKS == CHUNKS - 1:  # a slice's last chunk: its sum into the total, the next from zero
                t0, t1, t2, t3 = tiles_add(t0, t1, t2, t3, acc0, acc1, acc2, acc3, ROW_TILES, USE_DOT)
                acc0, acc1, acc2, acc3 = z, z, z, z
    return t0, t1, t2, t3


@triton.jit
def weight_rows(pid_n, N, BLOCK_N: tl.constexpr, EPILOGUE: tl.constexpr, D: tl.constexpr):
    """The weight rows [BN] that column tile pid_n multiplies, and which exist: BN consecutive rows, or, for an
    epilogue on pairs, the two rows of BN / 2 consecutive pairs in adjacent columns, so that a program owns
    both members of each pair: "swiglu" (w [N, K] = [w_gate; w_up]) gate row j and up row N / 2 + j,
    "rope_kv" rows d and d + D / 2 of a head (the ones RoPE rotates together). A tile's column c is its
    weight row's column either way; which rows sit in a tile changes no element's dots."""
    c = tl.arange(0, BLOCK_N)
    if EPILOGUE == "none":
        n = pid_n * BLOCK_N + c
        return n, n < N
    p = pid_n * (BLOCK_N // 2) + c // 2  # each column's pair
    if EPILOGUE == "swiglu":
        half = N // 2
    else:
        half = D // 2
    return (p // half) * (2 * half) + p % half + (c % 2) * half, p < N // 2


@triton.jit
def pairs(acc, n0, BM: tl.constexpr, BN: tl.constexpr, DTYPE: tl.constexpr):
    """acc's pairs (``weight_rows``) rounded to DTYPE: the first and second members [BM, BN / 2] float32, and
    the pair index p [BN / 2] of each (pair p in columns 2p, 2p + 1 of the product)."""
    a, b = tl.split(tl.reshape(acc, [BM, BN // 2, 2]))
    return rounded(a, DTYPE), rounded(b, DTYPE), n0 // 2 + tl.arange(0, BN // 2)


@triton.jit
def store_rope_kv(acc, q_ptr, m, n0, M, N, rope, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                  H_KV: tl.constexpr, D: tl.constexpr):
    """The "rope_kv" epilogue of a row tile of the qkv product (rows m = b T + t [BM, 1]): ``rope_kv_kernel``
    on its rounded output, pair by pair: q and k heads rotated (cos and sin of the row's RoPE position) and
    written to q [B, H, T, D] and the K cache at the row's cache slot, v heads written to the V cache.
    rope: (cos_ptr, sin_ptr [B T, D], pos_ptr [B T], k_ptr, v_ptr [B, H_KV, S, D], T, S)."""
    cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, T, S = rope
    dtype = q_ptr.dtype.element_ty
    a, b, p = pairs(acc, n0, BM, BN, dtype)  # x_j, x_{j + D/2} of head p // (D / 2)
    head, j = (p // (D // 2))[None, :], (p % (D // 2))[None, :]  # [1, BN / 2]
    row_ok = (m < M) & (p < N // 2)[None, :]
    rotate = row_ok & (head < H + H_KV)
    cs = m * D + j  # [BM, BN / 2]: lane j of the row's cos and sin (lane j + D / 2: + D / 2)
    cos_a = tl.load(cos_ptr + cs, mask=rotate, other=0.0).to(tl.float32)
    sin_a = tl.load(sin_ptr + cs, mask=rotate, other=0.0).to(tl.float32)
    cos_b = tl.load(cos_ptr + cs + D // 2, mask=rotate, other=0.0).to(tl.float32)
    sin_b = tl.load(sin_ptr + cs + D // 2, mask=rotate, other=0.0).to(tl.float32)
    ra = rope_rotate(a, -b, cos_a, sin_a, dtype)
    rb = rope_rotate(b, a, cos_b, sin_b, dtype)
    a, b = tl.where(rotate, ra, a), tl.where(rotate, rb, b)
    bb, t = m // T, m % T
    q = q_ptr + ((bb * H + head) * T + t) * D + j
    tl.store(q, a.to(dtype), mask=row_ok & (head < H))
    tl.store(q + D // 2, b.to(dtype), mask=row_ok & (head < H))
    pos = tl.load(pos_ptr + m, mask=m < M, other=0)  # [BM, 1]
    in_cache = row_ok & (pos < S)
    is_k = in_cache & (head >= H) & (head < H + H_KV)
    kv = (bb * H_KV + head - H) * S + pos  # [BM, BN / 2]: the K slot (the V slot: H_KV heads on)
    tl.store(k_ptr + kv * D + j, a.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_ptr + kv * D + j + D // 2, b.to(k_ptr.dtype.element_ty), mask=is_k)
    is_v = in_cache & (head >= H + H_KV)
    kv -= H_KV * S
    tl.store(v_ptr + kv * D + j, a.to(v_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_ptr + kv * D + j + D // 2, b.to(v_ptr.dtype.element_ty), mask=is_v)


@triton.jit
def store_y(acc, y_ptr, m, n0, M, N, rope, BM: tl.constexpr, BN: tl.constexpr, EPILOGUE: tl.constexpr,
            H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr):
    """The output of one row tile (rows m [BM, 1], the tile's columns n0 + [0, BN)): y [M, N] = round(acc);
    "swiglu" (acc's columns gate, up alternating, ``weight_rows``) y [M, N / 2] = ``swiglu`` of the rounded
    gate and up at columns n0 / 2 + [0, BN / 2), ``silu_mul`` of the product's rounded output element by
    element; "rope_kv": ``store_rope_kv`` (y is q)."""
    dtype = y_ptr.dtype.element_ty
    if EPILOGUE == "swiglu":
        gate, up, j = pairs(acc, n0, BM, BN, dtype)
        tl.store(y_ptr + m * (N // 2) + j[None, :], swiglu(gate, up, dtype).to(dtype), mask=(m < M) & (j < N // 2)[None, :])
    elif EPILOGUE == "rope_kv":
        store_rope_kv(acc, y_ptr, m, n0, M, N, rope, BM, BN, H, H_KV, D)
    else:
        n = n0 + tl.arange(0, BN)
        tl.store(y_ptr + m * N + n[None, :], acc.to(dtype), mask=(m < M) & (n < N)[None, :])


@triton.jit
def tile_out(acc, part_ptr, y_ptr, m, n0, M, N, pid_s, rope, BM: tl.constexpr, BN: tl.constexpr, LAST: tl.constexpr,
             PARTIALS: tl.constexpr, EPILOGUE: tl.constexpr, H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr):
    """One row tile's result: with one partial (the program walked every slice), ``store_y(acc)``; else
    (LAST False) the program's float32 partial to the workspace [PARTIALS, M, N] at the tile's columns
    n0 + [0, BN), or (LAST True, the last program of the tile) ``store_y`` of the partials added from zero
    in slice order."""
    n = n0 + tl.arange(0, BN)
    mask = (m < M) & (n < N)[None, :]
    if PARTIALS == 1:
        store_y(acc, y_ptr, m, n0, M, N, rope, BM, BN, EPILOGUE, H, H_KV, D)
    elif not LAST:
        tl.store(part_ptr + (pid_s * M + m) * N + n[None, :], acc, mask=mask)
    else:
        total = tl.zeros_like(acc)
        for s in tl.static_range(PARTIALS):
            total += tl.load(part_ptr + (s * M + m) * N + n[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        store_y(total, y_ptr, m, n0, M, N, rope, BM, BN, EPILOGUE, H, H_KV, D)


@triton.jit
def tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n0, M, N, pid_s, rope, BM: tl.constexpr, BN: tl.constexpr,
              ROW_TILES: tl.constexpr, LAST: tl.constexpr, PARTIALS: tl.constexpr, EPILOGUE: tl.constexpr,
              H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr):
    tile_out(acc0, part_ptr, y_ptr, m, n0, M, N, pid_s, rope, BM, BN, LAST, PARTIALS, EPILOGUE, H, H_KV, D)
    if ROW_TILES > 1:
        tile_out(acc1, part_ptr, y_ptr, m + BM, n0, M, N, pid_s, rope, BM, BN, LAST, PARTIALS, EPILOGUE, H, H_KV, D)
    if ROW_TILES > 2:
        tile_out(acc2, part_ptr, y_ptr, m + 2 * BM, n0, M, N, pid_s, rope, BM, BN, LAST, PARTIALS, EPILOGUE, H, H_KV, D)
    if ROW_TILES > 3:
        tile_out(acc3, part_ptr, y_ptr, m + 3 * BM, n0, M, N, pid_s, rope, BM, BN, LAST, PARTIALS, EPILOGUE, H, H_KV, D)


@triton.jit(do_not_specialize=["M"])  # one compiled kernel per ROW_TILES for every M (Triton would specialize M == 1)
def invariant_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] ("swiglu": [w_gate; w_up]; "rope_kv": qkv's, [(H + 2 H_KV) D, K])
    y_ptr,  # [M, N] ("swiglu": [M, N / 2]; "rope_kv": q [B, H, T, D], M = B T)
    part_ptr,  # [SLICES // SPAN, M, N] float32 partial sums (SPAN < SLICES)
    count_ptr,  # [row groups * N tiles] int32, zero on entry and on exit (SPAN < SLICES)
    M, N, K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr,
    SLICES: tl.constexpr, SPAN: tl.constexpr, PARTIALS: tl.constexpr,
    PRELOAD: tl.constexpr, ROW_TILES: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr, USE_PDL: tl.constexpr,
    EPILOGUE: tl.constexpr = "none",  # "none", "swiglu" or "rope_kv"; the rest for "rope_kv" only (``store_rope_kv``)
    cos_ptr=None, sin_ptr=None, pos_ptr=None, k_ptr=None, v_ptr=None, T=1, S=1,
    H: tl.constexpr = 0, H_KV: tl.constexpr = 0, D: tl.constexpr = 0,
):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows, ok = weight_rows(pid_n, N, BLOCK_N, EPILOGUE, D)  # [BN] each
    m = (pid_m * (ROW_TILES * BLOCK_M) + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]  # [BM, 1]: the first row tile
    kk = tl.arange(0, BLOCK_K)
    n_ok = ok[:, None]  # [BN, 1]
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K  # [BN, 1]
    s_lo = pid_s * SPAN  # the program's first slice
    k_lo = s_lo * (CHUNKS * BLOCK_K)
    # the first slice's first PRELOAD weight chunks (never written by any kernel): in flight before the wait
    k = k_lo + kk[None, :]
    ws = (tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0),)  # [BN, BK] each
    for i in tl.static_range(1, PRELOAD):
        k = k_lo + i * BLOCK_K + kk[None, :]
        ws = ws + (tl.load(w_rows + k, mask=n_ok & (k < K), other=0.0),)
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()

    z = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc0, acc1, acc2, acc3 = z, z, z, z
    for i in tl.static_range(PRELOAD):  # the first slice: its preloaded chunks, then the rest, in order
        k = k_lo + i * BLOCK_K + kk[None, :]  # [1, BK]
        acc0, acc1, acc2, acc3 = tiles_dot(x_ptr, ws[i], m, k, M, acc0, acc1, acc2, acc3, K, BLOCK_M, BLOCK_N,
                                           BLOCK_K, ROW_TILES, PRECISION, USE_DOT)
    if SPAN == 1:
        acc0, acc1, acc2, acc3 = slice_dots(x_ptr, w_rows, n_ok, m, kk, k_lo, M, acc0, acc1, acc2, acc3, PRELOAD, K,
                                            BLOCK_M, BLOCK_N, BLOCK_K, CHUNKS, ROW_TILES, PRECISION, USE_DOT)
    else:  # the program's slices summed as the partials would be: from zero, in slice order
        acc0, acc1, acc2, acc3 = span_sum(x_ptr, w_rows, n_ok, m, kk, k_lo, M, acc0, acc1, acc2, acc3, PRELOAD, K,
                                          BLOCK_M, BLOCK_N, BLOCK_K, CHUNKS, SPAN, ROW_TILES, PRECISION, USE_DOT)

    n0 = pid_n * BLOCK_N  # the tile's first column (of the workspace; on pairs, pair n0 / 2 first)
    rope = (cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, T, S)
    tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n0, M, N, pid_s, rope, BLOCK_M, BLOCK_N, ROW_TILES, False,
              PARTIALS, EPILOGUE, H, H_KV, D)
    if PARTIALS > 1:
        counter = count_ptr + pid_m * tl.num_programs(1) + pid_n
        tl.debug_barrier()  # every thread's partials stored before the (one-thread) release below
        if tl.atomic_add(counter, 1, sem="acq_rel") == PARTIALS - 1:  # the last program: add them in order
            tiles_out(acc0, acc1, acc2, acc3, part_ptr, y_ptr, m, n0, M, N, pid_s, rope, BLOCK_M, BLOCK_N, ROW_TILES,
                      True, PARTIALS, EPILOGUE, H, H_KV, D)
            tl.atomic_xchg(counter, 0, sem="relaxed")
