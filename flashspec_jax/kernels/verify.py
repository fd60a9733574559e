"""The fused verify of speculative decoding in Pallas (GPU), with its jnp reference (``verify_reference``).

Notation (SPEC.md): z target logits, w draft logits, T temperature, p / q the target / draft
distributions after temperature, top-k and top-p, x drafted tokens, u accept uniforms, n first
rejection, y the residual or bonus token.

Design
------
Two streaming kernels and a small jnp epilogue, all inside one ``jax.jit`` (``verify`` is a plain
function of arrays and static arguments: jit it as it is, see ``flashspec_jax.verify.verify_jit``):

1. ``row_stats`` (kernels/row_stats.py, grid ``(B, NV)``: batch row b, vocabulary chunk c) writes
   per chunk the max and sum-exp of each of the G+1 target rows: ``[B, NV, G+1]`` floats; in greedy
   mode (T = 0) the max and argmax of ``z`` instead, and a jnp argmax across chunks finishes. The
   same kernel streams the G draft rows when the accept test needs ``log q(x)`` and
   ``draft_logprobs`` was not given.
2. ``final_decide`` (kernels/final.py, grid ``(B, NV)``): every program recombines its batch row's
   partials, tests x_1..x_G itself (accept ``x_i`` iff ``log u_i < log p(x_i) - log q(x_i)``), finds
   n and the FINAL key, and sweeps its chunk of row n of z (and of w, unless n = G) for the best
   residual and bonus keys: ``[B, NV]`` partials.
3. ``pick_draw`` (jnp): the first (lowest-index) maximum across chunks; ``emit`` the tokens.

HBM traffic: G+1 target rows once, the draft rows once only when ``draft_logprobs`` is missing,
then one target row and one draft row per batch row. Nothing of size V is written; the partials
are ``O(B * NV * (G+1))``. Splitting V into NV chunks keeps ``B * NV >= min_programs``; the
default (``config.choose_config``) keeps enough bytes in flight per SM to stream at the bandwidth
(docs/kernel_notes.md). top-k / top-p are a jnp pre-pass (``lax.top_k`` and a sort over V per row,
and one filtered float32 copy of z and w written to HBM): only paid when they are on.

Lowering: Pallas Triton, chosen for the H200 with JAX 0.11.2
-----------------------------------------------------------
JAX 0.11 deprecates the Triton lowering of ``pl.pallas_call`` but keeps it working. On both 0.10.2
and 0.11.2 the GPU default of ``pl.pallas_call`` is Mosaic GPU (``jax_pallas_use_mosaic_gpu``), so
the lowering is selected explicitly by ``compiler_params=plt.CompilerParams(num_warps, num_stages)``
(and ``pl.pallas_call`` with Mosaic GPU is itself deprecated in favour of ``plgpu.kernel``).
We keep the Triton lowering because this kernel is a masked, gather-heavy streaming reduction: masked tail
loads (``plt.load(mask=, other=-inf)``) of non-power-of-2 V and G+1, a data-dependent row n,
uint32 hashing and ``argmax`` with lowest-index ties are all first-class in the Triton lowering
and work identically in interpret mode, on JAX 0.10.2 and 0.11.2. Mosaic GPU is a warpgroup
programming model built around TMA copies of fixed, aligned tiles and WGMMA layouts; it buys
nothing for a bandwidth-bound reduction, needs explicit SMEM pipelining and padding for ragged V,
and its API is still changing between the two versions we must support. Revisit when the Triton
lowering is removed (the kernel bodies are plain jnp and port as they are).

Exactness: ``z / T`` must be an IEEE division (the oracle divides), but Triton's NVPTX backend
turns an f32 ``divf`` into the approximate ``div.full.f32``; on the GPU the kernels divide with
inline ``div.rn.f32`` (interpret mode divides in XLA, which is IEEE). Remaining differences to the NumPy oracle are
ulps in exp/log and in the order of summation; they can change a decision only at a near-tie (probability about 1e-6 per draw).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flashspec_jax import random as rng

from . import final
from .common import NEG_INF, Counters  # noqa: F401  (Counters re-exported)
from .config import Chunking, VerifyKernelConfig, choose_config  # noqa: F401  (re-exported)
from .row_stats import row_stats

# ----------------------------------------------------------------------------- shared jnp steps


def combine_argmax(m: jax.Array, idx: jax.Array, vocab: int) -> jax.Array:
    """[B, NV, Ra] chunk max and argmax -> [B, Ra] argmax (ties: lowest index)."""
    c = jnp.argmax(m, axis=1)  # first chunk holding the max
    best = jnp.take_along_axis(idx, c[:, None], axis=1)[:, 0]
    return jnp.minimum(best, vocab - 1)


def scale(z: jax.Array, temperature: float) -> jax.Array:  # [..., V] -> f32 [..., V]
    return z.astype(jnp.float32) / np.float32(temperature)


def filter_top_k(s: jax.Array, k: int) -> jax.Array:  # [..., V] scaled logits
    if k <= 0 or k >= s.shape[-1]:
        return s
    kth = lax.top_k(s, k)[0][..., k - 1 : k]
    return jnp.where(s >= kth, s, NEG_INF)


def filter_top_p(s: jax.Array, top_p: float) -> jax.Array:  # [..., V] scaled logits
    if top_p >= 1.0:
        return s
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    probs = e / jnp.sum(e, axis=-1, keepdims=True)
    order = jnp.argsort(-probs, axis=-1, stable=True)  # descending, lower ids first on ties
    sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
    keep_sorted = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs < np.float32(top_p)
    keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)
    return jnp.where(keep, s, NEG_INF)


def filter_logits(z: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """Pre-pass: z [..., V] -> f32 z with the tokens top-k / top-p remove (on z / T) set to -inf."""
    s = filter_top_p(filter_top_k(scale(z, temperature), top_k), top_p)
    return jnp.where(s == NEG_INF, NEG_INF, z.astype(jnp.float32))


def gather(a: jax.Array, x: jax.Array) -> jax.Array:  # [B, G, V], [B, G] -> [B, G]
    return jnp.take_along_axis(a, x[..., None], axis=-1)[..., 0]


def accept_log_uniforms(c: Counters, gamma: int) -> jax.Array:  # -> [B, G] f32
    i = jnp.arange(gamma, dtype=jnp.uint32)[None]
    col = lambda a: a[:, None]  # noqa: E731
    return jnp.log(rng.uniform(col(c.seed_lo), col(c.seed_hi), col(c.offset), col(c.row), i, 0, rng.ACCEPT))


def proposed_mask(lengths: jax.Array, gamma: int) -> jax.Array:  # [B] -> [B, G] bool: i < L_b
    return jnp.arange(gamma)[None] < lengths[:, None]


def full_lengths(lengths: jax.Array | None, batch: int, gamma: int) -> jax.Array:  # -> [B] int32
    """draft_lengths, or G for every row (None); clamped to [0, G] so that nothing reads out of bounds."""
    if lengths is None:
        return jnp.full((batch,), gamma, jnp.int32)
    return clamp_lengths(lengths, gamma)


def clamp_lengths(lengths: jax.Array | None, gamma: int) -> jax.Array | None:  # [B] -> [B] int32 in [0, G]
    return None if lengths is None else jnp.clip(lengths.astype(jnp.int32), 0, gamma)


def first_rejection(accepted: jax.Array) -> jax.Array:  # [B, G] bool -> [B] int32
    gamma = accepted.shape[-1]
    return jnp.where(accepted.all(-1), gamma, jnp.argmax(~accepted, axis=-1)).astype(jnp.int32)


def emit(x: jax.Array, n: jax.Array, y: jax.Array) -> jax.Array:  # [B, G], [B], [B] -> [B, G+1]
    batch, gamma = x.shape
    pos = jnp.arange(gamma + 1)[None]
    padded = jnp.concatenate([x, jnp.zeros((batch, 1), x.dtype)], axis=1)
    tokens = jnp.where(pos < n[:, None], padded, -1)
    return jnp.where(pos == n[:, None], y[:, None], tokens).astype(jnp.int32)


class Decision(NamedTuple):
    num_accepted: jax.Array  # [B] int32
    tokens: jax.Array  # [B, G+1] int32
    log_q_x: jax.Array  # [B, G] f32: log q(x) used by the accept test (-inf: x impossible under q)


# ----------------------------------------------------------------------------- entry points


def verify(
    z: jax.Array,  # [B, G+1, V] float
    x: jax.Array,  # [B, G] int32, in [0, V)
    w: jax.Array | None,  # [B, G, V] float, or None (one-hot q)
    log_q_given: jax.Array | None,  # [B, G] float, or None
    c: Counters,
    lengths: jax.Array | None = None,  # [B] int: draft_lengths in [0, G]; None: G
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    config: VerifyKernelConfig | None = None,
    interpret: bool = False,
) -> Decision:
    """The fused verify on already checked arguments (call under ``jax.jit``, temperature / top-k / top-p /
    config / interpret static); ``interpret``: Pallas interpret mode (any device)."""
    batch, g1, vocab = z.shape
    config = config or choose_config(batch, g1 - 1, vocab, jnp.dtype(z.dtype).itemsize, interpret)
    x = x.astype(jnp.int32)
    lengths = clamp_lengths(lengths, g1 - 1)  # None stays None: no [B] operand built per step
    if temperature == 0:
        return verify_greedy(z, x, lengths, config=config, interpret=interpret)
    if top_k > 0 or top_p < 1.0:
        z = filter_logits(z, temperature, top_k, top_p)
        w = None if w is None else filter_logits(w, temperature, top_k, top_p)
    return verify_sampled(z, x, w, log_q_given, c, lengths, temperature=temperature, config=config,
                          interpret=interpret)


def verify_greedy(
    z: jax.Array,  # [B, G+1, V]
    x: jax.Array,  # [B, G] int32
    lengths: jax.Array | None,  # [B] int32 in [0, G], or None (G)
    *,
    config: VerifyKernelConfig,
    interpret: bool,
) -> Decision:
    """T = 0: one argmax pass (row_stats) and O(B G) jnp ops."""
    batch, g1, vocab = z.shape
    gamma = g1 - 1
    x = jnp.clip(x, 0, vocab - 1)
    m, idx = row_stats(z, temperature=0.0, greedy=True, config=config, interpret=interpret)
    argmax = combine_argmax(m, idx, vocab)  # [B, G+1]
    accepted = x == argmax[:, :gamma]
    n = first_rejection(accepted if lengths is None else accepted & proposed_mask(lengths, gamma))
    return Decision(n, emit(x, n, argmax[jnp.arange(batch), n]), jnp.zeros(x.shape, jnp.float32))


def verify_sampled(
    z: jax.Array,  # [B, G+1, V] (filtered)
    x: jax.Array,  # [B, G] int32
    w: jax.Array | None,  # [B, G, V] (filtered) or None
    log_q_given: jax.Array | None,  # [B, G] or None
    c: Counters,
    lengths: jax.Array | None,  # [B] int32 in [0, G], or None (G)
    *,
    temperature: float,
    config: VerifyKernelConfig,
    interpret: bool,
) -> Decision:
    """T > 0: row_stats -> final_decide (accept test, n and the FINAL key in its prologue) -> pick_draw + emit."""
    vocab = z.shape[2]
    stats = functools.partial(row_stats, temperature=temperature, greedy=False, config=config, interpret=interpret)
    stats_q = stats(w) if w is not None and log_q_given is None else None
    partials, n, log_q_x = final.final_decide(z, x, w, log_q_given, stats(z), stats_q, c, lengths,
                                              temperature=temperature, config=config, interpret=interpret)
    y = final.pick_draw(partials, n, x.shape[1], vocab, lengths)
    return Decision(n, emit(jnp.clip(x, 0, vocab - 1), n, y), log_q_x)


def log_softmax(s: jax.Array) -> jax.Array:  # [..., V], the oracle's s - (m + log sum exp(s - m))
    m = jnp.max(s, axis=-1, keepdims=True)
    return s - (m + jnp.log(jnp.sum(jnp.exp(s - m), axis=-1, keepdims=True)))


def log_probs(a: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:  # [..., V]
    return log_softmax(filter_top_p(filter_top_k(scale(a, temperature), top_k), top_p))


def verify_reference(
    z: jax.Array,  # [B, G+1, V] float
    x: jax.Array,  # [B, G] int32
    w: jax.Array | None,  # [B, G, V] float, or None
    log_q_given: jax.Array | None,  # [B, G] float, or None
    c: Counters,
    lengths: jax.Array | None = None,  # [B] int: draft_lengths in [0, G]; None: G
    *,
    temperature: float,
    top_k: int,
    top_p: float,
) -> Decision:
    """The oracle's algorithm in jnp, materialising every distribution (float32)."""
    batch, g1, vocab = z.shape
    gamma, rows = g1 - 1, jnp.arange(batch)
    x = jnp.clip(x.astype(jnp.int32), 0, vocab - 1)
    z = z.astype(jnp.float32)
    lengths = full_lengths(lengths, batch, gamma)
    proposed = proposed_mask(lengths, gamma)  # [B, G]
    if temperature == 0:
        n = first_rejection((x == jnp.argmax(z[:, :gamma], axis=-1)) & proposed)
        y = jnp.argmax(z[rows, n], axis=-1)
        return Decision(n, emit(x, n, y), jnp.zeros(x.shape, jnp.float32))
    log_p = log_probs(z, temperature, top_k, top_p)  # [B, G+1, V]
    log_q = None if w is None else log_probs(w, temperature, top_k, top_p)  # [B, G, V]
    if log_q_given is not None:
        log_q_x = log_q_given.astype(jnp.float32)
    elif log_q is None:
        log_q_x = jnp.zeros(x.shape, jnp.float32)
    else:
        log_q_x = gather(log_q, x)
    n = first_rejection((accept_log_uniforms(c, gamma) < gather(log_p[:, :gamma], x) - log_q_x) & proposed)
    log_p_n = log_p[rows, n]  # [B, V]
    j = jnp.arange(vocab, dtype=jnp.uint32)[None]
    col = lambda a: a[:, None]  # noqa: E731
    coords = (col(c.seed_lo), col(c.seed_hi), col(c.offset), col(c.row), col(n.astype(jnp.uint32)), j)
    g = rng.gumbel(*coords, rng.FINAL)
    i = jnp.minimum(n, gamma - 1)
    if log_q is None:
        q_n = (jnp.arange(vocab)[None] == x[rows, i][:, None]).astype(jnp.float32)
    else:
        q_n = jnp.exp(log_q[rows, i])
    r = jnp.maximum(jnp.exp(log_p_n) - q_n, 0.0)
    use_p = (n == lengths)[:, None] | ~jnp.any(r > 0, axis=-1, keepdims=True)  # bonus: all L_b accepted
    y = jnp.argmax(jnp.where(use_p, log_p_n, jnp.log(r)) + g, axis=-1)
    return Decision(n, emit(x, n, y), log_q_x)
