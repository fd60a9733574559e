"""Tree speculation as a step of the torch backend: the draft head's EAGLE-2 tree, scored and verified exactly.

One step, every batch row at once (rows at different lengths; finished rows run along and commit nothing):

    the head fed up to each row's last committed token (the root, position base = length - 1)
    -> ``head_tree.expand_tree`` / ``select_tree``: a tree of N nodes, depth <= G (``gamma`` is the depth)
    -> ``tree_score.score_tree``: the target over the root and the N nodes in one forward, with the head's
       feature layers' states
    -> ``tree_verify.verify_tree`` (exact at every temperature / top-k / top-p: the tree's nodes are
       deterministic candidates, no q)
    -> ``compact_tree_cache``: the root's and the accepted nodes' K/V to rows base, base + 1, ...
    -> their features to ``seqs.features`` at the same positions (the head's input next step)
    -> the head's ``valid`` = length: its rows past the root hold the frontier's K/V (its own states),
       so the next step re-feeds them from the target's features, as ``HeadDraft`` does after a chain
    -> ``TorchBackend.commit``: the path's tokens, then y (cut at EOS and max_new_tokens).

``StepRecord.drafted`` counts each row's tree depth (the most tokens the step can accept), ``accepted`` the
accepted path's depth, so the policies' per-token acceptance is the chance that the accepted path goes one
level deeper. Every shape depends only on (B, N, top_k, G) and the tree's layout is built on the device, so
with ``graphed=True`` (``TorchBackend`` with graphs: head fed G + 1 positions, attention over the whole cache)
the step reads nothing to the host and is captured as one CUDA graph per (arm, G, sampling); eagerly (the CPU
default) attention stops at the host's length bound and the head catches up every unfed position.
"""

from __future__ import annotations

import torch

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult
from flashspec.drafts import MAX_TREE_NODES, TREE_TOP_K

from .faults import screen
from .head_tree import DraftTree, candidate_count, expand_tree, select_tree
from .heads import HeadDraft
from .tree_score import compact_tree_cache, score_tree
from .tree_verify import verify_tree


class HeadTreeDraft(HeadDraft):
    """The draft head drafting an EAGLE-2 tree of ``size`` nodes per row (``top_k`` children per frontier
    node, depth = the step's G); ``TorchBackend.step`` runs it through ``tree_step``."""

    capturable = True  # draft_tree(graphed=True) and tree_result have fixed shapes, no host read
    tree = True

    def __init__(self, name: str, head, target, size: int, top_k: int = TREE_TOP_K):
        super().__init__(name, head, target)
        if not 1 <= size <= MAX_TREE_NODES or top_k < 1:
            raise ValueError(f"size={size}, top_k={top_k}: a tree needs 1 <= size <= {MAX_TREE_NODES} nodes, top_k >= 1")
        self.size, self.top_k = size, top_k

    def nodes(self, gamma: int) -> int:
        """The tree's nodes at depth ``gamma``: ``size``, or every candidate where there are fewer."""
        return min(self.size, candidate_count(self.top_k, gamma))

    def check_depth(self, gamma: int) -> None:
        if (gamma - 1) * self.top_k > MAX_TREE_NODES:
            raise ValueError(f"draft {self.name!r}: depth G = {gamma} with top_k {self.top_k} writes "
                             f"{(gamma - 1) * self.top_k} head cache rows past the root, more than the "
                             f"{MAX_TREE_NODES} a row has spare; use G <= {1 + MAX_TREE_NODES // self.top_k}")

    def propose(self, *args, **kwargs):
        raise ValueError(f"draft {self.name!r} drafts a tree, which only TorchBackend.step runs (flashspec_torch."
                         "tree_step): not serving slots, full-information scoring or a chain's verify")

    def draft_tree(self, seqs, gamma: int, graphed: bool = False) -> tuple[DraftTree, torch.Tensor]:  # tree, depth [B]
        """The head fed up to each row's root, then its tree of ``nodes(gamma)`` nodes; afterwards ``valid`` =
        length (the rows past the root hold the frontier's K/V, re-fed next step). ``graphed``: fixed shapes
        and no host read (the head fed G + 1 positions, as ``propose(graphed=True)``; attention over the cache)."""
        self.check_depth(gamma)
        length = seqs.length
        s_max = self.cache.max_len
        attend = s_max if graphed else min(seqs.max_len_bound + gamma + (gamma - 1) * self.top_k, s_max)
        s, w = self.root(seqs, gamma, attend, graphed)
        cands = expand_tree(self.head, self.target, s, w, self.cache, length - 1, self.top_k, gamma, attend)
        tree = select_tree(cands, self.nodes(gamma), validate=False)
        self.valid.copy_(length)
        return tree, cands.depths[tree.index].max(-1).values


