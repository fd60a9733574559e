"""The bandit simulator, the bounds, and the headline regret numbers (200 seeds x 10,000 rounds)."""

import math

import numpy as np
import pytest

from flashspec.bandits import POLICIES, BanditConfig
from flashspec.simulate import (Environment, bounds, score, simulate, sqrt_kt_log_t, switch_every,
                                ucb1_bound)

MEANS = (0.3, 0.7, 0.5)
T, S, K = 10_000, 200, 3
STATIONARY = Environment(MEANS)
ACCEPTANCE = Environment(MEANS, reward="acceptance", gamma=4)
PIECEWISE = Environment(MEANS, switch_at=switch_every(2000, T))


def mean_regret(name, env, config=BanditConfig(), rounds=T, seeds=S, seed=0):
    make = POLICIES[name]
    result = simulate(lambda b, rng: make(K, config, rng=rng, batch=b), env, rounds, seeds, seed)
    return float(result.regret.mean())


# --- the headline numbers --------------------------------------------------------------------

def test_ucb1_regret_matches_the_write_up():
    assert 95 <= mean_regret("ucb1", STATIONARY) <= 107


def test_thompson_regret():
    assert mean_regret("thompson", STATIONARY) <= 22


def test_token_thompson_on_acceptance_fraction():
    token = mean_regret("thompson-token", ACCEPTANCE)
    assert token <= 13
    assert token < mean_regret("thompson", ACCEPTANCE)  # the token likelihood uses more of each step


def test_change_detection_on_piecewise_and_stationary():
    assert mean_regret("cd-thompson", PIECEWISE) <= 170
    assert mean_regret("cd-thompson", STATIONARY) <= 25
    # the scenario is hard for a stationary policy: plain Thompson stays on a stale arm
    assert mean_regret("thompson", PIECEWISE) > 500


# --- the environment -------------------------------------------------------------------------

def test_means_rotate_at_the_switches():
    env = Environment((0.1, 0.2, 0.3), switch_at=(2, 4))
    table = env.means_table(6)
    np.testing.assert_array_equal(table, [[0.1, 0.2, 0.3]] * 2 + [[0.3, 0.1, 0.2]] * 2
                                  + [[0.2, 0.3, 0.1]] * 2)
    assert switch_every(2000, 10_000) == (2000, 4000, 6000, 8000)


def test_pull_counts_leading_acceptances():
    env = Environment((0.5, 0.5), reward="acceptance", gamma=(4, 2))
    u = np.array([[0.1, 0.9, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.1]])
    drafted, accepted, seconds = env.pull(np.array([0, 0, 1]), np.array([0.5, 0.5]), u)
    assert drafted.tolist() == [4, 4, 2]
    assert accepted.tolist() == [1, 4, 2]  # the third pull drafts only 2
    assert seconds.tolist() == [1.0, 1.0, 1.0]


def test_acceptance_rewards_have_the_expected_mean():
    env = ACCEPTANCE
    rng = np.random.default_rng(0)
    n = 200_000
    arms = np.repeat(np.arange(3), n // 3 + 1)[:n]
    drafted, accepted, _ = env.pull(arms, np.array(MEANS), rng.random((n, 4)))
    observed = np.array([np.mean(accepted[arms == k] / 4) for k in range(3)])
    np.testing.assert_allclose(observed, env.values(np.array(MEANS)), atol=0.004)


def test_score_is_the_pseudo_regret_of_the_choices():
    env = Environment((0.2, 0.6), switch_at=(2,))
    chosen = np.array([[0, 1], [1, 1], [1, 0]])  # 3 rounds x 2 seeds
    result = score("x", env, env.means_table(3), chosen)
    # round 0: best 0.6 -> seed 0 loses 0.4; round 2: means (0.6, 0.2) -> seed 0 loses 0.4
    np.testing.assert_allclose(result.regret, [0.8, 0.0])
    np.testing.assert_allclose(result.curve_mean, [0.2, 0.2, 0.4])


def test_fixed_arms_have_linear_regret():
    for arm, per_round in ((1, 0.0), (0, 0.4)):
        regret = mean_regret("fixed", STATIONARY, BanditConfig(fixed_arm=arm), rounds=500, seeds=3)
        assert regret == pytest.approx(500 * per_round)


def test_simulation_is_reproducible_and_seeded():
    a = mean_regret("thompson", STATIONARY, rounds=300, seeds=20, seed=1)
    b = mean_regret("thompson", STATIONARY, rounds=300, seeds=20, seed=1)
    c = mean_regret("thompson", STATIONARY, rounds=300, seeds=20, seed=2)
    assert a == b and a != c


@pytest.mark.parametrize("kwargs,field", [
    (dict(means=(0.3, 1.2)), "means"), (dict(means=[0.3]), "means"), (dict(means=()), "means"),
    (dict(means=MEANS, reward="gauss"), "reward"), (dict(means=MEANS, gamma=0), "gamma"),
    (dict(means=MEANS, gamma=(4, 4)), "gamma"), (dict(means=MEANS, switch_at=(5, 3)), "switch_at"),
    (dict(means=MEANS, costs=(1.0, 0.0, 1.0)), "costs"), (dict(means=MEANS, objective="x"), "objective"),
])
def test_environment_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Environment(**kwargs)


# --- the bounds --------------------------------------------------------------------------------

def test_bounds_for_the_write_up_setting():
    assert sqrt_kt_log_t(3, 10_000) == pytest.approx(525.65, abs=0.01)
    by_hand = 8 * math.log(1e4) / 0.4 + 8 * math.log(1e4) / 0.2 + (1 + math.pi**2 / 3) * 0.6
    assert ucb1_bound(MEANS, 10_000) == pytest.approx(by_hand)
    assert 550 < by_hand < 560
    assert bounds(STATIONARY, T)["ucb1_auer2002_thm1"] == pytest.approx(by_hand)
    assert bounds(PIECEWISE, T)["ucb1_auer2002_thm1"] is None


def test_ucb1_stays_below_its_bound():
    for env in (STATIONARY, ACCEPTANCE):
        regret = mean_regret("ucb1", env, rounds=2000, seeds=50)
        assert regret < bounds(env, 2000)["ucb1_auer2002_thm1"]
