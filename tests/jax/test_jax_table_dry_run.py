"""benchmarks/jax_vs_torch_gpu.py (issue #37's table) end to end on a tiny model on the CPU (the shape
in a child process, its row merged by the parent): every JAX part runs and its checks pass (while-loop tokens equal the host loop's, the fused attention
kernel's output equals the einsum's, the row-invariant mode's tokens equal speculation's)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("flax")

from tests.benchmark_modules import load_benchmark  # noqa: E402


def test_dry_run_writes_the_table(tmp_path, capsys):
    bench = load_benchmark("jax_vs_torch_gpu")
    bench.main(["--dry-run", "--batches", "", "--out", str(tmp_path), "--autotune-cache", str(tmp_path / "tune")])
    result = json.loads((tmp_path / "jax_vs_torch_dry_run.json").read_text())
    failed = [name for name, ok in result["checks"].items() if not ok and "_within_" not in name]
    assert failed == [] and not result["info"].get("tiny_jax", "").startswith("error")  # timings vary on a shared CPU
    assert [(c["shape"], c["rc"], c["killed"]) for c in result["children"]] == [("tiny", 0, False)]
    assert result["issue37_missing"] == ["tiny: torch_step_ms"]  # no torch on the CPU; every JAX figure came out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jax_vs_torch_dry_run.json"]  # the child's file stayed in a temporary dir
    assert result["xla_flags"].endswith(f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path / 'tune'}")  # the child's XLA_FLAGS
    assert set(result["checks"]) == {"tiny_b1_while_within_1.05x_host_step", "tiny_b1_jax_while_tokens_equal_host",
                                     "tiny_row_invariant_equals_spec", "tiny_attention_fused_close_to_xla_ctx1000",
                                     "tiny_attention_fused_alt_close_to_xla_ctx1000"}
    s = result["summary"]["tiny"]
    assert s["jax_choices"]["attention"] == "xla" and s["jax_other_attention"] == "fused"  # the CPU's default, then the kernel
    assert all(math.isfinite(s[k]) and s[k] > 0 for k in ("jax_step_ms", "jax_other_step_ms",
                                                          "weights_floor_ms",
                                                          "jax_bytes_accessed", "jax_other_bytes_accessed"))
    row = result["rows"][0]
    assert row["jax"]["spec_while"]["steps"] == row["jax"]["spec_host"]["steps"] > 0
    assert "tiny | " in capsys.readouterr().out  # the table
    assert row["attention_paths"]["contexts"]["1000"]["splits"] == 16  # the combine ran (fused_alt: 2, the earlier threshold)
    assert row["attention_paths"]["contexts"]["1000"]["alt_splits"] == 2


def test_missing_figures_name_the_shape_and_the_figure():
    report = load_benchmark("jax_vs_torch_report")
    nan = float("nan")
    summary = dict(torch_step_ms=1.0, jax_step_ms=1.1, while_over_host_step=nan, jax_bytes_accessed=5.0,
                   **{f"b8_{s}_{r}_tokens_per_s": 9.0 for s in ("torch", "jax") for r in ("plain", "spec_host")})
    summary["b8_jax_spec_host_tokens_per_s"] = nan
    rows = [dict(shape="a", summary=summary)]
    assert report.missing_of(rows, [8], ["a", "b"]) == ["a: while_over_host_step", "a: b8_jax_spec_host_tokens_per_s", "b: no row"]


def test_jax_takes_the_torch_models_weights():
    """``jax_model`` hands a torch model's weights to JAX (DLPack): the two engines' greedy tokens agree
    (float32 on the CPU), and the JAX model's weights are the torch model's."""
    import numpy as np
    import torch

    from flashspec.config import SamplingConfig
    from flashspec.loop import decode
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.model import Llama, LlamaConfig

    bench = load_benchmark("jax_vs_torch_gpu")
    torch.manual_seed(0)
    tm = Llama(LlamaConfig(**bench.TINY, max_position_embeddings=8192)).eval().requires_grad_(False)
    for p in tm.parameters():
        p.data.normal_(0, 0.1)
    jm, source = bench.jax_model(bench.TINY, tm, np.float32)
    assert source == "the torch model's (DLPack)"
    np.testing.assert_array_equal(np.asarray(jm.gate_up[...][1]), tm.state_dict()["layers.1.gate_up.weight"].numpy())
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    with torch.inference_mode():
        want, _ = decode(TorchBackend(tm, [LookupDraft()], eos_ids=[]), prompts, sampling=SamplingConfig(0.0), max_new_tokens=8)
    got, _ = decode(bench.jax_backend(jm), prompts, sampling=SamplingConfig(0.0), max_new_tokens=8)
    assert got == want


def test_children_killed_at_their_share_keep_what_they_wrote(tmp_path):
    """``run_children``: a shape that overruns its share is killed (its process group) and its last
    file kept; the time a quick shape left goes to the ones after it."""
    import sys

    kids = load_benchmark("shape_children")
    write = "import json, pathlib, sys, time; pathlib.Path(sys.argv[1], 'result.json').write_text(json.dumps({'n': sys.argv[2]}))"
    command = lambda name, share, outdir: [sys.executable, "-c", write + ("; time.sleep(60)" if name == "slow" else ""),  # noqa: E731
                                           str(outdir), name]
    out = kids.run_children(["quick", "slow", "last"], {}, 4.0, command, tmp_path)
    quick, slow, last = out
    assert (quick["rc"], quick["killed"], slow["killed"], last["rc"], last["killed"]) == (0, False, True, 0, False)
    assert slow["data"] == {"n": "slow"} and last["data"] == {"n": "last"}
    assert slow["share_s"] > 4.0 / 3 and 1.0 < slow["wall_s"] < 3.5  # the quick shape's leftover, then killed


# The child of ``run_children`` for the test below: the tiny dry run, SIGKILLed by itself where batch 2's
# n-gram speculation would first run (its compile): the middle of the shape's JAX batch part.
KILLED_AT_BATCH_2_SPECULATION = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import jax_vs_torch_gpu as bench
first = bench.Loops.call_first
def call_first(self, name):
    if self.batch == 2 and name == "spec_host":
        os.kill(os.getpid(), signal.SIGKILL)
    first(self, name)
bench.Loops.call_first = call_first
bench.main(sys.argv[2:])
"""


