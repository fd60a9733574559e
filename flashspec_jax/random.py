"""The shared counter-based generator (``flashspec.random``) in ``jnp.uint32`` arithmetic.

Bit-identical to the NumPy definition: every function here is wrapping 32-bit integer
arithmetic (multiply, xor, logical shift) and one exact int -> float32 conversion, so it runs
unchanged under ``jax.jit``, in XLA on any device, and inside Pallas kernels (Triton lowering and
interpret mode). See ``flashspec/random.py`` for the specification and the test vectors.

Seeds are 64-bit but JAX arrays are 32-bit unless x64 is enabled, so a seed travels as two
``uint32`` halves (``seed_lo``, ``seed_hi``); :func:`split_counter` makes them from a Python int,
a NumPy array (any integer dtype, ``uint64`` included) or a JAX integer array.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flashspec.random import ACCEPT, DRAFT, FINAL

__all__ = ["ACCEPT", "DRAFT", "FINAL", "mix", "key", "bits", "to_uniform", "uniform", "gumbel", "split_counter"]

_M1 = np.uint32(0x7FEB352D)
_M2 = np.uint32(0x846CA68B)
_SALT = np.uint32(0x243F6A88)


def mix(x: jax.Array) -> jax.Array:  # uint32 [...] -> uint32 [...]
    """lowbias32, wrapping uint32 arithmetic (``>>`` on uint32 is a logical shift)."""
    x = x ^ (x >> np.uint32(16))
    x = x * _M1
    x = x ^ (x >> np.uint32(15))
    x = x * _M2
    return x ^ (x >> np.uint32(16))


def as_u32(x) -> jax.Array:
    """An integer array or Python int -> uint32 (the low 32 bits, two's complement for negatives)."""
    if isinstance(x, int):
        return jnp.uint32(x & 0xFFFFFFFF)
    return jnp.asarray(x).astype(jnp.uint32)


def key(seed_lo, seed_hi, offset, row, position, stream) -> jax.Array:  # uint32, broadcast
    """The per-(row, position) key: six rounds of ``mix``; all inputs broadcast."""
    k = mix(as_u32(seed_lo) ^ _SALT)
    k = mix(k ^ as_u32(seed_hi))
    k = mix(k ^ as_u32(stream))
    k = mix(k ^ as_u32(offset))
    k = mix(k ^ as_u32(row))
    return mix(k ^ as_u32(position))


def bits_from_key(k: jax.Array, vocab) -> jax.Array:  # uint32, broadcast
    """32 random bits at vocabulary index ``vocab`` under a precomputed key (used in kernels)."""
    return mix(k ^ as_u32(vocab))


def bits(seed_lo, seed_hi, offset, row, position, vocab, stream) -> jax.Array:
    return bits_from_key(key(seed_lo, seed_hi, offset, row, position, stream), vocab)


def to_uniform(b: jax.Array) -> jax.Array:  # uint32 -> float32
    """uint32 -> float32 in [2**-24, 1 - 2**-24], exactly: (2 * (b >> 9) + 1) * 2**-24."""
    m = (b >> np.uint32(9)).astype(jnp.int32)  # < 2**23: exact in int32 and in float32
    return (2 * m + 1).astype(jnp.float32) * np.float32(2.0**-24)


def gumbel_from_uniform(u: jax.Array) -> jax.Array:  # float32
    return -jnp.log(-jnp.log(u))


def uniform(seed_lo, seed_hi, offset, row, position, vocab, stream) -> jax.Array:
    return to_uniform(bits(seed_lo, seed_hi, offset, row, position, vocab, stream))


def gumbel(seed_lo, seed_hi, offset, row, position, vocab, stream) -> jax.Array:
    """float32 standard Gumbel variate, -log(-log(u)) in float32."""
    return gumbel_from_uniform(uniform(seed_lo, seed_hi, offset, row, position, vocab, stream))


def split_counter(value) -> tuple[jax.Array, jax.Array]:
    """seed / offset (int, NumPy or JAX integer array of shape [] or [B]) -> (lo, hi) uint32.

    Matches ``np.asarray(value, dtype=np.uint64)`` in the oracle: negatives wrap modulo 2**64.
    Host values are split on the host (so a 64-bit seed survives without x64); JAX arrays are
    split with jnp ops (and stay traced under ``jax.jit``).
    """
    if isinstance(value, (int, np.integer)):
        v = int(value) % 2**64
        return np.uint32(v & 0xFFFFFFFF), np.uint32(v >> 32)
    if isinstance(value, np.ndarray):
        v = value.astype(np.uint64)
        return (v & np.uint64(0xFFFFFFFF)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)
    v = jnp.asarray(value)
    lo = v.astype(jnp.uint32)
    if jnp.dtype(v.dtype).itemsize == 8:
        hi = (v >> 32).astype(jnp.uint32)
    elif jnp.issubdtype(v.dtype, jnp.signedinteger):
        hi = jnp.where(v < 0, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
    else:
        hi = jnp.zeros_like(lo)
    return lo, hi
