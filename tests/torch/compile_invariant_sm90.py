"""Compile the batch-invariant product for sm_90 with ``triton.compile`` (no GPU needed) and check its Triton
IR: where a slice is one chunk (``CHUNKS`` 1, SmolLM2-135M's K = 576 in slices of 128), every ``tt.dot``
must start from a zero accumulator, each slice summed from zero as the kernel's order says (the plain product
and each epilogue: gate_up's SwiGLU, qkv's RoPE + KV write). Triton's
combine pass turns ``t + tl.dot(x, w, 0)`` into ``tl.dot(x, w, t)``, which rounds otherwise; the kernel's
adds are kept opaque to it (``add_kept``). Run as a script without TRITON_INTERPRET
(tests/torch/test_invariant_matmul.py runs it in a subprocess); prints one line per launch, exits non-zero
on the first dot that accumulates onto anything else."""

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashspec_torch.invariant_matmul import EPILOGUES  # noqa: E402
from flashspec_torch.kernels.invariant_matmul import invariant_matmul_kernel  # noqa: E402

SIGNATURE = dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32")
ROPE_SIGNATURE = dict(cos_ptr="*bf16", sin_ptr="*bf16", pos_ptr="*i64", k_ptr="*bf16", v_ptr="*bf16", T="i32", S="i32")
NO_ROPE = dict(cos_ptr=None, sin_ptr=None, pos_ptr=None, k_ptr=None, v_ptr=None, T=1, S=1, H=0, H_KV=0, D=0)
ROPE = dict(H=9, H_KV=3, D=64)  # SmolLM2-135M's heads (its qkv: N = 960)


def ttir(constexprs: dict, num_warps: int) -> str:
    fn = invariant_matmul_kernel
    rope = constexprs["EPILOGUE"] == "rope_kv"
    constexprs = {**constexprs, **(ROPE if rope else NO_ROPE)}
    sig = {name: (SIGNATURE | ROPE_SIGNATURE if rope else SIGNATURE).get(name, "constexpr") for name in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": num_warps}).asm["ttir"]


def dot_accumulators(ir: str) -> tuple[list[str], set[str]]:
    """The accumulator operand of every tt.dot, and the names of the IR's all-zero constants."""
    zeros = set(re.findall(r"(%\w+) = arith.constant dense<0.000000e\+00>", ir))
    accs = re.findall(r"= tt.dot %[\w#]+, %[\w#]+, (%[\w#]+)", ir)
    return accs, zeros


def main() -> int:
    k, block_k, slices = 576, 128, 5  # SmolLM2-135M's hidden size: five one-chunk slices, the last half masked
    launches = ((16, 4, 1), (16, 4, slices), (64, 1, slices), (128, 1, slices))
    for (block_m, row_tiles, span), epilogue in [(launch, e) for e in EPILOGUES for launch in launches]:
        constexprs = dict(K=k, BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=block_k, CHUNKS=1, SLICES=slices, SPAN=span,
                          PARTIALS=slices // span, PRELOAD=1, ROW_TILES=row_tiles, PRECISION="tf32", USE_DOT=True,
                          USE_PDL=False, EPILOGUE=epilogue)
        accs, zeros = dot_accumulators(ttir(constexprs, 4))
        onto = [a for a in accs if a not in zeros]
        print(f"block_m {block_m} row_tiles {row_tiles} span {span} epilogue {epilogue}: {len(accs)} dots, "
              f"{len(onto)} onto a non-zero")
        if not accs or onto:
            print("FAIL: a one-chunk slice's dot accumulates onto", onto)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
