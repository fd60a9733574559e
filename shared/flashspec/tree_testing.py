"""The shared exactness suite of tree verification: hand it any ``verify_tree`` and it checks the law.

Usage from a backend's tests (the callable takes NumPy arrays like ``flashspec.tree.verify_tree`` and returns
an object whose ``num_accepted``, ``tokens`` and ``path`` go through ``np.asarray``)::

    from flashspec.tree_testing import assert_tree_exact
    assert_tree_exact(my_verify_tree_numpy_adapter)

One batch row is one independent sample: every case tiles one tree over ``n_samples`` rows (one seed for
the batch, so the rows draw different numbers). The checks:

1. structure: verify runs on every valid tree; the path is a chain of children from the root, ``tokens``
   is the path's tokens, then y, then -1, and y is not a child of the node where the walk stopped;
2. chi-square of the joint law of (stop slot, y) against ``tree_law`` per case (bins with expected
   count < 5 merged; a sample in a bin of probability zero fails outright), Bonferroni over the cases;
3. greedy (T = 0) follows the argmax rule exactly, ties to the lowest index;
4. the same (seed, offset) gives the same tokens, another offset other ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .config import SamplingConfig
from .pvalues import chi_square_test
from .reference import log_probs
from .testing import Check, Report
from .tree import children_of, tree_law

VerifyTree = Callable[..., object]


@dataclass(frozen=True)
class TreeCase:
    """One tree with the target's row at every slot; tiled over the batch it gives independent samples."""

    name: str
    target_logits: np.ndarray  # [N+1, V]
    tokens: np.ndarray  # [N]
    parents: np.ndarray  # [N]
    sampling: SamplingConfig


# Malformed single-row trees and the error each verify_tree must raise: (tree_tokens, tree_parents, keyword
# arguments, message pattern), with vocabulary 4 and target rows for every node.
MALFORMED_TREES = [
    ([1, 2], [-1, 1], {}, r"tree_parents\[0, 1\] = 1 must be in \[-1, 1\)"),
    ([1, 2], [-1, 5], {}, r"tree_parents\[0, 1\] = 5"),
    ([1, 2], [-2, 0], {}, r"tree_parents\[0, 0\] = -2"),
    ([1, 2, 3], [-1, 0, 1], {"max_depth": 2}, "depth 3, over max_depth=2"),
    ([1, 4], [-1, 0], {}, r"tree_tokens\[0, 1\] = 4 is out of range"),
    ([1, -1], [-1, 0], {}, r"tree_tokens\[0, 1\] = -1"),
    ([1, 1], [-1, -1], {}, "repeats a sibling's token"),
    ([1, 2], [-1, 0], {"tree_sizes": np.array([3])}, r"tree_sizes\[0\] = 3 is outside"),
    ([1, 2], [-1, 0], {"tree_sizes": np.array([1, 1])}, "tree_sizes must be an integer array"),
]


def top_k_tree(logits: Callable[[tuple[int, ...]], np.ndarray], widths) -> tuple[np.ndarray, np.ndarray]:
    """A static tree: ``widths[d]`` children per node at depth d, the top-k of ``logits(token path)``;
    returns (tokens [N], parents [N])."""
    tokens: list[int] = []
    parents: list[int] = []
    frontier: list[tuple[int, tuple[int, ...]]] = [(-1, ())]
    for w in widths:
        nxt = []
        for parent, path in frontier:
            for t in np.argsort(-logits(path), kind="stable")[:w]:
                tokens.append(int(t))
                parents.append(parent)
                nxt.append((len(tokens) - 1, path + (int(t),)))
        frontier = nxt
    return np.array(tokens), np.array(parents)


def token_paths(tokens, parents) -> list[tuple[int, ...]]:  # [N], [N] -> the token path to each slot, root first
    out: list[tuple[int, ...]] = [()]
    for t, a in zip(tokens, parents):
        out.append(out[int(a) + 1] + (int(t),))
    return out


