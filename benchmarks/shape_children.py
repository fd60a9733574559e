"""Each shape of a GPU benchmark in its own child process with a hard share of the time budget
(used by ``jax_vs_torch_gpu.py``, ``jax_small_sweep.py`` and ``jax_xla_flags_gpu.py``; no ``main``, no GPU
work here).

``run_children`` starts one child per shape, in the order given, and kills a child (its whole
process group) when its share is up: the share is what is left of the budget split over the
shapes not yet run by their weights, so time a shape leaves unused goes to the ones after it. A
child writes its JSON after every part (``write_json``: atomically, so a kill never leaves half a
file); a killed child's last file is kept. A killed child also frees its GPU memory. ``guarded``
bounds one part inside a process by a deadline. ``flagged_command``: a child under its own
``XLA_FLAGS``, its output also in a log file (``log_tail`` reads it back when the child failed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

RESULT = "result.json"  # what a child writes into the directory it is given
CHILD_SOFT = 0.85  # a child starts no part past this fraction of its share (it is killed at the share)
AUTOTUNE_CACHE = "--xla_gpu_per_fusion_autotune_cache_dir={dir}"  # one GEMM autotuning cache for every child
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16)  # every script's --dry-run model (the CPU)


def write_json(path: Path, data: dict) -> None:
    """``data`` to ``path`` through a temporary file and a rename (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def guarded(fn: Callable[[], dict], deadline: float, wall_key: str = "part_wall_s") -> dict:
    """fn() unless the budget is spent; an exception is recorded, not raised (one part must not lose the
    others); its wall time under ``wall_key``."""
    if time.perf_counter() > deadline:
        return dict(skipped="--budget-s spent")
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:
        out = dict(error=f"{type(e).__name__}: {e}"[:1000])
    out[wall_key] = time.perf_counter() - t0
    return out


def share_of(weights: list[float], left_s: float) -> float:
    """The first shape's share of ``left_s`` seconds: its weight over the weights of the shapes left."""
    return left_s * weights[0] / sum(weights)


def run_children(names: list[str], weights: dict[str, float], budget_s: float,
                 command: Callable[[str, float, Path], list[str]], workdir: Path) -> list[dict]:
    """Per name in order: ``command(name, share_s, outdir)`` run as a child process, killed after
    ``share_s``; returns per name dict(shape, share_s, wall_s, rc, killed, data: the child's
    ``outdir/RESULT`` or None if it wrote none). Names whose share is under a second are not run."""
    start, out = time.perf_counter(), []
    for i, name in enumerate(names):
        share = share_of([weights.get(n, 1.0) for n in names[i:]], budget_s - (time.perf_counter() - start))
        outdir = workdir / name
        outdir.mkdir(parents=True, exist_ok=True)
        row = dict(shape=name, share_s=round(share, 1), wall_s=0.0, rc=None, killed=False, data=None)
        out.append(row)
        if share < 1.0:
            row["rc"] = "not started: the budget was spent"
            continue
        t0 = time.perf_counter()
        child = subprocess.Popen(command(name, share, outdir), start_new_session=True)
        try:
            row["rc"] = child.wait(timeout=share)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            row["rc"], row["killed"] = child.wait(), True
        row["wall_s"] = time.perf_counter() - t0
        path = outdir / RESULT
        if path.exists():
            row["data"] = json.loads(path.read_text())
    return out


def flagged_command(flags: list[str], log: Path, argv: list[str]) -> list[str]:
    """``argv`` under ``XLA_FLAGS`` = the environment's, then ``flags`` (empty ones left out; XLA reads
    them once, when the backend starts), its output also into ``log``."""
    xla = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), *flags) if f)
    return ["bash", "-c", 'set -o pipefail; "$@" 2>&1 | tee "$0"', str(log), "env", f"XLA_FLAGS={xla}", *argv]


def log_tail(row: dict, log: Path, chars: int) -> str | None:
    """The last ``chars`` characters of a failed child's log (``run_children``'s row), else None."""
    return log.read_text(errors="replace")[-chars:] if row["rc"] != 0 and log.is_file() else None
