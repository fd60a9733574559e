"""The batch-invariant product's epilogues (``invariant_matmul``): gate_up with SwiGLU
(``invariant_matmul_swiglu``) and qkv with RoPE + KV write (``invariant_matmul_rope_kv``), under the Triton
interpreter on fresh random inputs: the bits of the engine's ``silu_mul`` / ``rope_kv`` kernel applied to
``invariant_matmul``'s output (q and both caches for RoPE), for the launch the engine takes at every M (1, 3,
16, 17, 64, 65, 320) on any card and on a card whose evidence admits 64- and 128-row tiles, and for every
other launch of the order (one slice per program or all of them, 1-4 row tiles, 16-128 columns, every
``MMA64_LAUNCHES`` entry), in float32 and bfloat16, at shapes whose last column tile ends inside each half
(or head); the references agree to rounding; a row's bits alone == inside any batch; the mutant that
splits K by batch size fails that check. (tests/torch/test_batch_invariant.py checks the model's forward
with them against the unfused path.)"""

from dataclasses import replace

import pytest
import torch

from flashspec_torch import invariant_matmul as I
from flashspec_torch.layers import rope_kv, silu_mul
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
    """For each launch of the order (``launches_of_the_order``) at 65 rows (several row tiles, the last
    partial): the fused launch's bits are silu_mul's of the same launch's product, and that launch's product
    keeps the engine's bits (so the fused op's bits do not depend on the launch either)."""
    k, i = SHAPES[1]
    for m in (65,):
        x, w = operands(m, k, i, dtype, 100 + m)
        engine = unfused(x, w)
        for name, t in launches_of_the_order(I.invariant_tiling(2 * i, k, dtype)).items():
            got = I.launch(x, w, False, t, epilogue="swiglu")
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


# RoPE + KV write: (K, heads, kv_heads, D). qkv has (H + 2 H_kv) D columns: 80 (tiles of 16-128 columns hold
# 8-64 pairs: a head, several, or all 5), 144 (D / 2 = 12 pairs a head: heads cross the tiles' edges)
ROPE_SHAPES = ((200, 3, 1, 16), (130, 2, 2, 24))
BT = ((1, 1), (3, 1), (16, 1), (17, 1), (16, 4), (13, 5), (64, 5))  # (B, T): M = 1, 3, 16, 17, 64, 65, 320
SLOTS = 12


def rope_operands(b: int, t: int, shape, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, I.RopeKV]:
    """(x [B, T, K], w, RopeKV: cos, sin [B, T, D], positions [B, T], caches [B, H_kv, SLOTS, D]): random, each
    row's positions consecutive from a random start, the last row's running past the cache (not written)."""
    k, heads, kv_heads, d = shape
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(b, t, k, generator=g), torch.randn((heads + 2 * kv_heads) * d, k, generator=g) / 4
    cos, sin = torch.randn(b, t, d, generator=g), torch.randn(b, t, d, generator=g)
    start = torch.randint(0, SLOTS - t + 1, (b, 1), generator=g)
    start[-1] = SLOTS - t + (t + 1) // 2  # the last row: its last half past the cache
    k_cache, v_cache = torch.randn(2, b, kv_heads, SLOTS, d, generator=g).to(dtype)
    x, w, cos, sin = (a.to(dtype) for a in (x, w, cos, sin))
    return x, w, I.RopeKV(cos, sin, start + torch.arange(t), k_cache, v_cache, heads, kv_heads)


def rope_run(fn, x, w, rope: I.RopeKV):
    """(q, k_cache, v_cache) after fn(x, w, rope) (an ``invariant_matmul_rope_kv``) on copies of the caches."""
    rope = replace(rope, k_cache=rope.k_cache.clone(), v_cache=rope.v_cache.clone())
    return fn(x, w, rope), rope.k_cache, rope.v_cache


def rope_unfused(x, w, r: I.RopeKV, tiling=None):  # what the engine ran before: the product, then rope_kv's kernel
    qkv = I.launch(x.reshape(-1, x.shape[-1]), w, False, tiling).reshape(*x.shape[:2], -1)
    return rope_kv(qkv, r.cos, r.sin, r.positions, r.k_cache, r.v_cache, r.heads, r.kv_heads, "triton")


def rope_fused(tiling):  # invariant_matmul_rope_kv with ``tiling``
    return lambda x, w, rope: I.launch(x.reshape(-1, x.shape[-1]), w, False, tiling, "rope_kv", rope)


