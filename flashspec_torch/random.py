"""The shared counter-based generator (``flashspec.random``) in PyTorch and in Triton.

Bit-identical to the NumPy definition (see ``flashspec/random.py`` for the specification and the
test vectors). Two versions:

* torch: ``int64`` tensors holding 32-bit values. Every step is masked back to 32 bits and the
  32 x 32-bit multiply is split in two 16-bit halves of the constant, so no intermediate ever
  exceeds 2**49 (nothing relies on int64 wrap-around). Runs on any device, no host sync.
* triton: ``@triton.jit`` device functions on ``tl.uint32`` (wrapping multiply, logical shifts)
  in :mod:`flashspec_torch.kernels.random`, used inside the verify kernels. They live under
  ``kernels/`` (imported on first use of ``impl="triton"``) so that importing this module neither
  needs Triton nor fixes the interpreter choice: ``TRITON_INTERPRET`` is read when a
  ``@triton.jit`` function is defined.

Seeds are 64-bit but a Python int up to 2**64 - 1 does not fit ``int64``, so a seed travels as two
32-bit halves (``seed_lo``, ``seed_hi``); :func:`split_seed` makes them without a host sync.
"""

from __future__ import annotations

import torch

from flashspec.random import ACCEPT, DRAFT, FINAL, TREE_ACCEPT, TREE_FINAL

__all__ = [
    "ACCEPT", "DRAFT", "FINAL", "TREE_ACCEPT", "TREE_FINAL", "mix", "key", "bits_from_key", "to_uniform", "gumbel_from_uniform",
    "uniform", "gumbel", "split_seed", "as_counter",
]

MASK32 = 0xFFFFFFFF
M1 = 0x7FEB352D
M2 = 0x846CA68B
SALT = 0x243F6A88


def mul32(x: torch.Tensor, m: int) -> torch.Tensor:  # int64 [...] in [0, 2**32) -> same
    """(x * m) mod 2**32 with every intermediate below 2**49: m = m_hi * 2**16 + m_lo."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    return ((((x * m_hi) & 0xFFFF) << 16) + x * m_lo) & MASK32


def mix(x: torch.Tensor) -> torch.Tensor:  # int64 [...] in [0, 2**32) -> same
    """lowbias32 on 32-bit values held in int64."""
    x = x ^ (x >> 16)
    x = mul32(x, M1)
    x = x ^ (x >> 15)
    x = mul32(x, M2)
    return x ^ (x >> 16)


def as_counter(x: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """A Python int or an integer tensor -> int64 tensor of its low 32 bits (two's complement)."""
    if isinstance(x, int):
        return torch.full((), x & MASK32, dtype=torch.int64, device=device)
    return x.to(torch.int64) & MASK32


def key(seed_lo, seed_hi, offset, row, position, stream) -> torch.Tensor:  # int64, broadcast
    """The per-(row, position) key: six rounds of ``mix``; tensor inputs broadcast."""
    k = mix(seed_lo ^ SALT)
    k = mix(k ^ seed_hi)
    k = mix(k ^ stream)
    k = mix(k ^ offset)
    k = mix(k ^ row)
    return mix(k ^ position)


def bits_from_key(k: torch.Tensor, vocab) -> torch.Tensor:  # int64, broadcast
    return mix(k ^ vocab)


def to_uniform(b: torch.Tensor) -> torch.Tensor:  # int64 bits -> float32
    """(2 * (b >> 9) + 1) * 2**-24: exact in float32, in [2**-24, 1 - 2**-24]."""
    return (2 * (b >> 9) + 1).to(torch.float32) * (2.0**-24)


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:  # float32
    return -torch.log(-torch.log(u))


def uniform(seed_lo, seed_hi, offset, row, position, vocab, stream) -> torch.Tensor:
    return to_uniform(bits_from_key(key(seed_lo, seed_hi, offset, row, position, stream), vocab))


def gumbel(seed_lo, seed_hi, offset, row, position, vocab, stream) -> torch.Tensor:
    return gumbel_from_uniform(uniform(seed_lo, seed_hi, offset, row, position, vocab, stream))


def split_seed(seed: torch.Tensor | int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """seed (Python int < 2**64, or an integer tensor read as 64 bits) -> (lo, hi) int64 tensors."""
    if isinstance(seed, int):
        return as_counter(seed & MASK32, device), as_counter(seed >> 32, device)
    s = seed.to(torch.int64)
    return s & MASK32, (s >> 32) & MASK32  # arithmetic shift, then mask: the high word's bits
