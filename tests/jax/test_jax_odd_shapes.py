"""The JAX backend at shapes that are not powers of two (issue #41): the Pallas verify (its only kernels: the
model is plain jnp, checked on the GPU at the odd shapes by benchmarks/odd_shapes_gpu.py) against the NumPy oracle
at vocabularies 49153 and 151936 in interpret mode, and exported for CUDA with its default config; the int32
vocabulary bound refused when a model is built."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import flashspec.reference as oracle  # noqa: E402
from flashspec_jax.kernels import verify as kernels  # noqa: E402
from flashspec_jax.model import Llama, LlamaConfig  # noqa: E402
from flashspec_jax.verify import make_counters  # noqa: E402
from jax_cases import make_inputs  # noqa: E402
from test_jax_lowering import TRITON_CALLS, export_for_cuda  # noqa: E402

VOCABS = (49153, 151936)


@pytest.mark.parametrize("vocab", VOCABS)
def test_pallas_verify_equals_the_oracle_at_odd_vocabularies(vocab):
    """Sampled (one-hot draft, the n-gram engine's case) and greedy, one row, interpret mode; the interpret default
    splits V into 256-logit tiles, so the last tile is partial at both vocabularies."""
    rs = np.random.default_rng(vocab)
    inputs = make_inputs(rs, 1, 2, vocab, temperature=0.7, draft="onehot")
    c = make_counters(jnp.uint32(5), jnp.uint32(0), jnp.uint32(2), 1)
    for temperature in (0.7, 0.0):
        got = jax.jit(lambda z, x: kernels.verify(z, x, None, None, c, temperature=temperature, top_k=0, top_p=1.0,
                                                  interpret=True))(inputs.target_logits, inputs.draft_tokens)
        want = oracle.verify(inputs.target_logits, inputs.draft_tokens, temperature=temperature, seed=5, offset=2)
        np.testing.assert_array_equal(np.asarray(got.tokens), want.tokens, err_msg=f"T={temperature}")
        np.testing.assert_array_equal(np.asarray(got.num_accepted), want.num_accepted, err_msg=f"T={temperature}")


@pytest.mark.parametrize("vocab,batch,draft,kernels_expected", [(49153, 1, "onehot", 2), (151936, 256, "logits", 3)])
def test_pallas_verify_lowers_for_cuda_at_odd_vocabularies(vocab, batch, draft, kernels_expected):
    """The default config (choose_config) at B = 1 (V in many chunks) and 256 (a few), bf16."""
    text = export_for_cuda(batch, 4, vocab, jnp.bfloat16, temperature=0.7, draft=draft).mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == kernels_expected


def test_a_vocabulary_past_int32_indexing_is_refused():
    cfg = LlamaConfig(vocab_size=2**30 + 1, hidden_size=96, intermediate_size=160, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=24)
    with pytest.raises(ValueError, match="vocab_size=1073741825 is not supported.*vocab_size <= 1073741824"):
        jax.eval_shape(lambda: Llama(cfg))
