"""The issue #35 GPU run in one command, each part under its own time limit so a slow part cannot eat the
other: ``adaptive_bench.py`` (adaptive vs every fixed (draft, G) vs plain decoding at batch 1, 4, 16, 64, 256
for Llama-3-8B's and SmolLM2-135M's shapes) and ``adaptive_mixed.py`` (the mixed stream, SmolLM2-135M's shape in
fp32 at batch 64: in bf16 the replay drafts lose their rows at the first near-tie), then ``admit_sync.py``
(whether the served slot path makes the host wait for the device; its JSON goes into summary.json). First, with
``--host-s``, ``adaptive_host.py --critical-only``: the loops' exposed host work per step on this machine's CPU
against a fake 1 ms device step (no GPU work). Writes adaptive_host.json, adaptive_gpu.json, adaptive_mixed.json,
their logs and summary.json (at most 6 files; a part whose limit is 0 is skipped) under ``--out``.

    export PYTHONPATH=$PWD/shared:$PWD:$PWD/benchmarks TRITON_INTERPRET=0
    timeout 150 python benchmarks/adaptive_gpu.py --out $OUT/ad --models smollm2-135m,llama3-8b --bench-s 125 \
        --mixed-s 0 --sync-s 0 --host-s 20
    ... --models embedded,llama3-8b --gguf /tmp/fs/model.gguf    # the embedded model's real weights, no package

Then, here, ``benchmarks/adaptive_replay.py --run <adaptive_gpu.json>`` replays the adaptive runs' decisions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def part(name: str, args: list[str], out: Path, limit: float) -> dict:
    """Run one benchmark script under ``limit`` seconds; its stdout and stderr go to ``out``/name.log."""
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        try:
            rc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args], stdout=log, stderr=subprocess.STDOUT,
                                timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return dict(rc=rc, seconds=round(time.perf_counter() - start, 1), limit_s=limit)


def sync_part(device: str, limit: float) -> dict:
    """``admit_sync.py`` under ``limit`` seconds: its JSON (the last stdout line), or why there is none."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(HERE / "admit_sync.py"), "--device", device], capture_output=True,
                              text=True, timeout=limit)
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if done.returncode == 0 and lines else {"rc": done.returncode,
                                                                               "stderr_tail": done.stderr[-1500:]}
    except subprocess.TimeoutExpired:
        result = {"rc": "timeout"}
    return dict(result, seconds=round(time.perf_counter() - start, 1), limit_s=limit)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--bench-s", type=float, default=165.0, help="the batch sweep's limit")
    ap.add_argument("--mixed-s", type=float, default=60.0, help="the mixed stream's limit")
    ap.add_argument("--models", default="llama3-8b,smollm2-135m")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--mixed-model", default="smollm2-135m")
    ap.add_argument("--mixed-batch", type=int, default=64)
    ap.add_argument("--sync-s", type=float, default=30.0, help="admit_sync.py's limit (0: skip it)")
    ap.add_argument("--host-s", type=float, default=0.0, help="adaptive_host.py --critical-only's limit (0: skip it)")
    ap.add_argument("--gguf", default=None, help="--models embedded: its GGUF file where its package is not installed")
    ap.add_argument("--drafts", default=None, help="--models embedded: its drafts, engine draft names (default: the "
                    "engine's, head,ngram; e.g. head:DIR,ngram for a head just trained)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"command": "python " + " ".join(sys.argv)}
    if args.host_s > 0:
        summary["adaptive_host"] = part("adaptive_host", [
            "--critical-only", "--batches", "1,4,16,64", "--tokens", "48", "--repeats", "5",
            "--out", str(args.out / "adaptive_host.json")], args.out, args.host_s)
    summary["adaptive_bench"] = part("adaptive_bench", [
        "--device", args.device, "--models", args.models, "--batches", args.batches, "--tokens", str(args.tokens),
        "--budget-s", str(args.bench_s - 35), "--out", str(args.out / "adaptive_gpu.json"),
        *(["--gguf", args.gguf] if args.gguf else []), *(["--drafts", args.drafts] if args.drafts else [])],
        args.out, args.bench_s)
    if args.mixed_s > 0:
        summary["adaptive_mixed"] = part("adaptive_mixed", [
            "--device", args.device, "--model", args.mixed_model, "--batch", str(args.mixed_batch), "--tokens", "96",
            "--budget-s", str(args.mixed_s - 25), "--out", str(args.out / "adaptive_mixed.json")], args.out, args.mixed_s)
    if args.sync_s > 0:
        summary["admit_sync"] = sync_part(args.device, args.sync_s)
    for key, file in (("adaptive_bench", "adaptive_gpu.json"), ("adaptive_mixed", "adaptive_mixed.json")):
        path = args.out / file
        if key in summary and path.exists():
            doc = json.loads(path.read_text())
            summary[key].update({k: doc.get(k) for k in ("complete", "speed_pass", "all_pass", "checks", "skipped",
                                                         "stopped") if k in doc})
    host = args.out / "adaptive_host.json"
    if "adaptive_host" in summary and host.exists():
        summary["adaptive_host"]["critical_path"] = [
            {"batch": r["batch"], "best_fixed": r["best_fixed"],
             **{k: r[k]["wall_ms"] for k in r if isinstance(r[k], dict)},
             **{k: r[k] for k in r if k.endswith("_over_best_fixed")}} for r in json.loads(host.read_text())["critical_path"]]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
