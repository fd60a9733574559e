"""Registers and spills of the batch-invariant product on sm_90, without a GPU: compiles the kernel
for sm_90a with ``triton.compile`` with every tiling ``benchmarks/invariant_tiles_gpu.py`` times (its
``families``: the candidates of each reduction order, and the engine's ``launch_tiling`` on any GPU and on
each card of ``MMA64_CARDS``) of every
projection of TinyLlama-1.1B's and Llama-3-8B's shapes (bf16), at M = 1, 64 and 320 where the
candidate runs (each distinct kernel once), and runs ``ptxas -v`` on its PTX. Run without
TRITON_INTERPRET:

    PYTHONPATH=$PWD/shared:$PWD:$PWD/benchmarks python benchmarks/invariant_registers_sm90.py \
        [--only m128] [tinyllama-1.1b llama3-8b]

(~1-2 s per compile on this project's CPU machine; ``--only TEXT``: only the variants whose name holds it).
Prints one line per projection and variant: its tiling, shared memory, registers, spill bytes.
"""

import argparse
import os
import subprocess
import tempfile
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
from invariant_tiles_gpu import families, m_class, projections  # noqa: E402  (benchmarks/ is on sys.path)

TARGET = GPUTarget("cuda", 90, 64)
SHARED_MAX = 232448  # bytes of shared memory a block may have on sm_90 (227 KB)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*", default=["tinyllama-1.1b", "llama3-8b"],
                    help="shapes of invariant_tiles_gpu.py")
    ap.add_argument("--only", default="", help="compile only the variants whose name holds this text")
    args = ap.parse_args()
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
        over = " (OVER sm_90's 232448: fails to launch)" if kernel.metadata.shared > SHARED_MAX else ""
        print(*label, f"shared {kernel.metadata.shared} B{over} |", " | ".join(info), flush=True)

    real_ptr = torch.Tensor.data_ptr
    meta = torch.device("meta")
    with mock.patch.object(JITFunction, "run", run), \
            mock.patch.object(torch.Tensor, "data_ptr", lambda t: ((id(t) & 0xFFFFFFFFFF) << 8) if t.is_meta else real_ptr(t)), \
            mock.patch.object(layers, "pdl_possible", lambda d: True), mock.patch.object(I, "interpreting", lambda: False):
        for shape in args.shapes:
            for proj, n, k in projections(shape):
                t = I.invariant_tiling(n, k, torch.bfloat16)
                e = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device=meta)  # noqa: E731
                seen = set()
                cands = [(f"{f}/{c}", tt, cls) for f, d in families(t, k).items() for c, (tt, cls) in d.items()]
                for m in (1, 64, 320):
                    engine = [(f"launch_tiling {gpu}", I.launch_tiling(t, m, n, k, gpu), (m_class(m),))
                              for gpu in (None, *I.MMA64_CARDS)]
                    for name, tiling, classes in engine + cands:
                        key = (tiling, min(tiling.row_tiles, -(-m // tiling.block_m)))
                        if m_class(m) not in classes or key in seen or args.only not in name:
                            continue
                        seen.add(key)
                        label[:] = [shape, proj, n, k, f"M {m} {name} {tiling} slices {tiling.slices(k)}:"]
                        I.launch(e(m, k), e(n, k), True, tiling)


if __name__ == "__main__":
    main()
