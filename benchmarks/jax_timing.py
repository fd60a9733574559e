"""The JAX timing loop of jax_loop_floor.py.

One jitted ``lax.scan`` runs ``steps`` steps over k input sets held as separate buffers (k steps per
iteration, one per set: no step slices its inputs out of a stacked array); each step's result feeds
the next step's accumulator (so nothing is elided), nothing else is kept; ``block_until_ready`` once
per call, the median over calls divided by the steps.
"""

from __future__ import annotations

import time


def scan_over_sets(step, sets, steps: int):
    """``step(acc, inp) -> acc`` (uint32 scalar accumulator) over ``sets`` -> jitted fn(sets) -> acc."""
    import jax
    import jax.numpy as jnp

    k = len(sets)

    def run(sets):
        def body(acc, _):
            for inp in sets:
                acc = step(acc, inp)
            return acc, None
        return jax.lax.scan(body, jnp.uint32(0), None, length=steps // k)[0]
    return jax.jit(run)


def median_seconds(fn, args, repeats: int) -> float:
    """Median wall time of ``fn(*args)`` over ``repeats`` calls after one warm-up call (outputs: a pytree)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
