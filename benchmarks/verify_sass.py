"""Instruction mix of the Triton verify kernels for sm_90, and a throughput model; needs no GPU.

    python benchmarks/verify_sass.py                        # the default shapes, every variant
    python benchmarks/verify_sass.py --batch 256 --gamma 4 --vocab 128256 --dtype bfloat16 --temperature 0.7

Compiles exactly what ``verify_triton`` would launch on an H200 (the launcher runs with a
recording stand-in for the kernels, then the JIT's own specialisation, e.g. unit strides and
16-divisible sizes, is applied by ``triton.compile``), disassembles the cubin with the cuobjdump
shipped in Triton's wheel, and counts per loop (a backward branch) the SASS instructions by
opcode. The model: per launch, warp-instructions issued = programs x warps x (loop iterations x
loop body + the rest once), against 132 SMs x 4 schedulers x 1.98 GHz; MUFU (16 lanes per SM per
clock: 8 scheduler cycles per warp instruction); bytes against 4.25 TB/s. A launch takes at least
the largest of the three; launches add. An upper bound on speed (perfect overlap, no tail).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import math
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # real kernels, not the interpreter
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the variants, the pruning simulation

import sweep_prune_sim  # noqa: E402

H200 = dict(sms=132, schedulers=4, ghz=1.98, mufu_cycles=8, tbps=4.25)
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);")


def parse_args(argv=None) -> argparse.Namespace:
    ints = lambda s: [int(t) for t in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=ints, default=[256, 32])
    p.add_argument("--gamma", type=ints, default=[4])
    p.add_argument("--vocab", type=ints, default=[128256])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--variants", default="lanes,tile", help="names from benchmarks/verify_variants.py")
    p.add_argument("--show-loops", action="store_true", help="print the opcode counts of every loop")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- compiling offline


def offline_launches(b: int, g: int, v: int, dtype, temperature: float, config) -> list[tuple]:
    """(kernel, grid, args, kwargs) of every launch verify_triton makes, recorded, not run."""
    import torch
    import triton

    from flashspec.config import SamplingConfig

    fv = importlib.import_module("flashspec_torch.verify")
    kernels = importlib.import_module("flashspec_torch.kernels.verify")
    calls = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((self.fn, grid, a, k))

    class Shim:
        def __getattr__(self, name):
            obj = getattr(kernels, name)
            return Recorder(obj) if isinstance(obj, triton.runtime.jit.JITFunction) else obj

    original = fv.load_kernels
    fv.load_kernels = lambda device: Shim()
    try:
        z = torch.zeros(b, g + 1, v, dtype=dtype)
        w = torch.zeros(b, g, v, dtype=dtype)
        x = torch.zeros(b, g, dtype=torch.int64)
        lq = torch.zeros(b, g)
        seed, offset = torch.zeros(b, dtype=torch.int64), torch.zeros((), dtype=torch.int64)
        fv.verify_triton(z, x, w, lq, SamplingConfig(temperature), seed, offset, config=config)
    finally:
        fv.load_kernels = original
    return calls


def compile_launch(fn, args, kwargs):
    """triton.compile with the specialisation the JIT would give these arguments on sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def cuobjdump(compiled, flag: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


# ----------------------------------------------------------------------------- SASS


@dataclasses.dataclass(frozen=True)
class Loop:
    lo: int
    hi: int
    mix: collections.Counter
    ins: tuple = ()  # (address, opcode, operands) of every instruction in the loop

    @property
    def size(self) -> int:
        return sum(self.mix.values())

    @property
    def mufu(self) -> int:
        return sum(n for op, n in self.mix.items() if op.startswith("MUFU"))


def opcode(op: str) -> str:
    return op if op.startswith(("MUFU", "LDG", "STG", "LDS", "STS")) else op.split(".")[0]


def analyse(compiled) -> tuple[int, list[Loop], int]:
    """(instructions, innermost-first loops, registers per thread)."""
    ins = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in LINE.finditer(cuobjdump(compiled, "-sass"))]
    ins = [t for t in ins if t[1] != "NOP"]
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            lo = int(target.group(1), 16)
            body = tuple(t for t in ins if lo <= t[0] <= addr)
            loops.append(Loop(lo, addr, collections.Counter(opcode(o) for _, o, _ in body), body))
    regs = re.search(r"REG:(\d+)", cuobjdump(compiled, "-res-usage"))
    return len(ins), sorted(loops, key=lambda lp: lp.size), int(regs.group(1)) if regs else -1


