"""The counts route's moment start (companion.multihead._star, learn_canonical_rational(start="moments"))."""

import math

import numpy as np
import pytest
from scipy.special import expit

from companion import multihead
from companion.numerics.rational import ratio_design
from companion.multihead._star import (
    head_subspace,
    jennrich,
    power_sums,
    sigma_derivatives,
    symmetric_fit,
    track_rows,
)
from companion.errors import InvalidInputError, OracleInconsistentError
from companion.multihead import (
    MOMENT_FROM,
    canonical_form,
    follow_up_count,
    learn_canonical_rational,
    match_heads,
    moment_plan,
    random_multi_head,
)
from companion.oracles import ValueQueryOracle


def test_sigma_derivatives_match_finite_differences():
    s = np.linspace(-3, 3, 7)
    B = sigma_derivatives(s, 3)
    h = 1e-4
    for j in range(1, 4):
        fd = (sigma_derivatives(s + h, j - 1)[:, j - 1] - sigma_derivatives(s - h, j - 1)[:, j - 1]) / (2 * h)
        np.testing.assert_allclose(B[:, j], fd, rtol=0, atol=1e-7)
    np.testing.assert_allclose(B[:, 0], expit(s), rtol=0, atol=0)


def test_power_sums_recover_small_shifts_and_flag_large_ones():
    n, m = ratio_design(12)
    s = np.log(n / m)
    rng = np.random.default_rng(0)
    gam = rng.standard_normal(5)
    for width, ok in ((0.1, True), (3.0, False)):
        L = rng.uniform(-width, width, (20, 5))
        G = expit(s[None, :, None] + L[:, None, :]) @ gam
        P, misfit = power_sums(s, G, gam.sum(), 9)
        true = np.stack([(L**j) @ gam for j in range(1, 10)], axis=1)
        err = np.max(np.abs(P[:, 1] - true[:, 1])) / np.max(np.abs(true[:, 1]))
        assert (err < 1e-8) == ok
        assert (np.max(misfit) < 1e-10) == ok


def test_symmetric_fit_recovers_a_cubic():
    rng = np.random.default_rng(1)
    T = rng.standard_normal((3, 3, 3))
    T = sum(np.transpose(T, p) for p in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]) / 6
    Z = rng.standard_normal((30, 3))
    M = symmetric_fit(Z, np.einsum("abc,ka,kb,kc->k", T, Z, Z, Z), 3)
    np.testing.assert_allclose(M, T, rtol=0, atol=1e-12)


def test_jennrich_recovers_rows_and_amplitudes():
    rng = np.random.default_rng(2)
    C = rng.standard_normal((5, 5))
    g = rng.standard_normal(5)
    M2 = np.einsum("h,ha,hb->ab", g, C, C)
    M3 = np.einsum("h,ha,hb,hc->abc", g, C, C, C)
    Ch, gh, gap = jennrich(M2, M3, rng)
    assert gap > 0
    for h in range(5):
        k = int(np.argmin(np.linalg.norm(Ch - C[h], axis=1)))
        assert np.linalg.norm(Ch[k] - C[h]) <= 1e-9 * np.linalg.norm(C[h])
        assert abs(gh[k] - g[h]) <= 1e-9 * np.max(np.abs(g))


def test_jennrich_reports_complex_eigenvalues_as_no_start():
    # M3(w) M2^{-1} a rotation for every w: no real simultaneous diagonalisation
    M2 = np.eye(2)
    M3 = np.zeros((2, 2, 2))
    M3[0, 1, 0], M3[1, 0, 0] = 1.0, -1.0
    M3[0, 1, 1], M3[1, 0, 1] = 1.0, -1.0
    C, g, gap = jennrich(M2, M3, np.random.default_rng(0))
    assert gap == 0.0 and np.all(np.isnan(C)) and np.all(np.isnan(g))


def test_head_subspace_spans_the_rows():
    rng = np.random.default_rng(3)
    R = rng.standard_normal((3, 8))
    D = rng.standard_normal((12, 3)) @ R
    U, sv = head_subspace(D, 3)
    assert sv[3] < 1e-14 < sv[2]
    np.testing.assert_allclose(U @ (U.T @ R.T), R.T, rtol=0, atol=1e-12)


