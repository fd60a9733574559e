"""The fused layer kernels against their plain torch references, on fresh random inputs."""

import pytest
import torch

from flashspec_torch import layers
from flashspec_torch.device import interpreting
from flashspec_torch.model import Llama, LlamaConfig


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("rows,c,with_d", [(1, 576, True), (7, 100, True), (5, 64, False)])
def test_add_rms_norm_matches_reference(rows, c, with_d):
    h, d, w = rand(rows, c, seed=rows), rand(rows, c, seed=c) if with_d else None, rand(c, seed=3)
    want_h, want_y = layers.add_rms_norm(h.clone(), d, w, 1e-5, impl="reference")
    got_h, got_y = layers.add_rms_norm(h.clone(), d, w, 1e-5, impl="triton")
    torch.testing.assert_close(got_h, want_h, rtol=0, atol=0)
    torch.testing.assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b,t,heads,kv_heads,d", [(1, 1, 3, 1, 8), (2, 5, 4, 2, 16)])
def test_rope_kv_matches_reference(b, t, heads, kv_heads, d):
    s = 12
    qkv = rand(b, t, (heads + 2 * kv_heads) * d, seed=t)
    angles = rand(b, t, d // 2, seed=1)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    positions = torch.stack([torch.randperm(s, generator=torch.Generator().manual_seed(i))[:t] for i in range(b)])
    caches = {impl: (rand(b, kv_heads, s, d, seed=5), rand(b, kv_heads, s, d, seed=6)) for impl in layers.IMPLS}
    q = {impl: layers.rope_kv(qkv, cos, sin, positions, *caches[impl], heads, kv_heads, impl=impl) for impl in layers.IMPLS}
    torch.testing.assert_close(q["triton"], q["reference"], rtol=1e-6, atol=1e-6)
    for got, want in zip(caches["triton"], caches["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,i", [(1, 1536), (3, 37)])
def test_silu_mul_matches_reference(rows, i):
    gu = rand(rows, 2 * i, seed=i) * 3
    torch.testing.assert_close(layers.silu_mul(gu, impl="triton"), layers.silu_mul(gu, impl="reference"), rtol=1e-6, atol=1e-6)


def test_a_broken_kernel_would_be_caught():
    """The comparisons above have power: a norm without its weight differs visibly."""
    h, w = rand(3, 64, seed=0), rand(64, seed=1) + 2
    _, y = layers.add_rms_norm(h.clone(), None, w, 1e-5, impl="triton")
    _, unweighted = layers.add_rms_norm(h.clone(), None, torch.ones(64), 1e-5, impl="reference")
    assert not torch.allclose(y, unweighted, atol=1e-3)


def test_model_forward_fused_equals_reference():
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=64, tie_word_embeddings=True)  # head_dim 64: the attention kernel runs
    torch.manual_seed(0)
    model = Llama(cfg).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    tokens = torch.randint(0, 97, (2, 6))
    positions = torch.arange(6)[None].expand(2, -1)
    out = {}
    for impl in layers.IMPLS:
        model.impl = impl
        cache = model.new_cache(2, 16)
        with torch.inference_mode():
            first = model(tokens[:, :4], positions[:, :4], cache, 4)  # prefill 4, then decode 2: the kernel both times
            out[impl] = (first, model(tokens[:, 4:], positions[:, 4:], cache, 6), cache.k.clone())
    for got, want in zip(out["triton"], out["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl="):
        layers.check_impl("cuda", torch.device("cpu"))


def test_layer_kernels_compile_for_sm90():
    """GPU compile errors show up without a GPU (triton.compile for sm_90)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_layers_sm90.py")
    out = subprocess.run([sys.executable, str(script), "layers"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert out.stdout.count("ok ") == 38, out.stdout  # 3 dtypes x (6 kernels + 5 with PDL) + 5 step kernels


@pytest.mark.parametrize("b,t,heads,kv_heads,d,s", [(1, 1, 8, 2, 64, 70), (2, 5, 4, 4, 64, 33), (2, 3, 9, 3, 64, 128)])
def test_decode_attention_matches_sdpa(b, t, heads, kv_heads, d, s):
    q = rand(b, heads, t, d, seed=t)
    k, v = rand(b, kv_heads, s + 7, d, seed=1), rand(b, kv_heads, s + 7, d, seed=2)
    positions = torch.stack([torch.arange(t) + int(x) for x in torch.randint(0, s - t + 1, (b,), generator=torch.Generator().manual_seed(b))])
    mask = torch.arange(s)[None, None, None, :] <= positions[:, None, :, None]
    want = layers.attention(q, k, v, positions, mask, kv_heads, impl="reference")
    got = layers.attention(q, k, v, positions, mask, kv_heads, impl="triton")
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (5, 33, 300), (18, 16, 16)])
def test_skinny_linear_matches_f_linear(m, n, k):
    x, w = rand(m, k, seed=m), rand(n, k, seed=n)
    torch.testing.assert_close(layers.skinny_linear(x, w, block_n=16, block_k=64), torch.nn.functional.linear(x, w),
                               rtol=1e-5, atol=1e-4)


def layout_model(tie: bool) -> Llama:
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, max_position_embeddings=64, tie_word_embeddings=tie)
    torch.manual_seed(1)
    m = Llama(cfg).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


def projections(m: torch.nn.Module) -> list[torch.nn.Linear]:
    return [x for x in m.modules() if type(x) is torch.nn.Linear]


@pytest.mark.parametrize("tie", [False, True])
def test_lay_out_keeps_values_ties_and_products(tie):
    """K-major storage changes neither a weight's values nor F.linear's results (to float32 rounding), and
    a tied LM head stays the embedding's Parameter; laying it out back gives row-major storage."""
    m = layout_model(tie)
    before = {name: p.detach().clone() for name, p in m.named_parameters()}
    x = rand(5, 32, seed=2)
    want = [torch.nn.functional.linear(x if lin.in_features == 32 else rand(5, 48, seed=3), lin.weight)
            for lin in projections(m)]
    layers.lay_out(m, True)
    assert all(layers.is_k_major(lin.weight) and not lin.weight.is_contiguous() for lin in projections(m))
    assert (m.lm_head.weight is m.embed.weight) == tie
    for name, p in m.named_parameters():
        assert torch.equal(p, before[name]), name
    got = [torch.nn.functional.linear(x if lin.in_features == 32 else rand(5, 48, seed=3), lin.weight)
           for lin in projections(m)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    layers.lay_out(m, False)
    assert all(lin.weight.is_contiguous() for lin in projections(m))


def test_cpu_forward_reads_k_major_weights_and_gives_the_same_logits():
    """The first float32 CPU forward lays the projections out K-major (``Llama.settle_layout``) and the
    logits equal those of row-major weights; a forward whose products are kernels (the batch-invariant
    mode, interpreted) lays them out row-major again, which its kernels require."""
    m = layout_model(tie=True)
    tokens, positions = torch.tensor([[3, 7, 9, 1]]), torch.arange(4)[None]
    m.linear_impl = "triton"  # float32 on the CPU: F.linear too, but not the setting that reads K-major
    want = m(tokens, positions, m.new_cache(1, 8), 4)
    assert all(lin.weight.is_contiguous() for lin in projections(m))
    m.linear_impl = None
    got = m(tokens, positions, m.new_cache(1, 8), 4)
    assert all(layers.is_k_major(lin.weight) for lin in projections(m))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if not interpreting():
        pytest.skip("the batch-invariant forward runs its Triton kernels: TRITON_INTERPRET=1")
    m.batch_invariant = True
    inv = m(tokens, positions, m.new_cache(1, 8), 4)
    assert all(lin.weight.is_contiguous() for lin in projections(m))
    torch.testing.assert_close(inv, want, rtol=1e-4, atol=1e-4)


def test_pdl_only_where_the_gpu_has_it(monkeypatch):
    """pdl=True launches with programmatic dependent launch only on compute capability 9.0+ (an
    older GPU would fail to compile it), never on the CPU or in the interpreter."""
    from types import SimpleNamespace

    from flashspec_torch import device, layers

    gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(device, "interpreting", lambda: False)
    for capable in (True, False):
        monkeypatch.setattr(device, "has_pdl", lambda index, capable=capable: capable)
        assert layers.pdl_on(True, gpu) is capable
        assert layers.pdl_on(False, gpu) is False
    assert layers.pdl_on(True, torch.zeros(1)) is False  # a CPU tensor
