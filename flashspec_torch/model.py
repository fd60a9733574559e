"""The decoder of every supported family (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3,
Phi-3) with a static KV cache; the family differences are ``LlamaConfig`` fields.

Every row of a batch has its own positions, so rows that accepted different numbers of drafted
tokens simply continue from different places: scoring writes K/V at ``positions`` and lets each
query attend to cache slots ``s <= its position``. Stale entries past a row's length are never
attended before they are overwritten, so "rolling back" rejected tokens costs nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from flashspec.config import LlamaConfig

from . import gemv as fused
from .device import interpreting
from .family import family_block, family_logits, family_settings, local_tables, window_masks
from .invariant_matmul import RopeKV, invariant_matmul, invariant_matmul_rope_kv, invariant_matmul_swiglu
from .layers import (MAX_KERNEL_HEAD_DIM, add_rms_norm, attention, default_impl, kernel_attends, linear, rope_kv,
                     settle_layout, silu_mul)
from .shapes import check_shapes
from .tree_score import TreePass


class KVCache(nn.Module):
    """Preallocated K and V: [layers, B, H_kv, S, D] each."""

    def __init__(self, config: LlamaConfig, batch: int, max_len: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


def project(module: nn.Module, x: torch.Tensor, impl: str) -> torch.Tensor:  # x [..., K] -> [..., N]
    """A projection: the module itself (nn.Linear, or a 4-bit one), or for plain nn.Linear weights
    ``layers.linear`` with ``impl`` (the Triton product for a few rows), or with ``impl`` "invariant"
    the batch-invariant product (for weights without bias; others, such as a draft head's, by the module)."""
    if impl == "invariant" and type(module) is nn.Linear and module.bias is None:
        return invariant_matmul(x, module.weight)
    if impl in ("reference", "fused", "invariant") or type(module) is not nn.Linear:
        return module(x)
    return linear(x, module.weight, impl)


LINEAR_IMPLS = ("reference", "triton", "fused")  # what model.linear_impl may be; "invariant" is batch_invariant's
FUSABLE = frozenset({"qkv", "o", "gate_up", "down", "lm_head"})  # projections flashspec_torch.gemv can serve


def fusable(x: torch.Tensor, linear_impl: str, rows: int, *modules: nn.Module) -> bool:
    """The fused path (flashspec_torch.gemv: the norms and SwiGLU inside the products) serves
    plain nn.Linear weights and at most ``rows`` (<= 8) rows; otherwise the layer runs unfused,
    projections by cuBLAS. ``linear_impl`` as ``Llama.decode_settings`` checked it."""
    m = x.numel() // x.shape[-1]
    return linear_impl == "fused" and m <= rows and fused.fits(m, x) and all(type(mod) is nn.Linear for mod in modules)


def check_fused(names: frozenset[str]) -> frozenset[str]:
    if not isinstance(names, frozenset) or not names <= FUSABLE:
        raise ValueError(f"fused={names!r} must be a frozenset of {sorted(FUSABLE)}")
    return names


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.qkv = nn.Linear(c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, bias=c.attention_bias)
        self.o = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.gate_up = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=c.mlp_bias)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.attn_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.mlp_norm = nn.Parameter(torch.ones(c.hidden_size))
        if c.qk_norm:
            self.q_norm, self.k_norm = nn.Parameter(torch.ones(c.head_dim)), nn.Parameter(torch.ones(c.head_dim))
        if c.sandwich_norms:
            self.post_attn_norm = nn.Parameter(torch.ones(c.hidden_size))
            self.post_mlp_norm = nn.Parameter(torch.ones(c.hidden_size))
        self.family = bool(c.kernel_blockers)  # a feature the layer kernels lack: flashspec_torch.family runs it

    def forward(self, h, d, cos, sin, k_cache, v_cache, positions, mask, attend_len: int, impl: str, linear_impl: str,
                pdl: bool = False, fused_projs: frozenset[str] = FUSABLE, fused_rows: int = fused.MAX_ROWS):
        """h [B, T, C] the residual stream and d [B, T, C] (or None) what the previous layer adds to
        it; k_cache, v_cache [B, H_kv, S, D]; positions [B, T]; mask [B, 1, T, S] bool (slot visible;
        None where the attention kernel serves, which needs only ``attend_len``).
        Returns (h, d) for the next layer: the residual add is fused into the next norm.

        With ``linear_impl == "fused"`` the projections named in ``fused_projs`` run as
        flashspec_torch.gemv products with their prologue inside (all four: 6 launches); the others
        run by cuBLAS after the separate add_rms_norm / silu_mul kernels. ``pdl`` goes to every
        Triton kernel of the layer."""
        c = self.c
        if self.family:
            return family_block(self, h, d, cos, sin, k_cache, v_cache, positions, mask)
        if linear_impl == "invariant":
            return self.forward_invariant(h, d, cos, sin, k_cache, v_cache, positions, attend_len, pdl)
        on = frozenset()  # the cheap test first: this runs per layer and per token on the CPU too
        if linear_impl == "fused" and fused_projs:
            names = tuple(n for n in ("qkv", "o", "gate_up", "down") if n in fused_projs)
            on = frozenset(names) if fusable(h, linear_impl, fused_rows, *(getattr(self, n) for n in names)) else on
        if "qkv" in on:
            qkv, h = fused.gemv_add_rms_norm(h, d, self.attn_norm, c.rms_norm_eps, self.qkv.weight, pdl=pdl)
        else:
            h, x = add_rms_norm(h, d, self.attn_norm, c.rms_norm_eps, impl, pdl)
            qkv = project(self.qkv, x, linear_impl)
        q = rope_kv(qkv, cos, sin, positions, k_cache, v_cache, c.num_heads, c.num_kv_heads, impl, pdl)
        attn = attention(q, k_cache, v_cache, positions, mask, c.num_kv_heads, impl, pdl, attend_len)  # [B, T, H D]
        o = fused.gemv(attn, self.o.weight, pdl=pdl) if "o" in on else project(self.o, attn, linear_impl)
        if "gate_up" in on:
            gate_up, h = fused.gemv_add_rms_norm(h, o, self.mlp_norm, c.rms_norm_eps, self.gate_up.weight, pdl=pdl)
        else:
            h, x = add_rms_norm(h, o, self.mlp_norm, c.rms_norm_eps, impl, pdl)
            gate_up = project(self.gate_up, x, linear_impl)
        if "down" in on:
            return h, fused.gemv_silu_mul(gate_up, self.down.weight, pdl=pdl)
        return h, project(self.down, silu_mul(gate_up, impl, pdl), linear_impl)

    def forward_invariant(self, h, d, cos, sin, k_cache, v_cache, positions, attend_len: int, pdl: bool):
        """``forward`` in batch-invariant mode (arguments as there): every product by the
        batch-invariant one, add + RMSNorm by its per-row kernel before it (once per row, not per column
        tile of the product), RoPE + KV write as qkv's epilogue and SwiGLU as gate_up's
        (``invariant_matmul_rope_kv``, ``invariant_matmul_swiglu``: the bits of ``rope_kv`` and ``silu_mul``
        after the product, one launch each), attention with a fixed query tile and KV split, so that a
        row's bits depend neither on the batch nor on the number of tokens."""
        c = self.c
        h, x = add_rms_norm(h, d, self.attn_norm, c.rms_norm_eps, "triton", pdl)
        rope = RopeKV(cos, sin, positions, k_cache, v_cache, c.num_heads, c.num_kv_heads)
        q = invariant_matmul_rope_kv(x, self.qkv.weight, rope, pdl)
        attn = attention(q, k_cache, v_cache, positions, None, c.num_kv_heads, "triton", pdl, attend_len, invariant=True)
        h, x = add_rms_norm(h, invariant_matmul(attn, self.o.weight, pdl), self.mlp_norm, c.rms_norm_eps, "triton", pdl)
        return h, invariant_matmul(invariant_matmul_swiglu(x, self.gate_up.weight, pdl), self.down.weight, pdl)


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        check_shapes(config)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.skip: frozenset[int] = frozenset()  # layers a layer-skipping draft leaves out
        self.impl: str | None = None  # layer kernels: "triton" (fused) or "reference"; None: by device
        # projections of a few rows: "reference" (cuBLAS), "triton" (layers.skinny_linear), or "fused"
        # (flashspec_torch.gemv: norms and SwiGLU inside the products, <= 8 rows; more rows: cuBLAS).
        # None (this and the three below): by device and shape, see decode_settings.
        self.linear_impl: str | None = None
        self.pdl: bool | None = None  # programmatic dependent launch between the Triton kernels (Hopper; GPU only)
        # with linear_impl "fused": the projections that run fused; the others by cuBLAS (see Block.forward)
        self.fused: frozenset[str] | None = None
        self.fused_rows: int | None = None  # the fused products serve at most this many rows (<= 8)
        # CUDA (or the Triton interpreter): every product by flashspec_torch.invariant_matmul and attention
        # with a fixed tiling, so a row's logits depend neither on the batch nor on the tokens per pass
        self.batch_invariant = False

    def decode_settings(self, device: torch.device) -> tuple[str, bool, frozenset[str], int]:
        """(linear_impl, pdl, fused, fused_rows): what is set, else the defaults by device and width. CPU:
        cuBLAS-free torch (F.linear), no PDL. CUDA: PDL between the Triton kernels, and the fused one-row
        products (decoding, drafting; scoring passes keep cuBLAS) on the projections where they beat cuBLAS
        in the whole step: all five at hidden 576 (SmolLM2-135M), o and down at 2048 (TinyLlama-1.1B), none
        from 4096 (docs/engine_notes.md has the figures). ``batch_invariant``: ``invariant_settings``."""
        if self.batch_invariant:
            return self.invariant_settings(device)
        if self.config.kernel_blockers:
            return family_settings(self)
        explicit = self.linear_impl is not None
        if explicit and self.linear_impl not in LINEAR_IMPLS:
            raise ValueError(f"linear_impl={self.linear_impl!r} must be one of {LINEAR_IMPLS} (or None: by device)")
        subset = FUSABLE if self.fused is None else check_fused(self.fused)
        if device.type != "cuda":
            return self.linear_impl or "reference", bool(self.pdl), subset, self.fused_rows or fused.MAX_ROWS
        hidden = self.config.hidden_size
        default = FUSABLE if hidden <= 1024 else frozenset({"o", "down"}) if hidden <= 2048 else frozenset()
        linear_impl = self.linear_impl or ("fused" if default else "reference")
        subset = default if self.fused is None else subset
        rows = self.fused_rows or (fused.MAX_ROWS if explicit else 1)
        return linear_impl, True if self.pdl is None else self.pdl, subset, rows

    def settle_layout(self, linear_impl: str, device: torch.device) -> None:
        """The projections' weights in the storage order this forward's products read best (``layers.settle_layout``,
        judged by the LM head's; none where the LM head is not a plain nn.Linear, as with tensor parallelism)."""
        if type(self.lm_head) is nn.Linear:
            settle_layout(self, self.lm_head.weight, linear_impl, device)

    def invariant_settings(self, device: torch.device) -> tuple[str, bool, frozenset[str], int]:
        """``decode_settings`` in batch-invariant mode: ("invariant", PDL on CUDA unless set, all five, 0), or
        a ValueError naming what the mode does not implement for this model or device."""
        c, why = self.config, None
        plain = all(type(m) is nn.Linear and m.bias is None for layer in self.layers for m in
                    (layer.qkv, layer.o, layer.gate_up, layer.down)) and type(self.lm_head) is nn.Linear
        if c.kernel_blockers:
            why = f"the layer kernels do not implement {c.kernel_blockers} of this model"
        elif not plain:
            why = "its projections are not all plain nn.Linear weights without bias (an NF4 model?)"
        elif c.head_dim > MAX_KERNEL_HEAD_DIM:
            why = f"head_dim {c.head_dim} > {MAX_KERNEL_HEAD_DIM}, the attention kernel's largest"
        elif device.type != "cuda" and not interpreting():
            why = f"device {device} runs torch's own kernels (on the CPU set TRITON_INTERPRET=1 before importing)"
        elif self.impl not in (None, "triton") or (self.linear_impl, self.fused, self.fused_rows) != (None, None, None):
            why = (f"impl={self.impl!r}, linear_impl={self.linear_impl!r}, fused={self.fused!r}, fused_rows="
                   f"{self.fused_rows!r} are set; leave them None")
        if why:
            raise ValueError(f"batch_invariant: {why}; or set batch_invariant = False")
        return "invariant", device.type == "cuda" if self.pdl is None else self.pdl, FUSABLE, 0

    def rope_tables(self, like: torch.Tensor, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # [P, D] cos, sin
        """cos and sin (in like's dtype) of every position up to max_position_embeddings, built on
        first use (per device and dtype) and then only gathered: two launches per forward instead of
        eight. Each entry is what ``(cat([cos(p f)] * 2) * scaling).to(dtype)`` of the position alone
        gives (elementwise; ``f, scaling = config.rope(local)``, the scaling 1 but for yarn / longrope)."""
        attr = "_rope_local" if local else "_rope"
        tables = getattr(self, attr, None)
        if tables is None or tables[0].device != like.device or tables[0].dtype != like.dtype:
            inv_freq, scaling = self.config.rope(local)
            # past the context too: finished rows and graphed steps may index a few slots beyond it
            p = torch.arange(max(512, self.config.max_position_embeddings) + 512, device=like.device)
            angles = p[:, None].float() * torch.from_numpy(inv_freq).to(like.device)  # [P, D/2]
            tables = tuple((torch.cat([f(angles)] * 2, -1) * scaling).to(like.dtype) for f in (torch.cos, torch.sin))
            setattr(self, attr, tables)  # graphs captured with these keep reading them: never replaced on one device
        return tables

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.embed.weight
        return KVCache(self.config, batch, max_len, p.dtype, p.device)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] int64
        positions: torch.Tensor,  # [B, T] int64: each token's position in its row
        cache: KVCache,
        attend_len: int,  # attend to cache slots [0, attend_len): a host-side bound >= max position + 1
        logits_last: int | None = None,  # compute logits for the last `logits_last` tokens only (0: none)
        select: torch.Tensor | None = None,  # [B]: compute logits at this token index of each row only
        skip: frozenset[int] | None = None,
        hidden: tuple[int, ...] = (),  # also return the residual stream after these layers (a draft head's input)
        tree: TreePass | None = None,  # a tree's scoring pass: positions are then the cache rows written
    ):  # [B, logits_last or T or 1, V] float32 or None; with ``hidden``: (that, [B, T, len(hidden) * C])
        """The decoder over tokens at positions (RoPE, cache rows written, causal mask). With ``tree``
        (``flashspec_torch.tree_score.score_tree`` builds it) RoPE takes ``tree.rope_positions``, attention
        ``tree.mask`` through the plain torch layers (impl "reference"), and K/V go to rows ``positions``."""
        skip = self.skip if skip is None else skip
        c = self.config
        h = self.embed(tokens)
        if c.embed_scale != 1.0:
            h = h * torch.tensor(c.embed_scale, dtype=h.dtype)
        cos_table, sin_table = self.rope_tables(h)
        rope_positions = positions if tree is None else tree.rope_positions
        cos, sin = cos_table[rope_positions], sin_table[rope_positions]  # [B, T, D]
        local = local_tables(self, h, rope_positions)  # Gemma 3's sliding layers: (cos, sin) of their own RoPE, or None
        impl = "triton" if self.batch_invariant else self.impl or default_impl(h.device)
        if c.kernel_blockers and not self.batch_invariant:  # batch_invariant: refused by decode_settings
            if self.impl == "triton":
                raise ValueError(f"impl='triton': the layer kernels do not implement {c.kernel_blockers}; leave "
                                 "model.impl None (the plain torch layers run this model)")
            impl = "reference"
        mask = None  # the attention kernel needs none: skip its two launches
        if tree is not None:
            impl, mask = "reference", tree.mask
        elif not self.batch_invariant and not kernel_attends(impl, c.num_heads, c.num_kv_heads, tokens.shape[1],
                                                             c.head_dim):
            slots = torch.arange(attend_len, device=tokens.device)
            mask = slots[None, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, S] bool (CPU SDPA: 10x a float mask)
        masks = window_masks(c, mask, positions)  # per sliding window: its mask
        linear_impl, pdl, fused_projs, fused_rows = self.decode_settings(h.device)
        self.settle_layout(linear_impl, h.device)
        d, states = None, {}
        for i, layer in enumerate(self.layers):
            if i not in skip:
                cs = local if c.local_rope(i) else (cos, sin)
                h, d = layer(h, d, *cs, cache.k[i], cache.v[i], positions, masks.get(c.window(i), mask), attend_len,
                             impl, linear_impl, pdl, fused_projs, fused_rows)
            if i in hidden:
                states[i] = h if d is None else h + d
        if hidden:
            return self.forward_logits(h, d, logits_last, select), torch.cat([states[i] for i in hidden], -1)
        return self.forward_logits(h, d, logits_last, select)

    def forward_logits(self, h, d, logits_last: int | None, select: torch.Tensor | None):
        """``forward``'s last part: the final norm and the LM head over the residual stream h + d [B, T, C]."""
        c = self.config
        impl = self.impl or default_impl(h.device)
        linear_impl, pdl, fused_projs, fused_rows = self.decode_settings(h.device)
        if logits_last == 0:
            return None
        if select is not None:
            h = h.gather(1, select[:, None, None].expand(-1, 1, h.shape[-1]))
            d = None if d is None else d.gather(1, select[:, None, None].expand(-1, 1, d.shape[-1]))
        elif logits_last is not None:
            h, d = h[:, -logits_last:].contiguous(), None if d is None else d[:, -logits_last:].contiguous()
        if linear_impl == "invariant":
            return invariant_matmul(add_rms_norm(h, d, self.norm, c.rms_norm_eps, "triton", pdl)[1], self.lm_head.weight,
                                    pdl).float()
        if c.kernel_blockers:
            return family_logits(self, h, d)
        if "lm_head" in fused_projs and fusable(h, linear_impl, fused_rows, self.lm_head):
            return fused.gemv_add_rms_norm(h, d, self.norm, self.config.rms_norm_eps, self.lm_head.weight, pdl=pdl)[0].float()
        _, x = add_rms_norm(h, d, self.norm, self.config.rms_norm_eps, impl, pdl)
        return project(self.lm_head, x, linear_impl).float()
