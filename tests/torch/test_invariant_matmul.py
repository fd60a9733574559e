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


def invariance_failures(fn, x, w, full=None) -> list[str]:
    """Where a row's bits in a batch of 70 (``full``: fn(x, w) unless given) differ from its bits alone
    (rows at tile edges), inside batches of 1, 3, 17, 64 (at the first and the last place) or as a row of
    a [3, 5] scoring pass; fn(x, w) is a product (or the SwiGLU of one), x [ROWS, K]."""
    full = fn(x, w) if full is None else full
    failures = [f"row {i} alone" for i in EDGES if not torch.equal(fn(x[i : i + 1], w)[0], full[i])]
    for m in (1, 3, 17, 64):
        for start in sorted({0, ROWS - m}):
            y = fn(x[start : start + m], w)
            failures += [f"row {start + i} in a batch of {m}" for i in range(m) if not torch.equal(y[i], full[start + i])]
    scored = fn(x[:15].reshape(3, 5, x.shape[-1]), w).reshape(15, full.shape[-1])  # 3 requests x (G + 1 = 5) rows
    return failures + [f"scoring row {i}" for i in range(15) if not torch.equal(scored[i], full[i])]


# crc32 of the engine's 70 x 40 product (4 slices of 1 chunk in float32, 2 of 1 in bfloat16, partials added
# by the last program), recorded before the "group" level of the order was deleted (session 15): the order
# with one slice per group is the order without groups (test_a_tilings_launch_choices_... shows every span
# gives these bits).
PINNED = {torch.float32: 0x3D07C106, torch.bfloat16: 0x65A66526}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_batch(dtype):
    """The engine's product (up to 4 row tiles per program, one weight chunk load for all of them), and
    the same bits with one row tile per program (the product before); those bits are the ones pinned
    before the group level went (a change to the sum order fails this), and agree with the reference
    to rounding."""
    import zlib

    x, w = operands(dtype)
    full = I.invariant_matmul(x, w)
    assert zlib.crc32(full.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).numpy().tobytes()) == PINNED[dtype]
    want = I.invariant_matmul_reference(x, w)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype] * want.float().abs().max().item()
    torch.testing.assert_close(full.float(), want.float(), rtol=0, atol=tol)
    assert invariance_failures(I.invariant_matmul, x, w, full) == []
    one_tile = I.launch(x, w, False, replace(I.invariant_tiling(N, K, dtype), row_tiles=1))
    assert torch.equal(one_tile, full)


def split_k_by_batch(x, w):
    """A mutant: K split in 2 when the batch has more than one row (each half rounded to the output
    dtype, then added), as split-K kernels that pick their split from the problem size do."""
    if x.reshape(-1, x.shape[-1]).shape[0] == 1:
        return I.invariant_matmul(x, w)
    h = K // 2
    parts = I.invariant_matmul(x[..., :h].contiguous(), w[:, :h].contiguous()).float()
    return (parts + I.invariant_matmul(x[..., h:].contiguous(), w[:, h:].contiguous()).float()).to(x.dtype)


