"""``verify`` for torch tensors: argument checks, impl dispatch, the launcher of the fused Triton kernels
(their bodies in ``flashspec_torch/kernels/verify.py``, imported when first launched so that
TRITON_INTERPRET is read then) and ``verify_reference``, the plain-torch reference they are tested
against: SPEC.md step by step as the NumPy oracle, in torch ops a careful engineer writes without a
custom kernel (log_softmax, gather, Gumbel-max over row n; float32, log space; no ``.item()``).

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

import math

import numpy as np
import torch

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult, check_verify_args, draft_lengths_problem

from .device import interpreting, next_pow2, pdl_possible
from .kernel_config import KernelConfig, choose_config
from . import random as rng
from .reference import Counters, gather, log_probs, scale, sorted_nucleus

IMPLS = ("triton", "reference")
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
    draft_lengths: torch.Tensor | None = None,  # [B] int in [0, G]: row b proposes its first L_b tokens; None: G
    impl: str | None = None,  # "triton" (default on CUDA) or "reference" (default on CPU)
    validate: bool | None = None,  # value checks: None on CPU tensors only, True also on a GPU (a host sync), False never
    config: KernelConfig | None = None,  # impl="triton": the kernels' tiling and variants (None: choose_config)
) -> VerifyResult[torch.Tensor]:
    """Exact speculative verification (SPEC.md); num_accepted [B] int32, tokens [B, G+1] int32. With
    ``draft_lengths``, n_b <= L_b and a row whose L_b tokens are all accepted draws y from p at position L_b
    (L_b = 0: plain decoding's token); ids past L_b are never read."""
    shape, cfg = check_verify_args(
        target_logits, draft_tokens, draft_logits, draft_logprobs, temperature, top_k, top_p, seed, offset,
        draft_lengths,
    )
    check_tensors(target_logits, draft_tokens, draft_logits, draft_logprobs, seed, offset, draft_lengths)
    impl = default_impl(target_logits) if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} must be one of {IMPLS}")
    if validate or (validate is None and target_logits.device.type == "cpu"):
        check_values(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg, draft_lengths)
    if impl == "reference":
        return verify_reference(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg, seed, offset,
                                draft_lengths)
    return verify_triton(target_logits, draft_tokens, draft_logits, draft_logprobs, cfg, seed, offset, config,
                         draft_lengths)


def default_impl(target_logits: torch.Tensor) -> str:
    return "triton" if target_logits.is_cuda else "reference"


# ----------------------------------------------------------------------------- checks


def check_tensors(z, x, w, lq, seed, offset, lengths=None) -> None:
    """Every array argument is a torch tensor on target_logits' device."""
    named = {"target_logits": z, "draft_tokens": x, "draft_logits": w, "draft_logprobs": lq, "draft_lengths": lengths}
    check_on_device(named, seed, offset, "flashspec_torch.verify", "flashspec.reference.verify")


def check_on_device(named: dict, seed, offset, api: str, numpy_api: str) -> None:
    """Every array in ``named`` (None: absent) and seed / offset unless a Python int is a torch tensor on
    target_logits' device; ``api`` / ``numpy_api`` name the function and its NumPy twin in the message."""
    z = named["target_logits"]
    named = dict(named, **{k: v for k, v in (("seed", seed), ("offset", offset)) if not isinstance(v, int)})
    for name, a in named.items():
        if a is None:
            continue
        if not isinstance(a, torch.Tensor):
            raise ValueError(f"{name} is a {type(a).__name__}; {api} takes torch tensors ({numpy_api} takes NumPy "
                             "arrays)")
        if a.device != z.device:
            raise ValueError(f"{name} is on {a.device} but target_logits is on {z.device}: pass tensors on one device "
                             "(seed / offset: a Python int or a tensor on that device)")


