"""The host backend's step results: packed into one array on the device, unpacked on the host with
the StepView's dtypes (the loop indexes rows by the boolean flags)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from flashspec_jax.backend import pack, start_copy  # noqa: E402
from flashspec_jax.steps import StepOut  # noqa: E402


def test_step_results_come_back_from_one_copy():
    out = StepOut(jnp.array([2, 0, 4], jnp.int32), jnp.array([True, False, True]), jnp.array([False, True, True]))
    view = start_copy(pack(out)).fetch()
    assert view.num_accepted.tolist() == [2, 0, 4]
    assert view.active.dtype == bool and view.active.tolist() == [True, False, True]
    assert view.done.dtype == bool and view.done.tolist() == [False, True, True]
