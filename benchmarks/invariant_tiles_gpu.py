"""Which tilings of the batch-invariant product may the mode mix by row count, and what do they cost
against cuBLAS (issue #40)?

    python benchmarks/invariant_tiles_gpu.py --out $OUT/invariant_tiles_gpu.json --budget-s 170

Every projection (qkv, o, gate_up, down, LM head) of TinyLlama-1.1B's and Llama-3-8B's shapes (and with
``--shapes smollm2-135m`` SmolLM2-135M's), random bf16. A *family* is one reduction order (``InvariantTiling.order()``: block_k, chunks) with the candidates
that keep it (``families``): 16-row tiles varying warps, stages, column tile, slices per program;
64-row tiles of 16-128 columns, 2-4 stages, 4-8 warps (a warpgroup MMA on sm_90 instead of ``mma.sync``:
an empirical question of rounding); above 64 rows 128-row tiles of 64-128 columns, 8 warps (two 64-row
warpgroup MMAs per dot);
and K chunks of twice the length over the same slices (``r16_k2x``: the same sequence of 16-deep MMA
steps if the compiler chains them alike; the interpreter's pairwise tree over 256 is the sum of the two
trees over 128, the same bits).
Per projection and family:

* ``checks``: each row of ``--rows`` random rows computed alone by the family's first candidate (M = 1)
  is the reference; every candidate at each of its M (``--ms``) on ``--trials`` random inputs x 3
  placements (the rows rotated, so a row sits at different places of the batch, every place holding a
  checked row) must give each row the same bits (pass), with the differing rows counted; likewise the
  engine's own choice by M (``launch_tiling``). A mutant that splits K in two when M > 1 (``mutant``)
  must differ: pass when it is caught.
* ``timing_us``: us per call (the median of ``triton.testing.do_bench``, L2 flushed) of each candidate and of cuBLAS
  (``F.linear``) at each M.
* ``best``: per M, the fastest candidate of the family that passed every check, and its ratio to cuBLAS.

``summary``: per shape, family and M, the sum over the projections of the best passing candidates' us
against cuBLAS's and the engine's (``launch_tiling``); which candidates failed anywhere (they must never
be mixed); ``mma64_equal``: no 64- or 128-row candidate failed and every mutant was caught (with nothing in
``skipped``, the evidence ``flashspec_torch.invariant_matmul.MMA64_CARDS`` asks for this GPU). The JSON is rewritten after each part; a part that would start after ``--budget-s`` is
skipped and named in ``skipped``. ``--device cpu --tiny`` (TRITON_INTERPRET=1) tests the script.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import zlib
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

from flashspec_torch import invariant_matmul as I

SHAPES = {  # hidden, intermediate, heads, kv heads, head_dim, vocab (engine_gpu.py's)
    "tinyllama-1.1b": (2048, 5632, 32, 4, 64, 32000),
    "llama3-8b": (4096, 14336, 32, 8, 128, 128256),
    "smollm2-135m": (576, 1536, 9, 3, 64, 49152),  # K 576 (4.5 chunks of 128) and 1536: issue #40 (--shapes smollm2-135m)
    "tiny": (256, 192, 4, 2, 32, 96),  # --tiny: the CPU test of this script (2-3 slices of K)
}


def projections(shape: str) -> list[tuple[str, int, int]]:
    """(name, N, K) of the shape's five products."""
    h, i, heads, kv, hd, vocab = SHAPES[shape]
    return [("qkv", (heads + 2 * kv) * hd, h), ("o", h, heads * hd), ("gate_up", 2 * i, h), ("down", h, i),
            ("lm_head", vocab, h)]


