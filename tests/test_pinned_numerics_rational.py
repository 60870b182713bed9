"""Pinned documented behaviour of ``companion.numerics.rational`` (the one-dimensional fits of learn_canonical).

Formulas (the logistic sum, its Jacobian, the rounding sensitivity ``eps scale / sigma_min(J)``),
the count designs and their bounds, the real-negative pole rule at its edge, and each fit's
documented outputs (exact recovery on exact data, the residual and scale it reports), so a
refactor of the per-pair fits keeps them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion.numerics import rational as rat


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


EPS = float(np.finfo(float).eps)


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_logistic_sum_and_its_jacobian():
    s = np.array([-1.0, 0.0, 0.7])
    c, l = np.array([0.5, -2.0]), np.array([0.3, -1.1])
    ref = np.array([sum(c[h] * sig(si + l[h]) for h in range(2)) for si in s])
    np.testing.assert_allclose(rat.logistic_sum(s, c, l), ref, rtol=1e-14)
    J = rat.logistic_jacobian(s, c, l)
    assert J.shape == (3, 4)
    for k, si in enumerate(s):
        for h in range(2):
            z = sig(si + l[h])
            assert J[k, h] == approx(z, rel=1e-14)
            assert J[k, 2 + h] == approx(c[h] * z * (1 - z), rel=1e-14)


def test_sensitivity_is_eps_scale_over_the_smallest_singular_value():
    J = np.array([[3.0, 0.0], [0.0, 0.5], [0.0, 0.0]])
    assert rat._sensitivity(J, 2.0) == approx(EPS * 2.0 / 0.5, rel=1e-14)
    assert rat._sensitivity(np.zeros((3, 2)), 1.0) == math.inf
    assert rat._sensitivity(np.zeros((3, 0)), 1.0) == math.inf
    s, c, l = np.linspace(-2, 2, 6), np.array([1.0, -0.5]), np.array([0.2, 1.0])
    J = rat.logistic_jacobian(s, c, l)
    assert rat.pair_sensitivity(s, c, l, 3.0) == approx(EPS * 3.0 / np.linalg.svd(J, compute_uv=False)[-1], rel=1e-12)


@pytest.mark.parametrize("n_points, max_len", [(5, 5), (9, 12), (24, 25)])
def test_count_pairs_are_coprime_within_max_len_sorted_and_span_log_max_len_minus_1(n_points, max_len):
    n, m = rat.count_pairs(n_points, max_len)
    assert np.all(n + m <= max_len) and np.all(n >= 1) and np.all(m >= 1)
    assert np.all(np.gcd(n, m) == 1)
    s = np.log(n / m)
    assert np.all(np.diff(s) > 0) and n.size <= n_points
    S = math.log(max_len - 1)
    assert s[0] == approx(-S, rel=1e-14) and s[-1] == approx(S, rel=1e-14)


def test_count_pairs_example():
    n, m = rat.count_pairs(5, 5)
    np.testing.assert_allclose(n / m, [0.25, 0.5, 1.0, 2.0, 4.0], rtol=1e-15)


@pytest.mark.parametrize("H", [1, 2, 3, 5, 12])
def test_ratio_design_has_2H_distinct_ratios_from_1_over_2H_to_2H_with_at_most_2H_plus_1_tokens(H):
    n, m = rat.ratio_design(H)
    assert n.size == m.size == 2 * H
    assert np.all(n >= 1) and np.all(m >= 1) and int((n + m).max()) <= 2 * H + 1
    r = n / m
    assert len(set(r.tolist())) == 2 * H
    assert r.min() == approx(1 / (2 * H), rel=1e-15) and r.max() == approx(2 * H, rel=1e-15)
    assert np.all(np.gcd(n, m) == 1)


def test_negative_real_rule_at_im_equal_1e_6_abs_lam():
    # A fixed point of y = 1e-6 |-1 + i y|: |Im lam| = 1e-6 |lam| holds exactly in float64.
    y = 1e-6
    for _ in range(5):
        y = 1e-6 * abs(complex(-1.0, y))
    lam_edge = complex(-1.0, y)
    assert abs(lam_edge.imag) == 1e-6 * abs(lam_edge)
    lam = np.array(
        [lam_edge, complex(-1.0, y * (1 + 1e-9)), complex(-1.0, y * (1 - 1e-9)), -2.0 + 0j, 0.0 + 0j, 3.0 + 0j]
    )
    assert rat._negative_real(lam).tolist() == [True, False, True, True, False, False]
    lam10 = np.array([complex(-1.0, 5e-6)])  # 5e-6 relative: complex at 1e-6
    assert not rat._negative_real(lam10)[0]


def _pairs_data(P=3, H=2, seed=0):
    rng = np.random.default_rng(seed)
    n, m = rat.ratio_design(H)
    r = n / m
    gamma = rng.uniform(0.5, 2.0, (P, H)) * rng.choice([-1, 1], (P, H))
    l = np.sort(rng.uniform(-1.0, 1.0, (P, H)), axis=1)
    l[:, 1] = l[:, 0] + 0.8  # well separated
    G = np.einsum("psh,ph->ps", sig(np.log(r)[None, :, None] + l[:, None, :]), gamma)
    return r, G, gamma, l


def test_interpolate_pairs_recovers_exact_type_H_H_data_sorted_by_shift():
    r, G, gamma, l = _pairs_data()
    g_hat, l_hat = rat.interpolate_pairs(r, G, 2)
    np.testing.assert_allclose(l_hat, l, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(g_hat, gamma, rtol=1e-7, atol=1e-7)
    assert np.all(np.diff(l_hat, axis=1) > 0)


def test_interpolate_pairs_nan_for_a_positive_pole_and_realised_otherwise():
    n, m = rat.ratio_design(1)
    r = n / m
    G = np.vstack([r / (r + 0.5), r / (r - 4.0)])  # poles -0.5 (a head) and +4 (none)
    g_hat, l_hat = rat.interpolate_pairs(r, G, 1)
    assert l_hat[0, 0] == approx(-math.log(0.5), rel=1e-10)
    assert g_hat[0, 0] == approx(1.0, rel=1e-10)
    assert np.isnan(l_hat[1, 0]) and np.isnan(g_hat[1, 0])
    g_r, l_r = rat.interpolate_pairs(r, G, 1, realise=True)
    assert l_r[1, 0] == approx(-math.log(4.0), rel=1e-10)  # -|Re lam| = -4: p = 4
    assert np.all(np.isfinite(g_r))


def test_polish_pairs_converges_from_a_perturbed_start_and_fixed_gamma_keeps_gamma():
    r, G, gamma, l = _pairs_data(seed=1)
    s = np.log(r)
    g1, l1, res = rat.polish_pairs(s, G, gamma * 1.01, l + 0.01)
    np.testing.assert_allclose(l1, l, atol=1e-8)
    np.testing.assert_allclose(g1, gamma, atol=1e-8)
    Z = sig(s[None, :, None] + l1[:, None, :])
    np.testing.assert_allclose(res, np.max(np.abs(np.einsum("psh,ph->ps", Z, g1) - G), axis=1), rtol=1e-9, atol=4 * EPS)
    g2, l2, _ = rat.polish_pairs(s, G, gamma, l + 0.01, fixed_gamma=True)
    np.testing.assert_array_equal(g2, gamma)
    np.testing.assert_allclose(l2, l, atol=1e-8)


def test_fit_free_finds_the_number_of_terms_and_reports_residual_and_scale():
    s = np.linspace(-3, 3, 11)
    c, l = np.array([1.0, -0.6]), np.array([-0.8, 0.9])
    g = rat.logistic_sum(s, c, l)
    c_hat, l_hat, info = rat.fit_free(s, g)
    np.testing.assert_allclose(l_hat, l, atol=1e-7)
    np.testing.assert_allclose(c_hat, c, atol=1e-7)
    assert info["scale"] == float(np.max(np.abs(g)))
    assert info["residual"] == approx(np.max(np.abs(rat.logistic_sum(s, c_hat, l_hat) - g)), rel=1e-6, abs=1e-15)
    J = rat.logistic_jacobian(s, c_hat, l_hat)
    assert info["sensitivity"] == approx(EPS * info["scale"] / np.linalg.svd(J, compute_uv=False)[-1], rel=1e-6)
    assert np.isnan(rat.fit_free(s, g, sensitivity=False)[2]["sensitivity"])


def test_fit_free_on_zero_data_returns_no_terms_at_zero_residual():
    c, l, info = rat.fit_free(np.linspace(-1, 1, 5), np.zeros(5))
    assert c.size == l.size == 0
    assert info == {"residual": 0.0, "sensitivity": 0.0, "scale": 0.0}


def test_fit_shifts_with_known_amplitudes():
    s = np.linspace(-2, 2, 4)
    c, l = np.array([0.7, 1.2]), np.array([-0.5, 0.4])
    g = rat.logistic_sum(s, c, l)
    l_hat, info = rat.fit_shifts(s, g, c, l + 0.05)
    np.testing.assert_allclose(l_hat, l, atol=1e-9)
    assert info["residual"] == approx(np.max(np.abs(rat.logistic_sum(s, c, l_hat) - g)), rel=1e-6, abs=1e-16)


def _row_data(K=6, d=2, H=2, seed=3):
    rng = np.random.default_rng(seed)
    n, m = rat.ratio_design(H)
    s = np.log(n / m)
    X = rng.standard_normal((K, d))
    c = np.array([1.0, -0.7])[:H]
    R = rng.standard_normal((H, d))
    G = np.einsum("ksh,h->ks", sig(s[None, :, None] + (X @ R.T)[:, None, :]), c)
    return s, G, X, c, R


def test_fit_row_recovers_the_row_and_its_sensitivity_is_eps_scale_over_sigma_min():
    s, G, X, c, R = _row_data()
    c_hat, R_hat, info = rat.fit_row(s, G, X, c * 1.02, R + 0.02)
    np.testing.assert_allclose(c_hat, c, atol=1e-8)
    np.testing.assert_allclose(R_hat, R, atol=1e-8)
    assert info["scale"] == float(np.max(np.abs(G)))
    # the Jacobian in (c, R): columns sigma(.) then c_h sigma'(.) x_k
    Z = sig(s[None, :, None] + (X @ R_hat.T)[:, None, :])
    dZ = c_hat * Z * (1 - Z)
    J = np.concatenate([Z.reshape(-1, 2), (dZ[..., None] * X[:, None, None, :]).reshape(-1, 4)], axis=1)
    smin = np.linalg.svd(J, compute_uv=False)[-1]
    assert info["sensitivity"] == approx(EPS * info["scale"] / smin, rel=1e-6)


@pytest.mark.parametrize("batched", [False, True])
def test_joint_row_fits_recover_the_row_and_report_residual_and_scale(batched):
    s, G, X, c, R = _row_data(seed=4)
    if batched:
        g2, R2, res, scale = rat.fit_rows_joint(s, G[None], X, (c * 1.001)[None], (R + 0.001)[None])
        g2, R2, res, scale = g2[0], R2[0], res[0], scale[0]
    else:
        g2, R2, info = rat.fit_row_joint(s, G, X, c * 1.001, R + 0.001)
        res, scale = info["residual"], info["scale"]
        assert info["iterations"] >= 1
    np.testing.assert_allclose(g2, c, atol=1e-9)
    np.testing.assert_allclose(R2, R, atol=1e-9)
    assert scale == float(np.max(np.abs(G)))
    Z = sig(s[None, :, None] + (X @ R2.T)[:, None, :])
    assert res == approx(float(np.max(np.abs(Z @ g2 - G))), rel=1e-6, abs=1e-16)
    assert res <= 1e3 * EPS * scale


def test_fit_rows_joint_chunks_give_the_same_rows_as_one_batch():
    s, G, X, c, R = _row_data(seed=5)
    Gs = np.stack([G, 0.5 * G, -G])
    cs = np.stack([c, 0.5 * c, -c]) * 1.001
    Rs = np.stack([R, R, R]) + 0.001
    one = rat.fit_rows_joint(s, Gs, X, cs, Rs)
    tiny = rat.fit_rows_joint(s, Gs, X, cs, Rs, max_bytes=1)  # one row per chunk (max(1, .))
    for a, b in zip(one, tiny):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_fit_row_joint_minpack_fallback_runs_between_1e4_floor_and_1e_6_relative():
    s, G, X, c, R = _row_data(seed=6)
    # iters=0: no damped step; a start 1e-9 off misfits between 1e4 (eps scale)^2 |G| and
    # (1e-6 scale)^2 |G|: MINPACK finishes (iterations = its evaluations, > 0).
    g1, R1, info = rat.fit_row_joint(s, G, X, c * (1 + 1e-9), R + 1e-9, iters=0)
    assert info["iterations"] > 0
    assert info["residual"] <= 1e3 * EPS * info["scale"]
    # a start 1e-3 off misfits above (1e-6 scale)^2 |G|: no fallback, the start comes back.
    g2, R2, info2 = rat.fit_row_joint(s, G, X, c * (1 + 1e-3), R + 1e-3, iters=0)
    assert info2["iterations"] == 0
    np.testing.assert_array_equal(R2, R + 1e-3)
    Z = sig(s[None, :, None] + (X @ R2.T)[:, None, :])
    assert info2["residual"] == approx(float(np.max(np.abs(Z @ g2 - G))), rel=1e-9)


def test_fit_free_tries_at_most_K_minus_1_over_2_terms_by_default():
    s = np.linspace(-4, 4, 6)  # K = 6: (K - 1) // 2 = 2, where K // 2 = 3 would fit more
    g = rat.logistic_sum(s, np.array([1.0, -0.8, 0.6]), np.array([-2.0, 0.0, 2.0]))
    c, l, info = rat.fit_free(s, g)
    c2, l2, info2 = rat.fit_free(s, g, max_terms=2)
    c3, _, info3 = rat.fit_free(s, g, max_terms=3)
    np.testing.assert_array_equal(c, c2)
    np.testing.assert_array_equal(l, l2)
    assert info["residual"] == info2["residual"] != info3["residual"]  # the default is the smaller cap
    assert c.size <= 2


def _noisy(G, level, seed):
    return G + level * np.random.default_rng(seed).uniform(-1, 1, G.shape)


def test_fits_report_the_largest_misfit_of_what_they_return_on_noisy_data():
    # Noise of 1e-6 keeps every misfit far above rounding, so the reported residual is a real number.
    s = np.linspace(-3, 3, 11)
    g = _noisy(rat.logistic_sum(s, np.array([1.0, -0.6]), np.array([-0.8, 0.9])), 1e-6, 0)
    c_hat, l_hat, info = rat.fit_free(s, g)
    assert 1e-8 < info["residual"] < 1e-5
    assert info["residual"] == approx(np.max(np.abs(rat.logistic_sum(s, c_hat, l_hat) - g)), rel=1e-6)
    c, l = np.array([0.7, 1.2]), np.array([-0.5, 0.4])
    s4 = np.linspace(-2, 2, 6)
    g4 = _noisy(rat.logistic_sum(s4, c, l), 1e-6, 1)
    l_hat, info = rat.fit_shifts(s4, g4, c, l + 0.05)
    assert 1e-8 < info["residual"] < 1e-5
    assert info["residual"] == approx(np.max(np.abs(rat.logistic_sum(s4, c, l_hat) - g4)), rel=1e-6)
    _, _, gamma, lp = _pairs_data(seed=1)
    sp = np.linspace(-2, 2, 8)  # more samples than the 2 H = 4 unknowns: a real misfit
    Gn = _noisy(np.einsum("psh,ph->ps", sig(sp[None, :, None] + lp[:, None, :]), gamma), 1e-6, 2)
    g1, l1, res = rat.polish_pairs(sp, Gn, gamma * 1.01, lp + 0.01)
    Z = sig(sp[None, :, None] + l1[:, None, :])
    assert np.all(res > 1e-9)
    np.testing.assert_allclose(res, np.max(np.abs(np.einsum("psh,ph->ps", Z, g1) - Gn), axis=1), rtol=1e-6)


@pytest.mark.parametrize("batched", [False, True])
def test_joint_row_fits_report_the_largest_misfit_on_noisy_data(batched):
    s, G, X, c, R = _row_data(seed=4)
    Gn = _noisy(G, 1e-6, 3)
    if batched:
        g2, R2, res, _ = rat.fit_rows_joint(s, Gn[None], X, (c * 1.001)[None], (R + 0.001)[None])
        g2, R2, res = g2[0], R2[0], res[0]
    else:
        g2, R2, info = rat.fit_row_joint(s, Gn, X, c * 1.001, R + 0.001)
        res = info["residual"]
    Z = sig(s[None, :, None] + (X @ R2.T)[:, None, :])
    assert 1e-8 < res < 1e-5
    assert res == approx(float(np.max(np.abs(Z @ g2 - Gn))), rel=1e-6)


def _count_pairs_reference(n_points, max_len):
    fr = sorted(
        {
            (n // math.gcd(n, m), m // math.gcd(n, m))
            for n in range(1, max_len)
            for m in range(1, max_len)
            if n + m <= max_len
        },
        key=lambda p: p[0] / p[1],
    )
    logs = np.log([n / m for n, m in fr])
    S = math.log(max_len - 1)
    idx = sorted({int(np.argmin(np.abs(logs - t))) for t in np.linspace(-S, S, n_points)})
    return np.array([fr[i][0] for i in idx]), np.array([fr[i][1] for i in idx])


@pytest.mark.parametrize("n_points, max_len", [(7, 9), (12, 20), (20, 64), (36, 128)])
def test_count_pairs_picks_the_fraction_nearest_each_even_target_in_log_ratio(n_points, max_len):
    n, m = rat.count_pairs(n_points, max_len)
    n_ref, m_ref = _count_pairs_reference(n_points, max_len)
    np.testing.assert_array_equal(n, n_ref)
    np.testing.assert_array_equal(m, m_ref)


def test_interpolate_pairs_realises_a_complex_pair_as_minus_its_real_part():
    n, m = rat.ratio_design(2)
    r = n / m
    # poles -1 +- i (complex): no head; realised, both poles become -|Re| = -1 (shift 0)
    G = (r * (0.5 * r + 0.3) / ((r + 1.0) ** 2 + 1.0))[None]
    g, l = rat.interpolate_pairs(r, G, 2)
    assert np.all(np.isnan(l)) and np.all(np.isnan(g))
    _, l_r = rat.interpolate_pairs(r, G, 2, realise=True)
    np.testing.assert_allclose(l_r, [[0.0, 0.0]], atol=1e-8)


def test_fit_row_joint_fallback_window_upper_edge_is_1e_6_relative_rms():
    s, G, X, c, R = _row_data(seed=7)
    scale = float(np.max(np.abs(G)))

    def rms(delta):  # the start's root-mean-square misfit relative to the scale
        Z = sig(s[None, :, None] + (X @ (R + delta).T)[:, None, :])
        return float(np.sqrt(np.mean((Z @ c - G) ** 2))) / scale

    deltas = np.geomspace(1e-9, 1e-4, 200)
    inside = next(x for x in deltas if 2e-7 < rms(x) < 6e-7)  # below 1e-6: MINPACK runs
    outside = next(x for x in deltas if 1.5e-6 < rms(x) < 5e-6)  # above: the start comes back
    assert rat.fit_row_joint(s, G, X, c, R + inside, iters=0)[2]["iterations"] > 0
    assert rat.fit_row_joint(s, G, X, c, R + outside, iters=0)[2]["iterations"] == 0


@pytest.mark.parametrize("H", [1, 2, 3, 4])
def test_null_vectors_are_lapack_qr_last_columns_up_to_sign(H):
    """_null_vectors (Householder reflections vectorized over the matrices) gives the last column of
    numpy.linalg.qr(mode="complete")'s Q to 1e-13 up to its sign, a unit vector orthogonal to the
    columns, and e_{H+1} where the columns already span the first H coordinates (no reflection)."""
    rng = np.random.default_rng(H)
    A = rng.standard_normal((50, H + 1, H))
    q = rat._null_vectors(A)
    ref = np.linalg.qr(A, mode="complete")[0][:, :, -1]
    sign = np.sign(np.sum(q * ref, axis=1))[:, None]
    assert np.max(np.abs(q - sign * ref)) <= 1e-13
    assert np.max(np.abs(np.linalg.norm(q, axis=1) - 1.0)) <= 1e-14
    assert np.max(np.abs(np.einsum("pnh,pn->ph", A, q))) <= 1e-14 * np.max(np.abs(A))
    upper = np.triu(rng.standard_normal((H + 1, H)))  # zero below the diagonal: every tau is 0
    assert np.array_equal(rat._null_vectors(upper[None])[0], np.eye(H + 1)[-1])


def test_numerator_roots_are_the_zeros_of_the_barycentric_denominator():
    """_numerator_roots: for H = 1 and 2 the roots of sum_j w_j prod_{i != j} (z - z_i) are where
    q(z) = sum_j w_j / (z - z_j) vanishes (|q| <= 1e-12 sum |w_j / (z - z_j)|), agree with numpy.roots
    of that polynomial to 1e-12, a negative discriminant gives a conjugate pair, and a zero leading
    coefficient (a pole at infinity) gives NaN instead of an infinite root."""
    rng = np.random.default_rng(0)
    for n in (2, 3):
        zs = np.sort(rng.uniform(0.1, 4.0, n))
        zs[0] = 0.0
        w = rng.standard_normal((40, n))
        lam = rat._numerator_roots(zs, w)
        assert lam.shape == (40, n - 1)
        terms = w[:, None, :] / (lam[:, :, None] - zs[None, None, :])
        assert np.max(np.abs(terms.sum(axis=2)) / np.abs(terms).sum(axis=2)) <= 1e-12
        for k in range(5):
            coef = sum(w[k, j] * np.poly(np.delete(zs, j)) for j in range(n))
            assert np.allclose(np.sort_complex(np.roots(coef)), np.sort_complex(lam[k]), rtol=1e-12, atol=1e-12)
    zs = np.array([0.0, 1.0, 2.0])
    # q's numerator z^2 + 2 z + 2: roots -1 +- i (the conjugate pair, not real)
    w = np.array([[1.0, -5.0, 5.0]])  # a = 1, b = -(3 - 10 + 5) = 2, c = 2
    pair = rat._numerator_roots(zs, w)[0]
    assert np.allclose(np.sort_complex(pair), [-1 - 1j, -1 + 1j], atol=1e-14)
    assert not rat._negative_real(pair).any()
    flat = rat._numerator_roots(zs, np.array([[2.0, -3.0, 1.0]]))[0]  # a = 0, N(z) = 4 - z
    assert np.isnan(flat).sum() == 1 and flat[np.isfinite(flat)] == approx([4.0], rel=1e-15)
    assert np.isnan(rat._numerator_roots(zs[:2], np.array([[1.0, -1.0]]))).all()  # H = 1, w_0 + w_1 = 0


def test_interpolate_pairs_misfit_is_the_interpolants_largest_misfit_and_inf_where_nan():
    """interpolate_pairs(misfit=True): the same amplitudes and shifts as without, and the largest
    |sum_h gamma_h sigma(log r + l_h) - G| of each row (recomputed here): rounding where the 2H + 1
    samples (with G(0) = 0) are interpolated, the realised terms' misfit for a complex pair, inf for a
    NaN row."""
    n, m = rat.ratio_design(2)
    r = n / m
    gamma, l = np.array([[0.7, -1.2], [1.0, 0.5]]), np.array([[-1.5, 0.2], [-0.4, 0.9]])
    G = np.einsum("psh,ph->ps", sig(np.log(r)[None, :, None] + l[:, None, :]), gamma)
    G = np.vstack([G, (r / (r + 1 - 0.5j) + r / (r + 1 + 0.5j)).real])  # poles -1 +- 0.5i
    for realise in (False, True):
        g0, l0 = rat.interpolate_pairs(r, G, 2, realise=realise)
        g1, l1, res = rat.interpolate_pairs(r, G, 2, realise=realise, misfit=True)
        assert np.array_equal(g0, g1, equal_nan=True) and np.array_equal(l0, l1, equal_nan=True)
        ok = np.isfinite(l1).all(axis=1)
        ref = np.max(np.abs(np.einsum("psh,ph->ps", sig(np.log(r)[None, :, None] + l1[ok][:, None, :]), g1[ok]) - G[ok]), axis=1)
        assert res[ok] == approx(ref, rel=1e-6, abs=1e-15)
        assert np.max(res[:2]) <= 1e-14
        assert (res[2] == np.inf) if not realise else (res[2] >= 1e-3)
