"""GGUF metadata and tensors of the supported families -> a Hugging Face config dict and state dict
(NumPy only), following llama.cpp's ``convert_hf_to_gguf.py`` conventions per architecture.

Architectures: ``llama`` (Llama 2/3.x, Mistral), ``qwen2``, ``qwen3``, ``gemma2``, ``gemma3`` (its text
model), ``phi3``. Every ``{arch}.*`` key is read into a config field or refused naming the key; so is
every tensor. Reversed here, where llama.cpp's converter applies them:

* ``llama``: ``attn_q`` / ``attn_k`` rows un-permuted; ``rope_freqs`` (Llama 3's per-frequency
  divisors of the inverse frequencies) read as RoPE with those factors (``longrope`` with equal short
  and long factors, attention factor 1: inv_freq = default / factor); ``llama.attention.sliding_window``
  makes it Mistral (a Mistral file without it runs with full attention, as llama.cpp runs it);
* Gemma: ``*norm.weight`` minus one (the file holds 1 + w); Gemma 2's soft-capping keys (llama.cpp's
  defaults 50 and 30 where absent); the query scale 1/sqrt(key_length),
  or 1/sqrt(hidden / heads) for the 27B models (llama.cpp's rule, by block count); Gemma 3's
  local RoPE base ``rope.freq_base_swa`` (default 10000) and ``attention.sliding_window_pattern``
  (llama.cpp's default: every sixth layer full);
* Phi-3: ``attn_qkv`` and ``ffn_up`` (gate and up rows) kept fused, as transformers' Phi-3 holds them;
  longrope as ``rope_factors_short`` / ``rope_factors_long`` tensors with ``rope.scaling.attn_factor``
  and ``rope.scaling.original_context_length``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3_text",
                 "phi3": "phi3"}
CONFIG_KEYS = {  # {arch}.<key> -> Hugging Face config field
    "context_length": "max_position_embeddings", "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size", "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
    "attention.key_length": "head_dim", "rope.freq_base": "rope_theta", "attention.sliding_window": "sliding_window",
}
GEMMA2_KEYS = {"attn_logit_softcapping": "attn_logit_softcapping", "final_logit_softcapping": "final_logit_softcapping"}
# read below, beside CONFIG_KEYS; at these values they change nothing
OTHER_KEYS = ("attention.value_length", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
              "rope.freq_base_swa", "attention.sliding_window_pattern", "expert_count", "expert_used_count",
              "rope.scaling.attn_factor", "rope.scaling.original_context_length")
# RoPE tensors read into the config's rope_parameters, per architecture
ROPE_TENSORS = {"llama": ("rope_freqs.weight",), "phi3": ("rope_factors_short.weight", "rope_factors_long.weight")}
NEUTRAL = {"expert_count": (0,), "expert_used_count": (0,)}
GEMMA_27B_BLOCKS = {"gemma2": 46, "gemma3": 62}  # llama.cpp's LLM_TYPE_27B: query scale from hidden / heads
LAYER_NAMES = {  # blk.N.<name> -> model.layers.N.<name>, every architecture
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
ARCH_LAYER_NAMES = {
    "gemma": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def refuse(arch: str, key: str, value, why: str) -> ValueError:
    return ValueError(f"GGUF metadata {arch}.{key}={value!r} is not supported by FlashSpec ({why}): refused rather "
                      "than run without it")


def architecture(fields: dict) -> str:
    arch = fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"general.architecture={arch!r}: FlashSpec reads GGUF files of {sorted(ARCHITECTURES)}")
    return arch


def arch_fields(fields: dict, arch: str) -> dict:
    """The ``{arch}.*`` keys (prefix removed), each checked to be one this module reads."""
    out = {k.removeprefix(arch + "."): v for k, v in fields.items() if k.startswith(arch + ".")}
    known = set(CONFIG_KEYS) | set(OTHER_KEYS) | (set(GEMMA2_KEYS) if arch == "gemma2" else set())
    for key, v in out.items():
        if key not in known:
            raise refuse(arch, key, v, f"it reads {sorted(known)} for {arch}")
        if key in NEUTRAL and v not in NEUTRAL[key]:
            raise refuse(arch, key, v, f"only {NEUTRAL[key]}")
    return out


def factors(rope: np.ndarray) -> list[float]:  # [head_dim / 2]
    return [float(x) for x in rope]


def rope_parameters(f: dict, arch: str, tensors: dict[str, np.ndarray]) -> dict:
    """rope_parameters of the HF config: the scaling keys, Llama 3's rope_freqs, Phi-3's longrope
    factors, Gemma 3's two bases."""
    kind = f.get("rope.scaling.type", "none")
    if kind not in ("none", "linear"):
        raise refuse(arch, "rope.scaling.type", kind, "none or linear (Llama 3 scaling comes as rope_freqs)")
    theta = float(f.get("rope.freq_base", 1e6 if arch == "gemma3" else 10000.0))
    rope: dict = {"rope_theta": theta, "rope_type": "default"}
    if kind == "linear":
        rope.update(rope_type="linear", factor=float(f["rope.scaling.factor"]))
    elif f.get("rope.scaling.factor", 1.0) != 1.0:
        raise refuse(arch, "rope.scaling.factor", f["rope.scaling.factor"], "with rope.scaling.type linear only")
    if tensors and kind != "none":
        raise refuse(arch, "rope.scaling.type", kind, f"none beside {sorted(tensors)}")
    if "rope_freqs.weight" in tensors:
        freqs = factors(tensors["rope_freqs.weight"])
        rope.update(rope_type="longrope", short_factor=freqs, long_factor=freqs, factor=1.0, attention_factor=1.0,
                    original_max_position_embeddings=int(f["context_length"]))
    elif tensors:  # Phi-3's longrope
        if set(tensors) != set(ROPE_TENSORS["phi3"]) or "rope.scaling.original_context_length" not in f:
            raise ValueError(f"GGUF holds {sorted(tensors)}: longrope needs both {ROPE_TENSORS['phi3']} and "
                             "phi3.rope.scaling.original_context_length")
        rope.update(rope_type="longrope", short_factor=factors(tensors["rope_factors_short.weight"]),
                    long_factor=factors(tensors["rope_factors_long.weight"]),
                    original_max_position_embeddings=int(f["rope.scaling.original_context_length"]))
        if "rope.scaling.attn_factor" in f:
            rope["attention_factor"] = float(f["rope.scaling.attn_factor"])
    else:
        for key in ("rope.scaling.attn_factor", "rope.scaling.original_context_length"):
            if key in f:
                raise refuse(arch, key, f[key], "with Phi-3's rope_factors tensors only")
    if arch == "gemma3":
        local = {"rope_type": "default", "rope_theta": float(f.get("rope.freq_base_swa", 10000.0))}
        return {"full_attention": rope, "sliding_attention": local}
    if "rope.freq_base_swa" in f:
        raise refuse(arch, "rope.freq_base_swa", f["rope.freq_base_swa"], "Gemma 3 only")
    return rope


