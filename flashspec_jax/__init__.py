"""FlashSpec's JAX backend: ``verify`` with a fused Pallas kernel (``impl="pallas"``) and a jnp
reference (``impl="reference"``), bit-compatible randomness with every other backend."""

try:
    import jax  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "flashspec_jax needs JAX: pip install 'flashspec[jax]' (and jax[cuda13] for the GPU kernels)"
    ) from e

from flashspec_jax.verify import verify

__all__ = ["verify"]
