"""The adaptive policy's step costs (``flashspec.adaptive.AdaptivePolicy`` inherits ``Pricing``; issue #35): per
(batch bucket, arm) a discounted mean of the log of the measured step seconds, each arm priced by its own work only
(ad22), and the full-information scoring priced apart and run as often as its price allows.

A step's seconds (``flashspec.loop.StepTimer``) can hold more than its arm's work: the scoring of the drafts for free
(on the device) and a choice's host work where the loop was host-bound (the engine's loop reads step k after it chose
and launched step k + 1, so that choice falls in step k's time). On an H100 with SmolLM2-135M (steps 0.6-1.5 ms,
choices 0.3-1.1 ms of host time) plain decoding was priced 1.33-1.43 ms against a real 0.97-1.05 from such steps and
lost to a slower draft (docs/adaptive.md, "ad22"). ``time_step`` keeps those steps out of the arm's price.

``Pricing`` is a mixin: it keeps ``log_cost``, ``cost_weight``, ``age``, ``samples``, ``rough``, ``score_log_cost``,
``score_weight``, ``last_bucket``, ``score_arm`` and ``score_streak`` on the policy and reads its ``dearer``, ``warm``,
``cost_discount`` and ``score_every``.
"""

from __future__ import annotations

import math

import numpy as np

from .throughput import CHOSE_SHARE

SPIKE = math.log(1.5)  # an arm's own log cost this far above its cap (capped_log_cost) was timed in a spike
SCORE_SHARE = 0.01  # the share of a run's time the full-information scoring may cost (``scoring_period``)
MAX_SCORE_EVERY = 32  # the most steps of an arm between two that score (``scoring_period``)


class Pricing:
    """Step costs of ``AdaptivePolicy`` (module docstring)."""

    @property
    def cost(self) -> np.ndarray:  # [buckets, arms]
        """The estimate of seconds per step (NaN: never measured)."""
        return np.where(self.cost_weight > 0, np.exp(self.log_cost), np.nan)

    def capped_log_cost(self, b: int) -> np.ndarray:  # [arms]
        """Bucket ``b``'s log costs, each capped by those of the arms that do its work and more."""
        own = self.log_cost[b]
        measured = np.where(self.cost_weight[b] > 0, own, np.inf)  # an arm not measured caps nothing
        return np.minimum(own, np.where(self.dearer, measured[None, :], np.inf).min(axis=1))

    def time_step(self, b: int, arm: int, seconds: float, scored: bool, chose_s: float) -> None:
        """A finished step of ``arm`` in bucket ``b`` took ``seconds`` (``AdaptivePolicy.observe``'s): every estimate of
        the bucket ages by a step. A step that scored the drafts for free (``scored``), or whose choice's host seconds
        ``chose_s`` are more than ``CHOSE_SHARE`` of it, took longer than the arm's own work: it prices an arm with no
        clean estimate (``rough``: replaced by the first clean step, ``price``; the arm is timed again,
        ``provisional``), and otherwise only moves the estimate into the range it allows (at most its seconds; at
        least them less ``chose_s``, where it did not score); a scoring step's seconds without a choice in them price
        the scoring (``score_log_cost``, ``scoring_period``)."""
        self.last_bucket = b
        self.cost_weight[b] *= self.cost_discount
        self.score_weight[b] *= self.cost_discount
        self.age[b] += 1
        self.age[b, arm] = 0
        chose = chose_s > CHOSE_SHARE * seconds
        if not (scored or chose):
            self.price(b, arm, seconds, rough=False)
        elif self.cost_weight[b, arm] == 0 or self.rough[b, arm]:
            self.price(b, arm, seconds, rough=True)
        else:  # the arm's own time lies in [seconds less the choice's (or 0 if it scored), seconds]: moved into it only
            low, own = 0.0 if scored else seconds - chose_s, math.exp(self.log_cost[b, arm])
            if not low <= own <= seconds:
                self.price(b, arm, min(max(own, low), seconds), rough=False)
        if scored and not chose:
            w = self.score_weight[b, arm] + 1.0
            self.score_log_cost[b, arm] += (math.log(seconds) - self.score_log_cost[b, arm]) / w
            self.score_weight[b, arm] = w

    def price(self, b: int, arm: int, seconds: float, rough: bool) -> None:
        """One step's ``seconds`` into the estimate of ``arm`` in bucket ``b`` (a discounted mean of logs); it replaces
        the estimate where that was a spike (above its cap by ``SPIKE``), provisional (a cold first measurement) or
        ``rough`` (from steps that held other work) and this one is clean."""
        if self.log_cost[b, arm] > self.capped_log_cost(b)[arm] + SPIKE:
            self.cost_weight[b, arm] = 0.0  # an impossible estimate is replaced, not averaged
        if self.samples[b, arm] == 1 and not self.warm:  # a provisional first measurement: the second replaces it
            self.cost_weight[b, arm] = 0.0
        if self.rough[b, arm] and not rough:
            self.cost_weight[b, arm] = 0.0
        w = self.cost_weight[b, arm] + 1.0
        self.log_cost[b, arm] += (math.log(seconds) - self.log_cost[b, arm]) / w
        self.cost_weight[b, arm], self.rough[b, arm] = w, rough
        self.samples[b, arm] += 1

    def provisional(self, b: int) -> np.ndarray:  # [arms] bool
        """Bucket ``b``'s arms measured once where the first run of a step kind may be cold (not ``warm``: no
        captured steps, a jit that compiles on first call, a lazy draft's first catch-up), or only on steps that held
        other work (``rough``): that estimate is provisional, the arm is run once more where it could win at the
        least it can cost (``explore``), and the next (clean) measurement replaces it (``observe``, ``price``)."""
        return ((self.samples[b] == 1) & (not self.warm)) | self.rough[b]

    def scores(self, arm: int) -> bool:
        """Whether the step of ``arm`` about to launch should score the drafts (full information): the first of every
        ``scoring_period(arm)`` steps in a row of that arm, once the arm's own cost was timed cleanly (and, where the
        first run may be cold, twice) in the bucket of the last step (``provisional``): no scoring in an exploration or
        a retry, whose step is that timing (``observe``). The scoring costs a
        plain step up to 17% (SmolLM2-135M on an H100, docs/adaptive.md), and a run of one arm needs only enough of it
        to notice another draft that would now pay."""
        if arm != self.score_arm:
            self.score_arm, self.score_streak = arm, 0
        b = self.last_bucket
        timed = self.cost_weight[b, arm] > 0 and not self.provisional(b)[arm]
        scores = timed and self.score_streak % self.scoring_period(arm) == 0
        self.score_streak += 1
        return scores

    def scoring_period(self, arm: int) -> int:
        """Steps of ``arm`` per step that scores, in the bucket of the last step observed: ``score_every``, or more where
        the scoring's measured price (the arm's scoring steps over its own, ``score_log_cost``) would cost more than
        ``SCORE_SHARE`` of the run, at most ``MAX_SCORE_EVERY``."""
        b = self.last_bucket
        if self.score_weight[b, arm] == 0 or self.cost_weight[b, arm] == 0 or self.rough[b, arm]:
            return self.score_every
        share = math.expm1(max(0.0, self.score_log_cost[b, arm] - self.log_cost[b, arm]))
        return int(min(MAX_SCORE_EVERY, max(self.score_every, math.ceil(share / SCORE_SHARE))))
