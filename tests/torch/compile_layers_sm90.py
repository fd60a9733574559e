"""Compile the fused layer, step (plain decoding's greedy and sampled picks among them) and GEMV kernels for
sm_90 with ``triton.compile`` (no GPU needed); run as a script without TRITON_INTERPRET:
``compile_layers_sm90.py [layers] [gemv]`` (no argument: both). tests/torch/test_layers.py runs the layers
group in a subprocess, tests/torch/test_gemv.py the gemv group."""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashspec_torch.kernels import gemv, layers, sample, steps  # noqa: E402


def compile_kernel(fn, signature: dict, constexprs: dict, num_warps: int) -> int:
    sig = {name: signature.get(name, "constexpr" if name in constexprs else "i32") for name in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return len(triton.compile(src, target=GPUTarget("cuda", 90, 64), options={"num_warps": num_warps}).asm["cubin"])


def main(groups: list[str]) -> int:
    if "layers" in groups:
        compile_layers()
    if "gemv" in groups:
        compile_gemv()
    return 0


def compile_gemv() -> None:
    """Every prologue and dtype, with and without PDL; 1 row (block_n 8) and 8 rows (block_n 1), one
    chunk preloaded; then bf16 with 4 chunks preloaded: all of K = 2048, or 4 of K = 5632's 11."""
    variants = [(dt, 2048, 1) for dt in ("bf16", "fp16", "fp32")] + [("bf16", 2048, 4), ("bf16", 5632, 4)]
    for dt, k, preload in variants:
        act = f"*{dt}"
        sig = dict(x_ptr=act, d_ptr=act, g_ptr=act, w_ptr=act, y_ptr=act, h_out_ptr=act, eps="fp32")
        for prologue, has_d in ((0, False), (1, True), (1, False), (2, False)):
            for use_pdl in (False, True):
                block_m, block_n = (1, 8) if use_pdl else (8, 1)
                constexprs = dict(K=k, PROLOGUE=prologue, HAS_D=has_d, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=512,
                                  USE_PDL=use_pdl, PRELOAD=preload)
                size = compile_kernel(gemv.gemv_kernel, sig, constexprs, 4)
                print(f"ok gemv_kernel {dt} {constexprs}: cubin {size} bytes")


def compile_layers() -> None:
    for dt in ("bf16", "fp16", "fp32"):
        act = f"*{dt}"
        variants = [
            (layers.add_rms_norm_kernel, dict(h_ptr=act, d_ptr=act, w_ptr=act, y_ptr=act, eps="fp32"),
             dict(HAS_D=True, BLOCK_R=2, BLOCK_C=1024), 4),
            (layers.add_rms_norm_kernel, dict(h_ptr=act, d_ptr=act, w_ptr=act, y_ptr=act, eps="fp32"),
             dict(HAS_D=False, BLOCK_R=1, BLOCK_C=4096), 8),
            (layers.rope_kv_kernel, dict(qkv_ptr=act, cos_ptr=act, sin_ptr=act, pos_ptr="*i64", q_ptr=act, k_ptr=act, v_ptr=act),
             dict(H=32, H_KV=8, D=128, BLOCK_D=128), 1),
            (layers.silu_mul_kernel, dict(gu_ptr=act, y_ptr=act), dict(BLOCK=2048), 4),
            (layers.decode_attention_kernel, dict(q_ptr=act, k_ptr=act, v_ptr=act, pos_ptr="*i64", out_ptr=act, scale="fp32"),
             dict(H=32, H_KV=8, D=128, BLOCK_D=128, BLOCK_Q=32, BLOCK_S=64, PRECISION="ieee" if dt == "fp32" else "tf32",
                  USE_DOT=True, KV_SPLIT=0), 4),
            (layers.skinny_linear_kernel, dict(x_ptr=act, w_ptr=act, y_ptr=act),
             dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, PRECISION="ieee" if dt == "fp32" else "tf32"), 4),
        ]
        for fn, sig, constexprs, warps in variants:
            for use_pdl in (False, True) if "USE_PDL" in fn.arg_names else (None,):
                if use_pdl is not None:
                    constexprs = {**constexprs, "USE_PDL": use_pdl}
                size = compile_kernel(fn, sig, constexprs, warps)
                print(f"ok {fn.__name__} {dt} {constexprs}: cubin {size} bytes")
    step_kernels = [
        (steps.commit_kernel, dict(n_ptr="*i32", emitted_ptr="*i32", eos_ptr="*i64", tokens_ptr="*i64", length_ptr="*i64",
                                   prompt_ptr="*i64", max_new_ptr="*i64", done_ptr="*i1", active_ptr="*i1"), dict(BLOCK_W=8), 1),
        (steps.lookup_kernel, dict(seq_ptr="*i64", length_ptr="*i64", out_ptr="*i64"), dict(MAX_N=3, BLOCK_S=512, BLOCK_G=8), 4),
        (steps.greedy_next_kernel, dict(z_ptr="*fp32", tokens_ptr="*i32", num_ptr="*i32", bad_ptr="*u8"),
         dict(FLAG=1, BLOCK_V=8192), 16),
    ]
    sample_sig = dict(thr_ptr="*fp32", tid_ptr="*i32", seed_ptr="*i64", offset_ptr="*i64", tokens_ptr="*i32",
                      num_ptr="*i32", bad_ptr="*u8", T="fp32")
    for dt, counters, filtered in (("bf16", False, False), ("fp32", True, True)):  # scalar seed; per-row seeds, top-k/p
        step_kernels.append((sample.sample_next_kernel, dict(sample_sig, z_ptr=f"*{dt}"),
                             dict(FILTER=filtered, SEED_TENSOR=counters, OFFSET_TENSOR=counters, PER_ROW_SEED=counters,
                                  FLAG=1, BLOCK_V=4096), 8))
    for fn, sig, constexprs, warps in step_kernels:
        print(f"ok {fn.__name__}: cubin {compile_kernel(fn, sig, constexprs, warps)} bytes")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["layers", "gemv"]))
