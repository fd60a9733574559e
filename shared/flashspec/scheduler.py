"""Continuous batching: requests wait in a queue, enter free slots of the backend's batch between
steps, speculate (or decode) together with ragged acceptance, and leave when finished (EOS, their
token budget) or cancelled, freeing their slot at once.

The scheduler drives a ``flashspec.backend.SlotBackend`` only. Like the loop, it reads each step's
results one step late: step t+1 is launched before step t is read, so the host never waits for the
device inside a step. A slot may change hands in between, so every launched step remembers which
request owned each row. Requests with different sampling settings cannot share a step (the verify
kernel is specialised on them): each step serves one group, chosen for the request that has waited
longest, and the other rows are held. Tokens reach each request through its ``on_event`` callback,
called on the scheduler's thread.

The draft choice: with an ``flashspec.adaptive.AdaptivePolicy`` (``flashspec serve``'s default,
``--policy adaptive``) each launch chooses an arm for the rows it serves: plain decoding, or a draft at
one of its lengths, priced by the cost measured for the bucket of the rows the step computes (the
highest slot in use + 1: requests fill the lowest free slots) and by the acceptance of each request
served (the policy's per-row counts, restarted at every admission, so a request starts from the
request prior and never inherits the posterior of the request that held its slot before).
Full-information scores (``StepView.free_scored``: drafts not run, scored for free by the torch
backend) update the drafts not run. The policy runs through the engine loop's own calls
(``flashspec.adaptive_loop``): ``Choices`` (a choice made on value holds its arm for a few steps where
steps are short, while the steps serve the same sampling group at the same cost bucket; a plain step
scores the drafts only now and then), ``observe_step``, and ``prepare_arms`` before the first step of
each sampling group (``prepare_sampling``; ``Service.prepare`` does it ahead for the warm-up settings),
so that no step kind is captured or compiled inside a timed step and the policy trusts first
measurements where the backend made step kinds ready (``AdaptivePolicy.warm``). With a draft bandit
(``fixed``, ``thompson-token``, ...) each step drafts ``gamma`` tokens with the bandit's draft, as
before. A step's seconds are its own (``flashspec.loop.StepTimer``: the step's own time, not its
predecessor's; the prefill work between steps is charged to no step).

Chunked prefill: between two steps the scheduler computes at most ``prefill_chunk`` prompt tokens
(K/V) in all, so a long prompt does not stall the running requests. A prompt's K/V are computed in
pieces at fixed offsets (0, prefill_chunk, 2 prefill_chunk, ...), whatever else is waiting: its
first pieces by ``backend.prefill_chunk`` into the slot it holds meanwhile, the last by ``admit``
(batched with the other prompts admitted then), after which it steps with the others.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .adaptive import AdaptivePolicy, bucket
from .adaptive_loop import Choices, observe_step, prepare_arms
from .backend import SlotBackend, StepHandle
from .config import SamplingConfig
from .loop import StepTimer


class QueueFull(RuntimeError):
    """The waiting queue holds ``max_queue`` requests already: try again later."""


class Closed(RuntimeError):
    """The scheduler is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Submission:
    """One request, in tokens."""

    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingConfig
    seed: int = 0


@dataclass
class Ticket:
    """A request in flight: its tokens so far, how it ended, its statistics (times from
    ``time.perf_counter``). ``on_event(ticket, new_tokens)`` is called on the scheduler's thread
    for every token group and once more when ``finish_reason`` is set (new_tokens then empty)."""

    id: int
    submission: Submission
    on_event: Callable[[Ticket, list[int]], None]
    tokens: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens whose K/V are in the slot (chunked prefill)
    finish_reason: str | None = None  # "stop" (EOS), "length", "cancelled", "error"
    error: str | None = None
    steps: int = 0  # steps this request took part in
    drafted: int = 0
    accepted: int = 0
    pulls: dict[str, int] = field(default_factory=dict)
    submitted: float = 0.0
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    last_step: int = -1  # the scheduler's step count when this request last took part
    cancel_requested: bool = False

    def stats(self) -> dict:
        """The request's speculation figures and timings (seconds)."""
        ttft = None if self.first_token is None else self.first_token - self.submitted
        total = None if self.finished is None else self.finished - self.submitted
        return {"new_tokens": len(self.tokens), "steps": self.steps, "drafted": self.drafted,
                "accepted": self.accepted, "acceptance": self.accepted / self.drafted if self.drafted else None,
                "arm_pulls": dict(self.pulls), "time_to_first_token_s": ttft, "total_s": total,
                "queue_s": None if self.admitted is None else self.admitted - self.submitted}


