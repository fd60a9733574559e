"""A served mixed stream on the CPU (issue #35): ``flashspec serve`` on the embedded model (real weights)
through its HTTP API on 127.0.0.1, code-editing requests (a function, then the same function again: long
repeats), chat requests (the chat template) and prose to continue, interleaved request by request, at
concurrency 1 and 4; plain decoding, each fixed draft (n-gram, the shipped draft head) and the adaptive
scheduler over both drafts (``--policy adaptive``, the server's default). Greedy, so every configuration's
text should equal plain decoding's (``texts_equal_plain``). Every configuration's server runs at once and
each level runs in ``--rounds`` rounds visiting the configurations in turn (a change of the shared
machine's load falls on all of them). Reports output tokens/s per configuration and level, per domain the
tokens per second of request time, the steps each arm ran (/metrics), and the load average; one JSON.

    python benchmarks/serve_adaptive_cpu.py --out benchmarks/results/serve_adaptive_cpu.json

Every request and level is bounded in time, the whole run by --budget-s; the servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_bench  # noqa: E402 - benchmarks/ is on sys.path

CONFIGS = {  # name -> flashspec serve options
    "plain": "--no-speculation",
    "ngram": "--policy fixed --draft ngram",
    "head": "--policy fixed --draft head",
    "adaptive": "--policy adaptive --draft ngram --draft head",
}


def requests_of(count: int) -> list[dict]:
    """``count`` requests cycling code-editing, chat and prose: {domain, endpoint, body}."""
    from drafts_common import chat_prompts
    from generate_cpu import code_prompts, prose_prompts

    k = -(-count // 3)
    code = [c.split("\n")[:14] for c in code_prompts(k)]
    code = ["\n".join(lines) + "\n\n# The same code again, unchanged:\n" + lines[0] + "\n" for lines in code]
    chat = [[{"role": "user", "content": c}] for c in chat_prompts(k)]
    prose = [p[:400] for p in prose_prompts(k)]
    out = []
    for i in range(count):
        domain, j = ("code", "chat", "prose")[i % 3], i // 3
        if domain == "chat":
            out.append({"domain": domain, "endpoint": "/v1/chat/completions", "body": {"messages": chat[j]}})
        else:
            out.append({"domain": domain, "endpoint": "/v1/completions",
                        "body": {"prompt": (code if domain == "code" else prose)[j]}})
    return out


async def one(client, url: str, model: str, req: dict, max_tokens: int, seed: int) -> dict:
    body = {**req["body"], "model": model, "max_tokens": max_tokens, "temperature": 0.0, "seed": seed}
    start = time.perf_counter()
    try:
        r = await client.post(url + req["endpoint"], json=body)
        r.raise_for_status()
        doc = r.json()
    except Exception as e:  # noqa: BLE001 - reported per request
        return {"domain": req["domain"], "error": f"{type(e).__name__}: {e}"}
    choice = doc["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return {"domain": req["domain"], "tokens": doc["usage"]["completion_tokens"], "seconds": time.perf_counter() - start,
            "text": text}


async def level(url: str, model: str, reqs: list[dict], concurrency: int, max_tokens: int, timeout: float) -> dict:
    queue, results = list(enumerate(reqs)), [None] * len(reqs)
    async with serve_bench.load_client(timeout, concurrency) as client:
        start = time.perf_counter()

        async def worker():
            while queue:
                i, req = queue.pop(0)
                results[i] = await one(client, url, model, req, max_tokens, i)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout)
        wall = time.perf_counter() - start
    ok = [r for r in results if r and "error" not in r]
    domains = {}
    for d in ("code", "chat", "prose"):
        mine = [r for r in ok if r["domain"] == d]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        domains[d] = {"requests": len(mine), "tokens": tokens, "request_seconds": round(seconds, 2),
                      "tokens_per_request_second": round(tokens / seconds, 2) if seconds else None}
    return {"concurrency": concurrency, "requests": len(reqs), "ok": len(ok), "wall_s": round(wall, 2),
            "output_tokens": sum(r["tokens"] for r in ok),
            "output_tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 2), "per_domain": domains,
            "errors": sorted({r["error"] for r in results if r and "error" in r})[:3],
            "texts": [r["text"] if r and "text" in r else None for r in results]}


def start(name: str, options: str, args, deadline: float, logs: Path) -> dict:
    """A server of one configuration, ready and warmed (one untimed request): {proc, url, model} or {error}."""
    proc, url = serve_bench.spawn(f"--device cpu --max-batch {max(args.concurrency)} --context 1024 --gamma 4 "
                                  f"--warm-up 0 {options}", logs / f"{name}.log")
    try:
        model = serve_bench.wait_ready(url, proc, max(10.0, min(args.start_limit, deadline - time.monotonic())))
        return {"proc": proc, "url": url, "model": model}
    except Exception as e:  # noqa: BLE001 - recorded, the other configurations run
        serve_bench.stop(proc)
        return {"error": f"{type(e).__name__}: {e}", "log_tail": (logs / f"{name}.log").read_text()[-1500:]}


def one_level(server: dict, reqs: list[dict], c: int, args, deadline: float) -> dict:
    left = deadline - time.monotonic()
    if left < 5:
        return {"concurrency": c, "error": "skipped: the budget was spent"}
    before = serve_bench.step_counts(server["url"])
    try:
        lv = asyncio.run(level(server["url"], server["model"], reqs, c, args.max_tokens, min(args.level_limit, left)))
    except Exception as e:  # noqa: BLE001 - e.g. the level's time limit
        return {"concurrency": c, "error": f"{type(e).__name__}: {e}"}
    after = serve_bench.step_counts(server["url"])
    lv["steps_by_arm"] = {k: after[k] - before.get(k, 0.0) for k in after}
    lv["load_average_after"] = os.getloadavg()[0]
    return lv


def merge(rounds: list[dict]) -> dict:
    """The rounds of one (configuration, concurrency) as one level: tokens and seconds summed."""
    ok = [r for r in rounds if "ok" in r]
    if not ok:
        return rounds[0]
    wall, tokens = sum(r["wall_s"] for r in ok), sum(r["output_tokens"] for r in ok)
    domains = {}
    for d in ok[0]["per_domain"]:
        t, sec = sum(r["per_domain"][d]["tokens"] for r in ok), sum(r["per_domain"][d]["request_seconds"] for r in ok)
        domains[d] = {"tokens": t, "request_seconds": round(sec, 2),
                      "tokens_per_request_second": round(t / sec, 2) if sec else None}
    arms = {}
    for r in ok:
        for k, v in r["steps_by_arm"].items():
            arms[k] = arms.get(k, 0.0) + v
    return {"concurrency": ok[0]["concurrency"], "rounds": len(ok), "requests": sum(r["requests"] for r in ok),
            "ok": sum(r["ok"] for r in ok), "wall_s": round(wall, 2), "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / wall, 2), "per_round_tokens_per_s": [r["output_tokens_per_s"] for r in ok],
            "per_domain": domains, "steps_by_arm": arms, "load_average_after": [r["load_average_after"] for r in ok],
            "errors": sorted({e for r in rounds for e in r.get("errors", [r.get("error")]) if e}),
            "texts": ok[0]["texts"], "texts_stable_over_rounds": all(r["texts"] == ok[0]["texts"] for r in ok)}


def run_all(names: list[str], args, reqs: list[dict], deadline: float, logs: Path) -> dict:
    """Every configuration's server at once (idle servers cost nothing), then each level in rounds that
    visit the configurations in turn, so that a change of the machine's load falls on all of them."""
    servers = {}
    try:
        for name in names:
            servers[name] = start(name, CONFIGS[name], args, deadline, logs)
        live = {n: s for n, s in servers.items() if "error" not in s}
        for s in live.values():  # untimed: the first use of every kernel
            asyncio.run(level(s["url"], s["model"], reqs[:1], 1, 4, args.level_limit))
        rounds = {(n, c): [] for n in live for c in args.concurrency}
        for c in args.concurrency:
            for _ in range(args.rounds):
                for n, s in live.items():
                    rounds[n, c].append(one_level(s, reqs, c, args, deadline))
                    print(n, c, {k: v for k, v in rounds[n, c][-1].items() if k not in ("texts", "per_domain")},
                          flush=True)
        runs = {n: ({"options": CONFIGS[n], "levels": [merge(rounds[n, c]) for c in args.concurrency]}
                    if n in live else {"options": CONFIGS[n], **servers[n]}) for n in names}
    finally:
        for s in servers.values():
            if "proc" in s:
                serve_bench.stop(s["proc"])
    return runs


