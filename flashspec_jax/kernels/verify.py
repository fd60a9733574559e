"""The fused verify kernel of speculative decoding, in Pallas (GPU), with its jnp reference.

Notation (SPEC.md): z target logits, w draft logits, T temperature, p / q the target / draft
distributions after temperature, top-k and top-p, x drafted tokens, u accept uniforms, n first
rejection, y the residual or bonus token.

Design
------
Two streaming kernels and a few scalar ops, all inside one ``jax.jit``. With
``VerifyKernelConfig(prologue=True)`` (the default of ``choose_config``) step 2 runs inside kernel
3's prologue (``final.final_decide``: every program (b, c) recombines its batch row's partials and
tests x_1..x_G itself), so T > 0 is row_stats -> final_decide -> a small jnp epilogue (argmax across
chunks, emit); ``prologue=False`` keeps step 2 as jnp ops between the kernels (``verify_with_glue``).

1. ``row_stats`` (grid ``(B, NV)``: batch row b, vocabulary chunk c). Program (b, c) streams the
   chunk's slice of each of the G+1 target rows in turn, in ``[block_v]`` tiles (masked tails, no
   padded rows), and writes the online max and sum-exp of ``z / T`` per row: ``[B, NV, G+1]``
   floats. In greedy mode (T = 0) it writes the max and argmax of ``z`` instead. The same kernel
   streams the G draft rows when the accept test needs ``log q(x)`` and ``draft_logprobs`` was
   not given.
2. Scalars (plain jnp, O(B G)): combine the chunks into ``log sum exp`` per row; ``log p(x_i)`` is
   ``z[b, i, x_i] / T - lse_i`` (a gather of B G logits); accept ``x_i`` iff
   ``log u_i < log p(x_i) - log q(x_i)``; n = first rejection; the FINAL key of row (b, n).
3. ``final_draw`` / ``final_decide`` (kernels/final.py, grid ``(B, NV)``): program (b, c) reads
   row n of z (and row n of w, unless n = G) over its chunk, rebuilds ``log p`` and ``q`` on the
   fly from the row normalisers, draws the Gumbel noise of the FINAL stream in registers, and keeps
   two running argmaxes (ties: lowest index): ``log max(0, p - q) + g`` (residual) and
   ``log p + g`` (bonus, or fallback when the residual is empty), plus whether any ``p - q > 0``.
   ``[B, NV]`` partials; a jnp argmax across chunks picks the first (lowest-index) maximum.

``VerifyKernelConfig(single=True)`` (kernels/single.py, opt-in: measured no faster on the H200) runs
steps 1-3 and the epilogue in one launch, the phases synchronised per batch row by an atomic counter.

HBM traffic: G+1 target rows once, the draft rows once only when ``draft_logprobs`` is missing,
then one target row and one draft row per batch row. Nothing of size V is written; the partials
are ``O(B * NV * (G+1))``. Splitting V into NV chunks keeps ``B * NV >= min_programs``; the
default (``config.choose_config``: "lanes" loops, 4 warps, 8 KB tiles loaded as 16-byte vectors,
the next tile prefetched, ~16 programs per SM, pruning from ~8 sweep tiles per program) keeps
enough bytes in flight per SM to stream at the bandwidth, which the first configuration (512
programs of 8 warps at B=256, one 16-byte load per thread at a time) did not: see
docs/kernel_notes.md. top-k / top-p are a jnp pre-pass (``lax.top_k`` and
a sort over V per row, and one filtered float32 copy of z and w written to HBM): only paid when
they are on.

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
inline ``div.rn.f32`` (interpret mode divides in XLA, which is IEEE). Remaining differences to the NumPy oracle are ulps in exp/log and in the order of
summation; they can change a decision only at a near-tie (probability about 1e-6 per draw).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from flashspec_jax import random as rng

from . import final, lanes, single
from .common import NEG_INF, Counters, divide, update_argmax  # noqa: F401  (Counters re-exported)
from .config import SMS, Chunking, VerifyKernelConfig, choose_config  # noqa: F401  (re-exported)
from .final import final_draw, final_draw_kernel  # noqa: F401  (re-exported)

# ----------------------------------------------------------------------------- kernel 1: row stats


def tile_cols(start, bv: int, vec: int) -> jax.Array:  # -> int32 [bv], or [bv // vec, vec] if vec
    """Vocabulary indices of the tile starting at ``start``; with ``vec`` one 16-byte vector per row."""
    if not vec:
        return start + jnp.arange(bv, dtype=jnp.int32)
    return start + (jnp.arange(bv // vec, dtype=jnp.int32)[:, None] * vec + jnp.arange(vec, dtype=jnp.int32)[None, :])


def row_stats_kernel(
    a_ref,  # [B, Ra, V] logits (any float dtype)
    m_ref,  # [B, NV, Ra] f32: max of a / T (greedy: max of a; lanes: max of raw a)
    l_ref,  # [B, NV, Ra] f32: sum exp(a / T - m) (greedy: int32 argmax)
    *count_ref,  # with row_stats(counter=True): [B] int32, zeroed here for final_decide's arrivals
    temperature: float,
    greedy: bool,
    chunking: Chunking,
    exact_div: bool,
    config: VerifyKernelConfig,
    ids: tuple | None = None,  # (b, c) when called from another kernel (single.py); None: the program ids
):
    b, c = ids or (pl.program_id(0), pl.program_id(1))
    num_rows, vocab = a_ref.shape[1], a_ref.shape[2]
    bv = chunking.block
    if count_ref:
        @pl.when(c == 0)
        def _():
            count_ref[0][b] = jnp.int32(0)

    per_lane = config.loops == "lanes" and not greedy

    def load(r, j):  # -> [bv] f32, index of its first entry
        start = (c * chunking.blocks + j) * bv
        cols = start + jnp.arange(bv, dtype=jnp.int32)
        a = plt.load(a_ref.at[b, r, cols], mask=cols < vocab, other=NEG_INF)
        return a.astype(jnp.float32), start

    def row_body(r, carry):
        def stats_body(j, ml):
            m, l = ml
            s, _ = load(r, j)
            s = divide(s, temperature, exact_div)
            m_new = jnp.maximum(m, jnp.max(s))
            m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
            return m_new, l * jnp.exp(m - m_safe) + jnp.sum(jnp.exp(s - m_safe))

        def argmax_body(j, best):
            z, start = load(r, j)
            return update_argmax(*best, z, start)

        init = jnp.float32(NEG_INF)
        if greedy:
            m, second = lax.fori_loop(0, chunking.blocks, argmax_body, (init, c * chunking.blocks * bv))
        else:
            m, second = lax.fori_loop(0, chunking.blocks, stats_body, (init, jnp.float32(0)))
        m_ref[b, c, r] = m
        l_ref[b, c, r] = second
        return carry

    def lanes_load(r, j):  # tile j of row r, raw, input dtype; j == blocks: tile 0 of row r + 1 (-inf past the last)
        if not isinstance(j, int):  # traced: the tile after the last of row r is row r + 1's first
            after = (j >= chunking.blocks).astype(jnp.int32)  # (arith, not jnp.where: its select of an i32
            r, j = r + after, j - after * chunking.blocks  # and a constant failed to verify in the lowering)
        cols = tile_cols((c * chunking.blocks + j) * bv, bv, config.vec)
        live = (cols < vocab) & (r < num_rows)
        return plt.load(a_ref.at[b, jnp.minimum(r, num_rows - 1), cols], mask=live, other=NEG_INF)

    def lanes_row(r, first):  # raw logits; the scale folded into exp2 (the max is divided outside)
        m, l, nxt = lanes.stream_row(lambda j: lanes_load(r, j), chunking.blocks, bv, config.vec, config.prefetch,
                                     lanes.LOG2E / temperature, first)
        m_ref[b, c, r] = m
        l_ref[b, c, r] = l
        return nxt

    if per_lane:
        lax.fori_loop(0, num_rows, lanes_row, lanes_load(0, 0) if config.prefetch else None)
    else:
        lax.fori_loop(0, num_rows, row_body, 0)


def row_stats(
    a: jax.Array,  # [B, Ra, V]
    *,
    temperature: float,
    greedy: bool,
    config: VerifyKernelConfig,
    interpret: bool,
    scale_max: bool = True,  # lanes: divide the raw max by T here (False: final_decide divides it in its prologue)
    counter: bool = False,  # also return a [B] int32 of zeros written by the kernel (final_decide's arrivals)
) -> tuple[jax.Array, ...]:  # [B, NV, Ra] f32, [B, NV, Ra] f32 (greedy: int32)[, [B] int32]
    batch, num_rows, vocab = a.shape
    chunking = Chunking.make(batch, vocab, config.block_v, config.min_programs)
    per_lane = config.loops == "lanes" and not greedy
    kernel = functools.partial(
        row_stats_kernel, temperature=temperature, greedy=greedy, chunking=chunking, exact_div=not interpret,
        config=config,
    )
    shape = (batch, chunking.num_chunks, num_rows)
    m, l, *count = pl.pallas_call(
        kernel,
        out_shape=[
            jax.ShapeDtypeStruct(shape, jnp.float32),
            jax.ShapeDtypeStruct(shape, jnp.int32 if greedy else jnp.float32),
            *([jax.ShapeDtypeStruct((batch,), jnp.int32)] if counter else []),
        ],
        grid=(batch, chunking.num_chunks),
        compiler_params=config.compiler_params(),
        interpret=interpret,
        name="flashspec_row_stats",
    )(a)
    m = scale(m, temperature) if per_lane and scale_max else m  # per lane: the max of raw a (IEEE / T)
    return (m, l, *count)


def combine_logsumexp(m: jax.Array, l: jax.Array) -> jax.Array:
    """[B, NV, Ra] chunk max and sum-exp -> [B, Ra] log sum exp."""
    big = jnp.max(m, axis=1)  # [B, R]
    safe = jnp.where(big == NEG_INF, 0.0, big)
    total = jnp.sum(l * jnp.exp(m - safe[:, None]), axis=1)
    return big + jnp.log(total)


def combine_argmax(m: jax.Array, idx: jax.Array, vocab: int) -> jax.Array:
    """[B, NV, Ra] chunk max and argmax -> [B, Ra] argmax (ties: lowest index)."""
    c = jnp.argmax(m, axis=1)  # first chunk holding the max
    best = jnp.take_along_axis(idx, c[:, None], axis=1)[:, 0]
    return jnp.minimum(best, vocab - 1)


# ----------------------------------------------------------------------------- shared jnp steps


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
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    config: VerifyKernelConfig | None = None,
    interpret: bool = False,
) -> Decision:
    """The fused verify on already checked arguments (call under ``jax.jit``)."""
    batch, g1, vocab = z.shape
    config = config or choose_config(batch, g1 - 1, vocab, jnp.dtype(z.dtype).itemsize, interpret)
    x = x.astype(jnp.int32)
    if temperature == 0:
        return verify_greedy(z, x, config=config, interpret=interpret)
    if top_k > 0 or top_p < 1.0:
        z = filter_logits(z, temperature, top_k, top_p)
        w = None if w is None else filter_logits(w, temperature, top_k, top_p)
    run = single.verify_single if config.single else verify_with_prologue if config.prologue else verify_with_glue
    return run(z, x, w, log_q_given, c, temperature=temperature, config=config, interpret=interpret)


def verify_greedy(
    z: jax.Array,  # [B, G+1, V]
    x: jax.Array,  # [B, G] int32
    *,
    config: VerifyKernelConfig,
    interpret: bool,
) -> Decision:
    """T = 0: one argmax pass (row_stats) and O(B G) jnp ops; ``config.prologue`` does not apply."""
    batch, g1, vocab = z.shape
    gamma = g1 - 1
    x = jnp.clip(x, 0, vocab - 1)
    m, idx = row_stats(z, temperature=0.0, greedy=True, config=config, interpret=interpret)
    argmax = combine_argmax(m, idx, vocab)  # [B, G+1]
    n = first_rejection(x == argmax[:, :gamma])
    return Decision(n, emit(x, n, argmax[jnp.arange(batch), n]), jnp.zeros(x.shape, jnp.float32))


def verify_with_prologue(
    z: jax.Array,  # [B, G+1, V] (filtered)
    x: jax.Array,  # [B, G] int32
    w: jax.Array | None,  # [B, G, V] (filtered) or None
    log_q_given: jax.Array | None,  # [B, G] or None
    c: Counters,
    *,
    temperature: float,
    config: VerifyKernelConfig,
    interpret: bool,
) -> Decision:
    """row_stats -> final_decide (accept test, n and the FINAL key in its prologue) -> pick_draw + emit."""
    vocab = z.shape[2]
    stats = functools.partial(row_stats, temperature=temperature, greedy=False, config=config, interpret=interpret,
                              scale_max=False)
    stats_q = stats(w) if w is not None and log_q_given is None else None
    m_p, l_p, *count = stats(z, counter=config.finish)
    partials, n, log_q_x, tokens = final.final_decide(
        z, x, w, log_q_given, (m_p, l_p), stats_q, c, *count,
        temperature=temperature, raw_max=config.loops == "lanes", config=config, interpret=interpret,
    )
    if tokens is not None:  # config.finish: the kernel reduced the partials and wrote the tokens
        return Decision(n, tokens, log_q_x)
    y = final.pick_draw(partials, n, x.shape[1], vocab)
    return Decision(n, emit(jnp.clip(x, 0, vocab - 1), n, y), log_q_x)


def verify_with_glue(
    z: jax.Array,  # [B, G+1, V] (filtered)
    x: jax.Array,  # [B, G] int32
    w: jax.Array | None,  # [B, G, V] (filtered) or None
    log_q_given: jax.Array | None,  # [B, G] or None
    c: Counters,
    *,
    temperature: float,
    config: VerifyKernelConfig,
    interpret: bool,
) -> Decision:
    """row_stats -> jnp glue (lse, accept test, n, FINAL key) -> final_draw -> emit (``prologue=False``)."""
    batch, g1, vocab = z.shape
    gamma, rows = g1 - 1, jnp.arange(batch)
    x = jnp.clip(x, 0, vocab - 1)
    stats = functools.partial(row_stats, temperature=temperature, greedy=False, config=config, interpret=interpret)
    lse_p = combine_logsumexp(*stats(z))  # [B, G+1]
    log_p_x = scale(z[rows[:, None], jnp.arange(gamma)[None], x], temperature) - lse_p[:, :gamma]  # no slice of z
    if w is None:
        log_q_x, lse_q = jnp.zeros(x.shape, jnp.float32), jnp.zeros(x.shape, jnp.float32)
    elif log_q_given is not None:  # the draft row's normaliser is one logit away
        log_q_x, t_x = log_q_given.astype(jnp.float32), scale(gather(w, x), temperature)
        lse_q = jnp.where(jnp.isfinite(t_x), t_x - log_q_x, jnp.inf)
    else:
        lse_q = combine_logsumexp(*stats(w))  # [B, G]
        log_q_x = scale(gather(w, x), temperature) - lse_q
    n = first_rejection(accept_log_uniforms(c, gamma) < log_p_x - log_q_x)
    i = jnp.minimum(n, gamma - 1)
    key = rng.key(c.seed_lo, c.seed_hi, c.offset, c.row, n.astype(jnp.uint32), rng.FINAL)
    y = final_draw(
        z, w, n, x[rows, i], lse_p[rows, n], lse_q[rows, i], key,
        temperature=temperature, config=config, interpret=interpret,
    )
    return Decision(n, emit(x, n, y), log_q_x)


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
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    top_down: bool = False,
) -> Decision:
    """The oracle's algorithm in jnp, materialising every distribution (float32). top_down: the FINAL draw's noise
    drawn block by block from the top (``flashspec.random.gumbel_top_down``; no Pallas kernel has it yet)."""
    batch, g1, vocab = z.shape
    gamma, rows = g1 - 1, jnp.arange(batch)
    x = jnp.clip(x.astype(jnp.int32), 0, vocab - 1)
    z = z.astype(jnp.float32)
    if temperature == 0:
        n = first_rejection(x == jnp.argmax(z[:, :gamma], axis=-1))
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
    n = first_rejection(accept_log_uniforms(c, gamma) < gather(log_p[:, :gamma], x) - log_q_x)
    log_p_n = log_p[rows, n]  # [B, V]
    j = jnp.arange(vocab, dtype=jnp.uint32)[None]
    col = lambda a: a[:, None]  # noqa: E731
    coords = (col(c.seed_lo), col(c.seed_hi), col(c.offset), col(c.row), col(n.astype(jnp.uint32)), j)
    g = rng.gumbel_top_down(*coords) if top_down else rng.gumbel(*coords, rng.FINAL)
    i = jnp.minimum(n, gamma - 1)
    if log_q is None:
        q_n = (jnp.arange(vocab)[None] == x[rows, i][:, None]).astype(jnp.float32)
    else:
        q_n = jnp.exp(log_q[rows, i])
    r = jnp.maximum(jnp.exp(log_p_n) - q_n, 0.0)
    use_p = (n == gamma)[:, None] | ~jnp.any(r > 0, axis=-1, keepdims=True)
    y = jnp.argmax(jnp.where(use_p, log_p_n, jnp.log(r)) + g, axis=-1)
    return Decision(n, emit(x, n, y), log_q_x)
