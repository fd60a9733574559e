"""The host backend's step results: packed into one array on the device, unpacked on the host with
the StepView's dtypes (the loop indexes rows by the boolean flags)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec_jax.backend import pack, start_copy  # noqa: E402
from flashspec_jax.steps import StepOut  # noqa: E402


def test_step_results_come_back_from_one_copy():
    out = StepOut(jnp.array([2, 0, 4], jnp.int32), jnp.array([True, False, True]), jnp.array([False, True, True]))
    view = start_copy(pack(out)).fetch()
    assert view.num_accepted.tolist() == [2, 0, 4]
    assert view.active.dtype == bool and view.active.tolist() == [True, False, True]
    assert view.done.dtype == bool and view.done.tolist() == [False, True, True]


def test_the_steps_read_the_weights_as_they_are_now():
    """``JaxBackend.leaves`` (what the jitted steps take) are the arrays a flatten of the weights gives at
    that moment: a value set on the model after the backend is built is used, and a decode step on the
    leaves gives the step on the pytree's logits (the weights changed between two calls)."""
    import jax
    import numpy as np

    from flashspec.config import SamplingConfig
    from flashspec_jax.backend import JaxBackend, packed
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=8, max_position_embeddings=64)
    m = random_model(cfg, dtype=jnp.float32, seed=1, std=0.5)
    backend = JaxBackend(m)
    backend.set_drafts([LookupDraft()])
    before = backend.leaves
    m.norm.set_value(-3 * m.norm.get_value())
    assert all(a is b for a, b in zip(backend.leaves, jax.tree.leaves(backend.weights)))
    assert sum(a is not b for a, b in zip(backend.leaves, before)) == 1  # the norm, and only it
    greedy, seeds = SamplingConfig(0.0), backend._seeds(0)
    state = backend.start_state([[5, 9, 2]], 4)
    ours = backend.decode_jit(backend.leaves, state, greedy, seeds, 0)[1]
    ref = jax.jit(packed(backend.steps.decode_one), static_argnames=("cfg", "rows"))(backend.weights, state, greedy, seeds, 0)[1]
    assert np.array_equal(np.asarray(ours), np.asarray(ref))
    new_state = backend.decode_jit(backend.leaves, state, greedy, seeds, 0)[0]
    old_state = backend.decode_jit(before, state, greedy, seeds, 0)[0]
    assert not np.array_equal(np.asarray(new_state.seqs.tokens), np.asarray(old_state.seqs.tokens))


def test_weights_read_by_a_flatten_where_variables_hold_more_than_one_array():
    """``weight_sources`` gives None (``leaves`` then flattens per call) where reading each Variable's
    one array would not give the flatten's leaves."""
    import jax
    from flax import nnx

    from flashspec_jax.backend import weight_sources

    one = nnx.State({"a": nnx.Param(jnp.ones(2)), "b": nnx.Param(jnp.zeros(3))})
    two = nnx.State({"a": nnx.Param((jnp.ones(2), jnp.zeros(3)))})
    sources, treedef = weight_sources([one])
    assert sources is not None and treedef == jax.tree.structure([one])
    assert weight_sources([two])[0] is None


@pytest.mark.parametrize("scan", [True, False])
def test_decode_steps_compile_once_and_read_the_variables(scan):
    """A generation's decode steps reuse one compiled step (no retrace per call) and read the weights'
    leaves from their Variables (``weight_sources`` not None), for the scan and the unrolled layer loop:
    a miss per step, or a flatten per step, is host time the GPU's small models pay 1:1."""
    import jax
    import numpy as np

    from flashspec.config import SamplingConfig
    from flashspec_jax.backend import JaxBackend
    from flashspec_jax.drafts import LookupDraft
    from flashspec_jax.model import LlamaConfig
    from flashspec_jax.weights import random_model

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=3, num_heads=2, num_kv_heads=1,
                      head_dim=8, max_position_embeddings=64)
    m = random_model(cfg, dtype=jnp.float32, seed=int(np.random.default_rng().integers(1 << 16)))
    m.scan_layers = scan
    backend = JaxBackend(m, eos_ids=[])
    backend.set_drafts([LookupDraft()])
    assert backend.sources is not None and len(backend.sources) == len(jax.tree.leaves(backend.weights))
    backend.prefill([[5, 9, 2]], 8)
    seeds = np.zeros(1, np.uint64)
    for step in range(6):
        backend.decode_one(SamplingConfig(0.0), seeds, step).fetch()
    assert backend.decode_jit._cache_size() == 1