def tree_step(backend, arm: int, gamma: int, sampling: SamplingConfig, seed, offset: int):
    """One eager tree speculation step of ``backend`` (a ``TorchBackend``) with its draft ``arm`` (a
    ``HeadTreeDraft``) at depth ``gamma`` (module docstring); returns the backend's ``AsyncHandle``."""
    result, depth = tree_result(backend, arm, gamma, sampling, seed, offset, graphed=False)
    backend.drafts[arm].mark_used(backend.seqs, gamma)
    return backend.commit(result, depth, skip=arm)


def tree_result(backend, arm: int, gamma: int, sampling: SamplingConfig, seed, offset,
                graphed: bool) -> tuple[VerifyResult, torch.Tensor]:  # tokens [B, G+1], depth [B]
    """The device work of a tree step up to the commit: draft, score, screen, verify, compact the cache, move the
    features. ``graphed``: fixed shapes, no host read (``TorchBackend.graphed_step`` captures it)."""
    draft, seqs = backend.drafts[arm], backend.seqs
    tree, depth = draft.draft_tree(seqs, gamma, graphed)
    base = seqs.length - 1  # [B]: the roots' positions
    root = seqs.tokens.gather(1, base[:, None])[:, 0]
    n = tree.tokens.shape[1]
    logits, feats = score_tree(backend.target, backend.cache, root, tree.tokens, tree.parents, base, tree.sizes,
                               hidden=backend.hidden, attend=backend.attend(n + 1), validate=False)  # [B, N+1, V], [B, N+1, F]
    logits = screen(backend.bad, logits)[0]
    r = verify_tree(logits, tree.tokens, tree.parents, temperature=sampling.temperature, top_k=sampling.top_k,
                    top_p=sampling.top_p, seed=seed, offset=offset, tree_sizes=tree.sizes, validate=False,  # screened
                    widest=draft.top_k, depth=gamma)  # [B, G+1]: one width per G
    kept = kept_slots(r.path)  # [B, G+1]
    compact_tree_cache(backend.cache, base, kept)
    keep_features(seqs.features, feats, base, kept)
    return VerifyResult(r.num_accepted, r.tokens), depth


def kept_slots(path: torch.Tensor) -> torch.Tensor:  # path [B, D] -> [B, D+1] int64
    """``flashspec.tree_layout.kept_slots`` on the device: the root (slot 0), the accepted nodes' slots, -1 after."""
    path = path.long()
    return torch.cat([torch.zeros_like(path[:, :1]), torch.where(path >= 0, path + 1, -1)], 1)


def keep_features(
    features: torch.Tensor,  # [B, S, F], written: kept slot i's features at position base + i
    feats: torch.Tensor,  # [B, N+1, F]: each slot's features from the scoring pass
    base: torch.Tensor,  # [B] int64: the roots' positions
    kept: torch.Tensor,  # [B, D+1] int64: kept_slots (-1: nothing kept there)
) -> None:
    """The kept slots' features at consecutive positions from the root's, as ``compact_tree_cache`` moves
    their K/V; positions of -1 entries keep what they held."""
    f = features.shape[-1]
    dest = (base[:, None] + torch.arange(kept.shape[1], device=base.device)).clamp(max=features.shape[1] - 1)
    at = lambda i: i[..., None].expand(-1, -1, f)  # noqa: E731
    new = feats.to(features.dtype).gather(1, at(kept.clamp(min=0)))
    features.scatter_(1, at(dest), torch.where((kept >= 0)[..., None], new, features.gather(1, at(dest))))
