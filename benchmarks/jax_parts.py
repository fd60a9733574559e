"""A part of the JAX decode step timed alone at a model's shapes, each against its XLA path
(used by ``jax_vs_torch_gpu.py``; no ``main``).

* ``attention_paths``: the attention of one decode token over all L layers (one jit, a Python loop
  over the layers as the unrolled model runs them, the cache donated): ``attend`` with "xla" (RoPE,
  two cache scatters and the einsum over every cache slot) against "fused" (one Pallas kernel per
  layer, ``kernels.attention.fused_attention``, its slots split by ``choose_splits``) and against
  "fused_alt" (the kernel with ``alt_splits``: ``choose_splits``' at the earlier ``SPLIT_MIN_SLOTS`` of
  ``ALT_MIN_SLOTS`` where that differs, else 1 where it splits, else 4), per context length; the cache
  holds context + 64 slots and the token sits at the context's position, the end of a generation of
  that length. The outputs are compared with the einsum's.

It times with ``jax_profile_gpu.median_ms``: the median of ``reps`` calls after 3 warm-ups.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from flashspec_jax import model as model_lib
from flashspec_jax.kernels import attention as kernel_attention
from flashspec_jax.model import KVCache, Layers, LlamaConfig
from flashspec_jax.verify import on_gpu

from jax_profile_gpu import median_ms  # benchmarks/ is on sys.path


ATTENTIONS = ("xla", "fused", "fused_alt")
ALT_SPLITS = 4  # fused_alt's splits where choose_splits gives 1 at both thresholds
ALT_MIN_SLOTS = 512  # the earlier SPLIT_MIN_SLOTS: fused_alt's splits where they differ from the default's


def attention_step(c: LlamaConfig, impl: str, layers: int, splits: int = 0):
    """fn(qkv [B, 1, W], cos [B, 1, 1, D], sin, cache, positions [B, 1]) -> (sum of outputs [B, 1, H, D], cache).
    ``impl``: "xla" (``attend``'s einsum path) or "fused" (``fused_attention`` in ``splits``, 0: by
    ``choose_splits``)."""
    empty = Layers(*[None] * 6)  # attend reads only q_norm / k_norm (None: no q/k norm)

    def one(qkv, cos, sin, cache, i, positions, mask):
        if impl == "xla":
            return model_lib.attend(c, empty, qkv, cos, sin, cache, i, positions, mask, 0, "xla")
        out, k, v = kernel_attention.fused_attention(
            qkv, cos[:, :, 0], sin[:, :, 0], cache.k, cache.v, i, positions, 0, heads=c.num_heads,
            splits=splits, interpret=not on_gpu())
        return out, KVCache(k, v)

    def step(qkv, cos, sin, cache, positions):
        slots = jnp.arange(cache.max_len)[None, None, :]
        mask = slots <= positions[:, :, None]
        total = jnp.zeros(qkv.shape[:2] + (c.num_heads, c.head_dim), jnp.float32)
        for i in range(layers):
            out, cache = one(qkv, cos, sin, cache, i, positions, mask)
            total = total + out.astype(jnp.float32)
        return total, cache

    return jax.jit(step, donate_argnames=("cache",) if on_gpu() else ())


def splits_at(batch: int, kv_heads: int, slots: int) -> dict:
    """The default's splits (``choose_splits``) and fused_alt's (module docstring)."""
    auto = kernel_attention.choose_splits(batch, kv_heads, slots, kernel_attention.BLOCK_S)
    earlier = kernel_attention.choose_splits(batch, kv_heads, slots, kernel_attention.BLOCK_S, ALT_MIN_SLOTS)
    return dict(splits=auto, alt_splits=earlier if earlier != auto else ALT_SPLITS if auto == 1 else 1)


def attention_paths(dims: dict, contexts: list[int], batch: int, reps: int, dtype, deadline: float) -> dict:
    """Per context: ms of the attention of one token over all layers, each of ``ATTENTIONS``, the
    kernel's splits there, and each output's largest difference from the einsum's (relative)."""
    c = LlamaConfig(**dims, max_position_embeddings=max(contexts) + 128)
    key = jax.random.key(0)
    out = dict(batch=batch, layers=c.num_layers, contexts={})
    for ctx in contexts:
        if time.perf_counter() > deadline:
            out["contexts"][ctx] = dict(skipped="--budget-s spent")
            continue
        slots = ctx + 64
        qkv = jax.random.normal(key, (batch, 1, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim), dtype)
        positions = jnp.full((batch, 1), ctx, jnp.int32)
        cos, sin = model_lib.rope_table(c, positions, dtype)
        row = dict(slots=slots, **splits_at(batch, c.num_kv_heads, slots))
        results = {}
        shape = (c.num_layers, batch, c.num_kv_heads, slots, c.head_dim)
        made = KVCache(*(0.5 * jax.random.normal(jax.random.key(i), shape, dtype) for i in (1, 2)))
        for impl in ATTENTIONS:
            if time.perf_counter() > deadline:
                row[f"{impl}_skipped"] = "--budget-s spent"
                continue
            cache = KVCache(*(jnp.copy(a) for a in made))  # each path's own (the step donates it)
            step = attention_step(c, impl.removesuffix("_alt"), c.num_layers, row["alt_splits"] if impl == "fused_alt" else 0)
            t0 = time.perf_counter()
            total, cache = step(qkv, cos, sin, cache, positions)
            results[impl] = np.asarray(total, np.float32)
            row[f"{impl}_compile_and_first_s"] = time.perf_counter() - t0
            row[f"{impl}_ms"], cache = median_ms(lambda cc: step(qkv, cos, sin, cc, positions)[1], cache, reps)
            del cache
        del made
        ref = results.get("xla")
        for impl in (i for i in ATTENTIONS[1:] if i in results and ref is not None):
            row[f"{impl}_rel_max_diff"] = float(np.abs(results[impl] - ref).max() / max(1e-30, np.abs(ref).max()))
            row[f"{impl}_over_xla"] = row[f"{impl}_ms"] / row["xla_ms"]
        out["contexts"][ctx] = row
    return out
