"""Hypothesis fuzzing of ``flashspec_jax.verify`` (reference impl; every new shape compiles, so few
examples): a valid result or a documented error."""

import pytest

jnp = pytest.importorskip("jax.numpy")

import numpy as np  # noqa: E402
from fuzz_cases import DOCUMENTED, check_result, verify_args  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402

from flashspec_jax import verify  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verify_args(max_b=2, max_g=2, max_v=4))
def test_jax_verify(case):
    (z, x), kw = case
    kw = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    try:
        res = verify(jnp.asarray(z), jnp.asarray(x), **kw, impl="reference")
    except DOCUMENTED:
        return
    check_result(res, z, x)
