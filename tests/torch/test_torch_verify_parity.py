"""Parity: NumPy oracle == torch reference == Triton (fused, split-V two launches with each sweep the GPU's
default takes), token for token. Every case runs the reference, the default kernel and the split launches; the
slot-vote and tile-vote configurations (the interpreter's slowest) run on one shape of each parametrized test,
so each sees every sampling mode, and on the edge-case tests below (pruning, bf16 pairs)."""

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from torch_helpers import make_inputs

from flashspec import reference as oracle
from flashspec.config import SamplingConfig
from flashspec_torch import KernelConfig, verify, verify_triton

fv = importlib.import_module("flashspec_torch.verify")  # the module (the package exports its verify function)
SPLIT = KernelConfig(block_b=2, block_v=256, sweep_v=128, num_chunks=4,  # V over 4 programs: two launches,
                     sweep_chunks=7, sweep_warps=2, pdl=True,  # the final launch's own split of row n (PDL: GPU only)
                     prune=False)  # no pruning (the GPU's default under ~8 sweep tiles a program, B < 32)
# the slot vote with the sweep split finer, one warp a program, bf16 pairs (the GPU's default from B = 128)
SLOTS_SPLIT = KernelConfig(block_b=1, block_v=128, sweep_v=64, num_chunks=3, sweep_chunks=5, sweep_warps=1,
                           sweep_slots=4, pdl=True, bf16_pairs=True)
TILE_VOTE = KernelConfig(block_b=4, block_v=128, sweep_v=256, num_chunks=3)  # one pruning vote per sweep tile


def as_torch(a):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def run_all(inp, cfg, *, seed=7, offset=3, logprobs=False, dtype=torch.float32, split=SPLIT, variants=True,
            lengths=None):
    """(oracle, [torch reference, triton fused, triton split, and with ``variants`` the slot and tile votes])
    results as numpy (n, tokens) pairs; ``lengths``: draft_lengths [B] (NumPy int32), or None."""
    z, w = as_torch(inp.z).to(dtype), as_torch(inp.w)
    w = None if w is None else w.to(dtype)
    zf = z.float().numpy()  # the oracle sees the same upcast values
    wf = None if w is None else w.float().numpy()
    lq = inp.lq if logprobs else None
    kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    np_seed = seed.numpy().astype(np.uint64) if isinstance(seed, torch.Tensor) else seed
    np_offset = offset.numpy().astype(np.uint64) if isinstance(offset, torch.Tensor) else offset
    want = oracle_result(zf, inp.x, wf, lq, cfg, seed=np_seed, offset=np_offset, lengths=lengths)
    x, lq_t, lt = as_torch(inp.x), as_torch(lq), as_torch(lengths)
    got = [verify(z, x, w, lq_t, seed=seed, offset=offset, impl=impl, draft_lengths=lt, **kw)
           for impl in ("reference", "triton")]
    got.append(verify_triton(z, x, w, lq_t, cfg, seed, offset, config=split, draft_lengths=lt))
    if variants:
        got.extend(verify_triton(z, x, w, lq_t, cfg, seed, offset, config=c, draft_lengths=lt)
                   for c in (SLOTS_SPLIT, TILE_VOTE))
    return want, [(r.num_accepted.numpy(), r.tokens.numpy()) for r in got]


def oracle_result(z, x, w, lq, cfg, *, seed=7, offset=3, lengths=None):
    """The NumPy oracle's (num_accepted, tokens): run_all's want, and alone for tests of kernel variants."""
    want = oracle.verify(z, x, w, lq, seed=seed, offset=offset, temperature=cfg.temperature, top_k=cfg.top_k,
                         top_p=cfg.top_p, draft_lengths=lengths)
    return want.num_accepted, want.tokens


def assert_parity(want, got, variants=True):
    assert len(got) == (5 if variants else 3)
    names = ("torch reference", "triton fused", "triton split-V", "triton split-V slot vote",
             "triton split-V tile vote")
    for name, (n, t) in zip(names, got):
        assert n.dtype == np.int32 and t.dtype == np.int32, name
        np.testing.assert_array_equal(n, want[0], err_msg=f"{name}: num_accepted")
        np.testing.assert_array_equal(t, want[1], err_msg=f"{name}: tokens")


SHAPES = [(1, 1, 1000), (3, 4, 4099), (8, 8, 1000), (3, 1, 33), (8, 4, 258)]


