"""Batch-invariant mode on a GPU (issue #40): are a request's tokens the same bits alone, in a batch
of 16 or 64 other requests, and through n-gram speculation, and what does the mode cost per token?

    python benchmarks/batch_invariant_gpu.py --out $OUT/batch_invariant_gpu.json [--gguf PATH] [--tiles-json PATH]
        [--shapes smollm2-135m --draws-after tinyllama-1.1b]   # SmolLM2's requests of the default run, alone

Random bf16 weights of three shapes (the embedded SmolLM2-135M's, TinyLlama-1.1B's, Llama-3-8B's);
``--gguf PATH`` adds the embedded model's real weights on its 8 benchmark prompts. Per shape:

* ``checks``: requests 0-3 (random prompts of 8-40 tokens, each its own seed) decoded alone, inside
  a batch of 16 and inside a batch of 64 (reversed, so request 0 is the last row), each plainly and
  with the n-gram draft (G = 4, fixed draft choice), greedy and sampled (T = 0.8): pass when all six
  token lists of a request are equal. Run in batch-invariant mode, and (greedy, as "before", first
  shape only) in the default mode.
* ``timing``: ms per plain token at batch 1, 16, 64 and ms per speculative step (with its tokens per
  step) at batch 1 and 64, CUDA graphs on, in four or five modes: batch-invariant with the engine's
  launches (``invariant``: ``launch_tiling``), the default mode, cuBLAS-only products, batch-invariant with
  qkv's and gate_up's products then the ``rope_kv`` and ``silu_mul`` kernels (``invariant_unfused``: the
  mode before they became the products' epilogues), and, with
  ``--tiles-json`` (a result of ``benchmarks/invariant_tiles_gpu.py`` on this GPU, usually from the same
  run), batch-invariant with each product launched as the fastest candidate of the engine's order that
  passed every bit check there at the nearest measured M at or above the pass's rows
  (``invariant_best``: what ``launch_tiling`` would give if it took those winners); the ratios of each
  invariant mode to the default, to cuBLAS (issue #40's bar: <= 1.15 at batch 1, <= 1.25 at batch 64) and
  to ``invariant_unfused``.
* ``epilogues``: the shape's gate_up and qkv alone at M = 1, 5, 16, 64, 65, 320: their epilogues (SwiGLU;
  RoPE + KV write) give the bits of the product then ``silu_mul`` / ``rope_kv`` (pass), with the engine's
  launches on this card.
* ``products``: (``--product-shapes``) each projection alone at M = 1, 16, 64, 320: us per call of the
  three invariant tilings above on the product's input (``rows4`` the engine's, ``rows1``, ``m64``),
  of cuBLAS, and of the per-row add + RMSNorm or SwiGLU kernel the engine runs before the product;
  pass: row 0 has the same bits as alone in each tiling; ``attention``: decode
  attention at contexts 128, 1024, 4096 (1, 4, 16 KV splits) invariant vs default, and a position's
  bits alone == as a scoring row == in a prefill pass (pass).
* ``distinct``: (first shape only, after every shape's other parts; eager) ``--distinct`` greedy runs of request 0, alternately plain
  and speculative, each inside a batch of random size (1-64) of random other requests at a random
  row: the number of distinct completions in batch-invariant mode (pass: 1), and in the default mode
  over a quarter as many runs.

The JSON is rewritten after each part, so a run cut short keeps what it finished; a part that would
start after ``--budget-s`` seconds is skipped and named in ``skipped``, and no distinct-completion run
starts after ``--stop-s`` seconds. Every check has
``pass``; ``summary`` counts them. Small enough to test on the CPU under TRITON_INTERPRET=1 with
``--device cpu --tiny`` (a 2-layer model, a few tokens).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import triton

from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft
from flashspec_torch.model import Llama, LlamaConfig
from batch_invariant_ops import attention_part, epilogue_part, products  # benchmarks/ is on sys.path for scripts
from engine_gpu import SHAPES as ENGINE_SHAPES

SHAPES = {
    **ENGINE_SHAPES,
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                 head_dim=16),  # --tiny: the CPU test of this script
}
# mode: (model.batch_invariant, model.linear_impl, model.pdl); None: the model's default by device and shape
MODES = {"invariant": (True, None, None), "default": (False, None, None), "cublas": (False, "reference", False),
         "invariant_unfused": (True, None, None),  # qkv's and gate_up's products, then rope_kv / silu_mul (< session 21)
         "invariant_best": (True, None, None)}  # the last with --tiles-json only: launches from its winners
ENGINE_LAUNCH = None  # invariant_matmul.launch_tiling as imported (set_mode restores it)
ENGINE_EPILOGUES = None  # model.invariant_matmul_swiglu and _rope_kv as imported (set_mode restores them)
GREEDY, SAMPLED = SamplingConfig(0.0), SamplingConfig(0.8)


class Fixed:  # the n-gram draft every step: a request's tokens must not depend on a policy's batch-wide choice
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def random_model(cfg: LlamaConfig, device: str) -> Llama:
    torch.manual_seed(0)
    with torch.device(device):
        m = Llama(cfg).to(torch.bfloat16)
    for p in m.parameters():
        p.data.normal_(0, 0.02 if cfg.hidden_size > 64 else 0.4)
    return m.eval().requires_grad_(False)


def set_mode(m: Llama, mode: str, winners: dict | None = None) -> None:
    """The model's mode, and the invariant product's launches (``invariant_matmul.launch_tiling``, read at
    each launch: a backend made after this call captures its graphs with them): the engine's, or for
    ``invariant_best`` the ``winners`` (``tile_winners``)."""
    from flashspec_torch import invariant_matmul as I
    from flashspec_torch import model as model_module

    global ENGINE_LAUNCH, ENGINE_EPILOGUES
    ENGINE_LAUNCH = ENGINE_LAUNCH or I.launch_tiling
    ENGINE_EPILOGUES = ENGINE_EPILOGUES or (model_module.invariant_matmul_swiglu, model_module.invariant_matmul_rope_kv)
    m.batch_invariant, m.linear_impl, m.pdl = MODES[mode]
    I.launch_tiling = ENGINE_LAUNCH if mode != "invariant_best" else best_launch(winners, ENGINE_LAUNCH)
    unfused = mode == "invariant_unfused"
    model_module.invariant_matmul_swiglu, model_module.invariant_matmul_rope_kv = \
        (unfused_swiglu, unfused_rope_kv) if unfused else ENGINE_EPILOGUES


def unfused_swiglu(x, w, pdl=False):  # x [..., K]; w [2I, K] -> [..., I]: the product, then silu_mul's kernel
    from flashspec_torch.invariant_matmul import invariant_matmul
    from flashspec_torch.layers import silu_mul

    return silu_mul(invariant_matmul(x, w, pdl), "triton", pdl)


def unfused_rope_kv(x, w, r, pdl=False):  # x [B, T, K]; r: an invariant_matmul.RopeKV -> q: the product, then rope_kv
    from flashspec_torch.invariant_matmul import invariant_matmul
    from flashspec_torch.layers import rope_kv

    return rope_kv(invariant_matmul(x, w, pdl), r.cos, r.sin, r.positions, r.k_cache, r.v_cache, r.heads, r.kv_heads,
                   "triton", pdl)


def tile_winners(path: Path) -> dict[tuple[int, int], dict[int, dict]]:
    """(N, K) -> M -> the tiling (a dict) of the fastest candidate of ``benchmarks/invariant_tiles_gpu.py``'s
    result at ``path`` that passed every check and keeps the engine's order (``r16`` is the engine's order)."""
    got = json.loads(path.read_text())
    out: dict[tuple[int, int], dict[int, dict]] = {}
    for part in got["parts"]:
        fam, cands = part["families"]["engine"], part["candidates"]["engine"]
        order = cands["r16"]["order"]
        for m, row in fam["timing_us"].items():
            ok = {c: us for c, us in row.items() if c in cands and fam["checks"][c]["pass"] and cands[c]["order"] == order}
            if ok:
                out.setdefault((part["n"], part["k"]), {})[int(m)] = cands[min(ok, key=ok.get)]["tiling"]
    return out


def best_launch(winners: dict, engine):
    """A ``launch_tiling`` that takes the winner measured at the smallest M >= the pass's rows (the largest
    measured M above it) for a product of ``winners``, the engine's launch for any other."""
    from flashspec_torch.invariant_matmul import InvariantTiling

    def launch_tiling(t, m, n, k, gpu=None):
        by_m = winners.get((n, k))
        if not by_m:
            return engine(t, m, n, k, gpu)
        at = min([x for x in by_m if x >= m] or [max(by_m)])
        return InvariantTiling(**by_m[at])
    return launch_tiling


