"""Held choices that grow while their arm keeps winning (``adaptive_loop.Choices``, ``throughput.held``) and the
drawn arms' own pricing (``AdaptivePolicy.log_rate(arms=)``): issue #35, ad20."""

import numpy as np

from flashspec import adaptive_loop, throughput
from flashspec.adaptive import AdaptivePolicy, make_arms


def test_a_held_choice_grows_while_its_arm_keeps_winning_and_restarts_on_moved_acceptance():
    """``adaptive_loop.Choices``: a choice on value taking 0.12 s against 1 s steps holds 3 steps (ceil(0.12 /
    ``HOST_SHARE``)); each next choice of
    the same arm on the posterior means, clear of its rivals (``CLEAR``), doubles it (3, 6, 12, 24, then
    ``MAX_GROWN``), so the policy is asked at
    steps 0, 3, 9, 21, 45, 77; a choice made by a Thompson draw alone (``margin`` 0) holds its 3 steps and starts
    the streak again; a draft's pooled acceptance moving by more than ``DRIFT`` ends a hold at once."""
    policy = AdaptivePolicy(make_arms(1, (2,)), 1)
    now, asked, settled = [0.0], [], []

    def choose():
        now[0] += 0.12
        asked.append(step)
        policy.on_value, policy.margin = True, (1.0 if settled.pop(0) else 0.0) if settled else 1.0
        return 1

    choices = adaptive_loop.Choices(None, policy, lambda: now[0])
    for step in range(80):
        assert choices.next(choose, 1.0) == 1
    assert asked == [0, 3, 9, 21, 45, 45 + throughput.MAX_GROWN]
    choices, asked[:], settled[:] = adaptive_loop.Choices(None, policy, lambda: now[0]), [], [True, False, True, True]
    for step in range(9):
        if step == 8:
            policy.succ[0] += 10.0  # the n-gram's pooled acceptance moves: the hold of 6 from step 6 ends
        choices.next(choose, 1.0)
    assert asked == [0, 3, 6, 8]


def test_the_drawn_arms_rate_alone_is_the_full_rates_entry():
    """``log_rate(rows, alpha, arms)`` (``choose`` prices only the arms a Thompson draw moves) equals the full
    computation's entries, for a static batch (``finish_steps`` per arm) and a server."""
    r = np.random.default_rng(3)
    for tokens in (40, None):
        p = AdaptivePolicy(make_arms(2, (2, 4)), 2)
        p.new_batch(16, tokens)
        for _ in range(5):
            for a in range(1, 5):
                p.observe(a, 16, r.integers(0, p.arms[a].length + 1, 16), 1.0, where=np.arange(16))
        alpha = r.uniform(0.1, 0.95, (2, 16))
        full = p.log_rate(16, alpha)
        for pick in ([3, 4], [0], [1, 4]):
            assert np.array_equal(p.log_rate(16, alpha, np.array(pick)), full[pick])


def test_a_static_batch_is_priced_by_the_spread_of_its_rows_rates():
    """``AdaptivePolicy.measure_spread``: rows drawn at acceptance 0.95 and 0.75 (between-row variance 0.01), 400 trials
    each, give tau^2 near 0.01; one rate for all rows gives 0. ``rate_spread``: a fresh static batch of 256 rows is
    then priced slower on the draft (its slowest rows unknown yet), never faster, and plain decoding is unchanged."""
    rng = np.random.default_rng(5)
    rows = 256
    arms = make_arms(1, (2, 4))
    spread = {}
    for name, rates in (("mixed", np.where(np.arange(rows) % 2 == 0, 0.95, 0.75)), ("one", np.full(rows, 0.85))):
        p = AdaptivePolicy(arms, 1)
        p.new_batch(rows, tokens=128)
        trials = 400
        succ = rng.binomial(trials, rates)
        p.row_succ[0], p.row_fail[0] = succ, trials - succ
        p.measure_spread()
        spread[name] = p.row_spread[0]
        p.new_batch(rows, tokens=128)
        p.succ[:], p.fail[:] = 85.0, 15.0
        priced = p.log_rate(rows, p.mean_alpha())
        p.row_spread[:] = 0.0
        pooled = p.log_rate(rows, p.mean_alpha())  # every row at the pool's mean
        assert priced[0] == pooled[0]  # plain decoding: one token a step whatever the rows
        assert (priced[1:] <= pooled[1:]).all()
        if name == "mixed":
            assert (priced[1:] < pooled[1:] - 0.02).all()
    assert abs(spread["mixed"] - 0.01) < 0.003 and spread["one"] < 0.001