def summary(runs: dict, concurrency: list[int]) -> dict:
    """Per level: tokens/s of each configuration, adaptive / plain and adaptive / the best fixed draft (and
    per domain the same ratios of tokens per request second), and whether each text equals plain's."""
    out = {}
    for c in concurrency:
        lv = {name: next((x for x in run.get("levels", []) if x.get("concurrency") == c and "ok" in x), None)
              for name, run in runs.items()}
        if not all(lv.values()):
            out[c] = {"error": "a configuration did not run this level"}
            continue
        tps = {name: x["output_tokens_per_s"] for name, x in lv.items()}
        best = max(tps["ngram"], tps["head"])
        row = {"output_tokens_per_s": tps, "adaptive/plain": round(tps["adaptive"] / tps["plain"], 3),
               "adaptive/best_single_draft": round(tps["adaptive"] / best, 3),
               "texts_equal_plain": {name: x["texts"] == lv["plain"]["texts"] for name, x in lv.items()},
               "steps_by_arm_adaptive": lv["adaptive"].get("steps_by_arm")}
        for d in ("code", "chat", "prose"):
            rate = {name: x["per_domain"][d]["tokens_per_request_second"] for name, x in lv.items()}
            if all(rate.values()):
                row[f"{d}: adaptive/plain, adaptive/best single draft"] = (
                    round(rate["adaptive"] / rate["plain"], 3), round(rate["adaptive"] / max(rate["ngram"], rate["head"]), 3))
        out[c] = row
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("serve_adaptive_cpu.json"))
    p.add_argument("--requests", type=int, default=6, help="per level, cycling code, chat, prose")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="rounds per level, each visiting every configuration")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"some of {','.join(CONFIGS)}")
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--start-limit", type=float, default=180.0)
    p.add_argument("--level-limit", type=float, default=300.0)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    names = args.configs.split(",")
    if set(names) - set(CONFIGS):
        p.error(f"--configs {args.configs}: each must be one of {','.join(CONFIGS)}")
    start, deadline = time.monotonic(), time.monotonic() + args.budget_s
    reqs = requests_of(args.requests)
    logs = Path(tempfile.mkdtemp(prefix="serve_adaptive_cpu_"))
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(sys.argv), "environment": serve_bench.environment(),
           "settings": {k: str(v) for k, v in vars(args).items()}, "load_average_before": os.getloadavg(),
           "requests": [{"domain": r["domain"], **r["body"]} for r in reqs], "runs": {}}
    doc["runs"] = run_all(names, args, reqs, deadline, logs)
    if set(CONFIGS) <= set(names):
        doc["summary"] = summary(doc["runs"], args.concurrency)
    doc["load_average_after"], doc["wall_s"] = os.getloadavg(), round(time.monotonic() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc.get("summary"), indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
