"""The fused verify kernels (``@triton.jit`` code only; the launcher is ``flashspec_torch.verify``).

Letters as in SPEC.md: z target logits [B, G+1, V], w draft logits [B, G, V], T temperature,
x drafted tokens [B, G], n first rejection [B], y residual / bonus token [B].

Two kernels, used either alone or as a pair:

* ``verify_final_kernel`` with ``FUSED=True`` (one launch; when B alone fills the GPU): a program
  owns ``BLOCK_B`` batch rows and the whole vocabulary. It streams the G+1 target rows (and the G
  draft rows unless ``draft_logprobs`` was given) once as [BLOCK_B, ROWS, BLOCK_V] tiles, keeping
  an online max and sum-exp per row; gathers z(x_i) and w(x_i); decides the accept tests in log
  space; and sweeps row n once more for the Gumbel-max draw of the residual (or bonus) token.
* ``verify_stats_kernel`` then ``verify_final_kernel`` with ``FUSED=False`` (two launches; small
  B): the vocabulary is split over C programs per batch row. The first launch writes per-chunk
  (max, sum-exp) partials [B, C, 2, ROWS]; the second recombines them in every program (a few KB),
  decides n, sweeps its chunk of row n and writes one Gumbel-max candidate per chunk; the last
  program of a batch tile to finish (an atomic counter) reduces the C candidates and writes the
  tokens. Two launches are needed because row n, hence the chunks to sweep, is only known once
  every chunk of every row has been normalised (a grid-wide dependency).
  With ``PDL`` (Hopper programmatic dependent launch, ``KernelConfig.pdl``) the second launch may
  start while the first one's last programs still run: every stats program lets it launch at once
  (``gdc_launch_dependents``), and a final program loads what the first launch does not write (its
  drafted ids, their logits, the accept uniforms) before it waits for the partials (``gdc_wait``).
* ``verify_persistent_kernel`` (``persistent.py``, ``KernelConfig(schedule="persistent")``): the
  same two phases in one launch, as ticketed work items that wait on per-tile counters.

The work of one program of either split kernel is a device function (``stats_item``,
``final_item``), which the persistent kernel calls per work item.

Nothing of size V is ever written. All arithmetic is float32 after loading (bf16 / fp16 are upcast
immediately) and draft ids are masked: an id outside [0, V) is never read from memory (it counts
as rejected and y is drawn from p).

The streaming loops come in two variants, chosen per launch by ``KernelConfig.stream`` /
``.sweep`` (``flashspec_torch.verify``): "lanes" (the default; ``lanes.py``: rows one at a time,
per-thread running state, exp2 with the scale folded in, keys in log2 units, exact pruning of
sweep tiles; ``slots.py``: the sweep's vote per slot) and "tile" (``tile.py``: [BLOCK_B, ROWS, BLOCK_V]
tiles reduced every step, z / T as ``div_rn`` per logit). docs/kernel_notes.md has the instruction counts
of both. The per-row scalars (the gathered z(x_i) / T of the accept test, lse) use ``div_rn`` in both.
"""

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .bounds import sweep_row_bounded
from .lanes import ORDERED_NEG_INF, hint_floor, rows_stats_lanes, sweep_row_lanes
from .slots import sweep_row_slots, sweep_row_slots_lazy
from .random import key, key_base, mix, uniform_from_bits
from .topdown import BLOCK, sweep_row_top_down
from .tile import BIG_INDEX, NEG_INF, apply_filter, load_scaled, row_argmax, row_stats, safe_log, sweep_row

ACCEPT_STREAM = tl.constexpr(0)  # flashspec.random.ACCEPT
FINAL_STREAM = tl.constexpr(1)  # flashspec.random.FINAL
FINAL_BLOCKS_STREAM = tl.constexpr(3)  # flashspec.random.FINAL_BLOCKS (the top-down noise's block maxima)


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


