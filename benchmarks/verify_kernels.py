"""Timing of flashspec_torch.verify: impl="triton" (the fused kernels) against impl="reference".

    python benchmarks/verify_kernels.py            # the full grid on a GPU (about 4-5 minutes on an H200)
    python benchmarks/verify_kernels.py --quick    # a few shapes
    python benchmarks/verify_kernels.py --dry-run  # tiny shapes; on a CPU through the Triton interpreter

Per shape (B, G, V, logits dtype, draft kind): first the Triton tokens must equal the torch
reference's on random inputs, and a CUDA-graph replay of the Triton step (with new seed / offset
written into device tensors) must equal eager; then each impl is timed as the median of CUDA-event
timings (``triton.testing.do_bench``, return_mode="median"), cycling through enough input sets to
exceed the 60 MB L2 three times, plus the Triton step replayed from a CUDA graph (launch overhead
removed). Bytes required per step: one read of the target logits [B, G+1, V] and of the draft
row n [B, V] (plus [B, G] scalars), compared with a measured device-to-device copy bandwidth.

Writes $OUT/verify_kernels.json (default benchmarks/results/) with the hardware, versions and date,
and verify_kernels.png when matplotlib is importable. Rows of benchmarks/verify_kernels_jax.py's
``run_jax(shapes)`` are merged when it imports.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time

L2_BYTES = 60 * 2**20
HERE = pathlib.Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    ints = lambda s: [int(t) for t in s.split(",")]  # noqa: E731
    strs = lambda s: s.split(",")  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=ints, default=[1, 8, 32, 128, 256])
    p.add_argument("--gamma", type=ints, default=[1, 4, 8])
    p.add_argument("--vocab", type=ints, default=[32000, 128256])
    p.add_argument("--dtypes", type=strs, default=["bfloat16", "float32"])
    p.add_argument("--drafts", type=strs, default=["logits", "logprobs"],
                   help="logits: draft_logits only; logprobs: draft_logits + draft_logprobs; onehot: no draft logits")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="B in {1, 32, 256}, G=4, both V, bf16, logits drafts")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes; runs on a CPU with TRITON_INTERPRET=1")
    p.add_argument("--no-jax", action="store_true", help="skip benchmarks/verify_kernels_jax.py")
    p.add_argument("--jax-all", action="store_true",
                   help="give run_jax every shape (default: B in {1, 32, 256}, G=4: JAX compiles per shape)")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.gamma, args.dtypes, args.drafts = [1, 32, 256], [4], ["bfloat16"], ["logits"]
    if args.dry_run:
        args.batch, args.gamma, args.vocab, args.dtypes = [1, 3], [1, 4], [1000], ["bfloat16", "float32"]
    return args


def shapes_from(args) -> list[dict]:
    return [dict(B=b, G=g, V=v, dtype=d, draft=k, temperature=args.temperature)
            for v, d, k, g, b in itertools.product(args.vocab, args.dtypes, args.drafts, args.gamma, args.batch)]


# ----------------------------------------------------------------------------- inputs


def target_rows(shape: dict, device, gen):  # -> z [B, G+1, V] float32
    """shape["rows"]: "flat" (the default: 2 N(0, 1), every logit alike, the sweep's worst case) or "llm"
    (peaked rows drawn from SmolLM2's recorded decoding rows, ``llm_rows.sample_rows``)."""
    import torch

    b, g, v = shape["B"], shape["G"], shape["V"]
    kind = shape.get("rows", "flat")
    if kind == "flat":
        return 2.0 * torch.randn(b, g + 1, v, device=device, generator=gen)
    if kind != "llm":
        raise ValueError(f"rows={kind!r} must be 'flat' or 'llm'")
    import llm_rows

    record = llm_rows.load()
    n = b * (g + 1)
    z = torch.empty(n, v, device=device)
    for r0 in range(0, n, 256):  # bounded temporaries
        z[r0:r0 + 256] = llm_rows.sample_rows(record, min(256, n - r0), v, device, gen, first=r0)
    return z.view(b, g + 1, v)


def make_inputs(shape: dict, device, gen) -> dict:
    """z [B, G+1, V] (``target_rows``), x [B, G] drawn from q (Gumbel-max), w [B, G, V] near z, lq [B, G] = log q(x)."""
    import torch

    b, g, v, t = shape["B"], shape["G"], shape["V"], shape["temperature"]
    dtype = getattr(torch, shape["dtype"])
    z = target_rows(shape, device, gen)
    w = z[:, :g] + 1.4 * torch.randn(b, g, v, device=device, generator=gen)
    u = torch.rand(b, g, v, device=device, generator=gen).clamp_(1e-7, 1 - 1e-7)
    log_q = torch.log_softmax(w.to(dtype).float() / t, -1)
    x = (log_q - torch.log(-torch.log(u))).argmax(-1)
    lq = log_q.gather(-1, x[..., None])[..., 0]
    del u, log_q
    inp = dict(target_logits=z.to(dtype), draft_tokens=x, draft_logits=w.to(dtype), draft_logprobs=lq)
    if shape["draft"] != "logprobs":
        inp["draft_logprobs"] = None
    if shape["draft"] == "onehot":
        inp["draft_logits"] = None
    return inp


def input_sets(shape: dict, device) -> list[dict]:
    """Enough independent input sets that cycling through them never hits a warm L2."""
    import torch

    itemsize = 2 if shape["dtype"] in ("bfloat16", "float16") else 4
    per_set = (2 * shape["G"] + 1) * shape["B"] * shape["V"] * itemsize
    count = max(2, min(64, math.ceil(3 * L2_BYTES / per_set)))
    gen = torch.Generator(device=device).manual_seed(shape["B"] * 7919 + shape["G"] * 31 + shape["V"])
    return [make_inputs(shape, device, gen) for _ in range(count)]


def bytes_required(shape: dict) -> int:
    """One read of the target logits and of the draft row n, plus the [B, G] scalars and outputs."""
    itemsize = 2 if shape["dtype"] in ("bfloat16", "float16") else 4
    b, g, v = shape["B"], shape["G"], shape["V"]
    draft_row = 0 if shape["draft"] == "onehot" else b * v * itemsize
    return b * (g + 1) * v * itemsize + draft_row + b * g * (8 + 4) + b * (g + 2) * 4


# ----------------------------------------------------------------------------- timing


def copy_bandwidth_gbps(device) -> float:
    """Device-to-device copy of 1 GiB: (read + write) bytes / median time."""
    import torch
    import triton.testing

    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def time_eager(step, sets: list[dict], on_gpu: bool) -> float:
    """Median milliseconds of one call, cycling through the input sets."""
    cycle = itertools.cycle(sets)
    if on_gpu:
        import triton.testing

        return triton.testing.do_bench(lambda: step(next(cycle)), return_mode="median")
    times = []
    for inp in itertools.islice(cycle, 3):
        t0 = time.perf_counter()
        step(inp)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def capture(step, sets: list[dict]):
    """One CUDA graph running the step once per input set; returns (graph, outputs)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for inp in sets[:2]:
            step(inp)  # compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [step(inp) for inp in sets]
    return graph, outs


def time_graph(graph, calls: int, reps: int = 30, warmup_ms: float = 100.0, min_calls: int = 32) -> float:
    """Median milliseconds per step of graph replays (CUDA events), after at least ``warmup_ms`` of
    replays: the first graph timed at a shape used to come out up to 12% slower than the same
    configuration timed again right after it (H200, ``verify_variants_reverse.json``: "lanes" against
    "lanes-again" at G = 8), with only one replay before timing.

    Each timed interval replays the graph back to back until it holds at least ``min_calls`` steps,
    behind an untimed replay, so that the host's launch of a replay overlaps the previous replay on
    the GPU, as in an engine whose decode loop is one graph. ``min_calls=1`` (one replay between the
    events, the method before 2026-12-05) counts that launch latency divided by the graph's calls:
    10-18 us per replay in the committed H200 runs' empty graphs, ~4-8 us a step where a graph holds
    2 input sets (the large shapes); ``verify_floor.py --single-replay`` times both ways."""
    import torch

    replays = max(1, math.ceil(min_calls / calls))
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spent = 0.0
    while spent < warmup_ms:
        start.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        spent += start.elapsed_time(end)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if min_calls > 1:
            graph.replay()  # untimed lead-in: the GPU runs it while the host launches the timed replays
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (calls * replays))
    return statistics.median(times)


# ----------------------------------------------------------------------------- one shape


def run_shape(shape: dict, device, copy_gbps: float | None) -> list[dict]:
    import torch

    from flashspec_torch import verify

    on_gpu = device.type == "cuda"
    sets = input_sets(shape, device)
    b = shape["B"]
    seed = torch.full((b,), 7, dtype=torch.int64, device=device)
    offset = torch.zeros((), dtype=torch.int64, device=device)

    def step_for(impl):
        def step(inp):
            return verify(**inp, temperature=shape["temperature"], seed=seed, offset=offset, impl=impl)
        return step

    steps = {impl: step_for(impl) for impl in ("triton", "reference")}
    got = {impl: f(sets[0]) for impl, f in steps.items()}
    ok = all(torch.equal(getattr(got["triton"], k), getattr(got["reference"], k)) for k in ("num_accepted", "tokens"))
    mismatched_rows = int((got["triton"].tokens != got["reference"].tokens).any(-1).sum())
    graph_ok, graph_ms = None, None
    if on_gpu:
        graph, outs = capture(steps["triton"], sets)
        seed.fill_(11)
        offset.fill_(5)  # new randomness, written in place: the graph reads it on replay
        graph.replay()
        eager = steps["triton"](sets[-1])
        torch.cuda.synchronize()
        graph_ok = bool(torch.equal(outs[-1].tokens, eager.tokens))
        graph_ms = time_graph(graph, len(sets))
        del graph, outs
    need = bytes_required(shape)
    rows = []
    times = {impl: time_eager(f, sets, on_gpu) for impl, f in steps.items()}
    for impl, ms in times.items():
        row = dict(backend="torch", impl=impl, **shape, median_ms=ms, ok=ok, mismatched_rows=mismatched_rows,
                   buffers=len(sets), bytes_required=need, gbps=need / (ms * 1e-3) / 1e9,
                   speedup_vs_reference=times["reference"] / ms)
        if impl == "triton":
            row.update(graph_ok=graph_ok, graph_median_ms=graph_ms)
            if graph_ms:
                row["graph_gbps"] = need / (graph_ms * 1e-3) / 1e9
        if copy_gbps:
            row["fraction_of_copy_bw"] = row["gbps"] / copy_gbps
        rows.append(row)
    del sets
    if on_gpu:
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- output


def environment(device) -> dict:
    import torch
    import triton

    hw = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return dict(hardware=hw, device=str(device), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, python=platform.python_version(),
                interpreter=os.environ.get("TRITON_INTERPRET") == "1",
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def run_jax_rows(shapes: list[dict], every_shape: bool) -> tuple[list[dict], str]:
    """benchmarks/verify_kernels_jax.py's rows, if it imports (drafts it knows: logits, onehot)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    sys.path.insert(0, str(HERE))
    try:
        from verify_kernels_jax import run_jax
    except Exception as e:  # noqa: BLE001 - optional companion script
        return [], f"not run: {type(e).__name__}: {e}"
    jax_shapes = [s for s in shapes if s["draft"] in ("logits", "onehot")]
    if not every_shape:
        subset = [s for s in jax_shapes if s["B"] in (1, 32, 256) and s["G"] == 4]
        jax_shapes = subset or jax_shapes[:4]
    try:
        return run_jax(jax_shapes), "ok"
    except Exception as e:  # noqa: BLE001 - report, keep the torch results
        return [], f"failed: {type(e).__name__}: {e}"


def plot(rows: list[dict], path: pathlib.Path, copy_gbps: float | None = None) -> str:
    """Per (V, dtype): step times against B (top: eager medians, and Triton's CUDA-graph replay), and
    the graph replay over the memory floor with the 1.5x line (bottom, needs ``copy_gbps``). Draft
    logits where the run has them, else draft log-probs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped: matplotlib is not installed"
    drafts = {r.get("draft", "logits") for r in rows}
    draft = "logits" if "logits" in drafts else sorted(drafts)[0]
    panels = sorted({(r["V"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 8), squeeze=False)
    for col, (v, dtype) in enumerate(panels):
        sel = [r for r in rows if r["V"] == v and r["dtype"] == dtype and r.get("draft", "logits") == draft]
        for key in sorted({(r["backend"], r["impl"], r["G"]) for r in sel}):
            pts = sorted(((r["B"], r) for r in sel if (r["backend"], r["impl"], r["G"]) == key), key=lambda p: p[0])
            label = f"{key[0]}/{key[1]} G={key[2]}"
            bs = [p[0] for p in pts]
            axes[0][col].plot(bs, [1e3 * p[1]["median_ms"] for p in pts], marker="o", label=f"{label} eager")
            graph = [(p[0], p[1]["graph_median_ms"]) for p in pts if p[1].get("graph_median_ms")]
            if graph:
                axes[0][col].plot([g[0] for g in graph], [1e3 * g[1] for g in graph], marker="s", ls="--",
                                  label=f"{label} graph")
                if copy_gbps:
                    floor = {p[0]: p[1]["bytes_required"] / (copy_gbps * 1e9) * 1e3 for p in pts}
                    axes[1][col].plot([g[0] for g in graph], [g[1] / floor[g[0]] for g in graph], marker="s",
                                      label=f"{label} graph")
        axes[0][col].set(title=f"V={v} {dtype}, draft {draft}", xscale="log", yscale="log", ylabel="median us/step")
        axes[1][col].axhline(1.5, color="grey", lw=0.8, ls=":")
        axes[1][col].set(xscale="log", yscale="log", xlabel="batch B", ylabel="graph time / memory floor")
        for ax in axes[:, col]:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    on_gpu = torch.cuda.is_available()
    if not torch.cuda.is_available():
        if not args.dry_run:
            print("no CUDA device: use --dry-run (tiny shapes through the Triton interpreter)")
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before flashspec_torch defines its kernels
    device = torch.device("cuda" if on_gpu else "cpu")
    t0 = time.perf_counter()
    shapes = shapes_from(args)
    copy_gbps = copy_bandwidth_gbps(device) if on_gpu else None
    rows = []
    for shape in shapes:
        new = run_shape(shape, device, copy_gbps)
        rows.extend(new)
        t = {r["impl"]: r for r in new}
        print(f"B={shape['B']:4d} G={shape['G']} V={shape['V']:6d} {shape['dtype']:8s} {shape['draft']:8s} "
              f"triton {1e3 * t['triton']['median_ms']:9.1f} us (graph {1e3 * (t['triton']['graph_median_ms'] or 0):8.1f}) "
              f"reference {1e3 * t['reference']['median_ms']:9.1f} us  x{t['triton']['speedup_vs_reference']:.2f}  "
              f"ok={t['triton']['ok']} graph_ok={t['triton']['graph_ok']}", flush=True)
    jax_rows, jax_status = ([], "skipped (--no-jax)") if args.no_jax else run_jax_rows(shapes, args.jax_all)
    rows.extend(jax_rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(environment=environment(device), copy_bandwidth_gbps=copy_gbps, jax=jax_status,
                  seconds=time.perf_counter() - t0, all_tokens_match=all(r["ok"] for r in rows if "ok" in r),
                  rows=rows)
    result["plot"] = plot(rows, out / "verify_kernels.png", copy_gbps)
    (out / "verify_kernels.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'verify_kernels.json'} ({len(rows)} rows, {result['seconds']:.0f} s); plot: {result['plot']}; "
          f"jax: {jax_status}")
    return 0 if result["all_tokens_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
