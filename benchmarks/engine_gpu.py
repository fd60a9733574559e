"""The torch engine on a GPU with random weights (timing only): model shapes of SmolLM2-135M,
TinyLlama-1.1B and Llama-3-8B, next to transformers' generate on the same shapes, same run.

    python benchmarks/engine_gpu.py [--shapes smollm2,tinyllama] [--tokens 128]   # writes $OUT/engine_gpu.json

Per shape: ms per autoregressive token (FlashSpec's plain decoding and transformers' generate),
ms per speculative step (n-gram draft, G = 4), the time of the target forward alone in each case
(so the share of step time outside the model forwards), host synchronisations per step (counted
with torch.cuda.set_sync_debug_mode), and the weights' memory floor (bytes / copy bandwidth).
bf16. Each engine runs twice: eager (``graphs=False``) and with every step captured in a CUDA
graph (the default on a GPU); the model forwards alone are timed the same way (graph replays over
the same cache length), so "outside the forwards" is what a step adds to the target's forward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from datetime import date
from pathlib import Path

import torch

from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft
from flashspec_torch.model import Llama, LlamaConfig
from verify_kernels import copy_bandwidth_gbps  # benchmarks/ is on sys.path for scripts

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32,
                           num_kv_heads=4, head_dim=64),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                      num_kv_heads=8, head_dim=128, rope_theta=500000.0),
}


# mode: (CUDA graphs, model.linear_impl, model.pdl, model.fused); None: the model's own default by
# device and shape (Llama.decode_settings: on CUDA PDL, and the fused products for one row on the
# projections measured faster). "fused": flashspec_torch.gemv's products with the norms / SwiGLU
# folded in (all five, any row count up to 8: bit-equal rows); pdl: programmatic dependent launch.
# --gemv-configs with a sweep's best_chain adds "graphs_best": that variant (maybe a fused subset).
ALL = frozenset({"qkv", "o", "gate_up", "down", "lm_head"})
MODES = {
    "eager": (False, None, None, None),
    "graphs": (True, None, None, None),
    "graphs_cublas": (True, "reference", False, None),
    "graphs_fused_all_pdl": (True, "fused", True, ALL),
}


class Fixed:
    def choose(self):
        return 0

    def observe(self, *args):
        pass


def random_model(cfg: LlamaConfig) -> Llama:
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Llama(cfg).to(torch.bfloat16)
    for p in m.parameters():
        p.data.normal_(0, 0.02)
    return m.eval().requires_grad_(False)


def graph_ms(fn, reps: int = 50) -> float:
    """Median ms of one replay of ``fn`` captured in a CUDA graph (after an eager warm-up)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def forward_ms(m: Llama, batch: int, tokens: int, context: int, attend: int) -> float:
    """The target forward alone over ``tokens`` new positions after ``context``, graph-replayed."""
    cache = m.new_cache(batch, attend)
    x = torch.randint(0, m.config.vocab_size, (batch, tokens), device="cuda")
    pos = torch.arange(context, context + tokens, device="cuda").expand(batch, -1)
    return graph_ms(lambda: m(x, pos, cache, attend))


def add_forward_costs(r: dict, m: Llama, batch: int, context: int, attend: int, floor_ms: float) -> None:
    """Into a time_engine result: the target forwards alone (1 and 5 new positions after
    ``context``), the shares of the plain and speculative steps outside them, and plain / floor."""
    fwd1, fwd5 = forward_ms(m, batch, 1, context, attend), forward_ms(m, batch, 5, context, attend)
    r.update(forward_1_token_ms=fwd1, forward_5_tokens_ms=fwd5)
    r["ar_share_outside_forward"] = 1 - fwd1 / r["ar_ms_per_token"]
    r["spec_share_outside_forward"] = 1 - fwd5 / r["spec_ms_per_step"]
    r["ar_over_weights_floor"] = r["ar_ms_per_token"] / floor_ms


