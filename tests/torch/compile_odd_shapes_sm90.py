"""Compile for sm_90, without a GPU, exactly what the launchers launch at the odd shapes of issue #41; run as
a script without TRITON_INTERPRET: ``compile_odd_shapes_sm90.py [ci|all]`` (tests/torch/test_odd_shapes.py runs
the ci set in a subprocess; ``all``: every shape and variant, minutes).

``compile_launches`` replaces ``JITFunction.run`` (what ``kernel[grid](...)`` calls) by ``triton.compile`` for
sm_90 of the launch's own specialization: the constexprs the launcher chose and the divisibility of its
integer arguments and pointers, as Triton's JIT would on an H100. The launchers run on ``meta`` tensors (no
memory, no data; the kernels' outputs are never read) that count as CUDA tensors (``is_cuda``, distinct
256-aligned ``data_ptr``s), with the choices the launchers make on an H100: PDL on, ``choose_config`` for 132
SMs, ``Llama.decode_settings`` of a CUDA device. Each distinct launch compiles once.
Prints one line per compiled kernel with its constexprs and shared memory; exits non-zero on the first compile
error or on shared memory above the H100's 227 KB per block.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from flashspec_torch import backend as torch_backend  # noqa: E402
from flashspec_torch import kernel_config, layers  # noqa: E402
from flashspec_torch.kernels import verify as verify_kernels  # noqa: E402
from flashspec_torch.model import Llama, LlamaConfig  # noqa: E402

TARGET = GPUTarget("cuda", 90, 64)
H100_SMS = 132
MAX_SHARED = 232448  # bytes per block on sm_90 (227 KB)
META = torch.device("meta")
torch_verify = importlib.import_module("flashspec_torch.verify")  # the module (the package exports the function)
LLAMA_SETTINGS = Llama.decode_settings  # the real one, called with a CUDA device inside compile_launches


@contextlib.contextmanager
def compile_launches():
    """Inside: every ``kernel[grid](...)`` compiles for sm_90 instead of launching; yields {key: line}."""
    backend = make_backend(TARGET)
    compiled: dict[tuple, str] = {}

    def run(self, *args, grid, warmup, **kwargs):
        kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, spec, options = create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        key = (self.fn.__name__, str(spec), str(options))
        if key in compiled:
            return
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
        named = {self.arg_names[path[0]]: value for path, value in constexprs.items()}
        shared = kernel.metadata.shared
        compiled[key] = f"{self.fn.__name__} {named} warps={options.num_warps}: shared {shared} bytes"
        print(f"ok {compiled[key]}", flush=True)
        if shared > MAX_SHARED:
            raise RuntimeError(f"{compiled[key]}: above the {MAX_SHARED} bytes of shared memory per block of sm_90")

    def gpu_config(batch, gamma, vocab, device, itemsize=2):  # choose_config as on an H100
        with mock.patch.object(kernel_config, "interpreting", lambda: False), \
                mock.patch.object(kernel_config, "device_sms", lambda d: H100_SMS):
            return kernel_config.choose_config(batch, gamma, vocab, torch.device("cuda"), itemsize)

    real_data_ptr = torch.Tensor.data_ptr

    def data_ptr(t: torch.Tensor) -> int:  # meta tensors: distinct 256-aligned addresses (the launchers compare them)
        return (id(t) & 0xFFFFFFFFFF) << 8 if t.is_meta else real_data_ptr(t)

    patches = [
        mock.patch.object(JITFunction, "run", run),
        mock.patch.object(torch.Tensor, "data_ptr", data_ptr),
        mock.patch.object(torch.Tensor, "is_cuda", property(lambda t: t.is_meta or t.device.type == "cuda")),
        mock.patch.object(layers, "pdl_possible", lambda d: True),  # every layer kernel and product: PDL, as on Hopper
        mock.patch.object(torch_verify, "pdl_possible", lambda d: True),
        mock.patch.object(torch_verify, "load_kernels", lambda d: verify_kernels),
        mock.patch.object(torch_verify, "choose_config", gpu_config),
        mock.patch.object(Llama, "decode_settings", lambda self, d: LLAMA_SETTINGS(self, torch.device("cuda"))),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield compiled


def meta_model(config: LlamaConfig, dtype: torch.dtype, batch_invariant: bool) -> Llama:
    with torch.device("meta"):
        model = Llama(config).to(dtype)
    model.impl = "triton"
    model.batch_invariant = batch_invariant  # the batch-invariant products and attention; else the H100 defaults
    return model


def forward(model: Llama, batch: int, new_tokens: int, cache_len: int = 64) -> None:
    """One decoding (1 new token) or scoring (G + 1) pass of the model: every kernel of a step's forward."""
    cache = model.new_cache(batch, cache_len)
    tokens = torch.zeros((batch, new_tokens), dtype=torch.int64, device=META)
    positions = torch.zeros((batch, new_tokens), dtype=torch.int64, device=META)
    with torch.inference_mode():
        model(tokens, positions, cache, cache_len)


def verify_launch(batch: int, vocab: int, temperature: float, draft: bool, gamma: int = 4) -> None:
    """One verify of bf16 logits (both launches: V is split on an H100)."""
    z = torch.empty((batch, gamma + 1, vocab), dtype=torch.bfloat16, device=META)
    w = torch.empty((batch, gamma, vocab), dtype=torch.bfloat16, device=META) if draft else None
    x = torch.empty((batch, gamma), dtype=torch.int64, device=META)
    torch_verify.verify(z, x, w, temperature=temperature, impl="triton", validate=False)