def test_the_emitted_slope_is_the_derivative_of_the_emitted_mean():
    """``throughput.emitted_slope`` against a central difference of ``emitted_moments``' mean, on random acceptance,
    lengths and position profiles (some factors capped at 1)."""
    r = np.random.default_rng(11)
    alpha = r.uniform(0.05, 0.95, (3, 40))
    length = r.integers(0, 6, (3, 40)).astype(float)
    profile = r.uniform(0.5, 1.6, (3, 1, 6))
    h = 1e-6
    up, _ = throughput.emitted_moments(alpha + h, length, profile)
    down, _ = throughput.emitted_moments(alpha - h, length, profile)
    capped = np.abs(alpha[..., None] * profile - 1.0).min(axis=-1) < 1e-4  # a kink within the difference's reach
    slope = throughput.emitted_slope(alpha, length, profile)
    assert np.allclose(slope[~capped], ((up - down) / (2 * h))[~capped], rtol=1e-5, atol=1e-7)
    assert (slope[length == 0] == 0).all() and (slope[length > 0] > 0).any()


def test_a_step_scores_the_drafts_on_the_first_of_every_score_every_steps_of_its_arm():
    """``AdaptivePolicy.scores``: a run of one arm, plain or speculative, scores on its steps 0, k, 2k, ... (k =
    ``score_every``); another arm starts its own count; an arm whose cost was not timed cleanly (never, or only on
    steps that held other work: ``rough``) scores nothing, its step being that timing."""
    p = AdaptivePolicy(make_arms(1, (2, 4)), 1, score_every=3)
    seq = [0] * 7 + [1] * 4 + [2] * 2 + [1] * 4
    p.warm = True  # first timings trusted (steps made ready before them)
    assert not any(p.scores(a) for a in seq)  # nothing timed
    for arm in range(3):
        p.observe(arm, 1, np.zeros(1, int), 1e-3)
    p.observe(2, 1, np.zeros(1, int), 1e-3, chose_s=1e-4)  # a choice's host time in it: no change (timed clean)
    got = [p.scores(a) for a in seq]
    every = lambda n: [i % 3 == 0 for i in range(n)]  # noqa: E731
    want = every(7) + every(4) + every(2) + every(4)
    assert got == want
    q = AdaptivePolicy(make_arms(1, (2, 4)), 1, score_every=3)
    q.warm = True
    q.observe(0, 1, np.zeros(1, int), 1e-3, scored=True)  # timed only with the scoring in it: rough
    assert q.rough[0, 0] and not any(q.scores(0) for _ in range(4))


def test_a_draft_that_accepts_more_than_its_posterior_predicts_is_priced_up():
    """``AdaptivePolicy.bias``: rows that accept every token of G = 4 while the posterior says 0.5 a token give the
    draft a bias > 1 (accepted over predicted, from the posterior before each step, weighted by its evidence),
    which raises its rate; rows that accept nothing give < 1; no steps leave 1; plain decoding's rate never moves."""
    arms = make_arms(1, (4,))
    rates = {}
    for accepted in (4, 0, None):
        p = AdaptivePolicy(arms, 1, discount=1.0)
        p.new_batch(8, tokens=64)
        p.succ[:], p.fail[:] = 50.0, 50.0
        for _ in range(5 if accepted is not None else 0):
            p.observe(1, 8, np.full(8, accepted), 0.01)  # pooled: 100 trials of evidence, a step's weight 100 / 108
            p.succ[:], p.fail[:] = 50.0, 50.0  # the posterior held at 0.5: only the bias moves
        rates[accepted] = (p.bias()[0], p.log_rate(8, p.mean_alpha()))
    assert rates[4][0] > 1.5 and rates[0][0] < 0.7 and rates[None][0] == 1.0
    assert rates[4][1][1] > rates[None][1][1] > rates[0][1][1]
    assert rates[4][1][0] == rates[None][1][0] == rates[0][1][0]
