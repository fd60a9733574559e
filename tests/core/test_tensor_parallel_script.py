"""benchmarks/tensor_parallel_gpu.py's pure part: the tokens check across TP degrees (the script
itself runs on several GPUs, or with --dry-run on the CPU: docs/tensor_parallel.md)."""

from benchmark_modules import load_benchmark


def part(backend: str, tp: int, shas: list[str]) -> dict:
    rows = [dict(batch=b, mode=m, tokens_sha=s) for (b, m), s in zip([(1, "plain"), (32, "speculative")], shas)]
    return dict(backend=backend, tp=tp, rows=rows)


def test_tokens_check_passes_only_when_every_row_equals_tp1():
    checks = load_benchmark("tensor_parallel_gpu").checks
    parts = [part("torch", 1, ["a", "b"]), part("torch", 2, ["a", "b"]), part("torch", 4, ["a", "x"]),
             part("jax", 1, ["c", "d"]), part("jax", 2, [])]
    assert checks(parts) == {"torch tp=2 tokens == tp=1": "pass", "torch tp=4 tokens == tp=1": "fail",
                             "jax tp=2 tokens == tp=1": "not run"}
    assert checks([part("jax", 2, ["c", "d"])]) == {}  # no TP = 1 row to compare with
