"""Tree speculation as an engine step (flashspec_torch.tree_step), fp32 on the CPU: greedy tree speculation ==
greedy decoding token for token, with the target's K/V and the head's features of every committed position
equal to plain decoding's (a tiny random Llama and head, batch 4 at prompt lengths 1-8, rows ending at EOS,
tree / chain / n-gram arms in turn, eager and graphed code); at T = 0.7 with top-p the first two emitted tokens
follow the target's own joint law (the tiny model, and the embedded SmolLM2-135M with the shipped head's own
trees); on the embedded model 48 greedy tokens equal plain decoding's at batch 1 and 3, and the adaptive policy
runs a tree arm exactly. Hand mutants of the step (no cache compaction, features not moved, sampling dropped) fail."""

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.drafts import SHIPPED_HEAD
from flashspec.loop import SpecConfig, decode, speculate
from head_checks import check_first_two_tokens  # tests/head_checks.py
from schedules import Cycle  # tests/schedules.py
from test_head_engine import first_two_laws
from test_heads import random_head, target  # noqa: F401  (the tiny target fixture)


def no_compaction(cache, base, kept):  # the mutant: the accepted nodes' K/V stay at their slots' rows
    pass


def features_not_moved(features, feats, base, kept):  # the mutant: the scoring pass's features are dropped
    pass


MUTANTS = {"compact_tree_cache": no_compaction, "keep_features": features_not_moved}


def tiny_backend(target, graphs=False, size=6, top_k=3, scale=0.3, tree=None, eos=()):
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.heads import HeadDraft
    from flashspec_torch.tree_step import HeadTreeDraft

    head = random_head(target, scale=scale)
    kind = HeadTreeDraft if tree is None else tree
    drafts = [kind("head-tree", head, target, size, top_k), HeadDraft("head", head, target), LookupDraft("ngram")]
    return TorchBackend(target, drafts, eos, graphs=graphs)


def known_tree_draft(continuations, prompt_lens, seed=0):
    """A HeadTreeDraft (the head runs and is fed as usual) whose trees are replaced by a depth-3 tree of 6
    nodes built from the known greedy continuation x of each row: the root's children x1 then a wrong
    token; under x1 a wrong token then x2 (so the kept slots move); under x2 x3 and a wrong one. At a random
    depth per row and step the true token is replaced by a wrong one, so accepted paths of every depth 0-3
    occur in every batch."""
    from flashspec_torch.head_tree import DraftTree
    from flashspec_torch.tree_step import HeadTreeDraft

    rng = np.random.default_rng(seed)

    class KnownTree(HeadTreeDraft):
        def draft_tree(self, seqs, gamma, graphed=False):
            tree, _ = super().draft_tree(seqs, gamma, graphed)
            v = self.target.config.vocab_size
            rows = []
            for b, n in enumerate(seqs.length.tolist()):
                done = n - prompt_lens[b]
                x = [continuations[b][min(done + k, len(continuations[b]) - 1)] for k in range(3)]
                cut = int(rng.integers(0, 4))  # depths >= cut + 1 are wrong
                c = [t if k < cut else (t + 2) % v for k, t in enumerate(x)]
                rows.append([c[0], (c[0] + 1) % v, (c[1] + 1) % v, c[1], c[2], (c[2] + 1) % v])
            tokens = torch.tensor(rows)
            parents = torch.tensor([[-1, -1, 0, 0, 3, 3]]).expand(len(rows), -1)
            size = torch.full((len(rows),), 6)
            return DraftTree(tokens, parents, size, tree.index[:, :1].expand(-1, 6)), torch.full((len(rows),), 3)

    return KnownTree


def fixed_tree_draft(tokens, parents):
    """A HeadTreeDraft (the head runs and is fed as usual) whose every tree is ``tokens`` / ``parents`` [N]."""
    from flashspec_torch.head_tree import DraftTree
    from flashspec_torch.tree_step import HeadTreeDraft

    class FixedTree(HeadTreeDraft):
        def draft_tree(self, seqs, gamma, graphed=False):
            tree, depth = super().draft_tree(seqs, gamma, graphed)
            b, n = tree.tokens.shape[0], len(tokens)
            return (DraftTree(torch.tensor([tokens]).expand(b, -1), torch.tensor([parents]).expand(b, -1),
                              torch.full((b,), n), tree.index[:, :1].expand(-1, n)), depth)

    return FixedTree


def committed_state(backend):  # per row: the target's K/V and the features of positions < length - 1
    out = []
    for b, n in enumerate(backend.seqs.length.tolist()):
        out.append((backend.cache.k[:, b, :, : n - 1].clone(), backend.cache.v[:, b, :, : n - 1].clone(),
                    backend.seqs.features[b, : n - 1].clone()))
    return out


