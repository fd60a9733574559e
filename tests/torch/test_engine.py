"""The torch engine on the real embedded model (SmolLM2-135M-Instruct, fp32 on the CPU); the first-token law
on a tiny random target."""

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.testing import chi_square_test
from torch_helpers import next_token_law

from prompts import PROMPTS  # noqa: E402  (tests/prompts.py: shared by both backends)


@pytest.fixture(scope="module")
def engine():
    from flashspec_torch.engine import Engine

    torch.manual_seed(0)
    return Engine(None, ("ngram", "layerskip:24-29"), policy="thompson-token", device="cpu")


def test_prompts_are_twenty_of_mixed_kinds():
    assert len(PROMPTS) >= 20 and len(set(PROMPTS)) == len(PROMPTS)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_speculation_equals_greedy_decoding(engine, batch):
    """Speculation (G = 4) one prompt at a time and in batches of 4 emits, per prompt, the tokens of plain greedy
    decoding, which runs all of the test's prompts in one batch (a CPU forward costs about the same at 1 and 10
    rows: 20 forwards instead of 20 per group)."""
    common = dict(temperature=0.0, max_new_tokens=20, chat=False)
    # one at a time: every fourth prompt (code, SQL, prose, chat, a repeat); in batches of 4 (4, 4, 2 rows): the ten
    # odd ones (code, prose, chat, lists, verse), so the two cover 15 of the 20
    prompts = PROMPTS[::4] if batch == 1 else PROMPTS[1::2]
    plain = engine.generate(prompts, speculation=False, **common)["tokens"]
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        spec = engine.generate(group, speculation=True, gamma=4, **common)
        for prompt, a, b in zip(group, plain[i : i + batch], spec["tokens"]):
            assert a == b, f"{prompt!r}: speculative {b} != autoregressive {a}"
        assert spec["steps"] >= 1 and sum(spec["arm_pulls"].values()) == spec["steps"]


def test_adaptive_policy_greedy_equals_greedy_decoding(engine):
    """--policy adaptive: plain steps and speculative steps of G and G // 2 mixed (every arm runs twice
    first), each request's greedy tokens those of plain decoding; plain steps are no draft's pulls.
    Two short prompts with repeats: cheap, and the n-gram draft matches."""
    from flashspec_torch.engine import Engine

    adaptive = Engine(engine.target, ("ngram",), policy="adaptive", device="cpu")
    prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "The cat sat on the mat. The cat"]
    common = dict(temperature=0.0, max_new_tokens=10, chat=False)
    plain = engine.generate(prompts, speculation=False, **common)
    spec = adaptive.generate(prompts, speculation=True, gamma=4, **common)
    assert spec["tokens"] == plain["tokens"] and spec["policy"] == "adaptive"
    assert 1 <= sum(spec["arm_pulls"].values()) <= spec["steps"]


@pytest.mark.parametrize("sharpen", [1.0, 3.0])
def test_sampled_first_tokens_follow_the_target(sharpen):
    """With drafts in the loop, the first emitted token ~ the target's next-token distribution. One step
    (max_new_tokens=1): the first token is that step's accepted draft or its corrected draw, and a
    second step (the loop issues it before reading the first) would not change it. On the tiny random
    target (tests/torch/fault_helpers.py), the same engine, draft and verify code as the embedded model's
    (400 rows there took ~3 min of CI), 4,000 rows: its flat law (the draft's own filters ignored fails it,
    p ~ 1e-7 at 400 rows) and, final norm x3, a peaked one (a law at T = 0.8 or 1.25 instead of 1 fails it,
    p < 1e-4, as on the embedded model's 400 rows). The greedy tests above keep the embedded model."""
    from fault_helpers import tiny_target

    from flashspec_torch.engine import Engine

    prompt, n = "The capital of France is", 4000
    sampling = SamplingConfig(temperature=1.0, top_k=8)
    tiny = tiny_target(seed=3)
    tiny.model.norm.data.mul_(sharpen)
    drafted = Engine(tiny, ("layerskip:2",), policy="fixed", device="cpu")  # q != p, often accepted
    p = next_token_law(tiny.model, drafted.encode(prompt, chat=False), sampling)
    out = drafted.generate([prompt] * n, seed=list(range(n)), temperature=1.0, top_k=8, max_new_tokens=1, gamma=2, chat=False)
    first = np.array([t[0] for t in out["tokens"]])
    _, p_value, note = chi_square_test(np.bincount(first, minlength=p.size), p)
    assert p_value > 1e-3, note
    assert out["acceptance"] > 0.1  # the drafts really took part


def test_bad_input_is_a_clear_error(engine):
    with pytest.raises(ValueError, match="prompt"):
        engine.generate("   ")
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("hi", max_new_tokens=0)
    with pytest.raises(ValueError, match="layerskip"):
        engine.make_draft("layerskip:40-50")
    with pytest.raises(ValueError, match="unknown"):
        engine.make_draft("no-such-draft")
    assert engine.generate("hi", max_new_tokens=2, chat=False)["new_tokens"] >= 1  # still usable


def test_stop_below_reaches_model_drafts_and_is_refused_without_one(engine):
    """The dynamic draft length is set on the drafts that implement it (model drafts, heads); with
    only fixed-length drafts (the n-gram lookup) it is refused, not ignored."""
    from flashspec_torch.engine import Engine

    eng = Engine(engine.target, ("ngram", "layerskip:24-29"), policy="fixed", device="cpu", stop_below=0.1)
    assert [getattr(d, "stop_below", None) for d in eng.drafts] == [None, 0.1]
    with pytest.raises(ValueError, match="stop_below=0.1 needs a model draft"):
        Engine(engine.target, ("ngram",), policy="fixed", device="cpu", stop_below=0.1)


def test_batch_invariant_is_the_models_setting_and_checked(engine):
    """``batch_invariant`` lands on the target model (decode_settings reads it there), what the mode
    does not implement is refused when the engine is built, and a non-bool is refused.
    (tests/torch/test_batch_invariant.py runs the mode.)"""
    from flashspec_torch.engine import Engine

    target = engine.target
    try:
        Engine(target, ("ngram",), policy="fixed", device="cpu", batch_invariant=True)
        assert target.model.batch_invariant is True
        Engine(target, ("ngram",), policy="fixed", device="cpu")
        assert target.model.batch_invariant is False
        target.model.impl = "reference"
        with pytest.raises(ValueError, match="batch_invariant: impl='reference'"):
            Engine(target, ("ngram",), policy="fixed", device="cpu", batch_invariant=True)
        with pytest.raises(TypeError, match="batch_invariant"):
            Engine(target, ("ngram",), device="cpu", batch_invariant="yes")
    finally:
        target.model.batch_invariant, target.model.impl = False, None
