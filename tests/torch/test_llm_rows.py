"""benchmarks/llm_rows.py: rows drawn from a recorded LLM row keep its head exactly and its bulk's quantiles."""

import numpy as np
import pytest
import torch

from tests.benchmark_modules import BENCHMARKS, load_benchmark


def record(r=3, head=8, q=64, seed=0):
    rng = np.random.default_rng(seed)
    bulk = (np.sort(rng.normal(size=(r, q)), axis=1) + np.arange(r)[:, None] * 10).astype(np.float32)  # rows apart
    top = (bulk[:, -1:] + 5 + np.sort(rng.uniform(0, 3, size=(r, head)), axis=1)[:, ::-1]).astype(np.float32)
    return dict(head=np.ascontiguousarray(top), bulk=bulk, vocab=np.int64(1000))


def test_sampled_rows_keep_the_head_once_and_the_bulk_in_range():
    lr = load_benchmark("llm_rows")
    rec = record()
    z = lr.sample_rows(rec, 7, 500, "cpu", torch.Generator().manual_seed(1), first=2)
    assert z.shape == (7, 500)
    for i in range(7):
        k = (2 + i) % 3  # the recorded row this row follows
        top = z[i].topk(8).values.numpy()
        np.testing.assert_array_equal(top, rec["head"][k])  # each head logit once, at its exact value
        rest = z[i].sort().values[:-8].numpy()
        assert rest.min() >= rec["bulk"][k, 0] and rest.max() <= rec["bulk"][k, -1]


def test_sampled_bulk_follows_the_recorded_quantiles():
    lr = load_benchmark("llm_rows")
    rec = record(r=1, q=256)
    z = lr.sample_rows(rec, 1, 200_000, "cpu", torch.Generator().manual_seed(2))[0]
    rest = z.sort().values[:-8].numpy()
    probs = (np.arange(256) + 0.5) / 256
    got = np.quantile(rest, probs[16:-16])
    np.testing.assert_allclose(got, rec["bulk"][0, 16:-16], atol=0.05)


def test_summarise_then_sample_reproduces_a_row():
    lr = load_benchmark("llm_rows")
    rng = np.random.default_rng(3)
    z = np.concatenate([rng.normal(size=(2, 20_000)), rng.uniform(8, 12, size=(2, lr.HEAD))], axis=1)
    head, bulk = lr.summarise(z)
    assert head.shape == (2, lr.HEAD) and bulk.shape == (2, lr.QUANTILES)
    np.testing.assert_allclose(head, np.sort(z, axis=1)[:, ::-1][:, :lr.HEAD], rtol=1e-6)
    assert np.all(np.diff(bulk, axis=1) >= 0) and np.all(bulk[:, -1] < head[:, -1])


def test_too_small_a_vocabulary_is_refused():
    lr = load_benchmark("llm_rows")
    with pytest.raises(ValueError, match="v=8 must exceed"):
        lr.sample_rows(record(), 2, 8, "cpu", torch.Generator())


def test_committed_record_gives_peaked_rows():
    """The committed SmolLM2 record: rows far more peaked than the flat benchmark rows."""
    lr = load_benchmark("llm_rows")
    rec = lr.load()
    assert rec["head"].shape[1] == lr.HEAD and rec["bulk"].shape[1] == lr.QUANTILES
    def entropy(z):  # [N, V] -> median entropy of softmax(z / 0.7), nats
        lp = torch.log_softmax(z / 0.7, -1)
        return -(lp.exp() * lp).sum(-1).median().item()

    llm = entropy(lr.sample_rows(rec, 64, 32000, "cpu", torch.Generator().manual_seed(0)))
    flat = entropy(2 * torch.randn(64, 32000, generator=torch.Generator().manual_seed(0)))
    assert llm < 1.5 and flat > 3


def test_benchmark_inputs_take_either_kind_of_rows(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    vk = load_benchmark("verify_kernels")
    gen = torch.Generator().manual_seed(0)
    shape = dict(B=3, G=2, V=1000, dtype="float32", temperature=0.7, draft="logprobs", rows="llm")
    inp = vk.make_inputs(shape, "cpu", gen)
    assert inp["target_logits"].shape == (3, 3, 1000) and inp["draft_logits"].shape == (3, 2, 1000)
    z = inp["target_logits"]
    assert (z.amax(-1) - z.median(-1).values).min() > 10  # the recorded heads far above the bulk, not 2 N(0, 1)
    with pytest.raises(ValueError, match="rows='peaked' must be"):
        vk.make_inputs(dict(shape, rows="peaked"), "cpu", gen)
