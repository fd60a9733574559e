"""FlashInfer's chain speculative sampling next to flashspec_torch.verify, on a GPU.

    bash scripts/flashinfer_build.sh                     # here, no GPU: .flashinfer/lib/*.so
    python benchmarks/verify_kernels_flashinfer.py       # on the GPU (carry .flashinfer/lib)
    python benchmarks/verify_kernels_flashinfer.py --quick

One run times both: per shape (B, G, V, logits dtype; draft logits) flashspec's steps exactly as
benchmarks/verify_kernels.py times them (``run_shape``: parity with the reference, graph == eager,
then Triton eager, Triton graph, torch reference), then FlashInfer's on the same inputs. The
library is FlashInfer's own kernel (``flashinfer::sampling::ChainSpeculativeSampling<float, int>``,
the launcher its Python ``chain_speculative_sampling`` calls) behind a C entry point,
built without a GPU by ``bash scripts/flashinfer_build.sh`` (benchmarks/flashinfer/chain.cu).

FlashInfer takes probabilities, not logits: fp32 target probs [B, G+1, V] and draft probs
[B, G, V]. Per shape three steps are timed, each from CUDA-graph replays (graph) and eagerly:

* ``kernel``: the kernel alone, both probability tensors given;
* ``target_softmax``: :func:`probabilities` of the target logits (``softmax(z / T, dtype=fp32)``,
  as vLLM prepares them), then the kernel (the draft probs given, as a draft's sampler has them):
  what a step costs from the logits flashspec reads;
* ``both_softmax``: the draft probs computed from the draft logits as well.

Before any timing, :func:`check_law` runs FlashInfer's kernel on the shared exactness suite's
cases (``flashspec.testing.standard_cases``: their p and q after temperature, top-k and top-p,
x drawn from q): structure, then the chi-square of the joint law of (n, y) against ``exact_law``,
Bonferroni over the cases at alpha = 0.01 like the suite.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_LIB = HERE.parent / ".flashinfer" / "lib" / "libflashinfer_chain.so"


def load(path: str | pathlib.Path):
    """The C entry point of benchmarks/flashinfer/chain.cu; FileNotFoundError says how to build it."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: build it with `bash scripts/flashinfer_build.sh` "
                                "(needs the package registry, no GPU) and carry .flashinfer/lib to the GPU")
    lib = ctypes.CDLL(str(path))
    f = lib.flashinfer_chain_speculative_sampling
    f.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_uint] * 3 + [ctypes.c_ulonglong] * 2 + [ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


def chain(f, draft_probs, draft_tokens, target_probs, seed: int = 0, offset: int = 0):
    """(num_accepted [B], tokens [B, G+1]) from FlashInfer's kernel on the current stream.

    draft_probs [B, G, V] fp32, draft_tokens [B, G] int32, target_probs [B, G+1, V] fp32.
    FlashInfer's "emitted draft token number" is flashspec's num_accepted n; its "accepted token
    number" also counts drafts accepted after the first rejection (an acceptance-rate statistic).
    """
    import torch

    b, g, v = draft_probs.shape
    args = (("draft_probs", draft_probs, torch.float32, (b, g, v)), ("draft_tokens", draft_tokens, torch.int32, (b, g)),
            ("target_probs", target_probs, torch.float32, (b, g + 1, v)))
    for name, t, dtype, shape in args:
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape {shape}; got {t.dtype} "
                             f"{tuple(t.shape)} strides {t.stride()}: FlashInfer reads it through a bare "
                             "pointer (call .contiguous() / .to(...) first)")
    for name, t, _, _ in args:
        if not t.is_cuda:
            raise ValueError(f"{name} is on {t.device}: FlashInfer's kernel reads CUDA memory only")
    tokens = torch.empty((b, g + 1), dtype=torch.int32, device=draft_probs.device)
    accepted = torch.zeros((b,), dtype=torch.int32, device=draft_probs.device)
    emitted = torch.zeros((b,), dtype=torch.int32, device=draft_probs.device)
    status = f(draft_probs.data_ptr(), draft_tokens.data_ptr(), target_probs.data_ptr(), tokens.data_ptr(),
               accepted.data_ptr(), emitted.data_ptr(), b, g, v, seed, offset,
               torch.cuda.current_stream().cuda_stream)
    if status != 0:
        raise RuntimeError(f"ChainSpeculativeSampling returned cudaError {status}")
    return emitted, tokens


# ----------------------------------------------------------------------------- the law


