"""Tilings of the batch-invariant product on a GPU (issue #40 follow-up): which (block_m, block_n,
block_k, num_warps, num_stages) makes ``flashspec_torch.invariant_matmul`` cheap, and is each one
still batch-invariant on the GPU's MMA?

    python benchmarks/invariant_tune_gpu.py --out $OUT/invariant_tune.json [--budget-s 270] [--jobs 12]

For the (N, K, prologue) of every product of SmolLM2-135M / TinyLlama-1.1B / Llama-3-8B as the model
runs them (qkv fused with add + RMSNorm, o, gate_up with add + RMSNorm, down with SwiGLU, the LM head
with the final norm), bf16 random operands:

* ``products[*].tilings[*]``: per tiling, ``invariant`` (GPU bits: rows 0, 1, 37, 63 alone == inside
  a 64-row pass == inside a 320-row pass, i.e. as scoring rows of 64 requests x G+1 = 5, and the 64-row
  pass's rows == the 320-row pass's) and ``us`` by M in {1, 5, 16, 64, 320} (``triton.testing.do_bench``,
  L2 flushed between calls, median); beside them ``cublas_us`` (torch.matmul of the prepared
  activations: no prologue) and ``gemv_us`` (``flashspec_torch.gemv``'s default tiling, prologue
  inside, M <= 8).
* ``block_m_bits_agree``: for tilings equal but for block_m, whether the 64-row pass's bits are the
  same at block_m 16, 32, 64 (if all are, ``block_m_by_m_possible`` is true: the launcher could pick
  block_m by M and keep a row's bits, which makes large batches cheap).
* ``configs`` / ``configs_python``: per (N, K, dtype) the invariant block_m-16 tiling with the least
  geometric mean of us / cuBLAS's us over the M set, as ``flashspec_torch.invariant_matmul.INVARIANT_CONFIGS``
  takes it (paste ``configs_python``).
* ``attention``: invariant attention (one 64-row query tile) vs the default decode kernel (its tile
  sized by the rows), one new token, context 128 / 1024, batch 1 / 64, us; and whether a row's bits
  alone == inside the batch.

Per model, compiles first in ``--jobs`` processes (Triton's disk cache), then times in this one; stops
starting tilings after ``--budget-s`` and records what it skipped. The JSON is rewritten after each product.
CPU test of the script (Triton interpreter, seconds):
``TRITON_INTERPRET=1 python benchmarks/invariant_tune_gpu.py --tiny --device cpu --out /tmp/t.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

from flashspec_torch import gemv as G
from flashspec_torch import invariant_matmul as I
from flashspec_torch import layers as L

MODELS = {  # name: (hidden, intermediate, heads, kv_heads, head_dim, vocab), as engine_gpu.SHAPES
    "tinyllama-1.1b": (2048, 5632, 32, 4, 64, 32000),
    "llama3-8b": (4096, 14336, 32, 8, 128, 128256),
    "smollm2-135m": (576, 1536, 9, 3, 64, 49152),
}
TINY = {"tiny": (64, 96, 4, 2, 16, 80)}
MS, TINY_MS = (1, 5, 16, 64, 320), (1, 5, 12)
MID, TINY_MID = 64, 8  # the batch whose rows are checked against the largest M's and alone
CHECK_ROWS, TINY_CHECK_ROWS = (0, 1, 37, 63), (0, 1, 5, 7)
T = I.InvariantTiling


def products(hidden, inter, heads, kv, hd, vocab) -> list[tuple[str, str, int, int]]:
    """(name, prologue, N, K) of each product as Block.forward_invariant and forward_logits run them."""
    return [("qkv", "add_rms_norm", (heads + 2 * kv) * hd, hidden), ("o", "none", hidden, heads * hd),
            ("gate_up", "add_rms_norm", 2 * inter, hidden), ("down", "silu_mul", hidden, inter),
            ("lm_head", "add_rms_norm", vocab, hidden)]


def candidates(n: int, k: int, tiny: bool) -> list[I.InvariantTiling]:
    """The engine's tiling, block_m 16 variants (more programs, bigger K chunks, stages; 1 stage keeps the
    add + RMSNorm prologue at 80 registers where 2-3 take 255 on sm_90), then block_m 32 / 64 of the engine's."""
    engine = I.invariant_tiling(n, k, torch.bfloat16)
    if tiny:
        grid = [T(16, 32, 32, 4, 2)]
    else:
        grid = [T(16, bn, bk, w, s) for bn, bk, w, s in (
            (16, 64, 4, 3), (16, 128, 4, 1), (16, 256, 4, 1), (64, 64, 4, 3), (16, 256, 4, 3), (16, 512, 4, 2), (32, 128, 4, 3), (32, 256, 4, 1),
            (32, 256, 8, 3), (64, 128, 4, 3), (64, 128, 8, 1), (64, 256, 8, 2), (128, 128, 8, 3), (128, 64, 8, 4))]
    grid = [engine] + [t for t in grid if t != engine and t.block_n <= max(16, triton.next_power_of_2(n))]
    return grid + [T(bm, engine.block_n, engine.block_k, engine.num_warps, engine.num_stages) for bm in (32,) + ((64,) * (not tiny))]


