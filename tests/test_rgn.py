"""The Riemannian Gauss-Newton solver's tangent steps and stopping rules (issue 22, item 5).

Each tolerance of ``companion.numerics.rgn`` and ``learn_low_rank_noisy``'s second-start rule is
tested just inside and just outside: the CGLS stopping test, ``_STALL_FLOOR``, the weighted run's
``rtol`` (converged) rule and ``robust._noisy.SKIP_SECOND_START_FIT``.
"""

import numpy as np
import pytest

from companion import robust
from companion.numerics import rgn, rop
from companion.oracles import ApproxValueQueryOracle


def _problem(d=24, r=3, ratio=3.0, seed=0, noise=0.0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / np.sqrt(d)
    m = int(ratio * r * (2 * d - r))
    A, B = rop._gaussian_rop_design(d, m, np.ones(d), rng)
    t = rgn._rop_apply(A, B, W) + noise * rng.standard_normal(m) * np.linalg.norm(W) / d
    return A, B, t, W, r


def _tangent(U, X, Y, V):
    return U @ X.T + Y @ V.T


@pytest.mark.parametrize("low", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_cgls_tangent_step_is_the_least_squares_tangent_vector(low, weighted):
    # the matrix-free step (float64 or float32 inner solve, weighted rows or not) gives the tangent
    # vector U X^T + Y V^T of the direct minimum-norm solve, to its tolerance
    A, B, t, W, r = _problem(noise=0.05)
    w = np.random.default_rng(1).uniform(0.1, 1.0, t.size) if weighted else np.ones(t.size)
    U, s, V = rgn._spectral_start(A, B, t, r)
    alpha, beta, fit = rgn._factor_products(A, B, U, s, V)
    res, a_w, b_w = w * (t - fit), w[:, None] * alpha, w[:, None] * beta
    Xd, Yd, its_d = rgn._tangent_step(A, B, res, U, V, direct_max=10**12, rtol=0.0, alpha=a_w, beta=b_w)
    lo = (A.astype(np.float32), B.astype(np.float32)) if low else None
    X, Y, its = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=1e-5, alpha=a_w, beta=b_w, low=lo)
    assert its_d == 0 and 0 < its < 2 * 24 * 3
    assert np.allclose(U.T @ Y, 0, atol=1e-5)                 # the gauge-free coordinates: U^T Y = 0
    exact = _tangent(U, Xd, Yd, V)
    assert np.linalg.norm(_tangent(U, X, Y, V) - exact) < 1e-3 * np.linalg.norm(exact)


def test_cgls_stops_exactly_at_its_relative_tolerance():
    # the first iteration whose normal-equation residual is at most rtol times the start ends the
    # solve: with rtol just above that ratio it stops there, just below it takes one more step
    A, B, t, W, r = _problem(noise=0.05)
    U, s, V = rgn._spectral_start(A, B, t, r)
    alpha, beta, fit = rgn._factor_products(A, B, U, s, V)
    res = t - fit

    def normal_ratio(X, Y):
        def adj(y):
            Yb = A.T @ (y[:, None] * beta)
            return B.T @ (y[:, None] * alpha), Yb - U @ (U.T @ Yb)
        r0 = adj(res)
        fitted = np.einsum("kr,kr->k", B @ X, alpha) + np.einsum("kr,kr->k", A @ Y, beta)
        r1 = adj(res - fitted)
        return np.sqrt(sum(np.sum(g * g) for g in r1) / sum(np.sum(g * g) for g in r0))

    X, Y, k = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=1e-2)
    ratio = normal_ratio(X, Y)
    assert ratio <= 1e-2
    _, _, k_in = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=ratio * (1 + 1e-6))
    _, _, k_out = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=ratio * (1 - 1e-6))
    assert (k_in, k_out) == (k, k + 1)


