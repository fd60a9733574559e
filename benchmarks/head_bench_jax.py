"""The draft head in the JAX engine against plain decoding and ngram, on held-out prompts by domain, batch 1.

Prompts: the held-out groups of ``flashspec.head_corpus`` (as benchmarks/head_bench.py, the torch
table), the first ``--prompts`` per domain; chat through the chat template. For each domain and
temperature: plain decoding, the head at G = 4 (host loop), ngram at G = 4, and the head at G = 4
in the whole-generation ``lax.while_loop`` (``loop="device"``). Every prompt runs once untimed
first (JAX compiles each shape on its first call), then timed. Checks: at T = 0 each speculative
run's tokens equal plain decoding's (``greedy_equal``). Also the draft's cost: the jitted head
proposal (G tokens) and one plain decoding step, medians of ``--reps`` calls.

    python benchmarks/head_bench_jax.py [--target model.gguf] [--prompts 2] [--new-tokens 48] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent))

from head_bench import Steps, summary  # noqa: E402  (the torch table's counters)


def run(engine, ids_list, *, temperature: float, gamma: int, new_tokens: int, speculation: bool = True):
    """Each prompt untimed (compiles its shapes), then timed; returns (cell, tokens)."""
    from flashspec.config import SamplingConfig
    from flashspec.engine import Request
    from flashspec.loop import SpecConfig

    sampling, spec = SamplingConfig(temperature), SpecConfig(gamma=gamma, max_new_tokens=new_tokens)
    steps, tokens, seconds = Steps(), [], 0.0
    for ids in ids_list:
        engine.run(Request([ids], [0], sampling, spec, speculation, None), [])  # warm-up: compile
        records: list = []
        start = time.perf_counter()
        out = engine.run(Request([ids], [0], sampling, spec, speculation, None), records)
        seconds += time.perf_counter() - start
        tokens.append(out[0])
        for r in records:
            steps(r)
    return summary(steps, tokens, seconds, gamma, speculation), tokens


def draft_cost(engine, ids, gamma: int, reps: int) -> dict:
    """ms of the jitted head proposal (G tokens, greedy) and of one plain decoding step, after a prefill."""
    from flashspec.config import SamplingConfig

    backend, greedy = engine.backend, SamplingConfig(0.0)

    def median_ms(f):
        jax.block_until_ready(f())
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            jax.block_until_ready(f())
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    backend.prefill([ids], 64)
    state = backend.state  # every call from the same state: the same work each time
    draft = median_ms(lambda: backend.draft_jit(0, backend.leaves, state, gamma, greedy, backend.seeds(0), 0)[0].tokens)
    plain = median_ms(lambda: backend.decode_jit(backend.leaves, state, greedy, backend.seeds(0), 0)[1].num_accepted)
    return {"gamma": gamma, "draft_ms": draft, "draft_ms_per_token": draft / gamma, "plain_step_ms": plain,
            "draft_per_token_over_plain_step": draft / gamma / plain}


def bench(loaded, *, prompts: int, new_tokens: int, gamma: int, temperatures, reps: int, log=print, save=None) -> dict:
    """Every cell; ``save(partial results)`` after each (a run cut by a timeout keeps what it measured)."""
    from flashspec.engine import encode
    from flashspec.head_corpus import DOMAINS, corpus, split
    from flashspec_jax.engine import Engine

    engines = {"head": Engine(loaded, ("head",), policy="fixed"), "ngram": Engine(loaded, ("ngram",), policy="fixed"),
               "head device loop": Engine(loaded, ("head",), policy="fixed", loop="device")}
    held = split(corpus())[1]
    results = {}
    for d in DOMAINS:
        ids_list = [encode(loaded.tokenizer, p.text, d == "chat") for p in [p for p in held if p.domain == d][:prompts]]
        for t in temperatures:
            cells = {}
            cells["plain"], plain = run(engines["head"], ids_list, temperature=t, gamma=1, new_tokens=new_tokens,
                                        speculation=False)
            for name, e in engines.items():
                cells[f"{name} G={gamma}"], got = run(e, ids_list, temperature=t, gamma=gamma, new_tokens=new_tokens)
                cells[f"{name} G={gamma}"]["greedy_equal"] = got == plain if t == 0 else None
            for c in cells.values():
                c["speedup"] = c["tok_s"] / cells["plain"]["tok_s"]
            results[f"{d} T={t}"] = cells
            if save:
                save({"cells": results})
            log(f"{d} T={t}: " + ", ".join(f"{k} {c['tok_s']:.1f} tok/s ({c['speedup']:.2f}x"
                                           + (f", {c['emitted_per_step']:.2f}/step" if "emitted_per_step" in c else "")
                                           + ")" for k, c in cells.items()))
    ids = encode(loaded.tokenizer, [p for p in held if p.domain == "prose"][0].text, False)
    cost = draft_cost(engines["head"], ids, gamma, reps)
    log(f"draft cost: {cost}")
    return {"cells": results, "draft_cost": cost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None, help="the embedded model's .gguf (default: the installed one)")
    ap.add_argument("--prompts", type=int, default=2, help="held-out prompts per domain")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import flax
    import jax.numpy as jnp

    from flashspec_jax.weights import load

    dev = jax.devices()[0]
    loaded = load(args.target, jnp.float32 if dev.platform == "cpu" else jnp.bfloat16)
    start = time.time()

    def save(results: dict, complete: bool = False) -> bool:
        equal = [c["greedy_equal"] for cells in results["cells"].values() for c in cells.values()
                 if c.get("greedy_equal") is not None]
        doc = {"command": "python benchmarks/head_bench_jax.py " + " ".join(sys.argv[1:]), "date": str(date.today()),
               "device": f"{dev.platform}: {dev.device_kind}", "machine": platform.machine(),
               "dtype": "float32" if dev.platform == "cpu" else "bfloat16", "batch": 1, "complete": complete,
               "versions": {"jax": jax.__version__, "flax": flax.__version__, "python": platform.python_version()},
               "checks": {"greedy_equal": all(equal), "pass": all(equal)}, "seconds": time.time() - start, **results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        return all(equal)

    results = bench(loaded, prompts=args.prompts, new_tokens=args.new_tokens, gamma=args.gamma,
                    temperatures=tuple(float(t) for t in args.temperatures.split(",")), reps=args.reps, save=save)
    print(f"wrote {args.out}: greedy_equal {save(results, complete=True)}")


if __name__ == "__main__":
    main()
