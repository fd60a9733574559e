"""Hugging Face configs of the supported families -> ``LlamaConfig`` keyword arguments, and the guard list.

Every key of a config either (a) never changes the forward (``HARMLESS``), (b) is read into a
``LlamaConfig`` field, or (c) is refused with a ValueError naming the key, its value and what is
supported. A key this module does not know is refused too: a model whose config grew a feature is
never run silently without it. ``GUARDS`` lists, one row per field, what the test
(tests/core/test_families_guards.py) checks against transformers: the field set to a non-default
value either gives transformers' logits or raises.
"""

from __future__ import annotations

import math

from .rope import ROPE_TYPES

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
# keys of any transformers config that do not change an inference forward (dropouts are off at inference)
HARMLESS = frozenset({
    "architectures", "output_hidden_states", "return_dict", "dtype", "torch_dtype", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "initializer_range", "use_cache", "pad_token_id",
    "transformers_version", "_name_or_path", "name_or_path", "output_attentions", "attention_dropout", "resid_pdrop",
    "embd_pdrop", "model_type", "tokenizer_class", "pretraining_tp", "initializer_factor", "cache_implementation",
    "_sliding_window_pattern", "sliding_window_pattern", "max_window_layers", "use_sliding_window", "tf_legacy_loss",
    "use_bfloat16", "torchscript", "quantization_config", "prefix", "finetuning_task", "task_specific_params", "bos_token_id",
    "eos_token_id", "original_max_position_embeddings", "_model_name_or_path", "sep_token_id",
    "decoder_start_token_id", "_attn_implementation", "_attn_implementation_autoset", "tie_encoder_decoder",
    "output_scores", "return_dict_in_generate", "use_return_dict",
    # generation settings some configs carry: FlashSpec takes its own (--temperature, ...)
    "max_length", "min_length", "do_sample", "temperature", "top_p", "top_k", "num_beams", "repetition_penalty",
})
# keys read below (beside HARMLESS); any other key is refused
READ = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "rope_local_base_freq", "tie_word_embeddings", "max_position_embeddings", "hidden_act", "hidden_activation",
    "attention_bias", "mlp_bias", "sliding_window", "layer_types", "attn_logit_softcapping",
    "final_logit_softcapping", "query_pre_attn_scalar", "use_bidirectional_attention", "partial_rotary_factor",
})
ACTIVATION_NAMES = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
ROPE_KEYS = {  # the parameters each rope_type reads (beside rope_type and rope_theta)
    "default": set(), "dynamic": {"factor"}, "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "longrope": {"short_factor", "long_factor", "factor", "original_max_position_embeddings", "attention_factor"},
}
GEMMA = ("gemma2", "gemma3_text")