def layer_types(f: dict, arch: str, layers: int) -> list[str] | None:
    """Per-layer attention kinds from ``attention.sliding_window_pattern`` (a bool per layer, true:
    sliding; or an int n: every n-th layer full), llama.cpp's defaults without it."""
    pattern = f.get("attention.sliding_window_pattern")
    if pattern is None:
        return None  # families.sliding_windows applies the family's default, as llama.cpp does
    if isinstance(pattern, list) and len(pattern) == layers:
        sliding = [bool(p) for p in pattern]
    elif isinstance(pattern, int) and pattern > 0:
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    else:
        raise refuse(arch, "attention.sliding_window_pattern", pattern, f"{layers} booleans or a positive int")
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def config_dict(fields: dict, tensor_names: set[str], rope_tensors: dict[str, np.ndarray]) -> dict:
    """The GGUF's metadata (``{key: value}``), tensor names and RoPE tensors (those of ROPE_TENSORS
    the file holds) -> the Hugging Face config dict of the same model."""
    arch = architecture(fields)
    f = arch_fields(fields, arch)
    model_type = "mistral" if arch == "llama" and f.get("attention.sliding_window") else ARCHITECTURES[arch]
    c = {"model_type": model_type}  # first, then the name: the key order of transformers' GGUF configs
    if "general.name" in fields:
        c["_model_name_or_path"] = fields["general.name"]
    c.update({ours: f[key] for key, ours in {**CONFIG_KEYS, **GEMMA2_KEYS}.items() if key in f})
    heads = c["num_attention_heads"]
    head_dim = c.setdefault("head_dim", c["hidden_size"] // heads)
    for key in ("attention.value_length", "rope.dimension_count"):
        if f.get(key, head_dim) != head_dim:
            raise refuse(arch, key, f[key], f"equal to the head dimension {head_dim} (partial RoPE and value heads of "
                         "another width are not implemented)")
    if arch in ("qwen2", "qwen3") and c.get("sliding_window"):  # which layers slide is not in the file
        raise refuse(arch, "attention.sliding_window", c["sliding_window"], "no window for qwen2 / qwen3, as llama.cpp")
    c.update(rope_parameters=rope_parameters(f, arch, rope_tensors),
             tie_word_embeddings="output.weight" not in tensor_names)
    types = layer_types(f, arch, c["num_hidden_layers"])
    if types is not None:
        c["layer_types"] = types
    if arch in GEMMA_27B_BLOCKS:
        big = c["num_hidden_layers"] == GEMMA_27B_BLOCKS[arch]
        c["query_pre_attn_scalar"] = c["hidden_size"] // heads if big else head_dim
        gemma2 = arch == "gemma2"  # llama.cpp's defaults where a Gemma 2 file lacks the keys: 50 and 30
        c.setdefault("attn_logit_softcapping", 50.0 if gemma2 else None)
        c.setdefault("final_logit_softcapping", 30.0 if gemma2 else None)
    c["attention_bias"] = "blk.0.attn_q.bias" in tensor_names and arch != "qwen2"
    c["mlp_bias"] = "blk.0.ffn_down.bias" in tensor_names
    for key, ours in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("unknown_token_id", "unk_token_id"), ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{key}" in fields:
            c[ours] = fields[f"tokenizer.ggml.{key}"]
    return c


def hf_name(tensor: str, arch: str) -> str:
    """A GGUF tensor name -> its Hugging Face name (refused naming the tensor when not read)."""
    base, _, suffix = tensor.rpartition(".")
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    names = {**LAYER_NAMES, **ARCH_LAYER_NAMES.get("gemma" if arch.startswith("gemma") else arch, {})}
    parts = base.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or parts[2] not in names:
        raise ValueError(f"GGUF tensor {tensor!r} is not read by FlashSpec (it reads {sorted(TOP_NAMES)}, "
                         f"{ROPE_TENSORS.get(arch, ())} and blk.N.{sorted(names)} for {arch}): refused rather than "
                         "run without it")
    return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:  # [heads * D, K] -> [heads * D, K]
    """Undo llama.cpp's q/k row permutation (each head's rows interleaved as pairs), exactly as
    transformers' ``LlamaTensorProcessor._reverse_permute_weights``."""
    half = w.shape[0] // heads // 2
    return np.ascontiguousarray(w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape))


def state_dict(tensors: list, arch: str, config: dict, dequantize: Callable) -> dict[str, np.ndarray]:
    """The GGUF's tensors (gguf-py's ReaderTensor list) de-quantized to float32 under Hugging Face names."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    state: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if tensor.name in ROPE_TENSORS.get(arch, ()):
            continue  # read into the config (rope_parameters)
        name = hf_name(tensor.name, arch)
        w = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if arch == "llama" and (".attn_q." in tensor.name or ".attn_k." in tensor.name):
            w = unpermute_rows(w, heads if ".attn_q." in tensor.name else kv_heads)
        if arch.startswith("gemma") and tensor.name.endswith("norm.weight"):
            w = w - 1.0
        state[name] = np.ascontiguousarray(w)
    return state
