"""Random verify inputs drawn the way a real draft draws them (shared by the torch tests)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flashspec.config import SamplingConfig
from flashspec.reference import sample


@dataclass(frozen=True)
class Inputs:
    z: np.ndarray  # [B, G+1, V] float32
    x: np.ndarray  # [B, G] int64
    w: np.ndarray | None  # [B, G, V] float32, None for a one-hot draft
    lq: np.ndarray | None  # [B, G] float32: log q(x) as the draft computed it (None if one-hot)


def make_inputs(rng: np.random.Generator, b: int, g: int, v: int, cfg: SamplingConfig, *,
                onehot: bool = False, spread: float = 2.0, noise: float = 0.7, seed: int = 11) -> Inputs:
    """z random; w = z + noise (so drafts are often accepted); x sampled from q with the DRAFT stream."""
    z = (rng.normal(size=(b, g + 1, v)) * spread).astype(np.float32)
    if onehot:
        best = z[:, :g].argmax(-1)
        x = np.where(rng.random((b, g)) < 0.6, best, rng.integers(0, v, (b, g)))
        return Inputs(z, x.astype(np.int64), None, None)
    w = (z[:, :g] + rng.normal(size=(b, g, v)) * noise * spread).astype(np.float32)
    xs, lqs = [], []
    for i in range(g):
        x_i, lq_i = sample(w[:, i], cfg, seed, 3, position=i)
        xs.append(x_i)
        lqs.append(lq_i)
    return Inputs(z, np.stack(xs, 1).astype(np.int64), w, np.stack(lqs, 1).astype(np.float32))


def next_token_law(model, ids: list[int], cfg: SamplingConfig) -> np.ndarray:  # [V] float64
    """The target's law of the token after ``ids`` under ``cfg`` (temperature, top-k, top-p): what the
    engine-level distribution tests compare the first emitted token against."""
    import torch

    from flashspec_torch.reference import log_probs

    with torch.inference_mode():
        z = model(torch.tensor([ids]), torch.arange(len(ids))[None], model.new_cache(1, len(ids)), len(ids), logits_last=1)[0, 0]
    return log_probs(z, cfg).exp().double().numpy()
