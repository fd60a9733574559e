"""The draft head over its N most frequent tokens (``--draft head:DIR@N``) against its whole vocabulary,
end to end on held-out prompts (benchmarks/head_bench.py's ``bench``, head only, batch 1).

A head file written by ``flashspec train-head`` stores its vocabulary most frequent first with the
counts. A file without them (the first format, sorted by id: the shipped head of 2026-12-06) gets
counts estimated here: the head's tokens are ranked by their count in every training prompt of
``flashspec.head_corpus`` and in the target's greedy continuations (``--count-tokens``) of
``--count-prompts`` of them per domain (ties by lower id); greedy continuations of as many held-out
prompts give each N's coverage. Timing per ``--clock``
(``process``: this process's CPU time, for a shared machine).

    OMP_NUM_THREADS=1 python benchmarks/head_vocab_cpu.py --tops 8192,4096 --out benchmarks/results/cpu_head_vocab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def counted_copy(path, loaded, directory: Path, prompts: int, tokens: int, log) -> tuple[Path, dict]:
    """The head at ``path`` saved under ``directory`` most frequent first (its own counts, or counts
    estimated from the target's continuations), and the held-out coverage of its top N."""
    from flashspec.engine import encode
    from flashspec.head_corpus import corpus, split
    from flashspec_torch.head_job import data_stats, pick
    from flashspec_torch.head_train import Sequence, TrainConfig, by_frequency, generate_sequences, token_counts
    from flashspec_torch.heads import load_head, save_head
    from safetensors import safe_open

    model = loaded.model
    head, meta = load_head(path, model.config)
    train_p, held_p = split(corpus())
    cfg = TrainConfig(new_tokens=tokens, gen_batch=64)
    enc = lambda p: encode(loaded.tokenizer, p.text, p.domain == "chat")  # noqa: E731
    eos = model.config.eos_token_ids
    with safe_open(str(Path(path) / "head.safetensors" if Path(path).is_dir() else path), "pt") as f:
        stored = f.get_tensor("token_counts") if "token_counts" in f.keys() else None
        ids_in_file = f.get_tensor("token_ids")
    if stored is not None:
        counts = torch.zeros(model.config.vocab_size, dtype=torch.int64).index_put_((ids_in_file,), stored)
        source = "the file's token_counts"
    else:
        log(f"{path}: no token_counts; estimating them from the training prompts and {prompts} continuations per domain")
        text = [Sequence(p.domain, False, enc(p), 0) for p in train_p]
        text += generate_sequences(model, pick(train_p, prompts, 0), enc, cfg, eos, greedy=True)
        counts = token_counts(text, model.config.vocab_size)
        source = (f"estimated: the {len(train_p)} training prompts' tokens and greedy continuations of {prompts} "
                  f"of them per domain, {tokens} tokens")
    held = generate_sequences(model, pick(held_p, prompts, 1), enc, cfg, eos, greedy=True)
    inside = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    inside[head.token_ids] = True
    order = by_frequency(torch.where(inside, counts + 1, torch.zeros_like(counts)))[: len(head.token_ids)]
    out = save_head(head, directory / "head.safetensors", target_name=meta.get("target_name", ""), dtype=torch.float32,
                    extra=json.loads(meta.get("extra", "{}")), counts=torch.where(inside, counts + 1, 0))
    coverage = data_stats([], held, order, model.config.vocab_size)["held_out_coverage_by_top_n"]
    return out, {"counts": source, "held_out_coverage_by_top_n": coverage}


def main() -> None:
    import head_bench
    from flashspec.drafts import SHIPPED_HEAD
    from flashspec_torch.engine import load_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default=str(SHIPPED_HEAD), help="a head file or directory (default: the shipped head)")
    ap.add_argument("--tops", default="8192,4096")
    ap.add_argument("--prompts", type=int, default=2, help="held-out prompts per domain (engine runs)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--count-prompts", type=int, default=16, help="training prompts per domain for estimated counts")
    ap.add_argument("--count-tokens", type=int, default=64)
    ap.add_argument("--clock", choices=sorted(head_bench.CLOCKS), default="process")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    head_bench.clock = head_bench.CLOCKS[args.clock]
    log = lambda s: print(s, flush=True)  # noqa: E731
    start = time.perf_counter()
    loaded = load_target(None, torch.float32, "cpu")
    doc = {"command": "python benchmarks/head_vocab_cpu.py " + " ".join(sys.argv[1:]), **head_bench.machine("cpu"),
           "clock": args.clock, "head": args.head, "tops": {}}
    with tempfile.TemporaryDirectory() as tmp:
        whole, doc["vocabulary"] = counted_copy(args.head, loaded, Path(tmp) / "whole", args.count_prompts,
                                                args.count_tokens, log)
        for n in (int(x) for x in args.tops.split(",")):
            log(f"top {n}:")
            doc["tops"][n] = head_bench.bench(loaded, f"head:{whole}@{n}", prompts=args.prompts, new_tokens=args.new_tokens,
                                              gammas=(args.gamma,), others=(), device="cpu", hf=False, log=log,
                                              temperatures=tuple(float(t) for t in args.temperatures.split(",")))
    doc["wall_s"] = time.perf_counter() - start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
