"""Continuous batching on the JAX backend: ``flashspec.backend.SlotBackend`` over ``JaxBackend``.

``open_slots`` makes a fixed batch of rows on the device (``steps.State`` with per-row budgets,
plus per-row seeds and step counters); requests enter a free row between steps (``admit``: the
row's tokens and settings set, its prompt's K/V computed over that row alone, in pieces of a
bucketed length) and leave it (``release``). A slot step runs the same ``Steps`` methods as
``generate`` over the first k rows, k the power of two (at most the slot count) above the highest
row in use, so jit compiles one step per (k, step kind, sampling), not one per running set; rows
outside ``rows`` or released are held (marked finished for the commit, then restored: nothing
emitted, step counter unchanged). The state is donated on a GPU.

Drafts: every kind ``generate`` runs (the n-gram lookup, model drafts, draft heads). A draft with
a cache of its own is fed an admitted row's prompt with the target (the same pieces, that row
only), so a step never catches up more than its usual positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flashspec.backend import StepView, check_admit, check_open_slots
from flashspec.config import SamplingConfig

from .backend import JaxBackend
from .drafts import Seeds, make_seeds
from .heads import HeadDraft
from .model import KVCache
from .steps import BUCKET, MARGIN, PREFIX_BUCKET, State, Steps, round_up
from .verify import on_gpu


class Rows(NamedTuple):
    """The per-row generator coordinates of the slots (beside ``State``)."""

    seed_lo: jax.Array  # [B] uint32
    seed_hi: jax.Array  # [B] uint32
    offset: jax.Array  # [B] int32: each row's step counter, from its admission


class SlotOut(NamedTuple):
    num_accepted: jax.Array  # [k] int32
    active: jax.Array  # [k] bool
    done: jax.Array  # [k] bool
    emitted: jax.Array  # [k, W] int32: the tokens appended to each row, then -1


class SlotHandle:
    """A slot step's small results, copying to the host; ``fetch`` waits for that copy only."""

    def __init__(self, out: SlotOut):
        for a in out:
            a.copy_to_host_async()
        self.out = out

    def fetch(self) -> StepView:
        n, active, done, emitted = (np.asarray(a).copy() for a in self.out)
        return StepView(n, active, done, None, emitted)


def rows_of(tree, take):
    """``take(array, axis)`` over every per-row array of a State-like tree: a KVCache's batch axis is 1."""
    if isinstance(tree, KVCache):
        return KVCache(take(tree.k, 1), take(tree.v, 1))
    if isinstance(tree, tuple):
        return type(tree)(*(rows_of(t, take) for t in tree)) if hasattr(tree, "_fields") else tuple(
            rows_of(t, take) for t in tree)
    return None if tree is None else take(tree, 0)


def first_rows(state: State, k: int) -> State:
    """The first k rows of every per-row array (the drafts' states too)."""
    return rows_of(state, lambda a, axis: lax.slice_in_dim(a, 0, k, axis=axis))


def put_rows(state: State, sub: State, k: int) -> State:
    """``state`` with its first k rows replaced by ``sub``'s."""
    if k == state.seqs.tokens.shape[0]:
        return sub
    parts = iter(jax.tree.leaves(sub))
    return rows_of(state, lambda a, axis: lax.dynamic_update_slice_in_dim(a, next(parts), 0, axis=axis))


def row_of(state: State, slot) -> State:
    """Row ``slot`` of every per-row array, kept as a batch of one."""
    return rows_of(state, lambda a, axis: lax.dynamic_slice_in_dim(a, slot, 1, axis=axis))


def put_row(state: State, row: State, slot) -> State:
    parts = iter(jax.tree.leaves(row))
    return rows_of(state, lambda a, axis: lax.dynamic_update_slice_in_dim(a, next(parts), slot, axis=axis))


