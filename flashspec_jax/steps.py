"""The pure, jittable steps of speculative decoding over device arrays.

``Steps`` holds what is static (the models' graph definitions, the drafts, the EOS ids, the verify
implementation); every method is a pure function of array pytrees (the weights, the ``State``,
seeds, the step offset). The host backend jits each method once; the whole-generation loop
(``flashspec_jax.whole``) calls the same methods inside one ``lax.while_loop``, so both paths run
the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flashspec.backend import feature_layers
from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult
from flashspec.random import FINAL
from flashspec_jax.verify import on_gpu, resolve_impl, verify_jit

from .drafts import LookupDraft, ModelDraft, Proposal, Seeds, Seqs, as_logits, prompt_forward, sample
from .model import KVCache, Llama

MARGIN = 66  # cache slots past prompt + max_new_tokens: room for a step's G + 1 writes (G <= 64)
BUCKET = 64  # cache lengths are rounded up to this, so few shapes are ever compiled
PREFIX_BUCKET = 16  # prompt prefixes (prefill lengths) are rounded up to this


class State(NamedTuple):
    seqs: Seqs
    cache: KVCache  # the target's
    drafts: tuple  # one state per draft (a model draft's or a head's (cache, valid); () for a lookup)


class StepOut(NamedTuple):
    """A step's small results, what the host reads one step late."""

    num_accepted: jax.Array  # [B] int32
    active: jax.Array  # [B] bool
    done: jax.Array  # [B] bool


