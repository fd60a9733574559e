"""The decoder of every supported family (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3,
Phi-3) in Flax NNX with a static KV cache; the family differences are ``LlamaConfig`` fields.

The same semantics as ``flashspec_torch.model``: every row has its own positions; a forward writes
K/V at ``positions`` and lets each query attend to cache slots ``s <= its position``, so stale
entries past a row's length are never attended before they are overwritten and rolling back
rejected tokens is free. Shapes are fixed: attention runs over the whole static cache with a
mask (or, ``Llama.attention_impl`` "pallas" / "fused", a kernel that reads only the blocks of
slots a row sees: ``kernels/attention.py``), so nothing recompiles as sequences grow.

The layers' weights are stacked along a leading layer axis ([L, ...]). Two loops over them, one
math (``Llama.scan_layers``; None: ``Llama.uses_scan``): one ``lax.scan`` over
the indices of the layers it runs (one compiled layer whatever the depth: the CPU compiles the
30-layer SmolLM2 in 3 s, unrolled in 24 s), or a Python loop with static layer indices, which the
GPU needs: there a static slice of the stack is read in place by the product, while the scan's
dynamic slice is first copied out (each weight read twice and written once; docs/jax.md has the
H100 profile). A layer-skipping draft passes the skipped layers as a static set, so they cost
nothing and no data-dependent branch (which XLA on a GPU evaluates on the host) is needed. The
products are XLA's (``Llama.batch_invariant``: every product, norm and attention by the
batch-invariant Pallas kernels, ``kernels/invariant_*.py``). Weights use the fused layout of
``flashspec.weights`` (``qkv`` and ``gate_up`` concatenated, ``[out, in]``), so the one converted
cache on disk loads into either backend.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from flashspec.config import LlamaConfig
from flashspec.contract import check_vocab

from .kernels import attention as kernel_attention
from .kernels.attention import attention_reference
from .kernels.invariant_attention import invariant_attention
from .kernels.invariant_matmul import invariant_matmul
from .kernels.invariant_norm import invariant_rms_norm
from .verify import on_gpu

__all__ = ["LlamaConfig", "KVCache", "Llama", "new_cache"]


ATTENTION_IMPLS = ("xla", "pallas", "fused")  # "invariant": batch_invariant's, never set by hand
SCAN_BELOW_BYTES = 32 << 20  # a layer's weights: the GPU scans smaller layers (SmolLM2's 7 MB), unrolls larger (TinyLlama's 88 MB)


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


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:  # [..., C], [C]
    """RMSNorm; with ``offset`` (Gemma) the product by (offset + weight) in float32, then rounded."""
    xf = x.astype(jnp.float32)
    xf = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if offset:
        return (xf * (offset + weight.astype(jnp.float32))).astype(x.dtype)
    return xf.astype(x.dtype) * weight


def rope_table(c: LlamaConfig, positions: jax.Array, dtype, local: bool = False):  # ([B, T, 1, D], [B, T, 1, D])
    """cos and sin at ``positions`` [B, T] of the config's RoPE (``local``: Gemma 3's sliding layers')."""
    inv_freq, scaling = c.rope(local)
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)  # [B, T, D/2]
    return tuple((jnp.concatenate([f(angles)] * 2, -1) * np.float32(scaling))[:, :, None].astype(dtype)
                 for f in (jnp.cos, jnp.sin))


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


def attention(c: LlamaConfig, q: jax.Array, cache: KVCache, layer, positions: jax.Array, mask: jax.Array, window=0,
              impl: str = "xla") -> jax.Array:
    """q [B, T, H, D] against layer ``layer`` of the cache ([L, B, H_kv, S, D]); positions [B, T];
    mask [B, T, S] (the slots each query sees: slot <= position, within ``window`` if not 0).
    ``impl`` "xla": the einsum over every slot (``attention_reference``); "pallas": the kernel that
    reads only the visible blocks (``kernels.attention.decode_attention``) where it takes the shape
    (a few rows per KV head: decoding and scoring), the einsum otherwise (a long prefill)."""
    if impl == "pallas" and kernel_attention.supported(q.shape[1], c.num_heads, c.num_kv_heads, c.head_dim):
        return kernel_attention.decode_attention(q, cache.k, cache.v, layer, positions, window, scale=c.query_scale,
                                                 softcap=c.attn_softcap, interpret=not on_gpu())
    return attention_reference(q, cache.k[layer], cache.v[layer], mask, c.query_scale, c.attn_softcap)


