"""Each shape of a GPU benchmark in its own child process with a hard share of the time budget
(used by ``jax_vs_torch_gpu.py``; no ``main``, no GPU work here).

``run_children`` starts one child per shape, in the order given, and kills a child (its whole
process group) when its share is up: the share is what is left of the budget split over the
shapes not yet run by their weights, so time a shape leaves unused goes to the ones after it. A
child writes its JSON after every part (``write_json``: atomically, so a kill never leaves half a
file); a killed child's last file is kept. A killed child also frees its GPU memory. ``guarded``
bounds one part inside a process by a deadline (used by ``jax_vs_torch_gpu.py`` and ``jax_small_gpu.py``).
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
