"""The batch-invariant product in Pallas (Triton lowering), with its plain jnp reference.

``invariant_matmul(x, w)``: y = x w^T for any number of rows M, w [N, K] in the fused layout
(``[out, in]``). A row's output bits do not depend on M nor on the other rows: the reduction order
along K is fixed by K alone. K is cut into chunks of ``BLOCK_K`` (128; the last one masked to zero
past K), each chunk's product of one row by one column summed on its own (``chunk_dot``), and the
chunks' sums added in chunk order into a float32 accumulator from zero; y = round(accumulator) to
x's dtype. Program (i, j) of the grid ``(cdiv(M, block_m), cdiv(N, block_n))`` computes the row tile
i and column tile j; the tiles are a launch choice (``launch_tiles``, by M and N) that changes no
element's sequence of additions.

``chunk_dot``: on a GPU the Triton dot (an MMA computes every element of its [block_m, block_n] tile
the same way, whatever row it sits in; block_m is 16 whatever M, so the dot's shape never follows
the batch; Triton may fold the addition into the MMA's accumulator, an order still fixed by K); under the interpreter the float32 products of the chunk summed by a fixed pairwise
tree (``tree_sum``), because the CPU's dot (XLA's, through Eigen) may round a row differently by
its place in the tile.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

BLOCK_K = 128  # the chunk of K: fixed, so the reduction order is K's alone
BLOCK_M = 16  # the row tile on the GPU (the Triton dot's smallest M) whatever M
BLOCK_N = 64  # the column tile (at most; fewer for a narrow N)


def tree_sum(p: jax.Array) -> jax.Array:  # [..., BK] f32 -> [...]
    """The sum over the last axis (a power of two) by halves: (p[:h] + p[h:]), then again."""
    while p.shape[-1] > 1:
        h = p.shape[-1] // 2
        p = p[..., :h] + p[..., h:]
    return p[..., 0]


def chunk_dot(x: jax.Array, w: jax.Array, use_dot: bool) -> jax.Array:  # [BM, BK], [BN, BK] -> [BM, BN] f32
    """One chunk's products x w^T in float32: the Triton dot (``use_dot``), else the pairwise tree."""
    if use_dot:
        precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
        return jnp.dot(x, w.T, precision=precision, preferred_element_type=jnp.float32)
    return tree_sum(x.astype(jnp.float32)[:, None, :] * w.astype(jnp.float32)[None, :, :])


def interpreted_grid(grid: tuple[int, ...], interpret: bool) -> tuple[int, ...]:
    """The grid, under the interpreter with at least two programs along its first axis (the extra one
    masked out): XLA's CPU code contracts a float32 product and the tree's first addition into one
    fused multiply-add or not by how the kernel's body is fused, and it compiles a one-program grid
    inline with the code around it, a loop over programs as a body of its own."""
    return (max(grid[0], 2), *grid[1:]) if interpret and math.prod(grid) == 1 else grid


def matmul_kernel(x_ref, w_ref, y_ref, *, block_m: int, block_n: int, use_dot: bool):
    """x [M, K], w [N, K], y [M, N]: program (i, j) writes y's row tile i, column tile j."""
    m_total, k_total = x_ref.shape
    n_total = w_ref.shape[0]
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    kk = jnp.arange(BLOCK_K, dtype=jnp.int32)

    def chunk(c, acc):  # chunk c of K added to the accumulator: chunks in order
        k = c * BLOCK_K + kk  # [BK]
        x = plt.load(x_ref.at[rows[:, None], k[None, :]], mask=(rows[:, None] < m_total) & (k[None, :] < k_total),
                     other=0)
        w = plt.load(w_ref.at[cols[:, None], k[None, :]], mask=(cols[:, None] < n_total) & (k[None, :] < k_total),
                     other=0)
        return acc + chunk_dot(x, w, use_dot)

    acc = lax.fori_loop(0, pl.cdiv(k_total, BLOCK_K), chunk, jnp.zeros((block_m, block_n), jnp.float32))
    plt.store(y_ref.at[rows[:, None], cols[None, :]], acc.astype(y_ref.dtype),
              mask=(rows[:, None] < m_total) & (cols[None, :] < n_total))


def launch_tiles(m: int, n: int, interpret: bool) -> tuple[int, int]:
    """(block_m, block_n): BLOCK_M rows on the GPU; under the interpreter (the tree: no row sees its
    tile) up to 64 rows, fewer programs to walk. Neither changes a row's bits."""
    block_n = min(BLOCK_N, max(16, 1 << (n - 1).bit_length()))
    block_m = min(64, max(16, 1 << (m - 1).bit_length())) if interpret else BLOCK_M
    return block_m, block_n


@functools.partial(jax.jit, static_argnames=("interpret", "block_m", "num_warps"))
def invariant_matmul(x: jax.Array, w: jax.Array, *, interpret: bool = False, block_m: int = 0,
                     num_warps: int = 4) -> jax.Array:  # x [..., K], w [N, K] -> [..., N] in x's dtype
    """y = x w^T, each row's bits a function of its own data, N, K and the dtype only (module
    docstring); ``block_m`` (0: ``launch_tiles``) the row tile, a launch choice."""
    if x.shape[-1] != w.shape[1] or w.ndim != 2:
        raise ValueError(f"invariant_matmul: x {x.shape} and w {w.shape}: w must be [N, K] with K = x's last axis")
    if x.dtype != w.dtype:
        raise ValueError(f"invariant_matmul: x is {x.dtype}, w is {w.dtype}: cast x to the weight's dtype")
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    bm, bn = launch_tiles(m, n, interpret)
    bm = block_m or bm
    kernel = functools.partial(matmul_kernel, block_m=bm, block_n=bn, use_dot=not interpret)
    y = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=interpreted_grid((pl.cdiv(m, bm), pl.cdiv(n, bn)), interpret),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="flashspec_invariant_matmul",
    )(x2, w)
    return y.reshape(*lead, n)


@functools.partial(jax.jit, static_argnames=("block_k",))
def invariant_matmul_reference(x: jax.Array, w: jax.Array,  # [M, K], [N, K] -> [M, N]
                               block_k: int = BLOCK_K) -> jax.Array:
    """The kernel's order in plain jnp: chunks of ``block_k`` (the kernel's BLOCK_K; zero padded), each
    summed by ``tree_sum``, added in chunk order from zero in float32, rounded to x's dtype. Jitted as
    the interpreted kernel is (``interpreted_grid``: XLA's CPU code contracts multiply-adds,
    op-by-op execution does not)."""
    m, k = x.shape
    pad = -k % block_k
    xf = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, pad)))
    wf = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, pad)))
    acc = jnp.zeros((m, w.shape[0]), jnp.float32)
    for c in range(xf.shape[1] // block_k):
        part = slice(c * block_k, (c + 1) * block_k)
        acc = acc + tree_sum(xf[:, None, part] * wf[None, :, part])
    return acc.astype(x.dtype)
