"""flashspec_torch.tree_verify: token for token the NumPy oracle (flashspec.tree) on random batches of random
trees, the shared tree law suite, malformed trees refused with the oracle's messages."""

import numpy as np
import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.tree import verify_tree as oracle
from flashspec.tree_testing import MALFORMED_TREES, assert_tree_exact
from flashspec_torch.tree_verify import as_numpy_result, verify_tree

CONFIGS = {
    "T1": SamplingConfig(1.0),
    "T0.7_top_p0.85": SamplingConfig(0.7, 0, 0.85),
    "T0.9_top_k3": SamplingConfig(0.9, 3),
    "T2": SamplingConfig(2.0),
    "greedy": SamplingConfig(0.0),
}


def as_tensor(a) -> torch.Tensor:
    a = np.asarray(a)
    return torch.from_numpy((a.view(np.int64) if a.dtype == np.uint64 else a).copy())


def torch_adapter(z, tokens, parents, *, seed=0, offset=0, tree_sizes=None, **kw):
    """The torch verify_tree on the oracle's NumPy arguments (uint64 seeds travel as their int64 bits)."""
    seed, offset = (x if isinstance(x, int) else as_tensor(x) for x in (seed, offset))
    sizes = None if tree_sizes is None else as_tensor(tree_sizes)
    res = verify_tree(as_tensor(z), as_tensor(tokens), as_tensor(parents), seed=seed, offset=offset,
                      tree_sizes=sizes, **kw)
    return as_numpy_result(res)


def random_batch(r: np.random.Generator, b: int, n: int, v: int, greedy: bool):
    """B random trees of up to N nodes (sizes from 0 to N, garbage past them), their logits; greedy: rounded
    logits (ties) and children that often hold their slot's argmax."""
    z = (r.normal(size=(b, n + 1, v)) * r.choice([0.5, 2.0, 4.0])).astype(np.float32)
    if greedy:
        z = np.round(z)
    tokens = r.integers(-3, v + 3, size=(b, n))
    parents = r.integers(-5, n + 5, size=(b, n))
    sizes = r.integers(0, n + 1, size=b)
    sizes[r.integers(b)] = 0
    sizes[r.integers(b)] = n
    for row in range(b):
        used: dict[int, set] = {}
        for j in range(sizes[row]):
            a = int(r.integers(-1, j)) if r.random() < 0.8 else j - 1
            if len(used.setdefault(a, set())) == v:  # a full parent: the previous node has no child yet
                a = j - 1
            taken = used.setdefault(a, set())
            likely = [int(t) for t in np.argsort(-z[row, a + 1], kind="stable")[:3] if t not in taken]
            free = [t for t in range(v) if t not in taken]
            t = likely[0] if likely and r.random() < 0.6 else int(r.choice(free))
            taken.add(t)
            tokens[row, j], parents[row, j] = t, a
    return z, tokens, parents, sizes


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("seed", range(8))
def test_tokens_equal_the_oracle_on_random_batches(cfg, seed):
    r = np.random.default_rng(seed)
    b, n, v = int(r.integers(1, 40)), int(r.integers(1, 16)), int(r.choice([2, 5, 17, 300]))
    z, tokens, parents, sizes = random_batch(r, b, n, v, cfg.greedy)
    kw = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, tree_sizes=sizes)
    counters = [(int(r.integers(2**63)), seed * 7),  # one seed for the batch (generator row = batch row)
                (r.integers(0, 2**64 - 1, size=b, dtype=np.uint64), r.integers(0, 2**40, size=b))]  # per-row
    for s, off in counters:
        want = oracle(z, tokens, parents, seed=s, offset=off, **kw)
        got = torch_adapter(z, tokens, parents, seed=s, offset=off, **kw)
        for field in ("num_accepted", "tokens", "path"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)


def test_many_rows_deep_trees_equal_the_oracle():
    r = np.random.default_rng(123)
    z, tokens, parents, sizes = random_batch(r, 400, 24, 9, greedy=False)
    z = z * 0.3  # flat targets: long accepted paths
    want = oracle(z, tokens, parents, seed=77, offset=3, tree_sizes=sizes)
    got = torch_adapter(z, tokens, parents, seed=77, offset=3, tree_sizes=sizes)
    assert want.num_accepted.max() >= 3
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.path, want.path)


