"""Two ways to skip the row-n sweep's per-logit hash, simulated in NumPy before building either (both dropped).

The final launch is bound by what every logit of row n pays: the hash of its index and the slot vote
(docs/kernel_notes.md). Both ideas below would let a whole tile of logits skip the hash.

``pretest``: a tile is skipped when even the largest noise the generator can give (24 in log2 units: the
uniform's 24 bits, ``slots.py``) cannot lift its largest logit to the floor K: max lp2 + 24 < K. Counted here
with the most favourable floor there is, the row's final one (min of the best key_p and key_r of the whole
row), so the fractions are upper bounds for any kernel.

``top-down``: a different generator (not the shared one): per tile of ``tile`` indices, the tile's largest
Gumbel M_t = ln n + G first (one draw), its position uniform, and the others Gumbel truncated below M_t,
g = -ln(E + exp(-M_t)) with E ~ Exp(1): the same joint law as n independent Gumbels. A tile whose
max lp2 + M_t log2(e) is below the floor is skipped. Counted for programs of ``span`` logits that raise their
floor from their own tiles (as the kernel's sweep does), and with the row's final floor.

Rows: the benchmark's flat rows (z = 2 N(0, 1), ``verify_kernels.py``) and rows drawn from SmolLM2's recorded
decoding rows (``llm_rows.py``), the draft row w = z + 1.4 N(0, 1) for both.

    python benchmarks/noise_skip_sim.py                 # both studies, flat and LLM rows, V = 128256, T = 0.7
"""

from __future__ import annotations

import argparse

import numpy as np

LOG2E = 1.4426950408889634
MAX_NOISE2 = 24.0  # the largest Gumbel noise of a 24-bit uniform, in log2 units (slots.py)


def draws_from_logits(rng: np.random.Generator, z: np.ndarray, temperature: float):
    """z [V] -> lp2, lq2 (the draft w = z + 1.4 N(0, 1)), key_p, key_r: [V] each, log2 units."""
    w = z + 1.4 * rng.standard_normal(z.size)
    lp = z / temperature - np.logaddexp.reduce(z / temperature)
    lq = w / temperature - np.logaddexp.reduce(w / temperature)
    g = -np.log(-np.log(rng.random(z.size)))
    with np.errstate(divide="ignore"):
        key_r = (np.log(np.maximum(np.exp(lp) - np.exp(lq), 0.0)) + g) * LOG2E
    return lp * LOG2E, lq * LOG2E, (lp + g) * LOG2E, key_r


def llm_logits(n: int, v: int, seed: int) -> np.ndarray:  # [n, V] rows drawn from the recorded SmolLM2 rows
    import torch

    import llm_rows

    gen = torch.Generator().manual_seed(seed)
    return llm_rows.sample_rows(llm_rows.load(), n, v, "cpu", gen).numpy().astype(np.float64)


def tile_max(x: np.ndarray, tile: int) -> np.ndarray:  # [V] -> [ceil(V / tile)]
    pad = (-x.size) % tile
    return np.pad(x, (0, pad), constant_values=-np.inf).reshape(-1, tile).max(axis=1)


def pretest_fraction(lp2: np.ndarray, key_p: np.ndarray, key_r: np.ndarray, tile: int) -> float:
    """The fraction of tiles whose every logit stays below the row's final floor with the largest noise."""
    floor = min(key_p.max(), key_r.max())
    return float(np.mean(tile_max(lp2, tile) + MAX_NOISE2 < floor))


