"""The one speculative loop, written once for every backend.

    choose a draft (the policy sees only the past) -> ``backend.step``: draft G tokens, score G+1
    positions, verify, commit -> observe the previous step (one step late) -> stop when all rows are done

It calls only what ``flashspec.backend.Backend`` declares.

Exactness holds for any draft choice made before the step's verification randomness is drawn
(SPEC.md's theorem); reading results one step late only delays what the policy learns.

Step times (``StepTimer``): the loop launches step k + 1 before it reads step k, so on an
asynchronous device the read of step k returns when the device finishes step k, while on a
synchronous one (the CPU) the launch does the work. A step's seconds are the time between the
previous read's end and its own read's end, less the next step's launch (which fell in between),
plus its own launch (and at least its own launch): the device time of step k when the device is the
bottleneck, the host time of step k when the host is. (Timing the interval between two launches instead measures step k - 1
on an asynchronous device: the launch of step k + 1 follows the read of step k - 1.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .backend import Backend, StepHandle
from .config import SamplingConfig
from .faults import check_finite


@dataclass(frozen=True)
class SpecConfig:
    gamma: int = 4
    max_new_tokens: int = 128
    max_steps: int | None = None  # default: max_new_tokens (each step emits >= 1 token per row)

    def __post_init__(self):
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or not 1 <= self.gamma <= 64:
            raise ValueError(f"{self.gamma=} must be an integer in [1, 64]")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"{self.max_new_tokens=} must be an integer >= 1")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ValueError(f"{self.max_steps=} must be None or an integer >= 1")


@dataclass(frozen=True)
class StepRecord:
    arm: int
    drafted: int  # tokens proposed over the active rows (each row's L_b under a dynamic draft length)
    accepted: int  # drafted tokens accepted over the active rows
    emitted: int  # tokens emitted (accepted + one per active row)
    rows: int  # active rows
    seconds: float  # this step's own time (``StepTimer``)
    row_accepted: tuple[int, ...] | None = None  # per batch row: drafted tokens it accepted (-1: not active); None: unknown
    row_drafted: tuple[int, ...] | None = None  # per batch row: tokens it proposed (0 on plain steps, -1: not active)


class StepTimer:
    """Seconds per step of a loop that launches step k + 1 and then reads step k (module docstring).
    ``clock``: seconds (None: ``time.perf_counter``; a test's simulated clock). Between a read that leaves no
    step in flight and the next launch the clock stops (a server waiting for requests), and host work
    between steps that is no step's (``outside``: a server's prefill) is taken out of the step it fell in."""

    def __init__(self, clock=None):
        self.clock = clock
        self.read_end: float | None = None  # when the last read returned (the first launch's end before any)
        self.launches: list[float] = []  # host seconds inside each launched step not yet read, oldest first
        self.off = 0.0  # host seconds outside any step since the last read (``outside``)
        self.waited = 0.0  # host seconds the last read waited inside ``fetch`` (for the device, on an asynchronous one)

    def launch(self, start):
        """Call ``start()`` (launch one step) and return its handle, timing the host's part."""
        t0 = self.now()
        handle = start()
        t1 = self.now()
        if self.read_end is None:  # the first step's own launch is added back at its read, so it starts the clock
            self.read_end, self.off = t1, 0.0
        self.launches.append(t1 - t0)
        return handle

    def outside(self, work):
        """Run ``work()`` (host work between steps that belongs to no step) and return its result; its
        seconds are not charged to the step being timed."""
        t0 = self.now()
        try:
            return work()
        finally:
            if self.read_end is not None:
                self.off += self.now() - t0

    def now(self) -> float:
        return time.perf_counter() if self.clock is None else self.clock()

    def read(self, handle: StepHandle):
        """(``handle.fetch()``, the oldest unread step's seconds)."""
        t0 = self.now()
        view = handle.fetch()
        t = self.now()
        self.waited = t - t0
        own = self.launches.pop(0)
        seconds = t - self.read_end - self.off - sum(self.launches) + own
        self.read_end, self.off = (t if self.launches else None), 0.0
        return view, max(seconds, own, 1e-9)

    def unhidden(self, host_s: float) -> float:
        """Of ``host_s`` seconds of host work done while the step just read ran, those its read's wait for the
        device (``waited``) did not hide."""
        return max(0.0, host_s - self.waited)


class Policy:
    """What the loop needs of a draft-selection policy (see flashspec.bandits)."""

    def choose(self) -> int: ...

    def observe(self, arm: int, drafted: int, accepted: int, seconds: float) -> None: ...


def speculate(
    backend: Backend,
    policy: Policy,
    prompts: list[list[int]],
    *,
    sampling: SamplingConfig,
    spec: SpecConfig,
    seed=0,
    first_offset: int = 0,
    on_step=None,  # called with each StepRecord as it is observed (a progress bar)
    records: list[StepRecord] | None = None,  # appended to as steps are observed (kept if interrupted)
) -> tuple[list[list[int]], list[StepRecord]]:
    """Generate for every prompt; returns (new tokens per row, per-step records). Raises
    flashspec.faults.NonFiniteLogitsError when a model's logits were NaN or infinite."""
    backend.prefill(prompts, spec.max_new_tokens)
    records = [] if records is None else records
    speculate_steps(backend, policy, sampling=sampling, spec=spec, seed=seed, first_offset=first_offset,
                    on_step=on_step, records=records)
    return backend.outputs(), records


