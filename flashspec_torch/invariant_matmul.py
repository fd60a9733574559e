"""The batch-invariant product: y = x w^T for any number of rows with a row's bits independent of
how many rows are computed with it and of what they hold (``Engine(batch_invariant=True)`` runs
every product of the target by it, after the per-row add + RMSNorm kernel of ``flashspec_torch.layers``;
qkv as ``invariant_matmul_rope_kv`` and gate_up as ``invariant_matmul_swiglu``, the product with ``rope_kv``
or ``silu_mul`` as its epilogue). Kernel in ``flashspec_torch/kernels/invariant_matmul.py``; argument
checks and the reference (``invariant_matmul_reference``, rounding once at the end) are
``flashspec_torch.gemv``'s.

The reduction order (``invariant_tiling``) depends on N, K and the dtype, never on M: one K chunk
size and a fixed cut of K into slices (each a float32 sum of its chunks' dots in order); the slices'
sums are added in order. How the work is spread
over programs (``launch_tiling``) does depend on M and never changes that order: up to 4 row tiles
of 16 rows per program (each weight chunk loaded once for all of them), one slice per program up to
64 rows (partials added by the last program), every slice in one program above (no workspace), and
64-row tiles only on the GPUs of ``MMA64_CARDS`` (another MMA instruction: admitted by measurement),
each with only the launches and for only the products (N, K) its evidence covers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .device import cuda_index, interpreting
from .gemv import check, gemv_reference
from .layers import pdl_on, rope_kv_reference, silu_mul_reference

invariant_matmul_reference = gemv_reference  # x [..., K]; w [N, K] -> [..., N]


def kernels():
    from .kernels import invariant_matmul

    return invariant_matmul


@dataclass(frozen=True)
class InvariantTiling:
    """How the kernel computes a product. The reduction order along K, hence a row's bits, is fixed by
    ``order()`` (block_k, chunks) and K; the other fields only say which program computes what."""

    block_m: int
    block_n: int
    block_k: int
    chunks: int  # K chunks per slice: K is cut into slices() slices of chunks x block_k
    preload: int  # weight chunks of a program's first slice loaded before the PDL wait, 1 <= preload <= chunks
    num_warps: int = 4
    num_stages: int = 2  # software pipelining of the loads; the sum order is the chunk order whatever it is
    row_tiles: int = 4  # row tiles of block_m per program at most (1-4): each weight chunk is loaded once for them
    span: int = 1  # slices per program: 1 (partials added by the last program) or 0 (all of them: no workspace)

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            val = getattr(self, name)
            if not (isinstance(val, int) and val >= 16 and val & (val - 1) == 0):
                raise ValueError(f"{name}={val!r} must be a power of two >= 16")
        if not (isinstance(self.chunks, int) and self.chunks >= 1 and 1 <= self.preload <= self.chunks):
            raise ValueError(f"chunks={self.chunks!r}, preload={self.preload!r}: need 1 <= preload <= chunks")
        if self.row_tiles not in (1, 2, 3, 4):
            raise ValueError(f"row_tiles={self.row_tiles!r} must be 1, 2, 3 or 4")
        if self.span not in (0, 1):
            raise ValueError(f"span={self.span!r} must be 1 (one slice per program) or 0 (every slice)")

    def order(self) -> tuple[int, int]:
        """What fixes a row's bits (with K and the dtype): two tilings of one order give the same bits."""
        return self.block_k, self.chunks

    def slices(self, k: int) -> int:
        """K's slices of ``chunks`` chunks of ``block_k`` (the last one partial)."""
        return -(-(-(-k // self.block_k)) // self.chunks)

    def partials(self, k: int) -> int:
        """Programs along K, each writing one partial (1: no workspace)."""
        return self.slices(k) // (self.span or self.slices(k))


BLOCK_M = 16  # tl.dot's least M: a decode row pays 16 rows of arithmetic but reads the weights once
ROW_TILES = 4  # a program computes up to 4 row tiles (64 rows) per weight chunk it loads
TARGET_PROGRAMS = 1024  # programs per launch at M <= 64: ~8 per SM of an H100 (132 SMs)
MAX_SPLIT_COLUMNS = 65536  # slices x N at most: the float32 partials of a row stay <= 256 KB
SERIAL_PROGRAMS = 256  # > 64 rows, 16-row tiles: one program per (row group, column tile) over all slices from this many
MMA64_SERIAL_PROGRAMS = 320  # 64 rows on a card of MMA64_CARDS: one 64-row tile over all slices from this many column tiles


def invariant_tiling(n: int, k: int, dtype: torch.dtype) -> InvariantTiling:
    """A function of (N, K, dtype) only, so that its order is the same for every M: wider N tiles for
    wide products (the LM head), K chunks of 128 (64 in float32, whose tiles take twice the registers),
    and slices of 8, 4, 2 or 1 chunks, the longest that still give ~``TARGET_PROGRAMS`` programs at
    M <= 64, lengthened while the partials would exceed ``MAX_SPLIT_COLUMNS``."""
    block_n = 64 if n >= 16384 else 32 if n >= 8192 else 16
    block_k = 64 if dtype == torch.float32 else 128
    tiles, chunks_k = -(-n // block_n), -(-k // block_k)
    chunks = 8
    while chunks > 1 and tiles * -(-chunks_k // chunks) < TARGET_PROGRAMS:
        chunks //= 2
    while -(-chunks_k // chunks) > 1 and -(-chunks_k // chunks) * n > MAX_SPLIT_COLUMNS:
        chunks *= 2
    chunks = min(chunks, chunks_k)
    return InvariantTiling(BLOCK_M, block_n, block_k, chunks, min(chunks, max(1, 32 // block_n)), row_tiles=ROW_TILES)


@dataclass(frozen=True)
class Evidence:
    """Where a card's 64-row tiles were shown to give every row its bits alone: the result directory of
    ``benchmarks/invariant_tiles_gpu.py`` on that card, the launches of ``MMA64_LAUNCHES`` it checked and
    the products (N, K) it checked them on (all passing there; ``test_every_admitted_card_has_its_evidence``
    reads the JSON). Any other product keeps 16-row tiles on that card."""

    results: str
    launches: frozenset[str]
    products: frozenset[tuple[int, int]]


# Warpgroup-MMA launches of an order's tiling ``t``, named as ``benchmarks/invariant_tiles_gpu.py``'s candidates:
# the fields replaced in ``t`` (one 64- or 128-row tile per program over every slice, or, ``m64_n64``, one slice).
MMA64_LAUNCHES: dict[str, dict[str, int]] = {
    "m64_n64": dict(block_m=64, row_tiles=1, span=1, block_n=64, num_stages=3, preload=1),
    "m64_serial": dict(block_m=64, row_tiles=1, span=0),
    "m64_n64_serial": dict(block_m=64, row_tiles=1, span=0, block_n=64, num_stages=3),
    "m64_n64_s4_serial": dict(block_m=64, row_tiles=1, span=0, block_n=64, num_stages=4, preload=1),
    "m64_n128_w8_serial": dict(block_m=64, row_tiles=1, span=0, block_n=128, num_stages=3, num_warps=8, preload=1),
    # 128-row tiles (two 64-row warpgroup MMAs per dot, 8 warps: the 64-row tiles' instruction, its rounding
    # still checked on each card), for many rows: 64 or 128 columns, as many stages as sm_90's 227 KB of shared
    # memory holds (ptxas: 240 and 256 KB with one stage more; benchmarks/invariant_registers_sm90.py)
    "m128_n64_w8_s3_serial": dict(block_m=128, row_tiles=1, span=0, block_n=64, num_stages=3, num_warps=8, preload=1),
    "m128_n128_w8_serial": dict(block_m=128, row_tiles=1, span=0, block_n=128, num_stages=2, num_warps=8, preload=1),
}
MMA64_BASIC = frozenset({"m64_serial", "m64_n64_serial"})  # the order's columns or 64, 2-3 stages
MMA64_CUBLAS_LIKE = frozenset({"m64_n64_s4_serial", "m64_n128_w8_serial"})  # shaped like cuBLAS's tiles
MMA128 = frozenset({"m128_n64_w8_s3_serial", "m128_n128_w8_serial"})  # from MMA128_ROWS rows
MMA64_SPLIT = frozenset({"m64_n64"})  # one slice per program, partials added by the last: short K at 64 rows
# (N, K) of the five products of TinyLlama-1.1B's and Llama-3-8B's shapes: what both cards' runs checked (SmolLM2-135M's,
# K = 576 and 1536, never were: issue #40's SmolLM2 failure on the H200, docs/batch_invariance.md)
MMA64_PRODUCTS = frozenset({(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (32000, 2048),
                            (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)})

# GPUs (``torch.cuda.get_device_name``) on which ``benchmarks/invariant_tiles_gpu.py`` found the 64-row
# tiles (on sm_90 a warpgroup MMA, not ``mma.sync``) bit-equal to the 16-row tiles in every check. Only on
# these does the engine use 64-row tiles (from MMA64_ROWS rows), and only the launches their evidence covers.
MMA64_CARDS: dict[str, Evidence] = {
    "NVIDIA H200": Evidence("benchmarks/results/gpu_2026-12-06_s14_invtile", MMA64_BASIC, MMA64_PRODUCTS),
    "NVIDIA H100 80GB HBM3": Evidence("benchmarks/results/h100_2026-12-07_s20",
                                      MMA64_BASIC | MMA64_CUBLAS_LIKE | MMA64_SPLIT, MMA64_PRODUCTS),
}
MMA64_ROWS = 64
MMA128_ROWS = 128  # where covered, 128-row tiles from this many rows
MMA128_PROGRAMS = 132  # ... where they still give one program per SM of an H100 (else the 64-row launch)
MMA64_DTYPES = (torch.bfloat16,)  # the dtype of every card's run (settings.dtype in its JSON): float32 and
# float16 keep 16-row tiles everywhere until a run checks them
WIDE_N = 8192  # from this many columns (gate_up, LM heads) 64-row tiles of 128 columns where covered
LONG_K = 2048  # where covered: above 64 rows a longer K also takes 128 columns, at 64 rows 64 columns


@functools.lru_cache(maxsize=None)
def card_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def card(device: torch.device) -> str | None:  # the GPU's name; None on the CPU and in the interpreter
    if device.type != "cuda" or interpreting():
        return None
    return card_name(cuda_index(device))


def evidence_card(x: torch.Tensor) -> str | None:
    """The GPU whose ``MMA64_CARDS`` evidence may decide ``x``'s launches: its card where ``x`` has a dtype
    of ``MMA64_DTYPES`` (the only dtype every card's run checked), else None (16-row tiles, as on any card)."""
    return card(x.device) if x.dtype in MMA64_DTYPES else None


def launch_tiling(t: InvariantTiling, m: int, n: int, k: int, gpu: str | None = None) -> InvariantTiling:
    """The engine's tiling for M rows, always of ``t``'s order (``t``: ``invariant_tiling``; block_n < 64
    but for the widest products). From 64 rows on a ``gpu`` of ``MMA64_CARDS``, the 64-row (from 128 rows
    128-row, where its evidence lists them) launch of ``mma64_launch``. Otherwise up to 64 rows, 16-row
    tiles (up to 4 per program), one slice per program,
    with twice ``t``'s columns per tile, or, for the widest products, 4 stages where a slice has 16 chunks
    or more (at most 16 rows); above 64 rows 16-row tiles over every slice where that still gives
    ``SERIAL_PROGRAMS`` programs. These are the fastest checked candidates of
    ``benchmarks/invariant_tiles_gpu.py`` (docs/batch_invariance.md). A row's bits are the same at every M:
    the sequence of dots and additions is ``t``'s (and the MMA instruction the same, or shown to round
    alike on ``gpu``)."""
    name = mma64_launch(t, m, n, k, gpu)
    if name is not None:
        return replace(t, **MMA64_LAUNCHES[name])
    wide = t.block_n >= 64
    if m <= t.block_m * t.row_tiles:
        if not wide:
            return replace(t, block_n=2 * t.block_n)
        return replace(t, num_stages=4) if m <= t.block_m and t.chunks >= 16 else t
    groups = -(-m // (t.block_m * t.row_tiles))
    if groups * -(-n // t.block_n) >= SERIAL_PROGRAMS:
        return replace(t, span=0)
    return t


def mma64_launch(t: InvariantTiling, m: int, n: int, k: int, gpu: str | None) -> str | None:
    """The name (``MMA64_LAUNCHES``) of the engine's 64-row launch for M rows on ``gpu``, None for 16-row
    tiles: none below ``MMA64_ROWS`` rows, on a card not in ``MMA64_CARDS`` or for a product (N, K) its
    evidence did not check, and only a launch the card's evidence covers. Where it covers ``MMA64_CUBLAS_LIKE`` and ``MMA64_BASIC``: 128 columns with 8 warps for
    ``WIDE_N`` columns or more, and above 64 rows for K > ``LONG_K`` too; otherwise at 64 rows 64 columns
    with 4 stages for K > ``LONG_K``, for shorter K 64 columns and one slice per program (``m64_n64``, where
    covered; else ``t``'s columns over every slice), and above 64 rows 64 columns, 3 stages.
    Where it covers ``MMA64_BASIC`` only: at 64 rows ``t``'s columns where there are
    ``MMA64_SERIAL_PROGRAMS`` column tiles (16-row tiles below that), above 64 rows 64 columns (3 stages;
    the widest products keep their 2). From ``MMA128_ROWS`` rows ``mma128_launch`` first, where covered."""
    ev = MMA64_CARDS.get(gpu)
    covered = ev.launches if ev is not None and (n, k) in ev.products else frozenset()
    if m < MMA64_ROWS or not covered:
        return None
    wide = mma128_launch(m, n, covered)
    if wide is not None:
        return wide
    if MMA64_BASIC | MMA64_CUBLAS_LIKE <= covered:
        if n >= WIDE_N or (m > MMA64_ROWS and k > LONG_K):
            name = "m64_n128_w8_serial"
        elif m == MMA64_ROWS:
            name = "m64_n64_s4_serial" if k > LONG_K else "m64_n64" if MMA64_SPLIT <= covered else "m64_serial"
        else:
            name = "m64_n64_serial"
    elif m == MMA64_ROWS:
        name = "m64_serial" if -(-n // t.block_n) >= MMA64_SERIAL_PROGRAMS else None
    else:
        name = "m64_serial" if t.block_n >= 64 else "m64_n64_serial"
    return name if name in covered else None


def mma128_launch(m: int, n: int, covered: frozenset[str]) -> str | None:
    """The 128-row launch (``MMA128``) for M rows of an N-column product, if ``covered`` holds it: none below
    ``MMA128_ROWS`` rows; 128, else 64 columns, the first that gives ``MMA128_PROGRAMS`` programs (None where
    neither does: the 64-row launch). A first rule, to be replaced by what a card's run of
    ``benchmarks/invariant_tiles_gpu.py`` finds fastest."""
    if m < MMA128_ROWS:
        return None
    tiles = -(-m // MMA128_ROWS)  # row tiles of 128
    if tiles * -(-n // 128) >= MMA128_PROGRAMS:
        name = "m128_n128_w8_serial"
    elif tiles * -(-n // 64) >= MMA128_PROGRAMS:
        name = "m128_n64_w8_s3_serial"
    else:
        return None
    return name if name in covered else None


def invariant_matmul(
    x: torch.Tensor,  # [..., K], any number of rows
    w: torch.Tensor,  # [N, K]
    pdl: bool = False,
) -> torch.Tensor:  # [..., N] = x w^T
    k = x.shape[-1]
    check(x, "x", w, k, max_rows=None)
    y = launch(x.reshape(-1, k).contiguous(), w, pdl)
    return y.reshape(*x.shape[:-1], w.shape[0])


def invariant_matmul_swiglu(
    x: torch.Tensor,  # [..., K], any number of rows
    w: torch.Tensor,  # [2I, K]: w_gate's rows, then w_up's (nn.Linear gate_up's layout)
    pdl: bool = False,
) -> torch.Tensor:  # [..., I] = silu(x w_gate^T) * (x w_up^T)
    """``silu_mul(invariant_matmul(x, w))``'s bits in one launch, without the [..., 2I] product in memory:
    the product's tiling and sums for N = 2I (each output column's gate and up in one program, adjacent
    columns of its tile), then ``silu_mul``'s rounding of the rounded gate and up as the epilogue."""
    k = x.shape[-1]
    check(x, "x", w, k, max_rows=None)
    if w.shape[0] % 2:
        raise ValueError(f"w has {w.shape[0]} rows: a gate_up weight has an even number (gate's rows, then up's)")
    y = launch(x.reshape(-1, k).contiguous(), w, pdl, epilogue="swiglu")
    return y.reshape(*x.shape[:-1], w.shape[0] // 2)


def invariant_matmul_swiglu_reference(x, w):  # x [..., K]; w [2I, K] -> [..., I]
    return silu_mul_reference(invariant_matmul_reference(x, w))


@dataclass(frozen=True)
class RopeKV:
    """What the "rope_kv" epilogue rotates with and writes to: ``layers.rope_kv``'s arguments."""

    cos: torch.Tensor  # [B, T, D]
    sin: torch.Tensor  # [B, T, D]
    positions: torch.Tensor  # [B, T] int64: each token's cache slot
    k_cache: torch.Tensor  # [B, H_kv, S, D], written at positions
    v_cache: torch.Tensor  # [B, H_kv, S, D], written at positions
    heads: int
    kv_heads: int

    def kernel_args(self) -> tuple:  # (cos, sin, positions, k, v, T, S, H, H_KV, D) of the kernel
        b, t, d = self.cos.shape
        return (self.cos, self.sin, self.positions, self.k_cache, self.v_cache, t, self.k_cache.shape[2], self.heads,
                self.kv_heads, d)


NO_ROPE = (None,) * 5 + (1, 1, 0, 0, 0)  # the kernel's RopeKV.kernel_args for the other epilogues


def invariant_matmul_rope_kv(
    x: torch.Tensor,  # [B, T, K]
    w: torch.Tensor,  # [(H + 2 H_kv) D, K]: the qkv projection
    rope: RopeKV,
    pdl: bool = False,
) -> torch.Tensor:  # q [B, H, T, D], rotated; K and V written to rope's caches
    """``layers.rope_kv(invariant_matmul(x, w), ..., impl="triton")``'s bits in one launch, without qkv in
    memory: the product's tiling and sums, lanes d and d + D / 2 of a head adjacent in a column tile, then
    ``rope_kv_kernel``'s rotation and writes as the epilogue."""
    b, t, k = x.shape
    d = rope.cos.shape[-1]
    check(x, "x", w, k, max_rows=None)
    if d % 2 or w.shape[0] != (rope.heads + 2 * rope.kv_heads) * d or rope.cos.shape != (b, t, d) \
            or rope.sin.shape != rope.cos.shape:
        raise ValueError(f"w {tuple(w.shape)}, cos {tuple(rope.cos.shape)}, sin {tuple(rope.sin.shape)}: need an even "
                         f"head_dim D, w [(heads + 2 kv_heads) D, K] = [{(rope.heads + 2 * rope.kv_heads) * d}, {k}] "
                         "and cos, sin [B, T, D]")
    if not (rope.k_cache.is_contiguous() and rope.v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous [B, H_kv, S, D] (the epilogue writes them in place)")
    rope = replace(rope, cos=rope.cos.contiguous(), sin=rope.sin.contiguous(), positions=rope.positions.contiguous())
    return launch(x.reshape(-1, k).contiguous(), w, pdl, epilogue="rope_kv", rope=rope)


def invariant_matmul_rope_kv_reference(x, w, rope: RopeKV):  # x [B, T, K] -> q [B, H, T, D]; writes rope's caches
    return rope_kv_reference(invariant_matmul_reference(x, w), rope.cos, rope.sin, rope.positions, rope.k_cache,
                             rope.v_cache, rope.heads, rope.kv_heads)


EPILOGUES = ("none", "swiglu", "rope_kv")


def launch(x, w, pdl: bool, tiling: InvariantTiling | None = None, epilogue: str = "none",
           rope: RopeKV | None = None) -> torch.Tensor:
    """x [M, K]; w [N, K] -> y [M, N] by ``invariant_matmul_kernel``: a program computes up to
    ``row_tiles`` row tiles of one column tile and ``span`` slices, each weight chunk loaded once for all
    of them (a row's bits are those of its row tile alone: the same chunk order, slices and sum order).
    ``tiling`` None: ``launch_tiling(invariant_tiling(...), M)`` (the engine); given: that one. The same
    tiling of N columns with an ``epilogue`` (``EPILOGUES``): "swiglu" y [M, N / 2] (``invariant_matmul_swiglu``),
    "rope_kv" y = q [B, H, T, D] and ``rope``'s caches written (``invariant_matmul_rope_kv``)."""
    assert epilogue in EPILOGUES and (rope is not None) == (epilogue == "rope_kv"), (epilogue, rope)
    m, (n, k) = x.shape[0], w.shape
    t = launch_tiling(invariant_tiling(n, k, x.dtype), m, n, k, evidence_card(x)) if tiling is None else tiling
    row_tiles = min(t.row_tiles, -(-m // t.block_m))  # fewer when M is small: no program computes an empty tile
    rows_per_program = row_tiles * t.block_m
    slices, partials = t.slices(k), t.partials(k)
    span = slices // partials
    grid = (-(-m // rows_per_program), -(-n // t.block_n))
    rows = COUNTERS // grid[1] * rows_per_program  # the most rows one launch's counters cover
    if partials > 1 and m > rows:  # pieces of whole row groups: a row's bits do not depend on its launch
        if rope is not None:
            raise ValueError(f"{m} rows of qkv with RoPE in one launch: more than the {rows} its counters cover; "
                             "prefill in chunks")
        return torch.cat([launch(x[i : i + rows], w, pdl, t, epilogue) for i in range(0, m, rows)])
    if rope is not None:
        b, seq, d = rope.cos.shape
        y = torch.empty((b, rope.heads, seq, d), dtype=x.dtype, device=x.device)
    else:
        y = torch.empty((m, n // 2 if epilogue == "swiglu" else n), dtype=x.dtype, device=x.device)
    part = count = y
    if partials > 1:
        part = torch.empty((partials, m, n), dtype=torch.float32, device=x.device)
        count = counters(x.device, grid[0] * grid[1])
    use_pdl = pdl_on(pdl, x)
    cos, sin, pos, k_cache, v_cache, seq, slots, heads, kv_heads, d = NO_ROPE if rope is None else rope.kernel_args()
    kernels().invariant_matmul_kernel[(*grid, partials)](
        x, w, y, part, count, m, n, k,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, CHUNKS=t.chunks, SLICES=slices, SPAN=span,
        PARTIALS=partials, PRELOAD=t.preload, ROW_TILES=row_tiles,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", USE_DOT=not interpreting(),
        USE_PDL=use_pdl, EPILOGUE=epilogue, cos_ptr=cos, sin_ptr=sin, pos_ptr=pos, k_ptr=k_cache, v_ptr=v_cache,
        T=seq, S=slots, H=heads, H_KV=kv_heads, D=d, num_warps=t.num_warps, num_stages=t.num_stages, launch_pdl=use_pdl,
    )
    return y


COUNTERS = 1 << 20  # tiles per launch at most (4 MB): 2978 row groups (M 190592) of TinyLlama's gate_up (352 column tiles)
_counters: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The split product's per-tile counters on ``device`` ([COUNTERS] int32, zero between launches: the
    program that adds a tile's partials resets its counter). Made at the first launch on the device
    (an eager one: the engine warms up before it captures a CUDA graph) and shared by every launch,
    which run one after another on one stream."""
    assert tiles <= COUNTERS, tiles  # launch cuts larger grids into pieces
    if device not in _counters:
        _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[device]
