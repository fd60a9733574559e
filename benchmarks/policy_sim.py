"""The adaptive policy against every fixed arm in the replay simulator (``flashspec.policy_sim``), on scenarios
calibrated from an H100 run of ``adaptive_bench.py`` (issue #35). CPU, deterministic, about a minute.

    python benchmarks/policy_sim.py --out benchmarks/results/policy_sim.json

Calibration, per (model, batch, draft): the step seconds per arm are the policy's own estimates in that run
(``adaptive_cost_ms``; an arm it never measured gets the next longer length's); each draft's acceptance is a
``DraftModel`` (first / then / switch), fitted on a grid so that the fixed runs of that draft at G = 2 and 4
reproduce the run's acceptance and its number of steps (tokens/s x step cost), the tail included: the JSON
gives measured and simulated tokens/s of every fixed arm beside the fit. Where the run's JSON has the fixed runs'
per-row traces (``trace``, written since issue #35's s15 change), the simulator replays those instead of the
fitted models (``flashspec.policy_sim.trace_bits``, ``Rows.replay``): ``replay_steps`` gives each fixed arm's
recorded and replayed steps. Then, per scenario, every fixed arm and
the adaptive policy run over the same rows: static batches of ``--tokens`` (as measured) and 4x as many
tokens a row, with the benchmark's warm-up run first (warm), without (cold: the policy's first run) and with
every arm's step seconds known but no acceptance (priced: as if each step kind were timed at capture), and a
continuous stream (a server's slots refilled as requests finish). ``--policy old`` runs the policy as it
was before this change (``OldPolicy``: mean-throughput value, Thompson sampling on free-scored drafts) for
the before/after table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT)]

from flashspec.adaptive import AdaptivePolicy, make_arms  # noqa: E402
from flashspec.policy_sim import (DraftModel, Rows, Scenario, arm_names, compare, position_acceptance, run_fixed,  # noqa: E402
                                  trace_bits)

DEFAULT_RUN = ROOT / "benchmarks/results/h100_2026-12-06_s13_adaptive/adaptive_gpu.json"
DRAFTS = ("ngram", "replay")
LENGTHS = (2, 4)
GRID_ALPHA = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
GRID_SWITCH = (0.0, 8.0, 16.0, 32.0, 64.0, 128.0, 512.0)


def fixed_runs(ok: np.ndarray, length: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed runs at ``length`` of rows whose tokens are accepted where ``ok`` [models, rows, width]:
    (pooled acceptance [models], steps until the batch's last row is done [models])."""
    models, rows, width = ok.shape
    pos = np.zeros((models, rows), np.int64)
    acc_sum = np.zeros(models)
    drafted = np.zeros(models)
    steps = np.zeros(models)
    ar = np.arange(length)
    while (pos < tokens).any():
        active = pos < tokens  # [models, rows]
        idx = np.minimum(pos[..., None] + ar, width - 1)
        acc = np.cumprod(np.take_along_axis(ok, idx, axis=2), axis=2).sum(axis=2)
        acc_sum += (acc * active).sum(axis=1)
        drafted += active.sum(axis=1) * length
        steps += active.any(axis=1)
        pos += active * np.minimum(acc + 1, tokens - pos)
    return acc_sum / np.maximum(drafted, 1), steps


def fit_draft(measured: dict, batch: int, tokens: int) -> tuple[DraftModel, dict]:
    """The grid's (first, then, switch) whose fixed runs at G = 2 and 4 come closest to ``measured``
    ({L: (acceptance, steps)}): squared acceptance error + squared log step-count error."""
    combos = [(f, t, s) for f, t, s in itertools.product(GRID_ALPHA, GRID_ALPHA, GRID_SWITCH)
              if (s > 0 or f == t) and not (s > 0 and f == t)]
    rows = min(batch, 256)
    width = tokens + max(LENGTHS) + 2
    rng = np.random.default_rng(11)
    ok = np.empty((len(combos), rows, width), bool)
    for i, (f, t, s) in enumerate(combos):
        alpha = DraftModel(f, t, s).alpha(rng.exponential(s, rows) if s else np.zeros(rows), width)
        ok[i] = rng.random((rows, width)) < alpha
    loss = np.zeros(len(combos))
    sims = {}
    for g in LENGTHS:
        acc, steps = fixed_runs(ok, g, tokens)
        sims[g] = (acc, steps)
        m_acc, m_steps = measured[g]
        loss += (acc - m_acc) ** 2 + np.log(steps / m_steps) ** 2
    i = int(np.argmin(loss))
    f, t, s = combos[i]
    return DraftModel(f, t, s), dict(first=f, then=t, switch=s, loss=float(loss[i]), **{
        f"G{g}": dict(acceptance=[round(measured[g][0], 3), round(float(sims[g][0][i]), 3)],
                      steps=[round(measured[g][1], 1), int(sims[g][1][i])]) for g in LENGTHS})


