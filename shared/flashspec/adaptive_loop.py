"""The engine's adaptive loop around ``flashspec.adaptive.AdaptivePolicy``: turn on full-information scoring
(``use_free_scoring``), make every arm's step kind ready (``prepare_arms``), run the steps, each the arm the policy
chooses, reading each one step late (``speculate_adaptive``), and feed each finished step to the policy
(``observe_adaptive``, ``observe_step``, ``observe_free``: the drafts the backend scored on steps that did not run
them). ``Choices`` (held choices, the scoring switch), ``prepare_arms`` and ``observe_step`` are the server's too
(``flashspec.scheduler``): both loops run the policy through the same calls."""

from __future__ import annotations

import math

import numpy as np

from .adaptive import AdaptivePolicy
from .backend import Backend, FreeScoring, StepHandle, StepView
from .config import SamplingConfig
from .faults import check_finite
from .loop import SpecConfig, StepRecord, StepTimer, drafted_per_row, row_accepted, row_drafted
from .throughput import CHOSE_SHARE, held

CLEAR = math.log(1.1)  # the margin (log value) over the best rival arm that lets a held choice grow (``Choices``)
DRIFT = 0.05  # a held choice ends where a draft's pooled posterior acceptance moved this much since it (``Choices``)


class Choices:
    """The arm of each step, as both loops ask the policy: a choice made on value (``AdaptivePolicy.on_value``)
    holds for ``held(its host seconds, the last step's seconds, streak)`` steps, during which the policy is not asked
    (it still observes every step) and the arm is launched again; ``now``: the loop's clock (``StepTimer.now``). The
    streak counts the choices in a row that chose the same arm on value, on the posterior means (not by a Thompson
    draw's luck) and ``CLEAR`` ahead of its best rival (``AdaptivePolicy.margin``): each doubles the hold (3 -> 6 -> 12
    ... steps), so a run whose best arm stays the best pays the choice's host time ever more rarely. A hold,
    and its streak, end where the steps' ``key`` changes (the engine: None; the server: the sampling group and cost
    bucket served), the policy saw a change of regime (``AdaptivePolicy.shifts``) or a draft's pooled acceptance
    moved by more than ``DRIFT`` since the choice (``pooled_mean``). A choice made on no value (an exploration, a
    re-measurement) whose host time exceeds the last read's wait by ``CHOSE_SHARE`` of a step holds two steps (drift
    does not end them), so
    the first is timed without a choice's host work in it (``chose_s``). Where the policy scores the drafts for free,
    the backend's scoring is switched for the step: on for one of every ``scoring_period`` steps in a row of its arm
    (``AdaptivePolicy.scores``). ``chose_s`` and ``scored`` tell the loop how to price the steps
    (``AdaptivePolicy.observe``)."""

    def __init__(self, backend: Backend | None, policy: AdaptivePolicy, now):
        """``backend``: whose scoring the steps switch (None: none, a simulator's loop)."""
        self.backend, self.policy, self.now = backend, policy, now
        self.arm, self.hold, self.key, self.streak, self.shifts = 0, 0, None, 0, policy.shifts
        self.seen = policy.pooled_mean()  # [drafts]: at the last choice
        self.chose = False  # the last ``next`` asked the policy (its host work fell in the step being read then)
        self.chose_s = 0.0  # that choice's host seconds (0: none)
        self.valued = False  # the choice held now was made on value (``drifted`` ends only those)
        self.scored = False  # the last ``next``'s step scores the drafts for free

    def next(self, choose, last_s: float | None, key=None, waited: float = 0.0) -> int:
        """The next step's arm index: the held arm, or ``choose()`` (the policy's choice for the rows served), timed;
        ``last_s``: the last finished step's seconds (None: none yet); ``waited``: the last read's wait for the device
        (``StepTimer.waited``: a choice shorter than that hides behind the device's step)."""
        policy = self.policy
        if self.hold > 0 and (key != self.key or policy.shifts != self.shifts or self.valued and self.drifted()):
            self.hold = self.streak = 0  # another key, a change of regime, moved acceptance: choose afresh
        self.chose, self.chose_s = self.hold <= 0, 0.0
        if not self.chose:  # the last choice still holds: the arm again, the policy's work saved
            self.hold -= 1
            policy.launch(self.arm)
        else:
            t0 = self.now()
            arm = choose()
            self.chose_s = self.now() - t0
            again = policy.on_value and policy.margin >= CLEAR and arm == self.arm and key == self.key
            self.key, self.shifts, self.seen = key, policy.shifts, policy.pooled_mean()
            self.streak = self.streak + 1 if again else 0
            self.arm = arm
            self.valued = policy.on_value
            # a choice on no value (an exploration, a re-measurement) whose host time shows: one step more, clean
            explore = int(self.chose_s > waited + CHOSE_SHARE * (last_s or 0.0))
            self.hold = held(self.chose_s, last_s, self.streak) - 1 if policy.on_value else explore
        self.scored = bool(policy.scoring_gamma) and policy.scores(self.arm)
        if policy.scoring_gamma and self.backend is not None:  # scoring only now and then (``AdaptivePolicy.scores``)
            self.backend.score_free(policy.scoring_gamma if self.scored else 0)
        return self.arm

    def drifted(self) -> bool:
        """Whether a draft's pooled acceptance moved by more than ``DRIFT`` since the last choice."""
        return bool(np.abs(self.policy.pooled_mean() - self.seen).max(initial=0.0) > DRIFT)


