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


ACTIVATIONS = ("silu", "gelu_tanh")
# family features the GPU layer kernels (flashspec_torch/kernels, flashspec_torch/gemv) do not implement:
# a model using one runs the plain torch layers (see LlamaConfig.kernel_blockers)
KERNEL_BLOCKERS = ("attention_bias", "o_bias", "mlp_bias", "qk_norm", "sliding_windows", "attn_softcap", "final_softcap",
                   "norm_offset", "activation", "sandwich_norms", "query_scale")


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-shaped decoder and the family differences as data (``flashspec.families`` reads them
    from Hugging Face configs): Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3, Phi-3."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_type: str = "default"  # flashspec.rope.ROPE_TYPES
    rope_scaling: tuple[tuple[str, object], ...] | None = None  # rope_type's parameters (factor, ...)
    local_rope_theta: float | None = None  # Gemma 3: sliding layers use default RoPE with this theta
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    attention_bias: bool = False  # q, k, v projections have biases (Qwen2, Llama attention_bias)
    o_bias: bool = False  # the output projection has a bias (Llama attention_bias)
    mlp_bias: bool = False  # gate, up, down have biases (Llama mlp_bias)
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    sliding_windows: tuple[int, ...] = ()  # per layer: attend to the last w positions (0: all); (): all layers full
    embed_scale: float = 1.0  # embeddings times this, rounded to the activation dtype (Gemma: sqrt(hidden))
    attn_softcap: float = 0.0  # scores -> c tanh(scores / c) before the softmax (Gemma 2); 0: off
    final_softcap: float = 0.0  # logits -> c tanh(logits / c) (Gemma 2); 0: off
    norm_offset: float = 0.0  # RMSNorm multiplies by (offset + weight) (Gemma: 1)
    activation: str = "silu"  # the gated MLP's activation: ACTIVATIONS
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs too (Gemma 2/3)
    query_scale: float = 0.0  # attention scores times this (Gemma: query_pre_attn_scalar ** -0.5); 0: head_dim ** -0.5

    def __post_init__(self):
        from .rope import ROPE_TYPES

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads=} must be a multiple of {self.num_kv_heads=}")
        if self.head_dim % 2:
            raise ValueError(f"{self.head_dim=} must be even (RoPE rotates pairs)")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type={self.rope_type!r} must be one of {ROPE_TYPES}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} must be one of {ACTIVATIONS}")
        if self.sliding_windows and (len(self.sliding_windows) != self.num_layers or min(self.sliding_windows) < 0):
            raise ValueError(f"sliding_windows={self.sliding_windows} must hold one window >= 0 per layer "
                             f"({self.num_layers}), or be empty")

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window (0: it attends to every earlier position)."""
        return self.sliding_windows[layer] if self.sliding_windows else 0

    def local_rope(self, layer: int) -> bool:
        """Whether layer ``layer`` uses the local (sliding layers') RoPE table (Gemma 3)."""
        return self.local_rope_theta is not None and self.window(layer) > 0

    def rope(self, local: bool = False):  # ([D/2] float32 inverse frequencies, cos / sin scaling)
        from .rope import rope_frequencies

        if local:
            return rope_frequencies("default", self.local_rope_theta, self.head_dim, {}, self.max_position_embeddings)
        return rope_frequencies(self.rope_type, self.rope_theta, self.head_dim, dict(self.rope_scaling or ()),
                                self.max_position_embeddings)

    @property
    def kernel_blockers(self) -> tuple[str, ...]:
        """The fields set here that the GPU layer kernels do not implement (empty: a plain Llama)."""
        return tuple(name for name in KERNEL_BLOCKERS if getattr(self, name) != self.__dataclass_fields__[name].default)

    @classmethod
    def from_hf(cls, hf) -> "LlamaConfig":
        """From a transformers config object (or its dict) of a supported family; every field that
        changes the forward is either read or refused (``flashspec.families``)."""
        from .families import config_kwargs

        return cls(**config_kwargs(hf if isinstance(hf, dict) else hf.to_dict()))
