#!/usr/bin/env bash
# Builds FlashInfer's chain speculative sampling kernel (header-only, flashinfer/sampling.cuh) into
# .flashinfer/lib/libflashinfer_chain.so on this machine, no GPU needed, so that a device-tool call
# can carry it (2.3 MB) to the H200 and benchmarks/verify_kernels.py --flashinfer can time it.
#   bash scripts/flashinfer_build.sh       # needs the package registry: the FlashInfer wheel
#                                          # (sources, 101 MB) and CUDA 13.0's nvcc wheels
# FlashInfer's Python package is not used: its wheel ships sources only and JIT-compiles them at
# first use, and its whole tree (101 MB) is more than a device call carries (64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHINFER=${FLASHINFER_VERSION:-0.7.4}
CUDA=${CUDA_VERSION:-13.0}
work=.flashinfer/build
mkdir -p "$work/wheels" "$work/tree" .flashinfer/lib
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" "flashinfer-python==$FLASHINFER" \
  "nvidia-cuda-nvcc==$CUDA.*" "nvidia-cuda-crt==$CUDA.*" "nvidia-nvvm==$CUDA.*" "nvidia-cuda-cccl==$CUDA.*" \
  "nvidia-cuda-runtime==$CUDA.*" "nvidia-curand==10.4.*" 2>&1 | grep -v '^WARNING: Location' || true
for w in "$work"/wheels/nvidia_*.whl; do unzip -q -o "$w" -d "$work/tree"; done
unzip -q -o "$work"/wheels/flashinfer_python-"$FLASHINFER"-*.whl 'flashinfer/data/include/*' -d "$work/tree"
cuda_home="$work/tree/nvidia/cu${CUDA%%.*}"
"$cuda_home/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -L "$cuda_home/lib" \
  -I "$work/tree/flashinfer/data/include" benchmarks/flashinfer/chain.cu \
  -o .flashinfer/lib/libflashinfer_chain.so 2>&1 | grep -v -i 'warning' || true
test -s .flashinfer/lib/libflashinfer_chain.so
echo "flashinfer $FLASHINFER (nvcc $CUDA, sm_90) -> .flashinfer/lib/libflashinfer_chain.so"
echo "$FLASHINFER" > .flashinfer/lib/VERSION
