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


def lazy_steps(policy, arms, plain_s, draft_s, per_position_s, prompt_s, rows=4):
    """Observe steps of ``arms`` (arm indices, in order) over ``rows`` rows: plain decoding costs ``plain_s``; a step of
    draft 0 (every token accepted) costs ``draft_s`` plus ``per_position_s`` per position emitted since its last step,
    its first step ``prompt_s`` more (it feeds the prompt), as the torch backend's head catches up lazily."""
    behind = None  # the prompt: unknown to the policy
    for a in arms:
        policy.choose(rows)  # in flight, as in the loop
        if policy.arms[a].plain:
            policy.observe(a, rows, np.zeros(rows, np.int64), plain_s)
            behind = None if behind is None else behind + 1
        else:
            g = policy.arms[a].length
            lag_s = prompt_s if behind is None else per_position_s * behind
            policy.observe(a, rows, np.full(rows, g, np.int64), draft_s + lag_s)
            behind = 0


def test_a_lazy_drafts_catch_up_is_priced_apart_and_charged_to_the_steps_that_leave_it_behind():
    """Plain 1 s; the draft's step 2 s plus 0.25 s per position it is behind (its first step in the batch 3 s more:
    the prompt), runs of 2-9 plain steps between runs of the draft. The draft's price stays its own 2 s (charging its
    first steps: 2.2-2.5 s a step), its catch-up is learnt as 0.25 s a position, and a plain step, which leaves the
    draft one position further behind, is charged 1.25 s (1 s without the catch-up)."""
    policy = AdaptivePolicy(make_arms(1, (2,)), 1, rng=0)
    policy.warm, policy.lazy[0] = True, True  # as ``adaptive_loop.mark_lazy`` marks the torch head
    policy.new_batch(4)
    plain, g2 = (next(i for i, a in enumerate(policy.arms) if a.plain == p) for p in (True, False))
    pattern = [g2] * 3 + [a for k in (2, 5, 9, 3, 7, 4, 8, 2, 6) for a in [plain] * k + [g2] * 3]
    lazy_steps(policy, pattern, plain_s=1.0, draft_s=2.0, per_position_s=0.25, prompt_s=3.0)
    b = policy.bucket_of(4)
    assert policy.cost[b, g2] == pytest.approx(2.0, rel=0.02), policy.cost[b]
    assert policy.cost[b, plain] == pytest.approx(1.0, rel=1e-6)
    assert policy.catch_cost[b, 0] == pytest.approx(0.25, rel=0.05), policy.catch_cost[b]
    charged = np.exp(policy.charged(b, policy.capped_log_cost(b)))
    assert charged[plain] == pytest.approx(1.25, rel=0.05) and charged[g2] == pytest.approx(2.0, rel=0.02), charged


def test_a_lazy_drafts_catch_up_step_does_not_score_the_drafts_the_next_one_does():
    """With the drafts scored for free, a run of an arm scores on its first step; a lazy draft's first step after
    plain steps catches up, so the run's second scores instead (timed clean, the first prices the catch-up). A
    draft that is not lazy (the n-gram) scores on its first step, as before."""
    for lazy in (True, False):
        p = AdaptivePolicy(make_arms(1, (2,)), 1, score_every=3)
        p.warm, p.lazy[0] = True, lazy
        for arm in range(2):
            p.observe(arm, 1, np.zeros(1, int), 1e-3)
        got = [p.scores(a) for a in [0] * 4 + [1] * 4 + [0] * 2]
        draft = [False, True, False, False] if lazy else [True, False, False, True]
        assert got == [True, False, False, True] + draft + [True, False], (lazy, got)


def test_a_stateless_drafts_first_steps_are_priced_as_any():
    """The same runs where the draft's step costs 2 s however far behind it is (the n-gram): marked lazy, nothing is
    learnt as its catch-up and nothing charged; not marked lazy, nothing is measured as catch-up at all. Every one of
    its 4 steps prices it either way."""
    policy = AdaptivePolicy(make_arms(1, (2,)), 1, rng=0)
    policy.warm, policy.lazy[0] = True, True
    policy.new_batch(4)
    plain, g2 = (next(i for i, a in enumerate(policy.arms) if a.plain == p) for p in (True, False))
    lazy_steps(policy, [g2] * 2 + [plain] * 3 + [g2] + [plain] * 4 + [g2], 1.0, 2.0, 0.0, 0.0)
    b = policy.bucket_of(4)
    assert policy.catch_cost[b, 0] == pytest.approx(0.0, abs=1e-9) and policy.samples[b, g2] == 4
    assert np.exp(policy.charged(b, policy.capped_log_cost(b))) == pytest.approx([1.0, 2.0][::1 if plain == 0 else -1])
    other = AdaptivePolicy(make_arms(1, (2,)), 1, rng=0)
    other.warm = True
    other.new_batch(4)
    lazy_steps(other, [g2] * 2 + [plain] * 3 + [g2] + [plain] * 4 + [g2], 1.0, 2.0, 0.0, 0.0)
    assert other.samples[b, g2] == 4 and other.catch_weight[b, 0] == 0 and not other.rough[b, g2]
