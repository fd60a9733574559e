"""Bad arguments raise ValueError naming the argument; traced inputs never read out of bounds."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flashspec_jax import verify
from jax_cases import make_inputs


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(np.random.default_rng(0), 2, 3, 50)


def jnp_args(inputs):
    return tuple(None if a is None else jnp.asarray(a) for a in inputs.args)


@pytest.mark.parametrize("impl", ["reference", "pallas"])
@pytest.mark.parametrize(
    "mutate,kwargs,match",
    [
        (lambda z, x, w, lq: (z[:, :1], x[:, :0], w[:, :0], None), {}, "target_logits"),
        (lambda z, x, w, lq: (z, x[:, :2], w, None), {}, "draft_tokens"),
        (lambda z, x, w, lq: (z, x, w[..., :40], None), {}, "draft_logits"),
        (lambda z, x, w, lq: (z.astype(jnp.int32), x, w, None), {}, "target_logits"),
        (lambda z, x, w, lq: (z, x.astype(jnp.float32), w, None), {}, "draft_tokens"),
        (lambda z, x, w, lq: (z, x.at[1, 2].set(-1), w, None), {}, r"draft_tokens\[1, 2\] = -1"),
        (lambda z, x, w, lq: (z, x.at[0, 0].set(50), None, None), {}, r"draft_tokens\[0, 0\] = 50"),
        (lambda z, x, w, lq: (z.at[0, 1, 3].set(jnp.nan), x, w, None), {}, r"target_logits\[0, 1, 3\]"),
        (lambda z, x, w, lq: (z.at[1, 2].set(-jnp.inf), x, w, None), {}, "target_logits.*no finite"),
        (lambda z, x, w, lq: (z, x, w.at[0, 0, 0].set(jnp.inf), None), {}, r"draft_logits\[0, 0, 0\]"),
        (lambda z, x, w, lq: (z, x, w, jnp.ones((2, 3))), {}, "draft_logprobs"),
        (lambda z, x, w, lq: (z, x, None, jnp.zeros((2, 3))), {}, "draft_logprobs"),
        (lambda z, x, w, lq: (z, x, w, None), {"temperature": -1.0}, "temperature"),
        (lambda z, x, w, lq: (z, x, w, None), {"top_k": -2}, "top_k"),
        (lambda z, x, w, lq: (z, x, w, None), {"top_p": 0.0}, "top_p"),
        (lambda z, x, w, lq: (z, x, w, None), {"seed": True}, "seed"),
        (lambda z, x, w, lq: (z, x, w, None), {"seed": -1}, "seed"),
        (lambda z, x, w, lq: (z, x, w, None), {"seed": jnp.zeros(3, jnp.int32)}, "seed"),
        (lambda z, x, w, lq: (z, x, w, None), {"offset": 2**32}, "offset"),
        (lambda z, x, w, lq: (z, x, w, None), {"offset": jnp.zeros(2, jnp.float32)}, "offset"),
        (lambda z, x, w, lq: (z, x, w.at[0, 1, x[0, 1]].set(-jnp.inf), None), {}, r"draft_tokens\[0, 1\].*zero probability"),
    ],
)
def test_bad_arguments_raise(inputs, impl, mutate, kwargs, match):
    args = mutate(*jnp_args(inputs))
    with pytest.raises(ValueError, match=match):
        verify(*args, **kwargs, impl=impl)


def test_unknown_impl(inputs):
    with pytest.raises(ValueError, match="impl='triton'"):
        verify(*jnp_args(inputs), impl="triton")


def test_default_impl_off_gpu_is_reference(inputs):
    a = verify(*jnp_args(inputs), seed=3)
    b = verify(*jnp_args(inputs), seed=3, impl="reference")
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


@pytest.mark.parametrize("impl", ["reference", "pallas"])
def test_traced_padding_ids_are_clamped(inputs, impl):
    """Under jit the value checks cannot run: -1 / huge ids must not read out of bounds."""
    z, x, w, _ = jnp_args(inputs)
    x = x.at[0, 0].set(-1).at[1, 2].set(10**6)
    res = jax.jit(lambda z, x, w: verify(z, x, w, seed=1, impl=impl))(z, x, w)
    tokens = np.asarray(res.tokens)
    assert ((tokens >= -1) & (tokens < z.shape[-1])).all()


def test_import_without_jax_says_how_to_install():
    code = "import sys; sys.modules['jax'] = None; import flashspec_jax"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "pip install 'flashspec[jax]'" in out.stderr
