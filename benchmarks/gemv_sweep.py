"""The fused skinny products (flashspec_torch.gemv) on a GPU: a config sweep per projection against
cuBLAS, then whole decode steps of TinyLlama-1.1B in one CUDA graph per engine variant.

    python benchmarks/gemv_sweep.py [--out benchmarks/results/gemv_sweep.json] [--models tinyllama smollm2 llama3-8b]
    python benchmarks/gemv_sweep.py --quick       # TinyLlama, 1 row only
    python benchmarks/gemv_sweep.py --dry-run     # CPU: interpreter, tiny shapes, no timing claims

The grid is trimmed to keep the default run (TinyLlama, 1 and 5 rows, sweep + chain) to a few
minutes: block_k in {256, 512}, block_n in {4, 8, 16} (5 rows: {2, 4, 8}), num_warps in {4, 8} (5
rows: 4), num_stages 1 only (the old grid's block_k 128/1024, block_n 32, 2 warps and the stages
2-4 re-runs are gone: they never won on the H200). All configs first run with one chunk preloaded;
for 1 row the 3 fastest are then re-run with preload in {2, 4, all that fit} (GemvConfig's register
limit, at most the K chunks there are).

The chain (``chain`` in the JSON) times one whole-model forward per variant: cuBLAS projections
without and with PDL on the Triton layer kernels, the fused path untuned, then with the swept
winners, fused subsets with PDL (``model.fused``; the rest cuBLAS). Each entry records
``linear_impl``, ``pdl``, ``tuned``, ``fused`` (the sorted subset; [] for linear_impl reference) and
``us_per_forward``; ``best_chain`` is the fastest of them, for the engine to pick.

Per call times are CUDA-graph replays (``--calls`` calls per graph, cycling over enough weight
copies that they do not sit in L2), median of ``--replays`` replays. Every config's output is
checked against the plain torch reference before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

MODELS = {  # hidden, heads, kv heads, head_dim, intermediate, vocab, layers
    "tinyllama": (2048, 32, 4, 64, 5632, 32000, 22),
    "smollm2": (576, 9, 3, 64, 1536, 49152, 30),
    "llama3-8b": (4096, 32, 8, 128, 14336, 128256, 32),
}
TINY = (64, 4, 2, 16, 80, 97, 2)


def projections(hidden, heads, kv_heads, head_dim, inter, vocab):  # name -> (n, k, prologue as the fused model uses it)
    return {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden, "add_rms_norm"),
        "o": (hidden, heads * head_dim, "none"),
        "gate_up": (2 * inter, hidden, "add_rms_norm"),
        "down": (hidden, inter, "silu_mul"),
        "lm_head": (vocab, hidden, "add_rms_norm"),
    }


def grid(k: int, m: int, dry: bool):
    from flashspec_torch.gemv import GemvConfig
    from flashspec_torch.device import next_pow2

    if dry:
        return [GemvConfig(block_n=8, block_k=64, preload=1), GemvConfig(block_n=4, block_k=32, preload=1)]
    out = []
    for bn in (4, 8, 16) if m == 1 else (2, 4, 8):
        for bk in (256, 512):
            for warps in (4, 8) if m == 1 else (4,):
                per_thread = next_pow2(m) * bn * bk / (32 * warps)  # float32 accumulators
                if bk <= next_pow2(k) and 8 <= per_thread <= 128:
                    out.append(GemvConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=1, preload=1))
    return out


def preloads(config, k: int, dry: bool):
    """config with preload in {2, 4, all that fit}: valid GemvConfigs, each at most the K chunks."""
    from flashspec_torch.gemv import MAX_PRELOAD, GemvConfig

    chunks = -(-k // config.block_k)
    out = []
    for p in sorted({2, 4, MAX_PRELOAD} if not dry else {2}):
        p = min(p, chunks)
        while p > 1:
            try:
                c = GemvConfig(block_n=config.block_n, block_k=config.block_k, num_warps=config.num_warps,
                               num_stages=config.num_stages, preload=p)
                break
            except ValueError:  # over the register limit: the most that fit
                p -= 1
        if p > 1 and c not in out:
            out.append(c)
    return out


KEYS = ("block_n", "block_k", "num_warps", "num_stages", "preload")


class Timer:
    def __init__(self, torch, calls: int, replays: int, dry: bool):
        self.torch, self.calls, self.replays, self.dry = torch, calls, replays, dry

    def per_call_us(self, fns) -> float:
        """fns: callables (one per weight copy); one graph of `calls` calls cycling over them
        (verify_kernels' capture and timer, as the other benchmarks use them)."""
        from verify_kernels import capture, time_graph  # benchmarks/ is on sys.path for scripts

        seq = [fns[i % len(fns)] for i in range(max(self.calls, len(fns)))]
        if self.dry:
            t = time.perf_counter()
            seq[0]()
            return (time.perf_counter() - t) * 1e6
        graph, _ = capture(lambda f: f(), seq)
        return time_graph(graph, len(seq), reps=self.replays) * 1e3


def sweep_projection(torch, G, timer, name, n, k, m, prologue, dev, dtype, dry):
    F = torch.nn.functional
    wbytes = n * k * dtype.itemsize
    copies = 1 if dry else max(2, min(512, math.ceil((256 << 20) / wbytes)))
    gen = torch.Generator(device=dev).manual_seed(n + k + m)
    ws = [torch.randn(n, k, device=dev, dtype=dtype, generator=gen) * 0.05 for _ in range(copies)]
    kin = 2 * k if prologue == "silu_mul" else k
    x = torch.randn(m, kin, device=dev, dtype=dtype, generator=gen)
    d = torch.randn(m, k, device=dev, dtype=dtype, generator=gen)
    g = torch.randn(k, device=dev, dtype=dtype, generator=gen)

    def fused_fn(w, config):
        if prologue == "add_rms_norm":
            return lambda: G.gemv_add_rms_norm(x, d, g, 1e-5, w, config)[0]
        if prologue == "silu_mul":
            return lambda: G.gemv_silu_mul(x, w, config)
        return lambda: G.gemv(x, w, config)

    if prologue == "add_rms_norm":
        want = G.gemv_add_rms_norm_reference(x, d, g, 1e-5, ws[0])[0]
    elif prologue == "silu_mul":
        want = G.gemv_silu_mul_reference(x, ws[0])
    else:
        want = G.gemv_reference(x, ws[0])
    plain = x[:, :k].contiguous()
    cublas_us = timer.per_call_us([lambda w=w: F.linear(plain, w) for w in ws])
    tol = 2e-2 * want.float().abs().max().item() + 1e-3
    rows = []

    def run(config):  # checked against the reference, then timed
        row = {key: getattr(config, key) for key in KEYS}
        try:
            err = (fused_fn(ws[0], config)().float() - want.float()).abs().max().item()
            row["max_err"] = err
            if not err <= tol:
                row["error"] = f"max abs error {err:.3g} > {tol:.3g}"
            else:
                row["us"] = timer.per_call_us([fused_fn(w, config) for w in ws])
                row["gbs"] = wbytes / row["us"] / 1e3
        except Exception as e:  # OutOfResources and friends: skip the config
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)

    for config in grid(k, m, dry):
        run(config)
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    for r in timed[:3] if m == 1 else []:  # the best few again with more chunks preloaded
        for config in preloads(G.GemvConfig(**{key: r[key] for key in KEYS}), k, dry):
            run(config)
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    del ws
    return dict(proj=name, n=n, k=k, m=m, prologue=prologue, weight_bytes=wbytes, weight_copies=copies,
                cublas_us=cublas_us, cublas_gbs=wbytes / cublas_us / 1e3, best=timed[0] if timed else None, configs=rows)


