"""The Pallas kernels lower for the GPU without a GPU (Triton IR), so CI catches lowering errors.

``jax.export`` with ``platforms=["cuda"]`` runs the Pallas Triton lowering on this CPU-only
machine. It stops at Triton IR: PTX compilation (and the inline ``div.rn.f32``) is only checked on
a real GPU.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from flashspec_jax.kernels import verify as kernels
from flashspec_jax.verify import make_counters

TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")  # JAX 0.10 and 0.11 custom calls


def export_for_cuda(batch, gamma, vocab, dtype, *, temperature, top_k=0, top_p=1.0, draft="logits", config=None,
                    lengths=False):
    """The Pallas verify exported for CUDA; ``config`` None: ``choose_config``; ``lengths``: with draft_lengths [B]."""

    def f(z, x, w, lq, seed, *length):
        c = make_counters(seed, seed, seed, z.shape[0])
        d = kernels.verify(z, x, w, lq, c, *length, temperature=temperature, top_k=top_k, top_p=top_p, config=config,
                           interpret=False)
        return d.num_accepted, d.tokens

    spec = jax.ShapeDtypeStruct
    args = (
        spec((batch, gamma + 1, vocab), dtype),
        spec((batch, gamma), jnp.int32),
        None if draft == "onehot" else spec((batch, gamma, vocab), dtype),
        spec((batch, gamma), jnp.float32) if draft == "logprobs" else None,
        spec((batch,), jnp.uint32),
        *([spec((batch,), jnp.int32)] if lengths else []),
    )
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    return jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args)


@pytest.mark.parametrize(
    "batch,gamma,vocab,dtype,temperature,top_k,top_p,draft,kernels_expected",
    [
        (4, 4, 32000, jnp.float32, 1.0, 0, 1.0, "logits", 3),  # stats of z and w, final draw
        (1, 8, 128256, jnp.bfloat16, 0.7, 0, 1.0, "logprobs", 2),  # no pass over the draft rows
        (8, 1, 50257, jnp.float16, 1.0, 0, 1.0, "onehot", 2),
        (64, 4, 1000, jnp.float32, 0.0, 0, 1.0, "logits", 1),  # greedy: one argmax pass
        (2, 3, 777, jnp.float32, 0.8, 40, 0.9, "logits", 3),
    ],
)
def test_lowers_to_triton(batch, gamma, vocab, dtype, temperature, top_k, top_p, draft, kernels_expected):
    exported = export_for_cuda(batch, gamma, vocab, dtype, temperature=temperature, top_k=top_k, top_p=top_p, draft=draft)
    assert exported.platforms == ("cuda",)
    text = exported.mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == kernels_expected


@pytest.mark.parametrize("draft,temperature", [("onehot", 0.8), ("logits", 0.0)])
def test_lowers_with_draft_lengths(draft, temperature):
    exported = export_for_cuda(16, 4, 49152, jnp.bfloat16, temperature=temperature, draft=draft, lengths=True)
    assert sum(exported.mlir_module().count(name) for name in TRITON_CALLS) == (1 if temperature == 0 else 2)


@pytest.mark.parametrize("draft,temperature,batch", [("logits", 0.7, 4), ("logprobs", 1.0, 256), ("onehot", 0.9, 32),
                                                     ("logprobs", 0.0, 32)])
def test_default_config_lowers_to_triton(draft, temperature, batch):
    """The default (choose_config: 16-byte vectors, prefetch, pruning at B=256)."""
    exported = export_for_cuda(batch, 4, 128256, jnp.bfloat16, temperature=temperature, draft=draft)
    expected = 1 if temperature == 0 else 3 if draft == "logits" else 2
    text = exported.mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == expected
    assert ("flashspec_final_decide" in text) == (temperature > 0)


@pytest.mark.parametrize("batch,vocab,dtype,temperature,top_k,top_p,draft", [
    (4, 32000, jnp.bfloat16, 0.7, 0, 1.0, "logits"),  # draft stats recombined in the prologue
    (1, 128256, jnp.bfloat16, 1.0, 0, 1.0, "logprobs"),  # lse_q one logit away
    (8, 50257, jnp.float16, 0.9, 0, 1.0, "onehot"),
    (2, 777, jnp.float32, 0.8, 40, 0.9, "logits"),  # filters: the jnp pre-pass, then the same kernels
])
def test_explicit_config_lowers_to_triton(batch, vocab, dtype, temperature, top_k, top_p, draft):
    """A config other than the default (the dataclass's values: 8 warps, 4096 / 1024-logit tiles): row_stats (of
    z, and of w without draft_logprobs) then flashspec_final_decide."""
    exported = export_for_cuda(batch, 4, vocab, dtype, temperature=temperature, top_k=top_k, top_p=top_p, draft=draft,
                               config=kernels.VerifyKernelConfig())
    text = exported.mlir_module()
    assert sum(text.count(name) for name in TRITON_CALLS) == (3 if draft == "logits" else 2)
    assert "flashspec_final_decide" in text


def main_function(text: str) -> str:  # the exported module's entry function, as text
    main = text[text.index("func.func public @main"):]
    return main[: main.index("\n  }")]


def kernel_operand_sources(text: str) -> list[str]:
    """The op that defines each operand of each Triton call in the exported module's main function:
    "arg", "kernel" (another Triton call's result) or the StableHLO op's name."""
    main = main_function(text)
    defined = {}
    for line in main.splitlines():
        m = re.match(r"\s*(%[\w]+)(?::\d+)? = (\S+)", line)
        if m:
            defined[m.group(1)] = "kernel" if any(name in line for name in TRITON_CALLS) else m.group(2)
    sources = []
    for line in main.splitlines():
        if any(name in line for name in TRITON_CALLS):
            operands = line[line.index("(", line.index("custom_call")) + 1:].split(")")[0]
            for op in re.findall(r"%[\w]+", operands):
                sources.append("arg" if op.startswith("%arg") else defined.get(op, "?"))
    return sources


@pytest.mark.parametrize("per_row", [False, True])
def test_kernel_operands_are_not_built_per_step(per_row):
    """A shared seed and offset reach the kernels as one value each (a reshape: no copy), and the row
    coordinate is computed inside: nothing of size B is built before the kernels, which in a jitted
    decoding loop XLA would do every step (an iota and broadcasts, a kernel launch each)."""
    spec = jax.ShapeDtypeStruct
    b, g, v = 32, 1, 32000
    counter = spec((b,) if per_row else (), jnp.uint32)

    def f(z, x, w, lq, seed, offset):
        c = make_counters(seed, seed, offset, b)
        d = kernels.verify(z, x, w, lq, c, temperature=0.7, top_k=0, top_p=1.0, interpret=False)
        return d.num_accepted, d.tokens

    args = (spec((b, g + 1, v), jnp.float32), spec((b, g), jnp.int32), spec((b, g, v), jnp.float32),
            spec((b, g), jnp.float32), counter, counter)
    checks = [jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS]
    text = jax.export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
    sources = kernel_operand_sources(text)
    assert sources.count("kernel") == 2, sources  # the normalisers, into final_decide
    assert set(sources) <= {"arg", "kernel", "stablehlo.reshape"}, sources
