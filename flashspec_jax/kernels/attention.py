"""Decode attention over the static KV cache in Pallas (Triton lowering), with its jnp reference.

The model's einsum attention (``attention_reference``) reads every slot of the static cache and
masks; this kernel reads only the blocks of slots a row can see. Program (b, kh) of the grid
``(B, H_kv)`` (with one split of the slots, below) takes the query rows of KV head kh (the T
positions times the G = H / H_kv query heads of its GQA group, padded to a power of two of at
least 16 rows for the Triton dot), and streams the cache's slots ``[block_s]`` at a time from the
first block any row sees to the last, with an online softmax in float32. Row r sees slots
``lo[r] <= s <= hi[r]`` (``hi``: its position; ``lo``: 0, or position - window + 1 for a sliding
window). The cache is the model's whole ``[L, B, H_kv, S, D]`` stack and the layer a traced
scalar, so neither loop over layers copies a layer's cache out first.

Both kernels (``decode_attention``, and ``fused_attention``: RoPE, the cache write and the
attention in one) can split the slots: grid ``(B, H_kv, P)``, program p streaming the p-th share
of the blocks and writing its partial softmax sums, which ``combine_splits`` merges. One program
per (row, KV head) is only B H_kv programs (8 for Llama-3-8B at batch 1, 3 for SmolLM2), each
streaming the whole context alone; ``choose_splits`` gives long caches more programs and keeps
P = 1 (no partial sums, no combine) below 2 ``SPLIT_MIN_SLOTS`` slots.

Used for the few rows of decoding and scoring (``MAX_ROWS``); the prefill's long prompts keep the
einsum (``flashspec_jax.model.attention``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

BLOCK_S = 64  # cache slots per step of a program's loop (the kernels' default block_s)
MAX_ROWS = 128  # T * G query rows per program at most (registers); more: the einsum
MIN_ROWS = 16  # the Triton dot's smallest M
SPLIT_MIN_SLOTS = 64  # cache slots per split at least (choose_splits; docs/jax.md: 64 against 512)
PROGRAMS = 132  # programs wanted when splitting (an H100's SMs; choose_splits)


def supported(t: int, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the kernel takes T positions of this attention shape (else the einsum runs)."""
    pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return pow2 and t * (heads // kv_heads) <= MAX_ROWS


def scores(s: jax.Array, d: int, scale: float, softcap: float) -> jax.Array:  # f32, any shape
    """Raw q.k products -> the attention scores (times ``scale``, 0: 1 / sqrt(D); then the softcap)."""
    s = s * np.float32(scale) if scale else s / np.float32(math.sqrt(d))
    if softcap:
        s = jnp.tanh(s / np.float32(softcap)) * np.float32(softcap)
    return s


def online_update(carry, s: jax.Array, v: jax.Array):  # (m [R], l [R], acc [R, D]), s [R, N] f32 (-inf: unseen), v [N, D]
    """One block of the online softmax: rescale the running sums to the new row maxima, add the block."""
    m, l, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    base = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a row that has seen nothing yet
    alpha = jnp.exp(m - base)
    p = jnp.exp(s - base[:, None])
    return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + jnp.dot(
        p.astype(v.dtype), v, preferred_element_type=jnp.float32)


def attention_kernel(q_ref, k_ref, v_ref, layer_ref, lo_ref, hi_ref, *out_refs, block_s: int, splits: int, scale: float,
                     softcap: float):
    """q [B, H_kv, R, D]; k, v [L, B, H_kv, S, D]; layer [1] int32; lo, hi [B, R] int32; ``out_refs`` as
    ``store_split``'s. Program (b, kh, p) streams split p's blocks."""
    b, kh, part = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    num_rows, d = q_ref.shape[2], q_ref.shape[3]
    slots = k_ref.shape[3]
    layer = layer_ref[0]
    rows, dims = jnp.arange(num_rows, dtype=jnp.int32), jnp.arange(d, dtype=jnp.int32)
    q = plt.load(q_ref.at[b, kh, rows[:, None], dims[None, :]])  # [R, D]
    lo, hi = plt.load(lo_ref.at[b, rows]), plt.load(hi_ref.at[b, rows])  # [R]

    def body(j, carry):
        cols, k, v = load_block(k_ref, v_ref, layer, b, kh, j, block_s)
        s = scores(jnp.dot(q, k.T, preferred_element_type=jnp.float32), d, scale, softcap)  # [R, BS]
        seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
        return online_update(carry, jnp.where(seen, s, -jnp.inf), v)

    init = (jnp.full((num_rows,), -jnp.inf, jnp.float32), jnp.zeros((num_rows,), jnp.float32),
            jnp.zeros((num_rows, d), jnp.float32))
    first, last = split_blocks(lo, hi, slots, block_s, part, splits)
    store_split(out_refs, b, kh, part, lax.fori_loop(first, last, body, init), splits)


def load_block(k_ref, v_ref, layer, b, kh, j, block_s: int):  # -> (cols [BS], k [BS, D], v [BS, D])
    """Block j of ``block_s`` cache slots of (layer, batch row b, KV head kh); slots past the cache read 0."""
    cols = j * block_s + jnp.arange(block_s, dtype=jnp.int32)
    dims = jnp.arange(k_ref.shape[4], dtype=jnp.int32)
    at = (layer, b, kh, cols[:, None], dims[None, :])
    live = cols[:, None] < k_ref.shape[3]
    return cols, plt.load(k_ref.at[at], mask=live, other=0), plt.load(v_ref.at[at], mask=live, other=0)


def split_blocks(lo, hi, slots: int, block_s: int, part, splits: int):  # lo, hi [R] -> (first, last) block indices
    """The blocks [first, last) of split ``part`` (of ``splits`` equal runs of blocks) that rows seeing
    slots lo..hi need (none: first >= last)."""
    span = pl.cdiv(pl.cdiv(slots, block_s), splits)
    first = jnp.maximum(jnp.min(lo) // block_s, part * span)
    last = jnp.minimum(jnp.minimum(jnp.max(hi), slots - 1) // block_s + 1, (part + 1) * span)
    return first, last


def store_split(refs, b, kh, part, carry, splits: int) -> list:
    """A program's softmax sums (m [R], l [R], acc [R, D] float32) into the first refs: one split (one
    ref), the normalized output o [B, H_kv, R, D] (rows that saw nothing: 0); more (three), the
    partial sums acc [B, H_kv, P, R, D], m and l [B, H_kv, P, R] for ``combine_splits``. Returns the
    refs after them."""
    m, l, acc = carry
    r = jnp.arange(acc.shape[0], dtype=jnp.int32)
    dims = jnp.arange(acc.shape[1], dtype=jnp.int32)
    if splits == 1:
        out = acc / jnp.where(l == 0, 1.0, l)[:, None]
        plt.store(refs[0].at[b, kh, r[:, None], dims[None, :]], out.astype(refs[0].dtype))
        return list(refs[1:])
    plt.store(refs[0].at[b, kh, part, r[:, None], dims[None, :]], acc)
    plt.store(refs[1].at[b, kh, part, r], m)
    plt.store(refs[2].at[b, kh, part, r], l)
    return list(refs[3:])


def split_shapes(b: int, kv_heads: int, rows: int, d: int, dtype, splits: int) -> list[jax.ShapeDtypeStruct]:
    """``store_split``'s outputs for ``splits``."""
    if splits == 1:
        return [jax.ShapeDtypeStruct((b, kv_heads, rows, d), dtype)]
    return [jax.ShapeDtypeStruct((b, kv_heads, splits, rows, d), jnp.float32),
            *[jax.ShapeDtypeStruct((b, kv_heads, splits, rows), jnp.float32)] * 2]


def merged(outs: list, dtype) -> jax.Array:  # store_split's outputs -> [B, H_kv, R, D]
    return outs[0] if len(outs) == 1 else combine_splits(*outs).astype(dtype)


def bounds(positions: jax.Array, window) -> tuple[jax.Array, jax.Array]:  # [B, T] -> ([B, T], [B, T]) int32
    """The first and last slot each position sees (``window`` 0: from slot 0; may be traced)."""
    hi = positions.astype(jnp.int32)
    lo = jnp.where(window > 0, hi - window + 1, 0)
    return jnp.maximum(lo, 0), hi


def decode_attention(
    q: jax.Array,  # [B, T, H, D]
    k: jax.Array,  # [L, B, H_kv, S, D]
    v: jax.Array,  # [L, B, H_kv, S, D]
    layer,  # int or int32 scalar: the layer of the cache to read
    positions: jax.Array,  # [B, T] int: each query's position (it sees slots <= its position)
    window=0,  # int or int32 scalar: 0 full attention, else a sliding window of this many slots
    *,
    scale: float = 0.0,
    softcap: float = 0.0,
    block_s: int = 0,
    splits: int = 0,
    num_warps: int = 4,
    interpret: bool = False,
) -> jax.Array:  # [B, T, H, D]
    """``attention_reference`` over layer ``layer`` of the cache, reading only the visible blocks
    (``splits`` of the slots, each its own program; 0: ``choose_splits``)."""
    b, t, h, d = q.shape
    h_kv, slots = k.shape[2], k.shape[3]
    if not supported(t, h, h_kv, d):
        raise ValueError(f"decode_attention: T={t} positions x {h // h_kv} heads per KV head, head_dim={d}: needs "
                         f"head_dim a power of two >= 16 and at most {MAX_ROWS} rows; use attention_reference")
    g = h // h_kv
    rows = max(MIN_ROWS, 1 << (t * g - 1).bit_length())
    qr = q.reshape(b, t, h_kv, g, d).transpose(0, 2, 1, 3, 4).reshape(b, h_kv, t * g, d)
    qr = jnp.pad(qr, ((0, 0), (0, 0), (0, rows - t * g), (0, 0)))  # [B, H_kv, R, D]
    lo, hi = bounds(positions, window)
    pad = ((0, 0), (0, rows - t * g))
    lo = jnp.pad(jnp.repeat(lo, g, axis=1), pad, constant_values=slots)  # [B, R]: padding rows see nothing
    hi = jnp.pad(jnp.repeat(hi, g, axis=1), pad, constant_values=-1)
    block_s = block_s or BLOCK_S
    splits = splits or choose_splits(b, h_kv, slots, block_s)
    kernel = functools.partial(attention_kernel, block_s=block_s, splits=splits, scale=scale, softcap=softcap)
    outs = pl.pallas_call(
        kernel,
        out_shape=split_shapes(b, h_kv, rows, d, q.dtype, splits),
        grid=(b, h_kv, splits),
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="flashspec_decode_attention",
    )(qr, k, v, jnp.asarray(layer, jnp.int32).reshape(1), lo, hi)
    out = merged(outs, q.dtype)[:, :, : t * g].reshape(b, h_kv, t, g, d).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, t, h, d)


def attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float = 0.0,
                        softcap: float = 0.0) -> jax.Array:
    """q [B, T, H, D]; k, v [B, H_kv, S, D]; mask [B, T, S] -> [B, T, H, D] (GQA, float32 softmax over
    every slot of the cache, the masked ones at -inf)."""
    b, t, h, d = q.shape
    h_kv = k.shape[1]
    q = q.reshape(b, t, h_kv, h // h_kv, d)
    s = scores(jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32), d, scale, softcap)
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", p, v, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, d).astype(q.dtype)


def fused_kernel(qkv_ref, cos_ref, sin_ref, pos_ref, k_ref, v_ref, layer_ref, window_ref, *refs, heads: int, rows: int,
                 new: int, block_s: int, splits: int, scale: float, softcap: float):
    """qkv [B, T, (H + 2 H_kv) D]; cos, sin [B, T, D]; pos [B, T] int32; k, v [L, B, H_kv, S, D] (aliased to
    ko, vo); layer, window [1] int32. R = ``rows`` query rows (t, j) -> t * G + j, ``new`` >= T the padded
    count of new keys. Program (b, kh, p) streams split p's blocks of slots; split ``splits`` - 1 also
    attends the new keys, split 0 writes them. ``refs``: ``store_split``'s outputs, then ko, vo."""
    b, kh, part = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    t_len, d = qkv_ref.shape[1], cos_ref.shape[2]
    kv_heads, slots = k_ref.shape[2], k_ref.shape[3]
    g = heads // kv_heads
    layer, window = layer_ref[0], window_ref[0]
    dims = jnp.arange(d, dtype=jnp.int32)
    roped = functools.partial(load_roped, qkv_ref, cos_ref, sin_ref, b)

    r = jnp.arange(rows, dtype=jnp.int32)
    live_r = r < t_len * g
    t_r = jnp.minimum(r // g, t_len - 1)
    q = roped(t_r, (kh * g + r % g) * d).astype(k_ref.dtype)  # [R, D] (rounded as the model rounds q)
    pos_r = plt.load(pos_ref.at[b, t_r])
    hi = jnp.where(live_r, pos_r, -1)
    lo = jnp.where(live_r, jnp.where(window > 0, jnp.maximum(pos_r - window + 1, 0), 0), slots)
    n = jnp.arange(new, dtype=jnp.int32)
    t_n = jnp.minimum(n, t_len - 1)
    pos_n = jnp.where(n < t_len, plt.load(pos_ref.at[b, t_n]), -1)  # [N]: -1 for padding

    def body(j, carry):  # cache slots, the new positions' slots left out (their keys come from qkv)
        cols = j * block_s + jnp.arange(block_s, dtype=jnp.int32)
        at = (layer, b, kh, cols[:, None], dims[None, :])
        k = plt.load(k_ref.at[at], mask=cols[:, None] < slots, other=0)
        v = plt.load(v_ref.at[at], mask=cols[:, None] < slots, other=0)
        s = scores(jnp.dot(q, k.T, preferred_element_type=jnp.float32), d, scale, softcap)
        fresh = jnp.max(jnp.where(cols[:, None] == pos_n[None, :], 1, 0), axis=1) > 0  # [BS]
        seen = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]) & ~fresh[None, :]
        return online_update(carry, jnp.where(seen, s, -jnp.inf), v)

    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32), jnp.zeros((rows, d), jnp.float32))
    first, last = split_blocks(lo, hi, slots, block_s, part, splits)
    carry = lax.fori_loop(first, last, body, init)
    k_new = roped(t_n, jnp.full((new,), (heads + kh) * d, jnp.int32)).astype(k_ref.dtype)  # [N, D]
    v_new = plt.load(qkv_ref.at[b, t_n[:, None], (heads + kv_heads + kh) * d + dims[None, :]])
    s = scores(jnp.dot(q, k_new.T, preferred_element_type=jnp.float32), d, scale, softcap)  # [R, N]
    seen = (pos_n[None, :] >= lo[:, None]) & (pos_n[None, :] <= hi[:, None]) & (pos_n[None, :] < slots)
    carry = online_update(carry, jnp.where(seen & (part == splits - 1), s, -jnp.inf), v_new.astype(k_ref.dtype))
    ko_ref, vo_ref = store_split(refs, b, kh, part, carry, splits)
    write_new(qkv_ref, pos_ref, ko_ref, vo_ref, roped, b, kh, layer, heads, part == 0)


