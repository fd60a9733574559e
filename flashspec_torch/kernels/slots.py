"""The row-n sweep with a pruning vote per slot (``KernelConfig(sweep_slots=S)``; docs/kernel_notes.md).

``lanes.sweep_row_lanes`` decides per tile whether to evaluate its keys: one logit of the tile
above the pruning floor and every logit of the tile pays the keys (on the benchmark's flat rows,
``benchmarks/sweep_prune_sim.py`` evaluates 22.6% of the 256-logit tiles at B = 256's split of
V = 128256, T = 0.7). Here a tile is a [BB, N, S] block in which each thread holds S consecutive
logits (one 16-byte load for bf16, S = 8), and the vote is taken per *slot*: slot s is the s-th
logit of every thread, N logits spread over the tile, and only the slots that hold a logit above
the floor are evaluated (docs/kernel_notes.md has the fractions on the benchmark's rows).

The test every logit pays is cheaper than ``sweep_row_lanes``' as well (the same bound, rearranged):
both keys are at most lp2 + 24 - log2(2**24 (1 - u)) <= lp2 + 23 - log2(t'), with t' = 2**23 - 1 - m
(m = bits >> 9, the uniform's 23 bits; 2**24 (1 - u) = 2 t' + 1), so a logit can reach the floor K
only if t' <= 2**d, d = lp2 + 23 - K (+ the slack). The vote tests a weaker condition that costs less:
the top 16 bits of bits = h ^ (h >> 16) are those of h (mix's last step, ``random.mix_body``), so with
a = 65535 - (h >> 16), m <= 128 (65535 - a) + 127 and t' >= 128 a; a logit votes when a <= 2**(d - 7),
which every logit with t' <= 2**d does. That is one FFMA (K and the 7 folded into the row's constant),
one ex2, and a as a float straight from h (one shift, one xor with 0x4B00FFFF, one add), where the
tile vote takes an I2F, an lg2 and two adds. The hash's first step (x ^ (x >> 16), x = key ^ j) is
taken once per thread: j = j_t + s with j_t a multiple of S, so x = (key ^ j_t) ^ s and x >> 16 does
not see s.

The S votes cost one reduction per tile: each logit's vote is the bit 1 << s of its slot, OR-reduced
over the tile (in-thread first, then across threads: one REDUX on sm_90). A slot is taken out of
the thread's registers by a select on its (compile-time) position and an integer sum (``pick``),
which the compiler reduces to a register move; its keys are ``draw_keys``' (the hash recomputed
for the slot), and the running best of each slot is updated in place by a select on the same
position. Every logit's keys are those of ``sweep_row_lanes`` and every slot keeps the lowest
index among its ties, so the winner, hence every token, is the same.
"""

import triton
import triton.language as tl

from .lanes import NEG_INF, PRUNE_SLACK, draw_keys, exp2_scale, hash_gap, load_tile, log2_scaled, plane, sweep_scalars
from .random import mix

NEG_PAIR = tl.constexpr(-8323200)  # 0xFF80FF80: two bfloat16 -inf as one int32


@triton.jit
def bit_or(a, b):
    return a | b


@triton.jit
def pick(bits, col, s):  # int32 [BB, N, S] -> [BB, N, 1]: slot s of every thread (a register move)
    """Floats go through their bits: a float sum would turn -0.0 into 0.0."""
    return tl.sum(tl.where(col == s, bits, 0), axis=2, keep_dims=True)


@triton.jit
def slot_votes(x, j_t, col, k, lse_p2, floor, key_n, T, inv_T, thr_p, tid_p, FILTER: tl.constexpr, FAST: tl.constexpr):
    """[BB, N, S] int32 of a tile's raw logits x (j_t: [1, N, 1], each thread's first index): the bit 1 << s
    where the logit of slot s can reach the floor K ([BB, 1, 1] or a scalar), else 0."""
    # d - 7 = lp2 + 16 - K + slack (NaN for a logit of zero probability while K = -inf: never evaluated)
    d7 = log2_scaled(x, j_t + col, k, lse_p2 + (floor - PRUNE_SLACK - 16.0), T, inv_T, thr_p, tid_p, FILTER, FAST)
    a = hash_gap(key_n, j_t, col)  # 65535 - (mix >> 16) <= t' / 128
    return tl.where(a <= tl.math.exp2(d7), 1 << col, 0)


