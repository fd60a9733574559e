"""The Pallas verify kernels beside their references (Pallas interpret mode): ``row_stats`` against
``row_stats_reference``; the whole verify (``final_decide``'s accept test and sweep, ``pick_draw``)
against the NumPy oracle's tokens and ``verify_reference``'s log q(x); the config's checks."""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import flashspec.reference as oracle
from flashspec_jax import random as rng
from flashspec_jax.kernels import row_stats
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
    "chunks": kernels.VerifyKernelConfig(block_v=64, sweep_v=16, min_programs=8, vec=4, num_warps=4,
                                         prune_tiles=0.0),  # several chunks of several tiles, pruned
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
def test_kernels_equal_the_oracle(case, config):
    b, g, v, t, draft, dtype = case
    rs = np.random.default_rng(zlib.crc32(repr(case[:5]).encode()))
    inputs = make_inputs(rs, b, g, v, temperature=t, draft=draft)
    z = inputs.target_logits.astype(dtype)
    w = None if inputs.draft_logits is None else inputs.draft_logits.astype(dtype)
    x, lq = inputs.draft_tokens, inputs.draft_logprobs
    for per_row in (False, True):
        c, seeds = counters(b, per_row)
        what = f"{case} {config} per_row={per_row}"
        got = run(z, x, w, lq, c, temperature=t, config=CONFIGS[config])
        assert_same(oracle.verify(z, x, w, lq, temperature=t, **seeds), got, f"oracle: {what}")
        ref = kernels.verify_reference(jnp.asarray(z), jnp.asarray(x), None if w is None else jnp.asarray(w),
                                       None if lq is None else jnp.asarray(lq), c, temperature=t, top_k=0, top_p=1.0)
        # log q(x): the kernels sum the chunk partials in another order than log_softmax (ulps)
        np.testing.assert_allclose(np.asarray(got.log_q_x), np.asarray(ref.log_q_x), rtol=1e-5, atol=1e-5,
                                   err_msg=f"log_q_x: {what}")


def test_cases_accept_and_reject():
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


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_row_stats_equal_their_reference(config, greedy):
    """Chunk max (raw logits) and sum-exp, or max and argmax (ties: lowest index): masked tails, a row of
    -inf and repeated maxima included."""
    rs = np.random.default_rng(11)
    a = rs.standard_normal((3, 5, 1000)).astype(np.float32) * 3
    a[0, 1] = -np.inf
    a[1, 2, 100:200] = 9.0  # equal maxima within a chunk and across chunks
    a[2, 0, 900:] = -np.inf
    cfg = CONFIGS[config]
    t = 0.0 if greedy else 0.7
    got = row_stats.row_stats(jnp.asarray(a), temperature=t, greedy=greedy, config=cfg, interpret=True)
    chunking = kernels.Chunking.make(3, 1000, cfg.block_v, cfg.min_programs)
    want = row_stats.row_stats_reference(jnp.asarray(a), temperature=t, greedy=greedy, chunking=chunking)
    assert got[0].shape == want[0].shape == (3, chunking.num_chunks, 5)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    if greedy:
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    else:
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)  # exp2 against exp: ulps


@pytest.mark.parametrize("field,value", [("block_v", 48), ("sweep_v", 8), ("sweep_v", 8192), ("vec", 3),
                                         ("num_warps", 3), ("num_stages", 0), ("min_programs", 0),
                                         ("prune_tiles", -1.0), ("prune_tiles", float("nan"))])
def test_config_refuses_bad_values_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        kernels.VerifyKernelConfig(**{field: value})


def test_default_configs_are_valid_at_the_readme_shapes():
    for b in (1, 8, 32, 256):
        for v in (32000, 128256):
            for itemsize in (2, 4):
                config = kernels.choose_config(b, 4, v, itemsize)
                assert config.vec * itemsize == 16 and config.sweep_v <= config.block_v


def test_per_row_seeds_with_one_offset():
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
    got = run(z, inputs.draft_tokens, w, inputs.draft_logprobs, c, temperature=t, config=CONFIGS["chunks"])
    assert_same(oracle.verify(z, inputs.draft_tokens, w, inputs.draft_logprobs, temperature=t, seed=seed,
                              offset=offset), got, "per-row seeds")
