"""Replay simulator for the adaptive policy (issue #35): a policy against every fixed arm over the same rows.

A scenario gives each arm's step seconds at the batch's size (``costs``, measured on a GPU:
``benchmarks/policy_sim.py`` takes them from an H100 run's JSON) and each draft's acceptance per row and
token position (``DraftModel``); every configuration runs over the same rows (common random numbers: whether
draft d's token at row r, position p would be accepted is drawn once, ``Rows.ok``), so the ratios compare
policies, not luck. Step seconds get a small seeded log-normal jitter (``noise``), the same per step index
for every configuration.

Two shapes of run:

* ``static``: a batch of ``batch`` rows, ``tokens`` new tokens each (the engine's ``generate``); every step
  costs the whole batch's step until the last row is done, so a batch that drains ends with its slowest rows;
* ``stream``: ``batch`` slots for ``steps`` steps, a finished row replaced by a new request (a server's
  continuous batch), scored by the tokens emitted.

The policy runs as the engine's loop runs it (``flashspec.adaptive_loop.speculate_adaptive``): it chooses step
k + 1 before it observes step k, sees each step's per-row accepted tokens and seconds, and the recomputable
drafts (``free``) are scored on the steps that did not run them (every speculative step, the plain steps
``AdaptivePolicy.scores`` picks; every step of a stream) over the step's emitted window, min(G, n + 1)
tokens (``flashspec.adaptive_loop.observe_free``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .adaptive import AdaptivePolicy, Arm
from .adaptive_loop import Choices


@dataclass(frozen=True)
class DraftModel:
    """A draft's per-token acceptance along a row: ``first`` until the row's switch position, ``then`` after it;
    the switch position is exponential with mean ``switch`` tokens (0: ``then`` from the first token). The
    n-gram lookup on greedy random weights: little to match until the row falls into a loop (first < then);
    the benchmark's replay draft in bf16: ``--keep`` until a near-tie sends the row off plain decoding's
    tokens, which it replays (first > then)."""

    first: float
    then: float
    switch: float = 0.0
    free: bool = True  # recomputable from the history: scored on steps that did not run it
    position: tuple[float, ...] = ()  # per draft position k: a further chance its token holds (an n-gram past its match)

    def __post_init__(self):
        for name in ("first", "then"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a probability in [0, 1]")
        if not all(0.0 <= p <= 1.0 for p in self.position):
            raise ValueError(f"position={self.position!r} must be probabilities in [0, 1]")
        if not (math.isfinite(self.switch) and self.switch >= 0):
            raise ValueError(f"switch={self.switch!r} must be a number of tokens >= 0")

    def alpha(self, switch: np.ndarray, width: int) -> np.ndarray:  # [rows, width]
        """Per-token acceptance of rows whose switch positions are ``switch`` [rows]."""
        return np.where(np.arange(width)[None, :] < switch[:, None], self.first, self.then)


@dataclass(frozen=True)
class Scenario:
    arms: tuple[Arm, ...]
    costs: tuple[float, ...]  # [arms]: seconds per step at this batch size
    drafts: tuple[DraftModel, ...]
    batch: int
    tokens: int = 128  # new tokens per row (per request in a stream)
    mode: str = "static"  # "static" | "stream"
    steps: int = 0  # stream: steps to run
    noise: float = 0.03  # log-normal sigma of each step's seconds
    score_cost: float = 0.0  # seconds a plain step's full-information scoring adds (fixed runs never score)
    spec_score_cost: float = 0.0  # seconds a speculative step's scoring adds (0: ``costs`` hold it, scored or not)
    seed: int = 0
    choose_s: float = 0.0  # static: host seconds of one adaptive choice (0: free, every step chooses: ``run_adaptive``)
    host_s: float = 0.0  # static: the adaptive loop's other host seconds a step (a step lasts at least its host work)

    def __post_init__(self):
        if len(self.costs) != len(self.arms) or not all(c > 0 for c in self.costs):
            raise ValueError(f"costs={self.costs!r} must give a positive time for each of the {len(self.arms)} arms")
        if any(not a.plain and not 0 <= a.draft < len(self.drafts) for a in self.arms):
            raise ValueError("every arm's draft must index drafts")
        if self.mode not in ("static", "stream"):
            raise ValueError(f"mode={self.mode!r} must be 'static' or 'stream'")
        if self.mode == "stream" and self.steps < 1:
            raise ValueError("a stream needs steps >= 1")
        if self.batch < 1 or self.tokens < 1:
            raise ValueError("batch and tokens must be >= 1")


class Rows:
    """The scenario's rows: ``ok`` [drafts, requests, positions] bool, draft d's token at a request's position
    p accepted; a static batch has ``batch`` requests, a stream enough for every slot's refills."""

    def __init__(self, sc: Scenario):
        rng = np.random.default_rng(sc.seed)
        self.requests = sc.batch if sc.mode == "static" else sc.batch * (sc.steps + 1)
        width = sc.tokens + max(a.length for a in sc.arms) + 2
        self.ok = np.empty((len(sc.drafts), self.requests, width), bool)
        for d, m in enumerate(sc.drafts):
            switch = rng.exponential(m.switch, self.requests) if m.switch > 0 else np.zeros(self.requests)
            self.ok[d] = rng.random((self.requests, width)) < m.alpha(switch, width)
        self.position = np.ones((len(sc.drafts), max(a.length for a in sc.arms)), np.float32)  # [drafts, K]
        self.u = None  # [drafts, requests, width]: the draws the position profiles test (common to every run)
        if any(m.position for m in sc.drafts):
            self.u = rng.random((len(sc.drafts), self.requests, width), dtype=np.float32)
            for d, m in enumerate(sc.drafts):
                k = min(len(m.position), self.position.shape[1])
                self.position[d, :k] = m.position[:k]
        self.cost_noise = np.exp(sc.noise * rng.standard_normal(64 * sc.tokens + sc.steps + 1))

    @classmethod
    def replay(cls, sc: Scenario, bits: Sequence[np.ndarray]) -> "Rows":
        """Rows replayed from recorded traces instead of ``sc.drafts``' models: ``bits`` per draft [rows, width]
        int8 (``trace_bits``: 1 accepted, 0 rejected, -1 never seen); request r replays trace row r mod rows, and a
        position never seen is drawn (seeded by ``sc.seed``) at that row's own acceptance, (1 + accepted) / (2 +
        seen), so a replay of the run's own fixed arm takes exactly its recorded steps."""
        if len(bits) != len(sc.drafts):
            raise ValueError(f"bits gives {len(bits)} drafts; the scenario has {len(sc.drafts)}")
        self = cls(sc)
        self.u = None  # the traces hold whatever position profile the drafts had
        rng = np.random.default_rng(sc.seed + 7919)
        width = self.ok.shape[2]
        for d, b in enumerate(bits):
            b = np.asarray(b)
            if b.ndim != 2 or b.shape[0] < 1:
                raise ValueError(f"bits[{d}] must be [rows >= 1, width], got shape {b.shape}")
            b = np.pad(b[:, :width], ((0, 0), (0, max(0, width - b.shape[1]))), constant_values=-1)[
                np.arange(self.requests) % b.shape[0]]  # [requests, width]
            rate = (1.0 + (b == 1).sum(axis=1)) / (2.0 + (b >= 0).sum(axis=1))  # [requests]
            self.ok[d] = np.where(b >= 0, b == 1, rng.random(b.shape) < rate[:, None])
        return self

    def leading(self, d: int, req: np.ndarray, pos: np.ndarray, window: np.ndarray) -> np.ndarray:  # [rows]
        """Draft d's leading accepted tokens at each row's position, at most ``window`` [rows] of them."""
        span = int(window.max()) if len(window) else 0
        if span == 0:
            return np.zeros(len(req), np.int64)
        ok = self.ok[d][req[:, None], pos[:, None] + np.arange(span)[None, :]]  # [rows, span]
        ok &= np.arange(span)[None, :] < window[:, None]
        if self.u is not None:  # draft position k's token holds only if its draw is under position[k] too
            ok &= self.u[d][req[:, None], pos[:, None] + np.arange(span)[None, :]] < self.position[d, :span][None, :]
        return np.cumprod(ok, axis=1).sum(axis=1)


