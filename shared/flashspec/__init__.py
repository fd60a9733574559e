"""FlashSpec core: exact speculative decoding, backend-agnostic (NumPy and the standard library only).

Backends live in ``flashspec_torch`` and ``flashspec_jax``; nothing here imports them.
"""

from .config import SamplingConfig
from .contract import VerifyResult

__all__ = ["SamplingConfig", "VerifyResult"]
__version__ = "0.1.0"