def _star_case(d, H, target_seed, rng_seed, n_rows, centre=None):
    """A random target's exact answers on a star of ``n_rows`` rows 0.01 around a centre (random
    unless given): ``(target, P, (s, G, X, gamma0, R0, G0))``, the last as track_rows takes it."""
    target = random_multi_head(d, H, seed=target_seed)
    n, m = ratio_design(H)
    s = np.log(n / m)
    rng = np.random.default_rng(rng_seed)
    X = rng.standard_normal((12, d))
    if centre is None:
        centre = rng.standard_normal(d)
        centre /= np.linalg.norm(centre)
    P = centre + 0.01 * rng.standard_normal((n_rows, d))

    def row(delta):
        shifts = X @ (target.Ws.transpose(0, 2, 1) @ delta).T
        return expit(s[None, :, None] + shifts[:, None, :]) @ (target.vs @ delta)

    g0, R0 = target.vs @ centre, np.einsum("a,hab->hb", centre, target.Ws)
    return target, P, (s, np.stack([row(q) for q in P]), X, g0, R0, row(centre))


def test_track_rows_learns_the_star_from_the_centre():
    target, P, args = _star_case(6, 2, target_seed=4, rng_seed=5, n_rows=4)
    gam, R, rel, tracked = track_rows(*args, tol=1e-12)
    assert np.all(rel <= 1e-12)
    for i, p in enumerate(P):
        np.testing.assert_allclose(R[i], np.einsum("a,hab->hb", p, target.Ws), rtol=0, atol=1e-9)


def test_moment_plan_values_and_limits():
    p = moment_plan(64, 12)
    assert (p["S"], p["K"], p["n_centres"], p["n_moment_tokens"], p["n_base_tokens"]) == (24, 98, 2, 546, 256)
    assert p["n_queries"] <= p["budget"] == follow_up_count(64, 12)
    assert p["n_moment_tokens"] == math.ceil(1.5 * math.comb(14, 3))
    q = moment_plan(32, 12)  # a second centre would leave fewer than 1.5 d tokens per row
    assert q["n_centres"] == 1 and q["K"] >= 33
    with pytest.raises(InvalidInputError, match="H <= d"):
        moment_plan(4, 5)
    with pytest.raises(InvalidInputError, match="tokens per row"):
        moment_plan(8, 6)


@pytest.mark.parametrize("d, H, seed", [(16, 4, 0), (24, 6, 0)])
def test_moment_start_learns_at_the_count(d, H, seed):
    target = random_multi_head(d, H, seed=seed)
    oracle = ValueQueryOracle(target)
    rec = learn_canonical_rational(oracle, H=H, seed=seed, start="moments")
    mh = match_heads(canonical_form(target), rec.model)
    assert rec.n_heads == H and max(mh["max_W_error"], mh["max_v_error"]) <= 1e-8
    assert rec.n_learning_queries <= follow_up_count(d, H) and rec.diagnostics["max_len"] <= 2 * H + 1
    dg = rec.diagnostics
    assert dg["start"] == "moments" and dg["verify_max_error"] <= dg["verify_tolerance"]
    documented = {"start", "n_centres_tried", "centre_amplitude_ratio", "subspace_sv", "taylor_misfit",
                  "jennrich_gap", "n_tracked_rows", "n_redrawn_rows", "max_row_residual", "n_heads", "max_len",
                  "kim_count", "plan"}
    assert documented <= set(dg) and dg["plan"] == moment_plan(d, H)


def test_moment_start_finds_H_from_a_bound():
    target = random_multi_head(16, 4, seed=0)
    rec = learn_canonical_rational(ValueQueryOracle(target), H_bound=5, seed=0, start="moments")
    assert rec.n_heads == 4
    assert rec.n_learning_queries <= follow_up_count(16, 5)


def test_start_is_checked_and_auto_switches_at_moment_from(monkeypatch):
    oracle = ValueQueryOracle(random_multi_head(64, 2, seed=0))
    with pytest.raises(InvalidInputError, match="start must be"):
        learn_canonical_rational(oracle, H=2, start="pair")
    calls = []
    # the starts are a table (start= -> route(oracle, d, opts)): replace both routes by spies
    monkeypatch.setitem(multihead._counts.STARTS, "moments", lambda o, d, opts: calls.append(opts.H_plan) or "moments")
    monkeypatch.setitem(multihead._counts.STARTS, "pairs", lambda *a: (_ for _ in ()).throw(RuntimeError("pairs")))
    assert learn_canonical_rational(oracle, H=MOMENT_FROM, start="auto") == "moments"
    with pytest.raises(RuntimeError, match="pairs"):
        learn_canonical_rational(oracle, H=MOMENT_FROM - 1, start="auto")
    assert calls == [MOMENT_FROM]


