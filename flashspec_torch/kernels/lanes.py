"""Per-lane streaming device functions of the verify kernels (``@triton.jit`` code only; the kernels are in
``verify.py``, the slot vote of the row-n sweep in ``slots.py``; docs/kernel_notes.md has the design).

Both loops keep their running state per thread (per vector of VEC logits, or per logit) and reduce
across threads once, after the loop: no shuffles or barriers per tile, no padding of the G+1 rows
to a power of two (one row at a time), exponentials as ``exp2`` with the log2(e) / T scale folded
into one FFMA, and (with ``FAST``, on a GPU only) the fast hardware ``lg2`` where an absolute
error of ~1e-7 is below the float32 rounding of the key it enters.

A program owns BLOCK_B batch rows (1 on the GPU, many in the interpreter).
"""

import triton
import triton.language as tl

from .random import mix, mix_body

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)  # above any vocabulary index: "no candidate" in argmin reductions

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
PRUNE_SLACK = tl.constexpr(0.01)  # log2 units; both sides' rounding is below 1e-5
A_BITS = tl.constexpr(0x4B00FFFF)  # hi ^ A_BITS: the bits of 2**23 + 65535 - hi (hi < 2**16)


@triton.jit
def log2_approx(x, FAST: tl.constexpr):  # float32 >= 0 -> log2(x), -inf at 0
    """lg2.approx.ftz (one MUFU op, absolute error ~2**-22) on the GPU; exact log2 otherwise (the
    interpreter runs no inline assembly)."""
    if FAST:
        y = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.where(x > 0, tl.math.log2(tl.where(x > 0, x, 1.0)), NEG_INF)
    return y


@triton.jit
def div_t(z, T, inv_T, FAST: tl.constexpr):  # float32 z / T, correctly rounded
    """z / T without a division per element on the GPU: q = RN(z * RN(1/T)), then one FMA
    correction (Markstein): q + (z - q T) / T rounded once, as CUDA's div.rn fast path (checked
    against RN(z / T) on 48M float32 z in [2**-30, 2**12] for 12 temperatures; docs/kernel_notes.md).
    -inf stays -inf (the FMA of inf would be NaN). The interpreter's fma rounds twice, so it
    divides (div_rn)."""
    if FAST:
        q = z * inv_T
        r = tl.math.fma(-q, T, z)
        y = tl.where(q == NEG_INF, q, tl.math.fma(r, inv_T, q))
    else:
        y = tl.math.div_rn(z, T)
    return y


@triton.jit
def exp2_scale(inv_T, FILTER: tl.constexpr):  # k with exp(z / T) = exp2(z k); FILTER: z is already divided by T
    if FILTER:
        k = LOG2E
    else:
        k = LOG2E * inv_T
    return k