class SlotSteps:
    """The pure functions of slot serving over ``Steps`` (jitted by the backend)."""

    def __init__(self, steps: Steps):
        self.steps = steps

    def step(self, weights, state: State, rows: Rows, hold, *, k: int, arm: int, gamma: int, cfg: SamplingConfig,
             decode_rows: int = 1):
        """One step over the first k rows (``arm`` < 0: plain decoding, gamma 1: its emitted width 2);
        held rows ([B] ``hold``) are marked finished for the commit and restored after.
        Returns (state, rows, SlotOut)."""
        s = self.steps
        sub = first_rows(state, k)
        seeds, offset, held = Seeds(rows.seed_lo[:k], rows.seed_hi[:k]), rows.offset[:k], hold[:k]
        done_before, length_before = sub.seqs.done, sub.seqs.length
        sub = sub._replace(seqs=sub.seqs._replace(done=done_before | held))
        if arm < 0:
            sub, out = s.decode_one(weights, sub, cfg, seeds, offset, rows=decode_rows)
        else:
            proposal, sub = s.draft(arm, weights, sub, gamma, cfg, seeds, offset)
            z, sub = s.score(weights, sub, proposal)
            sub, out = s.commit(sub, s.verify(z, proposal, cfg, seeds, offset))
        done = jnp.where(held, done_before, sub.seqs.done)
        sub = sub._replace(seqs=sub.seqs._replace(done=done))
        count = sub.seqs.length - length_before  # [k] tokens appended
        j = jnp.arange(gamma + 1)[None]
        at = jnp.minimum(length_before[:, None] + j, sub.seqs.tokens.shape[1] - 1)
        emitted = jnp.where(j < count[:, None], jnp.take_along_axis(sub.seqs.tokens, at, axis=1), -1)
        rows = rows._replace(offset=rows.offset.at[:k].add(out.active.astype(jnp.int32)))
        return put_rows(state, sub, k), rows, SlotOut(out.num_accepted.astype(jnp.int32), out.active, done, emitted)

    def set_row(self, state: State, rows: Rows, slot, tokens, length, max_new, seed_lo, seed_hi, cached):
        """A request into row ``slot``: its tokens [S] (prompt, zero padded), length, budget, seed;
        step counter 0, not finished; each draft cache holds its first ``cached`` positions."""
        q = state.seqs
        seqs = q._replace(tokens=q.tokens.at[slot].set(tokens), length=q.length.at[slot].set(length),
                          prompt_len=q.prompt_len.at[slot].set(length), done=q.done.at[slot].set(False),
                          max_new=q.max_new.at[slot].set(max_new))
        drafts = tuple(d if d == () else (d[0], d[1].at[slot].set(cached)) for d in state.drafts)
        rows = Rows(rows.seed_lo.at[slot].set(seed_lo), rows.seed_hi.at[slot].set(seed_hi), rows.offset.at[slot].set(0))
        return State(seqs, state.cache, drafts), rows

    def fill(self, weights, state: State, slot, tokens, start, n):
        """Row ``slot``'s first ``n`` tokens of tokens [1, T] at positions start .. start + n - 1 (the
        rest is padding: its K/V land past them, stale): into the row's token history, the target's
        cache (and features) and each draft's cache, whose ``valid`` becomes start + n. Computed on
        that row alone."""
        s = self.steps
        row = row_of(state, slot)
        j = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
        pos = start + j
        old = jnp.take_along_axis(row.seqs.tokens, jnp.minimum(pos, row.seqs.tokens.shape[1] - 1), axis=1)
        seqs = row.seqs._replace(tokens=row.seqs.tokens.at[0, pos[0]].set(jnp.where(j < n, tokens, old)[0], mode="drop"))
        _, seqs, cache = s.run_target(weights, seqs, tokens, pos, row.cache, logits=False)
        drafts = []
        for d, (dcache, valid) in ((d, st) for d, st in zip(s.drafts, row.drafts) if st != ()):
            if isinstance(d, HeadDraft):
                p, embed = d.parts(weights)
                _, dcache = d.feed(p, embed, seqs, dcache, jnp.full((1,), start, jnp.int32), tokens.shape[1])
            else:
                _, dcache = d.model(weights)(tokens, pos, dcache, skip=d.skip, logits=False)
            drafts.append((dcache, jnp.full_like(valid, start + n)))
        drafts = iter(drafts)
        row = State(seqs, cache, tuple(st if st == () else next(drafts) for st in row.drafts))
        return put_row(state, row, slot)

    def set_length(self, state: State, slot, length):
        return state._replace(seqs=state.seqs._replace(length=state.seqs.length.at[slot].set(length)))


