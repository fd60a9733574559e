"""Full-information updates (HedgeSpec): arms scored without being run (``Policy.observe_free_batch``)
and the simulator's ``Environment.free``; the regret they save is in benchmarks/results/bandit_piecewise-free-*.json."""

import numpy as np
import pytest

from flashspec.bandits import POLICIES, BanditConfig, Thompson
from flashspec.cli import main
from flashspec.simulate import Environment, simulate, switch_every

MEANS = (0.3, 0.7, 0.5)


def mean_regret(name, env, rounds, seeds, config=BanditConfig()):
    make = POLICIES[name]
    return float(simulate(lambda b, rng: make(3, config, rng=rng, batch=b), env, rounds, seeds, 0).regret.mean())


def test_token_posterior_takes_a_censored_window():
    """A scored window of d tokens with a leading matches: a += a, b += 1 only if a < d (a window that ends
    without a mismatch says nothing about the next token); pulls and costs are not touched."""
    p = Thompson(2, BanditConfig(likelihood="token"), batch=3)
    p.observe_free_batch(np.array([1, 1, 0]), np.array([3, 2, 0]), np.array([1, 2, 0]))
    a, b = p.posterior()
    np.testing.assert_array_equal(a, [[1, 2], [1, 3], [1, 1]])
    np.testing.assert_array_equal(b, [[1, 2], [1, 1], [1, 1]])
    assert not p._pulls.any() and not p._seconds.any()


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_takes_free_observations(name):
    p = POLICIES[name](3, BanditConfig(), rng=1, batch=2)
    arms = p.choose_batch()
    p.observe_batch(arms, np.array([4, 4]), np.array([2, 0]), np.array([0.1, 0.1]))
    p.observe_free_batch(np.array([2, 2]), np.array([3, 0]), np.array([3, 0]))
    assert p.choose_batch().shape == (2,)


def test_free_observations_reject_bad_input():
    p = Thompson(3, BanditConfig(), batch=2)
    for arms, drafted, accepted in (([0, 3], [1, 1], [0, 0]), ([0, 1], [1, 1], [2, 0]), ([0, 1], [-1, 1], [0, 0]),
                                    ([0], [1], [0]), ([0.0, 1.0], [1, 1], [0, 0])):
        with pytest.raises(ValueError):
            p.observe_free_batch(np.array(arms), np.array(drafted), np.array(accepted))
    with pytest.raises(ValueError, match="free"):
        Environment(MEANS, free=(3,))
    with pytest.raises(ValueError, match="free"):
        Environment(MEANS, free=(0, 0))


def test_scored_window_is_the_emitted_text():
    env = Environment((0.5, 0.9), reward="acceptance", gamma=4)
    u = np.full((3, 4), 0.1)
    drafted, accepted = env.score_free(1, np.array([0, 1, 0]), np.array([2, 5, 5]), np.array([0.5, 0.9]), u)
    np.testing.assert_array_equal(drafted, [2, 0, 4])  # min(G, emitted); 0 where the arm itself was pulled
    np.testing.assert_array_equal(accepted, [2, 0, 4])


def test_full_information_lowers_stationary_regret():
    plain, free = Environment(MEANS), Environment(MEANS, free=(0, 1, 2))
    for name in ("ucb1", "thompson"):
        assert mean_regret(name, free, 1000, 20) < 0.5 * mean_regret(name, plain, 1000, 20)


def test_full_information_helps_change_detection_on_piecewise():
    plain = Environment(MEANS, switch_at=switch_every(500, 2000))
    free = Environment(MEANS, switch_at=switch_every(500, 2000), free=(0, 1, 2))
    assert mean_regret("cd-thompson", free, 2000, 20) < 0.8 * mean_regret("cd-thompson", plain, 2000, 20)


def test_bandit_sim_free_option(capsys):
    assert main(["bandit-sim", "--policy", "ucb1", "--rounds", "50", "--seeds", "2", "--free", "0,2", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"free": [\n      0,\n      2\n    ]' in out