class Layers(NamedTuple):
    """One block's weights; in ``Llama`` each field is stacked over layers ([L, ...]). The fields
    after ``mlp_norm`` exist only where the config has the feature (None otherwise)."""

    qkv: jax.Array  # [(H + 2 H_kv) D, C]
    o: jax.Array  # [C, H D]
    gate_up: jax.Array  # [2 F, C]
    down: jax.Array  # [C, F]
    attn_norm: jax.Array  # [C]
    mlp_norm: jax.Array  # [C]
    qkv_bias: jax.Array | None = None  # [(H + 2 H_kv) D]: attention_bias
    o_bias: jax.Array | None = None  # [C]: o_bias
    gate_up_bias: jax.Array | None = None  # [2 F]: mlp_bias
    down_bias: jax.Array | None = None  # [C]: mlp_bias
    q_norm: jax.Array | None = None  # [D]: qk_norm
    k_norm: jax.Array | None = None  # [D]: qk_norm
    post_attn_norm: jax.Array | None = None  # [C]: sandwich_norms
    post_mlp_norm: jax.Array | None = None  # [C]: sandwich_norms


def layer_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The per-layer shape of each Layers field this config has."""
    nqkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    shapes = {"qkv": (nqkv, c.hidden_size), "o": (c.hidden_size, c.num_heads * c.head_dim),
              "gate_up": (2 * c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size),
              "attn_norm": (c.hidden_size,), "mlp_norm": (c.hidden_size,)}
    if c.attention_bias:
        shapes["qkv_bias"] = (nqkv,)
    if c.o_bias:
        shapes["o_bias"] = (c.hidden_size,)
    if c.mlp_bias:
        shapes["gate_up_bias"], shapes["down_bias"] = (2 * c.intermediate_size,), (c.hidden_size,)
    if c.qk_norm:
        shapes["q_norm"] = shapes["k_norm"] = (c.head_dim,)
    if c.sandwich_norms:
        shapes["post_attn_norm"] = shapes["post_mlp_norm"] = (c.hidden_size,)
    return shapes


def dense(x: jax.Array, w: jax.Array, bias: jax.Array | None, invariant: bool = False) -> jax.Array:  # [..., in] -> [..., out]
    """x w^T (+ bias); ``invariant``: the batch-invariant product (``Llama.batch_invariant``: no biases)."""
    if invariant:
        return invariant_matmul(x, w, interpret=not on_gpu())
    y = linear(x, w)
    return y if bias is None else y + bias


def norm(c: LlamaConfig, x: jax.Array, weight: jax.Array | None, invariant: bool = False) -> jax.Array:
    """RMSNorm (None: none); ``invariant``: its row reduction by the per-row kernel (no norm offset)."""
    if weight is None:
        return x
    if invariant:
        return invariant_rms_norm(x, weight, c.rms_norm_eps, interpret=not on_gpu())
    return rms_norm(x, weight, c.rms_norm_eps, c.norm_offset)


def attend(c: LlamaConfig, w: Layers, qkv, cos, sin, cache: KVCache, layer, positions, mask, window, attn: str,
           shards: int = 1):
    """qkv [B, T, (H + 2 H_kv) D] -> (attention output [B, T, H, D], the cache with this layer's new K/V):
    q/k norms and RoPE, the cache write, ``attention``; with ``attn`` "fused" one kernel does all three
    (``kernels.attention.fused_attention``) where it takes the config and shape, else as "pallas"; "invariant":
    ``kernels.invariant_attention`` after the same RoPE and cache write.
    ``shards`` > 1: qkv in the shard-major order of ``flashspec_jax.parallel`` (each shard's q, k, v heads
    side by side; ``Llama.attention_choice`` is then "xla"); 1: the fused layout."""
    b, t, _ = qkv.shape
    if attn == "fused" and not c.qk_norm and kernel_attention.supported(t, c.num_heads, c.num_kv_heads, c.head_dim):
        out, k, v = kernel_attention.fused_attention(
            qkv, cos[:, :, 0], sin[:, :, 0], cache.k, cache.v, layer, positions, window, heads=c.num_heads,
            scale=c.query_scale, softcap=c.attn_softcap, interpret=not on_gpu())
        return out, KVCache(k, v)
    qkv = qkv.reshape(b, t, shards, -1)  # [B, T, N, (H + 2 H_kv) D / N]
    nq, nk = c.num_heads * c.head_dim // shards, c.num_kv_heads * c.head_dim // shards
    q = norm(c, qkv[..., :nq].reshape(b, t, c.num_heads, c.head_dim), w.q_norm)
    k = norm(c, qkv[..., nq : nq + nk].reshape(b, t, c.num_kv_heads, c.head_dim), w.k_norm)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    v = qkv[..., nq + nk :].reshape(b, t, c.num_kv_heads, c.head_dim)
    cache = KVCache(write_cache(cache.k, k, layer, positions), write_cache(cache.v, v, layer, positions))
    if attn == "invariant":  # ``Llama.batch_invariant`` (no q/k norms, no windows, one device: ``invariant_check``)
        return invariant_attention(q, cache.k, cache.v, layer, positions, scale=c.query_scale,
                                   interpret=not on_gpu()), cache
    return attention(c, q, cache, layer, positions, mask, window, "pallas" if attn == "fused" else attn), cache


def block(c: LlamaConfig, w: Layers, h, cos, sin, cache: KVCache, layer, positions, mask, window=0, attn: str = "xla",
          shards: int = 1):
    """h [B, T, C]; cache [L, B, H_kv, S, D] (layer ``layer`` is read and written); positions [B, T]; mask [B, T, S]
    (from ``window``, 0: none); ``attn`` the attention's implementation (``attend``).
    ``shards`` > 1: qkv and gate_up in ``flashspec_jax.parallel``'s shard-major order (``attend``; each
    shard's gate and up columns side by side)."""
    b, t, _ = h.shape
    inv = attn == "invariant"  # ``Llama.batch_invariant``: the products and norms by the invariant kernels too
    qkv = dense(norm(c, h, w.attn_norm, inv), w.qkv, w.qkv_bias, inv)
    out, cache = attend(c, w, qkv, cos, sin, cache, layer, positions, mask, window, attn, shards)
    h = h + norm(c, dense(out.reshape(b, t, -1), w.o, w.o_bias, inv), w.post_attn_norm)
    gate_up = dense(norm(c, h, w.mlp_norm, inv), w.gate_up, w.gate_up_bias, inv).reshape(b, t, shards, 2, -1)  # [B, T, N, 2, F / N]
    gate, up = gate_up[..., 0, :].reshape(b, t, -1), gate_up[..., 1, :].reshape(b, t, -1)
    act = jax.nn.silu(gate) if c.activation == "silu" else jax.nn.gelu(gate, approximate=True)
    return h + norm(c, dense(act * up, w.down, w.down_bias, inv), w.post_mlp_norm), cache


class Llama(nnx.Module):
    """Embedding, a stack of blocks (weights [L, ...]), final norm, LM head (tied or not)."""

    def __init__(self, config: LlamaConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None, std: float = 0.02,
                 scan_layers: bool | None = None, attention_impl: str | None = None):
        check_vocab(config.vocab_size)  # the Pallas verify indexes the vocabulary in int32
        self.config = config
        self.scan_layers = scan_layers  # the layer loop (module docstring); None: by platform at trace time
        self.attention_impl = attention_impl  # "xla", "pallas", "fused" (``attend``); None: ``attention_choice``
        self.mesh = None  # a jax.sharding.Mesh with a "tp" axis: the weights are split over it (flashspec_jax.parallel)
        # every reduction of the forward by the batch-invariant kernels (``invariant_check``; docs/batch_invariance.md)
        self.batch_invariant = False
        c, L = config, config.num_layers
        rngs = rngs or nnx.Rngs(0)

        def normal(*shape):
            return nnx.Param((std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype))

        def ones(*shape):  # a norm's weight: the identity (zeros where the norm adds norm_offset)
            return nnx.Param(jnp.full(shape, 1.0 - c.norm_offset, dtype))

        self.embed = normal(c.vocab_size, c.hidden_size)
        for name, shape in layer_shapes(c).items():
            setattr(self, name, ones(L, *shape) if "norm" in name else normal(L, *shape))
        self.norm = ones(c.hidden_size)
        self.lm_head = None if c.tie_word_embeddings else normal(c.vocab_size, c.hidden_size)
        self.attention_choice()  # the choice's name checked

    @property
    def dtype(self):
        return self.embed.get_value().dtype

    @property
    def shards(self) -> int:
        """The tensor-parallel degree (1: one device)."""
        return 1 if self.mesh is None else self.mesh.shape["tp"]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        cache = new_cache(self.config, batch, max_len, self.dtype)
        return cache if self.mesh is None else KVCache(*(self.place(a, (None, None, "tp")) for a in cache))

    def place(self, x: jax.Array, spec: tuple) -> jax.Array:
        """x constrained to ``spec`` over the mesh (names or None per leading axis; the rest replicated)."""
        return lax.with_sharding_constraint(x, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def uses_scan(self) -> bool:
        """``scan_layers``, or by default: the scan on the CPU, and on a GPU for layers whose
        weights are under SCAN_BELOW_BYTES (launches dominate there, docs/jax.md); else unrolled."""
        if self.scan_layers is not None:
            return bool(self.scan_layers)
        if jax.default_backend() == "cpu":
            return True
        return self.layer_bytes() < SCAN_BELOW_BYTES

    def attention_choice(self) -> str:
        """``attention_impl``, or by default: the einsum ("xla") on the CPU and for a target split over a
        mesh, "fused" on one GPU (faster at SmolLM2's, TinyLlama's and Llama-3-8B's shapes: docs/jax.md)."""
        if self.batch_invariant:
            self.invariant_check()
            return "invariant"
        if self.attention_impl not in (None, *ATTENTION_IMPLS):
            raise ValueError(f"attention_impl={self.attention_impl!r}: choose one of {ATTENTION_IMPLS} or None (by platform)")
        if self.attention_impl is not None:
            if self.mesh is not None and self.attention_impl != "xla":
                raise ValueError(f"attention_impl={self.attention_impl!r} runs on one device; a target split over "
                                 "a mesh takes 'xla' (or None)")
            return self.attention_impl
        if self.mesh is not None:  # the Pallas kernels see one device's arrays: XLA partitions the einsum
            return "xla"
        return "fused" if on_gpu() else "xla"

    def invariant_check(self) -> None:
        """A ValueError naming what ``batch_invariant`` does not implement for this model: the families'
        features the invariant kernels leave out, a head_dim the attention kernel does not take, a mesh,
        an explicit ``attention_impl``."""
        c, why = self.config, None
        if c.kernel_blockers:
            why = f"the invariant kernels do not implement {c.kernel_blockers} of this model"
        elif c.head_dim < 16 or c.head_dim & (c.head_dim - 1):
            why = f"head_dim {c.head_dim} is not a power of two >= 16 (the attention kernel's)"
        elif self.mesh is not None:
            why = "the target is split over a mesh (tensor_parallel > 1); the invariant kernels run on one device"
        elif self.attention_impl is not None:
            why = f"attention_impl={self.attention_impl!r} is set; the mode chooses its own attention (leave it None)"
        if why:
            raise ValueError(f"batch_invariant=True: {why}; use batch_invariant=False for this model")

    def layer_bytes(self) -> int:
        """One layer's weight bytes."""
        return sum(math.prod(s) for s in layer_shapes(self.config).values()) * jnp.dtype(self.dtype).itemsize

    def layers(self) -> Layers:
        return Layers(**{n: getattr(self, n).get_value() for n in layer_shapes(self.config)})

    def __call__(
        self,
        tokens: jax.Array,  # [B, T] int
        positions: jax.Array,  # [B, T] int: each token's position in its row
        cache: KVCache,
        *,
        select: jax.Array | None = None,  # [B]: logits at this token index of each row only
        skip: frozenset[int] | tuple[int, ...] = (),  # layers to leave out (static: a layer-skipping draft)
        logits: bool = True,
        hidden: tuple[int, ...] = (),  # also return the residual stream after these layers (a draft head's input)
    ):  # ([B, T or 1, V] float32 or None, the updated cache); with ``hidden``: (those, [B, T, len(hidden) * C])
        c = self.config
        if set(hidden) & set(skip):
            raise ValueError(f"hidden={hidden} names layers the forward skips ({sorted(skip)})")
        h = jnp.take(self.embed.get_value(), tokens, axis=0)
        if c.embed_scale != 1.0:
            h = h * jnp.asarray(c.embed_scale, h.dtype)
        cos, sin = rope_table(c, positions, h.dtype)
        local = rope_table(c, positions, h.dtype, local=True) if c.local_rope_theta is not None else (cos, sin)
        kept = [i for i in range(c.num_layers) if i not in set(skip)]
        run = scanned_layers if self.uses_scan() else unrolled_layers
        h, cache, feats = run(self, kept, h, (cos, sin), local, cache, positions, tuple(hidden))
        z = self.head_logits(h, select) if logits else None
        return (z, cache, feats) if hidden else (z, cache)

    def head_logits(self, h: jax.Array, select: jax.Array | None) -> jax.Array:  # [B, T, C] -> [B, T or 1, V] float32
        c = self.config
        if select is not None:
            h = jnp.take_along_axis(h, select[:, None, None], axis=1)
        head = self.embed.get_value() if self.lm_head is None else self.lm_head.get_value()
        inv = self.batch_invariant
        z = dense(norm(c, h, self.norm.get_value(), inv), head, None, inv)
        if self.mesh is not None:  # each device's vocabulary shard, then gathered: verify and sampling read whole rows
            z = self.place(self.place(z, (None, None, "tp")), ())
        z = z.astype(jnp.float32)
        return jnp.tanh(z / c.final_softcap) * c.final_softcap if c.final_softcap else z


def scanned_layers(m: Llama, kept: list[int], h, rope, local, cache: KVCache, positions, hidden: tuple[int, ...]):
    """The ``kept`` layers as one ``lax.scan`` over the stacked weights (h [B, T, C]; positions [B, T])
    -> (h, cache, the streams after the ``hidden`` layers [B, T, len(hidden) * C] or None)."""
    c = m.config
    slots = jnp.arange(cache.max_len)[None, None, :]
    mask = slots <= positions[:, :, None]  # [B, T, S]
    windows = jnp.asarray([c.window(i) for i in kept], jnp.int32)  # 0: a full layer
    uses_local = jnp.asarray([c.local_rope(i) for i in kept])
    layers = m.layers()
    slot = jnp.asarray([hidden.index(i) if i in hidden else -1 for i in kept], jnp.int32)  # into feats
    feats = jnp.zeros((len(hidden), *h.shape), h.dtype) if hidden else None  # [k, B, T, C]: the streams kept

    def layer(carry, xs):
        h, cache, feats = carry
        i, window, is_local, j = xs
        w = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, i, keepdims=False), layers)
        seen = mask & ((window == 0) | (slots > positions[:, :, None] - window))
        cs = (jnp.where(is_local, local[0], rope[0]), jnp.where(is_local, local[1], rope[1]))
        h, cache = block(c, w, h, *cs, cache, i, positions, seen, window, m.attention_choice(), m.shards)
        if feats is not None:
            at = jnp.maximum(j, 0)
            feats = lax.dynamic_update_index_in_dim(feats, jnp.where(j >= 0, h, feats[at]), at, 0)
        return (h, cache, feats), None

    xs = (jnp.asarray(np.array(kept, np.int32)), windows, uses_local, slot)
    (h, cache, feats), _ = lax.scan(layer, (h, cache, feats), xs)
    if feats is None:
        return h, cache, None
    b, t, width = h.shape
    return h, cache, jnp.moveaxis(feats, 0, 2).reshape(b, t, len(hidden) * width)


def unrolled_layers(m: Llama, kept: list[int], h, rope, local, cache: KVCache, positions, hidden: tuple[int, ...]):
    """The ``kept`` layers one after another, each's weights a static slice of the stack (or, where
    a field holds a tuple of per-layer arrays, ``flashspec_jax.whole``'s unstacked weights, its
    layer's entry); each layer's window and RoPE are static, and each writes its cache slots at a
    static layer index. Returns what ``scanned_layers`` returns."""
    c = m.config
    slots = jnp.arange(cache.max_len)[None, None, :]
    mask = slots <= positions[:, :, None]  # [B, T, S]
    layers = m.layers()
    kept_streams = {}
    for i in kept:
        window = c.window(i)
        seen = mask & (slots > positions[:, :, None] - window) if window else mask
        w = jax.tree.map(lambda a, i=i: a[i], layers, is_leaf=lambda x: type(x) is tuple)
        h, cache = block(c, w, h, *(local if c.local_rope(i) else rope), cache, i, positions, seen, window,
                         m.attention_choice(), m.shards)
        if i in hidden:
            kept_streams[i] = h
    feats = jnp.concatenate([kept_streams[i] for i in hidden], axis=-1) if hidden else None
    return h, cache, feats
