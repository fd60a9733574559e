"""The sampling math in plain torch that verify's reference (``flashspec_torch.verify.verify_reference``),
the Triton launcher and ``flashspec_torch.sampling`` share: temperature, top-k / top-p, log-probabilities
in the oracle's formulas (float32, log space), and the counter RNG's draws.

Letters as in SPEC.md: z target logits, w draft logits, T temperature, p / q the target / draft
distributions, x drafted tokens, u accept uniforms, n the first rejection, y the residual or bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashspec.config import SamplingConfig

from . import random as rng


def scale(z: torch.Tensor, temperature: float) -> torch.Tensor:  # [..., V] float32
    """z / T as a true division (torch turns ``z / python_float`` into z * (1/T) on CUDA)."""
    return z / z.new_full((1,), temperature)


def filter_top_k(s: torch.Tensor, k: int) -> torch.Tensor:  # [..., V] scaled logits
    """Keep every token whose scaled logit is at least the k-th largest (ties kept)."""
    if k <= 0 or k >= s.shape[-1]:
        return s
    kth = torch.topk(s, k, dim=-1).values[..., -1:]
    return torch.where(s >= kth, s, float("-inf"))


def softmax(s: torch.Tensor) -> torch.Tensor:  # [..., V], the oracle's formula
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def sorted_nucleus(s: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:  # [..., V] each
    """(order, keep_sorted): ids by descending probability (ties: lower id first) and the kept prefix."""
    probs = softmax(s)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # exclusive, as the oracle
    return order, mass_before < top_p


def filter_top_p(s: torch.Tensor, top_p: float) -> torch.Tensor:  # [..., V] scaled logits
    """Keep the shortest prefix (by probability, ties: lower id first) whose mass reaches top_p."""
    if top_p >= 1.0:
        return s
    order, keep_sorted = sorted_nucleus(s, top_p)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(keep, s, float("-inf"))


def log_softmax(s: torch.Tensor) -> torch.Tensor:  # [..., V], the oracle's formula
    m = s.amax(-1, keepdim=True)
    return s - (m + torch.log(torch.exp(s - m).sum(-1, keepdim=True)))


def log_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:  # [..., V] float32
    """log p = log_softmax(filter(z / T))."""
    s = scale(logits, cfg.temperature)
    return log_softmax(filter_top_p(filter_top_k(s, cfg.top_k), cfg.top_p))


def gather(a: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # [B, G, V], [B, G] -> [B, G]
    return torch.gather(a, -1, idx[..., None])[..., 0]


@dataclass(frozen=True)
class Counters:
    """Per-row coordinates of the shared generator, as int64 tensors of 32-bit values."""

    seed_lo: torch.Tensor  # [B]
    seed_hi: torch.Tensor  # [B]
    offset: torch.Tensor  # [B]
    row: torch.Tensor  # [B]: the batch row for a shared seed, 0 for per-row seeds

    @classmethod
    def make(cls, seed, offset, batch: int, device: torch.device) -> "Counters":
        per_row = isinstance(seed, torch.Tensor) and seed.ndim == 1
        lo, hi = rng.split_seed(seed, device)
        off = rng.as_counter(offset, device)
        row = torch.zeros(batch, dtype=torch.int64, device=device) if per_row else torch.arange(batch, device=device)
        return cls(*(t.expand(batch) for t in (lo, hi, off)), row)

    def keys(self, position, stream: int) -> torch.Tensor:  # position broadcast with [B, 1]
        c = (self.seed_lo[:, None], self.seed_hi[:, None], self.offset[:, None], self.row[:, None])
        return rng.key(*c, position, stream)

    def bits(self, position, vocab, stream: int) -> torch.Tensor:  # position, vocab broadcast with [B, 1]
        return rng.bits_from_key(self.keys(position, stream), vocab)

    def uniform(self, position, vocab, stream: int) -> torch.Tensor:  # position, vocab broadcast with [B, 1]
        return rng.to_uniform(self.bits(position, vocab, stream))