# ----------------------------------------------------------------------------- the model


def pruned_paths(loop: Loop) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """Opcode counts of a pruned sweep loop's three paths: (every tile, a tile with an evaluated part,
    the evaluated parts). The skip is the loop's widest forward branch; inside it, the top-level
    forward branches guard the slot bodies of ``sweep_row_slots`` (none in ``sweep_row_lanes``: its
    whole skipped region is one evaluated part)."""
    def target(rest):
        m = re.search(r"0x([0-9a-f]+)", rest)
        return int(m.group(1), 16) if m else -1

    fwd = [(a, target(r)) for a, o, r in loop.ins if o.startswith("BRA") and loop.lo < target(r) <= loop.hi
           and target(r) > a]
    if not fwd:
        return loop.mix, collections.Counter(), collections.Counter()
    lo, hi = max(fwd, key=lambda br: br[1] - br[0])
    guards = sorted((a, t) for a, t in fwd if lo < a and t <= hi)
    top = []
    for a, t in guards:
        if not top or a >= top[-1][1]:
            top.append((a, t))
    inside = lambda a: any(g < a < t for g, t in top)  # noqa: E731
    every = collections.Counter(opcode(o) for a, o, _ in loop.ins if a <= lo or a >= hi)
    if not top:  # the tile vote: the whole region is the evaluated part
        return every, collections.Counter(), collections.Counter(opcode(o) for a, o, _ in loop.ins if lo < a < hi)
    tile = collections.Counter(opcode(o) for a, o, _ in loop.ins if lo < a < hi and not inside(a))
    bodies = collections.Counter(opcode(o) for a, o, _ in loop.ins if lo < a < hi and inside(a))
    return every, tile, bodies


def mufu_of(mix: collections.Counter) -> int:
    return sum(n for op, n in mix.items() if op.startswith("MUFU"))


