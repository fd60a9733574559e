"""The pruning simulation behind benchmarks/verify_sass.py's sweep model: exact, and it counts what it says."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sweep_prune_sim as sim  # noqa: E402


def test_simulated_pruning_never_loses_a_winner():
    for tile, slots in ((256, 1), (256, 8), (64, 4)):
        f = sim.evaluated_fractions(20000, 5000, tile, slots, temperature=0.7, rows=2, seed=tile + slots)
        assert f["missed"] == 0, (tile, slots, f)
        assert 0 < f["slots"] <= f["tiles"] <= 1, (tile, slots, f)


def test_slot_votes_evaluate_fewer_logits_than_tile_votes():
    one = sim.evaluated_fractions(40000, 5344, 256, 1, rows=2)
    eight = sim.evaluated_fractions(40000, 5344, 256, 8, rows=2)
    assert one["slots"] == one["tiles"]  # one slot per tile: the tile vote
    assert eight["slots"] < 0.6 * one["tiles"], (one, eight)


def test_a_bound_too_low_loses_winners(monkeypatch):
    """The check can fail: a bound 2 log2 units below the true one passes over winners (either vote)."""
    rows = sim.flat_rows
    monkeypatch.setattr(sim, "flat_rows", lambda *a: (lambda kp, kr, bt, bs: (kp, kr, bt - 2.0, bs - 2.0))(*rows(*a)))
    assert sim.evaluated_fractions(20000, 5000, 64, 4, rows=2)["missed"] > 0
    assert sim.evaluated_fractions(20000, 5000, 64, 1, rows=2)["missed"] > 0


def test_the_slot_bound_is_the_kernels_weaker_vote():
    """Never below the exact bound lp2 + 23 - log2(t') (t' = 2**23 - 1 - m: every key is at most it), and
    above it by at most log2 of (128 a + 127) / (128 a): the vote of ``slots.slot_votes``."""
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    key_p, key_r, _, slot_bound = sim.flat_rows(rng, 50000, 0.7)
    rng.bit_generator.state = state  # the same draws again, to rebuild m and lp2
    z = 2.0 * rng.standard_normal(50000)
    rng.standard_normal(50000)
    m = rng.integers(0, 2**23, 50000)
    lp2 = (z / 0.7 - np.logaddexp.reduce(z / 0.7)) / np.log(2)
    exact = lp2 + 23.0 - np.log2(2**23 - 1 - m)
    assert np.all(slot_bound >= exact - 1e-9)
    assert np.all(np.maximum(key_p, key_r) <= exact + 1e-9)
    a = 65535 - (m >> 7)
    finite = a > 0
    assert np.all(slot_bound[finite] - exact[finite] <= np.log2((128 * a[finite] + 127) / (128 * a[finite])) + 1e-9)


def test_tile_bounds_bound_both_keys_and_never_lose_a_winner():
    """lanes.noise_bound as the simulation takes it: above key_p and key_r of every logit (a tile pruned by it
    holds no winner), at most 24 above lp2; the bounded final launch sweeps a few tiles and finds both winners."""
    rng = np.random.default_rng(5)
    m = rng.integers(0, 2**23, 200_000)
    m[:3] = (2**23 - 1, 2**23 - 128, 0)  # a = 0, a = 1, a = 65535
    lp2 = rng.normal(-17, 3, m.size)
    g2 = -np.log2(-np.log((2 * m + 1) / 2**24))
    bound = sim.noise_bound(lp2, m)
    assert np.all(bound >= lp2 + g2) and np.all(bound <= lp2 + 24)
    for tile in (256, 1024):
        f = sim.bounded_fraction(20000, tile, temperature=0.7, rows=3, seed=tile)
        assert f["missed"] == 0 and 0 < f["tiles"] < 0.5, (tile, f)
