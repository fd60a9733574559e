"""The fused verify kernels: the ``@triton.jit`` kernels here, their launcher ``flashspec_torch.verify.verify_triton``
(which ``flashspec_torch.verify.verify(impl="triton")`` calls), and their plain torch reference
``flashspec_torch.verify.verify_reference`` (``impl="reference"``), which the tests compare them with.

Letters as in SPEC.md: z target logits [B, G+1, V], w draft logits [B, G, V], T temperature,
x drafted tokens [B, G], n first rejection [B], y residual / bonus token [B].

Two kernels, used either alone or as a pair (docs/kernel_notes.md has the design and the alternatives
measured against it):

* ``verify_final_kernel`` with ``FUSED=True`` (one launch; ``KernelConfig.num_chunks == 1``): a program
  owns ``BLOCK_B`` batch rows and the whole vocabulary. It streams the G+1 target rows (and the G
  draft rows unless ``draft_logprobs`` was given) once, keeping an online max and sum-exp per row
  (``lanes.rows_stats_lanes``); gathers z(x_i) and w(x_i); decides the accept tests in log space; and
  sweeps row n once more for the Gumbel-max draw of the residual (or bonus) token.
* ``verify_stats_kernel`` then ``verify_final_kernel`` with ``FUSED=False`` (two launches): the
  vocabulary is split over C programs per batch row. The first launch writes per-chunk (max, sum-exp)
  partials [B, C, 2, ROWS]; the second recombines them in every program (a few KB), decides n, sweeps
  its chunk of row n (SC chunks, as many as C or more) and writes one Gumbel-max candidate per chunk;
  the last program of a batch tile to finish (an atomic counter) reduces the SC candidates and writes
  the tokens. Two launches are needed because row n, hence the chunks to sweep, is only known once
  every chunk of every row has been normalised (a grid-wide dependency).
  With ``PDL`` (Hopper programmatic dependent launch, ``KernelConfig.pdl``) the second launch may
  start while the first one's last programs still run: every stats program lets it launch at once
  (``gdc_launch_dependents``), and a final program loads what the first launch does not write (its
  drafted ids, their logits, the accept uniforms) before it waits for the partials (``gdc_wait``).

The sweep of row n is exact pruning's: ``lanes.sweep_row_lanes`` (PRUNE: one vote per tile, or none) or
``slots.sweep_row_slots`` (SLOTS > 1: one vote per slot). Nothing of size V is ever written. All arithmetic
is float32 after loading (bf16 / fp16 are upcast immediately) and draft ids are masked: an id outside
[0, V) is never read from memory (it counts as rejected and y is drawn from p).
"""

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .lanes import BIG_INDEX, NEG_INF, keep, load_scaled, row_argmax, rows_stats_lanes, safe_log, sweep_row_lanes
from .random import key, mix, uniform_from_bits
from .slots import sweep_row_slots

ACCEPT_STREAM = tl.constexpr(0)  # flashspec.random.ACCEPT
FINAL_STREAM = tl.constexpr(1)  # flashspec.random.FINAL


@triton.jit
def pick_row(a, i, n):  # a: [BB, R]; i: [1, R]; n: [BB] -> a[:, n], as a [BB] vector
    return tl.max(tl.where(i == n[:, None], a, NEG_INF), axis=1)


@triton.jit
def pick_row_int(a, i, n):  # integer version of pick_row
    return tl.min(tl.where(i == n[:, None], a, BIG_INDEX), axis=1)


@triton.jit
def combine_lse(m, l, axis: tl.constexpr):  # partial (max, sumexp) along axis -> log-sum-exp
    m_all = tl.max(m, axis=axis)
    m_safe = tl.where(m_all == NEG_INF, 0.0, m_all)
    l_all = tl.sum(l * tl.exp(m - tl.expand_dims(m_safe, axis)), axis=axis)
    return m_all + safe_log(l_all)