def count_syncs(fn) -> int:
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def time_engine(backend: TorchBackend, prompts, tokens: int, seed) -> dict:
    """ms per plain token and per speculative step (n-gram, G = 4), after a warm-up that
    compiles the kernels and captures the graphs."""
    greedy = SamplingConfig(0.0)
    decode(backend, prompts, sampling=greedy, max_new_tokens=8, seed=seed)
    speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=8), seed=seed)
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs, rec = decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)
    torch.cuda.synchronize()
    ar_wall = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    souts, srec = speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=tokens), seed=seed)
    torch.cuda.synchronize()
    spec_wall = (time.perf_counter() - t) * 1e3
    # a step's time: from its launch to the next one's (the loop reads results one step late, so
    # in steady state this is the device's step time); the prefill is timed on its own
    ar_ms = statistics.mean(r.seconds for r in rec) * 1e3
    spec_ms = statistics.mean(r.seconds for r in srec) * 1e3
    torch.cuda.synchronize()
    t = time.perf_counter()
    backend.prefill(prompts, tokens)
    torch.cuda.synchronize()
    prefill_ms = (time.perf_counter() - t) * 1e3
    backend.prefill(prompts, 64)
    syncs_ar = count_syncs(lambda: backend.decode_one(greedy, seed, 0))
    backend.prefill(prompts, 64)
    syncs_spec = count_syncs(lambda: backend.step(0, 4, greedy, seed, 0))
    accepted = sum(r.accepted for r in srec) / max(1, sum(r.drafted for r in srec))
    return dict(ar_ms_per_token=ar_ms, spec_ms_per_step=spec_ms, spec_tokens_per_step=sum(r.emitted for r in srec) / len(srec),
                prefill_ms=prefill_ms, ar_wall_ms=ar_wall, spec_wall_ms=spec_wall, ar_tokens_per_s=len(rec) / ar_wall * 1e3,
                spec_tokens_per_s=sum(r.emitted for r in srec) / spec_wall * 1e3,
                spec_acceptance=accepted, host_syncs_per_ar_step=syncs_ar, host_syncs_per_spec_step=syncs_spec,
                outputs=outs, spec_outputs=souts)


def tuned_configs(sweep: dict) -> dict:
    """GEMV_CONFIGS from a gemv_sweep.json: per (n, k, prologue) the fastest 1-row config, and for
    more rows the fastest one with the same block_k (a row's bits then do not depend on the row
    count, so greedy speculation stays token-for-token equal to greedy decoding in bf16)."""
    from flashspec_torch.gemv import GemvConfig

    keys = ("block_n", "block_k", "num_warps", "num_stages", "preload")  # preload: absent from older sweeps
    by_shape: dict = {}
    for r in sweep["gemv"]:
        if r.get("best"):
            by_shape.setdefault((r["n"], r["k"], r["prologue"]), {})[r["m"]] = r
    out = {}
    for (n, k, prologue), rows in by_shape.items():
        if 1 not in rows:
            continue
        block_k = rows[1]["best"]["block_k"]
        for m, r in rows.items():
            same = sorted((c for c in r["configs"] if c.get("us") and c["block_k"] == block_k), key=lambda c: c["us"])
            if same:
                out[(n, k, m, prologue)] = GemvConfig(**{key: same[0][key] for key in keys if key in same[0]})
    return out


def run_shape(name: str, tokens: int, batch: int, prompt_len: int, bw: float, modes: dict) -> dict:
    cfg = LlamaConfig(**SHAPES[name], max_position_embeddings=8192)
    m = random_model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len)).tolist()
    seed = torch.zeros(batch, dtype=torch.int64, device="cuda")
    row = dict(shape=name, batch=batch, prompt_len=prompt_len, new_tokens=tokens, weight_bytes=weight_bytes,
               weights_floor_ms=weight_bytes / bw * 1e3)
    with torch.inference_mode():
        runs = {}
        for mode, (graphs, linear, pdl, fused) in modes.items():
            m.linear_impl, m.pdl, m.fused = linear, pdl, fused
            backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton", graphs=graphs)
            runs[mode] = time_engine(backend, prompts, tokens, seed)
            attend = backend.cache.max_len
            del backend
        ref = runs["graphs_cublas"]["outputs"]
        row["tokens_agree"] = runs["graphs"]["outputs"] == runs["eager"]["outputs"] == runs["graphs"]["spec_outputs"]
        # greedy speculation == greedy decoding per mode (bit-equal logits of 1-row and 5-row passes make it exact
        # in bf16 too), and each mode's tokens against cuBLAS's (bf16 rounding may differ)
        row["spec_equals_plain"] = {mode: r["spec_outputs"] == r["outputs"] for mode, r in runs.items()}
        row["equals_cublas_tokens"] = {mode: r["outputs"] == ref for mode, r in runs.items()}
        ctx = prompt_len + tokens // 2
        for mode, r in runs.items():
            m.linear_impl, m.pdl, m.fused = modes[mode][1:]
            del r["outputs"], r["spec_outputs"]
            add_forward_costs(r, m, batch, ctx, attend, row["weights_floor_ms"])
            row[mode] = r
        m.linear_impl = m.pdl = m.fused = None
        row["attend_slots"] = attend
    row.update(hf_generate(cfg, m, prompts, tokens))
    del m
    torch.cuda.empty_cache()
    return row


