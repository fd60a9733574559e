"""Static tuning of the Pallas verify kernels: ``VerifyKernelConfig``, the default ``choose_config``, and
the split of V into chunks (``Chunking``). Instruction counts behind the default: docs/kernel_notes.md
("Pallas (JAX) and FlashInfer") and ``benchmarks/verify_sass_jax.py``."""

from __future__ import annotations

import dataclasses

from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


@dataclasses.dataclass(frozen=True)
class VerifyKernelConfig:
    """Static tuning of the two kernels (``choose_config``: the default for a shape)."""

    block_v: int = 2048  # vocabulary tile of the normaliser (entries of one row per loop step)
    num_warps: int = 8
    num_stages: int = 2
    min_programs: int = 264  # split V until B * NV reaches this (2 waves of 132 SMs)
    loops: str = "tile"  # "tile" (a reduction per tile) or "lanes" (per-thread state, exp2 / lg2; lanes.py)
    sweep_v: int = 0  # vocabulary tile of the row-n sweep (0: block_v); must divide block_v
    vec: int = 0  # lanes normaliser: logits per vector, 16 bytes / itemsize (0: a (max, sum) per logit slot)
    prefetch: bool = False  # lanes: the loops load tile j + 1 before the arithmetic of tile j
    prune: bool = False  # lanes: the sweep passes over tiles whose keys cannot win (exact)
    # The accept test inside the final kernel (final.final_decide): each program recombines the row
    # normalisers, tests x_1..x_G, finds n and the FINAL key in its prologue, so T > 0 is two
    # pallas_calls (three with draft stats) and a small jnp epilogue; False: the jnp glue between
    # row_stats and final_draw (one XLA op each). Greedy (T = 0) ignores it.
    prologue: bool = False
    # One launch for T > 0 (kernels/single.py): both phases in one grid, synchronised per batch row through
    # an atomic counter; needs prologue=True and B x chunks <= the SM count (every program resident).
    single: bool = False
    # With prologue=True: the last final_decide program of each row to arrive at a counter (zeroed by row_stats)
    # reduces the row's sweep partials and writes its tokens (``final.finish_row``), instead of the XLA epilogue
    # (``pick_draw`` and ``emit``: two launches a step). Not the default until timed on the GPU.
    finish: bool = False

    def __post_init__(self):
        if self.loops not in ("tile", "lanes"):
            raise ValueError(f"{self.loops=} must be 'tile' or 'lanes'")
        if self.block_v < 16 or self.block_v & (self.block_v - 1):
            raise ValueError(f"{self.block_v=} must be a power of 2 >= 16")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self.num_warps=} must be one of 1, 2, 4, 8, 16")
        if self.num_stages < 1:
            raise ValueError(f"{self.num_stages=} must be >= 1")
        if self.min_programs < 1:
            raise ValueError(f"{self.min_programs=} must be >= 1")
        if self.sweep_v and (self.sweep_v < 16 or self.sweep_v & (self.sweep_v - 1) or self.sweep_v > self.block_v):
            raise ValueError(f"{self.sweep_v=} must be 0 or a power of 2 in [16, block_v]")
        if self.vec not in (0, 1, 2, 4, 8, 16) or self.vec > self.block_v // 2:
            raise ValueError(f"{self.vec=} must be 0 or a power of 2 <= 16 and <= block_v / 2")
        if not isinstance(self.prologue, bool):
            raise ValueError(f"{self.prologue=} must be a bool (True: accept test inside the final kernel)")
        if not isinstance(self.single, bool) or (self.single and not self.prologue):
            raise ValueError(f"{self.single=} must be a bool, and True only with prologue=True (its phase 2 is the "
                             "prologue's accept test)")
        if not isinstance(self.finish, bool) or (self.finish and (not self.prologue or self.single)):
            raise ValueError(f"{self.finish=} must be a bool, and True only with prologue=True and single=False (the "
                             "last program of a row finishes the two-kernel path's final_decide)")
        if self.loops == "tile" and (self.vec or self.prefetch or self.prune or self.sweep_v):
            raise ValueError(f"{self.loops=}: vec, prefetch, prune and sweep_v need loops='lanes'")

    def compiler_params(self) -> plt.CompilerParams:
        return plt.CompilerParams(num_warps=self.num_warps, num_stages=self.num_stages)


SMS = 132  # H200


def choose_config(batch: int, gamma: int, vocab: int, itemsize: int, interpret: bool = False) -> VerifyKernelConfig:
    """The default: "lanes" loops as the torch kernels' choose_config on the H200 (4 warps, 8 below B=128, 8 KB per
    normaliser tile, 16-byte vectors, 1024-logit sweep tiles, ~16 programs per SM, the next tile
    prefetched, pruning from ~8 sweep tiles per program). Interpret mode: the same loops, a few
    small programs (every program runs one after the other there)."""
    del gamma
    vec = max(1, 16 // itemsize)
    if interpret:
        return VerifyKernelConfig(block_v=256, sweep_v=128, min_programs=1, loops="lanes", vec=vec, prefetch=True,
                                  prune=True, num_warps=4, prologue=True)
    wanted = min(pl.cdiv(16 * SMS, batch), 128 if batch < 8 else 32)  # chunks of V per batch row
    warps = 8 if batch < 128 else 4  # H200: B=32, G=4, V=128256 bf16 57 us with 8 warps, 70 with 4; B=256 201 vs 207
    lanes_min = 32 * warps * vec  # a 16-byte vector for each thread
    block_v = min(8192 // itemsize, max(lanes_min, pl.next_power_of_2(pl.cdiv(vocab, wanted))))
    chunks = Chunking.make(batch, vocab, block_v, batch * wanted).num_chunks
    sweep_v = min(1024, block_v)
    return VerifyKernelConfig(block_v=block_v, num_warps=warps, min_programs=batch * wanted, loops="lanes",
                              sweep_v=sweep_v, vec=vec, prefetch=True, prune=vocab / chunks / sweep_v >= 7.5,
                              prologue=True)


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


def single_config(batch: int, gamma: int, vocab: int, itemsize: int, num_warps: int = 0) -> VerifyKernelConfig:
    """``choose_config``'s loops in one launch (``single=True``, kernels/single.py): V split so that B x chunks
    stays within the SM count (every program resident, one per SM at most). B <= SMS."""
    if not 1 <= batch <= SMS:
        raise ValueError(f"{batch=} must be in [1, {SMS}] for the single launch (one program per batch row at least)")
    base = choose_config(batch, gamma, vocab, itemsize)
    warps = num_warps or base.num_warps
    per_row = SMS // batch
    lanes_min = 32 * warps * base.vec
    block_v = min(8192 // itemsize, max(lanes_min, pl.next_power_of_2(pl.cdiv(vocab, per_row))))
    chunks = Chunking.make(batch, vocab, block_v, batch * per_row).num_chunks
    sweep_v = min(1024, block_v)
    return dataclasses.replace(base, block_v=block_v, num_warps=warps, min_programs=batch * per_row, sweep_v=sweep_v,
                               prune=vocab / chunks / sweep_v >= 7.5, single=True)