def test_a_mutant_that_splits_k_by_batch_size_fails_the_check():
    x, w = operands(torch.bfloat16)
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
    their bits alone, and the sum of the slices agrees with the reference. Slices of 2 and 3 chunks walked
    by one program (span 0: one loop over every chunk, each slice's sum restarted from zero), with 1 or all
    of the first slice's chunks preloaded: the bits of one slice per program."""
    x, w = operands(torch.float32)
    want = I.invariant_matmul_reference(x, w)
    for tiling in (I.InvariantTiling(16, 16, 64, 3, 1, row_tiles=2), I.InvariantTiling(16, 16, 64, 4, 2)):
        got = I.launch(x, w, False, tiling)
        assert all(torch.equal(I.launch(x[i : i + 1], w, False, tiling), got[i : i + 1]) for i in (0, 31, 32, 69)), tiling
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    for chunks, preload in ((3, 1), (3, 3), (2, 2)):
        tiling = I.InvariantTiling(16, 16, 64, chunks, preload)
        assert torch.equal(I.launch(x, w, False, replace(tiling, span=0)), I.launch(x, w, False, tiling)), tiling


def test_the_engine_walks_every_slice_in_one_program_above_64_rows_with_the_same_bits(monkeypatch):
    """``launch_tiling`` above 64 rows (here forced: 1 program suffices) takes every slice in one program,
    no workspace: a row's bits alone (one slice per program) == in the 70-row pass == in the other batches."""
    monkeypatch.setattr(I, "SERIAL_PROGRAMS", 1)
    t = I.invariant_tiling(N, K, torch.bfloat16)
    assert I.launch_tiling(t, 70, N, K).span == 0 and I.launch_tiling(t, 64, N, K).span == 1
    x, w = operands(torch.bfloat16)
    assert invariance_failures(I.invariant_matmul, x, w) == []


def test_64_row_tiles_only_on_an_admitted_card_with_the_same_bits(monkeypatch):
    """On a card of ``MMA64_CARDS`` the engine takes 64-row tiles from 64 rows (with only ``MMA64_BASIC``
    covered, at 64 rows only with enough column tiles: here 1 suffices), elsewhere never, and
    only launches the card's evidence covers; under the interpreter (no MMA) they give every row its bits
    alone."""
    t = I.invariant_tiling(N, K, torch.bfloat16)
    blocks = lambda: [I.launch_tiling(t, m, N, K, "some GPU").block_m for m in (1, 63, 64, 70)]  # noqa: E731
    assert blocks() == [16, 16, 16, 16]
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": I.Evidence("its results", I.MMA64_BASIC, frozenset({(N, K)}))})
    assert blocks() == [16, 16, 16, 64]
    monkeypatch.setattr(I, "MMA64_SERIAL_PROGRAMS", 1)
    assert blocks() == [16, 16, 64, 64]
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": I.Evidence("its results", frozenset({"m64_serial"}), frozenset({(N, K)}))})
    assert blocks() == [16, 16, 64, 16]  # above 64 rows it would take m64_n64_serial: not covered
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": I.Evidence("its results", I.MMA64_BASIC | I.MMA64_CUBLAS_LIKE, frozenset({(N, K)}))})
    assert blocks() == [16, 16, 64, 64]
    assert [I.launch_tiling(t, m, N, K, "some GPU").block_n for m in (64, 70)] == [t.block_n, 64]
    monkeypatch.setattr(I, "card", lambda device: "some GPU")
    x, w = operands(torch.bfloat16)
    full = I.invariant_matmul(x, w)
    assert all(torch.equal(I.invariant_matmul(x[i : i + 1], w)[0], full[i]) for i in (0, 63, 64, 69))


def test_128_row_tiles_only_where_a_cards_evidence_lists_them(monkeypatch):
    """No card's evidence lists the 128-row launches (``MMA128``) yet, so the engine never takes them; on a
    card whose evidence lists them it takes one from ``MMA128_ROWS`` rows where it gives ``MMA128_PROGRAMS``
    programs (the 64-row launch elsewhere), only one its evidence lists; under the interpreter every row
    of a 200-row pass (two 128-row tiles over every slice, the second partial) has its bits alone, in the
    engine and with each 128-row launch in float32 and bfloat16, and with 256 columns in float32 (where a
    tile's products pass the interpreter's 2^20 elements a tensor, it sums them in halves of K: ``tree_dot``;
    float32 shows a changed order)."""
    assert not any(I.MMA128 & ev.launches for ev in I.MMA64_CARDS.values())
    for n, k in I.MMA64_PRODUCTS:
        t = I.invariant_tiling(n, k, torch.bfloat16)
        assert all(I.launch_tiling(t, m, n, k, gpu).block_m <= 64
                   for m in (128, 320, 2496) for gpu in (None, *I.MMA64_CARDS))
    cases = ((127, 32000), (320, 32000), (320, 6144), (320, 4096), (320, 2048))  # (M, N)
    assert [I.mma128_launch(m, n, I.MMA128) for m, n in cases] \
        == [None, "m128_n128_w8_serial", "m128_n128_w8_serial", "m128_n64_w8_s3_serial", None]
    assert I.mma128_launch(320, 6144, I.MMA128 - {"m128_n128_w8_serial"}) is None
    t = I.invariant_tiling(N, K, torch.bfloat16)
    blocks = lambda: [I.launch_tiling(t, m, N, K, "some GPU").block_m for m in (64, 127, 128, 200)]  # noqa: E731
    ev = I.Evidence("its results", I.MMA64_BASIC | I.MMA128, frozenset({(N, K)}))
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": ev})
    assert blocks() == [16, 64, 64, 64]  # 1 column tile: too few programs
    monkeypatch.setattr(I, "MMA128_PROGRAMS", 1)
    assert blocks() == [16, 64, 128, 128]
    assert I.launch_tiling(t, 200, N, K, "some GPU") == replace(t, **I.MMA64_LAUNCHES["m128_n128_w8_serial"])
    monkeypatch.setattr(I, "card", lambda device: "some GPU")
    x, w = rand(200, K, seed=7, dtype=torch.bfloat16), rand(N, K, seed=8, dtype=torch.bfloat16)
    rows = (0, 1, 63, 64, 127, 128, 129, 199)
    full = I.invariant_matmul(x, w)
    assert [i for i in rows if not torch.equal(I.invariant_matmul(x[i : i + 1], w)[0], full[i])] == []
    for dtype in (torch.float32, torch.bfloat16):
        x, w = rand(200, K, seed=9, dtype=dtype), rand(N, K, seed=10, dtype=dtype)
        t = I.invariant_tiling(N, K, dtype)
        alone = torch.cat([I.launch(x[i : i + 1], w, False, t) for i in rows])
        tilings = {name: replace(t, **I.MMA64_LAUNCHES[name]) for name in sorted(I.MMA128)}
        tilings["256 columns"] = replace(tilings["m128_n128_w8_serial"], block_n=256)
        for name, tiling in tilings.items():
            got = I.launch(x, w, False, tiling)[list(rows)]
            assert torch.equal(got, alone), (dtype, name, (got != alone).any(dim=1).nonzero().flatten().tolist())


def evidence(where: str) -> dict:  # the JSON of benchmarks/invariant_tiles_gpu.py in a result directory
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[2] / where / "invariant_tiles_gpu.json").read_text())


