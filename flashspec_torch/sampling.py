"""Sampling with the shared generator in torch: what drafts (and plain decoding) use.

``log_probs`` is SPEC.md's definition (temperature, then top-k, then top-p, then log-softmax,
float32); ``sample`` draws by Gumbel-max on a given stream, bit-compatible with
``flashspec.reference.sample``. No host synchronisation.
"""

from __future__ import annotations

import torch

from flashspec.config import SamplingConfig
from flashspec.random import DRAFT

from . import random as rng


def filter_logits(s: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:  # [..., V] scaled logits
    """top-k (ties at the k-th value kept), then top-p (shortest prefix reaching top_p, ties: lower id first)."""
    v = s.shape[-1]
    neg_inf = torch.tensor(float("-inf"), dtype=s.dtype, device=s.device)
    if 0 < cfg.top_k < v:
        kth = torch.topk(s, cfg.top_k, dim=-1).values[..., -1:]
        s = torch.where(s >= kth, s, neg_inf)
    if cfg.top_p < 1.0:
        probs = torch.softmax(s, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, order, mass_before < cfg.top_p)
        s = torch.where(keep, s, neg_inf)
    return s


def log_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:  # [..., V] -> [..., V] float32
    """log p = log_softmax(filter(z / T)) in float32."""
    return torch.log_softmax(filter_logits(logits.float() / cfg.temperature, cfg), dim=-1)


def counters(seed, offset, batch: int, device) -> tuple[torch.Tensor, ...]:
    """(seed_lo, seed_hi, offset, row) as [B, 1] int64; row = batch index for a shared seed, 0 per-row."""
    per_row = isinstance(seed, torch.Tensor) and seed.ndim == 1
    lo, hi = rng.split_seed(seed, device)
    off = rng.as_counter(offset, device)
    row = torch.zeros(batch, dtype=torch.int64, device=device) if per_row else torch.arange(batch, device=device)
    shape = (batch, 1)
    return lo.expand(batch).reshape(shape), hi.expand(batch).reshape(shape), off.expand(batch).reshape(shape), row.reshape(shape)


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
    lq = log_probs(logits, cfg)
    lo, hi, off, row = counters(seed, offset, b, logits.device)
    g = rng.gumbel(lo, hi, off, row, position, torch.arange(v, device=logits.device)[None], stream)
    tokens = (lq + g).argmax(-1)
    return tokens, lq.gather(-1, tokens[:, None])[:, 0]
