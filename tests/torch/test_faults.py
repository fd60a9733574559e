"""NaN logits out of a model are flagged on the device, reported one step late with the step and
row, never sampled from; the tokens before are kept; the engine stays usable. Ctrl-C returns the
partial result."""

import pytest
import torch
from fault_helpers import first_new_token, poisoned, tiny_target

from flashspec.config import SamplingConfig
from flashspec.faults import NonFiniteLogitsError
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, ModelDraft
from flashspec_torch.engine import Engine

PROMPT = "abcab"
OTHERS = ["zyx", "hello", "qqq", "mnop", "12345", "xyzzy"]
GREEDY = dict(temperature=0.0, max_new_tokens=16, chat=False)


@pytest.fixture(scope="module")
def clean():
    return tiny_target()


@pytest.fixture(scope="module")
def poison(clean):
    """(poisoned target, clean greedy tokens of PROMPT, index k of the token whose embedding is NaN)."""
    ref = Engine(clean, ("ngram",), policy="fixed", device="cpu").generate(PROMPT, speculation=False, **GREEDY)
    ids = clean.tokenizer(PROMPT)["input_ids"]
    k = first_new_token(ref["tokens"], ids, at_least=3)
    return poisoned(clean, ref["tokens"][k]), ref["tokens"], k


@pytest.fixture(scope="module")
def other(clean, poison):
    """A prompt whose clean greedy run never meets the poisoned token, and that run's tokens."""
    _, tokens, k = poison
    eng = Engine(clean, ("ngram",), policy="fixed", device="cpu")
    for prompt in OTHERS:
        out = eng.generate(prompt, speculation=False, **GREEDY)["tokens"]
        if tokens[k] not in out + clean.tokenizer(prompt)["input_ids"]:
            return prompt, out
    raise AssertionError("every candidate prompt meets the poisoned token")


@pytest.mark.parametrize("speculation", [False, True])
def test_nan_logits_stop_generation_and_keep_the_tokens_before(poison, speculation):
    bad, tokens, k = poison
    eng = Engine(bad, ("ngram",), policy="fixed", device="cpu")
    with pytest.raises(NonFiniteLogitsError, match=r"step \d+: the target model produced NaN or infinite logits for batch row 0") as info:
        eng.generate(PROMPT, speculation=speculation, **GREEDY)
    e = info.value
    assert e.rows == [0] and e.models == ["target"]
    # the poisoned token is generated (its logit is finite), then feeding it gives NaN: that step is dropped
    assert e.result["tokens"] == tokens[: k + 1]
    if not speculation:
        assert e.step == k + 1  # plain decoding emits one token per step


def test_a_model_draft_with_nan_logits_is_named(clean, poison):
    """A clean target with a poisoned draft model: the draft is named; the tokens before are the
    clean target's (greedy), nothing was sampled from the draft's NaN q."""
    bad, tokens, k = poison
    b = TorchBackend(clean.model, [ModelDraft("bad", bad.model)])
    prompt = clean.tokenizer(PROMPT)["input_ids"]
    with torch.inference_mode(), pytest.raises(NonFiniteLogitsError, match="the draft model") as info:
        speculate(b, FixedPolicy(), [prompt], sampling=SamplingConfig(0.0), spec=SpecConfig(gamma=3, max_new_tokens=16))
    assert info.value.models == ["draft"] and info.value.rows == [0]
    got = b.outputs()[0]
    assert len(got) >= k and got == tokens[: len(got)]


def test_only_the_bad_row_is_named_and_the_others_keep_their_tokens(clean, poison, other):
    bad, tokens, k = poison
    prompt, want = other
    poison_char = clean.tokenizer.decode([tokens[k]])
    eng = Engine(bad, ("ngram",), policy="fixed", device="cpu")
    with pytest.raises(NonFiniteLogitsError) as info:
        eng.generate([prompt, poison_char + "q"], speculation=False, **GREEDY)
    e = info.value
    assert e.rows == [1] and e.step == 0
    kept, poisoned_row = e.result["tokens"]
    assert poisoned_row == [] and 1 <= len(kept) and kept == want[: len(kept)]


@pytest.mark.parametrize("speculation", [False, True])
def test_the_engine_is_usable_after_a_fault(poison, other, speculation):
    """Same batch shape, so the buffers (and the stale NaN K/V of the faulty row) are reused."""
    bad, _, _ = poison
    prompt, want = other
    eng = Engine(bad, ("ngram",), policy="thompson-token", device="cpu")
    with pytest.raises(NonFiniteLogitsError):
        eng.generate(PROMPT, speculation=speculation, **GREEDY)
    assert eng.generate(prompt, speculation=speculation, **GREEDY)["tokens"] == want


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(0.8, top_k=9, top_p=0.9)])
def test_backend_flags_and_discards_the_faulty_step(poison, graphs, sampling):
    """Through the loop directly, eager and with the graphed (fixed-shape) step code."""
    bad, tokens, k = poison
    prompt = bad.tokenizer(PROMPT)["input_ids"]
    for spec in (True, False):
        b = TorchBackend(bad.model, [LookupDraft(), ModelDraft("skip", bad.model, frozenset({1}))], graphs=graphs)
        with torch.inference_mode(), pytest.raises(NonFiniteLogitsError) as info:
            if spec:
                speculate(b, FixedPolicy(), [prompt], sampling=sampling, spec=SpecConfig(gamma=3, max_new_tokens=16))
            else:
                decode(b, [prompt], sampling=sampling, max_new_tokens=16)
        out = b.outputs()[0]
        assert info.value.rows == [0]
        if sampling.greedy:
            assert out == tokens[: k + 1]
        assert all(0 <= t < bad.model.config.vocab_size for t in out)


class FixedPolicy:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def test_ctrl_c_in_generate_returns_the_partial_result(clean):
    eng = Engine(clean, ("ngram",), policy="fixed", device="cpu")
    full = eng.generate(PROMPT, **GREEDY)
    calls = []

    def interrupt(record):
        calls.append(record)
        if len(calls) == 2:
            raise KeyboardInterrupt

    part = eng.generate(PROMPT, on_step=interrupt, **GREEDY)
    assert part["interrupted"] is True and full["interrupted"] is False
    assert 2 <= len(part["tokens"]) < len(full["tokens"])
    assert part["tokens"] == full["tokens"][: len(part["tokens"])]
    assert part["text"] == clean.tokenizer.decode(part["tokens"])
    assert eng.generate(PROMPT, **GREEDY)["tokens"] == full["tokens"]  # usable afterwards
