"""Batch-invariant attention over the static KV cache in Pallas (Triton lowering).

``invariant_attention`` computes ``attention_reference`` (full causal attention, no window, no
softcap) so that a query's output bits depend on its own query, its position and the cache's
slots up to that position only: not on the batch, the number of positions per pass (1 decoding,
G + 1 scoring, T prefilling) nor the cache's length. Program (b t, kh, p) of the grid
``(B T, H_kv, P)`` takes the G query heads of token t of row b that share KV head kh (padded to
``rows``, at least 16 for the Triton dot: the same tile for every token), and walks split p of the
slots: ``SPLIT_SLOTS`` slots (a fixed size: the split count follows the cache's length, never the
batch), in blocks of ``BLOCK_S`` with the online softmax of ``kernels.attention`` in float32; blocks
past the token's position are not walked, and a split past it stores empty sums (max -inf, sum 0).
``combine_in_order`` merges the splits' sums in split order, one addition at a time, so the empty
splits of a longer cache add exact zeros: one split or eight give a row the same bits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from .attention import MIN_ROWS, load_block, online_update, scores
from .invariant_matmul import interpreted_grid

BLOCK_S = 64  # cache slots per step of a program's loop
SPLIT_SLOTS = 256  # cache slots per split: fixed


def block_update(carry, s: jax.Array, v: jax.Array, interpret: bool):  # s [R, N] f32 (-inf: unseen), v [N, D]
    """``attention.online_update``; under the interpreter with p rounded to v's dtype and the product in
    float32 (XLA's CPU dot takes no bfloat16 operands with a float32 result)."""
    if not interpret:
        return online_update(carry, s, v)
    m, l, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    base = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = jnp.exp(m - base)
    p = jnp.exp(s - base[:, None])
    pv = jnp.dot(p.astype(v.dtype).astype(jnp.float32), v.astype(jnp.float32), preferred_element_type=jnp.float32)
    return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv


def invariant_kernel(q_ref, k_ref, v_ref, layer_ref, pos_ref, acc_ref, m_ref, l_ref, *, tokens: int, scale: float,
                     interpret: bool):
    """q [B T, H_kv, R, D]; k, v [L, B, H_kv, S, D]; layer [1] int32; pos [B T] int32; acc [B T, H_kv, P, R, D],
    m, l [B T, H_kv, P, R] float32: program (bt, kh, p)'s softmax sums over split p's slots <= pos[bt]."""
    bt = jnp.minimum(pl.program_id(0), q_ref.shape[0] - 1)  # an extra program (``interpreted_grid``) redoes the last
    kh, part = pl.program_id(1), pl.program_id(2)
    b = bt // tokens
    num_rows, d = q_ref.shape[2], q_ref.shape[3]
    slots = k_ref.shape[3]
    layer, pos = layer_ref[0], pos_ref[bt]
    rows, dims = jnp.arange(num_rows, dtype=jnp.int32), jnp.arange(d, dtype=jnp.int32)
    q = plt.load(q_ref.at[bt, kh, rows[:, None], dims[None, :]])  # [R, D]

    def body(j, carry):
        cols, k, v = load_block(k_ref, v_ref, layer, b, kh, j, BLOCK_S)  # [BS], [BS, D] x2
        qk = (q.astype(jnp.float32), k.astype(jnp.float32)) if interpret else (q, k)  # bf16 products exact in f32
        s = scores(jnp.dot(qk[0], qk[1].T, preferred_element_type=jnp.float32), d, scale, 0.0)  # [R, BS]
        seen = jnp.broadcast_to(cols[None, :] <= pos, s.shape)
        return block_update(carry, jnp.where(seen, s, -jnp.inf), v, interpret)

    init = (jnp.full((num_rows,), -jnp.inf, jnp.float32), jnp.zeros((num_rows,), jnp.float32),
            jnp.zeros((num_rows, d), jnp.float32))
    span = SPLIT_SLOTS // BLOCK_S
    last = jnp.minimum(jnp.minimum(pos, slots - 1) // BLOCK_S + 1, (part + 1) * span)
    m, l, acc = lax.fori_loop(part * span, last, body, init)
    plt.store(acc_ref.at[bt, kh, part, rows[:, None], dims[None, :]], acc)
    plt.store(m_ref.at[bt, kh, part, rows], m)
    plt.store(l_ref.at[bt, kh, part, rows], l)


def combine_in_order(acc: jax.Array, m: jax.Array, l: jax.Array) -> jax.Array:  # [..., P, R, D], [..., P, R] x2
    """The splits' sums -> the normalized output [..., R, D] (rows that saw nothing: 0), the splits
    added one at a time in split order (an empty split: exact zeros)."""
    parts = m.shape[-2]
    top = m[..., 0, :]
    for p in range(1, parts):
        top = jnp.maximum(top, m[..., p, :])
    base = jnp.where(top == -jnp.inf, 0.0, top)
    den, num = jnp.zeros_like(top), jnp.zeros_like(acc[..., 0, :, :])
    for p in range(parts):
        w = jnp.where(m[..., p, :] == -jnp.inf, 0.0, jnp.exp(m[..., p, :] - base))  # [..., R]
        den = den + w * l[..., p, :]
        num = num + w[..., None] * acc[..., p, :, :]
    return num / jnp.where(den == 0, 1.0, den)[..., None]


def invariant_attention(
    q: jax.Array,  # [B, T, H, D]
    k: jax.Array,  # [L, B, H_kv, S, D]
    v: jax.Array,  # [L, B, H_kv, S, D]
    layer,  # int or int32 scalar: the layer of the cache to read
    positions: jax.Array,  # [B, T] int: each query's position (it sees slots <= its position)
    *,
    scale: float = 0.0,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:  # [B, T, H, D]
    """Causal attention over layer ``layer`` of the cache, each query's bits independent of the batch,
    of T and of the cache's length (module docstring). head_dim a power of two >= 16."""
    b, t, h, d = q.shape
    h_kv, slots = k.shape[2], k.shape[3]
    if d < 16 or d & (d - 1):
        raise ValueError(f"invariant_attention: head_dim={d} must be a power of two >= 16")
    g = h // h_kv
    rows = max(MIN_ROWS, 1 << (g - 1).bit_length())
    qr = jnp.pad(q.reshape(b * t, h_kv, g, d), ((0, 0), (0, 0), (0, rows - g), (0, 0)))  # [B T, H_kv, R, D]
    parts = -(-slots // SPLIT_SLOTS)
    f32 = jnp.float32
    outs = pl.pallas_call(
        functools.partial(invariant_kernel, tokens=t, scale=scale, interpret=interpret),
        out_shape=[jax.ShapeDtypeStruct((b * t, h_kv, parts, rows, d), f32),
                   *[jax.ShapeDtypeStruct((b * t, h_kv, parts, rows), f32)] * 2],
        grid=interpreted_grid((b * t, h_kv, parts), interpret),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="flashspec_invariant_attention",
    )(qr, k, v, jnp.asarray(layer, jnp.int32).reshape(1), positions.astype(jnp.int32).reshape(b * t))
    out = combine_in_order(*outs)[:, :, :g].astype(q.dtype)  # [B T, H_kv, G, D]
    return out.reshape(b, t, h, d)
