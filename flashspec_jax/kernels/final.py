"""Kernel 2 of the Pallas verify: the accept test and the residual / bonus draw over row n, with its
jnp reference (``pick_draw_reference`` for the epilogue; ``verify.verify_reference`` for the tokens).

``final_decide`` (grid ``(B, NV)``), as the torch Triton ``final_item``: every program (b, c)
recombines the ``[NV, G+1]`` chunk partials of ``row_stats`` for its batch row into log sum exp per
row (and ``[NV, G]`` of the draft rows, or reads ``log_q_given``), gathers ``z[b, i, x_i]`` (and
``w[b, i, x_i]``), tests ``log u_i < log p(x_i) - log q(x_i)`` with u from the ACCEPT stream at
vocabulary coordinate 0, finds n and the FINAL key, then sweeps its chunk of row n: it rebuilds
``log p`` and ``q`` on the fly, draws the Gumbel noise of the FINAL stream in registers and keeps two
running argmaxes (ties: lowest index), ``log max(0, p - q) + g`` (residual) and ``log p + g`` (bonus,
or fallback when the residual is empty), plus whether any ``p - q > 0``. Program c = 0 also writes
n [B] and log q(x) [B, G]. All programs of a row compute the same prologue (a few hundred bytes of
partials each), so nothing crosses programs.

A jnp epilogue (``pick_draw``: the best key across chunks in one reduction, then ``verify.emit``)
finishes. The prologue is ``verify_reference``'s arithmetic in the same order (``accept_log_uniforms``,
``first_rejection``, ``rng.key``); on the GPU the difference is Triton's libdevice log / exp against
XLA's (ulps).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from flashspec_jax import random as rng

from . import lanes
from .common import NEG_INF, Counters, divide, row_counters
from .config import Chunking, VerifyKernelConfig

Partials = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]  # [B, NV] each: r_val, r_idx, p_val, p_idx, any
DRAFT_INPUTS = {"onehot": 0, "given": 2, "stats": 3}  # refs after z: w, then log_q_given or the draft stats (m, l)


# ----------------------------------------------------------------------------- the sweep of row n


def sweep_row(z_ref, w_ref, b, c, n, x_n, lse_p, lse_q, key, *, temperature: float, chunking: Chunking,
              exact_div: bool, config: VerifyKernelConfig):
    """Program (b, c)'s chunk of row n -> (r_val, r_idx, p_val, p_idx, any residual mass): the best
    residual key log max(0, p - q) + g and bonus key log p + g (ties: lowest index).

    ``z_ref`` [B, G+1, V], ``w_ref`` [B, G, V] or None (one-hot q at ``x_n``); scalars n, x_n,
    lse_p (of z_n / T), lse_q (of w_n / T), key (FINAL stream of row (b, n))."""
    gamma, vocab = z_ref.shape[1] - 1, z_ref.shape[2]
    bonus, i = n == gamma, jnp.minimum(n, gamma - 1)
    bv, start = chunking.block, c * chunking.blocks * chunking.block
    sv = min(config.sweep_v, bv)
    cols_of = lambda j: start + j * sv + jnp.arange(sv, dtype=jnp.int32)  # noqa: E731

    def load_z(j, live):
        cols = cols_of(j)
        return plt.load(z_ref.at[b, n, cols], mask=(cols < vocab) & live, other=NEG_INF)

    def load_w(j, live):
        cols = cols_of(j)
        return plt.load(w_ref.at[b, i, cols], mask=(cols < vocab) & live & ~bonus, other=NEG_INF)

    return lanes.sweep_chunk(
        load_z, None if w_ref is None else load_w, cols_of, chunking.blocks * (bv // sv), sv, start, key, x_n,
        lse_p, lse_q, lanes.LOG2E / temperature, exact_div, config.prunes(vocab, chunking),
    )


def store_partials(out_refs, b, c, values) -> None:  # 5 refs [B, NV], 5 scalars
    for ref, v in zip(out_refs, values):
        ref[b, c] = v


def partial_shapes(batch: int, num_chunks: int) -> list[jax.ShapeDtypeStruct]:
    f32 = jax.ShapeDtypeStruct((batch, num_chunks), jnp.float32)
    i32 = jax.ShapeDtypeStruct((batch, num_chunks), jnp.int32)
    return [f32, i32, f32, i32, i32]


def pick_draw(partials: Partials, n: jax.Array, gamma: int, vocab: int,
              lengths: jax.Array | None = None) -> jax.Array:  # [B, NV] x 5, [B] -> [B] y
    """The epilogue: the first (lowest-chunk) best key across chunks, residual unless n = L_b (``lengths`` [B],
    None: G) or no mass.

    One variadic reduction over the chunks carries both running bests and the mass flag, so XLA
    emits one kernel where ``pick_draw_reference``'s two argmaxes and its ``any`` take three.
    Same result: a larger key wins, an equal key in a lower chunk wins (jnp.argmax's first maximum),
    a row of -inf keys gives chunk 0."""
    r_val, r_idx, p_val, p_idx, any_r = partials
    chunk = lax.broadcasted_iota(jnp.int32, r_val.shape, 1)

    def wins(a_val, a_c, b_val, b_c):  # a over b: a larger key, or the same key in a lower chunk
        return (a_val > b_val) | ((a_val == b_val) & (a_c < b_c))

    def combine(a, b):  # (r_val, r_idx, r_chunk, p_val, p_idx, p_chunk, any_r) x 2
        take_r = wins(a[0], a[2], b[0], b[2])
        take_p = wins(a[3], a[5], b[3], b[5])
        pick = lambda take, u, v: jnp.where(take, u, v)  # noqa: E731
        return (pick(take_r, a[0], b[0]), pick(take_r, a[1], b[1]), pick(take_r, a[2], b[2]),
                pick(take_p, a[3], b[3]), pick(take_p, a[4], b[4]), pick(take_p, a[5], b[5]), jnp.maximum(a[6], b[6]))

    big = jnp.int32(2**31 - 1)
    init = (jnp.float32(NEG_INF), jnp.int32(0), big, jnp.float32(NEG_INF), jnp.int32(0), big, jnp.int32(0))
    _, y_r, _, _, y_p, _, mass = lax.reduce((r_val, r_idx, chunk, p_val, p_idx, chunk, any_r.astype(jnp.int32)),
                                            init, combine, (1,))
    use_p = (n == (gamma if lengths is None else lengths)) | (mass <= 0)  # bonus (all L_b accepted) or no mass
    return jnp.minimum(jnp.where(use_p, y_p, y_r), vocab - 1)


def pick_draw_reference(partials: Partials, n: jax.Array, gamma: int, vocab: int,
                        lengths: jax.Array | None = None) -> jax.Array:  # as pick_draw
    """The plain epilogue: two argmaxes across chunks and an any (three XLA kernels on the GPU)."""
    r_val, r_idx, p_val, p_idx, any_r = partials
    y_r = jnp.take_along_axis(r_idx, jnp.argmax(r_val, axis=1)[:, None], axis=1)[:, 0]
    y_p = jnp.take_along_axis(p_idx, jnp.argmax(p_val, axis=1)[:, None], axis=1)[:, 0]
    use_p = (n == (gamma if lengths is None else lengths)) | ~jnp.any(any_r > 0, axis=1)
    return jnp.minimum(jnp.where(use_p, y_p, y_r), vocab - 1)


# ----------------------------------------------------------------------------- final_decide (accept test inside)


def combine_chunks(m_ref, l_ref, b, width: int, *, temperature: float, exact_div: bool):
    """``[B, NV, R]`` chunk max (of the raw logits) / sum-exp refs -> f32 [width] log sum exp of a / T of
    row r of batch row b (-inf past R); the max is divided by T here."""
    num_chunks, rows = m_ref.shape[1], m_ref.shape[2]
    ch = jnp.arange(pl.next_power_of_2(num_chunks), dtype=jnp.int32)[:, None]  # [NVp, 1]
    r = jnp.arange(width, dtype=jnp.int32)[None, :]  # [1, width]
    live = (ch < num_chunks) & (r < rows)
    at = (b, jnp.minimum(ch, num_chunks - 1), jnp.minimum(r, rows - 1))  # clamped: every address in bounds
    m = plt.load(m_ref.at[at], mask=live, other=NEG_INF)  # [NVp, width]
    l = plt.load(l_ref.at[at], mask=live, other=0.0)
    m = divide(m, temperature, exact_div)
    big = jnp.max(m, axis=0)  # [width]
    safe = jnp.where(big == NEG_INF, 0.0, big)
    return big + jnp.log(jnp.sum(l * jnp.exp(m - safe[None, :]), axis=0))


def pick(v: jax.Array, i: jax.Array, k, fill) -> jax.Array:  # [width], [width], scalar -> v[k] (scalar)
    return jnp.max(jnp.where(i == k, v, fill))


def accept_log_uniforms_at(c: Counters, i: jax.Array) -> jax.Array:  # scalar counters, int32 [width] -> f32 [width]
    """log u_i of the ACCEPT stream at vocabulary coordinate 0 (``verify.accept_log_uniforms``)."""
    k = rng.key(c.seed_lo, c.seed_hi, c.offset, c.row, i.astype(jnp.uint32), rng.ACCEPT)
    return jnp.log(rng.to_uniform(rng.bits_from_key(k, 0)))


def draft_log_probs(w_ref, q_refs, b, rows, x, width: int, *, draft: str, temperature: float,
                    exact_div: bool):  # -> (log q(x_i), lse of w_i / T): f32 [width] each
    """``draft``: "onehot" (w None: log q(x) = 0), "given" (``q_refs`` = (lq_ref [B, G],): lse_q is one
    logit away), "stats" (``q_refs`` = (m_ref, l_ref) [B, NV, G] of w)."""
    if draft == "onehot":
        zero = jnp.zeros((width,), jnp.float32)
        return zero, zero
    t_x = divide(plt.load(w_ref.at[b, rows, x]).astype(jnp.float32), temperature, exact_div)  # w_i(x_i) / T
    if draft == "given":
        log_q_x = plt.load(q_refs[0].at[b, rows]).astype(jnp.float32)
        return log_q_x, jnp.where(jnp.isfinite(t_x), t_x - log_q_x, jnp.inf)
    lse_q = combine_chunks(*q_refs, b, width, temperature=temperature, exact_div=exact_div)
    return t_x - lse_q, lse_q


def final_decide_kernel(
    x_ref,  # [B, G] int32: drafted tokens (clipped to [0, V) here)
    m_p_ref,  # [B, NV, G+1] f32: chunk max of z
    l_p_ref,  # [B, NV, G+1] f32: chunk sum exp((z - max) / T)
    seed_lo_ref,  # [B] or [1] uint32 (one value: shared by every row)
    seed_hi_ref,  # [B] or [1] uint32
    offset_ref,  # [B] or [1] uint32
    z_ref,  # [B, G+1, V]
    *refs,  # lengths_ref [B] int32 (has_lengths: draft_lengths L_b in [0, G]); w_ref [B, G, V] (draft != "onehot");
    #         lq_ref [B, G] ("given") or m_q_ref, l_q_ref [B, NV, G] ("stats"); then 5 partials [B, NV], n_ref [B]
    #         int32, log_q_x_ref [B, G] f32
    temperature: float,
    draft: str,
    chunking: Chunking,
    exact_div: bool,
    config: VerifyKernelConfig,
    has_lengths: bool = False,
):
    lengths_ref, refs = (refs[0], refs[1:]) if has_lengths else (None, refs)
    ins, outs = refs[: DRAFT_INPUTS[draft]], refs[DRAFT_INPUTS[draft]:]
    w_ref, q_refs = (ins[0], ins[1:]) if ins else (None, ())
    b, c = pl.program_id(0), pl.program_id(1)
    gamma, vocab = x_ref.shape[1], z_ref.shape[2]
    width = pl.next_power_of_2(gamma + 1)  # Triton blocks are powers of 2: rows past G+1 are masked
    i = jnp.arange(width, dtype=jnp.int32)
    rows = jnp.minimum(i, gamma - 1)  # draft row of lane i (clamped)
    x = jnp.clip(plt.load(x_ref.at[b, rows]), 0, vocab - 1)  # [width]
    counters = row_counters(seed_lo_ref, seed_hi_ref, offset_ref, b)
    scaled = functools.partial(divide, temperature=temperature, exact_div=exact_div)
    lse_p = combine_chunks(m_p_ref, l_p_ref, b, width, temperature=temperature, exact_div=exact_div)
    log_p_x = scaled(plt.load(z_ref.at[b, rows, x]).astype(jnp.float32)) - lse_p
    log_q_x, lse_q = draft_log_probs(w_ref, q_refs, b, rows, x, width, draft=draft, temperature=temperature,
                                     exact_div=exact_div)
    accepted = accept_log_uniforms_at(counters, i) < log_p_x - log_q_x
    if has_lengths:
        accepted &= i < lengths_ref[b]
    n = jnp.min(jnp.where((i < gamma) & ~accepted, i, gamma))  # first rejection (<= L_b), G if none
    j = jnp.minimum(n, gamma - 1)
    key = rng.key(*counters, n.astype(jnp.uint32), rng.FINAL)
    values = sweep_row(z_ref, w_ref, b, c, n, pick(x, i, j, 0), pick(lse_p, i, n, NEG_INF),
                       pick(lse_q, i, j, NEG_INF), key, temperature=temperature, chunking=chunking,
                       exact_div=exact_div, config=config)
    store_partials(outs[:5], b, c, values)
    n_ref, log_q_x_ref = outs[5:7]

    @pl.when(c == 0)
    def _():
        n_ref[b] = n
        for k in range(gamma):  # scalar stores: a masked vector store of clamped lanes would race in interpret mode
            log_q_x_ref[b, k] = pick(log_q_x, i, k, NEG_INF)


def final_decide(
    z: jax.Array,  # [B, G+1, V]
    x: jax.Array,  # [B, G] int32 (not yet clipped)
    w: jax.Array | None,  # [B, G, V]
    log_q_given: jax.Array | None,  # [B, G]
    stats_p: tuple[jax.Array, jax.Array],  # [B, NV, G+1] f32 each: row_stats of z
    stats_q: tuple[jax.Array, jax.Array] | None,  # [B, NV, G] f32 each: row_stats of w (w given, log_q_given not)
    c: Counters,  # uint32 [B] or [1] each (row: computed in the kernel)
    lengths: jax.Array | None,  # [B] int32: draft_lengths in [0, G]; None: G (no operand)
    *,
    temperature: float,
    config: VerifyKernelConfig,
    interpret: bool = False,
) -> tuple[Partials, jax.Array, jax.Array]:
    """-> 5 x [B, NV] sweep partials (``pick_draw`` makes y of them), n [B] int32, log q(x) [B, G] f32."""
    batch, g1, vocab = z.shape
    chunking = Chunking.make(batch, vocab, config.block_v, config.min_programs)
    draft = "onehot" if w is None else "given" if log_q_given is not None else "stats"
    extra = {"onehot": [], "given": [w, log_q_given], "stats": [w, *(stats_q or ())]}[draft]
    kernel = functools.partial(final_decide_kernel, temperature=temperature, draft=draft, chunking=chunking,
                               exact_div=not interpret, config=config, has_lengths=lengths is not None)
    out_shape = [*partial_shapes(batch, chunking.num_chunks), jax.ShapeDtypeStruct((batch,), jnp.int32),
                 jax.ShapeDtypeStruct((batch, g1 - 1), jnp.float32)]
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(batch, chunking.num_chunks),
        compiler_params=config.compiler_params(),
        interpret=interpret,
        name="flashspec_final_decide",
    )(x, *stats_p, c.seed_lo, c.seed_hi, c.offset, z, *([] if lengths is None else [lengths]), *extra)
    return tuple(outs[:5]), outs[5], outs[6]
