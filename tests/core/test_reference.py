"""The NumPy oracle's pieces against first-principles definitions."""

import numpy as np
import pytest

from flashspec import random as rng
from flashspec.config import SamplingConfig
from flashspec.reference import filter_top_k, filter_top_p, log_probs, sample, verify


def test_top_k_keeps_ties_at_the_boundary():
    s = np.array([[3.0, 1.0, 2.0, 2.0, 0.0]], np.float32)
    kept = np.isfinite(filter_top_k(s, 2))
    assert kept.tolist() == [[True, False, True, True, False]]


def brute_top_p(s, top_p):
    probs = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    order = sorted(range(len(s)), key=lambda j: (-probs[j], j))
    keep, total = set(), 0.0
    for j in order:
        if total >= top_p:
            break
        keep.add(j)
        total += probs[j]
    return [j in keep for j in range(len(s))]


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_top_p_rule(top_p):
    r = np.random.default_rng(int(top_p * 1000))
    for _ in range(20):
        s = r.normal(size=9).astype(np.float32)
        assert np.isfinite(filter_top_p(s[None], top_p))[0].tolist() == brute_top_p(s, top_p)


def test_top_p_ties_prefer_lower_ids():
    s = np.log(np.array([[0.25, 0.25, 0.25, 0.25]], np.float32))
    assert np.isfinite(filter_top_p(s, 0.5)).tolist() == [[True, True, False, False]]


def test_top_p_always_keeps_one_token():
    s = np.array([[5.0, 0.0, -1.0]], np.float32)
    assert np.isfinite(filter_top_p(s, 1e-6)).sum() == 1


def test_temperature_before_log_softmax():
    z = np.array([[1.0, 2.0, 4.0]], np.float32)
    lp = log_probs(z, SamplingConfig(temperature=0.5))
    want = z / 0.5 - np.log(np.exp(z / 0.5).sum())
    np.testing.assert_allclose(lp, want, rtol=1e-6)


def test_filters_run_topk_then_topp_on_scaled_logits():
    z = np.array([[4.0, 3.0, 2.0, 1.0, 0.0]], np.float32)
    cfg = SamplingConfig(temperature=2.0, top_k=3, top_p=0.6)
    kept = np.isfinite(log_probs(z, cfg))[0]
    s = z[0, :3] / 2.0
    p = np.exp(s) / np.exp(s).sum()  # renormalised over the top-k set
    assert p[0] < 0.6 <= p[0] + p[1]
    assert kept.tolist() == [True, True, False, False, False]


def test_sample_draws_from_q_with_the_draft_stream():
    z = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    x, lq = sample(np.broadcast_to(z, (60_000, 3)), SamplingConfig(), seed=4, offset=2, position=1)
    freq = np.bincount(x, minlength=3) / x.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.01)
    np.testing.assert_allclose(lq, z[x], rtol=1e-6)
    g = rng.gumbel(4, 2, np.arange(5)[:, None], 1, np.arange(3)[None], rng.DRAFT)
    assert np.array_equal(x[:5], (z + g).argmax(-1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes") if dtype == "bfloat16" else None
    np_dtype = ml_dtypes.bfloat16 if ml_dtypes else np.dtype(dtype)
    r = np.random.default_rng(1)
    z = r.normal(size=(16, 4, 50)).astype(np_dtype)
    w = r.normal(size=(16, 3, 50)).astype(np_dtype)
    x = r.integers(0, 50, (16, 3))
    a = verify(z, x, w, seed=5)
    b = verify(z.astype(np.float32), x, w.astype(np.float32), seed=5)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.num_accepted, b.num_accepted)


def test_per_row_seeds_make_a_request_independent_of_its_batch_row():
    r = np.random.default_rng(2)
    z = r.normal(size=(5, 4, 30)).astype(np.float32)
    w = r.normal(size=(5, 3, 30)).astype(np.float32)
    x = r.integers(0, 30, (5, 3))
    seeds = np.array([11, 22, 33, 44, 55])
    offsets = np.array([0, 3, 9, 1, 2])
    batch = verify(z, x, w, seed=seeds, offset=offsets)
    for b in range(5):
        alone = verify(z[b : b + 1], x[b : b + 1], w[b : b + 1], seed=seeds[b : b + 1], offset=offsets[b : b + 1])
        assert np.array_equal(alone.tokens[0], batch.tokens[b])


def test_given_draft_logprobs_match_computed_ones():
    r = np.random.default_rng(3)
    z = r.normal(size=(64, 3, 20)).astype(np.float32)
    w = r.normal(size=(64, 2, 20)).astype(np.float32)
    cfg = SamplingConfig(temperature=0.8)
    xs = [sample(w[:, i], cfg, seed=9, offset=0, position=i) for i in range(2)]
    x = np.stack([t for t, _ in xs], 1)
    lq = np.stack([l for _, l in xs], 1)
    a = verify(z, x, w, lq, temperature=0.8, seed=9)
    b = verify(z, x, w, None, temperature=0.8, seed=9)
    assert np.array_equal(a.tokens, b.tokens)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": np.zeros((2, 2), np.int64)}, "seed"),
        ({"offset": 2**32}, "offset"),
        ({"impl": "triton"}, "impl"),
    ],
)
def test_errors_name_the_argument(kwargs, needle):
    z = np.zeros((2, 3, 5), np.float32)
    x = np.zeros((2, 2), np.int64)
    with pytest.raises(ValueError, match=needle):
        verify(z, x, **kwargs)


def test_value_errors_name_the_argument():
    z = np.zeros((2, 3, 5), np.float32)
    x = np.zeros((2, 2), np.int64)
    with pytest.raises(ValueError, match=r"draft_tokens\[1, 0\] = -1"):
        verify(z, np.array([[0, 1], [-1, 2]]))
    with pytest.raises(ValueError, match="vocabulary"):
        verify(z, x, np.zeros((2, 2, 4), np.float32))
    with pytest.raises(ValueError, match="G >= 1"):
        verify(z[:, :1], x[:, :0])
    with pytest.raises(ValueError, match="draft_logprobs"):
        verify(z, x, None, np.zeros((2, 2), np.float32))
    w = np.zeros((2, 2, 5), np.float32)
    w[0, 1, 0] = -np.inf
    with pytest.raises(ValueError, match="zero probability"):
        verify(z, x, w)