def calibrate(row: dict, tokens: int) -> tuple[tuple[float, ...], tuple[DraftModel, ...], float, dict, list | None]:
    """(costs [arms], drafts, a plain step's scoring seconds, the fit's report, the traces' bits per draft or None)
    of one (model, batch) of an ``adaptive_bench.py`` JSON. A plain step costs what the fixed plain run took a step;
    the policy's own estimate, from its plain steps that scored the drafts for free, is dearer by the scoring's
    seconds. Where the JSON has the fixed runs' traces, the simulator replays them (``trace_bits``); the fitted
    models stay in the report beside them."""
    arms = make_arms(len(DRAFTS), LENGTHS)
    names = arm_names(arms, DRAFTS)
    ms = dict(row["adaptive_cost_ms"])
    for d in DRAFTS:  # an arm the policy never measured: its fixed run's median step, else the longer length's cost
        for g in LENGTHS:
            if not np.isfinite(ms[f"{d}:G{g}"]):
                ms[f"{d}:G{g}"] = row["fixed"][f"{d}:G{g}"].get("step_ms", float("nan"))
        for g in LENGTHS:
            if not np.isfinite(ms[f"{d}:G{g}"]):
                ms[f"{d}:G{g}"] = max(v for k, v in ms.items() if k.startswith(d) and np.isfinite(v))
    plain = row["new_tokens"] / row["plain_tokens_per_s"] / tokens
    score_cost = max(0.0, ms["plain"] / 1e3 - plain)
    ms["plain"] = plain * 1e3
    costs = tuple(ms[n] / 1e3 for n in names)
    drafts, report = [], {}
    for d in DRAFTS:
        fixed = [row["fixed"][f"{d}:G{g}"] for g in LENGTHS]  # its "steps" where recorded, else time / cost
        measured = {g: (f["acceptance"], f.get("steps") or row["new_tokens"] / f["tokens_per_s"] / (ms[f"{d}:G{g}"] / 1e3))
                    for g, f in zip(LENGTHS, fixed)}
        model, report[d] = fit_draft(measured, row["batch"], tokens)
        drafts.append(model)
    if not all("trace" in f for f in row["fixed"].values()):
        return costs, tuple(drafts), score_cost, report, None
    width = tokens + max(LENGTHS) + 2
    bits = [trace_bits({g: row["fixed"][f"{d}:G{g}"]["trace"] for g in LENGTHS}, width) for d in DRAFTS]
    return costs, tuple(drafts), score_cost, report, bits


