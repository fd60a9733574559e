"""The JAX engine's batch-invariant mode on a GPU (issue #40, the JAX half): tokens and ms per token.

    export PYTHONPATH=$PWD/shared:$PWD:$PWD/benchmarks TRITON_INTERPRET=0
    python benchmarks/batch_invariant_jax_gpu.py --out $OUT/bi_jax --budget-s 90     # H100 / H200
    python benchmarks/batch_invariant_jax_gpu.py --out /tmp/bi_jax --dry-run          # a tiny config on the CPU

Per shape (random bf16 weights of SmolLM2-135M's and TinyLlama-1.1B's shapes, seed 0; 16 prompts of
mixed lengths, each a repeated motif so the n-gram draft is accepted; ``prompts``) and per mode (``invariant``:
``Llama.batch_invariant``; ``default``: the JAX engine as it is), through ``flashspec.loop`` over
``JaxBackend``, greedy: requests 0-3 decoded alone, the 16 decoded as one batch, the 16 through
n-gram speculation (gamma 4, one draft: no choice to differ). Checks: each alone == its row of the
batch; speculation == the batch. Timing: plain decoding's wall ms per new token at batch 1 and 16
(a run to compile, then one timed). Every part runs only while ``--budget-s`` lasts (its result
says "skipped" otherwise). Writes ``batch_invariant_jax_gpu.json`` under ``--out``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flashspec.bandits import UCB1, BanditConfig  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402

SHAPES = {  # engine_gpu.py's (not imported: it imports torch)
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32,
                           num_kv_heads=4, head_dim=64),
}
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
BATCH, ALONE, GAMMA = 16, 4, 4
GREEDY = SamplingConfig(0.0)


def prompts(vocab: int, n: int) -> list[list[int]]:
    """n prompts, each a repeated motif; the first ALONE of one length (one compiled shape alone), the
    others of lengths 13 to 46 (the batch mixed)."""
    rs = np.random.default_rng(0)
    return [(rs.integers(0, vocab, 3 + r % 5).tolist() * 16)[: 16 if r < ALONE else 10 + 3 * r] for r in range(n)]


def backend_for(model, invariant: bool):
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    model.batch_invariant = invariant  # read when the backend splits the model (its graph)
    b = JaxBackend(model, eos_ids=[])
    b.set_drafts([LookupDraft()])
    return b


def plain(backend, ps, tokens: int):
    """(tokens per row, wall ms per new token of the row set)."""
    start = time.perf_counter()
    out, _ = decode(backend, ps, sampling=GREEDY, max_new_tokens=tokens, seed=np.zeros(len(ps), np.uint64))
    return out, 1000 * (time.perf_counter() - start) / tokens


def run_mode(model, invariant: bool, ps, tokens: int, deadline: float) -> dict:
    """The checks and timings of one mode (module docstring); parts past the deadline are skipped."""
    b = backend_for(model, invariant)
    res: dict = {}

    def part(name, f):
        if time.monotonic() > deadline:
            res[name] = "skipped (budget)"
            return None
        t0 = time.perf_counter()
        try:
            out = f()
        except Exception as e:  # noqa: BLE001 (recorded, the other parts go on)
            res[name] = f"error: {type(e).__name__}: {str(e)[:300]}"
            return None
        res[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        return out

    batch = part("batch16", lambda: plain(b, ps, tokens)[0])
    alone = part("alone", lambda: [plain(b, [p], tokens)[0][0] for p in ps[:ALONE]])
    spec = part("speculation", lambda: speculate(b, UCB1(1, BanditConfig(objective="acceptance")), ps, sampling=GREEDY,
                                                 spec=SpecConfig(gamma=GAMMA, max_new_tokens=tokens),
                                                 seed=np.zeros(len(ps), np.uint64)))
    if batch is not None and alone is not None:
        res["alone_eq_batch16"] = [a == batch[i] for i, a in enumerate(alone)]
    if batch is not None and spec is not None:
        res["speculation_eq_batch16"] = spec[0] == batch
        res["speculation_rows_eq"] = sum(s == r for s, r in zip(spec[0], batch))
        res["accepted"] = sum(r.accepted for r in spec[1])
    timed = part("timing", lambda: {f"ms_per_token_batch{n}": round(plain(b, ps[:n], tokens)[1], 3) for n in (1, BATCH)})
    if timed:
        res.update(timed)
    res["pass"] = bool(res.get("speculation_eq_batch16")) and all(res.get("alone_eq_batch16", [False]))
    return res


def write(out_dir: str, start: float, meta: dict, results: dict, cut: bool) -> None:
    """batch_invariant_jax_gpu.json under ``out_dir`` (``cut``: the watchdog stopped the run; partial)."""
    out = {
        "what": "JAX engine, batch_invariant=True vs the default mode: greedy tokens alone / batch 16 / n-gram "
                "speculation (pass = all equal), plain decoding ms per token (batch 1, 16); random weights",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(jax.devices()[0].device_kind), "platform": jax.default_backend(),
        "versions": {"jax": jax.__version__, "python": platform.python_version()},
        **meta, "gamma": GAMMA, "batch": BATCH, "alone": ALONE,
        "wall_s": round(time.monotonic() - start, 1), "cut_by_watchdog": cut,
        "invariant_pass": bool(results) and all(r.get("invariant", {}).get("pass") for r in results.values()),
        "shapes": results,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "batch_invariant_jax_gpu.json").write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({k: out[k] for k in ("device", "invariant_pass", "wall_s", "cut_by_watchdog")}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for batch_invariant_jax_gpu.json")
    ap.add_argument("--budget-s", type=float, default=90.0, help="wall seconds for all parts (those after: skipped)")
    ap.add_argument("--shapes", default="smollm2-135m,tinyllama-1.1b")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per request")
    ap.add_argument("--dry-run", action="store_true", help="a tiny config in float32 (the CPU: the plumbing only)")
    args = ap.parse_args()
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    start = time.monotonic()
    deadline = start + args.budget_s
    shapes = {"tiny": TINY} if args.dry_run else {n: SHAPES[n] for n in args.shapes.split(",")}
    dtype = jnp.float32 if args.dry_run else jnp.bfloat16
    results = {}
    meta = {"budget_s": args.budget_s, "dry_run": args.dry_run, "tokens": args.tokens, "dtype": jnp.dtype(dtype).name}
    watchdog = threading.Timer(args.budget_s + 30, lambda: (write(args.out, start, meta, results, cut=True), os._exit(3)))
    watchdog.daemon = True
    watchdog.start()  # a compile that overruns the budget cannot be interrupted: what is done is written, then exit
    for i, (name, fields) in enumerate(shapes.items()):
        share = start + args.budget_s * (i + 1) / len(shapes)  # each shape its share; unused time passes on
        now = time.monotonic()
        ends = {"invariant": now + 0.6 * (share - now), "default": share}  # a part starts only before its mode's end
        config = LlamaConfig(**fields, max_position_embeddings=4096)
        model = random_model(config, dtype=dtype, seed=0, std=0.02 if not args.dry_run else 0.3)
        ps = prompts(config.vocab_size, BATCH)
        results[name] = {}
        for mode, invariant in (("invariant", True), ("default", False)):
            results[name][mode] = run_mode(model, invariant, ps, args.tokens, min(deadline, ends[mode]))
            print(name, mode, json.dumps(results[name][mode]), flush=True)
        inv, dflt = results[name]["invariant"], results[name]["default"]
        for n in (1, BATCH):
            key = f"ms_per_token_batch{n}"
            if isinstance(inv.get(key), float) and isinstance(dflt.get(key), float):
                results[name][f"cost_batch{n}"] = round(inv[key] / dflt[key], 3)
    watchdog.cancel()
    write(args.out, start, meta, results, cut=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
