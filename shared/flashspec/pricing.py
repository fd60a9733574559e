"""The adaptive policy's step costs (``flashspec.adaptive.AdaptivePolicy`` inherits ``Pricing``; issue #35): per
(batch bucket, arm) a discounted mean of the log of the measured step seconds, each arm priced by its own work only
(ad22), and the full-information scoring priced apart and run as often as its price allows.

A step's seconds (``flashspec.loop.StepTimer``) can hold more than its arm's work: the scoring of the drafts for free
(on the device) and a choice's host work where the loop was host-bound (the engine's loop reads step k after it chose
and launched step k + 1, so that choice falls in step k's time). On an H100 with SmolLM2-135M (steps 0.6-1.5 ms,
choices 0.3-1.1 ms of host time) plain decoding was priced 1.33-1.43 ms against a real 0.97-1.05 from such steps and
lost to a slower draft (docs/adaptive.md, "ad22"). ``time_step`` keeps those steps out of the arm's price.

A draft that keeps a cache (``lazy``: the torch backend's head and model drafts) catches up lazily: its first step after
steps of other arms re-feeds every position they emitted (the embedded model's head at batch 16 on the CPU: about 1.5 ms a
position behind, docs/adaptive_results.md). No fixed arm pays that. ``catch_up`` learns it per (bucket, draft) as
seconds per position behind, from those first steps' time above the arm's price, and keeps it out of the arm's own
price; ``charged`` puts it on the steps that cause it: every step of an arm that leaves a draft behind owes that
draft's catch-up of the positions it emits (at most its length + 1 a row), paid when the draft next runs (a forced
re-measurement runs it at the latest). Such a first step does not score the drafts for free (``scores``), so that it
is timed clean. Only finished steps' times enter it, so exactness holds as for any choice.

``Pricing`` is a mixin: it keeps ``log_cost``, ``cost_weight``, ``age``, ``samples``, ``rough``, ``score_log_cost``,
``score_weight``, ``last_bucket``, ``score_arm``, ``score_streak``, ``behind``, ``catch_cost`` and ``catch_weight`` on the
policy (``init_catch_up``) and reads its ``arms``, ``arm_plain``, ``arm_draft``, ``arm_length``, ``dearer``, ``warm``,
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

    def init_catch_up(self, buckets: int, drafts: int) -> None:
        """No draft behind yet (``AdaptivePolicy.new_batch`` makes it unknown: a static batch's drafts feed its prompt
        lazily, at their first step; a server's slots feed each prompt at admission)."""
        self.lazy = np.zeros(drafts, bool)  # [drafts]: catches up lazily (``adaptive_loop.mark_lazy``; else none of this)
        self.behind = np.zeros(drafts)  # [drafts]: positions a row emitted since the draft ran (at most; NaN: unknown)
        self.catch_cost = np.zeros((buckets, drafts))  # [buckets, drafts]: seconds per position behind (discounted mean)
        self.catch_weight = np.zeros((buckets, drafts))  # [buckets, drafts]: its weight (0: never measured)
        self.leaves = ~(self.arm_draft[:, None] == np.arange(drafts)[None, :]) | self.arm_plain[:, None]  # [arms, drafts]

    def catch_up(self, b: int, arm: int, seconds: float, scored: bool, chose_s: float) -> float | None:
        """A finished step of ``arm`` in bucket ``b`` that took ``seconds``: the seconds of the arm's own work (less its
        draft's catch-up of the positions it was ``behind``). A step of a draft behind whose time held nothing else (as
        ``time_step``'s: not ``scored``, ``chose_s`` within ``CHOSE_SHARE``), its arm priced cleanly, measures the
        catch-up: its seconds above that price per position behind. None where the draft's lag is unknown (its first
        step in a batch, which fed the prompt)."""
        if self.arm_plain[arm] or not self.lazy[self.arm_draft[arm]]:
            return seconds
        d = self.arm_draft[arm]
        lag = self.behind[d]
        if np.isnan(lag):  # its first step in the batch fed the prompt: the arm's own time is unknown
            return None
        if lag == 0:
            return seconds
        clean = not scored and chose_s <= CHOSE_SHARE * seconds
        if clean and self.cost_weight[b, arm] > 0 and not self.rough[b, arm]:
            w = self.catch_weight[b, d] * self.cost_discount + 1.0
            excess = (seconds - math.exp(self.log_cost[b, arm])) / lag
            self.catch_cost[b, d] += (excess - self.catch_cost[b, d]) / w
            self.catch_weight[b, d] = w
        return max(seconds - max(0.0, self.catch_cost[b, d]) * lag, 0.5 * seconds)

    def fall_behind(self, arm: int, emitted: int) -> None:
        """After a step of ``arm`` whose rows emitted at most ``emitted`` tokens: its draft is level, the others behind."""
        self.behind[self.leaves[arm]] += emitted
        if not self.arm_plain[arm]:
            self.behind[self.arm_draft[arm]] = 0.0

    def charged(self, b: int, capped: np.ndarray) -> np.ndarray:  # [arms] log seconds
        """Bucket ``b``'s capped log costs (``capped`` [arms]) with the catch-up each arm's step leaves the drafts it
        does not run (``catch_cost``, positive only, per position: at most the arm's length + 1 a row)."""
        owed = self.leaves @ np.maximum(self.catch_cost[b], 0.0) * (self.arm_length + 1.0)  # [arms] seconds
        return np.log(np.exp(capped) + owed) if owed.any() else capped

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
        the scoring (``score_log_cost``, ``scoring_period``). A lazy draft's catch-up in its time is not the arm's
        (``catch_up``); an unknown one (the draft's first step in a batch) prices only an arm with no estimate, roughly."""
        own = self.catch_up(b, arm, seconds, scored, chose_s)
        self.age_bucket(b, arm)
        if own is None:
            if self.cost_weight[b, arm] == 0:
                self.price(b, arm, seconds, rough=True)
            return
        seconds = own
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

    def age_bucket(self, b: int, arm: int) -> None:
        """A step of ``arm`` in bucket ``b`` finished: every estimate of the bucket ages by a step."""
        self.last_bucket = b
        self.cost_weight[b] *= self.cost_discount
        self.score_weight[b] *= self.cost_discount
        self.age[b] += 1
        self.age[b, arm] = 0

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
        a retry, whose step is that timing (``observe``); nor in a ``lazy`` draft's first step after steps of another
        arm (its catch-up, timed clean for ``catch_up``): the run's next step scores instead. The scoring costs a
        plain step up to 17% (SmolLM2-135M on an H100, docs/adaptive.md), and a run of one arm needs only enough of it
        to notice another draft that would now pay."""
        last = self.score_arm  # the step launched before this one (``scores`` is asked for every step, in order)
        catching_up = not self.arm_plain[arm] and self.lazy[self.arm_draft[arm]] and (
            last < 0 or self.arm_plain[last] or self.arm_draft[last] != self.arm_draft[arm])
        if arm != self.score_arm:
            self.score_arm, self.score_streak = arm, 0
        if catching_up:
            return False
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