ALL = ("qkv", "o", "gate_up", "down", "lm_head")
UNTUNED = [("reference", False, ()), ("reference", True, ()), ("triton", False, ()), ("fused", False, ALL), ("fused", True, ALL)]
TUNED = [("fused", False, ALL), ("fused", True, ALL), ("fused", True, ("qkv", "o", "down")), ("fused", True, ("qkv", "down")),
         ("fused", True, ("down",)), ("fused", True, ("o", "down")), ("fused", True, ("qkv", "o", "gate_up", "down"))]


def chain(torch, G, timer, spec, dev, dtype, dry, variants, tuned: bool):
    """One decode step (T=1, batch 1) of the whole model per variant (linear_impl, pdl, fused
    subset), one CUDA graph each; logits compared with the cuBLAS reference forward."""
    from flashspec_torch.model import Llama, LlamaConfig

    hidden, heads, kv_heads, head_dim, inter, vocab, layers = spec
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                      num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    torch.manual_seed(0)
    with torch.device(dev):
        model = Llama(cfg).to(dtype).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    params = sum(p.numel() for p in model.parameters() if p is not model.embed.weight) + hidden
    floor_us = params * dtype.itemsize / 4.8e12 * 1e6
    cache = model.new_cache(1, 256)
    tok, pos = torch.tensor([[7]], device=dev), torch.tensor([[100]], device=dev)
    model.linear_impl, model.pdl = "reference", False
    with torch.inference_mode():
        want = model(tok, pos, cache, 128)  # linear_impl "reference", no PDL
    out = []
    for linear_impl, pdl, subset in variants:
        model.linear_impl, model.pdl, model.fused = linear_impl, pdl, frozenset(subset)
        row = dict(linear_impl=linear_impl, pdl=pdl, tuned=tuned, fused=sorted(subset) if linear_impl == "fused" else [])
        try:
            with torch.inference_mode():
                logits = model(tok, pos, cache, 128)
                us = timer.per_call_us([lambda: model(tok, pos, cache, 128)])
            out.append(dict(row, us_per_forward=us, max_logit_err=(logits - want).abs().max().item(), weights_floor_us_at_4_8tbs=floor_us))
        except Exception as e:
            out.append(dict(row, error=f"{type(e).__name__}: {str(e)[:300]}"))
    del model, cache
    return out


