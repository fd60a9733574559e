"""Continuous batching on the torch backend: ``flashspec.backend.SlotBackend`` over ``TorchBackend``.

``open_slots`` allocates a fixed batch of rows; requests enter a free row (``admit``: its prompt's
K/V computed in a small cache of its own, then copied into the row; a long prompt's first chunks
first, by ``prefill_chunk`` calls between steps, straight into the row) and leave it (``release``)
between steps. Each row keeps its own seed, step counter and token budget on the device, so a
request's tokens depend on its prompt and seed only (with a fixed draft). A slot step runs over the
whole batch; rows outside ``rows`` (another sampling setting's requests) are held: marked finished
for the commit, then restored, so they emit nothing and their counters stay. Graphed, a slot step is
one CUDA-graph replay like a ``generate`` step, and emits its appended tokens with the small results
that the scheduler reads one step late.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from flashspec.backend import FeatureDraft, StepView, check_admit, check_open_slots
from flashspec.config import SamplingConfig

from .backend import TorchBackend
from .device import next_pow2
from .drafts import ModelDraft, Sequences
from .free import expand, recomputable

MARGIN = 66  # slots past a row's budget that a step may write (gamma <= 64, plus the bonus token)
# per-row buffers that a step over the first k rows sees as their [:k] views
ROW_BUFFERS = ("done", "active", "bad", "seed", "offset", "hold", "done_before", "length_before", "prompt_len", "max_new",
               "drafted")


@dataclass
class CacheView:
    """The first rows of a KVCache, as the model reads one (each layer's [k, H_kv, S, D] is contiguous)."""

    k: torch.Tensor  # [layers, k, H_kv, S, D]
    v: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class SlotHandle:
    """A slot step's small results (num_accepted, active, done, bad, drafted, then the full-information
    counts [2, R, k] when scored, then the emitted tokens), copied to the host without blocking;
    ``drafts``: (D, then the recomputable drafts' indices) for the counts."""

    def __init__(self, tensors: list[torch.Tensor], event, drafts: tuple[int, ...]):
        self.tensors, self.event, self.drafts = tensors, event, drafts
        self.faulty: np.ndarray | None = None  # [slots] bool, the backend's: rows flagged here are marked in it

    def fetch(self) -> StepView:
        if self.event is not None:
            self.event.synchronize()
        values = [t.numpy().copy() for t in self.tensors]
        n, active, done, bad, drafted, emitted = *values[:5], values[-1]
        if self.faulty is not None:
            self.faulty[: len(bad)] |= bad != 0
        free = None
        if len(values) == 7:  # [2, R, k] -> (scored, accepted) [D, k] each
            free = [expand(c, self.drafts[0], list(self.drafts[1:])) for c in values[5]]
        return StepView(n, active, done, bad, emitted, free_scored=None if free is None else free[0],
                        free_accepted=None if free is None else free[1], drafted=drafted)


class SlotMirror:
    """Pinned host buffers for the slot steps' results, two per emitted width used in turn (as
    ``backend.HostMirror``: a buffer is rewritten two steps after its copy, when it was read)."""

    def __init__(self, batch: int, device: torch.device, drafts: tuple[int, ...]):
        self.batch, self.device, self.turn, self.buffers, self.drafts = batch, device, 0, {}, drafts

    def start(self, *tensors: torch.Tensor) -> SlotHandle:
        if self.device.type != "cuda":
            return SlotHandle([t.clone() for t in tensors], None, self.drafts)
        shape = (*tensors[-1].shape, len(tensors))  # (rows of the bucket, emitted width, with or without counts)
        pair = self.buffers.get(shape)
        if pair is None:
            pair = self.buffers[shape] = [[torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
                                          for _ in range(2)]
        slot = pair[self.turn]
        self.turn ^= 1
        for h, t in zip(slot, tensors):
            h.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return SlotHandle(slot, event, self.drafts)


class TorchSlotBackend(TorchBackend):
    """``TorchBackend`` with slots: ``generate`` (``prefill``) and serving (``open_slots``) use
    the same buffers and kernels; whichever was called last owns the batch.

    A slot step runs over the first k rows only, k the power of two (at most the slot count)
    above the highest slot in use: requests fill the lowest free slots, so a lightly loaded
    server computes few rows. Each bucket is its own CUDA graph, over views of the same buffers."""

    slot_mode = False

    def prefill(self, prompts, max_new_tokens, margin: int = MARGIN) -> None:
        self.slot_mode = False
        super().prefill(prompts, max_new_tokens, margin)

    def open_slots(self, slots: int, context: int) -> None:
        limit = self.target.config.max_position_embeddings
        check_open_slots(slots, context, limit)
        trees = [d.name for d in self.drafts if getattr(d, "tree", False)]
        if trees:
            raise ValueError(f"drafts {trees} draft trees, which serving slots do not run yet (only generate's "
                             "steps do): serve with head or another chain draft")
        self.allocate(slots, context + MARGIN)
        dev = self.device
        self.context = context
        self.offset = torch.zeros(slots, dtype=torch.int64, device=dev)  # each row's own step counter
        self.hold = torch.zeros(slots, dtype=torch.bool, device=dev)  # rows sitting this step out
        self.done_before = torch.zeros(slots, dtype=torch.bool, device=dev)
        self.length_before = torch.zeros(slots, dtype=torch.int64, device=dev)
        self.done.fill_(True)  # every slot is free
        self.seqs.length.fill_(1)
        self.prompt_len.fill_(1)
        self.hold_rows = np.zeros(slots, bool)
        self.bound = np.zeros(slots, np.int64)  # host upper bound of each row's length
        self.faulty = np.zeros(slots, bool)  # rows read back with NaN / inf logits, scrubbed before reuse
        self.seqs.max_len_bound, self.seqs.step = 1, 0
        self.slot_mirror = SlotMirror(slots, dev, (len(self.drafts), *recomputable(self.drafts)))
        self.whole = self.seqs  # the whole batch's Sequences (steps see views of the first rows)
        for d in self.drafts:
            d.start(slots, self.shape[1])
        self.slot_mode = True

    def check_slots(self, slots: Sequence[int]) -> torch.Tensor:
        if not self.slot_mode:
            raise RuntimeError("no slots are open: call open_slots first (a generate call since closed them)")
        b = self.shape[0]
        if not all(isinstance(s, (int, np.integer)) and 0 <= s < b for s in slots) or len(set(slots)) != len(slots):
            raise ValueError(f"slots={list(slots)} must be distinct integers in [0, {b})")
        return self.upload(torch.tensor([int(s) for s in slots], dtype=torch.int64))

    def upload(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device without a host wait: through pinned memory, whose caching
        allocator keeps the block until the copy has run."""
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t

    def admit(self, slots, prompts, max_new_tokens, seeds, cached=None) -> None:
        idx = self.check_slots(slots)
        cached = check_admit(slots, prompts, max_new_tokens, seeds, cached, self.context)
        self.scrub_faulty(slots)
        n, longest = len(slots), max(len(p) for p in prompts)
        host = torch.zeros((n, longest), dtype=torch.int64)
        for i, p in enumerate(prompts):
            host[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.int64)
        lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
        per_row = self.upload(torch.stack([lens, torch.tensor([int(m) for m in max_new_tokens]),
                                           torch.tensor([int(s) for s in seeds])]))  # [3, n]
        tokens = self.upload(host)
        self.seqs.tokens[idx, :longest] = tokens
        for buf in (self.seqs.length, self.prompt_len):
            buf[idx] = per_row[0]
        self.max_new[idx] = per_row[1]
        self.seed[idx] = per_row[2]
        self.offset[idx] = 0
        self.bad[idx] = 0
        fresh = [i for i, c in enumerate(cached) if c == 0]
        longest = max((len(prompts[i]) for i in fresh), default=1)
        if longest > 1:  # K/V of every prompt token but the last, in a cache of these rows only
            # device indices (``upload``): a Python list index is copied with a blocking copy, a stream sync that
            # makes the host wait for the step in flight inside StepTimer.outside (docs/adaptive.md)
            pick = self.upload(torch.tensor(fresh, dtype=torch.int64))
            rows = idx if len(fresh) == n else idx.index_select(0, pick)
            cache = self.target.new_cache(len(fresh), longest - 1)
            pos = torch.arange(longest - 1, device=self.device)[None].expand(len(fresh), -1)
            feats = self.prefill_kv(tokens.index_select(0, pick)[:, : longest - 1], pos, cache, longest - 1)
            self.cache.k[:, rows, :, : longest - 1] = cache.k
            self.cache.v[:, rows, :, : longest - 1] = cache.v
            if feats is not None:
                self.seqs.features[rows, : longest - 1] = feats.to(self.seqs.features.dtype)
        for i, c in enumerate(cached):  # the rest of a prompt whose first chunks are in its row already
            if c and len(prompts[i]) - 1 > c:
                self.fill_row(int(slots[i]), tokens[i : i + 1, c : len(prompts[i]) - 1], c)
        self.catch_up_admitted([int(s) for s in slots], [len(p) for p in prompts])
        self.done[idx] = False
        self.bound[list(slots)] = lens.numpy()
        self.seqs.max_len_bound = min(int(self.bound.max()), self.shape[1])

    def scrub_faulty(self, slots: Sequence[int]) -> None:
        """Zero the K/V rows (the drafts' caches and the features too) of those ``slots`` whose last request
        had NaN or infinite logits (``faulty``, marked when a step's results are read), before the slot
        takes a new request: stale NaN past the new prompt would reach it through attention
        (0 x NaN is NaN). Other slots, and slots without a fault, are not touched."""
        dirty = [int(s) for s in slots if self.faulty[int(s)]]
        if not dirty:
            return
        idx = self.upload(torch.tensor(dirty, dtype=torch.int64))  # no host wait for the step in flight
        caches = [self.cache] + [d.cache for d in self.drafts if isinstance(d, (ModelDraft, FeatureDraft))]
        for cache in caches:
            cache.k[:, idx] = 0
            cache.v[:, idx] = 0
        if self.seqs.features is not None:
            self.seqs.features[idx] = 0
        self.faulty[dirty] = False

    def catch_up_admitted(self, slots: list[int], lens: list[int]) -> None:
        """Each draft with a cache of its own (a model draft, a head) fed the admitted rows' prompts
        now, row by row over views of those rows, so that the next step's fixed-shape ``propose``
        finds them as current as the others: the rows already running are not fed again."""
        seqs = self.seqs
        for d in self.drafts:
            if not isinstance(d, (ModelDraft, FeatureDraft)):
                continue
            cache, valid, used_at = d.cache, d.valid, d.used_at
            try:
                for s, n in zip(slots, lens):
                    d.cache = CacheView(cache.k[:, s : s + 1], cache.v[:, s : s + 1])
                    d.valid, d.used_at = valid[s : s + 1], None
                    d.valid.zero_()
                    row = Sequences(seqs.tokens[s : s + 1], seqs.length[s : s + 1], n, seqs.step,
                                    None if seqs.features is None else seqs.features[s : s + 1])
                    d.catch_up(row, 1)  # positions 0 .. n - 1 (used_at None: the row's whole prompt)
            finally:
                d.cache, d.valid, d.used_at = cache, valid, used_at

    def prefill_chunk(self, slot: int, tokens: Sequence[int], start: int) -> None:
        """K/V (and the feature drafts' features) of a free slot's prompt tokens at positions
        ``start`` .. ``start + len(tokens) - 1``, over its K/V before ``start`` (earlier chunks).
        The row stays free: the held steps in between write at positions past this chunk only."""
        self.check_slots([slot])
        if not tokens or start < 0 or start + len(tokens) >= self.context:
            raise ValueError(f"a chunk of {len(tokens)} tokens at {start} does not fit a slot's prompt "
                             f"(1 to {self.context - 1} tokens, start >= 0)")
        self.scrub_faulty([slot])
        host = torch.as_tensor(list(tokens), dtype=torch.int64)[None]
        self.fill_row(slot, self.upload(host), start)
        self.seqs.length[slot] = start + len(tokens) + 1  # what a held step writes lands after the chunk

    def fill_row(self, slot: int, tokens: torch.Tensor, start: int) -> None:  # tokens [1, T] on the device
        """The target over one row's tokens at positions start.., straight into that row's cache."""
        t = tokens.shape[1]
        view = CacheView(self.cache.k[:, slot : slot + 1], self.cache.v[:, slot : slot + 1])
        pos = torch.arange(start, start + t, device=self.device)[None]
        feats = self.prefill_kv(tokens, pos, view, start + t)
        if feats is not None:
            self.seqs.features[slot, start : start + t] = feats[0].to(self.seqs.features.dtype)

    def prefill_kv(self, tokens, pos, cache, attend: int):  # tokens, pos [n, T] -> features [n, T, F] or None
        """K/V of tokens at pos into ``cache``; the feature drafts' features, if any, returned."""
        if not self.hidden:
            self.target(tokens, pos, cache, attend, logits_last=0)
            return None
        return self.target(tokens, pos, cache, attend, logits_last=0, hidden=self.hidden)[1]

    def release(self, slots) -> None:
        """Host bookkeeping only: a released row is held in every later step (``set_rows``), so it
        emits nothing and its state stays, until ``admit`` gives the slot a new request."""
        if not slots:
            return
        self.check_slots(slots)
        self.bound[list(slots)] = 0

    def state(self) -> list[torch.Tensor]:
        return super().state() + ([self.offset] if self.slot_mode else [])

    def set_rows(self, rows: np.ndarray) -> None:
        """The held rows (not in ``rows``, or released) into the device buffer, copied (without a
        host wait) only when they change."""
        rows = np.asarray(rows, bool)
        if rows.shape != (self.shape[0],):
            raise ValueError(f"rows must be a [{self.shape[0]}] bool mask, got shape {rows.shape}")
        hold = ~(rows & (self.bound > 0))
        if np.array_equal(hold, self.hold_rows):
            return
        self.hold.copy_(self.upload(torch.from_numpy(hold)))
        self.hold_rows = hold

    def bucket(self) -> int:
        """The rows a step computes: a power of two above the highest slot in use."""
        used = np.flatnonzero(self.bound > 0)
        return min(next_pow2(int(used[-1]) + 1 if len(used) else 1), self.shape[0])

    @contextlib.contextmanager
    def first_rows(self, k: int):
        """Inside, every per-row buffer (the caches, the drafts' too) is its view of the first k rows."""
        if k == self.shape[0]:
            yield
            return
        saved = {name: getattr(self, name) for name in ROW_BUFFERS}
        saved["free"] = self.free  # [2, R, B]: its rows are the last axis
        seqs, cache = self.seqs, self.cache
        drafts = [(d, d.cache, d.valid) for d in self.drafts if isinstance(d, (ModelDraft, FeatureDraft))]
        try:
            for name in ROW_BUFFERS:
                setattr(self, name, saved[name][:k])
            self.free = saved["free"][:, :, :k]
            self.seqs = Sequences(seqs.tokens[:k], seqs.length[:k], seqs.max_len_bound, seqs.step,
                                  None if seqs.features is None else seqs.features[:k])
            self.cache = CacheView(cache.k[:, :k], cache.v[:, :k])
            for d, c, valid in drafts:
                d.cache, d.valid = CacheView(c.k[:, :k], c.v[:, :k]), valid[:k]
            yield
        finally:
            for name, t in saved.items():
                setattr(self, name, t)
            self.seqs, self.cache = seqs, cache
            for d, c, valid in drafts:
                d.cache, d.valid = c, valid

    def step_slots(self, arm: int, gamma: int, sampling: SamplingConfig, rows) -> SlotHandle:
        self.check_slots([])
        self.set_rows(rows)
        draft, k = self.drafts[arm], self.bucket()
        graphed = self.graphed and draft.capturable
        with self.first_rows(k):
            if graphed and draft.lagging(self.seqs, gamma):
                draft.catch_up(self.seqs, gamma)
            run = self.slot_run(lambda: draft.propose(self.seqs, gamma, sampling, self.seed, self.offset,
                                                      graphed=graphed), sampling)
            key = ("slots", k, arm, gamma, sampling, self.free_gamma)
            out = self.graphs.replay(key, run, self.state()) if graphed else run()
            draft.mark_used(self.seqs, gamma)
            return self.slot_host(out, rows, gamma + 1)

    def decode_slots(self, sampling: SamplingConfig, rows) -> SlotHandle:
        self.check_slots([])
        self.set_rows(rows)
        k = self.bucket()
        with self.first_rows(k):
            run = self.slot_run(None, sampling)
            key = ("slots-plain", k, sampling, self.free_gamma)
            out = self.graphs.replay(key, run, self.state()) if self.graphed else run()
            return self.slot_host(out, rows, 2)

    def slot_run(self, propose, sampling: SamplingConfig):
        """The device work of one slot step (``propose`` None: plain decoding); returns
        (num_accepted [B], emitted [B, W]: the appended tokens, then -1)."""

        def run():
            self.done_before.copy_(self.done)
            self.done.logical_or_(self.hold)
            self.length_before.copy_(self.seqs.length)
            if propose is None:
                r, drafted = self.sample_next(sampling, self.seed, self.offset), 0
            else:
                p = propose()
                r = self.verify(self.score(p), p, sampling, self.seed, self.offset)
                drafted = p.tokens.shape[1] if p.lengths is None else p.lengths
            self.commit_device(r, drafted)
            self.done.copy_(torch.where(self.hold, self.done_before, self.done))
            self.offset.add_(self.active.to(torch.int64))
            count = self.seqs.length - self.length_before
            j = torch.arange(r.tokens.shape[1], device=self.device)
            return r.num_accepted, torch.where(j[None] < count[:, None], r.tokens, -1)

        return run

    def slot_host(self, out, rows, width: int) -> SlotHandle:
        """Host bookkeeping of a slot step (inside ``first_rows``): the length bounds, the step
        count (of the whole batch's Sequences too), the asynchronous copy of the results."""
        num_accepted, emitted = out
        live = np.asarray(rows, bool) & (self.bound > 0)
        self.bound[live] += width
        for seqs in {id(s): s for s in (self.seqs, self.whole)}.values():
            seqs.max_len_bound = min(int(self.bound.max(initial=1)), self.shape[1])
            seqs.step += 1
        free = [self.free] if self.free_gamma else []  # full-information counts (flashspec_torch.free)
        handle = self.slot_mirror.start(num_accepted.to(torch.int32), self.active, self.done, self.bad, self.drafted,
                                        *free, emitted)
        handle.faulty = self.faulty
        return handle

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        if not self.slot_mode:
            return super().prepare(gamma, sampling)
        if not self.graphed:
            return 0
        captured, k = 0, 1
        while True:  # every bucket: 1, 2, 4, ... and the slot count
            with self.first_rows(k):
                for arm, d in enumerate(self.drafts if gamma is not None else []):
                    if d.capturable:
                        run = self.slot_run(lambda d=d: d.propose(self.seqs, gamma, sampling, self.seed, self.offset,
                                                                  graphed=True), sampling)
                        captured += self.graphs.capture(("slots", k, arm, gamma, sampling, self.free_gamma), run,
                                                        self.state())
                captured += self.graphs.capture(("slots-plain", k, sampling, self.free_gamma),
                                                self.slot_run(None, sampling), self.state())
            if k == self.shape[0]:
                return captured
            k = min(2 * k, self.shape[0])
