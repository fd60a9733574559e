"""Instruction mix of the Pallas verify kernels for sm_90, and the XLA ops around them; needs no GPU.

    python benchmarks/verify_sass_jax.py                          # B=256,32, G=4, V=128256 bf16, T=0.7, every variant
    python benchmarks/verify_sass_jax.py --batch 256 --variants pallas-v2,pallas-v2-w8 --show-loops

``jax.export(..., platforms=["cuda"])`` runs the Pallas Triton lowering on this CPU machine; the Triton
IR (TTIR) of each ``pallas_call`` is captured from the lowering (the custom call carries the same
module as MLIR bytecode), then compiled with the local ``triton`` for sm_90 the way XLA / jaxlib do
(the TTIR passes, then TTGIR, LLVM, PTX, cubin) and disassembled with the cuobjdump of Triton's wheel
(``verify_sass.py``'s helpers). Per kernel: registers, the SASS of every loop (a backward branch), the
lane-instructions per logit of the innermost streaming loop and the throughput model of
``verify_sass.py``. The triton of this machine is not the one bundled with jaxlib 0.11.2 / XLA, so
counts are close to, not identical with, what runs on the H200.

Also lists the StableHLO ops outside the kernels whose operands or results are V-sized (a convert,
pad or slice of the logits costs a full extra pass over HBM).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import verify_sass as vs  # noqa: E402  (benchmarks/ is on sys.path)

H200 = vs.H200


def parse_args(argv=None) -> argparse.Namespace:
    ints = lambda s: [int(t) for t in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=ints, default=[256, 32])
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--variants", default=None, help="names from verify_variants.jax_variants (default: all)")
    p.add_argument("--show-loops", action="store_true", help="print the opcode counts of every loop")
    p.add_argument("--dump", default=None, help="folder for the TTIR / PTX / SASS of every kernel")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- lowering on CPU


def export_verify(batch: int, gamma: int, vocab: int, dtype, temperature: float, config):
    """(StableHLO text, [(kernel name, TTIR text)]) of the jitted Pallas verify lowered for CUDA."""
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton import pallas_call_registration as registration

    from flashspec_jax.kernels import verify as kernels
    from flashspec_jax.verify import make_counters

    captured = []
    lower = registration.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        captured.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    def f(z, x, w, lq, seed):  # draft log-probs given: no pass over the draft rows
        c = make_counters(seed, seed, seed, z.shape[0])
        d = kernels.verify(z, x, w, lq, c, temperature=temperature, top_k=0, top_p=1.0, config=config,
                           interpret=False)
        return d.num_accepted, d.tokens

    spec = jax.ShapeDtypeStruct
    args = (spec((batch, gamma + 1, vocab), dtype), spec((batch, gamma), jnp.int32),
            spec((batch, gamma, vocab), dtype), spec((batch, gamma), jnp.float32), spec((batch,), jnp.uint32))
    checks = [jax.export.DisabledSafetyCheck.custom_call(n) for n in ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")]
    registration.lowering.lower_jaxpr_to_triton_module = capture
    try:
        exported = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args)
    finally:
        registration.lowering.lower_jaxpr_to_triton_module = lower
    names = [re.search(r"module @(\w+)", t).group(1) for t in captured]
    return exported.mlir_module(), list(zip(names, captured))


def compile_ttir(ttir: str, num_warps: int, num_stages: int):
    """TTIR text -> triton CompiledKernel for sm_90, through the TTIR passes first (XLA runs them too)."""
    import triton
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    options = backend.parse_options(dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.ttir")
        with open(raw, "w") as f:
            f.write(ttir)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = ir.parse_mlir_module(raw, context)
        module.context = context
        module = CUDABackend.make_ttir(module, {}, options, 90)
        path = os.path.join(tmp, "kernel.ttir")
        with open(path, "w") as f:
            f.write(str(module))
        return triton.compile(path, target=target, options=dict(num_warps=num_warps, num_stages=num_stages))


def outside_ops(stablehlo: str, vocab: int) -> list[str]:
    """StableHLO ops outside the Pallas kernels that touch a V-sized array."""
    lines = []
    for line in stablehlo.splitlines():
        line = re.sub(r'ir = "[^"]*"', 'ir = "..."', line).strip()
        op = re.search(r"= (?:\"?)(stablehlo\.\w+|call @\w+)", line)
        if op and f"x{vocab}x" in line and "custom_call" not in line:
            lines.append(f"{op.group(1)}: {line.split(':')[-1].strip()[:160]}")
    return lines


def inner_paths(loop: vs.Loop, sass: list[tuple[int, str, str]]) -> tuple[int, int]:
    """(instructions of the loop when its largest forward-branch region is skipped, that region's size)."""
    best = (0, 0)
    for addr, op, rest in sass:
        if loop.lo <= addr < loop.hi and op.startswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", rest)
            if target and loop.lo < int(target.group(1), 16) <= loop.hi and int(target.group(1), 16) > addr:
                size = sum(1 for a, _, _ in sass if addr < a < int(target.group(1), 16))
                best = max(best, (size, addr))
    return loop.size - best[0], best[0]


# ----------------------------------------------------------------------------- report


def kernel_report(name: str, ttir: str, config, b: int, g: int, v: int, itemsize: int, show_loops: bool,
                  dump: str | None) -> dict:
    from flashspec_jax.kernels.verify import Chunking

    compiled = compile_ttir(ttir, config.num_warps, config.num_stages)
    text = vs.cuobjdump(compiled, "-sass")
    sass = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in vs.LINE.finditer(text)]
    sass = [t for t in sass if t[1] != "NOP"]
    total, loops, regs = vs.analyse(compiled)
    if dump:
        os.makedirs(dump, exist_ok=True)
        for ext, body in (("ttir", ttir), ("ptx", compiled.asm["ptx"]), ("sass", text)):
            with open(os.path.join(dump, f"{name}_B{b}.{ext}"), "w") as f:
                f.write(body)
    chunking = Chunking.make(b, v, config.block_v, config.min_programs)
    programs, warps = b * chunking.num_chunks, config.num_warps
    stats = name.endswith("row_stats")
    tile = chunking.block if stats else min(config.sweep_v, chunking.block)
    streaming = [lp for lp in loops if any(k.startswith("LDG") for k in lp.mix)]
    inner = streaming[0] if streaming else None
    per_thread = tile / (32 * warps)
    out = dict(kernel=name, grid=(b, chunking.num_chunks), warps=warps, regs=regs, total=total, tile=tile,
               loops=[lp.size for lp in loops])
    if inner:
        skipped, region = inner_paths(inner, sass)
        iters = (g + 1 if stats else 1) * chunking.blocks * chunking.block / tile
        issued = programs * warps * (iters * inner.size + total)
        rate = H200["sms"] * H200["schedulers"] * H200["ghz"] * 1e3  # warp instructions per us
        nbytes = (b * (g + 1) if stats else 2 * b) * v * itemsize
        out.update(loop=inner.size, ldg=sum(n for k, n in inner.mix.items() if k.startswith("LDG")),
                   ldg128=inner.mix.get("LDG.E.128", 0),
                   per_logit=inner.size / per_thread, mufu_per_logit=inner.mufu / per_thread,
                   passed_over_per_logit=skipped / per_thread if region else None,
                   issue_us=issued / rate, mufu_us=programs * warps * iters * inner.mufu * H200["mufu_cycles"] / rate,
                   memory_us=nbytes / (H200["tbps"] * 1e6),
                   bytes_in_flight_per_thread=per_thread * itemsize * 2)  # the next tile is loaded before this one's arithmetic
    if show_loops:
        for lp in loops:
            print(f"    {name} loop {lp.lo:#x}-{lp.hi:#x}: {lp.size} instr: "
                  + ", ".join(f"{k}:{n}" for k, n in lp.mix.most_common()))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax.numpy as jnp

    from verify_variants import jax_variants

    dtype = jnp.dtype(args.dtype)
    for b in args.batch:
        every = jax_variants(b, args.gamma, args.vocab, dtype.itemsize)
        names = args.variants.split(",") if args.variants else [n for n, (impl, _) in every.items() if impl == "pallas"]
        for name in names:
            _, config = every[name]
            from flashspec_jax.kernels.verify import choose_config

            config = config or choose_config(b, args.gamma, args.vocab, dtype.itemsize)
            hlo, kernels = export_verify(b, args.gamma, args.vocab, dtype, args.temperature, config)
            print(f"B={b} G={args.gamma} V={args.vocab} {args.dtype} T={args.temperature} {name}: {config}")
            for kname, ttir in kernels:
                r = kernel_report(kname, ttir, config, b, args.gamma, args.vocab, dtype.itemsize, args.show_loops,
                                  args.dump and os.path.join(args.dump, name))
                extra = ""
                if "per_logit" in r:
                    extra = (f"loop {r['loop']} SASS ({r['ldg']} LDG) per {r['tile']} logits: {r['per_logit']:.1f} "
                             f"lane-instr/logit, MUFU {r['mufu_per_logit']:.2f}/logit"
                             + (f", passed over {r['passed_over_per_logit']:.1f}/logit" if r["passed_over_per_logit"] else "")
                             + f"; {r['bytes_in_flight_per_thread']:.0f} B/thread in flight; model issue "
                             f"{r['issue_us']:.0f} us, MUFU {r['mufu_us']:.0f} us, memory {r['memory_us']:.0f} us")
                print(f"  {kname}: grid {r['grid']} x{r['warps']}w, {r['regs']} regs, {r['total']} SASS; {extra}",
                      flush=True)
            ops = outside_ops(hlo, args.vocab)
            print(f"  V-sized ops outside the kernels: {len(ops)}" + "".join(f"\n    {o}" for o in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