@triton.jit
def load_counter(ptr, value, stride, b, b_mask, IS_TENSOR: tl.constexpr):  # -> [BB] int64
    """seed / offset of each row: from a tensor (stride 0 or 1), or a scalar argument."""
    if IS_TENSOR:
        c = tl.load(ptr + b * stride, mask=b_mask, other=0).to(tl.int64)
    else:
        c = tl.zeros(b.shape, tl.int64) + value.to(tl.uint32, bitcast=True).to(tl.int64)
    return c


@triton.jit
def row_counters(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset, b, b_mask,
                 SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, PER_ROW_SEED: tl.constexpr):
    """The generator's (seed_lo, seed_hi, offset, row) of each batch row: four [BB] uint32."""
    s = load_counter(seed_ptr, seed_lo, s_seed, b, b_mask, SEED_TENSOR)
    if SEED_TENSOR:
        lo = (s & 0xFFFFFFFF).to(tl.uint32)
        hi = ((s >> 32) & 0xFFFFFFFF).to(tl.uint32)
    else:
        lo = s.to(tl.uint32)
        hi = tl.zeros(b.shape, tl.uint32) + seed_hi.to(tl.uint32, bitcast=True)
    off = (load_counter(offset_ptr, offset_lo, s_offset, b, b_mask, OFFSET_TENSOR) & 0xFFFFFFFF).to(tl.uint32)
    if PER_ROW_SEED:
        row = tl.zeros(b.shape, tl.uint32)  # a request's randomness follows its seed, not its row
    else:
        row = b.to(tl.uint32)
    return lo, hi, off, row


@triton.jit
def emit(tokens_ptr, num_ptr, b, b_mask, x, n, y, G: tl.constexpr, ROWS: tl.constexpr):
    """tokens[b] = x_0 .. x_{n-1}, y, -1 ...; num_accepted[b] = n."""
    i = tl.arange(0, ROWS)[None, :]
    tok = tl.where(i < n[:, None], x, tl.where(i == n[:, None], y[:, None], -1))
    tl.store(tokens_ptr + b[:, None] * (G + 1) + i, tok.to(tl.int32), mask=b_mask[:, None] & (i < G + 1))
    tl.store(num_ptr + b, n.to(tl.int32), mask=b_mask)


@triton.jit
def verify_stats_kernel(
    z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,  # [B, G+1, V], [B, G, V], [B, G+1] x2, [B, G] x2
    m_ptr, l_ptr, a_ptr, counter_ptr,  # [B, C, 2, ROWS] f32 x2, [B, C, ROWS] i32, [tiles] i32
    B, V, chunk, C, T, inv_T, szb, szr, szv, swb, swr, swv,
    G: tl.constexpr, ROWS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
    HAS_W_STATS: tl.constexpr, FILTER: tl.constexpr, GREEDY: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, PDL: tl.constexpr,
):
    """Launch 1 of 2: the (max, sum-exp) partials of chunk pid_c of every row of batch tile pid_b, or its
    argmax (T = 0); grid (tiles of B, C)."""
    if PDL:
        gdc_launch_dependents()  # the final launch may start once every program of this grid has started
    pid_b, pid_c = tl.program_id(0), tl.program_id(1)
    if pid_c == 0:
        tl.store(counter_ptr + pid_b, 0)  # arms the final launch's last-program detection
    b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = b < B
    b64 = b.to(tl.int64)[:, None]
    r = tl.arange(0, ROWS)[None, :]
    v_lo = pid_c * chunk
    v_hi = tl.minimum(v_lo + chunk, V)
    out = ((b64 * C + pid_c) * 2) * ROWS + r  # [BB, R] offsets of the target half
    p_mask = b_mask[:, None] & (r < G + 1)
    if GREEDY:
        z_rows = (z_ptr + b64 * szb + r * szr)[:, :, None]
        best, arg = row_argmax(z_rows, p_mask[:, :, None], v_lo, v_hi, szv, BLOCK_B, ROWS, BLOCK_V)
        tl.store(m_ptr + out, best, mask=p_mask)
        tl.store(a_ptr + (b64 * C + pid_c) * ROWS + r, arg, mask=p_mask)
    else:
        bb = b.to(tl.int64)
        m, l = rows_stats_lanes(z_ptr, szb, szr, szv, thr_p_ptr, tid_p_ptr, bb, b_mask, G + 1, v_lo, v_hi, T,
                                inv_T, BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST)
        tl.store(m_ptr + out, m, mask=p_mask)
        tl.store(l_ptr + out, l, mask=p_mask)
        if HAS_W_STATS:
            q_mask = b_mask[:, None] & (r < G)
            m, l = rows_stats_lanes(w_ptr, swb, swr, swv, thr_q_ptr, tid_q_ptr, bb, b_mask, G, v_lo, v_hi, T, inv_T,
                                    BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST)
            tl.store(m_ptr + out + ROWS, m, mask=q_mask)
            tl.store(l_ptr + out + ROWS, l, mask=q_mask)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset_lo"])  # new seeds / offsets never recompile
