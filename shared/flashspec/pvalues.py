"""p-values of the exactness suite (``flashspec.testing``) and the engine-level distribution tests:
chi-square goodness of fit (small bins merged, groups with fixed totals added up) and the discrete
Kolmogorov-Smirnov test, in the standard library and NumPy only (scipy is not a core dependency)."""

from __future__ import annotations

import math

import numpy as np


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof >= x): the regularised upper incomplete gamma Q(dof/2, x/2)."""
    return _gamma_q(dof / 2.0, x / 2.0)


def _gamma_q(a: float, x: float) -> float:
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Lentz's continued fraction for Q
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_front) * h)


def kolmogorov_sf(d: float, n: int) -> float:
    """Asymptotic P(D_n >= d) (Stephens' small-n correction); conservative for discrete laws."""
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    if lam < 0.2:
        return 1.0
    return min(1.0, max(0.0, 2 * sum((-1) ** (j - 1) * math.exp(-2 * j * j * lam * lam) for j in range(1, 101))))


def chi_square_test(observed: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, float, str]:
    """(statistic, p-value, note) of counts against probabilities, small bins merged."""
    stat, dof, note = chi_square_statistic(observed, probs, min_expected)
    return stat, (0.0 if math.isinf(stat) else chi2_sf(stat, dof) if dof else 1.0), note


def chi_square_groups(groups: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, str]:
    """One chi-square over independent groups of (counts, probabilities), each group's total fixed:
    the statistics and degrees of freedom add up."""
    parts = [chi_square_statistic(o, p) for o, p in groups]
    stat, dof = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return stat, (0.0 if math.isinf(stat) else chi2_sf(stat, dof) if dof else 1.0), "; ".join(p[2] for p in parts)


def chi_square_statistic(observed: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int, str]:
    """(statistic, degrees of freedom, note) of counts against probabilities, small bins merged."""
    observed = observed.ravel().astype(np.float64)
    probs = probs.ravel()
    n = observed.sum()
    impossible = (probs <= 0) & (observed > 0)
    if impossible.any():
        return math.inf, 1, f"{int(observed[impossible].sum())} samples in bins of probability 0"
    expected = probs * n
    keep = expected >= min_expected
    obs = list(observed[keep])
    exp = list(expected[keep])
    rest_o, rest_e = observed[~keep & (probs > 0)].sum(), expected[~keep & (probs > 0)].sum()
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    obs_a, exp_a = np.array(obs), np.array(exp)
    if len(obs_a) < 2:
        return 0.0, 0, "one bin"
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    return stat, len(obs_a) - 1, f"{len(obs_a)} bins"


def ks_discrete(samples: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(D, p-value) of integer samples in [0, V) against a discrete law over [0, V)."""
    v = probs.size
    counts = np.bincount(samples[(samples >= 0) & (samples < v)], minlength=v)[:v]
    bad = np.count_nonzero((samples < 0) | (samples >= v))
    f_emp = np.cumsum(counts) / samples.size
    d = float(np.abs(f_emp - np.cumsum(probs)).max())
    if bad:
        d = max(d, bad / samples.size)
    return d, kolmogorov_sf(d, samples.size)
