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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_plain_product_matches_f_linear(m, n, k, dtype):
    x, w = rand(m, k, seed=m, dtype=dtype), rand(n, k, seed=n, dtype=dtype)
    close(G.gemv(x, w, CONFIG), G.gemv_reference(x, w), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_d", [True, False])
@pytest.mark.parametrize("m,n,k", SHAPES[:3])
def test_add_rms_norm_prologue_matches_reference(m, n, k, with_d, dtype):
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
def test_a_row_has_the_same_bits_for_any_number_of_rows(prologue):
    """Decode (1 row) and scoring (5 rows) give row 0 bit-identically, also with another block_n."""
    k, n = 200, 30
    w, g = rand(n, k, seed=1, dtype=torch.bfloat16), rand(k, seed=2, dtype=torch.bfloat16)
    five = rand(5, 2 * k if prologue == "silu_mul" else k, seed=3, dtype=torch.bfloat16)
    d5 = rand(5, k, seed=4, dtype=torch.bfloat16)

    def run(rows, config):
        if prologue == "none":
            return G.gemv(five[:rows], w, config)
        if prologue == "silu_mul":
            return G.gemv_silu_mul(five[:rows], w, config)
        return G.gemv_add_rms_norm(five[:rows], d5[:rows], g, 1e-5, w, config)[0]

    one = run(1, G.GemvConfig(block_n=8, block_k=64))
    assert torch.equal(run(5, G.GemvConfig(block_n=8, block_k=64))[:1], one)
    assert torch.equal(run(5, G.GemvConfig(block_n=2, block_k=64))[:1], one)
    assert torch.equal(run(3, G.GemvConfig(block_n=16, block_k=64))[:1], one)


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


def test_configs_are_overridable_and_block_k_does_not_depend_on_m():
    assert G.gemv_config(2560, 2048, 1).block_k == G.gemv_config(2560, 2048, 5).block_k
    assert G.gemv_config(64, 576, 1).block_k == 128  # 576 = 4.5 x 128: the last chunk wastes 64 of 640
    custom = G.GemvConfig(block_n=16, block_k=256, num_warps=8, num_stages=2)
    G.GEMV_CONFIGS[(2560, 2048, 1, "add_rms_norm")] = custom
    try:
        assert G.gemv_config(2560, 2048, 1, "add_rms_norm") is custom
        assert G.gemv_config(2560, 2048, 1, "none") != custom
    finally:
        del G.GEMV_CONFIGS[(2560, 2048, 1, "add_rms_norm")]
