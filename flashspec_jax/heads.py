"""The EAGLE-style draft head in JAX: the torch head's (``flashspec_torch.heads``) computation, read
from the same safetensors file, as pure jittable functions of the backend's weights.

At head position p the input is the target's residual stream at position p - 1 after the layers
``feature_layers`` (concatenated, fused to the width C by ``fc_feat``) and the target's embedding of
token p (no embedding scale); ``fc_in`` maps the two (each RMS-normed) to C, one decoder layer (the
model's ``block``, with the head's own one-layer KV cache) gives the head's state s_p, and the final
norm and the target's LM head rows ``token_ids`` give the logits of token p + 1 over the head's
vocabulary. Drafting further, the head feeds its own s_p where the target's fused features were.

q is what the draft samples from: the logits of tokens outside ``token_ids`` are ``OUTSIDE`` (q = 0).
Drafting samples over the V_d columns with the DRAFT stream's Gumbel noise at the real token ids for
all G positions in one pass: the same token and log q as sampling the full row; the full row
(``full_logits``) is built once per step for the verifier.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from flashspec.config import LlamaConfig, SamplingConfig
from flashspec.head_file import OUTSIDE, check_fingerprint, draft_head_file, kept_ids, read_metadata

from .drafts import Proposal, Seeds, Seqs, gumbel_noise
from .kernels.verify import log_probs
from .model import KVCache, Layers, Llama, block, layer_shapes, linear, new_cache, rms_norm, rope_table

# the torch head's file names of the decoder layer's weights -> ``Layers`` fields
LAYER_NAMES = {"qkv": "qkv.weight", "o": "o.weight", "gate_up": "gate_up.weight", "down": "down.weight",
               "qkv_bias": "qkv.bias", "o_bias": "o.bias", "gate_up_bias": "gate_up.bias", "down_bias": "down.bias"}


class HeadParams(NamedTuple):
    """The head's weights (an entry of the backend's weights); ``lm_rows`` is lent by the target."""

    fc_feat: jax.Array  # [C, k C]
    fc_in: jax.Array  # [C, 2 C]
    embed_norm: jax.Array  # [C]
    feat_norm: jax.Array  # [C]
    layer: Layers  # each field [1, ...]: one decoder layer
    norm: jax.Array  # [C]
    token_ids: jax.Array  # [V_d] int32, sorted
    lm_rows: jax.Array  # [V_d, C]: the target's LM head at token_ids


def head_config(target: LlamaConfig) -> LlamaConfig:
    return replace(target, num_layers=1)


def run(p: HeadParams, c: LlamaConfig, embed, tokens, feats, positions, cache: KVCache):
    """embed [V, C] the target's; tokens [B, T] int; feats [B, T, C] (fused target features or the
    head's own states at the previous positions); positions [B, T]. K/V go into ``cache`` (one
    layer) at positions. Returns (the head's states [B, T, C], cache)."""
    e = jnp.take(embed, tokens, axis=0)
    x = jnp.concatenate([rms_norm(e, p.embed_norm, c.rms_norm_eps), rms_norm(feats, p.feat_norm, c.rms_norm_eps)], -1)
    x = linear(x, p.fc_in)
    cos, sin = rope_table(c, positions, x.dtype)
    mask = jnp.arange(cache.max_len)[None, None, :] <= positions[:, :, None]  # [B, T, S]
    return block(c, jax.tree.map(lambda a: a[0], p.layer), x, cos, sin, cache, 0, positions, mask)


def logits(p: HeadParams, c: LlamaConfig, s: jax.Array) -> jax.Array:  # [..., C] -> [..., V_d] float32
    return linear(rms_norm(s, p.norm, c.rms_norm_eps), p.lm_rows).astype(jnp.float32)


def full_logits(p: HeadParams, vocab: int, w: jax.Array) -> jax.Array:  # [..., V_d] -> [..., V]: OUTSIDE elsewhere
    if p.token_ids.shape[0] == vocab:
        return w
    return jnp.full((*w.shape[:-1], vocab), OUTSIDE, w.dtype).at[..., p.token_ids].set(w)


class HeadDraft:
    """The head as a draft of the JAX backend (a ``flashspec.backend.FeatureDraft``): the backend keeps
    the target's features in ``Seqs.features``; the head keeps its own KV cache and ``valid`` (positions
    below hold K/V made from the target's features) and catches up lazily in chunks of G + 2 inside a
    ``lax.while_loop``, re-feeding every position from the first one it drafted (those K/V were made
    from its own states)."""

    deterministic = False

    def __init__(self, name: str, target: Llama, feature_layers: tuple[int, ...], index: int, target_graph: Any):
        self.name, self.config, self.feature_layers = name, head_config(target.config), tuple(feature_layers)
        self.vocab, self.index, self.target_graph = target.config.vocab_size, index, target_graph

    def parts(self, weights) -> tuple[HeadParams, jax.Array]:  # (the head's weights, the target's embedding [V, C])
        return weights[self.index], nnx.merge(self.target_graph, weights[0]).embed.get_value()

    def feed(self, p, embed, seqs: Seqs, cache: KVCache, start, chunk: int):
        """Head positions start .. start + chunk - 1 ([B] start) from the tokens and the target's features."""
        pos = jnp.minimum(start[:, None] + jnp.arange(chunk), seqs.tokens.shape[1] - 1)  # [B, T]
        prev = jnp.maximum(pos - 1, 0)
        feats = jnp.take_along_axis(seqs.features, prev[..., None], axis=1)  # [B, T, k C]
        fused = linear(feats, p.fc_feat) * (pos > 0)[..., None].astype(feats.dtype)  # position 0 has no previous feature
        return run(p, self.config, embed, jnp.take_along_axis(seqs.tokens, pos, axis=1), fused, pos, cache)

    def start(self, weights, seqs: Seqs, prefix: int) -> tuple[KVCache, jax.Array]:
        """(cache, valid): positions < prefix fed from the prompt (the target's prefill made their features)."""
        p, embed = self.parts(weights)
        b, s = seqs.tokens.shape
        cache = new_cache(self.config, b, s, embed.dtype)
        if prefix:
            _, cache = self.feed(p, embed, seqs, cache, jnp.zeros(b, jnp.int32), prefix)
        return cache, jnp.minimum(seqs.length, prefix)

    def propose(self, weights, state, seqs: Seqs, gamma: int, cfg: SamplingConfig, seeds: Seeds, offset):
        p, embed = self.parts(weights)
        (cache, valid), c = state, self.config
        length, s_max, chunk = seqs.length, seqs.tokens.shape[1], gamma + 2

        def lagging(start):  # rows whose last token lies beyond this chunk
            return length - 1 - start >= chunk

        def catch_up(carry):
            cache, start = carry
            _, cache = self.feed(p, embed, seqs, cache, start, chunk)
            return cache, jnp.where(lagging(start), start + chunk, start)

        start = jnp.minimum(valid, length - 1)  # [B] first position the head must (re)feed
        cache, start = lax.while_loop(lambda a: jnp.any(lagging(a[1])), catch_up, (cache, start))
        s, cache = self.feed(p, embed, seqs, cache, start, chunk)
        s = jnp.take_along_axis(s, jnp.minimum(length - 1 - start, chunk - 1)[:, None, None], axis=1)[:, 0]  # [B, C]
        w, ids = logits(p, c, s), p.token_ids
        noise = None if cfg.greedy else gumbel_noise(seeds, offset, length.shape[0], jnp.arange(gamma), ids)  # [B, G, V_d]
        xs, ws, lqs = [], [], []
        for i in range(gamma):
            if noise is None:
                j, lq_i = jnp.argmax(w, axis=-1), jnp.zeros(w.shape[0], jnp.float32)
            else:
                lq = log_probs(w, cfg.temperature, cfg.top_k, cfg.top_p)
                j = jnp.argmax(lq + noise[:, i], axis=-1)
                lq_i = jnp.take_along_axis(lq, j[:, None], axis=-1)[:, 0]
            x_i = ids[j]
            xs.append(x_i)
            ws.append(w)
            lqs.append(lq_i)
            if i + 1 < gamma:
                pos = jnp.minimum(length + i, s_max - 1)[:, None]
                s, cache = run(p, c, embed, x_i[:, None], s[:, None], pos, cache)
                s = s[:, 0]
                w = logits(p, c, s)
        proposal = Proposal(jnp.stack(xs, 1).astype(jnp.int32), full_logits(p, self.vocab, jnp.stack(ws, 1)),
                            jnp.stack(lqs, 1))
        return proposal, (cache, length)


# -- files


def head_params(state: dict, target: Llama, feature_layers: tuple[int, ...]) -> HeadParams:
    """The torch head's tensors (its state dict's names) -> HeadParams in the target's dtype, checked."""
    c, dtype = head_config(target.config), target.dtype
    width = c.hidden_size

    def get(name: str, shape: tuple[int, ...]) -> jax.Array:
        if name not in state:
            raise ValueError(f"the draft head file lacks {name!r}: it was not written by `flashspec train-head`")
        a = state[name]
        if tuple(a.shape) != shape:
            raise ValueError(f"the draft head's {name!r} has shape {tuple(a.shape)}, this target needs {shape}")
        return jnp.asarray(a, dtype)

    ids = np.asarray(state.get("token_ids", np.zeros(0)), np.int64)
    if ids.ndim != 1 or not len(ids) or ids.min() < 0 or ids.max() >= c.vocab_size or len(np.unique(ids)) != len(ids):
        raise ValueError(f"the draft head's token_ids must be distinct token ids in [0, {c.vocab_size})")
    ids = np.sort(ids)
    layer = Layers(**{f: get(f"layer.{LAYER_NAMES.get(f, f)}", shape)[None] for f, shape in layer_shapes(c).items()})
    lm = target.embed.get_value() if target.lm_head is None else target.lm_head.get_value()
    return HeadParams(get("fc_feat.weight", (width, len(feature_layers) * width)), get("fc_in.weight", (width, 2 * width)),
                      get("embed_norm", (width,)), get("feat_norm", (width,)), layer, get("norm", (width,)),
                      jnp.asarray(ids, jnp.int32), lm if len(ids) == c.vocab_size else lm[jnp.asarray(ids)])


def load_head(path, target: Llama, top: int = 0) -> tuple[HeadParams, tuple[int, ...], dict]:
    """A head file (or a directory holding ``head.safetensors``) for ``target``: (params, feature_layers,
    metadata); ``top=N`` (0: all): over its N most frequent tokens (``head_file.kept_ids``)."""
    import json

    from safetensors.flax import load_file

    path, meta = read_metadata(path, target.config)
    layers = tuple(int(i) for i in json.loads(meta["feature_layers"]))
    bad = [i for i in layers if not 0 <= i < target.config.num_layers]
    if not layers or bad or len(set(layers)) != len(layers):
        raise ValueError(f"the draft head's feature_layers={layers!r} must be distinct target layers in "
                         f"[0, {target.config.num_layers})")
    state = load_file(str(path))
    if "token_ids" in state:
        state["token_ids"] = kept_ids(state["token_ids"], state.get("token_counts"), top, path)
    return head_params(state, target, layers), layers, meta


def fingerprint(target: Llama) -> float:
    """mean |embedding| (as ``flashspec_torch.heads.fingerprint``): tells two targets of the same shape apart."""
    return float(np.abs(np.asarray(target.embed.get_value(), np.float64)).mean())


def load_draft_head(backend, name: str, directory: str, top: int = 0) -> HeadDraft:
    """``head`` (the shipped head of the embedded model) or ``head:DIR`` as a draft of ``backend``'s
    target; ``top`` (``head@N``): over its N most frequent tokens only (0: all)."""
    target = backend.draft_models[0]
    path = draft_head_file(directory)
    params, layers, meta = load_head(path, target, top)
    check_fingerprint(name, path, meta, fingerprint(target))
    return backend.head_draft(name, params, layers)
