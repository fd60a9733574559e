"""The draft head against plain decoding and the other drafts, on held-out prompts by domain, batch 1.

Prompts: the held-out groups of ``flashspec.head_corpus`` (files, topics, subjects the head never saw),
the first ``--prompts`` per domain; chat through the chat template. For each domain and temperature
(0 and 0.7): plain decoding; the head at every G of ``--gammas`` (tokens emitted per step, acceptance
of each draft position = P(position k accepted | positions < k accepted), tok/s), and a second head
(``--baseline``, e.g. the shipped one beside a new one) at the same G; ngram, layerskip at G = 4;
transformers' assisted generation with prompt lookup (greedy only). Each draft's cost: the time its
``propose`` took (the head: feeding the positions accepted since the last step, then G single-token
passes), per step and per drafted token, and per drafted token over a plain decoding step of the
same cell (plain seconds / tokens; on a GPU the clock would time launches, not work: CPU only). Every method runs the same
prompts and token counts one after another in this process, so the machine's load weighs on all.
At T = 0 each speculative run's tokens are checked against plain decoding's (``greedy_equal``).
``--clock process`` times with the process's CPU time instead of the wall clock: on a machine shared
with other jobs it leaves out the time this process waited for a core (memory contention stays in).

    python benchmarks/head_bench.py --head head:DIR [--baseline head] [--prompts 4] [--new-tokens 64] [--out results/head_bench.json]
    OMP_NUM_THREADS=1 python benchmarks/head_bench.py --prompts 2 --new-tokens 48 --gammas 2,3,4,5   # the CPU table
    OMP_NUM_THREADS=1 python benchmarks/head_bench.py --prompts 2 --new-tokens 48 --gammas 3,4 --trees head-tree/8,head-tree/16,head-tree/32 --tree-gammas 4,6 --others '' --no-hf --clock process   # trees

    FLASHSPEC_CACHE=/tmp/fscache timeout 200 python benchmarks/head_bench.py --target /tmp/fs/model.gguf --device cuda --prompts 2 --new-tokens 64 --gammas 3,4 --trees head-tree/16,head-tree/32x8 --tree-gammas 4,6 --tree-eager --others '' --no-hf --budget-s 90 --out $OUT/tree_graphed_gpu.json   # GPU: the tree step in CUDA graphs (and eager) beside the chain head and plain decoding

Tree drafts (``--trees``, ``head-tree/N`` at each depth of ``--tree-gammas``): their draft time is ``draft_tree``'s
(feeding the head, EAGLE-2's expansion and selection), ``draft_ms_per_token`` per depth level. On CUDA a tree
step is one CUDA-graph replay like the chain's (captured in each cell's warm-up; the cell's ``graphs`` lists the
captured step kinds, e.g. "tree G=4"); ``--tree-eager`` adds each tree cell run eagerly ("... eager": the same
step with host reads, no graph). A cell that fails (a capture error, say) records ``error`` and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = time.perf_counter  # set by main from --clock


class Steps:
    """Counts per step (batch 1): emitted tokens and accepted drafted tokens."""

    def __init__(self):
        self.accepted: list[int] = []
        self.emitted = 0

    def __call__(self, record) -> None:
        self.accepted.append(record.accepted)
        self.emitted += record.emitted


def per_position(accepted: list[int], gamma: int) -> list[float]:
    """P(draft position k accepted | the ones before were), k = 1..gamma."""
    out = []
    for k in range(1, gamma + 1):
        reached = sum(1 for n in accepted if n >= k - 1)
        out.append(sum(1 for n in accepted if n >= k) / reached if reached else 0.0)
    return out


class ProposeClock:
    """Wraps a draft's ``propose`` (a tree draft's ``draft_tree``; an instance attribute shadowing the method)
    to add up its time."""

    def __init__(self, draft):
        self.method = "draft_tree" if getattr(draft, "tree", False) else "propose"
        self.draft, self.seconds, self.calls = draft, 0.0, 0
        inner = getattr(draft, self.method)

        def propose(*a, **k):
            start = clock()
            out = inner(*a, **k)
            self.seconds += clock() - start
            self.calls += 1
            return out

        setattr(draft, self.method, propose)

    def close(self) -> None:
        delattr(self.draft, self.method)


def eager(engine):
    """``engine`` with its backend's steps run eagerly (no CUDA graphs): the ``--tree-eager`` cells."""
    engine.backend.graphed, engine.backend.graphs, engine.backend.shape = False, None, None
    return engine


def graph_kinds(engine) -> list[str]:
    """The step kinds the engine's backend holds CUDA graphs of ("tree G=4", "spec G=3", "plain"); [] if none."""
    graphs = getattr(engine.backend.graphs, "graphs", {})
    return sorted(f"{k[0]} G={k[2]}" if k[0] != "plain" else "plain" for k in graphs)