def verify_final_kernel(
    z_ptr, w_ptr, x_ptr, lq_ptr,  # [B, G+1, V], [B, G, V], [B, G] int, [B, G] float
    thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,  # [B, G+1] f32 / i32, [B, G] f32 / i32
    seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,  # [B] or [] int64, or scalars
    m_ptr, l_ptr, a_ptr, counter_ptr, ck_ptr, ci_ptr, cf_ptr,  # launch-1 partials, [tiles], [B, SC, 2] candidates
    tokens_ptr, num_ptr,  # [B, G+1] i32, [B] i32
    len_ptr,  # [B] int: draft_lengths (HAS_LENGTHS)
    B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg,
    G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr, NSC: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr, SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, HAS_LQ: tl.constexpr, FILTER: tl.constexpr,
    GREEDY: tl.constexpr, FUSED: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, VEC: tl.constexpr, FAST: tl.constexpr, PRUNE: tl.constexpr, PDL: tl.constexpr,
    SLOTS: tl.constexpr, PAIRS: tl.constexpr, HAS_LENGTHS: tl.constexpr,
):
    """Normalisers -> accept tests -> n -> Gumbel-max over row n -> tokens; grid (tiles of B, SC): the C
    partials of a row are recombined by each of its SC programs, and program c sweeps [c sweep_chunk,
    (c + 1) sweep_chunk) of row n. PDL: everything launch 1 does not write is loaded before ``gdc_wait``."""
    if PDL:
        gdc_launch_dependents()
    pid_b, pid_c = tl.program_id(0), tl.program_id(1)
    b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = b < B
    b64 = b.to(tl.int64)
    i = tl.arange(0, ROWS)[None, :]  # row index: position i
    p_mask = b_mask[:, None] & (i < G + 1)
    q_mask = b_mask[:, None] & (i < G)
    x, x_ok = drafted_ids(x_ptr, len_ptr, b64, b_mask, i, q_mask, sxb, sxg, V, G, HAS_LENGTHS)  # [BB, R]
    thr_p, tid_p, thr_q, tid_q = filter_thresholds(thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, b64, i, p_mask, q_mask,
                                                   G, HAS_W, FILTER)
    if not GREEDY:  # what the accept tests need besides the normalisers (none of it written by launch 1)
        s_x, t_x, lq_x = gathered_logits(z_ptr, w_ptr, lq_ptr, x, b64, i, q_mask, thr_p, tid_p, thr_q, tid_q, T,
                                         szb, szr, szv, swb, swr, swv, slb, slg, BLOCK_B, ROWS, HAS_W, HAS_LQ, FILTER)
        lo, hi, off, row, log_u = accept_log_uniforms(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed,
                                                      s_offset, b, b_mask, i, SEED_TENSOR, OFFSET_TENSOR, PER_ROW_SEED)
    if PDL:
        gdc_wait()  # launch 1's partials (and its counter reset) are visible from here on
    if GREEDY:
        arg = final_argmax(z_ptr, m_ptr, a_ptr, b64, b_mask, i, p_mask, V, C, szb, szr, szv,
                           G, ROWS, NC, BLOCK_B, BLOCK_V, FUSED)
        n = tl.min(tl.where(q_mask & ~(x_ok & (x == arg)), i, G), axis=1)
        if pid_c == 0:
            emit(tokens_ptr, num_ptr, b, b_mask, x, n, pick_row_int(arg, i, n), G, ROWS)
    else:
        lse_p, lse_q = final_normalisers(z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, m_ptr, l_ptr,
                                         b64, b_mask, i, V, C, T, inv_T, szb, szr, szv, swb, swr, swv,
                                         G, ROWS, NC, BLOCK_B, BLOCK_V, HAS_W and not HAS_LQ, FILTER, FUSED, VEC, FAST)
        lse_p, lse_q, lq_x = draft_log_q(lse_p, lse_q, t_x, lq_x, p_mask, q_mask, HAS_W, HAS_LQ)
        accepted = x_ok & (log_u < (s_x - lse_p) - lq_x)
        n = tl.min(tl.where(q_mask & ~accepted, i, G), axis=1)  # [BB]
        use_p, best_r, idx_r, best_p, idx_p, mass = draw_row_n(
            z_ptr, w_ptr, x, x_ok, n, lo, hi, off, row, lse_p, lse_q, thr_p, tid_p, thr_q, tid_q, b64, b_mask, i,
            pid_c, V, sweep_chunk, T, inv_T, szb, szr, szv, swb, swr, swv, G, BLOCK_B, SWEEP_V, HAS_W, FILTER, FAST,
            PRUNE, SLOTS, PAIRS)
        if FUSED:
            emit(tokens_ptr, num_ptr, b, b_mask, x, n, tl.where(use_p | (mass == 0), idx_p, idx_r), G, ROWS)
        else:
            reduce_candidates(ck_ptr, ci_ptr, cf_ptr, counter_ptr, tokens_ptr, num_ptr, pid_b, pid_c, b, b_mask, x, n,
                              use_p, best_r, idx_r, best_p, idx_p, mass, SC, G, ROWS, NSC)


