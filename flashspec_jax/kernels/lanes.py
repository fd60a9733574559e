"""Per-lane loop bodies of the Pallas verify kernels (``VerifyKernelConfig(loops="lanes")``).

The same rewrites as the Triton "lanes" kernels (flashspec_torch/kernels/lanes.py; instruction
counts in docs/kernel_notes.md): every logit slot of a tile keeps its own running state, so a tile
costs no reduction; exponentials are ``exp2`` with the scale log2(e) / T folded into one multiply-add
(no division per logit: T is static); keys are in log2 units (the same argmax); -log(u) by libdevice's
logf polynomial without its special cases; ``lg2.approx`` on the GPU for -log2(E) and log2 r.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import triton as plt

from flashspec_jax import random as rng

LOG2E = float(np.log2(np.e))
LN2 = float(np.log(2.0))
FLT_MIN_VALUE = float(np.finfo(np.float32).min)  # a finite "-inf" for the running max
BIG_INDEX = np.int32(2**31 - 1)


def log2_approx(x: jax.Array, fast: bool) -> jax.Array:  # f32 >= 0 -> log2 x (-inf at 0)
    if not fast:
        return jnp.where(x > 0, jnp.log2(jnp.where(x > 0, x, 1.0)), -jnp.inf)
    [out] = plt.elementwise_inline_asm(
        "lg2.approx.ftz.f32 $0, $1;", args=[x], constraints="=f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)],
    )
    return out


def neg_log_uniform(b: jax.Array) -> jax.Array:  # uint32 bits -> E = -log u, u = (2 (b >> 9) + 1) 2**-24
    """-log u within ~1 ulp (libdevice logf's reduction and polynomial; u is normal, in [2**-24, 1))."""
    n = ((b >> np.uint32(9)) * np.uint32(2) + np.uint32(1)).astype(jnp.int32).astype(jnp.float32)
    bits = lax.bitcast_convert_type(n, jnp.int32)
    e_bits = (bits - np.int32(0x3F2AAAAB)) & np.int32(-8388608)
    f = lax.bitcast_convert_type(bits - e_bits, jnp.float32) - 1.0
    e = e_bits.astype(jnp.float32) * np.float32(1.1920928955078125e-07) - 24.0
    p = f * np.float32(-0.13018856942653656) + np.float32(0.1408461034297943)
    for c in (-0.12148627638816833, 0.1398061066865921, -0.16684235632419586, 0.20012299716472626,
              -0.24999669194221497, 0.333331823348999, -0.5):
        p = f * p + np.float32(c)
    r = f * (f * p) + f  # log of the mantissa
    return -(e * np.float32(LN2) + r)


def stats_init(bv: int):
    return jnp.full((bv,), FLT_MIN_VALUE, jnp.float32), jnp.zeros((bv,), jnp.float32)


def stats_step(a: jax.Array, ml, k: float):  # a: [bv] raw logits (-inf masked); per-slot (max, sum)
    """One exp2 per logit: with d = a - m, l <- l 2^(-d k) + 1 if d > 0 else l + 2^(d k)."""
    m, l = ml
    d = a - m
    e = jnp.exp2(-jnp.abs(d) * np.float32(k))
    return jnp.maximum(m, a), jnp.where(d > 0, l * e + 1.0, l + e)


def stats_finish(ml, k: float):  # per-slot (max, sum) -> (max of raw a or -inf, sum exp((a - max) / T))
    m, l = ml
    big = jnp.max(m)
    total = jnp.sum(l * jnp.exp2((m - big) * np.float32(k)))
    return jnp.where(total > 0, big, -jnp.inf), total


def sweep_init(bv: int, start):
    f = jnp.full((bv,), -jnp.inf, jnp.float32)
    i = jnp.zeros((bv,), jnp.int32) + start
    return f, i, f, i, jnp.zeros((bv,), jnp.float32)


def sweep_step(carry, z, w, cols, key, x_n, lse_p, lse_q, k: float, fast: bool):
    """Keys of one tile of row n in log2 units; every slot keeps its running best (ties: earlier)."""
    r_val, r_idx, p_val, p_idx, mass = carry
    lp2 = z * np.float32(k) - lse_p * np.float32(LOG2E)
    g2 = -log2_approx(neg_log_uniform(rng.bits_from_key(key, cols)), fast)
    key_p = lp2 + g2
    better = key_p > p_val
    p_val, p_idx = jnp.where(better, key_p, p_val), jnp.where(better, cols, p_idx)
    if w is None:
        q = jnp.where(cols == x_n, 1.0, 0.0).astype(jnp.float32)
    else:
        q = jnp.exp2(w * np.float32(k) - lse_q * np.float32(LOG2E))
    res = jnp.maximum(jnp.exp2(lp2) - q, 0.0)
    key_r = log2_approx(res, fast) + g2
    better = key_r > r_val
    r_val, r_idx = jnp.where(better, key_r, r_val), jnp.where(better, cols, r_idx)
    return r_val, r_idx, p_val, p_idx, jnp.maximum(mass, res)


def sweep_finish(carry):  # per-slot bests -> (r_val, r_idx, p_val, p_idx, any residual mass)
    r_val, r_idx, p_val, p_idx, mass = carry
    r_best, p_best = jnp.max(r_val), jnp.max(p_val)
    r_i = jnp.min(jnp.where(r_val == r_best, r_idx, BIG_INDEX))
    p_i = jnp.min(jnp.where(p_val == p_best, p_idx, BIG_INDEX))
    return r_best, r_i, p_best, p_i, (jnp.max(mass) > 0).astype(jnp.int32)
