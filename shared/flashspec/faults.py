"""Faults found while generating: NaN or infinite logits out of a model.

A backend screens every step's logits on the device (no host synchronisation) and reports, per
row, which model produced non-finite values in ``StepView.bad``; it discards that row's step and
stops the row. The loop reads the flags with the step's other results, one step late, and raises
``NonFiniteLogitsError``; the engine attaches what was generated before (``.result``).
"""

from __future__ import annotations

import numpy as np

TARGET_LOGITS = 1  # StepView.bad bit: the target's logits had NaN / +-inf (or a row without a finite one)
DRAFT_LOGITS = 2  # the draft's logits or log-probabilities did


class NonFiniteLogitsError(RuntimeError):
    """A model produced NaN or infinite logits; nothing was sampled from them.

    ``step``: the step (0-based) whose logits were bad; ``rows``: the batch rows; ``models``:
    ``"target"`` and / or ``"draft"``; ``result``: the engine's result dict of the tokens produced
    before that step (``None`` when raised by the loop alone).
    """

    def __init__(self, step: int, rows: list[int], models: list[str]):
        self.step, self.rows, self.models = step, rows, models
        self.result: dict | None = None
        super().__init__(
            f"step {step}: the {' and '.join(models)} model produced NaN or infinite logits for batch "
            f"row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}; generation stopped and that "
            "step's tokens were discarded (the tokens generated before it are kept: .result)"
        )


def check_finite(bad: np.ndarray | None, step: int) -> None:
    """Raise NonFiniteLogitsError if any row of a step was flagged (``bad`` [B] int bit mask)."""
    if bad is None or not bad.any():
        return
    rows = [int(r) for r in np.nonzero(bad)[0]]
    bits = int(np.bitwise_or.reduce(bad.astype(np.int64)))
    models = [name for bit, name in ((TARGET_LOGITS, "target"), (DRAFT_LOGITS, "draft")) if bits & bit]
    raise NonFiniteLogitsError(step, rows, models)
