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
                 max_new=torch.tensor(9), done=torch.rand(b, generator=gen) < 0.3, active=torch.zeros(b, dtype=torch.bool))
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
