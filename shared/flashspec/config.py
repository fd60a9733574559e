"""Frozen, validated configuration objects."""

from __future__ import annotations

import sys
from dataclasses import dataclass


MIN_TEMPERATURE = 1e-6  # below it z / T overflows float32 for ordinary logits; use 0 for greedy
MAX_TEMPERATURE = 3.4028234663852886e38  # float32's largest finite value: every backend scales z / T in float32


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are sampled: temperature, then top-k, then top-p (nucleus).

    ``temperature == 0`` means greedy; ``top_k == 0`` and ``top_p == 1.0`` mean off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= sys.float_info.max:
            raise ValueError(
                f"temperature={t!r} must be a finite number >= 0 (0 means greedy)"
            )
        if t > MAX_TEMPERATURE:
            raise ValueError(f"temperature={t!r} must be at most {MAX_TEMPERATURE} (float32's largest value: z / T is "
                             "computed in float32)")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature={t!r} must be 0 (greedy) or >= {MIN_TEMPERATURE}: "
                             "smaller ones overflow z / T in float32")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k={k!r} must be an integer >= 0 (0 means off)")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p={p!r} must be a number in (0, 1] (1.0 means off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0
