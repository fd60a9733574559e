"""A Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, ...) in Flax NNX with a static KV cache.

The same semantics as ``flashspec_torch.model``: every row has its own positions; a forward writes
K/V at ``positions`` and lets each query attend to cache slots ``s <= its position``, so stale
entries past a row's length are never attended before they are overwritten and rolling back
rejected tokens is free. Shapes are fixed: attention runs over the whole static cache with a
mask, so nothing recompiles as sequences grow.

The layers' weights are stacked along a leading layer axis ([L, ...]) and the forward is one
``lax.scan`` over the indices of the layers it runs (one compiled layer, whatever the depth; the
KV cache is carried and written in place at each layer's index). A layer-skipping draft passes
the skipped layers as a static set, so they cost nothing and no data-dependent branch (which XLA
on a GPU evaluates on the host) is needed. Weights use the
fused layout of ``flashspec.weights`` (``qkv`` and ``gate_up`` concatenated, ``[out, in]``), so the
one converted cache on disk loads into either backend.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from flashspec.config import LlamaConfig
from flashspec.contract import check_vocab

__all__ = ["LlamaConfig", "KVCache", "Llama", "rope_frequencies", "new_cache"]


class KVCache(NamedTuple):
    """Preallocated K and V: [L, B, H_kv, S, D] each."""

    k: jax.Array
    v: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


def new_cache(config: LlamaConfig, batch: int, max_len: int, dtype) -> KVCache:
    shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def rope_frequencies(config: LlamaConfig) -> np.ndarray:  # [D/2] float32
    """Inverse frequencies, llama3 scaling included (float64 maths as in the torch backend)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if config.rope_scaling:
        s = dict(config.rope_scaling)
        original = s["original_max_position_embeddings"]
        low_wavelen, high_wavelen = original / s["low_freq_factor"], original / s["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
        scaled = np.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv_freq = np.where(mid, (1 - smooth) * scaled / s["factor"] + smooth * scaled, scaled)
    return inv_freq.astype(np.float32)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:  # [..., C], [C]
    xf = x.astype(jnp.float32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype) * weight


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, H, D]; cos, sin [B, T, 1, D]; the rotate-half convention of HF Llama."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def linear(x: jax.Array, w: jax.Array) -> jax.Array:  # [..., in], [out, in] -> [..., out]
    return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))


def write_cache(cache: jax.Array, new: jax.Array, layer, positions: jax.Array) -> jax.Array:
    """cache [L, B, H, S, D] <- new [B, T, H, D] at layer ``layer``, slots positions [B, T] (per row)."""
    rows = jnp.arange(cache.shape[1])[:, None]
    return cache.at[layer, rows, :, positions].set(new.astype(cache.dtype), mode="drop")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """q [B, T, H, D]; k, v [B, H_kv, S, D]; mask [B, T, S] -> [B, T, H, D] (GQA, float32 softmax)."""
    b, t, h, d = q.shape
    h_kv = k.shape[1]
    q = q.reshape(b, t, h_kv, h // h_kv, d)
    s = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) / np.float32(math.sqrt(d))
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", p, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, d).astype(q.dtype)


class Layers(NamedTuple):
    """One block's weights; in ``Llama`` each field is stacked over layers ([L, ...])."""

    qkv: jax.Array  # [(H + 2 H_kv) D, C]
    o: jax.Array  # [C, H D]
    gate_up: jax.Array  # [2 F, C]
    down: jax.Array  # [C, F]
    attn_norm: jax.Array  # [C]
    mlp_norm: jax.Array  # [C]


