"""The torch generator's bits, argument validation, impl dispatch and the import error."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from flashspec import random as np_rng
from flashspec_torch import KernelConfig, verify
from flashspec_torch import random as rng

GEN = torch.Generator().manual_seed(0)
Z = torch.randn(2, 4, 6, generator=GEN)
W = torch.randn(2, 3, 6, generator=GEN)
X = torch.tensor([[0, 1, 2], [3, 4, 5]])


@pytest.mark.parametrize("coords,expected", np_rng.TEST_VECTORS)
def test_torch_generator_test_vectors(coords, expected):
    seed, offset, row, position, vocab, stream = coords
    lo, hi = rng.split_seed(seed, torch.device("cpu"))
    c = [torch.tensor(v) for v in (offset, row, position, vocab)]
    assert int(rng.bits_from_key(rng.key(lo, hi, c[0], c[1], c[2], stream), c[3])) == expected


def test_torch_generator_matches_numpy_in_bulk():
    seeds = torch.tensor([0, 1, 2**40 + 5, -7, 2**63 - 1])  # -7: the bits of 2**64 - 7
    vocab = torch.arange(5000)
    lo, hi = rng.split_seed(seeds, torch.device("cpu"))
    got = rng.uniform(lo[:, None], hi[:, None], 3, 2, 1, vocab[None], rng.FINAL)
    want = np_rng.uniform(seeds.numpy().astype(np.uint64)[:, None], 3, 2, 1, vocab.numpy()[None], np_rng.FINAL)
    np.testing.assert_array_equal(got.numpy(), want)
    g = rng.gumbel_from_uniform(got)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("what,args,kwargs,match", [
    ("id -1", (Z, torch.tensor([[0, 1, 2], [3, 4, -1]]), W), {}, "draft_tokens"),
    ("id = V", (Z, torch.tensor([[0, 6, 2], [3, 4, 5]]), W), {}, "draft_tokens"),
    ("NaN", (torch.where(Z > 10, Z, float("nan")), X, W), {}, "target_logits"),
    ("empty row", (torch.full_like(Z, float("-inf")), X, W), {}, "target_logits"),
    ("draft +inf", (Z, X, torch.full_like(W, float("inf"))), {}, "draft_logits"),
    ("G = 0", (Z[:, :1], X[:, :0], W[:, :0]), {}, "target_logits"),
    ("vocab", (Z, X, W[..., :5]), {}, "draft_logits"),
    ("int logits", (Z.int(), X, W), {}, "target_logits"),
    ("float ids", (Z, X.float(), W), {}, "draft_tokens"),
    ("logprobs > 0", (Z, X, W, torch.ones(2, 3)), {}, "draft_logprobs"),
    ("logprobs without logits", (Z, X, None, torch.zeros(2, 3)), {}, "draft_logprobs"),
    ("temperature", (Z, X, W), {"temperature": -1.0}, "temperature"),
    ("top_k", (Z, X, W), {"top_k": -2}, "top_k"),
    ("top_p", (Z, X, W), {"top_p": 0.0}, "top_p"),
    ("seed shape", (Z, X, W), {"seed": torch.zeros(3, dtype=torch.int64)}, "seed"),
    ("seed float", (Z, X, W), {"seed": torch.zeros(2)}, "seed"),
    ("offset range", (Z, X, W), {"offset": 2**32}, "offset"),
    ("numpy input", (Z.numpy(), X, W), {}, "target_logits"),
    ("zero-prob draft token", (Z, X, W), {"top_k": 1}, "draft_tokens"),
])
def test_validation_errors_name_the_argument(impl, what, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        verify(*args, impl=impl, **kwargs)


def test_unknown_impl_and_default_impl():
    with pytest.raises(ValueError, match="impl"):
        verify(Z, X, W, impl="pallas")
    res = verify(Z, X, W)  # CPU: the reference
    assert res.tokens.shape == (2, 4) and res.num_accepted.dtype == torch.int32


def test_kernel_config_is_validated():
    with pytest.raises(ValueError, match="block_v"):
        KernelConfig(block_v=100)
    with pytest.raises(ValueError, match="num_warps"):
        KernelConfig(num_warps=3)
    with pytest.raises(ValueError, match="sweep_slots"):
        KernelConfig(sweep_slots=3)
    with pytest.raises(ValueError, match="bf16_pairs"):
        KernelConfig(bf16_pairs=1)
    with pytest.raises(TypeError):  # a deleted option is refused, not ignored
        KernelConfig(schedule="persistent")


def test_gpu_default_takes_the_slot_vote_from_b32(monkeypatch):
    """choose_config on an H200 (132 SMs, no GPU needed): the pruned sweep with a vote per slot of 4
    from B = 32 (measured at or below the tile vote there: docs/kernel_notes.md), no pruning below it
    at V = 128256 (one or four sweep tiles per program), and every default a valid KernelConfig."""
    import dataclasses
    import importlib

    fv = importlib.import_module("flashspec_torch.kernel_config")
    monkeypatch.setattr(fv, "interpreting", lambda: False)
    monkeypatch.setattr(fv, "device_sms", lambda device: 132)
    gpu = torch.device("cuda", 0)
    for b in (1, 8, 32, 128, 256):
        for v in (32000, 128256):
            for itemsize in (2, 4):
                cfg = fv.choose_config(b, 4, v, gpu, itemsize)
                assert dataclasses.replace(cfg) == cfg  # __post_init__ accepts it
                assert cfg.pdl
                assert cfg.sweep_slots == (4 if cfg.prune else 0), (b, v, itemsize)
                if b >= 32 or v == 128256:
                    assert cfg.prune == (b >= 32), (b, v, itemsize)
    assert not fv.choose_config(8, 4, 128256, gpu).prune


def test_triton_on_cpu_without_interpreter_says_what_to_do():
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None)\n"
            "import torch; from flashspec_torch import verify\n"
            "try:\n    verify(torch.randn(1, 2, 5), torch.tensor([[1]]), impl='triton')\n"
            "except RuntimeError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR" in out.stdout and "TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr


def test_import_without_torch_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import flashspec_torch\n"
            "except ImportError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'flashspec[torch]'" in out.stdout, out.stdout + out.stderr


def test_validate_false_skips_the_cpu_value_checks():
    """The engine screens logits on the device and drafts emit valid ids: it opts out of the CPU
    checks (a full pass over the logits per step); the default still checks."""
    z = torch.zeros(1, 3, 10)
    z[0, 1, 4] = float("nan")
    x = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="target_logits"):
        verify(z, x, temperature=0.0)
    res = verify(z, x, temperature=0.0, validate=False)
    assert res.tokens.shape == (1, 3)
