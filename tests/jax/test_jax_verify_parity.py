"""Parity: the NumPy oracle, the jnp reference and the Pallas kernel (interpret mode) give
IDENTICAL num_accepted and tokens on fresh random inputs."""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import flashspec.reference as oracle
from flashspec_jax import verify
from flashspec_jax.kernels import verify as kernels
from flashspec_jax.verify import make_counters, verify_jit
from jax_cases import make_inputs

IMPLS = ("reference", "pallas")

# (B, G, V, T, top_k, top_p, draft): B in {1, 3, 8}, G in {1, 4, 8}, V odd / even, one block and
# several (the default tile is 2048 entries), greedy, filters, every draft kind.
CASES = [
    (1, 1, 7, 1.0, 0, 1.0, "logits"),
    (3, 4, 1000, 1.0, 0, 1.0, "logits"),
    (8, 8, 4099, 1.0, 0, 1.0, "logits"),
    (3, 4, 2048, 0.7, 0, 1.0, "logits"),
    (1, 8, 5001, 0.7, 0, 1.0, "logits"),
    (8, 1, 999, 2.0, 0, 1.0, "logits"),
    (3, 4, 1000, 0.0, 0, 1.0, "logits"),
    (1, 4, 4097, 0.0, 0, 1.0, "onehot"),
    (8, 8, 130, 0.0, 0, 1.0, "logits"),
    (3, 4, 1001, 1.0, 20, 1.0, "logits"),
    (3, 4, 1000, 0.7, 0, 0.9, "logits"),
    (8, 4, 513, 1.0, 50, 0.8, "logits"),
    (3, 4, 1000, 1.0, 0, 1.0, "onehot"),
    (8, 8, 3000, 0.7, 10, 0.9, "onehot"),
    (3, 4, 1000, 1.0, 0, 1.0, "logprobs"),
    (1, 8, 4500, 0.7, 30, 0.95, "logprobs"),
]


def assert_same(want, got, what: str):
    n, t = np.asarray(got.num_accepted), np.asarray(got.tokens)
    assert n.dtype == np.int32 and t.dtype == np.int32, what
    np.testing.assert_array_equal(n, want.num_accepted, err_msg=f"num_accepted: {what}")
    np.testing.assert_array_equal(t, want.tokens, err_msg=f"tokens: {what}")


def run_all(args, **kw):
    want = oracle.verify(*args, **kw)
    for impl in IMPLS:
        jargs = tuple(None if a is None else jnp.asarray(a) for a in args)
        assert_same(want, verify(*jargs, **kw, impl=impl), f"impl={impl} {kw}")
    return want


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-G{}-V{}-T{}-k{}-p{}-{}".format(*c))
def test_parity(case):
    b, g, v, t, k, p, draft = case
    rs = np.random.default_rng(zlib.crc32(repr(case).encode()))
    inputs = make_inputs(rs, b, g, v, temperature=t, top_k=k, top_p=p, draft=draft)
    ns = []
    for offset in (0, 1, 2):
        want = run_all(inputs.args, temperature=t, top_k=k, top_p=p, seed=1234 + offset, offset=offset)
        ns.append(want.num_accepted)
    if t > 0 and draft != "onehot" and b * g >= 12:  # the inputs must exercise both accepting and rejecting
        ns = np.concatenate(ns)
        assert (ns < g).any() and (ns > 0).any()


# per-row draft lengths: every L in [0, G]; ids past L_b are real tokens in even rows (a kernel ignoring L_b would
# accept them), -1 in odd rows (never read)
RAGGED = [(1.0, 0, 1.0, "logits"), (0.0, 0, 1.0, "onehot"), (0.8, 5, 1.0, "onehot"), (1.3, 0, 0.9, "logprobs")]


@pytest.mark.parametrize("t,k,p,draft", RAGGED, ids=lambda c: str(c))
def test_parity_per_row_draft_lengths(t, k, p, draft):
    b, g = 10, 4
    rs = np.random.default_rng(zlib.crc32(repr((t, k, p, draft)).encode()))
    z, x, w, lq = make_inputs(rs, b, g, 300, temperature=t, top_k=k, top_p=p, draft=draft, spread=1.0,
                              noise=0.2).args  # mostly accepted: n reaches L_b
    lengths = np.resize(np.arange(g + 1, dtype=np.int32), b)
    past = (np.arange(g)[None] >= lengths[:, None]) & (np.arange(b)[:, None] % 2 == 1)
    x = np.where(past, -1, x).astype(np.int32)
    want = oracle.verify(z, x, w, lq, temperature=t, top_k=k, top_p=p, seed=9, offset=2, draft_lengths=lengths)
    for impl in IMPLS:
        jargs = tuple(None if a is None else jnp.asarray(a) for a in (z, x, w, lq))
        got = verify(*jargs, temperature=t, top_k=k, top_p=p, seed=9, offset=2, draft_lengths=jnp.asarray(lengths),
                     impl=impl)
        assert_same(want, got, f"impl={impl} draft_lengths")
    assert ((want.num_accepted == lengths) & (lengths < g)).any()  # a short row fully accepted: y from p at L_b