class Observer:
    """What the scheduler reports as it goes (a metrics exporter overrides these; all no-ops)."""

    def step(self, arm: int, accepted: Sequence[int], drafted: Sequence[int], seconds: float, slots_used: int) -> None:
        """A step was read: the draft (-1: plain decoding), accepted and drafted tokens per live row (empty
        on a plain step), the step's own seconds."""

    def first_token(self, ticket: Ticket) -> None: ...

    def finished(self, ticket: Ticket) -> None: ...


@dataclass
class Launched:
    handle: StepHandle
    owners: list[Ticket | None]  # the request in each slot when the step was launched
    arm: int  # the policy's arm (an AdaptivePolicy's arm index, a bandit's draft); -1: no policy (plain decoding)
    draft: int | None  # the backend's draft index; None: plain decoding
    length: int  # tokens drafted per row (0: plain decoding)
    size: int  # the rows the step computes (the highest slot in use + 1): its cost bucket
    scored: bool = False  # the step also scores the drafts for free (``Choices.scored``)


class Scheduler:
    """``slots`` rows of ``context`` tokens each; ``policy``: an ``AdaptivePolicy`` (its arms: plain
    decoding and drafts at their lengths) or a draft bandit (``gamma`` drafted tokens per step with
    its draft); ``speculation=False``: plain decoding (``policy`` unused). At most ``max_queue``
    waiting. ``running`` is the context every backend call runs in (the scheduler thread enters
    it); ``clock``: the step timer's seconds (None: ``time.perf_counter``; a test's simulated clock)."""

    def __init__(self, backend: SlotBackend, policy, *, slots: int, context: int, gamma: int = 4,
                 speculation: bool = True, max_queue: int = 256, prefill_chunk: int = 512,
                 observer: Observer | None = None,
                 running: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 clock: Callable[[], float] | None = None):
        if not isinstance(backend, SlotBackend):
            raise TypeError(f"{type(backend).__name__} does not implement flashspec.backend.SlotBackend "
                            "(slots that requests enter and leave): it cannot serve")
        for name, value, low in (("slots", slots, 1), ("max_queue", max_queue, 0), ("gamma", gamma, 1),
                                 ("prefill_chunk", prefill_chunk, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        if speculation and policy is None:
            raise ValueError("speculation=True needs a policy (an AdaptivePolicy or a draft bandit); "
                             "speculation=False serves plain decoding")
        self.backend, self.policy, self.gamma, self.speculation = backend, policy, gamma, speculation
        self.adaptive = speculation and isinstance(policy, AdaptivePolicy)
        if self.adaptive:
            policy.open_rows(slots)
            policy.in_flight.clear()
        self.clock, self.timer = clock, StepTimer(clock)
        self.choices = Choices(backend, policy, self.timer.now) if self.adaptive else None
        self.last_s: float | None = None  # the last read step's seconds (held choices)
        self.prepared: set[SamplingConfig] = set()  # sampling groups whose arms were made ready (``prepare_sampling``)
        self.slots, self.context, self.max_queue, self.prefill_chunk = slots, context, max_queue, prefill_chunk
        self.observer, self.running = observer or Observer(), running
        self.owner: list[Ticket | None] = [None] * slots
        self.waiting: deque[Ticket] = deque()
        self.filling: list[Ticket] = []  # holding a slot, prompt K/V in progress (chunked prefill)
        self.pending: Launched | None = None
        self.count = itertools.count()
        self.step_count = 0
        self.lock = threading.Condition()
        self.closing = False
        self.thread: threading.Thread | None = None
        with self.running():
            backend.open_slots(slots, context)

    def warm_prefill(self) -> int:
        """Before ``start``: run a prompt's prefill once at every length class a request can meet
        (``prefill_lengths``: powers of two and one more, up to a chunk) and one chunk of
        ``prefill_chunk``, in slot 0, released at once, so that compiling a kernel variant or a
        jitted shape happens here and not in a request's time to first token. Returns the
        prefills run."""
        if self.thread is not None:
            raise RuntimeError("warm_prefill before start: the scheduler's thread owns the backend once started")
        lengths = prefill_lengths(min(self.prefill_chunk, self.context - 2))
        with self.running():
            for n in lengths:  # n prompt tokens of K/V: a prompt of n + 1 tokens
                self.backend.admit([0], [[0] * (n + 1)], [1], [0])
                self.backend.release([0])
            if self.prefill_chunk + 1 < self.context:  # a long prompt's first chunk (the slot stays free)
                self.backend.prefill_chunk(0, [0] * self.prefill_chunk, 0)
        return len(lengths) + (self.prefill_chunk + 1 < self.context)

    # -- any thread

    def submit(self, submission: Submission, on_event: Callable[[Ticket, list[int]], None]) -> Ticket:
        """Queue a request; raises QueueFull, Closed, or ValueError for one that can never fit."""
        n = len(submission.prompt)
        if n == 0:
            raise ValueError("the prompt has no tokens")
        if n + submission.max_tokens > self.context:
            raise ValueError(f"the prompt has {n} tokens and max_tokens is {submission.max_tokens}: together more "
                             f"than the context of {self.context} tokens; shorten the prompt or lower max_tokens")
        with self.lock:
            if self.closing:
                raise Closed("the server is shutting down")
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{len(self.waiting)} requests are waiting already (max_queue={self.max_queue}); "
                                "retry later")
            ticket = Ticket(next(self.count), submission, on_event, submitted=time.perf_counter())
            self.waiting.append(ticket)
            self.lock.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Stop a request (a client gone): its slot is freed before the next step."""
        with self.lock:
            ticket.cancel_requested = True
            self.lock.notify()

    def counts(self) -> dict:
        with self.lock:
            running = sum(t is not None for t in self.owner) + len(self.filling)
            return {"running": running, "waiting": len(self.waiting), "slots": self.slots}

    def start(self) -> None:
        """Run the scheduler on a thread of its own (a daemon: it never keeps the process alive)."""
        self.thread = threading.Thread(target=self.serve_forever, name="flashspec-scheduler", daemon=True)
        self.thread.start()

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Take no new requests; finish those admitted or waiting (``drain``) within ``timeout``
        seconds, then cancel what is left, and end the thread."""
        with self.lock:
            self.closing = True
            self.lock.notify()
        deadline = time.monotonic() + (timeout if drain else 0.0)
        while drain and time.monotonic() < deadline and (self.busy() or self.pending):
            time.sleep(0.01)
        with self.lock:
            for t in [*self.waiting, *self.filling, *(t for t in self.owner if t is not None)]:
                t.cancel_requested = True
            self.lock.notify()
        if self.thread is not None:
            self.thread.join(timeout=max(1.0, timeout))

    # -- the scheduler's thread

    def serve_forever(self) -> None:
        with self.running():
            while True:
                with self.lock:
                    if self.closing and not self.busy() and self.pending is None:
                        return
                    if not self.busy() and self.pending is None:
                        self.lock.wait(timeout=0.05)
                        continue
                try:
                    self.iterate()
                except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                    self.fail_all(f"{type(e).__name__}: {e}")

    def busy(self) -> bool:
        return bool(self.waiting) or bool(self.filling) or any(t is not None for t in self.owner)

    def iterate(self) -> None:
        """One round: drop cancelled requests, admit waiting ones (host work charged to no step's time),
        launch a step, read the one before."""
        self.timer.outside(self.between)
        launched = self.launch() if any(t is not None and t.finish_reason is None for t in self.owner) else None
        if self.pending is not None:  # read after the launch: a choice made for it fell in this step's time
            self.observe(self.pending, self.choices.chose_s if launched is not None and self.adaptive else 0.0)
        self.pending = launched

    def between(self) -> None:
        self.drop_cancelled()
        self.admit()

    def drop_cancelled(self) -> None:
        with self.lock:
            gone = [t for t in self.waiting if t.cancel_requested]
            for t in gone:
                self.waiting.remove(t)
        for t in [t for t in self.filling if t.cancel_requested]:
            self.filling.remove(t)
            gone.append(t)
        for t in gone:
            self.finish(t, "cancelled")
        for t in list(self.owner):
            if t is not None and t.cancel_requested and t.finish_reason is None:
                self.finish(t, "cancelled")

    def admit(self) -> None:
        """Prefill work of at most ``prefill_chunk`` prompt tokens: the next piece of each request
        holding a slot (oldest first), then of waiting requests entering free slots; a request
        whose last piece is computed is admitted (steps from the next launch on)."""
        budget, ready = self.prefill_chunk, []
        for t in list(self.filling):
            if self.piece(t) > budget:
                break
            budget -= self.advance(t, ready)
        held = {t.slot for t in self.filling}
        free = [i for i, t in enumerate(self.owner) if t is None and i not in held]
        while free:
            with self.lock:
                if not self.waiting or self.piece(self.waiting[0]) > budget:
                    break
                t = self.waiting.popleft()
            t.slot = free.pop(0)
            self.filling.append(t)
            budget -= self.advance(t, ready)
        if not ready:
            return
        subs = [t.submission for t in ready]
        for sampling in {s.sampling for s in subs}:
            self.prepare_sampling(sampling)
        self.backend.admit([t.slot for t in ready], [list(s.prompt) for s in subs], [s.max_tokens for s in subs],
                           [s.seed for s in subs], [t.prefilled for t in ready])
        if self.adaptive:  # each new request starts from the request prior, not its slot's last posterior
            self.policy.start_rows([t.slot for t in ready])
        now = time.perf_counter()
        for t in ready:
            self.filling.remove(t)
            t.admitted = now
            self.owner[t.slot] = t

    def prepare_sampling(self, sampling: SamplingConfig) -> int:
        """Adaptive: make ready every arm's step kind for requests with these settings, once per setting, before
        any of their steps is timed (``adaptive_loop.prepare_arms``: CUDA graphs captured, jitted steps compiled;
        the policy ``warm`` where any was). Returns the step kinds prepared (0: already, or nothing to do)."""
        if not self.adaptive or sampling in self.prepared:
            return 0
        self.prepared.add(sampling)
        return prepare_arms(self.backend, self.policy, sampling)

    def piece(self, t: Ticket) -> int:
        """The prompt tokens of ``t``'s next prefill piece (at least 1: the budget's unit)."""
        return max(1, min(len(t.submission.prompt) - 1 - t.prefilled, self.prefill_chunk))

    def advance(self, t: Ticket, ready: list[Ticket]) -> int:
        """The next piece of ``t``'s prompt K/V (every prompt token but the last, the first step
        feeds that): a full chunk now, or the rest with ``admit`` (``t`` joins ``ready``).
        Returns the piece's tokens."""
        if len(t.submission.prompt) - 1 - t.prefilled <= self.prefill_chunk:
            ready.append(t)
            return self.piece(t)
        start = t.prefilled
        self.backend.prefill_chunk(t.slot, list(t.submission.prompt[start : start + self.prefill_chunk]), start)
        t.prefilled += self.prefill_chunk
        return self.prefill_chunk

    def launch(self) -> Launched:
        live = [t for t in self.owner if t is not None and t.finish_reason is None]
        first = min(live, key=lambda t: (t.last_step, t.id))  # the one that has waited longest
        sampling = first.submission.sampling
        rows = np.array([t is not None and t.finish_reason is None and t.submission.sampling == sampling
                         for t in self.owner])
        for t in live:
            if rows[t.slot]:
                t.last_step = self.step_count
        self.step_count += 1
        size = 1 + max(i for i, t in enumerate(self.owner) if t is not None)
        arm, draft, length = self.choose(rows, size, sampling)
        if draft is None:
            handle = self.timer.launch(lambda: self.backend.decode_slots(sampling, rows))
        else:
            handle = self.timer.launch(lambda: self.backend.step_slots(draft, length, sampling, rows))
        return Launched(handle, list(self.owner), arm, draft, length, size, self.adaptive and self.choices.scored)

    def choose(self, rows: np.ndarray, size: int, sampling: SamplingConfig) -> tuple[int, int | None, int]:
        """(the policy's arm, the draft to run (None: plain decoding), tokens drafted per row) for a step
        over the rows set in ``rows`` [slots] bool, computing ``size`` rows, of requests with ``sampling``."""
        if not self.speculation:
            return -1, None, 0
        if self.adaptive:
            a = self.choices.next(lambda: self.policy.choose(int(rows.sum()), where=np.flatnonzero(rows), size=size),
                                  self.last_s, key=(sampling, bucket(size)), waited=self.timer.waited)
            arm = self.policy.arms[a]
            return a, arm.draft, arm.length
        d = self.policy.choose()
        return d, d, self.gamma

    def observe(self, launched: Launched, chose_s: float = 0.0) -> None:
        """Read a launched step: its rows' tokens to their requests, its figures to the policy; ``chose_s``: host
        seconds of a choice made while it ran (``learn``)."""
        view, seconds = self.timer.read(launched.handle)
        served, accepted, drafted = [], [], []  # the rows of requests still running, and their figures
        names = self.backend.draft_names
        for slot, t in enumerate(launched.owners[: len(view.active)]):  # the step computed the first rows only
            if t is None or not view.active[slot] or t.finish_reason is not None:
                continue
            if view.bad is not None and view.bad[slot]:
                self.finish(t, "error", "the model produced NaN or infinite logits; the request was stopped")
                continue
            t.steps += 1
            served.append(slot)
            if launched.draft is not None:
                n = int(view.num_accepted[slot])
                g = launched.length if view.drafted is None else int(view.drafted[slot])
                accepted.append(n)
                drafted.append(g)
                t.drafted += g
                t.accepted += n
                t.pulls[names[launched.draft]] = t.pulls.get(names[launched.draft], 0) + 1
            new = [int(x) for x in view.emitted[slot] if x >= 0]
            self.emit(t, new)
            if view.done[slot] and t.finish_reason is None:
                self.finish(t, "length" if len(t.tokens) >= t.submission.max_tokens else "stop")
        self.learn(launched, view, seconds, served, accepted, drafted, self.timer.unhidden(chose_s))
        self.observer.step(-1 if launched.draft is None else launched.draft, accepted, drafted, seconds,
                           sum(t is not None for t in self.owner))

    def learn(self, launched: Launched, view, seconds: float, served: list[int], accepted: list[int],
              drafted: list[int], chose_s: float = 0.0) -> None:
        """Feed the policy a read step: the rows ``served`` (slots of requests still running), their
        accepted and drafted tokens (speculative steps), the step's own ``seconds``; ``chose_s``: the host seconds
        of a choice in them that the read's wait for the device did not hide (``AdaptivePolicy.observe``: each arm
        priced by its own work, as the engine's loop does)."""
        if not self.speculation:
            return
        if not self.adaptive:
            for n, g in zip(accepted, drafted):  # each row is one trial; it bears its share of the time
                self.policy.observe(launched.draft, g, n, seconds / max(len(accepted), 1))
            return
        if not served:
            self.policy.in_flight.discard(launched.arm)
            return
        n = np.array(accepted if accepted else [0] * len(served), np.int64)
        g = np.array(drafted, np.int64) if drafted else None
        observe_step(self.policy, view, launched.arm, n, seconds, g, np.array(served), size=launched.size,
                     scored=launched.scored, chose_s=chose_s)
        self.last_s = seconds

    def emit(self, t: Ticket, new: list[int]) -> None:
        if not new:
            return
        t.tokens.extend(new)
        if t.first_token is None:
            t.first_token = time.perf_counter()
            self.observer.first_token(t)
        t.on_event(t, new)

    def finish(self, t: Ticket, reason: str, error: str | None = None) -> None:
        """End a request: free its slot now, tell its listener."""
        t.finish_reason, t.error, t.finished = reason, error, time.perf_counter()
        if t.slot is not None and self.owner[t.slot] is t:
            self.owner[t.slot] = None
            self.backend.release([t.slot])
        self.observer.finished(t)
        t.on_event(t, [])

    def fail_all(self, message: str) -> None:
        """After a failed step: every request ends with the error; the slots are freed (the
        backend's rows too, unless that fails as well: then the slots are reopened)."""
        self.pending = None
        self.timer = StepTimer(self.clock)
        if self.adaptive:
            self.policy.in_flight.clear()
            self.choices, self.last_s = Choices(self.backend, self.policy, self.timer.now), None
        with self.lock:
            waiting, self.waiting = list(self.waiting), deque()
        waiting, self.filling = [*waiting, *self.filling], []
        broken = False
        for t in [*waiting, *(t for t in self.owner if t is not None)]:
            try:
                self.finish(t, "error", message)
            except Exception:  # noqa: BLE001 - the listener is told below; the rows are reset
                broken = True
                t.finish_reason, t.error = "error", message
                t.on_event(t, [])
        self.owner = [None] * self.slots
        if broken:
            self.backend.open_slots(self.slots, self.context)
            self.prepared.clear()  # new rows: what was made ready for the old ones is prepared again at admission


def prefill_lengths(limit: int) -> list[int]:
    """The prompt K/V lengths that meet each of a prefill's shape classes up to ``limit``: every
    power of two and the length one past it (kernels specialise on powers of two of the tokens
    and on divisibility by 16; the JAX backend pads pieces to powers of two), and ``limit``."""
    out = {limit}
    t = 1
    while t <= limit:
        out.update(n for n in (t, t + 1) if n <= limit)
        t *= 2
    return sorted(out)
