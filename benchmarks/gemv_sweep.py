"""The fused skinny products (flashspec_torch.gemv) on a GPU: a config sweep per projection against
cuBLAS, then whole decode steps of TinyLlama-1.1B in one CUDA graph per engine variant.

    python benchmarks/gemv_sweep.py [--out benchmarks/results/gemv_sweep.json] [--models tinyllama smollm2 llama3-8b]
    python benchmarks/gemv_sweep.py --dry-run     # CPU: interpreter, tiny shapes, no timing claims

Per call times are CUDA-graph replays (``--calls`` calls per graph, cycling over enough weight
copies that they do not sit in L2), median of ``--replays`` replays. Every config's output is
checked against the plain torch reference before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
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
    from flashspec_torch.verify import next_pow2

    if dry:
        return [GemvConfig(block_n=8, block_k=64), GemvConfig(block_n=4, block_k=32)]
    out = []
    for bn in (4, 8, 16, 32):
        for bk in (128, 256, 512, 1024):
            for warps in (2, 4, 8):
                per_thread = next_pow2(m) * bn * bk / (32 * warps)  # float32 accumulators
                if bk <= next_pow2(k) and 8 <= per_thread <= 128:
                    out.append(GemvConfig(block_n=bn, block_k=bk, num_warps=warps, num_stages=1))
    return out


class Timer:
    def __init__(self, torch, calls: int, replays: int, dry: bool):
        self.torch, self.calls, self.replays, self.dry = torch, calls, replays, dry

    def per_call_us(self, fns) -> float:
        """fns: callables (one per weight copy); one graph of `calls` calls cycling over them."""
        torch = self.torch
        seq = [fns[i % len(fns)] for i in range(max(self.calls, len(fns)))]
        if self.dry:
            t = time.perf_counter()
            seq[0]()
            return (time.perf_counter() - t) * 1e6
        for f in fns[:2]:
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in seq:
                f()
        for _ in range(3):
            g.replay()
        times = []
        for _ in range(self.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / len(seq))
        return statistics.median(times)


def copy_bandwidth_gbs(torch) -> float:
    """Read + write bytes per second of a 2 GiB device-to-device copy."""
    a = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    del a, b
    return 2 * 2 * (1 << 30) / min(ts) / 1e9


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
    for config in grid(k, m, dry):
        row = dict(block_n=config.block_n, block_k=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages)
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
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    for r in timed[:3] if not dry else []:  # the best few again with deeper pipelining
        for stages in (2, 3, 4):
            config = G.GemvConfig(block_n=r["block_n"], block_k=r["block_k"], num_warps=r["num_warps"], num_stages=stages)
            row = dict(block_n=config.block_n, block_k=config.block_k, num_warps=config.num_warps, num_stages=stages)
            try:
                row["us"] = timer.per_call_us([fused_fn(w, config) for w in ws])
                row["gbs"] = wbytes / row["us"] / 1e3
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    del ws
    return dict(proj=name, n=n, k=k, m=m, prologue=prologue, weight_bytes=wbytes, weight_copies=copies,
                cublas_us=cublas_us, cublas_gbs=wbytes / cublas_us / 1e3, best=timed[0] if timed else None, configs=rows)


def chain(torch, G, timer, spec, dev, dtype, dry, tuned: bool):
    """One decode step (T=1, batch 1) of the whole model per engine variant, one CUDA graph each."""
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
    variants = [("reference", False), ("triton", False), ("fused", False), ("fused", True)]
    out, want = [], None
    for linear_impl, pdl in variants:
        model.linear_impl, model.pdl = linear_impl, pdl
        try:
            with torch.inference_mode():
                logits = model(tok, pos, cache, 128)
                if want is None:
                    want = logits
                us = timer.per_call_us([lambda: model(tok, pos, cache, 128)])
            out.append(dict(linear_impl=linear_impl, pdl=pdl, tuned=tuned, us_per_forward=us,
                            max_logit_err=(logits - want).abs().max().item(), weights_floor_us_at_4_8tbs=floor_us))
        except Exception as e:
            out.append(dict(linear_impl=linear_impl, pdl=pdl, tuned=tuned, error=f"{type(e).__name__}: {str(e)[:300]}"))
    del model, cache
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/gemv_sweep.json")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 5])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--dry-run", action="store_true", help="CPU: the Triton interpreter on tiny shapes")
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch
    import triton

    if not args.dry_run and not torch.cuda.is_available():
        print("gemv_sweep.py needs a CUDA GPU (or --dry-run for a CPU check of the script)", file=sys.stderr)
        return 2
    from flashspec_torch import gemv as G

    dev = "cpu" if args.dry_run else "cuda"
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    timer = Timer(torch, args.calls, args.replays, args.dry_run)
    result = dict(gpu="cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"), dry_run=args.dry_run,
                  copy_bandwidth_gbs=None if args.dry_run else copy_bandwidth_gbs(torch), gemv=[], chain=[], gemv_configs={})
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
                    result["gemv_configs"][f"{n},{k},{m},{prologue}"] = {key: b[key] for key in ("block_n", "block_k", "num_warps", "num_stages")}
                    print(f"{model_name:10} {proj:8} {m:>2} {n:>6} {k:>6} {r['cublas_us']:9.1f} {r['cublas_gbs']:6.0f} "
                          f"{b['us']:8.1f} {b['gbs']:6.0f} {100 * b['gbs'] / copy_bw:5.0f}  "
                          f"bn{b['block_n']} bk{b['block_k']} w{b['num_warps']} s{b['num_stages']}", flush=True)
                else:
                    print(f"{model_name:10} {proj:8} {m:>2}: no config ran: {r['configs'][:1]}", flush=True)
    print(f"sweep: {time.time() - start:.0f} s")
    spec = TINY if args.dry_run else MODELS["tinyllama"]
    result["chain"] = chain(torch, G, timer, spec, dev, dtype, args.dry_run, tuned=False)
    for key, c in result["gemv_configs"].items():  # the winners, as the model would read them
        n, k, m, prologue = key.split(",")
        G.GEMV_CONFIGS[(int(n), int(k), int(m), prologue)] = G.GemvConfig(**c)
    result["chain"] += [r for r in chain(torch, G, timer, spec, dev, dtype, args.dry_run, tuned=True) if r["linear_impl"] == "fused"]
    print("decode step, TinyLlama-1.1B shapes (one CUDA graph per forward):" if not args.dry_run else "decode step (tiny):")
    for r in result["chain"]:
        desc = f"  {r['linear_impl']:9} pdl={r['pdl']!s:5} tuned={r['tuned']!s:5}"
        print(desc + (f" {r['us_per_forward']:9.1f} us  max|dlogit| {r['max_logit_err']:.3g}" if "us_per_forward" in r else f" {r['error']}"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
