"""The eager torch tree verification (``flashspec_torch.tree_verify.verify_tree``) on a GPU: does it emit the NumPy
oracle's tokens there (CUDA's exp / log / sums against NumPy's), and what does one call cost beside the chain's
plain-torch verify?

    python benchmarks/tree_verify_gpu.py --out $OUT/tree_verify.json [--vocab 49152] [--sizes 8,32,64]

``parity``: per sampling config (T = 1, T = 0.7 with top-p 0.85, greedy), --parity-rows rows of random trees
(a random parent per node, distinct random sibling tokens, N = 16) with random logits (scale 3), per-row sizes
from 0 to N; the count of rows whose (tokens, path) differ from ``flashspec.tree.verify_tree`` on the same
float32 logits. ``ms``: medians over --reps of verify_tree at T = 1 and at T = 0, and of the chain's
``verify(impl="reference")`` with G = 4 one-hot drafts, per (B, N). ``--device cpu`` tests the script.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone

import numpy as np
import torch

from flashspec.tree import verify_tree as oracle
from flashspec_torch.tree_verify import as_numpy_result, verify_tree
from flashspec_torch.verify import verify
from tree_score_gpu import random_trees, timed_ms  # benchmarks/ is on sys.path for scripts

CONFIGS = {"T1": dict(temperature=1.0), "T0.7_top_p0.85": dict(temperature=0.7, top_p=0.85),
           "greedy": dict(temperature=0.0)}


def parity(r, args, device) -> dict:
    """Rows whose tokens or path differ from the NumPy oracle, per config."""
    b, n, v = args.parity_rows, 16, args.vocab
    tokens, parents = random_trees(r, b, n, v)
    z = (r.normal(size=(b, n + 1, v)) * 3).astype(np.float32)
    sizes = r.integers(0, n + 1, size=b)
    t = {k: torch.from_numpy(a).to(device) for k, a in (("z", z), ("x", tokens), ("a", parents), ("s", sizes))}
    out = {}
    for name, kw in CONFIGS.items():
        want = oracle(z, tokens, parents, seed=11, offset=2, tree_sizes=sizes, **kw)
        got = as_numpy_result(verify_tree(t["z"], t["x"], t["a"], seed=11, offset=2, tree_sizes=t["s"], **kw))
        same = (got.tokens == want.tokens).all(-1) & (got.path == want.path).all(-1)
        out[name] = {"rows": b, "rows_differing": int((~same).sum())}
    return out


def one_shape(r, args, b: int, n: int, device) -> dict:
    v = args.vocab
    tokens, parents = random_trees(r, b, n, v)
    z = torch.from_numpy((r.normal(size=(b, n + 1, v)) * 3).astype(np.float32)).to(device)
    x, a = torch.from_numpy(tokens).to(device), torch.from_numpy(parents).to(device)
    chain_x = x[:, :4]
    return {"b": b, "n": n, "ms": {
        "tree_T1": timed_ms(lambda: verify_tree(z, x, a, seed=1), args.reps, device),
        "tree_greedy": timed_ms(lambda: verify_tree(z, x, a, temperature=0.0), args.reps, device),
        "chain_reference_g4_T1": timed_ms(lambda: verify(z[:, :5], chain_x, seed=1, impl="reference"), args.reps,
                                          device)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--parity-rows", type=int, default=64)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--sizes", default="8,32,64")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new shapes after this many seconds")
    args = p.parse_args()
    device = torch.device(args.device)
    r = np.random.default_rng(0)
    t0 = time.perf_counter()
    report = {"parity": parity(r, args, device), "timing": []}
    print(json.dumps(report["parity"]), flush=True)
    for b in (int(x) for x in args.batches.split(",")):
        for n in (int(x) for x in args.sizes.split(",")):
            if time.perf_counter() - t0 > args.budget_s:
                break
            report["timing"].append(one_shape(r, args, b, n, device))
            print(json.dumps(report["timing"][-1]), flush=True)
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()}
    with open(args.out, "w") as f:
        json.dump({"when": datetime.now(timezone.utc).isoformat(), "args": vars(args), "env": env, **report}, f,
                  indent=1)


if __name__ == "__main__":
    main()
