"""The protocol a backend implements so that ``flashspec.loop`` can drive it.

The loop never looks inside an array: drafts, logits and results are opaque to it. The only
host values it reads are those of ``StepHandle.fetch()``, one step late, so that on a GPU the
host never waits for the device inside a step (the accepted counts drive the cache positions
on the device; the host needs them only for the policy and the stop check).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .config import SamplingConfig


@dataclass(frozen=True)
class StepView:
    """What the host learns about one step, once it is finished."""

    num_accepted: np.ndarray  # [B] int: accepted drafted tokens per row
    active: np.ndarray  # [B] bool: the row was still generating during this step
    done: np.ndarray  # [B] bool: the row has finished (EOS or length) after this step
    bad: np.ndarray | None = None  # [B] uint8: flashspec.faults bits, the model(s) whose logits were not finite
    emitted: np.ndarray | None = None  # [B, W] int: the tokens appended to each row by this step, then -1 (slot steps)
    # full information (``FreeScoring``): per draft and row, the emitted tokens a draft not run was scored on
    # and how many of them it would have had accepted (0 scored: not scored); None: nothing scored
    free_scored: np.ndarray | None = None  # [D, B] int
    free_accepted: np.ndarray | None = None  # [D, B] int
    drafted: np.ndarray | None = None  # [B] int: tokens each row proposed (L_b <= G under a dynamic length); None: G


@runtime_checkable
class FeatureDraft(Protocol):
    """A draft that drafts from the target's hidden states (an EAGLE-style head).

    A backend given such a draft keeps, for every position it has fed to the target (prefill,
    every scoring pass, every plain decoding step), the target's residual stream after each layer
    of ``feature_layers`` (concatenated in that order), in the token history it hands its drafts
    (the torch backend: ``Sequences.features``, [B, S, len(feature_layers) * C]). Entries past a
    row's committed tokens are stale and rewritten before they are read, as K/V are. A backend
    without such drafts computes and keeps nothing more."""

    feature_layers: tuple[int, ...]  # target layers, each in [0, num_layers)


def feature_layers(drafts) -> tuple[int, ...]:
    """The target layers every FeatureDraft among ``drafts`` reads (they must agree: one buffer serves all)."""
    wanted = {tuple(d.feature_layers) for d in drafts if isinstance(d, FeatureDraft)}
    if len(wanted) > 1:
        raise ValueError(f"draft heads reading different target layers {sorted(wanted)} cannot share one engine")
    return wanted.pop() if wanted else ()


@runtime_checkable
class FreeScoring(Protocol):
    """A backend that can score, on every step, the drafts it did not run (``StepView.free_scored``)."""

    def score_free(self, gamma: int) -> int:
        """From now on score each draft whose proposal can be recomputed from the history at ``gamma``
        tokens on every step (0: stop). Returns how many drafts are scored."""


class StepHandle(Protocol):
    def fetch(self) -> StepView:
        """Block until the step's small results are on the host (called one step late)."""


