"""Weights -> our JAX Llama: the one converted cache the torch backend writes, read into jax arrays.

There is one loader and one conversion: ``flashspec_torch.weights`` turns a GGUF (or a Hugging Face
directory in HF layout) into our fused layout and caches it as safetensors in ``$FLASHSPEC_CACHE``;
this module reads that cache (or a model directory already in our layout) with
``safetensors.numpy``, stacks the per-layer tensors along a layer axis and puts them on the device.
When the cache is missing, the torch loader converts it first. ``random_model`` builds random
weights directly on the device (no host copy), for GPU timing at Llama-3-8B sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from .model import Layers, Llama, LlamaConfig


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: Any  # a transformers tokenizer, or None
    name: str


def random_model(config: LlamaConfig, dtype=jnp.bfloat16, seed: int = 0, std: float = 0.02) -> Llama:
    """Normal(0, std) weights made on the default device inside one jit (nothing crosses the host)."""
    abstract = nnx.eval_shape(lambda: Llama(config, dtype=dtype, rngs=nnx.Rngs(seed), std=std))
    graphdef, _ = nnx.split(abstract)

    @jax.jit
    def make():
        return nnx.split(Llama(config, dtype=dtype, rngs=nnx.Rngs(seed), std=std))[1]

    return nnx.merge(graphdef, make())


def from_state(config: LlamaConfig, state: dict[str, np.ndarray], dtype=jnp.float32) -> Llama:
    """Our fused layout (``flashspec_torch.weights.convert_state_dict`` names) -> Llama."""
    def get(name: str) -> np.ndarray:
        if name not in state:
            raise ValueError(f"weight {name!r} is missing: the converted cache is corrupt or not in our layout")
        return np.asarray(state[name])

    names = {"qkv": "qkv.weight", "o": "o.weight", "gate_up": "gate_up.weight", "down": "down.weight",
             "attn_norm": "attn_norm", "mlp_norm": "mlp_norm"}
    model = nnx.eval_shape(lambda: Llama(config, dtype=dtype))
    put = lambda a: jnp.asarray(a, dtype=dtype)  # noqa: E731
    model.embed = nnx.Param(put(get("embed.weight")))
    model.norm = nnx.Param(put(get("norm")))
    for field in Layers._fields:
        stacked = np.stack([get(f"layers.{i}.{names[field]}") for i in range(config.num_layers)])
        expected = getattr(model, field).value.shape
        if stacked.shape != expected:
            raise ValueError(f"layers.*.{names[field]} has shape {stacked.shape[1:]}, the config needs {expected[1:]}")
        setattr(model, field, nnx.Param(put(stacked)))
    if not config.tie_word_embeddings:
        model.lm_head = nnx.Param(put(get("lm_head.weight")))
    return model


def read_directory(path: Path, dtype) -> tuple[Llama, LlamaConfig]:
    from safetensors.numpy import load_file

    config = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
    state: dict[str, np.ndarray] = {}
    for shard in sorted(path.glob("*.safetensors")):
        try:
            state.update(load_file(str(shard)))
        except Exception as e:  # safetensors raises its own error types for truncated files
            raise ValueError(f"cannot read {shard}: {e}; the file is corrupt or incomplete") from None
    if not any(k.endswith("qkv.weight") for k in state):  # HF layout: the torch loader converts it
        from flashspec_torch import weights as tw

        torch_model = tw.load_directory(path).model
        state = {k: v.float().numpy() for k, v in torch_model.state_dict().items()}
    return from_state(config, state, dtype), config


def load(spec: str | None, dtype=jnp.float32) -> LoadedModel:
    """None: the embedded SmolLM2 (its converted cache); a .gguf file; or a model directory."""
    from flashspec_torch import weights as tw

    if spec is None or Path(spec).suffix == ".gguf":
        gguf = tw.embedded_gguf() if spec is None else Path(spec)
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} does not exist")
        directory = tw.cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"
        if not (directory / "model.safetensors").is_file():
            tw.load_gguf(gguf)  # converts once and writes the cache both backends read
        name = gguf.stem
    else:
        directory = Path(spec)
        if not directory.is_dir():
            raise FileNotFoundError(f"model {spec!r} is neither a .gguf file nor a model directory (nothing is downloaded)")
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory} has no config.json: not a Hugging Face model directory")
        if not any(directory.glob("*.safetensors")):
            raise FileNotFoundError(f"{directory} has no *.safetensors weights")
        name = directory.name
    model, _ = read_directory(directory, dtype)
    return LoadedModel(model, tw.load_tokenizer(directory), name)
