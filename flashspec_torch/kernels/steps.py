"""Per-row bookkeeping of a decoding step as single kernels (``@triton.jit`` code only; the torch
references and the launchers are ``TorchBackend.commit_device`` / ``LookupDraft.propose``).

In a CUDA-graphed step each of these replaces some twenty tiny torch launches, which on a GPU
cost more than the work they do.

* ``commit_kernel``: append a row's emitted tokens (cut at the first EOS and at max_new_tokens),
  advance its length, flag it done.
* ``lookup_kernel``: prompt lookup: the latest earlier occurrence of the row's last n tokens
  (n = MAX_N .. 1, the longest match wins) and the G tokens that followed it.
* ``greedy_next_kernel``: plain greedy decoding's pick and fault screen in one pass over a row of
  logits (``TorchBackend.greedy_next_reference`` is the torch version: screen, argmax, result).
"""

import triton
import triton.language as tl

BIG = tl.constexpr(2147483647)


@triton.jit
def commit_kernel(
    n_ptr, emitted_ptr, eos_ptr,  # n [B] int32; emitted [B, W] int32; eos [E] int64
    tokens_ptr, length_ptr, prompt_ptr, max_new_ptr, done_ptr, active_ptr,  # [B, S], [B], [B], [B], [B], [B]
    W, E, S,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_W)
    emitted = tl.load(emitted_ptr + b * W + j, mask=j < W, other=-1).to(tl.int64)
    count = tl.load(n_ptr + b).to(tl.int64) + 1
    is_eos = j < 0  # all False
    for e in range(E):
        is_eos = is_eos | (emitted == tl.load(eos_ptr + e))
    is_eos = is_eos & (j < count)
    first = tl.min(tl.where(is_eos, j, BIG), axis=0)
    hit_eos = first < BIG
    count = tl.where(hit_eos, first + 1, count)
    length = tl.load(length_ptr + b)
    generated = length - tl.load(prompt_ptr + b)
    max_new = tl.load(max_new_ptr + b)
    count = tl.minimum(count, max_new - generated)
    active = tl.load(done_ptr + b) == 0
    count = tl.where(active, count, 0)
    pos = length + j
    tl.store(tokens_ptr + b * S + pos, emitted, mask=(j < count) & (pos < S))
    length = length + count
    tl.store(length_ptr + b, length)
    done = (~active) | (hit_eos & (count > 0)) | (generated + count >= max_new)
    tl.store(done_ptr + b, done.to(tl.int1))
    tl.store(active_ptr + b, active.to(tl.int1))


@triton.jit
def lookup_kernel(
    seq_ptr, length_ptr, out_ptr,  # seq [B, S] int64; length [B] int64; out [B, G] int64
    S, G,
    MAX_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
):
    b = tl.program_id(0)
    row = seq_ptr + b * S
    length = tl.load(length_ptr + b)
    best = length * 0 - 1  # continuation start; -1: no match yet
    for n in tl.static_range(MAX_N, 0, -1):  # longest first
        latest = length * 0 - 1
        for lo in range(0, S, BLOCK_S):
            start = lo + tl.arange(0, BLOCK_S)
            hit = start < length - n  # an earlier window than the tail itself
            for i in tl.static_range(n):
                tail_i = tl.load(row + tl.maximum(length - n + i, 0))
                hit = hit & (tl.load(row + start + i, mask=start + i < S, other=-1) == tail_i)
            latest = tl.maximum(latest, tl.max(tl.where(hit, start, -1), axis=0))
        found = (latest >= 0) & (length > n) & (n < S)
        best = tl.where((best < 0) & found, latest + n, best)
    start = tl.where(best >= 0, best, length - 1)  # no match: repeat the last token
    g = tl.arange(0, BLOCK_G)
    pos = tl.minimum(start + g, length - 1)
    tl.store(out_ptr + b * G + g, tl.load(row + pos, mask=g < G, other=0), mask=g < G)


@triton.jit
def greedy_next_kernel(
    z_ptr, tokens_ptr, num_ptr, bad_ptr,  # z [B, V] logits (row stride given); tokens [B, 2] int32; num [B] int32; bad [B] uint8
    V, stride_b,
    FLAG: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """tokens[b] = (the lowest index of the row's largest logit, -1), as torch.argmax picks it (NaN
    counts as the largest); num[b] = 0; bad[b] = FLAG when the row holds a NaN or +inf or no finite
    logit (what ``faults.nonfinite_rows`` flags), else 0."""
    b = tl.program_id(0)
    lane = tl.arange(0, BLOCK_V)
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_i = tl.full((BLOCK_V,), BIG, tl.int32)
    nan_lane = lane < 0  # all False
    bad_lane = lane < 0
    finite_lane = lane < 0
    for v0 in range(0, V, BLOCK_V):
        v = v0 + lane
        x = tl.load(z_ptr + b * stride_b + v, mask=v < V, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        take = ((x > best) & ~nan_lane) | (is_nan & ~nan_lane)  # strict: a lane keeps its earliest maximum
        best = tl.where(take, x, best)
        best_i = tl.where(take, v, best_i)
        nan_lane = nan_lane | is_nan
        bad_lane = bad_lane | is_nan | (x == float("inf"))
        finite_lane = finite_lane | ((x == x) & (x != float("inf")) & (x != float("-inf")))
    any_nan = tl.max(nan_lane.to(tl.int32), axis=0) > 0
    top = tl.max(tl.where(nan_lane, float("-inf"), best), axis=0)
    pick_nan = tl.min(tl.where(nan_lane, best_i, BIG), axis=0)
    pick = tl.min(tl.where(~nan_lane & (best == top), best_i, BIG), axis=0)
    token = tl.where(any_nan, pick_nan, tl.where(pick == BIG, 0, pick))
    bad = (tl.max(bad_lane.to(tl.int32), axis=0) > 0) | (tl.max(finite_lane.to(tl.int32), axis=0) == 0)
    tl.store(tokens_ptr + b * 2, token)
    tl.store(tokens_ptr + b * 2 + 1, -1)
    tl.store(num_ptr + b, 0)
    tl.store(bad_ptr + b, tl.where(bad, FLAG, 0).to(tl.uint8))
