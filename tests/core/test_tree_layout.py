"""flashspec.tree_layout: a toy attention layer scored over a tree with its mask and positions gives every slot
the logits of its own path run causally; the kept slots are the verified path at consecutive positions."""

import numpy as np
import pytest

from flashspec.tree import verify_tree
from flashspec.tree_layout import kept_slots, slot_depths, tree_attention_mask
from flashspec.tree_testing import token_paths

V, D = 7, 8


class ToyLayer:
    """One attention layer with learned absolute positions: logits = (x + attention(x)) @ E.T."""

    def __init__(self, seed: int):
        r = np.random.default_rng(seed)
        self.emb, self.pos = r.normal(size=(V, D)), r.normal(size=(64, D))
        self.wq, self.wk, self.wv = (r.normal(size=(D, D)) / np.sqrt(D) for _ in range(3))

    def run(self, tokens, positions, allowed) -> np.ndarray:  # [T], [T], [T, T] bool -> [T, V]
        x = self.emb[tokens] + self.pos[positions]
        scores = (x @ self.wq) @ (x @ self.wk).T
        scores = np.where(allowed, scores, -np.inf)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        return (x + (w / w.sum(-1, keepdims=True)) @ (x @ self.wv)) @ self.emb.T

    def causal(self, tokens) -> np.ndarray:  # [T] -> [T, V]
        t = len(tokens)
        return self.run(np.array(tokens), np.arange(t), np.tril(np.ones((t, t), bool)))

    def tree(self, context, root, tokens, parents) -> np.ndarray:  # -> [N+1, V]: the scoring pass over the tree
        l, n1 = len(context), len(tokens) + 1
        mask = tree_attention_mask(parents[None])[0]  # [N+1, N+1]
        allowed = np.zeros((l + n1, l + n1), bool)
        allowed[:l, :l] = np.tril(np.ones((l, l), bool))
        allowed[l:, :l] = True
        allowed[l:, l:] = mask
        positions = np.concatenate([np.arange(l), l + slot_depths(parents[None])[0]])
        return self.run(np.concatenate([context, [root], tokens]).astype(np.int64), positions, allowed)[l:]


@pytest.mark.parametrize("seed", range(6))
def test_every_slot_scores_its_own_path(seed):
    r = np.random.default_rng(seed)
    layer = ToyLayer(seed)
    tokens, parents = [], []
    for j in range(int(r.integers(1, 10))):
        a = int(r.integers(-1, j))
        taken = {t for t, p in zip(tokens, parents) if p == a}
        free = [t for t in range(V) if t not in taken]
        if free:
            tokens.append(int(r.choice(free)))
            parents.append(a)
    tokens, parents = np.array(tokens), np.array(parents)
    context, root = r.integers(0, V, int(r.integers(0, 5))), int(r.integers(0, V))
    scored = layer.tree(context, root, tokens, parents)
    for s, path in enumerate(token_paths(tokens, parents)):
        np.testing.assert_allclose(scored[s], layer.causal([*context, root, *path])[-1], rtol=1e-9, atol=1e-9)


def test_kept_slots_are_the_verified_path_at_consecutive_depths():
    r = np.random.default_rng(1)
    parents = np.array([[-1, -1, 0, 0, 2, 1, 5], [-1, 0, 1, 2, 3, 0, 0]])
    tokens = np.array([[1, 2, 3, 4, 5, 6, 0], [1, 2, 3, 4, 5, 6, 0]])
    sizes = np.array([7, 5])
    z = (r.normal(size=(2, 8, V)) * 0.1).astype(np.float32)  # flat: long paths are likely
    res = verify_tree(z, tokens, parents, seed=np.array([3, 4], np.uint64), tree_sizes=sizes)
    kept = kept_slots(res)
    depth = slot_depths(parents, sizes)
    for b in range(2):
        k = kept[b, : res.num_accepted[b] + 1]
        assert (kept[b, res.num_accepted[b] + 1:] == -1).all()
        np.testing.assert_array_equal(depth[b, k], np.arange(len(k)))  # row i of the cache moves to base + i
        assert all(tree_attention_mask(parents, sizes)[b, k[-1], k])  # the last kept slot sees all the kept ones


def test_padded_slots_see_only_themselves():
    mask = tree_attention_mask(np.array([[-1, 0, -1]]), np.array([2]))[0]
    np.testing.assert_array_equal(mask, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]])
