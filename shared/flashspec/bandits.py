"""Online draft selection: which draft (arm) to run for the next speculative step.

A policy is used in two calls per step::

    arm = policy.choose()                               # before the step: sees only the past
    policy.observe(arm, drafted, accepted, seconds)     # after it: the step's outcome

``choose`` takes no arguments, so a policy cannot see the current step's draft tokens or their
fate; exactness of speculative decoding only needs the choice to be fixed before the step's
verification randomness is drawn. Observations may arrive late (the loop reads the accepted counts
one step after the device produced them): ``choose`` may be called again before the previous
``observe``. Policies draw their own randomness from their own ``numpy.random.Generator``, never
from the verifier's counter-based streams.

Every policy holds ``batch`` independent bandits (state arrays of shape ``[batch, num_arms]``).
One request uses ``batch=1`` and the scalar calls ``choose``/``observe``; the simulator runs one
bandit per seed through ``choose_batch``/``observe_batch``: the same code, so the same algorithm.

Rewards. ``observe`` takes counts; the policy turns them into the acceptance fraction
``accepted / drafted`` itself and every posterior update re-checks that it is in [0, 1], so a
count can never be fed where a fraction is expected (a bug class of other implementations).

Objectives (``BanditConfig.objective``):

* ``"acceptance"``: maximise the expected fraction of drafted tokens accepted.
* ``"throughput"``: maximise expected emitted tokens per second, ``E[accepted + 1] / cost``, with
  ``cost`` the arm's mean measured step time: a cheap draft with lower acceptance can win.

Likelihoods of the Thompson family (``BanditConfig.likelihood``):

* ``"bernoulli"``: the reward fraction r is binarised (success with probability r, Agrawal and
  Goyal 2012) and a Beta posterior is kept on the mean reward.
* ``"token"``: a Beta posterior on the per-token acceptance probability alpha. If drafted tokens
  are accepted independently with probability alpha, "n leading tokens accepted out of G" has
  likelihood alpha^n (1 - alpha)^[n < G], a truncated geometric, which is conjugate to the Beta:
  the exact posterior update is ``a += n`` and ``b += 1`` if a token was rejected. This uses all
  G token trials the step revealed instead of one binarised draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np

OBJECTIVES = ("acceptance", "throughput")
LIKELIHOODS = ("bernoulli", "token")
RESTARTS = ("global", "arm")


@dataclass(frozen=True)
class BanditConfig:
    """Settings shared by every policy (each policy reads the fields it needs)."""

    objective: str = "acceptance"  # "acceptance" | "throughput"
    likelihood: str = "bernoulli"  # Thompson family: "bernoulli" | "token"
    prior_a: float = 1.0  # Beta prior pseudo-successes
    prior_b: float = 1.0  # Beta prior pseudo-failures
    gamma: int = 4  # tokens drafted per step, assumed for an arm until it is observed
    discount: float = 0.998  # discounted Thompson: statistics *= discount every step
    cd_delta: float = 0.2  # change detection: Page-Hinkley drift allowance, in reward units
    cd_threshold: float = 6.0  # change detection: alarm when the statistic exceeds this
    cd_warmup: int = 20  # change detection: observations of an arm before it is tested
    restart: str = "global"  # change detection: on alarm forget all arms or only the alarmed one
    fixed_arm: int = 0  # the fixed policy's arm
    per_request: bool = False  # begin_request() resets the state (else shared across requests)

    def __post_init__(self):
        _check_choice("objective", self.objective, OBJECTIVES)
        _check_choice("likelihood", self.likelihood, LIKELIHOODS)
        _check_choice("restart", self.restart, RESTARTS)
        for name in ("prior_a", "prior_b", "cd_delta", "cd_threshold"):
            _check_positive_float(name, getattr(self, name))
        d = self.discount
        if not _is_real(d) or not (0.0 < d <= 1.0):
            raise ValueError(f"discount={d!r} must be a number in (0, 1]")
        _check_int("gamma", self.gamma, low=1)
        _check_int("cd_warmup", self.cd_warmup, low=1)
        _check_int("fixed_arm", self.fixed_arm, low=0)
        if not isinstance(self.per_request, bool):
            raise ValueError(f"per_request={self.per_request!r} must be a bool")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(choices)}")


def _check_positive_float(name, value):
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0")


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")


def expected_accepted(alpha, gamma):
    """E[leading accepted tokens] = sum_{i=1..gamma} alpha^i, for i.i.d. per-token acceptance."""
    alpha = np.asarray(alpha, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        geometric = alpha * -np.expm1(gamma * np.log(alpha)) / (1.0 - alpha)
    geometric = np.where(gamma == 1.0, alpha, geometric)
    return np.where(alpha >= 1.0, gamma, np.where(alpha <= 0.0, 0.0, geometric))


def check_fraction(reward: np.ndarray) -> np.ndarray:
    """The guard against counts fed as fractions: every reward must lie in [0, 1]."""
    reward = np.asarray(reward, dtype=np.float64)
    if not np.all((reward >= 0.0) & (reward <= 1.0)):
        bad = reward[~((reward >= 0.0) & (reward <= 1.0))].ravel()[0]
        raise ValueError(
            f"reward={bad!r} must be a fraction in [0, 1] (accepted / drafted), not a count"
        )
    return reward


class Policy:
    """Base class: validation, per-arm step statistics, the objective, batching."""

    name = "policy"

    def __init__(self, num_arms: int, config: BanditConfig | None = None, *, rng=0, batch: int = 1):
        _check_int("num_arms", num_arms, low=1)
        _check_int("batch", batch, low=1)
        self.num_arms = int(num_arms)
        self.batch = int(batch)
        self.config = BanditConfig() if config is None else config
        if not isinstance(self.config, BanditConfig):
            raise ValueError(f"config={config!r} must be a BanditConfig")
        # An int seeds a fresh Generator; a Generator (or anything with .beta/.random) is used as is.
        self.rng = np.random.default_rng(rng) if isinstance(rng, (int, np.integer)) else rng
        self._rows = np.arange(self.batch)
        self.reset()

    # --- the public calls -------------------------------------------------------------------

    def choose(self) -> int:
        """The arm for the next step, from past observations only."""
        self._require_single("choose")
        return int(self.choose_batch()[0])

    def observe(self, arm, drafted, accepted, seconds) -> None:
        """Record a finished step: arm used, tokens drafted, leading tokens accepted, wall seconds."""
        self._require_single("observe")
        _check_scalar_arm(arm, self.num_arms)
        _check_int("drafted", drafted, low=1)
        _check_int("accepted", accepted, low=0)
        if accepted > drafted:
            raise ValueError(f"accepted={accepted!r} must be <= drafted={drafted!r}")
        _check_seconds(seconds, self.config.objective)
        self.observe_batch(np.array([arm]), np.array([drafted]), np.array([accepted]),
                           np.array([seconds], dtype=np.float64))

    def observe_free_batch(self, arms, drafted, accepted) -> None:
        """Full information (HedgeSpec): what arm ``arms[b]`` would have accepted in bandit b's step just
        observed, scored without running it (a draft whose proposal can be recomputed from the emitted
        text, such as the n-gram lookup). ``drafted[b]`` is the number of its tokens that could be scored
        (the emitted window: 0 = nothing, that bandit is skipped), ``accepted[b]`` its leading matches.
        Updates the acceptance statistics only: step counts and measured costs stay those of pulled arms."""
        arms, drafted, accepted = (np.asarray(x) for x in (arms, drafted, accepted))
        for name, x in (("arms", arms), ("drafted", drafted), ("accepted", accepted)):
            if x.shape != (self.batch,) or x.dtype.kind not in "iu":
                raise ValueError(f"{name} must be integers of shape ({self.batch},), got {x.dtype} {x.shape}")
        if np.any((arms < 0) | (arms >= self.num_arms)):
            raise ValueError(f"arms must be in [0, {self.num_arms})")
        if np.any((drafted < 0) | (accepted < 0) | (accepted > drafted)):
            raise ValueError("free observations need 0 <= accepted <= drafted")
        seen = drafted > 0
        if seen.any():
            self._scored[self._rows[seen], arms[seen]] += 1
            self._update_free(seen, arms, accepted / np.maximum(drafted, 1), drafted, accepted)

    def reset(self) -> None:
        """Forget every observation (the random stream continues)."""
        shape = (self.batch, self.num_arms)
        self._scored = np.zeros(shape)  # full-information observations (not pulls)
        self._pulls = np.zeros(shape)
        self._drafted = np.zeros(shape)
        self._seconds = np.zeros(shape)
        self._reset_state()

    def begin_request(self) -> None:
        """Call at each request boundary: resets iff ``config.per_request``."""
        if self.config.per_request:
            self.reset()

    def choose_batch(self) -> np.ndarray:
        """One arm per bandit, shape [batch]; ties go to the lowest index."""
        return np.argmax(self._values(), axis=1)

    def observe_batch(self, arms, drafted, accepted, seconds) -> None:
        """One observation per bandit (arrays of shape [batch])."""
        arms, drafted, accepted, seconds = self._check_batch(arms, drafted, accepted, seconds)
        cell = (self._rows, arms)
        self._pulls[cell] += 1
        self._drafted[cell] += drafted
        self._seconds[cell] += seconds
        self._update(arms, self._reward(drafted, accepted), drafted, accepted)

    # --- what subclasses provide ------------------------------------------------------------

    def _reset_state(self) -> None:
        pass

    def _values(self) -> np.ndarray:
        raise NotImplementedError

    def _update(self, arms, reward, drafted, accepted) -> None:
        pass

    def _update_free(self, seen, arms, reward, drafted, accepted) -> None:
        """A full-information observation for the bandits where ``seen`` [batch] is set."""
        raise NotImplementedError(f"policy {self.name!r} does not take full-information observations")

    def _reward(self, drafted, accepted) -> np.ndarray:
        return accepted / drafted

    # --- the objective ----------------------------------------------------------------------

    def _mean_drafted(self) -> np.ndarray:
        seen = self._pulls > 0
        return np.where(seen, self._drafted / np.maximum(self._pulls, 1), self.config.gamma)

    def _value_of_fraction(self, theta: np.ndarray) -> np.ndarray:
        """Objective value of an arm whose mean acceptance fraction is theta."""
        if self.config.objective == "acceptance":
            return theta
        return self._per_second(1.0 + self._mean_drafted() * theta)

    def _value_of_alpha(self, alpha: np.ndarray) -> np.ndarray:
        """Objective value of an arm whose per-token acceptance probability is alpha."""
        g = self._mean_drafted()
        accepted = expected_accepted(alpha, g)
        if self.config.objective == "acceptance":
            return accepted / g
        return self._per_second(1.0 + accepted)

    def _per_second(self, emitted: np.ndarray) -> np.ndarray:
        """Emitted tokens per step / mean step cost; an arm without a measured cost is tried first."""
        seen = self._pulls > 0
        cost = self._seconds / np.maximum(self._pulls, 1)
        with np.errstate(divide="ignore"):
            return np.where(seen, emitted / cost, np.inf)

    # --- checks -----------------------------------------------------------------------------

    def _require_single(self, call):
        if self.batch != 1:
            raise ValueError(f"{call}() needs batch=1 (this policy has batch={self.batch}); "
                             f"use {call}_batch()")

    def _check_batch(self, arms, drafted, accepted, seconds):
        arms, drafted, accepted = (np.asarray(x) for x in (arms, drafted, accepted))
        seconds = np.asarray(seconds, dtype=np.float64)
        for name, x in (("arms", arms), ("drafted", drafted), ("accepted", accepted),
                        ("seconds", seconds)):
            if x.shape != (self.batch,):
                raise ValueError(f"{name} has shape {x.shape}, expected ({self.batch},)")
        for name, x in (("arms", arms), ("drafted", drafted), ("accepted", accepted)):
            if x.dtype.kind not in "iu":
                raise ValueError(f"{name} must be integers, got dtype {x.dtype}")
        if np.any((arms < 0) | (arms >= self.num_arms)):
            raise ValueError(f"arms must be in [0, {self.num_arms}), got {arms.min()}..{arms.max()}")
        if np.any(drafted < 1):
            raise ValueError(f"drafted must be >= 1, got {drafted.min()}")
        if np.any((accepted < 0) | (accepted > drafted)):
            raise ValueError("accepted must be in [0, drafted]")
        low = 0.0 if self.config.objective == "acceptance" else np.nextafter(0.0, 1.0)
        if not np.all(np.isfinite(seconds) & (seconds >= low)):
            raise ValueError("seconds must be finite and >= 0 (> 0 for objective='throughput')")
        return arms, drafted, accepted, seconds


def _check_scalar_arm(arm, num_arms):
    if isinstance(arm, bool) or not isinstance(arm, (int, np.integer)) or not 0 <= arm < num_arms:
        raise ValueError(f"arm={arm!r} must be an integer in [0, {num_arms})")


def _check_seconds(seconds, objective):
    if not _is_real(seconds) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
    if objective == "throughput" and seconds == 0:
        raise ValueError("seconds=0 is not a step cost; objective='throughput' needs seconds > 0")


class FixedArm(Policy):
    """Always the same arm (the baseline: no adaptation)."""

    name = "fixed"

    def __init__(self, num_arms, config=None, *, rng=0, batch=1):
        super().__init__(num_arms, config, rng=rng, batch=batch)
        if self.config.fixed_arm >= self.num_arms:
            raise ValueError(f"fixed_arm={self.config.fixed_arm} must be < num_arms={num_arms}")

    def _values(self):
        values = np.zeros((self.batch, self.num_arms))
        values[:, self.config.fixed_arm] = 1.0
        return values

    def _update_free(self, seen, arms, reward, drafted, accepted):
        pass


class UCB1(Policy):
    """UCB1 (Auer, Cesa-Bianchi and Fischer 2002): play each arm once, then the largest
    mean + sqrt(2 ln t / n_k), t the number of observations so far."""

    name = "ucb1"

    def _reset_state(self):
        self._sum = np.zeros((self.batch, self.num_arms))

    def _update(self, arms, reward, drafted, accepted):
        self._sum[self._rows, arms] += check_fraction(reward)

    def _update_free(self, seen, arms, reward, drafted, accepted):
        self._sum[self._rows[seen], arms[seen]] += check_fraction(reward[seen])

    def _values(self):
        n = self._pulls + self._scored  # observations of the arm's reward, pulled or scored
        t = np.maximum(n.sum(axis=1, keepdims=True), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            index = self._sum / n + np.sqrt(2.0 * np.log(t) / n)
        unseen = n == 0
        if self.config.objective == "throughput":  # an optimistic fraction, at most 1
            index = self._value_of_fraction(np.minimum(np.where(unseen, 1.0, index), 1.0))
        return np.where(unseen, np.inf, index)  # (throughput: an arm never pulled has no cost yet: inf)


class Thompson(Policy):
    """Thompson sampling with a Beta posterior per arm (``config.likelihood`` says on what)."""

    name = "thompson"

    def _reset_state(self):
        shape = (self.batch, self.num_arms)
        self._succ = np.zeros(shape)
        self._fail = np.zeros(shape)

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """The Beta parameters (a, b) of every arm, each [batch, num_arms]."""
        c = self.config
        return c.prior_a + self._succ, c.prior_b + self._fail

    def _values(self):
        c = self.config
        theta = self.rng.beta(c.prior_a + self._succ, c.prior_b + self._fail)
        if c.likelihood == "token":
            return self._value_of_alpha(theta)
        return self._value_of_fraction(theta)

    def _update(self, arms, reward, drafted, accepted):
        self._discount()
        self._add(np.ones(self.batch, bool), arms, reward, drafted, accepted)

    def _update_free(self, seen, arms, reward, drafted, accepted):  # the step's discount is already applied
        self._add(seen, arms, reward, drafted, accepted)

    def _add(self, seen, arms, reward, drafted, accepted):
        """Posterior update of bandits ``seen`` [batch]; "token": ``drafted`` tokens were scored, so a
        window that ends without a rejection (a censored full-information one) adds no failure."""
        reward = check_fraction(reward)
        if self.config.likelihood == "token":
            success, failure = accepted, (accepted < drafted)
        else:
            success = self.rng.random(self.batch) < reward  # Bernoulli(r): exact for r in {0, 1}
            failure = ~success
        cell = (self._rows[seen], arms[seen])
        self._succ[cell] += success[seen]
        self._fail[cell] += failure[seen]

    def _discount(self):
        pass


class DiscountedThompson(Thompson):
    """Discounted Thompson sampling (Raj and Kalyani 2017): before each update every arm's
    statistics are multiplied by ``config.discount``, so old observations fade (memory about
    1 / (1 - discount) steps)."""

    name = "discounted-thompson"

    def _discount(self):
        self._succ *= self.config.discount
        self._fail *= self.config.discount


class ChangeDetectThompson(Thompson):
    """Thompson sampling restarted by a per-arm two-sided Page-Hinkley test on the reward.

    For the pulled arm, with m the mean of its earlier rewards since the last restart::

        up   = max(0, up   + (r - m - delta))      # drift upward
        down = max(0, down + (m - r - delta))      # drift downward

    (the recursive form of Page-Hinkley: the cumulative sum minus its running extremum). After
    ``cd_warmup`` observations of the arm, ``max(up, down) > cd_threshold`` raises an alarm and
    the posterior and detectors restart: all arms (``restart="global"``, suited to a change of
    prompt domain, which moves every draft) or the alarmed arm only (``restart="arm"``).
    """

    name = "cd-thompson"

    def _reset_state(self):
        super()._reset_state()
        shape = (self.batch, self.num_arms)
        self._det_n = np.zeros(shape)
        self._det_mean = np.zeros(shape)
        self._det_up = np.zeros(shape)
        self._det_down = np.zeros(shape)
        self.alarms = np.zeros(self.batch, dtype=np.int64)  # restarts so far, per bandit

    def _update(self, arms, reward, drafted, accepted):
        super()._update(arms, reward, drafted, accepted)
        self._restart(self._detect(np.ones(self.batch, bool), arms, reward), arms)

    def _update_free(self, seen, arms, reward, drafted, accepted):
        super()._update_free(seen, arms, reward, drafted, accepted)
        self._restart(self._detect(seen, arms, reward), arms)

    def _detect(self, seen, arms, reward) -> np.ndarray:
        """Feed each bandit's reward to its arm's detector (bandits ``seen`` [batch] only); True where it alarms."""
        c, cell = self.config, (self._rows, arms)
        n, mean = self._det_n[cell], self._det_mean[cell]
        tested = n >= c.cd_warmup
        up = np.where(tested, np.maximum(0.0, self._det_up[cell] + reward - mean - c.cd_delta), 0.0)
        down = np.where(tested, np.maximum(0.0, self._det_down[cell] + mean - reward - c.cd_delta), 0.0)
        self._det_up[cell] = np.where(seen, up, self._det_up[cell])
        self._det_down[cell] = np.where(seen, down, self._det_down[cell])
        self._det_n[cell] = np.where(seen, n + 1, n)
        self._det_mean[cell] = np.where(seen, mean + (reward - mean) / (n + 1), mean)
        return seen & (np.maximum(up, down) > c.cd_threshold)

    def _restart(self, alarm: np.ndarray, arms: np.ndarray):
        if not alarm.any():
            return
        self.alarms += alarm
        rows = self._rows[alarm]
        if self.config.restart == "global":
            cells = (rows, slice(None))
        else:
            cells = (rows, arms[alarm])
        for state in (self._succ, self._fail, self._det_n, self._det_mean, self._det_up,
                      self._det_down):
            state[cells] = 0.0


def make_thompson_token(num_arms, config, **kw) -> Policy:
    return Thompson(num_arms, replace(config, likelihood="token"), **kw)


# CLI name -> constructor(num_arms, config, *, rng, batch).
POLICIES: dict[str, Callable[..., Policy]] = {
    "ucb1": UCB1,
    "thompson": Thompson,
    "thompson-token": make_thompson_token,
    "discounted-thompson": DiscountedThompson,
    "cd-thompson": ChangeDetectThompson,
    "fixed": FixedArm,
}
