import os

# The Triton interpreter must be chosen before any @triton.jit is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
