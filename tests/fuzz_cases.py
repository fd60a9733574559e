"""Hypothesis strategies for fuzzing the public API: verify arguments of every kind, good and bad.

Arrays are NumPy; the torch and JAX tests convert them. ``check_result`` states what a successful
verify must return, so a fuzzed call either raises a documented error or returns a valid result.
"""

import numpy as np
from hypothesis import strategies as st

FLOATS = ["float16", "float32", "float64"]
ODD_DTYPES = ["int32", "bool", "complex64"]
DOCUMENTED = (ValueError, TypeError)

# any Python value a user might pass for a scalar setting
junk = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers(), st.floats(),
                 st.lists(st.integers(0, 3), max_size=2))
# the same for sizes (arms, batch, rounds, seeds), without huge ints: a valid size of 10**12 is a
# resource request, not malformed input, and would allocate until the machine kills the test
junk_size = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers(-10, 40), st.floats(),
                      st.lists(st.integers(0, 3), max_size=2))


@st.composite
def arrays(draw, shape, dtype, low=-8.0, high=8.0, bad=True):
    """An array of ``shape``; floats sometimes hold NaN / +-inf / huge values."""
    size = int(np.prod(shape)) if shape else 1
    if dtype in ("int32", "int64", "bool"):
        flat = np.array(draw(st.lists(st.integers(int(low), int(high)), min_size=size, max_size=size)))
        return flat.reshape(shape).astype(dtype)
    elems = st.floats(low, high, width=32)
    if bad and draw(st.booleans()):
        elems = st.one_of(elems, st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30]))
    flat = np.array(draw(st.lists(elems, min_size=size, max_size=size)), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return flat.reshape(shape).astype(dtype)


def rarely(draw) -> bool:
    """True about one time in eight: one knob at a time goes wrong, so most cases still run."""
    return draw(st.integers(0, 7)) == 0


def near(draw, n: int, lo: int = 0) -> int:
    """Usually n, rarely a neighbour (a wrong shape)."""
    return draw(st.integers(max(lo, n - 1), n + 1)) if rarely(draw) else n


@st.composite
def verify_args(draw, max_b=3, max_g=3, max_v=6):
    """(args, kwargs) for verify: mostly well-formed, often with one thing wrong."""
    lo = 0 if rarely(draw) else 1
    b, g, v = draw(st.integers(lo, max_b)), draw(st.integers(lo, max_g)), draw(st.integers(lo, max_v))
    z_shape = draw(st.sampled_from([(b, v), (b, g + 1, v, 1)])) if rarely(draw) else (b, g + 1, v)
    z_dtype = draw(st.sampled_from(ODD_DTYPES)) if rarely(draw) else draw(st.sampled_from(FLOATS))
    z = draw(arrays(z_shape, z_dtype if z_dtype != "bool" else "float32", bad=rarely(draw)))
    if z_dtype == "complex64":
        z = z.astype(np.complex64)
    x = draw(arrays((near(draw, b), near(draw, g)), "int64", low=-1 if rarely(draw) else 0, high=max(v - 1, 0)))
    x = x.astype(draw(st.sampled_from(["float32", "bool"])) if rarely(draw) else draw(st.sampled_from(["int64", "int32"])))
    kwargs = {}
    if draw(st.booleans()):
        kwargs["draft_logits"] = draw(arrays((b, g, near(draw, v)), draw(st.sampled_from(FLOATS)), bad=rarely(draw)))
    if ("draft_logits" in kwargs or rarely(draw)) and draw(st.booleans()):
        kwargs["draft_logprobs"] = draw(arrays((b, g), "float32", low=-6.0, high=0.5 if rarely(draw) else 0.0, bad=False))
    good = {
        "temperature": st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(1e-3, 5),
        "top_k": st.integers(0, v + 1),
        "top_p": st.sampled_from([1.0, 0.9, 0.5]) | st.floats(0.05, 1.0),
        "seed": st.integers(0, 2**64 - 1) | st.builds(lambda s: np.array(s, np.int64),
                                                      st.lists(st.integers(0, 9), min_size=b, max_size=b)),
        "offset": st.integers(0, 2**32),
    }
    bad = {
        "temperature": st.floats(-1, 1e-7) | junk,
        "top_k": st.integers(-3, -1) | junk,
        "top_p": st.floats(-0.5, 0.0) | st.floats(1.0, 2.0, exclude_min=True) | junk,
        "seed": st.integers(-5, -1) | st.integers(2**64, 2**65) | junk,
        "offset": st.integers(-3, -1) | junk,
    }
    for name in good:
        if draw(st.booleans()):
            kwargs[name] = draw(bad[name] if rarely(draw) else good[name])
    return (z, x), kwargs


def check_result(res, z, x) -> None:
    """What a successful verify returns: n in [0, G], n+1 tokens in [0, V), then -1."""
    n, tokens = np.asarray(res.num_accepted), np.asarray(res.tokens)
    b, g1, v = z.shape
    assert n.shape == (b,) and tokens.shape == (b, g1)
    assert ((0 <= n) & (n <= g1 - 1)).all()
    for row in range(b):
        k = int(n[row])
        assert ((0 <= tokens[row, : k + 1]) & (tokens[row, : k + 1] < v)).all()
        assert (tokens[row, k + 1 :] == -1).all()
        assert (tokens[row, :k] == np.asarray(x)[row, :k]).all()  # accepted drafts are emitted as drafted
