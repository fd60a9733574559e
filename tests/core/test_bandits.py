"""Draft-selection policies: validation, the past-only interface, posteriors, batching, objectives."""

import inspect
import math

import numpy as np
import pytest

from flashspec.bandits import (POLICIES, BanditConfig, ChangeDetectThompson, DiscountedThompson,
                               FixedArm, Policy, Thompson, UCB1, check_fraction, expected_accepted)
from flashspec.simulate import Environment, simulate

CLASSES = [UCB1, Thompson, DiscountedThompson, ChangeDetectThompson, FixedArm]


# --- configuration and input validation ------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("objective", "speed"), ("likelihood", "poisson"), ("restart", "none"),
    ("prior_a", 0.0), ("prior_b", -1.0), ("prior_a", math.nan), ("cd_delta", 0.0),
    ("cd_threshold", math.inf), ("discount", 0.0), ("discount", 1.5), ("discount", math.nan),
    ("gamma", 0), ("gamma", 2.0), ("cd_warmup", 0), ("fixed_arm", -1), ("fixed_arm", True),
    ("per_request", 1),
])
def test_config_rejects_bad_fields_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        BanditConfig(**{field: value})


def test_config_is_frozen():
    with pytest.raises(Exception):
        BanditConfig().discount = 0.5


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("args,name", [
    ((3, 4, 2, 0.01), "arm"), ((-1, 4, 2, 0.01), "arm"), ((True, 4, 2, 0.01), "arm"),
    ((1.0, 4, 2, 0.01), "arm"), ((0, 2, 3, 0.01), "accepted"), ((0, 0, 0, 0.01), "drafted"),
    ((0, 4.0, 2, 0.01), "drafted"), ((0, math.nan, 2, 0.01), "drafted"),
    ((0, 4, -1, 0.01), "accepted"), ((0, 4, 2, -0.5), "seconds"), ((0, 4, 2, math.nan), "seconds"),
    ((0, 4, 2, math.inf), "seconds"), ((0, 4, 2, "1"), "seconds"),
])
def test_observe_rejects_bad_input_by_name(cls, args, name):
    policy = cls(3, rng=0)
    with pytest.raises(ValueError, match=name):
        policy.observe(*args)


def test_throughput_objective_needs_a_positive_cost():
    policy = Thompson(2, BanditConfig(objective="throughput"), rng=0)
    with pytest.raises(ValueError, match="seconds"):
        policy.observe(0, 4, 2, 0.0)


def test_batch_calls_reject_bad_arrays():
    policy = Thompson(3, rng=0, batch=2)
    good = dict(arms=[0, 1], drafted=[4, 4], accepted=[1, 2], seconds=[0.1, 0.1])
    policy.observe_batch(**good)
    for key, bad in [("arms", [0, 3]), ("arms", [0.0, 1.0]), ("drafted", [0, 4]),
                     ("accepted", [5, 0]), ("seconds", [np.nan, 0.1]), ("arms", [0])]:
        with pytest.raises(ValueError, match=key):
            policy.observe_batch(**{**good, key: bad})
    with pytest.raises(ValueError, match="batch=1"):
        policy.choose()


# --- the past-only interface (exactness) -----------------------------------------------------

@pytest.mark.parametrize("name", list(POLICIES))
def test_choose_takes_no_arguments(name):
    policy = POLICIES[name](3, BanditConfig(), rng=0)
    assert list(inspect.signature(policy.choose).parameters) == []


@pytest.mark.parametrize("name", list(POLICIES))
def test_choice_depends_only_on_the_past(name):
    """Two runs share everything up to step 30, then see different outcomes: the choices up to
    and including step 31 (made before any differing outcome was observed) are identical."""

    def run(outcomes):
        policy = POLICIES[name](3, BanditConfig(), rng=5)
        arms = []
        for accepted in outcomes:
            arm = policy.choose()
            arms.append(arm)
            policy.observe(arm, 4, int(accepted), 0.01)
        return arms

    rng = np.random.default_rng(1)
    shared = rng.integers(0, 5, 31)
    a = run(np.concatenate([shared, np.zeros(30, int)]))
    b = run(np.concatenate([shared, np.full(30, 4)]))
    assert a[:32] == b[:32]


