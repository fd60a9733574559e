"""flashspec_jax.random is bit-identical to flashspec.random, in jit and inside a Pallas kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from flashspec import random as np_rng
from flashspec_jax import random as rng


@pytest.mark.parametrize("coords,expected", np_rng.TEST_VECTORS)
def test_test_vectors_under_jit(coords, expected):
    seed, offset, row, position, vocab, stream = coords
    lo, hi = rng.split_counter(seed)
    got = jax.jit(rng.bits)(lo, hi, jnp.uint32(offset), jnp.uint32(row), jnp.uint32(position), jnp.uint32(vocab), jnp.uint32(stream))
    assert int(got) == expected


def test_uniform_bits_match_numpy_over_a_vocabulary():
    v = np.arange(300_000, dtype=np.uint32)
    lo, hi = rng.split_counter(2**40 + 5)
    got = np.asarray(jax.jit(rng.uniform)(lo, hi, 7, 3, 2, v, rng.FINAL))
    np.testing.assert_array_equal(got, np_rng.uniform(2**40 + 5, 7, 3, 2, v, np_rng.FINAL))


@pytest.mark.parametrize(
    "seed",
    [0, 2**64 - 1, np.array([1, 2**63, 2**40 + 3], np.uint64), np.array([-1, 5, 0], np.int64),
     jnp.array([-2, 0, 7], jnp.int32), jnp.array([1, 2, 3], jnp.uint32)],
)
def test_split_counter_matches_the_oracle(seed):
    lo, hi = rng.split_counter(seed)
    wide = np.asarray(seed).astype(np.int64).astype(np.uint64) if isinstance(seed, jax.Array) else np.asarray(seed).astype(np.uint64)
    pos = np.arange(3)
    want = np_rng.bits(wide, 4, 1, pos, 9, np_rng.ACCEPT)
    got = np.asarray(rng.bits(lo, hi, 4, 1, pos, 9, rng.ACCEPT))
    np.testing.assert_array_equal(got, want)


def test_bits_inside_a_pallas_kernel():
    key = np.asarray(rng.key(*rng.split_counter(123456789), 7, 3, 2, rng.FINAL)).reshape(1)

    def kernel(key_ref, out_ref):
        cols = jnp.arange(256, dtype=jnp.int32) + 49000
        out_ref[...] = rng.bits_from_key(key_ref[0], cols)

    got = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256,), jnp.uint32), interpret=True)(key)
    want = np_rng.bits(123456789, 7, 3, 2, np.arange(49000, 49256), np_rng.FINAL)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert int(np.asarray(got)[151]) == 0x60EC0D85  # the table's vocab=49151 vector
