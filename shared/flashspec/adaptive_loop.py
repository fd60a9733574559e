"""The engine's adaptive loop around ``flashspec.adaptive.AdaptivePolicy``: turn on full-information scoring
(``use_free_scoring``), make every arm's step kind ready (``prepare_arms``), run the steps, each the arm the policy
chooses, reading each one step late (``speculate_adaptive``), and feed each finished step to the policy
(``observe_adaptive``, ``observe_free``: the drafts the backend scored on steps that did not run them)."""

from __future__ import annotations

import numpy as np

from .adaptive import AdaptivePolicy
from .backend import Backend, FreeScoring, StepHandle, StepView
from .config import SamplingConfig
from .faults import check_finite
from .loop import SpecConfig, StepRecord, StepTimer, drafted_per_row, row_accepted, row_drafted
from .throughput import held


def use_free_scoring(backend: Backend, policy: AdaptivePolicy) -> int:
    """Turn on full-information scoring at the arms' longest length where the backend offers it
    (``FreeScoring``; before ``prepare``, so the steps that score are the ones made ready). Returns the drafts scored."""
    longest = int(policy.arm_length.max())
    scored = backend.score_free(longest) if isinstance(backend, FreeScoring) else 0
    policy.scoring_gamma = longest if scored else 0
    return scored


def prepare_arms(backend: Backend, policy: AdaptivePolicy, sampling: SamplingConfig, prepared: int = 0) -> None:
    """Make ready every arm's step kind (CUDA graphs on a GPU), so no capture is timed: each length's steps,
    and plain decoding without scoring too where the policy scores (``AdaptivePolicy.plain_scores``). Where the
    backend made step kinds ready (these, or ``prepared`` by the caller's own ``prepare`` just before), the steps
    are timed warm from their first run and the policy trusts first measurements (``AdaptivePolicy.warm``)."""
    for g in sorted({a.length for a in policy.arms if not a.plain}):
        prepared += backend.prepare(g, sampling)
    if policy.scoring_gamma:
        backend.score_free(0)
        prepared += backend.prepare(None, sampling)
        backend.score_free(policy.scoring_gamma)
    policy.warm = policy.warm or prepared > 0


def speculate_adaptive(backend: Backend, policy: AdaptivePolicy, *, sampling: SamplingConfig, spec: SpecConfig, seed,
                       first_offset: int = 0, rows: int, on_step=None, records: list[StepRecord]) -> None:
    """The loop's steps on the batch the backend holds (after ``prefill``), each running the arm ``policy``
    chooses; ``rows``: the batch's rows. A choice made on value holds for ``held`` steps (the choice's host time
    against the last step's), during which the policy observes every step but is not asked again. Records carry
    the draft index (-1: plain) as ``StepRecord.arm``; step seconds come from ``flashspec.loop.StepTimer`` (each
    step's own time, not its predecessor's)."""
    pending: tuple[int, StepHandle] | None = None
    timer = StepTimer()
    policy.in_flight.clear()  # a run cut short leaves none behind
    policy.new_batch(rows, spec.max_new_tokens)
    a, hold = 0, 0
    for step in range(spec.max_steps or spec.max_new_tokens):
        if hold > 0:  # the last choice still holds: the arm again, the policy's work saved
            hold -= 1
            policy.launch(a)
        else:
            t0 = timer.now()
            a = policy.choose(rows)
            hold = held(timer.now() - t0, records[-1].seconds if records else None) - 1 if policy.on_value else 0
        arm = policy.arms[a]
        if policy.scoring_gamma:  # a plain step scores the drafts only now and then (``plain_scores``)
            backend.score_free(policy.scoring_gamma if not arm.plain or policy.plain_scores() else 0)
        if arm.plain:
            handle = timer.launch(lambda: backend.decode_one(sampling, seed, first_offset + step))
        else:
            handle = timer.launch(lambda: backend.step(arm.draft, arm.length, sampling, seed, first_offset + step))
        if pending is not None:
            rows, done = observe_adaptive(policy, records, *pending, timer=timer, on_step=on_step, step=step - 1)
            pending = None
            if done:
                break
        pending = (a, handle)
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


def observe_adaptive(policy: AdaptivePolicy, records: list[StepRecord], a: int, handle: StepHandle, *,
                     timer: StepTimer, on_step=None, step: int = -1) -> tuple[int, bool]:
    """Read a finished step, feed the policy, record it: (active rows, every row done)."""
    view, seconds = timer.read(handle)
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
        where = np.nonzero(view.active)[0]
        policy.observe(a, rows, accepted, seconds, drafted=lengths, where=where)
        observe_free(policy, view, skip=arm.draft, where=where)
        if on_step:
            on_step(record)
    else:
        policy.in_flight.discard(a)
    return max(rows, 1), bool(view.done.all())