def trace_bits(traces: dict[int, Sequence[str]], width: int) -> np.ndarray:  # [rows, width] int8
    """What the fixed runs of one draft saw, per row and token position: 1 accepted, 0 rejected, -1 never seen.
    ``traces``: {G: one string per row, one digit per step the row was active: the tokens it accepted of G}
    (``adaptive_bench.py``'s ``trace``). A step at position p that accepted n < G tokens shows p .. p + n - 1
    accepted and p + n rejected; n = G shows p .. p + G - 1 accepted and nothing of the bonus position p + G.
    The longest G's trace is read first; a shorter G's fills only the positions the longer ones never saw."""
    rows = {len(t) for t in traces.values()}
    if len(rows) != 1:
        raise ValueError(f"every G's trace must have the same rows, got {sorted(rows)}")
    bits = np.full((rows.pop(), width), -1, np.int8)
    for g in sorted(traces, reverse=True):
        for r, steps in enumerate(traces[g]):
            p = 0
            for ch in steps:
                n = int(ch)
                if not 0 <= n <= g:
                    raise ValueError(f"trace G={g} row {r}: {n} accepted of {g}")
                seen = np.r_[np.ones(n, np.int8), np.zeros(int(n < g), np.int8)][: max(0, width - p)]
                span = bits[r, p: p + len(seen)]
                bits[r, p: p + len(seen)] = np.where(span < 0, seen, span)
                p += n + 1
    return bits


