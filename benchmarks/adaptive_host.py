"""The adaptive loop's host work per step against the fixed loop's, on the CPU with a tiny random model (issue #35):
at SmolLM2-135M's shape on an H100 a GPU step takes ~1 ms and the adaptive loop's extra host work showed (docs/
adaptive.md, "Past experiments"); here the model's compute is small, so the host's parts are visible.

    PYTHONPATH=$PWD/shared:$PWD python benchmarks/adaptive_host.py --batches 1,4,16,64 --tokens 48 --repeats 7 \
        --before d6eb4da --out benchmarks/results/adaptive_host_cpu.json

Per batch, in turn: the fixed loop (n-gram at G = 2, ``speculate_steps``), and the adaptive loop (arms: plain,
n-gram at G = 2 and 4, full-information scoring on; ``speculate_adaptive``) of revision ``--before`` (its
``flashspec/adaptive.py``, and ``adaptive_loop.py`` where it has one, loaded beside this checkout's) and of this
checkout, after a warm-up run of each that measures every arm.
Each run's wall ms per step is split into host parts by wrapping the calls the loops make: ``choose`` and
``observe`` (the policy's), ``observe_free`` (the policy's full-information update), ``score_free`` (the
backend switch), ``launch`` (``StepTimer.launch``: on the CPU the step's own compute, the free scoring's included),
``read`` (``StepHandle.fetch``), and ``other`` (the rest: records, the timer). ``policy_ms`` = choose + observe +
observe_free: work a GPU run does on the host between launches. Then each policy alone replays this checkout's
last adaptive run's steps without any model (``*_policy_only_ms``; the same inputs, so the same choices:
``policy_only_same_choices``), with a cProfile of it (top functions by own time). Greedy; every adaptive run's
tokens must equal the fixed run's (``tokens_equal``). Medians over ``--repeats`` runs.

The critical path (``critical_path``, first; ``--critical-only`` runs it alone, no model): the loops on a fake
asynchronous device (``paced_device.PacedDevice``) whose steps take ``--device-ms`` (1 ms plain, + 0.025 ms per
drafted token: SmolLM2-135M's shape on an H100) after launch: each fixed arm, the adaptive loop of ``--before`` and of
this checkout, and this checkout's with one choice per step (``after_no_hold``: ``flashspec.throughput.MAX_HOLD`` = 1). A loop whose host
work per step fits in the device step runs at the device's pace; ``exposed_ms`` = wall - device ms per step is the host
work the device waited for, and ``*_over_best_fixed`` the adaptive loop's tokens/s over the best fixed arm's.

    PYTHONPATH=$PWD/shared:$PWD python benchmarks/adaptive_host.py --critical-only --batches 1,4,16,64 --tokens 48 \
        --repeats 5 --before 7f17826 --out benchmarks/results/adaptive_critical_cpu.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import types
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT), str(ROOT / "benchmarks")]  # this checkout's flashspec, whatever is installed

import flashspec.adaptive as adaptive  # noqa: E402
import flashspec.adaptive_loop as adaptive_loop  # noqa: E402
import flashspec.throughput as throughput  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, StepTimer, decode_steps, speculate_steps  # noqa: E402
from flashspec_torch.backend import TorchBackend  # noqa: E402
from flashspec_torch.drafts import LookupDraft  # noqa: E402
from flashspec_torch.model import Llama, LlamaConfig  # noqa: E402

from adaptive_bench import Fixed  # noqa: E402
from paced_device import PacedDevice, wait_until  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
GREEDY = SamplingConfig(0.0)
LENGTHS = (2, 4)
PARTS = ("choose", "observe", "observe_free", "score_free", "launch", "read")
AFTER = (adaptive, adaptive_loop)  # this checkout's (policy module, loop module)


class Clocks:
    """Host seconds per named part, summed over a run, by wrapping callables."""

    def __init__(self):
        self.s = dict.fromkeys(PARTS, 0.0)

    def wrap(self, name: str, fn):
        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.s[name] += time.perf_counter() - t0
        return timed


def model() -> Llama:
    torch.manual_seed(0)
    m = Llama(LlamaConfig(**TINY, max_position_embeddings=1024))
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m.eval().requires_grad_(False)


def prompts(batch: int, seed: int = 0) -> list[list[int]]:
    """Repetitive prompts (a short motif repeated), so the n-gram lookup finds matches."""
    r = np.random.default_rng(seed)
    return [(r.integers(0, TINY["vocab_size"], 5).tolist() * 6) for _ in range(batch)]


def load_module(rev: str, name: str) -> types.ModuleType:
    """``flashspec.<name>`` as of git revision ``rev`` of this checkout, as a module of its own
    (``flashspec.<name>_<rev>``) beside the current one."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:shared/flashspec/{name}.py"], capture_output=True,
                         text=True, check=True).stdout
    mod = types.ModuleType(f"flashspec.{name}_{rev}")
    mod.__package__, mod.__file__ = "flashspec", f"{rev}:shared/flashspec/{name}.py"
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


