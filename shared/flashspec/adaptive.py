"""Adaptive speculation: each step runs one arm, a (draft, length) pair or plain decoding, chosen for
the whole batch to maximise emitted tokens per second of measured step time (issue #35).

    arm = policy.choose(rows)       # rows: the active rows of the last finished step (the past only)
    handle = backend.decode_one(...) if the arm is plain else backend.step(draft, length, ...)
    policy.observe(arm, rows, accepted_per_row, seconds)    # one step late, as the loop reads every step

Exactness: the choice is a function of finished steps only and every step draws its randomness at
its own offset (a plain step: the FINAL stream at position 0, as ``Backend.decode_one``), so SPEC.md's
theorem applies to the sequence of steps whatever arms they ran.

The model (``AdaptivePolicy``):

* acceptance: per draft a Beta posterior on the per-token acceptance probability alpha, the token
  likelihood of ``flashspec.bandits`` (a row that accepted n of L: a += n, b += [n < L]), shared by
  every length of that draft and discounted by ``discount`` at every step, so that a change of
  domain is forgotten in about 1 / (1 - discount) steps; a new batch (``new_batch``, each
  ``flashspec.adaptive_loop.speculate_adaptive`` call: a new request's rows) keeps at most ``carry``
  rejections' worth of the old evidence as its prior, so each request adapts to its own domain within a few steps;
  a step whose first-position acceptance on a draft contradicts both its rows' own posteriors there and the draft's
  last few steps weakens the draft's evidence the same way (``flashspec.change.ChangeTest``: a change inside a
  request is seen in a step of a large batch, a slow drift is left to the discount). Per draft position k
  (pooled over rows, ``profile``) the acceptance there relative to the draft's over all positions scales a row's
  alpha at k, so a draft whose later tokens hold less often is not priced at G = 2 by G = 4's rejections (nor
  at G = 4 by G = 2's acceptance). Full information
  (``observe_free``): a draft whose proposal can be recomputed from the emitted text (the n-gram
  lookup) is scored on steps that did not run it, with the same censored-window update.
* cost: per (arm, batch bucket) a discounted mean of the log of the measured step seconds (each
  step's own time, ``flashspec.loop.StepTimer``, read one step late): each measurement adds weight 1
  and every step in the bucket multiplies the weights of all its arms by ``cost_discount``, so a
  measurement k steps old counts cost_discount^k. bucket = ceil(log2(B)) with B the batch's rows
  (``new_batch``), finished or not: a step computes them all. Only the arm's own work: a step that also scored
  the drafts, or whose time held a choice's host work the device did not hide (``observe``'s ``scored``,
  ``chose_s``), prices an arm that has no clean estimate yet (``rough``), else only moves its estimate into the
  range the step allows; scoring steps price the scoring apart (``score_log_cost``).
* value: tokens per second, each row's alpha_b from its own counts over the pooled ones. Served (rows
  replaced as they finish): active rows * (1 + mean over them of E[accepted | alpha_b, L]) / cost; plain
  decoding rows / cost. A static batch (``new_batch(rows, tokens)``: the engine's ``generate``) costs a
  whole step until its last row is done, so its value is its remaining tokens over the time to its end if
  the arm ran to it (``finish_steps``: row b needs about left_b / mean_b steps with a renewal count's
  spread; the end is where the rows are expected to pass once between them), which charges speculation
  for the slowest rows and for the spread of a large batch. The choice draws alpha from the posteriors
  (Thompson sampling), plain decoding among the arms, but for a draft scored for free (``observe_free``),
  which is seen on every step whatever runs: its posterior mean (every draft free: no draw).
* bias: per draft, the tokens its rows accepted over those the posterior predicted for the same rows and windows
  just before (``bias``; each row's step weighted by its own evidence, so a prior-only guess counts little) scales
  the accepted part of its value: the per-token model misses an n-gram's runs of misses then hits on a row, and
  prices it low where it is not (replay of the H100 run: accepted / predicted 1.03-1.19 on its steps).
* spread: a static batch's finish also carries each row's unknown rate (``rate_spread``, ``measure_spread``).
* scoring: a step scores the drafts for free only on the first of every ``scoring_period`` steps in a row of
  its arm (``scores``; the loop switches ``score_free`` around it): ``score_every``, or more where the scoring's
  measured price would cost more than ``SCORE_SHARE`` of the run (a plain step of SmolLM2-135M on an H100: +11%
  at b1, +17% at b256).
* monotone costs: a speculative step does a plain step's work and more, and a draft of L tokens
  does what a draft of fewer does and more, so the choice uses each arm's estimate capped by those
  of the arms that must cost at least as much (plain decoding: the cheapest speculative arm's;
  (d, L): (d, L')'s for L' > L).
* cost exploration: an (arm, bucket) never measured is run first (lowest arm index first); an arm
  not measured for ``remeasure`` steps of its bucket is run once more (forced re-measurement), and
  each forced run doubles that arm's period (back to ``remeasure`` when it is chosen on its value),
  so an arm that is really dearer costs O(log steps) extra steps while an arm measured in a load
  spike is re-measured, the decayed spike counting little against the fresh measurement. An arm
  whose own estimate exceeds its cap by more than 1.5x (impossible but for a spike) is re-measured
  after 1, 2, 4, ... steps instead, the measurement replacing that estimate.
  ``tests/core/test_adaptive.py``: 20x spikes on plain decoding's first steps and on the best arm's;
  each wins afterwards. Where a step kind's first run may be cold (``warm`` False: nothing prepared before the
  first timing, as on the CPU), an arm's first measurement in a bucket is provisional (``provisional``): the
  arm runs once more if it could win at the least it can cost, and the second measurement replaces the first.

* held choices (the engine's loop, ``flashspec.adaptive_loop``; ``flashspec.throughput.held``): a choice made on
  value runs its arm for as many steps as keep its host seconds within a share of a step's, doubled for each next
  choice of the same arm on the posterior means clear of its rivals (``margin``), until a draft's acceptance moves or
  a change of regime (``shifts``); the policy observes every step. Exactness: a held arm was chosen from finished
  steps, as any choice.

An arm's length holds for every row of the step; per-row lengths (``verify(draft_lengths=)``) come
from the drafts' own stop rule (``flashspec_torch.drafts.confident_lengths``), not from this policy
(docs/adaptive.md says why).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .calibration import Calibration
from .change import ChangeTest
from .pricing import SPIKE, Pricing
from .throughput import emitted_moments, finish_steps


NAME = "adaptive"  # the engines' policy name for this loop (``--policy adaptive``)
PROFILE_PRIOR = 8.0  # trials' worth of the pooled acceptance each draft position's own starts from (``profile``)


def engine_policies() -> list[str]:
    """The policy names an engine takes: the bandits over drafts, and this loop's."""
    from .bandits import POLICIES

    return sorted([*POLICIES, NAME])


