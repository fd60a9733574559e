"""The shared exactness suite (flashspec.testing) on both torch implementations.

The suite tiles each (p, q) case over ``n_samples`` batch rows in one verify call. The Triton
interpreter runs those rows as NumPy tiles, so we use 20,000 samples per case (the suite's default
is 100,000) and the write-up's 10,000 for the Kolmogorov-Smirnov check; the chi-square checks of
the joint law of (n, y) keep ample power at that size (see tests/core/test_exactness_suite.py for
the mutants the suite rejects).
"""

import numpy as np
import pytest
import torch

from flashspec.contract import VerifyResult
from flashspec_torch import KernelConfig, verify

testing = pytest.importorskip("flashspec.testing")

N_SAMPLES = 20_000
KS_SAMPLES = 10_000


def as_tensor(a):
    return None if a is None else torch.from_numpy(np.array(a))  # a copy: keeps the dtype, drops broadcasting


# The sweep's pruning vote per slot (kernels/slots.py): 4 slots of 4 logits per 16-logit tile, two launches
# (the interpreter's large programs: 4096 rows, tiles of 16; the suite's V <= 12 is one tile)
SLOTS = KernelConfig(block_b=4096, block_v=16, sweep_v=16, num_chunks=2, sweep_slots=4)


def numpy_adapter(impl: str, config: KernelConfig | None = None):
    """numpy arrays -> torch tensors -> flashspec_torch.verify(impl=...) -> numpy arrays."""

    def verify_np(target_logits, draft_tokens, draft_logits=None, draft_logprobs=None, draft_lengths=None,
                  **options):
        res = verify(as_tensor(target_logits), as_tensor(draft_tokens), as_tensor(draft_logits),
                     as_tensor(draft_logprobs), draft_lengths=as_tensor(draft_lengths), impl=impl, config=config,
                     **options)
        return VerifyResult(res.num_accepted.numpy(), res.tokens.numpy())

    return verify_np


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_shared_exactness_suite(impl):
    report = testing.assert_exact(numpy_adapter(impl), n_samples=N_SAMPLES, ks_samples=KS_SAMPLES)
    assert len(report.checks) > 50


def test_slot_vote_equals_the_oracle_on_every_suite_case():
    """The slot vote prunes only tiles that cannot win, so on every case of the suite it returns the NumPy
    oracle's tokens exactly (the oracle passes the suite at 100,000 samples in tests/core): 4,096 rows per
    case (one program), compared row by row, and the argmax rule at T = 0."""
    from flashspec.reference import verify as oracle

    slots = numpy_adapter("triton", SLOTS)
    for k, case in enumerate(testing.standard_cases()):
        _, n_want, t_want = testing.run_case(oracle, case, 4096, seed=7 + k, offset=7 * k)
        _, n_got, t_got = testing.run_case(slots, case, 4096, seed=7 + k, offset=7 * k)
        np.testing.assert_array_equal(n_got, n_want, err_msg=f"{case.name}: num_accepted")
        np.testing.assert_array_equal(t_got, t_want, err_msg=f"{case.name}: tokens")
    assert testing.check_greedy(slots).passed
