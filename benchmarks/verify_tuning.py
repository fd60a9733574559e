"""Tiling sweep of the Triton verify kernels on a GPU (which KernelConfig is fastest per shape).

    python benchmarks/verify_tuning.py    # writes $OUT/verify_tuning.json

Each variant is timed as CUDA-graph replays of R verify calls on R different input sets (so L2
serves no repeats and launch overhead is excluded), median of several replays. Bytes counted:
target logits [B, G+1, V] + draft row n [B, V] (draft_logprobs given, so only row n is read).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import torch

from flashspec.config import SamplingConfig
from flashspec_torch.verify import KernelConfig, choose_config, verify_triton
from verify_kernels import capture, copy_bandwidth_gbps, time_graph  # benchmarks/ is on sys.path for scripts


def inputs(b, g, v, dtype, count):
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for k in range(count):
        z = (torch.randn(b, g + 1, v, device="cuda", generator=gen) * 2).to(dtype)
        w = (z[:, :g].float() + torch.randn(b, g, v, device="cuda", generator=gen)).to(dtype)
        x = torch.randint(0, v, (b, g), device="cuda", generator=gen)
        lq = torch.full((b, g), -3.0, device="cuda")
        seed = torch.tensor(k, device="cuda")
        sets.append((z, x, w, lq, seed))
    return sets


def main() -> None:
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    bw = copy_bandwidth_gbps("cuda") * 1e9
    rows = []
    shapes = [(8, 4, 128256), (32, 4, 128256), (128, 4, 128256), (256, 4, 128256), (256, 4, 32000), (256, 8, 32000)]
    for (b, g, v), temperature in itertools.product(shapes, (1.0, 0.7)):
        cfg = SamplingConfig(temperature)
        per_set = b * (g + 1) * v * 2
        sets = inputs(b, g, v, torch.bfloat16, max(2, min(16, (3 * 60 * 2**20) // per_set + 1)))
        need = b * (g + 2) * v * 2 + b * g * 12
        default = choose_config(b, g, v, torch.device("cuda"))
        variants = {"default": default}
        for chunks, warps, block_v in itertools.product((1, 2, 4, 8, 16, 32), (4, 8), (256, 512, 1024)):
            if b * chunks > 4096:
                continue
            variants[f"c{chunks}-w{warps}-bv{block_v}"] = KernelConfig(block_b=1, block_v=block_v, sweep_v=2048,
                                                                       num_chunks=chunks, num_warps=warps)
        for name, kc in variants.items():
            def step(inp, kc=kc):
                return verify_triton(*inp[:4], cfg, inp[4], 3, config=kc)
            try:
                sec = time_graph(capture(step, sets)[0], len(sets)) * 1e-3
            except Exception as e:  # a variant that does not compile or launch is reported, not fatal
                rows.append(dict(B=b, G=g, V=v, T=temperature, variant=name, error=f"{type(e).__name__}: {e}"[:200]))
                continue
            rows.append(dict(B=b, G=g, V=v, T=temperature, variant=name, us=sec * 1e6,
                             floor_us=need / bw * 1e6, x_floor=sec * bw / need))
        best = min((r for r in rows if r.get("B") == b and r.get("V") == v and r.get("G") == g and r.get("T") == temperature and "us" in r),
                   key=lambda r: r["us"])
        dflt = next(r for r in rows if r.get("B") == b and r.get("V") == v and r.get("G") == g and r.get("T") == temperature and r["variant"] == "default")
        print(f"B={b:4d} G={g} V={v:6d} T={temperature}: default {dflt.get('us', float('nan')):8.1f} us "
              f"({dflt.get('x_floor', float('nan')):.2f}x floor), best {best['variant']} {best['us']:8.1f} us "
              f"({best['x_floor']:.2f}x floor {best['floor_us']:.1f} us)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_tuning.json").write_text(json.dumps({"copy_bandwidth_GBs": bw / 1e9, "gpu": torch.cuda.get_device_name(),
                                                       "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