def run_cell(engine, ids_list, plain, log, label, **kw) -> dict:
    """``run``'s cell with ``greedy_equal`` and ``graphs``; a failure (e.g. a CUDA-graph capture error) is recorded
    as the cell's ``error`` and logged, and the benchmark goes on."""
    try:
        cell, got = run(engine, ids_list, **kw)
    except Exception as e:  # noqa: BLE001  (reported in the JSON, not hidden)
        log(f"{label}: FAILED: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}", "graphs": graph_kinds(engine)}
    cell["greedy_equal"] = got == plain if kw["temperature"] == 0 else None
    cell["graphs"] = graph_kinds(engine)
    return cell


def run(engine, ids_list, *, temperature, gamma, new_tokens, speculation=True) -> tuple[dict, list]:
    """Each prompt (ids) in turn, after one short untimed warm-up (CUDA graphs are captured there)."""
    texts = [engine.tokenizer.decode(ids) for ids in ids_list]
    kw = dict(temperature=temperature, gamma=gamma, seed=0, speculation=speculation, chat=False)
    engine.generate(texts[0], max_new_tokens=4, **kw)
    steps, tokens, seconds = Steps(), [], 0.0
    timer = ProposeClock(engine.drafts[0]) if speculation and engine.device.type == "cpu" else None
    try:
        for text in texts:
            start = clock()
            tokens.append(engine.generate(text, max_new_tokens=new_tokens, on_step=steps, **kw)["tokens"])
            seconds += clock() - start
    finally:
        if timer:
            timer.close()
    return summary(steps, tokens, seconds, gamma, speculation, timer), tokens


def summary(steps: Steps, tokens: list, seconds: float, gamma: int, speculation: bool,
            timer: ProposeClock | None = None) -> dict:
    """One table cell: tokens, tok/s, steps; speculative: tokens per step, acceptance by draft position,
    the draft's ``propose`` time per step and per drafted token (ms)."""
    n = sum(len(t) for t in tokens)
    cell = {"tokens": n, "seconds": seconds, "tok_s": n / seconds, "ms_per_token": 1e3 * seconds / n,
            "steps": len(steps.accepted)}
    if speculation:
        cell.update(emitted_per_step=steps.emitted / max(1, len(steps.accepted)),
                    acceptance_by_position=per_position(steps.accepted, gamma))
    if timer is not None:
        cell.update(draft_ms_per_step=1e3 * timer.seconds / max(1, timer.calls),
                    draft_ms_per_token=1e3 * timer.seconds / max(1, timer.calls * gamma))
    return cell


def hf_prompt_lookup(hf, ids_list, new_tokens: int, gamma: int, eos) -> dict:
    n, seconds = 0, 0.0
    for ids in ids_list:
        x = torch.tensor([ids], device=hf.device)
        start = clock()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=0, prompt_lookup_num_tokens=gamma, eos_token_id=list(eos) or None)
        if hf.device.type == "cuda":
            torch.cuda.synchronize()
        seconds += clock() - start
        n += out.shape[1] - len(ids)
    return {"tokens": n, "seconds": seconds, "tok_s": n / seconds}


