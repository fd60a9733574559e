"""FlashSpec's PyTorch backend: ``verify`` with a fused Triton kernel and a plain-torch reference."""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("flashspec_torch needs PyTorch and Triton: pip install 'flashspec[torch]'") from e

from .verify import KernelConfig, verify, verify_reference, verify_triton

__all__ = ["KernelConfig", "verify", "verify_reference", "verify_triton"]
