"""Compile the verify kernels for sm_90 with ``triton.compile`` (no GPU needed); run as a script.

Run without TRITON_INTERPRET (the test runs it in a subprocess). Prints one line per variant and
exits non-zero on the first compile error, with Triton's message.
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashspec_torch.kernels import verify as kernels  # noqa: E402

INT_PTRS = {"tid_p_ptr", "tid_q_ptr", "a_ptr", "counter_ptr", "ci_ptr", "cf_ptr", "tokens_ptr", "num_ptr", "ticket_ptr",
            "ready_ptr", "kb_ptr", "lst_ptr"}
I64_PTRS = {"x_ptr", "seed_ptr", "offset_ptr"}
F32_PTRS = {"thr_p_ptr", "thr_q_ptr", "m_ptr", "l_ptr", "ck_ptr", "lq_ptr", "bnd_ptr"}


def signature(fn, constexprs: dict, logits: str) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INT_PTRS:
            sig[name] = "*i32"
        elif name in I64_PTRS:
            sig[name] = "*i64"
        elif name in F32_PTRS:
            sig[name] = "*fp32"
        elif name.endswith("_ptr"):
            sig[name] = f"*{logits}"
        elif name in ("T", "inv_T"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_variant(fn, logits: str, **constexprs) -> int:
    src = ASTSource(fn=fn, signature=signature(fn, constexprs, logits), constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": 4})
    return len(compiled.asm["cubin"])


COMMON = dict(G=4, ROWS=8, BLOCK_B=1, BLOCK_V=512)
FINAL = dict(NC=16, SWEEP_V=2048)
COUNTERS = dict(SEED_TENSOR=False, OFFSET_TENSOR=False, PER_ROW_SEED=False)  # scalar seed / offset
TILE = dict(LANES=False, VEC=8, FAST=False)  # KernelConfig(stream="tile", sweep="tile")
LANES = dict(LANES=True, VEC=8, FAST=True)  # the default: "lanes" loops, fast lg2 and FMA division
LANES4 = dict(LANES, VEC=4)  # fp32 logits: 4 per 16-byte load
# the split pair's options, unless a variant says: no PDL, the sweep's floor per program from -inf, 16 sweep chunks,
# one pruning vote per sweep tile
DEFAULTS = dict(PDL=False, HINT=False, SHARE_K=False, NSC=16, SLOTS=1, AHEAD=1, WAIT_END=False, REVERSE=False, LAZY=False,
                STAGES=3, PAIRS=False, BOUNDS=False, NTP=1, TOPDOWN=False, NR=1, PER=1, SEEDS=1, OWN_MAXIMA=False,
                **COUNTERS)
VARIANTS = [
    (kernels.verify_stats_kernel, "fp32", dict(**TILE, HAS_W_STATS=True, FILTER=True, GREEDY=False)),
    (kernels.verify_stats_kernel, "bf16", dict(**TILE, HAS_W_STATS=False, FILTER=False, GREEDY=True)),
    (kernels.verify_stats_kernel, "fp32", dict(**LANES4, HAS_W_STATS=True, FILTER=True, GREEDY=False)),
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=True, HAS_LQ=False, FILTER=True,
                                               GREEDY=False, FUSED=True, SEED_TENSOR=True, OFFSET_TENSOR=True,
                                               PER_ROW_SEED=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False)),
    (kernels.verify_final_kernel, "fp16", dict(**FINAL, **COUNTERS, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=False, HAS_LQ=False, FILTER=False,
                                               GREEDY=False, FUSED=False)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **COUNTERS, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=False, HAS_LQ=False, FILTER=False,
                                               GREEDY=True, FUSED=False)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=True, HAS_LQ=False, FILTER=False,
                                               GREEDY=True, FUSED=True)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=True, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False)),
    (kernels.verify_final_kernel, "fp16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=True)),
    # KernelConfig(pdl=True): the split pair with programmatic dependent launch
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False, PDL=True, SHARE_K=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SHARE_K=True)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=False, HAS_W=True, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, PDL=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=True, FUSED=False, PDL=True)),
    # KernelConfig(batch_group=k): a later group's stats launch waits for the previous group's final launch at its end
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False, PDL=True, WAIT_END=True)),
    # KernelConfig(prune_hint=True): the stats launch's chunk argmax seeds the sweep's pruning floor
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False, PDL=True, HINT=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, HINT=True)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, HINT=True)),
    # KernelConfig(sweep_slots=S): the sweep's pruning vote per slot (kernels/slots.py)
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=8)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=8) | dict(FAST=False)),  # its votes by max/sum
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, HINT=True, SLOTS=4)),
    (kernels.verify_final_kernel, "fp16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=True, SLOTS=16)),
    # KernelConfig(sweep_ahead=k): the slot-vote sweep loads k tiles of row n ahead
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, AHEAD=3)),
    # KernelConfig(sweep_ahead=0): the slot-vote sweep pipelined by Triton (asynchronous copies, STAGES stages)
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, AHEAD=0, STAGES=3)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, SLOTS=4, AHEAD=0, STAGES=4)),
    (kernels.verify_final_kernel, "fp16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=True, SLOTS=8, AHEAD=0, STAGES=2)),
    # KernelConfig(bf16_pairs=True), chosen from B = 128: the slot-vote sweep reads bfloat16 rows as int32 pairs
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, PAIRS=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=True, SLOTS=8, PAIRS=True, AHEAD=0, STAGES=3)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False, FILTER=False,
                                               GREEDY=False, FUSED=False, SLOTS=2, PAIRS=True, AHEAD=2)),
    # KernelConfig(lazy_draft=True): the slot-vote sweep reads row n of the draft only where a logit can win
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, LAZY=True)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False,
                                               FILTER=True, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, HINT=True, SLOTS=4, LAZY=True)),
    # KernelConfig(reverse_final=True): the final launch's programs in the reverse order of its grid
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, REVERSE=True)),
    # KernelConfig(tile_bounds=True): the stats launch bounds every tile of every target row, the final launch sweeps
    # only the tiles of row n that can hold a winner (kernels/bounds.py)
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False, PDL=True, BOUNDS=True)),
    (kernels.verify_stats_kernel, "fp32", dict(**LANES4, HAS_W_STATS=True, FILTER=False, GREEDY=False, BOUNDS=True,
                                               SEED_TENSOR=True, OFFSET_TENSOR=True, PER_ROW_SEED=True)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, PAIRS=True, BOUNDS=True, NTP=32)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, SLOTS=4, BOUNDS=True, NTP=64)),
    # KernelConfig(top_down=True): the stats launch keeps every block of 64 logits' maximum, the final launch draws
    # row n's blocks under the top-down noise where they can reach the floor (kernels/topdown.py)
    (kernels.verify_stats_kernel, "bf16", dict(**LANES, HAS_W_STATS=False, FILTER=False, GREEDY=False, PDL=True, BOUNDS=2)),
    (kernels.verify_stats_kernel, "fp32", dict(**LANES4, HAS_W_STATS=True, FILTER=False, GREEDY=False, BOUNDS=2)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True, FILTER=False,
                                               GREEDY=False, FUSED=False, PDL=True, SLOTS=4, TOPDOWN=True, NR=128)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=False, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=False, SEED_TENSOR=True,
                                               OFFSET_TENSOR=True, PER_ROW_SEED=True, TOPDOWN=True, NR=32, PER=4)),
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=False,
                                               FILTER=False, GREEDY=False, FUSED=False, PDL=True, TOPDOWN=True, NR=2048,
                                               SEEDS=16, PER=32)),  # one program a row at V = 128256
    # KernelConfig(top_down_maxima="final"): the final programs find row n's block maxima themselves
    (kernels.verify_final_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True, HAS_LQ=True,
                                               FILTER=False, GREEDY=False, FUSED=False, PDL=True, TOPDOWN=True, NR=128,
                                               SEEDS=4, PER=4, OWN_MAXIMA=True)),
    (kernels.verify_final_kernel, "fp32", dict(**FINAL, **COUNTERS, **LANES4, SWEEP_LANES=True, PRUNE=True, HAS_W=False,
                                               HAS_LQ=False, FILTER=False, GREEDY=False, FUSED=False, TOPDOWN=True, NR=64,
                                               SEEDS=2, PER=8, OWN_MAXIMA=True)),
    # KernelConfig(schedule="persistent"): both phases in one launch of ticketed work items
    (kernels.verify_persistent_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True,
                                                    HAS_LQ=True, FILTER=False, GREEDY=False)),
    (kernels.verify_persistent_kernel, "fp32", dict(**FINAL, **LANES4, SWEEP_LANES=True, PRUNE=False, HAS_W=True, HAS_LQ=False,
                                                    FILTER=True, GREEDY=False, SEED_TENSOR=True, OFFSET_TENSOR=True,
                                                    PER_ROW_SEED=True)),
    (kernels.verify_persistent_kernel, "fp16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=False,
                                                    HAS_LQ=False, FILTER=False, GREEDY=False)),
    (kernels.verify_persistent_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True,
                                                    HAS_LQ=False, FILTER=False, GREEDY=True)),
    (kernels.verify_persistent_kernel, "fp32", dict(**FINAL, **COUNTERS, **TILE, SWEEP_LANES=False, PRUNE=False, HAS_W=True,
                                                    HAS_LQ=False, FILTER=True, GREEDY=False)),
    # ... with the sweep split apart from phase 1 (KernelConfig.sweep_chunks) and the slot vote
    (kernels.verify_persistent_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True,
                                                    HAS_LQ=True, FILTER=False, GREEDY=False, SLOTS=4)),
    (kernels.verify_persistent_kernel, "bf16", dict(**FINAL, **COUNTERS, **LANES, SWEEP_LANES=True, PRUNE=True, HAS_W=True,
                                                    HAS_LQ=True, FILTER=False, GREEDY=False, SLOTS=4, PAIRS=True)),
]


def main() -> int:
    for fn, logits, flags in VARIANTS:
        flags = {**{k: v for k, v in DEFAULTS.items() if k in fn.arg_names}, **flags}
        size = compile_variant(fn, logits, **COMMON, **flags)
        print(f"ok {fn.__name__} {logits} {sorted(k for k, v in flags.items() if v is True)}: cubin {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
