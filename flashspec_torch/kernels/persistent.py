"""The split verify as one persistent launch (``KernelConfig(schedule="persistent")``).

``verify_stats_kernel`` then ``verify_final_kernel(FUSED=False)`` (the "two_launch" schedule) do
not overlap: the first is memory bound, the second issue bound, and the second re-reads row n of
the target logits from DRAM. Here a grid of P programs (about SMs x occupancy) takes **tickets**
from a global atomic counter until they run out; each ticket is one work item with exactly the
arithmetic of one program of the two-launch pair (``stats_item`` / ``final_item`` of
``verify.py``), so tokens and ``num_accepted`` are those of the two-launch schedule:

* phase-1 item (batch tile k, chunk c): the (max, sum-exp) partials of the G+1 target rows (and
  the G draft rows without ``draft_logprobs``; the argmax for T = 0) over chunk c; then
  ``ready[k] += 1`` with release semantics (after a barrier: every thread's stores first).
* phase-2 item (k, c): spins on an acquire load of ``ready[k]`` until it reaches C (every chunk of
  the tile normalised), then recombines, decides n, sweeps sweep chunk c of row n (row n split in
  SC chunks, as the two-launch final kernel's ``sweep_chunks``) and writes its candidate; the last
  of the tile's C2 phase-2 items (``counter[k]``, as in the two-launch final kernel) reduces the
  candidates and writes the tokens. T = 0 has one phase-2 item per tile (C2 = 1: the argmax
  partials decide everything), otherwise C2 = SC.

Ticket order, with a lookahead of L tiles (``ticket_item``): phase 1 of tiles 0 .. L-1, then for
k = 0, 1, ...: phase 1 of tile k + L followed by phase 2 of tile k, then the last L tiles' phase 2.
A phase-2 item is handed out about L (C + C2) tickets after its tile's phase-1 items, so with
L (C + C2) >~ P those have usually finished (no waiting) and were recent enough that row n is
still in L2 when it is swept.

Deadlock freedom: tickets are taken in increasing order (one atomic counter), and a ticket is only
ever held by a program that is running (it took it). Phase-1 items never wait. A phase-2 item
waits only for the phase-1 items of its own tile, all of which have lower tickets, hence were
already taken by running programs, which finish them without waiting on anything. So every wait
ends, whatever P is and however many programs are resident (programs that never started hold no
ticket). In the Triton interpreter the programs run one after the other: program 0 takes every
work ticket in order, so each wait is already satisfied when it is reached.

Replayable without a host write (CUDA graphs): the counters live in a persistent zeroed
workspace (``flashspec_torch.verify.persistent_workspace``) and every launch leaves them at zero.
Each program takes tickets until it draws one >= items, so a launch draws exactly items + P
tickets; the program that draws the last one, items + P - 1, is the last to touch the ticket
counter and stores 0. ``ready[k]`` and ``counter[k]`` are reset by the tile's last phase-2
finisher (every phase-2 item of the tile is past its wait by then). A launch that never completes
(a device fault) leaves them dirty: the launcher zeroes the workspace if a launch raises.
"""

import triton
import triton.language as tl

from .verify import final_item, stats_item


