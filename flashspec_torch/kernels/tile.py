"""The "tile" loops of the verify kernels (``KernelConfig(stream="tile", sweep="tile")``, the first
kernels; the default loops are ``lanes.py`` and ``slots.py``) and the per-logit helpers every kernel
shares (``@triton.jit`` code only; the kernels are in ``verify.py``).

A program streams [BLOCK_B, ROWS, BLOCK_V] tiles of raw logits and reduces them every tile: an online
(max, sum-exp) per row for the normalisers, a running argmax for T = 0, and the row-n sweep's running
Gumbel-max of both draws (key_r = log max(0, p - q) + g, key_p = lp + g). z / T is a ``div_rn`` per logit
(``load_scaled``); docs/kernel_notes.md has their instruction counts.
"""

import triton
import triton.language as tl

from .random import gumbel_from_bits, mix

NEG_INF = tl.constexpr(float("-inf"))
BIG_INDEX = tl.constexpr(2147483647)  # above any vocabulary index: "no candidate" in argmin reductions


@triton.jit
def load_scaled(ptrs, mask, T, SCALE: tl.constexpr):  # -> float32 z / T, -inf where masked
    z = tl.load(ptrs, mask=mask, other=NEG_INF).to(tl.float32)
    if SCALE:
        if T != 1.0:  # a uniform branch: z / 1 is z, and the correctly rounded division is not cheap
            z = tl.math.div_rn(z, T)
    return z


@triton.jit
def apply_filter(s, j, thr, thr_id):  # s: scaled logits, j: their ids; thr, thr_id broadcast
    """top-k / top-p as one cut: keep s > thr, and s == thr for ids up to thr_id."""
    keep = (s > thr) | ((s == thr) & (j <= thr_id))
    return tl.where(keep, s, NEG_INF)


@triton.jit
def safe_log(x):  # log(x) for x > 0, -inf for x == 0 (no log(0) is evaluated)
    return tl.where(x > 0, tl.log(tl.where(x > 0, x, 1.0)), NEG_INF)


@triton.jit
def row_stats(rows, row_mask, v_lo, v_hi, sv, T, thr, thr_id,  # rows: [BB, R, 1] pointers
              BLOCK_B: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr, FILTER: tl.constexpr):
    """Online (max, sum exp(s - max)) of s = filter(z / T) over [v_lo, v_hi) of each row: [BB, R]."""
    m = tl.full((BLOCK_B, ROWS), NEG_INF, tl.float32)
    l = tl.zeros((BLOCK_B, ROWS), tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        j = v0 + tl.arange(0, BLOCK_V)[None, None, :]
        s = load_scaled(rows + j.to(tl.int64) * sv, row_mask & (j < v_hi), T, True)
        if FILTER:
            s = apply_filter(s, j, thr[:, :, None], thr_id[:, :, None])
        m_new = tl.maximum(m, tl.max(s, axis=2))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[:, :, None]), axis=2)
        m = m_new
    return m, l


@triton.jit
def row_argmax(rows, row_mask, v_lo, v_hi, sv,  # rows: [BB, R, 1] pointers
               BLOCK_B: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """(max z, lowest index of the max) over [v_lo, v_hi) of each row, raw logits: [BB, R]."""
    best = tl.full((BLOCK_B, ROWS), NEG_INF, tl.float32)
    arg = tl.zeros((BLOCK_B, ROWS), tl.int32) + v_lo
    for v0 in range(v_lo, v_hi, BLOCK_V):
        j = v0 + tl.arange(0, BLOCK_V)[None, None, :]
        z = load_scaled(rows + j.to(tl.int64) * sv, row_mask & (j < v_hi), 1.0, False)
        z_max = tl.max(z, axis=2)
        z_arg = tl.min(tl.where(z == z_max[:, :, None], j, BIG_INDEX), axis=2)
        better = z_max > best  # strict: an earlier block keeps its (lower) index on ties
        best = tl.where(better, z_max, best)
        arg = tl.where(better, z_arg, arg)
    return best, arg


@triton.jit
def update_best(best, idx, keys, j):  # best, idx: [BB]; keys: [BB, S]; j: [1, S]
    """Running Gumbel-max: (max key, lowest index attaining it)."""
    k_max = tl.max(keys, axis=1)
    k_arg = tl.min(tl.where(keys == k_max[:, None], j, BIG_INDEX), axis=1)
    better = k_max > best
    return tl.where(better, k_max, best), tl.where(better, k_arg, idx)


@triton.jit
def sweep_row(z_row, w_row, sv_z, sv_w, v_lo, v_hi, T, lse_p, lse_q, x_n, thr_p, tid_p, thr_q, tid_q, k_final,
              b_mask, BLOCK_B: tl.constexpr, SWEEP_V: tl.constexpr, HAS_W: tl.constexpr, FILTER: tl.constexpr):
    """Gumbel-max over [v_lo, v_hi) of row n (z_row, w_row: [BB] pointers; the rest [BB]).

    key_r = log max(0, exp(lp) - q) + g (residual), key_p = lp + g (bonus and fallback), with
    g = Gumbel(FINAL stream, position n, vocab j). Returns both running argmaxes and whether the
    residual had any mass in the range.
    """
    best_r = tl.full((BLOCK_B,), NEG_INF, tl.float32)
    best_p = tl.full((BLOCK_B,), NEG_INF, tl.float32)
    idx_r = tl.zeros((BLOCK_B,), tl.int32) + v_lo
    idx_p = tl.zeros((BLOCK_B,), tl.int32) + v_lo
    mass = tl.zeros((BLOCK_B,), tl.int32)
    for v0 in range(v_lo, v_hi, SWEEP_V):
        j = v0 + tl.arange(0, SWEEP_V)[None, :]
        mask = b_mask[:, None] & (j < v_hi)
        s = load_scaled(z_row[:, None] + j.to(tl.int64) * sv_z, mask, T, True)
        if FILTER:
            s = apply_filter(s, j, thr_p[:, None], tid_p[:, None])
        lp = s - lse_p[:, None]
        g = gumbel_from_bits(mix(k_final[:, None] ^ j.to(tl.uint32)))
        if HAS_W:
            t = load_scaled(w_row[:, None] + j.to(tl.int64) * sv_w, mask, T, True)
            if FILTER:
                t = apply_filter(t, j, thr_q[:, None], tid_q[:, None])
            q = tl.exp(t - lse_q[:, None])
        else:
            q = tl.where(j == x_n[:, None], 1.0, 0.0)  # one-hot draft
        r = tl.maximum(tl.exp(lp) - q, 0.0)
        mass = mass | tl.max((r > 0).to(tl.int32), axis=1)
        best_r, idx_r = update_best(best_r, idx_r, safe_log(r) + g, j)
        best_p, idx_p = update_best(best_p, idx_p, lp + g, j)
    return best_r, idx_r, best_p, idx_p, mass