@triton.jit
def hash_gap(key_n, j_t, s):  # j_t: multiples of the vector size, s < it (broadcast) -> float32 a, exactly
    """a = 65535 - (mix(key_n ^ (j_t + s)) >> 16), the pruning bounds' view of the uniform (t' >= 128 a, ``slots.py``).
    The top 16 bits of mix are mix_body's (its last step is h ^ (h >> 16)), and the hash's first step is taken per
    vector: key ^ (j_t + s) = (key ^ j_t) ^ s, and >> 16 does not see s."""
    h = key_n ^ j_t.to(tl.uint32)
    h = mix_body((h ^ (h >> 16)) ^ s.to(tl.uint32))
    return ((h >> 16) ^ A_BITS).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def row_lse_lanes(rows, row_mask, sv, v_lo, v_hi, T, inv_T, thr, thr_id,  # rows, row_mask, thr, thr_id: [BB]
                  BLOCK_B: tl.constexpr, FILTER: tl.constexpr, NT: tl.constexpr, VEC: tl.constexpr,
                  FAST: tl.constexpr):
    """(max s, sum exp(s - max s)) over [v_lo, v_hi) of BLOCK_B rows, s = filter(z / T): two [BB].

    rows: pointers to each row's first logit, sv the stride along V (1 in practice: the JIT
    specialises it). Each thread owns vectors of VEC logits (one 16-byte load each, the next tile's
    issued before this tile's arithmetic) and keeps a running max and sum per vector: one exp2 per logit
    plus one per vector, FFMA-folded scale, no cross-thread reduction until the end. Without FILTER the
    max is taken on raw z (T > 0) and z / T is never formed: exp((z - m) / T) = exp2(z k - m k), k = log2(e) / T.
    """
    t = (tl.arange(0, NT) * VEC)[None, :, None] + tl.arange(0, VEC)[None, None, :]  # [1, NT, VEC]
    ptrs = rows[:, None, None]
    live = row_mask[:, None, None]
    k = exp2_scale(inv_T, FILTER)
    m = tl.full((BLOCK_B, NT), NEG_INF, tl.float32)
    l = tl.zeros((BLOCK_B, NT), tl.float32)
    j = v_lo + t
    a_next = tl.load(ptrs + j.to(tl.int64) * sv, mask=live & (j < v_hi), other=NEG_INF)
    for v0 in range(v_lo, v_hi, NT * VEC):
        j = v0 + t
        x = a_next.to(tl.float32)
        jn = j + NT * VEC  # prefetch the next tile (masked off past the end)
        a_next = tl.load(ptrs + jn.to(tl.int64) * sv, mask=live & (jn < v_hi), other=NEG_INF)
        if FILTER:
            x = div_t(x, T, inv_T, FAST)
            x = tl.where((x > thr[:, None, None]) | ((x == thr[:, None, None]) & (j <= thr_id[:, None, None])), x, NEG_INF)
        m_new = tl.maximum(m, tl.max(x, axis=2))  # [BB, NT]: each vector's largest logit so far
        mk = tl.where(m_new == NEG_INF, 0.0, m_new) * k
        l = l * tl.math.exp2(m * k - mk) + tl.sum(tl.math.exp2(x * k - mk[:, :, None]), axis=2)
        m = m_new
    m_all = tl.max(m, axis=1)
    mk = tl.where(m_all == NEG_INF, 0.0, m_all) * k
    l_all = tl.sum(l * tl.math.exp2(m * k - mk[:, None]), axis=1)
    if not FILTER:
        m_all = tl.math.div_rn(m_all, T)  # max z / T, the scale of s
    return m_all, l_all


@triton.jit
def neg_log_uniform(b):  # uint32 bits -> E = -log(u), u = (2 (b >> 9) + 1) 2**-24: the generator's uniform
    """-log u within 0.87 ulp for every one of the 2**23 uniforms (checked against float64; NumPy's
    float32 log is within 3.8 ulp): libdevice logf's range reduction and polynomial without its
    special cases (u is a normal float in [2**-24, 1)), the 2**-24 folded into the exponent."""
    n = ((b >> 9) * 2 + 1).to(tl.int32).to(tl.float32)  # 2m + 1, exactly
    bits = n.to(tl.int32, bitcast=True)
    e_bits = (bits - 0x3F2AAAAB) & -8388608  # exponent of n such that its mantissa m is in [2/3, 4/3)
    f = (bits - e_bits).to(tl.float32, bitcast=True) - 1.0  # m - 1, exact
    e = e_bits.to(tl.float32) * 1.1920928955078125e-07 - 24.0
    p = tl.math.fma(f, -0.13018856942653656, 0.1408461034297943)
    p = tl.math.fma(f, p, -0.12148627638816833)
    p = tl.math.fma(f, p, 0.1398061066865921)
    p = tl.math.fma(f, p, -0.16684235632419586)
    p = tl.math.fma(f, p, 0.20012299716472626)
    p = tl.math.fma(f, p, -0.24999669194221497)
    p = tl.math.fma(f, p, 0.333331823348999)
    p = tl.math.fma(f, p, -0.5)
    r = tl.math.fma(f, f * p, f)  # log m
    return -tl.math.fma(e, LN2, r)


@triton.jit
def column(a, BLOCK_B: tl.constexpr):  # [BB] -> [BB, 1]; a scalar when BLOCK_B == 1
    """With one batch row per program the per-row values enter the loops as scalars: a [1]
    vector computed from the [BB, NC, ROWS] partials would otherwise lend its layout to the
    per-logit arithmetic (measured: 6x the instructions, 255 registers at NC = 16)."""
    if BLOCK_B == 1:
        c = tl.max(a, axis=0)
    else:
        c = a[:, None]
    return c


