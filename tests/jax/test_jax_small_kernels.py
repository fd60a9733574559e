"""The small-shape Pallas kernels (``flashspec_jax.kernels.attention``: decode attention, fused
RoPE + cache write + attention) against their jnp references in interpret mode on the CPU, inside the model's layer loops, and lowered for CUDA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flashspec_jax.kernels.attention import (attention_reference, bounds, choose_splits, decode_attention, fused_attention,
                                             supported)
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


@pytest.mark.parametrize("splits", [1, 3])
def test_fused_kernel_equals_rope_write_and_reference(splits):
    """RoPE, the cache write and the attention in one kernel against the model's three steps: ragged
    rows, a sliding window, row 1's last position past the 100-slot cache (its write dropped); in one
    program per (row, KV head), and with the slots in 3 splits (row 0 seen by the first only, row 1
    by the last, the partial sums combined)."""
    h, kv, d, t = 9, 3, 16, 5
    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.standard_normal((2, t, (h + 2 * kv) * d), np.float32))
    angles = jnp.asarray(rng.standard_normal((2, t, d // 2), np.float32))
    cos, sin = (jnp.concatenate([f(angles)] * 2, -1) for f in (jnp.cos, jnp.sin))
    k, v = (jnp.asarray(rng.standard_normal((3, 2, kv, 100, d), np.float32)) for _ in range(2))
    positions = jnp.array([[3], [96]]) + jnp.arange(t)[None]
    f = jax.jit(lambda *a: fused_attention(*a, heads=h, block_s=16, splits=splits, interpret=True))
    out, k2, v2 = f(qkv, cos, sin, k, v, jnp.int32(1), positions, jnp.int32(4))
    q = apply_rope(qkv[..., : h * d].reshape(2, t, h, d), cos[:, :, None], sin[:, :, None])
    kn = apply_rope(qkv[..., h * d : (h + kv) * d].reshape(2, t, kv, d), cos[:, :, None], sin[:, :, None])
    kr, vr = write_cache(k, kn, 1, positions), write_cache(v, qkv[..., (h + kv) * d :].reshape(2, t, kv, d), 1, positions)
    np.testing.assert_allclose(np.asarray(k2), np.asarray(kr), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(v2), np.asarray(vr))
    ref = reference(q, kr, vr, 1, positions, 4)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_splits_only_where_programs_are_few_and_the_cache_has_blocks_to_share():
    assert choose_splits(1, 3, 384, 64) == 6 and choose_splits(8, 3, 320, 64) == 5  # SmolLM2's measured generations
    assert choose_splits(1, 8, 2112, 64) == 17 and choose_splits(1, 3, 8256, 64) == 44  # about PROGRAMS programs
    assert choose_splits(1, 8, 2112, 64, min_slots=512) == 4  # the earlier threshold
    assert choose_splits(64, 8, 8256, 64) == 1 and choose_splits(1, 8, 127, 64) == 1  # enough programs; one split's slots
    assert choose_splits(1, 1, 1024, 256) == 4  # no more splits than blocks


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_attention_equals_reference(splits):
    """The attention kernel alone (the q/k-norm configs' path) against the einsum: ragged rows, a
    sliding window on the second row, in one program per (row, KV head) and in 4 splits."""
    rng = np.random.default_rng(2)
    q = jnp.asarray(rng.standard_normal((2, 3, 6, 16), np.float32))
    k, v = (jnp.asarray(rng.standard_normal((2, 2, 2, 90, 16), np.float32)) for _ in range(2))
    positions = jnp.array([[4], [70]]) + jnp.arange(3)[None]
    window = jnp.int32(9)
    out = jax.jit(lambda *a: decode_attention(*a, block_s=16, splits=splits, interpret=True))(q, k, v, jnp.int32(1), positions, window)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference(q, k, v, 1, positions, 9)), rtol=2e-5, atol=2e-5)


def test_kernel_refuses_what_it_does_not_take():
    assert supported(5, 9, 3, 64) and not supported(1, 4, 2, 96) and not supported(200, 4, 2, 64)
    q = jnp.zeros((1, 1, 4, 96))
    k = jnp.zeros((1, 1, 2, 8, 96))
    with pytest.raises(ValueError, match="head_dim=96"):
        decode_attention(q, k, k, 0, jnp.zeros((1, 1), jnp.int32), interpret=True)


PLAIN = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=6, num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def gemma3ish():
    from flax import nnx

    return Llama(LlamaConfig(**GEMMA3ISH), rngs=nnx.Rngs(4), std=0.2)


@pytest.mark.parametrize("config,impl", [("gemma3ish", "pallas"), ("plain", "fused")])
def test_model_with_the_kernels_computes_what_xla_computes(gemma3ish, config, impl):
    """In the layer scan (the kernels read the layer a traced index names; the unrolled loop's
    static index lowers in the export test): XLA's prefill of 5 positions (ragged rows at 0 and 4),
    then a 2-position step each way from that cache. Gemma-ish (sliding windows, local RoPE,
    softcaps, norm offset) with the attention kernel; a plain Llama block with the fused attention."""
    from flax import nnx

    m = gemma3ish if config == "gemma3ish" else Llama(LlamaConfig(**PLAIN), rngs=nnx.Rngs(5), std=0.2)
    forward = nnx.jit(lambda m, x, p, cache: m(x, p, cache))
    tokens = jnp.arange(14).reshape(2, 7) % 97
    pos = jnp.array([[0], [4]]) + jnp.arange(7)[None]
    m.scan_layers = True
    _, cache = forward(m, tokens[:, :5], pos[:, :5], m.new_cache(2, 24))
    outs = []
    for attn in ("xla", impl):
        m.attention_impl = attn
        z, after = forward(m, tokens[:, 5:], pos[:, 5:], cache)
        outs.append((z, after.k, after.v))
    m.scan_layers = m.attention_impl = None
    for a, b in zip(*outs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)
    assert float(jnp.abs(outs[0][0]).max()) > 0.1  # not trivially zero


def test_greedy_speculation_equals_plain_decoding_with_the_split_fused_kernel():
    """fp32 on the CPU, the fused kernel (interpreted) at its default splits over a short cache (two
    rows, 150 slots: 2 splits): greedy n-gram speculation's tokens == plain decoding's == the einsum's."""
    from flax import nnx

    from flashspec.bandits import FixedArm
    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, decode, speculate
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    def backend_of(impl: str) -> JaxBackend:
        m = Llama(LlamaConfig(**PLAIN, max_position_embeddings=256), rngs=nnx.Rngs(7), std=0.3, attention_impl=impl)
        backend = JaxBackend(m, eos_ids=[])
        backend.set_drafts([LookupDraft()])
        return backend

    rs = np.random.default_rng(3)
    prompts = [(rs.integers(0, 97, 5).tolist() * 30)[:n] for n in (120, 97)]
    seed, greedy = np.zeros(2, np.uint64), SamplingConfig(0.0)
    fused, xla = backend_of("fused"), backend_of("xla")
    slots = fused.start_state(prompts, 24).cache.k.shape[3]
    assert choose_splits(2, PLAIN["num_kv_heads"], slots, 64) > 1
    plain, _ = decode(fused, prompts, sampling=greedy, max_new_tokens=24, seed=seed)
    spec, records = speculate(fused, FixedArm(1), prompts, sampling=greedy, spec=SpecConfig(gamma=3, max_new_tokens=24),
                              seed=seed)
    einsum, _ = decode(xla, prompts, sampling=greedy, max_new_tokens=24, seed=seed)
    assert spec == plain == einsum and all(len(r) == 24 for r in plain)
    assert sum(r.accepted for r in records) > 0  # the draft really took part


def test_kernel_choices_by_platform_and_checked(monkeypatch):
    """attention_impl None: the einsum on the CPU, the fused kernel on a GPU whatever the layer's size;
    a bad name is refused."""
    from flax import nnx

    with pytest.raises(ValueError, match="attention_impl='triton'"):
        Llama(LlamaConfig(**PLAIN), rngs=nnx.Rngs(0), attention_impl="triton")
    small = nnx.eval_shape(lambda: Llama(LlamaConfig(**PLAIN), dtype=jnp.bfloat16))
    wide = LlamaConfig(vocab_size=97, hidden_size=4096, intermediate_size=14336, num_layers=1, num_heads=32,
                       num_kv_heads=8, head_dim=128)  # Llama-3-8B's layer: 436 MB in bf16
    big = nnx.eval_shape(lambda: Llama(wide, dtype=jnp.bfloat16))
    assert (small.attention_choice(), big.attention_choice()) == ("xla", "xla")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert (small.attention_choice(), big.attention_choice()) == ("fused", "fused")
    big.attention_impl = "pallas"
    assert big.attention_choice() == "pallas"


@pytest.mark.parametrize("scan,impl", [(True, "pallas"), (False, "pallas"), (False, "fused"), (True, "fused")])
def test_decode_step_with_the_kernel_exports_for_cuda(scan, impl, monkeypatch):
    """The one-token forward with attention_impl "pallas" or "fused" lowers to Triton on this CPU: one
    attention kernel per layer (one in the scan's body), the einsum gone, the four products XLA's."""
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
    products = 4 if scan else 4 * cfg.num_layers
    assert text.count("stablehlo.dot_general") == products + 1  # the LM head
    assert ("stablehlo.scatter" in text) == (impl == "pallas")  # the fused kernel writes the cache itself


def test_split_kernels_export_for_cuda_at_llama3_8b(monkeypatch):
    """Llama-3-8B's attention (32 heads, 8 KV heads, head_dim 128) over a 2112-slot cache: 4 splits,
    one Triton call, the combine after it (its exp); a 96-slot cache (under 2 ``SPLIT_MIN_SLOTS``): no
    combine. Both kernels."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    spec = jax.ShapeDtypeStruct
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    for slots, combined in ((2112, True), (96, False)):
        cache = spec((32, 1, 8, slots, 128), jnp.bfloat16)
        f = jax.jit(lambda qkv, c, s, k, v, p: fused_attention(qkv, c, s, k, v, 3, p, heads=32))
        text = jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(
            spec((1, 1, 48 * 128), jnp.bfloat16), *[spec((1, 1, 128), jnp.bfloat16)] * 2, cache, cache,
            spec((1, 1), jnp.int32)).mlir_module()
        assert sum(text.count(name) for name in TRITON_CALLS) == 1
        assert ("stablehlo.exponential" in text) == combined
        g = jax.jit(lambda q, k, v, p: decode_attention(q, k, v, 3, p))
        text = jax.export.export(g, platforms=["cuda"], disabled_checks=checks)(
            spec((1, 5, 32, 128), jnp.bfloat16), cache, cache, spec((1, 5), jnp.int32)).mlir_module()
        assert sum(text.count(name) for name in TRITON_CALLS) == 1
        assert ("stablehlo.exponential" in text) == combined
