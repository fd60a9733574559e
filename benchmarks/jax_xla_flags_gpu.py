"""XLA_FLAGS variants against the JAX engine's per-step overhead (issue #37): per shape and variant,
the host loop's plain and speculative steps and the whole generation's ``lax.while_loop``.

    python benchmarks/jax_xla_flags_gpu.py --out DIR --budget-s 190   # on the H100 / H200 (random bf16 weights)
    python benchmarks/jax_xla_flags_gpu.py --dry-run --out DIR        # a tiny config on the CPU: the plumbing only

XLA reads ``XLA_FLAGS`` once, when JAX's backend starts, so every (shape, variant) pair of ``PLAN``
runs in a child process of its own (``shape_children.run_children``: killed at its share of
``--budget-s``, the share of a pair that finished early passes on), in ``PLAN``'s order: the
failing case first (TinyLlama-1.1B, whose while loop took 1.61x the host loop's step; Llama-3-8B's
took 2.30x, a gap that grows with the weights' bytes), its default before its variants:
``ds_fusion`` (GEMMs read slices of their operands in place: if the while body copies each
layer's weights out of the stack every iteration, this removes it), ``cb_while`` (the while loop
and conditionals in command buffers: if the body's kernels are launched one by one, this graphs
them), then SmolLM2-135M, then a tail that gets what is left. Every child also gets ``AUTOTUNE_CACHE``
(XLA's per-fusion autotuning cache in one directory, so the GEMM choices the first child tuned are
the later children's: less compile time, and the same products in every variant). Before the
children, one CPU-only process parses every variant's flags (``preflight``): a flag this XLA does
not know drops its variants (recorded), and if it is the cache's, the cache is dropped (``COMMON`` in the JSON).

A child (one shape, one variant; ``flashspec_jax.weights.random_model``, seed 0, the same model in
every child; batch 1, greedy, a ``--prompt-len`` random prompt, ``--tokens`` new tokens) times, in
this order, each run once to compile and then ``--reps`` times (the median wall time):
``spec_host`` (n-gram speculation, G = ``--gamma``, ``flashspec.loop.speculate``), ``while``
(the same generation in one ``lax.while_loop``, ``flashspec_jax.whole.Whole`` as the engine
builds it: where the layers are unrolled, their weights sliced once before the loop),
``while_stacked`` (where the layers are unrolled: ``Whole(unstack_weights=False)``, the weights
sliced out of the loop-carried stacks in every iteration, what the loop did before 1.61x / 2.30x
were measured) and ``plain`` (``flashspec.loop.decode``; last: at TinyLlama its first compile, the
GEMMs' autotuning at one row, took 42 s on the H100). Per run: ``ms_per_step_wall`` =
wall / steps (prefill included, comparable between the loops), for the host loops ``step_ms``, the
mean launch-to-launch step of the loop's records, and ``prefill_ms``, the host's jitted prefill
alone (the merged figures' ``*_over_host_net`` take it out of both loops' wall times). The default variant's child also reports the compiled while loop and the
host loop's scoring step (``while_hlo``, ``score_hlo``: the executables the runs used; XLA's cost
analysis, and the ops with results of 1 MB or more per computation), their optimized HLO written
gzipped as ``<shape>_while_hlo.txt.gz`` and ``<shape>_score_hlo.txt.gz`` beside the JSON (at most
5 files). The parent merges the children into ``xla_flags.json``: per shape the
variants side by side, checks (every run's tokens equal the default variant's; the while loop's
equal the host loop's), the issue's target (while loop within 1.05x of the host loop per step),
the best variant per figure, and prints the table.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashspec.config import SamplingConfig  # noqa: E402

import shape_children  # noqa: E402  (benchmarks/ is on sys.path)
from shape_children import AUTOTUNE_CACHE, CHILD_SOFT, TINY, guarded  # noqa: E402

CB_WHILE = "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
VARIANTS = {
    "default": "",
    "cb_while": CB_WHILE,  # while loops and conditionals in command buffers (CUDA graphs), graphs of any size
    "cb_while_unroll": CB_WHILE + " --xla_gpu_command_buffer_unroll_loops=true",  # known trip counts unrolled in the graph
    "ds_fusion": "--xla_gpu_enable_dynamic_slice_fusion=true",  # GEMMs read (dynamic) slices of their operands in place
    "cb_off": "--xla_gpu_enable_command_buffer=",  # no command buffers: what the graphs give the host loop
    "double_buffer": "--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_DOUBLE_BUFFER",  # XLA unrolls loops x2
    "min_graph_1": "--xla_gpu_graph_min_graph_size=1",
}
PLAN = (  # (shape, variant, weight of the budget): run in this order; the tail gets what the head leaves
    ("tinyllama-1.1b", "default", 7.0), ("tinyllama-1.1b", "ds_fusion", 3.5), ("tinyllama-1.1b", "cb_while", 3.5),
    ("smollm2-135m", "default", 1.5), ("smollm2-135m", "cb_while", 1.5),
    ("tinyllama-1.1b", "cb_off", 0.3), ("smollm2-135m", "cb_while_unroll", 0.3), ("smollm2-135m", "cb_off", 0.3),
    ("tinyllama-1.1b", "double_buffer", 0.3), ("smollm2-135m", "min_graph_1", 0.3),
    ("llama3-8b", "default", 0.3), ("llama3-8b", "ds_fusion", 0.2),  # reached with --shapes llama3-8b (long compiles)
)
WHILES = ("while", "while_stacked")  # the while loops timed: Whole's default, and the stacked weights where layers unroll
HLO_FILES = {"while": "while_hlo.txt.gz", "score": "score_hlo.txt.gz"}  # the default variant's, per shape
GREEDY = SamplingConfig(0.0)
TARGET = 1.05  # issue #37: the while loop within 1.05x of the host loop's per-step time


# -- the child: one shape under one variant's flags

def timed(fn, reps: int, host_loop: bool) -> dict:
    """fn() -> (tokens per row, StepRecords): once to compile, then ``reps`` times; the median."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        tokens, records = fn()
        walls.append(time.perf_counter() - t0)
    wall, steps = statistics.median(walls), max(1, len(records))
    out = dict(compile_and_first_s=first, wall_s=wall, walls_s=walls, steps=len(records), ms_per_step_wall=wall * 1e3 / steps,
               acceptance=sum(r.accepted for r in records) / max(1, sum(r.drafted for r in records)),
               tokens=tokens, tokens_sha1=hashlib.sha1(json.dumps(tokens).encode()).hexdigest())
    if host_loop:  # the while loop's records carry its mean, not a step's time
        out["step_ms"] = statistics.mean(r.seconds for r in records) * 1e3
    return out