@triton.jit
def or_votes(vote, FAST: tl.constexpr):  # [BB, N, S] from slot_votes -> the OR of all (a scalar)
    if FAST:  # the GPU: one OR (in-thread, then one REDUX.OR across the warp)
        votes = tl.reduce(tl.reduce(tl.reduce(vote, 2, bit_or), 1, bit_or), 0, bit_or)
    else:  # the same bits by built-in reductions (column s holds 0 or 1 << s: a max over threads is their
        # OR, the sum of distinct bits the OR across slots); the interpreter calls a custom combine
        # once per element in Python (3/4 of its time here), and FAST is never set there
        votes = tl.sum(tl.max(tl.max(vote, axis=1), axis=0), axis=0)
    return votes


@triton.jit
def evaluate_slots(x, w, votes, j_t, col, k, lse_p2, lse_q2, key_n, x_n, T, inv_T, thr_p, tid_p, thr_q, tid_q,
                   best_r, idx_r, best_p, idx_p, mass, SLOTS: tl.constexpr, HAS_W: tl.constexpr, FILTER: tl.constexpr,
                   FAST: tl.constexpr, PAIRS: tl.constexpr):
    """The keys of the slots of one tile whose bit is set in votes, folded into each slot's running best
    (x, w: [BB, N, S] raw logits of z and w; the state: [BB, N, S]). PAIRS: w is ``load_slot_tile``'s packed pairs,
    unpacked here, where a slot voted, not on every tile."""
    x_b = x.to(tl.int32, bitcast=True)
    w_b = tile_floats(w, PAIRS, x.shape[0], x.shape[1], SLOTS).to(tl.int32, bitcast=True)
    for s in tl.static_range(SLOTS):
        if (votes >> s) & 1:
            j_s = j_t + s  # [1, N, 1]
            lp2 = log2_scaled(pick(x_b, col, s).to(tl.float32, bitcast=True), j_s, k, lse_p2, T, inv_T,
                              thr_p, tid_p, FILTER, FAST)
            key_p, key_r, r = draw_keys(lp2, mix(key_n ^ j_s.to(tl.uint32)),
                                        pick(w_b, col, s).to(tl.float32, bitcast=True), j_s, k, lse_q2, T,
                                        inv_T, thr_q, tid_q, x_n, HAS_W, FILTER, FAST)
            here = col == s
            better = here & (key_p > best_p)  # strict: a slot keeps its earlier (lower) index on ties
            best_p = tl.where(better, key_p, best_p)
            idx_p = tl.where(better, j_s, idx_p)
            mass = tl.where(here, tl.maximum(mass, r), mass)
            better = here & (key_r > best_r)
            best_r = tl.where(better, key_r, best_r)
            idx_r = tl.where(better, j_s, idx_r)
    return best_r, idx_r, best_p, idx_p, mass


@triton.jit
def slot_state(v_lo, BLOCK_B: tl.constexpr, N: tl.constexpr, SLOTS: tl.constexpr):
    """A slot sweep's running state: per slot the best key_r, its index, the best key_p, its index and the
    residual mass seen ([BB, N, S]), and the floor K ([BB, 1, 1]: a key some logit of the row reaches; -inf
    while none is known)."""
    best_r = tl.full((BLOCK_B, N, SLOTS), NEG_INF, tl.float32)
    best_p = tl.full((BLOCK_B, N, SLOTS), NEG_INF, tl.float32)
    idx_r = tl.zeros((BLOCK_B, N, SLOTS), tl.int32) + v_lo
    idx_p = tl.zeros((BLOCK_B, N, SLOTS), tl.int32) + v_lo
    mass = tl.zeros((BLOCK_B, N, SLOTS), tl.float32)
    return best_r, idx_r, best_p, idx_p, mass, plane(tl.full((BLOCK_B,), NEG_INF, tl.float32), BLOCK_B)


