#!/bin/bash
# early call, session 12: invariant tiling tune (#40), adaptive bench (#35), JAX small-shape command buffers (#37)
export PYTHONPATH=$PWD/shared:$PWD:$PWD/benchmarks TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch,triton,jax;print(torch.__version__,triton.__version__,jax.__version__)" >> $OUT/gpu.txt 2>&1
( timeout 190 python benchmarks/invariant_tune_gpu.py --budget-s 150 --jobs 14 --out $OUT/invariant_tune.json > $OUT/tune.log 2>&1 )
echo tune rc=$?
( timeout 170 python benchmarks/adaptive_bench.py --models llama3-8b,smollm2-135m --batches 1,16,64,256 --tokens 48 --out $OUT/adaptive_gpu.json > $OUT/adaptive.log 2>&1 )
echo adaptive rc=$?
mkdir -p $OUT/jd $OUT/jc
( timeout 110 python benchmarks/jax_vs_torch_gpu.py --no-torch --batches "" --shapes smollm2-135m --reps 10 --out $OUT/jd > $OUT/jax.log 2>&1 )
echo jaxdefault rc=$?
( XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL --xla_gpu_graph_min_graph_size=1" timeout 110 python benchmarks/jax_vs_torch_gpu.py --no-torch --batches "" --shapes smollm2-135m --reps 10 --out $OUT/jc >> $OUT/jax.log 2>&1 )
echo jaxcmdbuf rc=$?
tail -3 $OUT/tune.log; tail -12 $OUT/adaptive.log; grep -E "ar_ms|Traceback|Error" $OUT/jax.log | cut -c1-300 | tail