@triton.jit
def plane(a, BLOCK_B: tl.constexpr, DIMS: tl.constexpr = 3):  # [BB] -> [BB, 1, 1] (DIMS 2: ``column``)
    if DIMS == 2:
        c = column(a, BLOCK_B)
    elif BLOCK_B == 1:
        c = tl.max(a, axis=0)
    else:
        c = a[:, None, None]
    return c


@triton.jit
def sweep_scalars(lse_p, lse_q, k_final, x_n, thr_p, tid_p, thr_q, tid_q,  # [BB] each (thr, tid: 0 without FILTER)
                  BLOCK_B: tl.constexpr, DIMS: tl.constexpr, HAS_W: tl.constexpr, FILTER: tl.constexpr):
    """A sweep's per-row values as ``column``s (DIMS = 2) or ``plane``s (DIMS = 3) of its tiles: lse_p and
    lse_q in log2 units, the FINAL key, x_n (one-hot drafts), the cuts (FILTER)."""
    lse_p2, lse_q2 = plane(lse_p * LOG2E, BLOCK_B, DIMS), plane(lse_q * LOG2E, BLOCK_B, DIMS)
    key_n = plane(k_final, BLOCK_B, DIMS)
    if FILTER:
        thr_p, tid_p = plane(thr_p, BLOCK_B, DIMS), plane(tid_p, BLOCK_B, DIMS)
        if HAS_W:
            thr_q, tid_q = plane(thr_q, BLOCK_B, DIMS), plane(tid_q, BLOCK_B, DIMS)
    if not HAS_W:
        x_n = plane(x_n, BLOCK_B, DIMS)
    return lse_p2, lse_q2, key_n, x_n, thr_p, tid_p, thr_q, tid_q


@triton.jit
def load_tile(z_rows, w_rows, j, sv_z, sv_w, live, v_hi, HAS_W: tl.constexpr, fill=NEG_INF):  # logits j of row n
    """(z, w): z and w (z again for a one-hot draft) at j, ``fill`` (-inf) past v_hi or for masked batch rows."""
    z = tl.load(z_rows + j.to(tl.int64) * sv_z, mask=live & (j < v_hi), other=fill)
    w = z
    if HAS_W:
        w = tl.load(w_rows + j.to(tl.int64) * sv_w, mask=live & (j < v_hi), other=fill)
    return z, w


@triton.jit
def keep(s, j, thr, tid):  # top-k / top-p cut (thr, tid: columns) on [BB, S] scaled logits
    return tl.where((s > thr) | ((s == thr) & (j <= tid)), s, NEG_INF)


@triton.jit
def log2_scaled(a, j, k, lse2, T, inv_T, thr, tid, FILTER: tl.constexpr, FAST: tl.constexpr):
    """log2 of the probabilities of raw logits a: (filter(a / T) - lse) log2(e). Without a filter
    one FFMA, a k - lse log2(e) with k = log2(e) / T; the cut compares exact a / T with thr.
    lse2, thr, tid: columns."""
    x = a.to(tl.float32)
    if FILTER:
        x = keep(div_t(x, T, inv_T, FAST), j, thr, tid)
    return x * k - lse2


@triton.jit
def draw_keys(lp2, bits, w, j, k, lse_q2, T, inv_T, thr_q, tid_q, x_n,
              HAS_W: tl.constexpr, FILTER: tl.constexpr, FAST: tl.constexpr):
    """(key_p, key_r, r) of logits j of row n from lp2 = log2 p, their hash bits and raw draft logits w
    (one-hot at x_n without HAS_W): key_p = lp2 + g2, key_r = log2 max(0, p - q) + g2, g2 = -log2 E."""
    g2 = -log2_approx(neg_log_uniform(bits), FAST)
    if HAS_W:
        q = tl.math.exp2(log2_scaled(w, j, k, lse_q2, T, inv_T, thr_q, tid_q, FILTER, FAST))
    else:
        q = tl.where(j == x_n, 1.0, 0.0)  # one-hot draft
    r = tl.maximum(tl.math.exp2(lp2) - q, 0.0)
    return lp2 + g2, log2_approx(r, FAST) + g2, r


