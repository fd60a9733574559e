"""Weights -> our JAX Llama: the converted cache on disk (or a model directory), read into jax arrays.

The core (``flashspec.weights``) converts a GGUF once into our fused layout and caches it as
safetensors in ``$FLASHSPEC_CACHE`` (the same cache the torch backend reads), and turns a Hugging
Face directory's tensors into that layout; this module stacks the per-layer tensors along a layer
axis and puts them on the device. ``random_model`` builds random weights directly on the device
(no host copy), for GPU timing at Llama-3-8B sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flashspec.weights import embedded_gguf, gguf_cache_dir, load_gguf_cached, load_tokenizer, read_config, read_directory_state

from .model import Llama, LlamaConfig, layer_shapes


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


def from_state(config: LlamaConfig, state: dict[str, np.ndarray | jax.Array], dtype=jnp.float32) -> Llama:
    """Our fused layout (``flashspec.weights.convert_state_dict`` names) -> Llama. The arrays are NumPy
    arrays, or JAX arrays (a torch model's handed over by DLPack, say): those are stacked where they are."""
    def get(name: str) -> np.ndarray | jax.Array:
        if name not in state:
            raise ValueError(f"weight {name!r} is missing: the converted cache is corrupt or not in our layout")
        return state[name] if isinstance(state[name], jax.Array) else np.asarray(state[name])

    names = {"qkv": "qkv.weight", "o": "o.weight", "gate_up": "gate_up.weight", "down": "down.weight",
             "qkv_bias": "qkv.bias", "o_bias": "o.bias", "gate_up_bias": "gate_up.bias", "down_bias": "down.bias"}
    model = nnx.eval_shape(lambda: Llama(config, dtype=dtype))
    put = lambda a: jnp.asarray(a, dtype=dtype)  # noqa: E731
    model.embed = nnx.Param(put(get("embed.weight")))
    model.norm = nnx.Param(put(get("norm")))
    for field in layer_shapes(config):
        name = names.get(field, field)
        layers = [get(f"layers.{i}.{name}") for i in range(config.num_layers)]
        stacked = (jnp.stack if isinstance(layers[0], jax.Array) else np.stack)(layers)
        expected = getattr(model, field).get_value().shape
        if stacked.shape != expected:
            raise ValueError(f"layers.*.{name} has shape {stacked.shape[1:]}, the config needs {expected[1:]}")
        setattr(model, field, nnx.Param(put(stacked)))
    if not config.tie_word_embeddings:
        model.lm_head = nnx.Param(put(get("lm_head.weight")))
    return model


def read_directory(path: Path, dtype) -> tuple[Llama, LlamaConfig]:
    _, config = read_config(path)
    return from_state(config, read_directory_state(path, config), dtype), config


def load(spec: str | None, dtype=jnp.float32) -> LoadedModel:
    """None: the embedded SmolLM2 (its converted cache); a .gguf file; or a model directory."""
    if spec is None or Path(spec).suffix == ".gguf":
        gguf = embedded_gguf() if spec is None else Path(spec)
        model, _ = load_gguf_cached(gguf, lambda out: read_directory(out, dtype))
        return LoadedModel(model, load_tokenizer(gguf_cache_dir(gguf)), gguf.stem)
    directory = Path(spec)
    if not directory.is_dir():
        raise FileNotFoundError(f"model {spec!r} is neither a .gguf file nor a model directory (nothing is downloaded)")
    model, _ = read_directory(directory, dtype)
    return LoadedModel(model, load_tokenizer(directory), directory.name)