def predict(b, g, v, dtype, temperature, name, config, show_loops=False, simulate=True) -> dict:
    """Model time of each launch of one verify step (see the module docstring). ``simulate``: a pruned
    sweep issues its every-tile path for each tile and its evaluated parts in the fractions that
    ``sweep_prune_sim`` finds on the benchmark's rows; otherwise every tile counts as evaluated."""
    itemsize = 2 if str(dtype).endswith(("bfloat16", "float16")) else 4
    out = dict(variant=name, B=b, G=g, V=v, launches=[])
    for fn, grid, args, kwargs in offline_launches(b, g, v, dtype, temperature, config):
        evaluated = {} if simulate else None
        compiled = compile_launch(fn, args, kwargs)
        total, loops, regs = analyse(compiled)
        programs = math.prod(grid)
        warps = kwargs["num_warps"]
        chunk = args[fn.arg_names.index("chunk")]
        chunks = args[fn.arg_names.index("C")]
        stats = fn.__name__ == "verify_stats_kernel" or kwargs.get("FUSED", False)
        lanes = kwargs.get("LANES", False)
        span = v if kwargs.get("FUSED", False) else chunk
        block = kwargs["BLOCK_V"]
        inner = loops[0] if loops else None
        issued = programs * warps * total  # everything once
        mufu = 0
        elements = 0
        if fn.__name__ == "verify_persistent_kernel":  # one launch: both phases' work items overlap
            t_issue, t_mufu, t_mem, items, per, lp_norm, lp_sweep = persistent_model(fn, args, kwargs, b, g, v,
                                                                                       itemsize, total, loops)
            out["launches"].append(dict(kernel=fn.__name__, grid=grid, warps=warps, regs=regs, chunks=chunks,
                                        items=items, loop_instr=[lp.size for lp in loops],
                                        normaliser_loop=lp_norm.size, sweep_loop=lp_sweep.size,
                                        lane_instr_per_element=per, issue_us=t_issue, mufu_us=t_mufu,
                                        memory_us=t_mem, model_us=max(t_issue, t_mufu, t_mem)))
            print_loops(fn, loops, show_loops)
            continue
        if fn.__name__ == "verify_stats_kernel" and inner:
            rows = (g + 1) if lanes else 1  # "tile" streams all rows in one [ROWS, BLOCK_V] tile
            iters = rows * math.ceil(span / block)
            issued += programs * warps * iters * inner.size
            mufu += programs * warps * iters * inner.mufu
            elements = b * (g + 1) * v
        elif inner:  # the final kernel: its innermost loop is the row-n sweep (chunks of SWEEP_V)
            sweep = [lp for lp in loops if any(op.startswith("LDG") for op in lp.mix)][0]
            if "sweep_chunk" in fn.arg_names and not kwargs.get("FUSED", False):
                span = args[fn.arg_names.index("sweep_chunk")]  # the final launch's own split of row n
            iters = math.ceil(span / kwargs["SWEEP_V"])
            per_iter, per_mufu = sweep.size, sweep.mufu  # every tile evaluated: the bound
            if kwargs.get("PRUNE", False) and kwargs.get("SWEEP_LANES", False) and evaluated is not None:
                every, tile, parts = pruned_paths(sweep)
                slots = kwargs.get("SLOTS", 1)
                f = sweep_prune_sim.evaluated_fractions(v, span, kwargs["SWEEP_V"], slots, temperature or 1.0)
                f_part = f["slots"] if slots > 1 else f["tiles"]
                per_iter = sum(every.values()) + f["tiles"] * sum(tile.values()) + f_part * sum(parts.values())
                per_mufu = mufu_of(every) + f["tiles"] * mufu_of(tile) + f_part * mufu_of(parts)
                evaluated.update(tiles=f["tiles"], parts=f_part, every_tile=sum(every.values()),
                                 evaluated_tile=sum(tile.values()), evaluated_parts=sum(parts.values()))
            issued += programs * warps * iters * per_iter
            mufu += programs * warps * iters * per_mufu
            elements = b * v
        nbytes = (b * (g + 1) * v * itemsize if stats else 0) + (2 * b * v * itemsize if fn.__name__ != "verify_stats_kernel" else 0)
        rate = H200["sms"] * H200["schedulers"] * H200["ghz"] * 1e3  # warp instructions per us
        t_issue, t_mufu = issued / rate, mufu * H200["mufu_cycles"] / rate
        t_mem = nbytes / (H200["tbps"] * 1e6)
        per = elements and (issued - programs * warps * total) * 32 / elements
        out["launches"].append(dict(kernel=fn.__name__, grid=grid, warps=warps, regs=regs, chunks=chunks,
                                    loop_instr=[lp.size for lp in loops], lane_instr_per_element=per,
                                    issue_us=t_issue, mufu_us=t_mufu, memory_us=t_mem,
                                    model_us=max(t_issue, t_mufu, t_mem), pruning=evaluated or None))
        print_loops(fn, loops, show_loops)
    out["model_us"] = sum(launch["model_us"] for launch in out["launches"])
    floor = (b * (g + 2) * v * itemsize + b * g * 12) / (H200["tbps"] * 1e6)
    out.update(floor_us=floor, model_x_floor=out["model_us"] / floor)
    return out


def print_loops(fn, loops, show: bool) -> None:
    if show:
        for lp in loops:
            print(f"    {fn.__name__} loop {lp.lo:#x}-{lp.hi:#x}: {lp.size} instr: "
                  + ", ".join(f"{k}:{n}" for k, n in lp.mix.most_common()))


