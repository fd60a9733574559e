"""Which layers of SmolLM2 to skip for a self-draft, chosen by measurement.

For each candidate skip set S, the agreement is the fraction of positions where the skipping
model's greedy next token equals the full model's, teacher-forced over the same mixed text (code,
prose and chat: each the full model's own greedy continuation of a held-out prompt, so the text is
what the draft will face). With per-token agreement a and the cost c(S) of one draft token relative
to one plain decoding step, the greedy speculative gain at speculation length G is
estimated as E[emitted per step] / (G c(S) + c_verify) with E = (1 - a^(G+1)) / (1 - a).
At batch 1 a forward reads every weight it uses once, so c(S) is the parameter count kept
(head + embedding + unskipped layers) over the full count; c_verify is the measured ratio of a
(G+1)-token forward to a 1-token forward (timings on a shared machine are noisy: the JSON keeps
them, and ``--rescore`` recomputes the gains of a saved search without running the model).

Candidates: contiguous blocks (odd starts, lengths 2, 4, 6, 8, 12), every-other layers over ranges, and
greedy removal (remove, one at a time, the layer whose removal keeps the agreement highest).
The best by estimated gain is shipped as ``layerskip``'s default (flashspec.drafts.layerskip_layers: the layer at 5/6 of the depth).

    python benchmarks/drafts_layerskip_search.py --per-domain 2 --new-tokens 32 --greedy-steps 6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from drafts_common import DOMAINS, machine, prompts  # noqa: E402


def build_text(engine, per_domain: int, new_tokens: int, context: int) -> list[list[int]]:
    """Held-out prompts (index 4.. for code/prose, 6.. for chat), each cut to its last `context`
    tokens and followed by the full model's greedy continuation."""
    seqs = []
    for domain in DOMAINS:
        first = 6 if domain == "chat" else 4
        for p in prompts(domain, first, per_domain):
            ids = engine.encode(p, chat=domain == "chat")
            out = engine.generate(p, temperature=0.0, max_new_tokens=new_tokens, speculation=False, chat=domain == "chat")
            seqs.append(ids[-context:] + out["tokens"])
    return seqs


class Scorer:
    """Greedy next tokens of the model with layers skipped, over a fixed batch of sequences."""

    def __init__(self, model, seqs: list[list[int]], skip_first: int):
        self.model = model
        t = max(map(len, seqs))
        self.tokens = torch.zeros(len(seqs), t, dtype=torch.int64)
        self.valid = torch.zeros(len(seqs), t, dtype=torch.bool)
        for i, s in enumerate(seqs):
            self.tokens[i, : len(s)] = torch.tensor(s)
            self.valid[i, skip_first : len(s)] = True  # right padding never reaches earlier positions
        self.positions = torch.arange(t)[None].expand(len(seqs), -1)
        self.cache = model.new_cache(len(seqs), t)
        self.reference = self.next_tokens(frozenset())

    def next_tokens(self, skip: frozenset[int]) -> torch.Tensor:  # [N] over the valid positions
        z = self.model(self.tokens, self.positions, self.cache, self.tokens.shape[1], skip=skip)
        return z.argmax(-1)[self.valid]

    def agreement(self, skip: frozenset[int]) -> float:
        return (self.next_tokens(skip) == self.reference).float().mean().item()


def time_forward(model, tokens: int, skip: frozenset[int], reps: int) -> float:
    """Median seconds of one decoding forward of `tokens` new tokens after a 64-token context."""
    cache = model.new_cache(1, 64 + tokens)
    ctx = torch.randint(0, model.config.vocab_size, (1, 64))
    model(ctx, torch.arange(64)[None], cache, 64, logits_last=0)
    x = torch.randint(0, model.config.vocab_size, (1, tokens))
    pos = 64 + torch.arange(tokens)[None]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        model(x, pos, cache, 64 + tokens, skip=skip)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def expected_emitted(a: float, g: int) -> float:
    return g + 1.0 if a >= 1.0 else (1 - a ** (g + 1)) / (1 - a)


def layer_params(model) -> int:
    return sum(p.numel() for p in model.layers[0].parameters())


def head_params(model) -> int:
    return model.embed.weight.numel() + model.norm.numel()


class CostModel:
    def __init__(self, per_layer: int, head: int, verify_ratio: float, num_layers: int = 30):
        self.per_layer, self.head, self.verify_ratio, self.num_layers = per_layer, head, verify_ratio, num_layers

    def entry(self, name: str, skip, a: float, g: int) -> dict:
        c = (self.head + (self.num_layers - len(skip)) * self.per_layer) / (self.head + self.num_layers * self.per_layer)
        gain = expected_emitted(a, g) / (g * c + self.verify_ratio)
        return {"name": name, "spelling": f"layerskip:{spell(skip)}", "skipped": len(skip),
                "agreement": a, "draft_cost": c, "estimated_gain": gain}


def candidates_fixed(num_layers: int) -> dict[str, frozenset[int]]:
    out = {}
    for length in (2, 4, 6, 8, 12):
        for start in range(1, num_layers - length, 2):
            out[f"block {start}-{start + length - 1}"] = frozenset(range(start, start + length))
    for lo, hi in [(1, 29), (4, 26), (10, 28), (16, 28), (20, 28)]:
        for parity in (0, 1):
            layers = frozenset(i for i in range(lo, hi) if i % 2 == parity)
            out[f"every-other {lo}-{hi - 1} parity {parity}"] = layers
    return out


