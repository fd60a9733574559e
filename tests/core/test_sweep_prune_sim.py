"""The pruning simulation behind benchmarks/verify_sass.py's sweep model: exact, and it counts what it says."""

import sys
from pathlib import Path

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
    """The check can fail: a bound 2 log2 units below the true one passes over winners."""
    rows = sim.flat_rows
    monkeypatch.setattr(sim, "flat_rows", lambda *a: (lambda kp, kr, b: (kp, kr, b - 2.0))(*rows(*a)))
    assert sim.evaluated_fractions(20000, 5000, 64, 4, rows=2)["missed"] > 0
