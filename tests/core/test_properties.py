"""Hypothesis property tests of the NumPy oracle over B, G, V and dtypes."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
