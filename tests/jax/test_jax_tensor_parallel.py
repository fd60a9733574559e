"""Tensor parallelism in JAX on a 2-device CPU mesh (tensor_parallel_child.py, in a subprocess:
the device count must be set before JAX starts): the split target's tokens equal one device's,
greedy and sampled, speculative and plain; its compiled forward holds one all-reduce per block
half (and the embedding's), and one all-gather, of the logits. And the refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec_jax.model import LlamaConfig  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def child() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    run = subprocess.run([sys.executable, str(HERE / "tensor_parallel_child.py")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_two_devices_give_one_devices_tokens(child):
    assert child["devices"] == 2
    for case, rows in child["one"].items():
        assert len(rows) == 2 and all(len(r) == 10 for r in rows), case
        assert child["two"][case] == rows, case
    assert child["one"]["sampled-ngram"] != child["one"]["greedy-ngram"]  # sampling really drew


def test_one_all_reduce_per_block_half_and_the_logits_gathered_once(child):
    """2 per layer (after o and after down) + 1 (the vocabulary-split embedding lookup); the only
    all-gather is the logits' vocabulary shards ([B, T, V]), not a weight; the cache is split by KV heads."""
    counts = child["hlo"]["counts"]
    assert counts == {"all-reduce": 2 * child["layers"] + 1, "all-gather": 1}, counts
    assert [g.split("{")[0] for g in child["hlo"]["gathered"]] == ["f32[2,5,64]"]
    assert child["cache"] == "P(None, None, 'tp')"


def test_degrees_that_do_not_divide_or_exceed_the_devices_are_refused():
    from flashspec_jax.parallel import check_degree

    c = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=6, num_kv_heads=3,
                    head_dim=8, max_position_embeddings=64)
    check_degree(c, 3, 4)
    for n, field in ((2, "num_kv_heads"), (4, "num_heads")):
        with pytest.raises(ValueError, match=f"tensor_parallel={n} must divide the target's {field}"):
            check_degree(c, n, 8)
    with pytest.raises(ValueError, match="needs 3 devices but JAX sees 2"):
        check_degree(c, 3, 2)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            check_degree(c, bad, 2)


def test_the_engine_refuses_more_devices_than_it_has():
    from flashspec_jax.engine import Engine
    from flashspec_jax.weights import LoadedModel, random_model

    c = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=8, max_position_embeddings=64)
    n = len(jax.devices("cpu")) + 1
    with pytest.raises(ValueError, match=f"tensor_parallel={n} needs {n} devices"):
        Engine(LoadedModel(random_model(c, dtype=jnp.float32), None, "tiny"), ("ngram",), device="cpu", tensor_parallel=n)