def measured(c: dict) -> I.InvariantTiling:  # a candidate's tiling in the JSON (session 14's had group 1)
    fields = dict(c["tiling"])
    assert fields.pop("group", 1) == 1
    return I.InvariantTiling(**fields)


def test_every_admitted_card_has_its_evidence():
    """Each card of ``MMA64_CARDS`` names a GPU result of benchmarks/invariant_tiles_gpu.py on that card
    where no 64- or 128-row candidate failed, nothing was skipped and every mutant was caught; every launch its
    evidence covers is a candidate of every projection there, the same tiling, passing; and each 64-row
    launch the engine makes at the run's M on that card ran there at that M."""
    for name, ev in I.MMA64_CARDS.items():
        got = evidence(ev.results)
        s = got["summary"]
        assert got["gpu"] == name and not got["skipped"] and s["mutants_caught"] == s["mutants"] > 0, ev.results
        assert not [f for f in s["failed"] if "m64" in f or "m128" in f], (ev.results, s["failed"])
        assert ev.launches and ev.launches <= set(I.MMA64_LAUNCHES), ev
        assert got["settings"]["dtype"] in [str(d).removeprefix("torch.") for d in I.MMA64_DTYPES], ev.results
        assert ev.products <= {(part["n"], part["k"]) for part in got["parts"]}, ev.results
        for part in got["parts"]:
            cands, checks = part["candidates"]["engine"], part["families"]["engine"]["checks"]
            t = I.invariant_tiling(part["n"], part["k"], torch.bfloat16)
            for launch in ev.launches:
                assert launch in cands and checks[launch]["pass"], (ev.results, part["projection"], launch)
                assert measured(cands[launch]) == replace(t, **I.MMA64_LAUNCHES[launch]), (ev.results, launch)
            for m in got["settings"]["ms"]:
                used = I.mma64_launch(t, m, part["n"], part["k"], name)
                assert used is None or ("64" if m <= 64 else "big") in cands[used]["at"], (name, part["projection"], m)
    h200 = I.MMA64_CARDS["NVIDIA H200"]  # its run never timed or checked the cuBLAS-like launches
    assert h200.launches == I.MMA64_BASIC
    assert not I.MMA64_CUBLAS_LIKE & set(evidence(h200.results)["parts"][0]["candidates"]["engine"])


H100 = "NVIDIA H100 80GB HBM3"
SMOLLM2_PRODUCTS = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))  # qkv, o, gate_up, down, LM head


