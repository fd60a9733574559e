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

INT_PTRS = {"len_ptr", "tid_p_ptr", "tid_q_ptr", "a_ptr", "counter_ptr", "ci_ptr", "cf_ptr", "tokens_ptr", "num_ptr"}
I64_PTRS = {"x_ptr", "seed_ptr", "offset_ptr"}
F32_PTRS = {"thr_p_ptr", "thr_q_ptr", "m_ptr", "l_ptr", "ck_ptr", "lq_ptr"}

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
FINAL = dict(NC=16, NSC=16, SWEEP_V=1024, HAS_LENGTHS=False)
COUNTERS = dict(SEED_TENSOR=False, OFFSET_TENSOR=False, PER_ROW_SEED=False)  # scalar seed / offset
TENSORS = dict(SEED_TENSOR=True, OFFSET_TENSOR=True, PER_ROW_SEED=True)  # per-row seed tensors
BF16 = dict(VEC=8, FAST=True)  # bfloat16 / float16: 8 logits per 16-byte load, fast lg2 and FMA division
FP32 = dict(VEC=4, FAST=True)
SAMPLED = dict(FILTER=False, GREEDY=False)
stats, final = kernels.verify_stats_kernel, kernels.verify_final_kernel
# final launches: no pruning (B < 32, few tiles), the tile vote (PRUNE, SLOTS=1), the slot vote, with bf16 pairs
NO_PRUNE = dict(PRUNE=False, SLOTS=1, PAIRS=False)
TILE_VOTE = dict(PRUNE=True, SLOTS=1, PAIRS=False)
SLOT_VOTE = dict(PRUNE=True, SLOTS=4, PAIRS=False)
PAIRS = dict(PRUNE=True, SLOTS=4, PAIRS=True)
VARIANTS = [
    (stats, "bf16", dict(**BF16, **SAMPLED, HAS_W_STATS=False, PDL=True)),
    (stats, "bf16", dict(**BF16, HAS_W_STATS=False, FILTER=False, GREEDY=True, PDL=True)),
    (stats, "fp32", dict(**FP32, **SAMPLED, HAS_W_STATS=True, PDL=True)),
    (stats, "fp32", dict(**FP32, HAS_W_STATS=True, FILTER=True, GREEDY=False, PDL=False)),
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **SAMPLED, **NO_PRUNE, HAS_W=True, HAS_LQ=True, FUSED=False,
                         PDL=True)),
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **SAMPLED, **SLOT_VOTE, HAS_W=True, HAS_LQ=True, FUSED=False,
                         PDL=True)),
    (final, "bf16", dict(**FINAL, **TENSORS, **BF16, **SAMPLED, **SLOT_VOTE, HAS_W=False, HAS_LQ=False, FUSED=False,
                         PDL=True) | dict(HAS_LENGTHS=True)),  # per-row draft lengths (the n-gram draft's step)
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **SAMPLED, **PAIRS, HAS_W=True, HAS_LQ=False, FUSED=False,
                         PDL=True) | dict(SWEEP_V=256)),
    (final, "fp32", dict(**FINAL, **TENSORS, **FP32, **SLOT_VOTE, HAS_W=True, HAS_LQ=False, FILTER=True, GREEDY=False,
                         FUSED=False, PDL=True)),
    (final, "fp16", dict(**FINAL, **COUNTERS, **BF16, **SAMPLED, **TILE_VOTE, HAS_W=False, HAS_LQ=False, FUSED=False,
                         PDL=False)),
    (final, "fp32", dict(**FINAL, **COUNTERS, **FP32, **NO_PRUNE, HAS_W=False, HAS_LQ=False, FILTER=False, GREEDY=True,
                         FUSED=False, PDL=True)),
    # the fused launch (num_chunks=1)
    (final, "fp32", dict(**FINAL, **TENSORS, **FP32, **TILE_VOTE, HAS_W=True, HAS_LQ=False, FILTER=True, GREEDY=False,
                         FUSED=True, PDL=False)),
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **SAMPLED, **SLOT_VOTE, HAS_W=True, HAS_LQ=True, FUSED=True,
                         PDL=False)),
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **NO_PRUNE, HAS_W=True, HAS_LQ=False, FILTER=False, GREEDY=True,
                         FUSED=True, PDL=False)),
    (final, "bf16", dict(**FINAL, **COUNTERS, **BF16, **NO_PRUNE, HAS_W=False, HAS_LQ=False, FILTER=False, GREEDY=True,
                         FUSED=True, PDL=False) | dict(HAS_LENGTHS=True)),
    (final, "fp32", dict(**FINAL, **COUNTERS, **FP32, **SAMPLED, **SLOT_VOTE, HAS_W=True, HAS_LQ=False, FUSED=False,
                         PDL=True) | dict(FAST=False)),  # the slot votes by max / sum
]


def main() -> int:
    for fn, logits, flags in VARIANTS:
        size = compile_variant(fn, logits, **COMMON, **flags)
        print(f"ok {fn.__name__} {logits} {sorted(k for k, v in flags.items() if v is True)}: cubin {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
