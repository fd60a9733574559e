"""Resident memory over many consecutive ``generate`` calls on one engine (a leak check).

Runs ``--calls`` short requests (a few tokens each, speculative and plain in turn, prompts and
seeds varying) on the embedded SmolLM2-135M-Instruct (``--random``: random weights of its shape and
a byte tokenizer, for a machine without the model) and records the resident set size (RSS, from
/proc/self/statm) after the first call and every ``--every`` calls; on CUDA also
``torch.cuda.memory_allocated`` and ``memory_reserved``. Prints a table and writes
``memory_soak[_cuda].json`` under ``--out``. Asserts nothing about memory: the growth is reported.

First it checks the fault path on the device (``fault_check``): a tiny random model whose embedding
of one generated token is NaN must raise NonFiniteLogitsError with the clean run's tokens up to that
token, the next clean request must match the clean run, and (on CUDA) a step with the NaN flags
must make no host synchronisation.

    python benchmarks/memory_soak.py                     # 1,000 calls on the CPU
    python benchmarks/memory_soak.py --dry-run           # 30 calls, every 10
    python benchmarks/memory_soak.py --random --out $OUT # on the GPU machine (no embedded model there)
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


class ByteTokenizer:
    """What Engine uses of a tokenizer, for random-weight models: one id per UTF-8 byte (+ 4)."""

    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [4 + b for b in text.encode()]}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) -> str:
        return bytes(i - 4 for i in ids if 4 <= i < 260).decode(errors="replace")


def random_target(device, dtype, small: bool):
    """Random weights: SmolLM2-135M's shape, or a tiny one (untied embeddings: poisoning one input
    embedding leaves that token's logit finite)."""
    from flashspec_torch.model import Llama, LlamaConfig
    from flashspec_torch.weights import LoadedModel

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                 head_dim=16) if small else dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                                 num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                                                 rope_theta=100000.0)
    torch.manual_seed(0)
    m = Llama(LlamaConfig(**shape, max_position_embeddings=2048))
    for p in m.parameters():
        p.data.normal_(0, 0.4 if small else 0.02)
    return LoadedModel(m.to(device=device, dtype=dtype).eval().requires_grad_(False), ByteTokenizer(), "random")


def fault_check(device) -> dict:
    """NaN logits on the device: reported with the tokens before, engine usable after, no sync."""
    import copy

    from flashspec.config import SamplingConfig
    from flashspec.faults import NonFiniteLogitsError
    from flashspec_torch.engine import Engine

    clean = random_target(device, torch.float32, small=True)
    kw = dict(temperature=0.0, max_new_tokens=16, chat=False)
    eng = Engine(clean, ("ngram",), policy="fixed", device=str(device))
    prompt, other = "abcab", "zz"
    ref = eng.generate(prompt, speculation=False, **kw)["tokens"]
    ids = clean.tokenizer(prompt)["input_ids"]
    k = next(i for i in range(3, len(ref)) if ref[i] not in ids and ref[i] not in ref[:i])
    bad = copy.deepcopy(clean)
    with torch.no_grad():
        bad.model.embed.weight[ref[k]] = float("nan")
    bad_eng = Engine(bad, ("ngram",), policy="fixed", device=str(device))
    out = {}
    for spec in (False, True):
        try:
            bad_eng.generate(prompt, speculation=spec, **kw)
            got = None
        except NonFiniteLogitsError as e:
            got = e.result["tokens"]
        out["spec" if spec else "plain"] = {"raised": got is not None, "tokens_kept_ok": got == ref[: k + 1]}
    want_other = eng.generate(other, speculation=True, **kw)["tokens"]
    out["clean_request_after_fault_ok"] = want_other == bad_eng.generate(other, speculation=True, **kw)["tokens"]
    if device.type == "cuda":  # the flags are computed and copied without a host sync
        with torch.inference_mode():  # as in Engine.generate, whose buffers are inference tensors
            out.update(fault_syncs(bad_eng.backend, ids))
    out["ok"] = all(v["raised"] and v["tokens_kept_ok"] for v in (out["plain"], out["spec"])) and \
        out["clean_request_after_fault_ok"] and out.get("host_syncs_per_spec_step", 0) == 0 and \
        out.get("host_syncs_per_plain_step", 0) == 0
    print("fault check:", json.dumps(out), flush=True)
    return out


def fault_syncs(b, ids) -> dict:
    """Host synchronisations of one graphed speculative and one plain step (after capture)."""
    from engine_gpu import count_syncs  # benchmarks/ is on sys.path for scripts

    from flashspec.config import SamplingConfig

    greedy = SamplingConfig(0.0)
    out = {}
    b.prefill([ids], 16)
    b.step(0, 4, greedy, 0, 0)  # capture first
    b.prefill([ids], 16)
    out["host_syncs_per_spec_step"] = count_syncs(lambda: b.step(0, 4, greedy, 0, 0))
    b.prefill([ids], 16)
    b.decode_one(greedy, 0, 0)
    b.prefill([ids], 16)
    out["host_syncs_per_plain_step"] = count_syncs(lambda: b.decode_one(greedy, 0, 0))
    return out


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
    ap.add_argument("--random", action="store_true", help="random SmolLM2-135M-shaped weights, byte tokenizer")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="skip Engine.warm_up before the first call (graphs are then captured as kinds first occur)")
    args = ap.parse_args()
    if args.dry_run:
        args.calls, args.every = 30, 10
    torch.set_num_threads(args.threads)
    from flashspec_torch.engine import Engine

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checked = fault_check(device)
    start = time.perf_counter()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = random_target(device, dtype, small=False) if args.random else None
    engine = Engine(target, ("ngram",), policy="thompson-token", device=str(device))
    # The soak's settings: gamma 3, greedy and T = 0.7, speculative and plain (see soak()).
    captured = engine.warm_up(gamma=3, temperatures=(0.0, 0.7)) if args.warm_up else None
    rows = soak(engine, args.calls, args.every, args.max_new_tokens)
    wall = time.perf_counter() - start
    keys = ["rss_mib"] + (["cuda_allocated_mib", "cuda_reserved_mib"] if engine.device.type == "cuda" else [])
    doc = {
        "what": "memory after consecutive short generate calls on one Engine (embedded SmolLM2-135M-Instruct)",
        "command": "python benchmarks/memory_soak.py" + (" --dry-run" if args.dry_run else f" --calls {args.calls}")
        + (" --random" if args.random else "") + ("" if args.warm_up else " --no-warm-up"),
        "warm_up_graphs": captured,
        "fault_check": checked, "random_weights": args.random,
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
    name = "memory_soak" + ("_random" if args.random else "") + ("" if args.warm_up else "_lazy") + \
        ("_dry_run" if args.dry_run else "") + ("_cuda" if engine.device.type == "cuda" else "")
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"\n{args.calls} calls in {wall:.0f} s on {engine.device}")
    print(f"{'memory':<22}{'after call 1':>14}{'at the end':>12}{'growth':>10}{'max':>10}")
    for k, g in doc["growth"].items():
        print(f"{k:<22}{g['after_first_call_mib']:>14.1f}{g['at_end_mib']:>12.1f}{g['growth_mib']:>10.1f}{g['max_mib']:>10.1f}")
    print(f"fault check: {'ok' if checked['ok'] else 'FAILED'}")
    print(path)


if __name__ == "__main__":
    main()
