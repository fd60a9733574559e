"""Rotary position embedding frequencies of every supported ``rope_type`` (NumPy, float64 maths).

Both backends build their cos / sin tables from ``rope_frequencies``: angle ``p * inv_freq`` for
position ``p``, and cos / sin times ``attention_scaling`` (yarn, longrope; 1 otherwise). The formulas
are transformers' ``modeling_rope_utils`` (5.17) ones:

* ``default`` and ``dynamic``: ``theta ** (-2i / D)``. Dynamic NTK rescales only past
  ``max_position_embeddings``, where no backend goes (the context is capped there), so it is default.
* ``linear``: default / factor.
* ``llama3``: Llama 3.1's wavelength-banded scaling.
* ``yarn``: NTK-by-parts interpolation and the attention factor.
* ``longrope`` (Phi-3): the short factors, valid up to ``original_max_position_embeddings``, to which
  ``flashspec.families`` caps the context (transformers switches to the long factors past it).
"""

from __future__ import annotations

import math

import numpy as np

ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "yarn", "longrope")


def default_frequencies(theta: float, dim: int) -> np.ndarray:  # [dim/2] float64
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def llama3_frequencies(inv_freq: np.ndarray, s: dict) -> np.ndarray:  # [D/2] -> [D/2]
    original = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / s["low_freq_factor"], original / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    scaled = np.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return np.where(mid, (1 - smooth) * scaled / s["factor"] + smooth * scaled, scaled)


def yarn_frequencies(theta: float, dim: int, s: dict) -> tuple[np.ndarray, float]:  # ([D/2], attention factor)
    factor = s["factor"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s["original_max_position_embeddings"] / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq = (1 / (factor * pos)) * (1 - extrapolation) + (1 / pos) * extrapolation
    return inv_freq, float(attention)


def longrope_frequencies(theta: float, dim: int, s: dict, max_positions: int) -> tuple[np.ndarray, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_positions / original
    attention = s.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    short = np.asarray(s["short_factor"], dtype=np.float64)
    return 1.0 / (short * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), float(attention)


def rope_frequencies(rope_type: str, theta: float, dim: int, scaling: dict,
                     max_positions: int) -> tuple[np.ndarray, float]:  # ([dim/2] float32, attention scaling)
    """Inverse frequencies and the cos / sin scaling of ``rope_type`` with parameters ``scaling``."""
    if rope_type in ("default", "dynamic"):
        inv, attention = default_frequencies(theta, dim), 1.0
    elif rope_type == "linear":
        inv, attention = default_frequencies(theta, dim) / scaling["factor"], 1.0
    elif rope_type == "llama3":
        inv, attention = llama3_frequencies(default_frequencies(theta, dim), scaling), 1.0
    elif rope_type == "yarn":
        inv, attention = yarn_frequencies(theta, dim, scaling)
    elif rope_type == "longrope":
        inv, attention = longrope_frequencies(theta, dim, scaling, max_positions)
    else:
        raise ValueError(f"rope_type={rope_type!r} is not implemented; supported: {ROPE_TYPES}")
    return inv.astype(np.float32), attention
