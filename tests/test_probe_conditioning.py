"""Conditioning of the Theorem 4.1 probe matrices (the numbers chapter 02 cites)."""

import numpy as np
import pytest

from companion.attention import random_single_head
from companion.exact import probe_matrix


def kappa_formula(k):
    return 0.5 * (k + 2 + np.sqrt(k * (k + 4)))


@pytest.mark.parametrize("d", [8, 32, 128])
def test_basis_probes_are_identity_plus_nilpotent_and_kappa_follows_the_swaps(d):
    v = random_single_head(d, seed=0).v
    Z = probe_matrix(v, "basis")
    N = Z - np.eye(d)
    p = int(np.argmax(np.abs(v)))
    swapped = np.flatnonzero(np.abs(v) < 0.5 * np.abs(v[p]))
    np.testing.assert_array_equal(np.flatnonzero(np.any(N != 0, axis=1)), swapped)
    np.testing.assert_array_equal(N @ N, 0.0)
    np.testing.assert_array_equal(np.linalg.inv(Z), np.eye(d) - N)     # solved entry by entry
    k = swapped.size
    assert np.linalg.cond(Z) == pytest.approx(kappa_formula(k), rel=1e-10)
    assert np.linalg.cond(Z, 1) == pytest.approx((k + 1) ** 2, rel=1e-12)


def test_the_numbers_chapter_02_cites_at_d_128():
    v = random_single_head(128, seed=0).v
    Z = probe_matrix(v, "basis")
    assert int(np.count_nonzero(np.any(Z != np.eye(128), axis=1))) == 110
    assert np.linalg.cond(Z) == pytest.approx(112.0, abs=0.05)
    G = probe_matrix(v, "gaussian", seed=0)
    assert np.linalg.cond(G) == pytest.approx(199.1, abs=0.05)
