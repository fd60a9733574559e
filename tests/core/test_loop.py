"""The one loop against a fake (Markov-chain) backend: exactness with adaptive draft choice."""

import numpy as np
import pytest

from flashspec.config import SamplingConfig
from flashspec.fake import LookupDraft, MarkovBackend, ModelDraft
from flashspec.fake import chain_law as target_law
from flashspec.loop import SpecConfig, speculate
from flashspec.stats import summarize
from flashspec.testing import chi_square_test

V = 4
ALPHA = 0.01


def chain(seed):
    r = np.random.default_rng(seed)
    target = (r.normal(size=(V, V)) * 1.2).astype(np.float32)
    drafts = [
        ModelDraft("good", (target + r.normal(size=(V, V)) * 0.3).astype(np.float32)),
        ModelDraft("bad", (r.normal(size=(V, V)) * 2.0).astype(np.float32)),
        LookupDraft("lookup", r.integers(0, V, V)),
    ]
    return target, drafts


class OutcomeDrivenPolicy:
    """Switches arm every step as a function of everything observed so far (only the past)."""

    def __init__(self, k):
        self.k, self.seen, self.steps = k, 0, 0

    def choose(self):
        self.steps += 1
        return (self.steps + self.seen) % self.k

    def observe(self, arm, drafted, accepted, seconds):
        self.seen += accepted + 1


def first_tokens(backend, policy, sampling, gamma, rows, length, seed):
    outs, records = speculate(
        backend, policy, [[0]] * rows, sampling=sampling, spec=SpecConfig(gamma=gamma, max_new_tokens=length), seed=seed
    )
    return np.array(outs), records


@pytest.mark.parametrize(
    "sampling,gamma",
    [(SamplingConfig(1.0), 2), (SamplingConfig(0.7, top_k=3), 3), (SamplingConfig(1.3, top_p=0.85), 1)],
)
def test_loop_with_switching_policy_is_exact(sampling, gamma):
    target, drafts = chain(1)
    backend = MarkovBackend(target, drafts)
    tokens, records = first_tokens(backend, OutcomeDrivenPolicy(3), sampling, gamma, 40_000, 3, seed=17)
    assert len({r.arm for r in records}) >= 2  # drafts of very different quality alternate
    observed = np.bincount(tokens @ np.array([V * V, V, 1]), minlength=V**3)
    _, p_value, note = chi_square_test(observed, target_law(target, sampling, 0, 3))
    assert p_value >= ALPHA / 3, note


def test_loop_with_thompson_over_drafts_is_exact():
    bandits = pytest.importorskip("flashspec.bandits")
    target, drafts = chain(2)
    policy = bandits.Thompson(3, rng=5)
    sampling = SamplingConfig(1.0)
    tokens, records = first_tokens(MarkovBackend(target, drafts), policy, sampling, 2, 40_000, 3, seed=3)
    observed = np.bincount(tokens @ np.array([V * V, V, 1]), minlength=V**3)
    _, p_value, note = chi_square_test(observed, target_law(target, sampling, 0, 3))
    assert p_value >= ALPHA, note


class PeekingBackend(MarkovBackend):
    """A cheating loop: when the first drafted token is rejected, it re-drafts with the next arm
    and verifies again -- a draft choice that depends on the current step's outcome."""

    def verify(self, target_logits, proposal, sampling, seed, offset):
        res = super().verify(target_logits, proposal, sampling, seed, offset)
        arm = next(i for i, d in enumerate(self.drafts) if d.name == self._arm)
        retry = self.draft((arm + 1) % len(self.drafts), proposal.tokens.shape[1], sampling, seed, offset + 10_000)
        res2 = super().verify(self.score(retry), retry, sampling, seed, offset + 10_000)
        redo = np.asarray(res.num_accepted) == 0
        return type(res)(np.where(redo, res2.num_accepted, res.num_accepted), np.where(redo[:, None], res2.tokens, res.tokens))

    def draft(self, arm, gamma, sampling, seed, offset):
        self._arm = self.drafts[arm].name
        return super().draft(arm, gamma, sampling, seed, offset)


def test_the_loop_test_catches_a_policy_that_peeks():
    target, drafts = chain(1)
    sampling = SamplingConfig(1.0)
    tokens, _ = first_tokens(PeekingBackend(target, drafts), OutcomeDrivenPolicy(3), sampling, 2, 40_000, 3, seed=17)
    observed = np.bincount(tokens @ np.array([V * V, V, 1]), minlength=V**3)
    _, p_value, _ = chi_square_test(observed, target_law(target, sampling, 0, 3))
    assert p_value < 1e-6


def test_eos_and_length_stop_rows_and_stats_add_up():
    target, drafts = chain(4)
    backend = MarkovBackend(target, drafts, eos=3)
    outs, records = speculate(
        backend, OutcomeDrivenPolicy(3), [[0], [1], [2]] * 20, sampling=SamplingConfig(1.0),
        spec=SpecConfig(gamma=3, max_new_tokens=12), seed=8,
    )
    for o in outs:
        assert 1 <= len(o) <= 12
        assert 3 not in o[:-1]  # nothing after EOS
        assert o[-1] == 3 or len(o) == 12
    stats = summarize(records, backend.draft_names, wall_seconds=1.0, new_tokens=sum(map(len, outs)))
    assert sum(stats["arm_pulls"].values()) == stats["steps"] == len(records)
    assert 0 <= stats["acceptance"] <= 1
    assert sum(r.emitted for r in records) >= sum(map(len, outs))


def test_spec_config_validation():
    for bad in ({"gamma": 0}, {"gamma": 2.0}, {"max_new_tokens": 0}, {"max_steps": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SpecConfig(**bad)
