"""``verify`` for torch tensors: argument checks, impl dispatch (the plain-torch reference is
``reference.py``), and the launcher of the fused Triton kernels (``flashspec_torch/kernels/verify.py``).

Letters as in SPEC.md: z target logits, w draft logits, T temperature, p / q the target / draft
distributions after temperature, top-k and top-p, x drafted tokens, u accept uniforms, n the first
rejection, y the residual or bonus token.

Both implementations are free of host synchronisation (no ``.item()``, no data-dependent shapes),
so a step can be captured in a CUDA graph; pass ``seed`` / ``offset`` as device tensors to replay
it with new randomness. Value checks that need the data (NaN logits, rows without a finite logit,
draft ids outside [0, V)) run on CPU tensors (``validate=False`` skips them: the engine, whose drafts
emit valid ids and whose logits are screened on the device, does), or on any device with ``validate=True``, which costs
a device-to-host synchronisation. Without them a draft id outside [0, V) (e.g. -1 padding) is
never read out of bounds: it counts as rejected and y is drawn from p at that position.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import replace

import numpy as np
import torch

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult, check_verify_args

from . import persistent as schedule
from .kernel_config import KernelConfig, check_top_down
from .reference import gather, log_probs, scale, sorted_nucleus, verify_reference

IMPLS = ("triton", "reference")
DEFAULT_SCHEDULE = "two_launch"  # choose_config's schedule on a GPU (the one-line switch)
INT32_MAX = 2**31 - 1


def verify(
    target_logits: torch.Tensor,  # [B, G+1, V] float: raw target logits
    draft_tokens: torch.Tensor,  # [B, G] int: x
    draft_logits: torch.Tensor | None = None,  # [B, G, V] float raw draft logits; None: one-hot q
    draft_logprobs: torch.Tensor | None = None,  # [B, G] float: log q_i(x_i) as the draft computed it
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | torch.Tensor = 0,  # int, or int tensor [] or [B] (per-row seeds: generator row 0)
    offset: int | torch.Tensor = 0,  # int, or int tensor [] or [B]
    impl: str | None = None,  # "triton" (default on CUDA) or "reference" (default on CPU)
    validate: bool | None = None,  # value checks: None on CPU tensors only, True also on a GPU (a host sync), False never
    config: KernelConfig | None = None,  # impl="triton": the kernels' tiling and variants (None: choose_config)
) -> VerifyResult[torch.Tensor]:
    """Exact speculative verification (SPEC.md); num_accepted [B] int32, tokens [B, G+1] int32."""
    shape, cfg = check_verify_args(
        target_logits, draft_tokens, draft_logits, draft_logprobs, temperature, top_k, top_p, seed, offset
    )
    check_tensors(target_logits, draft_tokens, draft_logits, draft_logprobs, seed, offset)
    impl = default_impl(target_logits) if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} must be one of {IMPLS}")
    if validate or (validate is None and target_logits.device.type == "cpu"):
        check_values(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg)
    if impl == "reference":
        return verify_reference(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg, seed, offset)
    return verify_triton(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg, seed, offset, config)


def default_impl(target_logits: torch.Tensor) -> str:
    return "triton" if target_logits.is_cuda else "reference"


# ----------------------------------------------------------------------------- checks


def check_tensors(z, x, w, lq, seed, offset) -> None:
    """Every array argument is a torch tensor on target_logits' device."""
    named = {"target_logits": z, "draft_tokens": x, "draft_logits": w, "draft_logprobs": lq}
    named.update({k: v for k, v in (("seed", seed), ("offset", offset)) if not isinstance(v, int)})
    for name, a in named.items():
        if a is None:
            continue
        if not isinstance(a, torch.Tensor):
            raise ValueError(f"{name} is a {type(a).__name__}; flashspec_torch.verify takes torch tensors "
                             "(flashspec.reference.verify takes NumPy arrays)")
        if a.device != z.device:
            raise ValueError(f"{name} is on {a.device} but target_logits is on {z.device}: pass tensors on one device "
                             "(seed / offset: a Python int or a tensor on that device)")


