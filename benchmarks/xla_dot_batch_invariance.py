"""Is XLA's dot batch-invariant? A row of x w computed in batches of 1, 3, 8, 17 rows against the same
row inside a batch of 64 (jit, fp32 accumulation, the result rounded to the input dtype), float32 and
bfloat16, at SmolLM2's and TinyLlama's widths, on whatever device JAX has; the same count for
``flashspec_jax.kernels.invariant_matmul`` (interpreted off a GPU), for XLA's RMSNorm
(``flashspec_jax.model.rms_norm``) and for ``invariant_rms_norm``. docs/batch_invariance.md cites it.

    python benchmarks/xla_dot_batch_invariance.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

import jax
import jax.numpy as jnp
import numpy as np


def differing_rows(dtype, k: int, n: int, impl: str = "xla", batches=(1, 3, 8, 17)) -> dict[int, int]:
    """Rows of the first m whose bits differ from the same rows in the batch of 64, per m; ``impl``
    "xla" (jnp.dot), "invariant" (the Pallas product), "xla_rms" / "invariant_rms" (RMSNorm of x)."""
    from flashspec_jax.kernels.invariant_matmul import invariant_matmul
    from flashspec_jax.kernels.invariant_norm import invariant_rms_norm
    from flashspec_jax.model import rms_norm

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, k)), dtype)  # [64, K]
    w = jnp.asarray(rng.standard_normal((k, n)), dtype)  # [K, N]
    ones = jnp.ones((k,), dtype)
    interpret = jax.default_backend() == "cpu"
    f = jax.jit({
        "xla": lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype),
        "invariant": lambda a, b: invariant_matmul(a, b.T, interpret=interpret),
        "xla_rms": lambda a, b: rms_norm(a, ones, 1e-5),
        "invariant_rms": lambda a, b: invariant_rms_norm(a, ones, 1e-5, interpret=interpret),
    }[impl])
    full = np.asarray(f(x, w).astype(jnp.float32))
    return {m: int((np.asarray(f(x[:m], w).astype(jnp.float32)) != full[:m]).any(axis=1).sum()) for m in batches}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [dict(impl=impl, dtype=name, k=k, n=n, rows_differing_by_batch=differing_rows(dt, k, n, impl))
            for impl in ("xla", "invariant", "xla_rms", "invariant_rms")
            for name, dt in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)) for k, n in ((576, 1536), (2048, 2048))]
    result = dict(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), jax=jax.__version__,
                  device=str(jax.devices()[0]), rows=rows)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