def prefill_ms(backend, prompts, tokens: int, reps: int) -> float:
    """The host's jitted prefill alone (the median of ``reps`` after one to compile)."""
    import jax

    jax.block_until_ready(backend.start_state(prompts, tokens))
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(backend.start_state(prompts, tokens))
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls) * 1e3


def runs_of(backend, prompts, args) -> tuple[dict, dict]:
    """(name -> fn() for ``timed``, in the order run; name -> the ``whole.Whole`` of each while loop)."""
    import numpy as np

    from flashspec.loop import SpecConfig, decode, speculate
    from flashspec_jax import whole

    seed = np.zeros(len(prompts), np.uint64)
    loops = {"while": whole.Whole(backend)}
    if not backend.draft_models[0].uses_scan():  # the unrolled layers: also with the weights sliced from the stacks
        loops["while_stacked"] = whole.Whole(backend, unstack_weights=False)

    class Fixed:  # the host loop's policy: arm 0, the n-gram draft
        def choose(self):
            return 0

        def observe(self, *a):
            pass

    def device(name: str):
        return lambda: loops[name].run(prompts, max_new_tokens=args.tokens, gamma=args.gamma, sampling=GREEDY, seed=seed,
                                       policy=whole.Fixed(0))

    runs = {"spec_host": lambda: speculate(backend, Fixed(), prompts, sampling=GREEDY, seed=seed,
                                           spec=SpecConfig(gamma=args.gamma, max_new_tokens=args.tokens)),
            **{name: device(name) for name in loops}}
    runs["plain"] = lambda: decode(backend, prompts, sampling=GREEDY, max_new_tokens=args.tokens, seed=seed)
    return runs, loops


