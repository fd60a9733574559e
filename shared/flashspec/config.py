"""Frozen, validated configuration objects: sampling, and the Llama-family model shape both backends build."""

from __future__ import annotations

import sys
from dataclasses import dataclass


MIN_TEMPERATURE = 1e-6  # below it z / T overflows float32 for ordinary logits; use 0 for greedy
MAX_TEMPERATURE = 3.4028234663852886e38  # float32's largest finite value: every backend scales z / T in float32


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are sampled: temperature, then top-k, then top-p (nucleus).

    ``temperature == 0`` means greedy; ``top_k == 0`` and ``top_p == 1.0`` mean off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= sys.float_info.max:
            raise ValueError(
                f"temperature={t!r} must be a finite number >= 0 (0 means greedy)"
            )
        if t > MAX_TEMPERATURE:
            raise ValueError(f"temperature={t!r} must be at most {MAX_TEMPERATURE} (float32's largest value: z / T is "
                             "computed in float32)")
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature={t!r} must be 0 (greedy) or >= {MIN_TEMPERATURE}: "
                             "smaller ones overflow z / T in float32")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k={k!r} must be an integer >= 0 (0 means off)")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p={p!r} must be a number in (0, 1] (1.0 means off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, float], ...] | None = None  # llama3: factor, low/high_freq_factor, original_max
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads=} must be a multiple of {self.num_kv_heads=}")
        if self.head_dim % 2:
            raise ValueError(f"{self.head_dim=} must be even (RoPE rotates pairs)")

    @classmethod
    def from_hf(cls, hf) -> "LlamaConfig":
        """From a transformers LlamaConfig (or its dict)."""
        c = hf if isinstance(hf, dict) else hf.to_dict()
        if c.get("model_type") not in (None, "llama", "mistral"):
            raise ValueError(f"model_type={c.get('model_type')!r} is not a Llama-family model")
        heads = c["num_attention_heads"]
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        scaling = None
        if rope.get("rope_type", rope.get("type", "default")) == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            scaling = tuple((k, float(rope[k])) for k in keys)
        eos = c.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
            bos_token_id=c.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
