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
    uses: dict = {}  # function -> ids of the language modules among its globals

    def patch_once(fn):
        langs = uses.get(fn)
        if langs is None:
            langs = uses[fn] = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
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


def lighten_interpreter_types() -> None:
    """The interpreter builds Triton's frontend types for every operation of every program: a tensor's
    shape as a ``tl.tuple`` whose type formats a name string, a block type that re-validates its shape,
    a fresh dtype table for every NumPy conversion. Here those are made once per distinct shape (types
    hold no state: the same shape gives an equal value) and a tuple type's name is formatted only when
    asked for; about half of an interpreted verify's time. Values and kernels are untouched."""
    import math

    import numpy as np
    from triton.language import core as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_flashspec_types", False):
        return

    def tuple_type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)

    def tuple_type_name(self):
        return "[" + ",".join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + "]"

    def int_shape(shape):  # a block shape as a tuple of ints, or None where it holds anything else
        if type(shape) is tl.tuple:
            shape = shape.values
        if type(shape) not in (list, tuple):
            return None
        out = []
        for s in shape:
            s = s.value if type(s) is tl.constexpr else s
            if type(s) is not int:
                return None
            out.append(s)
        return tuple(out)

    blocks, tensors, block_init = {}, {}, tl.block_type.__init__

    def block_type_init(self, element_ty, shape):
        key = int_shape(shape)
        if key is None or key not in blocks:
            block_init(self, element_ty, shape)  # validates the shape
            if key is not None:
                blocks[key] = (self.shape, self.numel)
            return
        self.element_ty = element_ty
        self.shape, self.numel = blocks[key]
        self.name = f"<{self.shape}, {element_ty}>"

    def tensor_init(self, handle, type):
        self.handle = handle
        shape = type.shape if type.is_block() else ()
        if shape not in tensors:
            tensors[shape] = (tl.constexpr(math.prod(shape)), tl.tuple([tl.constexpr(s) for s in shape]))
        self.numel, self.shape = tensors[shape]
        self.type = type
        self.dtype = type.scalar

    np_types = {tl.int1: bool, tl.float16: np.float16, tl.float32: np.float32, tl.float64: np.float64,
                tl.int8: np.int8, tl.uint8: np.uint8, tl.int16: np.int16, tl.uint16: np.uint16,
                tl.int32: np.int32, tl.uint32: np.uint32, tl.int64: np.int64, tl.uint64: np.uint64,
                tl.bfloat16: np.uint16, tl.float8e5: np.uint8, tl.float8e5b16: np.uint8,  # stored as integers
                tl.float8e4nv: np.uint8, tl.float8e4b8: np.uint8, tl.float8e4b15: np.uint8}
    np_types = {k: np.dtype(v) for k, v in np_types.items()}

    def get_np_dtype(tt_dtype):  # interpreter._get_np_dtype with its table built once
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        return np.dtype(np.uint64) if isinstance(tt_dtype, tl.pointer_type) else np_types[tt_dtype]

    tl.tuple_type.__init__ = tuple_type_init
    tl.tuple_type.name = property(tuple_type_name)
    tl.block_type.__init__ = block_type_init
    tl.tensor.__init__ = tensor_init
    interpreter._get_np_dtype = get_np_dtype
    interpreter._flashspec_types = True


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            skip_nested_language_patches()
            lighten_interpreter_types()
        except ImportError:  # no triton: the torch extra is not installed
            pass
