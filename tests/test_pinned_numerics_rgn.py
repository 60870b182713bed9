"""Pinned formulas, bounds and stopping rules of ``companion.numerics.rgn`` (documented behaviour).

Only what the docstrings promise: the spectral start's formula, the measurement operator, the
retraction, the direct/matrix-free switches at ``direct_max``, CGLS's default iteration cap, the
stopping rules and the reported diagnostics (recomputed from the returned ``W``).
"""

from __future__ import annotations

import numpy as np
import pytest

from companion.numerics import rgn


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def _design(d, m, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, d)) / np.sqrt(d), rng.standard_normal((m, d)) / np.sqrt(d)


def _low_rank(d, r, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((d, r)) @ rng.standard_normal((r, d))


def _measure(A, B, W):
    return np.array([a @ W @ b for a, b in zip(A, B)])


def test_chunks_hold_at_most_4_mib_of_float64_rows_and_cover_every_row():
    assert rgn._CHUNK_BYTES == 4 * 2**20
    d = 1000
    n = (4 * 2**20) // (8 * d)  # 524 rows
    ch = rgn._chunks(1200, d)
    assert ch == [(0, n), (n, 2 * n), (2 * n, 1200)]
    assert n * 8 * d <= rgn._CHUNK_BYTES < (n + 1) * 8 * d
    # A row larger than the chunk: one row per chunk (max(1, .)).
    assert rgn._chunks(3, 2**20) == [(0, 1), (1, 2), (2, 3)]


def test_rop_apply_is_a_k_transpose_W_b_k():
    A, B = _design(5, 9, 0)
    W = np.random.default_rng(1).standard_normal((5, 5))
    np.testing.assert_allclose(rgn._rop_apply(A, B, W), _measure(A, B, W), rtol=1e-12)
    F, G = W[:, :2], np.random.default_rng(2).standard_normal((2, 5))
    np.testing.assert_allclose(rgn._rop_apply_factors(A, B, F, G), _measure(A, B, F @ G), rtol=1e-12)


def test_spectral_start_is_top_r_svd_of_d2_over_m_sum_t_a_bT():
    d, m, r = 6, 40, 2
    A, B = _design(d, m, 3)
    t = np.random.default_rng(4).standard_normal(m)
    M = (d * d / m) * sum(t[k] * np.outer(A[k], B[k]) for k in range(m))
    Ue, se, Vte = np.linalg.svd(M)
    U, s, V = rgn._spectral_start(A, B, t, r)
    assert U.shape == V.shape == (d, r)
    np.testing.assert_allclose(s, se[:r], rtol=1e-12)
    np.testing.assert_allclose((U * s) @ V.T, (Ue[:, :r] * se[:r]) @ Vte[:r], rtol=1e-11, atol=1e-12)


def test_factor_svd_is_the_thin_svd_of_F_G():
    rng = np.random.default_rng(5)
    F, G = rng.standard_normal((7, 3)), rng.standard_normal((3, 7))
    U, s, V = rgn._factor_svd(F, G)
    np.testing.assert_allclose((U * s) @ V.T, F @ G, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, np.linalg.svd(F @ G, compute_uv=False)[:3], rtol=1e-12)
    np.testing.assert_allclose(U.T @ U, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(V.T @ V, np.eye(3), atol=1e-12)


def test_retract_is_the_rank_r_truncated_svd_of_U_S_VT_plus_U_XT_plus_Y_VT():
    rng = np.random.default_rng(6)
    d, r = 7, 2
    U, _ = np.linalg.qr(rng.standard_normal((d, r)))
    V, _ = np.linalg.qr(rng.standard_normal((d, r)))
    s = np.array([3.0, 1.0])
    X, Y = rng.standard_normal((d, r)), rng.standard_normal((d, r))
    Z = (U * s) @ V.T + U @ X.T + Y @ V.T
    Uz, sz, Vzt = np.linalg.svd(Z)
    U2, s2, V2 = rgn._retract(U, s, V, X, Y, r)
    np.testing.assert_allclose(s2, sz[:r], rtol=1e-12)
    np.testing.assert_allclose((U2 * s2) @ V2.T, (Uz[:, :r] * sz[:r]) @ Vzt[:r], rtol=1e-11, atol=1e-12)


def _tangent_problem(d=4, r=1, m=30, seed=7):
    A, B = _design(d, m, seed)
    rng = np.random.default_rng(seed + 1)
    U, _ = np.linalg.qr(rng.standard_normal((d, r)))
    V, _ = np.linalg.qr(rng.standard_normal((d, r)))
    res = rng.standard_normal(m)
    return A, B, res, U, V


def test_tangent_step_direct_solve_up_to_and_including_direct_max_entries():
    A, B, res, U, V = _tangent_problem()
    m, d = A.shape
    n = m * 2 * d * 1
    *_, its = rgn._tangent_step(A, B, res, U, V, direct_max=n, rtol=1e-12)
    assert its == 0  # m 2 d r == direct_max: direct
    *_, its = rgn._tangent_step(A, B, res, U, V, direct_max=n - 1, rtol=1e-12)
    assert its > 0  # one entry more than direct_max: matrix-free


def test_tangent_step_cgls_default_cap_is_2_d_r_iterations():
    A, B, res, U, V = _tangent_problem(d=3, r=1, m=40)
    kw = dict(direct_max=0, rtol=0.0)
    *_, its = rgn._tangent_step(A, B, res, U, V, **kw)
    assert its == 2 * 3 * 1
    *_, its = rgn._tangent_step(A, B, res, U, V, max_iter=2, **kw)
    assert its == 2


def test_tangent_step_direct_solution_minimises_the_tangent_least_squares_residual():
    A, B, res, U, V = _tangent_problem(d=3, r=1, m=25)
    X, Y, _ = rgn._tangent_step(A, B, res, U, V, direct_max=10**9, rtol=0.0)
    fit = lambda X, Y: _measure(A, B, U @ X.T + Y @ V.T)  # noqa: E731
    base = np.linalg.norm(fit(X, Y) - res)
    rng = np.random.default_rng(0)
    for _ in range(5):
        dX, dY = 1e-4 * rng.standard_normal(X.shape), 1e-4 * rng.standard_normal(Y.shape)
        assert np.linalg.norm(fit(X + dX, Y + dY) - res) >= base - 1e-12
    # Normal equations: the residual is orthogonal to every tangent direction.
    d, r = U.shape
    for i in range(d):
        E = np.zeros((d, r))
        E[i, 0] = 1.0
        assert abs(fit(E, np.zeros((d, r))) @ (fit(X, Y) - res)) < 1e-10
        assert abs(fit(np.zeros((d, r)), E) @ (fit(X, Y) - res)) < 1e-10


def test_single_precision_copies_only_above_2_000_000_entries(monkeypatch):
    assert rgn._DIRECT_MAX_WEIGHTED == 2_000_000
    A, B = _design(5, 10, 0)
    monkeypatch.setattr(rgn, "_DIRECT_MAX_WEIGHTED", 10 * 2 * 5 * 2)
    assert rgn._single_precision(A, B, 2) is None  # exactly at the limit: direct
    monkeypatch.setattr(rgn, "_DIRECT_MAX_WEIGHTED", 10 * 2 * 5 * 2 - 1)
    low = rgn._single_precision(A, B, 2)
    assert low[0].dtype == low[1].dtype == np.float32
    np.testing.assert_array_equal(low[0], A.astype(np.float32))


def test_documented_constants_of_the_stopping_rules():
    assert rgn._STALL_FLOOR == 1e3
    assert rgn._STAGNATION == 1e-2
    assert rgn._FORCING_MIN == 1e-4


def _rgn_problem(d=6, r=1, ratio=4, seed=11):
    m = ratio * r * (2 * d - r)
    A, B = _design(d, m, seed)
    W = _low_rank(d, r, seed + 1)
    return A, B, _measure(A, B, W), W


def test_rgn_max_iter_0_returns_the_spectral_start_and_its_measured_residual():
    A, B, t, _ = _rgn_problem()
    W, info = rgn._rgn(A, B, t, 1, max_iter=0, tol=1e-300)
    U, s, V = rgn._spectral_start(A, B, t, 1)
    np.testing.assert_allclose(W, (U * s) @ V.T, rtol=1e-12, atol=1e-14)
    assert info["iterations"] == 0
    assert info["residuals"] == [info["residual"]]
    rel = np.linalg.norm(_measure(A, B, W) - t) / np.linalg.norm(t)
    assert info["residual"] == approx(rel, rel=1e-9)


@pytest.mark.parametrize("max_iter", [1, 2, 3])
def test_rgn_reports_the_residual_of_the_W_it_returns_after_max_iter_steps(max_iter):
    A, B, t, _ = _rgn_problem()
    W, info = rgn._rgn(A, B, t, 1, max_iter=max_iter, tol=1e-300)
    assert info["iterations"] <= max_iter
    assert len(info["residuals"]) == info["iterations"] + 1
    rel = np.linalg.norm(_measure(A, B, W) - t) / np.linalg.norm(t)
    assert info["residual"] == info["residuals"][-1]
    assert info["residual"] == approx(rel, rel=1e-6, abs=1e-15)
    Fa, Fb = info["factors"]
    np.testing.assert_allclose(Fa @ Fb, W, rtol=1e-12, atol=1e-14)


def test_rgn_stops_at_a_residual_equal_to_tol_and_not_before():
    A, B, t, _ = _rgn_problem()
    _, info = rgn._rgn(A, B, t, 1, max_iter=1, tol=1e-300)
    rel1 = info["residuals"][1]
    assert rel1 < 0.5 * info["residuals"][0]  # real progress: no stall rule fires at it = 1
    _, at = rgn._rgn(A, B, t, 1, max_iter=6, tol=rel1)
    assert at["iterations"] == 1  # rel <= tol: equality stops
    _, above = rgn._rgn(A, B, t, 1, max_iter=6, tol=float(np.nextafter(rel1, 0.0)) / (1e3 + 1))
    assert above["iterations"] >= 2


def test_rgn_uses_direct_solves_up_to_direct_max_and_cgls_above():
    A, B, t, W = _rgn_problem(d=5, r=1, ratio=3)
    m, d = A.shape
    n = m * 2 * d * 1
    W1, info = rgn._rgn(A, B, t, 1, max_iter=8, tol=1e-12, direct_max=n)
    assert info["lsqr_iterations"] == 0
    W2, info2 = rgn._rgn(A, B, t, 1, max_iter=8, tol=1e-12, direct_max=n - 1)
    assert info2["lsqr_iterations"] > 0
    for Wx in (W1, W2):
        assert np.linalg.norm(Wx - W) <= 1e-6 * np.linalg.norm(W)


def test_rgn_zero_measurements_give_residual_zero_and_stop():
    A, B, _, _ = _rgn_problem()
    W, info = rgn._rgn(A, B, np.zeros(A.shape[0]), 1, max_iter=5, tol=1e-12)
    assert info["residual"] == 0.0 and info["iterations"] == 0
    np.testing.assert_array_equal(W, np.zeros_like(W))


def _weighted_problem(seed=21, noise=1e-3):
    d, r = 6, 1
    m = 6 * r * (2 * d - r)
    A, B = _design(d, m, seed)
    W = _low_rank(d, r, seed + 1)
    rng = np.random.default_rng(seed + 2)
    t = _measure(A, B, W) + noise * rng.standard_normal(m)
    w = rng.uniform(0.5, 2.0, m)
    return A, B, t, w


def test_weighted_rgn_max_iter_0_stops_with_max_iter_at_the_start():
    A, B, t, w = _weighted_problem()
    W, info = rgn._weighted_rgn(A, B, t, w, 1, max_iter=0)
    assert info["stop"] == "max_iter" and info["iterations"] == 0
    U, s, V = rgn._spectral_start(A, B, t, 1)
    np.testing.assert_allclose(W, (U * s) @ V.T, rtol=1e-12, atol=1e-14)


def test_weighted_rgn_residual_is_the_weighted_relative_residual_of_the_best_iterate():
    A, B, t, w = _weighted_problem()
    W, info = rgn._weighted_rgn(A, B, t, w, 1, max_iter=10)
    rel = np.linalg.norm(w * (t - _measure(A, B, W))) / np.linalg.norm(w * t)
    assert info["residual"] == approx(rel, rel=1e-9)
    assert info["residual"] == min(info["residuals"])
    assert len(info["residuals"]) == info["iterations"] + 1
    assert info["stop"] in ("converged", "stalled")
    Fa, Fb = info["factors"]
    np.testing.assert_allclose(Fa @ Fb, W, rtol=1e-12, atol=1e-14)


def test_weighted_rgn_exact_stop_at_a_zero_residual():
    A, B, _, w = _weighted_problem()
    _, info = rgn._weighted_rgn(A, B, np.zeros(A.shape[0]), w, 1, max_iter=5)
    assert info["stop"] == "exact" and info["iterations"] == 0 and info["residual"] == 0.0


def test_weighted_rgn_uses_the_given_start():
    A, B, t, w = _weighted_problem()
    U, s, V = rgn._spectral_start(A, B, t, 1)
    start = (U, 2.0 * s, V)
    W, info = rgn._weighted_rgn(A, B, t, w, 1, max_iter=0, start=start)
    np.testing.assert_allclose(W, (U * (2.0 * s)) @ V.T, rtol=1e-12, atol=1e-14)


# --- the stopping rules on scripted residual histories ----------------------------------------
# The measurements are t = e_1 (||t|| = 1) and the fitted measurements are scripted as t - rel_k e_1
# with rel_k powers of two (or sums of few), so every relative residual, ratio and threshold below
# is exact in float64 and the rules are tested at equality. The tangent steps are stubbed out.


def _scripted(monkeypatch, history, *, step=0.0):
    """Run-time stubs: iteration k's fit gives relative residual history[k]; records the iterates."""
    calls = []

    def products(A, B, U, s, V, low=None):
        k = len(calls)
        calls.append((U.copy(), s.copy(), V.copy()))
        fit = np.zeros(A.shape[0])
        fit[0] = 1.0 - history[k]
        return A @ U, B @ V, fit

    def tangent(A, B, res, U, V, **kw):
        d, r = U.shape
        return np.full((d, r), step), np.zeros((d, r)), 0

    monkeypatch.setattr(rgn, "_factor_products", products)
    monkeypatch.setattr(rgn, "_tangent_step", tangent)
    A, B = _design(4, 20, 0)
    t = np.zeros(20)
    t[0] = 1.0
    return A, B, t, calls


@pytest.mark.parametrize(
    "history, tol, stop_at",
    [
        ([1.0, 2.0**-10, 2.0**-30, 2.0**-40], 2.0**-30, 2),  # rel == tol stops
        ([1.0, 2.0**-10, 2.0**-29, 2.0**-40], 2.0**-30, 3),  # just above: goes on
    ],
)
def test_rgn_stops_at_rel_at_most_tol(monkeypatch, history, tol, stop_at):
    A, B, t, _ = _scripted(monkeypatch, history)
    _, info = rgn._rgn(A, B, t, 1, max_iter=10, tol=tol)
    assert info["iterations"] == stop_at
    assert info["residuals"] == history[: stop_at + 1]


def test_rgn_stall_rule_is_less_than_2_fold_progress_strictly_at_rounding_level(monkeypatch):
    tol = 2.0**-40  # the rounding level 1e3 tol ~ 2^-30
    # it = 3: exactly 2-fold progress (not a stall); it = 4: 3/4 of the previous residual, below the level
    history = [1.0, 2.0**-20, 2.0**-31, 2.0**-32, 0.75 * 2.0**-32, 2.0**-50]
    A, B, t, _ = _scripted(monkeypatch, history)
    _, info = rgn._rgn(A, B, t, 1, max_iter=10, tol=tol)
    assert info["iterations"] == 4


def test_rgn_stall_rule_applies_up_to_and_including_the_stall_floor(monkeypatch):
    monkeypatch.setattr(rgn, "_STALL_FLOOR", 2.0**10)
    tol = 2.0**-40  # floor 2^-30 exactly
    for last, stalled in [(2.0**-30, True), (2.0**-30 + 2.0**-40, False)]:
        history = [1.0, 2.0**-20, 1.5 * 2.0**-30, last, 2.0**-50]  # ratio ~ 2/3: no 2-fold progress
        A, B, t, _ = _scripted(monkeypatch, history)
        _, info = rgn._rgn(A, B, t, 1, max_iter=10, tol=tol)
        assert info["iterations"] == (3 if stalled else 4)


def test_rgn_five_iteration_rule_needs_less_than_2_fold_progress_over_5(monkeypatch):
    # far above the rounding level; it = 5: 0.5 = half of history[0] (not stopped); it = 6: 0.375 = half
    # of history[1] (not stopped); it = 7: above half of history[2] = 0.3125: stopped.
    history = [1.0, 0.75, 0.625, 0.5625, 0.53125, 0.5, 0.375, 0.3125 + 2.0**-10, 2.0**-60]
    A, B, t, _ = _scripted(monkeypatch, history)
    _, info = rgn._rgn(A, B, t, 1, max_iter=20, tol=2.0**-60)
    assert info["iterations"] == 7


def test_rgn_measures_the_iterate_after_the_last_step(monkeypatch):
    history = [1.0, 0.5, 0.25, 0.125]
    A, B, t, calls = _scripted(monkeypatch, history, step=0.01)
    W, info = rgn._rgn(A, B, t, 1, max_iter=3, tol=2.0**-60)
    assert info["iterations"] == 3 and len(calls) == 4 and info["residual"] == 0.125
    U, s, V = calls[-1]
    np.testing.assert_allclose(W, (U * s) @ V.T, rtol=1e-14, atol=1e-15)  # W is the last measured iterate


@pytest.mark.parametrize(
    "history, stop, it",
    [
        ([1.0, 0.9375, 0.5], "converged", 1),  # a decrease of exactly rtol = 1/16: converged
        ([1.0, 0.9375 + 2.0**-20, 0.5, 0.5, 0.5, 0.5], "converged", 1),  # a smaller decrease: converged
        ([1.0, 0.9375 - 2.0**-20, 0.5, 0.25, 0.125], "max_iter", 4),  # more than rtol: on to max_iter
        ([1.0, 1.0, 1.0, 1.0, 0.5], "stalled", 3),  # patience 3: three iterations without a cut
        ([1.0, 0.5, 0.75, 0.75, 0.75, 0.1], "stalled", 4),
        ([1.0, 0.0, 0.5], "exact", 1),
    ],
)
def test_weighted_rgn_stopping_rules(monkeypatch, history, stop, it):
    A, B, t, _ = _scripted(monkeypatch, history)
    _, info = rgn._weighted_rgn(A, B, t, np.ones(t.size), 1, max_iter=4, rtol=2.0**-4, patience=3)
    assert (info["stop"], info["iterations"]) == (stop, it)
    assert info["residual"] == min(info["residuals"]) == min(history[: it + 1])


def test_weighted_rgn_returns_the_best_iterate_not_the_last(monkeypatch):
    history = [1.0, 0.5, 0.75, 0.75, 0.75]
    A, B, t, calls = _scripted(monkeypatch, history, step=0.01)
    W, info = rgn._weighted_rgn(A, B, t, np.ones(t.size), 1, max_iter=10, rtol=2.0**-4, patience=3)
    assert info["stop"] == "stalled" and info["residual"] == 0.5
    U, s, V = calls[1]
    np.testing.assert_allclose(W, (U * s) @ V.T, rtol=1e-14, atol=1e-15)
    Ul, sl, Vl = calls[-1]
    assert not np.allclose(W, (Ul * sl) @ Vl.T)


def test_weighted_rgn_stops_at_a_non_finite_step_keeping_the_best_iterate(monkeypatch):
    history = [1.0, 0.5, 0.25]
    A, B, t, calls = _scripted(monkeypatch, history, step=0.01)
    real = rgn._tangent_step
    n = []

    def tangent(*args, **kw):
        n.append(1)
        X, Y, k = real(*args, **kw)
        return (X * np.nan if len(n) == 2 else X), Y, k

    monkeypatch.setattr(rgn, "_tangent_step", tangent)
    W, info = rgn._weighted_rgn(A, B, t, np.ones(t.size), 1, max_iter=10, rtol=2.0**-4, patience=3)
    assert info["stop"] == "diverged" and info["iterations"] == 1 and info["residual"] == 0.5
    U, s, V = calls[1]
    np.testing.assert_allclose(W, (U * s) @ V.T, rtol=1e-14, atol=1e-15)