def check_values(z, x, w, lq, cfg: SamplingConfig) -> None:
    """The oracle's value checks (they read the data: a host sync on a GPU)."""
    v = z.shape[-1]
    check_logits("target_logits", z)
    if w is not None:
        check_logits("draft_logits", w)
    bad = (x < 0) | (x >= v)
    if bool(bad.any()):
        b, i = (int(k) for k in bad.nonzero()[0])
        raise ValueError(f"draft_tokens[{b}, {i}] = {int(x[b, i])} is out of range [0, {v}); "
                         "padding ids such as -1 are not tokens: verify only rows with real drafts")
    if lq is not None:
        lqf = lq.float()
        if not bool((torch.isfinite(lqf) & (lqf <= 1e-3)).all()):
            raise ValueError("draft_logprobs must be finite log-probabilities (<= 0)")
    if w is not None and lq is None and not cfg.greedy:
        lq_x = gather(log_probs(w.float(), cfg), x.long())
        if bool(torch.isneginf(lq_x).any()):
            b, i = (int(k) for k in torch.isneginf(lq_x).nonzero()[0])
            raise ValueError(f"draft_tokens[{b}, {i}] = {int(x[b, i])} has zero probability under draft_logits after "
                             "temperature/top-k/top-p: the draft must sample from exactly the q given to verify")


def check_logits(name: str, a: torch.Tensor) -> None:  # [..., V]
    a = a.float()
    bad = torch.isnan(a) | torch.isposinf(a)
    if bool(bad.any()):
        idx = [int(k) for k in bad.nonzero()[0]]
        raise ValueError(f"{name}{idx} is {float(a[tuple(idx)])}: logits must be finite or -inf (masked)")
    empty = ~torch.isfinite(a).any(-1)
    if bool(empty.any()):
        idx = [int(k) for k in empty.nonzero()[0]]
        raise ValueError(f"{name}{idx} has no finite logit: every row needs at least one token with mass")


# ----------------------------------------------------------------------------- the Triton path


