"""Load on an OpenAI-compatible server (ours or another) at 127.0.0.1: time to first token,
inter-token latency p50 / p99, requests/s and output tokens/s, per load level, as JSON and PNG.

    flashspec bench serve --spawn "--max-batch 16" --concurrency 1,4,16 --requests 32 --out benchmarks/results/serve_cpu
    flashspec bench serve --url http://127.0.0.1:8000 --rate 2 --requests 64        # Poisson arrivals, 2 req/s

Each level sends ``--requests`` streaming completions (``/v1/completions``, ``stream_options.include_usage``)
of real prompts of mixed length (tests/prompts.py and benchmarks/prompts/chat.txt, in turn), either with a
fixed number in flight (``--concurrency``) or arriving as a Poisson process (``--rate``). Latencies are
measured at the client: TTFT from sending to the first chunk with text, ITL between chunks with text (a
speculative step's chunk carries several tokens: ``tpot_ms``, the time per output token after the first,
is the per-token figure), output tokens from the usage the server reports. Only loopback addresses are
accepted. ``--spawn ARGS`` starts ``flashspec serve ARGS`` on a free port first and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def prompts() -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from prompts import PROMPTS  # noqa: E402 - the tests' twenty mixed prompts

    chat = [line.strip() for line in (ROOT / "benchmarks" / "prompts" / "chat.txt").read_text().splitlines()]
    chat = [line for line in chat if line]
    return [p for pair in zip(PROMPTS, chat) for p in pair] + PROMPTS[len(chat):] + chat[len(PROMPTS):]


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_request(client, url: str, model: str, prompt: str, max_tokens: int, temperature: float, seed: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    arrivals, tokens, error, done = [], None, None, False
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                done = done or line == "data: [DONE]"
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    arrivals.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 - reported per request
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    if error or not (arrivals or done):
        return {"error": error or "the stream ended without [DONE]"}
    if not arrivals:  # e.g. EOS first: a finished request without text
        return {"ttft": None, "itl": [], "tokens": tokens or 0, "e2e": end - start, "tpot": None}
    tokens = tokens if tokens is not None else len(arrivals)
    return {"ttft": arrivals[0] - start, "itl": [b - a for a, b in zip(arrivals, arrivals[1:])],
            "tokens": tokens, "e2e": end - start,
            "tpot": (end - arrivals[0]) / (tokens - 1) if tokens > 1 else None}


def load_client(timeout: float, concurrency: int):
    """An httpx AsyncClient that opens one connection per request (no keep-alive reuse).

    A pooled keep-alive connection can be reused just as the server's keep-alive timer (uvicorn: 5 s
    after the last response) closes it: the server resets the connection with the new request unread
    and the client sees ``httpx.ReadError`` with an empty message, for a request the server never
    received; the client's own expiry clock starts when its busy event loop releases the connection,
    so it cannot prevent this. A fresh connection per request can (docs/serving.md, "Clients")."""
    import httpx

    limits = httpx.Limits(max_connections=max(concurrency, 256), max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


async def run_level(url: str, model: str, texts: list[str], *, concurrency: int | None, rate: float | None,
                    requests: int, max_tokens: int, temperature: float, timeout: float) -> dict:
    order = [texts[i % len(texts)] for i in range(requests)]
    results: list[dict] = []
    async with load_client(timeout, concurrency or 0) as client:
        start = time.perf_counter()
        if concurrency:
            queue = list(enumerate(order))

            async def worker():
                while queue:
                    i, p = queue.pop(0)
                    results.append(await one_request(client, url, model, p, max_tokens, temperature, i))

            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout)
        else:
            rng, tasks = random.Random(0), []
            for i, p in enumerate(order):
                tasks.append(asyncio.create_task(one_request(client, url, model, p, max_tokens, temperature, i)))
                await asyncio.sleep(rng.expovariate(rate))
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout)
        wall = time.perf_counter() - start
    return summarize(results, wall, concurrency, rate)


def summarize(results: list[dict], wall: float, concurrency, rate) -> dict:
    ok = [r for r in results if "error" not in r]
    ms = lambda xs, q: None if percentile(xs, q) is None else percentile(xs, q) * 1e3  # noqa: E731
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    return {"concurrency": concurrency, "rate": rate, "requests": len(results), "ok": len(ok),
            "errors": sorted({r["error"] for r in results if "error" in r})[:5], "wall_s": wall,
            "requests_per_s": len(ok) / wall, "output_tokens_per_s": tokens / wall, "output_tokens": tokens,
            "ttft_ms": {"p50": ms(ttft, 50), "p99": ms(ttft, 99)}, "itl_ms": {"p50": ms(itl, 50), "p99": ms(itl, 99)},
            "tpot_ms": {"mean": statistics.fmean(tpot) * 1e3 if tpot else None, "p50": ms(tpot, 50)}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen | None, limit: float, model: str | None = None) -> str:
    """The served model's id, once /v1/models answers (within ``limit`` seconds); with ``model``
    given, once /health answers (transformers serve's /v1/models needs a Hugging Face cache)."""
    import httpx

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            r = httpx.get(url + ("/health" if model else "/v1/models"), timeout=5)
            if r.status_code == 200:
                return model or r.json()["data"][0]["id"]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer /v1/models within {limit:.0f} s")


def spawn(args: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "flashspec.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", *args.split()]
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def step_counts(url: str) -> dict:
    """The server's steps so far by arm (/metrics: ``flashspec:plain_steps``, ``flashspec:draft_pulls`` per
    draft); {} where it has no such metrics (transformers serve)."""
    import re

    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^flashspec:(plain_steps|draft_pulls)_total(?:\{[^}]*?draft="([^"]+)"[^}]*\}|\{[^}]*\})?\s+(\S+)$', line)
        if m:
            key = "plain" if m.group(1) == "plain_steps" else m.group(2)
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def bench(url: str, levels: list[dict], *, requests: int, max_tokens: int, temperature: float, timeout: float,
          model: str | None = None, proc=None) -> dict:
    """Every load level against ``url``; returns the JSON document's ``levels`` and ``model``."""
    host = urlparse(url).hostname
    if host not in LOOPBACK:
        raise ValueError(f"--url {url}: this load generator talks to loopback addresses only ({LOOPBACK})")
    model = model or wait_ready(url, proc, 600)
    texts = prompts()
    out = []
    for level in levels:
        out.append(asyncio.run(run_level(url, model, texts, requests=requests, max_tokens=max_tokens,
                                         temperature=temperature, timeout=timeout, **level)))
        print(json.dumps(out[-1]), flush=True)
    return {"model": model, "levels": out}