def load_adaptive(rev: str | None) -> tuple[types.ModuleType, types.ModuleType]:
    """(policy module, loop module) as of git revision ``rev`` of this checkout (None: the current ones)."""
    if rev is None:
        return AFTER
    ad = load_module(rev, "adaptive")
    # the loop's module by what the revision's tree has: flashspec/adaptive.py before the split, adaptive_loop.py after
    return ad, ad if hasattr(ad, "speculate_adaptive") else load_module(rev, "adaptive_loop")


def instrumented_run(lp, backend, policy, batch: int, tokens: int, runs_adaptive: bool) -> tuple[dict, list, list]:
    """(ms per step of each part and of the whole, the outputs, the records) of one run after its prefill; ``lp``:
    the loop module whose ``speculate_adaptive`` runs (``runs_adaptive``) and whose ``observe_free`` is timed."""
    clocks = Clocks()
    backend.prefill(prompts(batch), tokens)
    saved = (StepTimer.launch, lp.observe_free, backend.score_free, policy.choose, policy.observe)
    orig_launch = StepTimer.launch

    def launch(self, start):
        def fetching():
            h = start()
            h.fetch = clocks.wrap("read", h.fetch)
            return h
        t0 = time.perf_counter()
        try:
            return orig_launch(self, fetching)
        finally:
            clocks.s["launch"] += time.perf_counter() - t0

    StepTimer.launch = launch
    lp.observe_free = clocks.wrap("observe_free", lp.observe_free)
    backend.score_free = clocks.wrap("score_free", backend.score_free)
    policy.choose = clocks.wrap("choose", policy.choose)
    policy.observe = clocks.wrap("observe", policy.observe)
    records: list = []
    t0 = time.perf_counter()
    try:
        if runs_adaptive:
            lp.speculate_adaptive(backend, policy, sampling=GREEDY, spec=SpecConfig(max(LENGTHS), tokens), seed=0,
                                  rows=batch, records=records)
        else:
            speculate_steps(backend, policy, sampling=GREEDY, spec=SpecConfig(LENGTHS[0], tokens), seed=0,
                            first_offset=0, on_step=None, records=records)
    finally:
        wall = time.perf_counter() - t0
        StepTimer.launch, lp.observe_free = saved[0], saved[1]
        del backend.score_free, policy.choose, policy.observe  # the instance attributes: the methods show again
    steps = max(1, len(records))
    ms = {k: v * 1e3 / steps for k, v in clocks.s.items()}
    ms["total"] = wall * 1e3 / steps
    ms["other"] = ms["total"] - sum(ms[k] for k in PARTS)
    ms["policy"] = ms["choose"] + ms["observe"] + ms["observe_free"]
    return ms, backend.outputs(), records


def median_parts(runs: list[dict]) -> dict:
    return {k: round(float(np.median([r[k] for r in runs])), 4) for k in runs[0]}


