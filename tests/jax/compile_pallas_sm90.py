"""Compile the Pallas attention kernels for sm_90 on a CPU: the Triton IR JAX's Pallas lowering hands
to XLA, captured during ``jax.export(..., platforms=["cuda"])`` and compiled with Triton's own
``triton.compile`` (what XLA runs on the GPU is its bundled Triton; this is a proxy that catches
shared-memory, register and spill problems before a GPU run). Run as a script, not under pytest:

    PYTHONPATH=$PWD/shared:$PWD python tests/jax/compile_pallas_sm90.py [--slots 2112] [--warps 4]

Prints, per kernel (fused_attention, decode_attention and the batch-invariant attention at Llama-3-8B's
attention: 32 heads, 8 KV heads, head_dim 128, bf16, batch 1; T = 1 decoding and T = 5 scoring; the
batch-invariant product at its gate_up and RMSNorm at its width, T rows), the splits, shared memory,
registers (``cuobjdump`` from Triton's bundled tools, if present) and local-memory loads and stores
in the PTX (spills). Exits non-zero on a compile error. Uses a private JAX hook
(``pallas_call_registration.lowering.lower_jaxpr_to_triton_module``) to capture the IR.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.default_backend = lambda: "gpu"  # the kernels lowered for the GPU, not interpreted

from jax._src.pallas.triton import pallas_call_registration as registration  # noqa: E402

from flashspec_jax.kernels import attention  # noqa: E402
from flashspec_jax.kernels.invariant_attention import invariant_attention  # noqa: E402
from flashspec_jax.kernels.invariant_matmul import invariant_matmul  # noqa: E402
from flashspec_jax.kernels.invariant_norm import invariant_rms_norm  # noqa: E402

TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")
CAPTURED: list[str] = []


def capture():
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def wrapped(*args, **kwargs):
        result = lower(*args, **kwargs)
        CAPTURED.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    registration.lowering.lower_jaxpr_to_triton_module = wrapped


def triton_ir(fn, *args) -> str:
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)
    return CAPTURED[-1]


def compile_sm90(ir: str, warps: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.ttir")
        with open(path, "w") as f:
            f.write(ir)
        compiled = triton.compile(path, target=GPUTarget("cuda", 90, 64), options={"num_warps": warps, "num_stages": 2})
        ptx = compiled.asm["ptx"]
        out = dict(shared_bytes=compiled.metadata.shared, spill_loads=len(re.findall(r"\bld\.local", ptx)),
                   spill_stores=len(re.findall(r"\bst\.local", ptx)))
        tools = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))
        if tools:
            cubin = os.path.join(d, "kernel.cubin")
            with open(cubin, "wb") as f:
                f.write(compiled.asm["cubin"])
            usage = subprocess.run([tools[0], "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
            regs = re.search(r"REG:(\d+)", usage)
            out["registers"] = int(regs.group(1)) if regs else None
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", type=int, default=2112, help="cache slots (2112: a 2048-token context)")
    ap.add_argument("--warps", type=int, default=4, help="num_warps (the kernels' default: 4)")
    args = ap.parse_args()
    capture()
    spec = jax.ShapeDtypeStruct
    layers, kv, heads, d = 32, 8, 32, 128
    cache = spec((layers, 1, kv, args.slots, d), jnp.bfloat16)
    splits = attention.choose_splits(1, kv, args.slots, attention.BLOCK_S)
    failed = False
    for t in (1, 5):
        pos = spec((1, t), jnp.int32)
        kernels = {
            "fused_attention": (lambda qkv, c, s, k, v, p: attention.fused_attention(qkv, c, s, k, v, 3, p, heads=heads),
                                (spec((1, t, (heads + 2 * kv) * d), jnp.bfloat16), spec((1, t, d), jnp.bfloat16),
                                 spec((1, t, d), jnp.bfloat16), cache, cache, pos)),
            "decode_attention": (lambda q, k, v, p: attention.decode_attention(q, k, v, 3, p),
                                 (spec((1, t, heads, d), jnp.bfloat16), cache, cache, pos)),
            "invariant_attention": (lambda q, k, v, p: invariant_attention(q, k, v, 3, p),
                                    (spec((1, t, heads, d), jnp.bfloat16), cache, cache, pos)),
            "invariant_matmul": (lambda x, w: invariant_matmul(x, w),  # gate_up: [2 F, C]
                                 (spec((t, heads * d), jnp.bfloat16), spec((28672, heads * d), jnp.bfloat16))),
            "invariant_rms_norm": (lambda x, w: invariant_rms_norm(x, w, 1e-5),
                                   (spec((t, heads * d), jnp.bfloat16), spec((heads * d,), jnp.bfloat16))),
        }
        for name, (fn, fn_args) in kernels.items():
            try:
                out = compile_sm90(triton_ir(fn, *fn_args), args.warps)
                print(f"ok {name} T={t} slots={args.slots} splits={splits} warps={args.warps}: {out}", flush=True)
            except Exception as e:  # report every kernel, then fail
                failed = True
                print(f"FAILED {name} T={t}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