def test_rgn_stall_floor_just_inside_and_outside(monkeypatch):
    # measurements of a rank-3 matrix fitted at rank 2: the relative residual stalls at its
    # best rank-2 level. With that level below _STALL_FLOOR * tol the first step without 2-fold
    # progress stops the run; just above it, the run goes on to the 5-iteration rule.
    A, B, _, W, _ = _problem(d=20, r=3, ratio=4.0)
    U, s, Vt = np.linalg.svd(W)
    W3 = (U[:, :3] * np.array([1.0, 0.7, 1e-6])) @ Vt[:3]
    t = rgn._rop_apply(A, B, W3)
    _, free = rgn._rgn(A, B, t, 2, max_iter=50, tol=1e-15, direct_max=0)
    h = free["residuals"]
    stall = next(i for i in range(1, len(h)) if h[i] > 0.5 * h[i - 1])   # first step without 2-fold progress
    tol = 1e-15
    monkeypatch.setattr(rgn, "_STALL_FLOOR", h[stall] * (1 + 1e-9) / tol)
    _, inside = rgn._rgn(A, B, t, 2, max_iter=50, tol=tol, direct_max=0)
    monkeypatch.setattr(rgn, "_STALL_FLOOR", h[stall] * (1 - 1e-9) / tol)
    _, outside = rgn._rgn(A, B, t, 2, max_iter=50, tol=tol, direct_max=0)
    assert inside["iterations"] == stall
    assert outside["iterations"] > stall
    assert inside["residual"] < 1e-5                           # the rank-2 level of sigma_3 = 1e-6


def test_weighted_rgn_converged_rule_just_inside_and_outside():
    # the weighted run stops at the first iteration that lowers the best residual by less than a
    # relative rtol; just below that decrease it goes on
    A, B, t, W, r = _problem(noise=0.05)
    w = np.random.default_rng(1).uniform(0.1, 1.0, t.size)
    _, full = rgn._weighted_rgn(A, B, t, w, r, max_iter=12, rtol=1e-300, patience=99)
    h = np.asarray(full["residuals"])
    best = np.minimum.accumulate(h)
    drops = 1 - h[1:] / best[:-1]                                 # relative decrease at step i + 1
    j = next(i for i in range(len(drops)) if 0 < drops[i] < 1e-3) + 1
    assert np.all(drops[: j - 1] > drops[j - 1])                  # no earlier, smaller decrease
    _, inside = rgn._weighted_rgn(A, B, t, w, r, max_iter=12, rtol=drops[j - 1] * 1.01, patience=99)
    _, outside = rgn._weighted_rgn(A, B, t, w, r, max_iter=12, rtol=drops[j - 1] * 0.99, patience=99)
    assert inside["iterations"] == j
    assert outside["iterations"] > j


def test_noisy_second_start_runs_only_when_the_first_fit_is_not_certified(monkeypatch):
    head = robust.random_margin_head(10, W_max=4.0, mu=0.1, rank=2, seed=0)
    calls = []
    real = robust._noisy.solve_weighted_rgn

    def spy(*args, **kw):
        W, info = real(*args, **kw)
        calls.append(info)
        return W, info

    monkeypatch.setattr(robust._noisy, "solve_weighted_rgn", spy)
    rec = robust.learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-4), 2, W_max=4.0, verify=0)
    assert len(calls) == 2 and rec.diagnostics["start"] == "sqrt-weighted"
    ratio = rec.diagnostics["fit_ratio"]
    assert 0 < ratio < 1
    for threshold, runs in [(ratio * (1 + 1e-6), 2), (ratio * (1 - 1e-6), 3)]:
        calls.clear()
        monkeypatch.setattr(robust._noisy, "SKIP_SECOND_START_FIT", threshold)
        again = robust.learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-4), 2, W_max=4.0, verify=0)
        assert len(calls) == runs, threshold
        assert np.linalg.norm(again.W - rec.W) <= 1e-4 * np.linalg.norm(rec.W)   # one minimiser


def test_rgn_inner_work_stays_small_at_the_default_forcing():
    # inexact Gauss-Newton with row-equilibrated CGLS steps: exact recovery with few inner
    # iterations in all: measured 11 Gauss-Newton and 110 inner iterations at d = 30, r = 3 (the
    # LSQR steps it replaced took 390); forcing ten times smaller takes 129 inner iterations, ten
    # times larger 22 Gauss-Newton iterations
    A, B, _, W, r = _problem(d=30, r=3, ratio=2.0)
    t = rgn._rop_apply(A, B, W)
    What, info = rgn._rgn(A, B, t, r, max_iter=50, tol=1e-13, direct_max=0)
    assert np.linalg.norm(What - W) < 1e-10 * np.linalg.norm(W)
    assert 0 < info["lsqr_iterations"] <= 120 and info["iterations"] <= 15
    F, G = info["factors"]
    assert np.allclose(F @ G, What)


