"""The target's scoring pass over a draft tree (eager torch: explicit boolean mask, SDPA attention), and the
KV compaction that keeps the verified path.

One forward over N+1 rows per batch row: slot 0 the root (the last committed token, at position ``base``),
slot j + 1 node j. Slot s's K/V are written at cache row ``base + s`` (every slot its own row, though siblings
share a depth); its RoPE position is ``base + depth(s)``; it attends the committed context (rows < base) and
the rows of its own path (``flashspec.tree_layout.tree_attention_mask``). So slot s's logits are the ones the
target gives "context, root, path to s" run causally: what ``flashspec.tree.verify_tree`` reads.
After verification, ``compact_tree_cache`` moves the kept rows (root, accepted nodes) to rows base, base+1, ...
so that the cache is again a plain causal one.

The layout (``slot_ancestors``) is built on the device with fixed shapes (B, N), so the pass can be captured
in a CUDA graph: with ``validate=False`` and ``attend`` given, ``score_tree`` reads nothing to the host.
Not here: the attention kernel (the layers run with impl "reference" in this pass), sliding windows,
batch-invariant mode (refused with a clear error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashspec.tree import MAX_TREE_DEPTH, tree_depths


@dataclass(frozen=True)
class TreePass:
    """What ``Llama.forward`` needs besides the cache write rows to score a tree."""

    rope_positions: torch.Tensor  # [B, N+1] int64: base + depth, each slot's RoPE position
    mask: torch.Tensor  # [B, 1, N+1, S] bool: slot s sees cache row c (S = attend_len)


def check_tree_model(model) -> None:
    """Refuse the models this eager pass does not score exactly."""
    c = model.config
    if model.batch_invariant:
        raise ValueError("score_tree: batch_invariant mode runs only the attention kernel, which has no tree mask; "
                         "set model.batch_invariant = False")
    if any(c.sliding_windows):
        raise ValueError("score_tree: sliding-window layers are not implemented for trees (their window is over "
                         "positions, the tree's rows are not at their positions); use a model without sliding_windows")


def check_tree(tokens: np.ndarray, parents: np.ndarray, sizes: np.ndarray, vocab: int) -> None:
    """The tree's shapes and structure (``flashspec.tree.tree_depths``' rules); raises ValueError."""
    if tokens.ndim != 2 or tokens.shape != parents.shape or sizes.shape != (tokens.shape[0],):
        raise ValueError(f"tree_tokens {list(tokens.shape)}, tree_parents {list(parents.shape)} must both be [B, N] "
                         f"and tree_sizes [B] (got {list(sizes.shape)})")
    for r in range(tokens.shape[0]):
        tree_depths(tokens[r], parents[r], int(sizes[r]), vocab, MAX_TREE_DEPTH, r)


def slot_ancestors(
    tree_parents: torch.Tensor,  # [B, N] int in [-1, j): node j's parent (-1 the root)
    tree_sizes: torch.Tensor,  # [B] int: nodes past tree_sizes[b] are padding
) -> torch.Tensor:  # [B, N+1, N+1] bool
    """``flashspec.tree_layout.tree_attention_mask`` on the device, fixed shapes, no host read: slot s sees
    slot t iff t is s or one of its ancestors (padded slots see only themselves). The parent links' reflexive
    transitive closure, by ceil(log2(N+1)) squarings of a 0/1 matrix (float32 sums of at most N+1 ones: exact)."""
    b, n = tree_parents.shape
    dev = tree_parents.device
    real = torch.arange(n, device=dev)[None] < tree_sizes[:, None]  # [B, N]
    up = torch.where(real, tree_parents.long() + 1, n + 1)  # [B, N]: slot j + 1's parent slot; n + 1: none
    a = torch.zeros((b, n + 1, n + 2), dtype=torch.float32, device=dev)
    a[:, 1:].scatter_(2, up[..., None], 1.0)
    a = a[..., : n + 1] + torch.eye(n + 1, device=dev)
    for _ in range(n.bit_length()):  # after r squarings: every ancestor up to 2^r links away
        a = torch.bmm(a, a).clamp_(max=1.0)
    return a > 0


def tree_pass(base: torch.Tensor, parents: torch.Tensor, sizes: torch.Tensor, attend: int) -> tuple[torch.Tensor, TreePass]:
    """(write rows [B, N+1], TreePass) for trees (parents [B, N], sizes [B], tensors on base's device) rooted at
    positions base [B]; device work only (fixed shapes)."""
    n1 = parents.shape[1] + 1
    device = base.device
    tree = slot_ancestors(parents, sizes)  # [B, N+1, N+1]
    depths = tree.sum(-1) - 1  # [B, N+1]: a slot's ancestors
    rel = torch.arange(attend, device=device)[None] - base[:, None]  # [B, S]: a cache row's slot past the root
    inside = (rel >= 0) & (rel < n1)
    on_path = tree.gather(2, rel.clamp(0, n1 - 1)[:, None, :].expand(-1, n1, -1))  # [B, N+1, S]
    mask = (rel < 0)[:, None, :] | (inside[:, None, :] & on_path)
    rows = base[:, None] + torch.arange(n1, device=device)
    return rows, TreePass(base[:, None] + depths, mask[:, None])


def score_tree(
    model,  # flashspec_torch.model.Llama
    cache,  # its KVCache: rows [0, base) hold each row's committed context; rows base .. base + N are overwritten
    root: torch.Tensor,  # [B] int64: the last committed token (not in the cache yet)
    tree_tokens: torch.Tensor,  # [B, N] int: node j's token
    tree_parents: torch.Tensor,  # [B, N] int in [-1, j): node j's parent (-1 the root)
    base: torch.Tensor,  # [B] int64: the root's position (the committed length - 1)
    tree_sizes: torch.Tensor | None = None,  # [B]: row b's tree is its first tree_sizes[b] nodes; None: all N
    hidden: tuple[int, ...] = (),  # also return the residual stream after these layers (a draft head's input)
    attend: int | None = None,  # the cache rows attended (> base + N in every row); None: read from base
    validate: bool = True,  # False: the tree is trusted (an engine step built it); with attend: no host read
):  # [B, N+1, V] float32: the root's logits, then node j's at j + 1; with ``hidden``: (that, [B, N+1, len * C])
    """The target's logits (and with ``hidden`` its states, as ``Llama.forward`` returns them) at every slot of
    the tree in one forward (see the module docstring); padded nodes' rows are computed but meaningless.
    ``validate`` reads the tree to the host to check it (``flashspec.tree.tree_depths``' rules); ``attend=None``
    reads base's maximum."""
    check_tree_model(model)
    b, n = tree_parents.shape
    dev = root.device
    sizes = torch.full((b,), n, dtype=torch.int64, device=dev) if tree_sizes is None else tree_sizes.long()
    if validate:
        check_tree(tree_tokens.cpu().numpy().astype(np.int64), tree_parents.cpu().numpy().astype(np.int64),
                   sizes.cpu().numpy(), model.config.vocab_size)
    if root.shape != (b,) or base.shape != (b,):
        raise ValueError(f"root {list(root.shape)} and base {list(base.shape)} must be [B] = [{b}]")
    if attend is None:
        attend = int(base.max()) + n + 1
        if int(base.min()) < 0:
            raise ValueError("a base is negative: base is each root's position (the committed length - 1)")
    if attend > cache.max_len:
        raise ValueError(f"the tree's rows base .. base + N reach {attend - 1}, outside the cache's "
                         f"[0, {cache.max_len}); allocate a longer cache or a smaller tree")
    padded = torch.arange(n, device=dev)[None] >= sizes[:, None]
    fed = torch.where(padded, 0, tree_tokens.long())  # padded nodes feed token 0
    rows, tp = tree_pass(base, tree_parents, sizes, attend)
    return model(torch.cat([root[:, None], fed], 1), rows, cache, attend, hidden=hidden, tree=tp)


def compact_tree_cache(
    cache,  # KVCache after score_tree
    base: torch.Tensor,  # [B] int64: the roots' positions
    kept: torch.Tensor,  # [B, D+1] int64: flashspec.tree_layout.kept_slots (the root, accepted nodes, then -1)
) -> None:
    """Move kept slot i's K/V (row base + kept[b, i]) to row base + i, in place, for every layer; rows past the
    accepted path are left as they are (stale, never attended before they are overwritten)."""
    d1 = kept.shape[1]
    dest = base[:, None] + torch.arange(d1, device=base.device)  # [B, D+1]
    src = torch.where(kept >= 0, base[:, None] + kept, dest)  # -1: copy a row onto itself
    for buf in (cache.k, cache.v):  # [L, B, H_kv, S, hd]
        l, _, h, _, hd = buf.shape
        at = lambda i: i[None, :, None, :, None].expand(l, -1, h, -1, hd)  # noqa: E731
        buf.scatter_(3, at(dest), buf.gather(3, at(src)))
