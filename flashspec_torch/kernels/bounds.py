"""Row n's draw from tile bounds written by the stats launch (``KernelConfig(tile_bounds=True)``).

The slot sweep (``slots.py``) reads every logit of row n (z and the draft row) and hashes it to decide
whether to evaluate it: ~1 warp instruction per logit in a launch bound by its latency
(docs/kernel_notes.md). Here the stats launch, which reads every row anyway and is bound by memory, also
stores per tile of BLOCK_V logits of every target row the bound ``lanes.noise_bound``: an upper bound of
both Gumbel keys of the tile's logits were that row row n, short of the row's normaliser. The final launch
then takes row n's tiles in decreasing order of bound - lse log2(e) and sweeps a tile (the slot sweep,
starting from the floor reached so far) only while its bound reaches the floor K = min(best key_p, best
key_r) (K = best key_p where the draw is from p): every tile left has keys below K, so it holds neither
winner. Exact, hence the tokens of every other path. On the benchmark's flat rows about 3 tiles of a row
are swept, whatever the tile size (2.7% of the 1024-logit tiles at V = 128256, 10.5% of the 4096-logit
ones: ``python benchmarks/sweep_prune_sim.py --tile-bounds 1024,2048,4096``), one after the other.
"""

import triton
import triton.language as tl

from .lanes import LOG2E, NEG_INF, PRUNE_SLACK
from .slots import sweep_row_slots
from .tile import BIG_INDEX


@triton.jit
def take_better(k_old, i_old, k_new, i_new):  # the larger key; on a tie the lower index (the sweeps' rule)
    better = (k_new > k_old) | ((k_new == k_old) & (i_new < i_old))
    return tl.where(better, k_new, k_old), tl.where(better, i_new, i_old)


@triton.jit
def pruning_floor(best_p, best_r, from_p):  # the key a logit must reach to matter: p's best alone when the draw is
    return tl.where(from_p, best_p, tl.minimum(best_p, best_r))  # from p, else -inf until residual mass was seen


@triton.jit
def sweep_row_bounded(z_row, w_row, bnd_row, n_tiles, sv_z, sv_w, V, T, inv_T, lse_p, lse_q, x_n,
                      k_final, b_mask, use_p, BLOCK_B: tl.constexpr, TILE: tl.constexpr, NTP: tl.constexpr,
                      SWEEP_V: tl.constexpr, SLOTS: tl.constexpr, HAS_W: tl.constexpr, FAST: tl.constexpr,
                      PAIRS: tl.constexpr):
    """Gumbel-max over all of row n (BLOCK_B = 1; z_row, w_row, bnd_row: [1] pointers to row n's logits,
    draft logits and n_tiles tile bounds; the rest [1]; no top-k / top-p): (best_r, idx_r, best_p, idx_p,
    residual mass > 0), each [1], as ``slots.sweep_row_slots`` over [0, V) returns them."""
    t = tl.arange(0, NTP)[None, :]
    bound = tl.load(bnd_row[:, None] + t, mask=b_mask[:, None] & (t < n_tiles), other=NEG_INF) - (lse_p * LOG2E)[:, None]
    best_r = tl.full((BLOCK_B,), NEG_INF, tl.float32)
    best_p = tl.full((BLOCK_B,), NEG_INF, tl.float32)
    idx_r = tl.full((BLOCK_B,), BIG_INDEX, tl.int32)
    idx_p = tl.full((BLOCK_B,), BIG_INDEX, tl.int32)
    mass = tl.zeros((BLOCK_B,), tl.int32)
    floor = tl.full((BLOCK_B,), NEG_INF, tl.float32)
    for _ in range(n_tiles):
        top = tl.max(bound, axis=1)  # [1]
        if tl.max(top, axis=0) >= tl.max(floor, axis=0) - PRUNE_SLACK:
            tile = tl.min(tl.where(bound == top[:, None], t, NTP), axis=1)  # [1]
            bound = tl.where(t == tile[:, None], NEG_INF, bound)
            v_lo = tl.max(tile, axis=0) * TILE
            k_r, i_r, k_p, i_p, m = sweep_row_slots(
                z_row, w_row, sv_z, sv_w, v_lo, tl.minimum(v_lo + TILE, V), T, inv_T, lse_p, lse_q, x_n,
                0.0, 0, 0.0, 0, k_final, b_mask, floor, BLOCK_B, SWEEP_V, SLOTS, HAS_W, False, FAST, PAIRS=PAIRS)
            best_r, idx_r = take_better(best_r, idx_r, k_r, i_r)
            best_p, idx_p = take_better(best_p, idx_p, k_p, i_p)
            mass = tl.maximum(mass, m)
            floor = pruning_floor(best_p, best_r, use_p)
    return best_r, idx_r, best_p, idx_p, mass
