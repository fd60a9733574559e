"""The draft head drafts a tree (EAGLE-2's dynamic tree), in the format ``flashspec.tree.verify_tree`` takes.

From each row's root (the last committed token, the head's state and logits after it), ``expand_tree`` runs
``depth`` rounds: round 1's candidates are the root's ``top_k`` children; each later round runs the head on
the ``top_k`` candidates of the newest depth with the highest cumulative log q (the frontier), each adding its
``top_k`` children as candidates (M = top_k + (depth - 1) top_k^2 candidates per row, in depth order). Each
frontier node feeds the head its parent's state, as chain drafting does, and is laid out as the target's tree
scoring pass lays out a tree (``tree_score.tree_pass``, the ancestor mask built on the device): the frontier
nodes so far form a tree under the root, node f's K/V at cache row root + 1 + f, its RoPE at root + its depth,
and it attends the committed context and its own ancestors only, so each path is run as chain drafting runs it.
One head pass of K rows per depth per batch row. The frontier tree is a device tensor of fixed shape
[B, (depth - 1) top_k] (its later rounds padding until written), so with ``attend`` given and
``validate=False`` nothing is read to the host: the step can be captured in a CUDA graph.

``select_tree`` keeps the ``size`` candidates of highest cumulative log q (a stable sort: on ties the earlier,
shallower candidate first; a child's value is at most its parent's, so a kept node's parent is kept) and lays
them out in candidate order (parents first): tree_tokens, tree_parents (-1: the root), tree_sizes, one fixed
N = size per batch. With top_k = 1 the tree is the head's greedy chain of ``depth`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import KVCache
from .tree_score import TreePass, tree_pass


@dataclass(frozen=True)
class Candidates:
    """EAGLE-2's candidates of each row, in depth order."""

    values: torch.Tensor  # [B, M] float32: cumulative log q of the path root -> candidate
    tokens: torch.Tensor  # [B, M] int64: the candidate's token (the target's id)
    parents: torch.Tensor  # [B, M] int64: the parent's candidate index, -1 for the root's children
    depths: torch.Tensor  # [M] int64: 1 for the root's children


@dataclass(frozen=True)
class DraftTree:
    """A tree in ``verify_tree``'s format, and which candidate each node is."""

    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [B, N] int64: a parent's node index (< the node's), -1 for the root
    sizes: torch.Tensor  # [B] int64: N for every row
    index: torch.Tensor  # [B, N] int64: each node's candidate index in ``Candidates``


def candidate_count(top_k: int, depth: int) -> int:
    return top_k + (depth - 1) * top_k * top_k


def copy_cache_rows(config, cache: KVCache, rows: torch.Tensor) -> KVCache:  # rows [R] -> a cache of R rows
    """A new cache whose row i is a copy of ``cache``'s row rows[i]."""
    out = KVCache(config, len(rows), cache.max_len, cache.k.dtype, cache.k.device)
    out.k.copy_(cache.k[:, rows])
    out.v.copy_(cache.v[:, rows])
    return out


def check_expand_args(head, state, logits, cache: KVCache, root, top_k: int, depth: int, attend: int | None) -> int:
    """The arguments' shapes; returns the attended cache rows (``attend``, or read from root when None)."""
    b = root.shape[0]
    if top_k < 1 or depth < 1:
        raise ValueError(f"top_k={top_k}, depth={depth}: both must be >= 1")
    if top_k > len(head.token_ids):
        raise ValueError(f"top_k={top_k} exceeds the head's vocabulary ({len(head.token_ids)} tokens); lower top_k")
    if state.shape[0] != b or logits.shape != (b, len(head.token_ids)) or cache.k.shape[1] != b:
        raise ValueError(f"state {list(state.shape)}, logits {list(logits.shape)}, cache rows {cache.k.shape[1]}: want "
                         f"[B, C], [B, V_d = {len(head.token_ids)}] and B cache rows for root [B = {b}]")
    if attend is None:
        attend = int(root.max()) + (depth - 1) * top_k + 1
    if attend > cache.max_len:
        raise ValueError(f"the frontier's cache rows reach {attend - 1}, outside the head's cache ({cache.max_len} rows); "
                         "allocate max_len > root + (depth - 1) top_k")
    return attend