@triton.jit
def drafted_ids(x_ptr, len_ptr, b64, b_mask, i, q_mask, sxb, sxg, V, G: tl.constexpr, HAS_LENGTHS: tl.constexpr):
    """(x clamped to 0 where masked, x_ok), each [BB, R]: an id outside [0, V) or at a position past the row's
    draft length L_b (HAS_LENGTHS: len_ptr [B]) is a masked id, rejected with y drawn from p there."""
    x = tl.load(x_ptr + b64[:, None] * sxb + i * sxg, mask=q_mask, other=0).to(tl.int64)
    x_ok = (x >= 0) & (x < V)
    if HAS_LENGTHS:
        x_ok = x_ok & (i < tl.load(len_ptr + b64, mask=b_mask, other=G)[:, None])
    return tl.where(x_ok, x, 0), x_ok  # masked id: never read out of bounds


@triton.jit
def filter_thresholds(thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, b64, i, p_mask, q_mask, G: tl.constexpr,
                      HAS_W: tl.constexpr, FILTER: tl.constexpr):
    """The top-k / top-p cut of each target row [BB, R] and draft row (FILTER; else no cut)."""
    thr_p = tl.load(thr_p_ptr + b64[:, None] * (G + 1) + i, mask=p_mask, other=NEG_INF) if FILTER else 0.0
    tid_p = tl.load(tid_p_ptr + b64[:, None] * (G + 1) + i, mask=p_mask, other=0) if FILTER else 0
    thr_q = tl.load(thr_q_ptr + b64[:, None] * G + i, mask=q_mask, other=NEG_INF) if FILTER and HAS_W else 0.0
    tid_q = tl.load(tid_q_ptr + b64[:, None] * G + i, mask=q_mask, other=0) if FILTER and HAS_W else 0
    return thr_p, tid_p, thr_q, tid_q


