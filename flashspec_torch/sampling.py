"""Sampling with the shared generator in torch: what drafts (and plain decoding) use.

The distribution is ``verify``'s own ``log_probs`` (temperature, top-k, top-p, log-softmax in
float32, the oracle's formulas), so q is exactly what verify recomputes; the draw is Gumbel-max on
a given stream, bit-compatible with ``flashspec.reference.sample``. No host synchronisation.
"""

from __future__ import annotations

import torch

from flashspec.config import SamplingConfig
from flashspec.random import DRAFT

from .random import bits_from_key, gumbel_from_uniform, to_uniform
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
    u = Counters.make(seed, offset, b, logits.device).uniform(position, torch.arange(v, device=logits.device)[None], stream)
    return sample_gumbel(logits, cfg, gumbel_from_uniform(u))


def draft_gumbel(seed, offset, batch: int, gamma: int, vocab: torch.Tensor) -> torch.Tensor:  # -> [B, G, V'] float32
    """The DRAFT stream's Gumbel noise of draft positions 0 .. gamma - 1 at the token ids ``vocab``
    ([V'] int64), in one pass: row i equals what ``sample(..., position=i)`` draws for those ids."""
    c = Counters.make(seed, offset, batch, vocab.device)
    keys = c.keys(torch.arange(gamma, device=vocab.device)[None], DRAFT)  # [B, G]
    return gumbel_from_uniform(to_uniform(bits_from_key(keys[..., None], vocab[None, None])))


def sample_gumbel(
    logits: torch.Tensor,  # [B, V'] raw logits
    cfg: SamplingConfig,  # not greedy
    gumbel: torch.Tensor,  # [B, V'] the noise of this draft position (``draft_gumbel``)
) -> tuple[torch.Tensor, torch.Tensor]:  # column [B] int64, log q(column) [B] float32
    """Gumbel-max over ``log_probs(logits)`` with the given noise."""
    lq = log_probs(logits.float(), cfg)
    tokens = (lq + gumbel).argmax(-1)
    return tokens, lq.gather(-1, tokens[:, None])[:, 0]