PROMPTS_TINY = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18], [19]]


def run_greedy(target, graphs=False, known=True, eos=()):
    """(plain tokens, plain state, tree-speculative tokens, its state, records): tree / chain / n-gram arms in turn."""
    greedy = SamplingConfig(0.0)
    with torch.inference_mode():
        plain, _ = decode(tiny_backend(target, graphs, eos=eos), PROMPTS_TINY, sampling=greedy, max_new_tokens=24)
        tree = known_tree_draft(plain, [len(p) for p in PROMPTS_TINY]) if known else None
        backend = tiny_backend(target, graphs, tree=tree, eos=eos)
        decode(backend, PROMPTS_TINY, sampling=greedy, max_new_tokens=24)
        want = committed_state(backend)
        spec, records = speculate(backend, Cycle([0, 0, 1, 0, 2, 0, 0, 1, 1, 0]), PROMPTS_TINY, sampling=greedy,
                                  spec=SpecConfig(gamma=3, max_new_tokens=24))
        got = committed_state(backend)
    return plain, want, spec, got, records


def states_equal(want, got) -> bool:
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for w, g in zip(want, got) for a, b in zip(w, g))


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("known", [True, False])
def test_greedy_tree_speculation_equals_greedy_decoding(target, graphs, known):
    """Known trees (every accepted depth 0-3, kept slots that move) and the random head's own trees."""
    plain, want, spec, got, records = run_greedy(target, graphs, known)
    assert spec == plain
    assert states_equal(want, got)  # K/V compacted, features moved: the cache is plain decoding's
    tree = [r for r in records if r.arm == 0]
    assert all(r.drafted <= 3 * r.rows for r in tree)  # drafted: the depth per row, at most G
    if known:
        assert {n for r in tree for n in r.row_accepted} >= {0, 1, 2, 3}


def run_sampled(target, graphs, guard=False):
    """(tokens, committed state, step records): T = 0.7 with top-p 0.9, per-row seeds, tree / chain / n-gram arms
    in turn; ``guard``: every graphed step under host_sync.no_host_reads."""
    from host_sync import GuardedSteps  # tests/torch/host_sync.py

    backend = tiny_backend(target, graphs)
    if guard:
        backend.graphs = GuardedSteps(backend)
    with torch.inference_mode():
        out, records = speculate(backend, Cycle([0, 0, 1, 0, 2, 0]), PROMPTS_TINY, sampling=SamplingConfig(0.7, 0, 0.9),
                                 spec=SpecConfig(gamma=3, max_new_tokens=20), seed=torch.arange(len(PROMPTS_TINY)) + 5)
    return out, committed_state(backend), records, backend


def test_the_graphed_tree_step_equals_the_eager_one_when_sampling(target):
    """graphs=True off CUDA (StaticSteps: the fixed-shape code a CUDA graph captures, run eagerly) against the
    eager step at T = 0.7 with top-p: the same tokens, target K/V and head features (greedy: the test above)."""
    eager, eager_state, records, _ = run_sampled(target, False)
    graphed, graphed_state, _, _ = run_sampled(target, True)
    assert graphed == eager
    assert states_equal(eager_state, graphed_state)
    assert {n for r in records if r.arm == 0 for n in r.row_accepted} >= {0, 1}


def test_the_graphed_tree_step_reads_nothing_to_the_host(target, monkeypatch):
    """Every graphed step (tree, chain head, n-gram) run with tensor.item / tolist / cpu / numpy / bool / int /
    float / index / np.asarray patched to raise: a host read there would break CUDA-graph capture; and no Python
    attribute of the backend or its drafts rebound inside (a replay would skip it). The guard catches a host
    read (the tree's select_tree with its host check on)."""
    from flashspec_torch import head_tree, tree_step

    out, _, _, backend = run_sampled(target, True, guard=True)
    assert {k[0] for k in backend.graphs.replays} >= {"tree", "spec"}
    assert out == run_sampled(target, False)[0]
    monkeypatch.setattr(tree_step, "select_tree", lambda cands, size, validate: head_tree.select_tree(cands, size))
    with pytest.raises(AssertionError, match="host read in a graphed step: Tensor.__bool__"):
        run_sampled(target, True, guard=True)