def use_free_scoring(backend: Backend, policy: AdaptivePolicy) -> int:
    """Turn on full-information scoring at the arms' longest length where the backend offers it
    (``FreeScoring``; before ``prepare``, so the steps that score are the ones made ready). Returns the drafts scored."""
    longest = int(policy.arm_length.max())
    scored = backend.score_free(longest) if isinstance(backend, FreeScoring) else 0
    policy.scoring_gamma = longest if scored else 0
    return scored


def prepare_arms(backend: Backend, policy: AdaptivePolicy, sampling: SamplingConfig, prepared: int = 0) -> int:
    """Make ready every arm's step kind (CUDA graphs on a GPU), so no capture is timed: each length's steps and
    plain decoding, with and without scoring where the policy scores (``AdaptivePolicy.scores``). Where the
    backend made step kinds ready (these, or ``prepared`` by the caller's own ``prepare`` just before), the steps
    are timed warm from their first run and the policy trusts first measurements (``AdaptivePolicy.warm``).
    Returns the step kinds prepared, ``prepared`` included."""
    lengths = sorted({a.length for a in policy.arms if not a.plain}) or [None]  # a length's prepare: plain's too
    for free in [policy.scoring_gamma, 0] if policy.scoring_gamma else [None]:
        if free is not None:
            backend.score_free(free)
        for g in lengths:
            prepared += backend.prepare(g, sampling)
    if policy.scoring_gamma:
        backend.score_free(policy.scoring_gamma)
    policy.warm = policy.warm or prepared > 0
    return prepared


