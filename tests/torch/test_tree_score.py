"""flashspec_torch.tree_score: one scoring pass over a draft tree gives every slot the logits of its own path
run causally (a causal mask or slot-index positions fail); compaction leaves a cache that decodes on exactly."""

import numpy as np
import pytest
import torch

from flashspec.tree import verify_tree
from flashspec.tree_layout import kept_slots
from flashspec.tree_testing import token_paths
from flashspec_torch import tree_score
from flashspec_torch.model import Llama, LlamaConfig
from flashspec_torch.tree_score import TreePass, compact_tree_cache, score_tree

V = 61


# the plain torch family layers (flashspec_torch.family): Qwen3-like, and Gemma-2-like without its sliding windows
FAMILY = {"qwen3": dict(qk_norm=True, attention_bias=True),
          "gemma2": dict(attn_softcap=20.0, final_softcap=15.0, sandwich_norms=True, norm_offset=1.0,
                         activation="gelu_tanh", embed_scale=32 ** 0.5, query_scale=0.3)}


def tiny(seed: int, **family) -> Llama:
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, tie_word_embeddings=False, max_position_embeddings=256, **family)
    torch.manual_seed(seed)
    m = Llama(cfg).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.4)
    return m


def causal_last(model, ids) -> torch.Tensor:  # [V]: the logits after ids, run causally on a fresh cache
    t = len(ids)
    return model(torch.tensor([ids]), torch.arange(t)[None], model.new_cache(1, t), t, logits_last=1)[0, 0]


def random_tree(r, model, prefix, n: int) -> tuple[list[int], list[int]]:
    """n nodes; a node takes its parent's greedy token when no sibling has (so paths go deep), else a fresh one.
    The root's first child is never its greedy token, its second (if any) is: the greedy path skips slot 1."""
    tokens, parents, paths = [], [], [()]
    for j in range(n):
        a = -1 if j < 2 else int(r.integers(-1, j))
        best = int(causal_last(model, [*prefix, *paths[a + 1]]).argmax())
        taken = {t for t, p in zip(tokens, parents) if p == a} | ({best} if j == 0 else set())
        greedy = j == 1 or (j > 1 and r.random() < 0.8)
        free = [t for t in r.integers(0, model.config.vocab_size, 4) if t not in taken]  # distinct siblings
        t = best if best not in taken and greedy else int(free[0])
        tokens.append(t)
        parents.append(a)
        paths.append(paths[a + 1] + (t,))
    return tokens, parents


def batch_case(seed: int, b: int = 3, n: int = 7, model: Llama | None = None):
    """A model (``tiny(seed)`` unless given), a cache holding each row's context (rows of different lengths), and
    padded trees per row."""
    r = np.random.default_rng(seed)
    model = tiny(seed) if model is None else model
    base = r.integers(1, 9, b)
    ctx = r.integers(0, model.config.vocab_size, (b, int(base.max()) + 1))  # row i: context ctx[i, :base[i]], then root
    cache = model.new_cache(b, 48)
    model(torch.from_numpy(ctx), torch.arange(ctx.shape[1]).expand(b, -1), cache, ctx.shape[1], logits_last=0)
    sizes = r.integers(1, n + 1, b)
    sizes[0] = n
    tokens, parents = np.zeros((b, n), np.int64), np.full((b, n), -1, np.int64)
    for i in range(b):
        tt, pp = random_tree(r, model, list(ctx[i, : base[i] + 1]), int(sizes[i]))
        tokens[i, : sizes[i]], parents[i, : sizes[i]] = tt, pp
    root = torch.from_numpy(ctx[np.arange(b), base])
    return model, cache, ctx, root, torch.from_numpy(base), tokens, parents, sizes


