"""A fake asynchronous device for measuring a loop's exposed host work on the CPU (issue #35,
``benchmarks/adaptive_host.py``'s critical-path part).

``PacedDevice`` implements the ``flashspec.backend.Backend`` methods the loops call, with no model: a launched step
computes its results on the host at once (a few numpy calls from a pre-drawn table), and its handle's ``fetch``
returns only when a device that runs one step at a time would have finished it: the step starts when the device
is free or when it was launched, whichever is later, and runs ``step_s(arm, gamma)`` seconds. So a loop whose host
work per step is shorter than the device step runs at the device's pace, and the wall time a loop takes beyond
``busy`` (the device's busy seconds) is host work the device waited for.

Results: row b accepts each drafted token with probability ``accept[b]`` (leading successes of a pre-drawn uniform
table, so a given (step, row) draws the same whatever arm runs); draft 0 is recomputable, so with
``score_free(G)`` on every step scores it on the step's emitted tokens (min(G, accepted + 1) scored).

``PacedSlots`` is the same device with slots (``flashspec.backend.SlotBackend``) for the server's scheduler
(``benchmarks/serve_paced.py``): a request accepts at its own rate, and ``prepare`` reports step kinds made ready or
not (a GPU's captured graphs, or the CPU's nothing).
"""

from __future__ import annotations

import time

import numpy as np

from flashspec.backend import StepView


def wait_until(deadline: float) -> None:
    """Sleep, then spin for the last 0.2 ms, until ``time.perf_counter()`` passes ``deadline``."""
    left = deadline - time.perf_counter()
    if left > 3e-4:
        time.sleep(left - 2e-4)
    while time.perf_counter() < deadline:
        pass


def leading(uniform: np.ndarray, accept: np.ndarray) -> np.ndarray:  # [..., B, G], [B] -> [..., B]
    """Leading accepted draft tokens: the uniform draws below each row's acceptance, counted until the first not."""
    return np.cumprod(uniform < accept[:, None], axis=-1).sum(axis=-1)


def step_results(lead: np.ndarray, gamma: int, active: np.ndarray, left: np.ndarray, free_gamma: int):
    """(accepted [B], emitted [B], (free_scored, free_accepted) [1, B] each or Nones) of a step of ``gamma`` drafted
    tokens over the ``active`` rows with ``left`` tokens to go: no token past a row's budget; draft 0 scored for
    free on the emitted tokens where ``free_gamma``."""
    n = np.minimum(np.minimum(lead, gamma), np.maximum(left - 1, 0)) * active
    count = (n + 1) * active
    if not free_gamma:
        return n, count, (None, None)
    scored = np.minimum(free_gamma, count)
    return n, count, (scored[None], np.minimum(lead, scored)[None])


class PacedHandle:
    def __init__(self, view: StepView, finish: float, seconds: float, device: PacedDevice):
        self.view, self.finish, self.seconds, self.device = view, finish, seconds, device

    def fetch(self) -> StepView:
        wait_until(self.finish)
        self.device.busy += self.seconds
        return self.view


class PacedDevice:
    """``step_ms``: (plain, per drafted token) device milliseconds: a step of G drafted tokens takes
    plain + G x per-token; ``accept`` [B]: each row's per-token acceptance; ``steps``: the table's depth;
    ``score_ms``: what a plain step's full-information scoring of draft 0 adds (a speculative step runs draft 0, the
    only draft, so it scores nothing)."""

    def __init__(self, accept: np.ndarray, step_ms: tuple[float, float] = (1.0, 0.025), steps: int = 512, seed: int = 0,
                 gamma_max: int = 8, score_ms: float = 0.0):
        self.accept = np.asarray(accept, np.float64)  # [B]
        self.step_ms, self.score_ms = step_ms, score_ms
        self.uniform = np.random.default_rng(seed).random((steps, len(self.accept), gamma_max))  # [steps, B, G]
        self.lead = leading(self.uniform, self.accept)  # [steps, B]: leading accepted tokens of gamma_max
        self.free_gamma = 0
        self.busy = 0.0  # device seconds of the steps read since prefill (a loop's last launch may go unread)
        self.launched = 0  # steps launched since prefill (open_slots)

    def score_free(self, gamma: int) -> int:
        self.free_gamma = gamma
        return 1 if gamma else 0

    def prepare(self, gamma, sampling) -> int:
        return 0

    def prefill(self, prompts, max_new_tokens: int) -> None:
        b = len(prompts)
        if b != len(self.accept):
            raise ValueError(f"{b} prompts for a device of {len(self.accept)} rows: give accept one entry per row")
        self.left = np.full(b, max_new_tokens, np.int64)
        self.emitted = np.zeros(b, np.int64)
        self.t, self.free_at, self.busy, self.launched = 0, 0.0, 0.0, 0

    def step(self, arm: int, gamma: int, sampling, seed, offset: int) -> PacedHandle:
        return self.launch(gamma)

    def decode_one(self, sampling, seed, offset: int) -> PacedHandle:
        return self.launch(0)

    def launch(self, gamma: int) -> PacedHandle:
        lead = self.lead[self.t % len(self.lead)]  # [B]
        active = self.left > 0
        n, count, free = step_results(lead, gamma, active, self.left, self.free_gamma)
        self.left -= count
        self.emitted += count
        view = StepView(n, active, self.left <= 0, np.zeros(len(n), np.uint8), free_scored=free[0],
                        free_accepted=free[1], drafted=np.full(len(n), gamma) * active)
        self.t += 1
        return self.run(view, gamma)

    def run(self, view: StepView, gamma: int) -> PacedHandle:
        """The handle of a step of ``gamma`` drafted tokens (0: plain) that starts when the device is free."""
        scoring = self.score_ms if gamma == 0 and self.free_gamma else 0.0
        seconds = (self.step_ms[0] + gamma * self.step_ms[1] + scoring) * 1e-3
        self.launched += 1
        self.free_at = max(self.free_at, time.perf_counter()) + seconds
        return PacedHandle(view, self.free_at, seconds, self)

    def outputs(self) -> list[list[int]]:
        return [[0] * int(e) for e in self.emitted]