@triton.jit
def ticket_item(t, tiles, C, C2, L):  # -> (phase 2?, batch tile, chunk): see the module docstring
    S = C + C2
    pro = L * C  # phase 1 of the first L tiles
    epi = pro + (tiles - L) * S  # from here: phase 2 of the last L tiles
    u = t - pro
    k = u // S
    r = u - k * S
    e = t - epi
    in_pro = t < pro
    in_epi = t >= epi
    phase2 = tl.where(in_pro, 0, tl.where(in_epi, 1, (r >= C).to(tl.int32)))
    tile = tl.where(in_pro, t // C, tl.where(in_epi, tiles - L + e // C2, tl.where(r < C, k + L, k)))
    c = tl.where(in_pro, t % C, tl.where(in_epi, e % C2, tl.where(r < C, r, r - C)))
    return phase2, tile, c


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset_lo"])  # new seeds / offsets never recompile
def verify_persistent_kernel(
    z_ptr, w_ptr, x_ptr, lq_ptr,  # [B, G+1, V], [B, G, V], [B, G] int, [B, G] float
    thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,  # [B, G+1] f32 / i32, [B, G] f32 / i32
    seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,  # [B] or [] int64, or scalars
    m_ptr, l_ptr, a_ptr, ck_ptr, ci_ptr, cf_ptr, counter_ptr,  # phase-1 partials; [B, C, 2] candidates
    tokens_ptr, num_ptr,  # [B, G+1] i32, [B] i32
    ticket_ptr, ready_ptr,  # [1] i32, [tiles] i32: zero before and after every launch
    B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg,
    tiles, C2, L, P,  # batch tiles, phase-2 items per tile (1 for T = 0, else SC), lookahead, programs
    G: tl.constexpr, ROWS: tl.constexpr, NC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
    SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, HAS_LQ: tl.constexpr, FILTER: tl.constexpr,
    GREEDY: tl.constexpr, SEED_TENSOR: tl.constexpr, OFFSET_TENSOR: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, LANES: tl.constexpr, SWEEP_LANES: tl.constexpr, VEC: tl.constexpr,
    FAST: tl.constexpr, PRUNE: tl.constexpr, NSC: tl.constexpr = 1, SLOTS: tl.constexpr = 1, AHEAD: tl.constexpr = 1,
    LAZY: tl.constexpr = False, STAGES: tl.constexpr = 3, PAIRS: tl.constexpr = False,
):
    """Both phases of the split verify in one launch of P programs; grid (P,). Phase 1 splits V in C
    chunks, phase 2 sweeps row n in SC chunks of sweep_chunk entries (``KernelConfig.sweep_chunks``);
    SLOTS > 1: the sweep's vote per slot (``slots.sweep_row_slots``)."""
    HAS_W_STATS: tl.constexpr = HAS_W and not HAS_LQ
    items = tiles * (C + C2)
    t = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
    while t < items:
        phase2, tile, c = ticket_item(t, tiles, C, C2, L)
        if phase2 == 0:
            stats_item(tile, c, z_ptr, w_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr, m_ptr, l_ptr, a_ptr,
                       B, V, chunk, C, T, inv_T, szb, szr, szv, swb, swr, swv,
                       G, ROWS, BLOCK_B, BLOCK_V, HAS_W_STATS, FILTER, GREEDY, LANES, VEC, FAST, False)
            tl.debug_barrier()  # every thread's partials are stored before the release
            tl.atomic_add(ready_ptr + tile, 1, sem="release", scope="gpu")
        else:
            ready = tl.atomic_add(ready_ptr + tile, 0, sem="acquire", scope="gpu")
            while ready < C:  # only lower tickets (running programs) increment it: see the docstring
                ready = tl.atomic_add(ready_ptr + tile, 0, sem="acquire", scope="gpu")
            final_item(tile, c, z_ptr, w_ptr, x_ptr, lq_ptr, thr_p_ptr, tid_p_ptr, thr_q_ptr, tid_q_ptr,
                       seed_ptr, offset_ptr, seed_lo, seed_hi, offset_lo, s_seed, s_offset,
                       m_ptr, l_ptr, a_ptr, ck_ptr, ci_ptr, cf_ptr, counter_ptr, ready_ptr, counter_ptr, tokens_ptr, num_ptr,
                       B, V, chunk, C, sweep_chunk, SC, T, inv_T, szb, szr, szv, swb, swr, swv, sxb, sxg, slb, slg,
                       G, ROWS, NC, NSC, BLOCK_B, BLOCK_V, SWEEP_V, HAS_W, HAS_LQ, FILTER, GREEDY, False, SEED_TENSOR,
                       OFFSET_TENSOR, PER_ROW_SEED, LANES, SWEEP_LANES, VEC, FAST, PRUNE, True, False, False, False,
                       SLOTS, AHEAD, LAZY, STAGES, PAIRS)
        t = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
    if t == items + P - 1:  # the launch's last ticket: nobody touches the counter after this
        tl.store(ticket_ptr, 0)