def generate(backend, prompts, seeds, sampling, tokens: int, spec: bool):
    """(new tokens per row, step records)."""
    seed = torch.tensor(seeds, dtype=torch.int64, device=backend.device)
    if spec:
        return speculate(backend, Fixed(), prompts, sampling=sampling, spec=SpecConfig(gamma=4, max_new_tokens=tokens),
                         seed=seed)
    return decode(backend, prompts, sampling=sampling, max_new_tokens=tokens, seed=seed)


def invariance_checks(backend, requests, seeds, samplings, tokens: int, label: str) -> list[dict]:
    """Requests 0-3: alone, in a batch of 16, in a batch of 64 reversed; plain and speculative."""
    checks = []
    big = min(64, len(requests))
    for sampling in samplings:
        runs: dict[str, list[list[int]]] = {}
        for spec in (False, True):
            kind = "spec" if spec else "plain"
            runs[f"alone {kind}"] = [generate(backend, [requests[i]], [seeds[i]], sampling, tokens, spec)[0][0]
                                     for i in range(4)]
            runs[f"batch 16 {kind}"] = generate(backend, requests[:16], seeds[:16], sampling, tokens, spec)[0][:4]
            order = list(range(big))[::-1]
            out = generate(backend, [requests[i] for i in order], [seeds[i] for i in order], sampling, tokens, spec)[0]
            runs[f"batch {big} reversed {kind}"] = [out[order.index(i)] for i in range(4)]
        for i in range(4):
            want = runs["alone plain"][i]
            differ = [name for name, rows in runs.items() if rows[i] != want]
            checks.append(dict(check=f"{label}: request {i}, T={sampling.temperature}: alone == in batches == speculative",
                               differing=differ, tokens=len(want), **{"pass": not differ}))
    return checks