def check_values(z, x, w, lq, cfg: SamplingConfig, lengths: torch.Tensor | None = None) -> None:
    """The oracle's value checks (they read the data: a host sync on a GPU); positions past L_b are not checked."""
    v = z.shape[-1]
    check_logits("target_logits", z)
    if w is not None:
        check_logits("draft_logits", w)
    proposed = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if lengths is not None:
        problem = draft_lengths_problem(lengths.cpu().numpy(), x.shape[1])
        if problem:
            raise ValueError(problem)
        proposed = torch.arange(x.shape[1], device=x.device)[None] < lengths[:, None]
    bad = ((x < 0) | (x >= v)) & proposed
    if bool(bad.any()):
        b, i = (int(k) for k in bad.nonzero()[0])
        raise ValueError(f"draft_tokens[{b}, {i}] = {int(x[b, i])} is out of range [0, {v}); "
                         "padding ids such as -1 are not tokens: verify only rows with real drafts")
    if lq is not None:
        lqf = lq.float()
        if not bool((torch.isfinite(lqf) & (lqf <= 1e-3) | ~proposed).all()):
            raise ValueError("draft_logprobs must be finite log-probabilities (<= 0)")
    if w is not None and lq is None and not cfg.greedy:
        lq_x = gather(log_probs(w.float(), cfg), torch.where(proposed, x.long(), 0))
        if bool((torch.isneginf(lq_x) & proposed).any()):
            b, i = (int(k) for k in (torch.isneginf(lq_x) & proposed).nonzero()[0])
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
    kept = (keep_sorted & (s.gather(-1, order) > float("-inf"))).sum(-1, keepdim=True)  # >= 1 unless no finite logit
    last = order.gather(-1, (kept - 1).clamp(min=0))  # [B, R, 1]: the last kept id (a faulty row: any, discarded)
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
    draft_lengths: torch.Tensor | None = None,  # [B] int in [0, G]; None: G
) -> VerifyResult[torch.Tensor]:
    """Launch the fused kernels (flashspec_torch/kernels/verify.py): one launch if V fits one chunk of
    ``config.num_chunks``' split, else the stats launch and the final launch."""
    z, x, w, lq = target_logits, draft_tokens, draft_logits, draft_logprobs
    kernels = load_kernels(z.device)
    b, g1, v = z.shape
    config = choose_config(b, g1 - 1, v, z.device, z.element_size()) if config is None else config
    greedy = cfg.greedy
    has_w, has_lq = w is not None and not greedy, lq is not None and not greedy
    filtered = cfg.filtered and not greedy
    thr_p, tid_p = filter_thresholds(z, cfg) if filtered else (z, z)
    thr_q, tid_q = filter_thresholds(w, cfg) if filtered and has_w else (z, z)
    w_arg, lq_arg = (w if has_w else z), (lq if has_lq else z)
    chunk, chunks = split_vocab(v, config.num_chunks, config.block_v)
    fused = chunks == 1
    sweep_chunk, sweeps = chunk, chunks  # the split of row n's sweep (its own, if asked; not the fused launch)
    if config.sweep_chunks and not fused:
        sweep_chunk, sweeps = split_vocab(v, config.sweep_chunks, config.sweep_v)
    slots = config.sweep_slots if config.prune and not greedy and config.sweep_slots else 1
    pairs = config.bf16_pairs and slots > 1 and bf16_pairs(z) and (not has_w or bf16_pairs(w))
    pdl = config.pdl and not fused and pdl_possible(z.device)  # else a plain launch
    t32 = np.float32(cfg.temperature or 1.0)
    temps = (float(t32), float(np.float32(1.0) / t32))  # T and RN(1/T) (exact float32 values)
    strides = (z.stride(0), z.stride(1), z.stride(2), w_arg.stride(0), w_arg.stride(1), w_arg.stride(2))
    common = dict(G=g1 - 1, ROWS=next_pow2(g1), BLOCK_B=config.block_b, BLOCK_V=config.block_v, FILTER=filtered,
                  GREEDY=greedy, VEC=max(1, 16 // z.element_size()), FAST=not interpreting(), PDL=pdl)
    bufs = workspace(b, g1, chunks, sweeps, config.block_b, fused, greedy, z.device)
    tiles = math.ceil(b / config.block_b)
    if not fused:
        kernels.verify_stats_kernel[(tiles, chunks)](
            z, w_arg, thr_p, tid_p, thr_q, tid_q, *bufs[:4], b, v, chunk, chunks, *temps, *strides,
            HAS_W_STATS=has_w and not has_lq, num_warps=config.num_warps, **common)
    s_ptr, s_lo, s_stride = counter_args(seed, b)
    o_ptr, o_lo, o_stride = counter_args(offset, b)
    seed_hi = (seed >> 32) & 0xFFFFFFFF if isinstance(seed, int) else 0
    seed_hi = seed_hi - 2**32 if seed_hi >= 2**31 else seed_hi
    counters = (z if s_ptr is None else s_ptr, z if o_ptr is None else o_ptr, s_lo, seed_hi, o_lo, s_stride, o_stride)
    lq_strides = (lq_arg.stride(0), lq_arg.stride(1)) if has_lq else (0, 0)
    kernels.verify_final_kernel[(tiles, 1 if greedy else sweeps)](
        z, w_arg, x, lq_arg, thr_p, tid_p, thr_q, tid_q, *counters, *bufs, z if draft_lengths is None else draft_lengths,
        b, v, chunk, chunks, sweep_chunk, sweeps, *temps, *strides, x.stride(0), x.stride(1), *lq_strides,
        NC=next_pow2(chunks), NSC=next_pow2(sweeps), SWEEP_V=config.sweep_v, HAS_W=has_w, HAS_LQ=has_lq,
        FUSED=fused, SEED_TENSOR=s_ptr is not None, OFFSET_TENSOR=o_ptr is not None,
        PER_ROW_SEED=isinstance(seed, torch.Tensor) and seed.ndim == 1, PRUNE=config.prune, SLOTS=slots, PAIRS=pairs,
        HAS_LENGTHS=draft_lengths is not None,
        num_warps=config.sweep_warps or config.num_warps, **common, **(dict(launch_pdl=True) if pdl else {}))
    return VerifyResult(num_accepted=bufs[-1], tokens=bufs[-2])


def workspace(b: int, g1: int, chunks: int, sweeps: int, block_b: int, fused: bool, greedy: bool, dev: torch.device):
    """The kernels' buffers: (m, l, a, counter, ck, ci, cf, tokens, num). m, l [B, C, 2, ROWS] f32 and a
    [B, C, ROWS] i32 (T = 0 only) hold launch 1's partials, ck / ci [B, SC, 2] and cf [B, SC] the sweep's candidates, counter
    [tiles] the finished final programs of each batch tile; the fused launch uses none of them (num in their place)."""
    f32, i32 = dict(dtype=torch.float32, device=dev), dict(dtype=torch.int32, device=dev)
    tokens, num = torch.empty((b, g1), **i32), torch.empty((b,), **i32)
    if fused:
        return (num,) * 7 + (tokens, num)
    rows = next_pow2(g1)
    return (torch.empty((b, chunks, 2, rows), **f32), torch.empty((b, chunks, 2, rows), **f32),
            torch.empty((b, chunks, rows), **i32) if greedy else num, torch.empty((math.ceil(b / block_b),), **i32),
            torch.empty((b, sweeps, 2), **f32), torch.empty((b, sweeps, 2), **i32), torch.empty((b, sweeps), **i32),
            tokens, num)


def verify_reference(
    target_logits: torch.Tensor,  # [B, G+1, V]
    draft_tokens: torch.Tensor,  # [B, G]
    draft_logits: torch.Tensor | None,  # [B, G, V]
    draft_logprobs: torch.Tensor | None,  # [B, G]
    cfg: SamplingConfig,
    seed,
    offset,
    draft_lengths: torch.Tensor | None = None,  # [B] int in [0, G]; None: G
) -> VerifyResult[torch.Tensor]:
    """SPEC.md in plain torch ops, step by step as the NumPy oracle (float32, log space). A position past
    L_b, or an id outside [0, V), counts as rejected, and y is drawn from p there."""
    z = target_logits.float()
    b, g1, v = z.shape
    x_ok = (draft_tokens >= 0) & (draft_tokens < v)  # [B, G]
    if draft_lengths is not None:
        x_ok &= torch.arange(g1 - 1, device=z.device)[None] < draft_lengths.to(z.device)[:, None]
    x = torch.where(x_ok, draft_tokens.long(), 0)
    if cfg.greedy:
        return verify_greedy(z, x, x_ok)
    c = Counters.make(seed, offset, b, z.device)
    log_p = log_probs(z, cfg)  # [B, G+1, V]
    log_q = None  # [B, G, V]: every draft row's log q, only where log q(x) is not given (else row n's alone)
    if draft_logprobs is not None:
        log_q_x = draft_logprobs.float()
    elif draft_logits is not None:
        log_q = log_probs(draft_logits.float(), cfg)
        log_q_x = gather(log_q, x)
    else:
        log_q_x = torch.zeros(x.shape, dtype=torch.float32, device=z.device)  # one-hot q: log q(x) = 0
    positions = torch.arange(g1 - 1, device=z.device)[None]
    log_u = torch.log(c.uniform(positions, 0, rng.ACCEPT))  # [B, G]
    accepted = x_ok & (log_u < gather(log_p[:, :-1], x) - log_q_x)
    n = first_rejection(accepted)
    y = sample_final(log_p, log_q, draft_logits, cfg, x, x_ok, n, c)
    return emit(x, n, y)


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:  # [B, G] bool -> [B] int64
    g = accepted.shape[-1]
    return torch.where(accepted.all(-1), g, (~accepted).to(torch.int32).argmax(-1))


def sample_final(log_p, log_q, draft_logits, cfg: SamplingConfig, x, x_ok, n, c: Counters) -> torch.Tensor:  # -> y [B]
    """y ~ normalise(max(0, p_n - q_n)) if n < G, else y ~ p_G; Gumbel-max over row n only. q_n is
    exp(log_q) at row n, or (log_q None) log_probs of draft_logits' row n alone; one-hot at x without either."""
    b, g1, v = log_p.shape
    rows = torch.arange(b, device=log_p.device)
    lp_n = log_p[rows, n]  # [B, V]
    g = -torch.log(-torch.log(c.uniform(n[:, None], torch.arange(v, device=n.device)[None], rng.FINAL)))  # [B, V]
    i = n.clamp(max=g1 - 2)  # the draft row n (clamped for the bonus rows, unused there)
    if draft_logits is None:
        q_n = (torch.arange(v, device=log_p.device)[None] == x[rows, i][:, None]).float()
    else:
        q_n = torch.exp(log_q[rows, i] if log_q is not None else log_probs(draft_logits[rows, i].float(), cfg))
    r = torch.clamp_min(torch.exp(lp_n) - q_n, 0.0)
    log_r = torch.log(r)
    use_p = (n == g1 - 1) | ~(r > 0).any(-1) | ~x_ok[rows, i]  # bonus; empty residual; masked id
    key = torch.where(use_p[:, None], lp_n, log_r) + g
    return key.argmax(-1)


def emit(x, n, y) -> VerifyResult[torch.Tensor]:  # x [B, G], n [B], y [B]
    b, g = x.shape
    pos = torch.arange(g + 1, device=x.device)[None]
    padded = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)
    tokens = torch.where(pos < n[:, None], padded, -1).scatter(1, n[:, None], y[:, None].to(padded.dtype))
    return VerifyResult(num_accepted=n.to(torch.int32), tokens=tokens.to(torch.int32))


def verify_greedy(z, x, x_ok) -> VerifyResult[torch.Tensor]:  # z [B, G+1, V], x [B, G]
    """T = 0: accept x_i iff x_i = argmax z_i; y = argmax z_n (torch.argmax: lowest index on ties)."""
    best = z.argmax(-1)  # [B, G+1]
    n = first_rejection(x_ok & (x == best[:, :-1]))
    return emit(x, n, best.gather(1, n[:, None])[:, 0])
