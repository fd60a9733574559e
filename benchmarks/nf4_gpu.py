"""NF4 (bitsandbytes) on a GPU with random weights: the NF4 self-draft of a bf16 target, and the
NF4 copy as the target itself, in the torch engine (timing and exactness; random weights, so the
acceptance says little about a real model's: see docs/drafts.md for the embedded model's).

    python benchmarks/nf4_gpu.py [--shapes smollm2-135m,tinyllama-1.1b] [--tokens 128]   # writes $OUT/nf4_gpu.json

Per shape, each engine with CUDA graphs and eagerly: ms per plain token, ms per speculative step
(draft: NF4 self-draft, G = 4, greedy), tokens per step, host synchronisations per step, and
whether greedy speculation gave plain decoding's tokens. The NF4 layers' own check: their product
against the dequantized weights' F.linear.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date
from pathlib import Path

import torch

from engine_gpu import SHAPES, random_model, time_engine  # benchmarks/ is on sys.path for scripts
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, ModelDraft
from flashspec_torch.model import LlamaConfig
from flashspec_torch.nf4 import NF4Linear, quantize_nf4


def check_layer(m) -> float:
    """Max |NF4Linear(x) - x W_deq^T| / max |x W_deq^T| over a few rows, first block's qkv."""
    layer = m.layers[0].qkv
    assert isinstance(layer, NF4Linear)
    x = torch.randn(5, layer.in_features, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), layer.dequantized().float())
    got = torch.cat([layer(x[i : i + 1]) for i in range(5)]).float()  # one row at a time: bnb's GEMV path
    return float((got - want).abs().max() / want.abs().max())


def run_engine(target, drafts, prompts, tokens: int, seed, graphs: bool) -> dict:
    b = TorchBackend(target, drafts, graphs=graphs)
    try:
        r = time_engine(b, prompts, tokens, seed)
    except Exception as e:  # reported, not hidden: e.g. a kernel that cannot be captured
        return {"error": f"{type(e).__name__}: {e}"[:400]}
    outs, souts = r.pop("outputs"), r.pop("spec_outputs")
    r["spec_equals_plain"] = outs == souts
    r["graphs"] = graphs
    return r | {"_outputs": outs}


def run_shape(name: str, tokens: int) -> dict:
    cfg = LlamaConfig(**SHAPES[name], max_position_embeddings=8192)
    m = random_model(cfg)
    t = time.perf_counter()
    q = quantize_nf4(m)
    torch.cuda.synchronize()
    quantize_s = time.perf_counter() - t
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (128,), generator=g).tolist()]
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    row = {"shape": name, "quantize_s": quantize_s, "nf4_layer_rel_error": check_layer(q),
           "nf4_weight_bytes": sum(b.numel() * b.element_size() for n, b in q.named_buffers() if "packed" in n)}
    for graphs in (True, False):
        key = "graphs" if graphs else "eager"
        bf16 = run_engine(m, [ModelDraft("nf4", q)], prompts, tokens, seed, graphs)
        nf4_target = run_engine(q, [LookupDraft()], prompts, tokens, seed, graphs)
        plain_bf16 = bf16.pop("_outputs", None)
        nf4_target.pop("_outputs", None)
        row[key] = {"bf16_target_nf4_draft": bf16, "nf4_target_ngram_draft": nf4_target}
        if plain_bf16 is not None:
            row[key]["bf16_target_nf4_draft"]["greedy_tokens_first_16"] = plain_bf16[0][:16]
    print(json.dumps(row, indent=1), flush=True)
    del m, q
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2-135m,tinyllama-1.1b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("nf4_gpu.py needs a CUDA GPU (the CPU figures are in benchmarks/drafts_by_domain.py)")
    import bitsandbytes

    with torch.inference_mode():
        rows = [run_shape(s, args.tokens) for s in args.shapes.split(",")]
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__,
           "date": date.today().isoformat(), "dtype": "bfloat16", "batch": 1, "prompt_len": 128,
           "new_tokens": args.tokens, "gamma": 4, "sampling": "greedy", "random_weights": True,
           "command": f"python benchmarks/nf4_gpu.py --shapes {args.shapes} --tokens {args.tokens}", "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nf4_gpu.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