def test_bf16_logits_int32_trees_and_tensor_counters_equal_the_oracle():
    r = np.random.default_rng(5)
    z, tokens, parents, sizes = random_batch(r, 30, 8, 11, greedy=False)
    z16 = torch.from_numpy(z).to(torch.bfloat16)
    tokens32, parents32, sizes32 = (torch.from_numpy(a).to(torch.int32) for a in (tokens, parents, sizes))
    got = verify_tree(z16, tokens32, parents32, tree_sizes=sizes32, seed=torch.tensor(9), offset=torch.tensor(0))
    want = oracle(z16.float().numpy(), tokens, parents, seed=9, tree_sizes=sizes)
    np.testing.assert_array_equal(as_numpy_result(got).tokens, want.tokens)


def test_the_torch_port_passes_the_tree_suite():
    assert_tree_exact(torch_adapter)


# ----------------------------------------------------------------------------- bad input


def call(tokens, parents, vocab=4, **kw):
    tokens, parents = np.array([tokens]), np.array([parents])
    z = np.zeros((1, tokens.shape[1] + 1, vocab), np.float32)
    return torch_adapter(z, tokens, parents, **kw)


@pytest.mark.parametrize("tokens,parents,kw,message", MALFORMED_TREES)
def test_malformed_trees_are_refused_as_the_oracle_refuses_them(tokens, parents, kw, message):
    with pytest.raises(ValueError, match=message):
        call(tokens, parents, **kw)
    with pytest.raises(ValueError, match=message):
        oracle(np.zeros((1, len(tokens) + 1, 4), np.float32), np.array([tokens]), np.array([parents]), **kw)


def test_the_first_bad_row_is_named():
    tokens = np.array([[1, 2], [1, 2], [3, 3]])
    parents = np.array([[-1, 0], [-1, 7], [-1, -1]])
    with pytest.raises(ValueError, match=r"tree_parents\[1, 1\] = 7"):
        torch_adapter(np.zeros((3, 3, 4), np.float32), tokens, parents)


def test_padding_past_tree_sizes_is_never_read():
    got = call([2, -7], [-1, 99], tree_sizes=np.array([1]), temperature=0.0)
    assert got.tokens.shape == (1, 2)


def test_nan_logits_and_numpy_arguments_are_refused():
    with pytest.raises(ValueError, match="NaN|nan"):
        torch_adapter(np.full((1, 2, 4), np.nan, np.float32), np.zeros((1, 1), np.int64), -np.ones((1, 1), np.int64))
    with pytest.raises(ValueError, match="takes torch tensors"):
        verify_tree(torch.zeros(1, 2, 4), np.zeros((1, 1), np.int64), -torch.ones(1, 1, dtype=torch.int64))


@pytest.mark.parametrize("cfg", [CONFIGS["T0.7_top_p0.85"], CONFIGS["greedy"]], ids=["T0.7_top_p0.85", "greedy"])
def test_widest_and_depth_given_change_nothing_but_the_padding(cfg):
    """widest= / depth= (the engine step's fixed shapes) at or above the tree's own: the same result, the path
    padded with -1 to D = depth; with validate=False too (no host read); below them: refused by name."""
    from flashspec.tree import tree_depths

    r = np.random.default_rng(7)
    z, tokens, parents, sizes = random_batch(r, 30, 12, 17, cfg.greedy)
    args = (as_tensor(z), as_tensor(tokens), as_tensor(parents))
    kw = dict(temperature=cfg.temperature, top_p=cfg.top_p, tree_sizes=as_tensor(sizes), seed=torch.arange(30), offset=3)
    want = verify_tree(*args, **kw)
    deepest = want.path.shape[1]
    assert deepest == max(int(tree_depths(tokens[i], parents[i], int(sizes[i]), 17, 32).max(initial=0)) for i in range(30))
    for widest, depth, validate in ((12, deepest, True), (12, 12, False), (20, deepest + 3, True)):
        got = verify_tree(*args, widest=widest, depth=depth, validate=validate, **kw)
        assert got.path.shape == (30, depth)
        torch.testing.assert_close(got.num_accepted, want.num_accepted)
        torch.testing.assert_close(got.path[:, :deepest], want.path)
        torch.testing.assert_close(got.tokens[:, : deepest + 1], want.tokens)
        assert (got.path[:, deepest:] == -1).all() and (got.tokens[:, deepest + 1 :] == -1).all()
    with pytest.raises(ValueError, match="depth=1: the tree's deepest path"):
        verify_tree(*args, depth=1, **kw)
    with pytest.raises(ValueError, match="widest=1: the tree's widest node"):
        verify_tree(*args, widest=1, **kw)
