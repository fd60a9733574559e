"""The shipped draft head on the real embedded model (SmolLM2-135M-Instruct, fp32 on the CPU):
greedy speculation equals greedy decoding, and at T = 0.7 with top-p and the dynamic draft length the
first two emitted tokens follow the target's own joint law."""

import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.drafts import SHIPPED_HEAD
from head_checks import check_first_two_tokens, check_greedy_equals_plain  # tests/head_checks.py
from prompts import HEAD_PROMPTS as PROMPTS  # tests/prompts.py

pytestmark = pytest.mark.skipif(not SHIPPED_HEAD.is_file(), reason="no trained head ships in this checkout")


@pytest.fixture(scope="module")
def engine():
    from flashspec_torch.engine import Engine

    return Engine(None, ("head",), policy="fixed", device="cpu")


def test_greedy_head_speculation_equals_greedy_decoding(engine):
    spec = check_greedy_equals_plain(engine, PROMPTS)
    assert spec["acceptance"] > 0.2  # the head really drafted (about 0.5 per position held out)


def first_two_laws(model, ids: list[int], sampling: SamplingConfig):  # -> first [F], p1 [V], p2 [F, V] (NumPy)
    """The target's own law of the first token after ``ids`` (``first``: the ids it can draw) and of the
    second after each of them, by plain forward passes: what ``check_first_two_tokens`` compares with."""
    from flashspec_torch.reference import log_probs

    k = len(ids) + 1
    with torch.inference_mode():
        z1 = model(torch.tensor([ids]), torch.arange(k - 1)[None], model.new_cache(1, k - 1), k - 1, logits_last=1)[0, 0]
        p1 = log_probs(z1, sampling).exp().double()  # [V]
        first = torch.nonzero(p1 > 0)[:, 0]  # the nucleus of the first token
        seqs = torch.tensor([ids + [t] for t in first.tolist()])
        z2 = model(seqs, torch.arange(k)[None].expand(len(first), -1), model.new_cache(len(first), k), k,
                   logits_last=1)[:, 0]
        p2 = log_probs(z2, sampling).exp().double()  # [F, V]
    return first.numpy(), p1.numpy(), p2.numpy()


def test_sampled_first_two_tokens_follow_the_target_with_the_head(engine, monkeypatch):
    """T = 0.7, top-p 0.9, G = 2, with the dynamic draft length (``stop_below`` 0.05: a row stops after
    a token the head gives q < 0.05 at temperature 1; about a third of the rows propose one token, the
    rest two): the first token's law and the first two tokens' joint law, chi-square against the
    target's own p(t1) p(t2 | t1) computed by plain forward passes. A short prompt with a few likely
    continuations keeps the rows cheap and the bins full."""
    draft = engine.backend.drafts[0]
    monkeypatch.setattr(draft, "stop_below", 0.05)
    lengths, propose = [], draft.propose

    def recorded(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        lengths.append(proposal.lengths)
        return proposal

    monkeypatch.setattr(draft, "propose", recorded)

    prompt, n = "My favourite colour is", 200
    laws = first_two_laws(engine.target.model, engine.encode(prompt, chat=False), SamplingConfig(0.7, top_p=0.9))
    with torch.inference_mode():
        out = engine.generate([prompt] * n, seed=list(range(n)), temperature=0.7, top_p=0.9, max_new_tokens=2, gamma=2,
                              chat=False)
    check_first_two_tokens(out["tokens"], *laws)
    assert out["acceptance"] > 0.1  # the head's drafts were accepted often enough to matter
    assert 0.15 < float((lengths[0] == 1).float().mean()) < 0.85  # both lengths are common


def test_the_shipped_head_drafts_valid_trees_and_its_top1_tree_is_its_chain(engine):
    """``head_tree.draft_tree`` with the shipped head after each of the last 6 prompt positions (a batch of 6
    roots): EAGLE-2's 32-node tree (top_k 8, depth 6) passes ``check_tree_args`` / ``tree_depths``, and with
    top_k = 1 the tree is ``HeadDraft.propose``'s greedy draft of G = 6 tokens."""
    import numpy as np

    from benchmark_modules import load_benchmark  # tests/benchmark_modules.py
    from flashspec.contract import check_tree_args
    from flashspec.tree import tree_depths
    from flashspec_torch.drafts import Sequences
    from flashspec_torch.head_tree import copy_cache_rows, draft_tree
    from flashspec_torch.heads import HeadDraft

    bench = load_benchmark("head_tree_cpu")
    draft = engine.backend.drafts[0]
    head, target, g = draft.head, draft.target, 6
    tokens = torch.tensor([engine.encode(PROMPTS[2], False)])  # [1, T]
    t, v = tokens.shape[1], target.config.vocab_size
    feats, _, _ = bench.target_view(target, tokens, head.feature_layers)
    s, w, cache = bench.head_base(head, target, tokens, feats, 5 * 8 + 1)
    roots = torch.arange(t - g, t)
    rows = copy_cache_rows(head.config, cache, torch.zeros(g, dtype=torch.int64))
    tree = draft_tree(head, target, s[roots], w[roots], rows, roots, 8, 6, 32)
    assert check_tree_args(np.zeros((g, 33, v), np.float32), tree.tokens.numpy(), tree.parents.numpy(),
                           tree.sizes.numpy(), np.zeros(g, np.int64), np.zeros(g, np.int64)) == (g, 32, v)
    depths = [tree_depths(tree.tokens[i].numpy(), tree.parents[i].numpy(), 32, v, 6, i) for i in range(g)]
    assert max(int(d.max()) for d in depths) >= 2  # the trees are not one level
    chain = draft_tree(head, target, s[roots], w[roots], rows, roots, 1, g, g)
    fresh = HeadDraft("head", head, target)
    for i, r in enumerate(roots.tolist()):
        fresh.start(1, t + g)
        want = fresh.propose(Sequences(tokens, torch.tensor([r + 1]), r + 1, features=feats), g, SamplingConfig(0.0),
                             None, 0).tokens
        assert chain.tokens[i].tolist() == want[0].tolist(), r
