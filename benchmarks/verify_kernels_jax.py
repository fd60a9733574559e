"""Timing of flashspec_jax.verify: impl="pallas" (the fused kernels) against impl="reference" (jnp).

Used by benchmarks/verify_kernels.py through :func:`run_jax`; runs alone too::

    python benchmarks/verify_kernels_jax.py [--quick]   # JSON to $OUT or benchmarks/results/

Per shape: check that the pallas tokens equal the reference tokens, then time each impl as the
median of many calls of the jitted step (``block_until_ready`` after each), cycling through enough
distinct input buffers that together they exceed the H200's 60 MB L2 three times over, so no
call is served from a cache warmed by the previous one. Off the GPU, pallas runs in interpret
mode: the timings then say nothing about the kernel.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from flashspec_jax import verify

L2_BYTES = 60 * 2**20
QUICK_SHAPES = [
    dict(B=1, G=4, V=32000, dtype="bfloat16"),
    dict(B=8, G=4, V=128256, dtype="bfloat16"),
    dict(B=64, G=8, V=32000, dtype="float32"),
]
FULL_SHAPES = [
    dict(B=b, G=g, V=v, dtype=d)
    for b in (1, 8, 64)
    for g in (4, 8)
    for v in (32000, 128256)
    for d in ("bfloat16", "float32")
]


def make_inputs(key, batch: int, gamma: int, vocab: int, dtype: str, temperature: float):
    """(z [B, G+1, V], x [B, G], w [B, G, V]): a draft near the target, x ~ q by Gumbel-max."""
    kz, kw, kg = jax.random.split(key, 3)
    z = 2.0 * jax.random.normal(kz, (batch, gamma + 1, vocab), jnp.float32)
    w = z[:, :gamma] + 0.7 * jax.random.normal(kw, (batch, gamma, vocab), jnp.float32)
    x = jnp.argmax(w / max(temperature, 1e-3) + jax.random.gumbel(kg, w.shape), axis=-1).astype(jnp.int32)
    return z.astype(dtype), x, w.astype(dtype)


def step_fn(impl: str, temperature: float, draft: str):
    def step(z, x, w, seed, offset):  # [B, G+1, V], [B, G], [B, G, V], uint32 [], uint32 []
        res = verify(z, x, w if draft == "logits" else None, seed=seed, offset=offset,
                     temperature=temperature, impl=impl)
        return res.num_accepted, res.tokens

    return jax.jit(step)


def time_step(step, inputs: list, reps: int) -> float:
    """Median milliseconds of one call, cycling through ``inputs``."""
    out = step(*inputs[0], jnp.uint32(0), jnp.uint32(0))
    jax.block_until_ready(out)
    times = []
    for r in range(reps):
        args = inputs[r % len(inputs)]
        t0 = time.perf_counter()
        out = step(*args, jnp.uint32(r), jnp.uint32(r))
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_shape(shape: dict, reps: int) -> list[dict]:
    b, g, v, dtype = shape["B"], shape["G"], shape["V"], shape["dtype"]
    temperature, draft = float(shape.get("temperature", 1.0)), shape.get("draft", "logits")
    bytes_per = (2 * g + 1) * b * v * jnp.dtype(dtype).itemsize
    copies = max(2, min(1024, math.ceil(3 * L2_BYTES / bytes_per)))
    keys = jax.random.split(jax.random.key(0), copies)
    inputs = [make_inputs(k, b, g, v, dtype, temperature) for k in keys]
    steps = {impl: step_fn(impl, temperature, draft) for impl in ("pallas", "reference")}
    results = {impl: f(*inputs[0], jnp.uint32(7), jnp.uint32(3)) for impl, f in steps.items()}
    ok = all(
        np.array_equal(np.asarray(a), np.asarray(b_)) for a, b_ in zip(results["pallas"], results["reference"])
    )
    rows = []
    for impl, f in steps.items():
        ms = time_step(f, inputs, reps)
        rows.append(dict(backend="jax", impl=impl, B=b, G=g, V=v, dtype=dtype, median_ms=ms, ok=bool(ok),
                         temperature=temperature, draft=draft, reps=reps, buffers=copies))
    return rows


def run_jax(shapes: list[dict], reps: int | None = None) -> list[dict]:
    """Rows {backend, impl, B, G, V, dtype, median_ms, ok, ...} for each shape and impl."""
    on_gpu = jax.default_backend() in ("gpu", "cuda")
    reps = reps or (200 if on_gpu else 3)
    rows = []
    for shape in shapes:
        rows.extend(run_shape(shape, reps))
    return rows


def environment() -> dict:
    return dict(
        jax=jax.__version__,
        device=str(jax.devices()[0].device_kind),
        backend=jax.default_backend(),
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes instead of the full grid")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--out", default=None, help="output folder (default: $OUT or benchmarks/results)")
    args = parser.parse_args()
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    if jax.default_backend() not in ("gpu", "cuda"):  # interpret mode: keep it small
        shapes = [dict(s, V=min(s["V"], 4096), B=min(s["B"], 8)) for s in shapes[:2]]
    rows = run_jax(shapes, args.reps)
    for r in rows:
        print(f"{r['impl']:>9} B={r['B']:<3} G={r['G']} V={r['V']:<6} {r['dtype']:<8} "
              f"{r['median_ms']:8.3f} ms  ok={r['ok']}")
    out = pathlib.Path(args.out or os.environ.get("OUT") or pathlib.Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "verify_kernels_jax.json"
    path.write_text(json.dumps(dict(environment=environment(), rows=rows), indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
