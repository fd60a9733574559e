"""The Pallas verify in one launch (VerifyKernelConfig(single=True), kernels/single.py) against the
two-kernel path (prologue=True) and the NumPy oracle: identical num_accepted and tokens on the same
random inputs (interpret mode, where the phases run in order); broken epilogues fail the same
comparison; the residency and config checks; the CUDA lowering is one kernel."""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import triton as plt

import flashspec.reference as oracle
from flashspec_jax.kernels import final, single
from flashspec_jax.kernels import verify as kernels
from flashspec_jax.kernels.config import SMS, single_config
from jax_cases import make_inputs
from test_jax_lowering import TRITON_CALLS, export_for_cuda
from test_jax_prologue import CASES, assert_same, counters, run

# several chunks per row (min_programs 8 over V of 300-2000 in 64-logit tiles): the last arrival reduces them
TWO = kernels.VerifyKernelConfig(block_v=64, sweep_v=16, min_programs=8, loops="lanes", vec=4, prefetch=True,
                                 prune=True, num_warps=4, prologue=True)
ONE = dataclasses.replace(TWO, single=True)
FINISH = dataclasses.replace(TWO, finish=True)  # two kernels, the row's last final_decide program writes the tokens


def inputs_of(case):
    b, g, v, t, draft, dtype = case
    rs = np.random.default_rng(zlib.crc32(repr(case[:5]).encode()))
    inputs = make_inputs(rs, b, g, v, temperature=t, draft=draft)
    w = None if inputs.draft_logits is None else inputs.draft_logits.astype(dtype)
    return inputs.target_logits.astype(dtype), inputs.draft_tokens, w, inputs.draft_logprobs


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-G{}-V{}-T{}-{}-{}".format(*c[:5], np.dtype(c[5]).name))
def test_single_launch_equals_two_kernels(case):
    z, x, w, lq = inputs_of(case)
    t = case[3]
    for per_row in (False, True):
        c, seeds = counters(case[0], per_row)
        what = f"{case} per_row={per_row}"
        two = run(z, x, w, lq, c, temperature=t, config=TWO)
        one = run(z, x, w, lq, c, temperature=t, config=ONE)
        assert_same(two, one, what)
        np.testing.assert_allclose(np.asarray(one.log_q_x), np.asarray(two.log_q_x), rtol=4e-6, atol=4e-6,
                                   err_msg=f"log_q_x: {what}")
        assert_same(oracle.verify(z, x, w, lq, temperature=t, **seeds), one, f"oracle: {what}")


def bonus_only(x_ref, partial_refs, tokens_ref, b, n, *, num_chunks: int, vocab: int) -> None:
    """Broken epilogue (final.finish_row with the residual ignored): y is always the bonus key's argmax."""
    gamma = x_ref.shape[1]
    ch = jnp.arange(1 << (num_chunks - 1).bit_length(), dtype=jnp.int32)
    live, at = ch < num_chunks, (b, jnp.minimum(ch, num_chunks - 1))
    p_val = plt.load(partial_refs[2].at[at], mask=live, other=-jnp.inf)
    p_idx = plt.load(partial_refs[3].at[at], mask=live, other=0)
    y = jnp.minimum(final.pick(p_idx, ch, jnp.argmax(p_val).astype(jnp.int32), -1), vocab - 1)
    for k in range(gamma + 1):
        tail = jnp.where(k == n, y, -1)
        tokens_ref[b, k] = tail if k == gamma else jnp.where(k < n, jnp.clip(x_ref[b, k], 0, vocab - 1), tail)


@pytest.mark.parametrize("config", ["single", "finish"])
@pytest.mark.parametrize("mutant", ["bonus_only", "off_by_one"])
def test_broken_single_launch_fails(monkeypatch, mutant, config):
    """The comparison above catches an epilogue that ignores the residual, and a last-arrival test
    off by one (the tokens are then never written): in the single launch, and in the two-kernel path's
    final_decide with finish=True (the same finish_row after the same arrivals)."""
    if mutant == "bonus_only":
        monkeypatch.setattr(final, "finish_row", bonus_only)
    else:
        real = final.arrive
        monkeypatch.setattr(final, "arrive", lambda ref, b, barrier: real(ref, b, barrier) + 1)
    jax.clear_caches()
    try:
        failures = 0
        for case in CASES[1:4]:
            z, x, w, lq = inputs_of(case)
            c, seeds = counters(case[0], False)
            want = oracle.verify(z, x, w, lq, temperature=case[3], **seeds)
            got = run(z, x, w, lq, c, temperature=case[3], config=ONE if config == "single" else FINISH)
            failures += not (np.array_equal(np.asarray(got.tokens), want.tokens)
                             and np.array_equal(np.asarray(got.num_accepted), want.num_accepted))
        assert failures > 0, f"the {mutant} mutant passed every case"
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_single_needs_the_prologue_and_resident_programs():
    with pytest.raises(ValueError, match="prologue"):
        kernels.VerifyKernelConfig(single=True)
    with pytest.raises(ValueError, match="batch"):
        single_config(SMS + 1, 4, 32000, 2)
    cfg = single_config(1, 4, 128256, 2)
    assert cfg.single and cfg.prologue
    for b in (1, 8, 32, SMS):
        c = single_config(b, 4, 128256, 2)
        chunks = kernels.Chunking.make(b, 128256, c.block_v, c.min_programs).num_chunks
        assert b * chunks <= SMS, (b, chunks)
    # more programs than SMs: refused at trace time on the GPU path (a wait that could never end)
    many = dataclasses.replace(TWO, single=True, min_programs=4 * SMS)
    spec = jax.ShapeDtypeStruct
    z, x = spec((8, 5, 4000), jnp.float32), spec((8, 4), jnp.int32)
    cs = kernels.Counters(*[spec((8,), jnp.uint32)] * 4)
    trace = functools.partial(single.verify_single, temperature=1.0, config=many, interpret=False)
    with pytest.raises(ValueError, match="resident"):
        jax.eval_shape(lambda z, x, c: trace(z, x, None, None, c), z, x, cs)


@pytest.mark.parametrize("draft", ["logits", "logprobs", "onehot"])
def test_single_lowers_to_one_triton_kernel(draft):
    exported = export_for_cuda(8, 4, 32000, jnp.bfloat16, temperature=0.7, draft=draft,
                               config=single_config(8, 4, 32000, 2))
    text = exported.mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == 1 and "flashspec_verify_single" in text
