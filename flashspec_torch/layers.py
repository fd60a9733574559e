"""The decoder layer's elementwise pieces, each twice: the plain torch version (``*_reference``,
what runs on the CPU) and the fused Triton kernel (``flashspec_torch/kernels/layers.py``, what
runs on a GPU, where a decode step's time is set by its number of launches).

``impl`` is "triton" or "reference". Both versions round to the activation dtype at the same
places, so they agree to float32 rounding of the reductions (tests/torch/test_layers.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .device import interpreting, next_pow2, pdl_possible

IMPLS = ("triton", "reference")


def default_impl(device: torch.device) -> str:
    return "triton" if device.type == "cuda" else "reference"


def check_impl(impl: str, device: torch.device) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} must be one of {IMPLS}")
    if impl == "triton" and device.type != "cuda" and not interpreting():
        raise RuntimeError("impl='triton' on the CPU needs TRITON_INTERPRET=1 set before flashspec_torch is imported")


def pdl_on(pdl: bool, x: torch.Tensor) -> bool:
    """Programmatic dependent launch only where asked for and possible: on a GPU of compute capability
    9.0 or newer (an older one would fail to compile the launch), never interpreted."""
    return bool(pdl) and pdl_possible(x.device)


def kernels():
    from .kernels import layers

    return layers


# ----------------------------------------------------------------------------- add + RMSNorm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # [..., C], [C]
    if x.dtype == torch.float32 and weight.dtype == torch.float32:  # one fused op, the same formula
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def add_rms_norm_reference(h, d, weight, eps: float):  # h, d [..., C] (d may be None); weight [C]
    if d is not None:
        h = h + d
    return h, rms_norm(h, weight, eps)


def add_rms_norm(
    h: torch.Tensor,  # [..., C]: the residual stream (updated in place by the kernel)
    d: torch.Tensor | None,  # [..., C]: what the last sub-layer adds to it, or None
    weight: torch.Tensor,  # [C]
    eps: float,
    impl: str = "reference",
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # (h + d, rms_norm(h + d) * weight)
    if impl == "reference":
        return add_rms_norm_reference(h, d, weight, eps)
    c = h.shape[-1]
    assert h.is_contiguous() and (d is None or d.is_contiguous())
    y = torch.empty_like(h)
    rows = h.numel() // c
    block_c = next_pow2(c)
    block_r = max(1, 2048 // block_c)  # not by rows: a row's reduction (its layout, the warps) is the same for any batch
    on = pdl_on(pdl, h)
    kernels().add_rms_norm_kernel[(triton_cdiv(rows, block_r),)](
        h, h if d is None else d, weight, y, rows, c, eps,
        HAS_D=d is not None, BLOCK_R=block_r, BLOCK_C=block_c, USE_PDL=on,
        num_warps=4 if block_c * block_r <= 4096 else 8, launch_pdl=on,
    )
    return h, y


# ----------------------------------------------------------------------------- RoPE + KV write


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos, sin [B, 1, T, D]; the rotate-half convention of HF Llama."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_kv_reference(qkv, cos, sin, positions, k_cache, v_cache, heads: int, kv_heads: int):
    b, t, _ = qkv.shape
    d = cos.shape[-1]
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], -1)
    q = apply_rope(q.view(b, t, heads, d).transpose(1, 2), cos[:, None], sin[:, None])
    k = apply_rope(k.view(b, t, kv_heads, d).transpose(1, 2), cos[:, None], sin[:, None])
    v = v.view(b, t, kv_heads, d).transpose(1, 2)
    index = positions[:, None, :, None].expand(b, kv_heads, t, d)
    k_cache.scatter_(2, index, k.to(k_cache.dtype))
    v_cache.scatter_(2, index, v.to(v_cache.dtype))
    return q


def rope_kv(
    qkv: torch.Tensor,  # [B, T, (H + 2 H_kv) D]: the fused projection
    cos: torch.Tensor,  # [B, T, D]
    sin: torch.Tensor,  # [B, T, D]
    positions: torch.Tensor,  # [B, T] int64
    k_cache: torch.Tensor,  # [B, H_kv, S, D], written at positions
    v_cache: torch.Tensor,  # [B, H_kv, S, D], written at positions
    heads: int,
    kv_heads: int,
    impl: str = "reference",
    pdl: bool = False,
) -> torch.Tensor:  # q [B, H, T, D], rotated
    if impl == "reference":
        return rope_kv_reference(qkv, cos, sin, positions, k_cache, v_cache, heads, kv_heads)
    b, t, _ = qkv.shape
    d = cos.shape[-1]
    qkv, cos, sin, positions = qkv.contiguous(), cos.contiguous(), sin.contiguous(), positions.contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    q = torch.empty((b, heads, t, d), dtype=qkv.dtype, device=qkv.device)
    on = pdl_on(pdl, qkv)
    kernels().rope_kv_kernel[(b * t, heads + 2 * kv_heads)](
        qkv, cos, sin, positions, q, k_cache, v_cache, t, k_cache.shape[2],
        H=heads, H_KV=kv_heads, D=d, BLOCK_D=next_pow2(d), USE_PDL=on, num_warps=1, launch_pdl=on,
    )
    return q


# ----------------------------------------------------------------------------- attention


def attention_reference(q, k_cache, v_cache, mask, kv_heads: int):
    """q [B, H, T, D]; caches [B, H_kv, S, D]; mask [B, 1, T, S'] bool (visible) -> [B, T, H D]."""
    b, h, t, d = q.shape
    s = mask.shape[-1]
    attn = F.scaled_dot_product_attention(q, k_cache[:, :, :s], v_cache[:, :, :s], attn_mask=mask, enable_gqa=h != kv_heads)
    return attn.transpose(1, 2).reshape(b, t, h * d)


MAX_KERNEL_HEAD_DIM = 256  # the attention kernel's largest head_dim; above it SDPA serves


def kernel_attends(impl: str, heads: int, kv_heads: int, tokens: int, head_dim: int) -> bool:
    """Whether ``attention`` runs the kernel (which needs no mask) rather than SDPA: a few new tokens per
    row (at most 64 query rows per KV head) and head_dim <= 256 (any, padded to a power of two inside)."""
    return impl != "reference" and (heads // kv_heads) * tokens <= 64 and head_dim <= MAX_KERNEL_HEAD_DIM


def attention_tiling(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_S, num_warps) of the attention kernel: head_dim padded to a power of two >= 16 (tl.dot's
    least K); cache slots per step so that a K or V tile holds at most 64 x 128 entries, the tiles of head_dim 128
    (128 slots up to BLOCK_D 64, as head_dim 64 had); 8 warps at BLOCK_D 256. The shared memory of the largest
    case fits sm_90's (tests/torch/compile_odd_shapes_sm90.py checks it)."""
    block_d = max(16, next_pow2(head_dim))
    block_s = 128 if block_d <= 64 else 64 * 128 // block_d
    return block_d, block_s, 4 if block_d <= 128 else 8


def attention(
    q: torch.Tensor,  # [B, H, T, D]
    k_cache: torch.Tensor,  # [B, H_kv, S, D]
    v_cache: torch.Tensor,  # [B, H_kv, S, D]
    positions: torch.Tensor,  # [B, T]: a query sees slots <= its position
    mask: torch.Tensor | None,  # [B, 1, T, S'] bool, the same rule over slots [0, S'); None where the kernel serves
    kv_heads: int,
    impl: str = "reference",
    pdl: bool = False,
    attend_len: int | None = None,  # S' (None: mask's last dimension)
    invariant: bool = False,
) -> torch.Tensor:  # [B, T, H D]
    """The kernel serves a few new tokens per row (decode, drafting, scoring); long prompts go
    to SDPA in both implementations. ``invariant`` (batch-invariant mode, impl "triton"): the kernel
    alone, with a query tile of ``invariant_query_rows(group)`` rows whatever T is, the tokens in
    pieces of that tile (one program per piece, one launch), the slots in splits of
    ``INVARIANT_KV_SPLIT`` (a program each, added in order by a second kernel when there are several),
    so that a query's bits depend on its position and the cache only (each split walks its slots in
    fixed blocks; blocks and splits past a query's position add nothing)."""
    b, h, t, d = q.shape
    if invariant:
        if impl != "triton" or d > MAX_KERNEL_HEAD_DIM:
            raise ValueError(f"invariant attention needs impl='triton' (got {impl!r}) and head_dim <= {MAX_KERNEL_HEAD_DIM}")
        block_q = invariant_query_rows(h // kv_heads)
        return launch_attention(q, k_cache, v_cache, positions, kv_heads, pdl, attend_len, block_q, not interpreting(),
                                block_q // (h // kv_heads), INVARIANT_KV_SPLIT)
    if not kernel_attends(impl, h, kv_heads, t, d):
        return attention_reference(q, k_cache, v_cache, mask, kv_heads)
    attend = mask.shape[-1] if attend_len is None else attend_len
    return launch_attention(q, k_cache, v_cache, positions, kv_heads, pdl, attend, max(16, next_pow2(h // kv_heads * t)))


def invariant_query_rows(group: int) -> int:
    """The query tile of invariant attention: a decode token's group of heads, at least 16 (tl.dot's
    least M), the same for every T."""
    return max(16, next_pow2(group))


INVARIANT_KV_SPLIT = 256  # cache slots per program of invariant attention: the split count follows the length only


def launch_attention(q, k_cache, v_cache, positions, kv_heads: int, pdl: bool, attend: int, block_q: int,
                     use_dot: bool = True, t_piece: int | None = None, kv_split: int = 0) -> torch.Tensor:
    """The attention kernel over q [B, H, T, D] in pieces of ``t_piece`` tokens (None: all T in one,
    H // kv_heads * t_piece <= block_q) -> [B, T, H D]; ``kv_split`` > 0 and ``attend`` above it: the slots
    in splits of ``kv_split``, a program each, then ``attention_merge_kernel``; ``use_dot`` False: the score
    and value products by float32 sums of a fixed tree (the interpreter's tl.dot is NumPy's matmul, whose
    row bits depend on the row's place in the tile)."""
    b, h, t, d = q.shape
    t_piece = t if t_piece is None else t_piece
    out = torch.empty((b, t, h * d), dtype=q.dtype, device=q.device)
    on = pdl_on(pdl, q)
    block_d, block_s, warps = attention_tiling(d)
    splits = triton_cdiv(attend, kv_split) if kv_split else 1
    grid = (b * kv_heads, triton_cdiv(t, t_piece), splits)
    part = None if splits == 1 else torch.empty((*grid, block_q, block_d + 2), dtype=torch.float32, device=q.device)
    kernels().decode_attention_kernel[grid](
        q.contiguous(), k_cache, v_cache, positions.contiguous(), out, t, k_cache.shape[2], attend, d ** -0.5, t_piece,
        H=h, H_KV=kv_heads, D=d, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_S=block_s,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_DOT=use_dot, USE_PDL=on, num_warps=warps,
        num_stages=2, launch_pdl=on, part_ptr=part, KV_SPLIT=0 if splits == 1 else kv_split,
    )
    if splits > 1:
        kernels().attention_merge_kernel[grid[:2]](part, out, t, t_piece, splits, H=h, H_KV=kv_heads, D=d, BLOCK_D=block_d,
                                                   BLOCK_Q=block_q, num_warps=4)
    return out


# ----------------------------------------------------------------------------- SwiGLU


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2I] -> [..., I]
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor, impl: str = "reference", pdl: bool = False) -> torch.Tensor:  # [..., 2I] -> [..., I]
    if impl == "reference":
        return silu_mul_reference(gate_up)
    i2 = gate_up.shape[-1]
    assert gate_up.is_contiguous() and i2 % 2 == 0
    rows, i = gate_up.numel() // i2, i2 // 2
    y = torch.empty((*gate_up.shape[:-1], i), dtype=gate_up.dtype, device=gate_up.device)
    block = min(next_pow2(i), 2048)
    on = pdl_on(pdl, gate_up)
    kernels().silu_mul_kernel[(rows, triton_cdiv(i, block))](
        gate_up, y, i, BLOCK=block, USE_PDL=on, num_warps=4, launch_pdl=on,
    )
    return y


# ----------------------------------------------------------------------------- skinny products


def linear(
    x: torch.Tensor,  # [..., K]
    w: torch.Tensor,  # [N, K]
    impl: str = "reference",
) -> torch.Tensor:  # [..., N] = x w^T
    """F.linear, or for a few rows (decode, drafting, scoring: M <= 16) the Triton product, which
    does not split K where cuBLAS does (docs/engine_notes.md)."""
    k = x.shape[-1]
    m = x.numel() // k
    if impl == "reference" or m > 16 or x.dtype == torch.float32:
        return F.linear(x, w)
    return skinny_linear(x, w, *skinny_tiling(w.shape[0], k))


def wants_k_major(device: torch.device, linear_impl: str, dtype: torch.dtype) -> bool:
    """Whether products on ``device`` with ``linear_impl`` read their weights K-major: torch's float32
    products on the CPU. There MKL multiplies a few rows by a K-major weight at about the one-row
    product's time, by a row-major one at up to twice it (docs/draft_head.md, "The CPU's weight layout");
    every kernel reads [N, K] rows."""
    return device.type == "cpu" and linear_impl == "reference" and dtype == torch.float32


def is_k_major(w: torch.Tensor) -> bool:  # w [N, K]
    return w.dim() == 2 and w.shape[0] > 1 and w.stride() == (1, w.shape[0])


def lay_out(module: nn.Module, k_major: bool) -> None:
    """Every plain nn.Linear weight [N, K] in ``module`` stored K-major ([K, N] storage, the weight a
    transposed view of it) or row-major. The values and the Parameter objects stay (tied weights stay
    tied); only the storage order changes. A new storage is an inference tensor where the old one was
    (a model built under ``torch.inference_mode``), else a plain one (usable by autograd: a head trained
    against the target)."""
    for m in module.modules():
        if type(m) is nn.Linear and is_k_major(m.weight) != k_major:
            m.weight.data = relaid(m.weight.data, k_major)


def settle_layout(module: nn.Module, probe: torch.Tensor, linear_impl: str, device: torch.device) -> bool:
    """``module``'s plain nn.Linear weights in the storage order this pass's products read best (``wants_k_major``),
    judged by ``probe`` (one of them, or one laid out with them); ``lay_out`` only where ``probe`` is not in that
    order (the first pass of a new device or setting). True where the order changed."""
    k_major = wants_k_major(device, linear_impl, probe.dtype)
    if is_k_major(probe) == k_major:
        return False
    lay_out(module, k_major)
    return True


def relaid(w: torch.Tensor, k_major: bool) -> torch.Tensor:  # w [N, K] -> the same values, K-major or row-major
    with torch.inference_mode(w.is_inference()), torch.no_grad():
        return w.t().contiguous().t() if k_major else w.contiguous()


def skinny_tiling(n: int, k: int) -> tuple[int, int, int, int]:
    """(block_n, block_k, num_warps, num_stages) of the skinny product by the projection's shape (tuned on
    TinyLlama-1.1B's projections, docs/engine_notes.md)."""
    if k >= 4096:  # the down projection: cuBLAS splits K (two launches)
        return 64, 512, 4, 3
    if n >= 16384:  # the LM head
        return 64, 128, 4, 3
    return 32, 512, 4, 3


def skinny_linear(
    x: torch.Tensor,  # [..., K]: a few rows
    w: torch.Tensor,  # [N, K]
    block_n: int = 32,
    block_k: int = 256,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:  # [..., N] = x w^T (F.linear without bias)
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    m, n = x2.shape[0], w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = 16
    kernels().skinny_linear_kernel[(triton_cdiv(n, block_n), triton_cdiv(m, block_m))](
        x2, w, y, m, n, k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages,
    )
    return y.reshape(*x.shape[:-1], n)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
