"""Small-row products in Pallas (Triton lowering) with the layer's prologue fused, and their jnp reference.

``project(x, w, layer)`` is ``x @ w[layer].T`` for the few rows of decoding and scoring (B T <= 16),
with one of three prologues computed in the kernel that reads ``x``: ``"norm"`` RMSNorm (``norm``
weight, optionally after adding ``residual``: the new residual stream is then a second output),
``"swiglu"`` silu(gate) * up of a ``[.., 2 F]`` input, or none. The weight is the model's whole
``[L, N, K]`` stack (the norm's ``[L, K]``) and the layer a traced scalar, so no layer's weight is copied out first (the
layer scan's dynamic slice, or a static slice handed to a custom call, would copy it). Program n of
the grid ``(N / block_n,)`` streams ``[block_n, block_k]`` tiles of the weight over K; the rows
are padded to 16 for the Triton dot. Each intermediate is rounded to the input dtype where the
model's jnp rounds it (``project_reference``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

MAX_ROWS = 16
PROLOGUES = (None, "norm", "swiglu")


def gemv_kernel(*refs, prologue: str | None, residual: bool, eps: float, block_n: int, block_k: int, rows: int):
    """x [M, K'] (K' = 2 K for swiglu); w [L, N, K]; layer [1]; norm [L, K]; residual [M, K]; out y [M, N], h [M, K]."""
    x_ref, w_ref, layer_ref = refs[:3]
    rest = list(refs[3:])
    norm_ref = rest.pop(0) if prologue == "norm" else None
    res_ref = rest.pop(0) if residual else None
    y_ref = rest.pop(0)
    h_ref = rest.pop(0) if residual else None
    n_blk = pl.program_id(0)
    m_len, k_len, n_len = x_ref.shape[0], w_ref.shape[2], w_ref.shape[1]
    layer = layer_ref[0]
    r = jnp.arange(rows, dtype=jnp.int32)
    live_r = r < m_len
    r_c = jnp.minimum(r, m_len - 1)
    dtype = x_ref.dtype
    steps = pl.cdiv(k_len, block_k)

    def chunk(j):  # the prologue's input at K columns j * block_k + [0, block_k): [R, BK] in dtype
        cols = j * block_k + jnp.arange(block_k, dtype=jnp.int32)
        ok = live_r[:, None] & (cols[None, :] < k_len)
        at = (r_c[:, None], cols[None, :])
        if prologue == "swiglu":
            g = plt.load(x_ref.at[r_c[:, None], cols[None, :]], mask=ok, other=0).astype(jnp.float32)
            u = plt.load(x_ref.at[r_c[:, None], k_len + cols[None, :]], mask=ok, other=0)
            return ((g * jax.nn.sigmoid(g)).astype(dtype) * u).astype(dtype), cols, ok
        x = plt.load(x_ref.at[at], mask=ok, other=0)
        if residual:
            x = (x + plt.load(res_ref.at[at], mask=ok, other=0)).astype(dtype)
        return x, cols, ok

    scale = None
    if prologue == "norm":
        def sumsq(j, acc):
            x, _, _ = chunk(j)
            xf = x.astype(jnp.float32)
            return acc + jnp.sum(xf * xf, axis=1)

        ss = lax.fori_loop(0, steps, sumsq, jnp.zeros((rows,), jnp.float32))
        scale = lax.rsqrt(ss / np.float32(k_len) + np.float32(eps))  # [R]

    n_cols = n_blk * block_n + jnp.arange(block_n, dtype=jnp.int32)

    def body(j, acc):
        x, cols, ok = chunk(j)
        if residual:  # the new residual stream, written by program 0
            store_rows(h_ref, x, cols, (cols < k_len) & (n_blk == 0))
        if prologue == "norm":
            nw = plt.load(norm_ref.at[layer, cols], mask=cols < k_len, other=0)
            x = ((x.astype(jnp.float32) * scale[:, None]).astype(dtype) * nw[None, :]).astype(dtype)
        w = plt.load(w_ref.at[layer, n_cols[:, None], cols[None, :]],
                     mask=(n_cols[:, None] < n_len) & (cols[None, :] < k_len), other=0)  # [BN, BK]
        return acc + jnp.dot(x, w.T, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((rows, block_n), jnp.float32))
    store_rows(y_ref, acc.astype(y_ref.dtype), n_cols, n_cols < n_len)


def store_rows(ref, a, cols, ok):  # a [R, C] -> ref[i, cols] for the ref's rows i, one row at a time
    """Row by row: a masked store of clamped padding rows would race with the real row in interpret mode."""
    r = jnp.arange(a.shape[0], dtype=jnp.int32)
    for i in range(ref.shape[0]):
        row = jnp.sum(jnp.where(r[:, None] == i, a, jnp.zeros_like(a)), axis=0)  # exact: one nonzero term
        plt.store(ref.at[i, cols], row.astype(ref.dtype), mask=ok)


def project(
    x: jax.Array,  # [M, K] ([M, 2 K] for swiglu)
    w: jax.Array,  # [L, N, K]
    layer,  # int or int32 scalar
    *,
    prologue: str | None = None,
    norm: jax.Array | None = None,  # [L, K]: the RMSNorm weights (prologue "norm"; layer ``layer``'s is used)
    residual: jax.Array | None = None,  # [M, K]: added to x before the norm (prologue "norm")
    eps: float = 1e-6,
    block_n: int = 0,
    block_k: int = 128,
    num_warps: int = 4,
    interpret: bool = False,
):  # -> y [M, N]; with residual: (y, x + residual)
    """The prologue of ``x`` times ``w[layer]`` transposed (``project_reference``). ``block_n`` 0: 32
    where that still gives 132 programs (an H100's SMs), else 16."""
    m, k_in = x.shape
    n, k = w.shape[1], w.shape[2]
    block_n = block_n or (32 if pl.cdiv(n, 32) >= 132 else 16)
    if prologue not in PROLOGUES or m > MAX_ROWS or k_in != (2 * k if prologue == "swiglu" else k):
        raise ValueError(f"project: prologue={prologue!r} (one of {PROLOGUES}), x {x.shape} against w {w.shape}: needs "
                         f"at most {MAX_ROWS} rows and K = {k} ({2 * k} for swiglu)")
    if (norm is None) != (prologue != "norm") or (residual is not None and prologue != "norm"):
        raise ValueError("project: norm= goes with prologue='norm' (and residual= only with it)")
    kernel = functools.partial(gemv_kernel, prologue=prologue, residual=residual is not None, eps=eps, block_n=block_n,
                               block_k=block_k, rows=MAX_ROWS)
    out_shape = [jax.ShapeDtypeStruct((m, n), x.dtype)]
    if residual is not None:
        out_shape.append(jax.ShapeDtypeStruct((m, k), x.dtype))
    args = [x, w, jnp.asarray(layer, jnp.int32).reshape(1)] + [a for a in (norm, residual) if a is not None]
    out = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(pl.cdiv(n, block_n),),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=3),
        interpret=interpret,
        name=f"flashspec_gemv_{prologue or 'plain'}",
    )(*args)
    return out[0] if residual is None else (out[0], out[1])


def project_reference(x, w, layer, *, prologue=None, norm=None, residual=None, eps=1e-6):
    """``project`` in jnp, as the model computes it (``rms_norm``, ``jax.nn.silu``, ``linear``)."""
    h = None
    if residual is not None:
        x = h = x + residual
    if prologue == "norm":
        xf = x.astype(jnp.float32)
        x = (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype) * norm[layer]
    elif prologue == "swiglu":
        gate, up = jnp.split(x, 2, axis=-1)
        x = jax.nn.silu(gate) * up
    y = lax.dot_general(x, w[layer], (((1,), (1,)), ((), ())))
    return y if h is None else (y, h)