# per-row draft lengths: every L in [0, G] twice; ids past L_b are real (mostly acceptable) tokens in even rows, so
# a kernel that ignored L_b would accept them, and -1 in odd rows (never read)
RAGGED = [  # (temperature, top_k, onehot, logprobs, variants)
    (0.0, 0, False, False, False), (1.0, 0, False, False, True), (0.8, 5, True, False, False),
    (1.3, 0, False, True, False),
]


@pytest.mark.parametrize("temperature,top_k,onehot,logprobs,variants", RAGGED)
def test_parity_per_row_draft_lengths(temperature, top_k, onehot, logprobs, variants):
    rng = np.random.default_rng(int(temperature * 10) + top_k + 100 * onehot)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k)
    b, g = 10, 4
    inp = make_inputs(rng, b, g, 258, cfg, onehot=onehot, spread=1.0, noise=0.2)  # mostly accepted: n reaches L_b
    lengths = np.resize(np.arange(g + 1, dtype=np.int32), b)
    past = (np.arange(g)[None] >= lengths[:, None]) & (np.arange(b)[:, None] % 2 == 1)
    inp = dataclasses.replace(inp, x=np.where(past, -1, inp.x))
    want, got = run_all(inp, cfg, logprobs=logprobs, variants=variants, lengths=lengths)
    assert_parity(want, got, variants)
    assert ((want[0] == lengths) & (lengths < g)).any()  # a short row fully accepted: y from p at L_b


@pytest.mark.parametrize("b,g,v", SHAPES)
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 2.0])
def test_parity_sampled_drafts(b, g, v, temperature):
    rng = np.random.default_rng(b * 1000 + g * 10 + v + int(temperature * 100))
    cfg = SamplingConfig(temperature=temperature)
    inp = make_inputs(rng, b, g, v, cfg)
    variants = (b, g, v) == SHAPES[1]
    want, got = run_all(inp, cfg, variants=variants)
    assert_parity(want, got, variants)


@pytest.mark.parametrize("b,g,v", [(3, 4, 1000), (8, 8, 258), (1, 1, 4099)])
@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.8), (50, 0.9), (1, 1.0)])
def test_parity_top_k_top_p(b, g, v, top_k, top_p):
    rng = np.random.default_rng(top_k + int(100 * top_p) + v)
    cfg = SamplingConfig(temperature=0.8, top_k=top_k, top_p=top_p)
    inp = make_inputs(rng, b, g, v, cfg, noise=0.3)
    variants = v == 1000
    want, got = run_all(inp, cfg, variants=variants)
    assert_parity(want, got, variants)


@pytest.mark.parametrize("b,g,v", [(3, 4, 1000), (8, 8, 257), (1, 1, 4099)])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0), (0.9, 0.85)])
def test_parity_one_hot_drafts(b, g, v, temperature, top_p):
    rng = np.random.default_rng(v + g)
    cfg = SamplingConfig(temperature=temperature, top_p=top_p)
    inp = make_inputs(rng, b, g, v, cfg, onehot=True, spread=3.0)
    variants = v == 257
    want, got = run_all(inp, cfg, variants=variants)
    assert_parity(want, got, variants)


@pytest.mark.parametrize("b,g,v", [(3, 4, 1000), (8, 8, 4099), (1, 1, 33)])
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (1.3, 0), (0.8, 20)])
def test_parity_draft_logprobs_given(b, g, v, temperature, top_k):
    rng = np.random.default_rng(v * 3 + g)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k)
    inp = make_inputs(rng, b, g, v, cfg)
    variants = v == 1000
    want, got = run_all(inp, cfg, logprobs=True, variants=variants)
    assert_parity(want, got, variants)


@pytest.mark.parametrize("kind", ["per-row", "scalar-tensor", "big-int", "big-tensor"])
def test_parity_seed_and_offset_forms(kind):
    b, g, v = 8, 4, 300
    rng = np.random.default_rng(5)
    cfg = SamplingConfig(temperature=1.0)
    inp = make_inputs(rng, b, g, v, cfg)
    seed, offset = {
        "per-row": (torch.arange(100, 100 + b), torch.arange(b) * 7),
        "scalar-tensor": (torch.tensor(12345), torch.tensor(9, dtype=torch.int32)),
        "big-int": (2**64 - 3, 2**32 - 1),
        "big-tensor": (torch.tensor([2**63 + 5 - 2**64] * b), torch.tensor(2**31 + 3)),
    }[kind]
    variants = kind == "per-row"
    want, got = run_all(inp, cfg, seed=seed, offset=offset, variants=variants)
    assert_parity(want, got, variants)