def policy_only(mod, batch: int, tokens: int, records: list, repeats: int) -> tuple[float, list[int], str]:
    """(ms per step, its choices, a cProfile: top 12 functions by own time) of the policy of ``mod`` (policy module,
    loop module) alone
    (choose + observe + free updates) replaying ``records`` (an adaptive run's steps, their seconds and acceptance)
    on a fresh policy: the same inputs for every module, so the same choices where the modules agree."""
    from flashspec.backend import StepView

    ad, lp = mod
    choices: list[int] = []

    def replay():
        choices.clear()
        p = ad.AdaptivePolicy(ad.make_arms(1, LENGTHS), 1, rng=0)
        p.scoring_gamma = max(LENGTHS)
        p.new_batch(batch, tokens)
        for r in records:
            a = p.choose(batch)
            choices.append(a)
            acc = np.array([max(0, n) for n in r.row_accepted])
            drafted = np.array([max(0, n) for n in r.row_drafted])
            active = np.array([n >= 0 for n in r.row_accepted])
            where = np.nonzero(active)[0]
            arm = p.arms[a]
            p.observe(a, len(where), np.minimum(acc[where], arm.length), r.seconds,
                      drafted=np.full(len(where), arm.length), where=where)
            view = StepView(acc, active, ~active, np.zeros(batch, bool),
                            free_scored=[np.full(batch, max(LENGTHS))], free_accepted=[np.minimum(acc, max(LENGTHS))],
                            drafted=drafted)
            lp.observe_free(p, view, skip=arm.draft, where=where)
        return len(records)

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = replay()
        times.append((time.perf_counter() - t0) * 1e3 / max(1, n))
    prof = cProfile.Profile()
    prof.enable()
    replay()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    return round(float(np.median(times)), 4), list(choices), "\n".join(lines[:30])


def run_batch(m, batch: int, tokens: int, repeats: int, before) -> dict:
    """Fixed, adaptive (``before``'s module, then this checkout's) runs in turn, ``repeats`` times after a warm-up
    each; then the policies alone on the last adaptive run's steps."""
    backend = TorchBackend(m, [LookupDraft()], eos_ids=[])
    mods = {"before": before, "after": AFTER} if before is not None else {"after": AFTER}
    policies = {k: ad.AdaptivePolicy(ad.make_arms(1, LENGTHS), 1, rng=0) for k, (ad, _) in mods.items()}
    runs: dict[str, list] = {"fixed": [], **{k: [] for k in mods}}
    outs, records = {}, {}
    for _ in range(repeats + 1):  # the first: warm-up (the policies measure every arm)
        backend.score_free(0)
        ms, outs["fixed"], _ = instrumented_run(adaptive_loop, backend, Fixed(0), batch, tokens, runs_adaptive=False)
        runs["fixed"].append(ms)
        for k, (_, lp) in mods.items():
            lp.use_free_scoring(backend, policies[k])
            ms, outs[k], records[k] = instrumented_run(lp, backend, policies[k], batch, tokens, runs_adaptive=True)
            runs[k].append(ms)
    backend.score_free(0)
    row = dict(batch=batch, tokens=tokens, tokens_equal={k: outs[k] == outs["fixed"] for k in mods})
    for k in runs:
        row[f"{k}_ms"] = median_parts(runs[k][1:])
    for k in mods:
        rec = records[k]
        row[f"{k}_extra_ms"] = round(row[f"{k}_ms"]["total"] - row["fixed_ms"]["total"], 4)
        row[f"{k}_pulls"] = {"plain": sum(r.arm < 0 for r in rec),
                             **{f"ngram:G{g}": sum(r.arm >= 0 and r.drafted == g * r.rows for r in rec) for g in LENGTHS}}
    trace = records["after"]
    row["policy_only_steps"] = len(trace)
    choices = {}
    for k, mod in mods.items():
        row[f"{k}_policy_only_ms"], choices[k], row[f"{k}_policy_profile"] = policy_only(mod, batch, tokens, trace, repeats)
    row["policy_only_same_choices"] = len(set(map(tuple, choices.values()))) == 1
    return row


