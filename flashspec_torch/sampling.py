"""Sampling with the shared generator in torch: what drafts (and plain decoding) use.

The distribution is ``verify``'s own ``log_probs`` (temperature, top-k, top-p, log-softmax in
float32, the oracle's formulas), so q is exactly what verify recomputes; the draw is Gumbel-max on
a given stream, bit-compatible with ``flashspec.reference.sample``. No host synchronisation.
"""

from __future__ import annotations

import torch

from flashspec.config import SamplingConfig
from flashspec.random import DRAFT

from .random import gumbel_from_uniform
from .reference import Counters, log_probs


def sample(
    logits: torch.Tensor,  # [B, V] raw logits
    cfg: SamplingConfig,
    seed,  # int or [B] int64 tensor (per-row seeds)
    offset,  # int or [] / [B] int64 tensor
    position: int = 0,
    stream: int = DRAFT,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B] int64, log q(token) [B] float32
    b, v = logits.shape
    if cfg.greedy:
        return logits.argmax(-1), torch.zeros(b, dtype=torch.float32, device=logits.device)
    lq = log_probs(logits.float(), cfg)
    u = Counters.make(seed, offset, b, logits.device).uniform(position, torch.arange(v, device=logits.device)[None], stream)
    tokens = (lq + gumbel_from_uniform(u)).argmax(-1)
    return tokens, lq.gather(-1, tokens[:, None])[:, 0]
