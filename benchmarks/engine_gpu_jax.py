"""The JAX engine on a GPU with random weights (timing only): the model shapes of SmolLM2-135M,
TinyLlama-1.1B and Llama-3-8B, as benchmarks/engine_gpu.py times the torch engine.

    python benchmarks/engine_gpu_jax.py [--shapes smollm2-135m,...] [--tokens 128] [--with-torch] [--out DIR]
    python benchmarks/engine_gpu_jax.py --dry-run            # a tiny config on the CPU: proves the script runs

Per shape (bf16, batch 1, 128-token random prompt, 128 new tokens, greedy): first the correctness
checks (speculative tokens == plain greedy tokens, host loop and on-device loop), then ms per
autoregressive token (host loop over the jitted decode step), ms per speculative step (n-gram
draft, G = 4) with the host loop (``flashspec.loop.speculate`` over jitted draft / score / verify /
commit, results read one step late) and with the whole generation in one ``lax.while_loop``
(``flashspec_jax.whole``), the jitted target forward alone (1 and G+1 tokens), and the weights'
memory floor. Random weights are made on the device inside one jit (Llama-3-8B is 16 GB in bf16).
``--with-torch`` adds benchmarks/engine_gpu.py's torch rows in the same run. JSON goes to
``--out``/engine_gpu_jax.json (dry run: engine_gpu_jax_dry_run.json); a table is printed last.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory to torch too

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

try:
    import flax  # noqa: E402, F401
except ImportError as e:
    raise SystemExit(f"engine_gpu_jax: the JAX engine needs flax (pip install flax): {e}")

from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402
from flashspec_jax import whole  # noqa: E402
from flashspec_jax.backend import JaxBackend  # noqa: E402
from flashspec_jax.drafts import LookupDraft  # noqa: E402
from flashspec_jax.model import LlamaConfig  # noqa: E402
from flashspec_jax.weights import random_model  # noqa: E402

from engine_gpu import SHAPES  # noqa: E402  (benchmarks/ is on sys.path for scripts)

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def forward_ms(m, batch: int, tokens: int, context: int, reps: int) -> float:
    from flax import nnx

    graphdef, params = nnx.split(m)

    @jax.jit
    def fwd(params, x, pos, cache):
        return nnx.merge(graphdef, params)(x, pos, cache)

    cache = m.new_cache(batch, context + tokens + 8)
    x = jnp.zeros((batch, tokens), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(context, context + tokens)[None], (batch, tokens))
    for _ in range(3):
        jax.block_until_ready(fwd(params, x, pos, cache))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fwd(params, x, pos, cache))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(jax.tree.leaves(out))
    return out, (time.perf_counter() - t) * 1e3


def run_shape(name: str, shape: dict, tokens: int, batch: int, prompt_len: int, gamma: int, reps: int) -> dict:
    cfg = LlamaConfig(**shape, max_position_embeddings=8192)
    dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
    t0 = time.perf_counter()
    m = random_model(cfg, dtype=dtype, seed=0)
    jax.block_until_ready(m.embed.value)
    build_s = time.perf_counter() - t0
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(m))
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt_len)).tolist()
    greedy = SamplingConfig(0.0)
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    loop = whole.Whole(backend)
    seed = np.zeros(batch, np.uint64)
    spec = SpecConfig(gamma=gamma, max_new_tokens=tokens)

    def ar():
        return decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)

    def host():
        return speculate(backend, Fixed(), prompts, sampling=greedy, spec=spec, seed=seed)

    def device():
        return loop.run(prompts, max_new_tokens=tokens, gamma=gamma, sampling=greedy, seed=seed, policy=whole.Fixed(0))

    t0 = time.perf_counter()
    (ar_out, _), (host_out, _), (dev_out, _) = ar(), host(), device()  # compiles every step (same shapes as timed)
    compile_s = time.perf_counter() - t0
    checks = dict(spec_host_equals_ar=host_out == ar_out, spec_device_equals_ar=dev_out == ar_out,
                  spec_device_equals_host=dev_out == host_out)
    (_, ar_rec), ar_ms = timed(ar)
    (_, host_rec), host_ms = timed(host)
    (_, dev_rec), dev_ms = timed(device)
    ctx = prompt_len + tokens // 2
    row = dict(
        shape=name, dtype=str(jnp.dtype(dtype)), batch=batch, prompt_len=prompt_len, new_tokens=tokens, gamma=gamma,
        weight_bytes=int(weight_bytes), build_weights_s=build_s, compile_and_first_runs_s=compile_s, **checks,
        ar_ms_per_token=ar_ms / len(ar_rec),
        spec_host_ms_per_step=host_ms / len(host_rec), spec_host_steps=len(host_rec),
        spec_device_ms_per_step=dev_ms / len(dev_rec), spec_device_steps=len(dev_rec),
        spec_acceptance=sum(r.accepted for r in host_rec) / max(1, sum(r.drafted for r in host_rec)),
        forward_1_token_ms=forward_ms(m, batch, 1, ctx, reps), forward_g1_tokens_ms=forward_ms(m, batch, gamma + 1, ctx, reps),
        ar_ms_total=ar_ms, spec_host_ms_total=host_ms, spec_device_ms_total=dev_ms,
    )
    del m, backend, loop
    return row


def torch_rows(shapes: list[str], tokens: int, batch: int, prompt_len: int) -> list[dict]:
    """benchmarks/engine_gpu.py's torch rows, same process, same shapes."""
    import engine_gpu  # benchmarks/ is on sys.path for scripts
    import torch

    bw = engine_gpu.copy_bandwidth_gbps("cuda") * 1e9
    rows = []
    for name in shapes:
        try:
            rows.append(engine_gpu.run_shape(name, tokens, batch, prompt_len, bw))
        except Exception as e:  # one shape failing must not lose the others
            rows.append(dict(shape=name, error=f"{type(e).__name__}: {e}"[:500]))
        torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict], torch_by_shape: dict) -> str:
    lines = [f"{'shape':<16}{'AR ms/tok':>10}{'host ms/step':>13}{'device ms/step':>15}{'fwd1 ms':>9}{'fwd5 ms':>9}"
             f"{'torch AR':>10}{'torch step':>11}{'spec==AR':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['shape']:<16} error: {r['error'][:90]}")
            continue
        t = torch_by_shape.get(r["shape"], {})
        tar, tsp = t.get("ar_ms_per_token"), t.get("spec_ms_per_step")
        lines.append(f"{r['shape']:<16}{r['ar_ms_per_token']:>10.2f}{r['spec_host_ms_per_step']:>13.2f}"
                     f"{r['spec_device_ms_per_step']:>15.2f}{r['forward_1_token_ms']:>9.2f}{r['forward_g1_tokens_ms']:>9.2f}"
                     f"{(f'{tar:.2f}' if tar else '-'):>10}{(f'{tsp:.2f}' if tsp else '-'):>11}"
                     f"{str(r['spec_host_equals_ar'] and r['spec_device_equals_ar']):>9}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20, help="repetitions of the forward-only timings")
    ap.add_argument("--with-torch", action="store_true", help="also run benchmarks/engine_gpu.py's torch rows")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config, few tokens (runs on the CPU)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args()
    if args.dry_run:
        shapes, args.tokens, args.prompt_len, args.reps = {"tiny": TINY}, 12, 16, 2
    else:
        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            ap.error(f"--shapes: unknown {sorted(unknown)}; choose from {sorted(SHAPES)}")
        shapes = {n: SHAPES[n] for n in args.shapes.split(",")}
    rows = []
    for name, shape in shapes.items():
        try:
            rows.append(run_shape(name, shape, args.tokens, args.batch, args.prompt_len, args.gamma, args.reps))
        except Exception as e:  # one shape failing must not lose the others
            rows.append(dict(shape=name, error=f"{type(e).__name__}: {e}"[:500]))
        print(json.dumps(rows[-1]), flush=True)
    t_rows = torch_rows(list(shapes), args.tokens, args.batch, args.prompt_len) if args.with_torch and not args.dry_run else []
    dev = jax.devices()[0]
    result = dict(device=getattr(dev, "device_kind", str(dev)), platform=jax.default_backend(), jax=jax.__version__,
                  date=str(date.today()), dry_run=args.dry_run,
                  verify_impl="pallas" if jax.default_backend() == "gpu" else "reference", rows=rows, torch_rows=t_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("engine_gpu_jax_dry_run.json" if args.dry_run else "engine_gpu_jax.json")
    path.write_text(json.dumps(result, indent=1))
    print(path)
    print(table(rows, {r["shape"]: r for r in t_rows}))


if __name__ == "__main__":
    main()