def families(t: I.InvariantTiling, k: int) -> dict[str, dict[str, tuple[I.InvariantTiling, tuple[str, ...]]]]:
    """family -> candidate -> (tiling, the M classes it runs at: "small" <= 16 rows, "64", "big" > 64).
    One family, ``engine``: the engine's order (``invariant_tiling``), launched in every way below. The
    64-row tiles of 64-128 columns with 3-4 stages (8 warps at 128 columns) are shaped like cuBLAS's
    tiles at these sizes; one weight chunk is preloaded there (two [128, 128] chunks would sit in registers).
    The engine's warpgroup-MMA launches (``MMA64_LAUNCHES``) are candidates by their names, the 128-row
    ones above 64 rows only; and ``m128_n128_w8``, their 128-column tiling with one slice per program."""
    m64 = replace(t, block_m=64, row_tiles=1)
    wide = min(64, 2 * t.block_n)
    engine = {
        "r16": (t, ("small", "64", "big")),
        "r16_w2": (replace(t, num_warps=2), ("small",)),
        "r16_s4": (replace(t, num_stages=4), ("small",)),
        "r16_n2x": (replace(t, block_n=wide), ("small", "64")),
        "r16_serial": (replace(t, span=0), ("64", "big")),
        "m64": (m64, ("64", "big")),
        "m64_n64": (replace(m64, block_n=64, num_stages=3, preload=1), ("64", "big")),
        "m64_n128_w8": (replace(m64, block_n=128, num_stages=3, num_warps=8, preload=1), ("64", "big")),
    }
    engine["m128_n128_w8"] = (replace(t, **dict(I.MMA64_LAUNCHES["m128_n128_w8_serial"], span=1)), ("big",))
    engine.update({name: (replace(t, **fields), ("64", "big") if fields["block_m"] == 64 else ("big",))
                   for name, fields in I.MMA64_LAUNCHES.items()})
    if t.chunks % 2 == 0:  # the same slices in chunks of twice the K: on a GPU the same 16-deep MMA steps in the
        # same order, if Triton chains them alike (another order(); the interpreter's tree sums give the same bits)
        engine["r16_k2x"] = (replace(t, block_k=2 * t.block_k, chunks=t.chunks // 2, preload=min(t.preload, t.chunks // 2)),
                             ("small",))  # at 64 rows (4 row tiles) ptxas spills
    return {"engine": engine}


def m_class(m: int) -> str:
    return "small" if m <= 16 else "64" if m <= 64 else "big"


def mutant(t: I.InvariantTiling):
    """A product that splits K by batch size: the engine's tiling at M = 1; above, K cut in two halves,
    each half's product rounded to bf16 and the two added (what a split-K kernel with low-precision
    partials does when the problem size makes it split), so a row's bits change with M."""
    def product(x, w):
        if x.shape[0] == 1:
            return I.launch(x, w, True, t)
        h = x.shape[1] // 2
        halves = [I.launch(x[:, s].contiguous(), w[:, s].contiguous(), True, t).float() for s in (slice(0, h), slice(h, None))]
        return (halves[0] + halves[1]).to(x.dtype)
    return product


def placements(rows: int, m: int) -> list[torch.Tensor]:
    """3 index sets of m of the rows: rotated by 0, 1 and m // 2 + 7, so a row sits at different places."""
    return [(torch.arange(m) + s) % rows for s in sorted({0, 1, m // 2 + 7})]


def check_family(fams, w, xs, alone, ms, fn_of) -> dict[str, dict]:
    """Each candidate of a family at its Ms: every row of every placement == its bits alone."""
    out = {}
    for name, (tiling, classes) in fams.items():
        fn = fn_of(tiling)
        launches = rows_checked = differing = 0
        for m in ms:
            if m_class(m) not in classes:
                continue
            for x, ref in zip(xs, alone):
                for idx in placements(x.shape[0], m):
                    y = fn(x[idx], w)
                    bad = (y != ref[idx]).any(dim=1)
                    launches, rows_checked, differing = launches + 1, rows_checked + m, differing + int(bad.sum())
        out[name] = dict(launches=launches, rows_checked=rows_checked, rows_differing=differing,
                         **{"pass": differing == 0})
    return out


def rows_alone(fn, x, w) -> torch.Tensor:  # each row of x [R, K] computed alone -> [R, N]
    return torch.cat([fn(x[i : i + 1], w) for i in range(x.shape[0])])


def time_family(fams, w, x, ms, device) -> dict[str, dict[str, float]]:
    """us per call of each candidate at its Ms and of cuBLAS (CUDA only)."""
    if device != "cuda":
        return {}
    out: dict[str, dict[str, float]] = {}
    for m in ms:
        row = {"cublas": us_per_call(lambda: F.linear(x[:m], w))}
        for name, (tiling, classes) in fams.items():
            if m_class(m) in classes:
                row[name] = us_per_call(lambda: I.launch(x[:m], w, True, tiling))
        out[str(m)] = row
    return out


def us_per_call(fn) -> float:
    """The median us of ``fn()`` (``triton.testing.do_bench``, L2 flushed; the median, not the mean: H100
    2026-12-07 timed TinyLlama's o at 50 us with the engine's launch and 20-28 us as the same candidate)."""
    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e3


def best(checks, timing) -> dict[str, dict]:
    """Per M: the fastest candidate that passed, with its ratio to cuBLAS."""
    out = {}
    for m, row in timing.items():
        ok = {c: us for c, us in row.items() if c != "cublas" and checks[c]["pass"]}
        if ok:
            c = min(ok, key=ok.get)
            out[m] = dict(candidate=c, us=ok[c], cublas_us=row["cublas"], over_cublas=ok[c] / row["cublas"])
    return out


def projection_part(shape, proj, n, k, args, device) -> dict:
    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"{shape} {proj}".encode()))
    w = (torch.randn(n, k, generator=g, device=device) * 0.05).to(torch.bfloat16)
    xs = [(torch.randn(args.rows, k, generator=g, device=device) * 0.5).to(torch.bfloat16) for _ in range(args.trials)]
    t = I.invariant_tiling(n, k, torch.bfloat16)
    fams = families(t, k)
    part = dict(shape=shape, projection=proj, n=n, k=k, slices=t.slices(k),
                engine={str(m): asdict(I.launch_tiling(t, m, n, k)) for m in args.ms},
                candidates={f: {c: dict(tiling=asdict(tt), order=tt.order(), at=cls) for c, (tt, cls) in cands.items()}
                            for f, cands in fams.items()}, families={})
    for fam, cands in fams.items():
        first = next(iter(cands.values()))[0]
        alone = [rows_alone(lambda a, b: I.launch(a, b, True, first), x, w) for x in xs]
        checks = check_family(cands, w, xs, alone, args.ms, lambda tt: lambda a, b: I.launch(a, b, True, tt))
        if fam == "engine":  # the engine's own choice by M, and the mutant (it must be caught)
            checks.update(check_family({"launch_tiling": (None, ("small", "64", "big"))}, w, xs, alone, args.ms,
                                       lambda _: lambda a, b: I.launch(a, b, True)))
            caught = check_family({"mutant": (None, ("small", "64", "big"))}, w, xs, alone, args.ms, lambda _: mutant(t))
            part["mutant"] = dict(caught["mutant"], **{"pass": caught["mutant"]["rows_differing"] > 0})
        timing = time_family(cands, w, xs[0], args.ms, device)
        if fam == "engine" and timing:
            for m, row in timing.items():
                row["launch_tiling"] = us_per_call(lambda: I.launch(xs[0][: int(m)], w, True))
        part["families"][fam] = dict(checks=checks, timing_us=timing, best=best(checks, timing))
    return part


def summarize(parts: list[dict]) -> dict:
    """Per shape, family and M: sums over the projections of the best passing candidates' us, cuBLAS's
    and the engine's; the candidates that failed a check anywhere; the mutants caught."""
    failed = sorted({f"{p['shape']} {p['projection']} {f}/{c}" for p in parts for f, d in p["families"].items()
                     for c, r in d["checks"].items() if not r["pass"]})
    out: dict = dict(failed=failed, mutants_caught=sum(p["mutant"]["pass"] for p in parts), mutants=len(parts),
                     per_shape={})
    for shape in dict.fromkeys(p["shape"] for p in parts):
        mine = [p for p in parts if p["shape"] == shape]
        rows = {}
        for fam in ("engine",):
            for m in mine[0]["families"]["engine"]["timing_us"]:
                bests = [p["families"][fam]["best"].get(m) for p in mine]
                if None in bests:  # a projection with no passing candidate at this M
                    continue
                best_us = sum(b["us"] for b in bests)
                cublas = sum(p["families"]["engine"]["timing_us"][m]["cublas"] for p in mine)
                engine = sum(p["families"]["engine"]["timing_us"][m]["launch_tiling"] for p in mine)
                rows[f"{fam} M={m}"] = dict(best_us=best_us, cublas_us=cublas, engine_us=engine,
                                            best_over_cublas=best_us / cublas, engine_over_cublas=engine / cublas,
                                            choice={p["projection"]: b["candidate"] for p, b in zip(mine, bests)})
        out["per_shape"][shape] = rows
    out["mma64_equal"] = (not [f for f in failed if "m64" in f or "m128" in f]
                          and out["mutants_caught"] == out["mutants"] > 0)
    return out


def compile_projection(job) -> float:
    """In a worker process: launch every kernel variant ``projection_part`` will launch for one
    projection, on 64 weight rows (N is not a compile-time constant; its divisibility by 16, which is, is
    kept), so Triton's on-disk cache holds them when the main process gets there. Returns seconds."""
    n, k, ms, device = job
    t0 = time.monotonic()
    x, w = (torch.zeros(r, k, dtype=torch.bfloat16, device=device) for r in (max(ms), 64))
    t = I.invariant_tiling(n, k, torch.bfloat16)
    variants = [tt for cands in families(t, k).values() for tt, classes in cands.values()]
    for m in ms:
        for tt in variants + [I.launch_tiling(t, m, n, k)]:
            I.launch(x[:m], w, True, tt)
        mutant(t)(x[:m], w)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.monotonic() - t0


def precompile(jobs, workers: int, timeout_s: float) -> dict:
    """``compile_projection`` of each job in ``workers`` spawned processes, for at most ``timeout_s``
    (the main process compiles whatever is not done)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.monotonic()
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(compile_projection, job) for job in jobs]
    done, _ = cf.wait(futures, timeout=timeout_s)
    pool.shutdown(wait=False, cancel_futures=True)
    errors = [repr(f.exception())[:300] for f in done if f.exception() is not None]
    return dict(jobs=len(jobs), done=len(done), workers=workers, wall_s=time.monotonic() - t0, errors=errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--shapes", default="tinyllama-1.1b,llama3-8b", help="comma-separated, of " + ", ".join(SHAPES))
    ap.add_argument("--projections", default="qkv,o,gate_up,down,lm_head", help="comma-separated")
    ap.add_argument("--ms", default="1,16,64,320", help="row counts (320: batch 64 x G + 1 = 5 scoring rows)")
    ap.add_argument("--rows", type=int, default=320, help="random rows per input (>= the largest M)")
    ap.add_argument("--trials", type=int, default=2, help="random inputs per projection")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape only (a CPU test of the script)")
    ap.add_argument("--compile-workers", type=int, default=8, help="processes that fill Triton's cache first (0: none)")
    ap.add_argument("--compile-s", type=float, default=60.0, help="the most seconds they take")
    ap.add_argument("--budget-s", type=float, default=170.0, help="parts that would start after this many seconds are skipped")
    args = ap.parse_args()
    args.ms = [int(m) for m in args.ms.split(",")]
    if args.rows < max(args.ms):
        raise SystemExit(f"--rows {args.rows} must be >= the largest of --ms ({max(args.ms)})")
    shapes = ["tiny"] if args.tiny else args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {s!r}; known: {', '.join(SHAPES)}")
    start = time.monotonic()
    result = dict(what=__doc__.split("\n\n")[0].replace("\n", " "), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu (TRITON_INTERPRET)",
                  versions=dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
                                cuda=torch.version.cuda),
                  settings=dict(ms=args.ms, rows=args.rows, trials=args.trials, placements=3, dtype="bfloat16",
                                budget_s=args.budget_s,
                                timer="triton.testing.do_bench(warmup=5, rep=25, return_mode='median'), L2 flushed"),
                  parts=[], skipped=[])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    jobs = [(n, k, tuple(args.ms), args.device) for shape in shapes for proj, n, k in projections(shape)
            if proj in args.projections.split(",")]
    if args.compile_workers and args.device == "cuda":
        result["precompile"] = precompile(list(dict.fromkeys(jobs)), args.compile_workers, args.compile_s)
        print("precompile:", result["precompile"], flush=True)
    if args.device == "cuda":  # clocks up before the first timing (the H200 run timed its first product 2.5x slow)
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        t_warm = time.monotonic()
        while time.monotonic() - t_warm < 3:
            a @ a
            torch.cuda.synchronize()  # one at a time: the loop's 3 s are the GPU's
        del a
    for shape in shapes:
        for proj, n, k in projections(shape):
            if proj not in args.projections.split(","):
                continue
            if time.monotonic() - start > args.budget_s:
                result["skipped"].append(f"{shape} {proj}")
                continue
            t0 = time.monotonic()
            part = projection_part(shape, proj, n, k, args, args.device)
            part["wall_s"] = time.monotonic() - t0
            result["parts"].append(part)
            result["summary"] = summarize(result["parts"])
            result["wall_s"] = time.monotonic() - start
            args.out.write_text(json.dumps(result, indent=1))
            print(f"{shape} {proj}: {part['wall_s']:.1f} s, failed so far: {result['summary']['failed']}", flush=True)
    result["wall_s"] = time.monotonic() - start
    result["summary"] = summarize(result["parts"])
    args.out.write_text(json.dumps(result, indent=1))
    s = result["summary"]
    print(json.dumps(dict(failed=s["failed"], mma64_equal=s["mma64_equal"], mutants=f"{s['mutants_caught']}/{s['mutants']} caught",
                          per_shape={sh: {k: round(v["best_over_cublas"], 3) for k, v in r.items()}
                                     for sh, r in s["per_shape"].items()}, skipped=result["skipped"]), indent=1))


if __name__ == "__main__":
    main()