def position_acceptance(trace: Sequence[str], g: int) -> list[float | None]:  # [G]
    """From one fixed run's ``trace`` at length ``g``: per draft position k, the fraction of the steps that reached
    it (the k - 1 before accepted) that accepted it (None where none reached it). One per-token acceptance would
    make these equal; an n-gram's later positions (its continuation past the match) hold less often."""
    digits = np.array([int(c) for row in trace for c in row], np.int64)  # every row's steps
    k = np.arange(g)  # [G]: 0-based positions
    reached = (digits[:, None] >= k).sum(axis=0)
    accepted = (digits[:, None] > k).sum(axis=0)
    return [round(float(a / r), 4) if r else None for a, r in zip(accepted, reached)]


@dataclass
class Result:
    tokens: int
    seconds: float
    steps: dict  # arm index -> steps run
    choices: int = 0  # adaptive, static: the steps that asked the policy (the rest held its choice)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def run(sc: Scenario, choose: Callable[[], tuple[int, bool, float]], observe=None, rows: Rows | None = None) -> Result:
    """One run of ``sc``: ``choose()`` gives each step's arm, whether the step scores the free drafts (the adaptive
    loop's, when the policy says: ``AdaptivePolicy.scores``; at ``score_cost`` for a plain step, ``spec_score_cost``
    for a speculative one) and the host seconds of the loop's work before the step's launch, its choice included:
    they fall in the previous step's time (the engine's loop reads step k after it launched step k + 1), which lasts
    at least that long (the device waits for the launch); ``observe(arm, where, accepted, drafted, seconds, free)``
    hears each step one step late, after the next step's ``choose`` (``free``: per draft, (scored, accepted) [rows] or
    None)."""
    rows = rows or Rows(sc)
    slot_req = np.arange(sc.batch)  # [batch]: the request each slot holds
    pos = np.zeros(sc.batch, np.int64)  # [batch]: tokens emitted by the slot's request
    next_req, tokens, seconds, counts, pending = sc.batch, 0, 0.0, {}, None
    max_len = max(a.length for a in sc.arms)
    step = 0
    while True:
        active = pos < sc.tokens
        if (sc.mode == "static" and not active.any()) or (sc.mode == "stream" and step >= sc.steps):
            break
        a, scores, host = choose()
        if pending is not None:  # the previous step's time, the host's work since its launch in it
            pending = (*pending[:4], max(pending[4], host), pending[5])
            seconds += pending[4]
            if observe is not None:
                observe(*pending)
        else:
            seconds += host  # the first choice: before any step
        arm = sc.arms[a]
        where = np.flatnonzero(active)
        req, p = slot_req[where], pos[where]
        if arm.plain:
            accepted, drafted = np.zeros(len(where), np.int64), np.zeros(len(where), np.int64)
        else:
            drafted = np.full(len(where), arm.length)
            accepted = rows.leading(arm.draft, req, p, drafted)
        free = [None if (d == arm.draft or not m.free or not scores) else
                (np.minimum(max_len, accepted + 1), rows.leading(d, req, p, np.minimum(max_len, accepted + 1)))
                for d, m in enumerate(sc.drafts)]
        emitted = np.minimum(accepted + 1, sc.tokens - p)
        pos[where] += emitted
        tokens += int(emitted.sum())
        extra = (sc.score_cost if arm.plain else sc.spec_score_cost) if scores else 0.0
        t = (sc.costs[a] + extra) * rows.cost_noise[step % len(rows.cost_noise)]  # the device's
        counts[a] = counts.get(a, 0) + 1
        pending = (a, where, accepted, drafted, t, free)
        if sc.mode == "stream":  # finished requests leave; new ones take their slots
            done = np.flatnonzero(pos >= sc.tokens)
            slot_req[done] = next_req + np.arange(len(done))
            next_req += len(done)
            pos[done] = 0
        step += 1
    if pending is not None:
        seconds += pending[4]
    return Result(tokens, seconds, counts)