def random_tree_case(name: str, seed: int, vocab: int, widths, sampling: SamplingConfig,
                     shuffle: bool = False) -> TreeCase:
    """Random target logits per slot; the tree offers the target's own most likely tokens (so that a
    rejection's renormalisation matters), or with ``shuffle`` a random ranking (unlikely children too)."""
    r = np.random.default_rng(seed)
    table: dict[tuple[int, ...], np.ndarray] = {}
    rank: dict[tuple[int, ...], np.ndarray] = {}

    def logits(path):
        return table.setdefault(path, (r.normal(size=vocab) * 1.5).astype(np.float32))

    def ranking(path):
        return rank.setdefault(path, r.permutation(vocab).astype(np.float32)) if shuffle else logits(path)

    tokens, parents = top_k_tree(ranking, widths)
    z = np.stack([logits(p) for p in token_paths(tokens, parents)])
    return TreeCase(name, z, tokens, parents, sampling)


def standard_tree_cases(seed: int = 20261207) -> list[TreeCase]:
    """Wide, deep, star and chain trees at T = 1, T = 0.7 with top-p, T = 2, top-k; unlikely children."""
    t1, hot, cold, topk = SamplingConfig(1.0), SamplingConfig(0.7, 0, 0.85), SamplingConfig(2.0), SamplingConfig(0.9, 3)
    specs = [("2,2,1", 5, (2, 2, 1)), ("3,1", 6, (3, 1)), ("star4", 6, (4,)), ("chain3", 5, (1, 1, 1))]
    cases = [random_tree_case(f"{name}-{tag}", seed + i, v, w, cfg)
             for i, (name, v, w) in enumerate(specs) for tag, cfg in (("T1", t1), ("T0.7-topp0.85", hot))]
    cases.append(random_tree_case("2,2-T2", seed + 10, 6, (2, 2), cold))
    cases.append(random_tree_case("3,2-topk3-T0.9", seed + 11, 7, (3, 2), topk))
    cases.append(random_tree_case("unlikely-3,2-T1", seed + 12, 6, (3, 2), t1, shuffle=True))
    return cases


# ----------------------------------------------------------------------------- running a case


def run_tree_case(verify: VerifyTree, case: TreeCase, n: int, seed: int, offset: int = 0):
    """-> (num_accepted [n], tokens [n, D+1], path [n, D]) as NumPy arrays."""
    cfg = case.sampling
    res = verify(np.tile(case.target_logits, (n, 1, 1)), np.tile(case.tokens, (n, 1)), np.tile(case.parents, (n, 1)),
                 temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, offset=offset)
    return np.asarray(res.num_accepted), np.asarray(res.tokens), np.asarray(res.path)


def stop_slots(num_accepted, path) -> np.ndarray:  # [B], [B, D] -> [B]: 0 the root, j + 1 node j
    last = path[np.arange(len(num_accepted)), np.maximum(num_accepted - 1, 0)]
    return np.where(num_accepted == 0, 0, last + 1)


def tree_structure_problem(case: TreeCase, num_accepted, tokens, path) -> str:
    """'' if every row is a path of children from the root, its tokens, then y (not a child), then -1."""
    return path_problem(case, num_accepted, tokens, path) or emitted_child_problem(case, num_accepted, tokens, path)


def path_problem(case: TreeCase, num_accepted, tokens, path) -> str:
    """'' if every row is a path of children from the root, its tokens, then y in [0, V), then -1."""
    children = children_of(case.parents, len(case.tokens))
    for r, (n, out, nodes) in enumerate(zip(num_accepted, tokens, path)):
        slot = 0
        for j in nodes[:n]:
            if j not in children[slot]:
                return f"row {r}: path {list(nodes[:n])} is not a chain of children from the root"
            slot = j + 1
        if (nodes[n:] != -1).any() or (out[n + 1:] != -1).any() or list(out[:n]) != list(case.tokens[nodes[:n]]):
            return f"row {r}: tokens {list(out)} / path {list(nodes)} are not the path's tokens, y, then -1"
        if not 0 <= out[n] < case.target_logits.shape[-1]:
            return f"row {r}: y = {out[n]} is out of range"
    return ""