def test_per_row_seed_follows_the_request_not_the_row():
    b, g, v = 4, 2, 100
    cfg = SamplingConfig()
    inp = make_inputs(np.random.default_rng(1), 1, g, v, cfg)
    z = torch.from_numpy(np.repeat(inp.z, b, 0))
    x, w = torch.from_numpy(np.repeat(inp.x, b, 0)), torch.from_numpy(np.repeat(inp.w, b, 0))
    for impl in ("reference", "triton"):
        res = verify(z, x, w, seed=torch.full((b,), 42), impl=impl)
        assert (res.tokens == res.tokens[:1]).all(), impl  # same seed, same request: same tokens


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parity_half_precision_inputs(dtype, temperature):
    rng = np.random.default_rng(17)
    cfg = SamplingConfig(temperature=temperature)
    inp = make_inputs(rng, 3, 4, 1000, cfg)
    want, got = run_all(inp, cfg, dtype=dtype)
    assert_parity(want, got)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(3)
    cfg = SamplingConfig(temperature=0.9)
    inp = make_inputs(rng, 4, 3, 200, cfg)
    want = oracle.verify(inp.z, inp.x, inp.w, temperature=0.9, seed=1)
    z = torch.from_numpy(inp.z).transpose(0, 1).contiguous().transpose(0, 1)  # batch stride < row stride
    x = torch.from_numpy(inp.x).t().contiguous().t()
    w = torch.from_numpy(np.concatenate([inp.w, inp.w], -1))[..., :200]  # V stride 1, row stride 400
    for impl in ("reference", "triton"):
        res = verify(z, x, w, temperature=0.9, seed=1, impl=impl)
        np.testing.assert_array_equal(res.tokens.numpy(), want.tokens, err_msg=impl)


def test_many_rows_many_samples_match():
    """A larger batch (tiles of 128 rows a program, a partial last one) over several offsets: every row
    identical. The one-row-a-program variants add nothing at this size."""
    rng = np.random.default_rng(99)
    cfg = SamplingConfig(temperature=1.0)
    inp = make_inputs(rng, 300, 3, 40, cfg, spread=1.0, noise=0.5)
    split = KernelConfig(block_b=128, block_v=16, sweep_v=16, num_chunks=3)
    for offset in range(3):
        want, got = run_all(inp, cfg, offset=offset, split=split, variants=False)
        assert_parity(want, got, variants=False)


@pytest.mark.parametrize("spread", [1.0, 6.0])  # flat rows, and peaked ones where most tiles are passed over
@pytest.mark.parametrize("onehot", [False, True])
def test_pruned_sweep_matches_the_oracle(spread, onehot):
    """KernelConfig(prune=True) skips the keys of tiles that cannot hold the winner: same tokens."""
    rng = np.random.default_rng(int(spread) + 10 * onehot)
    cfg = SamplingConfig(temperature=0.9)
    inp = make_inputs(rng, 4, 3, 775, cfg, spread=spread, onehot=onehot)  # 25 sweep tiles, a ragged last one
    want = oracle_result(inp.z, inp.x, inp.w, None, cfg)
    z, x = torch.from_numpy(inp.z), torch.from_numpy(inp.x)
    w = None if inp.w is None else torch.from_numpy(inp.w)
    slots = dict(sweep_slots=8)  # one vote per slot of 4 logits (kernels/slots.py)
    split_slots = dict(sweep_chunks=9, sweep_slots=4)
    for prune, chunks, block_b, more in (
            (True, 1, 2, {}), (True, 3, 1, {}),  # block_b=1: the GPU's scalar path (prune=False: every parity test)
            (True, 3, 1, slots), (True, 1, 2, slots), (True, 2, 2, split_slots),
            (True, 2, 1, dict(sweep_chunks=15, sweep_slots=4))):  # 1-2 tiles a program
        kc = KernelConfig(block_b=block_b, block_v=256, sweep_v=32, num_chunks=chunks, prune=prune, **more)
        got = verify_triton(z, x, w, None, cfg, 7, 3, config=kc)
        np.testing.assert_array_equal(got.num_accepted.numpy(), want[0], err_msg=f"{kc}")
        np.testing.assert_array_equal(got.tokens.numpy(), want[1], err_msg=f"{kc}")


