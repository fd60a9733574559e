"""benchmarks/serve_gpu_summary.py's adaptive rows: adaptive / plain and adaptive / the best fixed
configuration per concurrency, and the issue's two checks."""

from benchmark_modules import load_benchmark


def level(c, tps):
    return {"concurrency": c, "output_tokens_per_s": tps}


def test_adaptive_ratios_and_checks_per_concurrency():
    s = load_benchmark("serve_gpu_summary")
    runs = {f"adaptive part flashspec llama3-8b {mode}": {"levels": [level(1, a), level(256, b)]}
            for mode, a, b in (("plain", 100.0, 1000.0), ("ngram", 300.0, 700.0), ("adaptive", 290.0, 990.0))}
    out = s.summary({"runs": runs})
    rows = out["adaptive llama3-8b"]
    assert rows[1]["adaptive/plain"] == 2.9 and rows[1]["adaptive/best_fixed"] == 0.967
    assert rows[256]["adaptive/plain"] == 0.99 and rows[256]["adaptive/best_fixed"] == 0.99
    checks = out["checks"]
    assert checks["llama3-8b adaptive >= 1.0x plain at concurrency 1"]
    assert not checks["llama3-8b adaptive >= 0.98x best fixed at concurrency 1"]
    assert not checks["llama3-8b adaptive >= 1.0x plain at concurrency 256"]
    assert checks["llama3-8b adaptive >= 0.98x best fixed at concurrency 256"]