@pytest.mark.parametrize("seed_kind", ["uint64-per-row", "int-2**40", "jax-int32-per-row", "jax-scalar"])
def test_parity_seeds(seed_kind):
    rs = np.random.default_rng(7)
    inputs = make_inputs(rs, 3, 4, 1000)
    seed = {
        "uint64-per-row": np.array([2**63 + 5, 17, 2**40 + 1], np.uint64),
        "int-2**40": 2**40 + 5,
        "jax-int32-per-row": jnp.array([5, -3, 9], jnp.int32),
        "jax-scalar": jnp.uint32(77),
    }[seed_kind]
    np_seed = np.asarray(seed).astype(np.int64).astype(np.uint64) if isinstance(seed, jax.Array) else seed
    offset = np.array([3, 4, 5], np.uint32)
    want = oracle.verify(*inputs.args, seed=np_seed, offset=offset)
    for impl in IMPLS:
        jargs = tuple(None if a is None else jnp.asarray(a) for a in inputs.args)
        assert_same(want, verify(*jargs, seed=seed, offset=jnp.asarray(offset), impl=impl), f"{impl} {seed_kind}")


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("draft", ["logits", "logprobs"])
def test_parity_low_precision(dtype, draft):
    rs = np.random.default_rng(11)
    inputs = make_inputs(rs, 3, 4, 1500, temperature=0.7, draft=draft)
    z, w = inputs.target_logits.astype(dtype), inputs.draft_logits.astype(dtype)
    run_all((z, inputs.draft_tokens, w, inputs.draft_logprobs), temperature=0.7, seed=3, offset=1)
    run_all((z, inputs.draft_tokens, w, None), temperature=0.0, seed=3, offset=1)


def test_parity_masked_vocabulary_and_equal_draft():
    """-inf logits (a padded vocabulary), and a draft equal to the target (every token accepted)."""
    rs = np.random.default_rng(5)
    inputs = make_inputs(rs, 8, 4, 777)
    z, x, w, _ = inputs.args
    z, w = z.copy(), w.copy()
    z[..., 700:] = -np.inf
    w[..., 700:] = -np.inf
    x = np.minimum(x, 699)
    run_all((z, x, w, None), seed=1, offset=0)
    same = run_all((z, x, z[:, :4].copy(), None), seed=1, offset=0)
    np.testing.assert_array_equal(same.num_accepted, 4)


LANES_V2 = kernels.VerifyKernelConfig(block_v=64, sweep_v=16, vec=8, num_warps=4, min_programs=1, prune_tiles=0.0)
NO_PRUNE = float("inf")


@pytest.mark.parametrize(
    "config",
    [
        LANES_V2,  # one chunk of many tiles, 16-byte vectors, pruned sweep in 16-logit tiles
        dataclasses.replace(LANES_V2, block_v=32, min_programs=8, vec=4),  # chunks of several tiles
        dataclasses.replace(LANES_V2, prune_tiles=NO_PRUNE, block_v=16, min_programs=1000),  # one tile per chunk
        kernels.choose_config(3, 4, 333, 4, interpret=True),  # the default in interpret mode
    ],
    ids=["one-chunk", "chunks", "tile-per-chunk", "default"],
)
@pytest.mark.parametrize("temperature,draft", [(1.0, "logits"), (0.7, "logprobs"), (1.0, "onehot"), (0.0, "logits")])
def test_kernel_tilings(config, temperature, draft):
    rs = np.random.default_rng(3)
    inputs = make_inputs(rs, 3, 4, 333, temperature=temperature, draft=draft)
    want = oracle.verify(*inputs.args, temperature=temperature, seed=9, offset=2)

    @functools.partial(jax.jit, static_argnames=("t",))
    def run(z, x, w, lq, t):
        c = make_counters(np.uint32(9), np.uint32(0), np.uint32(2), z.shape[0])
        return kernels.verify(z, x, w, lq, c, temperature=t, top_k=0, top_p=1.0, config=config, interpret=True)

    assert_same(want, run(*inputs.args, t=temperature), f"{config}")


