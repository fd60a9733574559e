"""The server's adaptive stream on a fake asynchronous device (issue #35): the slot scheduler
(``flashspec.scheduler``, no HTTP, on this thread) serving requests on ``paced_device.PacedSlots``, whose steps
take ``--device-ms`` after launch (1 ms plain + 0.025 ms per drafted token: SmolLM2-135M's shape on an H100), so
the host work per step that the device waits for shows as on a GPU. Per slot count: ``--requests`` greedy
requests of ``--tokens`` tokens all queued at once (each accepting 0.5-0.9 of the n-gram's tokens, by seed),
served by plain decoding, each fixed n-gram length, and the adaptive scheduler of ``--before`` (its
``flashspec/scheduler.py``, with what its ``Service.prepare`` called) and of this checkout, with held choices and
without (``after_no_hold``: ``flashspec.throughput.MAX_HOLD`` = 1). ``--prepared 1``: the device reports its step
kinds made ready (captured CUDA graphs), 0: nothing made ready (the CPU).

    PYTHONPATH=$PWD/shared:$PWD python benchmarks/serve_paced.py --slots 1,4,16 --requests 32 --tokens 48 \
        --repeats 5 --before afe54c1 --out benchmarks/results/serve_paced_cpu.json

Per configuration: wall and device ms per step, exposed ms (wall less device: host work the device waited for),
output tokens/s and per step (the choices' worth, apart from the host's pace), the policy's choices per step and
its host ms per step (``choose_ms``, ``observe_ms``); medians over ``--repeats`` runs after a warm-up run (the policy kept
across runs, as a server's). ``*_over_best_fixed``: tokens/s over the best fixed configuration's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT), str(ROOT / "benchmarks")]  # this checkout's flashspec

from flashspec import adaptive_loop, scheduler, throughput  # noqa: E402
from flashspec.adaptive import AdaptivePolicy, engine_lengths, make_arms  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402

from adaptive_bench import Fixed  # noqa: E402
from adaptive_host import Clocks, cpu_name, load_module  # noqa: E402
from paced_device import PacedSlots  # noqa: E402

GREEDY = SamplingConfig(0.0)
GAMMA = 4
LENGTHS = engine_lengths(GAMMA)


def serve(mod, device: PacedSlots, policy, gamma: int, slots: int, requests: int, tokens: int) -> dict:
    """One run: ``requests`` queued at once, served by scheduler module ``mod`` to the end (policy None: plain
    decoding; ``Fixed(0)``: the n-gram at ``gamma``). Wall and device ms per step, tokens/s, choices per step."""
    adaptive = isinstance(policy, AdaptivePolicy)
    if adaptive:
        adaptive_loop.use_free_scoring(device, policy)
    sched = mod.Scheduler(device, policy, slots=slots, context=tokens + 8, gamma=gamma, speculation=policy is not None,
                          max_queue=requests)
    prepare(sched, device, adaptive)
    choices, clocks = [0], Clocks()
    if adaptive:  # the policy's host work: its choices (counted) and observes, timed
        choose = clocks.wrap("choose", policy.choose)
        policy.choose = lambda *a, **kw: choices.__setitem__(0, choices[0] + 1) or choose(*a, **kw)
        policy.observe = clocks.wrap("observe", policy.observe)
    for i in range(requests):
        sched.submit(mod.Submission((1, 2, 3), tokens, GREEDY, seed=i), lambda t, new: None)
    t0 = time.perf_counter()
    try:
        while sched.busy() or sched.pending:
            sched.iterate()
    finally:
        if adaptive:
            del policy.choose, policy.observe  # the instance attributes: the methods show again
    wall = time.perf_counter() - t0
    out, steps = int(device.emitted.sum()), device.launched
    return dict(wall_ms=wall * 1e3 / steps, device_ms=device.busy * 1e3 / steps,
                exposed_ms=(wall - device.busy) * 1e3 / steps, steps=steps, tokens=out, tokens_per_s=out / wall,
                tokens_per_step=out / steps, choices_per_step=choices[0] / steps, choose_ms=clocks.s["choose"] * 1e3 / steps, observe_ms=clocks.s["observe"] * 1e3 / steps,
                warm=bool(getattr(policy, "warm", False)))


def prepare(sched, device: PacedSlots, adaptive: bool) -> None:
    """What ``Service.prepare`` calls for greedy requests: this checkout's ``prepare_sampling`` (every arm, the policy
    warm where any step kind was made ready), or a scheduler without it (``--before``) the backend's ``prepare`` at
    each length."""
    if hasattr(sched, "prepare_sampling"):
        sched.prepare_sampling(GREEDY)
    else:
        for g in (LENGTHS if adaptive else [None]):
            device.prepare(g, GREEDY)


def one_slot_count(slots: int, args, mods: dict) -> dict:
    """Every configuration at ``slots`` slots, in turn, ``args.repeats`` times after a warm-up; medians."""
    accept = np.linspace(0.5, 0.9, 5)
    configs = {"plain": None, **{f"ngram:G{g}": g for g in LENGTHS}}
    policies = {k: AdaptivePolicy(make_arms(1, LENGTHS), 1, rng=0) for k in mods}
    runs: dict[str, list] = {k: [] for k in [*configs, *mods]}
    for _ in range(args.repeats + 1):  # the first: warm-up (the policies measure every arm)
        for name, g in configs.items():
            device = PacedSlots(accept, slots, args.step_ms, prepared=args.prepared)
            runs[name].append(serve(scheduler, device, None if g is None else Fixed(0), g or GAMMA, slots, args.requests,
                                    args.tokens))
        for k, (mod, hold) in mods.items():
            device = PacedSlots(accept, slots, args.step_ms, prepared=args.prepared)
            saved = throughput.MAX_HOLD
            throughput.MAX_HOLD = hold or saved
            try:
                runs[k].append(serve(mod, device, policies[k], GAMMA, slots, args.requests, args.tokens))
            finally:
                throughput.MAX_HOLD = saved
    row = dict(slots=slots, **{k: {m: float(np.median([r[m] for r in v[1:]])) for m in v[1]} for k, v in runs.items()})
    best = max(configs, key=lambda k: row[k]["tokens_per_s"])
    row["best_fixed"] = best
    for k in mods:
        row[f"{k}_over_best_fixed"] = round(row[k]["tokens_per_s"] / row[best]["tokens_per_s"], 4)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", default="1,4,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device-ms", default="1.0,0.025", help="plain step ms, ms per drafted token")
    ap.add_argument("--prepared", type=int, default=1, help="step kinds each prepare call reports (0: none, the CPU)")
    ap.add_argument("--before", default=None, help="a git revision whose flashspec/scheduler.py runs beside this one")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.step_ms = tuple(float(x) for x in args.device_ms.split(","))
    mods = {**({"before": (load_module(args.before, "scheduler"), None)} if args.before else {}),
            "after": (scheduler, None), "after_no_hold": (scheduler, 1)}
    rows = []
    for slots in (int(s) for s in args.slots.split(",")):
        rows.append(one_slot_count(slots, args, mods))
        r = rows[-1]
        print(f"slots {slots}: wall ms/step (exposed), choices/step, choose ms/step: " + ", ".join(
            f"{k} {r[k]['wall_ms']:.3f} ({r[k]['exposed_ms']:.3f}) {r[k]['choices_per_step']:.2f} "
            f"{r[k]['choose_ms']:.3f}"
            for k in ["plain", *(f"ngram:G{g}" for g in LENGTHS), *mods])
            + "; tokens/s over the best fixed: " + ", ".join(f"{k} {r[f'{k}_over_best_fixed']:.3f}" for k in mods),
            flush=True)
    doc = dict(benchmark="serve_paced", issue=35, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               command=" ".join(sys.argv), hardware=dict(cpu=cpu_name(), cores=os.cpu_count(), load_average=os.getloadavg()),
               settings={k: v for k, v in vars(args).items()}, units="ms per scheduler iteration (one step each)",
               rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