def operands(prologue: str, n: int, k: int, rows: int, device: str, seed: int = 0):
    """(x [rows, K or 2K], d [rows, K] or None, g [K] or None, w [N, K], h_out [rows, K] or None), bf16."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device).to(torch.bfloat16)  # noqa: E731
    w = r(n, k) * k ** -0.5
    if prologue == "add_rms_norm":
        return r(rows, k), r(rows, k), r(k), w, torch.empty(rows, k, dtype=torch.bfloat16, device=device)
    return r(rows, 2 * k if prologue == "silu_mul" else k), None, None, w, None


def run(prologue, ops, m: int, tiling):  # the first m rows
    x, d, g, w, h_out = ops
    return I.launch(prologue, x[:m], None if d is None else d[:m], g, w, None if h_out is None else h_out[:m],
                    1e-5, False, tiling)


def bench_us(fn, cuda: bool) -> float:
    if not cuda:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    return triton.testing.do_bench(fn, warmup=3, rep=10, return_mode="median") * 1e3


def invariance(prologue, ops, tiling, mid: int, m_big: int, check_rows) -> tuple[bool, torch.Tensor]:
    """(rows alone == in a pass of mid rows == in one of m_big, the mid-row pass [mid, N])."""
    y64, ybig = run(prologue, ops, mid, tiling), run(prologue, ops, m_big, tiling)
    ok = torch.equal(y64, ybig[:mid])
    x, d, g, w, h_out = ops
    for i in check_rows:
        ops_i = (x[i:], None if d is None else d[i:], g, w, None if h_out is None else h_out[i:])
        ok &= torch.equal(run(prologue, ops_i, 1, tiling), y64[i : i + 1])
    return bool(ok), y64


def references(prologue, ops, ms, cuda: bool) -> dict:
    x, d, g, w, _ = ops
    k = w.shape[1]
    xs = x[:, :k].contiguous()  # the prepared activations (values do not matter for timing)
    out = {"cublas_us": {m: bench_us(lambda m=m: torch.matmul(xs[:m], w.t()), cuda) for m in ms}, "gemv_us": {}}
    for m in (m for m in ms if m <= G.MAX_ROWS):
        if prologue == "add_rms_norm":
            fn = lambda m=m: G.gemv_add_rms_norm(x[:m], d[:m], g, 1e-5, w)  # noqa: E731
        elif prologue == "silu_mul":
            fn = lambda m=m: G.gemv_silu_mul(x[:m], w)  # noqa: E731
        else:
            fn = lambda m=m: G.gemv(x[:m], w)  # noqa: E731
        out["gemv_us"][m] = bench_us(fn, cuda)
    return out


def tune_product(model, name, prologue, n, k, args, deadline: float) -> dict:
    cuda = args.device == "cuda"
    ms, mid = (TINY_MS, TINY_MID) if args.tiny else (MS, MID)
    ops = operands(prologue, n, k, max(ms + (mid,)), args.device)
    row = dict(model=model, product=name, prologue=prologue, n=n, k=k, dtype="bfloat16", **references(prologue, ops, ms, cuda),
               tilings=[], skipped=[])
    by_family: dict[tuple, dict[int, torch.Tensor]] = {}
    for t in candidates(n, k, args.tiny):
        entry = dict(tiling=t.__dict__)
        if time.perf_counter() > deadline:
            row["skipped"].append(t.__dict__)
            continue
        try:
            entry["invariant"], y64 = invariance(prologue, ops, t, mid, max(ms + (mid,)), TINY_CHECK_ROWS if args.tiny else CHECK_ROWS)
            entry["us"] = {m: bench_us(lambda m=m: run(prologue, ops, m, t), cuda) for m in ms}
            entry["over_cublas"] = {m: entry["us"][m] / row["cublas_us"][m] for m in ms}
            entry["geomean_over_cublas"] = math.exp(sum(math.log(v) for v in entry["over_cublas"].values()) / len(ms))
            by_family.setdefault((t.block_n, t.block_k, t.num_warps, t.num_stages), {})[t.block_m] = y64
        except Exception as e:  # a tiling the GPU cannot run (shared memory, registers): recorded, not fatal
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["tilings"].append(entry)
    row["block_m_bits_agree"] = {str(f): {bm: bool(torch.equal(y, ys[16])) for bm, y in ys.items() if bm != 16}
                                 for f, ys in by_family.items() if 16 in ys and len(ys) > 1}
    good = [e for e in row["tilings"] if e.get("invariant") and e["tiling"]["block_m"] == 16]
    if good:
        best = min(good, key=lambda e: e["geomean_over_cublas"])
        row["best"] = best
        row["best_per_m"] = {m: min((e for e in row["tilings"] if e.get("invariant")), key=lambda e: e["us"][m])["tiling"]
                             for m in ms}
    return row


def precompile_one(job) -> str:
    """Compile (into Triton's disk cache) one (prologue, K, tiling) by a launch of 1 row and 256 columns."""
    prologue, k, t, device = job
    try:
        run(prologue, operands(prologue, 256, k, 1, device), 1, T(**t))
        if device == "cuda":
            torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def precompile(jobs: list[tuple], procs: int) -> dict:
    t = time.perf_counter()
    if procs <= 1:
        results = [precompile_one(j) for j in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            results = pool.map(precompile_one, jobs, chunksize=1)
    return dict(compiles=len(jobs), failed=sum(r != "ok" for r in results), seconds=time.perf_counter() - t)


def attention_part(args) -> list[dict]:
    """Invariant vs default decode attention, one new token per row: us, and a row's bits alone == in the batch."""
    cuda, out = args.device == "cuda", []
    shapes = {"tiny": (4, 2, 16)} if args.tiny else {"tinyllama-1.1b": (32, 4, 64), "llama3-8b": (32, 8, 128)}
    for model, (h, kv, d) in shapes.items():
        for ctx in ((24,) if args.tiny else (128, 1024)):
            for b in ((1, 3) if args.tiny else (1, 64)):
                gen = torch.Generator(device=args.device).manual_seed(1)
                r = lambda *s: torch.randn(*s, generator=gen, device=args.device).to(torch.bfloat16)  # noqa: E731
                q, kc, vc = r(b, h, 1, d), r(b, kv, ctx, d), r(b, kv, ctx, d)
                pos = torch.full((b, 1), ctx - 1, dtype=torch.int64, device=args.device)
                inv = lambda q=q, kc=kc, vc=vc, pos=pos: L.attention(q, kc, vc, pos, None, kv, "triton", False, ctx, True)  # noqa: E731
                dflt = lambda q=q, kc=kc, vc=vc, pos=pos: L.attention(q, kc, vc, pos, None, kv, "triton", False, ctx)  # noqa: E731
                alone = L.attention(q[-1:], kc[-1:], vc[-1:], pos[-1:], None, kv, "triton", False, ctx, True)
                row = dict(model=model, context=ctx, batch=b, invariant_us=bench_us(inv, cuda), default_us=bench_us(dflt, cuda),
                           last_row_alone_equals_in_batch=bool(torch.equal(alone, inv()[-1:])))
                row["invariant_over_default"] = row["invariant_us"] / row["default_us"]
                out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    ap.add_argument("--budget-s", type=float, default=270.0, help="start no tiling after this many seconds")
    ap.add_argument("--jobs", type=int, default=12, help="processes that compile first (1: none)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and 2 tilings: a CPU test of the script")
    args = ap.parse_args()
    start = time.perf_counter()
    models = TINY if args.tiny else {m: MODELS[m] for m in args.models.split(",")}
    cuda = args.device == "cuda"
    result = dict(
        what="issue #40 follow-up: tilings of the batch-invariant product, their GPU invariance and cost by M; "
             "invariant vs default decode attention",
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name() if cuda else "cpu",
        versions=dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda),
        settings=dict(dtype="bfloat16", ms=TINY_MS if args.tiny else MS, mid=TINY_MID if args.tiny else MID,
                      check_rows=TINY_CHECK_ROWS if args.tiny else CHECK_ROWS, budget_s=args.budget_s,
                      timing="triton.testing.do_bench median, L2 flushed" if cuda else "one call (CPU test)"),
        note=None if cuda else "CPU test of the script: the interpreter's product is a float32 tree, not the MMA, so its "
                               "invariance and block_m agreement say nothing about the GPU",
        products=[],
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["elapsed_s"] = time.perf_counter() - start
        args.out.write_text(json.dumps(result, indent=1, default=str))

    result["attention"] = attention_part(args)
    save()
    deadline, done, result["precompile"] = start + args.budget_s, set(), {}
    for model, shape in models.items():  # model by model, so that a slow compile leaves the first ones measured
        todo = products(*shape)
        jobs = {(pro, k, tuple(sorted(t.__dict__.items()))) for _, pro, n, k in todo for t in candidates(n, k, args.tiny)}
        if cuda and time.perf_counter() < deadline:  # the interpreter compiles nothing
            result["precompile"][model] = precompile([(pro, k, dict(t), args.device) for pro, k, t in sorted(jobs - done)],
                                                     args.jobs)
        done |= jobs
        for name, prologue, n, k in todo:
            result["products"].append(tune_product(model, name, prologue, n, k, args, deadline))
            print(f"{model} {name} ({n}, {k}): best {result['products'][-1].get('best', {}).get('tiling')} "
                  f"after {time.perf_counter() - start:.0f} s", flush=True)
            save()
    finish(result)
    save()
    print(json.dumps({k: result[k] for k in ("block_m_by_m_possible", "all_winners_invariant")}), flush=True)


def finish(result: dict) -> None:
    """The summary fields: the configs table, whether block_m may follow M, whether every winner is invariant."""
    rows = [p for p in result["products"] if "best" in p]
    result["configs"] = {f"{p['n']},{p['k']},bfloat16": p["best"]["tiling"] for p in rows}
    result["configs_python"] = "\n".join(
        f"    ({p['n']}, {p['k']}, torch.bfloat16): InvariantTiling({', '.join(str(v) for v in p['best']['tiling'].values())}),"
        f"  # {p['model']} {p['product']}: {p['best']['geomean_over_cublas']:.2f}x cuBLAS (geomean over M)" for p in rows)
    agree = [v for p in result["products"] for fam in p["block_m_bits_agree"].values() for v in fam.values()]
    result["block_m_by_m_possible"] = bool(agree) and all(agree)
    result["block_m_note"] = ("every compared tiling gave the same bits at block_m 16, 32, 64: the launcher may pick "
                              "block_m by M" if result["block_m_by_m_possible"] else
                              "some tiling's bits changed with block_m (or none compared): block_m must stay fixed")
    result["all_winners_invariant"] = all(p["best"]["invariant"] for p in rows)
    result["invariance_failures"] = [dict(model=p["model"], product=p["product"], tiling=e["tiling"])
                                     for p in result["products"] for e in p["tilings"] if e.get("invariant") is False]


if __name__ == "__main__":
    main()
