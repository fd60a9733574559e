"""The Flax Llama against the torch one on random tiny configs (GQA, llama3 RoPE, untied head),
weights through the shared fused layout, and the random-weight constructor."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from flashspec_jax.model import Llama as JaxLlama  # noqa: E402
from flashspec_jax.model import LlamaConfig  # noqa: E402
from flashspec_jax.weights import from_state, random_model  # noqa: E402

LLAMA3 = (("factor", 8.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0), ("original_max_position_embeddings", 64.0))


def tiny(tied: bool, scaling) -> LlamaConfig:
    return LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4, num_kv_heads=2,
                       head_dim=16, rope_theta=5000.0, rope_type="llama3" if scaling else "default",
                       rope_scaling=scaling, tie_word_embeddings=tied)


def torch_model(cfg: LlamaConfig, seed: int):
    from flashspec_torch.model import Llama

    torch.manual_seed(seed)
    m = Llama(cfg)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m.eval().requires_grad_(False)


@pytest.mark.parametrize("tied,scaling", [(True, None), (False, LLAMA3)])
def test_matches_the_torch_model_on_fresh_weights(tied, scaling):
    cfg = tiny(tied, scaling)
    tm = torch_model(cfg, seed=int(tied))
    jm = from_state(cfg, {k: v.numpy() for k, v in tm.state_dict().items()})
    rs = np.random.default_rng(0)
    tokens = rs.integers(0, cfg.vocab_size, (3, 9))
    pos = rs.integers(0, 20, (3, 1)) + np.arange(9)[None]  # each row at its own offset
    with torch.inference_mode():
        z_t = tm(torch.tensor(tokens), torch.tensor(pos), tm.new_cache(3, 40), 40).numpy()
        cache = tm.new_cache(3, 40)
        tm(torch.tensor(tokens[:, :5]), torch.tensor(pos[:, :5]), cache, 40)
        step_t = tm(torch.tensor(tokens[:, 5:]), torch.tensor(pos[:, 5:]), cache, 40).numpy()
    z_j, _ = jm(jnp.asarray(tokens), jnp.asarray(pos), jm.new_cache(3, 40))
    _, cache = jm(jnp.asarray(tokens[:, :5]), jnp.asarray(pos[:, :5]), jm.new_cache(3, 40), logits=False)
    step_j, _ = jm(jnp.asarray(tokens[:, 5:]), jnp.asarray(pos[:, 5:]), cache)
    for a, b in ((z_j, z_t), (step_j, step_t)):
        assert np.abs(np.asarray(a) - b).max() / np.abs(b).max() < 1e-5


def test_skipping_layers_matches_the_torch_model():
    cfg = tiny(True, None)
    tm = torch_model(cfg, seed=3)
    jm = from_state(cfg, {k: v.numpy() for k, v in tm.state_dict().items()})
    tokens, pos = np.arange(6)[None] + 5, np.arange(6)[None]
    with torch.inference_mode():
        z_t = tm(torch.tensor(tokens), torch.tensor(pos), tm.new_cache(1, 8), 8, skip=frozenset({1})).numpy()
    z_j, _ = jm(jnp.asarray(tokens), jnp.asarray(pos), jm.new_cache(1, 8), skip=frozenset({1}))
    z_all, _ = jm(jnp.asarray(tokens), jnp.asarray(pos), jm.new_cache(1, 8))
    assert np.abs(np.asarray(z_j) - z_t).max() / np.abs(z_t).max() < 1e-5
    assert np.abs(np.asarray(z_all) - z_t).max() > 1e-3  # skipping really changes the output


def test_rollback_is_free_stale_slots_are_never_read():
    """Write garbage past a row's position, then rescore: logits equal a clean cache's."""
    cfg = tiny(False, LLAMA3)
    jm = JaxLlama(cfg, rngs=__import__("flax").nnx.Rngs(1))
    tokens = jnp.arange(8)[None] + 3
    clean, _ = jm(tokens[:, :6], jnp.arange(6)[None], jm.new_cache(1, 16))
    _, dirty = jm(jnp.full((1, 8), 7), jnp.arange(8)[None], jm.new_cache(1, 16), logits=False)
    _, dirty = jm(tokens[:, :4], jnp.arange(4)[None], dirty, logits=False)  # slots 4..7 stale
    again, _ = jm(tokens[:, 4:6], jnp.arange(4, 6)[None], dirty)
    np.testing.assert_allclose(np.asarray(again[0]), np.asarray(clean[0, 4:6]), rtol=1e-5, atol=1e-5)


def test_random_model_is_built_on_the_device_in_the_requested_dtype():
    cfg = tiny(False, None)
    m = random_model(cfg, dtype=jnp.bfloat16, seed=0)
    assert m.qkv.get_value().shape == (3, (4 + 2 * 2) * 16, 64) and m.qkv.get_value().dtype == jnp.bfloat16
    assert 0.01 < float(jnp.std(m.down.get_value().astype(jnp.float32))) < 0.03
    z, _ = m(jnp.zeros((1, 2), jnp.int32), jnp.arange(2)[None], m.new_cache(1, 4))
    assert z.shape == (1, 2, cfg.vocab_size) and bool(jnp.isfinite(z).all())


def test_weights_that_do_not_fit_are_a_clear_error():
    cfg = tiny(True, None)
    state = {k: v.numpy() for k, v in torch_model(cfg, 0).state_dict().items()}
    del state["layers.1.qkv.weight"]
    with pytest.raises(ValueError, match="layers.1.qkv.weight"):
        from_state(cfg, state)


def test_a_hugging_face_directory_loads_as_the_torch_backend_reads_it(tmp_path):
    """HF layout (q/k/v, gate/up apart) fused by the core in NumPy: the same weights as torch's loader."""
    transformers = pytest.importorskip("transformers")
    from flashspec_jax.weights import load as jax_load
    from flashspec_torch.weights import load_directory

    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(3)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    jm, tm = jax_load(str(tmp_path)).model, load_directory(tmp_path).model
    for i in range(2):
        assert np.array_equal(np.asarray(jm.qkv.get_value()[i]), tm.layers[i].qkv.weight.numpy())
        assert np.array_equal(np.asarray(jm.gate_up.get_value()[i]), tm.layers[i].gate_up.weight.numpy())
    assert np.array_equal(np.asarray(jm.lm_head.get_value()), tm.lm_head.weight.numpy())