def step_ms(records) -> float:  # mean ms per step, the first (prefill-adjacent) step left out
    return statistics.mean(r.seconds for r in records[1:] or records) * 1e3


def timing(m: Llama, requests, seeds, tokens: int, batches, device: str, winners: dict | None) -> dict:
    """ms per plain token per batch and ms per speculative step at the smallest and largest batch, per mode."""
    out = {}
    for mode in MODES:
        if mode == "invariant_best" and not winners:
            continue
        set_mode(m, mode, winners)
        backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=device == "cuda")
        row = {}
        for b in batches:
            generate(backend, requests[:b], seeds[:b], GREEDY, 8, False)  # compile, capture
            row[f"plain_ms_per_token_b{b}"] = step_ms(generate(backend, requests[:b], seeds[:b], GREEDY, tokens, False)[1])
            if b in (batches[0], batches[-1]):
                generate(backend, requests[:b], seeds[:b], GREEDY, 8, True)
                records = generate(backend, requests[:b], seeds[:b], GREEDY, tokens, True)[1]
                row[f"spec_ms_per_step_b{b}"] = step_ms(records)
                row[f"spec_tokens_per_step_b{b}"] = statistics.mean(r.emitted for r in records) / b
        out[mode] = row
        del backend
    for mode in ("invariant", "invariant_best")[: 1 + bool(winners)]:
        for base in ("default", "cublas", "invariant_unfused"):
            out[f"{mode}_over_{base}"] = {k: out[mode][k] / out[base][k] for k in out[mode] if "_ms_" in k}
    set_mode(m, "invariant")
    return out


