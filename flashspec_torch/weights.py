"""Weights -> our torch Llama: the embedded GGUF, a Hugging Face model directory, or a transformers model.

A GGUF is converted once by the core (``flashspec.weights``) into the on-disk cache that both
backends read; this module reads that cache or a model directory with ``safetensors.torch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flashspec.weights import convert_state_dict, embedded_gguf, load_gguf_cached, load_tokenizer, read_config, read_shards

from .model import Llama, LlamaConfig


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: Any  # a transformers tokenizer, or None
    name: str


def fused(hf: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names -> our fused layout, for torch tensors."""
    return convert_state_dict(hf, config, cat=torch.cat)


def build(config: LlamaConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, device) -> Llama:
    with torch.device("meta"):
        model = Llama(config)
    model = model.to_empty(device=device)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.to(dtype=dtype).eval().requires_grad_(False)


def from_transformers(hf_model, dtype=torch.float32, device="cpu", tokenizer=None, name="transformers") -> LoadedModel:
    """Wrap the weights of a transformers model object of a supported family (copied to our layout)."""
    config = LlamaConfig.from_hf(hf_model.config)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return LoadedModel(build(config, fused(state, config), dtype, device), tokenizer, name)


def load_directory(path: str | Path, dtype=torch.float32, device="cpu") -> LoadedModel:
    """A Hugging Face model directory: config.json, *.safetensors, tokenizer files."""
    from safetensors.torch import load_file

    path = Path(path)
    _, config = read_config(path)
    state: dict[str, torch.Tensor] = read_shards(path, load_file)
    if not any(k.endswith("qkv.weight") for k in state):
        state = fused(state, config)
    return LoadedModel(build(config, state, dtype, device), load_tokenizer(path), path.name)


def load_transformers_directory(path: str | Path, dtype=torch.float32, device="cpu"):
    """Any transformers causal LM saved in a directory, as a transformers object (for a draft of
    an architecture our Llama class does not cover)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load {path} as a transformers causal LM: {e}") from None


def load_gguf(gguf: str | Path, dtype=torch.float32, device="cpu") -> LoadedModel:
    """A GGUF through its cached conversion (made first when missing or damaged)."""
    gguf = Path(gguf)
    loaded = load_gguf_cached(gguf, lambda out: load_directory(out, dtype, device))
    loaded.name = gguf.stem
    return loaded


def load(spec: str | None, dtype=torch.float32, device="cpu") -> LoadedModel:
    """None: the embedded SmolLM2; a .gguf file; or a Hugging Face model directory."""
    if spec is None:
        return load_gguf(embedded_gguf(), dtype, device)
    path = Path(spec)
    if path.suffix == ".gguf":
        return load_gguf(path, dtype, device)
    if path.is_dir():
        return load_directory(path, dtype, device)
    raise FileNotFoundError(f"model {spec!r} is neither a .gguf file nor a model directory (nothing is downloaded)")
