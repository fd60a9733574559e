"""The accept test inside the final kernel (VerifyKernelConfig(prologue=True), kernels/final.py
``final_decide``) against the jnp glue between the kernels (prologue=False) and the NumPy oracle:
identical num_accepted and tokens, and log q(x) within ulps, on the same random inputs (Pallas
interpret mode)."""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import flashspec.reference as oracle
from flashspec_jax import random as rng
from flashspec_jax.kernels import verify as kernels
from flashspec_jax.verify import make_counters
from jax_cases import make_inputs

# (B, G, V, T, draft, dtype): V not a multiple of the tiles below (64 / 128 / 256), B <= 4.
CASES = [
    (1, 1, 300, 1.0, "logits", np.float32),
    (3, 4, 1000, 0.7, "logits", ml_dtypes.bfloat16),
    (2, 8, 1999, 0.7, "logits", np.float32),
    (4, 3, 777, 1.0, "logprobs", np.float32),
    (2, 5, 1500, 0.7, "logprobs", ml_dtypes.bfloat16),
    (3, 4, 513, 1.0, "onehot", ml_dtypes.bfloat16),
    (4, 2, 2000, 0.7, "onehot", np.float32),
]

CONFIGS = {
    "tile": kernels.VerifyKernelConfig(block_v=128, min_programs=6),  # several chunks of several tiles
    "lanes": kernels.VerifyKernelConfig(block_v=64, sweep_v=16, min_programs=8, loops="lanes", vec=4,
                                        prefetch=True, prune=True, num_warps=4),
    "default": kernels.choose_config(3, 4, 1000, 4, interpret=True),  # one chunk of 256-logit tiles
}


@functools.partial(jax.jit, static_argnames=("temperature", "config"))
def run(z, x, w, lq, c, *, temperature, config):
    return kernels.verify(z, x, w, lq, c, temperature=temperature, top_k=0, top_p=1.0, config=config,
                          interpret=True)


def counters(batch: int, per_row: bool) -> tuple[kernels.Counters, dict]:
    """The kernel's counters and the oracle's seed / offset: one shared seed, or one seed per row."""
    if per_row:
        seed = np.array([2**63 + 11, 5, 2**40 + 3, 77][:batch], np.uint64)
        offset = np.array([3, 0, 9, 4][:batch], np.uint32)
    else:
        seed, offset = np.uint64(1234), np.uint32(2)
    lo, hi = rng.split_counter(seed)
    return make_counters(jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(offset), batch), dict(seed=seed, offset=offset)


def assert_same(want, got, what: str) -> None:
    for name in ("num_accepted", "tokens"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)),
                                      err_msg=f"{name}: {what}")


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-G{}-V{}-T{}-{}-{}".format(*c[:5], np.dtype(c[5]).name))
def test_prologue_equals_glue(case, config):
    b, g, v, t, draft, dtype = case
    rs = np.random.default_rng(zlib.crc32(repr(case[:5]).encode()))
    inputs = make_inputs(rs, b, g, v, temperature=t, draft=draft)
    z = inputs.target_logits.astype(dtype)
    w = None if inputs.draft_logits is None else inputs.draft_logits.astype(dtype)
    x, lq = inputs.draft_tokens, inputs.draft_logprobs
    glue = dataclasses.replace(CONFIGS[config], prologue=False)
    fused = dataclasses.replace(CONFIGS[config], prologue=True)
    finished = dataclasses.replace(fused, finish=True)  # the row's last program writes the tokens
    for per_row in (False, True):
        c, seeds = counters(b, per_row)
        what = f"{case} {config} per_row={per_row}"
        old = run(z, x, w, lq, c, temperature=t, config=glue)
        new = run(z, x, w, lq, c, temperature=t, config=fused)
        assert_same(old, new, what)
        assert_same(new, run(z, x, w, lq, c, temperature=t, config=finished), f"finish: {what}")
        # log q(x): the chunk partials are summed in another order than XLA's (ulps; decisions flip only at near-ties)
        np.testing.assert_allclose(np.asarray(new.log_q_x), np.asarray(old.log_q_x), rtol=4e-6, atol=4e-6,
                                   err_msg=f"log_q_x: {what}")
        assert_same(oracle.verify(z, x, w, lq, temperature=t, **seeds), new, f"oracle: {what}")


def test_prologue_cases_accept_and_reject():
    """The inputs above exercise every n: some drafts fully accepted, some rejected at once, some in between."""
    ns = []
    for b, g, v, t, draft, dtype in CASES:
        rs = np.random.default_rng(zlib.crc32(repr((b, g, v, t, draft)).encode()))
        inputs = make_inputs(rs, b, g, v, temperature=t, draft=draft)
        for per_row in (False, True):
            _, seeds = counters(b, per_row)
            n = oracle.verify(inputs.target_logits.astype(dtype), inputs.draft_tokens,
                              None if inputs.draft_logits is None else inputs.draft_logits.astype(dtype),
                              inputs.draft_logprobs, temperature=t, **seeds).num_accepted
            ns.append(n / g)
    ns = np.concatenate(ns)
    assert (ns == 0).any() and (ns == 1).any() and ((ns > 0) & (ns < 1)).any(), ns


def test_default_config_uses_the_prologue():
    for interpret in (False, True):
        assert kernels.choose_config(4, 4, 128256, 2, interpret=interpret).prologue
    assert not kernels.VerifyKernelConfig().prologue  # explicit configs keep the glue unless asked


def test_prologue_must_be_a_bool():
    with pytest.raises(ValueError, match="prologue"):
        kernels.VerifyKernelConfig(prologue="yes")


def test_finish_needs_the_two_kernel_prologue():
    with pytest.raises(ValueError, match="finish"):
        kernels.VerifyKernelConfig(finish=True)  # prologue=False: the glue has no final_decide
    with pytest.raises(ValueError, match="finish"):
        kernels.VerifyKernelConfig(prologue=True, single=True, finish=True)
    assert kernels.VerifyKernelConfig(prologue=True, finish=True).finish


@pytest.mark.parametrize("finish", [False, True])
def test_per_row_seeds_with_one_offset(finish):
    """The engine's counters: a seed per request ([B]) and one offset for the step (a scalar, indexed as
    [1] inside the kernels, not broadcast): the oracle's tokens."""
    b, g, v, t, draft, dtype = CASES[1]
    rs = np.random.default_rng(7)
    inputs = make_inputs(rs, b, g, v, temperature=t, draft=draft)
    z, w = inputs.target_logits.astype(dtype), inputs.draft_logits.astype(dtype)
    seed, offset = np.array([2**63 + 11, 5, 2**40 + 3][:b], np.uint64), np.uint32(6)
    lo, hi = rng.split_counter(seed)
    c = make_counters(jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(offset), b)
    assert c.seed_lo.shape == (b,) and c.offset.shape == (1,)
    config = dataclasses.replace(CONFIGS["lanes"], prologue=True, finish=finish)
    got = run(z, inputs.draft_tokens, w, inputs.draft_logprobs, c, temperature=t, config=config)
    assert_same(oracle.verify(z, inputs.draft_tokens, w, inputs.draft_logprobs, temperature=t, seed=seed,
                              offset=offset), got, f"finish={finish}")
