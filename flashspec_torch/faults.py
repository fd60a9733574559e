"""NaN / infinite logits out of a model, caught on the device (flashspec.faults explains the flow).

Each step the backend flags, per row, which model's logits were not finite, replaces them by zeros
where verify would refuse them (the CPU value checks), and after the commit takes the flagged rows'
tokens back and stops those rows. Everything is a tensor op on the step's own buffers: no host
synchronisation, and CUDA-graph capturable. The host reads the flags one step late.
"""

from __future__ import annotations

import torch

from flashspec.faults import DRAFT_LOGITS, TARGET_LOGITS


def nonfinite_rows(a: torch.Tensor) -> torch.Tensor:  # [B, ..., V] -> [B] bool
    """Rows holding a NaN or +inf, or a position without any finite logit (amax propagates NaN)."""
    top = a.amax(-1)  # [B, ...]
    return ~torch.isfinite(top).flatten(1).all(-1)


def screen(
    bad: torch.Tensor,  # [B] uint8, written: this step's flashspec.faults bits
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_logits: torch.Tensor | None = None,  # [B, G, V]
    draft_logprobs: torch.Tensor | None = None,  # [B, G]
):
    """Flag this step's bad rows into ``bad``; returns the inputs with flagged rows zeroed on the CPU,
    where verify value-checks its inputs (on a GPU the flagged rows' results are discarded unread)."""
    flags = nonfinite_rows(target_logits).to(torch.uint8) * TARGET_LOGITS
    if draft_logits is not None:
        flags |= nonfinite_rows(draft_logits).to(torch.uint8) * DRAFT_LOGITS
    if draft_logprobs is not None:
        flags |= (~torch.isfinite(draft_logprobs).all(-1)).to(torch.uint8) * DRAFT_LOGITS
    bad.copy_(flags)
    if target_logits.device.type != "cpu":
        return target_logits, draft_logits, draft_logprobs
    hit = flags.bool()
    zero = lambda a: None if a is None else a.masked_fill(hit.view(-1, *[1] * (a.dim() - 1)), 0.0)  # noqa: E731
    return zero(target_logits), zero(draft_logits), zero(draft_logprobs)


def discard_flagged(
    bad: torch.Tensor,  # [B] uint8: this step's flags; cleared where the row was not live
    length_before: torch.Tensor,  # [B] int64: lengths before the commit
    length: torch.Tensor,  # [B] int64, restored in place for flagged live rows
    done: torch.Tensor,  # [B] bool, set for flagged live rows
    active: torch.Tensor,  # [B] bool: the row was live during this step
) -> None:
    hit = bad.bool() & active
    bad.mul_(hit)
    length.copy_(torch.where(hit, length_before, length))
    done.logical_or_(hit)


def scrub_caches(caches) -> None:
    """Zero KV caches after a fault: a masked slot still holding NaN poisons attention (0 * NaN)."""
    for c in caches:
        c.k.zero_()
        c.v.zero_()
