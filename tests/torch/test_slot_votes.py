"""The slot sweep's vote (``kernels/slots.slot_votes``) against its exact condition, logit by logit.

A logit j of row n can reach the pruning floor K only if its bound lp2 + 23 - log2(t') does (t' = 2**23 - 1 -
(mix(key ^ j) >> 9)), i.e. t' <= 2**d with d = lp2 + 23 - K + slack. The vote must be set for every such
logit (or the sweep can pass over a winner) and for few others (or the pruning is gone). The parity tests
reach these cases only by chance; here every logit is checked on its own.
"""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashspec import random as counter
from flashspec_torch.kernels.lanes import PRUNE_SLACK
from flashspec_torch.kernels.slots import slot_votes


@triton.jit
def votes_kernel(x_ptr, out_ptr, key_n, floor, N: tl.constexpr, S: tl.constexpr):  # x, out: [V] f32, i32
    col = tl.arange(0, S)[None, None, :]  # [1, 1, S]
    j_t = tl.program_id(0) * N * S + tl.arange(0, N)[None, :, None] * S  # [1, N, 1]
    x = tl.load(x_ptr + j_t + col)
    vote = slot_votes(x, j_t, col, 1.0, 0.0, floor, key_n, 1.0, 1.0, 0.0, 0, False, False)
    tl.store(out_ptr + j_t + col, vote)


def exact_condition(lp2, j, key_n, floor):  # [V] f32, [V] -> [V] bool: t' <= 2**d
    m = (counter.mix(np.uint32(key_n) ^ j.astype(np.uint32)) >> np.uint32(9)).astype(np.int64)
    t = (2**23 - 1 - m).astype(np.float64)
    d = lp2.astype(np.float64) + 23.0 - floor + PRUNE_SLACK.value
    return t <= np.exp2(d)


@pytest.mark.parametrize("slots", [2, 4, 8])
def test_slot_votes_cover_every_logit_that_can_reach_the_floor(slots):
    rng = np.random.default_rng(slots)
    n, programs = 64, 16
    v = n * slots * programs
    floor = 3.0
    lp2 = rng.uniform(-14.0, 0.0, v).astype(np.float32) + np.float32(floor)  # P(exact) from 2**-14 to 1
    key_n = int(rng.integers(0, 2**32))
    out = torch.empty(v, dtype=torch.int32)
    votes_kernel[(programs,)](torch.from_numpy(lp2), out, key_n, floor, N=n, S=slots)
    j = np.arange(v)
    voted = (out.numpy() >> (j % slots)) & 1 == 1
    must = exact_condition(lp2, j, key_n, floor)
    assert must.sum() > 200, "the inputs no longer put logits near the bound"
    missed = np.flatnonzero(must & ~voted)
    assert missed.size == 0, f"{missed.size} logits that can reach the floor were not voted, e.g. {missed[:5]}"
    assert (out.numpy() & ~(1 << (j % slots))).max() == 0, "a logit voted outside its own slot's bit"
    # the weaker test votes a few more: 128 a <= t' + 127 (a = 65535 - mix >> 16), not many more
    assert voted.sum() <= 1.05 * must.sum() + 64, f"{voted.sum()} votes for {must.sum()} logits that need one"