def test_a_product_no_evidence_checked_keeps_16_row_tiles_on_an_admitted_card(monkeypatch):
    """SmolLM2-135M's products (K 576 and 1536, which no card's run checked; issue #40's failure at that
    shape on the H200) launch on the admitted cards as on any card, at every M; a checked product on the
    same card still takes its 64-row launch; and a card whose evidence names SmolLM2's LM head takes it there."""
    for n, k in SMOLLM2_PRODUCTS:
        t = I.invariant_tiling(n, k, torch.bfloat16)
        for m in (1, 5, 16, 64, 80, 320, 2496):
            assert I.launch_tiling(t, m, n, k, "NVIDIA H200") == I.launch_tiling(t, m, n, k, H100) == \
                I.launch_tiling(t, m, n, k), (n, k, m)
            assert I.launch_tiling(t, m, n, k).block_m == 16
    head = I.invariant_tiling(32000, 2048, torch.bfloat16)
    assert I.launch_tiling(head, 64, 32000, 2048, "NVIDIA H200").block_m == 64
    t = I.invariant_tiling(49152, 576, torch.bfloat16)
    monkeypatch.setattr(I, "MMA64_CARDS", {"some GPU": I.Evidence("its results", I.MMA64_BASIC, frozenset({(49152, 576)}))})
    assert [I.launch_tiling(t, m, 49152, 576, "some GPU").block_m for m in (16, 64, 80)] == [16, 64, 64]




def test_only_the_evidences_dtype_takes_64_row_tiles(monkeypatch):
    """On an admitted card a bfloat16 product may take 64-row tiles; float32 and float16, which no card's run
    checked, keep the 16-row tiles of any card."""
    monkeypatch.setattr(I, "card", lambda device: H100)
    assert I.evidence_card(torch.zeros(2, dtype=torch.bfloat16)) == H100
    assert I.evidence_card(torch.zeros(2, dtype=torch.float32)) is None
    assert I.evidence_card(torch.zeros(2, dtype=torch.float16)) is None


def test_the_engines_launches_by_m_are_the_measured_candidates():
    """``launch_tiling`` picks, per M, what benchmarks/invariant_tiles_gpu.py timed (and checked): twice
    the columns up to 64 rows (4 stages for the widest products with long slices at <= 16 rows); on the
    H200 one 64-row tile over every slice, of 64 columns above 64 rows; on the H100 from 64 rows the
    fastest passing launch its evidence covers in its run (2026-12-07), at M = 64 and 320, for every
    projection of TinyLlama-1.1B's and Llama-3-8B's shapes but two (each within 4% per call of it); every
    tiling of the engine's order."""
    qkv = I.invariant_tiling(2560, 2048, torch.bfloat16)  # TinyLlama-1.1B: 160 column tiles of 16
    head = I.invariant_tiling(128256, 4096, torch.bfloat16)  # Llama-3-8B's LM head: block_n 64, 32 chunks
    assert I.launch_tiling(qkv, 1, 2560, 2048) == replace(qkv, block_n=32) == I.launch_tiling(qkv, 64, 2560, 2048)
    assert I.launch_tiling(head, 16, 128256, 4096) == replace(head, num_stages=4)
    assert I.launch_tiling(head, 64, 128256, 4096) == head
    h200 = "NVIDIA H200"
    assert I.launch_tiling(head, 64, 128256, 4096, h200) == replace(head, block_m=64, row_tiles=1, span=0)
    assert I.launch_tiling(qkv, 64, 2560, 2048, h200) == replace(qkv, block_n=32)  # 160 column tiles: too few
    assert I.launch_tiling(qkv, 320, 2560, 2048, h200) == replace(qkv, block_m=64, row_tiles=1, span=0, block_n=64,
                                                                  num_stages=3)
    assert I.launch_tiling(qkv, 320, 2560, 2048) == replace(qkv, span=0)
    for m in (1, 16, 63):  # below 64 rows the H100 launches as every card does
        assert I.launch_tiling(qkv, m, 2560, 2048, H100) == I.launch_tiling(qkv, m, 2560, 2048)
    assert I.launch_tiling(qkv, 64, 2560, 2048, H100) == replace(qkv, **I.MMA64_LAUNCHES["m64_n64"])
    down = I.invariant_tiling(4096, 14336, torch.bfloat16)  # Llama-3-8B's down: K > LONG_K
    assert I.launch_tiling(down, 64, 4096, 14336, H100) == replace(down, **I.MMA64_LAUNCHES["m64_n64_s4_serial"])
    assert I.launch_tiling(down, 320, 4096, 14336, H100) == replace(down, **I.MMA64_LAUNCHES["m64_n128_w8_serial"])
    assert I.launch_tiling(qkv, 320, 2560, 2048, H100) == I.launch_tiling(qkv, 320, 2560, 2048, h200)
    assert I.launch_tiling(head, 65, 128256, 4096, H100) == replace(head, **I.MMA64_LAUNCHES["m64_n128_w8_serial"])
    for t, n, k in ((qkv, 2560, 2048), (head, 128256, 4096)):
        assert {I.launch_tiling(t, m, n, k, gpu).order() for m in (1, 16, 17, 64, 65, 320)
                for gpu in (None, h200, H100)} == {t.order()}
    off = []  # (shape, projection, M) where the H100's launch is not its run's fastest covered launch
    ev = I.MMA64_CARDS[H100]
    for part in evidence(ev.results)["parts"]:
        n, k, fam = part["n"], part["k"], part["families"]["engine"]
        t = I.invariant_tiling(n, k, torch.bfloat16)
        if (n, k) not in ev.products:
            continue
        for m in (64, 320):
            us = {c: v for c, v in fam["timing_us"][str(m)].items() if c in ev.launches}
            best = measured(part["candidates"]["engine"][min(us, key=us.get)])
            as_run = lambda x: replace(x, span=0) if x.slices(k) == 1 else x  # noqa: E731  (one slice: span is moot)
            if as_run(I.launch_tiling(t, m, n, k, H100)) != as_run(best):
                off.append((part["shape"], part["projection"], m))
                assert us[I.mma64_launch(t, m, n, k, H100)] < 1.04 * min(us.values()), off[-1]
    assert off == [("llama3-8b", "o", 64), ("llama3-8b", "o", 320)]


