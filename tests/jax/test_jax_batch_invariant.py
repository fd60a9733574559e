"""Batch-invariant mode of the JAX engine (docs/batch_invariance.md, "JAX"), on the CPU with the
Pallas kernels interpreted: each kernel against its jnp reference on fresh random inputs; a row's
bits alone and inside batches of 3, 8 and 17 (a mutant that picks the chunk of K by the batch
fails that check); the kernels lower to Triton for CUDA; the engine's greedy tokens alone, in a
batch and through n-gram speculation."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec_jax.kernels.attention import attention_reference  # noqa: E402
from flashspec_jax.kernels.invariant_attention import invariant_attention  # noqa: E402
from flashspec_jax.kernels.invariant_matmul import invariant_matmul, invariant_matmul_reference  # noqa: E402
from flashspec_jax.kernels.invariant_norm import invariant_rms_norm, invariant_rms_norm_reference  # noqa: E402

DTYPES = [jnp.float32, jnp.bfloat16]
TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")  # JAX 0.10 and 0.11 custom calls


def normal(seed: int, shape, dtype, scale: float = 1.0) -> jax.Array:
    return (scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)).astype(dtype)


def rows_hold(f, x: jax.Array) -> list[str]:
    """Where f (rows [M, ...] -> [M, ...]) gives a row other bits than inside the batch of all of x's
    17 rows: batches 1 (row 5 alone), 3, 8 (rows 9-16, at other places than in the 17)."""
    full = np.asarray(f(x))
    bad = []
    for lo, hi in ((5, 6), (0, 3), (9, 17)):
        if not np.array_equal(np.asarray(f(x[lo:hi])), full[lo:hi]):
            bad.append(f"rows {lo}:{hi}")
    return bad


@pytest.mark.parametrize("dtype", DTYPES)
def test_product_matches_its_reference_and_a_rows_bits_hold_in_any_batch(dtype):
    x, w = normal(0, (17, 200), dtype), normal(1, (72, 200), dtype)  # K: one chunk and a masked one
    y = invariant_matmul(x, w, interpret=True)
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y), np.asarray(invariant_matmul_reference(x, w)))
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    np.testing.assert_allclose(np.asarray(y, np.float64), exact, rtol=0, atol=1e-4 if dtype == jnp.float32 else 0.2)
    assert rows_hold(lambda a: invariant_matmul(a, w, interpret=True), x) == []


def test_a_mutant_that_picks_the_chunk_of_k_by_the_batch_fails_the_check():
    x, w = normal(2, (17, 256), jnp.float32), normal(3, (40, 256), jnp.float32)

    def mutant(a):  # split-K by batch size: chunks of 128 alone, of 64 in a batch
        return invariant_matmul_reference(a, w, block_k=128 if a.shape[0] == 1 else 64)

    assert rows_hold(lambda a: invariant_matmul_reference(a, w), x) == []
    assert "rows 5:6" in rows_hold(mutant, x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_its_reference_and_a_rows_bits_hold_in_any_batch(dtype):
    x, weight = normal(4, (17, 72), dtype), (1 + normal(5, (72,), jnp.float32, 0.1)).astype(dtype)
    y = invariant_rms_norm(x, weight, 1e-5, interpret=True)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(invariant_rms_norm_reference(x, weight, 1e-5)))
    assert rows_hold(lambda a: invariant_rms_norm(a, weight, 1e-5, interpret=True), x) == []


def test_attention_is_the_reference_and_a_querys_bits_follow_neither_batch_nor_t_nor_cache_length():
    dtype = jnp.float32
    layers, b, kv_heads, slots, d, heads, t = 2, 5, 2, 300, 16, 6, 3  # two splits of 256 slots
    k, v = normal(6, (layers, b, kv_heads, slots, d), dtype), normal(7, (layers, b, kv_heads, slots, d), dtype)
    q = normal(8, (b, t, heads, d), dtype)
    pos = jnp.array([[3, 4, 5], [100, 101, 102], [254, 255, 256], [280, 281, 282], [0, 1, 2]])
    out = np.asarray(invariant_attention(q, k, v, 1, pos, interpret=True))  # [B, T, H, D]
    f32 = jnp.float32
    mask = jnp.arange(slots)[None, None, :] <= pos[:, :, None]
    ref = attention_reference(q.astype(f32), k[1].astype(f32), v[1].astype(f32), mask)
    np.testing.assert_allclose(out, np.asarray(ref), atol=1e-6)
    for row, tok, cache in ((3, 1, slots), (2, 1, 256)):  # alone, T = 1; one split of a shorter cache
        alone = invariant_attention(q[row : row + 1, tok : tok + 1], k[:, row : row + 1, :, :cache],
                                    v[:, row : row + 1, :, :cache], 1, pos[row : row + 1, tok : tok + 1], interpret=True)
        np.testing.assert_array_equal(np.asarray(alone)[0, 0], out[row, tok])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernels_lower_to_triton_for_cuda(dtype):
    spec = jax.ShapeDtypeStruct
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]

    def triton_calls(f, *args) -> int:
        text = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
        return sum(text.count(name) for name in TRITON_CALLS)

    assert triton_calls(lambda x, w: invariant_matmul(x, w), spec((5, 576), dtype), spec((1536, 576), dtype)) == 1
    assert triton_calls(lambda x, w: invariant_rms_norm(x, w, 1e-5), spec((5, 576), dtype), spec((576,), dtype)) == 1
    cache = spec((22, 4, 4, 600, 64), dtype)
    assert triton_calls(lambda q, k, v, p: invariant_attention(q, k, v, 3, p), spec((4, 5, 32, 64), dtype), cache, cache,
                        spec((4, 5), jnp.int32)) == 1


@pytest.mark.parametrize("scan", [True, False])
def test_the_invariant_forward_lowers_to_triton_for_cuda(scan, monkeypatch):
    """The whole forward in batch-invariant mode, as on a GPU (the kernels not interpreted), exported for
    CUDA through the scan (the layer a traced index into the kernels) and the unrolled loop."""
    from flax import nnx

    import flashspec_jax.model as model_module
    from flashspec_jax.model import Llama, LlamaConfig

    monkeypatch.setattr(model_module, "on_gpu", lambda: True)
    m = nnx.eval_shape(lambda: Llama(LlamaConfig(**TINY), dtype=jnp.bfloat16))  # shapes only
    m.batch_invariant, m.scan_layers = True, scan
    graph, state = nnx.split(m)

    def forward(state, tokens, pos):
        mm = nnx.merge(graph, state)
        return mm(tokens, pos, mm.new_cache(tokens.shape[0], 128))[0]

    ids = jax.ShapeDtypeStruct((4, 5), jnp.int32)
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    text = jax.export.export(jax.jit(forward), platforms=["cuda"], disabled_checks=checks)(state, ids, ids).mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) >= 3  # product, norm, attention (each jitted once per shape)
    assert "stablehlo.dot_general" not in text  # no product left to XLA


TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model():
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    m = random_model(LlamaConfig(**TINY), dtype=jnp.float32, seed=1, std=0.3)
    m.batch_invariant = True
    return m


def test_greedy_tokens_alone_in_a_batch_and_with_ngram_speculation_are_identical(model):
    from flashspec.bandits import UCB1, BanditConfig
    from flashspec.config import SamplingConfig
    from flashspec.loop import SpecConfig, decode, speculate
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    backend = JaxBackend(model, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    rs = np.random.default_rng(0)
    ps = [(rs.integers(0, 64, 3 + r % 4).tolist() * 4)[: 6 + 2 * r] for r in range(5)]  # mixed lengths
    greedy, seed = SamplingConfig(0.0), np.zeros(5, np.uint64)
    batch, _ = decode(backend, ps, sampling=greedy, max_new_tokens=10, seed=seed)
    alone, _ = decode(backend, ps[1:2], sampling=greedy, max_new_tokens=10, seed=seed[:1])
    spec, records = speculate(backend, UCB1(1, BanditConfig(objective="acceptance")), ps, sampling=greedy,
                              spec=SpecConfig(gamma=3, max_new_tokens=10), seed=seed)
    assert all(len(row) == 10 for row in batch)
    assert alone[0] == batch[1]
    assert spec == batch
    assert sum(r.accepted for r in records) > 0  # scoring passes of G + 1 rows really ran


def test_a_rows_logits_alone_are_its_bits_in_a_batch_of_17(model):
    """The forward (prefill of 6 positions) of row 5 alone over a cache of 32 slots, and inside a
    batch of 17 over 64 slots: the same logits bit for bit (the default mode on this CPU: row 5
    alone differs in float32)."""
    from flax import nnx

    graph, state = nnx.split(model)

    @jax.jit
    def logits(state, tokens, slots):
        m = nnx.merge(graph, state)
        b, t = tokens.shape
        z, _ = m(tokens, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), m.new_cache(b, slots.shape[0]))
        return z  # [B, T, V]

    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (17, 6)), jnp.int32)
    batch = np.asarray(logits(state, tokens, jnp.zeros(64)))
    np.testing.assert_array_equal(np.asarray(logits(state, tokens[5:6], jnp.zeros(32)))[0], batch[5])


def test_what_the_mode_does_not_cover_is_refused(model):
    from flax import nnx

    from flashspec_jax.model import Llama, LlamaConfig

    for fields, words in ((dict(qk_norm=True), "qk_norm"), (dict(head_dim=8), "head_dim 8")):
        m = nnx.eval_shape(lambda f=fields: Llama(LlamaConfig(**{**TINY, **f})))  # shapes only
        m.batch_invariant = True
        with pytest.raises(ValueError, match=words):
            m.attention_choice()
    model.attention_impl = "xla"
    try:
        with pytest.raises(ValueError, match="attention_impl='xla' is set"):
            model.invariant_check()
    finally:
        model.attention_impl = None
