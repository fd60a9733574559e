"""GPU smoke test of the one-launch Pallas verify (kernels/single.py) before timing it: tokens of
``single_config`` against ``choose_config``'s two kernels and the jnp reference, a few shapes, one
call each (a wait that never ends shows as this script's timeout, not as a hung benchmark).

    timeout 90 python benchmarks/single_smoke.py
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from flashspec_jax import verify
from flashspec_jax.kernels.config import choose_config, single_config


def main() -> int:
    bad = 0
    for b, v, t, draft in [(1, 128256, 1.0, "logprobs"), (8, 128256, 0.7, "logits"), (32, 32000, 0.7, "onehot"),
                           (32, 128256, 1.0, "logprobs"), (100, 32000, 0.7, "logprobs")]:
        g = 4
        kz, kw, kg = jax.random.split(jax.random.key(b + v), 3)
        z = (2.0 * jax.random.normal(kz, (b, g + 1, v), jnp.float32)).astype(jnp.bfloat16)
        w = (z[:, :g].astype(jnp.float32) + 1.4 * jax.random.normal(kw, (b, g, v))).astype(jnp.bfloat16)
        log_q = jax.nn.log_softmax(w.astype(jnp.float32) / t, axis=-1)
        x = jnp.argmax(log_q + jax.random.gumbel(kg, log_q.shape), axis=-1).astype(jnp.int32)
        lq = jnp.take_along_axis(log_q, x[..., None], axis=-1)[..., 0]
        args = {"logprobs": (z, x, w, lq), "logits": (z, x, w, None), "onehot": (z, x, None, None)}[draft]
        outs = {}
        for name, impl, config in [("reference", "reference", None), ("two", "pallas", choose_config(b, g, v, 2)),
                                   ("single", "pallas", single_config(b, g, v, 2))]:
            for offset in range(3):
                r = verify(*args, seed=jnp.uint32(11), offset=jnp.uint32(offset), temperature=t, impl=impl,
                           config=config)
                outs.setdefault(name, []).append(np.asarray(r.tokens))
        same = all(np.array_equal(a, c) for a, c in zip(outs["single"], outs["reference"]))
        same2 = all(np.array_equal(a, c) for a, c in zip(outs["single"], outs["two"]))
        bad += not (same and same2)
        print(f"B={b} V={v} T={t} {draft}: single == reference {same}, == two kernels {same2}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
