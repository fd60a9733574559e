"""Acceptance and tokens/s of each draft per domain, at temperature 0 and 0.7, on the embedded
SmolLM2-135M-Instruct (CPU, fp32). One fixed draft per run, G = 4; plain decoding beside it.

Domains (benchmarks/drafts_common.py): code = the first half of standard-library functions,
prose = the start of pydoc_data topics, chat = benchmarks/prompts/chat.txt through the chat
template. At temperature 0 every speculative run must reproduce plain decoding token for token
(checked and recorded). Acceptance = accepted / drafted tokens pooled over the cell's steps.

    python benchmarks/drafts_by_domain.py --prompts 3 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from drafts_common import DOMAINS, machine, prompts  # noqa: E402


class Counter:
    """Pools drafted / accepted / emitted counts over every step it sees."""

    def __init__(self):
        self.drafted = self.accepted = self.emitted = self.steps = 0

    def __call__(self, record) -> None:
        self.drafted += record.drafted
        self.accepted += record.accepted
        self.emitted += record.emitted
        self.steps += 1


def run_cell(engine, texts: list[str], chat: bool, temperature: float, gamma: int, max_new: int, speculation: bool):
    count = Counter()
    tokens, seconds, outs = 0, 0.0, []
    for i, text in enumerate(texts):
        out = engine.generate(text, temperature=temperature, max_new_tokens=max_new, seed=i, gamma=gamma,
                              speculation=speculation, chat=chat, on_step=count)
        tokens += out["new_tokens"]
        seconds += out["wall_s"]
        outs.append(out["tokens"])
    cell = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "steps": count.steps}
    if speculation:
        cell["acceptance"] = count.accepted / count.drafted
        cell["emitted_per_step"] = count.emitted / count.steps
    return cell, outs


def make_engines(names: list[str], target, nf4_model):
    from flashspec_torch.engine import Engine
    from flashspec_torch.weights import LoadedModel

    engines = {}
    for name in names:
        draft = LoadedModel(nf4_model, target.tokenizer, "nf4") if name == "nf4" else name
        engines[name] = Engine(target, (draft,), policy="fixed", device="cpu")
    return engines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=3, help="prompts per domain")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--draft", action="append", help="a draft name; repeat (default ngram, nf4, layerskip)")
    ap.add_argument("--domains", default=",".join(DOMAINS))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/drafts_by_domain.json"))
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine more threads thrash)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from flashspec_torch.nf4 import quantize_nf4
    from flashspec_torch.weights import load

    torch.manual_seed(0)
    target = load(None)
    names = args.draft or ["ngram", "nf4", "layerskip"]
    nf4_model = quantize_nf4(target.model) if "nf4" in names else None
    engines = make_engines(names, target, nf4_model)
    plain = next(iter(engines.values()))
    for eng in engines.values():  # warm up
        eng.generate("warm up", max_new_tokens=4, chat=False, temperature=0.0)
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = []
    for domain in args.domains.split(","):
        texts = prompts(domain, 0, args.prompts)
        chat = domain == "chat"
        for t in temps:
            cell, ref = run_cell(plain, texts, chat, t, args.gamma, args.max_new_tokens, speculation=False)
            rows.append({"domain": domain, "temperature": t, "method": "plain", **cell})
            print(json.dumps(rows[-1]), flush=True)
            for name, eng in engines.items():
                cell, outs = run_cell(eng, texts, chat, t, args.gamma, args.max_new_tokens, speculation=True)
                row = {"domain": domain, "temperature": t, "method": name, **cell}
                if t == 0:
                    row["same_tokens_as_plain"] = outs == ref
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {
        "command": "python " + shlex.join(sys.argv),
        **machine(),
        "gamma": args.gamma,
        "drafts": {n: (e.drafts[0].name, sorted(getattr(e.drafts[0], "skip", ()))) for n, e in engines.items()},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{'domain':<7}{'T':>5}  {'method':<22}{'acceptance':>11}{'tok/step':>9}{'tok/s':>8}  exact")
    for r in rows:
        acc = f"{r['acceptance']:.3f}" if "acceptance" in r else "-"
        eps = f"{r['emitted_per_step']:.2f}" if "emitted_per_step" in r else "1"
        print(f"{r['domain']:<7}{r['temperature']:>5}  {r['method']:<22}{acc:>11}{eps:>9}{r['tokens_per_s']:>8.2f}  "
              f"{r.get('same_tokens_as_plain', '')}")


if __name__ == "__main__":
    main()
