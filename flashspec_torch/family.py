"""The decoder layer of a model with a family feature the GPU layer kernels lack (biases, q/k norms,
sliding windows, Gemma's norms, soft-capping, GELU, a query scale): plain torch ops, the same on the
CPU and the GPU, so such a model is never run by a kernel that would drop the feature.

``Llama`` (flashspec_torch/model.py) sends every layer of such a model here (``Block.family``);
a plain Llama keeps the fused Triton path. The formulas are transformers' eager ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import apply_rope, rms_norm


def norm(x: torch.Tensor, weight: torch.Tensor, c) -> torch.Tensor:  # [..., C], [C]
    """RMSNorm; with ``norm_offset`` (Gemma) the product by (offset + weight) in float32, then rounded."""
    if not c.norm_offset:
        return rms_norm(x, weight, c.rms_norm_eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)
    return (xf * (c.norm_offset + weight.float())).to(x.dtype)


def family_settings(model) -> tuple[str, bool, frozenset[str], int]:
    """``Llama.decode_settings`` of a model with kernel blockers: cuBLAS / F.linear products (they
    keep the biases), no PDL, nothing fused; asking for more is refused."""
    c = model.config
    if model.linear_impl not in (None, "reference"):
        raise ValueError(f"linear_impl={model.linear_impl!r}: the fused products do not implement "
                         f"{c.kernel_blockers} of this model; leave linear_impl None")
    return "reference", False, frozenset(), 1


def local_tables(model, like: torch.Tensor, positions: torch.Tensor):  # ([B, T, D], [B, T, D]) or None
    """The sliding layers' own RoPE (Gemma 3), gathered at ``positions``; None for other models."""
    if model.config.local_rope_theta is None:
        return None
    cos, sin = model.rope_tables(like, local=True)
    return cos[positions], sin[positions]


def window_masks(c, mask: torch.Tensor | None, positions: torch.Tensor) -> dict[int, torch.Tensor]:
    """{window: mask [B, 1, T, S]} for each sliding window of the config: slot s is visible to a query
    at position p when s <= p (``mask``) and s > p - window (transformers' sliding_window_overlay)."""
    if mask is None or not c.sliding_windows:
        return {}
    slots = torch.arange(mask.shape[-1], device=mask.device)
    return {w: mask & (slots[None, None, None, :] > positions[:, None, :, None] - w) for w in set(c.sliding_windows) if w}


def attend(c, q, k_cache, v_cache, mask) -> torch.Tensor:
    """q [B, H, T, D]; caches [B, H_kv, S, D]; mask [B, 1, T, S'] bool -> [B, T, H D]."""
    b, h, t, d = q.shape
    s = mask.shape[-1]
    k, v = k_cache[:, :, :s], v_cache[:, :, :s]
    scale = c.query_scale or d ** -0.5
    if not c.attn_softcap:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=h != c.num_kv_heads)
    else:
        k, v = (x.repeat_interleave(h // c.num_kv_heads, dim=1) for x in (k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        scores = torch.tanh(scores / c.attn_softcap) * c.attn_softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    return out.transpose(1, 2).reshape(b, t, h * d)


def family_block(block, h, d, cos, sin, k_cache, v_cache, positions, mask):
    """``Block.forward`` for these models: h, d [B, T, C]; cos, sin [B, T, D]; caches [B, H_kv, S, D]
    (written at positions [B, T]); mask [B, 1, T, S] bool of this layer's window. Returns (h, d)."""
    c = block.c
    if d is not None:
        h = h + d
    b, t, _ = h.shape
    q, k, v = block.qkv(norm(h, block.attn_norm, c)).split(
        [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], -1)
    q, k, v = q.view(b, t, -1, c.head_dim), k.view(b, t, -1, c.head_dim), v.view(b, t, -1, c.head_dim)
    if c.qk_norm:
        q, k = norm(q, block.q_norm, c), norm(k, block.k_norm, c)
    q = apply_rope(q.transpose(1, 2), cos[:, None], sin[:, None])
    k = apply_rope(k.transpose(1, 2), cos[:, None], sin[:, None])
    index = positions[:, None, :, None].expand(b, c.num_kv_heads, t, c.head_dim)
    k_cache.scatter_(2, index, k.to(k_cache.dtype))
    v_cache.scatter_(2, index, v.transpose(1, 2).to(v_cache.dtype))
    o = block.o(attend(c, q, k_cache, v_cache, mask))
    if c.sandwich_norms:
        o = norm(o, block.post_attn_norm, c)
    h = h + o
    gate, up = block.gate_up(norm(h, block.mlp_norm, c)).chunk(2, -1)
    act = F.silu(gate) if c.activation == "silu" else F.gelu(gate, approximate="tanh")
    m = block.down(act * up)
    if c.sandwich_norms:
        m = norm(m, block.post_mlp_norm, c)
    return h, m


def family_logits(model, h: torch.Tensor, d: torch.Tensor | None) -> torch.Tensor:  # [B, T, C] -> [B, T, V] float32
    c = model.config
    if d is not None:
        h = h + d
    z = model.lm_head(norm(h, model.norm, c)).float()
    return torch.tanh(z / c.final_softcap) * c.final_softcap if c.final_softcap else z
