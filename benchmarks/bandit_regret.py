"""Tune the non-stationary policies on a tuning seed, then evaluate on the standard scenarios.

    .venv/bin/python benchmarks/bandit_regret.py [--out benchmarks/results] [--seeds 200]

1. Grid over cd-thompson's (cd_delta, cd_threshold) and discounted-thompson's discount, each
   run on the stationary and the piecewise-stationary scenario with simulation seed 1 (the
   tuning seed). The rule, fixed before looking: minimise stationary + piecewise mean regret.
   Writes bandit_tuning.json.
2. The evaluation is ``flashspec bench bandit`` (simulation seed 0, held out from the tuning),
   run with the library defaults, which were set to the grid's choice.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

from flashspec.bandit_bench import MEANS, machine, run_policies
from flashspec.bandits import BanditConfig
from flashspec.simulate import Environment, switch_every

TUNING_SEED = 1
DELTAS = (0.1, 0.15, 0.2, 0.25)
THRESHOLDS = (4.0, 6.0, 8.0, 12.0)
DISCOUNTS = (0.99, 0.995, 0.998, 0.999)


def evaluate(policy: str, config: BanditConfig, rounds: int, seeds: int) -> dict:
    envs = {"stationary": Environment(MEANS),
            "piecewise": Environment(MEANS, switch_at=switch_every(2000, rounds))}
    out = {}
    for name, env in envs.items():
        result = run_policies([policy], env, config, rounds, seeds, TUNING_SEED)[policy]
        out[name] = round(float(result.regret.mean()), 2)
    out["sum"] = round(out["stationary"] + out["piecewise"], 2)
    return out


def tune(rounds: int, seeds: int) -> dict:
    base = BanditConfig()
    cd = [{"cd_delta": d, "cd_threshold": h,
           **evaluate("cd-thompson", replace(base, cd_delta=d, cd_threshold=h), rounds, seeds)}
          for d, h in itertools.product(DELTAS, THRESHOLDS)]
    disc = [{"discount": g, **evaluate("discounted-thompson", replace(base, discount=g), rounds, seeds)}
            for g in DISCOUNTS]
    for rows in (cd, disc):
        for row in rows:
            print(row, flush=True)
    return {
        "rule": "minimise stationary + piecewise mean regret on the tuning seed",
        "tuning_seed": TUNING_SEED, "rounds": rounds, "seeds": seeds, "means": list(MEANS),
        "switch_every": 2000, "cd_warmup": base.cd_warmup,
        "cd_thompson": cd, "cd_thompson_choice": min(cd, key=lambda r: r["sum"]),
        "discounted_thompson": disc, "discounted_thompson_choice": min(disc, key=lambda r: r["sum"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--rounds", type=int, default=10_000)
    p.add_argument("--seeds", type=int, default=200)
    args = p.parse_args()
    doc = tune(args.rounds, args.seeds)
    doc["command"] = (f".venv/bin/python benchmarks/bandit_regret.py --out {args.out} "
                      f"--rounds {args.rounds} --seeds {args.seeds}")
    doc["machine"] = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bandit_tuning.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("cd-thompson:", doc["cd_thompson_choice"])
    print("discounted-thompson:", doc["discounted_thompson_choice"])


if __name__ == "__main__":
    main()