def frontier_pass(root, parents: torch.Tensor, count: int, top_k: int, attend: int) -> tuple[torch.Tensor, TreePass]:
    """(cache rows [B, K], TreePass) of frontier nodes count - K .. count - 1 of the frontier tree ``parents``
    [B, F] (every frontier node, round by round; -1: the root; nodes past ``count`` are padding), laid out as the
    target's scoring pass lays out a tree (``tree_score.tree_pass``): node f at row root + 1 + f, RoPE at root +
    depth, its ancestors seen."""
    sizes = torch.full((parents.shape[0],), count, dtype=torch.int64, device=parents.device)
    rows, tp = tree_pass(root, parents, sizes, attend)
    new = slice(count - top_k + 1, count + 1)  # their slots
    return rows[:, new], TreePass(tp.rope_positions[:, new], tp.mask[:, :, new])


@torch.no_grad()
def expand_tree(head, target, state, logits, cache: KVCache, root, top_k: int, depth: int,
                attend: int | None = None) -> Candidates:
    """EAGLE-2's candidates (module docstring). state [B, C] and logits [B, V_d]: the head at position root [B]
    (its prediction of the first drafted token); ``cache`` [B rows] holds the head's K/V of positions <= root.
    Overwrites ``cache`` rows root + 1 .. root + (depth - 1) top_k (the frontier's K/V). ``attend``: the head
    cache rows its passes attend (> root + (depth - 1) top_k in every row); None reads root's maximum."""
    attend = check_expand_args(head, state, logits, cache, root, top_k, depth, attend)
    n, k = root.shape[0], top_k
    val, j = logits.float().log_softmax(-1).topk(k, -1)  # [B, K]
    ids = head.token_ids[j]
    front = torch.arange(k, device=root.device).expand(n, k)  # [B, K]: the frontier's candidate indices
    values, tokens, parents = [val], [ids], [torch.full_like(ids, -1)]
    depths = [torch.ones(k, dtype=torch.int64, device=root.device)]
    state = state[:, None].expand(n, k, state.shape[-1])  # [B, K, C]: the frontier's parents' states
    up = torch.full((n, (depth - 1) * k), -1, dtype=torch.int64, device=root.device)  # [B, F]: the frontier tree
    for d in range(1, depth):
        rows, tp = frontier_pass(root, up, d * k, k, attend)
        s, w = head.run(target, ids, state, rows, cache, attend, tree=tp)  # [B, K, C], [B, K, V_d]
        cval, cj = w.log_softmax(-1).topk(k, -1)  # [B, K, K]
        cval = (val[:, :, None] + cval).reshape(n, k * k)
        first = candidate_count(k, d)  # the new candidates' first index
        values.append(cval), tokens.append(head.token_ids[cj].reshape(n, k * k))
        parents.append(front.repeat_interleave(k, 1)), depths.append(torch.full_like(depths[0], d + 1).repeat(k))
        val, pick = cval.topk(k, -1)  # the next frontier: [B, K]
        ids, front, at = tokens[-1].gather(1, pick), first + pick, pick // k  # at: the parent's place in the frontier
        state = s.gather(1, at[:, :, None].expand(-1, -1, s.shape[-1]))
        if d + 1 < depth:
            up[:, d * k : (d + 1) * k] = (d - 1) * k + at
    return Candidates(torch.cat(values, 1), torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(depths))


def select_tree(cands: Candidates, size: int, validate: bool = True) -> DraftTree:
    """The ``size`` candidates of highest cumulative log q of each row as a tree (module docstring).
    ``validate`` checks on the host that every kept node's parent was kept (False: no host read)."""
    b, m = cands.values.shape
    if not 1 <= size <= m:
        raise ValueError(f"size={size}: want 1 <= size <= {m}, the candidates per row (top_k + (depth - 1) top_k^2)")
    best = cands.values.sort(dim=-1, descending=True, stable=True).indices[:, :size]
    index = best.sort(-1).values  # [B, N]: candidate order, so parents come first
    node_of = torch.full((b, m + 1), -1, dtype=torch.int64, device=index.device)  # candidate (+1) -> node; 0: root
    node_of[:, 1:].scatter_(1, index, torch.arange(size, device=index.device).expand(b, size))
    parents = node_of.gather(1, cands.parents.gather(1, index) + 1)
    if validate and bool(((cands.parents.gather(1, index) >= 0) & (parents < 0)).any()):
        raise AssertionError("select_tree kept a node without its parent (candidate values not monotone)")
    return DraftTree(cands.tokens.gather(1, index), parents, torch.full((b,), size, dtype=torch.int64, device=index.device),
                     index)


def draft_tree(head, target, state, logits, cache: KVCache, root, top_k: int, depth: int, size: int) -> DraftTree:
    """The head's EAGLE-2 tree of ``size`` nodes from each row's root (``expand_tree``, ``select_tree``)."""
    return select_tree(expand_tree(head, target, state, logits, cache, root, top_k, depth), size)
