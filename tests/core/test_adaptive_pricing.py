"""Each arm priced by its own work (issue #35, ad22): a choice's host time that held a step up and the full-information
scoring's device time are not the arm's (``AdaptivePolicy.observe``'s ``chose_s`` and ``scored``), the scoring is
priced apart and paid for at most ``SCORE_SHARE`` of a run (``scoring_period``)."""

import numpy as np
import pytest

from flashspec import adaptive_loop
from flashspec.adaptive import AdaptivePolicy, make_arms
from flashspec.pricing import MAX_SCORE_EVERY
from flashspec.config import SamplingConfig
from flashspec.fake import LookupDraft
from flashspec.loop import SpecConfig
from slow_choice import SlowChoice  # tests/slow_choice.py
from test_adaptive import V, AsyncBackend, chain, clock, run  # noqa: F401  (clock: the fixture)

COSTS = {0: 1.0, 2: 3.0, 4: 5.0}  # device seconds: plain, G = 2, G = 4


def useless_draft():
    target, _ = chain(2)
    return target, LookupDraft("wrong", (target.argmax(-1) + 1) % V)  # never the greedy token


def test_plain_decoding_is_priced_without_the_free_scoring(clock):
    """Plain decoding wins (a useless draft); a plain step that scores the draft for free costs 1.5 s against 1 s:
    plain decoding's estimate is its own 1 s (the scoring steps price the scoring, 1.5 s), and with the scoring at
    50% of a step it runs on 1 plain step in ``MAX_SCORE_EVERY`` (1 in ``score_every`` = 4 would be 8 of 33)."""
    target, wrong = useless_draft()
    backend = AsyncBackend(target, [wrong], clock, COSTS, score_s=0.5)
    policy = AdaptivePolicy(make_arms(1, (2, 4)), 1, rng=0)
    policy.warm = True  # first timings trusted, as after prepare_arms on a GPU
    assert adaptive_loop.use_free_scoring(backend, policy) == 1
    _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=40))
    b = policy.bucket_of(2)
    plain = sum(r.arm == -1 for r in records)
    assert plain >= 35 and policy.cost[b, 0] == pytest.approx(1.0, rel=1e-3), policy.cost[b]
    assert np.exp(policy.score_log_cost[b, 0]) == pytest.approx(1.5, rel=1e-3)
    assert policy.scoring_period(0) == MAX_SCORE_EVERY and backend.scored <= 3, backend.scored


@pytest.mark.parametrize("host_s", [0.5, 4.0])
def test_a_choices_host_time_is_not_priced_into_the_arm_it_held_up(clock, host_s):
    """Each choice takes ``host_s`` of host time: 0.5 s hides behind every device step (the read waits for the
    device longer), 4 s holds every step up (the host is the bottleneck). Either way each arm's estimate is its own
    device time (plain 1 s, G = 2 3 s): an exploration holds a second step, so its first is timed without a choice
    in it, and a later step with one only moves an estimate into the range it allows. (Charging the choice: every
    arm ~4 s at 4 s a choice, G = 2 as cheap as plain.)"""
    target, wrong = useless_draft()
    backend = AsyncBackend(target, [wrong], clock, COSTS)
    policy = SlowChoice(make_arms(1, (2, 4)), 1, rng=0, clock=clock, host_s=host_s)
    policy.warm = True
    _, records = run(backend, policy, [[0]] * 2, SamplingConfig(0.0), SpecConfig(gamma=4, max_new_tokens=60))
    b = policy.bucket_of(2)
    assert policy.cost[b, :2] == pytest.approx([1.0, 3.0], rel=1e-3), policy.cost[b]
    assert not policy.rough[b, :2].any() and sum(r.arm == -1 for r in records[-40:]) == 40