@triton.jit
def accept_log_uniforms(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset, b, b_mask, i,
                        SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr, PER_ROW_SEED: tl.constexpr):
    """The rows' counters (lo, hi, off, row: [BB] uint32) and log u of the accept test at each position [BB, R]."""
    lo, hi, off, row = row_counters(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset, b,
                                    b_mask, SEED_TENSOR, OFFSET_TENSOR, PER_ROW_SEED)
    k_accept = key(lo[:, None], hi[:, None], off[:, None], row[:, None], i.to(tl.uint32),
                   tl.full((), ACCEPT_STREAM, tl.uint32))
    return lo, hi, off, row, tl.log(uniform_from_bits(mix(k_accept)))  # vocab coordinate 0


@triton.jit
def draft_log_q(lse_p, lse_q, t_x, lq_x, p_mask, q_mask, HAS_W: tl.constexpr, HAS_LQ: tl.constexpr):
    """(lse_p, lse_q, log q(x)) with padding rows zeroed (no -inf - -inf): the draft's normaliser is one logit
    away when its log-probs were given (HAS_LQ), from the draft logits' normalisers otherwise (HAS_W)."""
    lse_p = tl.where(p_mask, lse_p, 0.0)
    if HAS_LQ:
        lse_q = t_x - lq_x
    elif HAS_W:
        lse_q = tl.where(q_mask, lse_q, 0.0)
        lq_x = t_x - lse_q
    return lse_p, lse_q, lq_x


@triton.jit
def gathered_logits(z_ptr, w_ptr, lq_ptr, x, b64, i, q_mask, thr_p, tid_p, thr_q, tid_q, T,
                    szb, szr, szv, swb, swr, swv, slb, slg, BLOCK_B: tl.constexpr, ROWS: tl.constexpr,
                    HAS_W: tl.constexpr, HAS_LQ: tl.constexpr, FILTER: tl.constexpr):
    """(z_i(x_i) / T, w_i(x_i) / T, log q_i(x_i) as given), each [BB, R], cut by top-k / top-p (FILTER); without
    HAS_W the second is the first, without HAS_LQ the third is 0 (one-hot q: log q(x) = 0)."""
    s_x = tl.where(q_mask, load_scaled(z_ptr + b64[:, None] * szb + i * szr + x * szv, q_mask, T, True), 0.0)
    if FILTER:
        s_x = keep(s_x, x, thr_p, tid_p)
    t_x = s_x
    if HAS_W:
        t_x = tl.where(q_mask, load_scaled(w_ptr + b64[:, None] * swb + i * swr + x * swv, q_mask, T, True), 0.0)
        if FILTER:
            t_x = keep(t_x, x, thr_q, tid_q)
    lq_x = tl.zeros((BLOCK_B, ROWS), tl.float32)
    if HAS_LQ:
        lq_x = tl.load(lq_ptr + b64[:, None] * slb + i * slg, mask=q_mask, other=0.0).to(tl.float32)
    return s_x, t_x, lq_x


@triton.jit
def final_argmax(z_ptr, m_ptr, a_ptr, b64, b_mask, i, p_mask, V, C, szb, szr, szv,
                 G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
                 FUSED: tl.constexpr):
    """T = 0: the argmax of every row [BB, R], streamed (FUSED) or from launch 1's per-chunk argmaxes."""
    if FUSED:
        z_rows = z_ptr + b64[:, None] * szb + i * szr  # [BB, R]
        _, arg = row_argmax(z_rows[:, :, None], p_mask[:, :, None], 0, V, szv, BLOCK_B, ROWS, BLOCK_V)
    else:
        c = tl.arange(0, NC)[None, :, None]
        part = ((b64[:, None, None] * C + c) * 2) * ROWS + i[:, None, :]  # [BB, NC, R]
        cp_mask = b_mask[:, None, None] & (c < C) & (i[:, None, :] < G + 1)  # written partials only
        best = tl.load(m_ptr + part, mask=cp_mask, other=NEG_INF)
        arg = tl.load(a_ptr + (b64[:, None, None] * C + c) * ROWS + i[:, None, :], mask=cp_mask, other=BIG_INDEX)
        arg = tl.min(tl.where(best == tl.max(best, axis=1)[:, None, :], arg, BIG_INDEX), axis=1)
    return arg


