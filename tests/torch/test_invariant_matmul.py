"""The batch-invariant product (flashspec_torch.invariant_matmul): a row's bits alone == inside a
batch of 1-70 rows (1-4 row tiles per program, two row groups) == as one of the G+1 rows of a scoring
pass == with one row tile per program, in float32 and bfloat16; it agrees with the reference to
rounding; and a mutant that splits K by batch size (what cuBLAS does for some shapes) fails the same
invariance check, so the check can fail."""

from dataclasses import replace

import pytest
import torch

from flashspec_torch import invariant_matmul as I

K, N = 200, 40  # K: 2-4 chunks of the tiling, the last one partial; N: 3 column tiles, the last partial
ROWS = 70  # two row groups of up to 4 row tiles of 16, the second partial
EDGES = (0, 1, 15, 16, 17, 31, 32, 47, 48, 63, 64, 69)  # rows at the edges of row tiles and groups


def rand(*shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def operands(dtype):  # (x [ROWS, K], w [N, K])
    return rand(ROWS, K, seed=5, dtype=dtype), rand(N, K, seed=6, dtype=dtype)


def invariance_failures(fn, x, w) -> list[str]:
    """Where a row's bits in a batch of 70 differ from its bits alone (rows at tile edges), inside
    batches of 1, 3, 17, 64 (at the first and the last place) or as a row of a [3, 5] scoring pass;
    fn(x, w) is a product."""
    full = fn(x, w)
    failures = [f"row {i} alone" for i in EDGES if not torch.equal(fn(x[i : i + 1], w)[0], full[i])]
    for m in (1, 3, 17, 64):
        for start in sorted({0, ROWS - m}):
            y = fn(x[start : start + m], w)
            failures += [f"row {start + i} in a batch of {m}" for i in range(m) if not torch.equal(y[i], full[start + i])]
    scored = fn(x[:15].reshape(3, 5, K), w).reshape(15, N)  # 3 requests x (G + 1 = 5) rows
    return failures + [f"scoring row {i}" for i in range(15) if not torch.equal(scored[i], full[i])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_batch(dtype):
    """The engine's product (up to 4 row tiles per program, one weight chunk load for all of them), and
    the same bits with one row tile per program (the product before)."""
    x, w = operands(dtype)
    assert invariance_failures(I.invariant_matmul, x, w) == []
    one_tile = I.launch(x, w, False, replace(I.invariant_tiling(N, K, dtype), row_tiles=1))
    assert torch.equal(one_tile, I.invariant_matmul(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(dtype):
    x, w = operands(dtype)
    got, want = I.invariant_matmul(x, w), I.invariant_matmul_reference(x, w)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype] * want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)


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
    x, w = operands(dtype)
    assert len(invariance_failures(split_k_by_batch, x, w)) >= 10


def test_bad_input_is_refused_by_name():
    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="w.dtype"):
        I.invariant_matmul(x, w.double())
    with pytest.raises(ValueError, match="must be a contiguous"):
        I.invariant_matmul(x, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="at least one row"):
        I.invariant_matmul(torch.zeros(0, 8), w)


def test_the_tiling_depends_on_the_weight_and_dtype_only():
    """One tiling per (N, K, dtype): the launcher has no M to choose by. K is split into slices so that
    a launch of up to 64 rows has ~1024 programs, the partials bounded by N."""
    head = I.invariant_tiling(32000, 2048, torch.bfloat16)
    assert (head.block_n, head.slices(2048)) == (64, 2)
    assert I.invariant_tiling(2048, 2048, torch.bfloat16) == I.InvariantTiling(16, 16, 128, 2, 2, row_tiles=4)
    assert I.invariant_tiling(2048, 5632, torch.bfloat16).slices(5632) == 11  # the last slice partial
    assert I.invariant_tiling(128256, 4096, torch.bfloat16).slices(4096) == 1  # 2004 column tiles: no split
    assert I.invariant_tiling(2048, 2048, torch.float32).block_k == 64


def test_a_split_or_none_keeps_a_rows_bits_and_agrees_with_the_reference():
    """Slices of 3 chunks (2 slices of float32's 4 chunks, the last partial; the default tiling has 4 of 1)
    with 2 row tiles per program, and no split at all: rows 0, 31, 32 and 69 of the 70-row pass have
    their bits alone, and the sum of the slices agrees with the reference."""
    x, w = operands(torch.float32)
    want = I.invariant_matmul_reference(x, w)
    for tiling in (I.InvariantTiling(16, 16, 64, 3, 1, row_tiles=2), I.InvariantTiling(16, 16, 64, 4, 2)):
        got = I.launch(x, w, False, tiling)
        assert all(torch.equal(I.launch(x[i : i + 1], w, False, tiling), got[i : i + 1]) for i in (0, 31, 32, 69)), tiling
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_more_rows_than_the_counters_cover_run_in_pieces(monkeypatch):
    """A grid with more tiles than the counters runs as launches of whole row groups (here 64 + 6 rows):
    the same bits as one launch."""
    x, w = operands(torch.bfloat16)
    whole = I.invariant_matmul(x, w)
    monkeypatch.setattr(I, "COUNTERS", 3)  # 3 column tiles: one row group per launch
    assert torch.equal(I.invariant_matmul(x, w), whole)
