"""Random verify inputs for the JAX tests: drafts sampled from q with the shared DRAFT stream."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashspec.config import SamplingConfig
from flashspec.reference import sample


@dataclass(frozen=True)
class Inputs:
    target_logits: np.ndarray  # [B, G+1, V]
    draft_tokens: np.ndarray  # [B, G]
    draft_logits: np.ndarray | None  # [B, G, V]
    draft_logprobs: np.ndarray | None  # [B, G]

    @property
    def args(self) -> tuple:
        return self.target_logits, self.draft_tokens, self.draft_logits, self.draft_logprobs


def make_inputs(
    rs: np.random.Generator,
    batch: int,
    gamma: int,
    vocab: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    draft: str = "logits",  # "logits" | "onehot" | "logprobs" (logits and the draft's log q(x))
    spread: float = 2.0,
    noise: float = 0.7,
) -> Inputs:
    """z ~ N(0, spread), w = z + N(0, noise) (a draft close to the target, so that some tokens are
    accepted and some rejected); x sampled from q as a real draft would."""
    z = (rs.standard_normal((batch, gamma + 1, vocab)) * spread).astype(np.float32)
    w = (z[:, :gamma] + rs.standard_normal((batch, gamma, vocab)) * noise).astype(np.float32)
    cfg = SamplingConfig(temperature, top_k, top_p)
    if draft == "onehot" or cfg.greedy:
        best = z[:, :gamma].argmax(-1)
        x = np.where(rs.random((batch, gamma)) < 0.6, best, rs.integers(0, vocab, (batch, gamma)))
        return Inputs(z, x.astype(np.int32), w if draft != "onehot" else None, None)
    seed = int(rs.integers(0, 2**31))
    xs, lqs = zip(*(sample(w[:, i], cfg, seed=seed, offset=0, position=i) for i in range(gamma)))
    x, lq = np.stack(xs, 1).astype(np.int32), np.stack(lqs, 1)
    return Inputs(z, x, w, lq if draft == "logprobs" else None)