@triton.jit
def sweep_row_slots(z_row, w_row, sv_z, sv_w, v_lo, v_hi, T, inv_T, lse_p, lse_q, x_n, thr_p, tid_p, thr_q, tid_q,
                    k_final, b_mask, BLOCK_B: tl.constexpr, SWEEP_V: tl.constexpr, SLOTS: tl.constexpr,
                    HAS_W: tl.constexpr, FILTER: tl.constexpr, FAST: tl.constexpr, PAIRS: tl.constexpr):
    """Gumbel-max over [v_lo, v_hi) of row n, as ``lanes.sweep_row_lanes(PRUNE=True)`` (the same keys
    and floor; z_row, w_row: [BB] pointers, the rest [BB]; v_lo a multiple of SLOTS) with the vote per
    slot: returns (best_r, idx_r, best_p, idx_p, residual mass > 0), each [BB]. The floor K rises once
    per tile, after the tile's evaluated slots. One tile is loaded ahead of the one evaluated, held in
    registers: the whole tiles by loads without bounds, then the partial tile, if any.
    PAIRS: bfloat16 rows of unit stride, loaded as int32 pairs (``load_slot_tile``): z is widened by one
    shift or one mask per logit, w only in the slots that voted."""
    N: tl.constexpr = SWEEP_V // SLOTS
    col = tl.arange(0, SLOTS)[None, None, :]  # [1, 1, S]
    row = tl.arange(0, N)[None, :, None] * SLOTS  # [1, N, 1]
    z_rows = z_row[:, None, None]
    w_rows = w_row[:, None, None]
    live = b_mask[:, None, None]
    k = exp2_scale(inv_T, FILTER)
    lse_p2, lse_q2, key_n, x_n, thr_p, tid_p, thr_q, tid_q = sweep_scalars(
        lse_p, lse_q, k_final, x_n, thr_p, tid_p, thr_q, tid_q, BLOCK_B, 3, HAS_W, FILTER)
    best_r, idx_r, best_p, idx_p, mass, floor = slot_state(v_lo, BLOCK_B, N, SLOTS)
    v_whole = v_lo + (v_hi - v_lo) // SWEEP_V * SWEEP_V
    z_next, w_next = load_slot_tile(z_rows, w_rows, v_lo + row, col, sv_z, sv_w, live & (v_lo < v_whole), v_hi,
                                    SLOTS, HAS_W, PAIRS, True)
    for v0 in tl.range(v_lo, v_whole, SWEEP_V, loop_unroll_factor=1):
        j_t = v0 + row  # [1, N, 1]: each thread's first logit (a multiple of S)
        x, w = tile_floats(z_next, PAIRS, BLOCK_B, N, SLOTS), w_next  # (w: z again for a one-hot draft, unused)
        z_next, w_next = load_slot_tile(z_rows, w_rows, j_t + SWEEP_V, col, sv_z, sv_w,
                                        live & (v0 + SWEEP_V < v_whole), v_hi, SLOTS, HAS_W, PAIRS, True)
        best_r, idx_r, best_p, idx_p, mass, floor = slot_tile(
            x, w, j_t, col, k, lse_p2, lse_q2, floor, key_n, x_n, T, inv_T, thr_p, tid_p, thr_q, tid_q,
            best_r, idx_r, best_p, idx_p, mass, BLOCK_B, SLOTS, HAS_W, FILTER, FAST, PAIRS)
    if v_whole < v_hi:
        j_t = v_whole + row
        z, w = load_slot_tile(z_rows, w_rows, j_t, col, sv_z, sv_w, live, v_hi, SLOTS, HAS_W, PAIRS)
        best_r, idx_r, best_p, idx_p, mass, floor = slot_tile(
            tile_floats(z, PAIRS, BLOCK_B, N, SLOTS), w, j_t, col, k, lse_p2, lse_q2, floor, key_n, x_n, T, inv_T,
            thr_p, tid_p, thr_q, tid_q, best_r, idx_r, best_p, idx_p, mass, BLOCK_B, SLOTS, HAS_W, FILTER, FAST,
            PAIRS)
    return slot_winners(best_r, idx_r, best_p, idx_p, mass, BLOCK_B, SWEEP_V)


