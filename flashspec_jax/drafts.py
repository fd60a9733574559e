"""Drafts for the JAX backend, as pure functions of device arrays (jittable, vmappable).

* ``ModelDraft``: any Llama-family model sharing the target's tokenizer: a small model, or the
  target itself (``self``) or with layers skipped (``layerskip:...``), over the same weights. It
  keeps its own KV cache and catches up lazily: when it was not used for some steps (the bandit
  chose another arm), it first feeds every token it has not seen, in fixed chunks of G + 2 tokens
  inside a ``lax.while_loop`` (fixed shapes, however long the lag), so arms can switch every step.
* ``LookupDraft``: prompt-lookup (n-gram) drafting on the device: the latest earlier occurrence of
  the sequence's last n tokens (n = max_n .. 1) and what followed it. Deterministic: q is one-hot.

Both mirror ``flashspec_torch.drafts`` step for step (same tokens for the same inputs and seed).
A proposal can be made "uniform" (``as_logits``) so that every arm of a ``lax.switch`` returns the
same structure: a one-hot draft becomes logits 0 at x and -inf elsewhere, whose log-softmax is
exactly the one-hot log q, so verify decides exactly as with ``draft_logits=None``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from flashspec.config import SamplingConfig
from flashspec.random import DRAFT

from . import random as rng
from .kernels.verify import log_probs
from .model import KVCache, Llama


class Proposal(NamedTuple):
    tokens: jax.Array  # [B, G] int32
    logits: jax.Array | None  # [B, G, V] float32 raw draft logits; None: one-hot q
    logprobs: jax.Array | None  # [B, G] float32 log q(x) as sampled


class Seqs(NamedTuple):
    """The batch's token history on the device (shared by the backend and the drafts)."""

    tokens: jax.Array  # [B, S] int32: prompt then generated tokens
    length: jax.Array  # [B] int32: tokens held per row; the last one is not yet in any cache
    prompt_len: jax.Array  # [B] int32
    done: jax.Array  # [B] bool
    max_new: jax.Array  # [] int32
    features: jax.Array | None = None  # [B, S, k C]: the target's streams a FeatureDraft reads (None: no such draft)


class Seeds(NamedTuple):
    """Per-request seeds as two uint32 halves (the shared generator's 64-bit seed)."""

    lo: jax.Array  # [B] uint32 (per-request seeds), or [] (one seed; the batch row is a coordinate)
    hi: jax.Array  # same shape


def make_seeds(seeds) -> Seeds:  # an int or [B] integer array (uint64 allowed)
    lo, hi = rng.split_counter(np.asarray(seeds, dtype=np.uint64))
    return Seeds(jnp.asarray(lo), jnp.asarray(hi))


def sample(
    w: jax.Array,  # [B, V] raw logits
    cfg: SamplingConfig,
    seeds: Seeds,
    offset: jax.Array,  # [] int, or [B] (each row's own step counter)
    position: int = 0,
    stream: int = DRAFT,
) -> tuple[jax.Array, jax.Array]:  # tokens [B] int32, log q(token) [B] float32
    """Gumbel-max on verify's own log_probs (per-row seeds: row coordinate 0), as the torch ``sample``."""
    b, v = w.shape
    if cfg.greedy:
        return jnp.argmax(w, axis=-1).astype(jnp.int32), jnp.zeros(b, jnp.float32)
    lq = log_probs(w.astype(jnp.float32), cfg.temperature, cfg.top_k, cfg.top_p)
    x = jnp.argmax(lq + gumbel_noise(seeds, offset, b, position, jnp.arange(v), stream), axis=-1).astype(jnp.int32)
    return x, jnp.take_along_axis(lq, x[:, None], axis=-1)[:, 0]


def gumbel_noise(seeds: Seeds, offset, b: int, position, vocab: jax.Array, stream: int = DRAFT) -> jax.Array:
    """The generator's Gumbel noise of ``b`` rows at positions ``position`` (an int or an int array
    [...]) and token ids ``vocab`` [V'] -> [B, ..., V'] float32. Per-request seeds use row coordinate
    0, a shared seed the batch row (as the torch ``Counters``)."""
    pos = jnp.asarray(position, jnp.uint32)[..., None]  # [..., 1]
    col = lambda a: jnp.reshape(a, (b,) + (1,) * pos.ndim)  # noqa: E731
    lo, hi = (col(jnp.broadcast_to(a, (b,))) for a in seeds)
    row = col(jnp.zeros(b, jnp.uint32) if jnp.ndim(seeds.lo) == 1 else jnp.arange(b, dtype=jnp.uint32))
    off = col(jnp.broadcast_to(rng.as_u32(offset), (b,)))  # one offset, or each row's own (slots)
    u = rng.uniform(lo, hi, off, row, pos[None], vocab.astype(jnp.uint32), stream)
    return rng.gumbel_from_uniform(u)


def as_logits(p: Proposal, vocab: int) -> Proposal:
    """A deterministic proposal as one-hot logits (0 at x, -inf elsewhere) and log q(x) = 0."""
    if p.logits is not None:
        return p
    onehot = jnp.arange(vocab)[None, None] == p.tokens[..., None]
    return Proposal(p.tokens, jnp.where(onehot, 0.0, -jnp.inf).astype(jnp.float32), jnp.zeros(p.tokens.shape, jnp.float32))