class JaxSlotBackend(JaxBackend):
    """``JaxBackend`` with slots: ``generate`` (``prefill``) and serving (``open_slots``) share the
    weights and compiled steps; whichever was called last owns ``state``."""

    slot_mode = False

    def jit_steps(self) -> None:
        super().jit_steps()
        s, donate = SlotSteps(self.steps), on_gpu()
        keep = lambda *names: dict(donate_argnames=names) if donate else {}  # noqa: E731
        self.slot_step_jit = jax.jit(self.on_leaves(s.step), static_argnames=("k", "arm", "gamma", "cfg", "decode_rows"), **keep("state", "rows"))
        self.set_row_jit = jax.jit(s.set_row, **keep("state", "rows"))
        self.fill_jit = jax.jit(self.on_leaves(s.fill), **keep("state"))
        self.set_length_jit = jax.jit(s.set_length, **keep("state"))

    def prefill(self, prompts, max_new_tokens) -> None:
        self.slot_mode = False
        super().prefill(prompts, max_new_tokens)

    def open_slots(self, slots: int, context: int) -> None:
        if self.steps is None:
            raise ValueError("set_drafts(...) must be called before open_slots")
        limit = self.config.max_position_embeddings
        check_open_slots(slots, context, limit)
        s_max = round_up(context + MARGIN, BUCKET)
        tokens = np.zeros((slots, s_max), np.int32)
        ones = np.ones(slots, np.int32)
        self.state = self.steps.prefill(self.weights, jnp.asarray(tokens), jnp.asarray(ones), 0, prefix=0)
        seqs = self.state.seqs._replace(done=jnp.ones(slots, bool), max_new=jnp.zeros(slots, jnp.int32))
        self.state = self.state._replace(seqs=seqs)
        zeros = jnp.zeros(slots, jnp.uint32)
        self.rows = Rows(zeros, zeros, jnp.zeros(slots, jnp.int32))
        self.context, self.s_max, self.slots = context, s_max, slots
        self.live = np.zeros(slots, bool)  # rows holding an admitted request (host)
        self.hold_host, self.hold = None, None
        self.slot_mode = True

    def check_slots(self, slots: Sequence[int]) -> None:
        if not self.slot_mode:
            raise RuntimeError("no slots are open: call open_slots first (a generate call since closed them)")
        if not all(isinstance(s, (int, np.integer)) and 0 <= s < self.slots for s in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"slots={list(slots)} must be distinct integers in [0, {self.slots})")

    def admit(self, slots, prompts, max_new_tokens, seeds, cached=None) -> None:
        self.check_slots(slots)
        cached = check_admit(slots, prompts, max_new_tokens, seeds, cached, self.context)
        for slot, p, m, seed, c in zip(slots, prompts, max_new_tokens, seeds, cached):
            row = np.zeros(self.s_max, np.int32)
            row[: len(p)] = p
            lo, hi = make_seeds(np.uint64(int(seed) % 2**64))
            self.state, self.rows = self.set_row_jit(self.state, self.rows, jnp.int32(slot), jnp.asarray(row),
                                                     jnp.int32(len(p)), jnp.int32(m), lo, hi, jnp.int32(c))
            if len(p) - 1 > c:  # K/V of every prompt token but the last (the first step feeds that)
                self.fill_row(int(slot), row[c : len(p) - 1], c)
            self.live[slot] = True

    def fill_row(self, slot: int, tokens: np.ndarray, start: int) -> None:
        """The target over one row's tokens at positions start.., zero padded to a power of two of
        at least PREFIX_BUCKET (few shapes to compile; the padding's K/V land past the prompt:
        stale, overwritten before they are read)."""
        t = max(PREFIX_BUCKET, 1 << (len(tokens) - 1).bit_length())
        padded = np.zeros((1, t), np.int32)
        padded[0, : len(tokens)] = tokens
        self.state = self.fill_jit(self.leaves, self.state, jnp.int32(slot), jnp.asarray(padded), jnp.int32(start),
                                   jnp.int32(len(tokens)))

    def prefill_chunk(self, slot: int, tokens: Sequence[int], start: int) -> None:
        """K/V of a free slot's prompt tokens at positions ``start`` .., over its earlier chunks; the
        row stays free, and held steps in between write past this chunk only."""
        self.check_slots([slot])
        if not tokens or start < 0 or start + len(tokens) >= self.context:
            raise ValueError(f"a chunk of {len(tokens)} tokens at {start} does not fit a slot's prompt "
                             f"(1 to {self.context - 1} tokens, start >= 0)")
        self.fill_row(slot, np.asarray(tokens, np.int32), start)
        self.state = self.set_length_jit(self.state, jnp.int32(slot), jnp.int32(start + len(tokens) + 1))

    def release(self, slots) -> None:
        """Host bookkeeping only: a released row is held in every later step until ``admit``."""
        if not slots:
            return
        self.check_slots(slots)
        self.live[list(slots)] = False

    def bucket(self) -> int:
        """The rows a step computes: a power of two above the highest slot in use."""
        used = np.flatnonzero(self.live)
        top = int(used[-1]) + 1 if len(used) else 1
        return min(1 << (top - 1).bit_length(), self.slots)

    def held(self, rows) -> jax.Array:
        """The [B] hold mask on the device (uploaded only when it changes)."""
        rows = np.asarray(rows, bool)
        if rows.shape != (self.slots,):
            raise ValueError(f"rows must be a [{self.slots}] bool mask, got shape {rows.shape}")
        hold = ~(rows & self.live)
        if self.hold_host is None or not np.array_equal(hold, self.hold_host):
            self.hold_host, self.hold = hold, jnp.asarray(hold)
        return self.hold

    def run_slots(self, arm: int, gamma: int, sampling: SamplingConfig, rows, k: int | None = None) -> SlotHandle:
        self.check_slots([])
        hold = self.held(rows)
        self.state, self.rows, out = self.slot_step_jit(self.leaves, self.state, self.rows, hold,
                                                        k=k or self.bucket(), arm=arm, gamma=gamma, cfg=sampling,
                                                        decode_rows=self.decode_rows)
        return SlotHandle(out)

    def step_slots(self, arm: int, gamma: int, sampling: SamplingConfig, rows) -> SlotHandle:
        if not 0 <= arm < len(self.drafts):
            raise ValueError(f"arm={arm} must name one of the {len(self.drafts)} drafts")
        return self.run_slots(arm, gamma, sampling, rows)

    def decode_slots(self, sampling: SamplingConfig, rows) -> SlotHandle:
        return self.run_slots(-1, 1, sampling, rows)

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        """In slot mode: compile now every bucket's step (each draft's at ``gamma``, and plain
        decoding) by running it with every row held (nothing emitted, no counter moves) and
        every prefill piece's length; returns the number of step shapes run."""
        if not self.slot_mode:
            return super().prepare(gamma, sampling)
        ran, k, nobody = 0, 1, np.zeros(self.slots, bool)
        while True:
            kinds = [(arm, gamma) for arm in range(len(self.drafts))] if gamma is not None else []
            for arm, g in [*kinds, (-1, 1)]:
                self.run_slots(arm, g, sampling, nobody, k).fetch()
                ran += 1
            if k == self.slots:
                return ran
            k = min(2 * k, self.slots)
