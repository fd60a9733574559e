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


def skip_nested_language_patches() -> None:
    """Triton 3.6's interpreter patches ``triton.language`` again at every call of a nested ``@triton.jit``
    function (``InterpretedFunction.__call__`` -> ``_patch_lang``, an ``inspect.getmembers`` of the whole
    language each time), inside a launch that has patched it already and restores it when it ends: about a
    third of an interpreted verify's time. Here a nested call whose modules the launch has patched skips that
    redundant work; a launch patches and restores exactly as before, so every kernel computes the same."""
    import inspect

    from triton.runtime import interpreter

    import triton.language as tl

    if getattr(interpreter, "_flashspec_patched", False):
        return
    patch_lang, restore = interpreter._patch_lang, interpreter._LangPatchScope.restore
    patched: set[int] = set()  # ids of the language modules the running launch has patched

    def patch_once(fn):
        langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if langs and langs <= patched:
            return interpreter._LangPatchScope()
        scope = patch_lang(fn)
        patched.update(langs)
        return scope

    def restore_all(self):
        restore(self)
        patched.clear()

    interpreter._patch_lang = patch_once
    interpreter._LangPatchScope.restore = restore_all
    interpreter._flashspec_patched = True


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            skip_nested_language_patches()
        except ImportError:  # no triton: the torch extra is not installed
            pass
