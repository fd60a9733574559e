#!/usr/bin/env bash
# One device-tool call's GPU work: checks first, then timings; JSON and logs under $OUT.
#   bash scripts/gpu_session.sh [STEP ...]    steps: bnb tests engine profile verify jax checks soak nf4 gemv
#   kernels floor slots ahead lazy tune ncu groups sweepsplit tickets jaxproc samejax samegrid reverse pallas_split single stash embedded flashinfer
#   flashinfer: carry .flashinfer/lib (bash scripts/flashinfer_build.sh builds it here, no GPU)
#   (default: tests engine profile verify jax checks). DEADLINE=seconds (bash's SECONDS) stops samegrid's loop in time. bnb installs carried wheels (.whl/, see README)
#   into /tmp/site first: the device has no bitsandbytes.
#   The embedded model's GGUF (98 MB) is more than one call carries (64 MiB): `stash` keeps
#   .carry_a/gguf.part_a in /tmp/fs on the device; the next call (back to back, while the machine
#   is warm) carries .carry_b/ (gguf.part_b, gguf.sha256, the gguf and accelerate wheels) and its
#   `embedded` step reassembles the file, checks its hash and runs engine_gpu_embedded.py.
# Runs from a source tree without installing (the device has torch/triton/jax but no network):
# `flashspec` is the tree's shared/flashspec/ folder: shared/ goes on PYTHONPATH.
# TREE=path runs another checkout's code (e.g. a branch exported with git archive).
set -uo pipefail
TREE=${TREE:-$PWD}
OUT=${OUT:-$TREE/benchmarks/results}
mkdir -p "$OUT"
export PYTHONPATH=$TREE/shared:$TREE:$TREE/benchmarks TRITON_INTERPRET=0 OUT
cd "$TREE"
steps=${*:-tests engine profile verify jax checks}
for step in $steps; do
  echo "== $step $(date +%T)"
  case $step in
    bnb) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
           && export PYTHONPATH=$PYTHONPATH:/tmp/site && python3 -c "import bitsandbytes as b; print('bitsandbytes', b.__version__)" ;;
    tests) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/torch/test_backend_graphs.py tests/torch/test_torch_verify_cuda_graph.py \
             tests/torch/test_warm_up.py tests/torch/test_nf4_gpu.py ${EXTRA_TESTS:-} > "$OUT/tests.log" 2>&1; tail -15 "$OUT/tests.log" ;;
    soak) for v in ${SOAK_VARIANTS:-warm lazy}; do a=; [ "$v" = lazy ] && a=--no-warm-up; timeout 200 python3 benchmarks/memory_soak.py --random --device cuda --out "$OUT" $a > "$OUT/memory_soak_$v.log" 2>&1; tail -6 "$OUT/memory_soak_$v.log"; done ;;
    nf4) timeout 300 python3 benchmarks/nf4_gpu.py --shapes ${NF4_SHAPES:-smollm2-135m,tinyllama-1.1b} > "$OUT/nf4_gpu.log" 2>&1; tail -4 "$OUT/nf4_gpu.log" ;;
    gemv) timeout ${GEMV_TIMEOUT:-330} python3 benchmarks/gemv_sweep.py --out "$OUT/gemv_sweep.json" > "$OUT/gemv_sweep.log" 2>&1; tail -40 "$OUT/gemv_sweep.log" ;;
    engine) timeout ${ENGINE_TIMEOUT:-300} python3 benchmarks/engine_gpu.py --tokens 128 ${ENGINE_ARGS:-} > "$OUT/engine_gpu.log" 2>&1; tail -5 "$OUT/engine_gpu.log" ;;
    profile) timeout 120 python3 benchmarks/engine_profile.py --shape tinyllama-1.1b > "$OUT/profile.log" 2>&1; tail -2 "$OUT/profile.log" ;;
    pallas_split) timeout ${PALLAS_SPLIT_TIMEOUT:-200} python3 benchmarks/verify_pallas_split.py --out "$OUT" > "$OUT/verify_pallas_split.log" 2>&1; tail -6 "$OUT/verify_pallas_split.log" ;;
    slots) timeout ${SLOTS_TIMEOUT:-300} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 0.7 --budget-s 220 \
             --variants lanes,lanes-tile-vote,lanes-slots8,pdl-s8-w1-slots8,pdl-s4-w1-slots8,pdl-s16-w1-slots8,pdl-s8-w1-slots4 \
             --split lanes,lanes-tile-vote --batch 256,128,32 > "$OUT/verify_slots.log" 2>&1; tail -8 "$OUT/verify_slots.log" ;;
    groups) timeout ${GROUPS_TIMEOUT:-480} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s 420 \
             --variants lanes,bg4,bg8,bg16,bg32,bg64,bg128,bg4-own,bg8-own,bg16-own,bg32-own,bg64-own,bg128-own --split none \
             --batch ${GROUPS_BATCH:-256,128,32} --gamma ${GROUPS_GAMMA:-1,4,8} > "$OUT/verify_groups.log" 2>&1; tail -${GROUPS_TAIL:-60} "$OUT/verify_groups.log" ;;
    sweepsplit) timeout ${SPLIT_TIMEOUT:-300} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s 240 \
             --variants lanes,pdl-s1-w1,pdl-s2-w1,pdl-s2-w2,pdl-s4-w1,pdl-s4-w2,pdl-s8-w1 --split none \
             --batch ${SPLIT_BATCH:-256,128} --gamma ${SPLIT_GAMMA:-1,4,8} --vocab ${SPLIT_VOCAB:-32000} > "$OUT/verify_sweepsplit.log" 2>&1; \
           tail -${SPLIT_TAIL:-50} "$OUT/verify_sweepsplit.log" ;;
    reverse) timeout ${REVERSE_TIMEOUT:-400} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s 330 \
             --variants lanes,lanes-reverse,lanes-again --split none --batch ${REVERSE_BATCH:-256,128,32} --gamma ${REVERSE_GAMMA:-1,4,8} \
             > "$OUT/verify_reverse.log" 2>&1; tail -${REVERSE_TAIL:-80} "$OUT/verify_reverse.log" ;;
    tickets) timeout ${TICKETS_TIMEOUT:-480} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s ${TICKETS_BUDGET:-380} \
             --variants ${TICKETS_VARIANTS:-lanes,tickets-w1-p16,tickets-w1-p21,tickets-w1-p12,tickets-w2-p8,tickets-w2-p10,tickets-w1-p16-la2,tickets-w1-p16-la-half,lanes-again} \
             --split none --batch ${TICKETS_BATCH:-256,128,32} --gamma ${TICKETS_GAMMA:-1,4,8} > "$OUT/verify_tickets.log" 2>&1; tail -${TICKETS_TAIL:-90} "$OUT/verify_tickets.log" ;;
    lazy) timeout ${LAZY_TIMEOUT:-500} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s ${LAZY_BUDGET:-420} \
             --variants ${LAZY_VARIANTS:-lanes,lanes-lazy,lanes-lazy-slots8,lanes-again} --split ${LAZY_SPLIT:-none} \
             --batch ${LAZY_BATCH:-256,128,32} --gamma ${LAZY_GAMMA:-1,4,8} > "$OUT/verify_lazy.log" 2>&1; tail -${LAZY_TAIL:-80} "$OUT/verify_lazy.log" ;;
    tune) timeout ${TUNE_TIMEOUT:-560} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 1.0 --budget-s ${TUNE_BUDGET:-470} \
             --shapes ${TUNE_SHAPES:-128:1:128256:float32,128:4:128256:bfloat16,32:4:128256:float32,128:4:32000:float32,256:1:32000:float32,256:1:128256:bfloat16,256:4:32000:bfloat16,32:8:128256:bfloat16,128:1:128256:bfloat16,128:8:32000:bfloat16} \
             --variants ${TUNE_VARIANTS:-lanes,lanes-pipe2,pdl-s4-w1,pdl-s8-w1,pdl-s16-w1,pdl-s8-w2,lanes-c2,lanes-double-chunks,lanes-slots8,lanes-no-pairs,lanes-again} \
             --split ${TUNE_SPLIT:-none} > "$OUT/verify_tune.log" 2>&1; grep "^B=" "$OUT/verify_tune.log"; tail -${TUNE_TAIL:-2} "$OUT/verify_tune.log" ;;
    ncu) n=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); echo "ncu: $n"
         for s in ${NCU_SHAPES:-256:1:128256:bfloat16 256:4:32000:bfloat16 256:4:128256:bfloat16 128:4:128256:bfloat16}; do
           IFS=: read -r b g v d <<< "$s"
           timeout ${NCU_TIMEOUT:-150} "$n" --clock-control none --kernel-name regex:verify_ --launch-skip 6 --launch-count 2 \
             --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
             --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
             --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio \
             python3 benchmarks/verify_ncu.py --batch $b --gamma $g --vocab $v --dtype $d --variant ${NCU_VARIANT:-lanes} \
             > "$OUT/ncu_${NCU_VARIANT:-lanes}_${b}_${g}_${v}_${d}.txt" 2>&1
           grep -E "verify_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|dram__bytes_read|Block Limit|Stall|Executed Ipc A" "$OUT/ncu_${NCU_VARIANT:-lanes}_${b}_${g}_${v}_${d}.txt" | head -${NCU_TAIL:-60}
         done ;;
    kernels) timeout ${KERNELS_TIMEOUT:-420} python3 benchmarks/verify_kernels.py --out "$OUT" --no-jax --drafts logprobs ${KERNELS_ARGS:-} \
             > "$OUT/verify_kernels.log" 2>&1; tail -${KERNELS_TAIL:-8} "$OUT/verify_kernels.log" ;;
    ahead) timeout ${AHEAD_TIMEOUT:-330} python3 benchmarks/verify_variants.py --out "$OUT" --no-jax --temperatures 0.7 --budget-s 260 \
             --variants lanes,lanes-ahead2,lanes-ahead3,lanes-ahead2-slots8 --split lanes,lanes-ahead2,lanes-ahead3 \
             --batch ${AHEAD_BATCH:-256,128} --gamma ${AHEAD_GAMMA:-1,4,8} > "$OUT/verify_ahead.log" 2>&1; tail -8 "$OUT/verify_ahead.log" ;;
    single) timeout 150 python3 benchmarks/single_smoke.py > "$OUT/single_smoke.log" 2>&1; tail -6 "$OUT/single_smoke.log"
            timeout 250 python3 benchmarks/jax_loop_floor.py --out "$OUT" > "$OUT/jax_loop_floor.log" 2>&1; tail -30 "$OUT/jax_loop_floor.log" ;;
    jaxproc) o="--only verify-two,read,pallas-2 --shapes ${JAXPROC_SHAPES:-1:128256,32:32000,32:128256,256:128256} --out $OUT"
             # the Pallas step in a process of its own, with and without XLA's preallocation, and after torch's work
             (timeout 150 python3 benchmarks/jax_loop_floor.py $o --tag _own_prealloc
              XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 benchmarks/jax_loop_floor.py $o --tag _own_no_prealloc
              XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 benchmarks/jax_loop_floor.py $o --torch-first --tag _torch_no_prealloc
              XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 timeout 150 python3 benchmarks/jax_loop_floor.py $o --torch-first --tag _torch_prealloc50
             ) > "$OUT/jax_process.log" 2>&1; grep -v "^W\|^I" "$OUT/jax_process.log" | tail -${JAXPROC_TAIL:-40} ;;
    samejax) for r in 1 2; do timeout 200 python3 benchmarks/jax_loop_floor.py --triton --only verify-two --tag _same_process_$r --out "$OUT" \
               --shapes ${SAMEJAX_SHAPES:-1:128256,1:32000,8:128256,32:32000,32:128256,128:128256,256:128256}; done > "$OUT/jax_same_process.log" 2>&1
             grep "us/step\|wrote\|Error" "$OUT/jax_same_process.log" | tail -40 ;;
    samegrid) for d in ${SAMEGRID_DTYPES:-bfloat16 float32}; do for g in ${SAMEGRID_GAMMA:-1 4 8}; do
               left=$(( ${DEADLINE:-100000} - SECONDS )); [ $left -lt 40 ] && { echo "samegrid: deadline, stopped before $d G=$g"; break 2; }
               timeout $(( left < 150 ? left : 150 )) python3 benchmarks/jax_loop_floor.py --triton --only ${SAMEGRID_ONLY:-verify-two} --dtype $d --gamma $g --temperature ${SAMEGRID_T:-1.0} \
                 --tag _same_process_${d}_g$g --out "$OUT" --shapes ${SAMEGRID_SHAPES:-32:32000,32:128256,128:32000,128:128256,256:32000,256:128256}
             done; done > "$OUT/jax_same_grid.log" 2>&1; grep "us/step\|wrote\|Error" "$OUT/jax_same_grid.log" | tail -90 ;;
    floor) timeout ${FLOOR_TIMEOUT:-200} python3 benchmarks/verify_floor.py ${FLOOR_ARGS:-} > "$OUT/verify_floor.log" 2>&1; tail -14 "$OUT/verify_floor.log" ;;
    verify) timeout ${VERIFY_TIMEOUT:-330} python3 benchmarks/verify_variants.py --out "$OUT" ${VERIFY_ARGS:-} > "$OUT/verify_variants.log" 2>&1; tail -${VERIFY_TAIL:-40} "$OUT/verify_variants.log" ;;
    jax) timeout ${JAX_TIMEOUT:-400} python3 benchmarks/engine_gpu_jax.py --shapes ${JAX_SHAPES:-smollm2-135m,tinyllama-1.1b,llama3-8b} --out "$OUT" > "$OUT/engine_gpu_jax.log" 2>&1; tail -12 "$OUT/engine_gpu_jax.log" ;;
    checks) for b in ${CHECK_BACKENDS:-torch jax}; do timeout 240 python3 benchmarks/gpu_checks.py --backend $b > "$OUT/gpu_checks_$b.log" 2>&1; tail -3 "$OUT/gpu_checks_$b.log"; done ;;
    flashinfer) timeout ${FLASHINFER_TIMEOUT:-500} python3 benchmarks/verify_kernels_flashinfer.py --out "$OUT" ${FLASHINFER_ARGS:-} \
             > "$OUT/verify_kernels_flashinfer.log" 2>&1; tail -${FLASHINFER_TAIL:-45} "$OUT/verify_kernels_flashinfer.log" ;;
    stash) mkdir -p /tmp/fs && cp .carry_a/* /tmp/fs/ && ls -la /tmp/fs ;;
    embedded) cat /tmp/fs/gguf.part_a .carry_b/gguf.part_b > /tmp/fs/model.gguf \
           && echo "$(cat .carry_b/gguf.sha256)  /tmp/fs/model.gguf" | sha256sum -c \
           && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 .carry_b/*.whl \
           && PYTHONPATH=$PYTHONPATH:/tmp/site2 FLASHSPEC_CACHE=/tmp/fscache timeout ${EMBEDDED_TIMEOUT:-420} \
              python3 benchmarks/engine_gpu_embedded.py --gguf /tmp/fs/model.gguf ${EMBEDDED_ARGS:-} > "$OUT/engine_gpu_embedded.log" 2>&1; \
           tail -14 "$OUT/engine_gpu_embedded.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
