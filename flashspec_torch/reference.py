"""The plain-torch reference verifier (``flashspec_torch.verify(impl="reference")``): SPEC.md step by
step as the NumPy oracle, in torch ops a careful engineer writes without a custom kernel
(log_softmax, gather, Gumbel-max over row n; float32, log space; no ``.item()``), and the pieces
the Triton launcher shares with it (temperature, top-k / top-p, the counters).

Letters as in SPEC.md: z target logits, w draft logits, T temperature, p / q the target / draft
distributions, x drafted tokens, u accept uniforms, n the first rejection, y the residual or bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult

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



def verify_reference(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_tokens: torch.Tensor,  # [B, G]
    draft_logits: torch.Tensor | None,  # [B, G, V]
    draft_logprobs: torch.Tensor | None,  # [B, G]
    cfg: SamplingConfig,
    seed,
    offset,
    draft_lengths: torch.Tensor | None = None,  # [B] int in [0, G]; None: G
) -> VerifyResult[torch.Tensor]:
    """SPEC.md in plain torch ops, step by step as the NumPy oracle (float32, log space). A position past
    L_b, or an id outside [0, V), counts as rejected, and y is drawn from p there."""
    z = target_logits.float()
    b, g1, v = z.shape
    x_ok = (draft_tokens >= 0) & (draft_tokens < v)  # [B, G]
    if draft_lengths is not None:
        x_ok &= torch.arange(g1 - 1, device=z.device)[None] < draft_lengths.to(z.device)[:, None]
    x = torch.where(x_ok, draft_tokens.long(), 0)
    if cfg.greedy:
        return verify_greedy(z, x, x_ok)
    c = Counters.make(seed, offset, b, z.device)
    log_p = log_probs(z, cfg)  # [B, G+1, V]
    log_q = None if draft_logits is None else log_probs(draft_logits.float(), cfg)  # [B, G, V]
    if draft_logprobs is not None:
        log_q_x = draft_logprobs.float()
    elif log_q is not None:
        log_q_x = gather(log_q, x)
    else:
        log_q_x = torch.zeros(x.shape, dtype=torch.float32, device=z.device)  # one-hot q: log q(x) = 0
    positions = torch.arange(g1 - 1, device=z.device)[None]
    log_u = torch.log(c.uniform(positions, 0, rng.ACCEPT))  # [B, G]
    accepted = x_ok & (log_u < gather(log_p[:, :-1], x) - log_q_x)
    n = first_rejection(accepted)
    y = sample_final(log_p, log_q, x, x_ok, n, c)
    return emit(x, n, y)


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:  # [B, G] bool -> [B] int64
    g = accepted.shape[-1]
    return torch.where(accepted.all(-1), g, (~accepted).to(torch.int32).argmax(-1))


def sample_final(log_p, log_q, x, x_ok, n, c: Counters) -> torch.Tensor:  # -> y [B]
    """y ~ normalise(max(0, p_n - q_n)) if n < G, else y ~ p_G; Gumbel-max over row n only."""
    b, g1, v = log_p.shape
    rows = torch.arange(b, device=log_p.device)
    lp_n = log_p[rows, n]  # [B, V]
    g = -torch.log(-torch.log(c.uniform(n[:, None], torch.arange(v, device=n.device)[None], rng.FINAL)))  # [B, V]
    i = n.clamp(max=g1 - 2)  # the draft row n (clamped for the bonus rows, unused there)
    if log_q is None:
        q_n = (torch.arange(v, device=log_p.device)[None] == x[rows, i][:, None]).float()
    else:
        q_n = torch.exp(log_q[rows, i])
    r = torch.clamp_min(torch.exp(lp_n) - q_n, 0.0)
    log_r = torch.log(r)
    use_p = (n == g1 - 1) | ~(r > 0).any(-1) | ~x_ok[rows, i]  # bonus; empty residual; masked id
    key = torch.where(use_p[:, None], lp_n, log_r) + g
    return key.argmax(-1)


def emit(x, n, y) -> VerifyResult[torch.Tensor]:  # x [B, G], n [B], y [B]
    b, g = x.shape
    pos = torch.arange(g + 1, device=x.device)[None]
    padded = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)
    tokens = torch.where(pos < n[:, None], padded, -1).scatter(1, n[:, None], y[:, None].to(padded.dtype))
    return VerifyResult(num_accepted=n.to(torch.int32), tokens=tokens.to(torch.int32))


def verify_greedy(z, x, x_ok) -> VerifyResult[torch.Tensor]:  # z [B, G+1, V], x [B, G]
    """T = 0: accept x_i iff x_i = argmax z_i; y = argmax z_n (torch.argmax: lowest index on ties)."""
    best = z.argmax(-1)  # [B, G+1]
    n = first_rejection(x_ok & (x == best[:, :-1]))
    return emit(x, n, best.gather(1, n[:, None])[:, 0])
