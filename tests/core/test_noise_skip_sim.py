"""The top-down Gumbel noise of benchmarks/noise_skip_sim.py: the law of independent Gumbels, and the tile
bounds it gives never pass over a winner (each check fails for a broken variant)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import noise_skip_sim as sim  # noqa: E402


def gumbel_ks(g: np.ndarray) -> float:  # Kolmogorov-Smirnov distance to the standard Gumbel law
    x = np.sort(g)
    cdf = np.exp(-np.exp(-x))
    n = x.size
    return float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))


def test_top_down_noise_is_standard_gumbel_with_the_tile_maximum_first():
    rng = np.random.default_rng(11)
    g, top = sim.top_down_noise(rng, 200_000 + 37, 64)  # a partial last tile too
    assert gumbel_ks(g) < 1.63 / math.sqrt(g.size)  # the KS test at the 1% level
    tiles = np.pad(g, (0, (-g.size) % 64), constant_values=-np.inf).reshape(-1, 64)
    np.testing.assert_array_equal(tiles.max(axis=1), top)  # M_t is the tile's largest noise, at one position
    assert np.all((tiles == top[:, None]).sum(axis=1) == 1)
    where = np.argmax(tiles[:-1], axis=1)  # the maximum's position: uniform over the tile
    assert abs(np.mean(where) - 31.5) < 4 * 18.5 / math.sqrt(where.size)


@pytest.mark.parametrize("broken", ["no ln n", "no truncation"])
def test_broken_top_down_noise_fails_the_law(monkeypatch, broken):
    """Without ln n the tile maxima are too small; without the truncation the others are plain Gumbels and
    the tile holds more than n draws' worth of large values: either way not n independent Gumbels."""
    rng = np.random.default_rng(11)
    v, tile = 200_000, 64
    if broken == "no ln n":
        top = -np.log(-np.log(rng.random(v // tile)))
        g = np.repeat(top, tile) - np.log(rng.exponential(size=v) + np.exp(-np.repeat(top, tile)))
        g[np.arange(v // tile) * tile] = top
    else:
        top = math.log(tile) - np.log(-np.log(rng.random(v // tile)))
        g = -np.log(rng.exponential(size=v))
        g[np.arange(v // tile) * tile] = top
    assert gumbel_ks(g) > 1.63 / math.sqrt(v)


def test_tile_bounds_never_lose_a_winner_and_skip_most_tiles():
    rng = np.random.default_rng(5)
    fractions = []
    for _ in range(4):
        lp2, lq2, _, _ = sim.draws_from_logits(rng, 2.0 * rng.standard_normal(40_000), 1.0)
        for first in (8, 32):
            f = sim.two_round_fraction(rng, lp2, lq2, 64, first)
            assert f["missed"] == 0, (first, f)
            fractions.append(f["tiles"])
        f = sim.top_down_fractions(rng, lp2, lq2, 5120, 64)
        assert f["missed"] == 0 and 0 < f["final"] <= f["programs"] <= 1, f
    assert 0 < np.mean(fractions) < 0.4, fractions  # (a floor from a few tiles is -inf where they hold no residual)
    with pytest.raises(ValueError, match="multiple"):  # programs across the generator's tiles: refused
        sim.top_down_fractions(rng, lp2, lq2, 5000, 64)


def test_a_bound_too_low_loses_winners(monkeypatch):
    real = sim.top_down_noise
    monkeypatch.setattr(sim, "top_down_noise", lambda *a: (lambda g, top: (g, top - 3.0))(*real(*a)))
    rng = np.random.default_rng(5)
    lost = 0
    for _ in range(4):
        lp2, lq2, _, _ = sim.draws_from_logits(rng, 2.0 * rng.standard_normal(20_000), 1.0)
        lost += sim.two_round_fraction(rng, lp2, lq2, 64, 1)["missed"]
    assert lost > 0


def test_the_pretest_skips_nothing_on_flat_rows():
    rng = np.random.default_rng(2)
    lp2, _, key_p, key_r = sim.draws_from_logits(rng, 2.0 * rng.standard_normal(50_000), 0.7)
    assert sim.pretest_fraction(lp2, key_p, key_r, 256) == 0.0
    assert sim.pretest_fraction(lp2 - 60.0, key_p, key_r, 256) == 1.0  # rows far below the floor: all skipped
