"""How often does the correct reference fail the exactness suite? (The family-wise false-alarm rate.)

Runs the whole statistical suite on ``flashspec.reference.verify`` with many seeds and reports
the fraction of runs with any failed check, and the smallest p-values seen (they should look
uniform). Writes benchmarks/results/suite_false_alarms.json.

    python benchmarks/suite_false_alarms.py --runs 100 --n-samples 20000
"""

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np

from flashspec.reference import verify
from flashspec.testing import run_suite


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--n-samples", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/suite_false_alarms.json"))
    args = ap.parse_args()
    start = time.time()
    failed_runs, p_values = 0, []
    for run in range(args.runs):
        report = run_suite(verify, seed=10_000 + 97 * run, n_samples=args.n_samples)
        failed_runs += not report.passed
        p_values += [c.p_value for c in report.checks if c.name.startswith(("ks", "chi2"))]
    p = np.array(p_values)
    result = {
        "command": f"python benchmarks/suite_false_alarms.py --runs {args.runs} --n-samples {args.n_samples}",
        "runs": args.runs,
        "n_samples": args.n_samples,
        "failed_runs": failed_runs,
        "family_alpha": 0.01,
        "statistical_tests": int(p.size),
        "fraction_of_p_below": {str(a): float((p < a).mean()) for a in (0.01, 0.05, 0.1, 0.5)},
        "seconds": time.time() - start,
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "date": str(date.today()),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
