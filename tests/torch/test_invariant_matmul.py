"""The batch-invariant product (flashspec_torch.invariant_matmul): a row's bits alone == inside a
batch of M rows == as one of the G+1 rows of a scoring pass, for every prologue, in float32 and
bfloat16; the references agree to rounding; and a mutant that splits K by batch size (what cuBLAS
does for some shapes) fails the same invariance check, so the check can fail."""

from dataclasses import replace

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


ROWS = 70  # two row groups of up to 4 row tiles of 16, the second partial
EDGES = (0, 1, 15, 16, 17, 31, 32, 47, 48, 63, 64, 69)  # rows at the edges of row tiles and groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_product_gives_a_row_its_bits_alone_in_any_batch_up_to_64_and_past_it(dtype):
    """The engine's product (up to 4 row tiles per program, one weight chunk load for all of them): a
    row's bits in a batch of 70 == alone (rows at tile edges) == inside batches of 1, 3, 17, 64 (1-4 row
    tiles, at the first and the last place) == as a scoring row == with one row tile per program (the
    product before)."""
    x, w = rand(ROWS, K, seed=5, dtype=dtype), rand(N, K, seed=6, dtype=dtype)
    full = I.invariant_matmul(x, w)
    failures = [f"row {i} alone" for i in EDGES if not torch.equal(I.invariant_matmul(x[i : i + 1], w)[0], full[i])]
    for m in (1, 3, 17, 64):
        for start in sorted({0, ROWS - m}):
            y = I.invariant_matmul(x[start : start + m], w)
            failures += [f"row {start + i} in a batch of {m}" for i in range(m) if not torch.equal(y[i], full[start + i])]
    scored = I.invariant_matmul(x[:15].reshape(3, 5, K), w).reshape(15, N)  # 3 requests x (G + 1 = 5) rows
    failures += [f"scoring row {i}" for i in range(15) if not torch.equal(scored[i], full[i])]
    one_tile = I.launch_plain(x, w, False, replace(I.invariant_tiling(N, K, dtype), row_tiles=1))
    failures += [f"row {i} with one row tile per program" for i in range(ROWS) if not torch.equal(one_tile[i], full[i])]
    assert failures == []


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
    """One tiling per (N, K, dtype): the launcher has no M to choose by. K is split into slices so that
    a decode row's launch has ~1024 programs, the partials bounded by N."""
    head = I.invariant_tiling(32000, 2048, torch.bfloat16)
    assert (head.block_n, head.splits(2048)) == (64, 2)
    assert I.invariant_tiling(2048, 2048, torch.bfloat16) == I.InvariantTiling(16, 16, 128, 2, 2)
    assert I.invariant_tiling(2048, 5632, torch.bfloat16).splits(5632) == 11  # the last slice partial
    assert I.invariant_tiling(128256, 4096, torch.bfloat16).splits(4096) == 1  # 2004 column tiles: no split
    assert I.invariant_tiling(2048, 2048, torch.float32).block_k == 64


def test_a_split_or_none_keeps_a_rows_bits_and_agrees_with_the_reference():
    """Slices of 3 chunks (2 slices of float32's 4 chunks, the last partial; the default tiling has 4 of 1)
    and no split at all: rows 0, 8 and 16 of a 17-row pass have their bits alone, and the sum of the
    slices agrees with the reference."""
    x, d, g, w = operands("add_rms_norm", torch.float32)
    want = I.invariant_matmul_add_rms_norm_reference(x, d, g, 1e-5, w)[0]
    for tiling in (I.InvariantTiling(16, 16, 64, 3, 1), I.InvariantTiling(16, 16, 64, 4, 2)):
        def fn(rows):
            return I.launch("add_rms_norm", x[rows], d[rows], g, w, torch.empty_like(x[rows]), 1e-5, False, tiling)

        got = fn(slice(0, 17))
        assert all(torch.equal(fn(slice(i, i + 1)), got[i : i + 1]) for i in (0, 8, 16)), tiling
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_more_rows_than_the_counters_cover_run_in_pieces(monkeypatch):
    """A grid with more tiles than the counters runs as launches of whole row tiles (here 16 + 1 rows):
    the same bits and the same residual as one launch."""
    x, d, g, w = operands("add_rms_norm", torch.bfloat16)
    whole, hn = I.invariant_matmul_add_rms_norm(x, d, g, 1e-5, w)
    monkeypatch.setattr(I, "COUNTERS", 3)  # 3 column tiles: one row tile per launch
    pieces, hn2 = I.invariant_matmul_add_rms_norm(x, d, g, 1e-5, w)
    assert torch.equal(pieces, whole) and torch.equal(hn2, hn)
