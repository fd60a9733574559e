"""The CPU's float32 products by weight layout: one forward's worth of the embedded model's projections
(30 layers of qkv, o, gate_up, down, then the LM head; distinct weights, so they stream from memory as in
decoding) at M rows, with row-major weights by F.linear, row-major as (W x^T)^T (the layout used before,
measured faster on an AMD EPYC), and K-major by F.linear (``flashspec_torch.layers.lay_out``, what the
engine runs). Medians of process time; one JSON.

    OMP_NUM_THREADS=1 python benchmarks/cpu_layout.py --out benchmarks/results/cpu_layout.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

SMOLLM2 = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def time_forward(ws: list[torch.Tensor], m: int, product, repeats: int) -> float:  # ms, median
    xs = {k: torch.randn(m, k) for k in {w.shape[1] for w in ws}}
    product(xs[ws[0].shape[1]], ws[0])
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        for w in ws:
            product(xs[w.shape[1]], w)
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,3,4,5,6,8,17")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    row_major = [torch.randn(n, k) for n, k in SMOLLM2]
    k_major = [w.t().contiguous().t() for w in row_major]
    ways = {"row-major F.linear": (row_major, F.linear),
            "row-major (W x^T)^T": (row_major, lambda x, w: torch.mm(w, x.t()).t().contiguous()),
            "K-major F.linear": (k_major, F.linear)}
    rows = []
    for m in (int(r) for r in args.rows.split(",")):
        row = {"rows": m, **{name: round(time_forward(ws, m, f, args.repeats), 2) for name, (ws, f) in ways.items()}}
        print(row, flush=True)
        rows.append(row)
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ms_per_forward_products": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