def test_noisy_start_run_tolerances_change_only_the_start(monkeypatch):
    # the sqrt-weighted run gets START_RUN_RTOL and START_RUN_INNER_RTOL (d = 100: matrix-free
    # steps); a tenfold change of either changes that run's work, and tightening either leaves the
    # W returned as it is (loosening START_RUN_INNER_RTOL tenfold, to 3, leaves the start unsolved)
    head = robust.random_margin_head(100, W_max=4.0, mu=0.05, rank=5, seed=0)
    real = robust._noisy.solve_weighted_rgn
    calls = []

    def spy(*args, **kw):
        W, info = real(*args, **kw)
        calls.append((kw, info))
        return W, info

    monkeypatch.setattr(robust._noisy, "solve_weighted_rgn", spy)

    def run():
        calls.clear()
        rec = robust.learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-5), 5, W_max=4.0, verify=0)
        return rec, calls[0]

    rec, (kw, info) = run()
    assert kw["rtol"] == robust._noisy.START_RUN_RTOL and kw["inner_rtol"] == robust._noisy.START_RUN_INNER_RTOL
    assert "rtol" not in calls[1][0] and "inner_rtol" not in calls[1][0]        # the kept run: defaults
    work = (info["iterations"], info["lsqr_iterations"])
    for name in ("START_RUN_RTOL", "START_RUN_INNER_RTOL"):
        for factor in (10.0, 0.1):
            monkeypatch.setattr(robust._noisy, name, getattr(robust._noisy, name) * factor)
            other, (_, info2) = run()
            monkeypatch.undo()
            monkeypatch.setattr(robust._noisy, "solve_weighted_rgn", spy)
            assert (info2["iterations"], info2["lsqr_iterations"]) != work, (name, factor)
            if factor < 1:
                assert np.linalg.norm(other.W - rec.W) <= 1e-4 * np.linalg.norm(rec.W), name


# --- issue 22 item 5: the factored operator, the float32 start, the stagnation and forcing rules ---

def test_factored_operator_equals_the_dense_one():
    # the measurement operator at W = F G ((d, k) and (k, d)) without forming W, and the fitted
    # measurements of _factor_products at W = U S V^T, equal a_k^T W b_k of the dense W
    A, B, _, _, _ = _problem(d=13, r=2, ratio=3.0)
    rng = np.random.default_rng(3)
    F, G = rng.standard_normal((13, 4)), rng.standard_normal((4, 13))
    dense = np.einsum("kd,de,ke->k", A, F @ G, B)
    assert np.allclose(rgn._rop_apply_factors(A, B, F, G), dense, rtol=1e-13, atol=1e-13 * np.abs(dense).max())
    assert np.allclose(rgn._rop_apply(A, B, F @ G), dense, rtol=1e-13, atol=1e-13 * np.abs(dense).max())
    U, s, V = rgn._factor_svd(F, G)
    alpha, beta, fit = rgn._factor_products(A, B, U, s, V)
    assert np.allclose(fit, dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())
    assert np.allclose(alpha, A @ U) and np.allclose(beta, B @ V)


def test_tangent_operator_and_adjoint_equal_the_dense_ones():
    # one CGLS iteration from zero is the step gamma / ||K p||^2 along p = K^T res: with the dense
    # tangent map (X, Y) -> (a_k^T (U X^T + Y V^T) b_k)_k and its adjoint on the gauge U^T Y = 0,
    # the factored float64 and float32 steps are that step
    A, B, t, W, r = _problem(d=11, r=2, ratio=3.0, noise=0.1)
    U, s, V = rgn._spectral_start(A, B, t, r)
    res = t - rgn._factor_products(A, B, U, s, V)[2]
    P = np.eye(11) - U @ U.T
    GX = np.einsum("k,kd,ke->de", res, B, A) @ U             # d/dX of sum_k res_k b_k^T X U^T a_k
    GY = P @ np.einsum("k,kd,ke->de", res, A, B) @ V         # d/dY, projected on U^T Y = 0
    q = rgn._rop_apply(A, B, _tangent(U, GX, GY, V))
    step = (np.sum(GX**2) + np.sum(GY**2)) / np.dot(q, q)
    for low in (None, (A.astype(np.float32), B.astype(np.float32))):
        X, Y, its = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, max_iter=1, low=low)
        tol = 1e-12 if low is None else 1e-5
        assert its == 1
        assert np.linalg.norm(X - step * GX) <= tol * np.linalg.norm(step * GX)
        assert np.linalg.norm(Y - step * GY) <= tol * np.linalg.norm(step * GY)