class PacedSlots(PacedDevice):
    """``PacedDevice`` with ``slots`` rows that requests enter and leave: a request of seed s accepts each drafted
    token with probability ``accept[s % len(accept)]``, drawing from its slot's column of the table at its own step
    count; every step, whatever rows it serves, takes the device ``step_ms`` (as ``PacedDevice``). ``prepared``: the
    step kinds each ``prepare`` call reports made ready (0: none, as the CPU; 1: as CUDA graphs captured)."""

    draft_names = ("ngram",)

    def __init__(self, accept, slots: int, step_ms: tuple[float, float] = (1.0, 0.025), steps: int = 512,
                 seed: int = 0, gamma_max: int = 8, prepared: int = 0):
        super().__init__(np.zeros(slots), step_ms, steps, seed, gamma_max)
        self.accept_of, self.prepared = np.asarray(accept, np.float64), prepared

    def prepare(self, gamma, sampling) -> int:
        return self.prepared

    def open_slots(self, slots: int, context: int) -> None:
        if slots != len(self.accept):
            raise ValueError(f"{slots} slots for a device of {len(self.accept)}: make PacedSlots with slots={slots}")
        self.live = np.zeros(slots, bool)
        self.left = np.zeros(slots, np.int64)
        self.emitted = np.zeros(slots, np.int64)
        self.steps_of = np.zeros(slots, np.int64)  # each slot's own step count (its request's)
        self.free_at, self.busy, self.launched = 0.0, 0.0, 0

    def admit(self, slots, prompts, max_new_tokens, seeds, cached=None) -> None:
        for s, n, seed in zip(slots, max_new_tokens, seeds):
            self.live[s], self.left[s], self.steps_of[s] = True, n, 0
            self.accept[s] = self.accept_of[seed % len(self.accept_of)]

    def prefill_chunk(self, slot: int, tokens, start: int) -> None:
        pass

    def release(self, slots) -> None:
        self.live[list(slots)] = False

    def step_slots(self, arm: int, gamma: int, sampling, rows) -> PacedHandle:
        return self.launch_slots(gamma, np.asarray(rows, bool))

    def decode_slots(self, sampling, rows) -> PacedHandle:
        return self.launch_slots(0, np.asarray(rows, bool))

    def launch_slots(self, gamma: int, rows: np.ndarray) -> PacedHandle:  # rows [slots] bool
        b = np.arange(len(rows))
        lead = leading(self.uniform[self.steps_of % len(self.uniform), b], self.accept)  # [slots]
        active = rows & self.live & (self.left > 0)
        n, count, free = step_results(lead, gamma, active, self.left, self.free_gamma)
        self.left -= count
        self.emitted += count
        self.steps_of += active
        emitted = np.where(np.arange(gamma + 1)[None] < count[:, None], 1, -1)  # [slots, G + 1]
        view = StepView(n, active, self.left <= 0, np.zeros(len(n), np.uint8), emitted=emitted, free_scored=free[0],
                        free_accepted=free[1], drafted=np.full(len(n), gamma) * active)
        return self.run(view, gamma)