def scored_rows_match(seed: int, b: int = 3, n: int = 7, model: Llama | None = None, atol: float = 1e-5) -> bool:
    """score_tree's row per slot against the slot's path run causally, to fp32 tolerance (the row counts differ,
    so the products round differently: 1e-6 on the tiny model, 5e-5 on SmolLM2's logits of size 30)."""
    model, cache, ctx, root, base, tokens, parents, sizes = batch_case(seed, b, n, model)
    with torch.no_grad():
        z = score_tree(model, cache, root, torch.from_numpy(tokens), torch.from_numpy(parents), base,
                       torch.from_numpy(sizes))
        for i in range(len(sizes)):
            prefix = list(ctx[i, : base[i] + 1])
            for s, path in enumerate(token_paths(tokens[i, : sizes[i]], parents[i, : sizes[i]])):
                if not torch.allclose(z[i, s], causal_last(model, [*prefix, *path]), rtol=1e-5, atol=atol):
                    return False
    return True


@pytest.mark.parametrize("seed", range(4))
def test_every_slot_scores_its_own_path(seed):
    assert scored_rows_match(seed)


@pytest.mark.parametrize("family", sorted(FAMILY))
def test_the_family_layers_score_every_slot_as_its_path(family):
    assert all(scored_rows_match(seed, model=tiny(seed, **FAMILY[family])) for seed in range(2))


def test_the_embedded_smollm2_scores_every_slot_as_its_path():
    """The real model (SmolLM2-135M, 30 layers, GQA 9/3, fp32 CPU): two rows of five-node trees."""
    from flashspec_torch.weights import load

    assert scored_rows_match(0, b=2, n=5, model=load(None).model, atol=2e-4)


def causal_layout(pass_):
    rows, tp = pass_
    s = tp.mask.shape[-1]
    return rows, TreePass(tp.rope_positions, torch.arange(s)[None, None, None, :] <= rows[:, None, :, None])


def index_layout(pass_):
    rows, tp = pass_
    return rows, TreePass(rows, tp.mask)


@pytest.mark.parametrize("mutate", [causal_layout, index_layout])
def test_a_wrong_layout_fails(monkeypatch, mutate):
    right = tree_score.tree_pass
    monkeypatch.setattr(tree_score, "tree_pass", lambda *a: mutate(right(*a)))
    assert not any(scored_rows_match(seed) for seed in range(4))


def next_token_matches(seed: int, compact: bool = True) -> bool:
    """Score, verify greedily, compact; then decode the emitted token y on the cache and compare its logits with
    the causal run of "context, root, accepted path, y". Asserts that compaction had rows to move."""
    model, cache, ctx, root, base, tokens, parents, sizes = batch_case(seed, n=8)
    with torch.no_grad():
        z = score_tree(model, cache, root, torch.from_numpy(tokens), torch.from_numpy(parents), base,
                       torch.from_numpy(sizes))
        res = verify_tree(z.numpy(), tokens, parents, temperature=0.0, tree_sizes=sizes)
        kept = kept_slots(res)
        assert any((k[k >= 0] != np.arange((k >= 0).sum())).any() for k in kept), "no row's path needs moving"
        if compact:
            compact_tree_cache(cache, base, torch.from_numpy(kept).long())
        a = torch.from_numpy(res.num_accepted).long()
        y = torch.from_numpy(res.tokens[np.arange(len(a)), a.numpy()]).long()
        pos = base + a + 1  # y's position: after the root and the accepted path
        got = model(y[:, None], pos[:, None], cache, int(pos.max()) + 1)[:, 0]
        return all(torch.allclose(got[i], causal_last(model, [*ctx[i, : base[i] + 1], *res.tokens[i, : a[i] + 1]]),
                                  rtol=1e-5, atol=1e-5) for i in range(len(a)))


@pytest.mark.parametrize("seed", range(4))
def test_compacted_cache_decodes_the_next_token_exactly(seed):
    assert next_token_matches(seed)


def test_without_compaction_the_next_token_is_wrong():
    assert not any(next_token_matches(seed, compact=False) for seed in range(4))