def paced_run(lp, device: PacedDevice, policy, batch: int, tokens: int, fixed: tuple[int, int] | None,
              choose_ms: float = 0.0) -> dict:
    """One run on the paced device: loop module ``lp``'s adaptive loop (``fixed`` None) or the fixed loop of (arm, G)
    (arm -1: plain decoding); wall and device ms per step, tokens, the policy's choices per step (held choices: fewer
    than 1) and its cost estimates at the end (``cost_ms``, per arm); ``choose_ms``: host ms each choice takes at
    least (a slower host's: the H100 machine's took 0.3-1.1 ms, s22)."""
    device.prefill([[0]] * batch, tokens)
    records: list = []
    choices = [0]
    t0 = time.perf_counter()
    if fixed is None:
        choose = policy.choose

        def counted(*args):
            choices[0] += 1
            start = time.perf_counter()
            arm = choose(*args)
            wait_until(start + choose_ms * 1e-3)
            return arm

        policy.choose = counted
        try:
            lp.speculate_adaptive(device, policy, sampling=GREEDY, spec=SpecConfig(max(LENGTHS), tokens), seed=0,
                                  rows=batch, records=records)
        finally:
            del policy.choose  # the instance attribute: the method shows again
    elif fixed[0] < 0:
        decode_steps(device, sampling=GREEDY, max_new_tokens=tokens, seed=0, first_offset=0, on_step=None, records=records)
    else:
        speculate_steps(device, Fixed(fixed[0]), sampling=GREEDY, spec=SpecConfig(fixed[1], tokens), seed=0,
                        first_offset=0, on_step=None, records=records)
    wall = time.perf_counter() - t0
    steps = max(1, len(records))
    out = dict(wall_ms=wall * 1e3 / steps, device_ms=device.busy * 1e3 / steps,
               exposed_ms=(wall - device.busy) * 1e3 / steps, steps=len(records), tokens=int(device.emitted.sum()),
               tokens_per_s=float(device.emitted.sum()) / wall, choices_per_step=choices[0] / steps)
    if fixed is None:
        out["plain_steps"] = sum(r.arm < 0 for r in records)
        out.update({f"cost_ms_{i}": float(c) * 1e3 for i, c in enumerate(policy.cost[policy.bucket_of(batch)])})
    return out


def critical_path(batch: int, tokens: int, repeats: int, mods: dict, step_ms: tuple[float, float],
                  accept: tuple[float, float] = (0.5, 0.9), score_ms: float = 0.0, choose_ms: float = 0.0) -> dict:
    """The loops on ``PacedDevice`` (a device step of ``step_ms``, a plain step's scoring ``score_ms`` more, rows
    accepting ``accept`` (lowest, highest: spread over the rows) of the n-gram's tokens; 0, 0: plain decoding wins;
    each choice at least ``choose_ms`` of host time): each
    fixed arm (plain, n-gram at each of ``LENGTHS``) and each version's adaptive loop (``mods``: name -> ((policy
    module, loop module), ``flashspec.throughput.MAX_HOLD`` for the run or None)), in turn, ``repeats`` times after a
    warm-up; medians. ``exposed_ms``: wall less device time per step, the host work the device waited for."""
    rates = np.linspace(*accept, batch)  # [batch]
    arms = {"plain": (-1, 0), **{f"ngram:G{g}": (0, g) for g in LENGTHS}}
    policies = {k: ad.AdaptivePolicy(ad.make_arms(1, LENGTHS), 1, rng=0) for k, ((ad, _), _) in mods.items()}
    runs: dict[str, list] = {k: [] for k in [*arms, *mods]}
    for _ in range(repeats + 1):  # the first: warm-up (the policies measure every arm)
        for name, arm in arms.items():
            device = PacedDevice(rates, step_ms, score_ms=score_ms)
            runs[name].append(paced_run(adaptive_loop, device, None, batch, tokens, arm))
        for k, ((_, lp), hold) in mods.items():
            device = PacedDevice(rates, step_ms, score_ms=score_ms)
            lp.use_free_scoring(device, policies[k])
            saved = throughput.MAX_HOLD
            throughput.MAX_HOLD = saved if hold is None else hold
            try:
                runs[k].append(paced_run(lp, device, policies[k], batch, tokens, None, choose_ms))
            finally:
                throughput.MAX_HOLD = saved
    row = dict(batch=batch, tokens=tokens, step_ms=step_ms, accept=accept, score_ms=score_ms, choose_ms=choose_ms,
               **{k: median_parts(v[1:]) for k, v in runs.items()})
    best = max(arms, key=lambda k: row[k]["tokens_per_s"])
    row["best_fixed"] = best
    for k in mods:
        row[f"{k}_over_best_fixed"] = round(row[k]["tokens_per_s"] / row[best]["tokens_per_s"], 4)
        row[f"{k}_over_plain"] = round(row[k]["tokens_per_s"] / row["plain"]["tokens_per_s"], 4)
    return row


