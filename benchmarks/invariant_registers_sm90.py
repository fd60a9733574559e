"""Registers and spills of the batch-invariant product on sm_90, without a GPU: compiles the kernel
for sm_90a with ``triton.compile`` with the engine's tiling (``invariant_tiling``) of every projection
of TinyLlama-1.1B's and Llama-3-8B's shapes (bf16) at M = 1 (one row tile per program) and M = 64
(4 row tiles per program), and 64-row tiles (one per program) at M = 64, and runs ``ptxas -v`` on its
PTX. Run without TRITON_INTERPRET:

    PYTHONPATH=$PWD/shared:$PWD python benchmarks/invariant_registers_sm90.py [tinyllama llama3]

(~10-20 s per compile on a slow core). Prints one line per projection and variant: its tiling, shared
memory, registers, spill bytes.
"""

import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from flashspec_torch import invariant_matmul as I  # noqa: E402
from flashspec_torch import layers  # noqa: E402

TARGET = GPUTarget("cuda", 90, 64)
SHAPES = {  # (projection, N, K): qkv, o, gate_up, down, LM head
    "tinyllama": (("qkv", 2560, 2048), ("o", 2048, 2048), ("gate_up", 11264, 2048), ("down", 2048, 5632),
                  ("lm_head", 32000, 2048)),
    "llama3": (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
               ("lm_head", 128256, 4096)),
}


def main() -> None:
    backend = make_backend(TARGET)
    label = []

    def run(self, *args, grid, warmup, **kwargs):  # kernel[grid](...): compile for sm_90a, ptxas -v, no launch
        kwargs["debug"], kwargs["instrumentation_mode"] = False, knobs.compilation.instrumentation_mode
        bound, spec, options = create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(kernel.asm["ptx"])
        err = subprocess.run(["ptxas", "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True).stderr
        info = [line.split("info    : ")[-1] for line in err.splitlines() if "registers" in line or "spill" in line]
        print(*label, f"shared {kernel.metadata.shared} B |", " | ".join(info), flush=True)

    real_ptr = torch.Tensor.data_ptr
    meta = torch.device("meta")
    with mock.patch.object(JITFunction, "run", run), \
            mock.patch.object(torch.Tensor, "data_ptr", lambda t: ((id(t) & 0xFFFFFFFFFF) << 8) if t.is_meta else real_ptr(t)), \
            mock.patch.object(layers, "pdl_possible", lambda d: True), mock.patch.object(I, "interpreting", lambda: False):
        for shape in sys.argv[1:] or list(SHAPES):
            for proj, n, k in SHAPES[shape]:
                t = I.invariant_tiling(n, k, torch.bfloat16)
                e = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device=meta)  # noqa: E731
                for m, tiling in ((1, t), (64, t), (64, replace(t, block_m=64, row_tiles=1))):
                    label[:] = [shape, proj, n, k, f"M {m} {tiling} splits {tiling.slices(k)}:"]
                    I.launch(e(m, k), e(n, k), True, tiling)

if __name__ == "__main__":
    main()
