"""Resident memory over many consecutive ``generate`` calls on one engine (a leak check).

Runs ``--calls`` short requests (a few tokens each, speculative and plain in turn, prompts and
seeds varying) on the embedded SmolLM2-135M-Instruct and records the resident set size (RSS, from
/proc/self/statm) after the first call and every ``--every`` calls; on CUDA also
``torch.cuda.memory_allocated`` and ``memory_reserved``. Prints a table and writes
``memory_soak[_cuda].json`` under ``--out``. Asserts nothing: the growth is reported, not judged.

    python benchmarks/memory_soak.py                     # 1,000 calls on the CPU
    python benchmarks/memory_soak.py --dry-run           # 30 calls, every 10
    python benchmarks/memory_soak.py --device cuda       # on a GPU (needs the embedded model)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

PROMPTS = ["def add(a, b):", "The capital of France is", "1, 2, 3, 4,", "Once upon a time",
           "import os\nimport sys", "Roses are red,"]


def rss_mib() -> float:
    """Resident set size now, MiB (/proc/self/statm's second field is resident pages)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: fall back to the peak, which is all getrusage offers
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sample(call: int, device: torch.device) -> dict:
    gc.collect()
    row = {"call": call, "rss_mib": rss_mib()}
    if device.type == "cuda":
        torch.cuda.synchronize()
        row["cuda_allocated_mib"] = torch.cuda.memory_allocated() / 2**20
        row["cuda_reserved_mib"] = torch.cuda.memory_reserved() / 2**20
    return row


def soak(engine, calls: int, every: int, max_new_tokens: int) -> list[dict]:
    rows = []
    for i in range(1, calls + 1):
        engine.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=max_new_tokens, seed=i, chat=False,
                        temperature=0.7 if i % 3 else 0.0, speculation=i % 2 == 1, gamma=3)
        if i == 1 or i % every == 0 or i == calls:
            rows.append(sample(i, engine.device))
            print(f"call {i:>5}: " + ", ".join(f"{k} {v:.1f}" for k, v in rows[-1].items() if k != "call"), flush=True)
    return rows


def growth(rows: list[dict], key: str) -> dict:
    first, last = rows[0][key], rows[-1][key]
    return {"after_first_call_mib": first, "at_end_mib": last, "growth_mib": last - first,
            "max_mib": max(r[key] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=3)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the machine is shared)")
    ap.add_argument("--dry-run", action="store_true", help="30 calls, sampled every 10")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    if args.dry_run:
        args.calls, args.every = 30, 10
    torch.set_num_threads(args.threads)
    from flashspec_torch.engine import Engine

    start = time.perf_counter()
    engine = Engine(None, ("ngram",), policy="thompson-token", device=args.device)
    rows = soak(engine, args.calls, args.every, args.max_new_tokens)
    wall = time.perf_counter() - start
    keys = ["rss_mib"] + (["cuda_allocated_mib", "cuda_reserved_mib"] if engine.device.type == "cuda" else [])
    doc = {
        "what": "memory after consecutive short generate calls on one Engine (embedded SmolLM2-135M-Instruct)",
        "command": "python benchmarks/memory_soak.py" + (" --dry-run" if args.dry_run else f" --calls {args.calls}"),
        "calls": args.calls, "max_new_tokens": args.max_new_tokens, "device": str(engine.device),
        "dtype": str(engine.dtype), "wall_s": wall,
        "growth": {k: growth(rows, k) for k in keys},
        "samples": rows,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "cpu_count": os.cpu_count(),
                    "gpu": torch.cuda.get_device_name() if engine.device.type == "cuda" else None},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "memory_soak" + ("_dry_run" if args.dry_run else "") + ("_cuda" if engine.device.type == "cuda" else "")
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"\n{args.calls} calls in {wall:.0f} s on {engine.device}")
    print(f"{'memory':<22}{'after call 1':>14}{'at the end':>12}{'growth':>10}{'max':>10}")
    for k, g in doc["growth"].items():
        print(f"{k:<22}{g['after_first_call_mib']:>14.1f}{g['at_end_mib']:>12.1f}{g['growth_mib']:>10.1f}{g['max_mib']:>10.1f}")
    print(path)


if __name__ == "__main__":
    main()