@triton.jit(do_not_specialize=["t0", "seed_lo", "seed_hi", "offset_lo"])
def verify_stats_kernel(
    z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,  # [B, G+1, V], [B, G, V], [B, G+1] x2, [B, G] x2
    m_ptr, l_ptr, a_ptr, counter_ptr, kb_ptr,  # [B, C, 2, ROWS] f32 x2, [B, C, ROWS] i32, [tiles] i32, [B, 2] i32
    B, V, chunk, C, T, inv_T, szb, szr, szv, swb, swr, swv, t0,
    G: tl.constexpr, ROWS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
    HAS_W_STATS: tl.constexpr, FILTER: tl.constexpr, GREEDY: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, PDL: tl.constexpr, SHARE_K: tl.constexpr, HINT: tl.constexpr, WAIT_END: tl.constexpr = False,
    seed_ptr=0, offset_ptr=0, seed_lo=0, seed_hi=0, offset_lo=0, s_seed=0, s_offset=0, bnd_ptr=0, n_tiles=0,
    SEED_TENSOR: tl.constexpr = False, OFFSET_TENSOR: tl.constexpr = False, PER_ROW_SEED: tl.constexpr = False,
    BOUNDS: tl.constexpr = False,
):
    """Phase 1 of the split path: per-chunk (max, sum-exp) of every row; grid (tiles of B, C), batch
    tiles t0, t0 + 1, ... (rows below B only: a batch group, ``KernelConfig.batch_group``).
    WAIT_END (a group after the first, launched with PDL behind the previous group's final launch):
    every program waits for that launch to complete before it exits, so that the groups' launches
    complete in stream order (the verify is done when its last launch is).
    BOUNDS (lanes, no filter, BLOCK_B = 1): also the tile bounds of every target row (``lanes.noise_bound``)
    into bnd_ptr [B, G+1, n_tiles], for the final launch's ``bounds.sweep_row_bounded``; the generator's
    counters as the final launch takes them. BOUNDS = 2: the largest logit of every block of 64 (the top-down
    draw's bounds, ``topdown.py``)."""
    if PDL:
        gdc_launch_dependents()  # phase 2 may launch once every program of this grid has started
    pid_b, pid_c = tl.program_id(0) + t0, tl.program_id(1)
    if pid_c == 0:
        tl.store(counter_ptr + pid_b, 0)  # arms phase 2's last-program detection
        if SHARE_K:  # resets the row-wide pruning floors of phase 2's sweep (lanes.sweep_row_lanes)
            b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
            tl.store(kb_ptr + b * 2, tl.full((BLOCK_B,), ORDERED_NEG_INF, tl.int32), mask=b < B)
            tl.store(kb_ptr + b * 2 + 1, tl.full((BLOCK_B,), ORDERED_NEG_INF, tl.int32), mask=b < B)
    k_base = 0
    if BOUNDS == 1:
        b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        lo, hi, off, row = row_counters(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset, b,
                                        b < B, SEED_TENSOR, OFFSET_TENSOR, PER_ROW_SEED)
        k_base = key_base(lo, hi, off, row, tl.full((), FINAL_STREAM, tl.uint32))
    stats_item(pid_b, pid_c, z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, m_ptr, l_ptr, a_ptr,
               B, V, chunk, C, T, inv_T, szb, szr, szv, swb, swr, swv,
               G, ROWS, BLOCK_B, BLOCK_V, HAS_W_STATS, FILTER, GREEDY, LANES, VEC, FAST, HINT, k_base, bnd_ptr, n_tiles,
               BOUNDS)
    if WAIT_END:
        gdc_wait()  # the previous group's final launch has completed (and with it every launch before it)