def distinct_completions(m: Llama, requests, seeds, tokens: int, runs: int, rng, deadline: float) -> dict:
    """Request 0, greedy, ``runs`` times (a quarter as many in the default mode; alternately plain and
    speculative) inside batches of random size (1-64) and content at a random row (eager): distinct
    completions per mode. No run starts after ``deadline`` (``time.perf_counter()``; the invariant mode's
    runs stop 10 s before it, leaving the default mode's): ``runs`` is the count done."""
    out = {}
    for mode, n_runs, stop in (("invariant", runs, deadline - 10), ("default", max(1, runs // 4), deadline)):
        set_mode(m, mode)
        backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=False)
        seen: dict[tuple, int] = {}
        r = np.random.default_rng(rng.integers(1 << 30))
        done = 0
        for k in range(n_runs):
            if time.perf_counter() > stop:
                break
            done += 1
            size = int(r.integers(1, min(64, len(requests)) + 1))
            others = [int(i) for i in r.choice(np.arange(1, len(requests)), size - 1, replace=False)]
            row = int(r.integers(0, size))
            batch = others[:row] + [0] + others[row:]
            got = generate(backend, [requests[i] for i in batch], [seeds[i] for i in batch], GREEDY, tokens, k % 2 == 1)[0]
            key = tuple(got[row])
            seen[key] = seen.get(key, 0) + 1
        out[mode] = dict(runs=done, distinct=len(seen), counts=sorted(seen.values(), reverse=True))
        del backend
    set_mode(m, "invariant")
    out["pass"] = out["invariant"]["distinct"] == 1 and out["invariant"]["runs"] > 1
    return out


def draw_requests(vocab: int, rng, tiny: bool) -> list[list[int]]:
    """64 random prompts of 8-40 tokens (8 of 8-11 with --tiny)."""
    return [rng.integers(0, vocab, int(rng.integers(8, 41 if not tiny else 12))).tolist() for _ in range(64 if not tiny else 8)]


def shape_setup(name: str, args, rng) -> tuple[Llama, list[list[int]], list[int]]:
    """A random model of the shape and its 64 requests (8 with --tiny) with their seeds."""
    cfg = LlamaConfig(**SHAPES[name], max_position_embeddings=4096)
    m = random_model(cfg, args.device)
    requests = draw_requests(cfg.vocab_size, rng, args.tiny)
    return m, requests, [1000 + i for i in range(len(requests))]


def run_shape(name: str, args, rng, result: dict, save) -> None:
    m, requests, seeds = shape_setup(name, args, rng)
    row = result["shapes"].setdefault(name, {})
    with torch.inference_mode():
        t = time.perf_counter()
        set_mode(m, "invariant")
        backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=args.device == "cuda")
        row["checks"] = invariance_checks(backend, requests, seeds, (GREEDY, SAMPLED), args.tokens, f"{name} invariant")
        if args.before and name == args.shapes[0]:  # the default mode on the first shape only (device time)
            set_mode(m, "default")
            backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=args.device == "cuda")
            row["before"] = invariance_checks(backend, requests, seeds, (GREEDY,), args.tokens, f"{name} default")
            for c in row["before"]:
                c["informational"] = True  # the default mode is not expected to pass
        del backend
        row["checks_s"] = time.perf_counter() - t
        save()
        print(f"{name}: checks {row['checks_s']:.0f} s", flush=True)
        if not over_budget(args, f"{name} timing"):
            t = time.perf_counter()
            batches = (1, 16, 64) if not args.tiny else (1, 4)
            row["timing"] = timing(m, requests, seeds, args.tokens, batches, args.device, args.winners)
            row["timing_s"] = time.perf_counter() - t
            save()
        if not over_budget(args, f"{name} epilogues"):
            row["epilogues"] = epilogue_part(name, SHAPES[name], (1, 5, 16, 64, 65, 320) if not args.tiny else
                                             (1, 5, 17, 70), args.device)
            save()
        if name in args.product_shapes and not over_budget(args, "products"):
            t = time.perf_counter()
            row["products"] = products(SHAPES[name], (1, 16, 64, 320) if not args.tiny else (1, 5, 17, 70), args.device)
            row["attention"] = attention_part(SHAPES[name], (128, 1024, 4096) if not args.tiny else (48, 300), args.device)
            row["products_s"] = time.perf_counter() - t
            save()
    del m
    if args.device == "cuda":
        torch.cuda.empty_cache()


