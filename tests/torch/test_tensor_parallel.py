"""Tensor parallelism in torch on the CPU: ``torchrun --standalone --nproc-per-node 2`` with gloo
runs tensor_parallel_child.py, whose split target gives the whole target's tokens (greedy and
sampled, speculative and plain) and holds half of each split weight; and the refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fault_helpers import tiny_target  # noqa: E402
from flashspec.config import LlamaConfig  # noqa: E402
from flashspec_torch.engine import Engine  # noqa: E402
from flashspec_torch.parallel import check_degree  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def child() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(HERE / "tensor_parallel_child.py")], capture_output=True, text=True, env=env, timeout=600,
                         cwd=HERE)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_two_ranks_give_one_process_tokens(child):
    assert child["world"] == 2
    for case, rows in child["one"].items():
        assert child["two"][case] == rows, case
    assert child["one"]["sampled-spec"] != child["one"]["greedy-spec"]  # sampling really drew
    assert min(child["one"]["sampled-spec pulls"].values()) > 0  # both drafts took part, chosen alike on both ranks


def test_each_rank_holds_its_share_of_the_split_weights(child):
    """tiny_target: hidden 32, 4 heads and 2 KV heads of 8, MLP 64, vocabulary 64."""
    assert child["shapes"] == {"qkv": [(4 + 2 * 2) * 8 // 2, 32], "o": [32, 16], "gate_up": [2 * 64 // 2, 32],
                               "down": [32, 32], "embed": [32, 32]}


def test_graphed_steps_of_a_split_target_are_refused_off_cuda(child):
    assert child["graphs"].startswith("graphs=True with a tensor-parallel target off CUDA")


def test_what_a_split_cannot_run_is_refused():
    c = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=6, num_kv_heads=3,
                    head_dim=8)
    check_degree(c, 3)
    for n, field in ((2, "num_kv_heads"), (4, "num_heads")):
        with pytest.raises(ValueError, match=f"tensor_parallel={n} must divide the target's {field}"):
            check_degree(c, n)
    qwen3 = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=6, num_kv_heads=3,
                        head_dim=8, qk_norm=True)
    check_degree(qwen3, 1)  # one device runs every family
    with pytest.raises(ValueError, match="splits Llama-shaped targets only"):
        check_degree(qwen3, 3)
    with pytest.raises(ValueError, match="must be an int >= 1"):
        check_degree(c, 0)
    with pytest.raises(ValueError, match="launch with torchrun --nproc-per-node 2"):
        Engine(tiny_target(0), ("ngram",), device="cpu", tensor_parallel=2)
    with pytest.raises(ValueError, match="does not run policy='adaptive'"):
        Engine(tiny_target(0), ("ngram",), policy="adaptive", device="cpu", tensor_parallel=2)
