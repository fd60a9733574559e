"""The Pallas verify in one launch (``VerifyKernelConfig(single=True)``): for small batches, where
XLA's launch of each kernel and fusion, not the bytes, is the step (docs/kernel_notes.md).

The two-kernel path (``verify.verify_with_prologue``) is row_stats -> final_decide -> an XLA
epilogue: three launches. Here one grid ``(phases, B, NV)`` does all of it, with the same kernel
bodies, so every token is the two-kernel path's:

1. phase 1 (``verify.row_stats_kernel``): program (b, c) writes the chunk max / sum-exp of the
   G+1 target rows (and of the G draft rows with draft logits and no draft log-probs);
2. it arrives at its batch row's counter (``count[b] += 1`` after a barrier: release at GPU scope)
   and waits until all NV programs of the row have arrived (atomic reads, acquire);
3. phase 2 (``final.final_decide_body``): the accept test from the partials (loaded past L1), n,
   the FINAL key, the sweep of its chunk of row n; it arrives again;
4. the row's last arrival (ticket 2 NV - 1) reduces the NV sweep partials as ``final.pick_draw``
   does (larger key; equal keys: lower chunk) and writes the row's tokens.

The wait needs every program resident at once: B x NV <= the SM count (one program per SM always
fits), checked at the call. The counters are a zeroed ``[B]`` int32 buffer per call (aliased in and
out). Interpret mode runs programs one after the other, where a wait would never end: there the
grid has two phases (``phases = 2``, phase-major order), phase 1 of every program runs before any
phase 2, and nothing waits; the arithmetic and the counters are the GPU's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from . import final
from . import verify as kv
from .common import Counters
from .config import SMS, Chunking, VerifyKernelConfig


def wait_for(count_ref, b, target: int, ticket) -> None:
    """Spin until ``count[b] >= target`` (atomic reads: each one an acquire)."""
    lax.while_loop(lambda seen: seen < target, lambda _: plt.atomic_add(count_ref, b, jnp.int32(0)), ticket + 1)
    plt.debug_barrier()


def verify_single_kernel(
    x_ref,  # [B, G] int32
    seed_lo_ref, seed_hi_ref, offset_ref,  # [B] or [1] uint32 each
    z_ref,  # [B, G+1, V]
    *refs,  # draft inputs (final.DRAFT_INPUTS: w [B, G, V], log_q_given [B, G]), the counter [B] (aliased);
    #         outputs m_p, l_p [B, NV, G+1] f32, m_q, l_q [B, NV, G] ("stats"), 5 partials [B, NV], n [B],
    #         log q(x) [B, G], tokens [B, G+1], the counter [B]
    temperature: float,
    draft: str,
    chunking: Chunking,
    exact_div: bool,
    config: VerifyKernelConfig,
    spin: bool,
):
    given = refs[: {"onehot": 0, "given": 2, "stats": 1}[draft]]
    rest = refs[len(given) + 1:]  # past the counter's input ref: the outputs
    stats = rest[:4] if draft == "stats" else rest[:2]
    partials, (n_ref, log_q_x_ref, tokens_ref, count_ref) = rest[len(stats): len(stats) + 5], rest[len(stats) + 5:]
    phase, b, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    num_chunks = chunking.num_chunks
    common = dict(temperature=temperature, chunking=chunking, exact_div=exact_div, config=config, ids=(b, c))

    def phase_one():
        kv.row_stats_kernel(z_ref, *stats[:2], greedy=False, **common)
        if draft == "stats":
            kv.row_stats_kernel(given[0], *stats[2:], greedy=False, **common)
        return final.arrive(count_ref, b, spin)

    def phase_two():
        draft_refs = (*given, *stats[2:])
        n = final.final_decide_body(x_ref, *stats[:2], seed_lo_ref, seed_hi_ref, offset_ref, z_ref,
                                    *draft_refs, *partials, n_ref, log_q_x_ref, draft=draft,
                                    raw_max=config.loops == "lanes", fresh=True, **common)
        last = final.arrive(count_ref, b, spin) == 2 * num_chunks - 1

        @pl.when(last)
        def _():
            final.finish_row(x_ref, partials, tokens_ref, b, n, num_chunks=num_chunks, vocab=z_ref.shape[2])

    if spin:  # one program does both phases (the GPU)
        wait_for(count_ref, b, num_chunks, phase_one())
        phase_two()
    else:  # interpret mode: phase 1 of every program, then phase 2 of every program
        @pl.when(phase == 0)
        def _():
            phase_one()

        pl.when(phase == 1)(phase_two)


def verify_single(
    z: jax.Array,  # [B, G+1, V] (filtered)
    x: jax.Array,  # [B, G] int32
    w: jax.Array | None,  # [B, G, V] (filtered) or None
    log_q_given: jax.Array | None,  # [B, G] or None
    c: Counters,
    *,
    temperature: float,
    config: VerifyKernelConfig,
    interpret: bool,
) -> kv.Decision:
    """T > 0 in one ``pallas_call`` (see the module docstring)."""
    batch, g1, vocab = z.shape
    chunking = Chunking.make(batch, vocab, config.block_v, config.min_programs)
    programs = batch * chunking.num_chunks
    if not interpret and programs > SMS:
        raise ValueError(f"VerifyKernelConfig(single=True) needs every program resident: B x chunks = {batch} x "
                         f"{chunking.num_chunks} = {programs} > {SMS} SMs; lower min_programs or raise block_v, "
                         "or use single=False for this batch")
    draft = "onehot" if w is None else "given" if log_q_given is not None else "stats"
    given = {"onehot": [], "given": [w, log_q_given], "stats": [w]}[draft]
    f32 = jnp.float32
    stat = lambda rows: [jax.ShapeDtypeStruct((batch, chunking.num_chunks, rows), f32)] * 2  # noqa: E731
    out_shape = [*stat(g1), *(stat(g1 - 1) if draft == "stats" else []),
                 *final.partial_shapes(batch, chunking.num_chunks), jax.ShapeDtypeStruct((batch,), jnp.int32),
                 jax.ShapeDtypeStruct((batch, g1 - 1), f32), jax.ShapeDtypeStruct((batch, g1), jnp.int32),
                 jax.ShapeDtypeStruct((batch,), jnp.int32)]
    kernel = functools.partial(verify_single_kernel, temperature=temperature, draft=draft, chunking=chunking,
                               exact_div=not interpret, config=config, spin=not interpret)
    inputs = [x, c.seed_lo, c.seed_hi, c.offset, z, *given, jnp.zeros((batch,), jnp.int32)]
    *_, n, log_q_x, tokens, _ = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(1 if not interpret else 2, batch, chunking.num_chunks),
        input_output_aliases={len(inputs) - 1: len(out_shape) - 1},
        compiler_params=config.compiler_params(),
        interpret=interpret,
        name="flashspec_verify_single",
    )(*inputs)
    return kv.Decision(n, tokens, log_q_x)