def distinct_part(name: str, args, rng, result: dict, save) -> None:
    """``distinct_completions`` on the first shape's model and requests (made again: the same seeds), last."""
    m, requests, seeds = shape_setup(name, args, np.random.default_rng(0))
    row = result["shapes"].setdefault(name, {})
    with torch.inference_mode():
        t = time.perf_counter()
        row["distinct"] = distinct_completions(m, requests, seeds, args.distinct_tokens, args.distinct, rng,
                                               args.start + args.stop_s)
        row["distinct_s"] = time.perf_counter() - t
    save()
    del m


def real_weights(path: str, args, result: dict, save) -> None:
    """The embedded model's real weights: greedy speculation == greedy plain decoding on the 8
    benchmark prompts (generate_cpu's 4 code + 4 prose), at batch 1 and inside a batch of 16."""
    from flashspec_torch.weights import load
    from generate_cpu import code_prompts, prose_prompts  # benchmarks/ is on sys.path for scripts

    loaded = load(path, torch.bfloat16, args.device)
    m, tok = loaded.model, loaded.tokenizer
    prompts = [tok(p)["input_ids"] for p in code_prompts(4) + prose_prompts(4)]
    prompts16 = prompts + prompts[::-1]
    seeds = list(range(16))
    row = result.setdefault("real_weights", dict(model=loaded.name, prompts=8, tokens=args.real_tokens))
    with torch.inference_mode():
        for mode in ("invariant", "default"):
            set_mode(m, mode)
            backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=args.device == "cuda")
            plain1 = [generate(backend, [p], [0], GREEDY, args.real_tokens, False)[0][0] for p in prompts]
            spec1 = [generate(backend, [p], [0], GREEDY, args.real_tokens, True)[0][0] for p in prompts]
            plain16 = generate(backend, prompts16, seeds, GREEDY, args.real_tokens, False)[0][:8]
            spec16 = generate(backend, prompts16, seeds, GREEDY, args.real_tokens, True)[0][:8]
            row[mode] = dict(spec_equals_plain_b1=sum(a == b for a, b in zip(plain1, spec1)),
                             spec_equals_plain_b16=sum(a == b for a, b in zip(plain16, spec16)),
                             b16_equals_b1=sum(a == b for a, b in zip(plain16, plain1)))
            del backend
    row["pass"] = row["invariant"] == dict(spec_equals_plain_b1=8, spec_equals_plain_b16=8, b16_equals_b1=8)
    save()


def over_budget(args, part: str) -> bool:
    """Whether ``--budget-s`` is spent (the part is then skipped, and named in the JSON's ``skipped``)."""
    if time.perf_counter() - args.start < args.budget_s:
        return False
    args.skipped.append(part)
    return True


