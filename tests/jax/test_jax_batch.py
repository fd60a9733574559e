"""Batches on a tiny random model in fp32, with the layer loop a GPU runs (unrolled): greedy
speculation (host loop with the bandit over n-gram and layer-skip drafts, and the whole generation
in one ``lax.while_loop``) == greedy plain decoding, row for row; the row-invariant decoding."""

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec.bandits import UCB1, BanditConfig  # noqa: E402
from flashspec.config import SamplingConfig  # noqa: E402
from flashspec.loop import SpecConfig, decode, speculate  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
            head_dim=8, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model():
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    m = random_model(LlamaConfig(**TINY), dtype=jnp.float32, seed=1, std=0.3)
    m.scan_layers = False  # the GPU's loop
    return m


@pytest.fixture(scope="module")
def backend(model):
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    b = JaxBackend(model, eos_ids=[])
    b.set_drafts([LookupDraft(), b.model_draft("layerskip:2", skip=frozenset({2}))])
    return b


def prompts(batch: int) -> list[list[int]]:
    """Rows of different lengths, each a repeated motif (the n-gram draft finds continuations)."""
    rs = np.random.default_rng(batch)
    return [(rs.integers(0, 64, 3 + r % 4).tolist() * 4)[: 6 + 2 * r] for r in range(batch)]


def test_greedy_speculation_equals_plain_decoding_at_batch_8(backend):
    from flashspec_jax import whole

    ps, greedy = prompts(8), SamplingConfig(0.0)
    seed = np.zeros(8, np.uint64)
    plain, _ = decode(backend, ps, sampling=greedy, max_new_tokens=12, seed=seed)
    host, records = speculate(backend, UCB1(2, BanditConfig(objective="acceptance")), ps, sampling=greedy,
                              spec=SpecConfig(gamma=3, max_new_tokens=12), seed=seed)
    device, _ = whole.Whole(backend).run(ps, max_new_tokens=12, gamma=3, sampling=greedy, seed=seed, policy=whole.UCB1())
    assert all(len(row) == 12 for row in plain)
    assert host == plain
    assert device == plain
    assert sum(r.accepted for r in records) > 0  # the drafts really took part
    assert {r.arm for r in records} == {0, 1}


def test_row_invariant_decoding_runs_the_scoring_shape_with_the_same_tokens(backend):
    """decode_rows = G + 1: plain decoding forwards the last token and G copies (their cache slots
    are written, stale), and the tokens are plain decoding's (in fp32 on the CPU the two shapes
    round alike; on a GPU in bf16 this is what makes speculation's tokens equal: jax_vs_torch_gpu.py)."""
    ps, greedy = prompts(8), SamplingConfig(0.0)  # the shapes the test above compiled
    seed = np.zeros(8, np.uint64)
    plain, _ = decode(backend, ps, sampling=greedy, max_new_tokens=12, seed=seed)
    backend.decode_rows = 4
    try:
        invariant, _ = decode(backend, ps, sampling=greedy, max_new_tokens=12, seed=seed)
    finally:
        backend.decode_rows = 1
    assert invariant == plain
    n = len(ps[-1])  # the longest row: its slots past the prompt were not touched by the prefill
    for rows, written in ((1, False), (4, True)):
        state = backend.start_state(ps, 12)
        before = np.asarray(state.cache.k)[:, -1, :, n : n + 3]
        after, _ = backend.decode_jit(backend.leaves, state, greedy, backend._seeds(0), 0, rows=rows)
        assert np.array_equal(np.asarray(after.cache.k)[:, -1, :, n : n + 3], before) != written


@pytest.fixture(scope="module")
def lookup(model):
    """The n-gram draft alone over the unrolled model: one branch, a cheap compile."""
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft

    b = JaxBackend(model, eos_ids=[])
    b.set_drafts([LookupDraft()])
    return b


def weight_slices_in_the_loop(hlo: str) -> int:
    """Ops of the while loop's body (by their metadata) whose result has a layer weight's shape."""
    c = TINY
    shapes = {((c["num_heads"] + 2 * c["num_kv_heads"]) * c["head_dim"], c["hidden_size"]), (c["hidden_size"], c["hidden_size"]),
              (2 * c["intermediate_size"], c["hidden_size"]), (c["hidden_size"], c["intermediate_size"])}
    found = (re.search(r"= f32\[(\d+),(\d+)\]", line) for line in hlo.splitlines() if "while/body" in line)
    return sum(1 for m in found if m and (int(m.group(1)), int(m.group(2))) in shapes)


def test_unstacked_weights_give_the_same_generation_without_weight_slices_in_the_loop(lookup):
    """``Whole(unstack_weights=None)`` (the default, the layers unrolled here) slices the layer
    weights once before the loop: the same tokens and records as the stacked weights
    (``unstack_weights=False``), and the loop's body (this CPU's optimized HLO) holds no op with a
    weight's shape, where the stacked weights' body slices every layer's weights out of the stack
    each iteration."""
    from flashspec_jax import whole
    from flashspec_jax.drafts import make_seeds

    ps, greedy = prompts(2), SamplingConfig(0.0)
    seed = np.zeros(2, np.uint64)
    kw = dict(max_new_tokens=6, gamma=3, sampling=greedy, seed=seed, policy=whole.Fixed(0))
    stacked, flat = whole.Whole(lookup, unstack_weights=False), whole.Whole(lookup)
    (a, ra), (b, rb) = stacked.run(ps, **kw), flat.run(ps, **kw)
    assert a == b and [(r.accepted, r.rows) for r in ra] == [(r.accepted, r.rows) for r in rb]
    tokens, lengths, prefix = stacked.inputs(ps, 6)
    hlo = [w.run_jit.lower(lookup.weights, tokens, lengths, 6, make_seeds(seed), 0, 0, prefix=prefix, gamma=3, cfg=greedy,
                           policy=whole.Fixed(0), max_steps=6).compile().as_text() for w in (stacked, flat)]
    assert weight_slices_in_the_loop(hlo[0]) >= 4 * TINY["num_layers"] and weight_slices_in_the_loop(hlo[1]) == 0
    assert flat.unstack
    lookup.draft_models[0].scan_layers = True
    try:
        assert not whole.Whole(lookup).unstack  # the scan reads the stacks
        with pytest.raises(ValueError, match="unstack_weights=True needs the unrolled layer loop"):
            whole.Whole(lookup, unstack_weights=True)
    finally:
        lookup.draft_models[0].scan_layers = False
