#!/usr/bin/env bash
# One device-tool call's GPU work: checks first, then timings; JSON and logs under $OUT.
#   bash scripts/gpu_session.sh [STEP ...]    steps: tests engine profile kernels floor checks jax jax1 jax2 stash embedded head jaxhead serve flashinfer
#   (default: tests engine profile kernels jax checks).
#   Issue #37's table (benchmarks/jax_vs_torch_gpu.py) does not fit one call: two calls, `bash scripts/gpu_session.sh jax1`
#   (SmolLM2-135M and TinyLlama-1.1B, $OUT/jax1/) then `jax2` (Llama-3-8B alone, $OUT/jax2/); docs/jax.md has the estimate
#   per part. `jax` runs JAX_SHAPES (default all three) in one call: every shape's batch-1 figures, not the large shapes' batch 64.
#   All three keep XLA's autotuning in JAX_AUTOTUNE_CACHE (/tmp/fs_autotune): a later call on the warm machine reuses it.
#   flashinfer: carry .flashinfer/lib (bash scripts/flashinfer_build.sh builds it here, no GPU)
#   The embedded model's GGUF (98 MB) is more than one call carries (64 MiB with the tree): `stash` keeps
#   .carry_a/gguf.part_* in /tmp/fs on the device, once per call (back to back, while the machine is warm)
#   until the last part; the call after them carries .carry_b/ (the last part, gguf.sha256, the wheels the
#   device lacks) and its `embedded`, `head`, `jaxhead` or `serve` step reassembles the file, checks its hash, installs
#   the wheels and runs engine_gpu_embedded.py, train_head_gpu.py (about 6 min on an H100; $OUT/head/) or serve_gpu.py.
#   Parts: split -n 3 -d -a 1 --additional-suffix= $GGUF gguf.part_ (gguf.part_0 and _1 stashed, _2 in .carry_b).
# Runs from a source tree without installing (the device has torch/triton/jax but no network):
# `flashspec` is the tree's shared/flashspec/ folder: shared/ goes on PYTHONPATH.
# TREE=path runs another checkout's code (e.g. a branch exported with git archive).
set -uo pipefail
TREE=${TREE:-$PWD}
OUT=${OUT:-$TREE/benchmarks/results}
mkdir -p "$OUT"
export PYTHONPATH=$TREE/shared:$TREE:$TREE/benchmarks TRITON_INTERPRET=0 OUT
cd "$TREE"
steps=${*:-tests engine profile kernels jax checks}
gguf_ready() {  # the stashed parts + .carry_b's last part -> /tmp/fs/model.gguf, hash checked; wheels on PYTHONPATH
  cat /tmp/fs/gguf.part_* .carry_b/gguf.part_* > /tmp/fs/model.gguf \
    && echo "$(cat .carry_b/gguf.sha256)  /tmp/fs/model.gguf" | sha256sum -c \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 .carry_b/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site2
}
jax_table() {  # SHAPES BUDGET_S TIMEOUT_S SUBDIR: benchmarks/jax_vs_torch_gpu.py, its JSON and log under $OUT/SUBDIR
  mkdir -p "$OUT/$4" && timeout "$3" python3 benchmarks/jax_vs_torch_gpu.py --shapes "$1" --budget-s "$2" --out "$OUT/$4" \
    --autotune-cache "${JAX_AUTOTUNE_CACHE:-/tmp/fs_autotune}" \
    > "$OUT/$4/jax_vs_torch.log" 2>&1; tail -"${JAX_TAIL:-12}" "$OUT/$4/jax_vs_torch.log"
}
for step in $steps; do
  echo "== $step $(date +%T)"
  case $step in
    tests) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/torch/test_backend_graphs.py tests/torch/test_torch_verify_cuda_graph.py \
             tests/torch/test_warm_up.py tests/torch/test_nf4_gpu.py ${EXTRA_TESTS:-} > "$OUT/tests.log" 2>&1; tail -15 "$OUT/tests.log" ;;
    engine) timeout ${ENGINE_TIMEOUT:-300} python3 benchmarks/engine_gpu.py --tokens 128 ${ENGINE_ARGS:-} > "$OUT/engine_gpu.log" 2>&1; tail -5 "$OUT/engine_gpu.log" ;;
    profile) timeout 120 python3 benchmarks/engine_profile.py --shape tinyllama-1.1b > "$OUT/profile.log" 2>&1; tail -2 "$OUT/profile.log" ;;
    kernels) timeout ${KERNELS_TIMEOUT:-420} python3 benchmarks/verify_kernels.py --out "$OUT" --no-jax --drafts logprobs ${KERNELS_ARGS:-} \
             > "$OUT/verify_kernels.log" 2>&1; tail -${KERNELS_TAIL:-8} "$OUT/verify_kernels.log" ;;
    floor) timeout ${FLOOR_TIMEOUT:-200} python3 benchmarks/verify_floor.py ${FLOOR_ARGS:-} > "$OUT/verify_floor.log" 2>&1; tail -14 "$OUT/verify_floor.log" ;;
    jax) jax_table "${JAX_SHAPES:-smollm2-135m,tinyllama-1.1b,llama3-8b}" "${JAX_BUDGET:-530}" "${JAX_TIMEOUT:-560}" . ;;
    jax1) jax_table smollm2-135m,tinyllama-1.1b "${JAX_BUDGET:-400}" "${JAX_TIMEOUT:-430}" jax1 ;;
    jax2) jax_table llama3-8b "${JAX_BUDGET:-530}" "${JAX_TIMEOUT:-560}" jax2 ;;
    checks) for b in ${CHECK_BACKENDS:-torch jax}; do timeout 240 python3 benchmarks/gpu_checks.py --backend $b > "$OUT/gpu_checks_$b.log" 2>&1; tail -3 "$OUT/gpu_checks_$b.log"; done ;;
    flashinfer) timeout ${FLASHINFER_TIMEOUT:-500} python3 benchmarks/verify_kernels_flashinfer.py --out "$OUT" ${FLASHINFER_ARGS:-} \
             > "$OUT/verify_kernels_flashinfer.log" 2>&1; tail -${FLASHINFER_TAIL:-45} "$OUT/verify_kernels_flashinfer.log" ;;
    stash) mkdir -p /tmp/fs && cp .carry_a/gguf.part_* /tmp/fs/ && ls -la /tmp/fs ;;
    embedded) gguf_ready && FLASHSPEC_CACHE=/tmp/fscache timeout ${EMBEDDED_TIMEOUT:-420} \
              python3 benchmarks/engine_gpu_embedded.py --gguf /tmp/fs/model.gguf ${EMBEDDED_ARGS:-} > "$OUT/engine_gpu_embedded.log" 2>&1; \
           tail -14 "$OUT/engine_gpu_embedded.log" ;;
    head) gguf_ready && FLASHSPEC_CACHE=/tmp/fscache timeout ${HEAD_TIMEOUT:-530} \
              python3 benchmarks/train_head_gpu.py --gguf /tmp/fs/model.gguf --out "$OUT/head" ${HEAD_ARGS:-} > "$OUT/train_head_gpu.log" 2>&1; \
           tail -8 "$OUT/train_head_gpu.log" ;;
    jaxhead) gguf_ready && FLASHSPEC_CACHE=/tmp/fscache timeout ${JAXHEAD_TIMEOUT:-340} \
              python3 benchmarks/head_bench_jax.py --target /tmp/fs/model.gguf --out "$OUT/head_bench_jax.json" \
              ${JAXHEAD_ARGS:---prompts 2 --new-tokens 96} > "$OUT/head_bench_jax.log" 2>&1; tail -10 "$OUT/head_bench_jax.log" ;;
    serve) gguf_ready && FLASHSPEC_CACHE=/tmp/fscache timeout ${SERVE_TIMEOUT:-520} \
              python3 benchmarks/serve_gpu.py --gguf /tmp/fs/model.gguf --out "$OUT/serve_gpu" ${SERVE_ARGS:-} > "$OUT/serve_gpu.log" 2>&1; \
           tail -25 "$OUT/serve_gpu.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