def top_down_noise(rng: np.random.Generator, v: int, tile: int):
    """-> g [V] (nats) and M [tiles]: independent standard Gumbels, drawn tile by tile from the top."""
    n_t = np.full((v + tile - 1) // tile, tile)
    n_t[-1] = v - tile * (n_t.size - 1)
    top = np.log(n_t) - np.log(-np.log(rng.random(n_t.size)))  # M_t = ln n + Gumbel: the max of n Gumbels
    where = (rng.random(n_t.size) * n_t).astype(np.int64)  # its position, uniform in the tile
    per = np.repeat(top, n_t)
    g = -np.log(rng.exponential(size=v) + np.exp(-per))  # the others: Gumbel truncated below M_t
    g[np.arange(n_t.size) * tile + where] = top
    return g, top


def top_down_keys(rng: np.random.Generator, lp2: np.ndarray, lq2: np.ndarray, tile: int):
    """A row's keys under the top-down generator and its tile bounds: key_p, key_r [V] (log2 units), bound [tiles]."""
    g, top = top_down_noise(rng, lp2.size, tile)
    key_p = lp2 + g * LOG2E
    with np.errstate(divide="ignore"):
        key_r = np.log2(np.maximum(np.exp2(lp2) - np.exp2(lq2), 0.0)) + g * LOG2E
    return key_p, key_r, tile_max(lp2, tile) + top * LOG2E


def top_down_fractions(rng: np.random.Generator, lp2: np.ndarray, lq2: np.ndarray, span: int, tile: int) -> dict:
    """Tiles evaluated by programs of ``span`` logits (floor from their own tiles) and under the row's final
    floor; ``missed``: programs that lost their best key (0: the tile bound is exact)."""
    if span % tile:
        raise ValueError(f"{span=} must be a multiple of {tile=}: a program sweeps whole tiles of the generator")
    key_p, key_r, bound = top_down_keys(rng, lp2, lq2, tile)
    final = min(key_p.max(), key_r.max())
    evaluated = missed = 0
    for lo in range(0, lp2.size, span):
        floor = best_p = best_r = -np.inf
        for t0 in range(lo, min(lo + span, lp2.size), tile):
            if bound[t0 // tile] >= floor - 0.01:
                sl = slice(t0, t0 + tile)
                best_p, best_r = max(best_p, key_p[sl].max()), max(best_r, key_r[sl].max())
                floor = min(best_p, best_r)
                evaluated += 1
        whole = slice(lo, min(lo + span, lp2.size))
        missed += best_p != key_p[whole].max() or best_r != key_r[whole].max()
    return dict(programs=evaluated / bound.size, final=float(np.mean(bound >= final - 0.01)), missed=missed)


def two_round_fraction(rng: np.random.Generator, lp2: np.ndarray, lq2: np.ndarray, tile: int, first: int) -> dict:
    """The top-down generator with a row's tile bounds known up front (a stats launch can store them: one draw
    per tile and the tile's largest logit): evaluate the ``first`` tiles of highest bound, take the floor from
    them, then every tile whose bound reaches it (in parallel). -> fraction of tiles evaluated, and
    ``missed`` (0: both winners found)."""
    key_p, key_r, bound = top_down_keys(rng, lp2, lq2, tile)
    tiles_p, tiles_r = tile_max(key_p, tile), tile_max(key_r, tile)
    head = np.argsort(-bound, kind="stable")[:first]
    floor = min(tiles_p[head].max(), tiles_r[head].max())
    second = bound >= floor - 0.01
    second[head] = True
    missed = tiles_p[second].max() != key_p.max() or tiles_r[second].max() != key_r.max()
    return dict(tiles=float(second.mean()), missed=int(missed))


def rows_of(kind: str, rng: np.random.Generator, n: int, v: int, temperature: float):
    """n (lp2, lq2, key_p, key_r) of the benchmark's flat rows (z = 2 N(0, 1)) or of LLM-shaped rows."""
    logits = llm_logits(n, v, seed=int(rng.integers(2**31))) if kind == "llm" else None
    for i in range(n):
        z = logits[i] if kind == "llm" else 2.0 * rng.standard_normal(v)
        yield draws_from_logits(rng, z, temperature)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tile", type=int, default=256)
    p.add_argument("--spans", type=lambda s: [int(k) for k in s.split(",")], default=[5376, 42752],
                   help="logits per sweep program (B = 256's split of V = 128256, and a third of the row)")
    p.add_argument("--first", type=lambda s: [int(k) for k in s.split(",")], default=[1, 8, 32],
                   help="tiles of highest bound evaluated before the floor is taken (two_round_fraction)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--kinds", type=lambda s: s.split(","), default=["flat", "llm"])
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    for kind in args.kinds:
        pre, spans, final, missed = [], {s: [] for s in args.spans}, [], 0
        rounds = {k: [] for k in args.first}
        for lp2, lq2, key_p, key_r in rows_of(kind, rng, args.rows, args.vocab, args.temperature):
            pre.append(pretest_fraction(lp2, key_p, key_r, args.tile))
            for s in args.spans:
                f = top_down_fractions(rng, lp2, lq2, s, args.tile)
                spans[s].append(f["programs"])
                missed += f["missed"]
            final.append(f["final"])
            for k in args.first:
                f = two_round_fraction(rng, lp2, lq2, args.tile, k)
                rounds[k].append(f["tiles"])
                missed += f["missed"]
        print(f"{kind} rows, V={args.vocab}, T={args.temperature}, tiles of {args.tile}: "
              f"pretest skips at most {100 * np.mean(pre):.1f}% of the tiles (row's final floor); "
              f"top-down generator evaluates "
              + ", ".join(f"{100 * np.mean(spans[s]):.1f}% (programs of {s})" for s in args.spans)
              + f", {100 * np.mean(final):.1f}% under the row's final floor, "
              + ", ".join(f"{100 * np.mean(rounds[k]):.1f}% (floor from the {k} highest bounds)" for k in args.first)
              + f"; programs or rows that lost a winner: {missed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
