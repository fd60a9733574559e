"""Tensor parallelism for the torch target through ``torch.distributed``: one process per device
(``torchrun --nproc-per-node N``; NCCL on GPUs, gloo on the CPU), every rank holding 1/N of the
target and running the same engine loop on the same inputs (docs/tensor_parallel.md).

Megatron-style, with plain collectives:

* ``qkv`` and ``gate_up`` keep their rank's output rows (its heads' q, k and v; its share of the
  gate and up columns): plain ``nn.Linear`` modules of a local config (heads and the MLP width
  divided by N), no communication.
* ``o`` and ``down`` keep their rank's input columns (``RowParallelLinear``): partial products,
  summed by one all-reduce each, one per block half.
* The embedding and the LM head keep their rank's vocabulary rows: the embedding all-reduces a
  lookup that is zero outside the rank's rows (exact: one value plus zeros); the LM head
  all-gathers its logits' vocabulary shards, so verify and sampling run unchanged on whole rows.
* The KV cache is split by KV heads (the local config's ``num_kv_heads``); drafts other than the
  target itself are replicated.

On a GPU the collectives sit inside the captured step graphs (NCCL allows capture). The loop's
host-side arm choice is rank 0's, broadcast over a gloo group (``RankZeroPolicy``): a policy
rewarded by measured time would otherwise choose differently on different ranks.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from flashspec.config import LlamaConfig

from .model import Llama


def check_degree(config: LlamaConfig, n: int) -> None:
    """A clear error unless ``n`` ranks can split this config's heads, MLP and vocabulary evenly."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tensor_parallel={n!r} must be an int >= 1")
    for field in ("num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        size = getattr(config, field)
        if size % n:
            raise ValueError(f"tensor_parallel={n} must divide the target's {field} ({size}): pick a divisor of it")
    if n > 1 and config.kernel_blockers:
        raise ValueError(f"tensor_parallel={n}: the torch backend splits Llama-shaped targets only, not one with "
                         f"{config.kernel_blockers} (the JAX backend splits every family)")


def start(n: int, device: torch.device) -> tuple[int, torch.device]:
    """Join (or find) the process group of ``n`` ranks; returns (rank, this rank's device: cuda:LOCAL_RANK
    on a GPU). The group is the default one: started here from torchrun's environment when not yet."""
    if not dist.is_initialized():
        if "WORLD_SIZE" not in os.environ:
            raise ValueError(f"tensor_parallel={n} with the torch backend runs one process per device: launch with "
                             f"torchrun --nproc-per-node {n} (or start torch.distributed before the engine)")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != n:
        raise ValueError(f"tensor_parallel={n} but the process group has {dist.get_world_size()} ranks: "
                         f"launch with torchrun --nproc-per-node {n}")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
        torch.cuda.set_device(device)
    return dist.get_rank(), device


class RowParallelLinear(nn.Linear):
    """A projection whose input columns are split over the ranks: each rank's partial product,
    all-reduced, then the bias (held whole, added once)."""

    def __init__(self, full: nn.Linear, rank: int, world: int):
        cols = full.in_features // world
        super().__init__(cols, full.out_features, bias=full.bias is not None, device="meta")
        self.weight = nn.Parameter(full.weight[:, rank * cols : (rank + 1) * cols].contiguous(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in / N] -> [..., out]
        y = F.linear(x, self.weight)
        dist.all_reduce(y)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """The embedding's rows [rank V / N, (rank + 1) V / N): each rank looks up the tokens it holds
    (zeros for the others), then one all-reduce gives every rank the whole lookup."""

    def __init__(self, full: nn.Embedding, rank: int, world: int):
        super().__init__()
        rows = full.num_embeddings // world
        self.start, self.rows = rank * rows, rows
        self.weight = nn.Parameter(full.weight[self.start : self.start + rows].contiguous(), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, C]
        local = tokens - self.start
        mine = (local >= 0) & (local < self.rows)
        h = F.embedding(local.clamp(0, self.rows - 1), self.weight)
        h = torch.where(mine[..., None], h, torch.zeros((), dtype=h.dtype, device=h.device))
        dist.all_reduce(h)
        return h


class VocabParallelHead(nn.Linear):
    """The LM head's vocabulary rows of this rank; its logits' shards are all-gathered into whole rows."""

    def __init__(self, weight: nn.Parameter, world: int):
        super().__init__(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.weight, self.world = weight, world

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., C] -> [..., V]
        z = F.linear(x, self.weight).contiguous()  # [..., V / N]
        parts = torch.empty((self.world * z.shape[0], *z.shape[1:]), dtype=z.dtype, device=z.device)  # ranks along dim 0
        gather_into(parts, z)
        return parts.view(self.world, *z.shape).movedim(0, -2).reshape(*z.shape[:-1], self.world * z.shape[-1])


def gather_into(out: torch.Tensor, part: torch.Tensor) -> None:
    """All ranks' ``part`` concatenated along dim 0 into ``out``: ``all_gather_single`` where torch has it
    (2.13 deprecates ``all_gather_into_tensor``), else ``all_gather_into_tensor`` (torch 2.11 on the GPU machine)."""
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, part)


def rows(full: nn.Linear, index: torch.Tensor) -> nn.Linear:
    """An ``nn.Linear`` holding the output rows ``index`` of ``full``."""
    part = nn.Linear(full.in_features, len(index), bias=full.bias is not None, device="meta")
    part.weight = nn.Parameter(full.weight[index].contiguous(), requires_grad=False)
    if full.bias is not None:
        part.bias = nn.Parameter(full.bias[index].contiguous(), requires_grad=False)
    return part


def local_rows(config: LlamaConfig, rank: int, world: int, field: str) -> torch.Tensor:
    """The rows of ``qkv`` or ``gate_up`` this rank holds: its heads' q, k, v, or its gate and up columns."""
    d = config.head_dim
    sizes = ([config.num_heads * d, config.num_kv_heads * d, config.num_kv_heads * d] if field == "qkv"
             else [config.intermediate_size] * 2)
    parts, start = [], 0
    for size in sizes:
        share = size // world
        parts.append(torch.arange(start + rank * share, start + (rank + 1) * share))
        start += size
    return torch.cat(parts)


@torch.no_grad()
def shard_model(model: Llama, rank: int, world: int) -> Llama:
    """Split ``model`` in place into this rank's part (the module docstring); every rank must hold the
    same weights before. Its config becomes the local one (heads, KV heads, MLP width divided by N)."""
    c = model.config
    check_degree(c, world)
    if world == 1:
        return model
    for layer in model.layers:
        if any(type(m) is not nn.Linear for m in (layer.qkv, layer.o, layer.gate_up, layer.down)):
            raise ValueError(f"tensor_parallel={world}: the target's projections must be plain nn.Linear (not NF4)")
    local = dataclasses.replace(c, num_heads=c.num_heads // world, num_kv_heads=c.num_kv_heads // world,
                                intermediate_size=c.intermediate_size // world)
    qkv_rows, gate_up_rows = local_rows(c, rank, world, "qkv"), local_rows(c, rank, world, "gate_up")
    for layer in model.layers:
        layer.c = local
        layer.qkv, layer.gate_up = rows(layer.qkv, qkv_rows), rows(layer.gate_up, gate_up_rows)
        layer.o, layer.down = RowParallelLinear(layer.o, rank, world), RowParallelLinear(layer.down, rank, world)
    tied = model.lm_head.weight is model.embed.weight
    head = model.lm_head.weight
    model.embed = VocabParallelEmbedding(model.embed, rank, world)
    if tied:
        model.lm_head = VocabParallelHead(model.embed.weight, world)
    else:
        rows_v = c.vocab_size // world
        model.lm_head = VocabParallelHead(nn.Parameter(head[rank * rows_v : (rank + 1) * rows_v].contiguous(),
                                                       requires_grad=False), world)
    model.config = local
    return model


def is_split(model: Llama) -> bool:
    """Whether ``shard_model`` split ``model`` over several ranks."""
    return isinstance(model.embed, VocabParallelEmbedding)


class RankZeroPolicy:
    """A draft-selection policy whose choices are rank 0's, broadcast to every rank over a gloo group
    (host memory: no device sync); every rank observes its own steps, only rank 0's choices count."""

    def __init__(self, policy, group):
        self.policy, self.group = policy, group
        self.arm = torch.zeros(1, dtype=torch.int64)

    def choose(self) -> int:
        self.arm[0] = self.policy.choose()
        dist.broadcast(self.arm, 0, group=self.group)
        return int(self.arm[0])

    def observe(self, arm: int, drafted: int, accepted: int, seconds: float) -> None:
        self.policy.observe(arm, drafted, accepted, seconds)
