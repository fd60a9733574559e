"""Two parts of the JAX decode step timed alone at a model's shapes, each against its XLA path
(used by ``jax_vs_torch_gpu.py``; no ``main``).

* ``attention_paths``: the attention of one decode token over all L layers (one jit, a Python loop
  over the layers as the unrolled model runs them, the cache donated): ``attend`` with "xla" (RoPE,
  two cache scatters and the einsum over every cache slot) against "fused" (one Pallas kernel per
  layer, ``kernels.attention.fused_attention``, its slots split by ``choose_splits``) and against
  "fused_alt" (the kernel with ``alt_splits``: 1 where ``choose_splits`` splits, else 4), per context length; the cache
  holds context + 64 slots and the token sits at the context's position, the end of a generation of
  that length. The outputs are compared with the einsum's.
* ``gemv_paths``: the block's four products of one token over L layers (norms, the residual add
  and SiLU * up included, no attention), XLA's ``linear`` against ``kernels.gemv.project``; the
  layer weights cycle over ``stack`` distinct layers so that they do not stay in L2.

Both time with ``jax_profile_gpu.median_ms``: the median of ``reps`` calls after 3 warm-ups.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from flashspec_jax import model as model_lib
from flashspec_jax.kernels import attention as kernel_attention
from flashspec_jax.kernels import gemv as kernel_gemv
from flashspec_jax.model import KVCache, Layers, LlamaConfig
from flashspec_jax.verify import on_gpu

from jax_profile_gpu import median_ms  # benchmarks/ is on sys.path


ATTENTIONS = ("xla", "fused", "fused_alt")
ALT_SPLITS = 4  # fused_alt's splits where choose_splits gives 1


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
        auto = kernel_attention.choose_splits(batch, c.num_kv_heads, slots, kernel_attention.BLOCK_S)
        row = dict(slots=slots, splits=auto, alt_splits=ALT_SPLITS if auto == 1 else 1)
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


def block_products(c: LlamaConfig, impl: str, layers: int, stack: int):
    """fn(x [M, C], weights) -> x after ``layers`` blocks' products (attention left out: its output is
    the qkv's first H D columns), layer i reading the stack's layer i % stack."""
    eps = c.rms_norm_eps

    def xla(x, w, i):
        qkv = model_lib.linear(model_lib.rms_norm(x, w.attn_norm[i], eps), w.qkv[i])
        h = x + model_lib.linear(qkv[:, : c.num_heads * c.head_dim], w.o[i])
        gate, up = jnp.split(model_lib.linear(model_lib.rms_norm(h, w.mlp_norm[i], eps), w.gate_up[i]), 2, axis=-1)
        return h + model_lib.linear(jax.nn.silu(gate) * up, w.down[i])

    def pallas(x, w, i):
        run = lambda *a, **k: kernel_gemv.project(*a, layer=i, eps=eps, interpret=not on_gpu(), **k)  # noqa: E731
        qkv = run(x, w.qkv, prologue="norm", norm=w.attn_norm)
        o = run(qkv[:, : c.num_heads * c.head_dim], w.o)
        gate_up, h = run(o, w.gate_up, prologue="norm", norm=w.mlp_norm, residual=x)
        return h + run(gate_up, w.down, prologue="swiglu")

    one = {"xla": xla, "pallas": pallas}[impl]

    def step(x, w):
        for i in range(layers):
            x = one(x, w, i % stack)
        return x

    return jax.jit(step)


def gemv_paths(dims: dict, rows: int, reps: int, dtype, stack: int = 4) -> dict:
    """ms of the products of all L layers for ``rows`` rows, XLA's and the Pallas products, and their agreement."""
    c = LlamaConfig(**dims, max_position_embeddings=256)
    shapes = model_lib.layer_shapes(c)
    keys = jax.random.split(jax.random.key(3), len(shapes))
    w = Layers(**{n: (jnp.ones((stack, *s), dtype) if "norm" in n else
                      0.02 * jax.random.normal(k, (stack, *s), dtype)) for (n, s), k in zip(shapes.items(), keys)})
    x = jax.random.normal(jax.random.key(4), (rows, c.hidden_size), dtype)
    row, outs = dict(rows=rows, layers=c.num_layers, distinct_layers=stack,
                     weight_bytes_per_step=c.num_layers * sum(a[0].size * a.dtype.itemsize for a in w if a is not None and a.ndim == 3)), {}
    for impl in ("xla", "pallas"):
        step = block_products(c, impl, c.num_layers, stack)
        t0 = time.perf_counter()
        outs[impl] = np.asarray(step(x, w), np.float32)
        row[f"{impl}_compile_and_first_s"] = time.perf_counter() - t0
        row[f"{impl}_ms"], _ = median_ms(lambda _x: step(x, w), x, reps)
        row[f"{impl}_gb_per_s"] = row["weight_bytes_per_step"] / row[f"{impl}_ms"] / 1e6
    ref = outs["xla"]
    row["rel_max_diff"] = float(np.abs(outs["pallas"] - ref).max() / max(1e-30, np.abs(ref).max()))
    row["pallas_over_xla"] = row["pallas_ms"] / row["xla_ms"]
    return row
