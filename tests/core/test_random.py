import numpy as np
import pytest

from flashspec import random as rng


@pytest.mark.parametrize("coords,expected", rng.TEST_VECTORS)
def test_test_vectors(coords, expected):
    assert int(rng.bits(*coords)) == expected


def test_docstring_table_matches_vectors():
    for coords, expected in rng.TEST_VECTORS:
        assert f"0x{expected:08X}" in rng.__doc__


def test_uniform_is_open_interval_and_exact():
    b = np.array([0, 1, 511, 512, 0xFFFFFFFF, 0xFFFFFE00], dtype=np.uint32)
    u = rng.to_uniform(b)
    assert u.dtype == np.float32
    assert u.min() == np.float32(2.0**-24) and u.max() == np.float32(1 - 2.0**-24)
    m = (b >> 9).astype(np.float64)
    np.testing.assert_array_equal(u.astype(np.float64), (2 * m + 1) * 2.0**-24)


def test_streams_and_coordinates_give_independent_numbers():
    v = np.arange(20000)
    a = rng.uniform(1, 2, 3, 4, v, rng.ACCEPT)
    f = rng.uniform(1, 2, 3, 4, v, rng.FINAL)
    d = rng.uniform(1, 2, 3, 4, v, rng.DRAFT)
    ta = rng.uniform(1, 2, 3, 4, v, rng.TREE_ACCEPT)
    tf = rng.uniform(1, 2, 3, 4, v, rng.TREE_FINAL)
    assert len({rng.ACCEPT, rng.FINAL, rng.DRAFT, rng.TREE_ACCEPT, rng.TREE_FINAL}) == 5
    for x, y in ((a, f), (a, d), (f, d), (ta, a), (ta, f), (ta, d), (tf, a), (tf, f), (tf, d), (ta, tf)):
        assert abs(np.corrcoef(x, y)[0, 1]) < 0.03
        assert not np.any(x == y) or np.mean(x == y) < 1e-3


def test_uniformity_chi_square():
    u = rng.uniform(7, 0, np.arange(200)[:, None], 0, np.arange(500)[None], rng.FINAL).ravel()
    counts = np.histogram(u, bins=50, range=(0, 1))[0]
    expected = u.size / 50
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 100  # chi-square(49) exceeds 100 with probability ~2e-5


def test_seed_high_bits_matter():
    assert rng.bits(5, 0, 0, 0, 0, 0) != rng.bits(5 + 2**32, 0, 0, 0, 0, 0)
