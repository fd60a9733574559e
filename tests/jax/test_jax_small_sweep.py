"""benchmarks/jax_small_sweep.py on the CPU at a tiny shape: one child's work in this process (the
--dry-run child: plain decoding, the host's launch time, k decode steps per call with the same tokens),
each child's XLA_FLAGS, and the merge against torch's and the default's step. The whole sweep is
``python benchmarks/jax_small_sweep.py --dry-run --out DIR`` (about 20 s a child: not run here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("jax")

from tests.benchmark_modules import load_benchmark  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("jax_small_sweep")


def test_dry_run_child_times_plain_host_and_k_steps(bench, tmp_path):
    bench.main(["--dry-run", "--child", "--shape", "tiny", "--variant", "default", "--dims", json.dumps(bench.TINY),
                "--batches", "1", "--tokens", "5", "--k", "2", "--out", str(tmp_path), "--budget-s", "600"])
    row = json.loads((tmp_path / "result.json").read_text())
    b1 = row["batches"]["1"]
    assert b1["plain"]["steps"] == 5 and b1["plain"]["step_ms"] > 0 and len(b1["plain"]["tokens"][0]) == 5
    assert 0 < b1["host"]["launch_us"] and b1["host"]["step_us"] > 0
    assert b1["k_steps"]["calls"] == 3 and b1["k_steps_equal_plain"] is True  # 2 + 2 + 2 steps; the 6th past max_new changes nothing
    assert row["layer_loop"] == "scan" and row["splits_at_batch"] == {"1": 2}  # 128 slots: 2 splits of 64


def test_children_flags_and_the_merge(bench, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    args = bench.parse_args(["--reps", "2"])
    plan = bench.plan_of(args)
    assert [p[1] for p in plan[:3]] == ["torch", "torch", "default"]  # the bar first
    command = bench.child_command(args, plan, {"smollm2-135m": bench.TINY}, "--c=1", "script.py")
    argv = command("smollm2-135m@split512", 12.0, Path("/x"))
    assert "XLA_FLAGS=--xla_dump_to=/tmp/d --c=1" in argv and argv[argv.index("--batches") + 1] == "1,8"
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "nope"])
    dry = bench.plan_of(bench.parse_args(["--dry-run", "--variants", "torch,default,split512"]))
    assert dry == [("tiny", "default", (1,), 28.0), ("tiny", "split512", (1,), 14.0)]

    def child(variant, step, tokens):
        return dict(shape=f"s@{variant}", rc=0, killed=False, share_s=1, wall_s=1, data=dict(batches={"1": dict(
            plain=dict(step_ms=step, ms_per_token_wall=step, tokens=tokens), host=dict(launch_us=50.0))}))

    merged = bench.merge([child("torch", 0.6, [[1]]), child("default", 0.9, [[1]]), child("split512", 0.66, [[2]])])
    t = merged["table"]["s b1"]
    assert t["default"]["over_torch"] == pytest.approx(1.5) and t["default"]["within_bar"] is False
    assert t["split512"]["over_default"] == pytest.approx(0.66 / 0.9) and t["split512"]["within_bar"] is True
    assert t["split512"]["tokens_equal_default"] is False and "torch" not in t
    assert merged["best"]["s b1"]["variant"] == "split512"
    assert "tokens" not in merged["children"]["s"]["default"]["batches"]["1"]["plain"]
    assert "split512" in bench.print_table(merged["table"])