def same(a, b) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("dtype, card", [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, "admitted")])
def test_rope_kv_engines_launch_at_every_m_gives_the_unfused_bits(dtype, card, monkeypatch):
    """At every M = B T the engine's launch gives rope_kv(invariant_matmul)'s q and caches, and q agrees with
    the reference to rounding (float32 up to 65 rows: the interpreter's time)."""
    seed = 0
    for shape in ROPE_SHAPES:
        n = (shape[1] + 2 * shape[2]) * shape[3]
        if card:
            admit_every_launch(monkeypatch, n, shape[0])
        launched = set()
        for b, t in BT if dtype != torch.float32 else BT[:-1]:
            seed += 1
            x, w, rope = rope_operands(b, t, shape, dtype, seed)
            t_ = I.launch_tiling(I.invariant_tiling(n, shape[0], dtype), b * t, n, shape[0], I.evidence_card(x))
            launched.add((t_.block_m, t_.block_n, t_.span))
            got = rope_run(I.invariant_matmul_rope_kv, x, w, rope)
            assert same(got, rope_run(rope_unfused, x, w, rope)), (shape, b, t, t_)
            # the reference's q (its KV write needs slots < S)
            want = rope_run(I.invariant_matmul_rope_kv_reference, x, w,
                            replace(rope, positions=rope.positions.clamp(max=SLOTS - 1)))[0].float()
            tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype] * want.abs().max().item()
            torch.testing.assert_close(got[0].float(), want, rtol=0, atol=tol)
        assert {bm for bm, _, _ in launched} == ({16, 64, 128} if card else {16}), launched


def test_rope_kv_every_launch_of_the_order_gives_the_unfused_bits():
    """Each launch of the order at M = 65 (13 x 5), bfloat16: q and caches are rope_kv's of the same launch's
    product, and the engine's."""
    shape, dtype = ROPE_SHAPES[1], torch.bfloat16
    n = (shape[1] + 2 * shape[2]) * shape[3]
    x, w, rope = rope_operands(13, 5, shape, dtype, 213)
    engine = rope_run(rope_unfused, x, w, rope)
    for name, tiling in launches_of_the_order(I.invariant_tiling(n, shape[0], dtype)).items():
        got = rope_run(rope_fused(tiling), x, w, rope)
        unfused = rope_run(lambda *a: rope_unfused(*a, tiling=tiling), x, w, rope)
        assert same(got, unfused) and same(got, engine), name


def rope_invariance_failures(fn, dtype) -> list[str]:
    """Where request r's q and cache rows differ between a batch of 6 requests of 5 tokens and r alone."""
    x, w, rope = rope_operands(6, 5, ROPE_SHAPES[0], dtype, 9)
    batch = rope_run(fn, x, w, rope)
    failures = []
    for r in range(6):
        one = slice(r, r + 1)
        mine = replace(rope, cos=rope.cos[one], sin=rope.sin[one], positions=rope.positions[one],
                       k_cache=rope.k_cache[one], v_cache=rope.v_cache[one])
        alone = rope_run(fn, x[one], w, mine)
        failures += [f"request {r} {name}" for name, a, b in zip("qkv", alone, batch) if not torch.equal(a[0], b[r])]
    return failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_a_requests_bits_do_not_depend_on_the_batch(dtype):
    assert rope_invariance_failures(I.invariant_matmul_rope_kv, dtype) == []


def test_rope_kv_the_mutant_that_splits_k_by_batch_size_fails_the_check():
    """RoPE + KV write of the product that splits K in two for a batch of more than one request: the same
    check finds requests whose q or cache rows changed with the batch."""
    def mutant(x, w, r):  # x [B, T, K]
        qkv = split_k_by_batch(x, w) if x.shape[0] > 1 else I.invariant_matmul(x, w)
        return rope_kv(qkv, r.cos, r.sin, r.positions, r.k_cache, r.v_cache, r.heads, r.kv_heads, "triton")

    assert len(rope_invariance_failures(mutant, torch.bfloat16)) >= 6


def test_rope_kv_bad_input_is_refused_by_name():
    x, cos = torch.zeros(1, 2, 8), torch.zeros(1, 2, 16)
    cache = torch.zeros(1, 1, 4, 16)
    pos = torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="need an even head_dim"):  # 5 heads of 16: 80 rows
        I.invariant_matmul_rope_kv(x, torch.zeros(64, 8), I.RopeKV(cos, cos, pos, cache, cache, 3, 1))
    with pytest.raises(ValueError, match="must be contiguous"):
        I.invariant_matmul_rope_kv(x, torch.zeros(80, 8), I.RopeKV(cos, cos, pos, cache.transpose(2, 3), cache, 3, 1))
