"""How much of the row-n sweep the exact pruning evaluates, simulated in NumPy on the benchmark's rows.

The rows are ``verify_kernels.py``'s (z = 2 N(0, 1), draft log-probs of w = z + 1.4 N(0, 1) at
temperature T; residual draws), split as the final launch splits row n: programs of ``span``
logits, each sweeping tiles of ``tile`` logits from a floor of -inf. A tile (``sweep_row_lanes``)
or a slot (``sweep_row_slots``: the logits of a tile with the same index mod ``slots``) is
evaluated when one of its logits' bound reaches the floor K = min(best key_p, best key_r) so far,
less the kernels' 0.01 slack; K rises after each tile with an evaluated part. The bounds are the
kernels' own: the tile vote's lp2 + 24 - log2(2**24 (1 - u)), and the slot vote's lp2 + 16 - log2(a)
with a = 65535 - (m >> 7) from the top 16 bits of the hash (``slots.slot_votes``; m: the uniform's 23
bits, u = (2m + 1) / 2**24), which a few more logits pass than the exact lp2 + 23 - log2(2**23 - 1 - m).
The uniforms' bits are NumPy's, not the generator's (the same law).

    python benchmarks/sweep_prune_sim.py --span 5344 --tile 256 --slots 8     # B=256's split of V=128256
    python benchmarks/sweep_prune_sim.py --tile-bounds 1024,2048,4096          # KernelConfig(tile_bounds=True)

``--tile-bounds``: the final launch of ``kernels/bounds.py``, one program per row: the tiles of the whole row
taken in decreasing order of the stats launch's bound (``lanes.noise_bound``: the slot bound with log2 a
rounded down to an integer, at most 24 above lp2), each swept whole while its bound reaches the floor.
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def flat_draws(rng: np.random.Generator, v: int, temperature: float):
    """One benchmark row and its draw: -> lp2 (log2 p), m (the uniforms' 23 bits, as uniform_from_bits takes
    them), key_p, key_r: [V] each."""
    z = 2.0 * rng.standard_normal(v)
    w = z + 1.4 * rng.standard_normal(v)
    lp = z / temperature - np.logaddexp.reduce(z / temperature)
    lq = w / temperature - np.logaddexp.reduce(w / temperature)
    m = rng.integers(0, 2**23, v)
    g2 = -np.log2(-np.log((2 * m + 1) / 2**24))
    with np.errstate(divide="ignore"):
        key_r = np.log2(np.maximum(np.exp(lp) - np.exp(lq), 0.0)) + g2
    lp2 = lp / math.log(2)
    return lp2, m, lp2 + g2, key_r


def flat_rows(rng: np.random.Generator, v: int, temperature: float):
    """-> key_p, key_r, tile_bound, slot_bound: [V] each (the slot vote's bound is +inf where a = 0)."""
    lp2, m, key_p, key_r = flat_draws(rng, v, temperature)
    with np.errstate(divide="ignore"):
        slot_bound = lp2 + 16.0 - np.log2(65535 - (m >> 7))
    t = np.maximum(1.0, np.floor((1.0 - (2 * m + 1) / 2**24) * 2**24))
    return key_p, key_r, lp2 + 24.0 - np.log2(t), slot_bound


def noise_bound(lp2, m):  # lanes.noise_bound less lse: lp2 + min(16 - floor(log2 a), 24), a = 65535 - (m >> 7)
    a = 65535 - (m >> 7)
    with np.errstate(divide="ignore"):
        c = np.where(a > 0, 16 - np.floor(np.log2(np.maximum(a, 1))), 24.0)
    return lp2 + np.minimum(c, 24.0)


def bounded_fraction(v: int, tile: int, temperature: float = 0.7, rows: int = 3, seed: int = 0) -> dict:
    """KernelConfig(tile_bounds=True)'s final launch on flat rows: the fraction of a row's tiles it sweeps, and
    ``missed``: rows whose best key_p or key_r it lost (0: exact)."""
    rng = np.random.default_rng(seed)
    swept = total = missed = 0
    for _ in range(rows):
        lp2, m, key_p, key_r = flat_draws(rng, v, temperature)
        bound = noise_bound(lp2, m)
        starts = range(0, v, tile)
        tile_bound = np.array([bound[t0:t0 + tile].max() for t0 in starts])
        floor = best_p = best_r = -np.inf
        for k in np.argsort(-tile_bound, kind="stable"):
            if tile_bound[k] < floor - 0.01:
                break
            sl = slice(k * tile, (k + 1) * tile)
            best_p, best_r = max(best_p, key_p[sl].max()), max(best_r, key_r[sl].max())
            floor = min(best_p, best_r)
            swept += 1
        total += len(starts)
        missed += (best_p, best_r) != (key_p.max(), key_r.max())
    return dict(tiles=swept / total, missed=missed)


def evaluated_fractions(v: int, span: int, tile: int, slots: int = 1, temperature: float = 0.7, rows: int = 3,
                        seed: int = 0) -> dict:
    """Fractions of the tiles with an evaluated part, and of the slots evaluated (slots = 1: the tile vote);
    ``missed``: programs whose pruned sweep lost its best key_p or key_r (0: the bound is exact)."""
    rng = np.random.default_rng(seed)
    tiles = any_slot = slots_done = slots_total = missed = 0
    for _ in range(rows):
        key_p, key_r, tile_bound, slot_bound = flat_rows(rng, v, temperature)
        bound = slot_bound if slots > 1 else tile_bound
        for lo in range(0, v, span):
            whole = slice(lo, min(lo + span, v))
            want = (key_p[whole].max(), key_r[whole].max())  # what the program's sweep must still find
            floor, best_p, best_r = -np.inf, -np.inf, -np.inf
            for t0 in range(lo, min(lo + span, v), tile):
                sl = slice(t0, min(t0 + tile, lo + span, v))
                hit = bound[sl] >= floor - 0.01
                size = hit.size
                part = np.zeros(max(1, slots), bool)
                np.logical_or.at(part, np.arange(size) % max(1, slots), hit)
                tiles += 1
                slots_total += part.size
                slots_done += int(part.sum())
                if part.any():
                    any_slot += 1
                    keep = part[np.arange(size) % max(1, slots)]
                    best_p = max(best_p, key_p[sl][keep].max())
                    best_r = max(best_r, key_r[sl][keep].max())
                    floor = min(best_p, best_r)
            missed += (best_p, best_r) != want and not (want[1] == -np.inf and best_p == want[0])
    return dict(tiles=any_slot / tiles, slots=slots_done / slots_total, missed=missed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--span", type=int, default=5344, help="logits per sweep program (the final launch's sweep_chunk)")
    p.add_argument("--tile", type=int, default=256)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tile-bounds", type=lambda t: [int(k) for k in t.split(",")], default=None,
                   help="tile sizes of KernelConfig(tile_bounds=True) to simulate instead")
    args = p.parse_args(argv)
    if args.tile_bounds:
        for tile in args.tile_bounds:
            f = bounded_fraction(args.vocab, tile, args.temperature, rows=8)
            print(f"V={args.vocab} T={args.temperature} tile bounds of {tile} logits: the final launch sweeps "
                  f"{100 * f['tiles']:.1f}% of row n's tiles (rows that lost a winner: {f['missed']})")
        return 0
    one = evaluated_fractions(args.vocab, args.span, args.tile, 1, args.temperature)
    f = evaluated_fractions(args.vocab, args.span, args.tile, args.slots, args.temperature)
    print(f"V={args.vocab} span={args.span} tile={args.tile} T={args.temperature}: the tile vote evaluates "
          f"{100 * one['tiles']:.1f}% of the tiles; {args.slots} slot votes {100 * f['slots']:.1f}% of the slots "
          f"({100 * f['tiles']:.1f}% of the tiles evaluate one or more)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
