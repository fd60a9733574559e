"""Kernel 1 of the Pallas verify: the chunk statistics of the logit rows, with its jnp reference.

Program (b, c) of the grid ``(B, NV)`` streams chunk c of each of the R rows of batch row b in turn,
in ``[block_v]`` tiles (masked tails, no padded rows), and writes per row the max of the raw logits
and sum exp((a - max) / T) (``lanes.stream_row``: the max is divided by T where the chunks are
combined, ``final.combine_chunks``); in greedy mode (T = 0) the max and the argmax (ties: lowest
index) instead. ``[B, NV, R]`` floats: nothing of size V is written.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from . import lanes
from .common import NEG_INF, update_argmax
from .config import Chunking, VerifyKernelConfig


def tile_cols(start, bv: int, vec: int) -> jax.Array:  # -> int32 [bv // vec, vec]
    """Vocabulary indices of the tile starting at ``start``, one 16-byte vector per row."""
    return start + (jnp.arange(bv // vec, dtype=jnp.int32)[:, None] * vec + jnp.arange(vec, dtype=jnp.int32)[None, :])


def row_stats_kernel(
    a_ref,  # [B, R, V] logits (any float dtype)
    m_ref,  # [B, NV, R] f32: max of the raw a in chunk c (-inf: none finite)
    l_ref,  # [B, NV, R] f32: sum exp((a - max) / T) (greedy: int32 argmax)
    *,
    temperature: float,
    greedy: bool,
    chunking: Chunking,
    vec: int,
):
    b, c = pl.program_id(0), pl.program_id(1)
    num_rows, vocab = a_ref.shape[1], a_ref.shape[2]
    bv = chunking.block

    def load(r, j):  # -> [bv] f32, index of its first entry
        start = (c * chunking.blocks + j) * bv
        cols = start + jnp.arange(bv, dtype=jnp.int32)
        a = plt.load(a_ref.at[b, r, cols], mask=cols < vocab, other=NEG_INF)
        return a.astype(jnp.float32), start

    def argmax_row(r, carry):
        def body(j, best):
            z, start = load(r, j)
            return update_argmax(*best, z, start)

        m_ref[b, c, r], l_ref[b, c, r] = lax.fori_loop(
            0, chunking.blocks, body, (jnp.float32(NEG_INF), c * chunking.blocks * bv))
        return carry

    def lanes_load(r, j):  # tile j of row r, raw, input dtype; j == blocks: tile 0 of row r + 1 (-inf past the last)
        if not isinstance(j, int):  # traced: the tile after the last of row r is row r + 1's first
            after = (j >= chunking.blocks).astype(jnp.int32)  # (arith, not jnp.where: its select of an i32
            r, j = r + after, j - after * chunking.blocks  # and a constant failed to verify in the lowering)
        cols = tile_cols((c * chunking.blocks + j) * bv, bv, vec)
        live = (cols < vocab) & (r < num_rows)
        return plt.load(a_ref.at[b, jnp.minimum(r, num_rows - 1), cols], mask=live, other=NEG_INF)

    def lanes_row(r, first):  # raw logits; the scale folded into exp2
        m, l, nxt = lanes.stream_row(lambda j: lanes_load(r, j), chunking.blocks, bv, vec, lanes.LOG2E / temperature,
                                     first)
        m_ref[b, c, r] = m
        l_ref[b, c, r] = l
        return nxt

    if greedy:
        lax.fori_loop(0, num_rows, argmax_row, 0)
    else:
        lax.fori_loop(0, num_rows, lanes_row, lanes_load(0, 0))


def row_stats(
    a: jax.Array,  # [B, R, V]
    *,
    temperature: float,
    greedy: bool,
    config: VerifyKernelConfig,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array]:  # [B, NV, R] f32, [B, NV, R] f32 (greedy: int32)
    """The chunk statistics of every row of ``a`` (``row_stats_kernel``); NV from ``config``'s chunking."""
    batch, num_rows, vocab = a.shape
    chunking = Chunking.make(batch, vocab, config.block_v, config.min_programs)
    kernel = functools.partial(row_stats_kernel, temperature=temperature, greedy=greedy, chunking=chunking,
                               vec=config.vec)
    shape = (batch, chunking.num_chunks, num_rows)
    m, l = pl.pallas_call(
        kernel,
        out_shape=[
            jax.ShapeDtypeStruct(shape, jnp.float32),
            jax.ShapeDtypeStruct(shape, jnp.int32 if greedy else jnp.float32),
        ],
        grid=(batch, chunking.num_chunks),
        compiler_params=config.compiler_params(),
        interpret=interpret,
        name="flashspec_row_stats",
    )(a)
    return m, l


def row_stats_reference(
    a: jax.Array,  # [B, R, V]
    *,
    temperature: float,
    greedy: bool,
    chunking: Chunking,
) -> tuple[jax.Array, jax.Array]:  # as row_stats
    """``row_stats`` in jnp: the same chunks, -inf past V."""
    batch, num_rows, vocab = a.shape
    size = chunking.blocks * chunking.block
    a = a.astype(jnp.float32)
    a = jnp.pad(a, ((0, 0), (0, 0), (0, chunking.num_chunks * size - vocab)), constant_values=NEG_INF)
    a = a.reshape(batch, num_rows, chunking.num_chunks, size).transpose(0, 2, 1, 3)  # [B, NV, R, size]
    m = jnp.max(a, axis=-1)
    if greedy:
        start = jnp.arange(chunking.num_chunks, dtype=jnp.int32)[None, :, None] * size
        return m, start + jnp.argmax(a, axis=-1).astype(jnp.int32)
    safe = jnp.where(m == NEG_INF, 0.0, m)
    return m, jnp.sum(jnp.exp((a - safe[..., None]) / jnp.float32(temperature)), axis=-1)
