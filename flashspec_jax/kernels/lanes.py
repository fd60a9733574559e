"""Per-lane loops of the Pallas verify kernels (``row_stats.row_stats_kernel`` and ``final.sweep_row``).

The same rewrites as the Triton "lanes" kernels (flashspec_torch/kernels/lanes.py; instruction
counts in docs/kernel_notes.md): the running state lives in registers per thread, so a tile costs no
cross-thread reduction; exponentials are ``exp2`` with the scale log2(e) / T folded into one
multiply-add (no division per logit: T is static); keys are in log2 units (the same argmax); -log(u)
by libdevice's logf polynomial without its special cases; ``lg2.approx`` on the GPU for -log2(E) and
log2 r.

Normaliser (``stream_row``): a tile is loaded as ``[bv // vec, vec]`` (one 16-byte load per row of
it: ``vec`` = 16 bytes / itemsize) and each vector keeps a running (max, sum): one exp2 per logit
plus one per vector, as the torch kernel. The next tile is loaded before this tile's arithmetic (the
loop carries it), so two tiles per thread are in flight; the sweep loads the same way.

Row-n sweep (``sweep_chunk``): every logit slot keeps its running best; with ``prune`` a tile none
of whose keys can reach the smallest of the two best keys so far is passed over (exact; the bound
is in ``prune_bound``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import triton as plt

from flashspec_jax import random as rng

LOG2E = float(np.log2(np.e))
LN2 = float(np.log(2.0))
BIG_INDEX = np.int32(2**31 - 1)
PRUNE_SLACK = np.float32(0.01)  # log2 units; the rounding of both sides is below 1e-5

Load = Callable[[jax.Array, jax.Array], jax.Array]  # (tile j, live) -> raw logits of tile j (-inf masked)


def log2_approx(x: jax.Array, fast: bool) -> jax.Array:  # f32 >= 0 -> log2 x (-inf at 0 and denormals)
    """``lg2.approx.ftz`` on the GPU; elsewhere exact log2 with denormals flushed to -inf as the GPU's
    ftz does. (XLA on the CPU mixes the two: ``x > 0`` held for a denormal residual while the
    guarded ``log2`` saw 0, and a residual of 7e-39 got the key 0 + g2 on a peaked row.)"""
    if not fast:
        normal = x >= np.float32(np.finfo(np.float32).tiny)
        return jnp.where(normal, jnp.log2(jnp.maximum(x, np.float32(np.finfo(np.float32).tiny))), -jnp.inf)
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


# ----------------------------------------------------------------------------- normaliser


def vec_init(bv: int, vec: int):
    return jnp.full((bv // vec,), -jnp.inf, jnp.float32), jnp.zeros((bv // vec,), jnp.float32)


def vec_step(a: jax.Array, ml, k: float):  # a: [bv // vec, vec] raw logits (-inf masked)
    """Per vector: m' = max(m, max a), l' = l 2^(m k - m' k) + sum 2^(a k - m' k) (m' = -inf: 0)."""
    m, l = ml
    m_new = jnp.maximum(m, jnp.max(a, axis=1))
    mk = jnp.where(m_new == -jnp.inf, 0.0, m_new) * np.float32(k)
    s = jnp.sum(jnp.exp2(a * np.float32(k) - mk[:, None]), axis=1)
    return m_new, l * jnp.exp2(m * np.float32(k) - mk) + s


def vec_finish(ml, k: float):  # per-vector (max, sum) -> (max of raw a or -inf, sum exp((a - max) / T))
    m, l = ml
    big = jnp.max(m)
    mk = jnp.where(big == -jnp.inf, 0.0, big) * np.float32(k)
    return big, jnp.sum(l * jnp.exp2(m * np.float32(k) - mk))


def stream_row(load: Callable[[jax.Array], jax.Array], blocks: int, bv: int, vec: int, k: float, first: jax.Array):
    """(max of raw a or -inf, sum exp((a - max) / T), next) over tiles 0..blocks-1 of one row, k = log2(e) / T.

    ``load(j)``: the raw logits of tile j (-inf masked), ``[bv // vec, vec]``. Tile 0 is ``first``, and each
    tile's successor is loaded before its arithmetic; ``load(blocks)`` must give the next row's tile 0
    (returned as ``next``, so that the row loop streams on without a bubble: the load of a row's first
    tile overlaps the previous row's arithmetic and reduction)."""
    def body(j, carry):
        ml, a = carry
        a_next = load(j + 1)  # issued before this tile's arithmetic
        return vec_step(a.astype(jnp.float32), ml, k), a_next

    ml, nxt = lax.fori_loop(0, blocks, body, (vec_init(bv, vec), first))
    return (*vec_finish(ml, k), nxt)


# ----------------------------------------------------------------------------- row-n sweep


def sweep_init(bv: int, start):
    f = jnp.full((bv,), -jnp.inf, jnp.float32)
    i = jnp.zeros((bv,), jnp.int32) + start
    return f, i, f, i, jnp.zeros((bv,), jnp.float32)


def prune_bound(lp2: jax.Array, bits: jax.Array, fast: bool) -> jax.Array:  # f32 [S], uint32 [S] -> f32 [S]
    """An upper bound of both keys: E = -log u >= 1 - u, so g2 = -log2 E <= 24 - log2(2**24 (1 - u))
    (2**24 (1 - u) = 2**24 - 1 - 2 (b >> 9), an integer in [1, 2**24)), and log2 r <= log2 p = lp2."""
    t = (np.uint32(16777215) - np.uint32(2) * (bits >> np.uint32(9))).astype(jnp.int32).astype(jnp.float32)
    return lp2 + (24.0 - log2_approx(t, fast))


def sweep_tile(state, floor, z, w, cols, key, x_n, lse_p, lse_q, k: float, fast: bool, prune: bool):
    """One tile of row n: keys in log2 units, every slot keeps its running best (ties: earlier).

    ``floor`` (prune only): min of the best key_p and best key_r so far (-inf until both exist); a
    tile whose bound stays below it is passed over: none of its keys can win, and residual mass
    was seen already (best key_r > -inf), so the mass flag is exact as well."""
    lp2 = z * np.float32(k) - lse_p * np.float32(LOG2E)
    bits = rng.bits_from_key(key, cols)

    def evaluate(args):
        (r_val, r_idx, p_val, p_idx, mass), floor = args
        g2 = -log2_approx(neg_log_uniform(bits), fast)
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
        if prune:
            floor = jnp.minimum(jnp.max(p_val), jnp.max(r_val))
        return (r_val, r_idx, p_val, p_idx, jnp.maximum(mass, res)), floor

    if not prune:
        return evaluate((state, floor))
    todo = jnp.max((prune_bound(lp2, bits, fast) >= floor - PRUNE_SLACK).astype(jnp.int32)) > 0
    return lax.cond(todo, evaluate, lambda args: args, (state, floor))


def sweep_chunk(load_z: Load, load_w: Load | None, tile_cols: Callable[[jax.Array], jax.Array], blocks: int,
                sv: int, start, key, x_n, lse_p, lse_q, k: float, fast: bool, prune: bool):
    """The sweep over ``blocks`` tiles of ``sv`` logits of row n -> (r_val, r_idx, p_val, p_idx, mass>0);
    each tile's successor is loaded before its arithmetic."""
    def body(j, carry):
        state, floor, z, w = carry
        live = j + 1 < blocks
        nxt = load_z(j + 1, live), None if load_w is None else load_w(j + 1, live)
        w = None if w is None else w.astype(jnp.float32)
        tile = sweep_tile(state, floor, z.astype(jnp.float32), w, tile_cols(j), key, x_n, lse_p, lse_q, k, fast, prune)
        return (*tile, *nxt)

    init = (sweep_init(sv, start), jnp.float32(-jnp.inf))
    first = load_z(0, True), None if load_w is None else load_w(0, True)
    state, *_ = lax.fori_loop(0, blocks, body, (*init, *first))
    return sweep_finish(state)


def sweep_finish(carry):  # per-slot bests -> (r_val, r_idx, p_val, p_idx, any residual mass)
    r_val, r_idx, p_val, p_idx, mass = carry
    r_best, p_best = jnp.max(r_val), jnp.max(p_val)
    r_i = jnp.min(jnp.where(r_val == r_best, r_idx, BIG_INDEX))
    p_i = jnp.min(jnp.where(p_val == p_best, p_idx, BIG_INDEX))
    return r_best, r_i, p_best, p_i, (jnp.max(mass) > 0).astype(jnp.int32)
