"""Fused decoder-layer kernels (``@triton.jit`` code only; wrappers in ``flashspec_torch.layers``).

On a GPU a decode step of a small model is a chain of tiny kernels, so the number of launches, not
the bytes, sets its time. These three kernels replace the ~30 elementwise launches of a layer with
three, and round every intermediate to the activation dtype exactly where the plain torch layer
(``flashspec_torch.layers.*_reference``) rounds, so both compute the same function:

* ``add_rms_norm_kernel``: h <- h + d (the residual add), then y = rms_norm(h) * weight.
* ``rope_kv_kernel``: rotate q and k (RoPE, rotate-half convention), write q into its own
  [B, H, T, D] buffer and k, v straight into the KV cache at each token's position.
* ``silu_mul_kernel``: silu(gate) * up from the fused gate_up projection.

All arithmetic is float32 after loading; ``ROUND`` rounds to the storage dtype in between.

``USE_PDL`` (opt-in, Hopper programmatic dependent launch, launched with ``launch_pdl=True``): each
kernel waits for the previous one (``gdc_wait``) before it reads or writes anything, then lets the
next one launch, so a layer's kernels form one PDL chain.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .gemv import rope_rotate, rounded, swiglu
from .invariant_matmul import dot_nt


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):  # before the first read of anything the previous kernel wrote
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def add_rms_norm_kernel(
    h_ptr, d_ptr, w_ptr, y_ptr,  # h, d, y: [R, C] rows; w: [C]
    rows, C, eps,
    HAS_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]  # [BR, 1]
    c = tl.arange(0, BLOCK_C)[None, :]  # [1, BC]
    mask = (r < rows) & (c < C)
    offs = r * C + c
    h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        h = rounded(h + tl.load(d_ptr + offs, mask=mask, other=0.0).to(tl.float32), h_ptr.dtype.element_ty)
        tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
    mean_sq = tl.sum(h * h, axis=1)[:, None] / C
    normed = rounded(h * tl.math.rsqrt(mean_sq + eps), y_ptr.dtype.element_ty)
    w = tl.load(w_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (normed * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def lanes_below(j, D: tl.constexpr, BLOCK_D: tl.constexpr):  # j [BLOCK_D] -> j < D (all true, folded, when D == BLOCK_D)
    if D == BLOCK_D:
        ok = tl.full(j.shape, 1, tl.int1)
    else:
        ok = j < D
    return ok


@triton.jit
def rope_kv_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr,  # qkv [B, T, (H + 2 H_kv) D]; cos, sin [B, T, D]; pos [B, T]
    q_ptr, k_ptr, v_ptr,  # q [B, H, T, D]; k, v caches [B, H_kv, S, D]
    T, S,
    H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    """BLOCK_D: D rounded up to a power of two; the lanes j >= D are masked off."""
    pdl_wait(USE_PDL)
    bt = tl.program_id(0)  # one token
    head = tl.program_id(1)  # one of the H + 2 H_kv head vectors of that token
    b, t = bt // T, bt % T
    j = tl.arange(0, BLOCK_D)
    j_ok = lanes_below(j, D, BLOCK_D)
    row = qkv_ptr + bt * (H + 2 * H_KV) * D + head * D
    x = tl.load(row + j, mask=j_ok, other=0.0).to(tl.float32)
    dtype = q_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + bt)
    if head < H + H_KV:  # q or k: rotate
        half = D // 2
        partner = tl.load(row + (j + half) % D, mask=j_ok, other=0.0).to(tl.float32)
        rot = tl.where(j < half, -partner, partner)
        cos = tl.load(cos_ptr + bt * D + j, mask=j_ok, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + bt * D + j, mask=j_ok, other=0.0).to(tl.float32)
        x = rope_rotate(x, rot, cos, sin, dtype)
        if head < H:
            tl.store(q_ptr + ((b * H + head) * T + t) * D + j, x.to(dtype), mask=j_ok)
        else:
            tl.store(k_ptr + ((b * H_KV + head - H) * S + pos) * D + j, x.to(k_ptr.dtype.element_ty),
                     mask=j_ok & (pos < S))
    else:
        tl.store(v_ptr + ((b * H_KV + head - H - H_KV) * S + pos) * D + j, x.to(v_ptr.dtype.element_ty),
                 mask=j_ok & (pos < S))


@triton.jit
def silu_mul_kernel(
    gu_ptr, y_ptr,  # gu [R, 2I] (gate then up); y [R, I]
    I, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    pdl_wait(USE_PDL)
    r = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = i < I
    gate = tl.load(gu_ptr + r * 2 * I + i, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + r * 2 * I + I + i, mask=mask, other=0.0).to(tl.float32)
    dtype = y_ptr.dtype.element_ty
    tl.store(y_ptr + r * I + i, swiglu(gate, up, dtype).to(dtype), mask=mask)


@triton.jit
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr,  # q [B, H, T, D]; k, v [B, H_kv, S, D]; pos [B, T]; out [B, T, H D]
    T, S, attend, scale, T_PIECE,
    H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr, PRECISION: tl.constexpr, USE_DOT: tl.constexpr = True,
    USE_PDL: tl.constexpr = False,
    part_ptr=None,  # KV_SPLIT: [programs, BLOCK_Q, BLOCK_D + 2] float32: acc, then m and l, per split program
    KV_SPLIT: tl.constexpr = 0,  # > 0: program_id(2) takes slots [KV_SPLIT id, KV_SPLIT (id + 1)) and writes part
):
    """Attention of a few new tokens over the cache: program (row x KV head, piece) holds that head's
    group of query heads times the piece's T_PIECE tokens [piece T_PIECE, (piece + 1) T_PIECE) of T
    (T_PIECE <= BLOCK_Q / group), streams the slots [0, attend) once with an online softmax, and writes
    [B, T, H D] (the o-projection's layout); with KV_SPLIT, one split of the slots, its unnormalized
    state to ``part`` (``attention_merge_kernel`` adds the splits).
    A query at position p sees slots s <= p, so the loop stops after the row's last position.
    BLOCK_D: D rounded up to a power of two (>= 16, for tl.dot); q, k and v load zeros in the lanes
    d >= D, which add nothing to the scores and are not stored. ``USE_DOT`` False: both products by
    ``dot_nt``'s fixed float32 tree instead of tl.dot (the interpreter, batch-invariant mode)."""
    pdl_wait(USE_PDL)
    b = tl.program_id(0) // H_KV
    kv = tl.program_id(0) % H_KV
    GROUP: tl.constexpr = H // H_KV
    r = tl.arange(0, BLOCK_Q)  # query rows: head-in-group major, token minor
    head, t = kv * GROUP + r // T_PIECE, tl.program_id(1) * T_PIECE + r % T_PIECE
    row_ok = (r < GROUP * T_PIECE) & (t < T)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + ((b * H + head[:, None]) * T + t[:, None]) * D + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    pos = tl.load(pos_ptr + b * T + t, mask=row_ok, other=-1)
    m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_Q,), tl.float32)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), tl.float32)
    base = (b * H_KV + kv).to(tl.int64) * S * D  # int64: B * H_kv * S * D passes 2**31 at serving sizes
    hi = tl.minimum(tl.max(pos, axis=0) + 1, attend)  # no query of this program sees a later slot
    lo0 = 0
    if KV_SPLIT > 0:
        lo0 = tl.program_id(2) * KV_SPLIT
        hi = tl.minimum(hi, lo0 + KV_SPLIT)
    for lo in range(lo0, hi, BLOCK_S):
        s = lo + tl.arange(0, BLOCK_S)
        s_ok = s < hi
        kv_ok = s_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + base + s[:, None] * D + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + base + s[:, None] * D + d[None, :], mask=kv_ok, other=0.0)
        zero = tl.zeros((BLOCK_Q, BLOCK_S), tl.float32)
        scores = dot_nt(q, k, zero, BLOCK_Q, BLOCK_S, BLOCK_D, PRECISION, USE_DOT) * scale  # [BQ, BS]
        visible = (s[None, :] <= pos[:, None]) & s_ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        l = l * alpha + tl.sum(p, axis=1)
        pv = dot_nt(p.to(v.dtype), tl.trans(v), tl.zeros((BLOCK_Q, BLOCK_D), tl.float32), BLOCK_Q, BLOCK_D, BLOCK_S,
                    PRECISION, USE_DOT)
        acc = acc * alpha[:, None] + pv
        m = m_new
    if KV_SPLIT > 0:
        at = part_ptr + ((tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2)
                         + tl.program_id(2)) * BLOCK_Q * (BLOCK_D + 2) + r * (BLOCK_D + 2)  # [BQ]
        tl.store(at[:, None] + d[None, :], acc)
        tl.store(at + BLOCK_D, m)
        tl.store(at + BLOCK_D + 1, l)
    else:
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr + ((b * T + t[:, None]) * H + head[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def attention_merge_kernel(
    part_ptr, out_ptr,  # part [B H_kv, pieces, SPLITS, BLOCK_Q, BLOCK_D + 2] float32; out [B, T, H D]
    T, T_PIECE, SPLITS,
    H: tl.constexpr, H_KV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """The splits of ``decode_attention_kernel`` (KV_SPLIT) of program (row x KV head, piece) added in
    split order: out = sum_s acc_s e^(m_s - m) / sum_s l_s e^(m_s - m), m the largest m_s. Splits that saw
    no slot (m_s = -inf) are skipped, not added as zeros, and the first split taken is not added to a
    zero: one split gives acc / l, the bits of the kernel without KV_SPLIT."""
    b, kv = tl.program_id(0) // H_KV, tl.program_id(0) % H_KV
    GROUP: tl.constexpr = H // H_KV
    r = tl.arange(0, BLOCK_Q)
    head, t = kv * GROUP + r // T_PIECE, tl.program_id(1) * T_PIECE + r % T_PIECE
    row_ok = (r < GROUP * T_PIECE) & (t < T)
    d = tl.arange(0, BLOCK_D)
    base = part_ptr + (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * SPLITS * BLOCK_Q * (BLOCK_D + 2) \
        + r * (BLOCK_D + 2)  # [BQ]
    m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
    for sp in range(0, SPLITS):
        m = tl.maximum(m, tl.load(base + sp * BLOCK_Q * (BLOCK_D + 2) + BLOCK_D))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    num = tl.zeros((BLOCK_Q, BLOCK_D), tl.float32)
    den = tl.zeros((BLOCK_Q,), tl.float32)
    started = tl.zeros((BLOCK_Q,), tl.int1)
    for sp in range(0, SPLITS):
        at = base + sp * BLOCK_Q * (BLOCK_D + 2)
        m_s = tl.load(at + BLOCK_D)
        f = tl.exp(m_s - m_safe)
        acc = tl.load(at[:, None] + d[None, :]) * f[:, None]
        l_s = tl.load(at + BLOCK_D + 1) * f
        seen = m_s > float("-inf")
        num = tl.where(seen[:, None], tl.where(started[:, None], num + acc, acc), num)
        den = tl.where(seen, tl.where(started, den + l_s, l_s), den)
        started = started | seen
    out = num / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + ((b * T + t[:, None]) * H + head[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (d < D)[None, :])


@triton.jit
def skinny_linear_kernel(
    x_ptr, w_ptr, y_ptr,  # x [M, K]; w [N, K] (nn.Linear's layout); y [M, N]
    M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """y = x w^T for a few rows (decode: M = batch x new tokens): each program streams BLOCK_N
    rows of w once, the whole reduction in registers (the product is bound by reading w)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
        x = tl.load(x_ptr + m[:, None] * K + k[None, :], mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    tl.store(y_ptr + m[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))