class OldPolicy(AdaptivePolicy):
    """The policy before the s14 change, for that before/after table: every step valued by the active rows' mean
    throughput (no remaining tokens, no tail) and Thompson sampling even on drafts scored for free (on today's
    acceptance model, the per-position profile included)."""

    def new_batch(self, rows=None, tokens=None):
        super().new_batch(rows, None)

    def observe_free(self, draft, scored, accepted, where=None):
        self._add(draft, np.asarray(scored), np.asarray(accepted), where)

    def scores(self, arm):
        return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, default=DEFAULT_RUN, help="an adaptive_bench.py JSON (H100)")
    ap.add_argument("--policy", choices=("new", "old", "both"), default="both")
    ap.add_argument("--choose-ms", type=float, default=0.0,
                    help="static scenarios: host ms of one choice (0: free, every step chooses; ``Scenario.choose_s``)")
    ap.add_argument("--host-ms", type=float, default=0.0,
                    help="static scenarios: the loop's other host ms a step (``Scenario.host_s``)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    src = json.loads(args.run.read_text())
    tokens = src["tokens_per_row"]
    arms = make_arms(len(DRAFTS), LENGTHS)
    names = arm_names(arms, DRAFTS)
    policies = {"new": AdaptivePolicy, "old": OldPolicy}
    chosen = list(policies) if args.policy == "both" else [args.policy]
    start = time.perf_counter()
    doc = dict(command="python " + " ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               source=str(args.run.relative_to(ROOT) if args.run.is_relative_to(ROOT) else args.run),
               source_device=src.get("device"), arms=names, tokens_per_row=tokens, models={})
    for model, rows in src["models"].items():
        doc["models"][model] = []
        for row in rows:
            costs, drafts, score_cost, fit, bits = calibrate(row, tokens)
            b = row["batch"]
            entry = dict(batch=b, costs_ms=[round(c * 1e3, 4) for c in costs], plain_scoring_ms=round(score_cost * 1e3, 4),
                         fit=fit, replayed=bits is not None, runs={})
            if bits is not None:  # each fixed arm's steps: recorded, and replayed from the traces
                static = Scenario(arms, costs, drafts, b, tokens, noise=0.0)
                rows_ = Rows.replay(static, bits)
                entry["replay_steps"] = {n: [row["fixed"][n]["steps"], sum(run_fixed(static, a, rows_).steps.values())]
                                         for a, n in enumerate(names) if n != "plain"}
                entry["position_acceptance"] = {n: position_acceptance(row["fixed"][n]["trace"], arm.length)
                                                for n, arm in zip(names, arms) if not arm.plain}
            host = dict(choose_s=args.choose_ms / 1e3, host_s=args.host_ms / 1e3)
            scenarios = {
                "static": Scenario(arms, costs, drafts, b, tokens, score_cost=score_cost, **host),
                "static_long": Scenario(arms, costs, drafts, b, 4 * tokens, score_cost=score_cost, **host),
                "stream": Scenario(arms, costs, drafts, b, tokens, mode="stream", steps=3 * tokens, score_cost=score_cost),
            }
            for kind, sc in scenarios.items():
                for begin in ("warm", "cold", "priced") if kind == "static" else ("cold",):
                    key = f"{kind}_{begin}"
                    entry["runs"][key] = {}
                    for p in chosen:
                        out = compare(sc, lambda p=p: policies[p](arms, len(DRAFTS), rng=0), warm=begin == "warm",
                                      repeats=max(1, 16 // b), priced=begin == "priced", bits=bits)
                        entry["runs"][key][p] = dict(
                            vs_best=round(out["vs_best"], 4), vs_plain=round(out["vs_plain"], 4),
                            best=names[out["best"]], steps={names[a]: n for a, n in sorted(out["steps"].items())},
                            tokens_per_s={**{names[a]: round(v) for a, v in out["fixed"].items()},
                                          "adaptive": round(out["adaptive"])})
            entry["measured_tokens_per_s"] = {"plain": round(row["plain_tokens_per_s"]),
                                              **{k: round(v["tokens_per_s"]) for k, v in row["fixed"].items()},
                                              "adaptive": round(row["adaptive_tokens_per_s"])}
            entry["measured_adaptive_steps"] = row["adaptive_steps"]  # beside runs.static_warm's simulated steps
            doc["models"][model].append(entry)
            print(model, b, {k: {p: (v[p]["vs_best"], v[p]["vs_plain"]) for p in v} for k, v in entry["runs"].items()},
                  flush=True)
    for p in chosen:
        runs = [r["runs"][k][p] for rows in doc["models"].values() for r in rows for k in r["runs"]]
        doc[f"{p}_min_vs_best"] = min(r["vs_best"] for r in runs)
        doc[f"{p}_min_vs_plain"] = min(r["vs_plain"] for r in runs)
        doc[f"{p}_pass"] = all(r["vs_best"] >= 0.98 and r["vs_plain"] >= 1.0 for r in runs)
    doc["seconds"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print({k: v for k, v in doc.items() if k.endswith(("vs_best", "vs_plain", "pass", "seconds"))})


if __name__ == "__main__":
    main()