def test_a_child_killed_mid_run_keeps_its_finished_runs(tmp_path):
    """A child killed in the middle of its JAX batch part keeps every run that finished before: the
    batch-1 figures (plain step, while loop against host loop, bytes) and batch 2's plain decoding;
    the merged result names only the cut run (and torch's, absent on the CPU) as missing."""
    import sys

    bench, kids = load_benchmark("jax_vs_torch_gpu"), load_benchmark("shape_children")
    command = lambda name, share, outdir: [sys.executable, "-c", KILLED_AT_BATCH_2_SPECULATION,  # noqa: E731
                                           str(kids.__file__).rsplit("/", 1)[0], "--dry-run", "--batches", "2",
                                           "--out", str(outdir), "--budget-s", f"{share:.1f}", "--child"]
    children = kids.run_children(["tiny"], {}, 600.0, command, tmp_path)
    assert children[0]["rc"] == -9 and children[0]["data"] is not None
    result = bench.merge(children, [2], dict(argv=[]), 1.0)
    assert result["issue37_missing"] == ["tiny: torch_step_ms", "tiny: b2_torch_plain_tokens_per_s",
                                         "tiny: b2_torch_spec_host_tokens_per_s", "tiny: b2_jax_spec_host_tokens_per_s"]
    row = result["rows"][0]
    assert row["jax_batches"]["batch_2"]["unfinished"] and row["jax_batches"]["batch_2"]["plain"]["steps"] > 0
    assert row["jax"]["bytes_per_step"]["cost_analysis"]["bytes accessed"] > 0 and "unfinished" not in row["jax"]
    assert result["checks"]["tiny_b1_jax_while_tokens_equal_host"]
    assert "row_invariant" not in row and result["info"]["tiny_child"] == "rc -9"


def test_merge_keeps_a_killed_childs_partial_row(tmp_path):
    """The parent's merge: a child's partial row (killed before its summary) is summarized, its checks
    kept, and a child killed before writing anything is named in ``info``."""
    bench = load_benchmark("jax_vs_torch_gpu")
    bench.main(["--dry-run", "--batches", "", "--out", str(tmp_path), "--budget-s", "0", "--child"])  # every part skipped
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["rows"][0]["jax"] == {"skipped": "--budget-s spent"}
    for k in ("checks", "info", "summary", "passed"):
        data.pop(k)
    del data["rows"][0]["summary"]
    data["rows"][0]["jax"] = {"plain": {"step_ms": 2.0, "ms_per_step_wall": 2.5}, "unfinished": True}  # killed mid-part
    children = [dict(shape="tiny", share_s=5.0, wall_s=5.0, rc=-9, killed=True, data=data),
                dict(shape="none", share_s=3.0, wall_s=3.0, rc=-9, killed=True, data=None)]
    result = bench.merge(children, [], dict(argv=["x"]), 8.0)
    assert result["device"] == data["device"] and result["argv"] == ["x"] and [r["shape"] for r in result["rows"]] == ["tiny"]
    assert result["summary"]["tiny"]["jax_step_ms"] == 2.0
    assert result["info"]["tiny_child"] == "killed at its share (5.0 s)"
    assert result["info"]["none_child"] == "killed at its share (3.0 s), no row written"
    assert "data" not in result["children"][0]