@triton.jit
def final_normalisers(z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, m_ptr, l_ptr, b64, b_mask, i, V, C,
                      T, inv_T, szb, szr, szv, swb, swr, swv, G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr,
                      BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, HAS_W_STATS: tl.constexpr, FILTER: tl.constexpr,
                      FUSED: tl.constexpr, VEC: tl.constexpr, FAST: tl.constexpr):
    """T > 0: (lse_p, lse_q) [BB, R] of the target and draft rows, streamed (FUSED) or recombined from launch 1's
    partials; lse_q only with HAS_W_STATS (draft logits without their log-probs; else zeros)."""
    lse_q = tl.zeros((BLOCK_B, ROWS), tl.float32)
    if FUSED:
        m, l = rows_stats_lanes(z_ptr, szb, szr, szv, thr_p_ptr, tid_p_ptr, b64, b_mask, G + 1, 0, V, T, inv_T,
                                BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST)
        lse_p = m + safe_log(l)
        if HAS_W_STATS:
            m, l = rows_stats_lanes(w_ptr, swb, swr, swv, thr_q_ptr, tid_q_ptr, b64, b_mask, G, 0, V, T, inv_T,
                                    BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST)
            lse_q = m + safe_log(l)
    else:
        c = tl.arange(0, NC)[None, :, None]
        part = ((b64[:, None, None] * C + c) * 2) * ROWS + i[:, None, :]  # [BB, NC, R]
        cp_mask = b_mask[:, None, None] & (c < C) & (i[:, None, :] < G + 1)  # written partials only
        lse_p = combine_lse(tl.load(m_ptr + part, mask=cp_mask, other=NEG_INF),
                            tl.load(l_ptr + part, mask=cp_mask, other=0.0), 1)
        if HAS_W_STATS:
            cq_mask = b_mask[:, None, None] & (c < C) & (i[:, None, :] < G)
            lse_q = combine_lse(tl.load(m_ptr + part + ROWS, mask=cq_mask, other=NEG_INF),
                                tl.load(l_ptr + part + ROWS, mask=cq_mask, other=0.0), 1)
    return lse_p, lse_q


