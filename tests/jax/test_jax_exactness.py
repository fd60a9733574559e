"""The shared exactness suite (flashspec.testing) on both JAX implementations.

impl="reference" runs the suite's default sample sizes. impl="pallas" runs in Pallas interpret
mode on the CPU, where every batch row is one sequential grid step, so it uses
n_samples=10_000 and ks_samples=5_000 (less power than the default 100_000 / 10_000; run the
defaults on the GPU with FLASHSPEC_FULL_SUITE=1).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

testing = pytest.importorskip("flashspec.testing")

from flashspec_jax import verify  # noqa: E402
from flashspec_jax.verify import on_gpu  # noqa: E402


def numpy_adapter(impl: str):
    """A callable with flashspec.reference.verify's NumPy signature over flashspec_jax.verify."""

    def verify_np(target_logits, draft_tokens, draft_logits=None, draft_logprobs=None, **kwargs):
        res = verify(target_logits, draft_tokens, draft_logits, draft_logprobs, **kwargs, impl=impl)
        return type(res)(num_accepted=np.asarray(res.num_accepted), tokens=np.asarray(res.tokens))

    return verify_np


def test_reference_is_exact():
    testing.assert_exact(numpy_adapter("reference"))


def test_pallas_is_exact():
    full = on_gpu() or os.environ.get("FLASHSPEC_FULL_SUITE") == "1"
    sizes = {} if full else dict(n_samples=10_000, ks_samples=5_000)
    testing.assert_exact(numpy_adapter("pallas"), **sizes)
