"""Where the bytes of one JAX decode step go: the compiled executables' cost, data movement and time.

    python benchmarks/jax_profile_gpu.py --out DIR            # on the H100 (Llama-3-8B and TinyLlama shapes)
    python benchmarks/jax_profile_gpu.py --dry-run --out DIR  # a tiny config on the CPU: proves the script runs

Per shape (random weights, bf16 on a GPU, float32 on the CPU; batch 1, a 128-token prompt), three
executables as the engine compiles them (``flashspec_jax.backend.JaxBackend``'s jitted steps, the
state donated on a GPU): ``decode`` (one plain decode step), ``spec`` (one speculative step with the
n-gram draft, G = 4: draft, score, verify, commit in one jit) and ``forward`` (the target's forward
of one token alone). For each: ``cost_analysis()`` (flops, bytes accessed; XLA counts a while
loop's body once, so the layer scan's bytes are per layer, see ``scan_trip_counts``),
``memory_analysis()`` (argument / output / alias / temp bytes: the alias bytes are the donated
buffers reused in place), the optimized HLO's data-moving ops outside fusions (copy, transpose,
convert, dynamic-update-slice, dynamic-slice, gather, scatter, and the while loops' carried
shapes) with their byte sizes, the donation flags seen in the module header
(``input_output_alias``), and the measured ms per step (median of ``--reps``). The weights' bytes
and a measured device copy bandwidth give the weights floor. The optimized HLO of each executable
is written next to the JSON (``--out``/hlo/SHAPE_NAME.txt) for reading.

``--loops scan,unrolled``: each shape with both layer loops of the model
(``flashspec_jax.model.Llama.scan_layers``): the scan is the engine before issue #37, unrolled
after. (Commit aff3652 of this script ran the one-token forward three ways instead, the
``variants`` of benchmarks/results/h100_2026-12-06_jax_profile_before/.)
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec_jax.backend import JaxBackend  # noqa: E402
from flashspec_jax.drafts import LookupDraft  # noqa: E402
from flashspec_jax.model import LlamaConfig  # noqa: E402
from flashspec_jax.weights import random_model  # noqa: E402

from engine_gpu import SHAPES as ENGINE_SHAPES  # noqa: E402  (benchmarks/ is on sys.path; imports torch)

SHAPES = ENGINE_SHAPES
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
MOVERS = ("copy", "transpose", "convert", "dynamic-update-slice", "dynamic-slice", "gather", "scatter",
          "copy-start", "broadcast", "concatenate", "slice", "pad", "reshape", "bitcast-convert")
BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
         "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
SHAPE_RE = re.compile(r"\b(pred|[subf]\d+|bf16|f8e4m3fn|f8e5m2)\[([\d,]*)\]")
OP_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")


def shape_bytes(text: str) -> int:
    """Bytes of every array shape in an HLO result type (a tuple sums its parts)."""
    total = 0
    for dt, dims in SHAPE_RE.findall(text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * BYTES.get(dt, 4)
    return total


def parse_hlo(text: str) -> dict:
    """The optimized HLO's data-moving ops outside fusions, while loops and their carried bytes."""
    fused, comps, current = set(), {}, None
    for line in text.splitlines():
        m = HEADER_RE.match(line)
        if m and not line.lstrip().startswith("ROOT"):
            current = ("ENTRY " if m.group(1) else "") + m.group(2)
            comps[current] = []
            continue
        op = OP_RE.match(line)
        if op and current is not None:
            comps[current].append((op.group(2), op.group(3), op.group(4), line))
            if op.group(4) == "fusion":
                fused.update(re.findall(r"calls=%?([\w.\-]+)", line))
    movers, inside, whiles, counts = [], Counter(), [], Counter()
    for comp, ops in comps.items():
        is_fused = comp in fused
        for name, result_type, opcode, line in ops:
            counts[opcode] += 1
            if opcode in MOVERS:
                if is_fused:
                    inside[opcode] += 1
                elif opcode not in ("reshape", "slice", "broadcast", "bitcast-convert") or shape_bytes(result_type) > 1 << 20:
                    movers.append(dict(computation=comp, name=name, op=opcode, bytes=shape_bytes(result_type),
                                       result=result_type[:200]))
            if opcode == "while":
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                whiles.append(dict(computation=comp, name=name, carried_bytes=shape_bytes(result_type),
                                   known_trip_count=int(trip.group(1)) if trip else None))
    header = text.splitlines()[0] if text else ""
    alias = re.search(r"input_output_alias=\{(.*?)\}\s*(,|$)", header)
    movers.sort(key=lambda r: -r["bytes"])
    by_op = Counter()
    for r in movers:
        by_op[r["op"]] += r["bytes"]
    return dict(movers_outside_fusions=movers[:60], mover_bytes_by_op=dict(by_op), mover_count=len(movers),
                movers_inside_fusions=dict(inside), while_loops=whiles, op_counts=dict(counts.most_common(40)),
                input_output_alias=alias.group(1)[:2000] if alias else None, num_computations=len(comps))


