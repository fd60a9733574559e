"""The step kernels (commit, prompt lookup) against their torch references on random states."""

import pytest
import torch

from flashspec_torch.backend import commit_reference, commit_triton
from flashspec_torch.drafts import lookup_reference, lookup_triton


def random_history(gen, b, s, vocab):
    seq = torch.randint(0, vocab, (b, s), generator=gen)
    length = torch.randint(1, s + 1, (b,), generator=gen)
    return seq, length


@pytest.mark.parametrize("trial", range(6))
def test_lookup_kernel_matches_reference(trial):
    gen = torch.Generator().manual_seed(trial)
    b, s, vocab = 5, [7, 33, 64, 130, 9, 200][trial], [3, 4, 2, 5, 50, 3][trial]  # small vocab: many matches
    seq, length = random_history(gen, b, s, vocab)
    for gamma, max_n in ((4, 3), (1, 1), (6, 4)):
        want = lookup_reference(seq, length, gamma, max_n)
        got = lookup_triton(seq, length, gamma, max_n)
        assert torch.equal(got, want), (gamma, max_n, got, want)


def commit_state(gen, b, s, w):
    n = torch.randint(0, w, (b,), generator=gen, dtype=torch.int32)
    emitted = torch.randint(0, 6, (b, w), generator=gen, dtype=torch.int32)
    emitted = torch.where(torch.arange(w)[None] <= n[:, None], emitted, -1)
    prompt = torch.randint(1, 5, (b,), generator=gen)
    length = prompt + torch.randint(0, 8, (b,), generator=gen)
    state = dict(tokens=torch.randint(0, 6, (b, s), generator=gen), length=length, prompt_len=prompt,
                 max_new=torch.randint(5, 10, (b,), generator=gen), done=torch.rand(b, generator=gen) < 0.3, active=torch.zeros(b, dtype=torch.bool))
    return n, emitted, state


@pytest.mark.parametrize("trial", range(8))
def test_commit_kernel_matches_reference(trial):
    gen = torch.Generator().manual_seed(100 + trial)
    b, s, w = 6, 24, [2, 5, 9][trial % 3]
    eos = torch.tensor([[3], [3, 5], [-1]][trial % 3])
    n, emitted, state = commit_state(gen, b, s, w)
    ref = {k: v.clone() for k, v in state.items()}
    got = {k: v.clone() for k, v in state.items()}
    commit_reference(n, emitted, eos, *ref.values())
    commit_triton(n, emitted, eos, *got.values())
    for k in state:
        assert torch.equal(got[k], ref[k]), (k, got[k], ref[k])
    assert not torch.equal(ref["length"], state["length"]) or bool(state["done"].all())  # the step did something


def greedy_rows(gen, b, v, dtype):
    """Random logits with the cases that matter: ties (the lowest index wins), NaN, +inf, all -inf,
    -inf entries, a maximum in the last (masked-tile) positions."""
    z = torch.randn(b, v, generator=gen).to(dtype)
    z[0, [3, v - 2]] = 50.0  # a tie: index 3
    z[1, 5] = float("nan")
    z[2, v // 2] = float("inf")
    z[3] = float("-inf")
    z[4, : v // 2] = float("-inf")
    z[5, v - 1] = 99.0
    return z


@pytest.mark.parametrize("v,dtype", [(37, torch.float32), (1500, torch.float32), (2049, torch.bfloat16)])
def test_greedy_next_kernel_matches_reference(v, dtype):
    from flashspec_torch.backend import greedy_next_reference, greedy_next_triton

    gen = torch.Generator().manual_seed(v)
    z = greedy_rows(gen, 8, v, dtype)
    bad_ref, bad_got = torch.full((8,), 7, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8)
    want, got = greedy_next_reference(z, bad_ref), greedy_next_triton(z, bad_got)
    assert torch.equal(bad_got, bad_ref) and bad_ref.tolist() == [0, 1, 1, 1, 0, 0, 0, 0]
    assert torch.equal(got.num_accepted, want.num_accepted)
    ok = bad_ref == 0  # a flagged row's token is discarded unread
    assert torch.equal(got.tokens[ok], want.tokens[ok]) and got.tokens[0, 0] == 3 and got.tokens[5, 0] == v - 1
    assert (got.tokens[:, 1] == -1).all()


def test_greedy_next_kernel_is_what_plain_greedy_decoding_runs():
    """The backend's plain greedy step through the kernel (interpreter) gives the reference's tokens."""
    from flashspec.config import SamplingConfig
    from flashspec.loop import decode
    from test_backend_graphs import PROMPTS, backends

    outs = []
    for impl in ("reference", "triton"):
        b = backends("cpu", False)
        b.commit_impl = impl
        seed = torch.zeros(len(PROMPTS), dtype=torch.int64)
        with torch.inference_mode():
            outs.append(decode(b, PROMPTS, sampling=SamplingConfig(0.0), max_new_tokens=12, seed=seed)[0])
    assert outs[0] == outs[1] and any(len(o) > 1 for o in outs[0])
