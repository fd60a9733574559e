"""benchmarks/head_tree_cpu.py's tree counts on a tiny random target and a random head: static and
dynamic (EAGLE-2) trees against a brute force that runs the head along every node's path from a fresh
cache; the chain against the head's own drafting (``HeadDraft.propose``) and ``acceptance_by_position``."""

import pytest
import torch

from benchmark_modules import load_benchmark  # tests/benchmark_modules.py
from flashspec.config import LlamaConfig, SamplingConfig

V = 8  # a small vocabulary, so that trees hit the target's tokens several deep
CFG = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=128)
PROMPTS = ([1, 2, 3], [5, 4, 7, 7, 2])
NEW = 14


@pytest.fixture(scope="module")
def setup():
    from flashspec_torch.head_train import Sequence, for_training
    from flashspec_torch.heads import DraftHead
    from flashspec_torch.model import Llama

    torch.manual_seed(0)
    target = Llama(CFG).eval().requires_grad_(False)
    for p in target.parameters():
        p.data.normal_(0, 1.0)  # at 0.3 its greedy continuations are one token repeated
    head = DraftHead(CFG, (0, 2), torch.arange(0, V - 1))  # token V - 1 outside the head's vocabulary
    for p in head.parameters():
        p.data.normal_(0, 0.3)
    head = for_training(head, target).eval().requires_grad_(False)
    seqs = [Sequence("code", True, greedy_continuation(target, list(p), NEW), len(p)) for p in PROMPTS]
    return target, head, seqs


@torch.no_grad()
def greedy_continuation(target, ids: list[int], n: int) -> list[int]:
    from flashspec_torch.head_train import target_pass

    for _ in range(n):
        z, _ = target_pass(target, torch.tensor([ids]), (0,))
        ids = ids + [int(z[0, -1].argmax())]
    return ids


@torch.no_grad()
def path_logits(head, target, tokens, feats, r: int, path: list[int]) -> torch.Tensor:
    """[V_d]: the head's logits after root r and the drafted ``path``, one token at a time in a fresh cache."""
    from flashspec_torch.head_train import shift
    from flashspec_torch.model import KVCache

    cache = KVCache(head.config, 1, 64, torch.float32, "cpu")
    s, w = head.run(target, tokens[:, : r + 1], shift(head.fuse(feats[:, : r + 1])), torch.arange(r + 1)[None], cache, r + 1)
    s, w = s[:, -1], w[:, -1]
    for i, x in enumerate(path):
        s, w = head.run(target, torch.tensor([[x]]), s[:, None], torch.tensor([[r + 1 + i]]), cache, r + 2 + i)
        s, w = s[:, 0], w[:, 0]
    return w[0]


def hit_depth(paths, truth, r: int) -> int:
    """The deepest path that is the target's greedy tokens from root r on."""
    return max((len(p) for p in paths if p == truth[r : r + len(p)]), default=0)


def brute_static(head, target, tokens, feats, truth, r: int, widths) -> int:
    paths, level = [], [[]]
    for b in widths:
        level = [p + [int(head.token_ids[j])] for p in level
                 for j in path_logits(head, target, tokens, feats, r, p).topk(b).indices]
        paths += level
    return hit_depth(paths, truth, r)


def brute_candidates(head, target, tokens, feats, r: int, top_k: int, depth: int) -> list:
    """EAGLE-2's candidates written out, in the benchmark's order: [(cumulative log q, path)] of each depth,
    the frontier being the top_k newest of highest value (a stable sort)."""
    cands, frontier = [], [(torch.tensor(0.0), [])]
    for _ in range(depth):
        new = []
        for value, p in frontier:
            v, j = path_logits(head, target, tokens, feats, r, p).log_softmax(-1).topk(top_k)
            new += [(value + a, p + [int(head.token_ids[b])]) for a, b in zip(v, j)]
        cands += new
        frontier = sorted(new, key=lambda c: -float(c[0]))[:top_k]
    return cands


def brute_dynamic(cands, truth, r: int, size: int) -> int:
    """The deepest hit among the size best candidates (a stable sort: on ties the earlier, shallower one)."""
    return hit_depth([p for _, p in sorted(cands, key=lambda c: -float(c[0]))[:size]], truth, r)


def views(bench, head, target, seq):
    tokens = torch.tensor([seq.tokens])
    feats, truth, _ = bench.target_view(target, tokens, head.feature_layers)
    return tokens, feats, truth


def test_static_tree_counts_equal_a_brute_force(setup):
    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    counts = []
    for seq in seqs:
        tokens, feats, truth = views(bench, head, target, seq)
        roots = torch.arange(seq.prompt_len - 1, len(seq.tokens) - 4 + 1)
        rr = bench.root_ranks(bench.chain_ranks(head, target, tokens, feats, truth, 4), roots)
        for widths in ((3, 2, 1), (1, 1, 1, 1), (2, 2, 2, 2)):
            got = bench.static_counts(rr, widths).tolist()
            want = [brute_static(head, target, tokens, feats, truth.tolist(), int(r), widths) for r in roots]
            assert got == want, widths
            counts += got
    assert max(counts) >= 3 and min(counts) == 0  # the case is not trivial