def while_hlo(loop, prompts, args, path: Path | None) -> dict:
    """The compiled while loop, the executable ``loop.run`` ran (a cache hit): ``report``."""
    import numpy as np

    from flashspec_jax import whole
    from flashspec_jax.drafts import make_seeds

    tokens, lengths, prefix = loop.inputs(prompts, args.tokens)
    t0 = time.perf_counter()
    compiled = loop.run_jit.lower(loop.backend.weights, tokens, lengths, args.tokens, make_seeds(np.zeros(len(prompts), np.uint64)),
                                  0, 0, prefix=prefix, gamma=args.gamma, cfg=GREEDY, policy=whole.Fixed(0),
                                  max_steps=args.tokens).compile()
    return dict(lower_and_compile_s=time.perf_counter() - t0, **report(compiled, path))


def score_hlo(backend, prompts, args, outdir: Path) -> dict:
    """The host loop's scoring step as the loop compiled it (a cache hit: the state after a run and a
    fresh n-gram proposal): ``report``, to hold against the while loop's body."""
    seed = [0] * len(prompts)
    backend.prefill(prompts, args.tokens)
    proposal = backend.draft(0, args.gamma, GREEDY, seed, 0)
    t0 = time.perf_counter()
    compiled = backend.score_jit.lower(backend.leaves, backend.state, proposal).compile()
    return dict(lower_and_compile_s=time.perf_counter() - t0, **report(compiled, outdir / HLO_FILES["score"]))


def report(compiled, path: Path | None) -> dict:
    """A compiled executable's optimized HLO gzipped to ``path`` (if given), its cost and memory analysis, its
    while loops, and per computation the ops whose result is >= 1 MB (``large_results``: a weight
    or cache materialized inside a loop body shows here)."""
    import gzip

    import jax_profile_gpu  # imports torch (not CUDA): its HLO parser

    text = compiled.as_text()
    if path is not None:
        path.write_bytes(gzip.compress(text.encode()))
    return dict(hlo_chars=len(text), large_results=large_results(text), while_loops=jax_profile_gpu.parse_hlo(text)["while_loops"],
                **jax_profile_gpu.cost(compiled))


def large_results(text: str, min_bytes: int = 1 << 20) -> dict:
    """computation -> [op, name without its number, count, MB of results] for ops outside fusions'
    insides whose result is at least ``min_bytes``."""
    import re
    from collections import Counter

    from jax_profile_gpu import HEADER_RE, OP_RE, shape_bytes

    fused, comps, current = set(), {}, None
    for line in text.splitlines():
        head = HEADER_RE.match(line)
        if head and not line.lstrip().startswith("ROOT"):
            current = comps.setdefault(("ENTRY " if head.group(1) else "") + head.group(2), Counter())
            continue
        op = OP_RE.match(line)
        if op is None or current is None:
            continue
        fused.update(re.findall(r"calls=%?([\w.\-]+)", line) if op.group(4) == "fusion" else ())
        size = shape_bytes(op.group(3))
        if size >= min_bytes:
            current[(op.group(4), re.sub(r"[.\d]+$", "", op.group(2)))] += size
    return {name: [[opcode, base, round(size / 2**20, 1)] for (opcode, base), size in c.most_common(40)]
            for name, c in comps.items() if name.split()[-1] not in fused and c}