def test_pruning_floor_is_the_lower_of_the_two_keys():
    """The sweep's floor K must be min(best key_p, best key_r): key_r <= key_p, so a floor from key_p
    alone (max for min) passes over the residual's winner. Rows built for it: the drafted token 7
    has q = 0.99 against p = 0.5 (rejected half the time, no residual mass there), and it sits in the
    first tile with a key_p as high as the flat rest's, where the residual's winner is."""
    rng = np.random.default_rng(5)
    b, v = 6, 1000
    z = (rng.normal(size=(b, 2, v)) * 0.5).astype(np.float32)
    w = z[:, :1].copy()
    z[:, :, 7] = np.log(v)  # p(7) ~ 1/2
    w[:, :, 7] = np.log(v) + 5.3  # q(7) ~ 0.99
    x = np.full((b, 1), 7, dtype=np.int64)
    cfg = SamplingConfig(temperature=1.0)
    zt, xt, wt = torch.from_numpy(z), torch.from_numpy(x), torch.from_numpy(w)
    configs = [KernelConfig(block_b=1, block_v=256, sweep_v=32, num_chunks=2),
               KernelConfig(block_b=2, block_v=256, sweep_v=32, num_chunks=1),  # fused
               KernelConfig(block_b=1, block_v=256, sweep_v=32, num_chunks=2, sweep_slots=8)]
    rejected = 0
    for offset in range(4):
        want = oracle.verify(z, x, w, None, seed=7, offset=offset, temperature=1.0)
        rejected += int((want.num_accepted == 0).sum())
        for kc in configs:
            got = verify_triton(zt, xt, wt, None, cfg, 7, offset, config=kc)
            np.testing.assert_array_equal(got.num_accepted.numpy(), want.num_accepted, err_msg=f"{kc}")
            np.testing.assert_array_equal(got.tokens.numpy(), want.tokens, err_msg=f"{kc}")
    assert rejected >= 8, f"only {rejected} of {4 * b} rows rejected: the rows no longer test the residual draw"


def padded(a):  # [B, R, V] -> the same values in rows of V + 64, the 64 past V at 80 (a read past V picks them)
    big = torch.full((*a.shape[:2], a.shape[2] + 64), 80.0, dtype=a.dtype)
    big[..., :a.shape[2]] = a
    return big[..., :a.shape[2]]


@pytest.mark.parametrize("onehot", [False, True])
def test_bf16_pairs_match_the_oracle(onehot):
    """bfloat16 rows of unit stride and even V: the slot-vote sweep reads them as int32 pairs, widened by hand
    (KernelConfig.bf16_pairs, slots.load_slot_tile / tile_floats): whole tiles without bounds, then the partial
    one; fused, split, a sweep split finer, a dead row in the last batch tile, 2-8 slots;
    rows strided past V, with logits there that would win if read; bonus tokens forced at 7 places along the
    row, the last in the partial tile (a tile left out fails it). The oracle's tokens on the upcast values,
    as with plain loads (an odd V, which cannot be read in pairs)."""
    rng = np.random.default_rng(77 + onehot)
    cfg = SamplingConfig(temperature=0.9)
    configs = (dict(block_b=2, sweep_v=64, num_chunks=2, sweep_slots=4),
               dict(block_b=1, sweep_v=32, num_chunks=2, sweep_chunks=12, sweep_slots=8),
               dict(block_b=2, sweep_v=32, num_chunks=2, sweep_slots=4),
               dict(block_b=2, sweep_v=64, num_chunks=1, sweep_slots=2))  # fused: one pair per thread and row
    for b, v, pairs, forced in ((3, 380, True, False), (3, 381, False, False), (7, 380, True, True)):
        inp = make_inputs(rng, b, 3, v, cfg, onehot=onehot, spread=4.0)
        bonus = v - 1 - ((b - 1 - np.arange(b)) * v) // b  # spread along the row, the last in the partial tile
        if forced:  # drafts of p ~ 1 (all accepted) and a bonus token of p ~ 1: every program's tiles must be swept
            inp.z[np.arange(b)[:, None], np.arange(3), inp.x] = 40.0
            inp.z[np.arange(b), 3, bonus] = 40.0
        z, w = (None if a is None else padded(torch.from_numpy(a).bfloat16()) for a in (inp.z, inp.w))
        assert fv.bf16_pairs(z) is pairs and (w is None or fv.bf16_pairs(w) is pairs)
        want = oracle_result(z.float().numpy(), inp.x, None if w is None else w.float().numpy(), None, cfg)
        if forced:
            assert (want[1][:, 3] == bonus).all(), "the rows no longer force the bonus tokens"
        for more in configs if pairs else configs[:1]:
            kc = KernelConfig(block_v=256, bf16_pairs=True, **more)
            got = verify_triton(z, torch.from_numpy(inp.x), w, None, cfg, 7, 3, config=kc)
            np.testing.assert_array_equal(got.num_accepted.numpy(), want[0], err_msg=f"{v=} {kc}")
            np.testing.assert_array_equal(got.tokens.numpy(), want[1], err_msg=f"{v=} {kc}")