def prompt_forward(model: Llama, seqs: Seqs, cache: KVCache, prefix: int, skip: frozenset[int] = frozenset()) -> KVCache:
    """K/V of the first ``prefix`` tokens of every row (every prompt token but the last is inside)."""
    if prefix == 0:
        return cache
    b = seqs.tokens.shape[0]
    pos = jnp.broadcast_to(jnp.arange(prefix, dtype=jnp.int32)[None], (b, prefix))
    _, cache = model(seqs.tokens[:, :prefix], pos, cache, skip=skip, logits=False)
    return cache


class LookupDraft:
    """Prompt lookup: match the last n tokens (n = max_n .. 1) against the history."""

    deterministic = True

    def __init__(self, name: str = "ngram", max_n: int = 3):
        if max_n < 1:
            raise ValueError(f"{max_n=} must be >= 1")
        self.name, self.max_n = name, max_n

    def start(self, weights, seqs: Seqs, prefix: int) -> tuple:
        return ()

    def propose(self, weights, state, seqs: Seqs, gamma: int, cfg: SamplingConfig, seeds: Seeds, offset):
        seq, length = seqs.tokens, seqs.length
        b, s = seq.shape
        best = jnp.full((b,), -1, jnp.int32)  # continuation start, -1: none yet
        for n in range(self.max_n, 0, -1):
            if n >= s:
                continue
            tail = jnp.take_along_axis(seq, jnp.maximum(length[:, None] - n + jnp.arange(n), 0), axis=1)  # [B, n]
            starts = jnp.arange(s - n + 1)
            windows = seq[:, starts[:, None] + jnp.arange(n)[None]]  # [B, S-n+1, n]
            hit = jnp.all(windows == tail[:, None], -1) & (starts[None] < (length - n)[:, None])
            latest = jnp.max(jnp.where(hit, starts[None], -1), axis=-1)  # [B]
            found = (latest >= 0) & (length > n)
            best = jnp.where((best < 0) & found, latest + n, best)
        start = jnp.where(best >= 0, best, length - 1)  # no match: repeat the last token
        pos = jnp.minimum(start[:, None] + jnp.arange(gamma), (length - 1)[:, None])
        return Proposal(jnp.take_along_axis(seq, pos, axis=1), None, None), state


class ModelDraft:
    """A draft model (index ``model_index`` into the backend's weights), optionally skipping layers."""

    deterministic = False

    def __init__(self, name: str, model: Llama, model_index: int, graphdef: Any, skip: frozenset[int] = frozenset()):
        if skip and max(skip) >= model.config.num_layers:
            raise ValueError(f"skip={sorted(skip)} names layers beyond the model's {model.config.num_layers}")
        self.name, self.config, self.model_index, self.graphdef = name, model.config, model_index, graphdef
        self.skip = frozenset(skip)

    def model(self, weights) -> Llama:
        return nnx.merge(self.graphdef, weights[self.model_index])

    def start(self, weights, seqs: Seqs, prefix: int) -> tuple[KVCache, jax.Array]:
        """(cache, valid): the prompt fed but its last token (valid = length - 1)."""
        model = self.model(weights)
        cache = model.new_cache(*seqs.tokens.shape)
        cache = prompt_forward(model, seqs, cache, prefix, self.skip)
        return cache, jnp.maximum(seqs.length - 1, 0)

    def propose(self, weights, state, seqs: Seqs, gamma: int, cfg: SamplingConfig, seeds: Seeds, offset):
        model, (cache, valid) = self.model(weights), state
        length, s_max, chunk = seqs.length, seqs.tokens.shape[1], gamma + 2
        steps = jnp.arange(chunk)

        def feed(cache, start, select=None):
            pos = jnp.minimum(start[:, None] + steps, s_max - 1)  # [B, C]
            tokens = jnp.take_along_axis(seqs.tokens, pos, axis=1)
            return model(tokens, pos, cache, select=select, skip=self.skip, logits=select is not None)

        def lagging(start):  # rows whose last token lies beyond this chunk
            return length - 1 - start >= chunk

        def catch_up(carry):
            cache, start = carry
            _, cache = feed(cache, start)
            return cache, jnp.where(lagging(start), start + chunk, start)

        start = jnp.minimum(valid, length - 1)  # [B] first position this draft must (re)feed
        cache, start = lax.while_loop(lambda c: jnp.any(lagging(c[1])), catch_up, (cache, start))
        w, cache = feed(cache, start, select=jnp.minimum(length - 1 - start, chunk - 1))
        w = w[:, 0]
        xs, ws, lqs = [], [], []
        for i in range(gamma):
            x_i, lq_i = sample(w, cfg, seeds, offset, position=i)
            xs.append(x_i)
            ws.append(w)
            lqs.append(lq_i)
            if i + 1 < gamma:
                w, cache = model(x_i[:, None], (length + i)[:, None], cache, skip=self.skip)
                w = w[:, 0]
        proposal = Proposal(jnp.stack(xs, 1), jnp.stack(ws, 1), jnp.stack(lqs, 1))
        return proposal, (cache, length + gamma - 1)
