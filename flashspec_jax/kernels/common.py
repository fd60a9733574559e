"""Helpers shared by the two Pallas verify kernels (``verify.row_stats`` and ``final``): the counter
coordinates, the IEEE division by T, and the running argmax with lowest-index ties."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import triton as plt

NEG_INF = float("-inf")


class Counters(NamedTuple):
    """Coordinates of the shared generator, uint32: seed_lo, seed_hi and offset [B], or [1] where one value
    is shared by every row (broadcast in jnp; the kernels index it, ``row_counters``); row [B]."""

    seed_lo: jax.Array
    seed_hi: jax.Array
    offset: jax.Array
    row: jax.Array  # the batch row for a shared seed, 0 for per-row seeds


def row_counters(seed_lo_ref, seed_hi_ref, offset_ref, b) -> Counters:  # [B] or [1] refs -> scalars of row b
    """Inside a kernel: batch row b's coordinates. A shared seed or offset arrives as one value, not as B
    copies (in a jitted decoding loop XLA would build those every step, a kernel launch each); the row
    coordinate is computed here: b for a shared seed, 0 for per-row seeds (as ``Counters.row``)."""
    at = lambda ref: ref[b] if ref.shape[0] > 1 else ref[0]  # noqa: E731
    row = jnp.uint32(0) if seed_lo_ref.shape[0] > 1 else jnp.asarray(b).astype(jnp.uint32)
    return Counters(at(seed_lo_ref), at(seed_hi_ref), at(offset_ref), row)


def divide(a: jax.Array, temperature: float, exact_div: bool) -> jax.Array:  # f32 [...]
    """a / T as an IEEE float32 division (``div.rn.f32`` on the GPU)."""
    if temperature == 1.0:
        return a
    if not exact_div:
        return a / np.float32(temperature)
    t = jnp.full(a.shape, temperature, jnp.float32)
    [out] = plt.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;", args=[a, t], constraints="=f,f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)],
    )
    return out


def update_argmax(best, idx, values, start):  # scalars, [N] -> scalars; ties keep the lowest index
    """Running (max, argmax) over tiles; ``values[k]`` is vocabulary entry ``start + k``."""
    v = jnp.max(values)
    better = v > best  # strict: an equal later tile keeps the earlier (lower) index
    return jnp.where(better, v, best), jnp.where(better, start + lax.argmax(values, 0, jnp.int32), idx)