def test_a_tilings_launch_choices_keep_its_order_and_a_rows_bits():
    """One order (block_k 64, slices of 1 chunk: 4 slices; float32, where every rounding shows) computed
    with 1 or all 4 slices per program, 1-4 row tiles of 16 or 32 rows, 16 or 32 columns, 2 or 4 warps:
    every row of the 70-row pass has the bits of the first tiling's rows alone, and each tiling's sum
    agrees with the reference."""
    x, w = operands(torch.float32)
    first = I.InvariantTiling(16, 16, 64, 1, 1)
    alone = torch.cat([I.launch(x[i : i + 1], w, False, first) for i in EDGES])
    want = I.invariant_matmul_reference(x, w)
    for t in (replace(first, span=0), replace(first, span=0, row_tiles=2), replace(first, block_n=32, span=0),
              replace(first, block_m=32, row_tiles=1, num_warps=2), replace(first, row_tiles=3)):
        assert t.order() == first.order() and t.slices(K) == 4 and t.partials(K) == 4 // (t.span or 4)
        got = I.launch(x, w, False, t)
        assert torch.equal(got[list(EDGES)], alone), t
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("field, value, match", [("span", 3, "span=3 must be 1"), ("row_tiles", 5, "row_tiles=5"),
                                                 ("block_m", 24, "block_m=24 must be a power of two"),
                                                 ("preload", 3, "need 1 <= preload <= chunks")])
def test_a_bad_tiling_is_refused_by_name(field, value, match):
    with pytest.raises(ValueError, match=match):
        replace(I.InvariantTiling(16, 16, 64, 2, 1), **{field: value})


def test_more_rows_than_the_counters_cover_run_in_pieces(monkeypatch):
    """A grid with more tiles than the counters runs as launches of whole row groups (here 64 + 6 rows):
    the same bits as one launch."""
    x, w = operands(torch.bfloat16)
    whole = I.invariant_matmul(x, w)
    monkeypatch.setattr(I, "COUNTERS", 3)  # 3 column tiles: one row group per launch
    assert torch.equal(I.invariant_matmul(x, w), whole)


def test_one_chunk_slices_are_summed_from_zero_on_sm90():
    """compile_invariant_sm90.py: compiled for sm_90, every dot of SmolLM2-135M's one-chunk slices starts from
    zero in both launch kinds (partials and one program over every slice), with every epilogue. Before ``add_kept`` Triton's combine pass fused the serial launch's slice sums into the running
    total, so 320-row scoring passes and large prefills rounded otherwise than a row alone (the H100,
    2026-12-07: 504 of 2,304 rows of the qkv product)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("compile_invariant_sm90.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    # 16 rows (partials, serial), 64, 128 (serial); each plain, with the SwiGLU and with the RoPE epilogue
    assert out.stdout.count("0 onto a non-zero") == 12, out.stdout