def check_law(f, device, n_samples: int = 100_000, alpha: float = 0.01, seed: int = 1234) -> dict:
    """FlashInfer on the exactness suite's cases: structure and the chi-square of (n, y)."""
    import torch

    from flashspec.testing import (case_distributions, chi_square_test, draft_step, exact_law,
                                   standard_cases, structure_problem)

    cases = standard_cases()
    threshold = alpha / len(cases)
    checks = []
    for k, case in enumerate(cases):
        log_p, log_q = case_distributions(case)
        p = np.exp(log_p.astype(np.float64))
        p /= p.sum(-1, keepdims=True)
        x, _ = draft_step(case, n_samples, seed + k, offset=7 * k)
        if log_q is None:  # a one-hot draft: q puts all its mass on the drafted token
            q = np.zeros((case.gamma, case.vocab))
            q[np.arange(case.gamma), case.draft_tokens] = 1.0
        else:
            q = np.exp(log_q.astype(np.float64))
            q /= q.sum(-1, keepdims=True)
        tp = torch.tensor(p, dtype=torch.float32, device=device).expand(n_samples, -1, -1).contiguous()
        dp = torch.tensor(q, dtype=torch.float32, device=device).expand(n_samples, -1, -1).contiguous()
        # a one-hot case's x is column-major (astype of a broadcast keeps order 'K'): copy it row-major
        xt = torch.tensor(np.ascontiguousarray(x), dtype=torch.int32, device=device)
        n, tokens = chain(f, dp, xt, tp, seed=seed + k, offset=7 * k)
        n, tokens = n.cpu().numpy().astype(np.int64), tokens.cpu().numpy().astype(np.int64)
        problem = structure_problem(x, n, tokens, case.vocab)
        law = exact_law(log_p, log_q, case.draft_tokens)
        y = tokens[np.arange(n_samples), n]
        stat, p_value, note = (np.nan, 0.0, problem) if problem else chi_square_test(
            np.bincount(n * case.vocab + np.clip(y, 0, case.vocab - 1), minlength=law.size), law)
        checks.append(dict(case=case.name, structure=problem or "ok", chi2=stat, p_value=p_value,
                           passed=not problem and p_value >= threshold, note=note))
    return dict(n_samples=n_samples, alpha=alpha, threshold=threshold,
                passed=all(c["passed"] for c in checks), checks=checks)


# ----------------------------------------------------------------------------- timing


def probabilities(z, t: float):
    """fp32 softmax(z / T) as vLLM prepares FlashInfer's inputs: z / T in z's dtype, then a softmax
    that reads z's dtype and writes fp32 (two kernels; ``z.float() / T`` first would be three)."""
    import torch

    return torch.softmax(z / t, -1, dtype=torch.float32)  # [..., V]


def run_shape(f, shape: dict, sets: list[dict], copy_gbps: float | None, need: int) -> list[dict]:
    """Rows of the three steps at one shape; ``sets`` are verify_kernels.input_sets (draft logits)."""
    import torch
    import triton.testing

    from verify_kernels import capture, time_graph

    t = shape["temperature"]
    probs = [dict(z=s["target_logits"], w=s["draft_logits"], x=s["draft_tokens"].to(torch.int32),
                  p=probabilities(s["target_logits"], t), q=probabilities(s["draft_logits"], t)) for s in sets]
    steps = {
        "kernel": lambda s: chain(f, s["q"], s["x"], s["p"], seed=7),
        "target_softmax": lambda s: chain(f, s["q"], s["x"], probabilities(s["z"], t), seed=7),
        "both_softmax": lambda s: chain(f, probabilities(s["w"], t), s["x"], probabilities(s["z"], t), seed=7),
    }
    rows = []
    for name, step in steps.items():
        cycle = itertools.cycle(probs)
        eager_ms = triton.testing.do_bench(lambda: step(next(cycle)), return_mode="median")
        graph, outs = capture(step, probs)
        graph_ms = time_graph(graph, len(probs))
        n = torch.cat([o[0] for o in outs]).float()
        del graph, outs
        row = dict(backend="flashinfer", impl=name, **shape, median_ms=eager_ms, graph_median_ms=graph_ms,
                   buffers=len(probs), bytes_required=need, gbps=need / (eager_ms * 1e-3) / 1e9,
                   graph_gbps=need / (graph_ms * 1e-3) / 1e9, mean_num_accepted=float(n.mean()))
        if copy_gbps:
            row["fraction_of_copy_bw"] = row["graph_gbps"] / copy_gbps
        rows.append(row)
    del probs
    torch.cuda.empty_cache()
    return rows


def run_flashinfer(shapes: list[dict], lib: str | pathlib.Path, device, copy_gbps: float | None) -> tuple[list[dict], dict]:
    """(timing rows, law check) for the shapes with draft logits; raises if the library is missing."""
    import torch

    from verify_kernels import bytes_required, input_sets

    f = load(lib)
    law = check_law(f, device)
    rows = []
    for shape in [s for s in shapes if s["draft"] == "logits"]:
        sets = input_sets(shape, device)
        rows.extend(run_shape(f, shape, sets, copy_gbps, bytes_required(shape)))
        del sets
        torch.cuda.empty_cache()
        r = {x["impl"]: x for x in rows[-3:]}
        print(f"flashinfer B={shape['B']:4d} G={shape['G']} V={shape['V']:6d} {shape['dtype']:8s} "
              + " ".join(f"{k} {1e3 * x['graph_median_ms']:8.1f} us" for k, x in r.items()), flush=True)
    return rows, law