def run_fixed(sc: Scenario, arm: int, rows: Rows | None = None) -> Result:
    return run(sc, lambda: (arm, False, 0.0), rows=rows)


def run_adaptive(sc: Scenario, policy: AdaptivePolicy, rows: Rows | None = None, warm: bool = True,
                 chosen: list[int] | None = None) -> Result:
    """``policy`` over ``sc`` as the engine's loop (static: ``new_batch``, choices held as ``adaptive_loop.Choices``
    holds them) or the server (stream: ``open_rows``, ``start_rows`` for each admitted request)
    drives it. ``warm``: no cold first run, as the GPU's captured steps (``adaptive_loop.prepare_arms``; False: first
    measurements provisional, ``AdaptivePolicy.warm``); ``chosen``: a list that gets each step's arm index."""
    rows = rows or Rows(sc)
    policy.in_flight.clear()
    policy.warm = warm
    if any(m.free for m in sc.drafts):  # the free drafts are scored on the steps ``AdaptivePolicy.scores`` names
        policy.scoring_gamma = max(a.length for a in sc.arms)
    state = {"slot_req": None}
    if sc.mode == "static":
        policy.new_batch(sc.batch, tokens=sc.tokens)
    else:
        policy.open_rows(sc.batch)
        state["slot_req"] = np.arange(sc.batch)
    last = {"where": np.arange(sc.batch), "s": None, "waited": 0.0}  # "waited": the last step's device time past the host's
    clock, asked = [0.0], [0]  # the host's clock (a choice advances it by ``choose_s``), the choices asked
    choices = Choices(None, policy, lambda: clock[0])

    def ask() -> int:
        clock[0] += sc.choose_s
        asked[0] += 1
        return policy.choose(len(last["where"]))

    scored: list[bool] = []  # whether each step launched and not yet observed scored
    host = {"choice": 0.0, "all": 0.0}  # the last ``choose``'s host seconds: its choice's, and with the loop's other

    def choose() -> tuple[int, bool, float]:
        if sc.mode == "static":  # as the engine's loop: a choice on value holds (``Choices``), timed on the host clock
            start = clock[0]
            a = choices.next(ask, last["s"], waited=last["waited"])
            if chosen is not None:
                chosen.append(a)
            host["choice"], host["all"] = clock[0] - start, sc.host_s + clock[0] - start
            scored.append(choices.scored)
            return a, choices.scored, host["all"]
        scored.append(False)
        return policy.choose(len(last["where"]), where=last["where"], size=sc.batch), True, 0.0  # the server scores always

    def observe(a, where, accepted, drafted, seconds, free) -> None:
        size = None if sc.mode == "static" else sc.batch
        last["waited"] = max(0.0, seconds - host["all"])  # the host's wait for the device in that step
        exposed = max(0.0, host["choice"] - last["waited"])  # a choice's host time less that wait, as the loop's
        policy.observe(a, len(where), accepted, seconds, drafted=drafted, where=where, size=size, scored=scored.pop(0),
                       chose_s=exposed)
        for d, f in enumerate(free):
            if f is not None and f[0].any():
                policy.observe_free(d, f[0], f[1], where)
        last["where"], last["s"] = where, seconds

    res = run(sc, choose, observe, rows=rows)
    res.choices = asked[0]
    return res


