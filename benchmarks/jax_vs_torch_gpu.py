"""The JAX engine and the torch engine side by side on one GPU, one process (issue #37's table).

    python benchmarks/jax_vs_torch_gpu.py --out DIR     # on the H100 (random bf16 weights)
    python benchmarks/jax_vs_torch_gpu.py --dry-run     # a tiny config on the CPU, JAX only: proves the script runs

Per shape (SmolLM2-135M, TinyLlama-1.1B, Llama-3-8B; smallest first), torch then JAX:

* batch 1 (128-token prompt, 128 new tokens, greedy): plain ms/token and the weights floor
  (bytes / measured copy bandwidth); JAX's plain decoding also with each layer loop (the scan it
  ran before issue #37, and unrolled; ``Llama.uses_scan`` picks by layer size); JAX also the n-gram speculative step (G = 4) with the host
  loop and with the whole generation in one ``lax.while_loop`` (``benchmarks/engine_gpu_jax.py``'s
  ``run_shape``: its checks too, speculative tokens == plain tokens), and torch its default mode
  (CUDA graphs) from ``benchmarks/engine_gpu.py``'s ``time_engine``;
* ``--batches`` (8 and 64) at ``--batch-shapes``: tokens/s of plain decoding and of n-gram
  speculation (host loop; JAX's while loop too), each engine over the same prompts;
* JAX's decode step's bytes per step from the compiled executable (``cost_analysis``, and
  ``jax_profile_gpu.py``'s HLO movers);
* JAX's row-invariant mode at batch 1 (plain decoding over G + 1 positions per step): its tokens
  against n-gram speculation's and the default plain decoding's (bf16), and its ms per token.

Torch frees its cache (``torch.cuda.empty_cache``) before JAX runs a shape; JAX does not
preallocate. JSON to ``--out``/jax_vs_torch.json; a table is printed last.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402
from flashspec_jax import whole  # noqa: E402
from flashspec_jax.backend import JaxBackend  # noqa: E402
from flashspec_jax.drafts import LookupDraft  # noqa: E402
from flashspec_jax.model import LlamaConfig  # noqa: E402
from flashspec_jax.weights import random_model  # noqa: E402

import engine_gpu_jax  # noqa: E402  (benchmarks/ is on sys.path)
import jax_profile_gpu  # noqa: E402

SHAPES = engine_gpu_jax.SHAPES  # engine_gpu.py's, smallest first
TINY = engine_gpu_jax.TINY


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def wall(fn) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def jax_batch(m, batch: int, tokens: int, prompt_len: int, gamma: int, device_loop: bool) -> dict:
    """Tokens/s of plain decoding and n-gram speculation (host loop; the while loop if asked) at ``batch``."""
    vocab = m.config.vocab_size
    prompts = np.random.default_rng(batch).integers(0, vocab, (batch, prompt_len)).tolist()
    greedy, seed = SamplingConfig(0.0), np.zeros(batch, np.uint64)
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    spec = SpecConfig(gamma=gamma, max_new_tokens=tokens)
    runs = {"plain": lambda: decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed),
            "spec_host": lambda: speculate(backend, Fixed(), prompts, sampling=greedy, spec=spec, seed=seed)}
    if device_loop:
        loop = whole.Whole(backend)
        runs["spec_device"] = lambda: loop.run(prompts, max_new_tokens=tokens, gamma=gamma, sampling=greedy,
                                               seed=seed, policy=whole.Fixed(0))
    row = dict(batch=batch, new_tokens=tokens)
    outs = {}
    for name, fn in runs.items():
        fn()  # compiles (same shapes as the timed run)
        (out, records), s = wall(fn)
        outs[name] = out
        row[f"{name}_tokens_per_s"] = sum(map(len, out)) / s
        row[f"{name}_ms_per_step"] = s * 1e3 / max(1, len(records))
    row["spec_equals_plain"] = all(o == outs["plain"] for o in outs.values())
    return row


def jax_row_invariant(m, tokens: int, prompt_len: int, gamma: int) -> dict:
    """Batch 1, greedy: plain decoding with ``decode_rows = G + 1`` (the row-invariant mode) against
    n-gram speculation, and against the default plain decoding; its ms per token."""
    prompts = np.random.default_rng(1).integers(0, m.config.vocab_size, (1, prompt_len)).tolist()
    greedy, seed = SamplingConfig(0.0), np.zeros(1, np.uint64)
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)
    spec, _ = speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=gamma, max_new_tokens=tokens), seed=seed)
    backend.decode_rows = gamma + 1
    invariant, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)
    (_, records), s = wall(lambda: decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed))
    return dict(row_invariant_equals_spec=invariant == spec, default_plain_equals_spec=plain == spec,
                row_invariant_equals_default_plain=invariant == plain, row_invariant_ms_per_token=s * 1e3 / len(records))


def torch_rows(name: str, dims: dict, tokens: int, prompt_len: int, batches: list[int], bw: float) -> dict:
    import engine_gpu
    import torch
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft as TorchLookup
    from flashspec_torch.model import LlamaConfig as TorchConfig

    cfg = TorchConfig(**dims, max_position_embeddings=8192)
    m = engine_gpu.random_model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    out = dict(weight_bytes=weight_bytes, weights_floor_ms=weight_bytes / bw * 1e3)
    with torch.inference_mode():
        for batch in [1, *batches]:
            prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len)).tolist()
            seed = torch.zeros(batch, dtype=torch.int64, device="cuda")
            backend = TorchBackend(m, [TorchLookup()], eos_ids=[], verify_impl="triton", graphs=True)
            r = engine_gpu.time_engine(backend, prompts, tokens if batch == 1 else tokens // 2, seed)
            r["spec_equals_plain"] = r.pop("spec_outputs") == r.pop("outputs")
            out[f"batch_{batch}"] = r
            del backend
    del m
    torch.cuda.empty_cache()
    return out


def jax_rows(name: str, dims: dict, args, batches: list[int], bw: float) -> dict:
    out = engine_gpu_jax.run_shape(name, dims, args.tokens, 1, args.prompt_len, args.gamma, args.reps)
    out["weights_floor_ms"] = out["weight_bytes"] / bw * 1e3
    out["ar_over_weights_floor"] = out["ar_ms_per_token"] / out["weights_floor_ms"]
    out["while_over_host_step"] = out["spec_device_ms_per_step"] / out["spec_host_ms_per_step"]
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    m = random_model(LlamaConfig(**dims, max_position_embeddings=8192), dtype=dtype, seed=0)
    out["layer_loop"] = "scan" if m.uses_scan() else "unrolled"  # the default (Llama.scan_layers None)
    out["bytes_per_step"] = decode_bytes(m, args.prompt_len)
    out["loop_ms_per_token"] = {loop: loop_decode_ms(m, loop == "scan", args.tokens // 2, args.prompt_len)
                                for loop in ("scan", "unrolled")}
    out["row_invariant"] = jax_row_invariant(m, args.tokens, args.prompt_len, args.gamma)
    for batch in batches:
        try:
            out[f"batch_{batch}"] = jax_batch(m, batch, args.tokens // 2, args.prompt_len, args.gamma, args.device_loop)
        except Exception as e:  # one batch failing (memory) must not lose the others
            out[f"batch_{batch}"] = dict(error=f"{type(e).__name__}: {e}"[:500])
    del m
    return out


def loop_decode_ms(m, scan: bool, tokens: int, prompt_len: int) -> float:
    """Plain decoding's ms/token with the layer scan (the engine before issue #37) or the unrolled
    loop, batch 1."""
    m.scan_layers = scan
    try:
        backend = JaxBackend(m, eos_ids=[])
        backend.set_drafts([LookupDraft()])
        prompts = [[1] * prompt_len]
        run = lambda: decode(backend, prompts, sampling=SamplingConfig(0.0), max_new_tokens=tokens, seed=np.zeros(1, np.uint64))  # noqa: E731
        run()
        (_, records), s = wall(run)
        return s * 1e3 / len(records)
    finally:
        m.scan_layers = None


def decode_bytes(m, prompt_len: int) -> dict:
    """The compiled decode step's cost_analysis bytes and HLO movers (batch 1, as the engine jits it)."""
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    state = backend.start_state([[1] * prompt_len], 128)
    compiled = backend.decode_jit.lower(backend.weights, state, SamplingConfig(0.0), backend._seeds(0), jnp.uint32(0)).compile()
    c = jax_profile_gpu.cost(compiled)
    hlo = jax_profile_gpu.parse_hlo(compiled.as_text())
    return dict(**c, mover_bytes_by_op=hlo["mover_bytes_by_op"], while_loops=hlo["while_loops"])


