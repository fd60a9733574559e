"""Tiny GGUF files of every supported family, written as llama.cpp's ``convert_hf_to_gguf.py`` writes
them, from the tiny transformers models of ``flashspec.family_cases`` (tests/torch/test_gguf_families.py,
benchmarks/families_table.py). Needs torch, transformers and gguf, imported when called.

The converter's conventions reproduced here (F32 tensors only):

* architecture names: ``llama`` (Llama and Mistral; ``general.name`` says "mistral"), ``qwen2``,
  ``qwen3``, ``gemma2``, ``gemma3``, ``phi3``;
* Llama / Mistral: the rows of ``attn_q`` / ``attn_k`` permuted per head (pairs interleaved), Llama 3's
  RoPE as a ``rope_freqs`` tensor of per-frequency divisors, Mistral's window as
  ``llama.attention.sliding_window``;
* Gemma: every ``*norm.weight`` stored plus one (the file holds the multiplier, not the offset), the
  soft-capping keys (Gemma 2), the window, a per-layer ``attention.sliding_window_pattern`` where the
  layer types are not llama.cpp's default, linear RoPE scaling as ``rope.scaling.type`` / ``.factor``;
* Phi-3: the fused ``attn_qkv`` and ``ffn_up`` (gate and up rows) tensors; longrope as the
  ``rope_factors_short`` / ``rope_factors_long`` tensors, ``rope.scaling.original_context_length`` and
  ``rope.scaling.attn_factor`` (sqrt(1 + ln(context / original) / ln(original))).

The tokenizer is a ``gpt2`` (byte-level BPE) one: 255 byte tokens and one merge (two spaces).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .family_cases import hf_model

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
        "gemma3_text": "gemma3", "phi3": "phi3"}
# fields of a family's case llama.cpp cannot write: Gemma's query scale is 1/sqrt(key_length) there
# and Qwen3's head_dim is transformers' default (its GGUF reader does not read attention.key_length for
# qwen3); Phi-3 with its longrope (an original context of 128: prompt + 64 tokens stay on the short factors)
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 128,
                 "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                 "long_factor": [1.0, 2.0, 4.0, 6.0, 8.0, 9.0, 9.5, 10.0]}
GGUF_FIELDS = {"gemma2": dict(query_pre_attn_scalar=16), "gemma3_text": dict(query_pre_attn_scalar=16),
               "qwen3": dict(head_dim=128), "phi3": dict(rope_parameters=PHI3_LONGROPE)}
LAYER_NAMES = {  # Hugging Face names under model.layers.N. -> GGUF names under blk.N.
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def permute(w: np.ndarray, heads: int) -> np.ndarray:  # [heads * D, K] -> [heads * D, K]
    """llama.cpp's ``LlamaModel.permute``: each head's rows reordered from halves to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str, gemma: bool) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, _, suffix = hf_name.rpartition(".")
    if base in top:
        return f"{top[base]}.{suffix}"
    _, _, layer, short = base.split(".", 3)
    names = {**LAYER_NAMES, **(GEMMA_NORMS if gemma else {"post_attention_layernorm": "ffn_norm"})}
    return f"blk.{layer}.{names[short]}.{suffix}"


def write_metadata(w, model_type: str, c) -> None:
    """The keys llama.cpp's converter writes for ``model_type`` from the transformers config ``c``."""
    from gguf import RopeScalingType

    w.add_name(f"{model_type}-tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if model_type in ("llama", "mistral", "phi3"):
        w.add_rope_dimension_count(c.head_dim)
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if model_type.startswith("gemma"):
        if model_type == "gemma2":
            w.add_attn_logit_softcapping(c.attn_logit_softcapping)
            w.add_final_logit_softcapping(c.final_logit_softcapping)
        else:  # llama.cpp's default Gemma 3 pattern is 5 sliding layers, then a full one
            w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
            w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
        w.add_sliding_window(c.sliding_window)
    elif getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)


def write_tokenizer(w, vocab: int) -> None:
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())[:vocab - 1] + ["ĠĠ"]  # one merge: readers need one
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["Ġ Ġ"])
    w.add_pad_token_id(0)


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:  # [head_dim / 2] float32
    """``rope_freqs`` as llama.cpp's ``LlamaModel.generate_extra_tensors`` computes it for rope_type llama3."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def save_gguf_case(model_type: str, path: Path, seed: int = 0):
    """Write ``path`` (a .gguf) from the tiny model of ``model_type``; returns the transformers model."""
    from gguf import GGUFWriter

    hf = hf_model(model_type, seed, **GGUF_FIELDS.get(model_type, {}))
    c, gemma = hf.config, model_type.startswith("gemma")
    w = GGUFWriter(str(path), ARCH[model_type])
    write_metadata(w, model_type, c)
    write_tokenizer(w, c.vocab_size)
    rope = c.rope_parameters
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, c.head_dim))
    if rope.get("rope_type") == "longrope":
        original = rope["original_max_position_embeddings"]
        scale = c.max_position_embeddings / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().numpy().astype(np.float32)
        if gemma and name.endswith("norm.weight"):
            a = a + 1.0
        if ARCH[model_type] == "llama" and (".q_proj." in name or ".k_proj." in name):
            a = permute(a, c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads)
        w.add_tensor(gguf_name(name, gemma), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf
