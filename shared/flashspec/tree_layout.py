"""How a draft tree is laid out for the target's scoring pass, and what its cache keeps after verification.

The scoring pass feeds N+1 rows: slot 0 the root (the last committed token), slot j + 1 node j. Row s may
attend the committed context and the slots on its own path (itself and its ancestors), and sits at
position ``base + depth(s)`` (the root's depth 0, its children 1, ...), so that every slot's logits are
the ones the target gives the sequence "context, path to s" (``flashspec.tree``'s ``target_logits``).
After ``verify_tree``, the cache keeps the root's and the accepted path's rows, moved to consecutive
positions (``kept_slots``); the other rows are dropped.

NumPy only; the backends build their masks and gathers from these arrays.
"""

from __future__ import annotations

import numpy as np

from .tree import TreeVerifyResult


def slot_parents(tree_parents, tree_sizes=None) -> np.ndarray:  # [B, N] -> [B, N+1]
    """Each slot's parent slot: -1 for the root and for padded nodes (past ``tree_sizes``), else parent + 1."""
    parents = np.asarray(tree_parents).astype(np.int64)
    b, n = parents.shape
    sizes = np.full(b, n) if tree_sizes is None else np.asarray(tree_sizes)
    real = np.arange(n)[None] < sizes[:, None]  # [B, N]
    return np.concatenate([np.full((b, 1), -1), np.where(real, parents + 1, -1)], axis=1)


def tree_attention_mask(tree_parents, tree_sizes=None) -> np.ndarray:  # [B, N] -> [B, N+1, N+1] bool
    """mask[b, s, t]: slot s may attend slot t (t is s or one of its ancestors). Padded slots see only
    themselves (their rows are never read)."""
    up = slot_parents(tree_parents, tree_sizes)  # [B, N+1]
    b, n1 = up.shape
    mask = np.zeros((b, n1, n1), bool)
    for s in range(n1):  # parents come first, so a slot's row extends its parent's
        mask[:, s, s] = True
        has = up[:, s] >= 0
        mask[has, s] |= mask[has, up[has, s]]
    return mask


def slot_depths(tree_parents, tree_sizes=None) -> np.ndarray:  # [B, N] -> [B, N+1]
    """Each slot's depth (the root 0): its position past the root's in the scoring pass."""
    return tree_attention_mask(tree_parents, tree_sizes).sum(-1) - 1


def kept_slots(result: TreeVerifyResult) -> np.ndarray:  # -> [B, D+1]
    """The slots whose cache rows survive the step, in order: the root, then the accepted nodes; -1 after.
    Row i of the kept rows moves to position base + i (the emitted y is not in the cache yet)."""
    path = np.asarray(result.path)
    return np.concatenate([np.zeros((len(path), 1), path.dtype), np.where(path >= 0, path + 1, -1)], axis=1)
