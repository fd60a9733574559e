"""The adaptive policy's throughput arithmetic (``flashspec.adaptive``'s value of an arm): the tokens a step emits at
a per-token acceptance, the steps until the last row of a static batch is done, and the steps a choice holds for."""

from __future__ import annotations

import math

import numpy as np

HOST_SHARE = 0.05  # the share of a step's time a choice's host work may take, spread over the steps it holds (``held``)
MAX_HOLD = 32  # the most steps one choice holds for on its host time alone
MAX_GROWN = 32  # the most steps a choice holds for once its arm keeps winning clearly (``held``'s streak)
CHOSE_SHARE = 0.02  # a choice's host seconds past this share of a step: not a clean timing (``AdaptivePolicy.observe``)
NEWTON_STEPS = 40  # the most Newton steps ``finish_steps`` takes to its crossing


def emitted_moments(alpha: np.ndarray, length: np.ndarray, profile: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:  # [...] each
    """Mean and variance of the tokens a step emits (1 + leading accepted of ``length``) at per-token acceptance
    ``alpha`` (broadcast) times ``profile`` [..., >= K] at draft position k (None: 1 everywhere, i.i.d.):
    P(accepted >= k) = prod_{j <= k} min(1, alpha profile_j) for k <= length."""
    k, _, tail = acceptance_tails(alpha, length, profile)
    mean = tail.sum(axis=-1)
    return 1.0 + mean, np.maximum(0.0, ((2 * k - 1) * tail).sum(axis=-1) - mean ** 2)


def emitted_slope(alpha: np.ndarray, length: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:  # [...]
    """d/d alpha of ``emitted_moments``' mean: sum_k P(accepted >= k) c_k / alpha, c_k the factors alpha profile_j
    (j <= k) below 1 (a factor capped at 1 does not move with alpha)."""
    _, per, tail = acceptance_tails(alpha, length, profile)
    moving = np.cumsum(per < 1.0, axis=-1)  # [..., K]: c_k
    return (tail * moving).sum(axis=-1) / np.maximum(np.asarray(alpha, np.float64), 1e-12)


def acceptance_tails(alpha: np.ndarray, length: np.ndarray, profile: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # [K], [..., K], [..., K]
    """(positions k = 1 .. K, alpha profile_k, P(accepted >= k)) of a draft of ``length`` (broadcast with ``alpha``)
    tokens at per-token acceptance ``alpha`` times ``profile`` [..., >= K] (None: 1 everywhere)."""
    alpha, length = np.asarray(alpha, np.float64), np.asarray(length, np.float64)  # broadcast against each other
    k = np.arange(1, int(length.max(initial=0)) + 1)  # [K]
    per = alpha[..., None] * (np.ones(len(k)) if profile is None else np.asarray(profile)[..., : len(k)])  # [..., K]
    tail = np.where(k <= length[..., None], np.cumprod(np.minimum(1.0, per), axis=-1), 0.0)  # [..., K]: P(accepted >= k)
    return k, per, tail


def finish_steps(left: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:  # [arms]
    """Expected steps until the last of R rows is done, per arm: row b, ``left`` [R] tokens to go at ``mean`` /
    ``var`` [arms, R] tokens a step, needs steps_b ~ normal(left / mean, left var / mean^3) (a renewal count); the
    last row is done at about the t that the rows pass once between them, sum_b P(steps_b > t) = 1 (the normal tail
    by its logistic approximation), and never before the slowest row's expectation, nor past it + 5 sigma. From the
    slowest row's expectation every tail is convex and falling in t, so Newton's steps rise to the crossing without
    passing it: at most ``NEWTON_STEPS``, stopping when every arm's step is below 1 / 8192 of its bracket (the
    precision of a 4096-cell grid's midpoint)."""
    m = left / mean  # [arms, R]
    if m.shape[1] == 1:
        return np.maximum(1.0, m[:, 0])
    s = np.sqrt(left * var / mean ** 3) + 1e-9
    lo = m.max(axis=1)
    hi = lo + 5.0 * s.max(axis=1)
    scale = 1.702 / s  # [arms, R]
    shift = scale * m
    t, tol = lo.copy(), (hi - lo) / 8192
    moving = np.ones(len(t), bool)  # [arms]: an arm stops at its own first small step (its answer is its own alone)
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(np.minimum(50.0, scale * t[:, None] - shift)))  # [arms, R]: P(steps_b > t)
        excess = p.sum(axis=1) - 1.0  # [arms]: > 0 left of the crossing, falling in t
        slope = (scale * p * (1.0 - p)).sum(axis=1)  # [arms]: -d excess / dt
        step = np.where(moving & (excess > 0), excess / np.maximum(slope, 1e-300), 0.0)
        t = np.minimum(hi, t + step)
        moving &= step > tol
        if not moving.any():
            break
    return np.maximum(1.0, t)


def held(choose_s: float, step_s: float | None, streak: int = 0) -> int:
    """The steps a choice made on value runs its arm for: enough that the choice's host seconds ``choose_s``, spread
    over them, stay within ``HOST_SHARE`` of a step (``step_s``: the last measured; None: unknown, 1), at most
    ``MAX_HOLD``; where that is more than one step, doubled for each of the ``streak`` choices in a row that chose
    the same arm (``adaptive_loop.Choices``), at most ``MAX_GROWN``. Where a device step is short
    (about 1 ms) the policy's host work would otherwise hold the device up (docs/adaptive.md); where steps are long,
    or on a simulated clock (``choose_s`` 0), every step chooses."""
    if not step_s or choose_s <= 0.0:
        return 1
    steps = int(min(MAX_HOLD, max(1, math.ceil(choose_s / (HOST_SHARE * step_s)))))
    return steps if steps == 1 else min(MAX_GROWN, steps << min(streak, 16))
