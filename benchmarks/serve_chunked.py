"""Chunked prefill, measured: a few requests stream (greedy) when a long prompt arrives; per
``--prefill-chunk`` setting, the running streams' largest gap between token groups while the long
prompt is prefilled, and the long request's time to first token. A chunk as long as the prompt is
the unchunked case. Writes one JSON (environment, settings, per chunk setting, checks).

    python benchmarks/serve_chunked.py --out benchmarks/results/serve_chunked_cpu.json            # CPU, ~2 min
    python benchmarks/serve_chunked.py --streams 16 --prompt-tokens 4096 --context 8192 --out $OUT/chunked.json

Uses the Python API (``flashspec.serving.Service``), no HTTP: the gaps are the scheduler's.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_bench  # noqa: E402 - benchmarks/ is on sys.path


def consume(stream, arrivals: list[float]) -> None:
    for delta in stream:
        if delta.token_ids:
            arrivals.append(time.perf_counter())


def one_setting(eng, args, chunk: int, long_ids: list[int], short_ids: list[list[int]]) -> dict:
    """The running streams and the long prompt under one ``prefill_chunk``."""
    from flashspec.serving import Service, check_params

    svc = Service(eng, max_batch=args.streams + 1, context=args.context, speculation=False, prefill_chunk=chunk,
                  max_queue=args.streams + 1)  # every request may wait at once
    svc.prepare([0.0])
    greedy = check_params(args.max_tokens, 0.0, 1.0, 0, 0, None)
    with svc:
        streams = [svc.submit(ids, greedy) for ids in short_ids]
        arrivals = [[] for _ in streams]
        threads = [threading.Thread(target=consume, args=(s, a)) for s, a in zip(streams, arrivals)]
        for t in threads:
            t.start()
        while any(len(a) < 3 and t.is_alive() for a, t in zip(arrivals, threads)):  # every stream runs (or ended)
            time.sleep(0.005)
        sent = time.perf_counter()
        long = svc.submit(long_ids, check_params(4, 0.0, 1.0, 0, 0, None))
        first = None
        for delta in long:
            first = first or (time.perf_counter() if delta.token_ids else None)
        for t in threads:
            t.join()
    gaps = [b - a for arr in arrivals for a, b in zip(arr, arr[1:]) if b > sent and (first is None or a < first)]
    return {"prefill_chunk": chunk, "long_prompt_ttft_s": None if first is None else first - sent,
            "largest_gap_during_prefill_s": max(gaps, default=None),
            "stream_groups_during_prefill": sum(sent < x < (first or x + 1) for arr in arrivals for x in arr),
            "tokens": [s.token_ids for s in streams], "long_tokens": long.token_ids}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gguf", help="the embedded model's GGUF (default: the installed one)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--streams", type=int, default=2, help="requests streaming when the long prompt arrives")
    p.add_argument("--max-tokens", type=int, default=48, help="new tokens of each running stream")
    p.add_argument("--prompt-tokens", type=int, default=1024, help="the long prompt's length")
    p.add_argument("--chunks", default="128,512", help="prefill_chunk settings (the prompt's length is added: unchunked)")
    p.add_argument("--context", type=int, default=2048)
    args = p.parse_args(argv)
    doc = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["runs"], indent=1), json.dumps(doc["checks"]))
    return 0


def measure(args, eng=None) -> dict:
    """Every chunk setting of ``args`` (main's options) on the embedded model (or the engine ``eng``): the
    JSON document."""
    if eng is None:
        from flashspec_torch.engine import Engine

        eng = Engine(args.gguf, ("ngram",), policy="fixed", device=args.device)
    texts = serve_bench.prompts()
    short_ids = [list(eng.tokenizer(texts[i % len(texts)])["input_ids"]) for i in range(args.streams)]
    long_ids = []
    while len(long_ids) < args.prompt_tokens:
        long_ids += list(eng.tokenizer(" ".join(texts))["input_ids"])
    long_ids = long_ids[: args.prompt_tokens]
    chunks = [int(c) for c in args.chunks.split(",")] + [args.prompt_tokens]
    runs = [one_setting(eng, args, c, long_ids, short_ids) for c in chunks]
    same = all(r["tokens"] == runs[-1]["tokens"] and r["long_tokens"] == runs[-1]["long_tokens"] for r in runs)
    return {"what": __doc__.split("\n\n")[0], "environment": serve_bench.environment(),
            "settings": {k: str(v) for k, v in vars(args).items()}, "model": eng.target.name,
            "runs": [{k: v for k, v in r.items() if k not in ("tokens", "long_tokens")} for r in runs],
            "checks": {"tokens equal under every chunk setting": same,
                       "the running streams emit during a chunked prefill": all(
                           r["stream_groups_during_prefill"] > 0 for r in runs[:-1])}}


if __name__ == "__main__":
    sys.exit(main())