@runtime_checkable
class Backend(Protocol):
    """Everything ``flashspec.loop`` and the engines call on a backend; nothing else is reached.

    How a backend drafts, scores, verifies and commits inside ``step`` is its own affair (the
    fake backend and the torch backend's eager path keep them as separate methods)."""

    draft_names: Sequence[str]  # one name per arm

    def prefill(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Start a batch: run the target (and drafts) over the prompts. Prepares nothing."""

    def prepare(self, gamma: int | None, sampling: SamplingConfig) -> int:
        """Make ready now, for the batch ``prefill`` started, every step kind a request with these
        settings can run: each draft's speculative step at ``gamma`` (None: none) and plain
        decoding (the torch backend on CUDA captures their CUDA graphs). A step kind not prepared
        is made ready when first run. Returns how many kinds were newly prepared (0: nothing to do)."""

    def step(self, arm: int, gamma: int, sampling: SamplingConfig, seed: Any, offset: int) -> StepHandle:
        """One speculative step as a unit: draft G tokens with draft ``arm`` (DRAFT stream), score
        the G+1 positions, verify (FINAL stream), append the emitted tokens, advance the caches by
        num_accepted + 1 and roll back the rest, flag finished rows; start the asynchronous copy
        of the step's small results."""

    def decode_one(self, sampling: SamplingConfig, seed: Any, offset: int) -> StepHandle:
        """One step of plain autoregressive decoding (one target forward, one token per live row,
        FINAL stream at position 0), committed as ``step`` commits."""

    def outputs(self) -> list[list[int]]:
        """The new tokens of every row (host), after the last step."""



@runtime_checkable
class SlotBackend(Backend, Protocol):
    """What ``flashspec.scheduler`` calls besides ``Backend``: a fixed set of rows (slots) that
    requests enter and leave between steps (continuous batching).

    After ``open_slots`` each row carries its own seed, step counter (the generator's offset,
    counted from its admission) and token budget, so a request's tokens do not depend on the rows
    around it (with a fixed draft choice). Slot steps read the emitted tokens back with the
    step's other small results (``StepView.emitted``), one step late, like every step."""

    def open_slots(self, slots: int, context: int) -> None:
        """Make ``slots`` empty rows, each holding up to ``context`` tokens (prompt + new)."""

    def admit(self, slots: Sequence[int], prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
              seeds: Sequence[int], cached: Sequence[int] | None = None) -> None:
        """Put one request into each (free) slot: its prompt's K/V (prefill), its budget, its seed.
        ``cached[i]``: the prompt's first tokens whose K/V ``prefill_chunk`` put in the slot already
        (None: none); admit computes the rest."""

    def prefill_chunk(self, slot: int, tokens: Sequence[int], start: int) -> None:
        """K/V of a free slot's prompt tokens at positions ``start`` .. (a long prompt's chunk, over
        its earlier chunks in the slot); the slot stays free, and steps in between do not disturb it."""

    def release(self, slots: Sequence[int]) -> None:
        """Finish these rows now (a cancelled or completed request): they take part in no later step."""

    def step_slots(self, arm: int, gamma: int, sampling: SamplingConfig, rows: np.ndarray) -> StepHandle:
        """``step`` over the rows where ``rows`` ([B] bool) is set; the others are held (nothing
        emitted, their step counters unchanged). Seeds and offsets are the rows' own."""

    def decode_slots(self, sampling: SamplingConfig, rows: np.ndarray) -> StepHandle:
        """``decode_one`` over the rows where ``rows`` is set, as ``step_slots``."""


def check_open_slots(slots, context, limit: int) -> None:
    """``open_slots``' arguments (``limit``: the model's context)."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots={slots!r} must be an integer >= 1 (the most requests served at once)")
    if isinstance(context, bool) or not isinstance(context, int) or not 2 <= context <= limit:
        raise ValueError(f"context={context!r} must be an integer in [2, {limit}] (the model's context)")


def check_admit(slots, prompts, max_new_tokens, seeds, cached, context: int) -> list[int]:
    """``admit``'s per-request lists (the slots themselves are the backend's to check); returns
    ``cached`` as a list of ints (None: zeros)."""
    cached = [0] * len(slots) if cached is None else [int(c) for c in cached]
    if not (len(slots) == len(prompts) == len(max_new_tokens) == len(seeds) == len(cached)) or not slots:
        raise ValueError("admit takes one prompt, max_new_tokens, seed and cached count per slot, for at least one slot")
    for p, m, c in zip(prompts, max_new_tokens, cached):
        if len(p) == 0 or m < 1 or len(p) + m > context:
            raise ValueError(f"a prompt of {len(p)} tokens with max_new_tokens={m} does not fit a slot of "
                             f"{context} tokens (each needs >= 1)")
        if not 0 <= c < len(p):
            raise ValueError(f"cached={c}: a prompt of {len(p)} tokens has 0 to {len(p) - 1} tokens prefilled")
    return cached
