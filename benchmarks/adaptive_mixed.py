"""A mixed stream served with several drafts (issue #35): requests of three domains interleaved (code editing
with long repeats, chat, prose), one batch of rows per request, one adaptive policy kept across the stream
(as a server keeps it), against every single fixed (draft, G) and plain decoding over the whole stream.

Two kinds of stream:

* random weights of a named shape (``adaptive_bench.SHAPES``; the GPU run), so the acceptance is
  controlled: two ``replay`` drafts (``adaptive_bench.ReplayDraft``) propose plain decoding's own
  continuation, each kept with a per-domain probability (``KEEP``): "code" is good on code requests
  (long repeats), "chat" on chat requests, neither on prose. No n-gram draft: greedy decoding of
  random weights falls into loops, so its acceptance follows the looping, not the domain;
* ``--model embedded`` (the CPU run): SmolLM2-135M-Instruct's real weights and real prompts of the three
  domains (``drafts_common``: the first half of standard-library functions to continue, chat requests
  through the chat template, documentation prose), served with two lookup drafts (the n-gram lookup
  matching the last 3 .. 1 tokens, and one matching the last token alone).

Greedy, so every configuration must emit plain decoding's tokens (the fraction of rows equal is reported:
in bf16 a near-tie can round differently, see adaptive_bench).

    python benchmarks/adaptive_mixed.py --model smollm2-135m --batch 64 --out $OUT/adaptive_mixed.json  # H100, fp32
    python benchmarks/adaptive_mixed.py --device cpu --model embedded --batch 1 --requests 6 --tokens 32 \
        --out benchmarks/results/adaptive_mixed_cpu.json                                              # CPU, < 2 min

Checks (pass/fail in the JSON): adaptive >= 1.15 x the best single fixed (draft, G) over the stream;
adaptive >= 1.0 x plain over the stream and in each domain; every configuration's tokens equal plain's.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "shared"), str(ROOT), str(ROOT / "benchmarks")]

from adaptive_bench import GREEDY, LENGTHS, Fixed, ReplayDraft, load_model, rows_equal, timed  # noqa: E402
from flashspec.adaptive import AdaptivePolicy, make_arms  # noqa: E402
from flashspec.adaptive_loop import speculate_adaptive, use_free_scoring  # noqa: E402
from flashspec.loop import SpecConfig, decode_steps, speculate_steps  # noqa: E402
from flashspec_torch.backend import TorchBackend  # noqa: E402
from flashspec_torch.drafts import LookupDraft  # noqa: E402

DOMAINS = ("code", "chat", "prose")
KEEP = {"code": {"code": 0.95, "chat": 0.05}, "chat": {"code": 0.05, "chat": 0.7}, "prose": {"code": 0.05, "chat": 0.05}}


def reference(prompts, outputs, width: int) -> torch.Tensor:  # [B, width]: prompt + plain decoding's tokens
    ref = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        ref[i, : len(p) + len(o)] = torch.tensor(p + o)
    return ref


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--requests", type=int, default=9, help="requests in the stream (domains in turn)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--budget-s", type=float, default=1e9, help="serve no new request after this many seconds")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="random weights' dtype: in bf16 a row's greedy tokens drift from plain decoding's at a "
                         "near-tie (scoring G + 1 positions rounds differently), and the replay drafts, which "
                         "replay plain decoding, then miss for the rest of the row")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    start = time.perf_counter()
    doc = dict(command="python " + " ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
               torch=torch.__version__, triton=version("triton"), python=platform.python_version(),
               model=args.model, batch=args.batch, tokens_per_row=args.tokens, lengths=LENGTHS, dtype=args.dtype,
               keep=None if args.model == "embedded" else KEEP,
               complete=False, requests=[])
    with torch.inference_mode():
        serve(args, device, doc, start)


class RandomStream:
    """Random prompts on random weights; the replay drafts' acceptance set per request's domain."""

    def __init__(self, model, args, device):
        self.b, self.vocab, self.prompt_len = args.batch, model.config.vocab_size, args.prompt_len
        self.width = args.prompt_len + args.tokens + 80
        blank = torch.zeros((self.b, self.width), dtype=torch.int64, device=device)
        self.drafts = [ReplayDraft(blank, 0.0, self.vocab, "code", 1), ReplayDraft(blank, 0.0, self.vocab, "chat", 2)]
        self.device = device

    def prompts(self, i: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(i + 1)
        return torch.randint(0, self.vocab, (self.b, self.prompt_len), generator=g).tolist()

    def before(self, i: int, prompts, ref_out) -> None:
        ref = reference(prompts, ref_out, self.width).to(self.device)
        for k, d in enumerate(self.drafts):
            d.load(ref, KEEP[DOMAINS[i % len(DOMAINS)]][d.name], seed=100 * i + k)


class EmbeddedStream:
    """Real prompts of the three domains on the embedded model; two lookups (the last 3 .. 1 tokens matched, and
    the last token alone). A model draft (the layer-skip self-draft) costs this 2-core CPU minutes a stream."""

    def __init__(self, args, device):
        from drafts_common import prompts as domain_prompts
        from flashspec_torch.engine import Engine

        eng = Engine(None, ("ngram",), device=str(device))
        self.model = eng.target.model
        self.drafts = [LookupDraft("ngram"), LookupDraft("ngram1", max_n=1)]
        per = -(-args.requests // len(DOMAINS))
        texts = {d: domain_prompts(d, 0, per * args.batch) for d in DOMAINS}
        self.requests = [[eng.encode(t, d == "chat") for t in texts[d][(i // len(DOMAINS)) * args.batch:][:args.batch]]
                         for i, d in ((i, DOMAINS[i % len(DOMAINS)]) for i in range(args.requests))]

    def prompts(self, i: int) -> list[list[int]]:
        return self.requests[i]

    def before(self, i: int, prompts, ref_out) -> None:
        pass


def serve(args, device, doc: dict, start: float) -> None:
    if args.model == "embedded":
        stream = EmbeddedStream(args, device)
        model = stream.model
    else:
        model, *_ = load_model(args.model, device, getattr(torch, args.dtype))
        stream = RandomStream(model, args, device)
    b, tokens, drafts = args.batch, args.tokens, stream.drafts
    seed = torch.zeros(b, dtype=torch.int64, device=device) if device.type == "cuda" else 0
    plain_backend = TorchBackend(model, [LookupDraft()], eos_ids=[])
    backend = TorchBackend(model, drafts, eos_ids=[])
    policy = AdaptivePolicy(make_arms(len(drafts), LENGTHS), len(drafts), rng=0)
    names = [f"{d.name}:G{g}" for d in drafts for g in LENGTHS]
    prompts = stream.prompts(0)
    for bk, frees in ((plain_backend, (0,)), (backend, (0, max(LENGTHS)))):  # every step kind made ready first
        for free in frees:
            bk.score_free(free)
            for g in LENGTHS:
                bk.prefill(prompts, tokens)
                bk.prepare(g, GREEDY)
    plain = lambda rec: decode_steps(plain_backend, sampling=GREEDY, max_new_tokens=tokens, seed=seed, first_offset=0,
                                     on_step=None, records=rec)
    timed(plain_backend, prompts, tokens, plain)  # warm-up
    for i in range(args.requests):
        if time.perf_counter() - start > args.budget_s:
            doc["stopped"] = f"--budget-s {args.budget_s} spent after {i} requests"
            break
        domain = DOMAINS[i % len(DOMAINS)]
        prompts = stream.prompts(i)
        ref_out, plain_s, _ = timed(plain_backend, prompts, tokens, plain)
        stream.before(i, prompts, ref_out)
        row = dict(request=i, domain=domain, plain_s=plain_s, fixed_s={}, tokens_equal={})
        backend.score_free(0)
        for d in range(len(drafts)):
            for g in LENGTHS:
                run = lambda rec, d=d, g=g: speculate_steps(backend, Fixed(d), sampling=GREEDY, spec=SpecConfig(g, tokens),
                                                           seed=seed, first_offset=0, on_step=None, records=rec)
                out, s, _ = timed(backend, prompts, tokens, run)
                row["fixed_s"][f"{drafts[d].name}:G{g}"] = s
                row["tokens_equal"][f"{drafts[d].name}:G{g}"] = rows_equal(out, ref_out)
        use_free_scoring(backend, policy)
        run = lambda rec: speculate_adaptive(backend, policy, sampling=GREEDY, spec=SpecConfig(max(LENGTHS), tokens),
                                             seed=seed, rows=b, records=rec)
        out, s, rec = timed(backend, prompts, tokens, run)
        row.update(adaptive_s=s, adaptive_steps=pulls(rec, drafts))
        row["tokens_equal"]["adaptive"] = rows_equal(out, ref_out)
        doc["requests"].append(row)
        print(json.dumps({k: row[k] for k in ("request", "domain", "adaptive_steps")}), flush=True)
        summarize(doc, names, b * tokens)
        write(args.out, doc, start)
    doc["complete"] = "stopped" not in doc
    write(args.out, doc, start)


def pulls(records, drafts) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        name = "plain" if r.arm < 0 else f"{drafts[r.arm].name}:G{r.drafted // max(r.rows, 1)}"
        out[name] = out.get(name, 0) + 1
    return out


def summarize(doc: dict, names: list[str], new_per_request: int) -> None:
    """Stream tokens/s per configuration, per domain, and the checks."""
    reqs = doc["requests"]

    def tps(key, rows):
        return new_per_request * len(rows) / sum(r[key] if isinstance(key, str) else r["fixed_s"][key[0]] for r in rows)

    configs = {"plain": "plain_s", "adaptive": "adaptive_s", **{n: (n,) for n in names}}
    doc["tokens_per_s"] = {c: tps(k, reqs) for c, k in configs.items()}
    doc["by_domain"] = {dom: {c: tps(k, rows) for c, k in configs.items()}
                        for dom in DOMAINS if (rows := [r for r in reqs if r["domain"] == dom])}
    best = max(names, key=lambda n: doc["tokens_per_s"][n])
    t = doc["tokens_per_s"]
    doc["best_fixed"] = best
    doc["checks"] = {
        "adaptive_vs_best_fixed": t["adaptive"] / t[best],
        "adaptive_ge_1.15_best_fixed": t["adaptive"] >= 1.15 * t[best],
        "adaptive_vs_plain": t["adaptive"] / t["plain"],
        "adaptive_ge_plain": t["adaptive"] >= t["plain"],
        "adaptive_ge_plain_each_domain": all(v["adaptive"] >= v["plain"] for v in doc["by_domain"].values()),
        "tokens_equal_plain": all(v == 1.0 for r in reqs for v in r["tokens_equal"].values()),
    }


def write(out: Path, doc: dict, start: float) -> None:
    doc["seconds"] = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