def head_kernels(head_dim: int, dtype: torch.dtype, heads: int = 8, kv_heads: int = 2, tokens: int = 1) -> None:
    """RoPE + KV write and attention of ``tokens`` new tokens per row at ``head_dim``."""
    b, s = 1, 64
    qkv = torch.empty((b, tokens, (heads + 2 * kv_heads) * head_dim), dtype=dtype, device=META)
    cos = torch.empty((b, tokens, head_dim), dtype=dtype, device=META)
    positions = torch.empty((b, tokens), dtype=torch.int64, device=META)
    k, v = (torch.empty((b, kv_heads, s, head_dim), dtype=dtype, device=META) for _ in range(2))
    q = layers.rope_kv(qkv, cos, cos, positions, k, v, heads, kv_heads, impl="triton", pdl=True)
    layers.attention(q, k, v, positions, None, kv_heads, impl="triton", pdl=True, attend_len=s)


def llama(vocab: int, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_layers=1, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=True)


# SmolLM2-360M's widths (hidden 960, intermediate 2560, 15 heads of 64: every product fused at one row on an H100)
# and a Phi-2-sized model (hidden 2560, 32 heads of 80, intermediate 10240: cuBLAS products), odd vocabularies
WIDTH_960 = llama(49153, 960, 2560, 15, 5, 64)
WIDTH_2560 = llama(151936, 2560, 10240, 32, 32, 80)


def ci() -> None:
    """Each kernel once per distinct shape that matters (49 compiles, and 5 of the batch-invariant scoring pass
    at width 960, 2 more with 600 cache slots: split attention and its merge): both models' decoding and scoring passes in bf16 with the H100 defaults (the 960 one's fused products at K = 960 and 2560, the 2560 one's
    add + RMSNorm at 4096 columns), decoding in float32 (the dtype of benchmarks/odd_shapes_gpu.py); RoPE and
    attention at head_dim 24, 96, 112 (bf16, and float32 at 24 and 112) and the largest tiles the attention kernel
    takes (float32, head_dim 256, 64 query rows); verify at V = 49153 (B = 1: 97 chunks,
    one-hot q) and 151936 (B = 256: the slot-vote sweep of bfloat16 pairs, draft logits); greedy_next."""
    for config in (WIDTH_960, WIDTH_2560):
        print(f"# {config}", flush=True)
        model = meta_model(config, torch.bfloat16, batch_invariant=False)
        forward(model, 1, 1)
        forward(model, 1, 5)
        forward(meta_model(config, torch.float32, batch_invariant=False), 1, 1)
    print("# batch-invariant scoring pass at width 960", flush=True)  # its products (3 prologues) and attention
    forward(meta_model(WIDTH_960, torch.bfloat16, batch_invariant=True), 2, 5)
    forward(meta_model(WIDTH_960, torch.bfloat16, batch_invariant=True), 2, 5, cache_len=600)  # 3 KV splits, the merge
    for head_dim in (24, 96, 112):
        print(f"# head_dim {head_dim}", flush=True)
        head_kernels(head_dim, torch.bfloat16)
        if head_dim != 96:
            head_kernels(head_dim, torch.float32)
    print("# head_dim 256, 8 query heads per KV head, 5 new tokens: the attention kernel's largest tiles", flush=True)
    head_kernels(256, torch.float32, heads=8, kv_heads=1, tokens=5)
    print("# verify", flush=True)
    verify_launch(1, WIDTH_960.vocab_size, 0.7, draft=False)
    verify_launch(256, WIDTH_2560.vocab_size, 0.7, draft=True)
    torch_backend.greedy_next_triton(torch.empty((1, WIDTH_2560.vocab_size), device=META),
                                     torch.empty((1,), dtype=torch.uint8, device=META))


def everything() -> None:
    """The ci set, then every odd shape x (bf16 defaults, bf16 batch-invariant, float32) x (decoding, scoring);
    verify at both vocabularies, B = 1 and 256, one-hot / draft logits / greedy (about 150 compiles, minutes)."""
    ci()
    configs = [WIDTH_960, WIDTH_2560, llama(32000, 96, 256, 4, 2, 24), llama(32000, 3072, 8192, 32, 32, 96),
               llama(32000, 896, 4864, 8, 2, 112)]
    for config in configs:
        print(f"# {config}", flush=True)
        for dtype, batch_invariant in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)):
            model = meta_model(config, dtype, batch_invariant)
            forward(model, 1, 1)
            forward(model, 1, 5)
    for vocab in (WIDTH_960.vocab_size, WIDTH_2560.vocab_size):
        for batch in (1, 256):
            for temperature, draft in ((0.7, False), (0.7, True), (0.0, False)):
                verify_launch(batch, vocab, temperature, draft)
        torch_backend.greedy_next_triton(torch.empty((1, vocab), device=META), torch.empty((1,), dtype=torch.uint8, device=META))


def main(which: str) -> int:
    with compile_launches() as compiled:
        everything() if which == "all" else ci()
    print(f"{len(compiled)} kernels compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "ci"))
