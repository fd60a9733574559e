"""Where a step's time goes on a GPU (random weights of a given shape): wall-clock time of each
backend call (eager), and torch.profiler tables of a few eager plain steps by CPU and by CUDA time
(kernel durations are what a CUDA-graph replay also pays, minus the launch gaps).
Writes $OUT/engine_profile_<shape>.txt.

    python benchmarks/engine_profile.py [--shape tinyllama-1.1b]
"""

import argparse
import os
import time
from pathlib import Path

import torch

from engine_gpu import SHAPES, Fixed, random_model  # benchmarks/ is on sys.path when run as a script
from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft
from flashspec_torch.model import LlamaConfig


def wall(fn, reps=20):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3, out


def linear_bandwidth(cfg: LlamaConfig, tokens: int = 1) -> list[str]:
    """Achieved bandwidth of each projection of one layer (bf16, ``tokens`` rows), graph-replayed:
    cuBLAS (F.linear) next to the best of a few tilings of flashspec_torch.layers.skinny_linear."""
    from engine_gpu import graph_ms

    from flashspec_torch.layers import skinny_linear

    c, d = cfg, cfg.head_dim
    shapes = {"qkv": ((c.num_heads + 2 * c.num_kv_heads) * d, c.hidden_size), "o": (c.hidden_size, c.num_heads * d),
              "gate_up": (2 * c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size),
              "lm_head": (c.vocab_size, c.hidden_size)}
    tilings = [(bn, bk, warps, stages) for bn in (16, 32, 64) for bk in (128, 256, 512) for warps in (4,) for stages in (3, 4)]
    lines = [f"== projections, {tokens} row(s), bf16, CUDA-graph replay: cuBLAS | best skinny_linear tiling =="]
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        mb = w.numel() * 2 / 1e6
        ms = graph_ms(lambda: torch.nn.functional.linear(x, w))
        best = (float("inf"), None)
        want = torch.nn.functional.linear(x, w).float()
        for t in tilings:
            try:
                got = skinny_linear(x, w, *t).float()
            except Exception as e:  # e.g. a tiling past the shared memory of the chip
                lines.append(f"{name} {t}: {type(e).__name__}")
                continue
            if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item()):
                lines.append(f"{name} {t}: WRONG")
                continue
            best = min(best, (graph_ms(lambda: skinny_linear(x, w, *t), reps=20), t))
        lines.append(f"{name:8s} [{n} x {k}] {mb:8.1f} MB  cuBLAS {ms * 1e3:7.1f} us {mb / ms / 1e3:5.0f} GB/s | "
                     f"triton {best[0] * 1e3:7.1f} us {mb / best[0] / 1e3:5.0f} GB/s {best[1]}")
    return lines


def graphed_steps(m, prompts, seed) -> list[str]:
    """Kernels inside CUDA-graph replays of plain and speculative steps (CUPTI traces them)."""
    greedy = SamplingConfig(0.0)
    be = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=True)
    decode(be, prompts, sampling=greedy, max_new_tokens=8, seed=seed)  # captures
    speculate(be, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=8), seed=seed)
    lines = []
    for name, fn in (("plain", lambda: be.decode_one(greedy, seed, 0)), ("speculative", lambda: be.step(0, 4, greedy, seed, 0))):
        be.prefill(prompts, 64)
        ms, _ = wall(fn, reps=10)
        be.prefill(prompts, 64)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        lines.append(f"== 5 graphed {name} steps ({ms:.3f} ms each, wall), by CUDA time ==")
        lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    cfg = LlamaConfig(**SHAPES[args.shape], max_position_embeddings=8192)
    m = random_model(cfg)
    prompts = torch.randint(0, cfg.vocab_size, (1, 128)).tolist()
    greedy = SamplingConfig(0.0)
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    be = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=False)
    lines = []
    with torch.inference_mode():
        decode(be, prompts, sampling=greedy, max_new_tokens=8, seed=seed)
        speculate(be, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=8), seed=seed)
        be.prefill(prompts, 512)
        lines.append(f"decode_one: {wall(lambda: be.decode_one(greedy, seed, 0))[0]:.2f} ms")
        be.prefill(prompts, 512)
        length = be.seqs.length
        last = be.seqs.tokens.gather(1, (length - 1)[:, None])
        lines.append(f"target forward T=1: {wall(lambda: m(last, (length - 1)[:, None], be.cache, 200))[0]:.2f} ms")
        ms, p = wall(lambda: be.draft(0, 4, greedy, seed, 0))
        lines.append(f"ngram draft: {ms:.2f} ms")
        ms, z = wall(lambda: be.score(p))
        lines.append(f"score (T=5): {ms:.2f} ms")
        ms, r = wall(lambda: be.verify(z, p, greedy, seed, 0))
        lines.append(f"verify (triton, greedy): {ms:.2f} ms")
        ms, _ = wall(lambda: be.verify(z, p, SamplingConfig(0.7), seed, 0))
        lines.append(f"verify (triton, T=0.7): {ms:.2f} ms")
        ms, _ = wall(lambda: be.commit(r))
        lines.append(f"commit: {ms:.2f} ms")
        be.prefill(prompts, 512)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(5):
                be.decode_one(greedy, seed, 0)
            torch.cuda.synchronize()
        lines.append("== 5 plain steps, by CPU time ==")
        lines.append(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
        lines.append("== 5 plain steps, by CUDA time ==")
        lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
        lines += graphed_steps(m, prompts, seed)
        lines += linear_bandwidth(cfg, 1) + linear_bandwidth(cfg, 5)
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"engine_profile_{args.shape}.txt").write_text(text)


if __name__ == "__main__":
    main()
