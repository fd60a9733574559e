"""Every Triton kernel beside its reference at shapes that are not powers of two (issue #41), under the
interpreter, with a few rows each: head_dim 24, 80, 96, 112 (RoPE + KV write, attention, a whole model);
widths 960 and 2560 (add + RMSNorm, SiLU * mul, the skinny and the fused products); vocabularies 49153 and
151936 (verify, greedy_next). tests/torch/compile_odd_shapes_sm90.py compiles the same launches for sm_90."""

import pytest
import torch
from benchmark_modules import load_benchmark

from flashspec_torch import gemv as G
from flashspec_torch import layers
from flashspec_torch.backend import greedy_next_reference, greedy_next_triton
from flashspec_torch.model import Llama, LlamaConfig
from flashspec_torch.verify import verify

HEAD_DIMS = (24, 80, 96, 112)
WIDTHS = (960, 2560)
VOCABS = (49153, 151936)


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("d", HEAD_DIMS + (256,))  # 256: the attention kernel's largest, 32-slot tiles
def test_rope_kv_and_attention_at_odd_head_dims(d):
    b, t, heads, kv_heads, s = 2, 3, 4, 2, 70  # 70 slots: two of the attention kernel's slot tiles at d > 64
    qkv = rand(b, t, (heads + 2 * kv_heads) * d, seed=d)
    angles = rand(b, t, d // 2, seed=1)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    positions = torch.tensor([[40, 41, 42], [66, 67, 68]])
    caches = {impl: (rand(b, kv_heads, s, d, seed=5), rand(b, kv_heads, s, d, seed=6)) for impl in layers.IMPLS}
    q = {impl: layers.rope_kv(qkv, cos, sin, positions, *caches[impl], heads, kv_heads, impl=impl) for impl in layers.IMPLS}
    torch.testing.assert_close(q["triton"], q["reference"], rtol=1e-6, atol=1e-6)
    for got, want in zip(caches["triton"], caches["reference"]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # every slot: written ones and the untouched rest
    assert layers.kernel_attends("triton", heads, kv_heads, t, d)
    k, v = caches["triton"]
    mask = torch.arange(s)[None, None, None, :] <= positions[:, None, :, None]
    want = layers.attention(q["reference"], k, v, positions, mask, kv_heads, impl="reference")
    got = layers.attention(q["triton"], k, v, positions, None, kv_heads, impl="triton", attend_len=s)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("c", WIDTHS)
def test_add_rms_norm_and_silu_mul_at_odd_widths(c):
    h, d, w = rand(3, c, seed=c), rand(3, c, seed=1), rand(c, seed=2)
    want_h, want_y = layers.add_rms_norm(h.clone(), d, w, 1e-5, impl="reference")
    got_h, got_y = layers.add_rms_norm(h.clone(), d, w, 1e-5, impl="triton")
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=0)
    torch.testing.assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
    gu = rand(2, 2 * c, seed=3) * 3
    torch.testing.assert_close(layers.silu_mul(gu, impl="triton"), layers.silu_mul(gu, impl="reference"),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", WIDTHS)
def test_products_at_odd_widths(k):
    """The skinny product with its production tiling, and the three fused products with their default configs
    (gemv_config: K = 960 leaves a partial last chunk), K = the width, a few odd N."""
    x, w = rand(3, k, seed=k), rand(37, k, seed=1)
    torch.testing.assert_close(layers.skinny_linear(x, w, *layers.skinny_tiling(37, k)), torch.nn.functional.linear(x, w),
                               rtol=1e-5, atol=1e-4)
    scale = lambda y: 1e-5 * y.abs().max().item()  # noqa: E731  (fp32: the K products summed in another order)
    want = G.gemv_reference(x, w)
    torch.testing.assert_close(G.gemv(x, w), want, rtol=0, atol=scale(want))
    g, d = rand(k, seed=2), rand(3, k, seed=3)
    y, hn = G.gemv_add_rms_norm(x, d, g, 1e-5, w)
    want_y, want_hn = G.gemv_add_rms_norm_reference(x, d, g, 1e-5, w)
    assert torch.equal(hn, want_hn)
    torch.testing.assert_close(y, want_y, rtol=0, atol=scale(want_y))
    gu, w_down = rand(2, 2 * k, seed=4), rand(19, k, seed=5)
    want = G.gemv_silu_mul_reference(gu, w_down)
    torch.testing.assert_close(G.gemv_silu_mul(gu, w_down), want, rtol=0, atol=scale(want))


@pytest.mark.parametrize("v", VOCABS)
def test_verify_and_greedy_next_at_odd_vocabularies(v):
    """Both verify launches (the fused one, and stats + final over V split into 7 chunks, the last one partial),
    sampled with draft logits and greedy, against the plain-torch reference; greedy_next against torch.argmax."""
    from flashspec_torch.kernel_config import KernelConfig

    small = v < 100_000  # the interpreter's time grows with B G V: G = 1 at the largest vocabulary
    b, g = (1, 2) if small else (1, 1)
    z, w = rand(b, g + 1, v, seed=v) * 4, rand(b, g, v, seed=1) * 4
    x = torch.stack([torch.argmax(z[:, i], -1) if i == 0 else torch.randint(0, v, (b,)) for i in range(g)], 1)
    split = KernelConfig(block_b=1, block_v=4096, sweep_v=4096, num_chunks=7, sweep_slots=4)
    for kwargs, configs in ((dict(draft_logits=w, temperature=0.7), (None, split) if small else (split,)), (dict(temperature=0.0), (split,))):
        want = verify(z, x, seed=3, offset=1, impl="reference", **kwargs)
        for config in configs:
            got = verify(z, x, seed=3, offset=1, impl="triton", config=config, **kwargs)
            assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.tokens, want.tokens), (kwargs, config)
    bad_ref, bad = torch.zeros(b, dtype=torch.uint8), torch.zeros(b, dtype=torch.uint8)
    ref, got = greedy_next_reference(z[:, 0], bad_ref), greedy_next_triton(z[:, 0], bad)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(bad, bad_ref)


def test_model_at_an_odd_shape_fused_equals_reference():
    """A whole forward (prefill 4, then decode 2) at head_dim 24, hidden 96, intermediate 160, vocabulary 131 with
    every layer kernel and the fused products (impl triton, linear_impl fused), against the plain torch forward."""
    cfg = LlamaConfig(vocab_size=131, hidden_size=96, intermediate_size=160, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=24, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Llama(cfg).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    tokens = torch.randint(0, cfg.vocab_size, (2, 6))
    positions = torch.arange(6)[None].expand(2, -1)
    out = {}
    for impl, linear_impl in (("reference", "reference"), ("triton", "fused")):
        model.impl, model.linear_impl = impl, linear_impl
        cache = model.new_cache(2, 16)
        with torch.inference_mode():
            first = model(tokens[:, :4], positions[:, :4], cache, 4)
            out[impl] = (first, model(tokens[:, 4:], positions[:, 4:], cache, 6), cache.k.clone())
    for got, want in zip(out["triton"], out["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_odd_shape_launches_compile_for_sm90():
    """compile_odd_shapes_sm90.py (its ci set): what the launchers launch on an H100 at the odd shapes compiles
    for sm_90 within its shared memory; every kernel family and every odd size is among the launches."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_odd_shapes_sm90.py")
    out = subprocess.run([sys.executable, str(script), "ci"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("ok ")]
    names = {line.split()[1] for line in lines}
    assert names == {"gemv_kernel", "add_rms_norm_kernel", "rope_kv_kernel", "decode_attention_kernel",
                     "silu_mul_kernel", "verify_stats_kernel", "verify_final_kernel", "greedy_next_kernel",
                     "invariant_matmul_kernel", "attention_merge_kernel"}, names
    for epilogue in ("swiglu", "rope_kv"):  # the batch-invariant gate_up and qkv
        assert any(line.startswith("ok invariant_matmul_kernel") and f"'EPILOGUE': '{epilogue}'" in line for line in lines)
    for d in HEAD_DIMS:
        assert any(line.startswith("ok decode_attention_kernel") and f"'D': {d}," in line for line in lines), d
    for k in WIDTHS:
        assert any(line.startswith("ok gemv_kernel") and f"'K': {k}," in line for line in lines), k


@pytest.mark.parametrize("field,value,limit", [("hidden_size", 65537, "hidden_size <= 65536"),
                                               ("vocab_size", 2**30 + 1, "vocab_size <= 1073741824")])
def test_unsupported_sizes_are_refused_when_the_model_is_built(field, value, limit):
    """The bounds the kernels keep: a ValueError naming the field, its value and the supported range, raised by
    Llama() (a load builds one), not a compiler traceback at the first step. The largest supported sizes pass."""
    sizes = dict(vocab_size=131, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                 head_dim=32)
    with torch.device("meta"):
        Llama(LlamaConfig(**{**sizes, field: value - 1}))
        with pytest.raises(ValueError, match=f"{field}={value} is not supported.*{limit}"):
            Llama(LlamaConfig(**{**sizes, field: value}))
    with pytest.raises(ValueError, match="V .* is not supported"):
        verify(torch.empty((1, 2, 2**30 + 1), device="meta"), torch.zeros((1, 1), dtype=torch.int64, device="meta"))


def test_the_gpu_script_reports_the_first_mismatch():
    """benchmarks/odd_shapes_gpu.py's comparison (its GPU run is the lead's; its CPU run only checks plumbing)."""
    compare = load_benchmark("odd_shapes_gpu").compare
    assert compare([[1, 2], [3, 4]], [[1, 2], [3, 4]]) == dict(equal=True, first_mismatch=None)
    got = compare([[1, 2], [3, 5, 6]], [[1, 2], [3, 4, 6]], [[0.5, 0.5], [0.1, 2e-7, 0.3]])
    assert got == dict(equal=False, first_mismatch=dict(prompt=1, index=1, got=5, want=4, reference_top2_gap=2e-7))
    assert not compare([[1, 2]], [[1, 2, 3]])["equal"]
