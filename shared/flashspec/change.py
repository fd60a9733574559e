"""The adaptive policy's change test (``flashspec.adaptive.AdaptivePolicy`` inherits ``ChangeTest``): a step whose
first-position acceptance on a draft contradicts both its rows' own posteriors there and the draft's last
``CHANGE_WINDOW`` steps (``changed``: more than ``CHANGE_Z`` standard errors each) weakens the draft's evidence as a
new request's prior (``forget``), so a change inside a request (an n-gram lookup with nothing to match for a
request's first steps, then rows in loops) is seen in a step of a large batch, and a slow drift is left to the
policy's per-step discount.

``ChangeTest`` is a mixin: it reads the policy's counts (``succ``, ``fail``, ``pos_succ``, ``pos_fail``,
``row_succ``, ``row_fail``, ``prior``) and estimates (``counts``, ``weakened``, ``posterior_mean``, ``profile``), and keeps its
window in the policy's ``recent`` (per draft: a list of (rows that accepted, rows that drafted)).
"""

from __future__ import annotations

import math

import numpy as np


CHANGE_Z = 4.0  # a step's first-position acceptance this many standard errors from the posterior's is a change (``changed``)
CHANGE_WINDOW = 3  # ... and from its last this many steps' (a change within a few steps, not a slow drift: ``changed``)


class ChangeTest:
    """``changed`` / ``surprised`` / ``row_alpha`` / ``remember`` / ``forget`` of ``AdaptivePolicy`` (module docstring)."""

    def changed(self, draft: int, drafted: np.ndarray, accepted: np.ndarray, where: np.ndarray | None = None,
                alpha: np.ndarray | None = None, profile: np.ndarray | None = None) -> bool:
        """Whether one step's evidence on ``draft`` (``drafted`` / ``accepted`` [rows]; ``where`` [rows]: the rows'
        indices, None: pooled) is a change of regime at the first draft position, where every row that drafted makes
        one Bernoulli trial whatever its window (a plain step's one-token window tests what a G = 4 step does). Two
        tests, both at ``CHANGE_Z`` standard errors: the share of rows that accepted it is far from the rows' own
        predictions (``surprised``), and far from the share of the draft's last ``CHANGE_WINDOW`` steps (``recent``),
        so a change within a few steps (an n-gram lookup with nothing to match at a request's start, then its rows in
        loops; a new domain) is seen in one step of a large batch, while a slow drift (rows falling into loops one by
        one over tens of steps) is left to the discount. Where the window is empty, or it and the step hold too few
        rows for the second test to pass at all (a 0 -> 1 flip is sqrt(n + n_window) standard errors), the first
        decides. ``alpha`` [rows] / ``profile`` [K]: ``row_alpha`` and the draft's ``profile`` where known."""
        tried = drafted > 0
        n = int(np.count_nonzero(tried))
        if n == 0 or not self.surprised(draft, tried, accepted, where, alpha, profile):
            return False
        share = np.count_nonzero(accepted[tried] > 0) / n
        prev_n = sum(k for _, k in self.recent[draft])
        if prev_n == 0 or n + prev_n <= CHANGE_Z ** 2:
            return True
        prev = sum(x for x, _ in self.recent[draft]) / prev_n
        q = (share * n + prev * prev_n) / (n + prev_n)  # the share of the step and its window together
        return abs(share - prev) > CHANGE_Z * math.sqrt(max(q * (1 - q), 1e-12) * (1 / n + 1 / prev_n))

    def surprised(self, draft: int, tried: np.ndarray, accepted: np.ndarray, where: np.ndarray | None,
                  alpha: np.ndarray | None = None, profile: np.ndarray | None = None) -> bool:
        """Whether the share of the rows ``tried`` [rows] that accepted ``draft``'s first token is further than
        ``CHANGE_Z`` standard errors from the mean of the rows' own predictions there, p_b = min(1, alpha_b r_1)
        (alpha_b from ``counts`` for the rows ``where``, else the pooled counts; r_1 the first position's
        ``profile``), as ``log_rate`` prices a step: the rows' Bernoulli spread plus the first position's pooled
        posterior spread, which every row shares. Per row, so the slow rows a static batch ends with are not taken
        for a change of the pool's. ``alpha`` / ``profile``: as ``changed``'s."""
        alpha = self.row_alpha(draft, where) if alpha is None else alpha  # [rows] or [1]
        first = (self.profile()[draft] if profile is None else profile)[0]
        p = np.minimum(1.0, (alpha[tried] if alpha.size > 1 else alpha) * first)
        p = np.broadcast_to(p, (int(np.count_nonzero(tried)),))  # [n]
        a, b = self.prior[0] + self.pos_succ[draft, 0], self.prior[1] + self.pos_fail[draft, 0]
        spread = np.sum(p * (1 - p)) / p.size ** 2 + a * b / ((a + b) ** 2 * (a + b + 1))
        share = np.count_nonzero(accepted[tried] > 0) / p.size
        return abs(share - p.mean()) > CHANGE_Z * math.sqrt(spread)

    def row_alpha(self, draft: int, where: np.ndarray | None) -> np.ndarray:  # [rows], or [1]: pooled
        """``draft``'s posterior mean acceptance for the rows ``where`` (``counts``), else its pooled one."""
        if self.row_succ is not None and where is not None:
            succ, fail = (c[draft] for c in self.counts(np.asarray(where)))
        else:
            succ, fail = self.succ[draft], self.fail[draft]
        return np.atleast_1d(self.posterior_mean(np.asarray(succ), np.asarray(fail)))

    def remember(self, draft: int, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Keep the step's first-position trials on ``draft`` (rows that accepted, rows that drafted) in its window of
        the last ``CHANGE_WINDOW`` steps that drafted it (``changed``); the window spans batches, so a request whose
        start differs from the last one's end is a change too."""
        tried = drafted > 0
        n = int(np.count_nonzero(tried))
        if n:
            self.recent[draft].append((float(np.count_nonzero(accepted[tried] > 0)), n))
            del self.recent[draft][:-CHANGE_WINDOW]

    def forget(self, draft: int) -> None:
        """A change on ``draft`` (``changed``): its evidence, pooled, per position and per row, is weakened to at most
        ``carry`` rejections' worth (the mean kept), as a new request's prior (``new_batch``)."""
        scale = self.weakened()[draft]
        self.succ[draft] *= scale
        self.fail[draft] *= scale
        self.pos_succ[draft] *= scale
        self.pos_fail[draft] *= scale
        if self.row_succ is not None:
            self.row_succ[draft] *= scale
            self.row_fail[draft] *= scale
