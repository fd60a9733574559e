"""The batch-invariant RMSNorm in Pallas (Triton lowering), with its plain jnp reference.

``invariant_rms_norm(x, weight, eps)``: ``flashspec_jax.model.rms_norm`` with the row's sum of
squares by a kernel with one program per row: the row (C values, masked up to the next power of
two) squared in float32 and summed in an order that depends on C only: the Triton reduction of one
[1, C'] row on a GPU, a pairwise tree (``invariant_matmul.tree_sum``) under the interpreter. XLA's
own row reduction could pick its layout by the number of rows; the rest of the norm is elementwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from .invariant_matmul import interpreted_grid, tree_sum


def squares_kernel(x_ref, out_ref, *, width: int, use_tree: bool):
    """x [M, C] -> out [M, 1] float32: program r sums row r's squares."""
    r = jnp.minimum(pl.program_id(0), x_ref.shape[0] - 1)  # an extra program (``interpreted_grid``) redoes the last row
    cols = jnp.arange(width, dtype=jnp.int32)[None, :]  # [1, C']
    x = plt.load(x_ref.at[r, cols], mask=cols < x_ref.shape[1], other=0).astype(jnp.float32)  # [1, C']
    s = tree_sum(x * x) if use_tree else jnp.sum(x * x, axis=1)  # [1]
    plt.store(out_ref.at[r, jnp.zeros((1,), jnp.int32)], s)


def row_squares(x: jax.Array, interpret: bool) -> jax.Array:  # [M, C] -> [M, 1] float32
    m, c = x.shape
    kernel = functools.partial(squares_kernel, width=1 << (c - 1).bit_length(), use_tree=interpret)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, 1), jnp.float32),
                          grid=interpreted_grid((m,), interpret),
                          compiler_params=plt.CompilerParams(num_warps=4, num_stages=1), interpret=interpret,
                          name="flashspec_invariant_rms")(x)


def normalize(x: jax.Array, ss: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [M, C], [M, 1] f32
    """``rms_norm``'s elementwise part: x rsqrt(ss / C + eps) in float32, rounded, times weight."""
    xf = x.astype(jnp.float32)
    return (xf * lax.rsqrt(ss / np.float32(x.shape[-1]) + np.float32(eps))).astype(x.dtype) * weight


@functools.partial(jax.jit, static_argnames=("eps", "interpret"))
def invariant_rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, interpret: bool = False) -> jax.Array:
    """x [..., C], weight [C] -> RMSNorm(x) [..., C]; each row's bits a function of its own data and C."""
    x2 = x.reshape(-1, x.shape[-1])
    return normalize(x2, row_squares(x2, interpret), weight, eps).reshape(x.shape)


@functools.partial(jax.jit, static_argnames=("eps",))
def invariant_rms_norm_reference(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [M, C], [C]
    """The interpreted kernel's order in plain jnp: the squares zero padded to a power of two, ``tree_sum``."""
    c = x.shape[-1]
    xf = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, (1 << (c - 1).bit_length()) - c)))
    return normalize(x, tree_sum(xf * xf)[:, None], weight, eps)
