"""The adaptive policy's corrections for what its per-token model misses (``flashspec.adaptive.AdaptivePolicy``
inherits ``Calibration``; issue #35, ad21), both from finished steps only:

* ``bias``: per draft, the tokens its rows accepted over those the posterior predicted for the same rows and windows
  just before each step (``note_bias``), which scales the accepted part of the draft's value: one per-token rate
  misses an n-gram's runs of misses then hits on a row (replay of the H100 run of 2026-12-07: the n-gram accepted
  1.03-1.19x its prediction, the replay draft 0.84-1.05x);
* ``rate_spread``: in a static batch's finish (``flashspec.throughput.finish_steps``), each row's unknown rate, from
  the last batch's between-row variance of acceptance (``measure_spread``), narrowed by the row's own trials: the
  batch ends with its slowest rows, which a fresh batch's rows, all at the pool's mean, do not show.

``Calibration`` is a mixin: it reads the policy's counts (``succ``, ``fail``, ``row_succ``, ``row_fail``,
``row_active``) and estimates (``counts``, ``posterior_mean``, ``profile``), and keeps ``real``, ``predicted`` and
``row_spread`` on the policy.
"""

from __future__ import annotations

import numpy as np

from .throughput import emitted_moments, emitted_slope

BIAS_PRIOR = 16.0  # tokens' worth of an unbiased model each draft's ``bias`` starts from
BIAS_EVIDENCE = 8.0  # a row's own trials at which its step counts half in ``bias`` (a prior-only guess: nothing)


class Calibration:
    """``bias`` / ``note_bias`` / ``rate_spread`` / ``measure_spread`` of ``AdaptivePolicy`` (module docstring)."""

    def bias(self) -> np.ndarray:  # [drafts]
        """Per draft, its accepted tokens over those its posterior predicted for the same rows and windows before
        each step (``_add``; discounted as the counts, ``BIAS_PRIOR`` tokens of 1 to start): the rate's correction
        for what the per-token model misses (an n-gram's runs of misses, then of hits, on each row)."""
        return (self.real + BIAS_PRIOR) / (self.predicted + BIAS_PRIOR)

    def note_bias(self, draft: int, drafted: np.ndarray, accepted: np.ndarray, where: np.ndarray | None,
                  alpha: np.ndarray, profile: np.ndarray) -> None:
        """Add a step's accepted tokens on ``draft`` and what the posterior predicted for them (``bias``): ``alpha``
        [rows] (or [1]: pooled) the rows' posterior means before the step (``row_alpha``), ``profile`` [K] the
        draft's; each row weighted by its own trials n / (n + ``BIAS_EVIDENCE``) (pooled: the pool's)."""
        mean, _ = emitted_moments(np.broadcast_to(alpha, drafted.shape), drafted.astype(np.float64), profile)
        if self.row_succ is not None and where is not None:
            own = self.row_succ[draft, where] + self.row_fail[draft, where]
        else:
            own = np.full(drafted.shape, self.succ[draft] + self.fail[draft])
        weight = own / (own + BIAS_EVIDENCE)  # [rows]: a row's prior-only guess counts little
        self.predicted[draft] += float((weight * (mean - 1.0)).sum())
        self.real[draft] += float((weight * accepted).sum())

    def rate_spread(self, alpha: np.ndarray, length: np.ndarray, profile: np.ndarray, draft: np.ndarray,
                    mean: np.ndarray, left: np.ndarray) -> np.ndarray:  # [arms, R]
        """The per-step variance that adds, to ``finish_steps``' renewal count (left var / mean^3), the spread of a
        row's steps that comes from not knowing its own rate: (left / mean^2)^2 (d mean / d alpha)^2 v_b, with v_b
        the uncertainty of row b's acceptance: the last batch's between-row variance (``row_spread``) narrowed by the
        row's own trials, 1 / (1 / tau^2 + n_b / (alpha_b (1 - alpha_b))). Without it a fresh static batch is priced
        as if every row ran at the pool's mean, while its slowest rows (H100, Llama-3-8B's shape, b256, n-gram G = 2:
        47.8 steps a row on average, 63 for the last) set its end."""
        tau2 = self.row_spread[draft][:, None]  # [arms, 1]
        if not tau2.any():
            return np.zeros_like(mean)
        trials = (self.row_succ + self.row_fail)[:, self.row_active][draft]  # [arms, R]
        a = np.clip(alpha[draft], 0.02, 0.98)
        v = np.where(tau2 > 0, 1.0 / (1.0 / np.maximum(tau2, 1e-12) + trials / (a * (1.0 - a))), 0.0)
        return left * emitted_slope(alpha[draft], length, profile) ** 2 * v / mean

    def measure_spread(self) -> None:
        """Each draft's between-row variance of per-token acceptance over the batch just ended (``row_spread``):
        the variance of its rows' own acceptance less its sampling part (method of moments, rows with at least two
        trials of their own; a draft with fewer than two such rows keeps its last)."""
        if self.row_succ is None:
            return
        n = self.row_succ + self.row_fail  # [drafts, B]
        for d in range(len(self.succ)):
            seen = n[d] >= 2.0
            if np.count_nonzero(seen) < 2:
                continue
            p = (self.row_succ[d, seen] + 0.5) / (n[d, seen] + 1.0)
            self.row_spread[d] = max(0.0, float(p.var() - np.mean(p * (1.0 - p) / (n[d, seen] + 1.0))))