# (model_type, field, a non-default value, "implemented" | "refused"): the guard test's list
GUARDS = (
    ("llama", "attention_bias", True, "implemented"),
    ("llama", "mlp_bias", True, "implemented"),
    ("llama", "head_dim", 32, "implemented"),
    ("llama", "tie_word_embeddings", True, "implemented"),
    ("llama", "rms_norm_eps", 1e-2, "implemented"),
    ("llama", "hidden_act", "gelu_pytorch_tanh", "implemented"),
    ("llama", "hidden_act", "relu", "refused"),
    ("llama", "rope_parameters", {"rope_type": "linear", "factor": 4.0}, "implemented"),
    ("llama", "rope_parameters", {"rope_type": "dynamic", "factor": 4.0}, "implemented"),
    ("llama", "rope_parameters", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, "implemented"),
    ("llama", "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
     "implemented"),
    ("llama", "rope_parameters", {"rope_type": "longrope", "short_factor": [1.5] * 8, "long_factor": [3.0] * 8,
                                  "original_max_position_embeddings": 64}, "implemented"),
    ("llama", "rope_parameters", {"rope_type": "default", "partial_rotary_factor": 0.5}, "refused"),
    ("llama", "quantization_config", {"quant_method": "gptq"}, "refused"),
    ("mistral", "sliding_window", 8, "implemented"),
    ("qwen2", "use_sliding_window", True, "implemented"),
    ("qwen2", "tie_word_embeddings", True, "implemented"),
    ("qwen3", "attention_bias", True, "implemented"),
    ("qwen3", "use_sliding_window", True, "implemented"),
    ("gemma2", "attn_logit_softcapping", 2.0, "implemented"),
    ("gemma2", "final_logit_softcapping", 1.5, "implemented"),
    ("gemma2", "query_pre_attn_scalar", 64, "implemented"),
    ("gemma2", "sliding_window", 8, "implemented"),
    ("gemma2", "attention_bias", True, "implemented"),
    ("gemma3_text", "sliding_window", 8, "implemented"),
    ("gemma3_text", "rope_parameters", {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, "implemented"),
    ("gemma3_text", "use_bidirectional_attention", True, "refused"),
    ("phi3", "rope_parameters", {"rope_type": "longrope", "short_factor": [1.5] * 8, "long_factor": [3.0] * 8,
                                 "original_max_position_embeddings": 64}, "implemented"),
    ("phi3", "sliding_window", 16, "implemented"),
    ("phi3", "partial_rotary_factor", 0.5, "refused"),
)


def refuse(model_type: str, key: str, value, supported: str) -> ValueError:
    return ValueError(f"{model_type} config field {key}={value!r} is not supported by FlashSpec ({supported}); "
                      "running it without would give a different model, so it is refused")


def check_keys(c: dict, model_type: str) -> None:
    """Refuse any key that is neither harmless nor read, and the read ones at a value not implemented."""
    for key, value in c.items():
        if key not in HARMLESS and key not in READ and not key.endswith(("_token_id", "_token_ids")):  # tokenizer ids
            raise refuse(model_type, key, value, "it reads the fields of flashspec.families.READ and ignores only "
                         "those of flashspec.families.HARMLESS, known not to change the forward")
    quant = c.get("quantization_config")
    if quant is not None and (quant.get("quant_method") if isinstance(quant, dict) else quant) != "gguf":
        raise refuse(model_type, "quantization_config", quant, "float weights, or a GGUF that transformers de-quantized")
    if c.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        raise refuse(model_type, "partial_rotary_factor", c["partial_rotary_factor"], "1.0: RoPE on the whole head")
    if c.get("use_bidirectional_attention"):
        raise refuse(model_type, "use_bidirectional_attention", c["use_bidirectional_attention"], "causal attention only")
    if model_type not in GEMMA:
        for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
            if c.get(key) is not None:
                raise refuse(model_type, key, c[key], "Gemma 2/3 only")


def rope_entry(model_type: str, rope: dict, key: str = "rope_parameters") -> tuple[str, tuple]:
    """One rope_parameters dict -> (rope_type, parameters) with every key checked."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise refuse(model_type, f"{key}.rope_type", rope_type, f"rope types {ROPE_TYPES}")
    if rope.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        raise refuse(model_type, f"{key}.partial_rotary_factor", rope["partial_rotary_factor"], "1.0")
    allowed = ROPE_KEYS[rope_type] | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    for k, v in rope.items():
        if k not in allowed:
            raise refuse(model_type, f"{key}.{k}", v, f"{rope_type} RoPE reads {sorted(ROPE_KEYS[rope_type])}")
    params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(rope.items())
                   if k in ROPE_KEYS[rope_type] and v is not None)
    return rope_type, params


def rope_fields(c: dict, model_type: str) -> dict:
    """rope_theta, rope_type, rope_scaling, local_rope_theta and max_position_embeddings."""
    rope = dict(c.get("rope_parameters") or {})
    legacy = c.get("rope_scaling") or {}
    local_theta = None
    if model_type == "gemma3_text":
        full = dict(rope.get("full_attention") or {})
        full.update(legacy)
        local = dict(rope.get("sliding_attention") or {"rope_type": "default"})
        if local.get("rope_type", local.get("type", "default")) != "default" or set(local) - {"rope_type", "type", "rope_theta"}:
            raise refuse(model_type, "rope_parameters.sliding_attention", local, "default RoPE on the sliding layers")
        local_theta = float(local.get("rope_theta", c.get("rope_local_base_freq", 10000.0)))
        rope, default_theta = full, 1_000_000.0
    else:
        rope.update(legacy)
        default_theta = 10000.0
    if c.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", c["partial_rotary_factor"])
    theta = float(rope.get("rope_theta", c.get("rope_theta", default_theta)))
    rope_type, params = rope_entry(model_type, rope)
    context = int(c.get("max_position_embeddings", 4096))
    if rope_type == "longrope":
        original = dict(params).get("original_max_position_embeddings") or c.get("original_max_position_embeddings")
        if original is None:
            raise refuse(model_type, "rope_parameters", rope, "longrope with original_max_position_embeddings")
        params = tuple(sorted({**dict(params), "original_max_position_embeddings": int(original)}.items()))
        params = tuple(sorted({"factor": dict(params).get("factor") or context / original, **dict(params)}.items()))
        context = min(context, int(original))  # past it transformers switches to the long factors
    return {"rope_theta": theta, "rope_type": rope_type, "rope_scaling": params or None,
            "local_rope_theta": local_theta, "max_position_embeddings": context}


def sliding_windows(c: dict, model_type: str, layers: int) -> tuple[int, ...]:
    """Per layer: the window of a sliding layer, 0 for a full one (transformers' layer_types rules)."""
    window = c.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
        window = None
    if not window:
        return ()
    types = c.get("layer_types")
    if types is None:
        if model_type in ("qwen2", "qwen3"):
            start = c.get("max_window_layers", 28)
            types = ["sliding_attention" if i >= start else "full_attention" for i in range(layers)]
        elif model_type == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
        elif model_type == "gemma3_text":
            pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        else:  # mistral, phi3: every layer
            types = ["sliding_attention"] * layers
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise refuse(model_type, "layer_types", types, f"{layers} entries of sliding_attention / full_attention")
    windows = tuple(int(window) if t == "sliding_attention" else 0 for t in types)
    return windows if any(windows) else ()


def activation(c: dict, model_type: str) -> str:
    key = "hidden_activation" if model_type in GEMMA and c.get("hidden_activation") else "hidden_act"
    default = "gelu_pytorch_tanh" if model_type in GEMMA else "silu"
    name = c.get(key) or default
    if name not in ACTIVATION_NAMES:
        raise refuse(model_type, key, name, f"activations {sorted(ACTIVATION_NAMES)}")
    return ACTIVATION_NAMES[name]


def family_fields(c: dict, model_type: str, hidden: int) -> dict:
    """The per-family structure: biases, q/k norms, Gemma's norms, scales and soft-capping."""
    bias = bool(c.get("attention_bias", False))
    out = {"attention_bias": bias or model_type == "qwen2", "o_bias": bias and model_type != "qwen2",
           "mlp_bias": bool(c.get("mlp_bias", False)), "qk_norm": model_type in ("qwen3", "gemma3_text")}
    if model_type == "qwen2" and bias:
        raise refuse(model_type, "attention_bias", bias, "Qwen2's fixed biases: q, k, v with, o without")
    if out["mlp_bias"] and model_type != "llama":
        raise refuse(model_type, "mlp_bias", True, "Llama only")
    if model_type in GEMMA:
        scalar = c.get("query_pre_attn_scalar") or 256
        out.update(embed_scale=math.sqrt(hidden), norm_offset=1.0, sandwich_norms=True, query_scale=scalar ** -0.5,
                   attn_softcap=float(c.get("attn_logit_softcapping") or 0.0),
                   final_softcap=float(c.get("final_logit_softcapping") or 0.0))
    return out


def config_kwargs(c: dict) -> dict:
    """A transformers config dict of a supported family -> LlamaConfig's keyword arguments."""
    model_type = c.get("model_type", "llama")
    if model_type not in FAMILIES and model_type is not None:
        raise ValueError(f"model_type={model_type!r} is not supported; FlashSpec runs {FAMILIES}"
                         + (" (Gemma 3: use the text model, model_type gemma3_text)" if model_type == "gemma3" else ""))
    model_type = model_type or "llama"
    check_keys(c, model_type)
    heads, layers, hidden = c["num_attention_heads"], c["num_hidden_layers"], c["hidden_size"]
    eos = c.get("eos_token_id")
    return dict(
        vocab_size=c["vocab_size"], hidden_size=hidden, intermediate_size=c["intermediate_size"], num_layers=layers,
        num_heads=heads, num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or hidden // heads, rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", model_type in GEMMA)),
        bos_token_id=c.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,)),
        activation=activation(c, model_type), sliding_windows=sliding_windows(c, model_type, layers),
        **rope_fields(c, model_type), **family_fields(c, model_type, hidden),
    )