def test_rows_finishing_at_eos_mid_path(target):
    """An EOS token that ends the rows at different steps (some inside an accepted path): the tokens, cut
    there, and the K/V and features of the rows still running equal plain decoding's."""
    with torch.inference_mode():
        free, _ = decode(tiny_backend(target), PROMPTS_TINY, sampling=SamplingConfig(0.0), max_new_tokens=24)
    eos = (free[0][9],)  # row 0 ends at its 10th token at the latest
    plain, want, spec, got, _ = run_greedy(target, eos=eos)
    assert spec == plain and len(plain[0]) <= 10 and len({len(t) for t in plain}) > 1
    assert states_equal(want, got)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_broken_tree_step_is_caught(target, monkeypatch, name):
    from flashspec_torch import tree_step

    monkeypatch.setattr(tree_step, name, MUTANTS[name])
    plain, want, spec, got, _ = run_greedy(target)
    assert not states_equal(want, got)
    if name == "compact_tree_cache":
        assert spec != plain  # stale K/V change the target's tokens; dropped features only cost acceptance


def sampling_dropped(logits, tokens, parents, **kwargs):  # the mutant: verify_tree at T = 1 without top-p
    from flashspec_torch.tree_verify import verify_tree

    return verify_tree(logits, tokens, parents, **{**kwargs, "temperature": 1.0, "top_p": 1.0})


@pytest.mark.parametrize("mutant", [None, sampling_dropped])
def test_sampled_first_two_tokens_follow_the_target_with_a_tree(target, monkeypatch, mutant):
    """T = 0.7, top-p 0.9, 3,000 rows, a tree of 6 nodes at every step (the target's top 3 first tokens, the
    first's top 2 and the second's top 1 next tokens, so that paths of depth 0, 1 and 2 all occur): the
    first token's law and the first two tokens' joint law (chi-square) are the target's own p(t1) p(t2 | t1),
    computed by plain forward passes; with the step's sampling settings dropped (verify at T = 1) they are not."""
    from flashspec_torch import tree_step

    if mutant:
        monkeypatch.setattr(tree_step, "verify_tree", mutant)
    sampling, prompt, n = SamplingConfig(0.7, 0, 0.9), [5, 6, 7], 3000
    first, p1, p2 = first_two_laws(target, prompt, sampling)
    a, b, c = np.argsort(-p1, kind="stable")[:3].tolist()
    under = lambda t, k: np.argsort(-p2[first.tolist().index(t)], kind="stable")[:k].tolist()  # noqa: E731
    tree = fixed_tree_draft([a, b, c, *under(a, 2), *under(b, 1)], [-1, -1, -1, 0, 0, 1])
    backend = tiny_backend(target, scale=0.1, tree=tree)
    with torch.inference_mode():
        out, records = speculate(backend, Cycle([0]), [prompt] * n, sampling=sampling,
                                 spec=SpecConfig(gamma=2, max_new_tokens=3), seed=torch.arange(n))
    assert all(len(t) == 3 for t in out)
    if mutant is None:
        depths = np.bincount(records[0].row_accepted, minlength=3)
        assert depths[1] > 200 and depths[2] > 10, depths  # about 2660 / 310 / 25 rows stop at depth 0 / 1 / 2
        check_first_two_tokens(out, first, p1, p2)
    else:
        with pytest.raises(AssertionError, match="first t"):
            check_first_two_tokens(out, first, p1, p2)


def test_tree_draft_refusals(target):
    from flashspec_torch.slots import TorchSlotBackend
    from flashspec_torch.tree_step import HeadTreeDraft

    head = random_head(target)
    with pytest.raises(ValueError, match="size=0"):
        HeadTreeDraft("t", head, target, 0)
    backend = tiny_backend(target)
    with torch.inference_mode(), pytest.raises(ValueError, match=r"use G <= 22"):
        speculate(backend, Cycle([0]), [[1, 2]], sampling=SamplingConfig(0.0), spec=SpecConfig(gamma=23, max_new_tokens=4))
    slots = TorchSlotBackend(target, backend.drafts)
    with pytest.raises(ValueError, match="serving slots do not run yet"):
        slots.open_slots(2, 32)


# -- the embedded model with the shipped head

