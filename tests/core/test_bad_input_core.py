"""Named cases the fuzzing found or the issue lists, for the NumPy-only entry points."""

import numpy as np
import pytest

from flashspec.config import SamplingConfig
from flashspec.reference import verify
from flashspec.simulate import Environment

Z, X = np.zeros((2, 3, 5), np.float32), np.zeros((2, 2), np.int64)


@pytest.mark.parametrize("kwargs,needle", [
    ({"seed": 1.5}, "seed=1.5 must be an int in [0, 18446744073709551615] or an integer array of shape [] or [B]"),
    ({"offset": "3"}, "offset='3' must be an int"),
    ({"seed": np.float64(2.0)}, "seed has dtype float64; expected an integer dtype"),
    ({"temperature": 1e-30}, "temperature=1e-30 must be 0 (greedy) or >= 1e-06"),
    ({"temperature": 10**400}, "must be a finite number >= 0"),
    ({"temperature": 3.402823466385289e38}, "must be at most 3.4028234663852886e+38"),  # found by the torch fuzz test
    ({"temperature": None}, "temperature=None"),
])
def test_verify_scalars_name_the_argument(kwargs, needle):
    with pytest.raises(ValueError) as info:
        verify(Z, X, **kwargs)
    assert needle in str(info.value)


def test_tiny_temperatures_would_overflow_and_are_refused():
    """Why the floor: z / T overflows float32 and the oracle's softmax turns NaN."""
    z = np.full((1, 4), 50.0, np.float32) * np.float32(1 / 1e-37)
    assert not np.isfinite(z).all()
    SamplingConfig(temperature=1e-6)  # the floor itself is fine
    with pytest.raises(ValueError, match="overflow"):
        SamplingConfig(temperature=1e-7)
    SamplingConfig(temperature=float(np.finfo(np.float32).max))  # the largest float32 is fine too


def test_logits_index_is_printed_as_plain_ints():
    with pytest.raises(ValueError, match=r"target_logits\[1, 2, 3\] is nan"):
        verify(np.where(np.arange(30).reshape(2, 3, 5) == 28, np.nan, Z), X)


def test_simulator_gamma_is_bounded():
    with pytest.raises(ValueError, match=r"gamma=65 must be an integer in \[1, 64\]"):
        Environment((0.5, 0.6), reward="acceptance", gamma=65)
