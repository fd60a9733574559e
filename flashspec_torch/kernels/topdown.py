"""Row n's draw under the top-down FINAL noise (``KernelConfig(top_down=True)``; docs/kernel_notes.md).

With the shared generator's noise (one independent Gumbel per logit, ``slots.py``) a sweep must hash every
logit of row n to know it cannot win: ~1 warp instruction per logit, the final launch's cost. The top-down
noise (``flashspec.random.gumbel_top_down``: same law) draws each block of 64 logits' largest Gumbel first,
M_t = -ln c_t with c_t = E_t / 64, at entry I_t, and the others below it, -ln(c_t + E_j). So a block's keys are
all at most

    max_j z_j k - lse_p log2(e) - log2(c_t)      (key_r <= key_p; k = log2(e) / T)

from one hash per block. The stats launch, which reads every target row anyway, keeps every block of 64 logits'
maximum (``lanes.row_lse_lanes``, BOUNDS = 2). Each final program of row n bounds the blocks of its own range
(one hash per block), draws the best block of each of SEEDS segments of it as one tile, and takes the floor K = min
of its best key_p and key_r (key_p's alone where the draw is from p; with other programs on the row, the row's
maxima so far: atomic max on their ordered bits, reset by the stats launch). It then lists its other blocks whose
bound reaches K (a prefix sum into a scratch row of NR int32) and draws them PER at a time as [PER, 64] tiles: a
few dependent round trips a program, where drawing one block at a time made each program a chain of them. Exact:
every K is a key some logit of the row reaches, so a block left out holds neither winner; a residual row whose
seeds hold no residual mass keeps K = -inf and draws every block (its fallback to p stays exact). With
``KernelConfig(top_down_maxima="final")`` the stats launch keeps nothing: each final program first reads z of its
range of row n and stores its blocks' maxima itself (``store_block_maxima``: one max per logit, no hash).
``benchmarks/noise_skip_sim.py``: ~2.5% of the blocks of a flat V = 128256 row drawn with the row's final floor,
~10% at V = 32000; timings: docs/kernel_notes.md, "Top-down on the H200".
"""

import triton
import triton.language as tl

from .bounds import pruning_floor, take_better
from .lanes import LOG2E, NEG_INF, PRUNE_SLACK, exp2_scale, from_ordered, log2_approx, neg_log_uniform, ordered
from .random import mix
from .tile import BIG_INDEX

BLOCK = tl.constexpr(64)  # flashspec.random.BLOCK


@triton.jit
def block_noise(k_blk, blk):  # uint32 [1], int32 [...] -> (c_t, I_t): c_t = E_t / 64 and the maximum's entry
    bits = mix(k_blk ^ blk.to(tl.uint32))
    return neg_log_uniform(bits) * 0.015625, (bits & 63).to(tl.int32)


@triton.jit
def block_keys(z_row, w_row, sv_z, sv_w, j, live, c, top, k, lse_p2, lse_q2, x_n, k_final,
               HAS_W: tl.constexpr, FAST: tl.constexpr):
    """key_p, key_r and r of logits j ([R, 64]: whole blocks) under the top-down noise; c, top: [R, 1] of their
    blocks; -inf keys where not live."""
    z = tl.load(z_row + j.to(tl.int64) * sv_z, mask=live, other=NEG_INF).to(tl.float32)
    lp2 = z * k - lse_p2
    e = neg_log_uniform(mix(k_final ^ j.to(tl.uint32)))
    e = tl.where((j & 63) == top, 0.0, e)  # the block's maximum: -ln c_t
    g2 = -log2_approx(c + e, FAST)
    if HAS_W:
        w = tl.load(w_row + j.to(tl.int64) * sv_w, mask=live, other=NEG_INF).to(tl.float32)
        q = tl.math.exp2(w * k - lse_q2)
    else:
        q = tl.where(j == x_n, 1.0, 0.0)  # one-hot draft
    r = tl.maximum(tl.math.exp2(lp2) - q, 0.0)
    key_p = tl.where(live, lp2 + g2, NEG_INF)
    key_r = tl.where(live, log2_approx(r, FAST) + g2, NEG_INF)
    return key_p, key_r, tl.where(live, r, 0.0)


