"""Hypothesis property tests of the NumPy oracle over B, G, V and dtypes."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashspec.random import FINAL
from flashspec.reference import sample, verify
from flashspec.config import SamplingConfig
from flashspec.testing import structure_problem

try:
    import ml_dtypes

    DTYPES = ["float32", "float16", "float64", ml_dtypes.bfloat16]
except ImportError:  # bfloat16 needs ml_dtypes (installed with the jax extra)
    DTYPES = ["float32", "float16", "float64"]


@st.composite
def problems(draw):
    b = draw(st.sampled_from([1, 2, 3, 7]))
    g = draw(st.sampled_from([1, 2, 5, 8]))
    v = draw(st.sampled_from([1, 2, 3, 17, 64]))
    dtype = draw(st.sampled_from(DTYPES))
    temperature = draw(st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    top_k = draw(st.sampled_from([0, 1, 3]))
    top_p = draw(st.sampled_from([1.0, 0.9, 0.4]))
    kind = draw(st.sampled_from(["logits", "one-hot"]))
    seed = draw(st.integers(0, 2**64 - 1))
    offset = draw(st.integers(0, 2**32 - 2))
    r = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    z = (r.normal(size=(b, g + 1, v)) * 3).astype(dtype)
    w = (r.normal(size=(b, g, v)) * 3).astype(dtype) if kind == "logits" else None
    cfg = SamplingConfig(temperature, top_k, top_p)
    if w is not None:
        x = np.stack([sample(w[:, i], cfg, seed, offset, position=i)[0] for i in range(g)], 1)
    else:
        x = r.integers(0, v, (b, g))
    return z, x, w, dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, offset=offset)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_result_is_well_formed_and_reproducible(problem):
    z, x, w, kw = problem
    res = verify(z, x, w, **kw)
    assert res.num_accepted.dtype == np.int32 and res.tokens.dtype == np.int32
    assert structure_problem(x, res.num_accepted.astype(np.int64), res.tokens.astype(np.int64), z.shape[-1]) == ""
    again = verify(z, x, w, **kw)
    assert np.array_equal(again.tokens, res.tokens) and np.array_equal(again.num_accepted, res.num_accepted)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 2))
def test_another_offset_gives_other_randomness(seed, offset):
    r = np.random.default_rng(seed % 1000)
    z = r.normal(size=(64, 3, 50)).astype(np.float32)
    w = r.normal(size=(64, 2, 50)).astype(np.float32)
    x = r.integers(0, 50, (64, 2))
    a = verify(z, x, w, seed=seed, offset=offset)
    b = verify(z, x, w, seed=seed, offset=offset + 1)
    assert not np.array_equal(a.tokens, b.tokens)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.data())
def test_a_row_with_draft_length_l_is_a_step_with_g_equal_l(problem, data):
    """draft_lengths: row b (per-row seeds, so the row's randomness is its own) gives what verify gives for
    that row alone with G = L_b (ids past L_b are -1 and never read); L_b = 0 gives plain decoding's token
    (the FINAL stream at position 0, as ``flashspec.fake`` and every backend's decode_one draw it)."""
    z, x, w, kw = problem
    b, g = x.shape
    lengths = np.array(data.draw(st.lists(st.integers(0, g), min_size=b, max_size=b)), np.int32)
    seeds = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=b, max_size=b)), np.uint64)
    kw = dict(kw, seed=seeds)
    padded = np.where(np.arange(g)[None] < lengths[:, None], x, -1)
    res = verify(z, padded, w, **kw, draft_lengths=lengths)
    assert structure_problem(x, res.num_accepted.astype(np.int64), res.tokens.astype(np.int64), z.shape[-1],
                             lengths) == ""
    cfg = SamplingConfig(kw["temperature"], kw["top_k"], kw["top_p"])
    for r, k in enumerate(lengths):
        alone = dict(kw, seed=seeds[r : r + 1])
        if k == 0:
            y, _ = sample(z[r : r + 1, 0], cfg, alone["seed"], kw["offset"], position=0, stream=FINAL)
            assert res.num_accepted[r] == 0 and res.tokens[r, 0] == y[0] and (res.tokens[r, 1:] == -1).all()
            continue
        one = verify(z[r : r + 1, : k + 1], x[r : r + 1, :k], None if w is None else w[r : r + 1, :k], **alone)
        assert res.num_accepted[r] == one.num_accepted[0]
        assert np.array_equal(res.tokens[r, : k + 1], one.tokens[0]) and (res.tokens[r, k + 1 :] == -1).all()