PROMPTS = ["def mean(values):\n    \"\"\"Return the arithmetic mean of values.\"\"\"\n",
           "The garbage collector frees memory that is no longer reachable, and",
           "Once upon a time, in a small village,"]


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_greedy_tree_speculation_equals_greedy_decoding_on_the_embedded_model():
    """48 greedy tokens of head-tree/16 at depth 5 == plain decoding's, batch 3 (prompts of 9 to 17 tokens)
    and each prompt alone."""
    from flashspec_torch.engine import Engine

    engine = Engine(None, ("head-tree/16",), policy="fixed", device="cpu")
    common = dict(temperature=0.0, max_new_tokens=48, chat=False)
    plain = engine.generate(PROMPTS, speculation=False, **common)["tokens"]
    assert min(len(t) for t in plain) == 48 and len({len(engine.encode(p, False)) for p in PROMPTS}) == 3
    spec = engine.generate(PROMPTS, speculation=True, gamma=5, **common)
    assert spec["tokens"] == plain
    assert spec["new_tokens"] / spec["steps"] > 2 * len(PROMPTS)  # more than 2 tokens per row and step
    for prompt, want in zip(PROMPTS, plain):
        assert engine.generate(prompt, speculation=True, gamma=5, **common)["tokens"] == want, prompt


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_the_adaptive_policy_runs_a_tree_arm_exactly():
    """The adaptive policy over {head-tree/8x4, head, ngram} (arms at G = 4 and 2: tree depths 4 and 2),
    greedy, 32 tokens: plain decoding's tokens, and the tree arm was run (it is priced like any arm)."""
    from flashspec_torch.engine import Engine

    engine = Engine(None, ("head-tree/8x4", "head", "ngram"), policy="adaptive", device="cpu")
    common = dict(temperature=0.0, max_new_tokens=32, chat=False)
    plain = engine.generate(PROMPTS[1], speculation=False, **common)["tokens"]
    spec = engine.generate(PROMPTS[1], speculation=True, gamma=4, **common)
    assert spec["tokens"] == plain
    assert spec["arm_pulls"]["head-tree/8x4"] > 0, spec["arm_pulls"]


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_sampled_first_two_tokens_follow_the_embedded_model_with_a_tree():
    """The shipped head's own trees (head-tree/4x2 at G = 2: 4 nodes, 2 children per frontier node) on the
    embedded model, T = 0.7, top-p 0.9, 200 rows: the first token's and the first two tokens' joint law,
    chi-square against the target's p(t1) p(t2 | t1) from plain forward passes (as the chain head's test)."""
    from flashspec_torch.engine import Engine

    engine = Engine(None, ("head-tree/4x2",), policy="fixed", device="cpu")
    prompt, n, sampling = "My favourite colour is", 200, SamplingConfig(temperature=0.7, top_p=0.9)
    laws = first_two_laws(engine.target.model, engine.encode(prompt, chat=False), sampling)
    with torch.inference_mode():
        out = engine.generate([prompt] * n, seed=list(range(n)), temperature=0.7, top_p=0.9, max_new_tokens=2, gamma=2,
                              chat=False)
    check_first_two_tokens(out["tokens"], *laws)
    assert out["acceptance"] > 0.1  # the trees' nodes were accepted often enough to matter


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_stop_below_is_refused_for_a_tree_alone():
    from flashspec_torch.engine import Engine

    with pytest.raises(ValueError, match=r"fixed length \(a tree too\)"):
        Engine(None, ("head-tree",), device="cpu", stop_below=0.1)


@pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")
def test_a_graphed_head_step_after_a_wider_one_feeds_every_position():
    """Arms at G = 4 then G = 2 in turn (the adaptive policy's G and G // 2 share one draft), tree and chain head,
    greedy, embedded model: the graphed code (host_sync.GuardedSteps: no host reads, no host state set inside, which
    a CUDA-graph replay would skip) accepts exactly what the eager code does at every step.
    A graphed step feeds the head G + 1 positions; after a step at G = 4 that accepted 4, 5 are unfed, and without
    the catch-up (``HeadDraft.lagging(seqs, gamma)``) the head drafts from a state missing positions (fewer accepted)."""
    from flashspec_torch.engine import Engine
    from host_sync import GuardedSteps  # tests/torch/host_sync.py

    engine = Engine(None, ("head-tree/8x4", "head"), policy="fixed", device="cpu", stop_below=0.0)  # G tokens always
    b, ids = engine.backend, engine.encode(PROMPTS[1], False)
    accepted = {}
    for graphed in (False, True):
        b.graphed, b.graphs, b.shape = graphed, GuardedSteps(b) if graphed else None, None
        with torch.inference_mode():
            b.prefill([ids], 40)
            accepted[graphed] = [(arm, g, int(b.step(arm, g, SamplingConfig(0.0), 0, i).fetch().num_accepted[0]))
                                 for i, (arm, g) in enumerate([(0, 4), (0, 2), (1, 4), (1, 2)] * 5)]
    assert accepted[True] == accepted[False]
    assert any(g == 4 and n >= 3 for _, g, n in accepted[False])  # a step that left more than 3 positions unfed
