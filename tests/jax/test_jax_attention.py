"""The Pallas decode attention (``flashspec_jax.kernels.attention``) against its einsum reference,
in interpret mode on the CPU, inside the model's two layer loops, and lowered for CUDA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flashspec_jax.kernels.attention import attention_reference, bounds, decode_attention, fused_attention, supported
from flashspec_jax.model import Llama, LlamaConfig, apply_rope, write_cache

TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")  # JAX 0.10 and 0.11 custom calls
GEMMA3ISH = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
                 head_dim=16, sliding_windows=(3, 0, 3, 0), local_rope_theta=1000.0, attn_softcap=30.0,
                 final_softcap=20.0, norm_offset=1.0, embed_scale=8.0)


def reference(q, k, v, layer, positions, window, **kw):
    lo, hi = bounds(positions, window)
    slots = jnp.arange(k.shape[3])
    mask = (slots >= lo[..., None]) & (slots <= hi[..., None])  # [B, T, S]
    return attention_reference(q, k[layer], v[layer], mask, **kw)


@pytest.mark.parametrize("t,heads,kv,window,scale,softcap", [
    (5, 9, 3, 0, 0.0, 0.0),  # scoring G + 1 = 5 positions, SmolLM2's GQA group of 3
    (3, 2, 2, 20, 0.1, 30.0),  # no GQA, a sliding window, Gemma's scale and softcap
])
def test_kernel_equals_reference(t, heads, kv, window, scale, softcap):
    """Ragged rows (positions 3 and 90 of a 100-slot cache in 32-slot blocks: blocks skipped
    before, after and within the last), the layer and window traced under jit."""
    rng = np.random.default_rng(t)  # numpy: jax.random's first compile costs seconds on this CPU
    q = jnp.asarray(rng.standard_normal((2, t, heads, 16), np.float32))
    k, v = (jnp.asarray(rng.standard_normal((3, 2, kv, 100, 16), np.float32)) for _ in range(2))
    positions = jnp.array([[3], [90]]) + jnp.arange(t)[None]
    f = jax.jit(lambda q, k, v, layer, pos, w: decode_attention(q, k, v, layer, pos, w, scale=scale, softcap=softcap,
                                                                block_s=32, interpret=True))
    out = f(q, k, v, jnp.int32(1), positions, jnp.int32(window))
    ref = reference(q, k, v, 1, positions, window, scale=scale, softcap=softcap)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)
    other = reference(q, k, v, 2, positions, window, scale=scale, softcap=softcap)
    assert not np.allclose(np.asarray(out), np.asarray(other), atol=1e-2)  # it read layer 1, not another


def test_fused_kernel_equals_rope_write_and_reference():
    """RoPE, the cache write and the attention in one kernel against the model's three steps: ragged
    rows, a sliding window, row 1's last position past the 100-slot cache (its write dropped)."""
    h, kv, d, t = 9, 3, 16, 5
    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.standard_normal((2, t, (h + 2 * kv) * d), np.float32))
    angles = jnp.asarray(rng.standard_normal((2, t, d // 2), np.float32))
    cos, sin = (jnp.concatenate([f(angles)] * 2, -1) for f in (jnp.cos, jnp.sin))
    k, v = (jnp.asarray(rng.standard_normal((3, 2, kv, 100, d), np.float32)) for _ in range(2))
    positions = jnp.array([[3], [96]]) + jnp.arange(t)[None]
    f = jax.jit(lambda *a: fused_attention(*a, heads=h, block_s=32, interpret=True))
    out, k2, v2 = f(qkv, cos, sin, k, v, jnp.int32(1), positions, jnp.int32(4))
    q = apply_rope(qkv[..., : h * d].reshape(2, t, h, d), cos[:, :, None], sin[:, :, None])
    kn = apply_rope(qkv[..., h * d : (h + kv) * d].reshape(2, t, kv, d), cos[:, :, None], sin[:, :, None])
    kr, vr = write_cache(k, kn, 1, positions), write_cache(v, qkv[..., (h + kv) * d :].reshape(2, t, kv, d), 1, positions)
    np.testing.assert_allclose(np.asarray(k2), np.asarray(kr), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(v2), np.asarray(vr))
    ref = reference(q, kr, vr, 1, positions, 4)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_kernel_refuses_what_it_does_not_take():
    assert supported(5, 9, 3, 64) and not supported(1, 4, 2, 96) and not supported(200, 4, 2, 64)
    q = jnp.zeros((1, 1, 4, 96))
    k = jnp.zeros((1, 1, 2, 8, 96))
    with pytest.raises(ValueError, match="head_dim=96"):
        decode_attention(q, k, k, 0, jnp.zeros((1, 1), jnp.int32), interpret=True)


@pytest.fixture(scope="module")
def gemma3ish():
    from flax import nnx

    return Llama(LlamaConfig(**GEMMA3ISH), rngs=nnx.Rngs(4), std=0.2)


@pytest.mark.parametrize("impl", ["pallas", "fused"])
def test_model_with_the_kernel_computes_what_the_einsum_computes(gemma3ish, impl):
    """The layer scan (the kernel reads the layer a traced index names; the unrolled loop's static
    index lowers in the export test): a 6-position pass then a 1-position step through one cache,
    the per-layer features on (sliding windows, local RoPE, softcap, biases)."""
    from flax import nnx

    m = gemma3ish
    forward = nnx.jit(lambda m, x, p, cache: m(x, p, cache))
    tokens = jnp.arange(14).reshape(2, 7) % 97
    pos = jnp.array([[0], [4]]) + jnp.arange(7)[None]
    outs = []
    for attn in ("xla", impl):
        m.scan_layers, m.attention_impl = True, attn
        cache = m.new_cache(2, 24)
        zs = []
        for a, b in ((0, 6), (6, 7)):
            z, cache = forward(m, tokens[:, a:b], pos[:, a:b], cache)
            zs.append(z)
        outs.append((*zs, cache.k, cache.v))
    m.scan_layers = m.attention_impl = None
    for a, b in zip(*outs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
    assert float(jnp.abs(outs[0][1]).max()) > 0.1  # not trivially zero


def test_attention_impl_is_checked(gemma3ish):
    from flax import nnx

    with pytest.raises(ValueError, match="attention_impl='triton'"):
        Llama(LlamaConfig(**GEMMA3ISH), rngs=nnx.Rngs(0), attention_impl="triton")
    assert gemma3ish.attention_choice() == "xla"  # the default on every platform


@pytest.mark.parametrize("scan,impl", [(True, "pallas"), (False, "pallas"), (False, "fused")])
def test_decode_step_with_the_kernel_exports_for_cuda(scan, impl, monkeypatch):
    """The one-token forward with attention_impl "pallas" or "fused" lowers to Triton on this CPU:
    one kernel per layer (one in the scan's body), the einsum gone."""
    from flax import nnx

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # the kernel compiled, not interpreted

    cfg = LlamaConfig(vocab_size=97, hidden_size=192, intermediate_size=256, num_layers=3, num_heads=9,
                      num_kv_heads=3, head_dim=64)
    m = nnx.eval_shape(lambda: Llama(cfg, dtype=jnp.bfloat16, scan_layers=scan, attention_impl=impl))
    graphdef, params = nnx.split(m)
    cache = jax.eval_shape(lambda: m.new_cache(1, 384))
    x = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    f = jax.jit(lambda p, x, pos, cache: nnx.merge(graphdef, p)(x, pos, cache))
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    text = jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(params, x, x, cache).mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == (1 if scan else cfg.num_layers)
    assert text.count("stablehlo.dot_general") == (4 if scan else 4 * cfg.num_layers) + 1  # products, LM head
    assert ("stablehlo.scatter" in text) == (impl == "pallas")  # the fused kernel writes the cache itself