def hf_generate(cfg: LlamaConfig, ours: Llama, prompts, tokens: int) -> dict:
    try:
        import transformers
        from transformers import LlamaConfig as HFConfig
        from transformers import LlamaForCausalLM
    except ImportError as e:
        return dict(hf_error=str(e))
    hc = HFConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                  head_dim=cfg.head_dim, tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=8192)
    with torch.device("cuda"):
        hf = LlamaForCausalLM(hc).to(torch.bfloat16).eval()
    ids = torch.tensor(prompts, device="cuda")
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3 / tokens
    del hf
    return dict(hf_generate_ms_per_token=ms, transformers=transformers.__version__)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,tinyllama-1.1b,llama3-8b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gemv-configs", type=Path, default=None,
                    help="a benchmarks/gemv_sweep.py JSON: its tuned tilings for the fused products")
    args = ap.parse_args()
    tuned, modes = {}, dict(MODES)
    if args.gemv_configs is not None:
        from flashspec_torch.gemv import GEMV_CONFIGS

        sweep = json.loads(args.gemv_configs.read_text())
        tuned = tuned_configs(sweep)
        GEMV_CONFIGS.update(tuned)
        best = sweep.get("best_chain")
        if best:  # the sweep's fastest whole-forward variant (its fused subset, PDL or not)
            modes["graphs_best"] = (True, best["linear_impl"], best["pdl"], frozenset(best["fused"]) if best["linear_impl"] == "fused" else ALL)
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    bw = copy_bandwidth_gbps("cuda") * 1e9
    rows = []
    for name in args.shapes.split(","):
        for batch in map(int, args.batch.split(",")):
            try:
                rows.append(run_shape(name, args.tokens, batch, args.prompt_len, bw, modes))
            except Exception as e:  # one shape failing must not lose the others
                rows.append(dict(shape=name, batch=batch, error=f"{type(e).__name__}: {e}"[:500]))
            print(json.dumps(rows[-1]), flush=True)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=str(date.today()),
                  copy_bandwidth_GBs=bw / 1e9, dtype="bfloat16", rows=rows,
                  gemv_configs={",".join(map(str, key)): vars(c) for key, c in tuned.items()},
                  graphs_best=None if "graphs_best" not in modes else dict(zip(("linear_impl", "pdl"), modes["graphs_best"][1:3]),
                                                                           fused=sorted(modes["graphs_best"][3])),
                  command="python benchmarks/engine_gpu.py" + (f" --gemv-configs {args.gemv_configs}" if tuned else ""))
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_gpu.json").write_text(json.dumps(result, indent=1))
    print("shape B | floor ms | mode | AR ms/token | x floor | fwd1 | outside | spec ms/step | fwd5 | outside | tok/step | HF ms | agree")
    for r in rows:
        if "error" in r:
            print(r["shape"], r["batch"], r["error"][:200])
            continue
        for mode in modes:
            g = r[mode]
            print(f"{r['shape']} {r['batch']} | {r['weights_floor_ms']:.3f} | {mode} | {g['ar_ms_per_token']:.3f} | "
                  f"{g['ar_over_weights_floor']:.2f} | {g['forward_1_token_ms']:.3f} | {g['ar_share_outside_forward']:.1%} | "
                  f"{g['spec_ms_per_step']:.3f} | {g['forward_5_tokens_ms']:.3f} | {g['spec_share_outside_forward']:.1%} | "
                  f"{g['spec_tokens_per_step']:.2f} | {r.get('hf_generate_ms_per_token', float('nan')):.3f} | {r['spec_equals_plain'][mode]}")

if __name__ == "__main__":
    main()