def test_track_rows_retries_damped_then_continues_with_capped_intermediate_fits(monkeypatch):
    """A row that misfits from the centre after FIRST_ITERS steps is fitted again from it with
    RETRY_DAMPING; if it misfits still, it is tracked over HOMOTOPY_STEPS fits: the intermediate ones
    (data no model fits, which never reach rounding level) capped at STEP_ITERS damped steps and
    stopped at STEP_STALL, the last at 120 steps."""
    import companion.multihead._star as star

    assert (star.FIRST_ITERS, star.RETRY_DAMPING, star.HOMOTOPY_STEPS) == (15, 1e-6, 2)
    assert (star.STEP_ITERS, star.STEP_STALL) == (15, 0.5)
    calls = []
    real = star.fit_rows_joint

    def spy(s, G, X, gamma, R, *, XX=None, iters=60, stall=None, damping=1e-8):
        calls.append((G.shape[0], iters, damping, stall))
        g, Rr, res, sc = real(s, G, X, gamma, R, XX=XX, iters=iters, stall=stall, damping=damping)
        if len(calls) <= 2:  # pretend row 1 misfit from the centre's start, both times
            j = 1 if len(calls) == 1 else 0  # row 1 of the first fit, the only row of the retry
            res = res.copy()
            res[j] = sc[j]
        return g, Rr, res, sc

    monkeypatch.setattr(star, "fit_rows_joint", spy)
    target, P, args = _star_case(5, 2, target_seed=1, rng_seed=2, n_rows=3, centre=np.eye(5)[0])
    gam, R, rel, tracked = star.track_rows(*args, tol=1e-12)
    assert calls == [(3, 15, 1e-8, None), (1, 15, 1e-6, None), (1, 15, 1e-8, 0.5), (1, 120, 1e-8, None)]
    assert tracked == 1 and np.all(rel <= 1e-12)
    np.testing.assert_allclose(R[1], np.einsum("a,hab->hb", P[1], target.Ws), rtol=0, atol=1e-9)


def test_track_rows_retry_alone_learns_a_row_without_continuation(monkeypatch):
    """A row the first fit leaves and the damped retry learns is not tracked (``tracked`` counts
    the continuation's rows only)."""
    import companion.multihead._star as star

    real, calls = star.fit_rows_joint, []

    def spy(s, G, X, gamma, R, **kw):
        calls.append(G.shape[0])
        g, Rr, res, sc = real(s, G, X, gamma, R, **kw)
        if len(calls) == 1:
            res = res.copy()
            res[2] = sc[2]
        return g, Rr, res, sc

    monkeypatch.setattr(star, "fit_rows_joint", spy)
    args = _star_case(5, 2, target_seed=1, rng_seed=2, n_rows=3, centre=np.eye(5)[0])[2]
    gam, R, rel, tracked = star.track_rows(*args, tol=1e-12)
    assert calls == [3, 1] and tracked == 0 and np.all(rel <= 1e-12)


def test_track_rows_skips_the_serial_fits_when_more_rows_misfit_than_max_serial(monkeypatch):
    """The serial fit (MINPACK fallback, minutes per row at H (d + 1) ~ 400 unknowns) is tried on
    the rows still misfitting after the continuation only if there are at most max_serial of them:
    d = 32, H = 12 used to spend more than ten minutes on the serial fits of rows it refused anyway."""
    import companion.multihead._star as star

    real = star.fit_rows_joint

    def always_bad(s, G, X, gamma, R, **kw):  # row 1 of the first call never fits
        g, Rr, res, sc = real(s, G, X, gamma, R, **kw)
        res = res.copy()
        if G.shape[0] == 3:
            res[1] = sc[1]
        else:
            res[:] = sc
        return g, Rr, res, sc

    serial = []
    monkeypatch.setattr(star, "fit_rows_joint", always_bad)
    monkeypatch.setattr(
        star, "fit_row_joint", lambda s, G, X, g, R, **k: serial.append(1) or (g, R, {"residual": np.inf})
    )
    args = _star_case(5, 2, target_seed=1, rng_seed=2, n_rows=3, centre=np.eye(5)[0])[2]
    rel = star.track_rows(*args, tol=1e-12, max_serial=0)[2]
    assert serial == [] and rel[1] == 1.0
    star.track_rows(*args, tol=1e-12, max_serial=1)
    assert serial == [1]
    star.track_rows(*args, tol=1e-12)
    assert serial == [1, 1]


def test_moment_start_refusal_on_a_residual_read_out_names_both_causes():
    """A residual read-out ``x_N^T c`` (no sum of heads) makes the centre's Taylor fit misfit (1.6e-3
    relative at d = 64, H = 12); the refusal names a target outside the class beside too large a
    scale, instead of the scale alone (2026-12-02)."""
    target = random_multi_head(24, 6, seed=0)
    c = np.random.default_rng(0).standard_normal(24) * 0.3

    def residual(X):
        X = np.asarray(X)
        return target(X) + X[:, -1, :] @ c

    with pytest.raises(OracleInconsistentError, match=r"Taylor misfit.*not a\s+sum of softmax heads"):
        learn_canonical_rational(ValueQueryOracle(residual, d=24), H=6, start="moments")
