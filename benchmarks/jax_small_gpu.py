"""The JAX engine's plain decode step at small shapes (issue #37): its kernels, and variants timed.

    python benchmarks/jax_small_gpu.py --out DIR --budget-s 200    # on the H100 (random bf16 weights)
    python benchmarks/jax_small_gpu.py --dry-run --out DIR         # a tiny config on the CPU, JAX only

Per shape (SmolLM2-135M, TinyLlama-1.1B; batch 1, 128-token prompt, greedy), per variant of the
model (``LOOP:ATTENTION``: the layer loop, ``flashspec_jax.model.Llama.scan_layers`` (``default``: the
model's choice at the shape, ``other``: the opposite), and the
attention, ``Llama.attention_impl``: ``xla`` the einsum over every cache slot, ``pallas`` the
decode-attention kernel, ``fused`` one kernel for RoPE, the cache write and the attention; and
optionally the attention kernels' cache slots per loop step, ``kernels.attention.BLOCK_S``, 64 unless given):

* plain decoding's ms per token through the engine's loop (``flashspec.loop.decode`` over
  ``JaxBackend``: wall time / tokens, and the mean launch-to-launch step time the torch rows use)
  and its greedy tokens, compared with the first variant's;
* a ``jax.profiler`` trace of ``--trace-steps`` decode steps (``JaxBackend.decode_jit``, the state
  donated as the engine does), parsed (``parse_trace``): per kernel name its count per step and
  device time, the device's busy time per step and the step's span from first kernel start to
  last kernel end, so the launch gaps show (span - busy);
* ``logits_check``: the scan's logits with the kernels against the einsum's, one 1- and one
  5-position forward from the same cache (relative max difference < 0.05 is the check: bf16 rounding
  differs, a wrong kernel does not come close); greedy tokens are information only (random bf16
  weights have near-tied logits, so any rounding change may part them);
* torch's plain ms per token once per shape (CUDA graphs, ``engine_gpu.time_engine``), for the ratio.

``--budget-s`` bounds the run, shared equally by the shapes: a part that would start past its
shape's share is skipped (recorded as skipped).
One JSON to ``--out``/jax_small.json (the traces are parsed in a temporary directory, not kept).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shape_children import guarded  # noqa: E402  (benchmarks/; no GPU work, no torch)

SMALL = "smollm2-135m,tinyllama-1.1b"  # engine_gpu.SHAPES' names (imported in main: that module imports torch)
TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=6, num_kv_heads=2,
            head_dim=16)
VARIANTS = "default:fused,default:fused:128,other:fused,default:xla"
ATTENTIONS = ("xla", "pallas", "fused")  # flashspec_jax.model.ATTENTION_IMPLS
LOOPS = ("default", "other", "scan", "unrolled")  # default: the model's choice for the shape (Llama.uses_scan); other: the opposite
HOST_NOISE = ("end: ", "$")  # CPU trace: thunk end markers and Python frames are not kernels


# -- the trace


def load_trace(trace_dir: Path) -> dict:
    """The perfetto JSON (``create_perfetto_trace=True``) under a ``jax.profiler.trace`` directory,
    else the TensorBoard ``*.trace.json.gz`` (the same Chrome trace format)."""
    found = sorted(trace_dir.rglob("perfetto_trace.json.gz")) or sorted(trace_dir.rglob("*.trace.json.gz"))
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz or *.trace.json.gz under {trace_dir}")
    with gzip.open(found[-1], "rt") as f:
        return json.load(f)


def thread_names(trace: dict) -> dict:
    """"process / thread" -> its number of complete events (the 20 busiest): what the trace holds."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e.get("pid"), e.get("tid") if e["name"] == "thread_name" else None)] = str(e.get("args", {}).get("name", ""))
    counts = defaultdict(int)
    for e in events:
        if e.get("ph") == "X":
            counts[f"{names.get((e.get('pid'), None), e.get('pid'))} / {names.get((e.get('pid'), e.get('tid')), e.get('tid'))}"] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:20])