def expand_roots(bench, head, target, tokens, feats, roots, top_k: int, depth: int):
    """``expand_tree`` from each root of one sequence (the roots sharing its head cache, as the benchmark runs it)."""
    from flashspec_torch.head_tree import copy_cache_rows, expand_tree

    s, w, cache = bench.head_base(head, target, tokens, feats, (depth - 1) * top_k + 1)
    cache = copy_cache_rows(head.config, cache, torch.zeros(len(roots), dtype=torch.int64))
    return expand_tree(head, target, s[roots], w[roots], cache, roots, top_k, depth)


def candidate_path(cands, i: int, m: int) -> list[int]:
    """Row i's candidate m as its path of tokens from the root, read through ``parents``."""
    path = []
    while m >= 0:
        path, m = [int(cands.tokens[i, m])] + path, int(cands.parents[i, m])
    return path


def test_dynamic_tree_counts_equal_a_brute_force(setup):
    """``expand_tree``'s candidates (values, paths, depths) and the benchmark's counts of ``select_tree``'s trees
    against EAGLE-2 written out with a fresh cache per path."""
    from types import SimpleNamespace

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    top_k, depth, counts = 3, 4, []
    args = SimpleNamespace(top_k=top_k, depth=depth, sizes=(2, 5, 12))
    for seq in seqs:
        tokens, feats, truth = views(bench, head, target, seq)
        roots = torch.arange(seq.prompt_len - 1, len(seq.tokens) - depth + 1)
        cands = expand_roots(bench, head, target, tokens, feats, roots, top_k, depth)
        on = bench.on_path(cands, roots, truth)
        base = bench.head_base(head, target, tokens, feats, (depth - 1) * top_k + 1)
        got = [bench.dynamic_counts(head, target, base, c, truth, args) for c in roots.split(4)]
        for i, r in enumerate(roots.tolist()):
            want = brute_candidates(head, target, tokens, feats, r, top_k, depth)
            paths = [candidate_path(cands, i, m) for m in range(cands.tokens.shape[1])]
            assert paths == [p for _, p in want] and cands.depths.tolist() == [len(p) for _, p in want]
            torch.testing.assert_close(cands.values[i], torch.stack([v for v, _ in want]), rtol=1e-5, atol=1e-5)
            assert on[i].tolist() == [p == truth.tolist()[r : r + len(p)] for p in paths]
            for size in args.sizes:
                n = int(got[i // 4][size][i % 4])
                assert n == brute_dynamic(want, truth.tolist(), r, size), (r, size)
                counts.append(n)
    assert max(counts) >= 3 and min(counts) == 0


def test_the_chain_is_what_the_head_drafts_and_what_acceptance_by_position_counts(setup):
    """Tree "1,1,1,1" per root == the leading drafted tokens of ``HeadDraft.propose`` (greedy, G = 4)
    that are the target's greedy tokens; its per-position hits == ``acceptance_by_position``'s greedy rates."""
    from flashspec_torch.drafts import Sequences
    from flashspec_torch.head_train import acceptance_by_position
    from flashspec_torch.heads import HeadDraft

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    draft = HeadDraft("head", head, target)
    for seq in seqs:
        tokens, feats, truth = views(bench, head, target, seq)
        t = len(seq.tokens)
        ranks = bench.chain_ranks(head, target, tokens, feats, truth, 4)
        roots = torch.arange(seq.prompt_len - 1, t - 4 + 1)
        got = bench.static_counts(bench.root_ranks(ranks, roots), (1, 1, 1, 1))
        for r, n in zip(roots.tolist(), got.tolist()):
            draft.start(1, 64)
            seqs_r = Sequences(tokens, torch.tensor([r + 1]), r + 1, features=feats)
            x = draft.propose(seqs_r, 4, SamplingConfig(0.0), None, 0).tokens[0]
            ok = (x == truth[r : r + 4]).long()
            assert n == int(ok.cumprod(0).sum()), r
        rates = acceptance_by_position(head, target, [seq], 4)["greedy"]
        for k in range(4):
            at = torch.arange(max(seq.prompt_len - 1, k + 1), t - 1)
            assert rates[k] == pytest.approx(float((ranks[k, at] == 0).float().mean()), abs=1e-6), k


def test_the_walk_over_chain_counts_takes_the_engines_steps(setup):
    """Greedy speculation with the head at G = 4 (``flashspec.loop.speculate``) accepts, step by step,
    what ``walk`` reads off the teacher-forced chain counts (the steps whose root has all 4 positions)."""
    from flashspec.loop import SpecConfig, speculate
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import HeadDraft
    from schedules import Cycle

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    backend = TorchBackend(target, [HeadDraft("head", head, target)])
    for seq in seqs:
        tokens, feats, truth = views(bench, head, target, seq)
        roots = torch.arange(seq.prompt_len - 1, len(seq.tokens) - 4 + 1)
        counts = bench.static_counts(bench.root_ranks(bench.chain_ranks(head, target, tokens, feats, truth, 4), roots),
                                     (1, 1, 1, 1))
        steps = bench.walk(counts)
        with torch.inference_mode():
            out, records = speculate(backend, Cycle([0]), [seq.tokens[: seq.prompt_len]], sampling=SamplingConfig(0.0),
                                     spec=SpecConfig(gamma=4, max_new_tokens=NEW))
        assert out[0] == seq.tokens[seq.prompt_len :]
        assert [r.accepted for r in records][: len(steps) - 1] == steps[:-1]  # the last may run past NEW
        assert len(set(steps)) > 1


def test_walk_steps_by_the_tokens_emitted():
    bench = load_benchmark("head_tree_cpu")
    assert bench.walk(torch.tensor([0, 2, 0, 0, 1, 0, 3])) == [0, 2, 1, 3]


@pytest.mark.parametrize("top_k,depth", [(3, 4), (2, 6)])
def test_the_drafted_tree_is_in_verify_trees_format_with_the_best_candidates(setup, top_k, depth):
    """``draft_tree``'s trees pass ``contract.check_tree_args`` and ``tree.tree_depths``; the nodes are the
    candidates of highest value and each node's parent is its path's parent."""
    import numpy as np

    from flashspec.contract import check_tree_args
    from flashspec.tree import tree_depths
    from flashspec_torch.head_tree import candidate_count, select_tree

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    tokens, feats, _ = views(bench, head, target, seqs[1])
    roots = torch.arange(seqs[1].prompt_len - 1, len(seqs[1].tokens) - depth + 1)
    cands = expand_roots(bench, head, target, tokens, feats, roots, top_k, depth)
    for size in (1, 5, 9, candidate_count(top_k, depth)):
        tree = select_tree(cands, size)
        b = len(roots)
        assert check_tree_args(np.zeros((b, size + 1, V), np.float32), tree.tokens.numpy(), tree.parents.numpy(),
                               tree.sizes.numpy(), np.zeros(b, np.int64), np.zeros(b, np.int64)) == (b, size, V)
        for i in range(b):
            d = tree_depths(tree.tokens[i].numpy(), tree.parents[i].numpy(), size, V, depth, i)
            assert d.tolist() == cands.depths[tree.index[i]].tolist()
            kept = set(tree.index[i].tolist())
            assert min(cands.values[i, list(kept)]) >= max(
                [float(cands.values[i, m]) for m in range(cands.values.shape[1]) if m not in kept], default=-np.inf)
            for j in range(size):
                want = [candidate_path(cands, i, int(tree.index[i, j]))]
                got, a = [int(tree.tokens[i, j])], int(tree.parents[i, j])
                while a >= 0:
                    got, a = [int(tree.tokens[i, a])] + got, int(tree.parents[i, a])
                assert want == [got]


def test_with_top1_children_the_tree_is_the_heads_chain_draft(setup):
    """top_k = 1, depth = size = G: the tree is ``HeadDraft.propose``'s greedy draft of G tokens, a chain."""
    from flashspec_torch.drafts import Sequences
    from flashspec_torch.head_tree import copy_cache_rows, draft_tree
    from flashspec_torch.heads import HeadDraft

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    draft, g = HeadDraft("head", head, target), 5
    for seq in seqs:
        tokens, feats, _ = views(bench, head, target, seq)
        s, w, cache = bench.head_base(head, target, tokens, feats, g)
        t = len(seq.tokens)
        for r in range(seq.prompt_len - 1, t):
            draft.start(1, t + g)
            want = draft.propose(Sequences(tokens, torch.tensor([r + 1]), r + 1, features=feats), g, SamplingConfig(0.0),
                                 None, 0).tokens
            rows = copy_cache_rows(head.config, cache, torch.tensor([0]))  # draft_tree writes past r
            tree = draft_tree(head, target, s[[r]], w[[r]], rows, torch.tensor([r]), 1, g, g)
            assert tree.tokens.tolist() == want.tolist(), r
            assert tree.parents.tolist() == [list(range(-1, g - 1))] and tree.sizes.tolist() == [g]


def test_bad_tree_requests_are_refused(setup):
    from flashspec_torch.head_tree import draft_tree

    bench = load_benchmark("head_tree_cpu")
    target, head, seqs = setup
    tokens, feats, _ = views(bench, head, target, seqs[0])
    s, w, cache = bench.head_base(head, target, tokens, feats, 2)
    r = torch.tensor([2])
    assert draft_tree(head, target, s[[2]], w[[2]], cache, r, 2, 4, 14).tokens.shape == (1, 14)  # 2 + 3 * 4 candidates
    with pytest.raises(ValueError, match="size=15"):
        draft_tree(head, target, s[[2]], w[[2]], cache, r, 2, 4, 15)
    with pytest.raises(ValueError, match="top_k=8 exceeds"):
        draft_tree(head, target, s[[2]], w[[2]], cache, r, 8, 2, 4)
    with pytest.raises(ValueError, match="outside the head's cache"):
        draft_tree(head, target, s[[2]], w[[2]], cache, r, 2, cache.max_len, 2)
