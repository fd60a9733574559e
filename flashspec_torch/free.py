"""Full-information scoring (issue #35, HedgeSpec): after a step, how many of its tokens each
recomputable draft would have had accepted, for drafts the step did not run.

A draft is recomputable (``recomputable = True``) when its proposal is a function of the token
history and G alone (the n-gram lookup; a replay of known text): ``propose`` is called on the
step's history before the commit, and its tokens are matched against the tokens the step emitted.
The emitted window is num_accepted + 1 tokens, so a proposal is scored on min(G, num_accepted + 1)
tokens; the count of leading matches among them is what it would have had accepted (censored where
the window ended without a mismatch: the policy counts no rejection then). Nothing here touches the
step's tokens or randomness, so exactness is unaffected.
"""

from __future__ import annotations

import torch


def recomputable(drafts) -> list[int]:
    """The indices of the drafts whose proposal can be recomputed from the history (``recomputable``)."""
    return [i for i, d in enumerate(drafts) if getattr(d, "recomputable", False)]


def free_proposals(drafts, seqs, gamma: int, skip: int | None = None) -> list[torch.Tensor | None]:
    """The proposal tokens [B, gamma] of every recomputable draft (``recomputable`` order), on the history
    before a commit; None for draft ``skip`` (the one the step ran: its own verification already counted it)."""
    return [None if i == skip else drafts[i].propose(seqs, gamma, None, None, None, graphed=True).tokens
            for i in recomputable(drafts)]


def score_into(
    out: torch.Tensor,  # [2, R, B] int32, written: (tokens scored, leading matches) per recomputable draft and row
    proposals: list[torch.Tensor | None],  # from free_proposals: R tensors [B, G], None for a draft not scored
    emitted: torch.Tensor,  # [B, W] int: the step's num_accepted + 1 tokens, then anything
    num_accepted: torch.Tensor,  # [B] int
) -> None:
    """Score every proposal against the emitted tokens, in place, in a few launches for all drafts; a draft whose
    proposal is None gets 0 tokens scored (the policy reads no evidence from it)."""
    keep = [r for r, p in enumerate(proposals) if p is not None]
    for r in range(len(proposals)):
        if r not in keep:
            out[:, r].zero_()
    if not keep:
        return
    tokens = torch.stack([proposals[r] for r in keep])  # [K, B, G]
    w = min(tokens.shape[2], emitted.shape[1])
    scored = torch.clamp(num_accepted.to(torch.int32) + 1, max=w)  # [B]
    j = torch.arange(w, device=emitted.device, dtype=torch.int32)
    match = (tokens[:, :, :w] == emitted[None, :, :w].to(tokens.dtype)) & (j < scored[:, None])  # [K, B, w]
    leading = match.to(torch.int32).cumprod(2).sum(2)  # [K, B]
    for i, r in enumerate(keep):  # integer indices: views, nothing copied from the host (capturable)
        out[0, r].copy_(scored)
        out[1, r].copy_(leading[i])


def expand(counts: "np.ndarray", drafts: int, which: list[int]) -> "np.ndarray":  # [R, B] -> [D, B]
    """Counts of the recomputable drafts ``which`` placed at their draft indices; 0 for the other drafts."""
    import numpy as np

    full = np.zeros((drafts, counts.shape[1]), counts.dtype)
    full[which] = counts
    return full
