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


def free_proposals(drafts, seqs, gamma: int) -> list[tuple[int, torch.Tensor]]:
    """(draft index, proposal tokens [B, gamma]) of every recomputable draft, on the history before a commit."""
    return [(i, drafts[i].propose(seqs, gamma, None, None, None, graphed=True).tokens) for i in recomputable(drafts)]


def score_into(
    out: torch.Tensor,  # [2, D, B] int32, written: (tokens scored, leading matches) per draft and row
    proposals: list[tuple[int, torch.Tensor]],  # from free_proposals: (draft, [B, G] tokens)
    emitted: torch.Tensor,  # [B, W] int: the step's num_accepted + 1 tokens, then anything
    num_accepted: torch.Tensor,  # [B] int
) -> None:
    """Score each proposal against the emitted tokens, in place (rows of drafts not listed keep 0 scored)."""
    for d, tokens in proposals:
        w = min(tokens.shape[1], emitted.shape[1])
        scored = torch.clamp(num_accepted.to(torch.int64) + 1, max=w)  # [B]
        j = torch.arange(w, device=emitted.device)
        match = (tokens[:, :w] == emitted[:, :w].to(tokens.dtype)) & (j[None] < scored[:, None])  # [B, w]
        out[0, d].copy_(scored)
        out[1, d].copy_(match.to(torch.int32).cumprod(1).sum(1))
