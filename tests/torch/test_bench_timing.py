"""benchmarks/verify_kernels.py's graph timing, on a fake graph and fake CUDA events (no GPU): what it
divides by, and that the host's launch before the first timed replay is never inside an interval."""
import pytest
import torch
from benchmark_modules import load_benchmark

STEP_MS = 0.25  # the fake GPU time of one call


def bench():
    return load_benchmark("verify_kernels")


class Clock:
    """GPU time of the fake stream: each replay runs its calls; the first replay of a timed interval also
    waits for the host's launch when nothing was queued ahead of it (the GPU idle since a synchronize)."""

    def __init__(self, launch_ms: float):
        self.now, self.launch_ms, self.queued, self.replays = 0.0, launch_ms, False, []

    def replay(self, calls: int):
        if not self.queued:
            self.now += self.launch_ms
        self.now += calls * STEP_MS
        self.queued = True
        self.replays.append(calls)


def fake_cuda(monkeypatch, clock: Clock):
    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock.now

        def synchronize(self):
            clock.queued = False

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: setattr(clock, "queued", False))


class Graph:
    def __init__(self, clock: Clock, calls: int):
        self.clock, self.calls = clock, calls

    def replay(self):
        self.clock.replay(self.calls)


@pytest.mark.parametrize("calls", [1, 2, 31, 64])
def test_back_to_back_replays_time_the_calls_alone(monkeypatch, calls):
    clock = Clock(launch_ms=0.015)
    fake_cuda(monkeypatch, clock)
    ms = bench().time_graph(Graph(clock, calls), calls, reps=5, warmup_ms=0.0)
    assert ms == pytest.approx(STEP_MS)
    assert sum(clock.replays) >= 5 * 32  # every interval held at least min_calls steps


def test_one_replay_per_interval_counts_the_launch(monkeypatch):
    """min_calls=1, the method before 2026-12-05: the host's launch divided by the graph's calls."""
    clock = Clock(launch_ms=0.015)
    fake_cuda(monkeypatch, clock)
    ms = bench().time_graph(Graph(clock, 2), 2, reps=5, warmup_ms=0.0, min_calls=1)
    assert ms == pytest.approx(STEP_MS + 0.015 / 2)


def floor_row(b, g, verify_x, read_x, single_x=None):  # a verify_floor.json row with a 10 us floor
    row = dict(B=b, G=g, V=32000, dtype="bfloat16", floor_us=10.0, verify_us=10.0 * verify_x,
               read_us=10.0 * read_x + 1.0, read_all_us=10.0 * read_x)
    if single_x is not None:
        row["verify_single_replay_us"] = 10.0 * single_x
    return row


def test_floor_table_counts_the_goal_at_b_from_32():
    vf = load_benchmark("verify_floor")
    rows = [floor_row(32, 1, 1.5, 1.6, 1.7), floor_row(128, 1, 1.51, 1.2, 1.9), floor_row(256, 1, 0.9, 0.5, 1.2),
            floor_row(8, 1, 1.1, 1.0, 1.1), floor_row(32, 4, 2.0, 1.4, 2.5)]
    text = vf.table(dict(rows=rows, timing="back to back"))
    assert "within 1.5x the floor: 2 of 4 shapes" in text  # 1.5 counts, 1.51 does not, B = 8 is left out
    assert "one replay between the events: 1 of 4" in text
    assert "a bare read past 1.5x: 1 of 4" in text  # the faster read (the sum) decides
    line = next(s for s in text.splitlines() if s.startswith("| 32 | 32000 | bf16 |"))
    assert line == "| 32 | 32000 | bf16 | **1.50** / 1.60 | 2.00 / 1.40 |"
    assert "| 8 | 32000 | bf16 | **1.10** / 1.00 | - |" in text


def test_floor_table_counts_each_kind_of_rows_apart():
    vf = load_benchmark("verify_floor")
    rows = [floor_row(32, 1, 1.4, 1.0), floor_row(128, 1, 1.6, 1.0)]
    rows += [dict(floor_row(32, 1, 1.2, 1.0), rows="llm"), dict(floor_row(128, 1, 1.3, 1.0), rows="llm")]
    text = vf.table(dict(rows=rows, timing="back to back"))
    flat, llm = text.split("llm rows")
    assert flat.startswith("flat rows") and "within 1.5x the floor: 1 of 2 shapes" in flat
    assert "within 1.5x the floor: 2 of 2 shapes" in llm and "| 128 | 32000 | bf16 | **1.30** / 1.00 |" in llm
