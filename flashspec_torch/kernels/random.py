"""The shared counter-based generator as ``@triton.jit`` device functions (``tl.uint32`` math).

Bit-identical to ``flashspec.random`` (the specification and test vectors live there) and to the
torch version in ``flashspec_torch.random``. uint32 multiplies wrap modulo 2**32 and ``>>`` on
uint32 is a logical shift, both on the GPU and in the interpreter (NumPy uint32).
"""

import triton
import triton.language as tl


@triton.jit
def mix(x):  # uint32 [...] -> uint32 [...]
    """lowbias32."""
    return mix_rest(x ^ (x >> 16))


@triton.jit
def mix_rest(h):  # uint32 [...] -> uint32 [...]: mix(x) from h = x ^ (x >> 16), its first step
    h = mix_body(h)
    return h ^ (h >> 16)


@triton.jit
def mix_body(h):  # uint32 [...] -> uint32 [...]: mix_rest(h) before its last step; its top 16 bits are mix's
    h = h * tl.full((), 0x7FEB352D, tl.uint32)
    h = h ^ (h >> 15)
    return h * tl.full((), 0x846CA68B, tl.uint32)


@triton.jit
def key(seed_lo, seed_hi, offset, row, position, stream):  # uint32, broadcast -> uint32
    """The per-(row, position) key: six rounds of ``mix``."""
    return mix(key_base(seed_lo, seed_hi, offset, row, stream) ^ position)


@triton.jit
def key_base(seed_lo, seed_hi, offset, row, stream):  # uint32, broadcast -> uint32: ``key`` before its position
    k = mix(seed_lo ^ tl.full((), 0x243F6A88, tl.uint32))
    k = mix(k ^ seed_hi)
    k = mix(k ^ stream)
    k = mix(k ^ offset)
    return mix(k ^ row)


@triton.jit
def uniform_from_bits(b):  # uint32 -> float32 in [2**-24, 1 - 2**-24], exactly
    m = (b >> 9).to(tl.int32)  # < 2**23
    return (2 * m + 1).to(tl.float32) * 5.9604644775390625e-08  # 2**-24
