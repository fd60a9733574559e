"""The shared exactness suite: hand it any ``verify`` and it checks SPEC.md's law.

Usage from a backend's tests (the callable takes NumPy arrays, like ``flashspec.reference.verify``,
and returns an object whose ``num_accepted`` and ``tokens`` go through ``np.asarray``)::

    from flashspec.testing import assert_exact
    assert_exact(my_verify_numpy_adapter)

One batch row is one independent sample: every case tiles one (p, q) pair over ``n_samples`` rows,
lets the draft sample x_i ~ q_i with the shared generator's DRAFT stream (as a real draft must),
and calls ``verify`` once. The checks:

1. structure: 0 <= n <= G, the accepted prefix equals the drafted prefix, exactly n + 1 tokens in
   [0, V) and then -1; the same (seed, offset) gives the same result, another offset another one;
2. Kolmogorov-Smirnov (the write-up's test, ``ks_samples`` rows): the first emitted token ~ p_0;
3. chi-square goodness of fit of the joint law of (n, y) against ``exact_law`` (bins with expected
   count < 5 merged; any sample in a bin of probability zero fails outright);
4. greedy (T = 0) equals the argmax rule exactly, ties included;
5. bad input raises ValueError (out-of-range and -1 draft ids, G = 0, mismatched vocabularies, ...).

The family-wise false-alarm rate of the statistical checks is held at ``alpha`` (default 0.01)
by Bonferroni: each of the m tests runs at alpha / m. The KS p-value is the asymptotic Kolmogorov
one, which is conservative for a discrete law, so the bound stays honest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .config import SamplingConfig
from .pvalues import chi2_sf, chi_square_groups, chi_square_test, ks_discrete, kolmogorov_sf  # noqa: F401 (re-exported)
from .reference import log_probs, sample

Verify = Callable[..., object]


@dataclass(frozen=True)
class Case:
    """One (p, q) configuration; tiled over the batch it gives independent samples."""

    name: str
    target_logits: np.ndarray  # [G+1, V]
    draft_logits: np.ndarray | None  # [G, V]; None: a deterministic (one-hot) draft
    draft_tokens: np.ndarray | None = None  # [G]: the deterministic draft's tokens
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    pass_logprobs: bool = False  # hand verify the draft's log q(x) as computed when sampling
    draft_lengths: tuple[int, ...] | None = None  # per-row lengths L_b, cycled over the rows; None: G everywhere

    @property
    def gamma(self) -> int:
        return self.target_logits.shape[0] - 1

    @property
    def vocab(self) -> int:
        return self.target_logits.shape[1]

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class Check:
    name: str
    case: str
    passed: bool
    p_value: float = float("nan")
    threshold: float = float("nan")
    detail: str = ""


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [f"{len(self.checks)} checks, {len(self.failures)} failed"]
        for c in self.failures:
            lines.append(f"  FAIL {c.name} [{c.case}] p={c.p_value:.3g} (threshold {c.threshold:.3g}) {c.detail}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the law


def exact_law(
    log_p: np.ndarray,  # [G+1, V] target log-probs (after temperature and filters)
    log_q: np.ndarray | None,  # [G, V] draft log-probs, or None for a one-hot draft
    draft_tokens: np.ndarray | None = None,  # [G] the one-hot draft's tokens
) -> np.ndarray:  # [G+1, V]
    """P(n = k, y = v) for one step, in float64.

    beta_i = sum_v min(p_i, q_i) is the chance that x_i ~ q_i is accepted; then
    P(n = k, y = v) = prod_{i<k} beta_i * max(0, p_k(v) - q_k(v)) for k < G, and
    P(n = G, y = v) = prod_{i<G} beta_i * p_G(v).
    """
    p = np.exp(log_p.astype(np.float64))
    p /= p.sum(-1, keepdims=True)
    g, v = p.shape[0] - 1, p.shape[1]
    if log_q is None:
        q = np.zeros((g, v))
        q[np.arange(g), draft_tokens] = 1.0
    else:
        q = np.exp(log_q.astype(np.float64))
        q /= q.sum(-1, keepdims=True)
    beta = np.minimum(p[:g], q).sum(-1)  # [G]
    reach = np.concatenate([[1.0], np.cumprod(beta)])  # [G+1]: P(n >= k)
    law = np.empty((g + 1, v))
    law[:g] = reach[:g, None] * np.maximum(p[:g] - q, 0.0)
    law[g] = reach[g] * p[g]
    return law


def ragged_law(log_p, log_q, draft_tokens, length: int) -> np.ndarray:  # [G+1, V]
    """P(n = k, y = v) for a row that proposed only its first ``length`` tokens: the law of a step
    with G = length (the extra token from p at position length when all are accepted); zero for k > length."""
    law = np.zeros(log_p.shape, np.float64)
    tokens = None if draft_tokens is None else draft_tokens[:length]
    law[: length + 1] = exact_law(log_p[: length + 1], None if log_q is None else log_q[:length], tokens)
    return law


def case_distributions(case: Case) -> tuple[np.ndarray, np.ndarray | None]:
    """(log p [G+1, V], log q [G, V] or None) exactly as SPEC.md defines them."""
    cfg = case.sampling
    log_q = None if case.draft_logits is None else log_probs(case.draft_logits, cfg)
    return log_probs(case.target_logits, cfg), log_q


# ----------------------------------------------------------------------------- the cases


def standard_cases(seed: int = 20261129) -> list[Case]:
    """SPEC.md's configuration list: T in {0.05, 0.7, 1, 2}; top-k, top-p; peaked and flat rows;
    q with zero mass where p has mass and the reverse; one-hot drafts; G from 1 to 8."""
    r = np.random.default_rng(seed)

    def logits(rows: int, v: int, spread: float = 1.0) -> np.ndarray:
        return (r.normal(size=(rows, v)) * spread).astype(np.float32)

    def near(z: np.ndarray, noise: float) -> np.ndarray:  # a draft close to the target
        return (z[:-1] + r.normal(size=z[:-1].shape) * noise).astype(np.float32)

    peaked = logits(4, 12)
    peaked[np.arange(4), r.integers(0, 12, 4)] += 5.0
    zero_q = logits(4, 10)
    zero_q_draft = near(zero_q, 0.7)
    zero_q_draft[:, :3] = -np.inf  # the draft never proposes tokens 0-2; p has mass there
    zero_p = logits(4, 10)
    zero_p[:, 7:] = -np.inf  # the target gives no mass to 7-9; the draft proposes them
    zero_p_draft = logits(3, 10)
    g8 = logits(9, 8, 0.8)
    z07 = logits(3, 12) * 0.7
    z2 = logits(5, 9) * 2
    cold = logits(2, 10) * 0.05
    onehot = logits(5, 12)
    onehot_tokens = np.array([int(onehot[0].argmax()), 3, int(onehot[2].argmax()), 5])
    same = logits(7, 11)
    ragged = logits(5, 10)
    ragged_onehot = logits(4, 9)
    return [
        Case("flat-T1-G4", logits(5, 12, 0.5), logits(4, 12, 0.5)),
        Case("peaked-T1-G3", peaked, near(peaked, 1.0)),
        Case("T0.05-G1", cold, cold[:1] + np.float32(0.05) * logits(1, 10)[0], temperature=0.05),
        Case("T0.7-G2", z07, near(z07, 0.8), temperature=0.7),
        Case("T2-G4", z2, near(z2, 2.0), temperature=2.0),
        Case("topk4-T0.9-G3", logits(4, 12), logits(3, 12), temperature=0.9, top_k=4),
        Case("topp0.8-T1.1-G3", logits(4, 12, 1.5), logits(3, 12, 1.5), temperature=1.1, top_p=0.8),
        Case("topk6-topp0.7-T0.7-G2", logits(3, 12), logits(2, 12), temperature=0.7, top_k=6, top_p=0.7),
        Case("q-zero-where-p-G3", zero_q, zero_q_draft),
        Case("p-zero-where-q-G3", zero_p, zero_p_draft),
        Case("onehot-G4", onehot, None, onehot_tokens),
        Case("onehot-topp0.9-T0.7-G2", logits(3, 9), None, np.array([1, 4]), temperature=0.7, top_p=0.9),
        Case("q-equals-p-G6", same, same[:-1].copy()),
        Case("near-G8", g8, near(g8, 0.3)),
        Case("logprobs-given-G5", logits(6, 10), logits(5, 10), temperature=1.3, pass_logprobs=True),
        Case("logprobs-given-topk5-G7", logits(8, 9), logits(7, 9), top_k=5, pass_logprobs=True),
        Case("ragged-lengths-G4", ragged, near(ragged, 0.6), temperature=0.9, draft_lengths=(0, 1, 2, 3, 4)),
        Case("ragged-onehot-topk5-G3", ragged_onehot, None, np.array([int(ragged_onehot[0].argmax()), 2, 5]),
             top_k=5, draft_lengths=(3, 0, 2, 1)),
    ]


# ----------------------------------------------------------------------------- running a case


def draft_step(case: Case, n: int, seed: int, offset: int) -> tuple[np.ndarray, np.ndarray | None]:
    """x [n, G] sampled from q_i with the DRAFT stream, and log q(x) [n, G] (None if one-hot)."""
    if case.draft_logits is None:
        return np.broadcast_to(case.draft_tokens, (n, case.gamma)).astype(np.int64), None
    xs, lqs = [], []
    for i in range(case.gamma):
        x_i, lq_i = sample(np.broadcast_to(case.draft_logits[i], (n, case.vocab)), case.sampling, seed, offset, position=i)
        xs.append(x_i)
        lqs.append(lq_i)
    return np.stack(xs, 1).astype(np.int64), np.stack(lqs, 1)


def row_lengths(case: Case, n: int) -> np.ndarray | None:  # [n] int32: case.draft_lengths cycled over the rows
    return None if case.draft_lengths is None else np.resize(np.asarray(case.draft_lengths, np.int32), n)


def run_case(verify: Verify, case: Case, n: int, seed: int, offset: int = 0):
    """Returns (x [n, G], num_accepted [n], tokens [n, G+1]) from one call of verify."""
    x, lq_x = draft_step(case, n, seed, offset)
    z = np.broadcast_to(case.target_logits, (n, *case.target_logits.shape))
    w = None if case.draft_logits is None else np.broadcast_to(case.draft_logits, (n, *case.draft_logits.shape))
    lengths = {} if case.draft_lengths is None else {"draft_lengths": row_lengths(case, n)}
    res = verify(
        z, x, w, lq_x if case.pass_logprobs else None,
        temperature=case.temperature, top_k=case.top_k, top_p=case.top_p, seed=seed, offset=offset, **lengths,
    )
    return x, np.asarray(res.num_accepted).astype(np.int64), np.asarray(res.tokens).astype(np.int64)


def joint_law_check(case: Case, n: np.ndarray, tokens: np.ndarray) -> tuple[float, float, str]:
    """Chi-square of the joint law of (n, y) (per draft length L_b for ragged cases): (stat, p, note)."""
    log_p, log_q = case_distributions(case)
    y = tokens[np.arange(len(n)), n]
    cells = n * case.vocab + y
    if case.draft_lengths is None:
        return chi_square_test(np.bincount(cells, minlength=(case.gamma + 1) * case.vocab),
                               exact_law(log_p, log_q, case.draft_tokens))
    lengths = row_lengths(case, len(n))
    return chi_square_groups([(np.bincount(cells[lengths == k], minlength=(case.gamma + 1) * case.vocab),
                               ragged_law(log_p, log_q, case.draft_tokens, k)) for k in sorted(set(case.draft_lengths))])


def structure_problem(x: np.ndarray, n: np.ndarray, tokens: np.ndarray, vocab: int,
                      lengths: np.ndarray | None = None) -> str:  # lengths [B]: L_b, None: G
    """'' if every row is well formed, else what is wrong with the first bad row."""
    b, g = x.shape
    if n.shape != (b,) or tokens.shape != (b, g + 1):
        return f"result shapes {n.shape}, {tokens.shape}; expected ({b},), ({b}, {g + 1})"
    bound = np.full(b, g) if lengths is None else lengths
    bad = (n < 0) | (n > bound)
    if bad.any():
        r = int(np.argmax(bad))
        return f"row {r}: num_accepted={n[r]} outside [0, {bound[r]}] (the row's draft length)"
    pos = np.arange(g + 1)[None]
    prefix_ok = np.where(pos[:, :g] < n[:, None], tokens[:, :g] == x, True).all(-1)
    y = tokens[np.arange(b), n]
    tail_ok = np.where(pos > n[:, None], tokens == -1, True).all(-1)
    for ok, what in ((prefix_ok, "accepted prefix differs from the drafted tokens"),
                     ((y >= 0) & (y < vocab), "the token after the accepted prefix is not in [0, V)"),
                     (tail_ok, "positions after the emitted tokens are not -1")):
        if not ok.all():
            r = int(np.argmin(ok))
            return f"row {r}: {what} (x={x[r].tolist()}, n={n[r]}, tokens={tokens[r].tolist()})"
    return ""


# ----------------------------------------------------------------------------- the suite


def run_suite(
    verify: Verify,
    *,
    cases: list[Case] | None = None,
    n_samples: int = 100_000,
    ks_samples: int = 10_000,
    alpha: float = 0.01,
    seed: int = 1234,
    stop_on_failure: bool = False,
) -> Report:
    """Run every check of the module docstring; return the report (see ``assert_exact``)."""
    cases = standard_cases() if cases is None else cases
    threshold = alpha / (2 * len(cases))  # Bonferroni over one chi-square and one KS per case
    report = Report()

    def add(check: Check) -> bool:
        report.checks.append(check)
        return stop_on_failure and not check.passed

    for check in check_validation(verify):
        if add(check):
            return report
    if add(check_greedy(verify)):
        return report
    for k, case in enumerate(cases):
        try:
            x, n, tokens = run_case(verify, case, n_samples, seed + k, offset=7 * k)
        except Exception as e:  # noqa: BLE001 - a valid case must not raise
            if add(Check("runs", case.name, False, detail=f"raised {type(e).__name__}: {e}")):
                return report
            continue
        problem = structure_problem(x, n, tokens, case.vocab, row_lengths(case, len(n)))
        if add(Check("structure", case.name, not problem, detail=problem)) or problem:
            continue
        log_p, _ = case_distributions(case)
        p0 = np.exp(log_p[0].astype(np.float64))
        d, p_ks = ks_discrete(tokens[:ks_samples, 0], p0 / p0.sum())
        if add(Check("ks-first-token", case.name, p_ks >= threshold, p_ks, threshold, f"D={d:.4f}")):
            return report
        stat, p_chi, note = joint_law_check(case, n, tokens)
        if add(Check("chi2-joint-n-y", case.name, p_chi >= threshold, p_chi, threshold, f"X2={stat:.1f}, {note}")):
            return report
        if add(check_determinism(verify, case, seed + k, offset=7 * k)):
            return report
    return report


def assert_exact(verify: Verify, **options) -> Report:
    """``run_suite`` that raises AssertionError listing every failed check."""
    report = run_suite(verify, **options)
    if not report.passed:
        raise AssertionError("verify failed the exactness suite:\n" + report.summary())
    return report


def check_determinism(verify: Verify, case: Case, seed: int, offset: int, n: int = 2000) -> Check:
    """Same (seed, offset): same result; another offset: other randomness (in some row)."""
    _, n1, t1 = run_case(verify, case, n, seed, offset)
    _, n2, t2 = run_case(verify, case, n, seed, offset)
    if not (np.array_equal(n1, n2) and np.array_equal(t1, t2)):
        return Check("determinism", case.name, False, detail="same seed and offset gave different results")
    # Another offset redraws the draft too; fix the draft to isolate the verifier's randomness.
    x, lq = draft_step(case, n, seed, offset)
    z = np.broadcast_to(case.target_logits, (n, *case.target_logits.shape))
    w = None if case.draft_logits is None else np.broadcast_to(case.draft_logits, (n, *case.draft_logits.shape))
    lengths = {} if case.draft_lengths is None else {"draft_lengths": row_lengths(case, n)}
    outs = [
        np.asarray(verify(z, x, w, lq if case.pass_logprobs else None, temperature=case.temperature,
                          top_k=case.top_k, top_p=case.top_p, seed=seed, offset=o, **lengths).tokens)
        for o in (offset, offset + 1)
    ]
    varies = not np.array_equal(outs[0], outs[1])
    return Check("determinism", case.name, varies, detail="" if varies else "offset+1 gave identical tokens")


def greedy_rule(z: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The argmax rule, written as plain loops: (num_accepted [B], tokens [B, G+1])."""
    b, g = x.shape
    n_out = np.zeros(b, np.int64)
    t_out = np.full((b, g + 1), -1, np.int64)
    for r in range(b):
        k = 0
        while k < g and x[r, k] == int(np.argmax(z[r, k])):
            t_out[r, k] = x[r, k]
            k += 1
        n_out[r] = k
        t_out[r, k] = int(np.argmax(z[r, k]))
    return n_out, t_out


