"""Host microseconds of one ``AdaptivePolicy.choose`` and one ``observe`` (with its full-information update) at the GPU
runs' arms (plain, n-gram and replay at G = 2 and 4; the n-gram scored for free, the replay drawn) and batch sizes,
for ``--before`` (a git revision's whole ``flashspec`` package, imported beside this checkout's) and this checkout,
interleaved, on the same inputs (issue #35: on the H100 run of 2026-12-07 a choice took 0.5-1.4 ms of host time,
on the critical path where a device step takes ~1 ms).

    PYTHONPATH=$PWD/shared:$PWD python benchmarks/adaptive_choose.py --before main --batches 1,4,16,64,256 \
        --out benchmarks/results/adaptive_choose_cpu.json

Each policy first observes ``--warm-steps`` steps of every arm in turn (random acceptance, a static batch whose rows
never finish while timed), then ``choose`` and ``observe`` are timed ``--calls`` times each; medians
over ``--repeats`` rounds. ``same_choices``: both revisions chose the same arms on the timed calls.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

import flashspec.adaptive as adaptive  # noqa: E402

TOKENS = 4096  # new tokens a row: no row finishes while timed (a static batch's pricing throughout)


def import_revision(rev: str, into: Path):
    """``flashspec.adaptive`` as of git revision ``rev``: its whole package extracted as ``flashspec_before``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "shared/flashspec"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    (into / "shared" / "flashspec").rename(into / "flashspec_before")
    sys.path.insert(0, str(into))
    return importlib.import_module("flashspec_before.adaptive")


def warmed(mod, batch: int, steps: int):
    """A policy of ``mod`` at the runs' arms after ``steps`` observed steps (every arm in turn), and its input stream."""
    arms = mod.make_arms(2, (2, 4))
    p = mod.AdaptivePolicy(arms, 2, rng=0)
    p.warm, p.scoring_gamma = True, 4
    p.new_batch(batch, TOKENS)
    r = np.random.default_rng(batch)
    for i in range(steps):
        observe(p, i % len(arms), batch, r)
    return p, r


def observe(p, a: int, batch: int, r) -> None:
    """One step of arm ``a`` over every row, then the n-gram's free scoring (when the arm is not the n-gram)."""
    where = np.arange(batch)
    arm = p.arms[a]
    accepted = r.integers(0, arm.length + 1, batch)
    p.observe(a, batch, accepted, 1e-3 * (1 + 0.1 * a), where=where)
    if arm.draft != 0:
        p.observe_free(0, np.full(batch, 4), r.integers(0, 5, batch), where)


def time_calls(p, r, batch: int, calls: int) -> tuple[float, float, list[int]]:
    """(us per choose, us per observe, the arms chosen)."""
    chosen, t_choose, t_observe = [], 0.0, 0.0
    for _ in range(calls):
        t0 = time.perf_counter()
        a = p.choose(batch)
        t1 = time.perf_counter()
        observe(p, a, batch, r)
        t_observe += time.perf_counter() - t1
        t_choose += t1 - t0
        chosen.append(a)
    return t_choose / calls * 1e6, t_observe / calls * 1e6, chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="a git revision to time beside this checkout")
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--warm-steps", type=int, default=40)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mods = {**({"before": import_revision(args.before, Path(tmp))} if args.before else {}), "after": adaptive}
        rows = []
        for batch in (int(b) for b in args.batches.split(",")):
            us = {k: {"choose": [], "observe": []} for k in mods}
            same = True
            for _ in range(args.repeats):
                picks = {}
                for k, mod in mods.items():  # interleaved: the same load on both
                    p, r = warmed(mod, batch, args.warm_steps)
                    c, o, picks[k] = time_calls(p, r, batch, args.calls)
                    us[k]["choose"].append(c)
                    us[k]["observe"].append(o)
                same &= len({tuple(v) for v in picks.values()}) == 1
            row = dict(batch=batch, same_choices=same,
                       **{f"{k}_us": {part: round(float(np.median(v)), 1) for part, v in parts.items()} for k, parts in us.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = dict(benchmark="adaptive_choose", issue=35, command="python " + " ".join(sys.argv),
               date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               hardware=dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(),
                             load_average=os.getloadavg()),
               units="host microseconds per call (median over repeats of the mean over calls)", rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