def versions() -> dict:
    from importlib import metadata

    out = dict(python=platform.python_version())
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt", "flax"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def child(args) -> None:
    """One shape under this process's XLA_FLAGS; the JSON rewritten after every run."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    start, deadline = time.perf_counter(), time.perf_counter() + args.budget_s * CHILD_SOFT
    dev = jax.devices()[0]
    dims = json.loads(args.dims)
    row = dict(shape=args.shape, variant=args.variant, xla_flags=os.environ.get("XLA_FLAGS", ""), config=dims,
               device=getattr(dev, "device_kind", str(dev)), platform=jax.default_backend(),
               versions=versions(),
               batch=1, prompt_len=args.prompt_len, new_tokens=args.tokens, gamma=args.gamma, reps=args.reps)
    path = args.out / shape_children.RESULT
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    m = random_model(LlamaConfig(**dims, max_position_embeddings=8192), dtype=dtype, seed=0)
    m.scan_layers = False if args.dry_run else None  # the dry run: the unrolled loop, as TinyLlama's on a GPU
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    row.update(dtype=str(jnp.dtype(dtype)), layer_loop="scan" if m.uses_scan() else "unrolled", attention=m.attention_choice())
    prompts = np.random.default_rng(1).integers(0, dims["vocab_size"], (1, args.prompt_len)).tolist()
    row["runs"] = {}
    runs, loops = runs_of(backend, prompts, args)
    for name, fn in runs.items():
        row["runs"][name] = guarded(lambda fn=fn, name=name: timed(fn, args.reps, not name.startswith("while")), deadline)
        if name == "spec_host":  # the prefill it compiled, alone (for the figures' per-step times net of it)
            row["prefill_ms"] = guarded(lambda: dict(ms=prefill_ms(backend, prompts, args.tokens, args.reps)), deadline)
        if name == "while" and args.variant == "default":
            row["while_hlo"] = guarded(lambda: while_hlo(loops[name], prompts, args, args.out / HLO_FILES["while"]), deadline)
            row["score_hlo"] = guarded(lambda: score_hlo(backend, prompts, args, args.out), deadline)
        if name == "while_stacked" and args.variant == "default":
            row["while_stacked_hlo"] = guarded(lambda: while_hlo(loops[name], prompts, args, None), deadline)
        row["child_wall_s"] = time.perf_counter() - start
        shape_children.write_json(path, row)
        print(json.dumps({args.shape: {args.variant: {name: {k: v for k, v in row["runs"][name].items() if k != "tokens"}}}}),
              flush=True)


# -- the parent: flags checked, one child per (shape, variant), the merge

def preflight(variants: list[str], common: str) -> tuple[list[str], str, dict]:
    """Parse every variant's flags (and ``common``) in one CPU-only JAX start; a flag XLA rejects
    drops the variants that use it (or ``common``). -> (variants kept, common kept, what was dropped and why)."""
    import re

    dropped = {}
    for _ in range(len(variants) + 2):
        flags = " ".join(f for f in [common, *(VARIANTS[v] for v in variants)] if f)
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        r = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            break
        unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", r.stderr)
        names = re.findall(r"--\w+", unknown.group(1) if unknown else "") or re.findall(r"Illegal value for (--\w+)", r.stderr)
        if not names:
            dropped["preflight"] = f"rc {r.returncode}, no flag named: {r.stderr[-800:]}"
            break
        why = f"XLA rejected {' '.join(names)}: " + (unknown or re.search(r"Illegal value for .*", r.stderr)).group(0)[:300]
        if set(names) & flag_names(common):
            common, dropped["COMMON"] = "", why
        for v in [v for v in variants if set(names) & flag_names(VARIANTS[v])]:
            variants.remove(v)
            dropped[v] = why
    return variants, common, dropped


def flag_names(flags: str) -> set[str]:
    return {f.split("=")[0] for f in flags.split()}


def child_command(args, dims: dict, flags: dict, script: str):
    """command(name, share, outdir) for ``run_children``: the child under its variant's XLA_FLAGS, its
    output also into outdir/child.log (read back when it fails)."""
    keep = ["--tokens", str(args.tokens), "--prompt-len", str(args.prompt_len), "--gamma", str(args.gamma),
            "--reps", str(args.reps),
            *(["--dry-run"] if args.dry_run else [])]

    def command(name: str, share: float, outdir: Path) -> list[str]:
        shape, variant = name.split("@")
        return shape_children.flagged_command(
            [flags["common"], VARIANTS[variant]], outdir / "child.log",
            [sys.executable, script, "--child", "--shape", shape, "--variant", variant, "--dims", json.dumps(dims[shape]),
             "--out", str(outdir), "--budget-s", f"{share:.1f}", *keep])
    return command


def figures(runs: dict, prefill_ms: float = math.nan) -> dict:
    """One (shape, variant)'s figures: ms per step and the while loops over the host loop, also net
    of the prefill (NaN: not run)."""
    def get(run, key):
        r = runs.get(run, {})
        if key == "ms_per_step_net" and "wall_s" in r:
            return (r["wall_s"] * 1e3 - prefill_ms) / max(1, r["steps"])
        return r.get(key, math.nan)

    f = dict(plain_step_ms=get("plain", "step_ms"), plain_ms_per_step_wall=get("plain", "ms_per_step_wall"),
             spec_host_step_ms=get("spec_host", "step_ms"), spec_host_ms_per_step_wall=get("spec_host", "ms_per_step_wall"))
    for w in WHILES:
        f[f"{w}_ms_per_step_wall"] = get(w, "ms_per_step_wall")
        f[f"{w}_over_host"] = get(w, "ms_per_step_wall") / get("spec_host", "ms_per_step_wall")
        f[f"{w}_over_host_net"] = get(w, "ms_per_step_net") / get("spec_host", "ms_per_step_net")
    return f


def checks_of(runs: dict, default_runs: dict) -> dict:
    """Every run's tokens against the default variant's same run; each while loop's against the host loop's."""
    c = {}
    for name, r in runs.items():
        if "tokens" in r and "tokens" in default_runs.get(name, {}):
            c[f"{name}_tokens_equal_default"] = r["tokens"] == default_runs[name]["tokens"]
        if name.startswith("while") and "tokens" in r and "tokens" in runs.get("spec_host", {}):
            c[f"{name}_equals_spec_host"] = r["tokens"] == runs["spec_host"]["tokens"]
    return c


def merge(children: list[dict]) -> dict:
    """Per shape, per variant: the child's row (rc, killed, its log's tail if it failed), figures, checks;
    per shape the issue's target per variant and the best variant per figure."""
    shapes = {}
    for c in children:
        shape, variant = c["shape"].split("@")
        row = dict(c["data"] or {}, rc=c["rc"], killed=c["killed"], share_s=c["share_s"], wall_s=c["wall_s"])
        if c["rc"] != 0 and c.get("log_tail"):
            row["log_tail"] = c["log_tail"]
        shapes.setdefault(shape, {})[variant] = row
    out = {}
    for shape, variants in shapes.items():
        default_runs = variants.get("default", {}).get("runs", {})
        s = dict(variants=variants, figures={}, checks={}, target_while_within_1_05={})
        for v, row in variants.items():
            runs = row.get("runs", {})
            s["figures"][v] = figures(runs, row.get("prefill_ms", {}).get("ms", math.nan))
            s["checks"][v] = checks_of(runs, default_runs)
            ratio = s["figures"][v]["while_over_host"]
            s["target_while_within_1_05"][v] = None if math.isnan(ratio) else bool(ratio <= TARGET)
        s["best"] = {key: best(s["figures"], key) for key in ("plain_step_ms", "spec_host_ms_per_step_wall",
                                                               *(f"{w}_ms_per_step_wall" for w in WHILES))}
        out[shape] = s
    return out


