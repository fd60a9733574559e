"""Bandit simulation: many seeds at once, cumulative pseudo-regret, and the textbook bounds.

A simulation runs ``seeds`` independent bandits in one policy object (``batch=seeds``): each round
every bandit chooses an arm, the environment draws its outcome, the bandit observes it. The
policy code is the one a request uses (``flashspec.bandits``), vectorised over seeds.

Environments (``Environment.reward``):

* ``"bernoulli"``: one trial per pull, success with probability ``means[arm]``; drafted = 1.
* ``"acceptance"``: ``gamma`` token trials per pull, each accepted with probability
  ``means[arm]``; accepted = the number of leading accepted trials, so the reward
  accepted / gamma has expectation ``sum_{i=1..gamma} p^i / gamma``, the arm's mean for regret.

Schedules: at each round listed in ``switch_at`` the means rotate by one arm
(``means <- roll(means, 1)``: the value at arm k moves to arm k+1), the same for every seed.
With means (0.3, 0.7, 0.5) every rotation moves the best value to another arm.

Full information (``free``): the arms listed are scored after every round without being run, as the
n-gram draft can be from the emitted text (HedgeSpec): each such arm not pulled gets its own
independent token trials, censored at the emitted window (the pulled arm's accepted + 1 tokens, the
only text there is to match a proposal against), and the policy hears them through
``Policy.observe_free_batch`` (acceptance statistics only: no step, no cost).

Pseudo-regret: the sum over rounds of the best arm's expected reward at that round minus the
chosen arm's expected reward (no sampling noise from the rewards themselves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .bandits import OBJECTIVES, Policy, expected_accepted

REWARDS = ("bernoulli", "acceptance")


@dataclass(frozen=True)
class Environment:
    means: tuple[float, ...]  # per arm: success / per-token acceptance probability
    reward: str = "bernoulli"  # "bernoulli" | "acceptance"
    gamma: int | tuple[int, ...] = 4  # tokens drafted per pull ("acceptance"); one or per arm
    switch_at: tuple[int, ...] = ()  # rounds at which the means rotate by one arm
    costs: tuple[float, ...] | None = None  # seconds per step per arm (None: 1.0 each)
    objective: str = "acceptance"  # what regret measures: acceptance fraction or tokens/s
    free: tuple[int, ...] = ()  # arms scored after every round without being run (full information)

    def __post_init__(self):
        m = self.means
        f = self.free
        if not isinstance(f, tuple) or not all(isinstance(k, int) and 0 <= k < len(m) for k in f) or len(set(f)) < len(f):
            raise ValueError(f"free={f!r} must be distinct arm indices in [0, {len(m)})")
        if not isinstance(m, tuple) or len(m) < 1 or not all(
            isinstance(x, (int, float)) and 0.0 <= x <= 1.0 for x in m
        ):
            raise ValueError(f"means={m!r} must be a non-empty tuple of probabilities in [0, 1]")
        if self.reward not in REWARDS:
            raise ValueError(f"reward={self.reward!r} must be one of {', '.join(REWARDS)}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} must be one of {', '.join(OBJECTIVES)}")
        g = self.gamma if isinstance(self.gamma, tuple) else (self.gamma,)
        if len(g) not in (1, len(m)) or not all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 64 for x in g
        ):
            raise ValueError(f"gamma={self.gamma!r} must be an integer in [1, 64], or one per arm")
        s = self.switch_at
        if not isinstance(s, tuple) or not all(isinstance(x, int) and x >= 1 for x in s) or any(
            b <= a for a, b in zip(s, s[1:])
        ):
            raise ValueError(f"switch_at={s!r} must be increasing integers >= 1")
        c = self.costs
        if c is not None and (not isinstance(c, (tuple, list)) or len(c) != len(m) or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in c
        )):
            raise ValueError(f"costs={c!r} must be one positive number per arm")

    @property
    def num_arms(self) -> int:
        return len(self.means)

    def gammas(self) -> np.ndarray:
        """Tokens drafted per pull, per arm (1 for Bernoulli arms)."""
        if self.reward == "bernoulli":
            return np.ones(self.num_arms, dtype=np.int64)
        g = self.gamma if isinstance(self.gamma, tuple) else (self.gamma,) * self.num_arms
        return np.array(g, dtype=np.int64)

    def step_costs(self) -> np.ndarray:
        return np.ones(self.num_arms) if self.costs is None else np.array(self.costs, dtype=float)

    def means_table(self, rounds: int) -> np.ndarray:
        """[rounds, K]: each arm's success probability at each round."""
        segment = np.searchsorted(np.array(self.switch_at, dtype=np.int64), np.arange(rounds),
                                  side="right")
        k = self.num_arms
        index = (np.arange(k)[None, :] - segment[:, None]) % k
        return np.array(self.means, dtype=np.float64)[index]

    def values(self, probs: np.ndarray) -> np.ndarray:
        """Expected objective value of each arm given its success probabilities (same shape)."""
        g = self.gammas()
        accepted = expected_accepted(probs, g)
        if self.objective == "acceptance":
            return accepted / g
        return (1.0 + accepted) / self.step_costs()

    def pull(self, arms: np.ndarray, probs: np.ndarray, uniforms: np.ndarray):
        """Outcomes of pulling ``arms`` [S] at success probabilities ``probs`` [K], from
        ``uniforms`` [S, max gamma]: (drafted, accepted, seconds), each [S]."""
        drafted = self.gammas()[arms]
        trials = uniforms < probs[arms][:, None]
        trials &= np.arange(uniforms.shape[1])[None, :] < drafted[:, None]
        accepted = np.cumprod(trials, axis=1).sum(axis=1)
        return drafted, accepted, self.step_costs()[arms]

    def score_free(self, arm: int, pulled: np.ndarray, emitted: np.ndarray, probs: np.ndarray,
                   uniforms: np.ndarray):
        """Full-information outcome of ``arm`` for bandits that pulled ``pulled`` [S] and emitted ``emitted``
        [S] tokens: (drafted, accepted) [S], drafted = the scored window min(G_arm, emitted), 0 where
        ``arm`` itself was pulled."""
        window = np.where(pulled == arm, 0, np.minimum(self.gammas()[arm], emitted))
        trials = (uniforms < probs[arm]) & (np.arange(uniforms.shape[1])[None, :] < window[:, None])
        return window, np.cumprod(trials, axis=1).sum(axis=1)


