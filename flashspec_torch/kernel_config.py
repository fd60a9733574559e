"""``KernelConfig``: the tiling and the options of the Triton verify kernels (``flashspec_torch/verify.py`` launches
them, ``choose_config`` picks one per shape), with the checks of each field."""

from __future__ import annotations

from dataclasses import dataclass

VARIANTS = ("lanes", "tile")  # KernelConfig.stream / .sweep
SCHEDULES = ("two_launch", "persistent")  # KernelConfig.schedule of the split path


@dataclass(frozen=True)
class KernelConfig:
    """Tiling of the verify kernels (see ``flashspec_torch/kernels/verify.py``)."""

    block_b: int = 1  # batch rows per program
    block_v: int = 1024  # vocabulary entries per row per step of the normaliser pass
    sweep_v: int = 4096  # vocabulary entries per step of the row-n sweep
    num_chunks: int = 1  # programs per batch row along V; 1: the single fused launch
    num_warps: int = 4
    stream: str = "lanes"  # normaliser pass: "lanes" (row by row, per-thread running max / sum) or "tile"
    sweep: str = "lanes"  # row-n sweep: "lanes" (per-slot running argmax, exp2 / lg2) or "tile"
    fast_math: bool = True  # "lanes" on a GPU: lg2.approx for -log(E) and log r, z / T by FMA (never in the interpreter)
    prune: bool = True  # "lanes" sweep: skip the keys of tiles that cannot hold the winner (exact)
    schedule: str = "two_launch"  # "persistent": both phases in one launch of ticketed items (kernels/persistent.py)
    programs_per_sm: int = 3  # "persistent": P = SMs x this on a GPU (sm_90: 159 registers: 3 resident); interpreter: P
    lookahead: int = 0  # "persistent": phase 2 of tile k after phase 1 of tile k + L; 0: L ~ P / items per tile
    max_registers: int = 0  # GPU: ptxas register cap (maxnreg) of the final / persistent launch; 0: none
    pdl: bool = False  # two launches on Hopper+: the final launch starts during the stats launch's tail (PDL)
    sweep_chunks: int = 0  # split path: programs (persistent: phase-2 items) per batch row of the sweep of row n; 0: num_chunks
    sweep_warps: int = 0  # two launches: warps of the final launch; 0: num_warps
    shared_floor: bool = False  # two launches, prune: the programs of a row share the sweep's pruning floor
    prune_hint: bool = False  # two launches, prune: the sweep's floor starts from the keys of row n's chunk maxima
    sweep_slots: int = 0  # "lanes" sweep, prune: votes per tile, one per slot of sweep_v / S logits (kernels/slots.py); 0: one
    sweep_ahead: int = 1  # the slot-vote sweep (sweep_slots > 1): tiles of row n loaded ahead of the one evaluated (1-3),
    # held in registers; 0: each tile loaded in its own iteration, the loop pipelined by Triton (sweep_stages stages)
    sweep_stages: int = 3  # sweep_ahead=0: Triton's software-pipelining stages of the slot-vote sweep (2-6)
    lazy_draft: bool = False  # the slot-vote sweep, draft logits: row n of the draft read only where a logit can win
    bf16_pairs: bool = False  # the slot-vote sweep, bfloat16 rows of unit stride: read as int32 pairs, widened by hand
    reverse_final: bool = False  # two launches: the final launch sweeps rows and chunks in reverse (L2 reuse)
    batch_group: int = 0  # two launches: rows per batch group, a stats + final pair per group, chained by PDL; 0: one pair
    tile_bounds: bool = False  # two launches, slot-vote sweep, no top-k / top-p, block_b 1: the stats launch bounds the
    # keys of every block_v tile of every target row, and one final program per row sweeps only row n's tiles that can
    # hold a winner (kernels/bounds.py)
    top_down: bool = False  # two launches, no top-k / top-p, block_b 1: the FINAL draw under the top-down noise
    # (flashspec.random.gumbel_top_down: the same law, other tokens than the default for a seed); the stats launch
    # (or, top_down_maxima='final', the final programs) finds every block of 64 logits' maximum and row n's blocks are
    # drawn only where they can win (kernels/topdown.py)
    top_down_seeds: int = 1  # top_down: a final program first draws the best block of each of this many equal segments of
    # its range, as one tile, for its floor (1-32)
    top_down_blocks: int = 1  # top_down: blocks a final program draws together after its seeds (1-32), their loads in
    # flight at once
    top_down_maxima: str = "stats"  # top_down: who finds row n's block maxima: "stats" (the stats launch keeps them for
    # every target row) or "final" (each final program reads z of its range of row n first: one max per logit)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"{self.schedule=} must be one of {SCHEDULES}")
        if not (isinstance(self.programs_per_sm, int) and self.programs_per_sm >= 1):
            raise ValueError(f"{self.programs_per_sm=} must be an int >= 1")
        if not (isinstance(self.lookahead, int) and self.lookahead >= 0):
            raise ValueError(f"{self.lookahead=} must be an int >= 0 (0: automatic)")
        for name in ("sweep_chunks", "sweep_warps"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ValueError(f"{name}={getattr(self, name)!r} must be an int >= 0 (0: as num_chunks / num_warps)")
        if self.sweep_slots not in (0, 1, 2, 4, 8, 16) or self.sweep_v % max(1, self.sweep_slots):
            raise ValueError(f"{self.sweep_slots=} must be 0 (one vote per tile) or one of 1, 2, 4, 8, 16 dividing "
                             f"{self.sweep_v=}")
        if self.sweep_ahead not in (0, 1, 2, 3):
            raise ValueError(f"{self.sweep_ahead=} must be 1, 2 or 3 (tiles loaded ahead by the slot-vote sweep) "
                             "or 0 (Triton's pipeliner)")
        if self.sweep_stages not in range(2, 7):
            raise ValueError(f"{self.sweep_stages=} must be 2 to 6 (software-pipelining stages of the sweep)")
        if self.sweep_slots > 1 and self.shared_floor:
            raise ValueError(f"{self.sweep_slots=} does not combine with shared_floor=True: use one of the two")
        if self.sweep_warps not in (0, 1, 2, 4, 8, 16):
            raise ValueError(f"{self.sweep_warps=} must be 0 (num_warps) or one of 1, 2, 4, 8, 16")
        if self.top_down_blocks not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"{self.top_down_blocks=} must be 1, 2, 4, 8, 16 or 32 (blocks of 64 drawn together)")
        if self.top_down_maxima not in ("stats", "final"):
            raise ValueError(f"{self.top_down_maxima=} must be 'stats' or 'final' (the launch that finds row n's block "
                             "maxima)")
        if self.top_down_seeds not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"{self.top_down_seeds=} must be 1, 2, 4, 8, 16 or 32 (segments whose best block is "
                             "drawn first)")
        if self.lazy_draft and self.sweep_ahead != 1:
            raise ValueError(f"{self.lazy_draft=} loads its own tiles ahead: leave {self.sweep_ahead=} at 1")
        for name in ("pdl", "shared_floor", "prune_hint", "reverse_final", "lazy_draft", "bf16_pairs", "tile_bounds",
                     "top_down"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if not (isinstance(self.max_registers, int) and (self.max_registers == 0 or 24 <= self.max_registers <= 255)):
            raise ValueError(f"{self.max_registers=} must be 0 (no cap) or an int in [24, 255]")
        for name in ("stream", "sweep"):
            if getattr(self, name) not in VARIANTS:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {VARIANTS}")
        for name in ("block_b", "block_v", "sweep_v"):
            val = getattr(self, name)
            if not (isinstance(val, int) and val >= 1 and val & (val - 1) == 0):
                raise ValueError(f"{name}={val!r} must be a power of two >= 1")
        if not (isinstance(self.batch_group, int) and self.batch_group >= 0 and self.batch_group % self.block_b == 0):
            raise ValueError(f"{self.batch_group=} must be 0 (one launch pair) or a positive multiple of {self.block_b=}")
        if self.block_v < 16 or self.sweep_v < 16:
            raise ValueError(f"{self.block_v=} and {self.sweep_v=} must be >= 16")
        if not (isinstance(self.num_chunks, int) and self.num_chunks >= 1):
            raise ValueError(f"{self.num_chunks=} must be an int >= 1")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"{self.num_warps=} must be one of 1, 2, 4, 8, 16")


def check_top_down(config: KernelConfig, two_launch: bool, filtered: bool) -> None:
    """The top-down noise's draw (kernels/topdown.py) runs in one configuration; raise where it cannot, rather
    than draw with the other noise (other tokens for the same seed)."""
    if filtered:
        raise ValueError("KernelConfig(top_down=True) draws from unfiltered rows: drop top_k / top_p, or use a "
                         "config without top_down")
    if not two_launch:
        raise ValueError(f"KernelConfig(top_down=True) needs two launches: {config.num_chunks=} must split V into "
                         f"2 or more chunks of {config.block_v=}, with {config.schedule=} 'two_launch'")
    if config.block_b != 1 or config.stream != "lanes" or config.block_v < 64:
        raise ValueError(f"KernelConfig(top_down=True) needs block_b=1, stream='lanes' and block_v >= 64, got "
                         f"{config.block_b=}, {config.stream=}, {config.block_v=}")
    if config.shared_floor or config.prune_hint:
        raise ValueError("KernelConfig(top_down=True) takes its floor from its own blocks: leave shared_floor and "
                         "prune_hint off")