def summarise(rows: list[dict]) -> list[dict]:
    """flashspec's Triton graph time against FlashInfer's per shape (rows of both, draft logits)."""
    key = lambda r: (r["B"], r["G"], r["V"], r["dtype"])  # noqa: E731
    ours = {key(r): r for r in rows if r["backend"] == "torch" and r["impl"] == "triton" and r["draft"] == "logits"}
    out = []
    for r in rows:
        if r["backend"] == "flashinfer" and key(r) in ours and ours[key(r)].get("graph_median_ms"):
            out.append(dict(B=r["B"], G=r["G"], V=r["V"], dtype=r["dtype"], flashinfer_step=r["impl"],
                            flashinfer_us=1e3 * r["graph_median_ms"],
                            triton_us=1e3 * ours[key(r)]["graph_median_ms"],
                            flashinfer_over_triton=r["graph_median_ms"] / ours[key(r)]["graph_median_ms"]))
    return out


def median_ratio(summary: list[dict], step: str) -> float:
    vals = [s["flashinfer_over_triton"] for s in summary if s["flashinfer_step"] == step]
    return statistics.median(vals) if vals else float("nan")


def graph_capturable(f, device) -> str:
    """'ok' if FlashInfer's launcher can be captured in a CUDA graph, else why not."""
    import torch

    p = torch.full((2, 3, 64), 1 / 64, device=device)
    x = torch.zeros((2, 2), dtype=torch.int32, device=device)
    q = p[:, :2].contiguous()
    try:
        chain(f, q, x, p)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(f, q, x, p)
        graph.replay()
        torch.cuda.synchronize()
        return "ok"
    except RuntimeError as e:
        torch.cuda.synchronize()
        return f"failed: {e}"


def plot(summary: list[dict], path: pathlib.Path) -> str:
    """FlashInfer's three steps over flashspec's Triton step, graph replays, per shape."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped: matplotlib is not installed"
    panels = sorted({(s["V"], s["dtype"]) for s in summary})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (v, dtype) in zip(axes[0], panels):
        for step, g in sorted({(s["flashinfer_step"], s["G"]) for s in summary}):
            pts = sorted((s["B"], s["flashinfer_over_triton"]) for s in summary
                         if (s["V"], s["dtype"], s["flashinfer_step"], s["G"]) == (v, dtype, step, g))
            ax.plot([b for b, _ in pts], [r for _, r in pts], marker="o", label=f"{step} G={g}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(title=f"V={v} {dtype} logits", xscale="log", yscale="log", xlabel="batch B",
               ylabel="FlashInfer time / flashspec Triton time (graph)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    import verify_kernels as vk

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=os.environ.get("FLASHINFER_CHAIN_LIB", str(DEFAULT_LIB)))
    p.add_argument("--quick", action="store_true", help="B in {1, 32, 256}, G=4, both V, bf16")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE / "results")))
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: FlashInfer's kernel runs on a GPU only (see the module docstring)")
        return 2
    f = load(args.lib)  # fail before any timing
    grid = vk.parse_args(["--drafts", "logits"] + (["--quick"] if args.quick else []))
    shapes = vk.shapes_from(grid)
    device = torch.device("cuda")
    t0 = time.perf_counter()
    copy_gbps = vk.copy_bandwidth_gbps(device)
    capturable = graph_capturable(f, device)
    if capturable != "ok":
        raise SystemExit(f"FlashInfer's launcher does not capture in a CUDA graph: {capturable}")
    rows = []
    for shape in shapes:
        rows.extend(vk.run_shape(shape, device, copy_gbps))
        t = rows[-2]
        print(f"flashspec  B={shape['B']:4d} G={shape['G']} V={shape['V']:6d} {shape['dtype']:8s} "
              f"triton graph {1e3 * t['graph_median_ms']:8.1f} us ok={t['ok']} graph_ok={t['graph_ok']}", flush=True)
    fi_rows, law = run_flashinfer(shapes, args.lib, device, copy_gbps)
    rows.extend(fi_rows)
    summary = summarise(rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(environment=vk.environment(device), flashinfer=(HERE.parent / ".flashinfer/lib/VERSION").read_text().strip()
                  if (HERE.parent / ".flashinfer/lib/VERSION").is_file() else "unknown",
                  lib=str(args.lib), copy_bandwidth_gbps=copy_gbps, graph_capture=capturable, law=law,
                  median_flashinfer_over_triton={s: median_ratio(summary, s)
                                                 for s in ("kernel", "target_softmax", "both_softmax")},
                  all_tokens_match=all(r["ok"] for r in rows if "ok" in r),
                  seconds=time.perf_counter() - t0, summary=summary, rows=rows)
    result["plot"] = plot(summary, out / "verify_kernels_flashinfer.png")
    (out / "verify_kernels_flashinfer.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'verify_kernels_flashinfer.json'}: law passed={law['passed']}, "
          f"median FlashInfer/Triton {result['median_flashinfer_over_triton']}")
    return 0 if result["all_tokens_match"] and law["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
