"""The shipped draft head on the real embedded model (SmolLM2-135M-Instruct, fp32 on the CPU):
greedy speculation equals greedy decoding, and at T = 0.7 with top-p and the dynamic draft length the
first two emitted tokens follow the target's own joint law."""

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.drafts import SHIPPED_HEAD
from flashspec.testing import chi_square_test

pytestmark = pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")

PROMPTS = ["def mean(values):\n    \"\"\"Return the arithmetic mean of values.\"\"\"\n",
           "The garbage collector frees memory that is no longer reachable, and",
           "Explain tides to a beginner in a few sentences."]


@pytest.fixture(scope="module")
def engine():
    from flashspec_torch.engine import Engine

    return Engine(None, ("head",), policy="fixed", device="cpu")


def test_greedy_head_speculation_equals_greedy_decoding(engine):
    common = dict(temperature=0.0, max_new_tokens=12, chat=False)
    plain = engine.generate(PROMPTS, speculation=False, **common)
    spec = engine.generate(PROMPTS, speculation=True, gamma=4, **common)
    for prompt, a, b in zip(PROMPTS, plain["tokens"], spec["tokens"]):
        assert a == b, f"{prompt!r}: head speculation {b} != plain {a}"
    assert spec["acceptance"] > 0.2  # the head really drafted (about 0.5 per position held out)


def test_sampled_first_two_tokens_follow_the_target_with_the_head(engine, monkeypatch):
    """T = 0.7, top-p 0.9, G = 2, with the dynamic draft length (``stop_below`` 0.05: a row stops after
    a token the head gives q < 0.05 at temperature 1; about a third of the rows propose one token, the
    rest two): the first token's law and the first two tokens' joint law, chi-square against the
    target's own p(t1) p(t2 | t1) computed by plain forward passes. A short prompt with a few likely
    continuations keeps the rows cheap and the bins full."""
    from flashspec_torch.reference import log_probs

    draft = engine.backend.drafts[0]
    monkeypatch.setattr(draft, "stop_below", 0.05)
    lengths, propose = [], draft.propose

    def recorded(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        lengths.append(proposal.lengths)
        return proposal

    monkeypatch.setattr(draft, "propose", recorded)

    prompt, n = "My favourite colour is", 200
    sampling = SamplingConfig(temperature=0.7, top_p=0.9)
    ids = engine.encode(prompt, chat=False)
    m = engine.target.model
    with torch.inference_mode():
        z1 = m(torch.tensor([ids]), torch.arange(len(ids))[None], m.new_cache(1, len(ids)), len(ids), logits_last=1)[0, 0]
        p1 = log_probs(z1, sampling).exp().double()  # [V]
        first = torch.nonzero(p1 > 0)[:, 0]  # the nucleus of the first token
        seqs = torch.tensor([ids + [t] for t in first.tolist()])
        k = len(ids) + 1
        z2 = m(seqs, torch.arange(k)[None].expand(len(first), -1), m.new_cache(len(first), k), k, logits_last=1)[:, 0]
        p2 = log_probs(z2, sampling).exp().double()  # [F, V]
        out = engine.generate([prompt] * n, seed=list(range(n)), temperature=0.7, top_p=0.9, max_new_tokens=2, gamma=2,
                              chat=False)
    joint = (p1[first][:, None] * p2).numpy()  # [F, V]
    row = {t: i for i, t in enumerate(first.tolist())}
    counts = np.zeros_like(joint)
    for t1, t2 in (t[:2] for t in out["tokens"]):
        assert t1 in row, f"first token {t1} is outside the target's top-p nucleus"
        counts[row[t1], t2] += 1
    _, p_first, note_first = chi_square_test(counts.sum(1), joint.sum(1))
    _, p_joint, note_joint = chi_square_test(counts, joint)
    assert p_first > 1e-3, f"first token: {note_first}, p = {p_first:.2g}"
    assert p_joint > 1e-3, f"first two tokens: {note_joint}, p = {p_joint:.2g}"
    assert out["acceptance"] > 0.1  # the head's drafts were accepted often enough to matter
    assert 0.15 < float((lengths[0] == 1).float().mean()) < 0.85  # both lengths are common