def next_pow2(k: int) -> int:
    return 1 << max(0, k - 1).bit_length()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def choose_config(batch: int, gamma: int, vocab: int, device: torch.device, itemsize: int = 2) -> KernelConfig:
    """GPU: V split over programs until ~16 programs per SM (B < 32), ~8 (B < 128) or ~4 (B >= 128):
    fewer, longer programs measured faster as B grows (H200, benchmarks/results/verify_variants_chunks.json:
    B=32, G=4, V=128256 bf16 35 us at 8 per SM against 43 at 16; B=128 90 us at 4 against 100 at
    8), because the recombine of the partials and the last-finisher reduction are paid per program;
    "lanes" loops with 8 KB (bf16: 4096 logits) per program per step, fewer logits per step when the
    split needs more chunks. The final launch with PDL, and from B=128 its sweep split 8x finer into
    one-warp programs (verify_variants_sweep.json: 0.85-0.99x the time at B >= 128, 1.1-1.35x at
    B=32). The sweep pruned with a vote per slot of 4 logits (``sweep_slots=4``, kernels/slots.py) from B=32
    or ~8 sweep tiles per program: at or below the tile vote at all 20 shapes of verify_variants_slots.json
    (B = 128, 256; B = 32 with V = 128256: B=256, G=4, V=128256 bf16 143 us against 149; B=256, G=8 205
    against 232; B=32, G=4 35 against 38), within 2.5% of it at B=32, V=32000 (verify_variants_slots_b32.json).
    From B=128 the one-warp sweep reads bfloat16 rows as int32 pairs (``bf16_pairs``): 1-3% faster at all 12
    bf16 shapes with B = 128, 256, 5-10% slower with B=32's four-warp programs at G = 1, 4
    (verify_variants_pairs.json). Interpreter: few, large programs."""
    rows = next_pow2(gamma + 1)
    if device.type != "cuda" or interpreting():  # the interpreter: few, large programs
        block_v = max(16, min(next_pow2(vocab), 4096 // rows))
        block_b = min(next_pow2(batch), max(1, 2**18 // (rows * block_v)))
        return KernelConfig(block_b=block_b, block_v=block_v, sweep_v=max(16, min(next_pow2(vocab), 4096)))
    per_sm = 16 if batch < 32 else 8 if batch < 128 else 4
    target_programs = per_sm * device_sms(device)
    wanted = min(math.ceil(target_programs / batch), 128 if batch < 8 else 32 if batch < 32 else 16)
    block_v = min(8192 // itemsize, max(256, next_pow2(math.ceil(vocab / wanted))))
    chunks = min(math.ceil(vocab / block_v), wanted)
    tiles = vocab / chunks / 1024  # sweep tiles per program: the tile vote paid from about 8 on flat rows
    prune = tiles >= 7.5 or batch >= 32  # the slot vote: faster, or within 2.5%, from B = 32 (2-8 tiles)
    config = KernelConfig(block_b=1, block_v=block_v, sweep_v=1024, num_chunks=chunks, num_warps=4, prune=prune,
                          sweep_slots=4 if prune else 0, schedule=DEFAULT_SCHEDULE,
                          pdl=True)  # PDL: 1-3 us less per step (no-op before sm_90)
    if batch >= 128:  # the sweep as 8x the programs of one warp: B=256, G=8, V=128256 bf16 212 us against 247
        config = replace(config, sweep_chunks=8 * chunks, sweep_warps=1, sweep_v=256, bf16_pairs=True)
    return config


def tile_config(batch: int, gamma: int, vocab: int, device: torch.device) -> KernelConfig:
    """The previous GPU default ("tile" loops), measured best for them on an H200
    (benchmarks/results/verify_tuning.json): [1, ROWS, block_v] tiles of about 2K elements (4K for
    G = 8) and ~16 programs per SM."""
    rows = next_pow2(gamma + 1)
    block_v = 256 if rows >= 8 else 2048 // rows
    target_programs = 16 * device_sms(device)
    blocks = math.ceil(vocab / block_v)
    chunks = min(blocks, math.ceil(target_programs / batch), 128 if batch < 8 else 32)
    return KernelConfig(block_b=1, block_v=block_v, sweep_v=2048, num_chunks=chunks, num_warps=8,
                        stream="tile", sweep="tile")


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def has_pdl(device_index: int) -> bool:  # programmatic dependent launch: compute capability 9.0 or newer
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def cuda_index(device: torch.device) -> int:  # a CUDA device's index ("cuda" alone: the current one)
    return device.index if device.index is not None else torch.cuda.current_device()


def pdl_possible(device: torch.device) -> bool:  # never in the interpreter
    if device.type != "cuda" or interpreting():
        return False
    return has_pdl(cuda_index(device))


def device_sms(device: torch.device) -> int:  # SMs of a GPU; 1 in the interpreter (its grids are small)
    if device.type != "cuda" or interpreting():
        return 1
    return sm_count(cuda_index(device))


def bf16_pairs(t: torch.Tensor) -> bool:  # [B, R, V]: rows readable as int32 pairs (slots.load_slot_tile)
    return (t.dtype == torch.bfloat16 and t.shape[2] % 2 == 0 and t.stride(2) == 1 and t.stride(0) % 2 == 0
            and t.stride(1) % 2 == 0 and t.data_ptr() % 4 == 0)


def split_vocab(vocab: int, parts: int, tile: int) -> tuple[int, int]:
    """V in at most ``parts`` chunks of whole tiles: (entries per chunk, number of chunks)."""
    chunk = math.ceil(math.ceil(vocab / min(parts, math.ceil(vocab / tile))) / tile) * tile
    return chunk, math.ceil(vocab / chunk)


def load_kernels(device: torch.device):
    """The kernels module; on CPU only with the Triton interpreter (a clear error otherwise)."""
    hint = ("set TRITON_INTERPRET=1 in the environment before flashspec_torch first uses impl='triton' "
            "(the interpreter is chosen when the kernels are defined), or use impl='reference'")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(f"impl='triton' on {device.type} tensors needs the Triton interpreter: {hint}")
    from .kernels import verify as kernels

    interpreted = type(kernels.verify_final_kernel).__name__ == "InterpretedFunction"
    if device.type != "cuda" and not interpreted:
        raise RuntimeError(f"impl='triton' on {device.type}: the kernels were defined without the interpreter; {hint}")
    return kernels


def filter_thresholds(logits: torch.Tensor, cfg: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """top-k then top-p as one cut per row: keep s > thr, and s == thr for ids <= thr_id.

    logits [B, R, V] -> (thr [B, R] float32, thr_id [B, R] int32), on the device, no sync. Cost:
    one scaled copy of the rows, a top-k (k > 0) and, for top-p, a full sort of every row
    (O(R V log V) work and several V-sized intermediates per row; top-p dominates the step).
    The cut equals the oracle's kept set except where two tokens of different logits round to the
    same float32 probability at the boundary (the oracle then orders them by id).
    """
    s = scale(logits.float(), cfg.temperature)
    b, r, v = s.shape
    if 0 < cfg.top_k < v:
        kth = torch.topk(s, cfg.top_k, dim=-1).values[..., -1]
    else:
        kth = s.new_full((b, r), float("-inf"))
    if cfg.top_p >= 1.0:
        return kth.contiguous(), torch.full((b, r), INT32_MAX, dtype=torch.int32, device=s.device)
    s = torch.where(s >= kth[..., None], s, float("-inf"))
    order, keep_sorted = sorted_nucleus(s, cfg.top_p)
    kept = (keep_sorted & (s.gather(-1, order) > float("-inf"))).sum(-1, keepdim=True)  # >= 1
    last = order.gather(-1, kept - 1)  # [B, R, 1]: the last kept id in the sorted order
    return s.gather(-1, last)[..., 0].contiguous(), last[..., 0].to(torch.int32).contiguous()


def counter_args(value, batch: int) -> tuple[torch.Tensor | None, int, int]:
    """(tensor int64 or None, scalar low word as int32 bits, stride) for a seed / offset."""
    if isinstance(value, int):
        lo = value & 0xFFFFFFFF
        return None, lo - 2**32 if lo >= 2**31 else lo, 0
    t = value.to(torch.int64).reshape(-1).contiguous()
    return t, 0, 0 if value.ndim == 0 else 1


def verify_triton(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_tokens: torch.Tensor,  # [B, G]
    draft_logits: torch.Tensor | None,  # [B, G, V]
    draft_logprobs: torch.Tensor | None,  # [B, G]
    cfg: SamplingConfig,
    seed,
    offset,
    config: KernelConfig | None = None,
) -> VerifyResult[torch.Tensor]:
    """Launch the fused kernels: one launch if ``config.num_chunks == 1``, else two (see kernels), or
    with ``config.schedule == "persistent"`` one launch of both phases (kernels/persistent.py)."""
    z, x, w, lq = target_logits, draft_tokens, draft_logits, draft_logprobs
    kernels = load_kernels(z.device)
    b, g1, v = z.shape
    g, rows = g1 - 1, next_pow2(g1)
    config = choose_config(b, g, v, z.device, z.element_size()) if config is None else config
    greedy = cfg.greedy
    has_w, has_lq = w is not None and not greedy, lq is not None and not greedy
    filtered = cfg.filtered and not greedy
    dev = z.device
    f32 = dict(dtype=torch.float32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    thr_p, tid_p = filter_thresholds(z, cfg) if filtered else (z, z)
    thr_q, tid_q = filter_thresholds(w, cfg) if filtered and has_w else (z, z)
    w_arg = w if has_w else z
    lq_arg = lq if has_lq else z
    s_ptr, s_lo, s_stride = counter_args(seed, b)
    o_ptr, o_lo, o_stride = counter_args(offset, b)
    seed_hi = (seed >> 32) & 0xFFFFFFFF if isinstance(seed, int) else 0
    seed_hi = seed_hi - 2**32 if seed_hi >= 2**31 else seed_hi
    chunk, chunks = split_vocab(v, config.num_chunks, config.block_v)
    persistent = config.schedule == "persistent"  # flashspec_torch/persistent.py
    fused = chunks == 1 and not persistent
    two_launch = not fused and not persistent
    pdl = config.pdl and two_launch and pdl_possible(z.device)  # else a plain launch
    sweep_chunk, sweeps = chunk, chunks  # the split of row n's sweep (its own, if asked; not the fused launch)
    if config.sweep_chunks and not fused:
        sweep_chunk, sweeps = split_vocab(v, config.sweep_chunks, config.sweep_v)
    pruned_sweep = two_launch and not greedy and config.prune and config.sweep == "lanes"
    share_k = pruned_sweep and config.shared_floor and sweeps > 1  # lanes.sweep_row_lanes(SHARE_K)
    hint = pruned_sweep and config.prune_hint and config.stream == "lanes"  # lanes.hint_floor
    slots = config.sweep_slots if config.prune and config.sweep == "lanes" and not greedy and config.sweep_slots else 1
    lazy = config.lazy_draft and slots > 1
    pairs = config.bf16_pairs and slots > 1 and not lazy and bf16_pairs(z) and (not has_w or bf16_pairs(w))
    bounds = (config.tile_bounds and two_launch and slots > 1 and not lazy and not filtered and config.block_b == 1
              and config.stream == "lanes" and not share_k and not hint)  # kernels/bounds.py
    top_down = config.top_down and not greedy  # kernels/topdown.py (T = 0 draws no noise)
    if top_down:
        check_top_down(config, two_launch, filtered)
    bounds = bounds and not top_down
    n_tiles = math.ceil(v / config.block_v)
    if bounds:
        sweep_chunk, sweeps = v, 1  # one final program per row
    if top_down:  # programs of whole blocks of 64; the stats launch (or the final programs) find the maximum of each
        sweep_chunk, sweeps = split_vocab(v, config.sweep_chunks or chunks, 64)
        n_tiles = math.ceil(v / 64)
    tiles = math.ceil(b / config.block_b)
    t32 = np.float32(cfg.temperature or 1.0)
    temps = (float(t32), float(np.float32(1.0) / t32))  # T and RN(1/T) (exact float32 values)
    lanes = dict(LANES=config.stream == "lanes", VEC=max(1, 16 // z.element_size()),
                 FAST=config.fast_math and not interpreting())
    tokens = torch.empty((b, g1), **i32)
    num = torch.empty((b,), **i32)
    if fused:
        m_buf = l_buf = a_buf = ck = ci = cf = counter = num
    else:
        m_buf, l_buf = torch.empty((b, chunks, 2, rows), **f32), torch.empty((b, chunks, 2, rows), **f32)
        a_buf = torch.empty((b, chunks, rows), **i32) if greedy or hint else num
        ck, ci, cf = torch.empty((b, sweeps, 2), **f32), torch.empty((b, sweeps, 2), **i32), torch.empty((b, sweeps), **i32)
        counter = None if persistent else torch.empty((tiles,), **i32)
    kb = torch.empty((b, 2), **i32) if share_k or top_down else num  # reset by the stats launch
    own_maxima = top_down and config.top_down_maxima == "final"  # row n's block maxima found by the final programs
    bnd = torch.empty((b, 1 if own_maxima else g1, n_tiles), **f32) if bounds or top_down else num  # the block bounds
    nr = next_pow2(sweep_chunk // 64) if top_down else 1  # blocks of 64 of a top-down final program (a power of two)
    lst = torch.empty((b, sweeps, nr), **i32) if top_down else num  # its list of blocks to draw (kernels/topdown.py)
    counters = (z if s_ptr is None else s_ptr, z if o_ptr is None else o_ptr, s_lo, seed_hi, o_lo, s_stride, o_stride)
    seeds = dict(SEED_TENSOR=s_ptr is not None, OFFSET_TENSOR=o_ptr is not None,
                 PER_ROW_SEED=isinstance(seed, torch.Tensor) and seed.ndim == 1)
    lq_strides = (lq_arg.stride(0), lq_arg.stride(1)) if has_lq else (0, 0)
    args = (z, w_arg, x, lq_arg, thr_p, tid_p, thr_q, tid_q, *counters,
            m_buf, l_buf, a_buf, ck, ci, cf, counter, tokens, num)
    sizes = (b, v, chunk, chunks, *temps,
             z.stride(0), z.stride(1), z.stride(2), w_arg.stride(0), w_arg.stride(1), w_arg.stride(2),
             x.stride(0), x.stride(1), *lq_strides)
    flags = dict(G=g, ROWS=rows, NC=next_pow2(chunks), BLOCK_B=config.block_b, BLOCK_V=config.block_v,
                 SWEEP_V=config.sweep_v, HAS_W=has_w, HAS_LQ=has_lq, FILTER=filtered, GREEDY=greedy, **seeds, **lanes,
                 SWEEP_LANES=config.sweep == "lanes", PRUNE=config.prune, num_warps=config.num_warps)
    launch = dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)
    if config.max_registers and not interpreting():
        flags["maxnreg"] = config.max_registers
    if not persistent:
        final_flags = dict(flags, num_warps=config.sweep_warps or config.num_warps)
        rows_per_group = config.batch_group if two_launch and config.batch_group else b
        for g0 in range(0, b, rows_per_group):  # batch groups: group k + 1's stats overlap group k's sweep (PDL)
            g_end, t0 = min(b, g0 + rows_per_group), g0 // config.block_b
            g_tiles = math.ceil((g_end - g0) / config.block_b)
            if two_launch:
                chained = pdl and g0 > 0  # behind the previous group's final launch
                kernels.verify_stats_kernel[(g_tiles, chunks)](
                    z, w_arg, thr_p, tid_p, thr_q, tid_q, m_buf, l_buf, a_buf, counter, kb,
                    g_end, v, chunk, chunks, *temps,
                    z.stride(0), z.stride(1), z.stride(2), w_arg.stride(0), w_arg.stride(1), w_arg.stride(2), t0,
                    G=g, ROWS=rows, BLOCK_B=config.block_b, BLOCK_V=config.block_v,
                    HAS_W_STATS=has_w and not has_lq, FILTER=filtered, GREEDY=greedy, **lanes, PDL=pdl,
                    SHARE_K=share_k or top_down, HINT=hint, WAIT_END=chained, num_warps=config.num_warps,
                    **(dict(launch_pdl=True) if chained else {}),
                    **(dict(zip(("seed_ptr", "offset_ptr", "seed_lo", "seed_hi", "offset_lo", "s_seed", "s_offset"),
                                counters), bnd_ptr=bnd, n_tiles=n_tiles, BOUNDS=True, **seeds) if bounds else {}),
                    **(dict(bnd_ptr=bnd, n_tiles=n_tiles, BOUNDS=2) if top_down and not own_maxima else {}))
            kernels.verify_final_kernel[(g_tiles, 1 if greedy else sweeps)](
                *args[:-2], kb, *args[-2:], g_end, *sizes[1:4], sweep_chunk, sweeps, *sizes[4:], t0,
                NSC=next_pow2(sweeps), FUSED=fused, SHARE_K=share_k, HINT=hint, SLOTS=slots,
                AHEAD=config.sweep_ahead if slots > 1 else 1, REVERSE=config.reverse_final and two_launch,
                LAZY=lazy, STAGES=config.sweep_stages, PAIRS=pairs, **final_flags, **launch,
                **(dict(bnd_ptr=bnd, n_tiles=n_tiles, BOUNDS=True, NTP=next_pow2(n_tiles)) if bounds else {}),
                **(dict(bnd_ptr=bnd, n_tiles=n_tiles, TOPDOWN=True, NR=nr, PER=config.top_down_blocks, lst_ptr=lst,
                        SEEDS=min(config.top_down_seeds, nr), OWN_MAXIMA=own_maxima) if top_down else {}))
        return VerifyResult(num_accepted=num, tokens=tokens)
    per_tile = chunks + (1 if greedy else sweeps)  # phase-1 and phase-2 items of one batch tile
    programs, lookahead = schedule.grid(device_sms(dev) * config.programs_per_sm, config.lookahead, tiles, per_tile)
    with schedule.workspace(dev, tiles) as (ticket, counter, ready):
        kernels.verify_persistent_kernel[(programs,)](
            *args[:-3], counter, tokens, num, ticket, ready, *sizes[:4], sweep_chunk, sweeps, *sizes[4:],
            tiles, per_tile - chunks, lookahead, programs, NSC=next_pow2(sweeps), SLOTS=slots,
            AHEAD=config.sweep_ahead if slots > 1 else 1, LAZY=lazy, STAGES=config.sweep_stages, PAIRS=pairs,
            **flags)
    return VerifyResult(num_accepted=num, tokens=tokens)