def greedy_removal(scorer: Scorer, num_layers: int, steps: int, log) -> list[dict]:
    skip: frozenset[int] = frozenset()
    path = []
    for _ in range(steps):
        best = max(
            ((scorer.agreement(skip | {i}), i) for i in range(num_layers) if i not in skip),
            key=lambda t: (t[0], -t[1]),
        )
        skip = skip | {best[1]}
        path.append({"skip": sorted(skip), "agreement": best[0]})
        log(f"greedy removal: +{best[1]:>2} -> {len(skip)} layers skipped, agreement {best[0]:.3f}")
    return path


def spell(skip) -> str:
    """{3, 4, 5, 9} -> '3-5,9' (what layerskip: parses)."""
    s, parts, i = sorted(skip), [], 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(f"{s[i]}-{s[j]}" if j > i else f"{s[i]}")
        i = j + 1
    return ",".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--context", type=int, default=40, help="prompt tokens kept before each continuation")
    ap.add_argument("--greedy-steps", type=int, default=6)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/drafts_layerskip_search.json"))
    ap.add_argument("--rescore", type=Path, help="recompute the gains of this saved search and exit")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine more threads thrash)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.rescore:
        return rescore(args.rescore)
    from flashspec_torch.engine import Engine

    torch.set_grad_enabled(False)
    engine = Engine(None, ("ngram",), policy="fixed", device="cpu")
    model = engine.target.model
    num_layers = model.config.num_layers
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    with torch.inference_mode():
        seqs = build_text(engine, args.per_domain, args.new_tokens, args.context)
        scorer = Scorer(model, seqs, skip_first=8)
        positions = int(scorer.valid.sum())
        log(f"{len(seqs)} sequences, {positions} scored positions")
        full_1 = time_forward(model, 1, frozenset(), 15)
        verify = time_forward(model, args.gamma + 1, frozenset(), 15)
        log(f"1-token forward {full_1 * 1e3:.1f} ms; {args.gamma + 1}-token forward {verify * 1e3:.1f} ms")
        cost = CostModel(layer_params(model), head_params(model), verify / full_1)

        def entry(name: str, skip: frozenset[int], agreement: float | None = None) -> dict:
            a = scorer.agreement(skip) if agreement is None else agreement
            return cost.entry(name, skip, a, args.gamma)

        rows = [entry("plain truncation 24-29", frozenset(range(24, 30)))]
        for name, skip in candidates_fixed(num_layers).items():
            rows.append(entry(name, skip))
        best_fixed = max(rows, key=lambda r: r["estimated_gain"])
        log(f"best fixed-shape candidate: {best_fixed}")
        path = greedy_removal(scorer, num_layers, args.greedy_steps, log)
        for p in path:
            rows.append(entry(f"greedy removal, {len(p['skip'])} layers", frozenset(p["skip"]), p["agreement"]))
    result = {
        "command": f"python benchmarks/drafts_layerskip_search.py --per-domain {args.per_domain} --new-tokens {args.new_tokens} "
                   f"--context {args.context} --greedy-steps {args.greedy_steps} --gamma {args.gamma}",
        **machine(),
        "scored_positions": positions,
        "gamma": args.gamma,
        "timings_ms": {"one_token_forward": full_1 * 1e3, "verify_forward": verify * 1e3},
        "greedy_path": path,
    }
    finish(result, rows, cost)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    show(result)


def finish(result: dict, rows: list[dict], cost: CostModel) -> None:
    rows.sort(key=lambda r: -r["estimated_gain"])
    by_count = {}
    for r in rows:
        k = r["skipped"]
        if k not in by_count or r["agreement"] > by_count[k]["agreement"]:
            by_count[k] = r
    result["cost_model"] = {"layer_params": cost.per_layer, "head_and_embed_params": cost.head,
                            "verify_over_one_token_forward": cost.verify_ratio}
    result["best"] = rows[0]
    result["best_agreement_per_skipped_count"] = [by_count[k] for k in sorted(by_count)]
    result["candidates"] = rows


def rescore(path: Path) -> None:
    """Recompute the gains of a saved search with the cost model (no model forward)."""
    from flashspec_torch.weights import load

    result = json.loads(path.read_text())
    model = load(None).model
    t = result.get("timings_ms") or {"one_token_forward": result["cost_model_ms"]["one_token_full"],
                                     "verify_forward": result["cost_model_ms"]["verify_step"]}
    result["timings_ms"] = t
    result.pop("cost_model_ms", None)
    cost = CostModel(layer_params(model), head_params(model), t["verify_forward"] / t["one_token_forward"],
                     model.config.num_layers)
    rows = []
    for r in result["candidates"]:
        skip = frozenset(int(x) for part in r["spelling"].split(":")[1].split(",")
                         for x in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))
        rows.append(cost.entry(r["name"], skip, r["agreement"], result["gamma"]))
    finish(result, rows, cost)
    result["rescored_with"] = f"python benchmarks/drafts_layerskip_search.py --rescore {path}"
    path.write_text(json.dumps(result, indent=1))
    show(result)


def show(result: dict) -> None:
    log = print
    rows = result["candidates"]
    log(f"\n{'candidate':<34}{'spelling':<30}{'skip':>5}{'agree':>8}{'cost':>7}{'gain':>7}")
    for r in rows[:12] + [r for r in rows if r["name"].startswith("plain")]:
        log(f"{r['name']:<34}{r['spelling'][:29]:<30}{r['skipped']:>5}{r['agreement']:>8.3f}{r['draft_cost']:>7.2f}{r['estimated_gain']:>7.2f}")
    log("best agreement per number of skipped layers:")
    for r in result["best_agreement_per_skipped_count"]:
        log(f"  {r['skipped']:>2} skipped: {r['agreement']:.3f} ({r['name']}, {r['spelling']})")


if __name__ == "__main__":
    main()