@triton.jit
def sweep_row_lanes(z_row, w_row, sv_z, sv_w, v_lo, v_hi, T, inv_T, lse_p, lse_q, x_n, thr_p, tid_p, thr_q, tid_q,
                    k_final, b_mask, BLOCK_B: tl.constexpr, SWEEP_V: tl.constexpr, HAS_W: tl.constexpr,
                    FILTER: tl.constexpr, FAST: tl.constexpr, PRUNE: tl.constexpr):
    """Gumbel-max over [v_lo, v_hi) of row n (z_row, w_row: [BB] pointers; the rest [BB]): the Gumbel-max
    keys of SPEC.md scaled by log2(e) (the same argmax), every logit slot keeping its own running
    best (no reduction per tile), the next tile's logits loaded before this tile's arithmetic.

    key_p = lp2 + g2 (bonus and fallback), key_r = log2 max(0, p - q) + g2 (residual), where lp2 =
    log2 p, g2 = -log2(E), E = -log(u) (neg_log_uniform: u near 1 decides the winners). Returns
    (best_r, idx_r, best_p, idx_p, residual mass > 0), each [BB].

    PRUNE skips the keys of a tile that cannot change the result: E >= 1 - u, so both keys are at
    most lp2 + 24 - log2(2**24 (1 - u)) (an integer from the hash bits; log2 r <= lp2), and a
    tile none of whose logits reaches K = min(best key_p, best key_r) so far (minus a slack far
    above the rounding of either side) is passed over. K stays -inf until some residual mass was
    seen, so the mass flag is exact too. Exact by construction; it saves work once K is high
    (after a few tiles on flat rows, almost at once on peaked ones).
    """
    j0 = tl.arange(0, SWEEP_V)[None, :]
    z_rows = z_row[:, None]
    w_rows = w_row[:, None]
    live = b_mask[:, None]
    k = exp2_scale(inv_T, FILTER)
    lse_p2, lse_q2, key_n, x_n, thr_p, tid_p, thr_q, tid_q = sweep_scalars(
        lse_p, lse_q, k_final, x_n, thr_p, tid_p, thr_q, tid_q, BLOCK_B, 2, HAS_W, FILTER)
    best_r = tl.full((BLOCK_B, SWEEP_V), NEG_INF, tl.float32)
    best_p = tl.full((BLOCK_B, SWEEP_V), NEG_INF, tl.float32)
    idx_r = tl.zeros((BLOCK_B, SWEEP_V), tl.int32) + v_lo
    idx_p = tl.zeros((BLOCK_B, SWEEP_V), tl.int32) + v_lo
    mass = tl.zeros((BLOCK_B, SWEEP_V), tl.float32)
    z_next, w_next = load_tile(z_rows, w_rows, v_lo + j0, sv_z, sv_w, live, v_hi, HAS_W)
    floor = column(tl.full((BLOCK_B,), NEG_INF, tl.float32), BLOCK_B)  # K: a key some logit reaches (-inf: none yet)
    top_p = tl.max(best_p, axis=1)  # [BB] this program's best keys so far (-inf)
    top_r = tl.max(best_r, axis=1)
    for v0 in range(v_lo, v_hi, SWEEP_V):
        j = v0 + j0
        z, w = z_next, w_next  # (w: z again for a one-hot draft, unused)
        z_next, w_next = load_tile(z_rows, w_rows, j + SWEEP_V, sv_z, sv_w, live, v_hi, HAS_W)  # the next tile
        lp2 = log2_scaled(z, j, k, lse_p2, T, inv_T, thr_p, tid_p, FILTER, FAST)
        bits = mix(key_n ^ j.to(tl.uint32))
        todo = 1
        if PRUNE:
            t = (16777215 - 2 * (bits >> 9)).to(tl.int32).to(tl.float32)  # 2**24 (1 - u), in [1, 2**24)
            bound = lp2 + (24.0 - log2_approx(t, FAST))
            todo = tl.max(tl.max((bound >= floor - PRUNE_SLACK).to(tl.int32), axis=1), axis=0)
        if todo > 0:
            key_p, key_r, r = draw_keys(lp2, bits, w, j, k, lse_q2, T, inv_T, thr_q, tid_q, x_n, HAS_W, FILTER, FAST)
            better = key_p > best_p  # strict: a slot keeps its earlier (lower) index on ties
            best_p = tl.where(better, key_p, best_p)
            idx_p = tl.where(better, j, idx_p)
            mass = tl.maximum(mass, r)
            better = key_r > best_r
            best_r = tl.where(better, key_r, best_r)
            idx_r = tl.where(better, j, idx_r)
            if PRUNE:
                top_p = tl.max(best_p, axis=1)
                top_r = tl.max(best_r, axis=1)
                floor = tl.maximum(floor, column(tl.minimum(top_p, top_r), BLOCK_B))
    k_r = tl.max(best_r, axis=1)
    k_p = tl.max(best_p, axis=1)
    i_r = tl.min(tl.where(best_r == k_r[:, None], idx_r, 2147483647), axis=1)
    i_p = tl.min(tl.where(best_p == k_p[:, None], idx_p, 2147483647), axis=1)
    return k_r, i_r, k_p, i_p, (tl.max(mass, axis=1) > 0).to(tl.int32)