def round_up(n: int, k: int = BUCKET) -> int:
    return -(-n // k) * k


def batch_shapes(prompts, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Prompts -> (tokens [B, S] int32 zero padded, lengths [B] int32, prefill prefix length)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    s_max = round_up(longest + max_new_tokens + MARGIN)
    tokens = np.zeros((len(prompts), s_max), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    prefix = min(round_up(longest - 1, PREFIX_BUCKET), s_max) if longest > 1 else 0
    return tokens, lengths, prefix


class Steps:
    def __init__(self, target: Llama, drafts: Sequence[ModelDraft | LookupDraft], eos_ids: Sequence[int], verify_impl: str | None, graphdef: Any):
        self.target_graph = graphdef
        self.drafts = tuple(drafts)
        self.hidden = feature_layers(self.drafts)  # target layers whose residual stream the drafts read
        self.vocab = target.config.vocab_size
        self.eos = np.array(sorted(set(eos_ids)) or [-1], np.int32)
        self.impl = resolve_impl(verify_impl)
        self.interpret = not on_gpu()

    def target(self, weights) -> Llama:
        return nnx.merge(self.target_graph, weights[0])

    # -- a batch

    def prefill(self, weights, tokens, lengths, max_new, prefix: int) -> State:
        """tokens [B, S] int32 (prompts, zero padded), lengths [B]: every prompt token but the last
        into the target's and each draft's cache."""
        b, s = tokens.shape
        target = self.target(weights)
        feats = jnp.zeros((b, s, len(self.hidden) * target.config.hidden_size), target.dtype) if self.hidden else None
        seqs = Seqs(tokens, lengths, lengths, jnp.zeros(b, bool), jnp.asarray(max_new, jnp.int32), feats)
        cache = target.new_cache(b, s)
        if not self.hidden:
            cache = prompt_forward(target, seqs, cache, prefix)
        elif prefix:
            pos = jnp.broadcast_to(jnp.arange(prefix, dtype=jnp.int32)[None], (b, prefix))
            _, seqs, cache = self.run_target(weights, seqs, tokens[:, :prefix], pos, cache, logits=False)
        drafts = tuple(d.start(weights, seqs, prefix) for d in self.drafts)
        return State(seqs, cache, drafts)

    def run_target(self, weights, seqs: Seqs, tokens, pos, cache: KVCache, logits: bool = True):
        """The target over tokens [B, T] at pos [B, T] -> (logits [B, T, V] or None, seqs, cache); with
        feature drafts its streams at ``self.hidden`` go into ``seqs.features`` at pos (positions past
        the buffer are dropped: those rows are finished)."""
        if not self.hidden:
            z, cache = self.target(weights)(tokens, pos, cache, logits=logits)
            return z, seqs, cache
        z, cache, f = self.target(weights)(tokens, pos, cache, logits=logits, hidden=self.hidden)
        rows = jnp.arange(tokens.shape[0])[:, None]
        return z, seqs._replace(features=seqs.features.at[rows, pos].set(f, mode="drop")), cache

    def draft(self, arm: int, weights, state: State, gamma: int, cfg: SamplingConfig, seeds: Seeds, offset):
        d = self.drafts[arm]
        proposal, d_state = d.propose(weights, state.drafts[arm], state.seqs, gamma, cfg, seeds, offset)
        drafts = tuple(d_state if i == arm else s for i, s in enumerate(state.drafts))
        return proposal, state._replace(drafts=drafts)

    def draft_uniform(self, arm: int, weights, state, gamma, cfg, seeds, offset):
        """``draft`` with a deterministic proposal as one-hot logits (every arm the same structure)."""
        proposal, state = self.draft(arm, weights, state, gamma, cfg, seeds, offset)
        return as_logits(proposal, self.vocab), state

    def score(self, weights, state: State, proposal: Proposal):  # -> ([B, G+1, V] float32, State)
        seqs = state.seqs
        g = proposal.tokens.shape[1]
        last = jnp.take_along_axis(seqs.tokens, (seqs.length - 1)[:, None], axis=1)
        pos = (seqs.length - 1)[:, None] + jnp.arange(g + 1)
        tokens = jnp.concatenate([last, proposal.tokens.astype(jnp.int32)], axis=1)
        z, seqs, cache = self.run_target(weights, seqs, tokens, pos, state.cache)
        return z, state._replace(seqs=seqs, cache=cache)

    def verify(self, z, proposal: Proposal, cfg: SamplingConfig, seeds: Seeds, offset) -> VerifyResult:
        d = verify_jit(
            z, proposal.tokens, proposal.logits, proposal.logprobs, seeds.lo, seeds.hi,
            jnp.asarray(offset).astype(jnp.uint32), temperature=float(cfg.temperature), top_k=int(cfg.top_k),
            top_p=float(cfg.top_p), impl=self.impl, interpret=self.interpret,
        )
        return VerifyResult(d.num_accepted, d.tokens)

    def decode_one(self, weights, state: State, cfg: SamplingConfig, seeds: Seeds, offset, rows: int = 1):
        """Plain autoregressive decoding: one target forward, one token (FINAL stream, position 0).
        ``rows`` > 1 (the row-invariant mode): the forward takes the last token and rows - 1 copies
        of it at the next positions, the shape of a scoring pass with G = rows - 1, so that its
        first row's logits are computed (and rounded) exactly as a scoring pass computes a row;
        the copies' cache slots are stale (overwritten before any query can see them)."""
        seqs = state.seqs
        last = jnp.take_along_axis(seqs.tokens, (seqs.length - 1)[:, None], axis=1)
        pos = (seqs.length - 1)[:, None] + jnp.arange(rows)[None]
        z, seqs, cache = self.run_target(weights, seqs, jnp.repeat(last, rows, axis=1), pos, state.cache)
        y, _ = sample(z[:, 0], cfg, seeds, offset, position=0, stream=FINAL)
        tokens = jnp.stack([y, jnp.full_like(y, -1)], axis=1)
        return self.commit(state._replace(seqs=seqs, cache=cache), VerifyResult(jnp.zeros_like(y), tokens))

    def commit(self, state: State, result: VerifyResult) -> tuple[State, StepOut]:
        """Append num_accepted + 1 tokens per live row (cut at EOS and at max_new_tokens)."""
        seqs = state.seqs
        n = result.num_accepted.astype(jnp.int32)
        emitted = result.tokens.astype(jnp.int32)  # [B, G+1]
        j = jnp.arange(emitted.shape[1])
        count = n + 1
        is_eos = (j[None] < count[:, None]) & jnp.isin(emitted, jnp.asarray(self.eos))
        hit_eos = jnp.any(is_eos, axis=-1)
        count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=-1) + 1, count)
        count = jnp.minimum(count, seqs.max_new - (seqs.length - seqs.prompt_len))
        active = ~seqs.done
        count = jnp.where(active, count, 0)
        pos = seqs.length[:, None] + j[None]
        rows = jnp.arange(emitted.shape[0])[:, None]
        old = jnp.take_along_axis(seqs.tokens, jnp.minimum(pos, seqs.tokens.shape[1] - 1), axis=1)
        tokens = seqs.tokens.at[rows, pos].set(jnp.where(j[None] < count[:, None], emitted, old), mode="drop")
        length = seqs.length + count
        done = seqs.done | (active & hit_eos & (count > 0)) | (length - seqs.prompt_len >= seqs.max_new)
        state = state._replace(seqs=seqs._replace(tokens=tokens, length=length, done=done))
        return state, StepOut(n, active, done)