@triton.jit
def stats_item(
    pid_b, pid_c, z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, m_ptr, l_ptr, a_ptr,
    B, V, chunk, C, T, inv_T, szb, szr, szv, swb, swr, swv,
    G: tl.constexpr, ROWS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
    HAS_W_STATS: tl.constexpr, FILTER: tl.constexpr, GREEDY: tl.constexpr, LANES: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, ARGMAX: tl.constexpr, k_base=0, bnd_ptr=0, n_tiles=0, BOUNDS: tl.constexpr = False,
):
    """Phase-1 work of batch tile pid_b, chunk pid_c: the (max, sum-exp) partials, or the argmax (T = 0).
    ARGMAX (lanes, T > 0): also an argmax of each target row's chunk, the final launch's pruning hint.
    BOUNDS (lanes): also the target rows' tile bounds (``lanes.rows_stats_lanes``; k_base: [BB] uint32)."""
    b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = b < B
    b64 = b.to(tl.int64)[:, None]
    r = tl.arange(0, ROWS)[None, :]
    v_lo = pid_c * chunk
    v_hi = tl.minimum(v_lo + chunk, V)
    out = ((b64 * C + pid_c) * 2) * ROWS + r  # [BB, R] offsets of the target half
    p_mask = b_mask[:, None] & (r < G + 1)
    z_rows = (z_ptr + b64 * szb + r * szr)[:, :, None]
    if GREEDY:
        best, arg = row_argmax(z_rows, p_mask[:, :, None], v_lo, v_hi, szv, BLOCK_B, ROWS, BLOCK_V)
        tl.store(m_ptr + out, best, mask=p_mask)
        tl.store(a_ptr + (b64 * C + pid_c) * ROWS + r, arg, mask=p_mask)
    elif LANES:
        bb = b.to(tl.int64)
        m, l, a = rows_stats_lanes(z_ptr, szb, szr, szv, thr_p_ptr, tid_p_ptr, bb, b_mask, G + 1, v_lo, v_hi, T,
                                   inv_T, BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST, ARGMAX, k_base, bnd_ptr,
                                   n_tiles, BOUNDS)
        tl.store(m_ptr + out, m, mask=p_mask)
        tl.store(l_ptr + out, l, mask=p_mask)
        if ARGMAX:
            tl.store(a_ptr + (b64 * C + pid_c) * ROWS + r, a, mask=p_mask)
        if HAS_W_STATS:
            q_mask = b_mask[:, None] & (r < G)
            m, l, _ = rows_stats_lanes(w_ptr, swb, swr, swv, thr_q_ptr, tid_q_ptr, bb, b_mask, G, v_lo, v_hi, T, inv_T,
                                       BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST, False)
            tl.store(m_ptr + out + ROWS, m, mask=q_mask)
            tl.store(l_ptr + out + ROWS, l, mask=q_mask)
    else:
        thr_p = tl.load(thr_p_ptr + b64 * (G + 1) + r, mask=p_mask, other=NEG_INF) if FILTER else 0.0
        tid_p = tl.load(tid_p_ptr + b64 * (G + 1) + r, mask=p_mask, other=0) if FILTER else 0
        m, l = row_stats(z_rows, p_mask[:, :, None], v_lo, v_hi, szv, T, thr_p, tid_p, BLOCK_B, ROWS, BLOCK_V, FILTER)
        tl.store(m_ptr + out, m, mask=p_mask)
        tl.store(l_ptr + out, l, mask=p_mask)
        if HAS_W_STATS:
            q_mask = b_mask[:, None] & (r < G)
            thr_q = tl.load(thr_q_ptr + b64 * G + r, mask=q_mask, other=NEG_INF) if FILTER else 0.0
            tid_q = tl.load(tid_q_ptr + b64 * G + r, mask=q_mask, other=0) if FILTER else 0
            w_rows = (w_ptr + b64 * swb + r * swr)[:, :, None]
            m, l = row_stats(w_rows, q_mask[:, :, None], v_lo, v_hi, swv, T, thr_q, tid_q, BLOCK_B, ROWS, BLOCK_V, FILTER)
            tl.store(m_ptr + out + ROWS, m, mask=q_mask)
            tl.store(l_ptr + out + ROWS, l, mask=q_mask)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset_lo", "t0"])  # new seeds / offsets never recompile
