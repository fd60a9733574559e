"""The fused sampled pick of plain decoding (``sample_next_triton``, one kernel) against its torch reference
(``sample_next_reference``: the fault screen and ``sampling.sample``), token for token and flag for flag, on
fresh random logits: temperatures, top-k / top-p edges, ties, -inf logits, faulty rows, V not a multiple of
the kernel's block, shared and per-row seeds and offsets; and what it refuses."""

import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec_torch.sample_next import sample_next_reference, sample_next_triton

# faulty rows (NaN, +inf, no finite logit) make NumPy warn inside the interpreter; their draws are discarded
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1.3, top_k=1),  # top-k 1: the argmax of z / T, ties kept
    SamplingConfig(temperature=0.9, top_k=5),
    SamplingConfig(temperature=1.0, top_p=0.9),
    SamplingConfig(temperature=0.6, top_k=20, top_p=0.5),
    SamplingConfig(temperature=2.0, top_p=1e-6),  # the nucleus of one token
]


def logits(gen, b, v, dtype):
    """Random rows with ties (repeated values), -inf logits and, in the last rows, faults."""
    z = torch.randn(b, v, generator=gen) * 3
    z[0] = torch.round(z[0])  # many exact ties
    z[1, : v // 2] = float("-inf")
    z[2, :] = 1.5  # every logit equal
    z[3, torch.randint(0, v, (v // 3,), generator=gen)] = float("-inf")
    z[4, 1:] = float("-inf")  # one finite logit
    z[-3, 7] = float("nan")
    z[-2, 3] = float("inf")
    z[-1, :] = float("-inf")  # no finite logit
    return z.to(dtype)


def check(z, cfg, seed, offset):
    b = z.shape[0]
    bad_ref, bad = torch.full((b,), 9, dtype=torch.uint8), torch.full((b,), 9, dtype=torch.uint8)
    want = sample_next_reference(z, cfg, seed, offset, bad_ref)
    got = sample_next_triton(z, cfg, seed, offset, bad)
    assert torch.equal(bad, bad_ref), (bad, bad_ref)
    ok = bad_ref == 0  # a flagged row's token is discarded by the commit (the kernel writes 0)
    assert torch.equal(got.tokens[ok], want.tokens[ok]), (cfg, got.tokens[ok, 0], want.tokens[ok, 0])
    assert torch.equal(got.tokens[~ok, 1], want.tokens[~ok, 1]) and torch.equal(got.num_accepted, want.num_accepted)


@pytest.mark.parametrize("v", [1000, 2053])  # below and past two of the CPU block of 1024
def test_sample_next_kernel_matches_reference(v):
    gen = torch.Generator().manual_seed(v)
    b = 9
    seeds = torch.randint(0, 2**62, (b,), generator=gen) * 3  # high words set
    for i, cfg in enumerate(CONFIGS):
        dtype = (torch.float32, torch.bfloat16)[i % 2]
        z = logits(gen, b, v, dtype)
        check(z, cfg, 2**40 + 17 * i, 5 + i)  # a shared seed (rows drawn by row index), a scalar offset
        check(z, cfg, seeds, torch.randint(0, 2**31, (b,), generator=gen))  # per-row seeds and offsets
    check(z, CONFIGS[0], torch.tensor(2**33 + 5), torch.tensor(7))  # a shared seed and offset as 0-d tensors


def test_sample_next_kernel_two_tied_logits():
    """Rows of two equal finite logits (top-k 1 keeps both): the kernel draws what the reference draws."""
    z = torch.full((16, 300), float("-inf"))
    z[:, 17] = z[:, 250] = 0.25
    for seed in range(2):
        check(z, SamplingConfig(temperature=1.0, top_k=1), seed, torch.arange(16))


def test_sample_next_refuses_what_it_does_not_cover():
    z = torch.zeros(2, 8)
    bad = torch.zeros(2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="greedy"):
        sample_next_triton(z, SamplingConfig(temperature=0.0), 0, 0, bad)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_next_triton(z[:, None], SamplingConfig(temperature=1.0), 0, 0, bad)
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_next_triton(z.to(torch.int32), SamplingConfig(temperature=1.0), 0, 0, bad)
    with pytest.raises(ValueError, match="seed"):
        sample_next_triton(z, SamplingConfig(temperature=1.0), torch.zeros(3, dtype=torch.int64), 0, bad)


def test_sample_next_kernel_is_what_plain_sampled_decoding_runs():
    """The backend's plain sampled step through the kernel (interpreter) gives the reference's tokens."""
    from flashspec.loop import decode
    from test_backend_graphs import PROMPTS, backends

    outs = []
    for impl in ("reference", "triton"):
        b = backends("cpu", False)
        b.commit_impl = impl
        seed = torch.arange(len(PROMPTS), dtype=torch.int64) + 11
        with torch.inference_mode():
            outs.append(decode(b, PROMPTS, sampling=SamplingConfig(0.8, top_k=20), max_new_tokens=5, seed=seed)[0])
    assert outs[0] == outs[1] and any(len(o) > 1 for o in outs[0])
