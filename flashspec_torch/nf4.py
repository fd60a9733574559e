"""A 4-bit NF4 copy of a Llama through bitsandbytes, without a second model file.

``quantize_nf4(model)`` returns a new ``Llama`` whose block projections (qkv, o, gate_up, down)
are ``NF4Linear`` layers holding 4-bit NF4 codes with one absmax per ``blocksize`` weights (the
QLoRA format, Dettmers et al. 2023); the embedding, the norms and the output head are shared with
the source model, as bitsandbytes' own ``load_in_4bit`` keeps ``lm_head`` in full precision. The
copy serves as a draft (``--draft nf4``) or as the target itself (``--target nf4``).

bitsandbytes 0.50 runs NF4 on the CPU too: correct, but slower than the fp32 matmul it replaces.
"""

from __future__ import annotations

import torch
from torch import nn

from .model import Block, Llama

PROJECTIONS = ("qkv", "o", "gate_up", "down")


def bitsandbytes():
    """The bitsandbytes module, or an ImportError naming the extra that installs it."""
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional  # noqa: F401
    except ImportError:
        raise ImportError("NF4 needs bitsandbytes: pip install 'flashspec[torch]' (or pip install bitsandbytes)") from None
    return bnb


class NF4Linear(nn.Module):
    """y = x W^T with W stored as NF4 codes (two per byte) and per-block absmax scales."""

    def __init__(self, linear: nn.Linear, blocksize: int = 64):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("NF4Linear quantizes bias-free projections only (Llama has none)")
        if blocksize not in (64, 128, 256, 512, 1024, 2048, 4096):
            raise ValueError(f"{blocksize=} must be a power of two in [64, 4096]")
        bnb = bitsandbytes()
        w = linear.weight.detach()  # [out, in]
        packed, self.state = bnb.functional.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", quant_storage=torch.uint8)
        self.register_buffer("packed", packed, persistent=False)  # [out * in / 2, 1] uint8
        self.out_features, self.in_features = w.shape
        self.blocksize = blocksize

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        return bitsandbytes().matmul_4bit(x, self.packed.t(), quant_state=self.state)

    def dequantized(self) -> torch.Tensor:  # [out, in]: the weight this layer multiplies by
        return bitsandbytes().functional.dequantize_4bit(self.packed, self.state)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4, blocksize={self.blocksize}"


def quantize_block(src: Block, blocksize: int) -> Block:
    with torch.device("meta"):
        blk = Block(src.c)
    for name in PROJECTIONS:
        setattr(blk, name, NF4Linear(getattr(src, name), blocksize))
    for name, param in src.named_parameters(recurse=False):  # the norms
        setattr(blk, name, param)
    return blk


def quantize_nf4(model: Llama, blocksize: int = 64) -> Llama:
    """A new Llama with NF4 block projections; embedding, norms and head shared with ``model``."""
    bitsandbytes()
    if is_nf4(model):
        raise ValueError("the model is already NF4-quantized")
    with torch.device("meta"):
        q = Llama(model.config)
    q.embed, q.norm, q.lm_head = model.embed, model.norm, model.lm_head
    q.layers = nn.ModuleList(quantize_block(b, blocksize) for b in model.layers)
    q._rope = model.rope_tables(model.embed.weight)  # shared, not rebuilt (bf16, head_dim 128: 4.5 MB at an 8K context, 67 MB at 128K)
    left = [n for n, t in [*q.named_parameters(), *q.named_buffers()] if t.is_meta]
    if left:
        raise AssertionError(f"NF4 copy left tensors unset: {left[:3]}")
    return q.eval().requires_grad_(False)


def is_nf4(model: Llama) -> bool:
    return any(isinstance(m, NF4Linear) for m in model.modules())


def dequantize_nf4(model: Llama) -> Llama:
    """The plain reference: the same model with each NF4 weight expanded back into an nn.Linear."""
    with torch.device("meta"):
        ref = Llama(model.config)
    ref.embed, ref.norm, ref.lm_head = model.embed, model.norm, model.lm_head
    layers = []
    for src in model.layers:
        with torch.device("meta"):
            blk = Block(src.c)
        for name in PROJECTIONS:
            layer = getattr(src, name)
            lin = nn.Linear(layer.in_features, layer.out_features, bias=False, device=layer.packed.device)
            lin.weight = nn.Parameter(layer.dequantized(), requires_grad=False)
            setattr(blk, name, lin)
        for name, param in src.named_parameters(recurse=False):  # the norms
            setattr(blk, name, param)
        layers.append(blk)
    ref.layers = nn.ModuleList(layers)
    return ref.eval()
