"""The jnp reference with the top-down FINAL noise (verify_reference(top_down=True)): the tokens of its NumPy oracle,
flashspec.reference.verify_top_down, for draft logits, draft log-probs and one-hot drafts, shared and per-row
seeds. (No Pallas kernel draws this noise yet: docs/kernel_notes.md, "Top-down noise".)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from flashspec import reference as oracle
from flashspec_jax.kernels import verify as kernels
from flashspec_jax import random as rng
from flashspec_jax.verify import make_counters


@pytest.mark.parametrize("draft", ["logits", "logprobs", "onehot"])
@pytest.mark.parametrize("per_row", [False, True])
def test_jnp_reference_with_top_down_noise_matches_the_oracle(draft, per_row):
    rs = np.random.default_rng(3 + per_row)
    b, g, v, t = 6, 3, 1000, 0.9
    z = (rs.normal(size=(b, g + 1, v)) * 3).astype(np.float32)
    w = (z[:, :g] + rs.normal(size=(b, g, v)) * 2).astype(np.float32)
    lq_all = w / t - np.logaddexp.reduce(w / t, axis=-1, keepdims=True)
    x = np.array([[rs.choice(v, p=np.exp(lq_all[i, k]) / np.exp(lq_all[i, k]).sum()) for k in range(g)]
                  for i in range(b)], np.int32)
    lq = np.take_along_axis(lq_all, x[..., None], -1)[..., 0].astype(np.float32)
    w_arg = None if draft == "onehot" else w
    lq_arg = lq if draft == "logprobs" else None
    seed = np.array([11, 2**40 + 5, 3, 7, 2**33, 9], np.uint64) if per_row else np.uint64(7)
    offset = np.array([3, 0, 2**31 + 1, 5, 8, 1], np.uint32) if per_row else np.uint32(3)
    lo, hi = rng.split_counter(seed)
    c = make_counters(jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(offset), b)
    got = kernels.verify_reference(jnp.asarray(z), jnp.asarray(x), None if w_arg is None else jnp.asarray(w_arg),
                                   None if lq_arg is None else jnp.asarray(lq_arg), c, temperature=t, top_k=0,
                                   top_p=1.0, top_down=True)
    want = oracle.verify_top_down(z, x, w_arg, lq_arg, seed=seed, offset=offset, temperature=t)
    np.testing.assert_array_equal(np.asarray(got.num_accepted), want.num_accepted)
    np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens)
    default = oracle.verify(z, x, w_arg, lq_arg, seed=seed, offset=offset, temperature=t)
    assert np.any(default.tokens != want.tokens)  # another noise: the check is not the default path's
