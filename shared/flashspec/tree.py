"""The NumPy oracle of tree verification: exact at every temperature, for deterministic drafts.

A draft tree per batch row: node j carries a token ``tree_tokens[b, j]`` and a parent
``tree_parents[b, j]`` in [-1, j) (-1: the root, i.e. the last committed token). Nodes come in
topological order; the children of a node are tried in increasing node index. The children are
deterministic candidates (the head's top-k, a static tree), so no draft q enters verification.
``target_logits[b, 0]`` is the target's row at the root, ``target_logits[b, j + 1]`` its row after
node j (the scoring pass over the tree with a tree attention mask gives exactly these).

Verification by sequential elimination, from the root. At the current node let p be the target's
distribution (temperature, top-k, top-p as in SPEC.md). Try the children c_1, c_2, ... in order:
accept c_i with probability p_i(c_i) (``log u < log p_i(c_i)``), where p_i is p with the already
rejected children c_1..c_{i-1} zeroed and renormalised; on accept, descend into c_i and repeat; if
every child is rejected (or the node is a leaf), emit y ~ p_k, the residual after the k rejected
children (at a leaf, p itself). Greedy (T = 0): descend into the child whose token is argmax p
(lowest index on ties), else emit that argmax.

Why the emitted tokens have exactly the target's law. One node, children c_1..c_k: the step's
output o (a child's token on descent, else y) satisfies o ~ p, by induction on k. For k = 0, o = y ~ p.
For k >= 1, P(o = c_1) = p(c_1) (accepted; nothing later can output c_1: it is zeroed in p_1 and
after), and for v != c_1, P(o = v) = (1 - p(c_1)) P(rest outputs v) = (1 - p(c_1)) p_1(v) = p(v),
because the rest is the same procedure on p_1 with children c_2..c_k, which outputs ~ p_1 by
induction. Each node uses its own uniform and each stopping slot its own Gumbel noise, each drawn
at most once per step, so given the tokens emitted so far the next one is a fresh exact draw from
the target's conditional. The walk stops right after o iff o is not a child of the current node
(y never is: the residual excludes every child, a leaf has none), a function of the emitted tokens
alone. So a step emits a prefix of an autoregressive sample of the target, cut at a stopping rule
that reads only that sample: exactly the target's law, whatever the tree.

Randomness: the counter generator's own purposes (``random.TREE_ACCEPT``: node j's uniform at
position j + 1; ``random.TREE_FINAL``: the Gumbel noise of slot s, 0 for the root and j + 1 for
node j, at position s), never a number of the chain's streams.

Plain and slow on purpose (a Python walk per row); float32 log space as ``flashspec.reference``. The
renormalised test is ``log u < log p(c_k) - log M_k`` with M_k the mass not yet rejected, summed as the mass of
the non-children plus the children not yet tried (``child_log_prob``): one masked pass over V per node, the
arithmetic a kernel port must reproduce token for token.
Not built here: the torch / JAX / kernel paths, tree attention masks, KV compaction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import random as rng
from .config import SamplingConfig
from .contract import check_tree_args
from .reference import Counters, as_float32, log_probs

MAX_TREE_DEPTH = 32  # the deepest accepted path a tree may offer (tokens per step <= depth + 1)


@dataclass(frozen=True)
class TreeVerifyResult:
    num_accepted: np.ndarray  # [B] int32: depth of the accepted path
    tokens: np.ndarray  # [B, D+1] int32: the path's tokens, then y, then -1 (D: the batch's deepest tree)
    path: np.ndarray  # [B, D] int32: the accepted nodes' indices (what KV compaction keeps), then -1


# ----------------------------------------------------------------------------- checks


def tree_depths(tokens, parents, size: int, vocab: int, max_depth: int, row: int = 0) -> np.ndarray:  # [n] -> [size]
    """Each node's depth (the root's children: 1); raises ValueError on a malformed tree."""
    if not 0 <= size <= len(tokens):
        raise ValueError(f"tree_sizes[{row}] = {size} is outside [0, {len(tokens)}] (0: plain decoding for that row)")
    depth = np.zeros(size, np.int64)
    seen: set[tuple[int, int]] = set()
    for j in range(size):
        t, a = int(tokens[j]), int(parents[j])
        if not 0 <= t < vocab:
            raise ValueError(f"tree_tokens[{row}, {j}] = {t} is out of range [0, {vocab}); pad with tree_sizes, "
                             "not with -1 tokens")
        if not -1 <= a < j:
            raise ValueError(f"tree_parents[{row}, {j}] = {a} must be in [-1, {j}): -1 is the root, and a parent "
                             "comes before its child (list the nodes in topological order)")
        if (a, t) in seen:
            raise ValueError(f"tree_tokens[{row}, {j}] = {t} repeats a sibling's token (parent {a}): siblings must "
                             "be distinct candidates (a repeated one can never be accepted)")
        seen.add((a, t))
        depth[j] = 1 if a < 0 else depth[a] + 1
        if depth[j] > max_depth:
            raise ValueError(f"tree row {row}: node {j} is at depth {depth[j]}, over max_depth={max_depth}; "
                             "prune the tree or raise max_depth")
    return depth


def children_of(parents, size: int) -> list[list[int]]:
    """children[s] for slot s (0: the root, j + 1: node j), in node order."""
    children: list[list[int]] = [[] for _ in range(size + 1)]
    for j in range(size):
        children[int(parents[j]) + 1].append(j)
    return children


# ----------------------------------------------------------------------------- verification


class TreeVerifier:
    """Tree verification as small steps; ``flashspec.mutants`` breaks single steps on purpose."""

    def __call__(
        self,
        target_logits,  # [B, N+1, V] float: the root's row, then node j's at j + 1
        tree_tokens,  # [B, N] int
        tree_parents,  # [B, N] int in [-1, j): -1 the root
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed=0,
        offset=0,
        tree_sizes=None,  # [B] int in [0, N]: row b's tree is its first tree_sizes[b] nodes; None: all N
        max_depth: int = MAX_TREE_DEPTH,
    ) -> TreeVerifyResult:
        cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        b, n, v = check_tree_args(target_logits, tree_tokens, tree_parents, tree_sizes, seed, offset)
        z = as_float32(target_logits)
        tokens = np.asarray(tree_tokens).astype(np.int64)
        parents = np.asarray(tree_parents).astype(np.int64)
        sizes = np.full(b, n, np.int64) if tree_sizes is None else np.asarray(tree_sizes).astype(np.int64)
        depths = [tree_depths(tokens[r], parents[r], int(sizes[r]), v, max_depth, r) for r in range(b)]
        _check_logits(z)
        c = Counters.make(seed, offset, b)
        log_p = None if cfg.greedy else log_probs(z, cfg)  # [B, N+1, V]
        log_u = None if cfg.greedy else np.log(self.accept_uniforms(c, n))  # [B, N]
        walks = []
        for r in range(b):
            children = children_of(parents[r], int(sizes[r]))
            if cfg.greedy:
                walks.append(self.walk_greedy(z[r], tokens[r], children))
            else:
                noise = lambda s, r=r: self.final_gumbel(c, r, s, v)  # noqa: E731 (slot -> [V], drawn on use)
                walks.append(self.walk(log_p[r], tokens[r], children, log_u[r], noise))
        return emit(tokens, walks, max((int(d.max()) if len(d) else 0) for d in depths))

    # -- randomness

    def accept_uniforms(self, c: Counters, n: int) -> np.ndarray:  # -> [B, N]
        j = np.arange(n)[None]
        return rng.uniform(c.seed[:, None], c.offset[:, None], c.row[:, None], j + 1, 0, rng.TREE_ACCEPT)

    def final_gumbel(self, c: Counters, r: int, slot: int, v: int) -> np.ndarray:  # -> [V]
        return rng.gumbel(c.seed[r], c.offset[r], c.row[r], slot, np.arange(v), rng.TREE_FINAL)

    # -- the walk

    def walk(self, log_p, tokens, children, log_u, gumbel) -> tuple[list[int], int]:  # log_p [N+1, V], log_u [N]
        """The accepted path's node indices and the emitted token y, for one row."""
        path: list[int] = []
        slot = 0
        while True:
            lp = log_p[slot]  # [V]
            kids = tokens[children[slot]]  # [K]: this node's children's tokens, in the order they are tried
            for k, j in enumerate(children[slot]):
                if self.accept(log_u[j], self.child_log_prob(lp, kids, k)):
                    path.append(j)
                    slot = j + 1
                    break
            else:
                return path, draw(self.residual(lp, kids), gumbel(slot))

    def accept(self, log_u, log_p_c) -> bool:
        return bool(log_u < log_p_c)

    def child_log_prob(self, lp, kids, k: int):  # [V], [K] -> float32 scalar
        """log p_cur(c_k) after c_0..c_{k-1} were rejected: log p(c_0) for k = 0, else log(p(c_k) / M_k) with
        p = exp(log p) in float32 and M_k = R + p(c_k) + ... + p(c_{K-1}), R the mass of the tokens that are not
        children (one masked pass over V per node: the form a kernel computes, accurate when little is left)."""
        if k == 0:
            return lp[kids[0]]
        p = np.exp(lp)
        is_child = np.zeros(lp.shape, bool)
        is_child[kids] = True
        left = np.where(is_child, np.float32(0), p).sum(dtype=np.float32) + p[kids[k:]].sum(dtype=np.float32)
        with np.errstate(divide="ignore"):
            return np.log(p[kids[k]]) - np.log(left)

    def residual(self, lp, kids):  # [V], [K] -> [V] unnormalised log weights
        """y's law after every child was rejected: p with the children zeroed (p itself at a leaf)."""
        out = lp.copy()
        out[kids] = -np.inf
        return out

    def walk_greedy(self, z, tokens, children) -> tuple[list[int], int]:  # z [N+1, V]
        """T = 0: descend into the child equal to argmax z (lowest index on ties), else emit it."""
        path: list[int] = []
        slot = 0
        while True:
            best = int(z[slot].argmax())
            nxt = [j for j in children[slot] if tokens[j] == best]
            if not nxt:
                return path, best
            path.append(nxt[0])
            slot = nxt[0] + 1


