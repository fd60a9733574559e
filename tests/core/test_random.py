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
    for x, y in ((a, f), (a, d), (f, d)):
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


def test_top_down_gumbels_have_the_gumbel_law_and_their_block_maximum_first():
    """gumbel_top_down: standard Gumbel marginals (KS at 1%), the block's maximum -ln(E_t / 64) at entry
    bits & 63 of its FINAL_BLOCKS draw, and the same numbers for the same coordinates."""
    v = np.arange(64 * 3000)
    g = rng.gumbel_top_down(7, 3, 1, 2, v)
    assert g.dtype == np.float32
    x = np.sort(g.astype(np.float64))
    cdf = np.exp(-np.exp(-x))
    ks = max(np.max(np.arange(1, x.size + 1) / x.size - cdf), np.max(cdf - np.arange(x.size) / x.size))
    assert ks < 1.63 / np.sqrt(x.size)
    b = rng.bits(7, 3, 1, 2, np.arange(3000), rng.FINAL_BLOCKS)
    top = -np.log(-np.log(rng.to_uniform(b)) * np.float32(1 / 64))
    blocks = g.reshape(-1, 64)
    np.testing.assert_array_equal(blocks.max(axis=1), top)
    np.testing.assert_array_equal(blocks.argmax(axis=1), b & 63)
    np.testing.assert_array_equal(rng.gumbel_top_down(7, 3, 1, 2, v[100:200]), g[100:200])  # a pure function
    # a partial last block: its entries are those of the whole block (past-the-end entries are drawn, unused)
    np.testing.assert_array_equal(rng.gumbel_top_down(7, 3, 1, 2, np.arange(100)), g[:100])


def test_top_down_gumbels_without_their_maximum_fail_the_law():
    """The check above can fail: the block's maximum left out (E'_{I_t} = E_j) puts the law below Gumbel's."""
    v = np.arange(64 * 3000)
    b = rng.bits(7, 3, 1, 2, v >> 6, rng.FINAL_BLOCKS)
    c = -np.log(rng.to_uniform(b)) * np.float32(1 / 64)
    g = -np.log(c - np.log(rng.uniform(7, 3, 1, 2, v, rng.FINAL)))
    x = np.sort(g.astype(np.float64))
    cdf = np.exp(-np.exp(-x))
    assert np.max(np.arange(1, x.size + 1) / x.size - cdf) > 1.63 / np.sqrt(x.size)
