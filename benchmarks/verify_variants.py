"""Variants of the Triton verify kernels (KernelConfig) against the memory floor, plus Pallas / jnp.

    python benchmarks/verify_variants.py --out DIR     # on the H200: under 5 minutes (time guards skip the rest)
    python benchmarks/verify_variants.py --dry-run     # tiny shapes on a CPU (Triton interpreter, Pallas interpret)

Per shape (B, G, V, logits dtype, T; draft log-probs given, so a step needs one read of the target
logits and of the draft row n): first every variant's tokens must equal the torch reference's
(and, on a GPU, a CUDA-graph replay must equal eager); then each variant is timed as the median
per-call time of CUDA-graph replays of one verify per input set (launch overhead removed) and as
the eager median (``triton.testing.do_bench``), cycling through enough input sets to exceed the
60 MB L2 three times (the timers of benchmarks/verify_kernels.py). ``x_floor`` = time / (bytes
required / measured copy bandwidth).

JAX: ``impl="pallas"`` (``jax_variants``: the default "pallas-v2" and its tuning ablations) and ``impl="reference"`` timed without per-call dispatch: one jitted
``lax.scan`` runs S verify steps over rotating input sets held as separate buffers (each step's
offset depends on the previous tokens, so nothing is elided), ``block_until_ready`` once; time / S.
"-sliced" rows: the old loop, which sliced each step's set out of a stacked array (a copy per step).
``lean_ms``: the same steps in a loop that keeps no tokens (each step's only feed the next offset, as
in a decode loop); ``loop_ms`` stacks every step's tokens for the check against the reference.
JAX rows only, more time for them: ``--jax-only --jax-budget-s 400``.

Writes DIR/verify_variants.json (default benchmarks/results/) and prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
JAX_SHAPES = [(256, 128256, 0.7), (32, 128256, 1.0), (256, 128256, 1.0), (32, 32000, 0.7), (1, 128256, 1.0)]  # (B, V, T)
JAX_CORE = ("pallas-v2", "reference")  # timed at every JAX shape; the rest at the first two
sys.path.insert(0, str(HERE))

from jax_timing import median_seconds, scan_over_sets  # noqa: E402
from verify_configs import variants  # noqa: E402  (the Triton variants by name; imported from here by other scripts)
from verify_kernels import (  # noqa: E402  (benchmarks/ is on sys.path)
    L2_BYTES, bytes_required, capture, copy_bandwidth_gbps, environment, input_sets, time_graph,
)


def shape_key(text: str) -> tuple:  # "B:G:V:dtype" -> (B, G, V, dtype)
    parts = text.split(":")
    if len(parts) != 4 or parts[3] not in ("bfloat16", "float16", "float32"):
        raise argparse.ArgumentTypeError(f"shape {text!r} must be B:G:V:dtype, e.g. 128:4:128256:bfloat16")
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]


def parse_args(argv=None) -> argparse.Namespace:
    ints = lambda s: [int(t) for t in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=ints, default=[256, 128, 32, 8, 1])
    p.add_argument("--gamma", type=ints, default=[4, 8])
    p.add_argument("--vocab", type=ints, default=[128256, 32000])
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    p.add_argument("--temperatures", type=lambda s: [float(t) for t in s.split(",")], default=[1.0, 0.7])
    p.add_argument("--shapes", type=lambda s: [shape_key(k) for k in s.split(",")], default=None,
                   help="exactly these torch shapes, B:G:V:dtype,... (each at every --temperatures), instead of the "
                        "product of --batch, --gamma, --vocab, --dtypes")
    p.add_argument("--budget-s", type=float, default=190.0, help="stop timing torch shapes after this many seconds (JAX: 80 s more)")
    p.add_argument("--no-jax", action="store_true")
    p.add_argument("--jax-only", action="store_true", help="skip the torch shapes (Pallas / jnp rows only)")
    p.add_argument("--jax-budget-s", type=float, default=80.0, help="JAX shapes start until budget-s plus this")
    p.add_argument("--variants", type=lambda s: s.split(","), default=None,
                   help="torch variants to time at every shape (default: CORE, plus the ablations at ABLATION_SHAPES)")
    p.add_argument("--split", type=lambda s: s.split(","), default=["lanes", "lanes-pdl"],
                   help="torch variants whose kernels are also timed one by one (torch.profiler, eager)")
    p.add_argument("--jax-shapes", type=lambda s: [tuple(float(t) if i == 2 else int(t) for i, t in enumerate(k.split(":")))
                                                   for k in s.split(",")], default=None,
                   help="JAX shapes as B:V:T,... (default: JAX_SHAPES)")
    p.add_argument("--jax-variants", type=lambda s: s.split(","), default=None,
                   help="JAX variants (default: all / JAX_CORE); the jnp reference always runs, to check tokens")
    p.add_argument("--unroll-sets", type=int, default=4,
                   help="JAX: at most this many input sets unrolled in the scan body; more: the sliced loop")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes; CPU (Triton interpreter, Pallas interpret)")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args(argv)
    if args.dry_run:
        args.batch, args.gamma, args.vocab, args.dtypes = [3, 1], [4], [1000], ["bfloat16", "float32"]
    return args


CORE = ("lanes", "lanes-pdl", "lanes-16-per-sm", "lanes-no-prune", "lanes-prune", "lanes-c2", "lanes-c4", "lanes-c8")  # timed at every shape;
# the rest at ABLATION_SHAPES
ABLATION_SHAPES = [(256, 4, 128256, "bfloat16", 0.7), (256, 4, 128256, "bfloat16", 1.0), (32, 4, 128256, "bfloat16", 0.7),
                   (128, 8, 32000, "float32", 0.7)]  # (B, G, V, dtype, T)


def kernel_split_us(step, sets: list, reps: int = 3) -> dict:
    """Mean device time per call of each kernel of ``step`` (eager calls over ``sets``; torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for inp in sets:
        step(inp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for inp in sets:
                step(inp)
        torch.cuda.synchronize()
    calls = reps * len(sets)
    return {e.key: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


def run_torch_shape(shape: dict, device, copy_gbps, names=None, split=()) -> list[dict]:
    import torch
    import triton.testing

    from flashspec.config import SamplingConfig
    from flashspec_torch import verify, verify_triton
    from flashspec_torch.reference import verify_reference

    on_gpu = device.type == "cuda"
    sets = input_sets(shape, device)
    b, t = shape["B"], shape["temperature"]
    cfg = SamplingConfig(temperature=t)
    seed = torch.full((b,), 7, dtype=torch.int64, device=device)
    offset = torch.zeros((), dtype=torch.int64, device=device)
    want = verify(**sets[0], temperature=t, seed=seed, offset=offset, impl="reference")
    need = bytes_required(shape)
    floor_ms = need / (copy_gbps * 1e9) * 1e3 if copy_gbps else None
    itemsize = 2 if shape["dtype"] in ("bfloat16", "float16") else 4
    rows = []
    every = variants(b, shape["G"], shape["V"], itemsize, device)
    if any(every[n].top_down for n in (every if names is None else names) if n in every):  # KernelConfig(top_down)
        want_top_down = verify_reference(*sets[0].values(), cfg, seed, offset, top_down=True)
    key = (b, shape["G"], shape["V"], shape["dtype"], t)
    if on_gpu:  # clocks and caches up before the first timed variant (it used to be the slower of two equals)
        cycle = itertools.cycle(sets)
        warm = lambda inp: verify_triton(inp["target_logits"], inp["draft_tokens"], inp["draft_logits"],  # noqa: E731
                                         inp["draft_logprobs"], cfg, seed, offset)
        triton.testing.do_bench(lambda: warm(next(cycle)), warmup=25, rep=50)
    for name in every if names is None else [n for n in names if n in every]:  # --variants: in its order
        kc = every[name]
        if names is None and on_gpu and name not in CORE and key not in ABLATION_SHAPES:
            continue
        def step(inp, kc=kc):
            return verify_triton(inp["target_logits"], inp["draft_tokens"], inp["draft_logits"],
                                 inp["draft_logprobs"], cfg, seed, offset, config=kc)

        row = dict(backend="torch", impl="triton", variant=name, config=dataclasses.asdict(kc), **shape,
                   bytes_required=need, floor_ms=floor_ms, buffers=len(sets))
        try:
            seed.fill_(7)
            offset.fill_(0)  # the reference's randomness (a failed variant may have left others)
            got = step(sets[0])
            ref = want_top_down if kc.top_down else want  # the top-down noise: other tokens, the same law
            row["ok"] = bool(torch.equal(got.tokens, ref.tokens) and torch.equal(got.num_accepted, ref.num_accepted))
            row["mismatched_rows"] = int((got.tokens != ref.tokens).any(-1).sum())
            if on_gpu:
                graph, outs = capture(step, sets)
                seed.fill_(11)
                offset.fill_(5)
                graph.replay()
                eager = step(sets[-1])
                torch.cuda.synchronize()
                row["graph_ok"] = bool(torch.equal(outs[-1].tokens, eager.tokens))
                seed.fill_(7)
                offset.fill_(0)
                row["graph_ms"] = time_graph(graph, len(sets), reps=15)
                del graph, outs
                cycle = itertools.cycle(sets)
                row["eager_ms"] = triton.testing.do_bench(lambda: step(next(cycle)), warmup=5, rep=25,
                                                          return_mode="median")
                row["x_floor"] = row["graph_ms"] / floor_ms
                row["eager_x_floor"] = row["eager_ms"] / floor_ms
                if name in split:
                    row["kernels_us"] = kernel_split_us(step, sets)
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile or launch is reported
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
    del sets
    if on_gpu:
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- jax


def jax_variants(b: int, g: int, v: int, itemsize: int) -> dict:
    """name -> (impl, VerifyKernelConfig or None); "pallas-v2" is the default (choose_config)."""
    from flashspec_jax.kernels.verify import choose_config

    v2 = choose_config(b, g, v, itemsize)
    return {
        "pallas-v2": ("pallas", v2),
        "pallas-v2-no-prune": ("pallas", dataclasses.replace(v2, prune_tiles=float("inf"))),
        "pallas-v2-prune": ("pallas", dataclasses.replace(v2, prune_tiles=0.0)),
        "pallas-v2-w8": ("pallas", dataclasses.replace(v2, num_warps=8)),
        "reference": ("reference", None),
    }


SLICED = ("pallas-v2",)  # also timed with the old loop (a dynamic slice of the stacked sets per step)
UNROLL_SETS = 4  # at most this many input sets unrolled in the scan body (compile time); more: the sliced loop


def run_jax_shape(shape: dict, names=None, unroll_sets: int = UNROLL_SETS) -> list[dict]:
    """Pallas and jnp verify timed inside one jitted scan over rotating input sets.

    The k input sets are separate arrays and the scan body runs k verify steps, one per set, so no
    step slices its logits out of a stacked array: a dynamic slice feeding a custom call (the Pallas
    kernels) is a copy of [B, G+1, V] and [B, G, V] per step, which the jnp reference (fused) and the
    torch graph replays do not pay. That copy is what the first Pallas numbers included (about
    280 us of the 0.63-0.9 ms at B=256); the "-sliced" rows keep the old loop to show it. With
    more than ``unroll_sets`` sets (small shapes) every variant uses the sliced loop (``sliced`` in the row).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flashspec_jax import verify

    b, g, v, dtype, t = shape["B"], shape["G"], shape["V"], shape["dtype"], shape["temperature"]
    on_gpu = jax.default_backend() in ("gpu", "cuda")
    per_set = (g + 1) * b * v * jnp.dtype(dtype).itemsize + b * v * jnp.dtype(dtype).itemsize
    k = max(2, min(32, math.ceil(3 * L2_BYTES / per_set))) if on_gpu else 2  # CPU: both loops run
    steps = k * math.ceil(32 / k) if on_gpu else k
    key = jax.random.key(b * 7919 + g * 31 + v)
    kz, kw, kg = jax.random.split(key, 3)
    z = (2.0 * jax.random.normal(kz, (k, b, g + 1, v), jnp.float32)).astype(dtype)
    w = (z[:, :, :g].astype(jnp.float32) + 1.4 * jax.random.normal(kw, (k, b, g, v), jnp.float32)).astype(dtype)
    log_q = jax.nn.log_softmax(w.astype(jnp.float32) / t, axis=-1)
    x = jnp.argmax(log_q + jax.random.gumbel(kg, log_q.shape), axis=-1).astype(jnp.int32)
    lq = jnp.take_along_axis(log_q, x[..., None], axis=-1)[..., 0]
    del log_q
    sets = [tuple(a[j] for a in (z, x, w, lq)) for j in range(k)]  # separate buffers
    stacked = (z, x, w, lq)
    del z, w

    def one_step(acc, inp, impl, config):  # -> (next offset, tokens)
        res = verify(*inp, seed=jnp.uint32(7), offset=acc, temperature=t, impl=impl, config=config)
        return acc + res.tokens.sum().astype(jnp.uint32), res.tokens

    def make(impl, config, sliced):
        def one(acc, inp):
            return one_step(acc, inp, impl, config)

        if sliced:
            def run(stacked):
                return jax.lax.scan(lambda acc, i: one(acc, tuple(a[i % k] for a in stacked)), jnp.uint32(0),
                                    jnp.arange(steps))
            return jax.jit(run), (stacked,)

        def run(sets):
            def body(acc, _):
                toks = []
                for inp in sets:  # k steps, each on its own input buffers (no slicing)
                    acc, tokens = one(acc, inp)
                    toks.append(tokens)
                return acc, jnp.stack(toks)
            acc, toks = jax.lax.scan(body, jnp.uint32(0), None, length=steps // k)
            return acc, toks.reshape(steps, *toks.shape[2:])
        return jax.jit(run), (sets,)

    every = jax_variants(b, g, v, jnp.dtype(dtype).itemsize)
    if names is not None:  # the reference always runs first: every row's "ok" compares its tokens with it
        names = ["reference", *(n for n in names if n != "reference")]
    todo = [(name, *every[name], k > unroll_sets) for name in (names or every)]
    todo += [(name + "-sliced", *every[name], True) for name in SLICED if k <= unroll_sets and name in (names or every)]
    rows = []
    outs = {}
    for name, impl, config, sliced in todo:
        row = dict(backend="jax", impl=name, **shape, steps=steps, buffers=k, sliced=sliced,
                   config=None if config is None else dataclasses.asdict(config), bytes_required=bytes_required(shape))
        try:
            fn, args = make(impl, config, sliced)
            acc, toks = fn(*args)
            jax.block_until_ready(acc)
            outs[name] = np.asarray(toks)
            repeats = 5 if on_gpu else 1
            row["loop_ms"] = 1e3 * median_seconds(fn, args, repeats) / steps
            if not sliced:  # the same steps without keeping every step's tokens (a stack and copy per step above)
                lean = scan_over_sets(lambda acc, inp, impl=impl, config=config: one_step(acc, inp, impl, config)[0],
                                      sets, steps)
                row["lean_ms"] = 1e3 * median_seconds(lean, (sets,), repeats) / steps
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
    for row in rows:
        row["ok"] = "reference" in outs and row["impl"] in outs and bool(np.array_equal(outs[row["impl"]], outs["reference"]))
    return rows


# ----------------------------------------------------------------------------- main


def shapes_from(args) -> list[dict]:
    """The ablation shapes first, then largest batches first (the x_floor goal is for B >= 32)."""
    grid = [(b, g, v, d, t) for b, v, d, g, t in
            itertools.product(args.batch, args.vocab, args.dtypes, args.gamma, args.temperatures)]
    if args.shapes:
        grid = [(b, g, v, d, t) for b, g, v, d in args.shapes for t in args.temperatures]
    first = [k for k in ABLATION_SHAPES if k in grid]
    return [dict(B=b, G=g, V=v, dtype=d, temperature=t, draft="logprobs")
            for b, g, v, d, t in first + [k for k in grid if k not in first]]


def table(rows: list[dict]) -> str:
    lines = [f"{'B':>4} {'G':>2} {'V':>6} {'dtype':8} {'T':>4} {'variant':26} {'graph us':>9} {'eager us':>9} "
             f"{'x floor':>7} ok"]
    for r in rows:
        if r["backend"] != "torch":
            continue
        g_us = 1e3 * r["graph_ms"] if r.get("graph_ms") else float("nan")
        e_us = 1e3 * r["eager_ms"] if r.get("eager_ms") else float("nan")
        lines.append(f"{r['B']:4d} {r['G']:2d} {r['V']:6d} {r['dtype']:8} {r['temperature']:4.1f} {r['variant']:26} "
                     f"{g_us:9.1f} {e_us:9.1f} {r.get('x_floor', float('nan')):7.2f} {r.get('ok')}"
                     + (f" ERROR {r['error'][:60]}" if "error" in r else ""))
    for r in rows:
        if r["backend"] == "jax":
            ms = r.get("loop_ms")
            lines.append(f"{r['B']:4d} {r['G']:2d} {r['V']:6d} {r['dtype']:8} {r['temperature']:4.1f} "
                         f"{'jax/' + r['impl']:26} {'':9} {1e3 * ms if ms else float('nan'):9.1f} (in-jit loop; "
                         f"lean {1e3 * r['lean_ms'] if r.get('lean_ms') else float('nan'):.1f}) "
                         f"{r.get('ok')}" + (f" ERROR {r['error'][:60]}" if "error" in r else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        if not args.dry_run:
            print("no CUDA device: use --dry-run (tiny shapes through the Triton interpreter)")
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before flashspec_torch defines its kernels
    device = torch.device("cuda" if on_gpu else "cpu")
    t0 = time.perf_counter()
    copy_gbps = copy_bandwidth_gbps(device) if on_gpu else None
    rows, skipped = [], []
    for shape in [] if args.jax_only else shapes_from(args):
        if time.perf_counter() - t0 > args.budget_s:
            skipped.append(shape)
            continue
        new = run_torch_shape(shape, device, copy_gbps, args.variants, args.split if on_gpu else ())
        rows.extend(new)
        best = min((r for r in new if r.get("graph_ms")), key=lambda r: r["graph_ms"], default=None)
        print(f"B={shape['B']:4d} G={shape['G']} V={shape['V']:6d} {shape['dtype']:8s} T={shape['temperature']}: "
              + " ".join(f"{r['variant']}={1e3 * r['graph_ms']:.0f}us" if r.get("graph_ms") else
                         f"{r['variant']}:{'ok' if r.get('ok') else 'FAIL'}" for r in new)
              + (f"  best {best['variant']} {best['x_floor']:.2f}x floor" if best else ""), flush=True)
    jax_status = "skipped (--no-jax)"
    if not args.no_jax:
        try:
            grid = (args.jax_shapes or JAX_SHAPES) if on_gpu else [(3, 1000, 1.0), (3, 1000, 0.7)]
            jax_shapes = [dict(B=b, G=4, V=v, dtype="bfloat16", temperature=t, draft="logprobs") for b, v, t in grid]
            for i, shape in enumerate(jax_shapes):
                if time.perf_counter() - t0 > (0 if args.jax_only else args.budget_s) + args.jax_budget_s:
                    skipped.append(shape)
                    continue
                names = args.jax_variants or (None if i < 2 or not on_gpu else JAX_CORE)
                rows.extend(run_jax_shape(shape, names, args.unroll_sets))
                print(" ".join(f"jax/{r['impl']}={1e3 * r['loop_ms']:.0f}us" if r.get("loop_ms") else
                               f"jax/{r['impl']}:FAIL" for r in rows if r["backend"] == "jax" and r["B"] == shape["B"]
                               and r["V"] == shape["V"] and r["temperature"] == shape["temperature"]), flush=True)
            jax_status = "ok"
        except Exception as e:  # noqa: BLE001 - keep the torch results
            jax_status = f"failed: {type(e).__name__}: {e}"[:300]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(environment=environment(device), copy_bandwidth_gbps=copy_gbps, jax=jax_status,
                  seconds=time.perf_counter() - t0, skipped=skipped,
                  all_tokens_match=all(r.get("ok", False) for r in rows),
                  all_graphs_match=all(r.get("graph_ok", True) for r in rows), rows=rows)
    try:
        import jax

        result["environment"]["jax"] = jax.__version__
    except ImportError:
        pass
    (out / "verify_variants.json").write_text(json.dumps(result, indent=1))
    print(table(rows))
    print(f"wrote {out / 'verify_variants.json'} ({len(rows)} rows, {result['seconds']:.0f} s, "
          f"{len(skipped)} shapes skipped by the time guard); tokens match: {result['all_tokens_match']}; jax: {jax_status}")
    return 0 if result["all_tokens_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