def draw(log_weights, gumbel) -> int:  # [V], [V]
    """Gumbel-max over the residual's log weights; refuses an empty residual (never reached: a child holding
    all the remaining mass has log p_cur = 0 exactly and is accepted)."""
    if not np.isfinite(log_weights).any():
        raise AssertionError("tree verification's residual has no mass: every token was a rejected child")
    return int((log_weights + gumbel).argmax())


def emit(tokens, walks, depth: int) -> TreeVerifyResult:  # tokens [B, N]
    b = len(walks)
    out = np.full((b, depth + 1), -1, np.int32)
    path = np.full((b, depth), -1, np.int32)
    for r, (nodes, y) in enumerate(walks):
        path[r, : len(nodes)] = nodes
        out[r, : len(nodes)] = tokens[r, nodes]
        out[r, len(nodes)] = y
    return TreeVerifyResult(np.array([len(w[0]) for w in walks], np.int32), out, path)


def _check_logits(z) -> None:
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("target_logits contain NaN or +inf: logits must be finite or -inf (masked)")
    if (~np.isfinite(z).any(-1)).any():
        raise ValueError("target_logits have a row with no finite logit: every row needs a token with mass")


# ----------------------------------------------------------------------------- the exact law


def tree_law(log_p, tokens, parents) -> np.ndarray:  # [N+1, V], [N], [N] -> [N+1, V] float64
    """P(the walk stops at slot s and emits y = v), T > 0: the path's product of p times p_s(v), with
    v ranging over the tokens that are not children of slot s. Sums to 1."""
    p = probs64(log_p)
    law = p.copy()
    for t, a in zip(tokens, parents):
        law[int(a) + 1, t] = 0.0
    return law * reach(p, tokens, parents)[:, None]


def expected_tokens(log_p, tokens, parents) -> float:  # [N+1, V], [N], [N]
    """E[tokens emitted by one step] = 1 + sum over nodes of P(the walk passes the node), T > 0: what a tree
    of drafts gives per step at this temperature, from one scoring pass's rows, without sampling."""
    return float(reach(probs64(log_p), tokens, parents).sum())


def reach(p, tokens, parents) -> np.ndarray:  # [N+1, V] float64, [N], [N] -> [N+1]
    """P(the walk reaches slot s): the product of p(token) along the path from the root."""
    out = np.ones(len(tokens) + 1)
    for j, (t, a) in enumerate(zip(tokens, parents)):
        out[j + 1] = out[int(a) + 1] * p[int(a) + 1, t]
    return out


def probs64(log_p) -> np.ndarray:  # [..., V] -> [..., V] float64, renormalised
    p = np.exp(log_p.astype(np.float64))
    return p / p.sum(-1, keepdims=True)


verify_tree = TreeVerifier()