def emitted_child_problem(case: TreeCase, num_accepted, tokens, path) -> str:
    """'' if no row's y is a child of the slot where its walk stopped (the residual excludes every child)."""
    children = children_of(case.parents, len(case.tokens))
    slots = stop_slots(num_accepted, path)
    for r, (n, s) in enumerate(zip(num_accepted, slots)):
        if tokens[r, n] in case.tokens[children[s]]:
            return f"row {r}: y = {tokens[r, n]} is a child of slot {s}: the residual must exclude the children"
    return ""


def check_tree_law(verify: VerifyTree, case: TreeCase, n: int, seed: int, threshold: float) -> list[Check]:
    try:
        num_accepted, tokens, path = run_tree_case(verify, case, n, seed)
    except Exception as e:  # a verify that refuses a valid tree fails the case
        return [Check("runs", case.name, False, detail=f"{type(e).__name__}: {e}")]
    problem = tree_structure_problem(case, num_accepted, tokens, path)
    checks = [Check("structure", case.name, not problem, detail=problem)]
    if path_problem(case, num_accepted, tokens, path):
        return checks  # no law to test
    counts = np.zeros(case.target_logits.shape)
    np.add.at(counts, (stop_slots(num_accepted, path), tokens[np.arange(n), num_accepted]), 1)
    law = tree_law(log_probs(case.target_logits, case.sampling), case.tokens, case.parents)
    _, p, note = chi_square_test(counts, law)
    return checks + [Check("chi-square (stop slot, y)", case.name, p > threshold, p, threshold, note)]


def check_tree_greedy(verify: VerifyTree, seed: int = 99, rows: int = 200) -> Check:
    """Random trees whose children often hold the argmax (ties included): T = 0 must follow it exactly."""
    r = np.random.default_rng(seed)
    cases = [random_tree_case("greedy", int(r.integers(1 << 30)), 5, (2, 2, 1), SamplingConfig(0.0), shuffle=b % 2 == 0)
             for b in range(rows)]
    z = np.stack([np.round(c.target_logits) for c in cases]).astype(np.float32)  # rounding makes ties
    tokens, parents = np.stack([c.tokens for c in cases]), cases[0].parents
    res = verify(z, tokens, np.tile(parents, (rows, 1)), temperature=0.0, seed=seed)
    for b in range(rows):
        slot, expected = 0, []
        while True:
            best = int(z[b, slot].argmax())
            kids = [j for j in children_of(parents, len(parents))[slot] if tokens[b, j] == best]
            expected.append(best)
            if not kids:
                break
            slot = kids[0] + 1
        got = list(np.asarray(res.tokens)[b, : int(np.asarray(res.num_accepted)[b]) + 1])
        if got != expected:
            return Check("greedy", f"row {b}", False, detail=f"emitted {got}, the argmax walk gives {expected}")
    return Check("greedy", "random trees", True)


def check_tree_determinism(verify: VerifyTree, case: TreeCase, seed: int, n: int = 2000) -> Check:
    a, b, c = (run_tree_case(verify, case, n, seed, off)[1] for off in (3, 3, 4))
    ok = np.array_equal(a, b) and not np.array_equal(a, c)
    return Check("determinism", case.name, ok, detail="" if ok else "same (seed, offset) differed, or offsets agreed")


def run_tree_suite(verify: VerifyTree, n_samples: int = 6000, alpha: float = 0.01, seed: int = 11) -> Report:
    cases = standard_tree_cases()
    report = Report()
    for case in cases:
        report.checks += check_tree_law(verify, case, n_samples, seed, alpha / len(cases))
    report.checks.append(check_tree_greedy(verify))
    report.checks.append(check_tree_determinism(verify, cases[0], seed))
    return report


def assert_tree_exact(verify: VerifyTree, **options) -> Report:
    """Run the tree suite; raise AssertionError with the failures' summary if any check fails."""
    report = run_tree_suite(verify, **options)
    if not report.passed:
        raise AssertionError(report.summary())
    return report