def compare(sc: Scenario, make_policy: Callable[[], AdaptivePolicy], warm: bool = True, repeats: int = 1,
            priced: bool = False, bits: Sequence[np.ndarray] | None = None) -> dict:
    """Every fixed arm and the adaptive policy over the same rows: tokens/s each, and adaptive / best fixed and
    adaptive / plain. ``warm``: the policy first runs the scenario once (the benchmark's warm-up run, which
    prices every arm at this batch size) before the run that counts; ``priced``: the policy starts knowing every
    arm's step seconds at this batch size (a plain step's at 1 scoring step in ``score_every``), nothing of the
    drafts' acceptance (as if each step kind were timed when captured); ``repeats``: scenarios of seeds seed,
    seed + 1, ... (a fresh policy each), tokens and seconds summed (a batch of one row is a noisy draw); ``bits``:
    replay these traces (``Rows.replay``) instead of drawing rows from the drafts' models."""
    totals = np.zeros((len(sc.arms) + 1, 2))  # [fixed arms + adaptive, (tokens, seconds)]
    steps: dict = {}
    for i in range(repeats):
        s = replace(sc, seed=sc.seed + i)
        rows = Rows(s) if bits is None else Rows.replay(s, bits)
        for a in range(len(sc.arms)):
            res = run_fixed(s, a, rows)
            totals[a] += (res.tokens, res.seconds)
        policy = make_policy()
        if priced:
            b = policy.bucket_of(sc.batch, sc.batch)
            plain = np.array([a.plain for a in sc.arms])
            policy.log_cost[b] = np.log(np.array(sc.costs) + plain * sc.score_cost / policy.score_every)
            policy.cost_weight[b] = 1.0
        if warm:
            run_adaptive(s, policy, rows)
        res = run_adaptive(s, policy, rows)
        totals[-1] += (res.tokens, res.seconds)
        for a, n in res.steps.items():
            steps[a] = steps.get(a, 0) + n
    tps = totals[:, 0] / totals[:, 1]
    fixed = {a: float(tps[a]) for a in range(len(sc.arms))}
    plain = [a for a, arm in enumerate(sc.arms) if arm.plain]
    best = max(fixed, key=fixed.get)
    return dict(fixed=fixed, adaptive=float(tps[-1]), steps=steps, best=best, vs_best=float(tps[-1]) / fixed[best],
                vs_plain=float(tps[-1]) / fixed[plain[0]] if plain else None)


def arm_names(arms: Sequence[Arm], drafts: Sequence[str]) -> list[str]:
    return ["plain" if a.plain else f"{drafts[a.draft]}:G{a.length}" for a in arms]
