"""flashspec.tree: the exact law of a tree step, the law of generated text, the chain as a special case,
malformed trees, and the mutants the laws must catch."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashspec import mutants
from flashspec import random as rng
from flashspec.config import SamplingConfig
from flashspec.pvalues import chi_square_test
from flashspec.reference import log_probs, verify
from flashspec.testing import exact_law
from flashspec.tree import TreeVerifier, expected_tokens, tree_law, verify_tree
from flashspec.tree_testing import (MALFORMED_TREES, TreeCase, assert_tree_exact, random_tree_case, run_tree_case,
                                    run_tree_suite, standard_tree_cases, stop_slots, token_paths, top_k_tree,
                                    tree_structure_problem)

ALPHA = 1e-4  # per test; a correct oracle fails one with this chance
CONFIGS = {"T1": SamplingConfig(1.0), "T0.7_top_p": SamplingConfig(0.7, 0, 0.85)}


def test_the_oracle_passes_the_tree_suite():
    report = assert_tree_exact(verify_tree)
    assert len(report.checks) == 2 * len(standard_tree_cases()) + 2


@pytest.mark.parametrize("mutant", mutants.TREE_MUTANTS, ids=lambda m: m.__name__)
def test_the_tree_suite_catches_the_mutants(mutant):
    failures = run_tree_suite(mutant()).failures
    assert any(c.name.startswith("chi-square") for c in failures), failures  # the law itself, not only structure


# ----------------------------------------------------------------------------- generated text


def tables(vocab: int):
    """A target and a draft (the target plus noise) whose logits depend on the last two tokens."""
    r = np.random.default_rng(5)
    target = (r.normal(size=(vocab + 1, vocab + 1, vocab)) * 1.5).astype(np.float32)
    return target, target + r.normal(size=target.shape).astype(np.float32)


def context_logits(table, ctx):  # ctx: the tokens so far -> [V]
    a, b = ([table.shape[0] - 1] * 2 + list(ctx))[-2:]
    return table[a, b]


def generate(cfg: SamplingConfig, rows: int, k: int, widths=(2, 2, 1), vocab: int = 4,
             verifier=verify_tree) -> np.ndarray:  # -> [rows, k]
    """Speculative generation by tree steps until every row has k tokens; rows carry their own seeds and
    trees of their own (the batch pads with tree_sizes)."""
    target, draft = tables(vocab)
    text = [[] for _ in range(rows)]
    for step in range(k):
        trees = [top_k_tree(lambda p, c=tuple(c): context_logits(draft, c + p), widths) for c in text]
        n = max(len(t) for t, _ in trees)
        z = np.zeros((rows, n + 1, vocab), np.float32)
        tokens, parents = np.full((rows, n), -1), np.full((rows, n), -1)
        sizes = np.array([len(t) for t, _ in trees])
        for r, (t, a) in enumerate(trees):
            tokens[r, : len(t)], parents[r, : len(t)] = t, a
            for s, p in enumerate(token_paths(t, a)):
                z[r, s] = context_logits(target, text[r] + list(p))
        res = verifier(z, tokens, parents, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                       seed=np.arange(rows, dtype=np.uint64) + 100, offset=step, tree_sizes=sizes)
        for r in range(rows):
            text[r] += [int(t) for t in res.tokens[r, : res.num_accepted[r] + 1]]
    return np.array([t[:k] for t in text])


def target_law(cfg: SamplingConfig, k: int, vocab: int = 4) -> np.ndarray:  # -> [V] * k
    target, _ = tables(vocab)
    law = np.ones([vocab] * k)
    for seq in np.ndindex(*law.shape):
        for i in range(k):
            law[seq] *= np.exp(log_probs(context_logits(target, list(seq[:i])), cfg).astype(np.float64))[seq[i]]
    return law / law.sum()


def text_p_value(cfg: SamplingConfig, verifier=verify_tree, rows: int = 4000, k: int = 3) -> float:
    """Chi-square of the first k generated tokens' joint counts against the target's own law."""
    text = generate(cfg, rows, k, verifier=verifier)
    counts = np.zeros([4] * k)
    np.add.at(counts, tuple(text.T), 1)
    return chi_square_test(counts, target_law(cfg, k))[1]


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_generated_text_has_the_targets_law(cfg):
    assert text_p_value(cfg) > ALPHA


@pytest.mark.parametrize("mutant", mutants.TREE_MUTANTS, ids=lambda m: m.__name__)
def test_tree_mutants_generate_text_of_another_law(mutant):
    assert text_p_value(CONFIGS["T1"], mutant()) < ALPHA


def test_greedy_generation_is_greedy_decoding():
    target, _ = tables(4)
    text = generate(SamplingConfig(0.0), rows=1, k=12)[0]
    for i in range(12):
        assert text[i] == context_logits(target, list(text[:i])).argmax()


# ----------------------------------------------------------------------------- the chain as a special case


class ChainStreams(TreeVerifier):
    """The tree walk drawing the chain oracle's numbers: node j's uniform is the chain's accept uniform of
    position j, slot s's noise the chain's FINAL noise of row s."""

    def accept_uniforms(self, c, n):
        return rng.uniform(c.seed[:, None], c.offset[:, None], c.row[:, None], np.arange(n)[None], 0, rng.ACCEPT)

    def final_gumbel(self, c, r, slot, v):
        return rng.gumbel(c.seed[r], c.offset[r], c.row[r], slot, np.arange(v), rng.FINAL)


@pytest.mark.parametrize("cfg", [*CONFIGS.values(), SamplingConfig(0.0)], ids=[*CONFIGS.keys(), "greedy"])
def test_a_chain_is_the_chain_oracle(cfg):
    b, g, v = 3000, 4, 6
    r = np.random.default_rng(7)
    z = (r.normal(size=(b, g + 1, v)) * 2).astype(np.float32)
    x = np.where(r.random((b, g)) < 0.6, z[:, :-1].argmax(-1), r.integers(0, v, (b, g)))
    parents = np.tile(np.arange(-1, g - 1), (b, 1))
    lengths = r.integers(0, g + 1, b)  # the chain's L_b is the tree's size; L_b = 0: plain decoding
    lengths[0] = g
    kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=9, offset=2)
    chain = verify(z, x, draft_lengths=lengths, **kw)
    tree = ChainStreams()(z, x, parents, tree_sizes=lengths, **kw)
    np.testing.assert_array_equal(tree.num_accepted, chain.num_accepted)
    np.testing.assert_array_equal(tree.tokens, chain.tokens)
    if not cfg.greedy:
        lp = log_probs(z[0], cfg)
        np.testing.assert_allclose(tree_law(lp, x[0], parents[0]), exact_law(lp, None, x[0]), atol=1e-12)


def test_expected_tokens_is_the_mean_step_and_the_chains_product():
    case = standard_tree_cases()[0]
    n = 6000
    num_accepted = np.asarray(run_tree_case(verify_tree, case, n, seed=5)[0])
    want = expected_tokens(log_probs(case.target_logits, case.sampling), case.tokens, case.parents)
    assert abs((num_accepted + 1).mean() - want) < 4.5 * (num_accepted + 1).std() / np.sqrt(n)
    lp = log_probs(np.random.default_rng(3).normal(size=(4, 6)).astype(np.float32), SamplingConfig(1.0))
    x = np.array([1, 4, 0])
    a = np.exp(lp[np.arange(3), x].astype(np.float64))
    assert np.isclose(expected_tokens(lp, x, np.array([-1, 0, 1])), 1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])


# ----------------------------------------------------------------------------- any tree (Hypothesis)


@st.composite
def trees(draw):
    v = draw(st.integers(2, 6))
    n = draw(st.integers(1, 9))
    tokens, parents, used = [], [], {}
    for _ in range(n):
        a = draw(st.integers(-1, len(tokens) - 1))
        free = [t for t in range(v) if t not in used.setdefault(a, set())]
        if free:  # a parent whose every token is a child already takes no more
            t = draw(st.sampled_from(free))
            used[a].add(t)
            tokens.append(t)
            parents.append(a)
    seed = draw(st.integers(0, 2**32 - 1))
    spread = draw(st.sampled_from([0.5, 3.0]))
    z = (np.random.default_rng(seed).normal(size=(len(tokens) + 1, v)) * spread).astype(np.float32)
    return z, np.array(tokens), np.array(parents), seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.sampled_from([SamplingConfig(1.0), SamplingConfig(0.7, 0, 0.8), SamplingConfig(0.0)]))
def test_any_tree_emits_a_path_then_a_non_child(case, cfg):
    z, tokens, parents, seed = case
    kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed)
    rows = 16
    res = verify_tree(np.tile(z, (rows, 1, 1)), np.tile(tokens, (rows, 1)), np.tile(parents, (rows, 1)), **kw)
    assert tree_structure_problem(TreeCase("h", z, tokens, parents, cfg), res.num_accepted, res.tokens, res.path) == ""
    slots = stop_slots(res.num_accepted, res.path)
    y = res.tokens[np.arange(rows), res.num_accepted]
    if cfg.greedy:
        on_path = [tokens[j] == z[0 if i == 0 else p[i - 1] + 1].argmax() for p, n in zip(res.path, res.num_accepted)
                   for i, j in enumerate(p[:n])]
        assert all(on_path) and (y == z[slots].argmax(-1)).all()
    else:
        law = tree_law(log_probs(z, cfg), tokens, parents)
        assert abs(law.sum() - 1) < 1e-9 and (law >= 0).all() and (law[slots, y] > 0).all()
    again = verify_tree(np.tile(z, (rows, 1, 1)), np.tile(tokens, (rows, 1)), np.tile(parents, (rows, 1)), **kw)
    np.testing.assert_array_equal(again.tokens, res.tokens)


def test_a_row_alone_equals_the_row_in_a_padded_batch():
    cases = [random_tree_case("pad", s, 5, w, SamplingConfig(1.0)) for s, w in ((0, (2, 1)), (1, (3, 2, 1)), (2, (1,)))]
    rows = [(c.target_logits, c.tokens, c.parents) for c in cases]
    n = max(len(t) for _, t, _ in rows)
    z = np.zeros((3, n + 1, 5), np.float32)
    tokens, parents = np.full((3, n), -1), np.full((3, n), -1)
    for r, (zr, t, a) in enumerate(rows):
        z[r, : len(t) + 1], tokens[r, : len(t)], parents[r, : len(t)] = zr, t, a
    seeds = np.array([4, 5, 6], np.uint64)
    batch = verify_tree(z, tokens, parents, seed=seeds, tree_sizes=np.array([len(t) for _, t, _ in rows]))
    for r, (zr, t, a) in enumerate(rows):
        alone = verify_tree(zr[None], t[None], a[None], seed=seeds[r : r + 1])
        width = alone.tokens.shape[1]
        np.testing.assert_array_equal(batch.tokens[r, :width], alone.tokens[0])
        assert (batch.tokens[r, width:] == -1).all()


# ----------------------------------------------------------------------------- malformed trees


def call(tokens, parents, n_rows=None, vocab=4, **kw):
    tokens, parents = np.array([tokens]), np.array([parents])
    z = np.zeros((1, (n_rows or tokens.shape[1]) + 1, vocab), np.float32)
    return verify_tree(z, tokens, parents, **kw)


@pytest.mark.parametrize("tokens,parents,kw,message", MALFORMED_TREES)
def test_malformed_trees_are_refused(tokens, parents, kw, message):
    with pytest.raises(ValueError, match=message):
        call(tokens, parents, **kw)


def test_empty_tree_and_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="empty tree"):
        verify_tree(np.zeros((1, 1, 4), np.float32), np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64))
    with pytest.raises(ValueError, match=r"tree_parents has shape \[1, 1\]; expected \[B, N\] = \[1, 2\]"):
        verify_tree(np.zeros((1, 3, 4), np.float32), np.zeros((1, 2), np.int64), np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="NaN"):
        verify_tree(np.full((1, 2, 4), np.nan, np.float32), np.zeros((1, 1), np.int64), -np.ones((1, 1), np.int64))


def test_padding_past_tree_sizes_is_never_read():
    res = call([2, -7], [-1, 99], tree_sizes=np.array([1]), temperature=0.0)
    assert res.tokens.shape == (1, 2)


def test_a_path_of_exactly_max_depth_is_accepted_whole():
    z = np.full((1, 4, 4), -np.inf, np.float32)
    z[0, np.arange(4), [1, 2, 3, 0]] = 0.0  # the target is sure of 1, 2, 3, then 0
    res = verify_tree(z, np.array([[1, 2, 3]]), np.array([[-1, 0, 1]]), max_depth=3, seed=1)
    assert res.num_accepted[0] == 3 and list(res.tokens[0]) == [1, 2, 3, 0] and list(res.path[0]) == [0, 1, 2]
