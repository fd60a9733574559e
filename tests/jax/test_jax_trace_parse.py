"""benchmarks/jax_small_gpu.py's trace parser on a real CPU trace and on a synthetic GPU-shaped one."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tests.benchmark_modules import load_benchmark


def test_parses_a_cpu_trace(tmp_path):
    bench = load_benchmark("jax_small_gpu")
    f = jax.jit(lambda x: jnp.sin(x) @ x + 1)
    x = jnp.ones((32, 32))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(3):
            x = f(x)
        x.block_until_ready()
    out = bench.parse_trace(bench.load_trace(tmp_path), steps=3)
    assert out["source"].startswith("host thunks") and out["kernels_per_step"] >= 1
    assert 0 < out["busy_us_per_step"] <= out["span_us_per_step"]
    assert all(k["per_step"] > 0 and k["hlo_op"] for k in out["top_kernels"])


def test_parses_device_streams_and_merges_overlaps():
    bench = load_benchmark("jax_small_gpu")
    trace = {"traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #20(Compute)"}},
        {"ph": "M", "pid": 1, "tid": 8, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": 4, "name": "gemv", "args": {"hlo_op": "dot.1"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 2, "dur": 4, "name": "fusion"},  # overlaps: busy 0..6
        {"ph": "X", "pid": 1, "tid": 7, "ts": 10, "dur": 2, "name": "gemv"},
        {"ph": "X", "pid": 1, "tid": 8, "ts": 0, "dur": 50, "name": "an XLA op row, not a kernel"},
        {"ph": "X", "pid": 2, "tid": 3, "ts": 0, "dur": 30, "name": "PjitFunction(step)", "args": {"hlo_op": "x"}},
    ]}
    out = bench.parse_trace(trace, steps=2)
    assert out["source"] == "device streams" and out["kernels_per_step"] == 1.5
    assert (out["busy_us_per_step"], out["span_us_per_step"], out["gap_us_per_step"]) == (4.0, 6.0, 2.0)
    assert out["top_kernels"][0] == dict(name="gemv", hlo_op="dot.1", per_step=1.0, us_per_step=3.0, mean_us=3.0)
    assert out["host_dispatch_us_per_step"] == 15.0