def cost(compiled) -> dict:
    c = compiled.cost_analysis()
    c = c[0] if isinstance(c, (list, tuple)) else c
    keep = {k: float(v) for k, v in (c or {}).items() if k in ("flops", "bytes accessed", "transcendentals",
                                                                "bytes accessedout{}", "optimal_seconds")}
    try:
        m = compiled.memory_analysis()
        mem = {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                               "temp_size_in_bytes", "generated_code_size_in_bytes") if hasattr(m, k)}
    except Exception as e:  # not every platform implements it
        mem = dict(error=f"{type(e).__name__}: {e}"[:200])
    return dict(cost_analysis=keep, memory_analysis=mem)


def bandwidth_gbps() -> float:
    """Device copy bandwidth: a jitted x + 1 over 1 GiB (GPU; 64 MiB on the CPU), read + write bytes / time."""
    n = (1 << 29) if jax.default_backend() == "gpu" else (1 << 25)
    x = jnp.zeros((n,), jnp.bfloat16)
    f = jax.jit(lambda a: a + jnp.bfloat16(1))
    jax.block_until_ready(f(x))
    times = []
    for _ in range(10):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t)
    del x
    return 2 * n * 2 / min(times) / 1e9


def median_ms(step, state, reps: int):
    """Run ``state = step(state)`` reps times (after 3 warm-up steps); median ms of one step."""
    for _ in range(3):
        state = step(state)
    jax.block_until_ready(state)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        state = step(state)
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), state


def profile(name: str, jitted, args: tuple, hlo_dir: Path, shape: str) -> dict:
    compiled = jitted.lower(*args).compile()
    text = compiled.as_text()
    hlo_dir.mkdir(parents=True, exist_ok=True)
    (hlo_dir / f"{shape}_{name}.txt").write_text(text)
    return dict(**cost(compiled), hlo=parse_hlo(text), hlo_chars=len(text))


def run_shape(shape: str, dims: dict, prompt_len: int, gamma: int, reps: int, dtype, hlo_dir: Path, loop: str) -> dict:
    from flax import nnx

    cfg = LlamaConfig(**dims, max_position_embeddings=8192)
    m = random_model(cfg, dtype=dtype, seed=0)
    m.scan_layers = loop == "scan"
    hlo_dir = hlo_dir / loop
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(m)))
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    s, greedy = backend.steps, SamplingConfig(0.0)
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, prompt_len)).tolist()
    new_tokens = 4 * reps + 64
    seeds = backend._seeds(0)
    donate = dict(donate_argnames=("state",)) if jax.default_backend() == "gpu" else {}
    state = backend.start_state(prompts, new_tokens)
    row = dict(shape=shape, loop=loop, config=dims, dtype=str(jnp.dtype(dtype)), batch=1, prompt_len=prompt_len, gamma=gamma,
               cache_len=int(state.cache.k.shape[3]), kv_cache_bytes=int(2 * state.cache.k.size * state.cache.k.dtype.itemsize),
               weight_bytes=int(weight_bytes), state_donated=bool(donate))

    def spec_step(weights, state, seeds, offset):
        proposal, state = s.draft(0, weights, state, gamma, greedy, seeds, offset)
        z, state = s.score(weights, state, proposal)
        return s.commit(state, s.verify(z, proposal, greedy, seeds, offset))

    def forward(weights, state, tokens, pos):
        z, cache = s.target(weights)(tokens, pos, state.cache)
        return z, state._replace(cache=cache)

    spec_jit = jax.jit(spec_step, **donate)
    fwd_jit = jax.jit(forward, **donate)
    off = jnp.uint32(0)
    one = jnp.zeros((1, 1), jnp.int32)
    pos = jnp.full((1, 1), prompt_len, jnp.int32)
    w = backend.weights
    row["executables"] = {
        "decode": profile("decode", backend.decode_jit, (w, state, greedy, seeds, off), hlo_dir, shape),
        "spec": profile("spec", spec_jit, (w, state, seeds, off), hlo_dir, shape),
        "forward": profile("forward", fwd_jit, (w, state, one, pos), hlo_dir, shape),
    }
    checks = {}
    ms, state = median_ms(lambda st: backend.decode_jit(w, st, greedy, seeds, off)[0], state, reps)
    row["decode_ms_per_step"] = ms
    ms, state = median_ms(lambda st: fwd_jit(w, st, one, pos)[1], state, reps)
    row["forward_ms"] = ms
    state = backend.start_state(prompts, new_tokens)
    ms, state = median_ms(lambda st: spec_jit(w, st, seeds, off)[0], state, reps)
    row["spec_ms_per_step"] = ms
    checks["tokens_in_vocab"] = bool(jnp.all((state.seqs.tokens >= 0) & (state.seqs.tokens < cfg.vocab_size)))
    checks["finite_logits"] = bool(jnp.all(jnp.isfinite(fwd_jit(w, state, one, pos)[0])))  # state donated
    row["checks"] = checks
    return row