def test_float32_spectral_start_is_the_float64_one_to_float32_rounding():
    A, B, t, W, r = _problem(d=40, r=3, ratio=3.0)
    U, s, V = rgn._spectral_start(A, B, t, r)
    U32, s32, V32 = rgn._spectral_start(A, B, t, r, low=(A.astype(np.float32), B.astype(np.float32)))
    assert U32.dtype == np.float64 and np.allclose(s32, s, rtol=1e-5)
    assert np.linalg.norm((U32 * s32) @ V32.T - (U * s) @ V.T) < 1e-5 * np.linalg.norm(s)


def test_gaussian_rop_design_values_are_normals_over_sqrt_d():
    # filled in place, the design holds the values of rng.standard_normal((m, d)) / sqrt(d), A then B
    rng, ref = np.random.default_rng(7), np.random.default_rng(7)
    A, B = rop._gaussian_rop_design(9, 50, np.ones(9), rng)
    A0, B0 = ref.standard_normal((50, 9)) / 3.0, ref.standard_normal((50, 9)) / 3.0
    redrawn = np.abs(A0 @ np.ones(9)) < rop._SMALL_AV * 3.0 / 3.0
    assert np.array_equal(A[~redrawn], A0[~redrawn]) and np.array_equal(B, B0)


def _ls_residual2(A, B, res, U, V, X, Y):
    fitted = rgn._rop_apply(A, B, _tangent(U, X, Y, V))
    return float(np.sum((res - fitted) ** 2))


def test_cgls_stagnation_rule_just_inside_and_outside():
    # at a noisy point the tangent least-squares residual levels off: CGLS with ``stagnation`` stops
    # at the first iteration that lowers ||rr||^2 by less than that fraction of it
    A, B, t, W, r = _problem(d=24, r=3, ratio=2.0, noise=1e-3)
    U, s, V = np.linalg.svd(W)[0][:, :r], np.linalg.svd(W)[1][:r], np.linalg.svd(W)[2][:r].T
    res = t - rgn._factor_products(A, B, U, s, V)[2]
    r2 = [float(np.sum(res**2))]
    for j in range(1, 40):
        X, Y, _ = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, max_iter=j)
        r2.append(_ls_residual2(A, B, res, U, V, X, Y))
    drop = [1.0 - r2[j] / r2[j - 1] for j in range(1, 40)]       # drop[j - 1]: iteration j
    _, _, k = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, stagnation=rgn._STAGNATION)
    assert drop[k - 1] < rgn._STAGNATION <= min(drop[: k - 1])
    s_in, s_out = drop[k - 1] * (1 + 1e-6), drop[k - 1] * (1 - 1e-6)
    assert rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, stagnation=s_in)[2] == k
    assert rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, stagnation=s_out)[2] > k
    for factor in (10.0, 0.1):                                   # a tenfold change moves the stop
        other = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=0.0, stagnation=rgn._STAGNATION * factor)
        assert other[2] != k, factor


def test_rgn_forcing_follows_the_residual_down_to_forcing_min(monkeypatch):
    # each tangent solve of _rgn gets rtol = min(forcing, max(_FORCING_MIN, rel)); a tenfold change
    # of _FORCING_MIN changes the inner work, and the run stays exact
    A, B, _, W, r = _problem(d=30, r=3, ratio=2.0)
    t = rgn._rop_apply(A, B, W)
    real, seen = rgn._tangent_step, []

    def spy(*args, **kw):
        seen.append(kw["rtol"])
        return real(*args, **kw)

    monkeypatch.setattr(rgn, "_tangent_step", spy)
    What, info = rgn._rgn(A, B, t, r, max_iter=50, tol=1e-13, direct_max=0)
    h = info["residuals"]
    assert seen == [min(rgn._FORCING, max(rgn._FORCING_MIN, rel)) for rel in h[: len(seen)]]
    assert any(rel < rgn._FORCING_MIN for rel in h[: len(seen)])          # the floor is used
    assert np.linalg.norm(What - W) < 1e-10 * np.linalg.norm(W)
    work = info["lsqr_iterations"]
    for factor in (10.0, 0.1):
        monkeypatch.setattr(rgn, "_FORCING_MIN", 1e-4 * factor)
        _, other = rgn._rgn(A, B, t, r, max_iter=50, tol=1e-13, direct_max=0)
        assert other["lsqr_iterations"] != work, factor


