"""Correctness of the GPU verify paths on a real GPU (no pytest needed there).

    python benchmarks/gpu_checks.py --backend torch   # triton + torch reference on CUDA
    python benchmarks/gpu_checks.py --backend jax     # pallas + jnp reference on the GPU

For each implementation: (1) parity with the NumPy oracle on fresh random fp32 inputs over a grid
of shapes and sampling settings (mismatched rows counted: they may differ only at floating-point
near-ties); (2) the shared exactness suite at its full default sizes (100,000 samples per case,
10,000 for KS, family-wise alpha 0.01) with value checks on. Writes $OUT/gpu_checks_<backend>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np

from flashspec.config import SamplingConfig
from flashspec.contract import VerifyResult
from flashspec.reference import sample
from flashspec.reference import verify as oracle
from flashspec.testing import run_suite

SETTINGS = [
    dict(temperature=1.0), dict(temperature=0.7), dict(temperature=2.0), dict(temperature=0.0),
    dict(temperature=0.8, top_k=50), dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_k=100, top_p=0.8),
]
SHAPES = [(1, 4, 32000), (8, 4, 128256), (32, 1, 32000), (3, 8, 4099), (64, 4, 32000)]
# JAX compiles per shape and static setting: a smaller grid
JAX_SHAPES = [(8, 4, 32000), (3, 8, 4099)]
JAX_SETTINGS = [dict(temperature=1.0), dict(temperature=0.0), dict(temperature=0.8, top_k=50, top_p=0.9)]


def draw(rng, b, g, v, cfg: SamplingConfig, kind: str, seed: int):
    z = (rng.normal(size=(b, g + 1, v)) * 2).astype(np.float32)
    if kind == "onehot":
        best = z[:, :g].argmax(-1)
        x = np.where(rng.random((b, g)) < 0.6, best, rng.integers(0, v, (b, g)))
        return z, x.astype(np.int64), None, None
    w = (z[:, :g] + rng.normal(size=(b, g, v)) * 1.4).astype(np.float32)
    xs, lqs = zip(*(sample(w[:, i], cfg, seed, 5, position=i) for i in range(g)))
    lq = np.stack(lqs, 1) if kind == "logprobs" else None
    return z, np.stack(xs, 1).astype(np.int64), w, lq


def parity(verify_np, name: str, shapes=SHAPES, settings=SETTINGS) -> list[dict]:
    rng = np.random.default_rng(2026)
    rows = []
    for (b, g, v), setting in ((s, t) for s in shapes for t in settings):
        cfg = SamplingConfig(**setting)
        for kind in ("logits", "logprobs", "onehot"):
            if kind == "logprobs" and cfg.greedy:
                continue
            seed = int(rng.integers(0, 2**63))
            z, x, w, lq = draw(rng, b, g, v, cfg, kind, seed)
            want = oracle(z, x, w, lq, seed=seed, offset=5, **setting)
            got = verify_np(z, x, w, lq, seed=seed, offset=5, **setting)
            bad = (np.asarray(got.tokens) != want.tokens).any(-1) | (np.asarray(got.num_accepted) != want.num_accepted)
            rows.append(dict(impl=name, B=b, G=g, V=v, kind=kind, **setting, mismatched_rows=int(bad.sum())))
    return rows


def torch_adapters() -> dict:
    import torch

    from flashspec_torch import verify

    def to(a):
        return None if a is None else torch.from_numpy(np.array(a)).cuda()

    def make(impl):
        def verify_np(z, x, w=None, lq=None, **kw):
            kw = {k: to(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
            r = verify(to(z), to(x), to(w), to(lq), impl=impl, validate=True, **kw)
            return VerifyResult(r.num_accepted.cpu().numpy(), r.tokens.cpu().numpy())
        return verify_np

    return {"triton": make("triton"), "torch-reference": make("reference")}


def jax_adapters() -> dict:
    from flashspec_jax import verify

    def make(impl):
        def verify_np(z, x, w=None, lq=None, **kw):
            r = verify(z, x, w, lq, impl=impl, **kw)
            return VerifyResult(np.asarray(r.num_accepted), np.asarray(r.tokens))
        return verify_np

    return {"pallas": make("pallas"), "jnp-reference": make("reference")}


def environment(backend: str) -> dict:
    env = {"python": platform.python_version(), "date": str(date.today())}
    if backend == "torch":
        import torch
        import triton

        env.update(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name())
    else:
        import jax

        env.update(jax=jax.__version__, devices=[str(d) for d in jax.devices()])
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("torch", "jax"), required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args()
    adapters = torch_adapters() if args.backend == "torch" else jax_adapters()
    result = {"environment": environment(args.backend), "parity": [], "suite": {}}
    for name, verify_np in adapters.items():
        start = time.time()
        grid = (SHAPES, SETTINGS) if args.backend == "torch" else (JAX_SHAPES, JAX_SETTINGS)
        rows = parity(verify_np, name, *grid)
        result["parity"] += rows
        print(f"{name}: parity {sum(r['mismatched_rows'] for r in rows)} mismatched rows over "
              f"{sum(r['B'] for r in rows)} rows, {time.time() - start:.1f} s", flush=True)
        start = time.time()
        report = run_suite(verify_np)
        result["suite"][name] = {
            "passed": report.passed, "checks": len(report.checks), "seconds": time.time() - start,
            "failures": [f"{c.name}[{c.case}] p={c.p_value:.3g} {c.detail}" for c in report.failures],
        }
        print(f"{name}: exactness suite {'PASSED' if report.passed else 'FAILED'} "
              f"({len(report.checks)} checks, {time.time() - start:.1f} s)\n" + report.summary(), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_checks_{args.backend}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
