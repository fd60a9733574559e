"""Deliberately broken verifiers, one per bug class of SPEC.md: the suite must reject each.

Each mutant is the reference with exactly one step broken, the way that bug shows up in real
implementations. ``tests/core/test_exactness_suite.py`` runs the shared suite on every one of ``MUTANTS``;
``tests/core/test_tree.py`` runs the tree laws on every one of ``TREE_MUTANTS``.
"""

from __future__ import annotations

import numpy as np

from . import random as rng
from .reference import Counters, ReferenceVerifier, filter_logits, log_softmax, scale
from .tree import TreeVerifier


class TemperatureAfterLogSoftmax(ReferenceVerifier):
    """log p = log_softmax(filter(z)) / T instead of log_softmax(filter(z / T))."""

    def target_log_probs(self, z, cfg):
        return log_softmax(filter_logits(z, cfg)) / np.float32(cfg.temperature)

    def draft_log_probs(self, w, cfg):
        return log_softmax(filter_logits(w, cfg)) / np.float32(cfg.temperature)


def _inverse_cdf(weights: np.ndarray, u: np.ndarray, normalise: bool = True) -> np.ndarray:
    """First index whose cumulative weight reaches u (times the total if normalise)."""
    c = np.cumsum(weights.astype(np.float64), -1)
    target = u[:, None] * (c[:, -1:] if normalise else 1.0)
    return np.minimum((c < target).sum(-1), weights.shape[-1] - 1)


class InverseCdfVerifier(ReferenceVerifier):
    """A CORRECT variant (the positive control): residual / bonus by inverse CDF with a fresh
    FINAL-stream uniform. Its subclasses below break it; it must itself pass the suite."""

    def final_uniform(self, c: Counters, n, log_u):  # [B]
        return rng.uniform(c.seed, c.offset, c.row, n, 0, rng.FINAL)

    def sample_final(self, log_p, log_q, x, n, bonus, c, log_u):
        b, g1, v = log_p.shape
        rows = np.arange(b)
        p_n = np.exp(log_p[rows, n].astype(np.float64))
        i = np.minimum(n, g1 - 2)
        q_n = (np.arange(v)[None] == x[rows, i][:, None]) * 1.0 if log_q is None else np.exp(log_q[rows, i].astype(np.float64))
        weights = np.where(bonus[:, None], p_n, self.residual(p_n, q_n))
        return self.pick(weights, self.final_uniform(c, n, log_u))

    def pick(self, weights, u):
        return _inverse_cdf(weights, u)


class ResidualNotNormalised(InverseCdfVerifier):
    """The residual max(0, p - q) is searched without dividing by its total mass."""

    def pick(self, weights, u):
        return _inverse_cdf(weights, u, normalise=False)


class ResidualNotClipped(InverseCdfVerifier):
    """p - q used without clipping at zero (negative entries pull the CDF down)."""

    def residual(self, p_n, q_n):
        return p_n - q_n

    def pick(self, weights, u):
        total = np.maximum(weights, 0).sum(-1, keepdims=True)
        c = np.cumsum(weights, -1)
        return np.minimum((c < u[:, None] * total).sum(-1), weights.shape[-1] - 1)


class UniformReused(InverseCdfVerifier):
    """The accept test's uniform u_n (the one that rejected) is reused for the residual draw."""

    def final_uniform(self, c, n, log_u):
        g = log_u.shape[1]
        fresh = super().final_uniform(c, n, log_u)
        reused = np.exp(log_u[np.arange(len(n)), np.minimum(n, g - 1)])
        return np.where(n < g, reused, fresh)


class BonusMissing(ReferenceVerifier):
    """All G accepted: no bonus token is emitted."""

    def emit(self, x, n, y):
        res = super().emit(x, n, y)
        g = x.shape[1]
        res.tokens[n == g, g] = -1
        return res


class BonusOverwritesLast(ReferenceVerifier):
    """All G accepted: the bonus token lands on the last accepted position."""

    def emit(self, x, n, y):
        res = super().emit(x, n, y)
        g = x.shape[1]
        full = n == g
        res.tokens[full, g - 1] = y[full]
        res.tokens[full, g] = -1
        return res


class KeepsAfterRejection(ReferenceVerifier):
    """n counts every accepted position, including those after the first rejection."""

    def first_rejection(self, accepted):
        return accepted.sum(-1)


class SharedStreamWithDraft(ReferenceVerifier):
    """The accept uniform is the draft's own random number for the drafted token (one stream)."""

    def accept_uniforms(self, c, gamma, x):
        i = np.arange(gamma)[None]
        return rng.uniform(c.seed[:, None], c.offset[:, None], c.row[:, None], i, x, rng.DRAFT)


class DraftFiltersIgnored(ReferenceVerifier):
    """q computed without top-k / top-p although the draft sampled with them."""

    def draft_log_probs(self, w, cfg):
        return log_softmax(scale(w, cfg.temperature))


class TargetParamsIgnored(ReferenceVerifier):
    """The target side ignores temperature, top-k and top-p (plain softmax of z)."""

    def target_log_probs(self, z, cfg):
        return log_softmax(z)


class PaddingReadOutOfBounds(ReferenceVerifier):
    """Draft ids are not range-checked: -1 padding silently reads the last vocabulary entry."""

    def check_values(self, z, x, w, lq_given, vocab, proposed):
        super().check_values(z, np.clip(x, 0, vocab - 1), w, lq_given, vocab, proposed)


class ShortRowResidual(ReferenceVerifier):
    """A row that proposed L_b < G tokens and had all accepted draws its extra token from the residual
    max(0, p_L - q_L) (as if position L_b had been proposed and rejected) instead of from p_L."""

    def sample_final(self, log_p, log_q, x, n, bonus, c, log_u):
        return super().sample_final(log_p, log_q, x, n, n == log_p.shape[1] - 1, c, log_u)


MUTANTS: tuple[type[ReferenceVerifier], ...] = (
    TemperatureAfterLogSoftmax,
    ResidualNotNormalised,
    ResidualNotClipped,
    UniformReused,
    BonusMissing,
    BonusOverwritesLast,
    KeepsAfterRejection,
    SharedStreamWithDraft,
    DraftFiltersIgnored,
    TargetParamsIgnored,
    PaddingReadOutOfBounds,
    ShortRowResidual,
)


# ----------------------------------------------------------------------------- tree verification


class TreeNotRenormalised(TreeVerifier):
    """A later child c is accepted with p(c) instead of p(c) renormalised after the rejected siblings."""

    def child_log_prob(self, lp, kids, k):
        return lp[kids[k]]


class TreeResidualKeepsRejected(TreeVerifier):
    """The residual after rejected children is p itself (the rejected children keep their mass)."""

    def residual(self, lp, kids):
        return lp


TREE_MUTANTS: tuple[type[TreeVerifier], ...] = (TreeNotRenormalised, TreeResidualKeepsRejected)
