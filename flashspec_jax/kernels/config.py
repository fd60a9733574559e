"""Static tuning of the Pallas verify kernels: ``VerifyKernelConfig`` (tile sizes, warps, the split of V
into chunks), the default ``choose_config``, and ``Chunking``. Instruction counts and timings behind
the default: docs/kernel_notes.md ("Pallas (JAX) and FlashInfer")."""

from __future__ import annotations

import dataclasses

from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def is_power_of_2(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


@dataclasses.dataclass(frozen=True)
class VerifyKernelConfig:
    """Tile sizes, warps and chunking of the two kernels (``choose_config``: the default for a shape).
    Every value gives the same tokens; only the speed changes."""

    block_v: int = 4096  # normaliser tile: logits of one row per loop step, loaded as [block_v // vec, vec]
    sweep_v: int = 1024  # row-n sweep tile (at most block_v)
    vec: int = 8  # logits per vector of the normaliser: 16 bytes / itemsize
    num_warps: int = 8
    num_stages: int = 2
    min_programs: int = 264  # split V until B * NV reaches this (2 waves of 132 SMs)
    # The sweep passes over tiles whose keys cannot win when a program's chunk holds at least this many
    # sweep tiles (0: always; float("inf"): never).
    prune_tiles: float = 7.5

    def __post_init__(self):
        if self.block_v < 16 or not is_power_of_2(self.block_v):
            raise ValueError(f"{self.block_v=} must be a power of 2 >= 16")
        if self.sweep_v < 16 or not is_power_of_2(self.sweep_v) or self.sweep_v > self.block_v:
            raise ValueError(f"{self.sweep_v=} must be a power of 2 in [16, block_v]")
        if self.vec not in (1, 2, 4, 8, 16) or self.vec > self.block_v // 2:
            raise ValueError(f"{self.vec=} must be a power of 2 <= 16 and <= block_v / 2")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self.num_warps=} must be one of 1, 2, 4, 8, 16")
        if self.num_stages < 1:
            raise ValueError(f"{self.num_stages=} must be >= 1")
        if self.min_programs < 1:
            raise ValueError(f"{self.min_programs=} must be >= 1")
        if not self.prune_tiles >= 0:
            raise ValueError(f"{self.prune_tiles=} must be >= 0 (0: always prune, inf: never)")

    def compiler_params(self) -> plt.CompilerParams:
        return plt.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)

    def prunes(self, vocab: int, chunking: "Chunking") -> bool:
        """Whether the sweep of a V-logit row split as ``chunking`` passes over hopeless tiles."""
        return vocab / chunking.num_chunks / self.sweep_v >= self.prune_tiles


SMS = 132  # H200


def choose_config(batch: int, gamma: int, vocab: int, itemsize: int, interpret: bool = False) -> VerifyKernelConfig:
    """The default, as the torch kernels' choose_config on the H200: 8 warps below B=128, else 4; 8 KB
    normaliser tiles of 16-byte vectors; 1024-logit sweep tiles; ~16 programs per SM; pruning from
    ~8 sweep tiles per program. Interpret mode: a few small programs (they run one after the other
    there), pruning always on."""
    del gamma
    vec = max(1, 16 // itemsize)
    if interpret:
        return VerifyKernelConfig(block_v=256, sweep_v=128, vec=vec, num_warps=4, min_programs=1, prune_tiles=0.0)
    wanted = min(pl.cdiv(16 * SMS, batch), 128 if batch < 8 else 32)  # chunks of V per batch row
    warps = 8 if batch < 128 else 4
    lanes_min = 32 * warps * vec  # a 16-byte vector for each thread
    block_v = min(8192 // itemsize, max(lanes_min, pl.next_power_of_2(pl.cdiv(vocab, wanted))))
    return VerifyKernelConfig(block_v=block_v, sweep_v=min(1024, block_v), vec=vec, num_warps=warps,
                              min_programs=batch * wanted)


@dataclasses.dataclass(frozen=True)
class Chunking:
    """V split into ``num_chunks`` chunks of ``blocks`` tiles of ``block`` entries."""

    block: int
    blocks: int
    num_chunks: int

    @classmethod
    def make(cls, batch: int, vocab: int, block: int, min_programs: int) -> "Chunking":
        block = min(block, max(16, pl.next_power_of_2(vocab)))
        tiles = pl.cdiv(vocab, block)
        wanted = min(tiles, max(1, pl.cdiv(min_programs, batch)))
        blocks = pl.cdiv(tiles, wanted)
        return cls(block, blocks, pl.cdiv(tiles, blocks))