def kernel_events(trace: dict) -> tuple[list[dict], str]:
    """The trace's device work: complete ('X') events on a device's stream threads (a GPU: processes
    named ``/device:GPU:N``, threads named ``Stream ...``); where there are none (the CPU), the XLA
    thunks on host threads (events with an ``hlo_op`` argument). Returns (events, which)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    device = [e for e in complete if procs.get(e.get("pid"), "").startswith("/device:")
              and "stream" in threads.get((e.get("pid"), e.get("tid")), "").lower()]
    if device:
        return device, "device streams"
    thunks = [e for e in complete if "hlo_op" in e.get("args", {}) and not e["name"].startswith(HOST_NOISE)]
    return thunks, "host thunks (no device stream in the trace)"


def parse_trace(trace: dict, steps: int, top: int = 40) -> dict:
    """Per kernel name: count per step, total and mean device time; the device's busy time (union of
    kernel intervals) per step, the span from first start to last end per step, and the host's time
    in ``PjitFunction`` events (dispatch, nested events counted once each) per step."""
    events, source = kernel_events(trace)
    if not events:
        return dict(source=source, kernels_per_step=0, error="no kernel events in the trace", threads=thread_names(trace))
    by_name = defaultdict(lambda: [0, 0.0, None])
    for e in events:
        rec = by_name[e["name"]]
        rec[0] += 1
        rec[1] += float(e["dur"])
        rec[2] = rec[2] or e.get("args", {}).get("hlo_op")
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events)
    busy, end = 0.0, float("-inf")
    for a, b in spans:  # the union of the intervals (kernels on several streams may overlap)
        if b > end:
            busy += b - max(a, end)
            end = b
    span = max(b for _, b in spans) - spans[0][0]
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    dispatch = [float(e["dur"]) for e in raw if e.get("ph") == "X" and str(e.get("name", "")).startswith("PjitFunction")]
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])
    kernels = [dict(name=n[:160], hlo_op=op, per_step=c / steps, us_per_step=t / steps, mean_us=t / c)
               for n, (c, t, op) in rows[:top]]
    return dict(source=source, steps=steps, kernels_per_step=len(events) / steps, distinct_kernels=len(by_name),
                busy_us_per_step=busy / steps, span_us_per_step=span / steps, gap_us_per_step=(span - busy) / steps,
                host_dispatch_us_per_step=sum(dispatch) / steps if dispatch else None, top_kernels=kernels,
                threads=thread_names(trace))


# -- JAX


def resolve(m, variants: list[str]) -> list[str]:
    """``default`` and ``other`` loops named as the model runs them at this shape (duplicates dropped)."""
    m.scan_layers = None
    default = "scan" if m.uses_scan() else "unrolled"
    other = {"scan": "unrolled", "unrolled": "scan"}[default]
    named = [v.replace("default:", f"{default}:").replace("other:", f"{other}:") for v in variants]
    return list(dict.fromkeys(named))


def parse_variant(v: str) -> list[str]:
    """LOOP:ATTENTION[:BLOCK_S] -> [LOOP, ATTENTION, BLOCK_S] (BLOCK_S 64 unless given; [] if malformed)."""
    parts = v.split(":")
    return parts + ["", "", "64"][len(parts):] if 2 <= len(parts) <= 3 else []


def variant_model(m, variant: str):
    """A variant onto the model (BLOCK_S: the attention kernels' slots per step, a module default)."""
    from flashspec_jax.kernels import attention

    loop, attn, block = parse_variant(variant)
    m.scan_layers, m.attention_impl = loop == "scan", attn
    attention.BLOCK_S = int(block)
    return m


def jax_variant(m, variant: str, prompts, tokens: int, trace_steps: int) -> dict:
    import jax
    import numpy as np

    from flashspec.config import SamplingConfig
    from flashspec.loop import decode
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    variant_model(m, variant)
    row = dict(variant=variant, layer_loop="scan" if m.uses_scan() else "unrolled", attention=m.attention_choice())
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    greedy, seed = SamplingConfig(0.0), np.zeros(len(prompts), np.uint64)
    t0 = time.perf_counter()
    decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)  # compiles
    row["compile_and_first_run_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs, rec = decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)
    wall = time.perf_counter() - t0
    row.update(ms_per_token=wall * 1e3 / len(rec), step_ms_launch_to_launch=statistics.mean(r.seconds for r in rec) * 1e3,
               tokens=outs)
    state = backend.start_state(prompts, tokens)
    step = lambda st: backend.decode_jit(backend.leaves, st, greedy, backend._seeds(0), np.uint32(0), rows=1)[0]  # noqa: E731
    for _ in range(3):
        state = step(state)
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(trace_steps):
                state = step(state)
            jax.block_until_ready(state)
        try:
            row["trace"] = parse_trace(load_trace(Path(d)), trace_steps)
        except Exception as e:  # the timings stand without the trace
            row["trace"] = dict(error=f"{type(e).__name__}: {e}"[:500])
    return row


def logits_check(m, prompts, variants=("scan:xla", "scan:fused")) -> dict:
    """Each variant's logits against the first's on one 1-position and one 5-position forward from the
    same prefilled cache (the scan: one compiled layer): max |difference| / max |logit| and whether
    each position's argmax agrees. bf16 rounding differs between the implementations; a wrong kernel
    shows as a large difference."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    prompt = jnp.asarray(prompts)[:, :-5]  # [1, P - 5]
    b, p = prompt.shape
    cache = m.new_cache(b, 384)
    pos = jnp.arange(p)[None]
    variant_model(m, variants[0])
    _, cache = nnx.jit(lambda m, x, q, c: m(x, q, c, logits=False))(m, prompt, pos, cache)
    out, ref = {}, {}
    for v in variants:
        variant_model(m, v)
        fwd = nnx.jit(lambda m, x, q, c: m(x, q, c)[0])
        for t in (1, 5):
            z = np.asarray(fwd(m, jnp.asarray(prompts)[:, p : p + t], p + jnp.arange(t)[None], cache), np.float32)
            if v == variants[0]:
                ref[t] = z
                continue
            out[f"{v}_t{t}"] = dict(rel_max_diff=float(np.abs(z - ref[t]).max() / np.abs(ref[t]).max()),
                                    argmax_agree=bool((z.argmax(-1) == ref[t].argmax(-1)).all()))
    return out


def torch_plain(dims: dict, prompts, tokens: int) -> dict:
    import engine_gpu
    import torch
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft as TorchLookup
    from flashspec_torch.model import LlamaConfig as TorchConfig

    m = engine_gpu.random_model(TorchConfig(**dims, max_position_embeddings=8192))
    with torch.inference_mode():
        backend = TorchBackend(m, [TorchLookup()], eos_ids=[], verify_impl="triton", graphs=True)
        r = engine_gpu.time_engine(backend, prompts, tokens, torch.zeros(len(prompts), dtype=torch.int64, device="cuda"))
    del backend, m
    torch.cuda.empty_cache()
    return dict(ms_per_token=r["ar_ms_per_token"], wall_ms_per_token=r["ar_wall_ms"] / tokens)


def run_shape(name: str, dims: dict, args, variants: list[str], deadline: float, save) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    cfg = LlamaConfig(**dims, max_position_embeddings=8192)
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, args.prompt_len)).tolist()
    row = dict(shape=name, config=dims, batch=1, prompt_len=args.prompt_len, new_tokens=args.tokens, variants={})
    if args.torch:
        row["torch"] = guarded(lambda: torch_plain(dims, prompts, args.tokens), deadline, "wall_s")
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    m = random_model(cfg, dtype=dtype, seed=0)
    row["dtype"] = str(jnp.dtype(dtype))
    row["logits_check"] = guarded(lambda: logits_check(m, prompts), deadline, "wall_s")
    for v in resolve(m, variants):
        row["variants"][v] = guarded(lambda v=v: jax_variant(m, v, prompts, args.tokens, args.trace_steps), deadline, "wall_s")
        print(json.dumps({k: x for k, x in row["variants"][v].items() if k not in ("tokens", "trace")}), flush=True)
        save(row)
    first = next((r["tokens"] for r in row["variants"].values() if "tokens" in r), None)
    for r in row["variants"].values():
        if "tokens" in r:
            r["tokens_equal_first_variant"] = r.pop("tokens") == first
    t = row.get("torch", {})
    for r in row["variants"].values():  # like with like: launch-to-launch steps, and wall time per token
        if "ms_per_token" in t and "ms_per_token" in r:
            r["over_torch"] = r["step_ms_launch_to_launch"] / t["ms_per_token"]
            r["over_torch_wall"] = r["ms_per_token"] / t["wall_ms_per_token"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["shape | variant | ms/token (wall) | step ms | JAX/torch (steps) | JAX/torch (wall) | kernels/step | busy us | span us | gap us | tokens = first"]
    for r in rows:
        t = r.get("torch", {})
        lines.append(f"{r['shape']} | torch (CUDA graphs) | {t.get('wall_ms_per_token', float('nan')):.3f} | "
                     f"{t.get('ms_per_token', float('nan')):.3f} | | | | | | |")
        for v, x in r["variants"].items():
            if "ms_per_token" not in x:
                lines.append(f"{r['shape']} | {v} | {x.get('error') or x.get('skipped')}"[:240])
                continue
            t = x.get("trace", {})
            lines.append(f"{r['shape']} | {v} | {x['ms_per_token']:.3f} | {x['step_ms_launch_to_launch']:.3f} | "
                         f"{x.get('over_torch', float('nan')):.2f} | {x.get('over_torch_wall', float('nan')):.2f} | "
                         f"{t.get('kernels_per_step', float('nan')):.0f} | "
                         f"{t.get('busy_us_per_step', float('nan')):.0f} | {t.get('span_us_per_step', float('nan')):.0f} | "
                         f"{t.get('gap_us_per_step', float('nan')):.0f} | {x.get('tokens_equal_first_variant')}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SMALL)
    ap.add_argument("--variants", default=VARIANTS, help="LOOP:ATTENTION[:BLOCK_S], LOOP in default/other/scan/unrolled, ATTENTION in xla/pallas/fused, BLOCK_S (the attention kernels' slots per step, kernels.attention.BLOCK_S) 16/32/64/128")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--trace-steps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=200.0, help="parts that would start after this many seconds are skipped")
    ap.add_argument("--no-torch", dest="torch", action="store_false")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU, JAX only")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args(argv)
    start = time.perf_counter()
    variants = args.variants.split(",")
    for v in variants:
        loop, attn, block = parse_variant(v) or ("", "", "")
        if loop not in LOOPS or attn not in ATTENTIONS or block not in ("16", "32", "64", "128"):
            ap.error(f"--variants: {v!r}; each LOOP:ATTENTION[:BLOCK_S] with LOOP in {'/'.join(LOOPS)}, ATTENTION "
                     f"in {'/'.join(ATTENTIONS)}, BLOCK_S in 16/32/64/128")
    if args.dry_run:
        shapes, args.tokens, args.prompt_len, args.torch, args.trace_steps = {"tiny": TINY}, 8, 16, False, 2
    else:
        from engine_gpu import SHAPES

        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            ap.error(f"--shapes: unknown {sorted(unknown)}; choose from {sorted(SHAPES)}")
        shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
    import jax

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("jax_small_dry_run.json" if args.dry_run else "jax_small.json")
    rows = []

    def partial(row):  # what has run so far, in case the caller's timeout stops the run
        path.write_text(json.dumps(dict(script="benchmarks/jax_small_gpu.py", argv=sys.argv[1:], partial=True,
                                        rows=[*rows, row]), indent=1))

    for i, (n, dims) in enumerate(shapes.items()):  # each shape its share of the budget
        rows.append(run_shape(n, dims, args, variants, start + args.budget_s * (i + 1) / len(shapes), partial))
    versions = dict(jax=jax.__version__, python=platform.python_version())
    if args.torch:
        import torch
        import triton

        versions.update(torch=torch.__version__, triton=triton.__version__)
    checks = {f"{r['shape']}_{v}_ran": "ms_per_token" in x for r in rows for v, x in r["variants"].items()}
    checks |= {f"{r['shape']}_logits_{k}_close": x["rel_max_diff"] < 0.05
               for r in rows for k, x in r.get("logits_check", {}).items() if isinstance(x, dict)}
    info = {f"{r['shape']}_{v}_tokens_equal_first_variant": x["tokens_equal_first_variant"]
            for r in rows for v, x in r["variants"].items() if "tokens_equal_first_variant" in x}
    dev = jax.devices()[0]
    result = dict(script="benchmarks/jax_small_gpu.py", argv=sys.argv[1:], device=getattr(dev, "device_kind", str(dev)),
                  platform=jax.default_backend(), versions=versions, xla_flags=os.environ.get("XLA_FLAGS", ""),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), dry_run=args.dry_run,
                  wall_s=time.perf_counter() - start, checks=checks, passed=all(checks.values()), tokens_equal_first_variant=info,
                  notes="ms_per_token: the engine's plain decoding, wall / tokens (torch: wall_ms_per_token); "
                        "step_ms_launch_to_launch: the mean launch-to-launch step (torch: ms_per_token, "
                        "engine_gpu.time_engine); over_torch compares steps, over_torch_wall walls. trace: busy = union of kernel intervals, span = first start to last "
                        "end, gap = span - busy, all per decode step. Tokens: greedy, bf16 random weights; a variant "
                        "whose rounding differs may part from the first on near-tied logits.", rows=rows)
    path.write_text(json.dumps(result, indent=1))
    print(path)
    print(table(rows))


if __name__ == "__main__":
    main()