@triton.jit
def load_slot_tile(z_rows, w_rows, j_t, col, sv_z, sv_w, live, v_hi, SLOTS: tl.constexpr, HAS_W: tl.constexpr,
                   PAIRS: tl.constexpr, WHOLE: tl.constexpr = False):
    """The logits j_t + col of z and w (z again for a one-hot draft; -inf past v_hi or in masked batch rows): [BB, N, S]
    as loaded, or with PAIRS (bfloat16, unit strides, j_t and v_hi even) [BB, N, S // 2] int32, two logits each,
    packed.
    WHOLE: the tile lies below v_hi; loaded only in the rows where live ([BB, 1, 1]) is set, left undefined elsewhere
    (no fill: the caller never reads them)."""
    if PAIRS:  # the same loads on int32 rows: pair p holds logits 2p, 2p + 1
        z_rows, w_rows = z_rows.to(tl.pointer_type(tl.int32)), w_rows.to(tl.pointer_type(tl.int32))
        j = (j_t >> 1) + tl.arange(0, SLOTS // 2)[None, None, :]  # [1, N, S // 2]
        sv_z, sv_w, v_end, fill = 1, 1, v_hi >> 1, NEG_PAIR
    else:
        j, v_end, fill = j_t + col, v_hi, NEG_INF
    if WHOLE:
        z = tl.load(z_rows + j.to(tl.int64) * sv_z, mask=live)
        w = z
        if HAS_W:
            w = tl.load(w_rows + j.to(tl.int64) * sv_w, mask=live)
    else:
        z, w = load_tile(z_rows, w_rows, j, sv_z, sv_w, live, v_end, HAS_W, fill)
    return z, w


@triton.jit
def tile_floats(t, PAIRS: tl.constexpr, BLOCK_B: tl.constexpr, N: tl.constexpr, SLOTS: tl.constexpr):
    """``load_slot_tile``'s z or w as float32 [BB, N, S]: a pair's low half is the lower index (little-endian),
    widened by a shift, its high half by a mask."""
    if PAIRS:
        lo = (t << 16).to(tl.float32, bitcast=True)
        hi = (t & -65536).to(tl.float32, bitcast=True)
        x = tl.reshape(tl.join(lo, hi), (BLOCK_B, N, SLOTS))
    else:
        x = t.to(tl.float32)
    return x


@triton.jit
def slot_tile(x, w, j_t, col, k, lse_p2, lse_q2, floor, key_n, x_n, T, inv_T, thr_p, tid_p, thr_q, tid_q,
              best_r, idx_r, best_p, idx_p, mass, BLOCK_B: tl.constexpr, SLOTS: tl.constexpr, HAS_W: tl.constexpr,
              FILTER: tl.constexpr, FAST: tl.constexpr, PAIRS: tl.constexpr):
    """One tile of the slot-vote sweep (x, w: [BB, N, S] raw logits of z as float32 and of w): the vote at
    the floor, the voted slots' keys folded into the running bests, and the floor raised after them."""
    votes = or_votes(slot_votes(x, j_t, col, k, lse_p2, floor, key_n, T, inv_T, thr_p, tid_p, FILTER, FAST), FAST)
    if votes != 0:
        best_r, idx_r, best_p, idx_p, mass = evaluate_slots(
            x, w, votes, j_t, col, k, lse_p2, lse_q2, key_n, x_n, T, inv_T, thr_p, tid_p, thr_q, tid_q,
            best_r, idx_r, best_p, idx_p, mass, SLOTS, HAS_W, FILTER, FAST, PAIRS)
        top_p = tl.max(tl.max(best_p, axis=2), axis=1)  # [BB]
        top_r = tl.max(tl.max(best_r, axis=2), axis=1)
        floor = tl.maximum(floor, plane(tl.minimum(top_p, top_r), BLOCK_B))
    return best_r, idx_r, best_p, idx_p, mass, floor


@triton.jit
def slot_winners(best_r, idx_r, best_p, idx_p, mass, BLOCK_B: tl.constexpr, SWEEP_V: tl.constexpr):
    """[BB, N, S] running bests -> (best_r, idx_r, best_p, idx_p, residual mass > 0), each [BB]: the lowest
    index among the ties at the maximum."""
    best_r = tl.reshape(best_r, (BLOCK_B, SWEEP_V))
    best_p = tl.reshape(best_p, (BLOCK_B, SWEEP_V))
    idx_r = tl.reshape(idx_r, (BLOCK_B, SWEEP_V))
    idx_p = tl.reshape(idx_p, (BLOCK_B, SWEEP_V))
    k_r = tl.max(best_r, axis=1)
    k_p = tl.max(best_p, axis=1)
    i_r = tl.min(tl.where(best_r == k_r[:, None], idx_r, 2147483647), axis=1)
    i_p = tl.min(tl.where(best_p == k_p[:, None], idx_p, 2147483647), axis=1)
    return k_r, i_r, k_p, i_p, (tl.max(tl.max(mass, axis=2), axis=1) > 0).to(tl.int32)