# --- issue 22 item 5, round 2: the fused normal operator, float32 fits, the float32 design ---

def test_fused_normal_operator_in_many_chunks_equals_one_pass(monkeypatch):
    # the tangent solve visits the design in row chunks of _CG_CHUNK_BYTES: chunks of 7 rows give
    # the solve of one chunk, to float64 rounding (the test problems fit one chunk by default)
    A, B, t, W, r = _problem(noise=0.05)
    U, s, V = rgn._spectral_start(A, B, t, r)
    res = t - rgn._factor_products(A, B, U, s, V)[2]
    X1, Y1, k1 = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=1e-6)
    monkeypatch.setattr(rgn, "_CG_CHUNK_BYTES", 7 * 8 * A.shape[1])
    X7, Y7, k7 = rgn._tangent_step(A, B, res, U, V, direct_max=0, rtol=1e-6)
    assert k1 == k7 > 3
    assert np.linalg.norm(_tangent(U, X7 - X1, Y7 - Y1, V)) < 1e-12 * np.linalg.norm(_tangent(U, X1, Y1, V))


def test_float32_fits_are_the_float64_ones_to_float32_rounding():
    A, B, t, W, r = _problem(d=20, r=2)
    U, s, V = rgn._spectral_start(A, B, t, r)
    a64, b64, f64 = rgn._factor_products(A, B, U, s, V)
    a32, b32, f32 = rgn._factor_products(A, B, U, s, V, low=(A.astype(np.float32), B.astype(np.float32)))
    assert a32.dtype == np.float32 and f32.dtype == np.float64
    assert 0 < np.linalg.norm(f32 - f64) < 1e-6 * np.linalg.norm(f64)
    assert np.allclose(a32, a64, rtol=1e-5, atol=1e-6) and np.allclose(b32, b64, rtol=1e-5, atol=1e-6)


def _coarse_flags(monkeypatch, A, B, t, r, **kw):
    real, flags = rgn._factor_products, []

    def spy(*args, low=None):
        flags.append(low is not None)
        return real(*args, low=low)

    monkeypatch.setattr(rgn, "_factor_products", spy)
    W, info = rgn._rgn(A, B, t, r, max_iter=50, direct_max=0, **kw)
    monkeypatch.undo()
    return flags, W, info


def test_coarse_fit_threshold_just_inside_and_outside(monkeypatch):
    # an iteration measures its fit in float32 while the previous relative residual exceeds
    # _COARSE_FIT; a float32 residual at or below it is measured again in float64
    A, B, _, W, r = _problem(d=24, r=2, ratio=2.5, seed=6)      # residuals 9.6e-3, 1.5e-4, ...
    t = rgn._rop_apply(A, B, W)
    flags, What, info = _coarse_flags(monkeypatch, A, B, t, r, tol=1e-13)
    h = info["residuals"]
    assert flags[0] and not flags[-1] and np.linalg.norm(What - W) < 1e-10 * np.linalg.norm(W)
    j = next(i for i, rel in enumerate(h) if rel < 1e-2)       # a residual of the float32 phase
    seen = []
    for threshold in (h[j] * (1 + 1e-6), h[j] * (1 - 1e-6)):
        monkeypatch.setattr(rgn, "_COARSE_FIT", threshold)
        seen.append(_coarse_flags(monkeypatch, A, B, t, r, tol=1e-13)[0])
    inside, outside = seen
    k = next(i for i, (a, b) in enumerate(zip(inside, outside)) if a != b)
    # just above h[j]: that float32 residual is measured again in float64; just below: the next
    # iteration's fit is float32 too
    assert (inside[k], outside[k]) == (False, True)
    for factor in (10.0, 0.1):
        monkeypatch.setattr(rgn, "_COARSE_FIT", 1e-3 * factor)
        assert _coarse_flags(monkeypatch, A, B, t, r, tol=1e-13)[0] != flags, factor


