"""Plain sampled decoding (T > 0) as one kernel: ``sample_next_kernel`` (``@triton.jit`` code only; the
launcher and its plain torch reference are in ``flashspec_torch.sample_next``).

One program per batch row streams the row's logits three times: the maximum of the scaled, filtered
logits s (and the fault screen), the sum of exp(s - m), then the Gumbel-max draw
argmax(s - (m + log l) + g) with g = -log(-log u), u the generator's FINAL-stream uniform at position 0,
as ``flashspec_torch.sampling.sample`` computes it with some thirty [B, V] torch ops. Nothing of size
V is written.
"""

import triton
import triton.language as tl

from .lanes import keep
from .random import key, mix, uniform_from_bits
from .verify import row_counters

NEG_INF = tl.constexpr(float("-inf"))
BIG = tl.constexpr(2147483647)
FINAL_STREAM = tl.constexpr(1)  # flashspec.random.FINAL


@triton.jit
def scaled(z_ptr, row, v, V, T, thr, tid, FILTER: tl.constexpr):  # -> float32 [BLOCK_V]: filter(z / T), -inf past V
    x = tl.load(z_ptr + row + v, mask=v < V, other=NEG_INF).to(tl.float32)
    s = tl.math.div_rn(x, T)
    if FILTER:
        s = keep(s, v, thr, tid)
    return s


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset_lo"])  # new seeds / offsets never recompile
def sample_next_kernel(
    z_ptr, thr_ptr, tid_ptr,  # z [B, V] logits (row stride given); thr [B] float32, tid [B] int32 (FILTER only)
    seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,  # as verify_final_kernel's counters
    tokens_ptr, num_ptr, bad_ptr,  # tokens [B, 2] int32; num [B] int32; bad [B] uint8
    V, stride_b, T,
    FILTER: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, PER_ROW_SEED: tl.constexpr,
    FLAG: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """tokens[b] = (the draw, -1), num[b] = 0; bad[b] = FLAG when the row holds a NaN or +inf or no finite
    logit (``faults.nonfinite_rows``), else 0; a flagged row's token is 0 (the commit discards it)."""
    b = tl.program_id(0)
    row = b.to(tl.int64) * stride_b
    lane = tl.arange(0, BLOCK_V)
    thr = NEG_INF
    tid = BIG
    if FILTER:
        thr = tl.load(thr_ptr + b)
        tid = tl.load(tid_ptr + b)
    m_lane = tl.full((BLOCK_V,), NEG_INF, tl.float32)
    bad_lane = lane < 0  # all False
    finite_lane = lane < 0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + lane
        x = tl.load(z_ptr + row + v, mask=v < V, other=NEG_INF).to(tl.float32)
        bad_lane = bad_lane | (x != x) | (x == float("inf"))
        finite_lane = finite_lane | ((x == x) & (x != float("inf")) & (x != NEG_INF))
        m_lane = tl.maximum(m_lane, scaled(z_ptr, row, v, V, T, thr, tid, FILTER))
    bad = (tl.max(bad_lane.to(tl.int32), axis=0) > 0) | (tl.max(finite_lane.to(tl.int32), axis=0) == 0)
    m = tl.max(m_lane, axis=0)
    m = tl.where(bad, 0.0, m)  # a flagged row's draw is discarded: keep its arithmetic finite
    l_lane = tl.zeros((BLOCK_V,), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        s = scaled(z_ptr, row, v0 + lane, V, T, thr, tid, FILTER)
        l_lane += tl.where(s == NEG_INF, 0.0, tl.exp(s - m))
    c = m + tl.log(tl.where(bad, 1.0, tl.sum(l_lane, axis=0)))  # log-sum-exp: log p = s - c
    lo, hi, off, r = row_counters(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,
                                  tl.full((1,), 0, tl.int32) + b, tl.full((1,), 1, tl.int1),
                                  SEED_TENSOR, OFFSET_TENSOR, PER_ROW_SEED)
    k = key(lo, hi, off, r, tl.full((1,), 0, tl.uint32), tl.full((1,), FINAL_STREAM, tl.uint32))  # [1]
    best = tl.full((BLOCK_V,), NEG_INF, tl.float32)
    best_i = tl.full((BLOCK_V,), BIG, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + lane
        s = scaled(z_ptr, row, v, V, T, thr, tid, FILTER)
        u = uniform_from_bits(mix(k ^ v.to(tl.uint32)))
        score = (s - c) + -tl.log(-tl.log(u))
        take = (score > best) & (v < V)  # strict: a lane keeps its earliest maximum
        best = tl.where(take, score, best)
        best_i = tl.where(take, v, best_i)
    top = tl.max(best, axis=0)
    pick = tl.min(tl.where(best == top, best_i, BIG), axis=0)
    token = tl.where(bad | (pick == BIG), 0, pick)
    tl.store(tokens_ptr + b * 2, token)
    tl.store(tokens_ptr + b * 2 + 1, -1)
    tl.store(num_ptr + b, 0)
    tl.store(bad_ptr + b, tl.where(bad, FLAG, 0).to(tl.uint8))