def summary(result: dict) -> dict:
    checks = [c for s in result["shapes"].values() for part in ("checks", "products", "attention", "epilogues")
              for c in s.get(part, [])]
    parts = [s["distinct"] for s in result["shapes"].values() if "distinct" in s]
    parts += [result["real_weights"]] if "pass" in result.get("real_weights", {}) else []
    passed = sum(c["pass"] for c in checks) + sum(p["pass"] for p in parts)
    return dict(checks=len(checks) + len(parts), passed=passed, all_pass=passed == len(checks) + len(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--shapes", default="tinyllama-1.1b,smollm2-135m,llama3-8b", help="comma-separated, of " + ", ".join(SHAPES))
    ap.add_argument("--no-before", dest="before", action="store_false",
                    help="skip the default mode's token checks (\"before\") on the first shape")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    ap.add_argument("--distinct", type=int, default=100, help="runs of the distinct-completions part (0: skip)")
    ap.add_argument("--distinct-tokens", type=int, default=32)
    ap.add_argument("--gguf", help="the embedded model's GGUF: adds its real weights on the 8 benchmark prompts")
    ap.add_argument("--real-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small sizes for a CPU test of the script")
    ap.add_argument("--product-shapes", default="llama3-8b", help="shapes whose products are timed alone (comma-separated)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="parts that would start after this many seconds are skipped")
    ap.add_argument("--stop-s", type=float, default=1e9, help="no distinct-completion run starts after this many seconds")
    ap.add_argument("--draws-after", default="", help="comma-separated shapes whose requests are drawn (and dropped) first: "
                    "the shapes' requests as in a run that checked those shapes before them")
    ap.add_argument("--tiles-json", type=Path, help="a result of benchmarks/invariant_tiles_gpu.py on this GPU: adds the "
                    "invariant_best timing mode (its winners); skipped with a note when the file is missing")
    args = ap.parse_args()
    args.winners = tile_winners(args.tiles_json) if args.tiles_json and args.tiles_json.exists() else None
    args.shapes, args.product_shapes = args.shapes.split(","), args.product_shapes.split(",")
    args.start, args.skipped = time.perf_counter(), []
    args.draws_after = [s for s in args.draws_after.split(",") if s]
    unknown = [s for s in args.shapes + args.draws_after if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes {unknown} unknown; choose from {sorted(SHAPES)}")
    cuda = args.device == "cuda"
    result = dict(
        what="issue #40: batch-invariant mode, token identity across batch sizes and with speculation, and its cost",
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name() if cuda else "cpu",
        versions=dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
                      cuda=torch.version.cuda),
        settings=dict(tokens=args.tokens, gamma=4, draft="ngram (fixed)", dtype="bfloat16", sampled_temperature=0.8,
                      distinct_runs=args.distinct, distinct_tokens=args.distinct_tokens, draws_after=args.draws_after,
                      tiles_json=str(args.tiles_json) if args.tiles_json else None,
                      invariant_best={f"{n}x{k}": {m: t for m, t in by_m.items()} for (n, k), by_m in (args.winners or {}).items()}),
        shapes={},
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def save() -> None:
        result["summary"] = summary(result)
        result["elapsed_s"] = time.perf_counter() - start
        args.out.write_text(json.dumps(result, indent=1))

    rng = np.random.default_rng(0)
    for name in args.draws_after:
        draw_requests(SHAPES[name]["vocab_size"], rng, args.tiny)
    result["skipped"] = args.skipped
    for name in args.shapes:
        if over_budget(args, name):
            continue
        run_shape(name, args, rng, result, save)
        print(f"{name}: {result['summary']} after {time.perf_counter() - start:.0f} s", flush=True)
    if args.distinct and not over_budget(args, "distinct"):
        distinct_part(args.shapes[0], args, rng, result, save)
    if args.gguf and not over_budget(args, "real_weights"):
        real_weights(args.gguf, args, result, save)
    save()
    print(json.dumps(result["summary"]), flush=True)


if __name__ == "__main__":
    main()