def speculate_steps(backend: Backend, policy: Policy, *, sampling: SamplingConfig, spec: SpecConfig, seed,
                    first_offset: int, on_step, records: list[StepRecord]) -> None:
    """``speculate``'s steps on the batch the backend holds (after ``prefill``, and ``prepare`` if wanted)."""
    pending: tuple[int, StepHandle] | None = None
    timer = StepTimer()
    max_steps = spec.max_steps or spec.max_new_tokens
    for step in range(max_steps):
        arm = policy.choose()
        handle = timer.launch(lambda: backend.step(arm, spec.gamma, sampling, seed, first_offset + step))
        if pending is not None and observe(policy, records, spec.gamma, *pending, timer=timer, on_step=on_step, step=step - 1):
            pending = None
            break
        pending = (arm, handle)
    if pending is not None:
        observe(policy, records, spec.gamma, *pending, timer=timer, on_step=on_step, step=step)


def observe(policy: Policy, records: list[StepRecord], gamma: int, arm: int, handle: StepHandle, *,
            timer: StepTimer, on_step=None, step: int = -1) -> bool:
    """Read a finished step, feed the policy, record it; True when every row is done."""
    view, seconds = timer.read(handle)
    check_finite(view.bad, step)
    rows = int(view.active.sum())
    if rows:
        accepted = int(view.num_accepted[view.active].sum())
        lengths = drafted_per_row(view, gamma)  # [rows]
        per_row = row_accepted(view)
        record = StepRecord(arm, int(lengths.sum()), accepted, accepted + rows, rows, seconds, per_row,
                            row_drafted(view, lengths))
        records.append(record)
        for n, g in zip(view.num_accepted[view.active], lengths):  # each row is one trial; it bears its share of the time
            policy.observe(arm, int(g), int(n), record.seconds / rows)
        if on_step:
            on_step(record)
    return bool(view.done.all())


def row_drafted(view, lengths: np.ndarray) -> tuple[int, ...]:
    """``StepRecord.row_drafted``: ``lengths`` [active rows] placed at the active rows, -1 elsewhere."""
    out = np.full(len(view.active), -1, np.int64)
    out[np.asarray(view.active, bool)] = lengths
    return tuple(out.tolist())


def row_accepted(view) -> tuple[int, ...]:
    """``StepRecord.row_accepted``: each row's accepted tokens, -1 where it was not active."""
    return tuple(np.where(np.asarray(view.active, bool), np.asarray(view.num_accepted, np.int64), -1).tolist())


def drafted_per_row(view, gamma: int) -> np.ndarray:  # [active rows] int64
    """The tokens each active row really proposed: ``StepView.drafted`` (a dynamic draft length stops rows
    early), or ``gamma`` for every row where the backend does not say."""
    if view.drafted is None:
        return np.full(int(view.active.sum()), gamma, np.int64)
    return np.asarray(view.drafted)[view.active].astype(np.int64)


def decode(
    backend: Backend,
    prompts: list[list[int]],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    seed=0,
    first_offset: int = 0,
    on_step=None,
    records: list[StepRecord] | None = None,
) -> tuple[list[list[int]], list[StepRecord]]:
    """Plain autoregressive decoding on the same backend (``backend.decode_one``): the baseline."""
    backend.prefill(prompts, max_new_tokens)
    records = [] if records is None else records
    decode_steps(backend, sampling=sampling, max_new_tokens=max_new_tokens, seed=seed, first_offset=first_offset,
                 on_step=on_step, records=records)
    return backend.outputs(), records


def decode_steps(backend: Backend, *, sampling: SamplingConfig, max_new_tokens: int, seed, first_offset: int, on_step,
                 records: list[StepRecord]) -> None:
    """``decode``'s steps on the batch the backend holds (after ``prefill``, and ``prepare`` if wanted)."""
    pending = None
    timer = StepTimer()
    for step in range(max_new_tokens):
        handle = timer.launch(lambda: backend.decode_one(sampling, seed, first_offset + step))
        if pending is not None and _observe_plain(records, pending, timer=timer, on_step=on_step, step=step - 1):
            pending = None
            break
        pending = handle
    if pending is not None:
        _observe_plain(records, pending, timer=timer, on_step=on_step, step=step)


def _observe_plain(records: list[StepRecord], handle: StepHandle, *, timer: StepTimer, on_step=None,
                   step: int = -1) -> bool:
    view, seconds = timer.read(handle)
    check_finite(view.bad, step)
    rows = int(view.active.sum())
    if rows:
        per_row = tuple(0 if a else -1 for a in view.active)
        records.append(StepRecord(-1, 0, 0, rows, rows, seconds, per_row, per_row))
        if on_step:
            on_step(records[-1])
    return bool(view.done.all())