def check_greedy(verify: Verify, seed: int = 99) -> Check:
    """T = 0 must follow the argmax rule exactly, ties to the lowest index, with or without q."""
    r = np.random.default_rng(seed)
    for b, g, v in ((64, 1, 5), (64, 4, 7), (32, 8, 33)):
        z = r.integers(-3, 4, size=(b, g + 1, v)).astype(np.float32)  # small integers: many ties
        best = z[:, :g].argmax(-1)
        x = np.where(r.random((b, g)) < 0.8, best, r.integers(0, v, (b, g)))
        w = r.normal(size=(b, g, v)).astype(np.float32)
        want_n, want_t = greedy_rule(z, x)
        for draft in (None, w):
            res = verify(z, x, draft, None, temperature=0.0, seed=3, offset=1)
            got_n, got_t = np.asarray(res.num_accepted), np.asarray(res.tokens)
            if not (np.array_equal(got_n, want_n) and np.array_equal(got_t, want_t)):
                rows = np.nonzero((got_t != want_t).any(-1) | (got_n != want_n))[0]
                return Check("greedy", f"B={b},G={g},V={v}", False, detail=f"{len(rows)} rows differ from the argmax rule")
    return Check("greedy", "argmax rule", True)


def invalid_inputs() -> list[tuple[str, tuple, dict]]:
    """(what, args, kwargs) that every verify must reject with ValueError."""
    r = np.random.default_rng(5)
    z = r.normal(size=(2, 4, 6)).astype(np.float32)
    w = r.normal(size=(2, 3, 6)).astype(np.float32)
    x = np.array([[0, 1, 2], [3, 4, 5]])
    neg = x.copy()
    neg[1, 2] = -1
    big = x.copy()
    big[0, 1] = 6
    no_finite = z.copy()
    no_finite[1, 2] = -np.inf
    nan = z.copy()
    nan[0, 0, 3] = np.nan
    return [
        ("draft id -1 (padding)", (z, neg, w), {}),
        ("draft id -1, one-hot draft", (z, neg, None), {}),
        ("draft id = V", (z, big, w), {}),
        ("G = 0", (z[:, :1], x[:, :0], w[:, :0]), {}),
        ("draft vocabulary differs", (z, x, w[..., :5]), {}),
        ("draft_tokens shape", (z, x[:, :2], w), {}),
        ("batch sizes differ", (z, x[:1], w[:1]), {}),
        ("temperature < 0", (z, x, w), {"temperature": -0.5}),
        ("temperature NaN", (z, x, w), {"temperature": float("nan")}),
        ("top_p = 0", (z, x, w), {"top_p": 0.0}),
        ("top_p > 1", (z, x, w), {"top_p": 1.5}),
        ("top_k < 0", (z, x, w), {"top_k": -1}),
        ("a target row with no finite logit", (no_finite, x, w), {}),
        ("a NaN logit", (nan, x, w), {}),
        ("integer logits", (z.astype(np.int32), x, w), {}),
        ("float draft tokens", (z, x.astype(np.float32), w), {}),
        ("draft_lengths > G", (z, x, w), {"draft_lengths": np.array([3, 4], np.int32)}),
        ("draft_lengths < 0", (z, x, None), {"draft_lengths": np.array([-1, 2], np.int32)}),
        ("draft_lengths shape", (z, x, w), {"draft_lengths": np.array([1, 2, 3], np.int32)}),
        ("draft id -1 within draft_lengths", (z, neg, w), {"draft_lengths": np.array([3, 3], np.int32)}),
    ]


def check_validation(verify: Verify) -> list[Check]:
    checks = []
    for what, args, kwargs in invalid_inputs():
        try:
            verify(*args, **kwargs)
            checks.append(Check("validation", what, False, detail="no ValueError raised"))
        except ValueError:
            checks.append(Check("validation", what, True))
        except Exception as e:  # noqa: BLE001 - any other exception is the failure we report
            checks.append(Check("validation", what, False, detail=f"raised {type(e).__name__}: {e}"))
    return checks
