import os

# The Triton interpreter must be chosen before any @triton.jit is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one thread per worker process, not two each
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