@triton.jit
def draw_row_n(z_ptr, w_ptr, x, x_ok, n, lo, hi, off, row, lse_p, lse_q, thr_p, tid_p, thr_q, tid_q, b64, b_mask, i,
               pid_c, V, sweep_chunk, T, inv_T, szb, szr, szv, swb, swr, swv, G: tl.constexpr, BLOCK_B: tl.constexpr,
               SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, FILTER: tl.constexpr, FAST: tl.constexpr,
               PRUNE: tl.constexpr, SLOTS: tl.constexpr, PAIRS: tl.constexpr):
    """The residual / bonus draw over this program's chunk of row n: (use_p, best_r, idx_r, best_p, idx_p, mass),
    each [BB]; use_p: y is drawn from p (the bonus, or a masked draft id)."""
    n_q = tl.minimum(n, G - 1)  # the draft row n (clamped for the bonus; unused there)
    x_n = pick_row_int(x, i, n_q).to(tl.int64)
    x_n_ok = pick_row_int(x_ok.to(tl.int32), i, n_q) != 0
    lse_qn = pick_row(lse_q, i, n_q) if HAS_W else tl.zeros((BLOCK_B,), tl.float32)
    k_final = key(lo, hi, off, row, n.to(tl.uint32), tl.full((), FINAL_STREAM, tl.uint32))
    v_lo = pid_c * sweep_chunk
    v_hi = tl.minimum(v_lo + sweep_chunk, V)
    z_n = z_ptr + b64 * szb + n.to(tl.int64) * szr
    w_n = w_ptr + b64 * swb + n_q.to(tl.int64) * swr
    thr_pn = pick_row(thr_p, i, n) if FILTER else 0.0
    tid_pn = pick_row_int(tid_p, i, n) if FILTER else 0
    thr_qn = pick_row(thr_q, i, n_q) if FILTER and HAS_W else 0.0
    tid_qn = pick_row_int(tid_q, i, n_q) if FILTER and HAS_W else 0
    use_p = (n == G) | ~x_n_ok
    if PRUNE and SLOTS > 1:
        best_r, idx_r, best_p, idx_p, mass = sweep_row_slots(
            z_n, w_n, szv, swv, v_lo, v_hi, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
            thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, BLOCK_B, SWEEP_V, SLOTS, HAS_W, FILTER, FAST, PAIRS)
    else:
        best_r, idx_r, best_p, idx_p, mass = sweep_row_lanes(
            z_n, w_n, szv, swv, v_lo, v_hi, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
            thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, BLOCK_B, SWEEP_V, HAS_W, FILTER, FAST, PRUNE)
    return use_p, best_r, idx_r, best_p, idx_p, mass


@triton.jit
def reduce_candidates(ck_ptr, ci_ptr, cf_ptr, counter_ptr, tokens_ptr, num_ptr, pid_b, pid_c, b, b_mask, x, n, use_p,
                      best_r, idx_r, best_p, idx_p, mass, SC, G: tl.constexpr, ROWS: tl.constexpr, NSC: tl.constexpr):
    """Two launches: store this program's candidates; the last program of the batch tile to finish reduces the
    SC candidates of each row (the larger key, on a tie the lower index) and writes the tokens."""
    b64 = b.to(tl.int64)
    cand = (b64 * SC + pid_c) * 2
    tl.store(ck_ptr + cand, best_r, mask=b_mask)
    tl.store(ci_ptr + cand, idx_r, mask=b_mask)
    tl.store(ck_ptr + cand + 1, best_p, mask=b_mask)
    tl.store(ci_ptr + cand + 1, idx_p, mask=b_mask)
    tl.store(cf_ptr + b64 * SC + pid_c, mass, mask=b_mask)
    tl.debug_barrier()
    done = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
    if done == SC - 1:  # the last program of this batch tile reduces the SC candidates
        c2 = tl.arange(0, NSC)[None, :]
        c2_mask = b_mask[:, None] & (c2 < SC)
        cands = (b64[:, None] * SC + c2) * 2
        k_r = tl.load(ck_ptr + cands, mask=c2_mask, other=NEG_INF, volatile=True)
        k_p = tl.load(ck_ptr + cands + 1, mask=c2_mask, other=NEG_INF, volatile=True)
        i_r = tl.load(ci_ptr + cands, mask=c2_mask, other=BIG_INDEX, volatile=True)
        i_p = tl.load(ci_ptr + cands + 1, mask=c2_mask, other=BIG_INDEX, volatile=True)
        f = tl.load(cf_ptr + b64[:, None] * SC + c2, mask=c2_mask, other=0, volatile=True)
        y_r = tl.min(tl.where(k_r == tl.max(k_r, axis=1)[:, None], i_r, BIG_INDEX), axis=1)
        y_p = tl.min(tl.where(k_p == tl.max(k_p, axis=1)[:, None], i_p, BIG_INDEX), axis=1)
        y = tl.where(use_p | (tl.max(f, axis=1) == 0), y_p, y_r)
        emit(tokens_ptr, num_ptr, b, b_mask, x, n, y, G, ROWS)
        tl.store(counter_ptr + pid_b, 0)
