"""benchmarks/jax_xla_flags_gpu.py's plumbing on the CPU (the flags act on a GPU only): the preflight
drops what XLA rejects, each child gets its variant's XLA_FLAGS, the merge checks tokens against the
default variant and the while loop against the host loop. The whole sweep at a tiny size is
``python benchmarks/jax_xla_flags_gpu.py --dry-run --out DIR`` (about a minute: not run here)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("jax")

from tests.benchmark_modules import load_benchmark  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("jax_xla_flags_gpu")


def test_preflight_drops_the_flags_xla_rejects(bench, monkeypatch):
    monkeypatch.setitem(bench.VARIANTS, "bogus", "--xla_gpu_graph_min_graph_size=1 --xla_no_such_flag=1")
    kept, common, dropped = bench.preflight(["default", "cb_while", "bogus"], "--xla_no_such_common_flag=1")
    assert kept == ["default", "cb_while"] and common == ""
    assert set(dropped) == {"bogus", "COMMON"} and "--xla_no_such_flag" in dropped["bogus"]


def test_each_child_gets_its_variants_flags(bench, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    args = bench.parse_args(["--reps", "2"])
    command = bench.child_command(args, {"tiny": bench.TINY}, dict(common="--c=1"), "script.py")
    argv = command("tiny@cb_while", 12.0, Path("/x"))
    assert f"XLA_FLAGS=--xla_dump_to=/tmp/d --c=1 {bench.CB_WHILE}" in argv
    assert argv[argv.index("--variant") + 1] == "cb_while" and argv[argv.index("--budget-s") + 1] == "12.0"
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "nope"])


def run(tokens, wall_s, steps, host=True):
    r = dict(tokens=tokens, wall_s=wall_s, steps=steps, ms_per_step_wall=wall_s * 1e3 / steps)
    return dict(r, step_ms=0.9 * r["ms_per_step_wall"]) if host else r


def test_merge_checks_tokens_and_picks_the_best_variant(bench):
    a, b = [[1, 2, 3]], [[1, 2, 4]]
    default = dict(runs={"spec_host": run(a, 0.020, 10), "while": run(a, 0.030, 10, host=False), "plain": run(a, 0.012, 12)},
                   prefill_ms=dict(ms=2.0))
    faster = dict(runs={"spec_host": run(a, 0.019, 10), "while": run(b, 0.0195, 10, host=False)})
    children = [dict(shape="s@default", rc=0, killed=False, share_s=9, wall_s=5, data=default),
                dict(shape="s@cb_while", rc=0, killed=False, share_s=9, wall_s=5, data=faster),
                dict(shape="s@cb_off", rc=-9, killed=True, share_s=1, wall_s=1, data=None, log_tail="killed")]
    s = bench.merge(children)["s"]
    assert s["checks"]["cb_while"] == {"spec_host_tokens_equal_default": True, "while_tokens_equal_default": False,
                                       "while_equals_spec_host": False}
    assert all(s["checks"]["default"].values())
    assert s["target_while_within_1_05"] == {"default": False, "cb_while": True, "cb_off": None}
    assert math.isclose(s["figures"]["default"]["while_over_host"], 1.5)
    assert math.isclose(s["figures"]["default"]["while_over_host_net"], 28 / 18)
    assert s["best"]["while_ms_per_step_wall"]["variant"] == "cb_while"
    assert s["best"]["plain_step_ms"]["variant"] == "default"
    assert s["variants"]["cb_off"]["log_tail"] == "killed" and math.isnan(s["figures"]["cb_off"]["plain_step_ms"])
    assert "| s | cb_while |" in bench.table({"s": s})