def test_rgn_stops_on_a_float64_residual():
    # with tol above _COARSE_FIT the run stops in the float32 phase: the residual it reports is
    # the float64 one of the W it returns, not the float32 fit's (off by about 1e-7 / tol)
    A, B, _, W, r = _problem(d=24, r=2, ratio=2.5, seed=6)      # residuals 0.069, 9.6e-3, ...
    t = rgn._rop_apply(A, B, W)
    What, info = rgn._rgn(A, B, t, r, max_iter=50, tol=2e-2, direct_max=0)
    rel = np.linalg.norm(rgn._rop_apply(A, B, What) - t) / np.linalg.norm(t)
    assert rgn._COARSE_FIT < info["residual"] <= 2e-2 < info["residuals"][-2]
    assert abs(info["residual"] - rel) <= 1e-9 * rel


def test_float32_design_is_the_float64_draws_rounded(monkeypatch):
    # drawn in row chunks (here of 7 rows) from the same stream: the float64 design's values,
    # redrawn rows included, rounded to float32
    monkeypatch.setattr(rop, "_SMALL_AV", 0.3)                 # many redrawn rows
    monkeypatch.setattr(rop, "_DRAW_CHUNK_BYTES", 7 * 8 * 9)
    A64, B64 = rop._gaussian_rop_design(9, 50, np.ones(9), np.random.default_rng(5))
    A32, B32 = rop._gaussian_rop_design(9, 50, np.ones(9), np.random.default_rng(5), dtype=np.float32)
    assert A32.dtype == B32.dtype == np.float32
    assert np.array_equal(A32, A64.astype(np.float32)) and np.array_equal(B32, B64.astype(np.float32))
    assert np.all(np.abs(A32.astype(np.float64) @ np.ones(9)) >= 0.3 * 3.0 / 3.0)


def test_learn_low_rank_rgn_measures_its_float32_design_exactly():
    # method="rgn" draws its design in float32 and measures exactly those vectors: the answers
    # invert to a_k^T W* b_k of the float32 values, and W is exact
    from companion import lowrank
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle

    head = random_single_head(40, rank=3, seed=2)
    rec = lowrank.learn_low_rank(ValueQueryOracle(head), 3, method="rgn", seed=4)
    assert rec.relative_errors(head)["W"] < 1e-10
    A, B = rop._gaussian_rop_design(40, rec.diagnostics["n_measurements"], rec.v, np.random.default_rng(4),
                                    dtype=np.float32)
    t, _ = lowrank.measure_bilinear(ValueQueryOracle(head), A, B, head.v)
    exact = np.einsum("kd,de,ke->k", A.astype(np.float64), head.W, B.astype(np.float64))
    assert np.allclose(t, exact, rtol=1e-9, atol=1e-12 * np.abs(exact).max())


def test_forcing_cap_leaves_far_solves_loose_and_still_steps():
    # the tangent solves' forcing is the residual, capped at _FORCING = 0.5 (the default): a cap
    # ten times smaller (the previous 3e-2 is between) spends more inner iterations for the same
    # exact W; ten times larger, a start with relative residual above 1 gets rtol > 1, no step,
    # and the run stalls (measured 99 inner iterations, 112 with the cap at 0.05, 117 at 3e-2; at
    # d = 30, r = 3 the cap 0.5 takes 113 against 105 at 3e-2: the gain is at larger sizes)
    A, B, _, W, r = _problem(d=48, r=4, ratio=2.0)
    t = rgn._rop_apply(A, B, W)

    def run(**kw):
        What, info = rgn._rgn(A, B, t, r, max_iter=50, tol=1e-13, direct_max=0, **kw)
        return np.linalg.norm(What - W) / np.linalg.norm(W), info

    default = run()
    runs = {f: run(forcing=f) for f in (0.5, 0.05, 5.0, 3e-2)}
    assert default[1]["residuals"] == runs[0.5][1]["residuals"] and default[0] < 1e-10
    assert default[1]["residuals"][0] > 1.0                            # the start's residual
    assert runs[0.05][0] < 1e-10 and runs[0.05][1]["lsqr_iterations"] > default[1]["lsqr_iterations"]
    assert runs[3e-2][1]["lsqr_iterations"] > default[1]["lsqr_iterations"]
    assert runs[5.0][1]["lsqr_iterations"] == 0 and runs[5.0][0] > 0.1
