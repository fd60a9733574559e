"""Tokens per second on the CPU: FlashSpec (plain and speculative) next to transformers' generate
and assisted generation, on the embedded SmolLM2-135M-Instruct, same machine, same run.

Prompts: code (the start of functions from Python's standard library sources, to be continued)
and prose (the start of pydoc_data topics, to be continued). Greedy decoding, so every method
must produce the same tokens; the script checks that they do and records any mismatch.

    python benchmarks/generate_cpu.py --prompts 4 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch


def code_prompts(k: int) -> list[str]:
    import json.decoder
    import textwrap
    import argparse as ap_module
    import collections

    funcs = [textwrap.TextWrapper._wrap_chunks, json.decoder.JSONDecoder.raw_decode,
             ap_module.ArgumentParser.parse_known_args, collections.Counter.most_common,
             textwrap.dedent, json.decoder.py_scanstring]
    out = []
    for f in funcs[:k]:
        src = inspect.getsource(f)
        out.append(src[: len(src) // 2])
    return out


def prose_prompts(k: int) -> list[str]:
    from pydoc_data.topics import topics

    names = ["assert", "assignment", "exceptions", "for", "function", "import"]
    return [topics[n][:700] for n in names[:k]]


def to_transformers(loaded):
    """A transformers LlamaForCausalLM holding our model's weights (split back to HF names)."""
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    c = loaded.model.config
    hf = LlamaForCausalLM(HFConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_word_embeddings, max_position_embeddings=c.max_position_embeddings,
        bos_token_id=c.bos_token_id, eos_token_id=list(c.eos_token_ids) or None,
    ))
    m = loaded.model
    sd = {"model.embed_tokens.weight": m.embed.weight, "model.norm.weight": m.norm}
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i, layer in enumerate(m.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = layer.qkv.weight.split([q, kv, kv])
        gate, up = layer.gate_up.weight.chunk(2)
        sd.update({p + "self_attn.q_proj.weight": wq, p + "self_attn.k_proj.weight": wk,
                   p + "self_attn.v_proj.weight": wv, p + "self_attn.o_proj.weight": layer.o.weight,
                   p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                   p + "mlp.down_proj.weight": layer.down.weight,
                   p + "input_layernorm.weight": layer.attn_norm, p + "post_attention_layernorm.weight": layer.mlp_norm})
    if not c.tie_word_embeddings:
        sd["lm_head.weight"] = m.lm_head.weight
    hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    if c.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def time_ours(engine, prompt: str, max_new: int, speculation: bool, gamma: int) -> tuple[list[int], dict]:
    out = engine.generate(prompt, temperature=0.0, max_new_tokens=max_new, speculation=speculation, gamma=gamma, chat=False)
    return out["tokens"], out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_hf(hf, tok, prompt: str, max_new: int, **kw) -> tuple[list[int], float]:
    """transformers' greedy generate on ``prompt`` (on the model's device): new tokens, seconds."""
    ids = tok(prompt, return_tensors="pt").input_ids.to(hf.device)
    sync(hf.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                          pad_token_id=tok.pad_token_id or 0, **kw)
    sync(hf.device)
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def trim(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4, help="prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/generate_cpu.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from flashspec_torch.engine import Engine
    from flashspec_torch.weights import load

    target = load(None)
    tok = target.tokenizer
    engines = {
        "ngram": Engine(target, ("ngram",), policy="fixed", device="cpu"),
        "bandit[ngram,layerskip]": Engine(target, ("ngram", "layerskip:24-29"), policy="thompson-token", device="cpu"),
    }
    hf = to_transformers(target)
    eos = set(target.model.config.eos_token_ids)
    domains = {"code": code_prompts(args.prompts), "prose": prose_prompts(args.prompts)}
    for eng in engines.values():
        eng.generate("warm up", max_new_tokens=4, chat=False, temperature=0.0)
    time_hf(hf, tok, "warm up", 4)
    rows = []
    for domain, prompts in domains.items():
        for i, prompt in enumerate(prompts):
            # The first prefill at a new length pays one-time CPU costs (about 0.3-1 s here: GEMM
            # shapes seen for the first time) that the next stack to run that length then skips:
            # both stacks see each prompt once, untimed, before either is timed on it.
            engines["ngram"].generate(prompt, max_new_tokens=1, chat=False, temperature=0.0, speculation=False)
            time_hf(hf, tok, prompt, 1)
            ref, res = time_ours(engines["ngram"], prompt, args.max_new_tokens, False, args.gamma)
            n = len(ref)
            rows.append(dict(domain=domain, prompt=i, method="flashspec plain", tokens=n, seconds=res["wall_s"], same=True))
            for name, eng in engines.items():
                got, res = time_ours(eng, prompt, args.max_new_tokens, True, args.gamma)
                rows.append(dict(domain=domain, prompt=i, method=f"flashspec spec {name}", tokens=len(got),
                                 seconds=res["wall_s"], same=got == ref, acceptance=res["acceptance"],
                                 arm_pulls=res["arm_pulls"]))
            got, sec = time_hf(hf, tok, prompt, args.max_new_tokens)
            rows.append(dict(domain=domain, prompt=i, method="transformers generate", tokens=len(trim(got, eos)),
                             seconds=sec, same=trim(got, eos) == ref))
            got, sec = time_hf(hf, tok, prompt, args.max_new_tokens, prompt_lookup_num_tokens=args.gamma)
            rows.append(dict(domain=domain, prompt=i, method="transformers prompt-lookup (assisted)",
                             tokens=len(trim(got, eos)), seconds=sec, same=trim(got, eos) == ref))
            print(json.dumps(rows[-5:]), flush=True)
    summary = {}
    for r in rows:
        key = f"{r['domain']} | {r['method']}"
        s = summary.setdefault(key, {"tokens": 0, "seconds": 0.0, "all_same": True})
        s["tokens"] += r["tokens"]
        s["seconds"] += r["seconds"]
        s["all_same"] &= r["same"]
    for s in summary.values():
        s["tokens_per_s"] = s["tokens"] / s["seconds"]
    result = {
        "command": f"python benchmarks/generate_cpu.py --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
                   f"--gamma {args.gamma}" + (f" --threads {args.threads}" if args.threads else ""),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, {platform.system()}",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": str(date.today()),
        "model": "SmolLM2-135M-Instruct (embedded GGUF, de-quantized to fp32)",
        "decoding": "greedy",
        "summary": summary,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for k, s in summary.items():
        print(f"{k:<60} {s['tokens_per_s']:7.2f} tok/s  same tokens: {s['all_same']}")


if __name__ == "__main__":
    main()
