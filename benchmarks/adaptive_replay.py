"""Replay an ``adaptive_bench.py`` GPU run's adaptive decisions on the CPU (issue #35): per model one policy kept
across batch sizes, as the benchmark keeps it, each batch a warm-up run then the timed run, over the fixed runs'
recorded per-row traces (``flashspec.policy_sim.Rows.replay``) and each arm's measured median step seconds
(the fixed runs' ``step_ms``, plain decoding's ``plain_step_ms``), first measurements trusted (``--cold``:
provisional, as on the runs before ``adaptive_bench.py`` declared its captured steps warm). Prints, per (model,
batch), the measured and the replayed arm sequences and adaptive / best fixed (or plain), measured and replayed
(``--seeds``: the mean over seeds; ``--before REV``: that revision's policy replayed too, ``before_vs_best_mean``).

    python benchmarks/adaptive_replay.py --run benchmarks/results/h100_2026-12-07_s20/adaptive/adaptive_gpu.json \
        --costs own --jitter 0.02 --seeds 4 --before d380f55 --out /tmp/adaptive_replay.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

from flashspec.adaptive import AdaptivePolicy, make_arms  # noqa: E402
from flashspec.policy_sim import DraftModel, Rows, Scenario, arm_names, run_adaptive, run_fixed, trace_bits  # noqa: E402

DRAFTS = ("ngram", "replay")


def drafts_of(row: dict) -> tuple[str, ...]:
    """The drafts a (model, batch) row ran, in ``DRAFTS`` order (the embedded model: the n-gram alone)."""
    return tuple(d for d in DRAFTS if f"{d}:G{LENGTHS[0]}" in row["fixed"])
LENGTHS = (2, 4)


def revision_policy(rev: str, into: Path):
    """``AdaptivePolicy`` as of git revision ``rev`` (``adaptive_choose.import_revision``: its whole package beside this
    checkout's), driven by this checkout's loop and simulator: where it predates ``observe``'s ``scored`` and ``chose_s``,
    every step prices its arm as it came; where it predates ``scores`` (the scoring switch of any arm), a speculative
    step always scores and a plain one on its ``plain_scores``, as its loop did."""
    from adaptive_choose import import_revision

    base = import_revision(rev, into).AdaptivePolicy
    if "chose_s" in inspect.signature(base.observe).parameters:
        return base

    class Before(base):
        def observe(self, *args, scored: bool = False, chose_s: float = 0.0, **kw):  # every step priced as it came
            return super().observe(*args, **kw)

        if not hasattr(base, "scores"):
            def scores(self, arm: int) -> bool:
                return not self.arms[arm].plain or self.plain_scores()

    return Before


def geometric_mean(values) -> float:
    return round(float(np.exp(np.mean(np.log(list(values))))), 4)


def runs_of(steps: list[int], names: list[str]) -> str:
    """An arm sequence as name*count runs ("ngram:G2*3 replay:G4*1 ...")."""
    out: list[list] = []
    for a in steps:
        if out and out[-1][0] == names[a]:
            out[-1][1] += 1
        else:
            out.append([names[a], 1])
    return " ".join(f"{n}*{k}" for n, k in out)


def scenario(row: dict, tokens: int, own: bool, host_ms: float = 0.0, jitter: float = 0.0,
             seed: int = 0) -> tuple[Scenario, list[np.ndarray]]:
    """A static scenario of one (model, batch) row: step seconds per arm, the fixed runs' traces. ``own``: the
    adaptive run's own end-of-run estimates (``adaptive_cost_ms``, where measured; a plain step's scoring included
    as ``score_cost``: what the plain estimate exceeds the fixed plain median by, four times, at most a speculative
    step's scoring: the estimate follows the run's last, longest steps), else the fixed runs' median steps; a
    speculative step's scoring costs what it cost the best fixed arm's steps (``best_fixed_scored``,
    ``Scenario.spec_score_cost``; taken off the own estimates, which hold it). Where the run recorded its choices'
    host ms (``adaptive_choose_ms``), a choice takes their median and a step lasts at least ``host_ms`` + that (the
    loop's other host work a step, then the choice: ``Scenario.host_s``), held choices as the engine's loop;
    ``jitter``: the log-normal sigma of each step's seconds (``Scenario.noise``, seeded by ``seed``)."""
    drafts = drafts_of(row)
    arms = make_arms(len(drafts), LENGTHS)
    names = arm_names(arms, drafts)
    ms = {"plain": row["plain_step_ms"], **{n: row["fixed"][n]["step_ms"] for n in names if n != "plain"}}
    score = 0.0
    scored = row.get("best_fixed_scored")
    spec = max(0.0, scored["step_ms"] - row["fixed"][scored["arm"]]["step_ms"]) if scored else 0.0
    if own:
        est = {n: v for n, v in row["adaptive_cost_ms"].items() if np.isfinite(v)}
        score = max(0.0, est.pop("plain", ms["plain"]) - ms["plain"]) * 4  # 1 step in 4 scores
        score = min(score, spec) / 1e3 if scored else score / 1e3  # at most a speculative step's scoring
        ms.update({n: max(v - spec, 0.8 * v) for n, v in est.items()})
    choose_ms = float(np.median(row["adaptive_choose_ms"])) if row.get("adaptive_choose_ms") else 0.0
    sc = Scenario(arms, tuple(ms[n] / 1e3 for n in names), tuple(DraftModel(0.5, 0.5) for _ in drafts), row["batch"],
                  tokens, noise=jitter, seed=seed, score_cost=score, spec_score_cost=spec / 1e3, choose_s=choose_ms / 1e3,
                  host_s=host_ms / 1e3 if choose_ms else 0.0)
    width = tokens + max(LENGTHS) + 2
    return sc, [trace_bits({g: row["fixed"][f"{d}:G{g}"]["trace"] for g in LENGTHS}, width) for d in drafts]


def replay_model(rows: list[dict], tokens: int, make_policy, own: bool, warm: bool, host_ms: float = 0.0,
                 jitter: float = 0.0, seed: int = 0) -> list[dict]:
    """Every batch of one model with one policy, as ``adaptive_bench.py`` runs them (``own``, ``host_ms``:
    ``scenario``'s; ``warm``: ``AdaptivePolicy.warm``, first measurements trusted)."""
    policy, out = None, []
    for row in rows:
        sc, bits = scenario(row, tokens, own, host_ms, jitter, seed)
        names = arm_names(sc.arms, drafts_of(row))
        policy = policy or make_policy(sc.arms)
        data = Rows.replay(sc, bits)
        fixed = {n: run_fixed(sc, a, data) for a, n in enumerate(names)}
        tps = {n: r.tokens_per_s for n, r in fixed.items()}
        run_adaptive(sc, policy, data, warm=warm)  # the benchmark's warm-up run
        seq: list[int] = []
        res = run_adaptive(sc, policy, data, warm=warm, chosen=seq)
        best = max(tps.values())
        out.append(dict(batch=row["batch"], measured_arms=row["adaptive_arms"], replayed_arms=runs_of(seq, names),
                        measured_vs_best=round(row["checks"]["adaptive_vs_best_fixed_or_plain"], 4),
                        replayed_vs_best=round(res.tokens_per_s / best, 4),
                        replayed_vs_plain=round(res.tokens_per_s / tps["plain"], 4),
                        replayed_steps=len(seq), best_fixed_steps=sum(fixed[max(tps, key=tps.get)].steps.values()),
                        choices=res.choices))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, required=True, help="an adaptive_bench.py JSON with the fixed runs' traces")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--costs", choices=("fixed", "own"), default="own",
                    help="step seconds: the fixed runs' medians, or the adaptive run's own estimates (``scenario``)")
    ap.add_argument("--cold", action="store_true", help="first measurements provisional (adaptive_bench.py before "
                    "it declared its captured steps warm: the H200 run of 2026-12-07)")
    ap.add_argument("--host-ms", type=float, default=0.9,
                    help="the adaptive loop's host ms a step besides its choice, where the run recorded its choices' "
                    "host ms (``scenario``): SmolLM2-135M's fixed steps on the H100 take ~1.0 ms at batch 1-16 whatever G")
    ap.add_argument("--jitter", type=float, default=0.0, help="log-normal sigma of each replayed step's seconds")
    ap.add_argument("--seeds", type=int, default=1, help="replays of seeds 0 .. N - 1 (jitter and policy); each "
                    "(model, batch) reports the mean of replayed_vs_best over them as replayed_vs_best_mean")
    ap.add_argument("--before", default=None, help="a git revision whose policy is replayed too (``revision_policy``): "
                    "each (model, batch) gains before_vs_best_mean")
    args = ap.parse_args()
    src = json.loads(args.run.read_text())
    doc = dict(command="python " + " ".join(sys.argv), source=str(args.run), models={})
    with tempfile.TemporaryDirectory() as tmp:
        policies = {"replayed": AdaptivePolicy}
        if args.before:
            policies["before"] = revision_policy(args.before, Path(tmp))
        for model, rows in src["models"].items():
            means = {}
            for key, cls in policies.items():
                runs = [replay_model(rows, src["tokens_per_row"], lambda arms, s=s: cls(arms, len(drafts_of(rows[0])), rng=s),
                                     args.costs == "own", not args.cold, args.host_ms, args.jitter, s)
                        for s in range(args.seeds)]
                means[key] = [round(float(np.mean([run[i]["replayed_vs_best"] for run in runs])), 4)
                              for i in range(len(rows))]
                doc["models"][model] = runs[0] if key == "replayed" else doc["models"][model]
            for i, r in enumerate(doc["models"][model]):
                r.update({f"{k}_vs_best_mean": v[i] for k, v in means.items()})
                print(model, json.dumps(r), flush=True)
    for key in ("replayed", "before") if args.before else ("replayed",):
        ratios = [r[f"{key}_vs_best_mean"] for rows in doc["models"].values() for r in rows]
        doc[f"{key}_min_vs_best"], doc[f"{key}_geometric_mean"] = min(ratios), geometric_mean(ratios)
        print(key, "geometric mean", doc[f"{key}_geometric_mean"], "lowest", doc[f"{key}_min_vs_best"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