def environment() -> dict:
    info = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "command": " ".join(sys.argv)}
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def plot(doc: dict, png: Path) -> str | None:
    """tok/s and TTFT per level, one line per run in ``doc['runs']``; None, or why no PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, run in doc["runs"].items():
        levels = [lv for lv in run.get("levels", []) if lv["ok"]]
        x = [lv["concurrency"] or lv["rate"] for lv in levels]
        axes[0].plot(x, [lv["output_tokens_per_s"] for lv in levels], "o-", label=name)
        axes[1].plot(x, [lv["ttft_ms"]["p50"] for lv in levels], "o-", label=name)
        axes[2].plot(x, [lv["tpot_ms"]["mean"] for lv in levels], "o-", label=name)
    for ax, title in zip(axes, ("output tokens/s", "TTFT p50 (ms)", "time per output token (ms)")):
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (or req/s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="flashspec bench serve", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server at 127.0.0.1 (e.g. http://127.0.0.1:8000)")
    where.add_argument("--spawn", metavar="ARGS", help="start `flashspec serve ARGS` on a free port for the run")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", default="1,4,16", help="requests in flight, comma-separated levels")
    load.add_argument("--rate", help="Poisson arrivals instead: requests/s, comma-separated levels")
    p.add_argument("--requests", type=int, default=32, help="requests per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a level may take")
    p.add_argument("--name", default="flashspec", help="the run's name in the JSON and the plot")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/serve"), help="writes OUT.json and OUT.png")
    args = p.parse_args(argv)
    if args.rate:
        levels = [{"concurrency": None, "rate": float(r)} for r in args.rate.split(",")]
    else:
        levels = [{"concurrency": int(c), "rate": None} for c in args.concurrency.split(",")]
    proc, url = spawn(args.spawn, args.out.with_suffix(".server.log")) if args.spawn else (None, args.url)
    try:
        run = bench(url, levels, requests=args.requests, max_tokens=args.max_tokens, temperature=args.temperature,
                    timeout=args.timeout, proc=proc)
    finally:
        if proc is not None:
            stop(proc)
    doc = {"what": "flashspec bench serve: client-side latency and throughput per load level",
           "environment": environment(), "settings": vars(args) | {"out": str(args.out)},
           "runs": {args.name: run | {"server_args": args.spawn}}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    why = plot(doc, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')}" + (f" ({why})" if why else f" and {args.out.with_suffix('.png')}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
