"""The Pallas verify's epilogue: ``final.pick_draw`` (one variadic reduction over the chunks) against
``final.pick_draw_reference`` (two argmaxes and an any) on fresh random partials built to tie:
keys from a few values with -inf among them, rows of all -inf, rows without residual mass, n = G."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flashspec_jax.kernels import final


def random_partials(rng: np.random.Generator, batch: int, chunks: int, vocab: int):
    levels = np.array([-np.inf, -3.0, 0.5, 2.0], np.float32)  # few values: ties across chunks are common
    r_val = rng.choice(levels, (batch, chunks)).astype(np.float32)
    p_val = rng.choice(levels, (batch, chunks)).astype(np.float32)
    r_val[0] = -np.inf  # a row where no chunk has a finite residual key
    p_val[1 % batch] = 2.0  # a row of equal keys: the lowest chunk must win
    width = vocab // chunks
    base = (np.arange(chunks) * width)[None]
    r_idx = (base + rng.integers(0, width, (batch, chunks))).astype(np.int32)
    p_idx = (base + rng.integers(0, width, (batch, chunks))).astype(np.int32)
    any_r = (rng.random((batch, chunks)) < 0.3).astype(np.int32)
    any_r[2 % batch] = 0  # no residual mass anywhere: the bonus draw
    return tuple(jnp.asarray(a) for a in (r_val, r_idx, p_val, p_idx, any_r))


@pytest.mark.parametrize("chunks", [1, 2, 7, 63, 130])
def test_pick_draw_matches_the_two_argmaxes(chunks):
    rng = np.random.default_rng(chunks)
    batch, gamma, vocab = 64, 4, 128256
    for _ in range(5):
        partials = random_partials(rng, batch, chunks, vocab)
        n = jnp.asarray(rng.integers(0, gamma + 1, batch).astype(np.int32))
        got = jax.jit(final.pick_draw, static_argnums=(2, 3))(partials, n, gamma, vocab)
        want = final.pick_draw_reference(partials, n, gamma, vocab)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_pick_draw_takes_the_lowest_chunk_on_ties():  # a hand-built row: the winner is known
    r_val = jnp.asarray([[1.0, 3.0, 3.0, 2.0]], jnp.float32)
    r_idx = jnp.asarray([[5, 17, 29, 33]], jnp.int32)
    p_val = jnp.asarray([[-jnp.inf] * 4], jnp.float32)
    p_idx = jnp.asarray([[1, 11, 21, 31]], jnp.int32)
    any_r = jnp.asarray([[0, 1, 0, 0]], jnp.int32)
    partials = (r_val, r_idx, p_val, p_idx, any_r)
    assert int(final.pick_draw(partials, jnp.asarray([0]), 4, 40)[0]) == 17  # residual: chunk 1 before chunk 2
    assert int(final.pick_draw(partials, jnp.asarray([4]), 4, 40)[0]) == 1  # n = G, all -inf: chunk 0