def best_chain(rows: list[dict]) -> dict | None:
    """The fastest chain variant: what the engine should run (model.linear_impl, .pdl, .fused, tuned configs)."""
    timed = [r for r in rows if "us_per_forward" in r]
    if not timed:
        return None
    b = min(timed, key=lambda r: r["us_per_forward"])
    return {key: b[key] for key in ("linear_impl", "pdl", "tuned", "fused", "us_per_forward")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/gemv_sweep.json")
    ap.add_argument("--models", nargs="+", default=["tinyllama"], choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=None, help="row counts to sweep (default 1 5; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="TinyLlama only, 1 row only")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--dry-run", action="store_true", help="CPU: the Triton interpreter on tiny shapes")
    args = ap.parse_args()
    if args.quick:
        args.models = ["tinyllama"]
    if args.rows is None:
        args.rows = [1] if args.quick else [1, 5]
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch
    import triton

    if not args.dry_run and not torch.cuda.is_available():
        print("gemv_sweep.py needs a CUDA GPU (or --dry-run for a CPU check of the script)", file=sys.stderr)
        return 2
    from flashspec_torch import gemv as G
    from verify_kernels import copy_bandwidth_gbps

    dev = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    timer = Timer(torch, args.calls, args.replays, args.dry_run)
    result = dict(gpu="cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"), dry_run=args.dry_run,
                  copy_bandwidth_gbs=None if args.dry_run else copy_bandwidth_gbps("cuda"), gemv=[], chain=[], best_chain=None,
                  gemv_configs={}, command=" ".join(["python benchmarks/gemv_sweep.py"] + sys.argv[1:]))
    copy_bw = result["copy_bandwidth_gbs"] or float("nan")
    print(f"{result['gpu']}: copy {copy_bw:.0f} GB/s (read + write)")
    print(f"{'model':10} {'proj':8} {'m':>2} {'n':>6} {'k':>6} {'cublas us':>9} {'GB/s':>6} {'fused us':>8} {'GB/s':>6} {'%copy':>5}  best config")
    specs = {"tiny": TINY} if args.dry_run else {name: MODELS[name] for name in args.models}
    start = time.time()
    for model_name, spec in specs.items():
        for proj, (n, k, prologue) in projections(*spec[:6]).items():
            for m in args.rows:
                r = sweep_projection(torch, G, timer, proj, n, k, m, prologue, dev, dtype, args.dry_run)
                r["model"] = model_name
                result["gemv"].append(r)
                b = r["best"]
                if b:
                    result["gemv_configs"][f"{n},{k},{m},{prologue}"] = {key: b[key] for key in KEYS}
                    print(f"{model_name:10} {proj:8} {m:>2} {n:>6} {k:>6} {r['cublas_us']:9.1f} {r['cublas_gbs']:6.0f} "
                          f"{b['us']:8.1f} {b['gbs']:6.0f} {100 * b['gbs'] / copy_bw:5.0f}  "
                          f"bn{b['block_n']} bk{b['block_k']} w{b['num_warps']} s{b['num_stages']} p{b['preload']}", flush=True)
                else:
                    print(f"{model_name:10} {proj:8} {m:>2}: no config ran: {r['configs'][:1]}", flush=True)
    print(f"sweep: {time.time() - start:.0f} s")
    spec = TINY if args.dry_run else MODELS["tinyllama"]
    chain_start = time.time()
    result["chain"] = chain(torch, G, timer, spec, dev, dtype, args.dry_run, UNTUNED, tuned=False)
    for key, c in result["gemv_configs"].items():  # the winners, as the model would read them
        n, k, m, prologue = key.split(",")
        G.GEMV_CONFIGS[(int(n), int(k), int(m), prologue)] = G.GemvConfig(**c)
    result["chain"] += chain(torch, G, timer, spec, dev, dtype, args.dry_run, TUNED, tuned=True)
    result["best_chain"] = best_chain(result["chain"])
    print("decode step, TinyLlama-1.1B shapes (one CUDA graph per forward):" if not args.dry_run else "decode step (tiny):")
    for r in result["chain"]:
        desc = f"  {r['linear_impl']:9} pdl={r['pdl']!s:5} tuned={r['tuned']!s:5} fused={'+'.join(r['fused']) or '-':27}"
        print(desc + (f" {r['us_per_forward']:9.1f} us  max|dlogit| {r['max_logit_err']:.3g}" if "us_per_forward" in r else f" {r['error']}"))
    print(f"chain: {time.time() - chain_start:.0f} s; best: {result['best_chain']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