def cpu_name() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,64")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before", default=None, 
                    help="a git revision whose flashspec/adaptive.py (and adaptive_loop.py) runs beside this one")
    ap.add_argument("--device-ms", default="1.0,0.025",
                    help="the critical-path part's paced device: plain step ms, ms per drafted token ('': skip the part)")
    ap.add_argument("--critical-only", action="store_true", help="only the critical-path part (no model runs)")
    ap.add_argument("--accept", default="0.5,0.9", help="the paced device's rows' acceptance, lowest,highest "
                    "('0,0': the draft never right, plain decoding best, as SmolLM2-135M's n-gram at batch 1)")
    ap.add_argument("--choose-ms", type=float, default=0.0, help="the least host ms of a choice on the paced device "
                    "(the H100 machine's choices took 0.3-1.1 ms, s22; this CPU's are faster)")
    ap.add_argument("--score-ms", type=float, default=0.0, help="the paced device's plain step scoring price, ms "
                    "(SmolLM2-135M on the H100, s22: +0.065 ms at batch 1, +0.07 at 4, +0.25 at 256)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    before = load_adaptive(args.before) if args.before else None
    batches = [int(b) for b in args.batches.split(",")]
    critical = []
    if args.device_ms:
        step_ms = tuple(float(x) for x in args.device_ms.split(","))
        mods = {**({"before": (before, None)} if before else {}), "after": (AFTER, None), "after_no_hold": (AFTER, 1)}
        accept = tuple(float(x) for x in args.accept.split(","))
        critical = [critical_path(b, args.tokens, args.repeats, mods, step_ms, accept, args.score_ms, args.choose_ms)
                    for b in batches]
        for r in critical:
            print(f"paced device, batch {r['batch']}: wall ms/step (exposed host ms/step) " + ", ".join(
                f"{k} {r[k]['wall_ms']:.3f} ({r[k]['exposed_ms']:.3f})" for k in ["plain", *(f"ngram:G{g}" for g in LENGTHS), *mods])
                + "; tokens/s over the best fixed arm " + ", ".join(f"{k} {r[f'{k}_over_best_fixed']:.3f}" for k in mods)
                + "; over plain " + ", ".join(f"{k} {r[f'{k}_over_plain']:.3f}" for k in mods))
    m = None if args.critical_only else model()
    rows = [] if args.critical_only else [run_batch(m, b, args.tokens, args.repeats, before) for b in batches]
    for r in rows:
        for k in ("before", "after"):
            if f"{k}_ms" in r:
                ms = r[f"{k}_ms"]
                print(f"batch {r['batch']} {k}: fixed {r['fixed_ms']['total']:.3f} ms/step, adaptive {ms['total']:.3f} "
                      f"(policy {ms['policy']:.3f}: choose {ms['choose']:.3f} observe {ms['observe']:.3f} free "
                      f"{ms['observe_free']:.3f}; launch {ms['launch']:.3f} vs {r['fixed_ms']['launch']:.3f}), policy "
                      f"alone {r[f'{k}_policy_only_ms']:.3f}, pulls {r[f'{k}_pulls']}")
    doc = dict(benchmark="adaptive_host", issue=35, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               hardware=dict(cpu=cpu_name(), cores=os.cpu_count(), load_average=os.getloadavg(), threads=args.threads),
               versions=dict(python=platform.python_version(), torch=torch.__version__, numpy=version("numpy")),
               model=TINY, args=vars(args), units="host ms per step (wall of the run / its steps, per part)",
               checks={f"batch{r['batch']}": dict(tokens_equal=all(r["tokens_equal"].values()),
                                                   policy_only_same_choices=r["policy_only_same_choices"]) for r in rows},
               critical_path_note="PacedDevice (benchmarks/paced_device.py): a fake device step of device_ms after launch; "
                                  "exposed_ms = wall - device ms per step: host work the device waited for; "
                                  "*_over_best_fixed: tokens/s over the best fixed arm's on the same device",
               critical_path=critical, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