def one_row(name: str, dims: dict, loop: str, args, dtype, bw: float) -> dict:
    t0 = time.perf_counter()
    try:
        row = run_shape(name, dims, args.prompt_len, args.gamma, args.reps, dtype, args.out / "hlo", loop)
    except Exception as e:  # one shape failing must not lose the others
        row = dict(shape=name, loop=loop, error=f"{type(e).__name__}: {e}"[:1000])
    row["wall_s"] = time.perf_counter() - t0
    if "weight_bytes" in row:
        row["weights_floor_ms"] = row["weight_bytes"] / (bw * 1e9) * 1e3
        row["decode_over_floor"] = row["decode_ms_per_step"] / row["weights_floor_ms"]
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama3-8b,tinyllama-1.1b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tag", default="")
    ap.add_argument("--loops", default="scan,unrolled",
                    help="the model's layer loops to profile (flashspec_jax.model.Llama.scan_layers)")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args(argv)
    if args.dry_run:
        shapes, args.prompt_len, args.reps = {"tiny": TINY}, 16, 3
    else:
        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            ap.error(f"--shapes: unknown {sorted(unknown)}; choose from {sorted(SHAPES)}")
        shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    bw = bandwidth_gbps()
    rows = []
    loops = args.loops.split(",")
    if set(loops) - {"scan", "unrolled"}:
        ap.error(f"--loops: {args.loops!r}; choose from scan, unrolled")
    for name, dims in shapes.items():
        for loop in loops:
            rows.append(one_row(name, dims, loop, args, dtype, bw))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "executables"}), flush=True)
    dev = jax.devices()[0]
    result = dict(script="benchmarks/jax_profile_gpu.py", device=getattr(dev, "device_kind", str(dev)),
                  platform=jax.default_backend(), jax=jax.__version__, python=platform.python_version(),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), dry_run=args.dry_run,
                  xla_flags=os.environ.get("XLA_FLAGS", ""), copy_bandwidth_gbps=bw, notes="cost_analysis counts a while loop's body once (the layer scan: "
                  "per-layer bytes); memory_analysis alias bytes = donated buffers reused in place", rows=rows,
                  passed=all("error" not in r and all(r["checks"].values()) for r in rows))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"jax_profile{'_dry_run' if args.dry_run else ''}{args.tag}.json"
    path.write_text(json.dumps(result, indent=1))
    print(path)
    for r in rows:
        if "error" in r:
            print(f"{r['shape']}: error {r['error'][:200]}")
            continue
        d = r["executables"]["decode"]
        print(f"{r['shape']} {r['loop']}: decode {r['decode_ms_per_step']:.3f} ms (floor {r['weights_floor_ms']:.3f}), spec "
              f"{r['spec_ms_per_step']:.3f} ms, forward {r['forward_ms']:.3f} ms; decode bytes accessed "
              f"{d['cost_analysis'].get('bytes accessed', 0) / 1e9:.3f} GB, movers "
              f"{ {k: round(v / 1e6, 1) for k, v in d['hlo']['mover_bytes_by_op'].items()} } MB")


if __name__ == "__main__":
    main()
