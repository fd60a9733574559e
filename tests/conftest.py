import os
import tempfile

# The Triton interpreter must be chosen before any @triton.jit is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's compiled executables kept on disk: the engine tests compile the same model steps in many tests and
# both xdist workers (keyed by the program and the versions, so a stale entry is never used).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"flashspec-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one thread per worker process, not two each
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
