"""What a draft *tree* would give the draft head: tokens per step of a greedy tree verify, teacher-forced.

On held-out prompts of each domain (``flashspec.head_corpus``'s held-out groups, chosen as
``flashspec train-head`` chooses its held-out set: ``head_job.pick``), the target continues each prompt
(greedy by default), then one target pass over prompt and continuation gives its features and its greedy
token after every position (``truth``: argmax of its logits). Every continuation position r is the root
of one speculative step (the head fed the target's features up to r, as after a verify): the head's
drafts are expanded as a tree, each branch fed the head's own states exactly as drafting feeds them, and
a greedy tree verify emits the longest path whose tokens are the target's greedy tokens, plus one.

- Static trees ("4,2,1,1": the root's top 4, each of those its top 2, ...; "1,1,1,1" is the chain at
  G = 4): a node on the target's path is in the tree iff at each depth k the target's token ranks below
  the width b_k among the head's logits along that path, so the count needs only the chain of the head's
  own states along the target's tokens (``head_train.ttt_states``, which the tests check equals
  drafting) and the target token's rank at each draft position (``static_counts``).
- Dynamic trees (EAGLE-2): from the root, ``depth`` rounds; each round runs the head on the ``top_k``
  candidates of the newest depth with the highest cumulative log-probability (the frontier; the root's
  children first), each of them adding its ``top_k`` children as candidates; then the N candidates of
  highest cumulative log-probability (parents before children on ties) are the tree
  (``flashspec_torch.head_tree``'s ``expand_tree`` and ``select_tree``, read by ``dynamic_counts``): each
  node attends its own ancestors only, so every branch is run as ``HeadDraft.propose`` runs one chain.

Tokens per step are reported over the steps a greedy engine run takes (``walk``: each step's root
where the previous one ended; ``engine_walk``) and averaged over every root (``per_position``, which
overweights long-accepting stretches). Also per domain: the target's own top-1 probability along the
continuation (how often it is unsure, p_top1 < 0.5), the head's top-1/2/4/8 recall of the target's
token per draft position, and the share of continuation tokens closing a 4-gram seen before.
The roots stop at the deepest chain's or tree's depth before each continuation's end.

    OMP_NUM_THREADS=1 python benchmarks/head_tree_cpu.py --prompts 12 --new-tokens 56 --out OUT.json   # the first 48 tokens
    OMP_NUM_THREADS=1 python benchmarks/head_tree_cpu.py --prompts 24 --new-tokens 192 --continuation sampled --sizes '' --out OUT.json
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

STATIC_TREES = ("1,1,1,1", "2,1,1,1", "4,1,1,1", "2,2,1,1", "4,2,1,1", "2,2,2,1", "4,2,2,1", "8,4,2,1")
DYNAMIC_SIZES = (8, 16, 32)
RECALL_AT = (1, 2, 4, 8)


def parse_widths(spec: str) -> tuple[int, ...]:
    widths = tuple(int(w) for w in spec.split(","))
    if not widths or min(widths) < 1:
        raise ValueError(f"tree {spec!r}: want positive branching factors per depth, e.g. 4,2,1,1")
    return widths


def tree_nodes(widths: tuple[int, ...]) -> int:
    """Drafted nodes of a static tree (the scoring pass has one row more: the root)."""
    total, level = 0, 1
    for b in widths:
        level *= b
        total += level
    return total


@torch.no_grad()
def target_view(target, tokens: torch.Tensor, layers: tuple[int, ...]):
    """tokens [1, T] -> (feats [1, T, k C] float32, truth [T]: the target's greedy token after each
    position, p_top1 [T]: its probability)."""
    from flashspec_torch.head_train import target_pass

    z, feats = target_pass(target, tokens, layers)
    p = z[0].float().softmax(-1)
    top = p.max(-1)
    return feats.float(), top.indices, top.values


def head_vocab_index(head, truth: torch.Tensor) -> torch.Tensor:  # [T] token ids -> [T] index in the head's vocabulary, -1 outside
    inv = torch.full((head.target_config.vocab_size,), -1, dtype=torch.int64)
    inv[head.token_ids] = torch.arange(len(head.token_ids))
    return inv[truth]


def rank_of(w: torch.Tensor, j: torch.Tensor) -> torch.Tensor:  # w [T, V_d], j [T] -> [T]: argmax order (ties: lower index first)
    wj = w.gather(-1, j.clamp(min=0)[:, None])
    idx = torch.arange(w.shape[-1])
    r = (w > wj).sum(-1) + ((w == wj) & (idx[None] < j[:, None])).sum(-1)
    return torch.where(j >= 0, r, torch.full_like(r, w.shape[-1]))  # outside the head's vocabulary: never drafted


@torch.no_grad()
def chain_ranks(head, target, tokens: torch.Tensor, feats: torch.Tensor, truth: torch.Tensor, depth: int) -> torch.Tensor:
    """[depth, T]: at [k, t], the rank of truth[t] among the head's logits of draft position k + 1 at
    position t (pass k of ``ttt_states``: the target's features up to t - k, then k of its own states
    along the sequence's tokens)."""
    from flashspec_torch.head_train import ttt_states

    states = ttt_states(head, target, tokens, feats, depth)
    j = head_vocab_index(head, truth)
    return torch.stack([rank_of(head.logits(s[0]), j) for s in states])


def root_ranks(ranks: torch.Tensor, roots: torch.Tensor) -> torch.Tensor:  # [D, T], [R] -> [R, D]: draft position k of root r at r + k - 1
    d = ranks.shape[0]
    return torch.stack([ranks[k, roots + k] for k in range(d)], 1)


def static_counts(rr: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:  # rr [R, D >= len(widths)] -> [R] drafts accepted
    ok = rr[:, : len(widths)] < torch.tensor(widths)
    return ok.long().cumprod(1).sum(1)


@torch.no_grad()
def head_base(head, target, tokens: torch.Tensor, feats: torch.Tensor, extra: int):
    """The head fed the target's features at every position (pass 0): states [T, C], logits [T, V_d],
    and its cache ([1, T + extra] slots, the first T written)."""
    from flashspec_torch.head_train import shift
    from flashspec_torch.model import KVCache

    t = tokens.shape[1]
    cache = KVCache(head.config, 1, t + extra, torch.float32, tokens.device)
    s, w = head.run(target, tokens, shift(head.fuse(feats)), torch.arange(t)[None], cache, t)
    return s[0], w[0], cache


@torch.no_grad()
def dynamic_counts(head, target, base, roots: torch.Tensor, truth: torch.Tensor, args) -> dict:
    """{size: [R] drafts accepted by a greedy verify of the head's EAGLE-2 tree of ``size`` nodes from each root}
    (``flashspec_torch.head_tree``, the roots sharing the one sequence's head cache)."""
    from flashspec_torch.head_tree import copy_cache_rows, expand_tree, select_tree

    s_base, w_base, cache = base
    cache = copy_cache_rows(head.config, cache, torch.zeros(len(roots), dtype=torch.int64))
    cands = expand_tree(head, target, s_base[roots], w_base[roots], cache, roots, args.top_k, args.depth)
    on = on_path(cands, roots, truth)
    out = {}
    for n in args.sizes:
        tree = select_tree(cands, n)
        out[n] = (on.gather(1, tree.index) * cands.depths[tree.index]).max(1).values
    return out


def on_path(cands, roots: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:  # -> [R, M] bool
    """Whether each candidate's path from the root is the target's greedy tokens (truth [T]) from the root on."""
    hit = cands.tokens == truth[roots[:, None] + cands.depths[None] - 1]
    for m in range(hit.shape[1]):  # candidates in depth order: a parent's entry is final before its children's
        p = cands.parents[:, m]
        hit[:, m] &= (p < 0) | hit.gather(1, p.clamp(min=0)[:, None])[:, 0]
    return hit


def walk(counts: torch.Tensor) -> list[int]:
    """The drafts accepted at each step of a greedy engine run over consecutive roots with ``counts``
    accepted per root: a step emits count + 1 tokens and the next step's root is that many positions on."""
    i, steps, c = 0, [], counts.tolist()
    while i < len(c):
        steps.append(c[i])
        i += c[i] + 1
    return steps


def repeated_share(tokens: list[int], start: int, n: int = 4) -> float:
    """The share of positions t >= start whose n-gram ending at t occurred earlier in the sequence."""
    seen, hits = set(), 0
    for t in range(n - 1, len(tokens)):
        gram = tuple(tokens[t - n + 1 : t + 1])
        hits += t >= start and gram in seen
        seen.add(gram)
    return hits / max(1, len(tokens) - start)


def rates(counts: list[torch.Tensor]) -> dict:
    """Tokens per step of per-root accepted counts (one tensor per sequence): averaged over every root
    (``per_position``) and over the steps of a greedy engine run (``engine_walk``, ``walk``)."""
    steps = [n for c in counts for n in walk(c)]
    return {"per_position": float(1 + torch.cat(counts).float().mean()),
            "engine_walk": 1 + sum(steps) / max(1, len(steps)), "walk_steps": len(steps)}


def chain_rows(rr: torch.Tensor, gammas) -> dict:
    """The chain at each G: acceptance per draft position (given the earlier ones were accepted) and
    1 + a1 + a1 a2 + ... from the marginal per-position rates (how the model card's table computes it)."""
    ok = (rr == 0).float()  # [R, D]
    out = {}
    for g in gammas:
        reached = torch.cat([torch.ones(len(rr), 1), ok[:, : g - 1].cumprod(1)], 1)  # the earlier ones accepted
        cond = (ok[:, :g] * reached).sum(0) / reached.sum(0).clamp(min=1)
        out[g] = {"nodes": g, "product_of_rates": float(1 + ok[:, :g].mean(0).cumprod(0).sum()),
                  "acceptance_by_position": [round(float(a), 4) for a in cond]}
    return out


def limits(rr: torch.Tensor, p: torch.Tensor) -> dict:
    """rr [R, D] ranks, p [R] the target's top-1 probability at each root: the target's own certainty
    along the continuation, and the head's top-k recall per draft position."""
    first_ok = rr[:, 0] == 0
    sure = p >= 0.5
    return {
        "target_p_top1_mean": float(p.mean()),
        "target_p_top1_quartiles": [round(float(q), 3) for q in p.quantile(torch.tensor([0.25, 0.5, 0.75]))],
        "target_unsure_share": float((~sure).float().mean()),
        "head_top1_where_target_sure": float(first_ok[sure].float().mean()) if sure.any() else None,
        "head_top1_where_target_unsure": float(first_ok[~sure].float().mean()) if (~sure).any() else None,
        "head_recall_by_position": {f"top{m}": [round(float(x), 4) for x in (rr < m).float().mean(0)] for m in RECALL_AT},
    }


@torch.no_grad()
def measure_sequence(head, target, seq, args) -> dict:
    """One sequence's per-root figures: ranks [R, D], static and dynamic counts, p_top1 at the roots."""
    tokens = torch.tensor([seq.tokens])
    feats, truth, p_top1 = target_view(target, tokens, head.feature_layers)
    depth = max([max(args.gammas)] + [len(w) for w in args.trees] + [args.depth] * bool(args.sizes))
    roots = torch.arange(seq.prompt_len - 1, max(seq.prompt_len - 1, len(seq.tokens) - depth + 1))  # none: ended early
    rr = root_ranks(chain_ranks(head, target, tokens, feats, truth, depth), roots)
    out = {"ranks": rr, "p_top1": p_top1, "roots": roots,
           "greedy_flips": int((truth[seq.prompt_len - 1 : -1] != tokens[0, seq.prompt_len :]).sum()),
           "repeated": repeated_share(seq.tokens, seq.prompt_len),
           "static": {w: static_counts(rr, w) for w in args.trees}}
    out["dynamic"] = {n: torch.zeros(0, dtype=torch.int64) for n in args.sizes}
    if args.sizes and len(roots):
        base = head_base(head, target, tokens, feats, (args.depth - 1) * args.top_k + 1)
        parts = [dynamic_counts(head, target, base, c, truth, args) for c in roots.split(args.root_chunk)]
        out["dynamic"] = {n: torch.cat([p[n] for p in parts]) for n in args.sizes}
    return out


def summarise(parts: list[dict], args) -> dict:
    """A domain's table rows from its sequences' ``measure_sequence`` results."""
    rr = torch.cat([p["ranks"] for p in parts])
    if not len(rr):
        return {"roots": 0, "note": "every continuation ended before the deepest tree's depth: use more --new-tokens"}
    row = {"roots": len(rr), "greedy_flips": sum(p["greedy_flips"] for p in parts),
           "repeated_4gram_share": sum(p["repeated"] for p in parts) / len(parts),
           "chain": chain_rows(rr, range(1, max(args.gammas) + 1))}
    for g, c in row["chain"].items():
        c.update(rates([static_counts(p["ranks"], (1,) * g) for p in parts]))
    row["static"] = {",".join(map(str, w)): {"nodes": tree_nodes(w), **rates([p["static"][w] for p in parts])}
                     for w in args.trees}
    if args.sizes:
        row["dynamic"] = {f"top{n} (K={args.top_k}, depth {args.depth})": {"nodes": n, **rates([p["dynamic"][n] for p in parts])}
                          for n in args.sizes}
    row["limits"] = limits(rr, torch.cat([p["p_top1"][p["roots"]] for p in parts]))
    return row


def held_out_sequences(loaded, prompts: int, new_tokens: int, greedy: bool, seed: int) -> list:
    """The target's continuations of ``prompts`` held-out prompts per domain (``head_job.pick``'s choice)."""
    from flashspec.engine import encode
    from flashspec.head_corpus import corpus, split
    from flashspec_torch.head_job import pick
    from flashspec_torch.head_train import TrainConfig, generate_sequences

    held = pick(split(corpus())[1], prompts, seed + 1)
    cfg = TrainConfig(new_tokens=new_tokens, gen_batch=len(held), seed=seed)
    enc = lambda p: encode(loaded.tokenizer, p.text, p.domain == "chat")  # noqa: E731
    return generate_sequences(loaded.model, held, enc, cfg, loaded.model.config.eos_token_ids, greedy=greedy)


def load_float_head(spelling: str, target):
    """``head`` (the shipped one) or ``head:DIR``, in float32 with the target's weights lent."""
    from flashspec.head_file import draft_head_file
    from flashspec_torch.head_train import for_training
    from flashspec_torch.heads import load_head

    if spelling != "head" and not spelling.startswith("head:"):
        raise ValueError(f"--head {spelling!r}: want head (the shipped head) or head:DIR")
    return for_training(load_head(draft_head_file(spelling[5:]), target.config)[0], target).eval()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head", default="head", help="head (the shipped one) or head:DIR")
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts per domain")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--continuation", choices=("greedy", "sampled"), default="greedy",
                    help="the target's continuation: greedy, or sampled at T = 0.8 as train-head's held-out set "
                         "(sampled: chain and static trees only; the head is fed the sampled tokens)")
    ap.add_argument("--trees", default=";".join(STATIC_TREES), help="static trees, ';'-separated")
    ap.add_argument("--sizes", default=",".join(map(str, DYNAMIC_SIZES)), help="dynamic tree sizes (nodes); '' for none")
    ap.add_argument("--top-k", type=int, default=8, help="dynamic trees: frontier and children per node")
    ap.add_argument("--depth", type=int, default=6, help="dynamic trees: the deepest candidates")
    ap.add_argument("--gammas", default="8", help="the chain is reported at G = 1..max of these")
    ap.add_argument("--root-chunk", type=int, default=8, help="roots expanded at once (memory: chunk x top-k cache rows)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "head_tree_cpu.json"))
    args = ap.parse_args(argv)
    args.trees = [parse_widths(t) for t in args.trees.split(";") if t]
    args.sizes = [int(n) for n in args.sizes.split(",") if n]
    args.gammas = [int(g) for g in args.gammas.split(",")]
    if args.sizes and args.continuation == "sampled":
        raise SystemExit("--continuation sampled: the dynamic trees need the target's greedy tokens; pass --sizes ''")
    if min(args.gammas) < 1 or args.top_k < 1 or args.depth < 1:
        raise SystemExit("--gammas, --top-k and --depth must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from flashspec_torch.engine import load_target

    doc = {"command": "python benchmarks/head_tree_cpu.py " + " ".join(sys.argv[1:]), "date": str(date.today()),
           "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads", "torch": torch.__version__}
    try:
        loaded = load_target(None, torch.float32, "cpu")
    except FileNotFoundError as e:  # the embedded model's package is not installed
        print(f"skipped: {e}")
        doc["skipped"] = str(e)
        return write(args.out, doc)
    head, start = load_float_head(args.head, loaded.model), time.perf_counter()
    seqs = held_out_sequences(loaded, args.prompts, args.new_tokens, args.continuation == "greedy", args.seed)
    doc["generate_s"], doc["results"] = time.perf_counter() - start, {}
    for d in sorted({s.domain for s in seqs}, key=[s.domain for s in seqs].index):
        doc["results"][d] = summarise([measure_sequence(head, loaded.model, s, args) for s in seqs if s.domain == d], args)
        print(d, table_line(doc["results"][d]) if doc["results"][d]["roots"] else doc["results"][d])
    doc["wall_s"], doc["load_average_at_end"] = time.perf_counter() - start, list(os.getloadavg())
    write(args.out, doc)


def table_line(row: dict) -> str:
    """Tokens per step (per position / engine walk) of each chain, tree and dynamic tree, one line."""
    cells = [(f"G={g}", c) for g, c in row["chain"].items()] + list(row["static"].items()) + list(row.get("dynamic", {}).items())
    return "; ".join(f"{k} [{c['nodes']}] {c['per_position']:.2f}/{c['engine_walk']:.2f}" for k, c in cells)


def write(out: str, doc: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
