"""benchmarks/invariant_tune_gpu.py's --tiny run under the Triton interpreter: it writes a JSON with a
tiling table for every product, the block_m comparison and the attention rows (the CPU test of the GPU script)."""

import json
import sys

from benchmark_modules import load_benchmark


def test_the_tiny_run_writes_the_table(tmp_path, monkeypatch):
    tune = load_benchmark("invariant_tune_gpu")
    out = tmp_path / "t.json"
    monkeypatch.setattr(sys, "argv", ["invariant_tune_gpu.py", "--tiny", "--device", "cpu", "--out", str(out)])
    tune.main()
    r = json.loads(out.read_text())
    assert [p["product"] for p in r["products"]] == ["qkv", "o", "gate_up", "down", "lm_head"]
    assert all(e["invariant"] for p in r["products"] for e in p["tilings"])  # the interpreter's tree: always
    assert len(r["configs"]) == 5 and r["configs_python"].count("InvariantTiling(16,") == 5
    assert r["all_winners_invariant"] and r["invariance_failures"] == []
    assert isinstance(r["block_m_by_m_possible"], bool) and all(p["block_m_bits_agree"] for p in r["products"])
    assert len(r["attention"]) == 2 and all(a["last_row_alone_equals_in_batch"] for a in r["attention"])
    assert all(set(p["gemv_us"]) == {"1", "5"} and set(p["cublas_us"]) == {"1", "5", "12"} for p in r["products"])
