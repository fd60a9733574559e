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


class PacedHandle:
    def __init__(self, view: StepView, finish: float, seconds: float, device: PacedDevice):
        self.view, self.finish, self.seconds, self.device = view, finish, seconds, device

    def fetch(self) -> StepView:
        wait_until(self.finish)
        self.device.busy += self.seconds
        return self.view


class PacedDevice:
    """``step_ms``: (plain, per drafted token) device milliseconds: a step of G drafted tokens takes
    plain + G x per-token; ``accept`` [B]: each row's per-token acceptance; ``steps``: the table's depth."""

    def __init__(self, accept: np.ndarray, step_ms: tuple[float, float] = (1.0, 0.025), steps: int = 512, seed: int = 0,
                 gamma_max: int = 8):
        self.accept = np.asarray(accept, np.float64)  # [B]
        self.step_ms = step_ms
        self.hits = np.random.default_rng(seed).random((steps, len(self.accept), gamma_max)) < self.accept[:, None]
        self.lead = np.cumprod(self.hits, axis=2).sum(axis=2)  # [steps, B]: leading accepted tokens of gamma_max
        self.free_gamma = 0
        self.busy = 0.0  # device seconds of the steps read since prefill (a loop's last launch may go unread)

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
        self.t, self.free_at, self.busy = 0, 0.0, 0.0

    def step(self, arm: int, gamma: int, sampling, seed, offset: int) -> PacedHandle:
        return self.launch(gamma)

    def decode_one(self, sampling, seed, offset: int) -> PacedHandle:
        return self.launch(0)

    def launch(self, gamma: int) -> PacedHandle:
        lead = self.lead[self.t % len(self.lead)]  # [B]
        active = self.left > 0
        n = np.minimum(np.minimum(lead, gamma), np.maximum(self.left - 1, 0)) * active  # [B]
        count = (n + 1) * active
        self.left -= count
        self.emitted += count
        free_scored = free_accepted = None
        if self.free_gamma:
            scored = np.minimum(self.free_gamma, count)
            free_scored, free_accepted = scored[None], np.minimum(lead, scored)[None]
        view = StepView(n, active, self.left <= 0, np.zeros(len(n), np.uint8), free_scored=free_scored,
                        free_accepted=free_accepted, drafted=np.full(len(n), gamma) * active)
        seconds = (self.step_ms[0] + gamma * self.step_ms[1]) * 1e-3
        self.free_at = max(self.free_at, time.perf_counter()) + seconds
        self.t += 1
        return PacedHandle(view, self.free_at, seconds, self)

    def outputs(self) -> list[list[int]]:
        return [[0] * int(e) for e in self.emitted]