def speculate_adaptive(backend: Backend, policy: AdaptivePolicy, *, sampling: SamplingConfig, spec: SpecConfig, seed,
                       first_offset: int = 0, rows: int, on_step=None, records: list[StepRecord], clock=None) -> None:
    """The loop's steps on the batch the backend holds (after ``prefill``), each running the arm ``policy``
    chooses; ``rows``: the batch's rows. A choice made on value holds for ``held`` steps (the choice's host time
    against the last step's), during which the policy observes every step but is not asked again. Records carry
    the draft index (-1: plain) as ``StepRecord.arm``; step seconds come from ``flashspec.loop.StepTimer`` (each
    step's own time, not its predecessor's) on ``clock`` (seconds; None: ``time.perf_counter``)."""
    pending: tuple[int, StepHandle] | None = None
    timer = StepTimer(clock)
    policy.in_flight.clear()  # a run cut short leaves none behind
    policy.new_batch(rows, spec.max_new_tokens)
    choices = Choices(backend, policy, timer.now)
    for step in range(spec.max_steps or spec.max_new_tokens):
        a = choices.next(lambda: policy.choose(rows), records[-1].seconds if records else None, waited=timer.waited)
        arm = policy.arms[a]
        if arm.plain:
            handle = timer.launch(lambda: backend.decode_one(sampling, seed, first_offset + step))
        else:
            handle = timer.launch(lambda: backend.step(arm.draft, arm.length, sampling, seed, first_offset + step))
        if pending is not None:  # the step read now was timed with this iteration's choice, if any, in it
            rows, done = observe_adaptive(policy, records, *pending, timer=timer, on_step=on_step, step=step - 1,
                                          chose_s=choices.chose_s)
            pending = None
            if done:
                break
        pending = (a, handle, choices.scored)
    if pending is not None:
        observe_adaptive(policy, records, *pending, timer=timer, on_step=on_step, step=step)
    if policy.scoring_gamma:
        backend.score_free(policy.scoring_gamma)


def observe_free(policy: AdaptivePolicy, view: StepView, skip: int | None, where: np.ndarray) -> None:
    """Full information: each draft but ``skip`` (the one the step ran) that the backend scored on this step
    (``StepView.free_scored``) updates its posterior over the rows ``where`` (indices of active rows)."""
    if view.free_scored is None:
        return
    for d in range(min(len(view.free_scored), len(policy.succ))):
        scored = np.asarray(view.free_scored[d])[where].astype(np.int64)
        if d != skip and scored.any():
            policy.observe_free(d, scored, np.asarray(view.free_accepted[d])[where].astype(np.int64), where)


def observe_adaptive(policy: AdaptivePolicy, records: list[StepRecord], a: int, handle: StepHandle,
                     scored: bool = False, *, timer: StepTimer, on_step=None, step: int = -1,
                     chose_s: float = 0.0) -> tuple[int, bool]:
    """Read a finished step, feed the policy, record it: (active rows, every row done); ``scored``: the step scored
    the drafts for free; ``chose_s``: host seconds of a choice in the step's time; less the read's wait for the device
    (which hid them), they are ``AdaptivePolicy.observe``'s."""
    view, seconds = timer.read(handle)
    chose_s = timer.unhidden(chose_s)
    check_finite(view.bad, step)
    rows = int(view.active.sum())
    if rows:
        arm = policy.arms[a]
        accepted = np.asarray(view.num_accepted)[view.active].astype(np.int64)
        lengths = drafted_per_row(view, arm.length)  # [rows]
        total = int(accepted.sum())
        per_row = row_accepted(view)
        record = StepRecord(-1 if arm.plain else arm.draft, int(lengths.sum()), total, total + rows, rows, seconds,
                            per_row, row_drafted(view, lengths))
        records.append(record)
        observe_step(policy, view, a, accepted, seconds, lengths, np.nonzero(view.active)[0], scored=scored,
                     chose_s=chose_s)
        if on_step:
            on_step(record)
    else:
        policy.in_flight.discard(a)
    return max(rows, 1), bool(view.done.all())


def observe_step(policy: AdaptivePolicy, view: StepView, a: int, accepted: np.ndarray, seconds: float,
                 drafted: np.ndarray | None, where: np.ndarray, size: int | None = None, scored: bool = False,
                 chose_s: float = 0.0) -> None:
    """Feed the policy a finished step of arm ``a`` over the rows ``where`` [rows] (indices of the rows served and
    still running): their ``accepted`` [rows] and ``drafted`` [rows] tokens (None: the arm's length), the step's
    own ``seconds``, the rows it computed (``size``: its cost bucket; None: the batch's), and the drafts the
    backend scored for free on it; ``scored``, ``chose_s``: as ``AdaptivePolicy.observe``'s."""
    policy.observe(a, len(where), accepted, seconds, drafted=drafted, where=where, size=size, scored=scored,
                   chose_s=chose_s)
    observe_free(policy, view, skip=policy.arms[a].draft, where=where)