def test_refuses_a_malformed_tree_and_a_short_cache():
    model, cache, _, root, base, tokens, parents, sizes = batch_case(0)
    bad = parents.copy()
    bad[0, 2] = 5  # a parent after its child
    with pytest.raises(ValueError, match="topological"):
        score_tree(model, cache, root, torch.from_numpy(tokens), torch.from_numpy(bad), base)
    windowed = tiny(0, sliding_windows=(4, 0))
    with pytest.raises(ValueError, match="sliding_windows"):
        score_tree(windowed, windowed.new_cache(3, 48), root, torch.from_numpy(tokens), torch.from_numpy(parents),
                   base, torch.from_numpy(sizes))
    with pytest.raises(ValueError, match="longer cache"):
        score_tree(model, model.new_cache(3, 8), root, torch.from_numpy(tokens), torch.from_numpy(parents), base + 4,
                   torch.from_numpy(sizes))


def test_a_chain_tree_is_bit_equal_to_the_chain_scoring_pass():
    """A tree that is one chain (node j's parent j - 1) feeds exactly what the chain's scoring pass feeds (rows,
    positions, mask): the logits are the same bits."""
    model, cache, ctx, root, base, _, _, _ = batch_case(5)
    r = np.random.default_rng(5)
    drafts = torch.from_numpy(r.integers(0, V, (3, 6)))
    chain = torch.arange(-1, 5).expand(3, -1)
    with torch.no_grad():
        tree = score_tree(model, cache, root, drafts, chain, base)
        pos = base[:, None] + torch.arange(7)
        plain = model(torch.cat([root[:, None], drafts], 1), pos, cache, int(base.max()) + 7)
    torch.testing.assert_close(tree, plain, rtol=0, atol=0)


def test_hidden_states_are_the_paths_own():
    """With ``hidden`` (a feature head's input), slot s's states are those of its path's last token run causally."""
    model, cache, ctx, root, base, tokens, parents, sizes = batch_case(3)
    with torch.no_grad():
        z, feats = score_tree(model, cache, root, torch.from_numpy(tokens), torch.from_numpy(parents), base,
                              torch.from_numpy(sizes), hidden=(0, 1))
        for i in range(len(sizes)):
            for s, path in enumerate(token_paths(tokens[i, : sizes[i]], parents[i, : sizes[i]])):
                ids = [*ctx[i, : base[i] + 1], *path]
                t = len(ids)
                _, want = model(torch.tensor([ids]), torch.arange(t)[None], model.new_cache(1, t), t, logits_last=1,
                                hidden=(0, 1))
                torch.testing.assert_close(feats[i, s], want[0, -1], rtol=1e-5, atol=1e-5)
    assert feats.shape == (3, 8, 2 * model.config.hidden_size)


def random_parents(r, b: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, N] parents (node j's in [-1, j), chains and stars mixed, garbage past the sizes) and sizes [B] (0 to N)."""
    parents = r.integers(-5, n + 5, size=(b, n))
    sizes = r.integers(0, n + 1, size=b)
    sizes[0], sizes[-1] = n, 0
    for row in range(b):
        for j in range(sizes[row]):
            parents[row, j] = j - 1 if r.random() < 0.5 else r.integers(-1, j)
    return parents, sizes


@pytest.mark.parametrize("n", [1, 2, 7, 16, 64])
def test_the_device_layout_equals_the_numpy_layout(n):
    """slot_ancestors and tree_pass's RoPE depths against flashspec.tree_layout on random padded trees."""
    from flashspec.tree_layout import slot_depths, tree_attention_mask

    r = np.random.default_rng(n)
    parents, sizes = random_parents(r, 12, n)
    p, s = torch.from_numpy(parents), torch.from_numpy(sizes)
    np.testing.assert_array_equal(tree_score.slot_ancestors(p, s).numpy(), tree_attention_mask(parents, sizes))
    base = torch.from_numpy(r.integers(0, 9, size=12))
    _, tp = tree_score.tree_pass(base, p, s, 9 + n + 1)
    np.testing.assert_array_equal((tp.rope_positions - base[:, None]).numpy(), slot_depths(parents, sizes))
