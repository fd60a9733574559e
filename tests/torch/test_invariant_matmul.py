"""The batch-invariant product (flashspec_torch.invariant_matmul): a row's bits alone == inside a
batch of M rows == as one of the G+1 rows of a scoring pass, for every prologue, in float32 and
bfloat16; the references agree to rounding; and a mutant that splits K by batch size (what cuBLAS
does for some shapes) fails the same invariance check, so the check can fail."""

import pytest
import torch

from flashspec_torch import invariant_matmul as I

K, N = 200, 40  # K: 2-4 chunks of the tiling, the last one partial; N: 3 column tiles, the last partial
BATCHES = (1, 3, 8, 17)  # 17: two row tiles


def rand(*shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def operands(prologue, dtype):
    """(x [17, K or 2K], d [17, K], g [K], w [N, K])."""
    width = 2 * K if prologue == "silu_mul" else K
    return (rand(17, width, seed=1, dtype=dtype), rand(17, K, seed=2, dtype=dtype), rand(K, seed=3, dtype=dtype),
            rand(N, K, seed=4, dtype=dtype))


def product(prologue, x, d, g, w):  # x [..., K]
    if prologue == "none":
        return I.invariant_matmul(x, w)
    if prologue == "silu_mul":
        return I.invariant_matmul_silu_mul(x, w)
    return I.invariant_matmul_add_rms_norm(x, d, g, 1e-5, w)[0]


def reference(prologue, x, d, g, w):
    if prologue == "none":
        return I.invariant_matmul_reference(x, w)
    if prologue == "silu_mul":
        return I.invariant_matmul_silu_mul_reference(x, w)
    return I.invariant_matmul_add_rms_norm_reference(x, d, g, 1e-5, w)[0]


def invariance_failures(fn, x, d, w) -> list[str]:
    """Where a row's bits alone differ from its bits among M rows (M in BATCHES, the row at every
    place) or as row j of a [B, G+1] scoring pass; fn(x, d, w) is a product."""
    alone = [fn(x[i : i + 1], d[i : i + 1], w) for i in range(x.shape[0])]
    failures = []
    for m in BATCHES:
        for start in sorted({0, x.shape[0] - m}):
            y = fn(x[start : start + m], d[start : start + m], w)
            failures += [f"row {start + i} in a batch of {m}" for i in range(m) if not torch.equal(y[i : i + 1], alone[start + i])]
    scored = fn(x[:15].reshape(3, 5, -1), d[:15].reshape(3, 5, -1), w)  # 3 requests x (G + 1 = 5) rows
    failures += [f"scoring row {i}" for i in range(15) if not torch.equal(scored.reshape(15, -1)[i : i + 1], alone[i])]
    return failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prologue", I.PROLOGUES)
def test_a_rows_bits_do_not_depend_on_the_batch(prologue, dtype):
    x, d, g, w = operands(prologue, dtype)
    assert invariance_failures(lambda x, d, w: product(prologue, x, d, g, w), x, d, w) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prologue", I.PROLOGUES)
def test_matches_the_reference(prologue, dtype):
    x, d, g, w = operands(prologue, dtype)
    got, want = product(prologue, x, d, g, w), reference(prologue, x, d, g, w)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype] * want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)


def test_add_rms_norm_returns_the_residual_and_reads_h_only():
    x, d, g, w = operands("add_rms_norm", torch.float32)
    before = x.clone()
    _, hn = I.invariant_matmul_add_rms_norm(x, d, g, 1e-5, w)
    assert torch.equal(x, before) and torch.equal(hn, x + d)
    y, same = I.invariant_matmul_add_rms_norm(x, None, g, 1e-5, w)
    assert same is x and y.shape == (17, N)


def split_k_by_batch(x, w):
    """A mutant: K split in 2 when the batch has more than one row (each half rounded to the output
    dtype, then added), as split-K kernels that pick their split from the problem size do."""
    if x.reshape(-1, x.shape[-1]).shape[0] == 1:
        return I.invariant_matmul(x, w)
    h = K // 2
    parts = I.invariant_matmul(x[..., :h].contiguous(), w[:, :h].contiguous()).float()
    return (parts + I.invariant_matmul(x[..., h:].contiguous(), w[:, h:].contiguous()).float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mutant_that_splits_k_by_batch_size_fails_the_check(dtype):
    x, d, _, w = operands("none", dtype)
    assert len(invariance_failures(lambda x, d, w: split_k_by_batch(x, w), x, d, w)) > 10


def test_bad_input_is_refused_by_name():
    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="w.dtype"):
        I.invariant_matmul(x, w.double())
    with pytest.raises(ValueError, match="must be a contiguous"):
        I.invariant_matmul(x, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="even"):
        I.invariant_matmul_silu_mul(torch.zeros(2, 7), w)
    with pytest.raises(ValueError, match="at least one row"):
        I.invariant_matmul(torch.zeros(0, 8), w)


def test_the_tiling_depends_on_the_weight_and_dtype_only():
    """One tiling per (N, K, dtype): the launcher has no M to choose by."""
    assert I.invariant_tiling(32000, 2048, torch.bfloat16).block_n == 64
    assert I.invariant_tiling(2048, 2048, torch.bfloat16) == I.InvariantTiling(16, 16, 128)
    assert I.invariant_tiling(2048, 2048, torch.float32).block_k == 64


def test_a_measured_tiling_in_the_table_is_the_one_launched(monkeypatch):
    """INVARIANT_CONFIGS (benchmarks/invariant_tune_gpu.py's winners) replaces the default for its (N, K, dtype)
    only, and a row's bits stay independent of the batch under it."""
    measured = I.InvariantTiling(16, 32, 64, 4, 1)
    x, d, g, w = operands("none", torch.float32)
    default = I.invariant_matmul(x, w)
    monkeypatch.setitem(I.INVARIANT_CONFIGS, (N, K, torch.float32), I.InvariantTiling(16, 16, 128))
    assert not torch.equal(I.invariant_matmul(x, w), default)  # launched: K chunks of 128, not 64, another sum
    monkeypatch.setitem(I.INVARIANT_CONFIGS, (N, K, torch.bfloat16), measured)
    assert I.invariant_tiling(N, K, torch.bfloat16) == measured
    assert I.invariant_tiling(N + 16, K, torch.bfloat16) == I.InvariantTiling(16, 16, 128)  # others: the default
    x, d, g, w = operands("add_rms_norm", torch.bfloat16)
    assert invariance_failures(lambda x, d, w: product("add_rms_norm", x, d, g, w), x, d, w) == []
