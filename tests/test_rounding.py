"""companion.numerics.rounding: Higham's gamma_n and the rounding bound of a head's output."""

import numpy as np
import pytest

from companion.attention import SingleHead, random_single_head
from companion.numerics.rounding import answer_rounding_units, gamma, head_output_error, unit_roundoff


def test_gamma_is_n_u_over_1_minus_n_u_and_refuses_n_u_of_1():
    u = unit_roundoff()
    assert u == 2.0**-53
    assert gamma(0) == 0.0
    assert gamma(3) == 3 * u / (1 - 3 * u)
    assert gamma(1, u=0.25) == pytest.approx(1 / 3)
    assert gamma(3.999, u=0.25) == pytest.approx(3999.0)  # n u just below 1
    with pytest.raises(ValueError, match="n u < 1"):
        gamma(4, u=0.25)  # n u = 1: just outside
    with pytest.raises(ValueError):
        gamma(-1)


def _reference(X, W, v):
    """f(X) in long double (64-bit significand on x86): a reference 2**11 times finer than float64."""
    X, W, v = (np.asarray(a, dtype=np.longdouble) for a in (X, W, v))
    s = X @ (W @ X[-1])
    a = np.exp(s - s.max())
    return float(np.sum(a * (X @ v)) / np.sum(a))


@pytest.mark.parametrize("seed", range(5))
def test_the_bound_covers_the_float64_error_of_a_head(seed):
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is float64 here: no finer reference")
    rng = np.random.default_rng(seed)
    head = random_single_head(6, seed=seed)
    head = SingleHead(head.W * 30, head.v)  # large scores: the score term dominates
    X = rng.standard_normal((50, 7, 6))
    err = np.abs(head(X) - np.array([_reference(x, head.W, head.v) for x in X]))
    E = head_output_error(X, np.abs(head.W), np.abs(head.v))
    assert np.all(err <= E)
    assert np.all(E < 1e-9)  # and it certifies something: 9 digits at these sizes


def test_the_bound_grows_with_the_terms_and_takes_ragged_lists():
    head = random_single_head(4, seed=0)
    X = [np.ones((2, 4)), np.ones((5, 4))]
    E = head_output_error(X, np.abs(head.W), np.abs(head.v))
    E2 = head_output_error(X, np.abs(head.W), np.abs(head.v), score_terms=20, value_terms=10)
    assert E.shape == (2,) and E[1] > E[0] and np.all(E2 > E)
    with pytest.raises(ValueError, match="W_abs"):
        head_output_error(X, np.ones((3, 3)), np.abs(head.v))
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        head_output_error([np.ones((2, 3))], np.abs(head.W), np.abs(head.v))


def test_answer_rounding_units_bounds_a_perturbed_answers_error():
    """1 u unperturbed; 2k + 2 u with the test mode's k ulps, and it covers the real perturbed error."""
    from companion.oracles import perturb

    assert answer_rounding_units() == 1 and answer_rounding_units(0) == 1
    assert answer_rounding_units(1) == 4 and answer_rounding_units(4) == 10
    assert answer_rounding_units(1000) == 2002  # the test mode's largest k: just inside
    for bad in (1001, -1, 2.0, True):  # just outside, and not an integer
        with pytest.raises(ValueError, match="integer in"):
            answer_rounding_units(bad)
    if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        pytest.skip("long double is float64 here: no finer reference")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3, 4))
    head = random_single_head(4, seed=0)
    exact = np.array([_reference(x, head.W, head.v) for x in X])
    y = perturb(head(X), X, 4)
    rel = np.abs(y - exact) / np.abs(exact)
    E = head_output_error(X, np.abs(head.W), np.abs(head.v)) / np.abs(exact)  # the evaluation's own error
    assert np.all(rel <= E + (answer_rounding_units(4) - 1) * unit_roundoff())
    assert np.max(rel) > 7 * unit_roundoff()  # 4 ulps = 8 u: the perturbation is there