def combine_splits(acc: jax.Array, m: jax.Array, l: jax.Array) -> jax.Array:  # [..., P, R, D], [..., P, R] x2 -> [..., R, D]
    """The splits' partial softmax sums (each over its own slots, relative to its own max ``m``) -> the
    normalized output (rows that saw nothing: 0)."""
    top = jnp.max(m, axis=-2, keepdims=True)
    w = jnp.where(m == -jnp.inf, 0.0, jnp.exp(m - jnp.where(top == -jnp.inf, 0.0, top)))  # [..., P, R]
    den = jnp.sum(w * l, axis=-2)
    return jnp.sum(w[..., None] * acc, axis=-3) / jnp.where(den == 0, 1.0, den)[..., None]


def choose_splits(batch: int, kv_heads: int, slots: int, block_s: int, min_slots: int = 0) -> int:
    """Splits of the cache's slots for ``fused_attention``: one program per (row, KV head) streams the
    whole context, so when those are few, each split of at least ``min_slots`` slots (0:
    SPLIT_MIN_SLOTS) gets its own program, up to about PROGRAMS programs (one per SM of an H100). 1
    below."""
    blocks = -(-slots // block_s)
    return max(1, min(slots // (min_slots or SPLIT_MIN_SLOTS), -(-PROGRAMS // (batch * kv_heads)), blocks))


def load_roped(qkv_ref, cos_ref, sin_ref, b, t, col0):  # t [N] indices into T, col0 [N] first columns -> [N, D] f32
    """Rows of qkv [B, T, W] at (b, t, col0 + [0, D)) with RoPE (rotate-half: x cos + [-x2, x1] sin)."""
    d = cos_ref.shape[2]
    dims = jnp.arange(d, dtype=jnp.int32)
    half = dims < d // 2
    turn = jnp.where(half, dims + d // 2, dims - d // 2)
    x = plt.load(qkv_ref.at[b, t[:, None], col0[:, None] + dims[None, :]]).astype(jnp.float32)
    xr = plt.load(qkv_ref.at[b, t[:, None], col0[:, None] + turn[None, :]]).astype(jnp.float32)
    xr = jnp.where(half[None, :], -xr, xr)
    c = plt.load(cos_ref.at[b, t[:, None], dims[None, :]]).astype(jnp.float32)
    s = plt.load(sin_ref.at[b, t[:, None], dims[None, :]]).astype(jnp.float32)
    return x * c + xr * s


def write_new(qkv_ref, pos_ref, ko_ref, vo_ref, roped, b, kh, layer, heads: int, active):
    """The T new keys (with RoPE) and values of KV head kh into the cache at their positions, one
    position at a time (one past the cache's end writes nothing; nothing where ``active`` is false)."""
    kv_heads, slots, d = ko_ref.shape[2], ko_ref.shape[3], ko_ref.shape[4]
    dims = jnp.arange(d, dtype=jnp.int32)

    def write(t, carry):
        p = pos_ref[b, t]
        keep = (dims < d) & (p < slots) & active
        at = (layer, b, kh, jnp.minimum(p, slots - 1), dims)
        col = jnp.full((1,), (heads + kh) * d, jnp.int32)
        plt.store(ko_ref.at[at], roped(jnp.full((1,), t, jnp.int32), col)[0].astype(ko_ref.dtype), mask=keep)
        plt.store(vo_ref.at[at], plt.load(qkv_ref.at[b, t, (heads + kv_heads + kh) * d + dims]).astype(vo_ref.dtype),
                  mask=keep)
        return carry

    lax.fori_loop(0, qkv_ref.shape[1], write, 0)


def fused_attention(
    qkv: jax.Array,  # [B, T, (H + 2 H_kv) D]: the q, k, v projections before RoPE
    cos: jax.Array,  # [B, T, D]
    sin: jax.Array,  # [B, T, D]
    k: jax.Array,  # [L, B, H_kv, S, D]
    v: jax.Array,  # [L, B, H_kv, S, D]
    layer,  # int or int32 scalar
    positions: jax.Array,  # [B, T] int
    window=0,  # int or int32 scalar: 0 full attention
    *,
    heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    block_s: int = 0,
    splits: int = 0,
    num_warps: int = 4,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # ([B, T, H, D], k, v)
    """RoPE on q and k, the new k and v written into layer ``layer`` of the cache at ``positions``
    (dropped past its end), and ``decode_attention`` of q over the cache, in one kernel: what the
    model's ``apply_rope``, ``write_cache`` and ``attention_reference`` compute (no q/k norm).
    ``splits`` of the cache's slots, each its own program (0: ``choose_splits``)."""
    b, t, width = qkv.shape
    kv_heads, slots, d = k.shape[2], k.shape[3], k.shape[4]
    if width != (heads + 2 * kv_heads) * d or not supported(t, heads, kv_heads, d):
        raise ValueError(f"fused_attention: qkv width {width}, T={t}, {heads} heads, {kv_heads} KV heads, head_dim={d}: "
                         f"needs width (H + 2 H_kv) D, head_dim a power of two >= 16 and at most {MAX_ROWS} rows")
    g = heads // kv_heads
    rows = max(MIN_ROWS, 1 << (t * g - 1).bit_length())
    new = max(MIN_ROWS, 1 << (t - 1).bit_length())
    block_s = block_s or BLOCK_S
    splits = splits or choose_splits(b, kv_heads, slots, block_s)
    kernel = functools.partial(fused_kernel, heads=heads, rows=rows, new=new, block_s=block_s, splits=splits,
                               scale=scale, softcap=softcap)
    scalar = lambda x: jnp.asarray(x, jnp.int32).reshape(1)  # noqa: E731
    parts = split_shapes(b, kv_heads, rows, d, qkv.dtype, splits)
    *outs, k, v = pl.pallas_call(
        kernel,
        out_shape=[*parts, jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        grid=(b, kv_heads, splits),
        input_output_aliases={4: len(parts), 5: len(parts) + 1},
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="flashspec_fused_attention",
    )(qkv, cos, sin, positions.astype(jnp.int32), k, v, scalar(layer), scalar(window))
    out = merged(outs, qkv.dtype)  # [B, H_kv, R, D]
    out = out[:, :, : t * g].reshape(b, kv_heads, t, g, d).transpose(0, 2, 1, 3, 4)
    return out.reshape(b, t, heads, d), k, v
