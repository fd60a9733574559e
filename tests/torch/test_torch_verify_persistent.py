"""The persistent schedule of the split verify (KernelConfig(schedule="persistent"), kernels/persistent.py):
its ticket order, its counters (back at zero after every call, so a second call or a graph replay
gives the same tokens), and tokens independent of P and the lookahead. Oracle parity is in
test_torch_verify_parity.py."""

import dataclasses

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from torch_helpers import make_inputs

from flashspec.config import SamplingConfig
from flashspec_torch import KernelConfig, verify_triton
from flashspec_torch import persistent as schedule
from flashspec_torch.kernels.persistent import ticket_item

BASE = KernelConfig(block_b=2, block_v=128, sweep_v=64, num_chunks=3, schedule="persistent", programs_per_sm=2)


@triton.jit
def tickets_kernel(out_ptr, items, tiles, C, C2, L, BLOCK: tl.constexpr):
    t = tl.arange(0, BLOCK)
    phase2, tile, c = ticket_item(t, tiles, C, C2, L)
    mask = t < items
    tl.store(out_ptr + 3 * t, phase2, mask=mask)
    tl.store(out_ptr + 3 * t + 1, tile, mask=mask)
    tl.store(out_ptr + 3 * t + 2, c, mask=mask)


@pytest.mark.parametrize("tiles,c,c2,lookahead", [(5, 3, 3, 2), (5, 3, 1, 1), (1, 4, 4, 1), (7, 2, 2, 7), (4, 1, 1, 3)])
def test_ticket_order(tiles, c, c2, lookahead):
    """Every item exactly once; a tile's phase-2 items after all of its phase-1 items and after
    the phase-1 items of tile k + L (the lookahead)."""
    items = tiles * (c + c2)
    out = torch.full((3 * 64,), -1, dtype=torch.int32)
    tickets_kernel[(1,)](out, items, tiles, c, c2, lookahead, BLOCK=64)
    order = [tuple(r) for r in out[:3 * items].view(items, 3).tolist()]
    want = {(0, k, j) for k in range(tiles) for j in range(c)} | {(1, k, j) for k in range(tiles) for j in range(c2)}
    assert len(order) == len(set(order)) == len(want) and set(order) == want
    pos = {item: t for t, item in enumerate(order)}
    for k in range(tiles):
        first_phase2 = min(pos[(1, k, j)] for j in range(c2))
        ahead = min(k + lookahead, tiles - 1)
        assert first_phase2 > max(pos[(0, kk, j)] for kk in range(ahead + 1) for j in range(c))


def inputs(b=5, g=3, v=700, temperature=0.9, onehot=False, seed=0):
    cfg = SamplingConfig(temperature=temperature)
    inp = make_inputs(np.random.default_rng(seed), b, g, v, cfg, onehot=onehot)
    w = None if inp.w is None else torch.from_numpy(inp.w)
    return cfg, torch.from_numpy(inp.z), torch.from_numpy(inp.x), w


@pytest.mark.parametrize("temperature,onehot", [(0.9, False), (0.0, False), (1.0, True)])
def test_counters_back_at_zero_and_a_second_call_repeats(temperature, onehot):
    cfg, z, x, w = inputs(temperature=temperature, onehot=onehot)
    first = verify_triton(z, x, w, None, cfg, 11, 4, config=BASE)
    ws = schedule.workspaces[z.device]
    assert ws.dtype == torch.int32 and not ws.any(), "counters not back at zero after the launch"
    second = verify_triton(z, x, w, None, cfg, 11, 4, config=BASE)
    assert schedule.workspaces[z.device] is ws and not ws.any()
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.num_accepted, second.num_accepted)
    split = verify_triton(z, x, w, None, cfg, 11, 4, config=dataclasses.replace(BASE, schedule="two_launch"))
    assert torch.equal(first.tokens, split.tokens) and torch.equal(first.num_accepted, split.num_accepted)


@pytest.mark.parametrize("programs,lookahead", [(1, 0), (1, 1), (4, 1), (7, 2), (50, 100)])
def test_tokens_do_not_depend_on_programs_or_lookahead(programs, lookahead):
    cfg, z, x, w = inputs(b=4, g=2, v=300, seed=3)
    ref = verify_triton(z, x, w, None, cfg, 5, 1, config=KernelConfig(block_b=1, block_v=64, sweep_v=32, num_chunks=3))
    kc = KernelConfig(block_b=1, block_v=64, sweep_v=32, num_chunks=3, schedule="persistent",
                      programs_per_sm=programs, lookahead=lookahead)
    got = verify_triton(z, x, w, None, cfg, 5, 1, config=kc)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.num_accepted, ref.num_accepted)
    assert not schedule.workspaces[z.device].any()


def test_workspace_grows_and_is_replaced_after_a_failed_launch():
    dev = torch.device("cpu")
    small = schedule.buffer(dev, 4)
    big = schedule.buffer(dev, 5000)
    assert big.numel() >= schedule.HEAD + 2 * 5000 and not big.any()
    assert small is big or any(r is small for r in schedule.retired)  # kept alive: a graph may point at it
    with pytest.raises(RuntimeError, match="boom"):
        with schedule.workspace(dev, 3) as (ticket, counter, ready):
            assert ticket.numel() == 1 and counter.numel() == ready.numel() == 3
            ready.fill_(2)  # a launch that stopped half-way
            raise RuntimeError("boom")
    assert not schedule.buffer(dev, 3).any()  # a fresh, zeroed buffer


@pytest.mark.parametrize("field,value", [("schedule", "persistant"), ("programs_per_sm", 0), ("lookahead", -1),
                                         ("max_registers", 16)])
def test_schedule_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        KernelConfig(**{field: value})


@pytest.mark.parametrize("sweep_chunks,slots", [(5, 4), (2, 0), (7, 4)])
@pytest.mark.parametrize("temperature,onehot,logprobs", [(0.9, False, False), (0.0, False, False), (1.0, True, False),
                                                         (0.7, False, True)])
def test_own_sweep_split_and_slot_vote_match_two_launches(sweep_chunks, slots, temperature, onehot, logprobs):
    """Phase-2 items of their own split of row n (sweep_chunks != num_chunks) with the slot vote give
    the tokens of two launches with the same sweep split (and of the persistent default)."""
    cfg = SamplingConfig(temperature=temperature)
    inp = make_inputs(np.random.default_rng(7), 4, 3, 700, cfg, onehot=onehot)
    z, x = torch.from_numpy(inp.z), torch.from_numpy(inp.x)
    w = None if inp.w is None else torch.from_numpy(inp.w)
    lq = torch.from_numpy(inp.lq) if logprobs else None  # the draft's log q(x) given beside its logits
    kc = dataclasses.replace(BASE, sweep_chunks=sweep_chunks, sweep_slots=slots, prune=True)
    got = verify_triton(z, x, w, lq, cfg, 21, 3, config=kc)
    assert not schedule.workspaces[z.device].any(), "counters not back at zero after the launch"
    for other in (dataclasses.replace(kc, schedule="two_launch"), BASE):
        want = verify_triton(z, x, w, lq, cfg, 21, 3, config=other)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted), other