def test_late_observations_are_accepted():
    policy = Thompson(3, BanditConfig(likelihood="token"), rng=0)
    first, second = policy.choose(), policy.choose()  # the loop reads step t during step t+1
    policy.observe(first, 4, 3, 0.01)
    policy.observe(second, 4, 1, 0.01)
    a, b = policy.posterior()
    assert a.sum() == 3 + 3 + 1 and b.sum() == 3 + 1 + 1


def test_policies_use_only_their_own_generator():
    np.random.seed(123)
    state = np.random.get_state()[1].copy()
    choices = []
    for _ in range(2):
        policy = Thompson(3, rng=np.random.default_rng(9))
        run = []
        for _ in range(50):
            arm = policy.choose()
            policy.observe(arm, 4, 2, 0.01)
            run.append(arm)
        choices.append(run)
    assert choices[0] == choices[1]
    assert np.array_equal(np.random.get_state()[1], state)


# --- the guard against counts fed as fractions -----------------------------------------------

def test_check_fraction_rejects_counts():
    check_fraction(np.array([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="reward"):
        check_fraction(np.array([0.25, 3.0]))
    with pytest.raises(ValueError, match="reward"):
        check_fraction(np.array([np.nan]))


def counts_mutant(cls, scale=1.0):
    """A broken policy: feeds the accepted count (divided by ``scale``) where a fraction is expected."""

    class Mutant(cls):
        name = f"counts-{cls.name}"

        def _reward(self, drafted, accepted):
            return accepted / scale

    return Mutant


@pytest.mark.parametrize("cls", [UCB1, Thompson, DiscountedThompson, ChangeDetectThompson])
def test_raw_counts_are_rejected(cls):
    policy = counts_mutant(cls)(3, rng=0)
    policy.observe(0, 4, 1, 0.01)  # 1 happens to be in [0, 1]
    with pytest.raises(ValueError, match="reward"):
        policy.observe(1, 4, 3, 0.01)


@pytest.mark.parametrize("cls", [UCB1, Thompson])
def test_counts_scaled_into_range_are_caught_by_regret(cls):
    """Counts divided by the largest gamma pass the range check but rank arms by tokens accepted,
    not by acceptance fraction: with a G = 1 draft at 0.9 and a G = 8 draft at 0.6 per token, the
    mutant prefers the wrong arm, which the regret check below detects (and the real policy passes)."""
    env = Environment((0.9, 0.6), reward="acceptance", gamma=(1, 8))

    def best_fraction(policy_cls):
        result = simulate(lambda b, rng: policy_cls(2, rng=rng, batch=b), env, 2000, 40, seed=3)
        return result.best_fraction

    assert best_fraction(cls) > 0.9
    assert best_fraction(counts_mutant(cls, scale=8.0)) < 0.5


# --- posteriors and values -------------------------------------------------------------------

def test_expected_accepted_is_the_truncated_geometric_mean():
    for alpha in (0.0, 0.3, 0.7, 0.999999, 1.0):
        for g in (1, 2, 4, 9):
            assert expected_accepted(alpha, g) == pytest.approx(sum(alpha**i for i in range(1, g + 1)))


def test_token_posterior_is_the_exact_bayes_update():
    """Beta(a, b) after the token update equals prior x prod alpha^n (1 - alpha)^[n < G], on a grid."""
    policy = Thompson(1, BanditConfig(likelihood="token", prior_a=2.0, prior_b=3.0), rng=0)
    steps = [(4, 4), (4, 0), (4, 2), (3, 3), (6, 5), (4, 1)]
    for drafted, accepted in steps:
        policy.observe(0, drafted, accepted, 0.01)
    a, b = (float(x[0, 0]) for x in policy.posterior())
    grid = np.linspace(1e-4, 1 - 1e-4, 20001)
    log_post = (2.0 - 1) * np.log(grid) + (3.0 - 1) * np.log1p(-grid)
    for drafted, accepted in steps:
        log_post += accepted * np.log(grid) + (accepted < drafted) * np.log1p(-grid)
    log_beta = (a - 1) * np.log(grid) + (b - 1) * np.log1p(-grid)
    difference = log_post - log_beta
    assert np.ptp(difference) < 1e-9  # proportional densities


def test_token_posterior_concentrates_on_the_per_token_rate():
    rng = np.random.default_rng(0)
    policy = Thompson(1, BanditConfig(likelihood="token"), rng=0)
    for _ in range(4000):
        accepted = int(np.cumprod(rng.random(4) < 0.6).sum())
        policy.observe(0, 4, accepted, 0.01)
    a, b = policy.posterior()
    assert float((a / (a + b))[0, 0]) == pytest.approx(0.6, abs=0.015)


def test_ucb1_plays_each_arm_once_then_the_index():
    policy = UCB1(3, rng=0)
    first = []
    for reward in (0, 1, 0):
        arm = policy.choose()
        first.append(arm)
        policy.observe(arm, 1, reward, 0.01)
    assert first == [0, 1, 2]
    # index: mean + sqrt(2 ln 3 / 1): arm 1 (mean 1) wins
    assert policy.choose() == 1


def test_discount_one_is_plain_thompson():
    def run(cls):
        policy = cls(3, BanditConfig(discount=1.0), rng=4)
        out = []
        for t in range(200):
            arm = policy.choose()
            policy.observe(arm, 4, (t * 7 + arm) % 5, 0.01)
            out.append(arm)
        return out, policy.posterior()

    (a, pa), (b, pb) = run(Thompson), run(DiscountedThompson)
    assert a == b and np.array_equal(pa[0], pb[0]) and np.array_equal(pa[1], pb[1])


def test_discount_forgets_old_observations():
    policy = DiscountedThompson(2, BanditConfig(discount=0.9), rng=0)
    policy.observe(0, 1, 1, 0.0)
    for _ in range(100):
        policy.observe(1, 1, 0, 0.0)
    a, b = policy.posterior()
    assert a[0, 0] - 1.0 < 1e-4  # arm 0's success has faded


def test_change_detection_restarts_on_a_drop_and_not_when_stationary():
    rng = np.random.default_rng(2)
    quiet = ChangeDetectThompson(1, rng=0)
    for _ in range(3000):
        quiet.observe(0, 1, int(rng.random() < 0.7), 0.01)
    assert quiet.alarms[0] == 0
    noisy = ChangeDetectThompson(2, rng=0)
    for t in range(1000):
        noisy.observe(0, 1, int(rng.random() < (0.7 if t < 500 else 0.3)), 0.01)
    assert noisy.alarms[0] >= 1
    a, b = noisy.posterior()
    assert a[0, 0] + b[0, 0] < 2 + 500  # restarted after the change


def test_arm_restart_keeps_the_other_arms():
    policy = ChangeDetectThompson(2, BanditConfig(restart="arm"), rng=0)
    for _ in range(50):
        policy.observe(1, 1, 1, 0.01)
    for t in range(400):
        policy.observe(0, 1, int(t < 200), 0.01)
    assert policy.alarms[0] >= 1
    a, b = policy.posterior()
    assert a[0, 1] + b[0, 1] >= 50  # arm 1 untouched


def test_begin_request_resets_only_per_request_state():
    for per_request, expected in ((True, 0.0), (False, 10.0)):
        policy = Thompson(2, BanditConfig(per_request=per_request, likelihood="token"), rng=0)
        for _ in range(10):
            policy.observe(0, 1, 1, 0.01)
        policy.begin_request()
        assert policy.posterior()[0][0, 0] - 1.0 == expected


def test_fixed_arm():
    policy = FixedArm(3, BanditConfig(fixed_arm=2), rng=0)
    for _ in range(5):
        assert policy.choose() == 2
        policy.observe(2, 4, 4, 0.01)
    with pytest.raises(ValueError, match="fixed_arm"):
        FixedArm(2, BanditConfig(fixed_arm=2))


def test_throughput_prefers_the_cheap_draft():
    """Per-token 0.8 at 1.0 s/step (3.36 tokens/s) vs 0.6 at 0.5 s/step (4.61 tokens/s)."""
    env = Environment((0.8, 0.6), reward="acceptance", gamma=4, costs=(1.0, 0.5),
                      objective="throughput")
    picks = {}
    for objective in ("acceptance", "throughput"):
        config = BanditConfig(objective=objective, likelihood="token")
        result = simulate(lambda b, rng: Thompson(2, config, rng=rng, batch=b), env, 2000, 40)
        picks[objective] = result.best_fraction
    assert picks["throughput"] > 0.95
    assert picks["acceptance"] < 0.1


# --- batched and single policies are the same algorithm --------------------------------------

class PerRowGenerators:
    """Draws row i of every batched request from generator i, as S single policies would."""

    def __init__(self, seeds):
        self.gens = [np.random.default_rng(s) for s in seeds]

    def beta(self, a, b):
        return np.stack([g.beta(a[i], b[i]) for i, g in enumerate(self.gens)])

    def random(self, size):
        assert size == len(self.gens)
        return np.array([g.random(1)[0] for g in self.gens])


@pytest.mark.parametrize("name,config,costs", [
    ("ucb1", BanditConfig(), None),
    ("thompson", BanditConfig(), None),
    ("thompson-token", BanditConfig(), None),
    ("discounted-thompson", BanditConfig(discount=0.95), None),
    ("cd-thompson", BanditConfig(cd_threshold=3.0, cd_warmup=5), None),
    ("cd-thompson", BanditConfig(cd_threshold=3.0, cd_warmup=5, restart="arm"), None),
    ("thompson-token", BanditConfig(objective="throughput"), (1.0, 0.4, 0.7)),
    ("ucb1", BanditConfig(objective="throughput"), (1.0, 0.4, 0.7)),
    ("fixed", BanditConfig(fixed_arm=1), None),
])
def test_batched_policy_matches_single_policies(name, config, costs):
    seeds, rounds = (11, 12, 13), 400
    env = Environment((0.3, 0.7, 0.5), reward="acceptance", gamma=4, switch_at=(100, 250),
                      costs=costs, objective=config.objective)
    uniforms = np.random.default_rng(0).random((rounds, len(seeds), 4))
    probs = env.means_table(rounds)
    make = POLICIES[name]
    batched = make(3, config, rng=PerRowGenerators(seeds), batch=len(seeds))
    singles = [make(3, config, rng=np.random.default_rng(s)) for s in seeds]
    for t in range(rounds):
        arms = batched.choose_batch()
        single_arms = [p.choose() for p in singles]
        assert arms.tolist() == single_arms, f"round {t}"
        drafted, accepted, seconds = env.pull(arms, probs[t], uniforms[t])
        batched.observe_batch(arms, drafted, accepted, seconds)
        for i, p in enumerate(singles):
            p.observe(single_arms[i], int(drafted[i]), int(accepted[i]), float(seconds[i]))
    if isinstance(batched, Thompson):
        for i, p in enumerate(singles):
            np.testing.assert_array_equal(batched.posterior()[0][i], p.posterior()[0][0])
            np.testing.assert_array_equal(batched.posterior()[1][i], p.posterior()[1][0])
    if isinstance(batched, ChangeDetectThompson):
        assert batched.alarms.sum() > 0  # the restart path was exercised
        assert batched.alarms.tolist() == [int(p.alarms[0]) for p in singles]


def test_policy_is_a_policy():
    for make in POLICIES.values():
        assert isinstance(make(2, BanditConfig(), rng=0), Policy)