@dataclass(frozen=True)
class SimResult:
    name: str
    regret: np.ndarray  # [S] cumulative pseudo-regret at the last round, per seed
    curve_mean: np.ndarray  # [T] mean over seeds of the cumulative pseudo-regret
    curve_std: np.ndarray  # [T] its standard deviation over seeds
    best_fraction: float  # mean fraction of rounds spent on a best arm

    def summary(self) -> dict:
        return {
            "mean_regret": float(self.regret.mean()),
            "std_regret": float(self.regret.std(ddof=1)) if self.regret.size > 1 else 0.0,
            "median_regret": float(np.median(self.regret)),
            "p90_regret": float(np.percentile(self.regret, 90)),
            "best_arm_fraction": self.best_fraction,
        }


MakePolicy = Callable[[int, object], Policy]  # (batch, rng) -> policy with that batch


def simulate(make_policy: MakePolicy, env: Environment, rounds: int, seeds: int, seed: int = 0,
             name: str | None = None) -> SimResult:
    """Run ``seeds`` independent bandits for ``rounds`` rounds; the policy and the environment
    draw from separate generators derived from ``seed``."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r} must be an integer >= 1")
    policy = make_policy(seeds, np.random.default_rng([seed, 1]))
    env_rng = np.random.default_rng([seed, 0])
    free_rng = np.random.default_rng([seed, 2])  # its own stream: the pulled arms' outcomes stay those without it
    probs = env.means_table(rounds)
    width = int(env.gammas().max())
    chosen = np.empty((rounds, seeds), dtype=np.int64)
    for t in range(rounds):
        arms = policy.choose_batch()
        outcome = env.pull(arms, probs[t], env_rng.random((seeds, width)))
        policy.observe_batch(arms, *outcome)
        for k in env.free:
            drafted, accepted = env.score_free(k, arms, outcome[1] + 1, probs[t], free_rng.random((seeds, width)))
            policy.observe_free_batch(np.full(seeds, k), drafted, accepted)
        chosen[t] = arms
    return score(name or policy.name, env, probs, chosen)


def score(name: str, env: Environment, probs: np.ndarray, chosen: np.ndarray) -> SimResult:
    """Pseudo-regret of the arms ``chosen`` [T, S] under per-round probabilities ``probs`` [T, K]."""
    values = env.values(probs)
    best = values.max(axis=1, keepdims=True)
    lost = best - np.take_along_axis(values, chosen, axis=1)
    cumulative = np.cumsum(lost, axis=0)
    on_best = np.take_along_axis(values, chosen, axis=1) >= best - 1e-12
    return SimResult(
        name=name,
        regret=cumulative[-1],
        curve_mean=cumulative.mean(axis=1),
        curve_std=cumulative.std(axis=1),
        best_fraction=float(on_best.mean()),
    )


def switch_every(period: int, rounds: int) -> tuple[int, ...]:
    """Switch times period, 2 period, ... before ``rounds``."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError(f"period={period!r} must be an integer >= 1")
    return tuple(range(period, rounds, period))


def sqrt_kt_log_t(num_arms: int, rounds: int) -> float:
    """sqrt(K T ln T): the write-up's "theoretical bound" (about 526 for K = 3, T = 10,000).
    It is the order of the minimax (problem-independent) regret of UCB1 up to constants, not a
    bound for any particular means."""
    return math.sqrt(num_arms * rounds * math.log(rounds))


def ucb1_bound(values, rounds: int) -> float:
    """Auer, Cesa-Bianchi and Fischer (2002), Theorem 1: the expected regret of UCB1 after n
    rounds is at most sum_{i: Delta_i > 0} 8 ln n / Delta_i + (1 + pi^2 / 3) sum_i Delta_i,
    for rewards in [0, 1] with means ``values`` (about 555 for 0.3, 0.7, 0.5 and n = 10,000)."""
    values = np.asarray(values, dtype=np.float64)
    gaps = values.max() - values
    gaps = gaps[gaps > 0]
    return float(np.sum(8.0 * math.log(rounds) / gaps) + (1.0 + math.pi**2 / 3.0) * gaps.sum())


def bounds(env: Environment, rounds: int) -> dict:
    """The bound values printed beside the results (the UCB1 one only for stationary means)."""
    stationary = not any(t < rounds for t in env.switch_at)
    auer = ucb1_bound(env.values(np.array(env.means)), rounds) if stationary else None
    if env.objective == "throughput":
        auer = None  # Theorem 1 needs rewards in [0, 1]; tokens per second are not
    return {"sqrt_k_t_ln_t": sqrt_kt_log_t(env.num_arms, rounds), "ucb1_auer2002_thm1": auer}
