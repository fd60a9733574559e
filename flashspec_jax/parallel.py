"""Tensor parallelism for the JAX target: a ``jax.sharding.Mesh`` with one ``tp`` axis, the weights
placed on it Megatron-style with ``NamedSharding``, and XLA's SPMD partitioner inserting the
collectives (docs/tensor_parallel.md).

* ``qkv`` and ``gate_up`` are split by output rows: each device holds its heads' q, k and v and
  its share of the MLP's gate and up columns. Their fused rows are first put in shard-major order
  (``shard_major``), so that a contiguous split gives each device whole heads and matching gate /
  up columns; ``model.block`` reads them back with ``shards`` = N.
* ``o`` and ``down`` are split by input columns: their products are partial sums, which XLA
  all-reduces, one all-reduce per block half.
* The embedding and the LM head are split over the vocabulary; ``Llama.head_logits`` gathers the
  logits' vocabulary shards, so verify and sampling run unchanged on whole rows.
* The KV cache is split by KV heads (``Llama.new_cache``); norms and biases after a reduction are
  replicated, and so is every draft model and draft head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from flashspec.config import LlamaConfig

from .model import Llama, layer_shapes

AXIS = "tp"
SPLIT = {  # each stacked weight's PartitionSpec ([L, ...] for the layers); a weight not named is replicated
    "qkv": (None, AXIS, None), "qkv_bias": (None, AXIS), "gate_up": (None, AXIS, None), "gate_up_bias": (None, AXIS),
    "o": (None, None, AXIS), "down": (None, None, AXIS), "embed": (AXIS, None), "lm_head": (AXIS, None),
}


def check_degree(config: LlamaConfig, n: int, devices: int) -> None:
    """A clear error unless ``n`` devices can split this config's heads, MLP and vocabulary evenly."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tensor_parallel={n!r} must be an int >= 1")
    if n > devices:
        raise ValueError(f"tensor_parallel={n} needs {n} devices but JAX sees {devices} of this platform "
                         "(on the CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)")
    for field in ("num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        size = getattr(config, field)
        if size % n:
            raise ValueError(f"tensor_parallel={n} must divide the target's {field} ({size}): pick a divisor of it")


def make_mesh(n: int, platform: str) -> Mesh:
    """A one-axis mesh (``tp``) over the first ``n`` devices of ``platform``."""
    return Mesh(np.array(jax.devices(platform)[:n]), (AXIS,))


def shard_major(config: LlamaConfig, n: int, field: str) -> np.ndarray:
    """The row order of ``qkv`` or ``gate_up`` (and their biases) in which N contiguous blocks are
    the N devices' parts: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] and [gate_0 up_0 | gate_1 up_1 | ...]."""
    d = config.head_dim
    if field.startswith("qkv"):
        sizes = [config.num_heads * d, config.num_kv_heads * d, config.num_kv_heads * d]
    else:
        sizes = [config.intermediate_size] * 2
    starts = np.cumsum([0, *sizes[:-1]])
    return np.concatenate([np.arange(a + s * k // n, a + (s + 1) * k // n) for s in range(n)
                           for a, k in zip(starts, sizes)])


def shard_model(model: Llama, mesh: Mesh) -> Llama:
    """A copy of ``model`` with its weights split over ``mesh`` (the module docstring); ``model``
    itself is left as it was."""
    n = mesh.shape[AXIS]
    check_degree(model.config, n, mesh.devices.size)
    graphdef, state = nnx.split(model)
    out = nnx.merge(graphdef, state, copy=True)
    out.mesh = mesh
    names = [*layer_shapes(model.config), "embed", "norm"] + ([] if model.lm_head is None else ["lm_head"])
    for name in names:
        param = getattr(out, name)
        a = param.get_value()
        if name.startswith(("qkv", "gate_up")):
            a = jnp.take(a, jnp.asarray(shard_major(model.config, n, name)), axis=1)
        param.set_value(jax.device_put(a, NamedSharding(mesh, PartitionSpec(*SPLIT.get(name, ())))))
    return out


def replicate(tree, mesh: Mesh):
    """Every array of ``tree`` (a draft's weights) copied to every device of ``mesh``."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))