def persistent_model(fn, args, kwargs, b, g, v, itemsize, total, loops):
    """Model of the persistent launch: the work of all items against one launch's issue / MUFU /
    memory budget (the phases overlap). The normaliser loop: the innermost loop with loads and no
    MUFU.LG2; the sweep loop: the innermost one with loads and LG2 (FAST), over sweep_chunk entries
    of row n; plain loads only (the spin loop's acquire load is LDG.E.STRONG.GPU). Per item, half the
    kernel's instructions outside the loops (only one phase's branch runs). Bytes: the target
    logits once, the draft row n once; row n of z is assumed to come from L2 (the lookahead)."""
    arg = lambda name: args[fn.arg_names.index(name)]  # noqa: E731
    chunk, c, c2, tiles, sweep_chunk = arg("chunk"), arg("C"), arg("C2"), arg("tiles"), arg("sweep_chunk")
    warps = kwargs["num_warps"]
    plain = ("LDG.E", "LDG.E.64", "LDG.E.128")  # not the spin loop's LDG.E.STRONG.GPU
    loads = sorted((lp for lp in loops if sum(lp.mix.get(op, 0) for op in plain) > 0), key=lambda lp: lp.size)
    lp_norm = next(lp for lp in loads if not lp.mix.get("MUFU.LG2", 0))  # innermost: the smallest
    lp_sweep = next((lp for lp in loads if lp.mix.get("MUFU.LG2", 0)), lp_norm)  # not the outer ticket loop
    rows = g + 1 if kwargs.get("LANES", False) else 1
    norm_iters = tiles * c * rows * math.ceil(chunk / kwargs["BLOCK_V"])
    sweep_iters = 0 if kwargs.get("GREEDY", False) else tiles * c2 * math.ceil(sweep_chunk / kwargs["SWEEP_V"])
    items = tiles * (c + c2)
    loop_issue = warps * (norm_iters * lp_norm.size + sweep_iters * lp_sweep.size)
    issued = items * warps * total / 2 + loop_issue
    mufu = warps * (norm_iters * lp_norm.mufu + sweep_iters * lp_sweep.mufu)
    rate = H200["sms"] * H200["schedulers"] * H200["ghz"] * 1e3  # warp instructions per us
    nbytes = b * (g + 1) * v * itemsize + (b * v * itemsize if kwargs.get("HAS_W", False) else 0)
    per = loop_issue * 32 / (b * (g + 2) * v)
    return (issued / rate, mufu * H200["mufu_cycles"] / rate, nbytes / (H200["tbps"] * 1e6), items, per,
            lp_norm, lp_sweep)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    fv = importlib.import_module("flashspec_torch.verify")
    fv.sm_count = lambda index: H200["sms"]  # choose_config as on the H200
    fv.interpreting = lambda: False
    fv.device_sms = lambda device: H200["sms"]  # the persistent grid as on the H200
    from verify_variants import variants

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda", 0)
    for b in args.batch:
        for g in args.gamma:
            for v in args.vocab:
                every = variants(b, g, v, dtype.itemsize, device)
                for name in args.variants.split(","):
                    r = predict(b, g, v, dtype, args.temperature, name, every[name], args.show_loops)
                    parts = "; ".join(
                        f"{x['kernel'].split('_')[1]}: grid {x['grid']} x{x['warps']}w {x['regs']} regs, "
                        f"loops {x['loop_instr']}, "
                        + (f"{x['items']} items, normaliser loop {x['normaliser_loop']}, sweep loop {x['sweep_loop']}, "
                           if "items" in x else "") +
                        f"{x['lane_instr_per_element']:.1f} instr/elem, issue {x['issue_us']:.0f} us, "
                        f"MUFU {x['mufu_us']:.0f} us, memory {x['memory_us']:.0f} us"
                        + (f" (pruning: every tile {x['pruning']['every_tile']} instr, {100 * x['pruning']['tiles']:.0f}% "
                           f"of tiles +{x['pruning']['evaluated_tile']}, {100 * x['pruning']['parts']:.0f}% of parts "
                           f"+{x['pruning']['evaluated_parts']})" if x.get("pruning") else "") for x in r["launches"])
                    print(f"B={b} G={g} V={v} {args.dtype} T={args.temperature} {name}: model {r['model_us']:.0f} us "
                          f"= {r['model_x_floor']:.2f}x floor ({r['floor_us']:.0f} us) | {parts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