@triton.jit
def best_of(key, j):  # [R, 64] -> (the largest key, its lowest index): scalars
    top = tl.max(tl.max(key, axis=1), axis=0)
    return top, tl.min(tl.min(tl.where(key == top, j, BIG_INDEX), axis=1), axis=0)


@triton.jit
def eval_blocks(z_row, w_row, sv_z, sv_w, blks, live, V, k, lse_p2, lse_q2, x_n, k_final, k_blk, best_r, idx_r, best_p,
                idx_p, mass, HAS_W: tl.constexpr, FAST: tl.constexpr):
    """Blocks blks ([R]; nothing where live [R] is not set), drawn as one [R, 64] tile, folded into the running
    bests (scalars)."""
    cb, topb = block_noise(k_blk, blks)
    jb = blks[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [R, 64]
    key_p, key_r, r = block_keys(z_row, w_row, sv_z, sv_w, jb, live[:, None] & (jb < V), cb[:, None], topb[:, None],
                                 k, lse_p2, lse_q2, x_n, k_final, HAS_W, FAST)
    kp, ip = best_of(key_p, jb)
    kr, ir = best_of(key_r, jb)
    best_p, idx_p = take_better(best_p, idx_p, kp, ip)
    best_r, idx_r = take_better(best_r, idx_r, kr, ir)
    return best_r, idx_r, best_p, idx_p, mass | (tl.max(tl.max(r, axis=1), axis=0) > 0)


@triton.jit
def share_floor(kf_row, best_p, best_r, from_p, live):
    """Publish this program's best keys to the row's shared maxima (atomic max on their ordered bits) and return the
    floor from what all its programs have found so far: keys real logits of the row reach."""
    g_p = from_ordered(tl.atomic_max(kf_row, ordered(best_p), mask=live, sem="relaxed"))
    g_r = from_ordered(tl.atomic_max(kf_row + 1, ordered(best_r), mask=live, sem="relaxed"))
    k_p = tl.maximum(best_p, tl.where(live, g_p, NEG_INF))
    k_r = tl.maximum(best_r, tl.where(live, g_r, NEG_INF))
    return pruning_floor(k_p, k_r, from_p)


@triton.jit
def store_block_maxima(z_row, bm_row, blk_lo, blk_hi, sv_z, V, live, CB: tl.constexpr):
    """Row n's largest logit of every block of 64 in [blk_lo, blk_hi) at bm_row[t] (raw z; live: a scalar), read
    CB blocks at a time, the next CB loaded before this step's maxima: one max per logit, no hash."""
    cb = tl.arange(0, CB)
    e = tl.arange(0, BLOCK)[None, :]
    blk = blk_lo + cb
    j = blk[:, None] * BLOCK + e
    z_next = tl.load(z_row + j.to(tl.int64) * sv_z, mask=(blk < blk_hi)[:, None] & (j < V) & live, other=NEG_INF)
    for t0 in range(blk_lo, blk_hi, CB):
        blk = t0 + cb
        z = z_next
        jn = (blk + CB)[:, None] * BLOCK + e
        z_next = tl.load(z_row + jn.to(tl.int64) * sv_z, mask=(blk + CB < blk_hi)[:, None] & (jn < V) & live,
                         other=NEG_INF)
        tl.store(bm_row + blk, tl.max(z, axis=1).to(tl.float32), mask=(blk < blk_hi) & live)
    tl.debug_barrier()  # read back by other threads of the program


@triton.jit
def sweep_row_top_down(z_row, w_row, bm_row, kf_row, list_row, n_blocks, blk_lo, blk_hi, sv_z, sv_w, V, inv_T, lse_p,
                       lse_q, x_n, k_final, k_blk, b_mask, use_p, NR: tl.constexpr, HAS_W: tl.constexpr,
                       FAST: tl.constexpr, SEEDS: tl.constexpr = 1, PER: tl.constexpr = 1, share=True,
                       OWN_MAXIMA: tl.constexpr = False, CB: tl.constexpr = 16):
    """Gumbel-max over blocks [blk_lo, blk_hi) of row n (one batch row: z_row, w_row, bm_row [1] pointers to row n's
    logits, draft logits and n_blocks block maxima (the stats launch's), kf_row a pointer to the row's two shared
    maxima (reset by the stats launch), list_row to NR int32 of scratch; the rest [1]; NR: a power of two >= the
    range's blocks; SEEDS: segments of the range whose best block is drawn first, as one tile; PER: blocks drawn
    together after them, their loads in flight at once; share: other programs draw the row's other ranges;
    OWN_MAXIMA: the block maxima are not the stats launch's: the program reads z of its range of row n first and
    writes them to bm_row itself, CB blocks a step):
    (best_r, idx_r, best_p, idx_p, residual mass > 0), each [1], as ``slots.sweep_row_slots`` returns them for its
    range."""
    k = exp2_scale(inv_T, False)
    lse_p2 = tl.max(lse_p, axis=0) * LOG2E
    lse_q2 = tl.max(lse_q, axis=0) * LOG2E
    live = tl.max(b_mask.to(tl.int32), axis=0) != 0
    k_final = tl.max(k_final, axis=0)
    k_blk = tl.max(k_blk, axis=0)
    x_n = tl.max(x_n, axis=0)
    from_p = tl.max(use_p.to(tl.int32), axis=0) != 0
    if OWN_MAXIMA:
        store_block_maxima(z_row, bm_row, blk_lo, blk_hi, sv_z, V, live, CB)
    # ---- the bound of every block of the range: max z k - lse_p log2(e) - log2 c_t
    tr = blk_lo + tl.arange(0, NR)
    mine = (tr < blk_hi) & (tr < n_blocks) & live
    c, _ = block_noise(k_blk, tr)
    reach = tl.load(bm_row + tr, mask=mine, other=NEG_INF) * k - lse_p2 - log2_approx(c, FAST)
    reach = tl.where(mine, reach, NEG_INF)
    # ---- the seeds: the best block of each of SEEDS equal segments of the range, drawn as one tile, give the floor
    seg: tl.constexpr = NR // SEEDS
    tr2 = tl.reshape(tr, (SEEDS, seg))
    reach2 = tl.reshape(reach, (SEEDS, seg))
    mine2 = tl.reshape(mine.to(tl.int32), (SEEDS, seg)) != 0
    top = tl.max(reach2, axis=1)  # [SEEDS]
    seed = tl.min(tl.where(mine2 & (reach2 == top[:, None]), tr2, BIG_INDEX), axis=1)
    has = seed < BIG_INDEX
    neg = tl.full((), NEG_INF, tl.float32)
    big = tl.full((), BIG_INDEX, tl.int32)
    best_r, idx_r, best_p, idx_p, mass = eval_blocks(
        z_row, w_row, sv_z, sv_w, tl.where(has, seed, 0), has, V, k, lse_p2, lse_q2, x_n, k_final, k_blk, neg, big,
        neg, big, tl.full((), 0, tl.int1), HAS_W, FAST)
    if share:  # the row's maxima so far, this program's seeds among them
        floor = share_floor(kf_row, best_p, best_r, from_p, tl.max(has.to(tl.int32), axis=0) != 0)
    else:
        floor = pruning_floor(best_p, best_r, from_p)
    # ---- every other block of the range whose bound reaches the floor, listed in order (a prefix sum into the
    # scratch row), then drawn PER at a time
    seeded = tl.reshape((tr2 == seed[:, None]).to(tl.int32), (NR,)) != 0
    alive = mine & ~seeded & (reach >= floor - PRUNE_SLACK)
    at = tl.cumsum(alive.to(tl.int32), axis=0)
    left = tl.max(at, axis=0)
    tl.store(list_row + at - 1, tr, mask=alive)
    tl.debug_barrier()  # the list is read back by other threads of the program
    q = tl.arange(0, PER)
    for base in range(0, left, PER):
        ok = base + q < left
        blks = tl.load(list_row + base + q, mask=ok, other=0)
        best_r, idx_r, best_p, idx_p, mass = eval_blocks(
            z_row, w_row, sv_z, sv_w, blks, ok, V, k, lse_p2, lse_q2, x_n, k_final, k_blk, best_r, idx_r, best_p,
            idx_p, mass, HAS_W, FAST)
    one = tl.zeros((1,), tl.int32)
    return one + best_r, one + idx_r, one + best_p, one + idx_p, one + mass.to(tl.int32)