def best(figs: dict, key: str):
    measured = {v: f[key] for v, f in figs.items() if not math.isnan(f[key])}
    return None if not measured else dict(variant=min(measured, key=measured.get), ms=min(measured.values()),
                                          default_ms=figs.get("default", {}).get(key))


def table(shapes: dict) -> str:
    whiles = WHILES
    cols = ["plain step", "spec host /step", *(f"{w} /step" for w in whiles), *(f"{w} / host" for w in whiles), "tokens ok"]
    lines = ["| shape | variant | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for shape, s in shapes.items():
        for v, f in s["figures"].items():
            ok = all(s["checks"][v].values()) if s["checks"][v] else None
            vals = [f["plain_step_ms"], f["spec_host_ms_per_step_wall"], *(f[f"{w}_ms_per_step_wall"] for w in whiles),
                    *(f[f"{w}_over_host"] for w in whiles)]
            lines.append(f"| {shape} | {v} | " + " | ".join(f"{x:.3f}" for x in vals) + f" | {ok} |")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    ap.add_argument("--budget-s", type=float, default=190.0, help="all children together; each is killed at its share")
    ap.add_argument("--variants", default="", help="comma-separated subset of VARIANTS (default: PLAN's)")
    ap.add_argument("--shapes", default="", help="comma-separated subset of PLAN's shapes")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per run after the compiling one (median)")
    ap.add_argument("--no-common", action="store_true", help="children without AUTOTUNE_CACHE (the shared autotuning cache)")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU (the flags do nothing there)")
    ap.add_argument("--child", action="store_true", help="(internal) one --shape under one --variant in this process")
    ap.add_argument("--shape", help="(internal)")
    ap.add_argument("--variant", help="(internal)")
    ap.add_argument("--dims", help="(internal) the shape's config as JSON")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.tokens, args.prompt_len, args.reps = 8, 12, 1
    unknown = set(filter(None, args.variants.split(","))) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    return args


def plan_of(args) -> list[tuple[str, str, float]]:
    """PLAN, or its variants on the tiny config (--dry-run), cut to --variants and --shapes."""
    plan = [("tiny", v, 1.0) for v in ("default", "cb_while")] if args.dry_run else list(PLAN)
    variants, shapes = set(filter(None, args.variants.split(","))), set(filter(None, args.shapes.split(",")))
    return [p for p in plan if (not variants or p[1] in variants) and (not shapes or p[0] in shapes)]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    start, script = time.perf_counter(), str(Path(__file__).resolve())
    plan = plan_of(args)
    if args.dry_run:
        dims = {"tiny": TINY}
    else:
        from engine_gpu import SHAPES  # imports torch (not CUDA): the shapes' configs

        dims = SHAPES
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "autotune").mkdir()
        common = "" if args.no_common else AUTOTUNE_CACHE.format(dir=Path(tmp) / "autotune")
        kept, common, dropped = preflight(sorted({v for _, v, _ in plan}), common)
        plan = [p for p in plan if p[1] in kept]
        names = [f"{shape}@{variant}" for shape, variant, _ in plan]
        command = child_command(args, dims, dict(common=common), script)
        children = shape_children.run_children(names, {f"{s}@{v}": w for s, v, w in plan},
                                               args.budget_s - (time.perf_counter() - start), command, Path(tmp))
        args.out.mkdir(parents=True, exist_ok=True)
        for c in children:
            if tail := shape_children.log_tail(c, Path(tmp) / c["shape"] / "child.log", 2000):
                c["log_tail"] = tail
            for hlo in (Path(tmp) / c["shape"] / f for f in HLO_FILES.values()):
                if hlo.exists():  # the default variant's, two per shape
                    shutil.copy(hlo, args.out / f"{c['shape'].split('@')[0]}_{hlo.name}")
    shapes = merge(children)
    checks = {f"{shape}/{v}/{k}": ok for shape, s in shapes.items() for v, c in s["checks"].items() for k, ok in c.items()}
    result = dict(script="benchmarks/jax_xla_flags_gpu.py", argv=sys.argv[1:] if argv is None else list(argv),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), dry_run=args.dry_run,
                  base_xla_flags=os.environ.get("XLA_FLAGS", ""), variants={v: VARIANTS[v] for v in kept},
                  common_flags=common, dropped_by_preflight=dropped, plan=plan, target_while_over_host=TARGET,
                  checks=checks, passed=bool(checks) and all(checks.values()), wall_s=time.perf_counter() - start,
                  notes="ms_per_step_wall: wall (prefill included) / steps, the median of --reps calls; *_over_host_net: "
                        "(wall - prefill_ms, the host's jitted prefill alone) / steps, while over host; step_ms: host loops' "
                        "mean launch-to-launch step. "
                        "Device, versions and XLA_FLAGS per child under shapes.<shape>.variants.<variant>.",
                  shapes=shapes)
    path = args.out / ("xla_flags_dry_run.json" if args.dry_run else "xla_flags.json")
    shape_children.write_json(path, result)
    print(path)
    print(table(shapes))


if __name__ == "__main__":
    main()
