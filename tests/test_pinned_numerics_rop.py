"""Pinned formulas and thresholds of ``companion.numerics.rop``, recomputed independently.

Each test restates one documented rule (the module's docstrings, §5/§6 of the paper in
``shared/paper/NOTES.md``) with plain numpy and compares; boundaries are built so that equality
holds exactly where the code distinguishes ``<`` from ``<=``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion.numerics import rop


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def _sigma(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_rop_queries_are_c_times_a_plus_b_then_c_times_b_per_row():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    c = np.array([1.0, 0.5, 2.0, 3.0, 0.25])
    X = rop.rop_queries(A, B, c)
    assert X.shape == (5, 2, 3)
    for k in range(5):
        np.testing.assert_allclose(X[k, 0], c[k] * (A[k] + B[k]), rtol=1e-15)
        np.testing.assert_allclose(X[k, 1], c[k] * B[k], rtol=1e-15)
    np.testing.assert_array_equal(rop.rop_queries(A, B), rop.rop_queries(A, B, 1.0))
    np.testing.assert_allclose(rop.rop_queries(A, B)[:, 0], A + B, rtol=1e-15)


def test_rop_answer_identity_gives_c_times_bv_plus_sigma_of_c2_aWb_times_av():
    from companion.attention import random_single_head

    head = random_single_head(4, seed=3)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((6, 4)) / 2, rng.standard_normal((6, 4)) / 2
    c = np.full(6, 0.7)
    y = head(rop.rop_queries(A, B, c))
    for k in range(6):
        t = float(A[k] @ head.W @ B[k])
        expected = c[k] * (B[k] @ head.v + _sigma(c[k] ** 2 * t) * (A[k] @ head.v))
        assert y[k] == approx(expected, rel=1e-12)


def test_small_av_floor_constant_is_1e_3():
    assert rop._SMALL_AV == 1e-3


def test_gaussian_design_redraws_with_the_1e_3_floor(monkeypatch):
    seen = []
    real = rop._redraw_small

    def spy(A, v, floor, rng):
        seen.append(floor)
        return real(A, v, floor, rng)

    monkeypatch.setattr(rop, "_redraw_small", spy)
    v = np.arange(1.0, 5.0)
    A, B = rop._gaussian_rop_design(4, 7, v, np.random.default_rng(0))
    assert seen == [1e-3]
    assert A.shape == B.shape == (7, 4)
    assert np.all(np.abs(A @ v) >= 1e-3 * np.linalg.norm(v) / 2.0)


@pytest.mark.parametrize(
    "a0, redrawn",
    [(0.25, False), (np.nextafter(0.25, 0.0), True), (0.26, False), (-0.25, False), (-0.24, True)],
)
def test_redraw_small_cut_is_strictly_below_floor_norm_v_over_sqrt_d(a0, redrawn):
    # d = 4, ||v|| = 2, sqrt(d) = 2: the cut floor ||v|| / sqrt(d) is floor itself = 0.5, and
    # a^T v = 2 a0, so a0 = 0.25 sits exactly at the cut (kept: the rule is strict <).
    v = np.array([2.0, 0.0, 0.0, 0.0])
    A = np.array([[a0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    out = rop._redraw_small(A.copy(), v, 0.5, np.random.default_rng(0))
    assert (not np.array_equal(out[0], A[0])) == redrawn
    np.testing.assert_array_equal(out[1], A[1])  # far above the cut: untouched
    assert np.all(np.abs(out @ v) >= 0.5)


def test_redraw_small_draws_replacements_as_normals_over_sqrt_d_in_row_order():
    d = 9
    v = np.zeros(d)
    v[0] = 3.0  # ||v|| / sqrt(d) = 1
    A = np.zeros((3, d))
    A[1, 0] = 5.0  # kept
    out = rop._redraw_small(A.copy(), v, 1e-12, np.random.default_rng(5))
    expected = np.random.default_rng(5).standard_normal((2, d)) / 3.0
    np.testing.assert_allclose(out[[0, 2]], expected, rtol=1e-15)
    np.testing.assert_array_equal(out[1], A[1])


def _scales_reference(A, B, W_max, logit_max):
    out = []
    for a, b in zip(A, B):
        na, nb = np.sqrt(np.sum(a * a)), np.sqrt(np.sum(b * b))
        nab = np.sqrt(np.sum((a + b) ** 2))
        out.append(min(1 / nab, 1 / nb, math.sqrt(logit_max / (W_max * na * nb))))
    return np.array(out)


@pytest.mark.parametrize("W_max, logit_max", [(0.1, 0.5), (4.0, 0.5), (50.0, 0.5), (4.0, 2.0)])
def test_rop_scales_are_the_largest_c_with_both_tokens_in_the_ball_and_logit_in_window(W_max, logit_max):
    rng = np.random.default_rng(2)
    A, B = rng.standard_normal((40, 5)), rng.standard_normal((40, 5))
    A[:5] *= 0.01  # ||a + b|| ~ ||b||: the second-token ball can bind
    B[5:10] *= 0.01
    kw = {} if logit_max == 0.5 else {"logit_max": logit_max}
    c = rop.rop_scales(A, B, W_max=W_max, **kw)
    np.testing.assert_allclose(c, _scales_reference(A, B, W_max, logit_max), rtol=1e-13)
    # Each constraint holds, and one is tight.
    na, nb, nab = (np.linalg.norm(M, axis=1) for M in (A, B, A + B))
    assert np.all(c * nab <= 1 + 1e-12) and np.all(c * nb <= 1 + 1e-12)
    assert np.all(c**2 * na * nb * W_max <= logit_max * (1 + 1e-12))
    tight = np.isclose(c * nab, 1) | np.isclose(c * nb, 1) | np.isclose(c**2 * na * nb * W_max, logit_max)
    assert np.all(tight)


def test_rop_scales_each_of_the_three_constraints_binds_somewhere():
    # a ~ 0, b unit: the logit bound is vacuous and ||a + b|| = ||b|| = 1 -> c = 1.
    c = rop.rop_scales(np.array([[1e-100, 0.0]]), np.array([[1.0, 0.0]]), W_max=1.0)
    assert c[0] == approx(1.0, rel=1e-12)
    # a = -b/2, ||b|| = 2: ||a + b|| = 1, so 1/||b|| = 1/2 binds (logit: sqrt(0.5 / (1e-3 * 2)) = 15.8).
    c = rop.rop_scales(np.array([[-1.0, 0.0]]), np.array([[2.0, 0.0]]), W_max=1e-3)
    assert c[0] == approx(0.5, rel=1e-12)
    # a = b = e_1: 1/||a + b|| = 1/2 binds at W_max = 1 (sqrt(0.5) = 0.707), the logit at W_max = 100.
    A = B = np.array([[1.0, 0.0]])
    assert rop.rop_scales(A, B, W_max=1.0)[0] == approx(0.5, rel=1e-12)
    assert rop.rop_scales(A, B, W_max=100.0)[0] == approx(math.sqrt(0.5 / 100.0), rel=1e-12)
    assert rop.rop_scales(A, B, W_max=2.0)[0] == approx(0.5, rel=1e-12)  # both exactly 1/2


def _error_bound_reference(alpha_hat, tau, c, A, B, av_hat, x):
    lo, hi = _sigma(-x), _sigma(x)
    deltas, das = [], []
    for k in range(len(alpha_hat)):
        da = tau * (1 / c[k] + np.sum(np.abs(B[k])) + hi * np.sum(np.abs(A[k]))) / abs(av_hat[k])
        ac = min(max(alpha_hat[k], lo), hi)
        ends = [min(max(ac - da, lo), hi), min(max(ac + da, lo), hi)]
        slope_den = min(p * (1 - p) for p in ends)
        deltas.append(min(da / slope_den, 2 * x) / c[k] ** 2)
        das.append(da)
    return np.array(deltas), np.array(das)


@pytest.mark.parametrize("x", [0.5, 1.5])
@pytest.mark.parametrize("tau", [1e-6, 1e-3, 0.2])
def test_rop_error_bound_matches_the_documented_interval_formula(tau, x):
    rng = np.random.default_rng(4)
    m, d = 12, 3
    A, B = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    c = rng.uniform(0.2, 1.0, m)
    av_hat = rng.standard_normal(m)  # negative entries: |a^T v_hat| is the divisor
    # Inside the window, below it and above it (clipping), both signs of a^T v_hat.
    alpha_hat = np.concatenate([rng.uniform(_sigma(-x), _sigma(x), m - 4), [0.01, 0.99, -0.3, 1.4]])
    kw = {} if x == 0.5 else {"logit_max": x}
    delta, d_alpha = rop.rop_error_bound(alpha_hat, tau=tau, c=c, A=A, B=B, av_hat=av_hat, **kw)
    ref_delta, ref_da = _error_bound_reference(alpha_hat, tau, c, A, B, av_hat, x)
    np.testing.assert_allclose(d_alpha, ref_da, rtol=1e-12)
    np.testing.assert_allclose(delta, ref_delta, rtol=1e-12)


def test_rop_error_bound_caps_the_logit_error_at_twice_logit_max_over_c2():
    A = B = np.ones((1, 2))
    c = np.array([0.5])
    delta, d_alpha = rop.rop_error_bound(np.array([0.5]), tau=1.0, c=c, A=A, B=B, av_hat=np.array([1.0]))
    assert d_alpha[0] == approx(1.0 * (2.0 + 2.0 + _sigma(0.5) * 2.0), rel=1e-12)
    assert delta[0] == approx(2 * 0.5 / 0.25, rel=1e-12)


def test_rop_error_bound_small_tau_slope_is_one_over_p_one_minus_p_at_the_worse_end():
    # alpha_hat = 0.6 in the window [sigma(-1/2), sigma(1/2)] = [0.3775, 0.6225]; the end farther
    # from 1/2 (0.6 + d_alpha) has the smaller p (1 - p).
    A = B = np.array([[1.0, 0.0]])
    tau, c, av = 1e-5, np.array([1.0]), np.array([2.0])
    delta, d_alpha = rop.rop_error_bound(np.array([0.6]), tau=tau, c=c, A=A, B=B, av_hat=av)
    da = tau * (1.0 + 1.0 + _sigma(0.5) * 1.0) / 2.0
    p = 0.6 + da
    assert d_alpha[0] == approx(da, rel=1e-13)
    assert delta[0] == approx(da / (p * (1 - p)), rel=1e-12)
