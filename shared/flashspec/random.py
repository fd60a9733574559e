"""The counter-based random generator shared by every backend.

Every random number FlashSpec uses is a pure function of six unsigned 32-bit integers::

    (seed, offset, row, position, vocab, stream)

so that NumPy, PyTorch, Triton, JAX and Pallas draw bit-identical numbers from the same inputs.

Specification (all arithmetic on unsigned 32-bit integers, wrapping modulo 2**32)::

    mix(x):                      # "lowbias32" by Chris Wellons, a bijection of uint32
        x ^= x >> 16
        x *= 0x7FEB352D
        x ^= x >> 15
        x *= 0x846CA68B
        x ^= x >> 16
        return x

    key(seed, offset, row, position, stream):        # per (row, position): computed once
        k = mix(seed_lo ^ 0x243F6A88)                # seed_lo = seed & 0xFFFFFFFF
        k = mix(k ^ seed_hi)                         # seed_hi = seed >> 32 (seeds < 2**64)
        k = mix(k ^ stream)
        k = mix(k ^ offset)
        k = mix(k ^ row)
        k = mix(k ^ position)
        return k

    bits(seed, offset, row, position, vocab, stream) = mix(key(...) ^ vocab)

    uniform(...) = (2 * (bits >> 9) + 1) * 2**-24    # float32, exact, in [2**-24, 1 - 2**-24]

The uniform is never 0 or 1, so ``log(u)`` and ``-log(-log(u))`` (a Gumbel variate) are finite.
``2 * (bits >> 9) + 1 < 2**24`` is exactly representable in float32, so every backend gets the
same float32 bits without relying on rounding modes.

Streams are disjoint by construction (``stream`` enters the key):

* ``ACCEPT`` (0): the accept test of drafted token i uses ``(position=i, vocab=0)``.
* ``FINAL`` (1): the residual / bonus draw at row n uses a Gumbel variate per vocabulary entry j,
  ``(position=n, vocab=j)``.
* ``DRAFT`` (2): a draft sampling its i-th token uses a Gumbel variate per vocabulary entry j,
  ``(position=i, vocab=j)``.
* ``TREE_ACCEPT`` (3): tree verification's accept test of node j (``flashspec.tree``) uses
  ``(position=j + 1, vocab=0)``; each node is tested at most once per step.
* ``TREE_FINAL`` (4): tree verification's residual / leaf draw at the slot s where the walk stops
  (s = 0: the root, s = j + 1: node j) uses a Gumbel variate per vocabulary entry j,
  ``(position=s, vocab=j)``.

``row`` is the batch row when one seed serves the whole batch, and 0 when every row carries its
own seed (a request's randomness is then keyed to its seed, not to its place in the batch).
``offset`` is the step counter: it advances every speculative step.

Test vectors (``bits`` and ``uniform``; see ``TEST_VECTORS``, checked by the test suite)::

    seed        offset  row  pos  vocab   stream   bits        uniform
    0           0       0    0    0       0        0xC13C4027  0.75482565
    1           0       0    0    0       0        0x6073F67F  0.37676948
    0           1       0    0    0       0        0xB7736485  0.71660453
    0           0       1    0    0       0        0x5F5168C9  0.37233597
    0           0       0    1    0       0        0xE6D354AA  0.90166217
    0           0       0    0    1       0        0x6684332A  0.40045470
    0           0       0    0    0       1        0xCEBB2280  0.80754298
    0           0       0    0    0       2        0xFE0D7009  0.99239260
    123456789   7       3    2    49151   1        0x60EC0D85  0.37860185
    2**40 + 5   4096    255  8    128255  2        0x4E415DAD  0.30568486
"""

from __future__ import annotations

import numpy as np

ACCEPT = 0
FINAL = 1
DRAFT = 2
TREE_ACCEPT = 3
TREE_FINAL = 4

_M1 = np.uint32(0x7FEB352D)
_M2 = np.uint32(0x846CA68B)
_SALT = np.uint32(0x243F6A88)
MAX_SEED = 2**64 - 1
MAX_OFFSET = 2**32 - 1


def mix(x: np.ndarray) -> np.ndarray:
    """lowbias32: a bijective 32-bit integer hash (wrapping uint32 arithmetic)."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * _M1
        x = x ^ (x >> np.uint32(15))
        x = x * _M2
        x = x ^ (x >> np.uint32(16))
    return x


def _u32(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"counter inputs must be integers, got dtype {a.dtype}")
    return (a.astype(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def key(seed, offset, row, position, stream) -> np.ndarray:
    """The per-(row, position) key; inputs broadcast against each other."""
    s = np.asarray(seed, dtype=np.uint64)
    k = mix(_u32(s & np.uint64(0xFFFFFFFF)) ^ _SALT)
    k = mix(k ^ _u32(s >> np.uint64(32)))
    k = mix(k ^ _u32(stream))
    k = mix(k ^ _u32(offset))
    k = mix(k ^ _u32(row))
    return mix(k ^ _u32(position))


def bits(seed, offset, row, position, vocab, stream) -> np.ndarray:
    """32 random bits; all arguments broadcast against each other."""
    return mix(key(seed, offset, row, position, stream) ^ _u32(vocab))


def to_uniform(b: np.ndarray) -> np.ndarray:
    """uint32 bits -> float32 uniform in [2**-24, 1 - 2**-24], exactly."""
    m = (np.asarray(b, dtype=np.uint32) >> np.uint32(9)).astype(np.int64)
    return (2 * m + 1).astype(np.float32) * np.float32(2.0**-24)


def uniform(seed, offset, row, position, vocab, stream) -> np.ndarray:
    """float32 uniform in (0, 1)."""
    return to_uniform(bits(seed, offset, row, position, vocab, stream))


def gumbel(seed, offset, row, position, vocab, stream) -> np.ndarray:
    """float32 standard Gumbel variate, -log(-log(u)) computed in float32."""
    u = uniform(seed, offset, row, position, vocab, stream)
    return -np.log(-np.log(u))


# (seed, offset, row, position, vocab, stream) -> bits; the docstring's table.
TEST_VECTORS: tuple[tuple[tuple[int, int, int, int, int, int], int], ...] = (
    ((0, 0, 0, 0, 0, 0), 0xC13C4027),
    ((1, 0, 0, 0, 0, 0), 0x6073F67F),
    ((0, 1, 0, 0, 0, 0), 0xB7736485),
    ((0, 0, 1, 0, 0, 0), 0x5F5168C9),
    ((0, 0, 0, 1, 0, 0), 0xE6D354AA),
    ((0, 0, 0, 0, 1, 0), 0x6684332A),
    ((0, 0, 0, 0, 0, 1), 0xCEBB2280),
    ((0, 0, 0, 0, 0, 2), 0xFE0D7009),
    ((123456789, 7, 3, 2, 49151, 1), 0x60EC0D85),
    ((2**40 + 5, 4096, 255, 8, 128255, 2), 0x4E415DAD),
)
