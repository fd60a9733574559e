"""The protocol a backend implements so that ``flashspec.loop`` can drive it.

The loop never looks inside an array: drafts, logits and results are opaque to it. The only
host values it reads are those of ``StepHandle.fetch()``, one step late, so that on a GPU the
host never waits for the device inside a step (the accepted counts drive the cache positions
on the device; the host needs them only for the policy and the stop check).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .config import SamplingConfig


@dataclass(frozen=True)
class StepView:
    """What the host learns about one step, once it is finished."""

    num_accepted: np.ndarray  # [B] int: accepted drafted tokens per row
    active: np.ndarray  # [B] bool: the row was still generating during this step
    done: np.ndarray  # [B] bool: the row has finished (EOS or length) after this step
    bad: np.ndarray | None = None  # [B] uint8: flashspec.faults bits, the model(s) whose logits were not finite


class StepHandle(Protocol):
    def fetch(self) -> StepView:
        """Block until the step's small results are on the host (called one step late)."""


class Backend(Protocol):
    draft_names: Sequence[str]  # one name per arm

    def prefill(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """Start a batch: run the target (and drafts) over the prompts."""

    def draft(self, arm: int, gamma: int, sampling: SamplingConfig, seed: Any, offset: int) -> Any:
        """Draft G tokens per row with draft ``arm`` (DRAFT stream); opaque proposal."""

    def score(self, proposal: Any) -> Any:
        """Target logits at the G drafted positions and the bonus position: [B, G+1, V]."""

    def verify(self, target_logits: Any, proposal: Any, sampling: SamplingConfig, seed: Any, offset: int) -> Any:
        """The verify kernel on the device; returns a VerifyResult of device arrays."""

    def commit(self, result: Any) -> StepHandle:
        """Append the emitted tokens, advance caches by num_accepted + 1, roll back the rest,
        flag finished rows; start the asynchronous copy of the step's small results."""

    # Optional: ``step(arm, gamma, sampling, seed, offset) -> StepHandle`` runs draft, score,
    # verify and commit as one unit (flashspec.loop.speculative_step uses it when present).

    def outputs(self) -> list[list[int]]:
        """The new tokens of every row (host), after the last step."""