def verify_final_kernel(
    z_ptr, w_ptr, x_ptr, lq_ptr,  # [B, G+1, V], [B, G, V], [B, G] int, [B, G] float
    thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,  # [B, G+1] f32 / i32, [B, G] f32 / i32
    seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,  # [B] or [] int64, or scalars
    m_ptr, l_ptr, a_ptr, ck_ptr, ci_ptr, cf_ptr, counter_ptr, kb_ptr,  # phase-1 partials; [B, SC, 2] candidates
    tokens_ptr, num_ptr,  # [B, G+1] i32, [B] i32
    B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg, t0,
    G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr, NSC: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr, SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, HAS_LQ: tl.constexpr, FILTER: tl.constexpr,
    GREEDY: tl.constexpr, FUSED: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, LANES: tl.constexpr, SWEEP_LANES: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, PRUNE: tl.constexpr, PDL: tl.constexpr, SHARE_K: tl.constexpr, HINT: tl.constexpr,
    SLOTS: tl.constexpr = 1, AHEAD: tl.constexpr = 1, REVERSE: tl.constexpr = False, LAZY: tl.constexpr = False,
    STAGES: tl.constexpr = 3, PAIRS: tl.constexpr = False, bnd_ptr=0, n_tiles=0, BOUNDS: tl.constexpr = False,
    NTP: tl.constexpr = 1, TOPDOWN: tl.constexpr = False, NR: tl.constexpr = 1,
    PER: tl.constexpr = 1, lst_ptr=0, SEEDS: tl.constexpr = 1, OWN_MAXIMA: tl.constexpr = False,
):
    """Normalisers -> accept tests -> n -> Gumbel-max over row n -> tokens; grid (tiles of B, SC):
    the C phase-1 partials of a row are recombined by each of its SC programs, and program c sweeps
    [c sweep_chunk, (c + 1) sweep_chunk) of row n. Batch tiles t0, t0 + 1, ... (rows below B only). PDL:
    the next launch (a later batch group's stats launch) may start once every program has started.
    REVERSE: programs take their (tile, chunk) in the reverse order of the grid, so that the first to run
    sweep the last chunks of the last rows, which the stats launch read last (still in L2). BOUNDS (one
    program per row): row n drawn from the stats launch's tile bounds (``bounds.sweep_row_bounded``; NTP: the
    next power of two >= n_tiles)."""
    if PDL:
        gdc_launch_dependents()
    pid_b, pid_c = tl.program_id(0), tl.program_id(1)
    if REVERSE:
        pid_b, pid_c = tl.num_programs(0) - 1 - pid_b, tl.num_programs(1) - 1 - pid_c
    final_item(pid_b + t0, pid_c, z_ptr, w_ptr, x_ptr, lq_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr,
               tid_q_ptr, seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,
               m_ptr, l_ptr, a_ptr, ck_ptr, ci_ptr, cf_ptr, counter_ptr, counter_ptr, kb_ptr, tokens_ptr, num_ptr,
               B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg,
               G, ROWS, NC, NSC, BLOCK_B, BLOCK_V, SWEEP_V, HAS_W, HAS_LQ, FILTER, GREEDY, FUSED, SEED_TENSOR,
               OFFSET_TENSOR, PER_ROW_SEED, LANES, SWEEP_LANES, VEC, FAST, PRUNE, False, PDL, SHARE_K, HINT, SLOTS, AHEAD,
               LAZY, STAGES, PAIRS, bnd_ptr, n_tiles, BOUNDS, NTP, TOPDOWN, NR, PER, lst_ptr, SEEDS,
               OWN_MAXIMA)