def engine_lengths(gamma: int) -> tuple[int, ...]:
    """The lengths an engine's adaptive arms draft: G and, where it differs, G // 2."""
    return tuple(sorted({max(1, gamma // 2), gamma}))


@dataclass(frozen=True)
class Arm:
    draft: int | None  # the backend's draft index; None: plain decoding
    length: int = 0  # tokens drafted per row (0 for plain decoding)

    @property
    def plain(self) -> bool:
        return self.draft is None


def make_arms(num_drafts: int, lengths: Sequence[int] = (2, 4), plain: bool = True) -> tuple[Arm, ...]:
    """Plain decoding (if ``plain``), then every draft at every length."""
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or num_drafts < 0:
        raise ValueError(f"num_drafts={num_drafts!r} must be an integer >= 0")
    if not lengths or any(isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= 64 for g in lengths):
        raise ValueError(f"lengths={lengths!r} must be a non-empty list of integers in [1, 64]")
    arms = [Arm(None)] if plain else []
    arms += [Arm(d, g) for d in range(num_drafts) for g in sorted(set(lengths))]
    if not arms:
        raise ValueError("no arms: give at least one draft or plain=True")
    return tuple(arms)


def ended(drafted: np.ndarray, accepted: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:  # [rows] each
    """(drafted, accepted) per row of a step of an arm of ``length`` as its draft's evidence: a row whose draft
    stopped early (a dynamic draft length, ``drafted`` < ``length``) with every token accepted ended its run there
    as a rejection would have (the step emitted accepted + 1 tokens either way), so it counts as one more position
    drafted and rejected. The acceptance is then that of a position being drafted and accepted, and an arm is
    valued by the tokens it emits: a draft that stops after its first token gains nothing from G = 4 over G = 2.
    (A free score's window, ``observe_free``, ends where the step's emitted tokens end: censored, not a rejection.)"""
    stopped = (drafted < length) & (accepted == drafted)
    return drafted + stopped, accepted


def bucket(rows: int) -> int:
    """The batch-size bucket of ``rows`` >= 1: ceil(log2(rows)) (1 -> 0, 2 -> 1, 3..4 -> 2, 5..8 -> 3, ...)."""
    return max(0, math.ceil(math.log2(max(1, rows))))


class InFlight(Counter):
    """The arms launched and not yet observed, each as many times as it is in flight (a held arm's steps)."""

    def add(self, arm: int) -> None:
        self[arm] += 1

    def discard(self, arm: int) -> None:
        if self[arm] > 1:
            self[arm] -= 1
        else:
            self.pop(arm, None)


class AdaptivePolicy(ChangeTest, Calibration, Pricing):
    """Thompson sampling over ``arms`` with the throughput objective per batch bucket (module docstring)."""

    name = "adaptive"

    def __init__(self, arms: Sequence[Arm], num_drafts: int, *, discount: float = 0.99, cost_discount: float = 0.9,
                 remeasure: int = 256, prior: tuple[float, float] = (1.0, 1.0), rng=0, max_buckets: int = 16,
                 carry: float = 4.0, score_every: int = 4):
        if not arms:
            raise ValueError("arms must not be empty")
        if any(not a.plain and not 0 <= a.draft < num_drafts for a in arms):
            raise ValueError(f"every arm's draft must be in [0, {num_drafts}) or None (plain decoding)")
        for name, v in (("discount", discount), ("cost_discount", cost_discount)):
            if not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
                raise ValueError(f"{name}={v!r} must be a number in (0, 1]")
        if isinstance(remeasure, bool) or not isinstance(remeasure, int) or remeasure < 1:
            raise ValueError(f"remeasure={remeasure!r} must be an integer >= 1 (steps of a bucket)")
        if not all(isinstance(p, (int, float)) and p > 0 for p in prior) or len(prior) != 2:
            raise ValueError(f"prior={prior!r} must be two positive numbers (Beta a, b)")
        self.arms = tuple(arms)
        self.dearer = np.array([[not o.plain and (a.plain or (o.draft == a.draft and o.length > a.length))
                                 for o in self.arms] for a in self.arms])  # [arms, arms]: o does a's work and more
        self.arm_plain = np.array([a.plain for a in self.arms])  # [arms]
        self.arm_draft = np.array([0 if a.plain else a.draft for a in self.arms])  # [arms]
        self.arm_length = np.array([a.length for a in self.arms], dtype=np.float64)  # [arms]
        self.discount, self.prior = float(discount), tuple(map(float, prior))
        self.cost_discount, self.remeasure = float(cost_discount), remeasure
        if not (isinstance(carry, (int, float)) and carry > 0):
            raise ValueError(f"carry={carry!r} must be a positive number (rejections' worth of evidence a new batch keeps)")
        self.carry = float(carry)
        if isinstance(score_every, bool) or not isinstance(score_every, int) or score_every < 1:
            raise ValueError(f"score_every={score_every!r} must be an integer >= 1 (steps of an arm per scoring one)")
        self.score_every = score_every
        self.score_arm, self.score_streak = -1, 0  # the arm of the last steps, and how many in a row (``scores``)
        self.scoring_gamma = 0  # the backend's full-information G (``adaptive_loop.use_free_scoring``; 0: none)
        self.rng = np.random.default_rng(rng) if isinstance(rng, (int, np.integer)) else rng
        self.succ = np.zeros(num_drafts)  # per draft: accepted tokens (discounted)
        self.fail = np.zeros(num_drafts)  # per draft: rejections (discounted)
        shape = (max_buckets, len(self.arms))
        self.log_cost = np.zeros(shape)  # [buckets, arms]: discounted mean log seconds per step
        self.cost_weight = np.zeros(shape)  # [buckets, arms]: its weight (0: never measured)
        self.age = np.zeros(shape, dtype=np.int64)  # [buckets, arms]: steps of the bucket since measured
        self.samples = np.zeros(shape, dtype=np.int64)  # [buckets, arms]: measurements taken (``provisional``)
        self.rough = np.zeros(shape, bool)  # [buckets, arms]: estimated from steps whose time held other work (``observe``)
        self.score_log_cost = np.zeros(shape)  # [buckets, arms]: as log_cost, of the arm's steps that scored
        self.score_weight = np.zeros(shape)  # [buckets, arms]: its weight (0: never measured)
        self.last_bucket = 0  # the bucket of the last step observed (``scoring_period``)
        self.warm = False  # every arm's step kind was ready before it was first timed (``adaptive_loop.prepare_arms``)
        self.period = np.full(shape, remeasure, dtype=np.int64)  # [buckets, arms]: age that forces a run
        self.in_flight = InFlight()  # arms chosen and not yet observed
        self.on_value = False  # the last choice was made on the arms' values (not exploration, not a re-measurement)
        self.shifts = 0  # changes of regime seen (``changed``): a held choice ends at one (``adaptive_loop.Choices``)
        self.margin = 0.0  # the last choice on value: its log value on the posterior means over its best rival's
        self.row_succ: np.ndarray | None = None  # [drafts, B]: per row of the batch (``new_batch``), as succ
        self.row_fail: np.ndarray | None = None  # [drafts, B]
        self.row_active: np.ndarray | None = None  # [B] bool: the rows active in the last finished step
        self.batch: int | None = None  # the batch's rows (``new_batch``): the cost bucket's size
        self.remaining: np.ndarray | None = None  # [B]: tokens each row of a static batch has left (None: a server)
        self.free = np.zeros(num_drafts, bool)  # [drafts]: scored on steps that did not run it (``observe_free``)
        width = max(1, int(self.arm_length.max()))
        self.pos_succ = np.zeros((num_drafts, width))  # [drafts, K]: accepted at draft position k + 1 (discounted)
        self.pos_fail = np.zeros((num_drafts, width))  # [drafts, K]: rejected at draft position k + 1
        self.real = np.zeros(num_drafts)  # [drafts]: accepted tokens (discounted; ``bias``)
        self.predicted = np.zeros(num_drafts)  # [drafts]: the posterior's prediction of them
        self.row_spread = np.zeros(num_drafts)  # [drafts]: between-row variance of acceptance (``measure_spread``)
        self.recent: list[list[tuple[float, int]]] = [[] for _ in range(num_drafts)]  # per draft: ``remember``

    def choose(self, rows: int, where: np.ndarray | None = None, size: int | None = None) -> int:
        """The arm index for the next step, given the active rows of the last finished step; ``where``: the rows
        (indices) the step will serve, whose own acceptance prices it (None: the last finished step's, as the
        engine's loop); ``size``: the rows the step computes (its cost bucket; None: ``bucket_of``'s)."""
        if where is not None and self.row_active is not None:
            self.row_active = np.zeros_like(self.row_active)
            self.row_active[where] = True
        b = self.bucket_of(rows, size)
        unmeasured = self.cost_weight[b] == 0
        self.on_value = False
        mean = self.mean_alpha()
        rate = self.log_rate(rows, mean)  # [arms]: on the posterior means, computed once a choice
        if unmeasured.any() or (self.provisional(b)).any():
            a = self.explore(b, unmeasured, rate)
            if a is not None:
                return self.launch(a)
        capped = self.capped_log_cost(b)
        inconsistent = self.log_cost[b] > capped + SPIKE  # re-measured after 1, 2, 4 ... steps
        stale = (self.age[b] >= np.where(inconsistent, self.period[b] // self.remeasure, self.period[b])) \
            & ~unmeasured  # a hopeless arm never measured waits until its acceptance gives it hope
        if stale.any():  # forced re-measurement; the next one of this arm waits twice as long
            a = int(np.argmax(stale))
            self.period[b, a] *= 2
            return self.launch(a)
        draw = self.sample_alpha()  # Thompson: a draft not scored for free is learnt only by running it
        drawn = ~self.arm_plain & ~self.free[self.arm_draft]  # [arms]: those the draw prices (the rest: the means)
        value = self.priced(b, rate, capped)  # [arms]: on the posterior means
        a = on_means = int(np.argmax(value))
        if drawn.any():
            rate = rate.copy()
            rate[drawn] = self.log_rate(rows, draw, np.flatnonzero(drawn))
            a = self.best(b, rate, capped)
        # [arms]: a's rivals, plain decoding and the other drafts' arms (a's own other lengths are not)
        rival = (self.arm_plain != self.arm_plain[a]) | ~self.arm_plain & (self.arm_draft != self.arm_draft[a])
        self.margin = float(value[a] - value[rival].max(initial=-np.inf)) if a == on_means else 0.0
        self.period[b, a] = self.remeasure
        self.on_value = True
        return self.launch(a)

    def explore(self, b: int, unmeasured: np.ndarray, rate: np.ndarray) -> int | None:
        """The arm to run while some of bucket ``b``'s arms are unmeasured (``unmeasured`` [arms] bool) or measured once,
        or None when every such arm is hopeless: each unmeasured arm once, the arms it includes first; then each arm
        measured once a second time (its first measurement is provisional, ``observe``); while the rest are in
        flight, the best measured arm; ``rate`` [arms]: ``log_rate`` on the posterior means."""
        flying = np.zeros(len(self.arms), bool)
        flying[list(self.in_flight)] = True
        hopeless = self.hopeless(b, rate)
        untried = unmeasured & ~flying & ~(self.dearer.T & unmeasured[None, :]).any(axis=1)  # an arm it includes first
        if (untried & ~hopeless).any():  # each unmeasured arm once (not twice because its first step is not read yet)
            return int(np.argmax(untried & ~hopeless))
        retry = self.provisional(b) & ~flying & ~hopeless
        if retry.any():  # a provisional estimate that could win at the least its arm can cost: measured again
            return int(np.argmax(retry))
        if (unmeasured & ~hopeless).any():  # the rest are in flight: the best measured arm meanwhile
            return self.best(b, rate)
        return None

    def counts(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:  # [drafts, R] each
        """(accepted, rejections) per draft and active row of the batch (``rows`` [R]: these rows' indices
        instead): the row's own counts plus the pooled ones weakened to ``carry`` rejections' worth (R = 1: the
        pooled counts alone, before ``new_batch`` gave the policy rows). A row with no evidence of its own
        follows the pool; its own steps soon lead."""
        if self.row_succ is None or (rows is None and not self.row_active.any()):
            return self.succ[:, None], self.fail[:, None]
        cols = self.row_active if rows is None else rows
        scale = self.weakened()[:, None]
        return self.succ[:, None] * scale + self.row_succ[:, cols], self.fail[:, None] * scale + self.row_fail[:, cols]

    def weakened(self) -> np.ndarray:  # [drafts]
        """The factor that weakens each draft's pooled counts to at most ``carry`` rejections' worth."""
        return np.minimum(1.0, self.carry / np.maximum(self.fail + self.succ / 4, 1e-12))

    def profile(self) -> np.ndarray:  # [drafts, K]
        """Per draft, its acceptance at each draft position relative to its acceptance over all positions: a_k / a
        (pooled over rows; a_k the acceptance at position k given the earlier ones accepted, shrunk toward a by
        ``PROFILE_PRIOR`` trials). A draft whose first tokens are surer than its later ones (an n-gram continuation
        past its match) is valued per position: 1 + sum_k prod_{j <= k} min(1, alpha_b r_j) tokens a step
        (``emitted_moments``), where one alpha for every position would price G = 2 from G = 4's rejections."""
        total_s, total_f = self.pos_succ.sum(axis=1, keepdims=True), self.pos_fail.sum(axis=1, keepdims=True)
        a = (1.0 + total_s) / (2.0 + total_s + total_f)  # [drafts, 1]
        a_k = (PROFILE_PRIOR * a + self.pos_succ) / (PROFILE_PRIOR + self.pos_succ + self.pos_fail)
        return a_k / a

    def hopeless(self, b: int, rate: np.ndarray) -> np.ndarray:  # [arms] bool
        """Arms unmeasured or with a provisional estimate (``provisional``) that cannot beat the best measured one
        even at the least they can cost (the dearest measured arm whose work they include: plain decoding's, or a
        shorter length's of the same draft, each at its ``capped_log_cost``), on the posterior means (``rate``
        [arms]: ``log_rate`` on them): not explored (``choose``
        measures the arms an arm includes before it)."""
        measured = self.cost_weight[b] > 0
        doubt = ~measured | self.provisional(b)  # [arms]: cost unknown or provisional
        if not measured.any() or not doubt.any():  # nothing measured to compare with, or nothing to explore
            return np.zeros(len(self.arms), bool)
        own = np.where(measured, self.capped_log_cost(b), -np.inf)  # plain decoding's capped by its dearer arms
        floor = np.where(self.dearer.T, own[None, :], -np.inf).max(axis=1)  # [arms]: the dearest arm it includes
        return doubt & (rate - floor < self.priced(b, rate).max())

    def mean_alpha(self) -> np.ndarray:  # [drafts, R]
        """The posterior mean of each draft's per-token acceptance, per active row (``counts``)."""
        return self.posterior_mean(*self.counts())

    def posterior_mean(self, succ: np.ndarray, fail: np.ndarray) -> np.ndarray:  # [drafts, R]
        return (self.prior[0] + succ) / (self.prior[0] + self.prior[1] + succ + fail)

    def pooled_mean(self) -> np.ndarray:  # [drafts]
        """Each draft's pooled posterior mean acceptance: what a held choice watches (``adaptive_loop.Choices``)."""
        return self.posterior_mean(self.succ, self.fail)

    def sample_alpha(self) -> np.ndarray:  # [drafts, R]
        """A Thompson draw of each draft's acceptance per active row; a draft scored for free (``free``) is seen on
        every step whatever runs, so it needs no exploration: its posterior mean. With every draft scored for free
        nothing is drawn (``free`` is for good: no later draw would have used the random stream either)."""
        succ, fail = self.counts()
        if self.free.all():
            return self.posterior_mean(succ, fail)
        draw = self.rng.beta(self.prior[0] + succ, self.prior[1] + fail)
        return np.where(self.free[:, None], self.posterior_mean(succ, fail), draw)

    def value(self, rows: int, b: int, alpha: np.ndarray) -> np.ndarray:  # [arms]
        """log(tokens per second) of every arm in bucket ``b`` at its capped cost (never measured: -inf): ``log_rate``
        less the log cost; ``alpha`` [drafts, R] per active row."""
        return self.priced(b, self.log_rate(rows, alpha))

    def priced(self, b: int, rate: np.ndarray, capped: np.ndarray | None = None) -> np.ndarray:  # [arms]
        """``value`` from ``rate`` [arms] (``log_rate``); ``capped``: ``capped_log_cost(b)`` if known."""
        v = rate - (self.capped_log_cost(b) if capped is None else capped)
        return np.where(self.cost_weight[b] > 0, v, -np.inf)

    def log_rate(self, rows: int, alpha: np.ndarray, arms: np.ndarray | None = None) -> np.ndarray:  # [arms]
        """log(tokens per step) each arm (``arms``: these indices' alone) would give. A server (no ``remaining``):
        rows x the rows' mean expected emitted tokens, a finished row being replaced. A static batch
        (``new_batch(tokens=)``): its remaining tokens over the steps until its last row is done if the arm ran to
        the end (``finish_steps``): every step costs the whole batch, so a batch that drains is as fast as its
        slowest rows, not its mean row."""
        pick = slice(None) if arms is None else arms
        draft, plain, width = self.arm_draft[pick], self.arm_plain[pick], self.arm_length[pick]  # [arms] each
        left = None if self.remaining is None or self.row_active is None else self.remaining[self.row_active]
        bias = self.bias()[draft, None]  # [arms, 1]
        if left is None or left.shape[0] != alpha.shape[1] or not left.any():
            mean, _ = emitted_moments(alpha[draft], width[:, None], self.profile()[draft, None])
            mean = np.minimum(1.0 + width[:, None], 1.0 + bias * (mean - 1.0))
            return np.log(rows * np.where(plain, 1.0, mean.mean(axis=1)))
        length = np.minimum(width[:, None], np.maximum(left - 1.0, 0.0))  # [arms, R]: no token past a row's end
        profile = self.profile()[draft, None]
        mean, var = emitted_moments(alpha[draft], length, profile)  # [arms, R] each
        mean = np.minimum(1.0 + length, 1.0 + bias * (mean - 1.0))
        var = var + self.rate_spread(alpha, length, profile, draft, mean, left)
        mean, var = np.where(plain[:, None], 1.0, mean), np.where(plain[:, None], 0.0, var)
        return np.log(left.sum()) - np.log(finish_steps(left, mean, var))

    def best(self, b: int, rate: np.ndarray, capped: np.ndarray | None = None) -> int:
        """The arm of the highest ``priced`` value."""
        return int(np.argmax(self.priced(b, rate, capped)))

    def launch(self, a: int) -> int:
        self.in_flight.add(a)
        return a

    def observe(self, arm: int, rows: int, accepted: np.ndarray, seconds: float, drafted: np.ndarray | None = None,
                where: np.ndarray | None = None, size: int | None = None, scored: bool = False,
                chose_s: float = 0.0) -> None:
        """A finished step of ``arm`` over ``rows`` active rows; ``accepted`` [rows] per row (ignored for plain);
        ``drafted`` [rows]: the tokens each row proposed (None: the arm's length); ``where`` [rows]: those rows'
        indices in the batch (None: no per-row statistics); ``size``: as ``choose``'s. ``scored``: the step also
        scored the drafts for free; ``chose_s``: host seconds of a choice that fell in the step's time and were not
        hidden behind a wait for the device (``adaptive_loop.Choices``): the step's time prices the arm's own work
        only (``flashspec.pricing.Pricing.time_step``)."""
        a = self.arms[arm]
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds={seconds!r} must be a finite step time > 0")
        self.in_flight.discard(arm)
        self.time_step(self.bucket_of(rows, size), arm, seconds, scored, chose_s)
        self.real *= self.discount
        self.predicted *= self.discount
        self.succ *= self.discount  # every draft forgets at every step, scored or not
        self.fail *= self.discount
        self.pos_succ *= self.discount
        self.pos_fail *= self.discount
        if self.row_succ is not None and where is not None:
            self.row_succ *= self.discount
            self.row_fail *= self.discount
            self.row_active = np.zeros_like(self.row_active)
            self.row_active[where] = True
        if not a.plain:
            lengths = np.full(len(accepted), a.length) if drafted is None else np.asarray(drafted)
            self._add(a.draft, *ended(lengths, np.asarray(accepted), a.length), where)
        if self.remaining is not None and where is not None:
            emitted = 1 if a.plain else np.asarray(accepted) + 1
            self.remaining[where] = np.maximum(0.0, self.remaining[where] - emitted)

    def bucket_of(self, rows: int, size: int | None = None) -> int:
        """The cost bucket of a step over ``rows`` active rows: ``size``'s (the rows the step computes) where
        given, else the batch's own size once ``new_batch`` gave it (a step computes every row of its batch,
        finished or not: its cost follows the batch, not the active rows), else ``rows``'."""
        return min(bucket(size or self.batch or rows), self.cost_weight.shape[0] - 1)

    def new_batch(self, rows: int | None = None, tokens: int | None = None) -> None:
        """A new batch (request) of ``rows`` rows starts: each draft's pooled acceptance evidence is weakened to at
        most ``carry`` rejections' worth (the mean kept), and the rows' own counts start at zero; ``tokens``: the
        new tokens each row will emit at most (a static batch: the value prices the batch's finish, ``log_rate``)."""
        self.measure_spread()
        scale = self.weakened()
        self.succ *= scale
        self.fail *= scale
        self.batch = rows
        if rows is not None:
            self.last_bucket = self.bucket_of(rows)
            self.row_succ = np.zeros((len(self.succ), rows))
            self.row_fail = np.zeros((len(self.succ), rows))
            self.row_active = np.ones(rows, bool)
        self.remaining = None if rows is None or tokens is None else np.full(rows, float(tokens))

    def open_rows(self, rows: int) -> None:
        """Serving: ``rows`` slots, each with its own counts (zero), the cost bucket given per step (``size``)."""
        self.batch, self.remaining = None, None
        self.row_succ = np.zeros((len(self.succ), rows))
        self.row_fail = np.zeros((len(self.succ), rows))
        self.row_active = np.zeros(rows, bool)

    def start_rows(self, where: Sequence[int]) -> None:
        """New requests enter rows ``where``: their own counts restart at zero, so each starts from the request
        prior (the pooled counts weakened to ``carry`` rejections' worth, ``counts``), never from the posterior
        of the request that held the row before."""
        if self.row_succ is None:
            raise RuntimeError("start_rows before open_rows (or new_batch): the policy has no rows")
        self.row_succ[:, list(where)] = 0.0
        self.row_fail[:, list(where)] = 0.0

    def observe_free(self, draft: int, scored: np.ndarray, accepted: np.ndarray, where: np.ndarray | None = None) -> None:
        """Full information: draft ``draft`` scored without being run, ``scored`` [rows] tokens of the emitted
        window each, ``accepted`` [rows] leading matches (no failure where the window ended without a mismatch);
        ``where`` as ``observe``'s. The draft is from now on chosen on its posterior mean (``sample_alpha``)."""
        self.free[draft] = True
        self._add(draft, np.asarray(scored), np.asarray(accepted), where)

    def _add(self, draft: int, drafted: np.ndarray, accepted: np.ndarray, where: np.ndarray | None = None) -> None:
        if np.any((accepted < 0) | (accepted > drafted)):
            raise ValueError("accepted must be in [0, drafted] for every row")
        alpha, profile = self.row_alpha(draft, where), self.profile()[draft]  # before this step: what it was priced on
        if self.changed(draft, drafted, accepted, where, alpha, profile):
            self.forget(draft)
            self.shifts += 1
        self.remember(draft, drafted, accepted)
        self.note_bias(draft, drafted, accepted, where, alpha, profile)
        self.succ[draft] += accepted.sum()
        self.fail[draft] += np.count_nonzero(accepted < drafted)
        k = np.arange(self.pos_succ.shape[1])  # [K]: draft positions 1 .. K, 0-based
        self.pos_succ[draft] += (accepted[:, None] > k).sum(axis=0)
        self.pos_fail[draft] += ((accepted[:, None] == k) & (accepted < drafted)[:, None]).sum(axis=0)
        if self.row_succ is not None and where is not None:
            self.row_succ[draft, where] += accepted
            self.row_fail[draft, where] += accepted < drafted
