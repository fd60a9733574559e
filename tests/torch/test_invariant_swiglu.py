"""The batch-invariant gate_up with SwiGLU as its epilogue (``invariant_matmul.invariant_matmul_swiglu``),
under the Triton interpreter on fresh random inputs: the bits of the engine's ``silu_mul`` kernel applied to
``invariant_matmul``'s output, for the launch the engine takes at every M (1, 3, 16, 17, 64, 65, 320) on any
card and on a card whose evidence admits 64- and 128-row tiles, and for every other launch of the order
(one slice per program or all of them, 1-4 row tiles, 16-128 columns, every ``MMA64_LAUNCHES`` entry), in
float32 and bfloat16, at shapes whose last column tile ends inside each half; the reference agrees to
rounding; a row's bits alone == inside any batch; the mutant that splits K by batch size fails that check.
(tests/torch/test_batch_invariant.py checks the model's forward with it against the unfused path.)"""

from dataclasses import replace

import pytest
import torch

from flashspec_torch import invariant_matmul as I
from flashspec_torch.layers import silu_mul
from test_invariant_matmul import ROWS, invariance_failures, split_k_by_batch

MS = (1, 3, 16, 17, 64, 65, 320)
# (K, I): the product has N = 2I columns. 200: 2 chunks of bfloat16's 128 (4 of float32's 64), the last
# partial; I = 20 and 56: 16 output columns per tile of 32 (2 and 4 tiles), the last one partial
SHAPES = ((200, 20), (130, 56))


def operands(m: int, k: int, i: int, dtype: torch.dtype, seed: int):  # (x [m, K], w [2I, K]): fresh each call
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), (torch.randn(2 * i, k, generator=g) / 4).to(dtype)


def unfused(x, w, tiling=None):  # what the engine ran before: the product, then silu_mul's kernel
    return silu_mul(I.launch(x, w, False, tiling), "triton")


def admit_every_launch(monkeypatch, n: int, k: int) -> None:
    """A card (``I.card`` of every tensor) whose evidence covers every 64- and 128-row launch for (n, k), 128-row
    tiles from one program: the engine then takes ``m64_n64`` at 64 rows, ``m64_n64_serial`` at 65 and
    ``m128_n128_w8_serial`` at 320."""
    ev = I.Evidence("its results", frozenset(I.MMA64_LAUNCHES), frozenset({(n, k)}))
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": ev})
    monkeypatch.setattr(I, "MMA128_PROGRAMS", 1)
    monkeypatch.setattr(I, "card", lambda device: "some GPU")


@pytest.mark.parametrize("dtype, card", [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, "admitted")])
def test_the_engines_launch_at_every_m_gives_the_unfused_bits(dtype, card, monkeypatch):
    """At every M the engine's launch (``launch_tiling``; with an admitted card, 64-row tiles from 64 rows and
    128-row tiles at 320) gives silu_mul(invariant_matmul)'s bits, and agrees with the reference to rounding."""
    seed = 0
    for k, i in SHAPES:
        if card:
            admit_every_launch(monkeypatch, 2 * i, k)
        launched = set()
        for m in MS:
            seed += 1
            x, w = operands(m, k, i, dtype, seed)
            t = I.launch_tiling(I.invariant_tiling(2 * i, k, dtype), m, 2 * i, k, I.evidence_card(x))
            launched.add((t.block_m, t.block_n, t.span))
            got = I.invariant_matmul_swiglu(x, w)
            assert got.shape == (m, i) and torch.equal(got, unfused(x, w)), (k, i, m, t)
            want = I.invariant_matmul_swiglu_reference(x, w).float()
            tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype] * want.abs().max().item()
            torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)
        if card:
            assert {(64, 64, 1), (64, 64, 0), (128, 128, 0)} <= launched, launched
        else:
            assert {b for b, _, _ in launched} == {16}, launched


def launches_of_the_order(t: I.InvariantTiling) -> dict[str, I.InvariantTiling]:
    """Every launch of ``t``'s order a test can name: one slice per program or all of them, 1-4 row tiles,
    16 or 32 columns, and each ``MMA64_LAUNCHES`` entry."""
    out = {"span 0": replace(t, span=0), "span 1": replace(t, span=1), "1 row tile": replace(t, row_tiles=1),
           "3 row tiles, span 0": replace(t, row_tiles=3, span=0), "16 columns": replace(t, block_n=16),
           "32 columns": replace(t, block_n=32)}
    return out | {name: replace(t, **fields) for name, fields in I.MMA64_LAUNCHES.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_launch_of_the_order_gives_the_unfused_bits(dtype):
    """For each launch of the order (``launches_of_the_order``) at 17 and 65 rows (several row tiles, the last
    partial): the fused launch's bits are silu_mul's of the same launch's product, and that launch's product
    keeps the engine's bits (so the fused op's bits do not depend on the launch either)."""
    k, i = SHAPES[1]
    for m in (17, 65):
        x, w = operands(m, k, i, dtype, 100 + m)
        engine = unfused(x, w)
        for name, t in launches_of_the_order(I.invariant_tiling(2 * i, k, dtype)).items():
            got = I.launch(x, w, False, t, swiglu=True)
            assert torch.equal(got, unfused(x, w, t)), (m, name)
            assert torch.equal(got, engine), (m, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_batch(dtype):
    """A row's bits alone == in batches of 1, 3, 17, 64, 70 == as a row of a scoring pass."""
    x, w = operands(ROWS, *SHAPES[0], dtype, 7)
    assert invariance_failures(I.invariant_matmul_swiglu, x, w) == []


def test_the_mutant_that_splits_k_by_batch_size_fails_the_check():
    """SwiGLU of the product that splits K in two above one row (test_invariant_matmul's mutant): the same
    check finds rows whose bits changed with the batch."""
    x, w = operands(ROWS, *SHAPES[0], torch.bfloat16, 8)
    assert len(invariance_failures(lambda a, b: silu_mul(split_k_by_batch(a, b), "triton"), x, w)) >= 10


def test_an_odd_weight_is_refused_by_name():
    with pytest.raises(ValueError, match="w has 41 rows"):
        I.invariant_matmul_swiglu(torch.zeros(2, 8), torch.zeros(41, 8))