def table(rows: list[dict], batches: list[int]) -> str:
    lines = ["shape | floor ms | torch ms/tok | JAX ms/tok | JAX/torch | JAX/floor | JAX scan ms/tok | JAX host step | JAX while step | while/host"]
    for r in rows:
        t, j = r.get("torch", {}), r.get("jax", {})
        if "error" in j or "error" in t or not j:
            lines.append(f"{r['shape']} | error: {j.get('error') or t.get('error')}"[:200])
            continue
        tar = t.get("batch_1", {}).get("ar_ms_per_token", float("nan"))
        lines.append(f"{r['shape']} | {j['weights_floor_ms']:.3f} | {tar:.3f} | {j['ar_ms_per_token']:.3f} | "
                     f"{j['ar_ms_per_token'] / tar:.2f} | {j['ar_over_weights_floor']:.2f} | {j['loop_ms_per_token']['scan']:.3f} | "
                     f"{j['spec_host_ms_per_step']:.3f} | "
                     f"{j['spec_device_ms_per_step']:.3f} | {j['while_over_host_step']:.3f}")
    lines.append("shape | batch | torch plain tok/s | JAX plain tok/s | torch spec tok/s | JAX spec tok/s (host) | JAX spec tok/s (while)")
    for r in rows:
        for b in batches:
            t, j = r.get("torch", {}).get(f"batch_{b}", {}), r.get("jax", {}).get(f"batch_{b}")
            if not j:
                continue
            lines.append(f"{r['shape']} | {b} | {t.get('ar_tokens_per_s', float('nan')):.0f} | {j.get('plain_tokens_per_s', float('nan')):.0f} | "
                         f"{t.get('spec_tokens_per_s', float('nan')):.0f} | {j.get('spec_host_tokens_per_s', float('nan')):.0f} | "
                         f"{j.get('spec_device_tokens_per_s', float('nan')):.0f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch-shapes", default="llama3-8b", help="shapes that also run --batches")
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-device-loop", dest="device_loop", action="store_false", help="batches: host loop only")
    ap.add_argument("--no-torch", dest="torch", action="store_false")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config on the CPU, JAX only")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args(argv)
    if args.dry_run:
        shapes, batch_shapes, args.tokens, args.prompt_len, args.reps, args.torch = {"tiny": TINY}, {"tiny"}, 12, 16, 2, False
    else:
        shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
        batch_shapes = set(args.batch_shapes.split(","))
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.torch:
        from verify_kernels import copy_bandwidth_gbps

        bw = copy_bandwidth_gbps("cuda") * 1e9
    else:
        bw = jax_profile_gpu.bandwidth_gbps() * 1e9
    rows = []
    for name, dims in shapes.items():
        row, b = dict(shape=name), batches if name in batch_shapes else []
        t0 = time.perf_counter()
        for side, fn in (("torch", lambda: torch_rows(name, dims, args.tokens, args.prompt_len, b, bw)),
                         ("jax", lambda: jax_rows(name, dims, args, b, bw))):
            if side == "torch" and not args.torch:
                continue
            try:
                row[side] = fn()
            except Exception as e:  # one side failing must not lose the other
                row[side] = dict(error=f"{type(e).__name__}: {e}"[:1000])
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
    dev = jax.devices()[0]
    versions = dict(jax=jax.__version__, python=platform.python_version())
    if args.torch:
        import torch
        import triton

        versions.update(torch=torch.__version__, triton=triton.__version__)
    checks = {f"{r['shape']}_{k}": v for r in rows for k, v in r.get("jax", {}).items()
              if k.startswith("spec_") and k.endswith(("equals_ar", "equals_host"))}
    checks |= {f"{r['shape']}_{k}": v for r in rows for k, v in r.get("jax", {}).get("row_invariant", {}).items()
               if k.startswith("row_invariant_equals")}
    result = dict(script="benchmarks/jax_vs_torch_gpu.py", device=getattr(dev, "device_kind", str(dev)),
                  platform=jax.default_backend(), versions=versions, xla_flags=os.environ.get("XLA_FLAGS", ""),
                  date=datetime.now(timezone.utc).isoformat(timespec="seconds"), dry_run=args.dry_run,
                  copy_bandwidth_gbps=bw / 1e9, argv=sys.argv[1:], checks=checks, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("jax_vs_torch_dry_run.json" if args.dry_run else "jax_vs_torch.json")
    path.write_text(json.dumps(result, indent=1))
    print(path)
    print(table(rows, batches))


if __name__ == "__main__":
    main()