def block(c: LlamaConfig, w: Layers, h, cos, sin, cache: KVCache, layer, positions, mask):
    """h [B, T, C]; cache [L, B, H_kv, S, D] (layer ``layer`` is read and written); positions [B, T]; mask [B, T, S]."""
    b, t, _ = h.shape
    qkv = linear(rms_norm(h, w.attn_norm, c.rms_norm_eps), w.qkv)
    nq, nk = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    q = apply_rope(qkv[..., :nq].reshape(b, t, c.num_heads, c.head_dim), cos, sin)
    k = apply_rope(qkv[..., nq : nq + nk].reshape(b, t, c.num_kv_heads, c.head_dim), cos, sin)
    v = qkv[..., nq + nk :].reshape(b, t, c.num_kv_heads, c.head_dim)
    cache = KVCache(write_cache(cache.k, k, layer, positions), write_cache(cache.v, v, layer, positions))
    attn = attention(q, cache.k[layer], cache.v[layer], mask)
    h = h + linear(attn.reshape(b, t, nq), w.o)
    gate, up = jnp.split(linear(rms_norm(h, w.mlp_norm, c.rms_norm_eps), w.gate_up), 2, axis=-1)
    return h + linear(jax.nn.silu(gate) * up, w.down), cache


class Llama(nnx.Module):
    """Embedding, a stack of blocks (weights [L, ...]), final norm, LM head (tied or not)."""

    def __init__(self, config: LlamaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None, std: float = 0.02):
        check_vocab(config.vocab_size)  # the Pallas verify indexes the vocabulary in int32
        self.config = config
        c, L = config, config.num_layers
        rngs = rngs or nnx.Rngs(0)
        nq = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim

        def normal(*shape):
            return nnx.Param((std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype))

        def ones(*shape):
            return nnx.Param(jnp.ones(shape, dtype))

        self.embed = normal(c.vocab_size, c.hidden_size)
        self.qkv = normal(L, nq, c.hidden_size)
        self.o = normal(L, c.hidden_size, c.num_heads * c.head_dim)
        self.gate_up = normal(L, 2 * c.intermediate_size, c.hidden_size)
        self.down = normal(L, c.hidden_size, c.intermediate_size)
        self.attn_norm = ones(L, c.hidden_size)
        self.mlp_norm = ones(L, c.hidden_size)
        self.norm = ones(c.hidden_size)
        self.lm_head = None if c.tie_word_embeddings else normal(c.vocab_size, c.hidden_size)

    @property
    def dtype(self):
        return self.embed.value.dtype

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return new_cache(self.config, batch, max_len, self.dtype)

    def layers(self) -> Layers:
        return Layers(*(getattr(self, n).value for n in Layers._fields))

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int
        positions: jax.Array,  # [B, T] int: each token's position in its row
        cache: KVCache,
        *,
        select: jax.Array | None = None,  # [B]: logits at this token index of each row only
        skip: frozenset[int] | tuple[int, ...] = (),  # layers to leave out (static: a layer-skipping draft)
        logits: bool = True,
    ) -> tuple[jax.Array | None, KVCache]:  # ([B, T or 1, V] float32 or None, the updated cache)
        c = self.config
        h = jnp.take(self.embed.value, tokens, axis=0)
        angles = positions[..., None].astype(jnp.float32) * jnp.asarray(rope_frequencies(c))  # [B, T, D/2]
        cos = jnp.concatenate([jnp.cos(angles)] * 2, -1)[:, :, None].astype(h.dtype)
        sin = jnp.concatenate([jnp.sin(angles)] * 2, -1)[:, :, None].astype(h.dtype)
        mask = jnp.arange(cache.max_len)[None, None, :] <= positions[:, :, None]  # [B, T, S]
        kept = np.array([i for i in range(c.num_layers) if i not in set(skip)], np.int32)
        layers = self.layers()

        def layer(carry, i):
            h, cache = carry
            w = Layers(*(lax.dynamic_index_in_dim(a, i, keepdims=False) for a in layers))
            return block(c, w, h, cos, sin, cache, i, positions, mask), None

        (h, cache), _ = lax.scan(layer, (h, cache), jnp.asarray(kept))
        if not logits:
            return None, cache
        if select is not None:
            h = jnp.take_along_axis(h, select[:, None, None], axis=1)
        head = self.embed.value if self.lm_head is None else self.lm_head.value
        return linear(rms_norm(h, self.norm.value, c.rms_norm_eps), head).astype(jnp.float32), cache