GEMMA3ISH = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
                 head_dim=16, qk_norm=True, sliding_windows=(3, 0, 3, 0), local_rope_theta=1000.0, attn_softcap=30.0,
                 final_softcap=20.0, norm_offset=1.0, activation="gelu_tanh", sandwich_norms=True, embed_scale=8.0,
                 attention_bias=True, o_bias=True, mlp_bias=True)


@pytest.mark.parametrize("skip", [frozenset(), frozenset({1, 2})], ids=["all", "skip12"])
def test_unrolled_layers_compute_what_the_scan_computes(skip):
    """The Python loop over the layers (the GPU's) against the lax.scan (the CPU's), on a config
    with every per-layer feature (sliding windows, local RoPE, biases, norms, softcaps), in two
    passes through the cache."""
    from flax import nnx

    m = JaxLlama(LlamaConfig(**GEMMA3ISH), rngs=nnx.Rngs(4), std=0.2)
    forward = nnx.jit(lambda m, x, p, cache: m(x, p, cache, skip=skip))
    tokens, pos = jnp.arange(14).reshape(2, 7) % 97, jnp.array([[0], [5]]) + jnp.arange(7)[None]
    outs = []
    for scan in (True, False):
        m.scan_layers = scan
        z1, cache = forward(m, tokens[:, :5], pos[:, :5], m.new_cache(2, 16))
        z2, cache = forward(m, tokens[:, 5:], pos[:, 5:], cache)
        outs.append((z1, z2, cache.k, cache.v))
    for a, b in zip(*outs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(outs[0][1]).max()) > 0.1  # not trivially zero


def test_unrolled_layers_keep_the_streams_the_scan_keeps():
    """``hidden=`` (a draft head's features) from both loops: the same streams, in the order asked."""
    from flax import nnx

    m = JaxLlama(LlamaConfig(**GEMMA3ISH), rngs=nnx.Rngs(5), std=0.2)
    forward = nnx.jit(lambda m, x, p, cache: m(x, p, cache, hidden=(3, 0)))
    tokens, pos = jnp.arange(10).reshape(2, 5) % 97, jnp.arange(5)[None].repeat(2, 0)
    feats = []
    for scan in (True, False):
        m.scan_layers = scan
        z, _, f = forward(m, tokens, pos, m.new_cache(2, 8))
        feats.append(np.asarray(f))
    assert feats[0].shape == (2, 5, 2 * GEMMA3ISH["hidden_size"])
    np.testing.assert_allclose(feats[0], feats[1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(feats[0][..., :64], feats[0][..., 64:])  # two different layers' streams


def test_the_unrolled_forward_exports_for_cuda_with_static_slices_only():
    """The GPU's loop (scan_layers=False) lowers for CUDA on this CPU: no while loop and no
    dynamic slice of a weight (the scan's copy of each layer's weights on the GPU), one dot per
    product per layer; the scan has the while loop."""
    from flax import nnx

    cfg = tiny(False, None)

    def exported(scan: bool) -> str:
        m = nnx.eval_shape(lambda: JaxLlama(cfg, dtype=jnp.bfloat16, scan_layers=scan))
        graphdef, params = nnx.split(m)
        cache = jax.eval_shape(lambda: m.new_cache(2, 64))
        x = jax.ShapeDtypeStruct((2, 1), jnp.int32)
        f = jax.jit(lambda p, x, pos, cache: nnx.merge(graphdef, p)(x, pos, cache))
        return jax.export.export(f, platforms=["cuda"])(params, x, x, cache).mlir_module()

    unrolled, scanned = exported(False), exported(True)
    assert "stablehlo.while" not in unrolled and "stablehlo.dynamic_slice" not in unrolled
    assert unrolled.count("stablehlo.dot_general") == cfg.num_layers * 6 + 1  # 4 products + 2 attention, LM head
    assert "stablehlo.while" in scanned


def test_the_default_loop_by_platform_and_layer_size(monkeypatch):
    """scan_layers None: the scan on the CPU; on a GPU the scan for layers under
    SCAN_BELOW_BYTES and unrolled above; an explicit scan_layers wins."""
    from flax import nnx

    from flashspec_jax.model import SCAN_BELOW_BYTES

    small = nnx.eval_shape(lambda: JaxLlama(tiny(False, None), dtype=jnp.bfloat16))
    wide = LlamaConfig(vocab_size=97, hidden_size=2048, intermediate_size=5632, num_layers=1, num_heads=32,
                       num_kv_heads=4, head_dim=64)  # TinyLlama's layer: 88 MB in bf16
    big = nnx.eval_shape(lambda: JaxLlama(wide, dtype=jnp.bfloat16))
    assert small.uses_scan() and big.uses_scan()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert small.uses_scan() and not big.uses_scan()
    assert 2 * 2048 * 5632 * 3 > SCAN_BELOW_BYTES
    big.scan_layers, small.scan_layers = True, False
    assert big.uses_scan() and not small.uses_scan()
