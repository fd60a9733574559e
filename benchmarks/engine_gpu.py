"""The torch engine on a GPU with random weights (timing only): model shapes of SmolLM2-135M,
TinyLlama-1.1B and Llama-3-8B, next to transformers' generate on the same shapes, same run.

    python benchmarks/engine_gpu.py [--shapes smollm2,tinyllama] [--tokens 128]   # writes $OUT/engine_gpu.json

Per shape: ms per autoregressive token (FlashSpec's plain decoding and transformers' generate),
ms per speculative step (n-gram draft, G = 4), the time of the target forward alone in each case
(so the share of step time outside the model forwards), host synchronisations per step (counted
with torch.cuda.set_sync_debug_mode), and the weights' memory floor (bytes / copy bandwidth).
Eager execution (no CUDA graphs yet), bf16.
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


def forward_ms(m: Llama, batch: int, tokens: int, context: int) -> float:
    cache = m.new_cache(batch, context + tokens + 8)
    x = torch.randint(0, m.config.vocab_size, (batch, tokens), device="cuda")
    pos = torch.arange(context, context + tokens, device="cuda").expand(batch, -1)
    for _ in range(3):
        m(x, pos, cache, context + tokens)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        m(x, pos, cache, context + tokens)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def count_syncs(fn) -> int:
    torch.cuda.set_sync_debug_mode(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def run_shape(name: str, tokens: int, batch: int, prompt_len: int, bw: float) -> dict:
    cfg = LlamaConfig(**SHAPES[name], max_position_embeddings=8192)
    m = random_model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len)).tolist()
    greedy = SamplingConfig(0.0)
    backend = TorchBackend(m, [LookupDraft()], eos_ids=[], verify_impl="triton")
    seed = torch.zeros(batch, dtype=torch.int64, device="cuda")
    with torch.inference_mode():
        decode(backend, prompts, sampling=greedy, max_new_tokens=8, seed=seed)  # warm-up (compiles the kernels)
        speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=8), seed=seed)
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs, rec = decode(backend, prompts, sampling=greedy, max_new_tokens=tokens, seed=seed)
        torch.cuda.synchronize()
        ar_ms = (time.perf_counter() - t) * 1e3 / len(rec)
        t = time.perf_counter()
        souts, srec = speculate(backend, Fixed(), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=tokens), seed=seed)
        torch.cuda.synchronize()
        spec_ms = (time.perf_counter() - t) * 1e3 / len(srec)
        same = outs == souts
        ctx = prompt_len + tokens // 2
        fwd1, fwd5 = forward_ms(m, batch, 1, ctx), forward_ms(m, batch, 5, ctx)
        backend.prefill(prompts, 64)
        syncs_ar = count_syncs(lambda: backend.decode_one(greedy, seed, 0))
        backend.prefill(prompts, 64)
        def one_step():
            p = backend.draft(0, 4, greedy, seed, 0)
            backend.commit(backend.verify(backend.score(p), p, greedy, seed, 0))
        syncs_spec = count_syncs(one_step)
    row = dict(shape=name, batch=batch, prompt_len=prompt_len, new_tokens=tokens, weight_bytes=weight_bytes,
               weights_floor_ms=weight_bytes / bw * 1e3, ar_ms_per_token=ar_ms, forward_1_token_ms=fwd1,
               ar_share_outside_forward=1 - fwd1 / ar_ms, spec_ms_per_step=spec_ms, forward_5_tokens_ms=fwd5,
               spec_share_outside_forward=1 - fwd5 / spec_ms, spec_acceptance=sum(r.accepted for r in srec) / max(1, sum(r.drafted for r in srec)),
               spec_equals_ar=same, host_syncs_per_ar_step=syncs_ar, host_syncs_per_spec_step=syncs_spec)
    row.update(hf_generate(cfg, m, prompts, tokens))
    del m, backend
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
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    bw = copy_bandwidth_gbps("cuda") * 1e9
    rows = []
    for name in args.shapes.split(","):
        try:
            rows.append(run_shape(name, args.tokens, args.batch, args.prompt_len, bw))
        except Exception as e:  # one shape failing must not lose the others
            rows.append(dict(shape=name, error=f"{type(e).__name__}: {e}"[:500]))
        print(json.dumps(rows[-1]), flush=True)
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, date=str(date.today()),
                  copy_bandwidth_GBs=bw / 1e9, dtype="bfloat16", execution="eager (no CUDA graphs)", rows=rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_gpu.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