@triton.jit
def final_item(
    pid_b, pid_c, z_ptr, w_ptr, x_ptr, lq_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,
    seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,
    m_ptr, l_ptr, a_ptr, ck_ptr, ci_ptr, cf_ptr, counter_ptr, ready_ptr, kb_ptr, tokens_ptr, num_ptr,
    B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg,
    G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr, NSC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
    SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, HAS_LQ: tl.constexpr, FILTER: tl.constexpr,
    GREEDY: tl.constexpr, FUSED: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, LANES: tl.constexpr, SWEEP_LANES: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, PRUNE: tl.constexpr, PERSISTENT: tl.constexpr, PDL: tl.constexpr, SHARE_K: tl.constexpr,
    HINT: tl.constexpr, SLOTS: tl.constexpr = 1, AHEAD: tl.constexpr = 1, LAZY: tl.constexpr = False,
    STAGES: tl.constexpr = 3, PAIRS: tl.constexpr = False, bnd_ptr=0, n_tiles=0, BOUNDS: tl.constexpr = False,
    NTP: tl.constexpr = 1, TOPDOWN: tl.constexpr = False, NR: tl.constexpr = 1,
    PER: tl.constexpr = 1, lst_ptr=0, SEEDS: tl.constexpr = 1, OWN_MAXIMA: tl.constexpr = False,
):
    """The work of batch tile pid_b, chunk pid_c of ``verify_final_kernel``. PERSISTENT (called by
    ``verify_persistent_kernel``): the phase-1 partials are read with volatile loads (written by
    other programs of the same launch), and the tile's last finisher also resets ``ready_ptr[pid_b]``,
    the count of its finished phase-1 items. PDL: everything phase 1 does not write is loaded before
    ``gdc_wait``, the partials after it. SLOTS > 1 (with PRUNE, lanes): the sweep votes per slot
    (``slots.sweep_row_slots``), AHEAD tiles loaded ahead (0: Triton's pipeliner, STAGES stages); LAZY
    (with HAS_W): the draft row read only where a logit can reach the floor (``slots.sweep_row_slots_lazy``);
    PAIRS (not LAZY): bfloat16 rows of unit stride read as int32 pairs (``slots.load_slot_tile``). TOPDOWN (one
    batch row a program, no top-k / top-p): the top-down FINAL noise, row n's blocks of 64 drawn only where the
    stats launch's block maxima let them reach the floor its programs share in kb_ptr
    (``topdown.sweep_row_top_down``; NR: a power of two >= a program's blocks, SEEDS: segments whose best block is
    drawn first, PER: blocks drawn together after them; lst_ptr: NR int32 of scratch per program; OWN_MAXIMA: the
    final programs find row n's block maxima themselves, reading z of row n, and bnd_ptr holds one row of them per
    batch row)."""
    HAS_W_STATS: tl.constexpr = HAS_W and not HAS_LQ
    b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = b < B
    b64 = b.to(tl.int64)
    i = tl.arange(0, ROWS)[None, :]  # row index: position i
    p_mask = b_mask[:, None] & (i < G + 1)
    q_mask = b_mask[:, None] & (i < G)
    z_rows = z_ptr + b64[:, None] * szb + i * szr  # [BB, R]
    w_rows = w_ptr + b64[:, None] * swb + i * swr
    x = tl.load(x_ptr + b64[:, None] * sxb + i * sxg, mask=q_mask, other=0).to(tl.int64)  # [BB, R]
    x_ok = (x >= 0) & (x < V)
    x = tl.where(x_ok, x, 0)  # masked id: never read out of bounds
    # ---- the normaliser of every row (or, for T = 0, its argmax)
    thr_p = tl.load(thr_p_ptr + b64[:, None] * (G + 1) + i, mask=p_mask, other=NEG_INF) if FILTER else 0.0
    tid_p = tl.load(tid_p_ptr + b64[:, None] * (G + 1) + i, mask=p_mask, other=0) if FILTER else 0
    thr_q = tl.load(thr_q_ptr + b64[:, None] * G + i, mask=q_mask, other=NEG_INF) if FILTER and HAS_W else 0.0
    tid_q = tl.load(tid_q_ptr + b64[:, None] * G + i, mask=q_mask, other=0) if FILTER and HAS_W else 0
    if not GREEDY:  # ---- what the accept tests need besides the normalisers (none of it written by phase 1)
        s_x = tl.where(q_mask, load_scaled(z_rows + x * szv, q_mask, T, True), 0.0)  # z_i(x_i) / T
        if FILTER:
            s_x = apply_filter(s_x, x, thr_p, tid_p)
        if HAS_W:
            t_x = tl.where(q_mask, load_scaled(w_rows + x * swv, q_mask, T, True), 0.0)
            if FILTER:
                t_x = apply_filter(t_x, x, thr_q, tid_q)
        if HAS_LQ:
            lq_x = tl.load(lq_ptr + b64[:, None] * slb + i * slg, mask=q_mask, other=0.0).to(tl.float32)
        lo, hi, off, row = row_counters(seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset, b,
                                        b_mask, SEED_TENSOR, OFFSET_TENSOR, PER_ROW_SEED)
        k_accept = key(lo[:, None], hi[:, None], off[:, None], row[:, None], i.to(tl.uint32),
                       tl.full((), ACCEPT_STREAM, tl.uint32))
        log_u = tl.log(uniform_from_bits(mix(k_accept)))  # vocab coordinate 0
    if PDL:
        gdc_wait()  # phase 1's partials (and its counter reset) are visible from here on
    if FUSED:
        if GREEDY:
            _, arg = row_argmax(z_rows[:, :, None], p_mask[:, :, None], 0, V, szv, BLOCK_B, ROWS, BLOCK_V)
        elif LANES:
            m, l, _ = rows_stats_lanes(z_ptr, szb, szr, szv, thr_p_ptr, tid_p_ptr, b64, b_mask, G + 1, 0, V, T, inv_T,
                                       BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST, False)
            lse_p = m + safe_log(l)
            if HAS_W_STATS:
                m, l, _ = rows_stats_lanes(w_ptr, swb, swr, swv, thr_q_ptr, tid_q_ptr, b64, b_mask, G, 0, V, T, inv_T,
                                           BLOCK_B, ROWS, FILTER, BLOCK_V // VEC, VEC, FAST, False)
                lse_q = m + safe_log(l)
        else:
            m, l = row_stats(z_rows[:, :, None], p_mask[:, :, None], 0, V, szv, T, thr_p, tid_p,
                             BLOCK_B, ROWS, BLOCK_V, FILTER)
            lse_p = m + safe_log(l)
            if HAS_W_STATS:
                m, l = row_stats(w_rows[:, :, None], q_mask[:, :, None], 0, V, swv, T, thr_q, tid_q,
                                 BLOCK_B, ROWS, BLOCK_V, FILTER)
                lse_q = m + safe_log(l)
    else:
        c = tl.arange(0, NC)[None, :, None]
        part = ((b64[:, None, None] * C + c) * 2) * ROWS + i[:, None, :]  # [BB, NC, R]
        cp_mask = b_mask[:, None, None] & (c < C) & (i[:, None, :] < G + 1)  # written partials only
        cq_mask = b_mask[:, None, None] & (c < C) & (i[:, None, :] < G)
        if GREEDY:
            best = tl.load(m_ptr + part, mask=cp_mask, other=NEG_INF, volatile=PERSISTENT)
            arg = tl.load(a_ptr + (b64[:, None, None] * C + c) * ROWS + i[:, None, :], mask=cp_mask, other=BIG_INDEX,
                          volatile=PERSISTENT)
            arg = tl.min(tl.where(best == tl.max(best, axis=1)[:, None, :], arg, BIG_INDEX), axis=1)
        else:
            lse_p = combine_lse(tl.load(m_ptr + part, mask=cp_mask, other=NEG_INF, volatile=PERSISTENT),
                                tl.load(l_ptr + part, mask=cp_mask, other=0.0, volatile=PERSISTENT), 1)
            if HAS_W_STATS:
                lse_q = combine_lse(tl.load(m_ptr + part + ROWS, mask=cq_mask, other=NEG_INF, volatile=PERSISTENT),
                                    tl.load(l_ptr + part + ROWS, mask=cq_mask, other=0.0, volatile=PERSISTENT), 1)
    # ---- accept tests and the first rejection n
    if GREEDY:
        accepted = x_ok & (x == arg)
        n = tl.min(tl.where(q_mask & ~accepted, i, G), axis=1)
        if pid_c == 0:
            emit(tokens_ptr, num_ptr, b, b_mask, x, n, pick_row_int(arg, i, n), G, ROWS)
            if PERSISTENT:
                tl.store(ready_ptr + pid_b, 0)  # the tile's only phase-2 item: its phase-1 count is spent
    else:
        lse_p = tl.where(p_mask, lse_p, 0.0)  # padding rows: no -inf - -inf below
        lp_x = s_x - lse_p
        if HAS_LQ:
            lse_q = t_x - lq_x  # the draft row's normaliser is one logit away
        elif HAS_W:
            lse_q = tl.where(q_mask, lse_q, 0.0)
            lq_x = t_x - lse_q
        else:
            lq_x = tl.zeros((BLOCK_B, ROWS), tl.float32)  # one-hot q: log q(x) = 0
        accepted = x_ok & (log_u < lp_x - lq_x)
        n = tl.min(tl.where(q_mask & ~accepted, i, G), axis=1)  # [BB]
        # ---- the residual / bonus draw over this program's chunk of row n
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
        floor0 = tl.full((BLOCK_B,), NEG_INF, tl.float32)
        if HINT:  # a pruning floor from the C chunk maxima of row n (stats_item ARGMAX)
            c3 = tl.arange(0, NC)[None, :]
            c3_mask = b_mask[:, None] & (c3 < C)
            cand = tl.load(a_ptr + (b64[:, None] * C + c3) * ROWS + n[:, None], mask=c3_mask, other=0)
            floor0 = hint_floor(z_n, w_n, szv, swv, cand, c3_mask, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
                                thr_pn, tid_pn, thr_qn, tid_qn, k_final, HAS_W, FILTER, FAST)
        use_p = (n == G) | ~x_n_ok  # the bonus; or a masked draft id: y ~ p
        if TOPDOWN:  # the top-down noise: blocks of 64 whose bound (the stats launch's block maxima) reaches the floor
            k_blk = key(lo, hi, off, row, n.to(tl.uint32), tl.full((), FINAL_BLOCKS_STREAM, tl.uint32))
            bm_n = bnd_ptr + (b64 if OWN_MAXIMA else b64 * (G + 1) + n) * n_tiles  # row n's block maxima
            best_r, idx_r, best_p, idx_p, mass = sweep_row_top_down(
                z_n, w_n, bm_n, kb_ptr + pid_b.to(tl.int64) * 2,
                lst_ptr + (pid_b.to(tl.int64) * SC + pid_c) * NR, n_tiles, v_lo // BLOCK, (v_hi + BLOCK - 1) // BLOCK,
                szv, swv, V, inv_T, pick_row(lse_p, i, n), lse_qn, x_n, k_final, k_blk, b_mask, use_p, NR, HAS_W, FAST,
                SEEDS, PER, SC > 1, OWN_MAXIMA)
        elif BOUNDS:
            best_r, idx_r, best_p, idx_p, mass = sweep_row_bounded(
                z_n, w_n, bnd_ptr + (b64 * (G + 1) + n) * n_tiles, n_tiles, szv, swv, V, T, inv_T, pick_row(lse_p, i, n),
                lse_qn, x_n, k_final, b_mask, use_p, BLOCK_B, BLOCK_V, NTP, SWEEP_V, SLOTS, HAS_W, FAST, PAIRS)
        elif SWEEP_LANES and SLOTS > 1 and LAZY and HAS_W:
            best_r, idx_r, best_p, idx_p, mass = sweep_row_slots_lazy(
                z_n, w_n, szv, swv, v_lo, v_hi, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
                thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, floor0, use_p.to(tl.int32), BLOCK_B, SWEEP_V, SLOTS,
                FILTER, FAST)
        elif SWEEP_LANES and SLOTS > 1:
            best_r, idx_r, best_p, idx_p, mass = sweep_row_slots(
                z_n, w_n, szv, swv, v_lo, v_hi, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
                thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, floor0, BLOCK_B, SWEEP_V, SLOTS, HAS_W, FILTER, FAST,
                AHEAD, STAGES, PAIRS)
        elif SWEEP_LANES:
            best_r, idx_r, best_p, idx_p, mass = sweep_row_lanes(
                z_n, w_n, szv, swv, v_lo, v_hi, T, inv_T, pick_row(lse_p, i, n), lse_qn, x_n,
                thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, kb_ptr + b64 * 2, floor0, BLOCK_B, SWEEP_V, HAS_W,
                FILTER, FAST, PRUNE, SHARE_K)
        else:
            best_r, idx_r, best_p, idx_p, mass = sweep_row(
                z_n, w_n, szv, swv, v_lo, v_hi, T, pick_row(lse_p, i, n), lse_qn, x_n,
                thr_pn, tid_pn, thr_qn, tid_qn, k_final, b_mask, BLOCK_B, SWEEP_V, HAS_W, FILTER)
        if FUSED:
            y = tl.where(use_p | (mass == 0), idx_p, idx_r)
            emit(tokens_ptr, num_ptr, b, b_mask, x, n, y, G, ROWS)
        else:
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
                if PERSISTENT:
                    tl.store(ready_ptr + pid_b, 0)  # every phase-2 item of the tile is past its wait


def __getattr__(name):  # the launcher finds every kernel here; persistent.py imports this module, hence lazily
    if name == "verify_persistent_kernel":
        from .persistent import verify_persistent_kernel

        return verify_persistent_kernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
