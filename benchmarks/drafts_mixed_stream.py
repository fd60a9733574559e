"""A mixed stream (code, then prose, then code): the bandit over the real drafts against each
single fixed draft over the whole stream, tokens/s on the CPU.

The stream is a sequence of requests on one engine, so the policy's state carries from one
request to the next (Engine keeps it) and it must notice when the domain changes. Each method
generates the same stream; at temperature 0 all must emit the same tokens (checked).

    python benchmarks/drafts_mixed_stream.py --per-segment 2 --max-new-tokens 48
    OMP_NUM_THREADS=1 python benchmarks/drafts_mixed_stream.py --draft head --draft ngram --temperature 0.7 --per-segment 1

``--clock process`` times each request by the process's CPU time instead of the wall clock (a shared machine).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from drafts_common import machine, prompts  # noqa: E402


def build_stream(per_segment: int) -> list[tuple[str, str]]:
    """(domain, prompt): code 0..k-1, prose 0..k-1, code k..2k-1."""
    code = prompts("code", 0, 2 * per_segment)
    prose = prompts("prose", 0, per_segment)
    return ([("code", p) for p in code[:per_segment]] + [("prose", p) for p in prose]
            + [("code", p) for p in code[per_segment:]])


def run_streams(methods: dict, stream, temperature: float, gamma: int, max_new: int, clock=None) -> dict:
    """Every method generates the stream; request-major order, so that the load of the shared
    machine at any moment weighs on every method alike. ``clock``: time.process_time, or None for
    the engine's own wall time."""
    results = {label: {"tokens": 0, "seconds": 0.0, "arm_pulls": {}, "requests": [], "outputs": []} for label in methods}
    for i, (domain, text) in enumerate(stream):
        for label, (engine, speculation) in methods.items():
            start = clock() if clock else 0.0
            out = engine.generate(text, temperature=temperature, max_new_tokens=max_new, seed=i, gamma=gamma,
                                  speculation=speculation, chat=False)
            if clock:
                out["wall_s"] = clock() - start
            r = results[label]
            r["tokens"] += out["new_tokens"]
            r["seconds"] += out["wall_s"]
            r["outputs"].append(out["tokens"])
            for k, v in out["arm_pulls"].items():
                r["arm_pulls"][k] = r["arm_pulls"].get(k, 0) + v
            r["requests"].append({"domain": domain, "tokens": out["new_tokens"], "seconds": out["wall_s"],
                                  "arm_pulls": out["arm_pulls"], "acceptance": out["acceptance"]})
            print(f"request {i} ({domain}) {label}: {out['new_tokens'] / out['wall_s']:.2f} tok/s, pulls {out['arm_pulls']}",
                  flush=True)
    for r in results.values():
        r["tokens_per_s"] = r["tokens"] / r["seconds"]
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-segment", type=int, default=2, help="requests per segment (code, prose, code)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--draft", action="append", help="a draft name; repeat (default ngram, nf4, layerskip)")
    ap.add_argument("--policies", default="thompson-token", help="comma-separated bandit policies")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/drafts_mixed_stream.json"))
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="wall, or process: this process's CPU time (a machine shared with other jobs)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine more threads thrash)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from flashspec_torch.engine import Engine
    from flashspec_torch.nf4 import quantize_nf4
    from flashspec_torch.weights import LoadedModel, load

    torch.manual_seed(0)
    target = load(None)
    names = args.draft or ["ngram", "nf4", "layerskip"]
    nf4 = LoadedModel(quantize_nf4(target.model), target.tokenizer, "nf4") if "nf4" in names else None
    drafts = [nf4 if n == "nf4" else n for n in names]
    stream = build_stream(args.per_segment)
    fixed = {f"fixed {n}": Engine(target, (d,), policy="fixed", device="cpu") for n, d in zip(names, drafts)}
    bandits = {f"bandit {p}": Engine(target, drafts, policy=p, objective="throughput", device="cpu")
               for p in args.policies.split(",")}
    for eng in [*fixed.values(), *bandits.values()]:  # warm up the code paths, then forget what the policy saw
        eng.generate("warm up", max_new_tokens=4, chat=False, temperature=0.0)
        eng.policy = None
    methods = {"plain": (next(iter(fixed.values())), False)}
    methods.update({k: (e, True) for k, e in [*fixed.items(), *bandits.items()]})
    results = run_streams(methods, stream, args.temperature, args.gamma, args.max_new_tokens,
                          time.process_time if args.clock == "process" else None)
    ref = results["plain"]["outputs"]
    for r in results.values():
        if args.temperature == 0:
            r["same_tokens_as_plain"] = r["outputs"] == ref
        del r["outputs"]
    fixed = {k: v["tokens_per_s"] for k, v in results.items() if k.startswith("fixed")}
    best_fixed = max(fixed, key=fixed.get)
    doc = {
        "command": "python " + shlex.join(sys.argv),
        **machine(),
        "stream": [d for d, _ in stream],
        "clock": args.clock,
        "best_fixed": best_fixed,
        "bandit_vs_best_fixed": {k: v["tokens_per_s"] / fixed[best_fixed] for k, v in results.items() if k.startswith("bandit")},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"\n{'method':<28}{'tok/s':>8}  pulls")
    for k, v in results.items():
        print(f"{k:<28}{v['tokens_per_s']:>8.2f}  {v['arm_pulls']}  exact: {v.get('same_tokens_as_plain', '-')}")
    print(f"best fixed: {best_fixed}; bandit / best fixed: {doc['bandit_vs_best_fixed']}")


if __name__ == "__main__":
    main()