@triton.jit
def rows_stats_lanes(src, sb, sr, sv, thr_ptr, tid_ptr, b64, b_mask, n_rows, v_lo, v_hi, T, inv_T,
                     BLOCK_B: tl.constexpr, ROWS: tl.constexpr, FILTER: tl.constexpr, NT: tl.constexpr,
                     VEC: tl.constexpr, FAST: tl.constexpr):
    """row_lse_lanes over the n_rows rows of each batch row, one row after the other (no padding
    rows are streamed): (max, sum-exp) as two [BB, ROWS], -inf / 0 in rows >= n_rows."""
    i = tl.arange(0, ROWS)[None, :]
    m_all = tl.full((BLOCK_B, ROWS), NEG_INF, tl.float32)
    l_all = tl.zeros((BLOCK_B, ROWS), tl.float32)
    for k in range(n_rows):
        if FILTER:
            thr = tl.load(thr_ptr + b64 * n_rows + k, mask=b_mask, other=NEG_INF)
            tid = tl.load(tid_ptr + b64 * n_rows + k, mask=b_mask, other=0)
        else:
            thr = tl.zeros((BLOCK_B,), tl.float32)
            tid = tl.zeros((BLOCK_B,), tl.int32)
        m, l = row_lse_lanes(src + b64 * sb + k * sr, b_mask, sv, v_lo, v_hi, T, inv_T, thr, tid,
                             BLOCK_B, FILTER, NT, VEC, FAST)
        m_all = tl.where(i == k, m[:, None], m_all)
        l_all = tl.where(i == k, l[:, None], l_all)
    return m_all, l_all


@triton.jit
def row_argmax(rows, row_mask, v_lo, v_hi, sv,  # rows: [BB, R, 1] pointers
               BLOCK_B: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """(max z, lowest index of the max) over [v_lo, v_hi) of each row, raw logits: [BB, R] (T = 0)."""
    best = tl.full((BLOCK_B, ROWS), NEG_INF, tl.float32)
    arg = tl.zeros((BLOCK_B, ROWS), tl.int32) + v_lo
    for v0 in range(v_lo, v_hi, BLOCK_V):
        j = v0 + tl.arange(0, BLOCK_V)[None, None, :]
        z = load_scaled(rows + j.to(tl.int64) * sv, row_mask & (j < v_hi), 1.0, False)
        z_max = tl.max(z, axis=2)
        z_arg = tl.min(tl.where(z == z_max[:, :, None], j, BIG_INDEX), axis=2)
        better = z_max > best  # strict: an earlier block keeps its (lower) index on ties
        best = tl.where(better, z_max, best)
        arg = tl.where(better, z_arg, arg)
    return best, arg


@triton.jit
def load_scaled(ptrs, mask, T, SCALE: tl.constexpr):  # -> float32 z / T, -inf where masked
    z = tl.load(ptrs, mask=mask, other=NEG_INF).to(tl.float32)
    if SCALE:
        if T != 1.0:  # a uniform branch: z / 1 is z, and the correctly rounded division is not cheap
            z = tl.math.div_rn(z, T)
    return z


@triton.jit
def safe_log(x):  # log(x) for x > 0, -inf for x == 0 (no log(0) is evaluated)
    return tl.where(x > 0, tl.log(tl.where(x > 0, x, 1.0)), NEG_INF)
