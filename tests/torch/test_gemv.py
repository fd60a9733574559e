"""The fused skinny products (flashspec_torch.gemv) against their plain torch references.

Under the interpreter bf16 rounding is not round-to-nearest-even (Triton's NumPy emulation), so
bf16 compares within one bf16 step of the reference; fp32 and fp16 round exactly like torch."""

import pytest
import torch

from flashspec_torch import gemv as G
from flashspec_torch.layers import add_rms_norm_reference

CONFIG = G.GemvConfig(block_n=8, block_k=64)


def rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def close(got, want, dtype):
    """Relative to the output's scale: the activations may differ by one step of their dtype (bf16:
    the interpreter truncates), and the K products are summed in another order."""
    scale = want.float().abs().max().item()
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}[dtype] * scale
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)


SHAPES = [(1, 40, 100), (3, 33, 130), (5, 17, 64), (8, 9, 77)]  # (M, N, K): N, K not multiples of the blocks


@pytest.mark.parametrize("preload", [1, 2, 16])  # K in 1-3 chunks: all streamed, some preloaded, all preloaded
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_plain_product_matches_f_linear(m, n, k, dtype, preload):
    x, w = rand(m, k, seed=m, dtype=dtype), rand(n, k, seed=n, dtype=dtype)
    close(G.gemv(x, w, G.GemvConfig(block_n=8, block_k=64, preload=preload)), G.gemv_reference(x, w), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_d", [True, False])
@pytest.mark.parametrize("m,n,k", SHAPES[:3])
def test_add_rms_norm_prologue_matches_reference(m, n, k, with_d, dtype):  # CONFIG: every chunk preloaded
    h, w, g = rand(1, m, k, seed=1, dtype=dtype), rand(n, k, seed=2, dtype=dtype), rand(k, seed=3, dtype=dtype)
    d = rand(1, m, k, seed=4, dtype=dtype) if with_d else None
    h_before = h.clone()
    y, hn = G.gemv_add_rms_norm(h, d, g, 1e-5, w, CONFIG)
    want_y, want_hn = G.gemv_add_rms_norm_reference(h, d, g, 1e-5, w)
    assert y.shape == (1, m, n) and hn.shape == (1, m, k)
    assert torch.equal(h, h_before)  # h is only read
    if dtype == torch.bfloat16:
        torch.testing.assert_close(hn.float(), want_hn.float(), rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(hn, want_hn)
    close(y, want_y, dtype)


def test_add_rms_norm_writes_the_residual_into_h_out():
    h, d, w, g = rand(2, 50, seed=1), rand(2, 50, seed=2), rand(20, 50, seed=3), rand(50, seed=4)
    h_out = torch.full_like(h, float("nan"))
    _, hn = G.gemv_add_rms_norm(h, d, g, 1e-5, w, CONFIG, h_out=h_out)
    assert hn is h_out and torch.equal(h_out, h + d)
    with pytest.raises(ValueError, match="h_out must not be h"):
        G.gemv_add_rms_norm(h, d, g, 1e-5, w, CONFIG, h_out=h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", SHAPES[:3])
def test_silu_mul_prologue_matches_reference(m, n, k, dtype):
    gu, w = (rand(m, 2 * k, seed=5) * 3).to(dtype), rand(n, k, seed=6, dtype=dtype)
    close(G.gemv_silu_mul(gu, w, CONFIG), G.gemv_silu_mul_reference(gu, w), dtype)


@pytest.mark.parametrize("prologue", G.PROLOGUES)
def test_streamed_chunks_after_preloaded_ones_match_the_reference(prologue):
    """K = 5.2 chunks: 1 or 2 preloaded, the rest streamed (the prologue reads chunk by chunk)."""
    m, n, k = 3, 20, 330
    w, g = rand(n, k, seed=1, dtype=torch.bfloat16), rand(k, seed=2, dtype=torch.bfloat16)
    x = rand(m, 2 * k if prologue == "silu_mul" else k, seed=3, dtype=torch.bfloat16) * 2
    d = rand(m, k, seed=4, dtype=torch.bfloat16)
    for preload in (1, 2):
        config = G.GemvConfig(block_n=8, block_k=64, preload=preload)
        if prologue == "none":
            got, want = G.gemv(x, w, config), G.gemv_reference(x, w)
        elif prologue == "silu_mul":
            got, want = G.gemv_silu_mul(x, w, config), G.gemv_silu_mul_reference(x, w)
        else:
            got, want = G.gemv_add_rms_norm(x, d, g, 1e-5, w, config)[0], G.gemv_add_rms_norm_reference(x, d, g, 1e-5, w)[0]
        close(got, want, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # float32 outputs show any change of the sum order
@pytest.mark.parametrize("prologue", G.PROLOGUES)
def test_a_row_has_the_same_bits_for_any_number_of_rows(prologue, dtype):
    """Decode (1 row) and scoring (5 rows) give row 0 bit-identically, also with another block_n
    or preload."""
    k, n = 200, 30
    w, g = rand(n, k, seed=1, dtype=dtype), rand(k, seed=2, dtype=dtype)
    five = rand(5, 2 * k if prologue == "silu_mul" else k, seed=3, dtype=dtype)
    d5 = rand(5, k, seed=4, dtype=dtype)

    def run(rows, config):
        if prologue == "none":
            return G.gemv(five[:rows], w, config)
        if prologue == "silu_mul":
            return G.gemv_silu_mul(five[:rows], w, config)
        return G.gemv_add_rms_norm(five[:rows], d5[:rows], g, 1e-5, w, config)[0]

    one = run(1, G.GemvConfig(block_n=8, block_k=64, preload=1))  # K = 200: 4 chunks
    assert torch.equal(run(5, G.GemvConfig(block_n=8, block_k=64, preload=1))[:1], one)
    assert torch.equal(run(5, G.GemvConfig(block_n=2, block_k=64, preload=3))[:1], one)
    assert torch.equal(run(3, G.GemvConfig(block_n=16, block_k=64, preload=2))[:1], one)
    assert torch.equal(run(1, G.GemvConfig(block_n=4, block_k=64, preload=4))[:1], one)  # every chunk preloaded
    assert torch.equal(run(2, G.GemvConfig(block_n=8, block_k=64, preload=16))[:1], one)  # clamped to 4


def mismatches(got, want):  # the fraction of elements that differ
    return (got != want).float().mean().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_identity_weight_shows_the_prologue_bits_and_a_wrong_rounding_point_differs(dtype):
    """w = I makes y the prologue's activations exactly (fp32 sums of one product); fp16 rounds
    like torch in the interpreter. The rms reduction order may move a rare element by one step;
    a reference that skips a rounding point (normed activations, silu) differs in many."""
    m, k = 4, 96
    eye = torch.eye(k, dtype=dtype)
    h, d, g = rand(m, k, seed=1, dtype=dtype), rand(m, k, seed=2, dtype=dtype), rand(k, seed=3, dtype=dtype)
    y, _ = G.gemv_add_rms_norm(h, d, g, 1e-5, eye, CONFIG)
    want = add_rms_norm_reference(h, d, g, 1e-5)[1]
    if dtype == torch.float16:  # fp32: F.rms_norm's own fused formula differs in the last bits
        assert mismatches(y, want) <= 0.02
    torch.testing.assert_close(y, want, rtol=2e-3 if dtype == torch.float16 else 1e-6, atol=0)
    gu = rand(m, 2 * k, seed=4, dtype=dtype) * 3
    silu = G.gemv_silu_mul(gu, eye, CONFIG)
    torch.testing.assert_close(silu, G.silu_mul_reference(gu), rtol=2e-3 if dtype == torch.float16 else 1e-6, atol=0)
    assert mismatches(silu, G.silu_mul_reference(gu)) <= (0.02 if dtype == torch.float16 else 0.5)
    if dtype == torch.float16:
        hf = (h + d).float()
        unrounded = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5) * g.float()).to(dtype)
        assert mismatches(y, unrounded) > 0.05
        gate, up = gu.float().chunk(2, -1)
        silu_unrounded = (torch.nn.functional.silu(gate) * up).to(dtype)
        assert mismatches(silu, silu_unrounded) > 0.05


def test_a_missing_residual_add_is_caught():
    m, n, k = 3, 24, 96
    h, d, w, g = (rand(*s, seed=i, dtype=torch.bfloat16) for i, s in enumerate([(m, k), (m, k), (n, k), (k,)]))
    got, _ = G.gemv_add_rms_norm(h, d, g, 1e-5, w, CONFIG)
    close(got, G.gemv_add_rms_norm_reference(h, d, g, 1e-5, w)[0], torch.bfloat16)
    with pytest.raises(AssertionError):
        close(got, G.gemv_add_rms_norm_reference(h, None, g, 1e-5, w)[0], torch.bfloat16)


def test_bad_arguments_are_clear_errors():
    x, w = rand(2, 64, seed=0), rand(16, 64, seed=1)
    with pytest.raises(ValueError, match=r"w \(16, 64\) must be a contiguous \[N, 32\]"):
        G.gemv(x[:, :32], w)
    with pytest.raises(ValueError, match="w.dtype=torch.bfloat16 must equal x.dtype"):
        G.gemv(x, w.bfloat16())
    with pytest.raises(ValueError, match="x.dtype=torch.int64 must be one of"):
        G.gemv(x.long(), w.long())
    with pytest.raises(ValueError, match="9 rows; the fused product takes at most 8"):
        G.gemv(rand(9, 64, seed=2), w)
    with pytest.raises(ValueError, match="d .* must match h"):
        G.gemv_add_rms_norm(x, x[:1], torch.ones(64), 1e-5, w)
    with pytest.raises(ValueError, match=r"g \(63,\) .* must be \[64\]"):
        G.gemv_add_rms_norm(x, None, torch.ones(63), 1e-5, w)
    with pytest.raises(ValueError, match="gu's last dimension 63 must be even"):
        G.gemv_silu_mul(rand(2, 63, seed=3), w)
    with pytest.raises(ValueError, match="w .* must be a contiguous \\[N, 32\\]"):
        G.gemv_silu_mul(x, w)  # gu [2, 64] -> K = 32
    with pytest.raises(ValueError, match="self.block_n=3 must be a power of two"):
        G.GemvConfig(block_n=3)
    with pytest.raises(ValueError, match="self.block_k=8 must be a power of two"):
        G.GemvConfig(block_k=8)
    with pytest.raises(ValueError, match="self.num_warps=3 must be one of"):
        G.GemvConfig(num_warps=3)
    with pytest.raises(ValueError, match="self.preload=0 must be in"):
        G.GemvConfig(preload=0)
    with pytest.raises(ValueError, match="self.preload=8 x block_n 16 x block_k 512 x 2 bytes exceeds"):
        G.GemvConfig(block_n=16, block_k=512, num_warps=4, preload=8)
    assert G.GemvConfig(block_n=32, block_k=1024, num_warps=2).preload == 1  # a big tile: no extra chunks
    assert G.GemvConfig(block_n=8, block_k=512).preload == 2  # 16 KB of bf16
    assert G.GemvConfig(block_n=8, block_k=256, preload=8).preload == 8  # 32 KB: allowed at 4 warps


def test_configs_are_overridable_and_block_k_does_not_depend_on_m():
    assert G.gemv_config(2560, 2048, 1).block_k == G.gemv_config(2560, 2048, 5).block_k
    assert G.gemv_config(64, 576, 1).block_k == 128  # 576 = 4.5 x 128: the last chunk wastes 64 of 640
    assert G.gemv_config(2048, 5632, 1, "silu_mul").preload == 2 and G.gemv_config(2048, 5632, 5, "silu_mul").preload == 2
    custom = G.GemvConfig(block_n=16, block_k=256, num_warps=8, num_stages=2)
    G.GEMV_CONFIGS[(2560, 2048, 1, "add_rms_norm")] = custom
    try:
        assert G.gemv_config(2560, 2048, 1, "add_rms_norm") is custom
        assert G.gemv_config(2560, 2048, 1, "none") != custom
    finally:
        del G.GEMV_CONFIGS[(2560, 2048, 1, "add_rms_norm")]


def test_gemv_kernel_compiles_for_sm90():
    """Every prologue and dtype, with and without PDL, through triton.compile for sm_90 (no GPU)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_layers_sm90.py")
    out = subprocess.run([sys.executable, str(script), "gemv"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert out.stdout.count("ok gemv_kernel") == 40, out.stdout  # (3 dtypes + 2 bf16 preloads) x 4 prologue variants x PDL on/off


def tiny_llama(dtype, seed=0):
    from flashspec_torch.model import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=80, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Llama(cfg).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3)
    return model.to(dtype)


def test_fused_model_logits_match_the_reference_model(monkeypatch):
    """bf16: prefill 6 tokens, decode 1, score 4 (all <= 8 rows: the fused path), then a 10-token
    prefill that falls back to cuBLAS."""
    calls = []
    real = G.gemv_silu_mul
    monkeypatch.setattr(G, "gemv_silu_mul", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    model = tiny_llama(torch.bfloat16)
    tokens = torch.randint(0, 97, (1, 11), generator=torch.Generator().manual_seed(0))
    out = {}
    for linear_impl in ("reference", "fused"):
        model.linear_impl = linear_impl
        cache = model.new_cache(1, 16)
        with torch.inference_mode():
            prefill = model(tokens[:, :6], torch.arange(6)[None], cache, 6)
            decode = model(tokens[:, 6:7], torch.tensor([[6]]), cache, 7)
            score = model(tokens[:, 7:11], torch.arange(7, 11)[None], cache, 11)
            long = model(tokens[:, :10], torch.arange(10)[None], model.new_cache(1, 16), 10)
        out[linear_impl] = (prefill, decode, score, cache.k.float().clone(), long)
    for got, want in zip(out["fused"], out["reference"]):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=0.05 * scale)
    assert len(calls) == 3 * 2  # the fused path ran: three forwards, two layers


def greedy_tokens(model, steps: int) -> torch.Tensor:  # [2, steps]: greedy continuations of two 3-token prompts
    cache = model.new_cache(2, 16)
    tokens = torch.tensor([[5, 9, 11], [7, 1, 2]])
    with torch.inference_mode():
        logits = model(tokens, torch.arange(3).expand(2, -1), cache, 3, logits_last=1)
        seq = []
        for pos in range(3, 3 + steps):
            nxt = logits[:, -1].argmax(-1)
            seq.append(nxt)
            logits = model(nxt[:, None], torch.full((2, 1), pos), cache, pos + 1)
    return torch.stack(seq, 1)


def test_fused_model_generates_the_same_greedy_tokens():
    model = tiny_llama(torch.float32, seed=1)
    runs = {}
    for linear_impl in ("reference", "fused"):
        model.linear_impl = linear_impl
        runs[linear_impl] = greedy_tokens(model, 7)
    assert torch.equal(runs["fused"], runs["reference"]), runs


def test_unknown_linear_impl_is_refused():
    model = tiny_llama(torch.float32)
    model.linear_impl = "cublas"
    with pytest.raises(ValueError, match="linear_impl='cublas' must be one of"):
        model(torch.tensor([[1]]), torch.tensor([[0]]), model.new_cache(1, 4), 1)


SUBSETS = [frozenset({"qkv", "down"}), frozenset({"o", "down", "lm_head"}), frozenset({"gate_up"}), frozenset()]


def count_fused_calls(monkeypatch) -> dict:
    calls = {"gemv": 0, "gemv_add_rms_norm": 0, "gemv_silu_mul": 0}
    for name in calls:
        real = getattr(G, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(G, name, counted)
    return calls


@pytest.mark.parametrize("impl", ["reference", "triton"])  # the layer kernels in torch, or Triton (in place h)
@pytest.mark.parametrize("subset", SUBSETS, ids=lambda s: "+".join(sorted(s)) or "none")
def test_a_fused_subset_matches_the_reference_model(monkeypatch, subset, impl):
    """bf16 prefill 6 + decode 1 with only `subset` fused (the rest cuBLAS after the separate norm /
    SwiGLU): logits and the cache match the reference, and exactly the subset's products ran."""
    model = tiny_llama(torch.bfloat16)
    model.impl = impl
    tokens = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(0))
    out = {}
    for linear_impl in ("reference", "fused"):
        model.linear_impl = linear_impl
        model.fused = subset if linear_impl == "fused" else frozenset({"qkv", "o", "gate_up", "down", "lm_head"})
        calls = count_fused_calls(monkeypatch)
        cache = model.new_cache(1, 16)
        with torch.inference_mode():
            prefill = model(tokens[:, :6], torch.arange(6)[None], cache, 6)
            decode = model(tokens[:, 6:7], torch.tensor([[6]]), cache, 7)
        out[linear_impl] = (prefill, decode, cache.k.float().clone(), cache.v.float().clone())
        monkeypatch.undo()
    for got, want in zip(out["fused"], out["reference"]):
        torch.testing.assert_close(got, want, rtol=0, atol=0.05 * want.abs().max().item())
    forwards, layers = 2, 2
    assert calls["gemv"] == forwards * layers * ("o" in subset)
    assert calls["gemv_silu_mul"] == forwards * layers * ("down" in subset)
    norms = layers * (("qkv" in subset) + ("gate_up" in subset)) + ("lm_head" in subset)
    assert calls["gemv_add_rms_norm"] == forwards * norms


@pytest.mark.parametrize("subset", SUBSETS[:2], ids=lambda s: "+".join(sorted(s)))
def test_a_fused_subset_generates_the_same_greedy_tokens(subset):
    model = tiny_llama(torch.float32, seed=1)
    runs = {}
    for linear_impl in ("reference", "fused"):
        model.linear_impl, model.fused = linear_impl, subset
        runs[linear_impl] = greedy_tokens(model, 6)
    assert torch.equal(runs["fused"], runs["reference"]), runs


def test_an_unknown_fused_projection_is_refused():
    model = tiny_llama(torch.float32)
    model.linear_impl, model.fused = "fused", frozenset({"qkv", "mlp"})
    with pytest.raises(ValueError, match="fused=frozenset.*must be a frozenset of"):
        model(torch.tensor([[1]]), torch.tensor([[0]]), model.new_cache(1, 4), 1)
    model.fused = {"qkv"}  # a plain set: refused, like any non-frozenset
    with pytest.raises(ValueError, match="must be a frozenset"):
        model(torch.tensor([[1]]), torch.tensor([[0]]), model.new_cache(1, 4), 1)


def test_decode_settings_by_device_and_shape():
    """None means the measured default (Llama.decode_settings); what is set wins."""
    from flashspec_torch.model import FUSABLE, Llama, LlamaConfig

    def model(hidden):
        with torch.device("meta"):
            return Llama(LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
                                     num_heads=hidden // 64, num_kv_heads=1, head_dim=64))

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert model(576).decode_settings(cpu) == ("reference", False, FUSABLE, G.MAX_ROWS)
    assert model(576).decode_settings(cuda) == ("fused", True, FUSABLE, 1)
    assert model(2048).decode_settings(cuda) == ("fused", True, frozenset({"o", "down"}), 1)
    assert model(4096).decode_settings(cuda) == ("reference", True, frozenset(), 1)
    m = model(2048)
    m.linear_impl, m.pdl, m.fused = "fused", False, frozenset({"qkv"})
    assert m.decode_settings(cuda) == ("fused", False, frozenset({"qkv"}), G.MAX_ROWS)
    for hidden in (576, 2048, 4096):  # batch-invariant: the invariant products at any row count, any width
        m = model(hidden)
        m.batch_invariant = True
        assert m.decode_settings(cuda) == ("invariant", True, FUSABLE, 0)
    m.fused = frozenset({"o"})
    with pytest.raises(ValueError, match="batch_invariant: .*fused=frozenset"):
        m.decode_settings(cuda)
    m.batch_invariant = False
    m.fused = frozenset({"attention"})
    with pytest.raises(ValueError, match="fused"):
        m.decode_settings(cuda)