def test_new_seeds_and_offsets_do_not_recompile():
    rs = np.random.default_rng(1)
    inputs = make_inputs(rs, 3, 2, 100)
    jargs = tuple(None if a is None else jnp.asarray(a) for a in inputs.args)
    verify(*jargs, seed=1, offset=0, impl="reference")
    verify(*jargs, seed=np.array([1, 2, 3], np.uint64), offset=np.array([1, 2, 3], np.uint32), impl="reference")
    before = verify_jit._cache_size()
    for s in (2, 2**50, 7):
        verify(*jargs, seed=s, offset=s % 5, impl="reference")
        verify(*jargs, seed=np.array([s, 2, 3], np.uint64), offset=np.array([1, 2, s % 1000], np.uint32), impl="reference")
    assert verify_jit._cache_size() == before


def test_verify_under_user_jit():
    """Traced inputs skip the value checks; results equal the eager ones."""
    rs = np.random.default_rng(2)
    inputs = make_inputs(rs, 3, 4, 500)
    jargs = tuple(None if a is None else jnp.asarray(a) for a in inputs.args)
    want = oracle.verify(*inputs.args, seed=4, offset=6)
    for impl in IMPLS:
        f = jax.jit(lambda z, x, w, s, o, impl=impl: verify(z, x, w, seed=s, offset=o, impl=impl))
        assert_same(want, f(*jargs[:3], jnp.uint32(4), jnp.uint32(6)), impl)


@pytest.mark.parametrize("rows", ["flat", "peaked"])
@pytest.mark.parametrize("draft", ["logits", "onehot"])
def test_pruned_sweep_is_exact(rows, draft):
    """The pruned sweep (LANES_V2: 16-logit tiles, one chunk of a 2000-logit row) equals the oracle on
    flat rows (few tiles passed over) and peaked ones (almost all passed over after the peak)."""
    rs = np.random.default_rng(21)
    spread = 2.0 if rows == "flat" else 12.0
    inputs = make_inputs(rs, 3, 4, 2000, temperature=0.8, draft=draft, spread=spread, noise=0.7)
    z, x, w, lq = inputs.args
    for offset in (0, 1, 2, 3):
        want = oracle.verify(z, x, w, lq, temperature=0.8, seed=5, offset=offset)
        for config in (LANES_V2, dataclasses.replace(LANES_V2, prune_tiles=NO_PRUNE)):
            c = make_counters(np.uint32(5), np.uint32(0), np.uint32(offset), z.shape[0])
            got = jax.jit(lambda z, x, w, c=c, config=config: kernels.verify(
                z, x, w, None, c, temperature=0.8, top_k=0, top_p=1.0, config=config, interpret=True))(z, x, w)
            assert_same(want, got, f"{rows} {draft} prune_tiles={config.prune_tiles} offset={offset}")


def test_pruning_passes_over_tiles():
    """On a peaked row the bound passes over almost every tile after the peak (lanes.sweep_tile in
    plain jnp, 64-logit tiles): evaluated tiles are those whose bound reaches the floor."""
    from flashspec_jax.kernels import lanes

    v, sv = 4096, 64
    z = np.random.default_rng(0).standard_normal(v).astype(np.float32)
    z[100] = 30.0  # a peak in the second tile
    lse = np.float32(np.log(np.sum(np.exp(z - z.max()))) + z.max())
    key = jnp.uint32(7)
    state, floor, evaluated = lanes.sweep_init(sv, 0), jnp.float32(-jnp.inf), 0
    for j in range(v // sv):
        cols = j * sv + jnp.arange(sv, dtype=jnp.int32)
        tile = jnp.asarray(z[j * sv:(j + 1) * sv])
        lp2 = tile * np.float32(lanes.LOG2E) - lse * np.float32(lanes.LOG2E)
        bound = lanes.prune_bound(lp2, lanes.rng.bits_from_key(key, cols), False)
        evaluated += int(jnp.any(bound >= floor - lanes.PRUNE_SLACK))
        state, floor = lanes.sweep_tile(state, floor, tile, None, cols, key, 0, lse, 0.0, lanes.LOG2E, False, True)
    r_val, r_idx, p_val, p_idx, mass = lanes.sweep_finish(state)
    assert int(p_idx) == 100 and int(mass) == 1  # the bonus winner is the peak; the one-hot q leaves mass
    assert evaluated <= 4, evaluated  # of 64 tiles