def bench(loaded, head: str, *, prompts: int, new_tokens: int, gammas: tuple[int, ...], others=("ngram", "layerskip"),
          temperatures=(0.0, 0.7), device=None, hf=True, baseline: str | None = None, trees: tuple[str, ...] = (),
          tree_gammas: tuple[int, ...] = (), tree_eager: bool = False, budget_s: float = float("inf"), log=print,
          save=None, stop_below: float | None = None) -> dict:
    """Every cell by "domain T=t"; ``baseline``: a second head's cells ("baseline G=g") beside ``head``'s;
    ``trees``: tree drafts (``head-tree/N``) at each depth G of ``tree_gammas`` ("head-tree/N G=g"; with
    ``tree_eager`` also run without CUDA graphs, "head-tree/N G=g eager"). Past
    ``budget_s`` seconds no further domain / temperature is started; ``save(results)`` after each (a run cut
    short keeps what it measured). The heads run with the engine's default dynamic draft length (on the CPU
    ``HEAD_STOP_BELOW_CPU``); ``stop_below`` not None: ``head`` once more with that one ("head stop=S G=g"; 0: G tokens
    always)."""
    from flashspec.engine import encode
    from flashspec.head_corpus import DOMAINS, corpus, split
    from flashspec_torch.engine import Engine

    held = split(corpus())[1]
    heads = {"head": head, **({"baseline": baseline} if baseline else {})}
    engines = {name: Engine(loaded, (name,), policy="fixed", device=device)
               for name in (*heads.values(), *others, *trees)}
    head_engines = {label: engines[spelling] for label, spelling in heads.items()}
    if stop_below is not None:
        head_engines[f"head stop={stop_below:g}"] = Engine(loaded, (head,), policy="fixed", device=device,
                                                           stop_below=stop_below)
    eager_trees = {name: eager(Engine(loaded, (name,), policy="fixed", device=device)) for name in trees if tree_eager}
    start = time.perf_counter()
    plain_engine = engines[head]
    hf_model = to_hf(loaded) if hf else None
    results = {}
    for d in DOMAINS:
        ids_list = [encode(loaded.tokenizer, p.text, d == "chat") for p in [p for p in held if p.domain == d][:prompts]]
        for t in temperatures:
            if time.perf_counter() - start > budget_s:
                log(f"{d} T={t}: skipped (past --budget-s {budget_s:g})")
                continue
            cells = {}
            cells["plain"], plain = run(plain_engine, ids_list, temperature=t, gamma=1, new_tokens=new_tokens, speculation=False)
            for label, engine in head_engines.items():
                for g in gammas:
                    cells[f"{label} G={g}"] = run_cell(engine, ids_list, plain, log, f"{d} T={t} {label} G={g}",
                                                       temperature=t, gamma=g, new_tokens=new_tokens)
            for spelling in trees:
                for g in tree_gammas:
                    for label, engine in ((f"{spelling} G={g}", engines[spelling]),
                                          (f"{spelling} G={g} eager", eager_trees.get(spelling))):
                        if engine is not None:
                            cells[label] = run_cell(engine, ids_list, plain, log, f"{d} T={t} {label}", temperature=t,
                                                    gamma=g, new_tokens=new_tokens)
            for name in others:
                cells[f"{name} G=4"] = run_cell(engines[name], ids_list, plain, log, f"{d} T={t} {name} G=4", temperature=t,
                                                gamma=4, new_tokens=new_tokens)
            if hf_model is not None and t == 0:
                cells["transformers prompt lookup G=4"] = hf_prompt_lookup(hf_model, ids_list, new_tokens, 4,
                                                                           loaded.model.config.eos_token_ids)
            plain_ms = 1e3 * cells["plain"]["seconds"] / cells["plain"]["tokens"]  # one token per plain step
            failed = {k: c for k, c in cells.items() if "error" in c}
            cells = {k: c for k, c in cells.items() if k not in failed}
            for c in cells.values():
                c["speedup"] = c["tok_s"] / cells["plain"]["tok_s"]
                if "draft_ms_per_token" in c:
                    c["draft_per_token_over_plain_step"] = c["draft_ms_per_token"] / plain_ms
            results[f"{d} T={t}"] = {"cells": {**cells, **failed}, "plain_step_ms": plain_ms, **{
                f"best_{label}": max((k for k in cells if k.startswith(f"{label} G=")), key=lambda k: cells[k]["tok_s"],
                                     default=None) for label in head_engines}}
            log(f"{d} T={t}: " + ", ".join(f"{k} {c['tok_s']:.1f} tok/s ({c['speedup']:.2f}x"
                                           + (f", {c['emitted_per_step']:.2f}/step" if "emitted_per_step" in c else "")
                                           + ")" for k, c in cells.items()))
            if save:
                save(results)
    return results


def to_hf(loaded):
    from generate_cpu import to_transformers

    return to_transformers(loaded).to(loaded.model.embed.weight.device)


def machine(device) -> dict:
    import transformers

    info = {"machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads", "date": str(date.today()),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}}
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default="head", help="head (the shipped one) or head:DIR")
    ap.add_argument("--baseline", default=None, help="a second head measured beside --head at the same G (e.g. head)")
    ap.add_argument("--target", default=None, help="a model directory or .gguf (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts per domain")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--gammas", default="2,3,4,5")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--trees", default="", help="tree drafts beside the head, e.g. head-tree/8,head-tree/16 ('': none)")
    ap.add_argument("--tree-gammas", default="4,6", help="the trees' depths G")
    ap.add_argument("--tree-eager", action="store_true", help="also run each tree cell without CUDA graphs")
    ap.add_argument("--others", default="ngram,layerskip", help="other drafts at G = 4 ('': none)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no domain / temperature past this")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall (a quiet machine) or process (this process's CPU time: a shared machine)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' prompt lookup")
    ap.add_argument("--stop-below", type=float, default=None,
                    help="also the head with this dynamic draft length (Engine(stop_below=...); 0: always G tokens)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "head_bench.json"))
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    from flashspec_torch.engine import check_device, load_target

    dev = check_device(args.device)
    loaded = load_target(args.target, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev)
    gammas = tuple(int(g) for g in args.gammas.split(","))
    temperatures = tuple(float(t) for t in args.temperatures.split(","))
    start = time.perf_counter()

    def save(results: dict) -> None:
        doc = {"command": "python benchmarks/head_bench.py " + " ".join(sys.argv[1:]), **machine(dev), "clock": args.clock,
               "head": args.head, "baseline": args.baseline,
               "load_average_at_end": list(os.getloadavg()), "wall_s": time.perf_counter() - start, "results": results}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))

    results = bench(loaded, args.head, prompts=args.prompts, new_tokens=args.new_tokens, gammas=gammas, device=str(dev),
                    hf=not args.no_hf, temperatures=temperatures, baseline=args.baseline,
                    trees=tuple(filter(None, args.trees.split(","))),
                    tree_gammas=tuple(int(g) for g in filter(None, args.tree_gammas.split(","))), tree_eager=args.tree_eager,
                    others=tuple(filter(None, args.others.split(","))), budget_s=args.budget_s, save=save,
                    stop_below=args.stop_below)
    save(results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
