"""The adaptive policy's cheaper host work (issue #35, benchmarks/adaptive_host.py): ``finish_steps``' Newton steps
against plain bisection, and the benchmark's own smoke run. The benchmark runs that read the host's time do so on a
simulated clock (``tick_clock.TickClock``): on a loaded machine the real one made their choices (and so the
counts checked) differ."""

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flashspec.adaptive import AdaptivePolicy
from flashspec.throughput import finish_steps
from tick_clock import TickClock  # tests/tick_clock.py


@pytest.fixture
def ticks(monkeypatch):
    """``time.perf_counter`` a ``TickClock`` for the test."""
    clock = TickClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


def finish_steps_bisection(left, mean, var):  # [arms]
    """``finish_steps`` by 12 halvings of [slowest row's expectation, + 5 sigma]: the plain reference."""
    m = left / mean
    if m.shape[1] == 1:
        return np.maximum(1.0, m[:, 0])
    s = np.sqrt(left * var / mean ** 3) + 1e-9
    lo = m.max(axis=1)
    hi = lo + 5.0 * s.max(axis=1)
    for _ in range(12):
        t = 0.5 * (lo + hi)
        over = (1.0 / (1.0 + np.exp(np.minimum(50.0, 1.702 / s * (t[:, None] - m))))).sum(axis=1) > 1.0
        lo, hi = np.where(over, t, lo), np.where(over, hi, t)
    return np.maximum(1.0, 0.5 * (lo + hi))


@pytest.mark.parametrize("rows", [2, 40])
def test_finish_steps_finds_bisections_crossing(rows):
    r = np.random.default_rng(rows)
    for _ in range(20):
        left = r.integers(0, 200, rows).astype(float)
        mean, var = r.uniform(1, 4, (3, rows)), r.uniform(0, 2, (3, rows)) * r.integers(0, 2, (3, 1))
        got, want = finish_steps(left, mean, var), finish_steps_bisection(left, mean, var)
        width = 5.0 * np.sqrt(left * var / mean ** 3).max(axis=1) / 4096 + 1e-9  # one cell
        assert np.all(np.abs(got - want) <= 0.5 * width + 1e-9 * want)  # the crossing vs its cell's midpoint
        assert np.array_equal(finish_steps(left, mean[1:], var[1:]), got[1:])  # an arm's answer is its own alone


def test_the_host_benchmark_runs_and_keeps_the_tokens(ticks, monkeypatch):
    """The fixed and adaptive loops' greedy tokens agree, and the host time of the adaptive policy's choices (1 ms
    each on the simulated clock: a real choice's 0.1-1 ms against the fixed policy's microsecond) is counted as
    ``choose``, above the fixed policy's (one tick a choice)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import adaptive_host

    choose = AdaptivePolicy.choose

    def slow_choose(self, *args, **kwargs):
        ticks.now += 1e-3
        return choose(self, *args, **kwargs)

    monkeypatch.setattr(AdaptivePolicy, "choose", slow_choose)
    row = adaptive_host.run_batch(adaptive_host.model(), 2, 6, 1, None)
    assert row["tokens_equal"] == {"after": True} and row["policy_only_same_choices"]
    assert row["after_ms"]["policy"] > 0 and row["after_ms"]["choose"] > row["fixed_ms"]["choose"]


def test_the_critical_path_part_runs_every_loop_on_the_paced_device():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import adaptive_host

    row = adaptive_host.critical_path(2, 6, 1, {"after": (adaptive_host.AFTER, None)}, (0.2, 0.0))
    assert row["best_fixed"] in ("plain", "ngram:G2", "ngram:G4") and row["after_over_best_fixed"] > 0
    assert all(row[k]["tokens"] == 12 and row[k]["device_ms"] > 0 for k in ("plain", "ngram:G2", "after"))
    assert row["plain"]["choices_per_step"] == 0 and 0 < row["after"]["choices_per_step"] <= 1.5


def test_serve_paced_serves_every_request_on_the_paced_slots(ticks):
    """``benchmarks/serve_paced.py`` at 2 slots, this checkout's scheduler with and without held choices: every
    configuration emits every request's tokens, the fixed ones never ask a policy, the adaptive one is warm (the
    device reports its kinds prepared) and asks on at most every step, on every step without held choices. On the
    simulated clock each choice hides behind the device's 0.2 ms step (on the real clock of a loaded machine an
    exploration's host time showed and held a second step: 0.8-0.92 choices a step without held choices)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import serve_paced
    from argparse import Namespace

    args = Namespace(requests=5, tokens=7, repeats=1, step_ms=(0.2, 0.0), prepared=1)
    row = serve_paced.one_slot_count(2, args, {"after": (serve_paced.scheduler, None), "one": (serve_paced.scheduler, 1)})
    assert all(row[k]["tokens"] == 35 for k in ("plain", "ngram:G2", "ngram:G4", "after", "one"))
    assert row["plain"]["choices_per_step"] == 0 and row["one"]["choices_per_step"] == 1.0
    assert 0 < row["after"]["choices_per_step"] <= 1.0 and row["after"]["warm"] == 1.0
    assert row["best_fixed"] in ("plain", "ngram:G2", "ngram:G4") and row["after_over_best_fixed"] > 0
