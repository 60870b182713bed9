"""Pinned formulas, budgets and thresholds of ``companion.lowrank`` (§5), recomputed independently.

Counts and budgets come from the docstrings (``d + m`` for the Gaussian methods, ``d + k (2d - k)``
for the sketch, plus the verification queries); thresholds are tested at equality and on both sides.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion import lowrank
from companion.attention import random_single_head
from companion.errors import BudgetExceededError, InvalidInputError, NotIdentifiableError, OracleInconsistentError
from companion.oracles import ValueQueryOracle


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def _oracle(d, r, seed=0, budget=None):
    return ValueQueryOracle(random_single_head(d, rank=r, seed=seed), budget=budget)


# --- sizes and counts -----------------------------------------------------------------------


@pytest.mark.parametrize("d, r", [(1, 1), (5, 2), (384, 32), (7, 7)])
def test_degrees_of_freedom_is_r_times_2d_minus_r(d, r):
    assert lowrank.degrees_of_freedom(d, r) == r * (2 * d - r) == d * d - (d - r) ** 2


def test_nuclear_program_size_formulas():
    d, m = 7, 33
    size = lowrank.nuclear_program_size(d, m)
    assert size["variables"] == 49 + 7 * 8
    assert size["constraints"] == 33
    assert size["psd_cone"] == 14
    assert size["entries"] == 33 * 49
    assert size["bytes"] == 128 * 33 * 49
    assert lowrank.NUCLEAR_BYTES_PER_ENTRY == 128
    assert lowrank.NUCLEAR_MAX_BYTES == 2 * 2**30


def test_check_nuclear_size_accepts_exactly_2_gib_and_refuses_one_row_more():
    # 128 m d^2 = 2^31 at d = 64, m = 4096.
    assert lowrank.check_nuclear_size(64, 4096, 1, "x")["bytes"] == 2**31
    with pytest.raises(InvalidInputError, match="learn_low_rank"):
        lowrank.check_nuclear_size(64, 4097, 1, "learn_low_rank")


def test_learn_low_rank_nuclear_refuses_a_too_big_program_before_the_first_query(monkeypatch):
    d, r, m = 4, 1, 10
    monkeypatch.setattr(lowrank, "NUCLEAR_MAX_BYTES", 128 * m * d * d - 1)
    oracle = _oracle(d, r)
    with pytest.raises(InvalidInputError):
        lowrank.learn_low_rank(oracle, r, n_measurements=m, verify=0, method="nuclear")
    assert oracle.n_queries == 0
    monkeypatch.setattr(lowrank, "NUCLEAR_MAX_BYTES", 128 * m * d * d)  # exactly at the limit
    oracle = _oracle(d, r, budget=0)
    with pytest.raises(BudgetExceededError):  # past the size check, refused only by the budget
        lowrank.learn_low_rank(oracle, r, n_measurements=m, verify=0, method="nuclear")


def test_default_measurements_are_ceil_5_and_2_times_r_2d_minus_r():
    assert lowrank.DEFAULT_OVERSAMPLING == {"nuclear": 5.0, "rgn": 2.0}
    d, r = 5, 1
    dof = r * (2 * d - r)
    for method, factor in (("nuclear", 5), ("rgn", 2)):
        oracle = _oracle(d, r, seed=1)
        rec = lowrank.learn_low_rank(oracle, r, method=method, verify=0, seed=0)
        assert rec.diagnostics["n_measurements"] == math.ceil(factor * dof)
        assert rec.n_queries == d + math.ceil(factor * dof) + rec.diagnostics["n_requeries"]


@pytest.mark.parametrize("method", ["nuclear", "rgn"])
def test_too_few_measurements_refused_below_r_2d_minus_r_not_at_it(method):
    d, r = 6, 2
    dof = r * (2 * d - r)
    oracle = _oracle(d, r)
    with pytest.raises(NotIdentifiableError):
        lowrank.learn_low_rank(oracle, r, method=method, n_measurements=dof - 1, verify=0)
    assert oracle.n_queries == 0
    oracle = _oracle(d, r, budget=0)
    with pytest.raises(BudgetExceededError):  # m = dof passes the count check
        lowrank.learn_low_rank(oracle, r, method=method, n_measurements=dof, verify=0)


@pytest.mark.parametrize("method", ["nuclear", "rgn"])
def test_gaussian_budget_is_d_plus_m_plus_verify_exactly(method):
    d, r, m, verify = 5, 1, 40, 7
    oracle = _oracle(d, r, budget=d + m + verify - 1)
    with pytest.raises(BudgetExceededError):
        lowrank.learn_low_rank(oracle, r, method=method, n_measurements=m, verify=verify, scale=0.5)
    assert oracle.n_queries == 0
    oracle = _oracle(d, r, budget=d + m + verify)
    rec = lowrank.learn_low_rank(oracle, r, method=method, n_measurements=m, verify=verify, scale=0.5)
    assert rec.n_queries == d + m + verify == oracle.n_queries
    assert rec.n_learning_queries == d + m
    assert rec.diagnostics["n_verify_queries"] == verify
    assert np.linalg.norm(rec.W - oracle.target.W) <= 1e-6 * np.linalg.norm(oracle.target.W)


@pytest.mark.parametrize("r, oversample", [(1, 1), (2, 0), (2, 3), (5, 4)])
def test_sketch_budget_is_d_plus_k_2d_minus_k_with_k_min_d_r_plus_oversample(r, oversample):
    d, verify = 6, 5
    k = min(d, r + oversample)
    need = d + k * (2 * d - k) + verify
    oracle = _oracle(d, r, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        lowrank.learn_low_rank(oracle, r, method="sketch", oversample=oversample, verify=verify, scale=0.5)
    assert oracle.n_queries == 0
    oracle = _oracle(d, r, budget=need)
    rec = lowrank.learn_low_rank(oracle, r, method="sketch", oversample=oversample, verify=verify, scale=0.5)
    assert rec.diagnostics["cross_size"] == k
    assert rec.diagnostics["n_measurements"] == k * (2 * d - k)
    assert rec.n_learning_queries == d + k * (2 * d - k)
    assert rec.rank == r


def test_verification_is_on_by_default_with_32_queries():
    oracle = _oracle(5, 1)
    rec = lowrank.learn_low_rank(oracle, 1, method="sketch", scale=0.5)
    assert rec.diagnostics["n_verify_queries"] == 32


# --- measurements ---------------------------------------------------------------------------


def test_invert_rop_solves_y_equals_c_bv_plus_sigma_t_av():
    y, av, bv, c = np.array([0.6, -0.2]), np.array([1.5, -2.0]), np.array([0.3, 0.1]), 0.5
    t, alpha = lowrank._measure.invert_rop(y, av, bv, c)
    a_ref = (y / c - bv) / av
    np.testing.assert_allclose(alpha, a_ref, rtol=1e-15)
    np.testing.assert_allclose(t, np.log(a_ref / (1 - a_ref)), rtol=1e-13)


def test_measure_bilinear_at_a_fixed_scale_divides_the_logit_by_c_squared():
    head = random_single_head(5, rank=2, seed=4)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    oracle = ValueQueryOracle(head)
    t, info = lowrank.measure_bilinear(oracle, A, B, head.v, scale=0.3)
    exact = np.einsum("kd,de,ke->k", A, head.W, B)
    np.testing.assert_allclose(t, exact, rtol=1e-9)
    np.testing.assert_array_equal(info["scales"], np.full(6, 0.3))
    assert info["max_abs_logit"] == approx(np.max(np.abs(0.09 * exact)), rel=1e-9)
    np.testing.assert_allclose(info["av"], A @ head.v, rtol=1e-15)
    np.testing.assert_allclose(info["bv"], B @ head.v, rtol=1e-15)
    assert info["n_requeries"] == 0 and oracle.n_queries == 6


def test_measure_bilinear_refuses_a_zero_a_transpose_v_before_any_query():
    head = random_single_head(3, seed=0)
    A = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    oracle = ValueQueryOracle(head)
    with pytest.raises(InvalidInputError, match="k=1"):
        lowrank.measure_bilinear(oracle, A, A, head.v)
    assert oracle.n_queries == 0


# --- the sketch's pieces --------------------------------------------------------------------


@pytest.mark.parametrize(
    "s, rank_tol, expected",
    [
        ([1.0, 1e-8], 1e-8, 1),  # exactly rank_tol s_1: zero (strict >)
        ([1.0, 1.01e-8], 1e-8, 2),
        ([2.0, 2e-8], 1e-8, 1),  # relative to s_1
        ([1e-6, 1e-12], 1e-20, 1),  # exactly the absolute floor 1e-12: zero
        ([1e-6, 1.01e-12], 1e-20, 2),
        ([1e-13], 1e-20, 0),
        ([], 1e-8, 0),
    ],
)
def test_numerical_rank_counts_singular_values_strictly_above_max_rank_tol_s1_and_1e_12(s, rank_tol, expected):
    assert lowrank._sketch._NOISE_FLOOR == 1e-12
    assert lowrank._sketch._numerical_rank(np.array(s), rank_tol) == expected


def test_nystrom_factors_reproduce_a_rank_r_matrix_from_its_cross():
    rng = np.random.default_rng(3)
    d, r, k = 8, 2, 3
    M = rng.standard_normal((d, r)) @ rng.standard_normal((r, d))
    F, G, s, rho = lowrank._sketch._nystrom_factors(M[:, :k], M[:k, :], k, None, 1e-10)
    assert rho == r
    np.testing.assert_allclose(s, np.linalg.svd(M[:k, :k], compute_uv=False), rtol=1e-12)
    np.testing.assert_allclose(F @ G, M, rtol=1e-9, atol=1e-10)
    F1, G1, _, rho1 = lowrank._sketch._nystrom_factors(M[:, :k], M[:k, :], k, 1, 1e-10)
    assert rho1 == 1 and F1.shape == (d, 1) and G1.shape == (1, d)
    # rank 1 of the core's pseudo-inverse: M_cols V_1 s_1^-1 U_1^T M_rows.
    Uc, sc, Vct = np.linalg.svd(M[:k, :k])
    ref = M[:, :k] @ np.outer(Vct[0] / sc[0], Uc[:, 0]) @ M[:k, :]
    np.testing.assert_allclose(F1 @ G1, ref, rtol=1e-10, atol=1e-12)


def test_sketch_bases_are_orthogonal_with_every_l_transpose_v_equal_to_norm_v_over_sqrt_d():
    v = np.array([3.0, -1.0, 0.5, 2.0, 0.0])
    L, RT = lowrank._sketch._sketch_bases(v, np.random.default_rng(7))
    np.testing.assert_allclose(L @ L.T, np.eye(5), atol=1e-13)
    np.testing.assert_allclose(L @ v, np.full(5, np.linalg.norm(v) / np.sqrt(5)), rtol=1e-12)
    assert sorted(map(tuple, RT)) == sorted(map(tuple, L))  # the rows of L, permuted


def test_haar_is_q_of_qr_with_the_sign_of_diag_r():
    G = np.random.default_rng(9).standard_normal((4, 4))
    Q, R = np.linalg.qr(G)
    np.testing.assert_allclose(lowrank._sketch._haar(4, np.random.default_rng(9)), Q * np.sign(np.diag(R)), rtol=1e-14)


def test_cross_indices_cover_the_first_rows_and_columns_exactly_once():
    d, k0, k1 = 7, 1, 3
    want = {(i, j) for i in range(d) for j in range(d) if (k0 <= i < k1 or k0 <= j < k1) and i >= k0 and j >= k0}
    for n in (None, 2, 5):
        i, j, _ = lowrank._sketch._cross_indices(d, k0, k1, n)
        got = list(zip(i.tolist(), j.tolist()))
        assert len(got) == len(set(got)) == len(want)
        assert set(got) == want


def test_sign_normalised_svd_top_r_with_largest_entry_of_each_left_vector_positive():
    rng = np.random.default_rng(2)
    F, G = rng.standard_normal((6, 2)), rng.standard_normal((2, 6))
    W = F @ G
    for factors in (None, (F, G)):
        U, s, Vt, sv = lowrank._learn._sign_normalised_svd(W, 2, factors=factors)
        np.testing.assert_allclose((U * s) @ Vt, W, rtol=1e-11, atol=1e-12)
        assert np.all(U[np.argmax(np.abs(U), axis=0), [0, 1]] > 0)
        ref = np.linalg.svd(W, compute_uv=False)
        assert sv.shape == (3,)
        np.testing.assert_allclose(sv[:2], ref[:2], rtol=1e-12)
        assert sv[2] == approx(0.0, abs=1e-12)


# --- nuclear rank check -------------------------------------------------------------------


@pytest.mark.parametrize(
    "s2, rank_tol, verify_tol, refused",
    [
        (1e-6, 1e-8, 1e-6, False),  # exactly max(rank_tol, verify_tolerance) s_1: passes
        (1.01e-6, 1e-8, 1e-6, True),
        (1e-4, 1e-4, 1e-6, False),  # rank_tol the larger: it sets the level
        (1.01e-4, 1e-4, 1e-6, True),
        (2e-6, 1e-8, 1e-6, True),
    ],
)
def test_nuclear_rank_check_refuses_above_max_rank_tol_verify_tolerance(s2, rank_tol, verify_tol, refused):
    sv = np.array([2.0, 2.0 * s2])
    checked = {"verify_tolerance": verify_tol, "n_verify_queries": 32}
    if refused:
        with pytest.raises(OracleInconsistentError):
            lowrank._learn._check_nuclear_rank(sv, 1, 4, 40, rank_tol, checked)
    else:
        assert lowrank._learn._check_nuclear_rank(sv, 1, 4, 40, rank_tol, checked) is None


def test_nuclear_rank_check_skips_when_no_r_plus_1_th_value_or_W_zero():
    checked = {"verify_tolerance": 1e-6, "n_verify_queries": 32}
    assert lowrank._learn._check_nuclear_rank(np.array([1.0]), 1, 1, 10, 1e-8, checked) is None
    assert lowrank._learn._check_nuclear_rank(np.array([0.0, 0.0]), 1, 2, 10, 1e-8, checked) is None


# --- the phase transition's helpers ---------------------------------------------------------


def test_transition_point_interpolates_linearly_and_counts_equality_as_reached():
    assert lowrank.transition_point([1.0, 2.0, 3.0], [0.0, 0.2, 0.8]) == approx(2.5, rel=1e-15)
    assert lowrank.transition_point([1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 0.5, 1.0]) == 2.0  # rate == level hits
    assert lowrank.transition_point([1.0, 2.0], [0.6, 1.0]) == 1.0
    assert lowrank.transition_point([1.0, 2.0], [0.6, 1.0], level=0.8) == approx(1.5, rel=1e-15)
    assert math.isnan(lowrank.transition_point([1.0, 2.0], [0.1, 0.4]))
    with pytest.raises(InvalidInputError):
        lowrank.transition_point([1.0, 1.0], [0.0, 1.0])  # not strictly increasing


def test_recovery_trial_m_is_ceil_ratio_dof_and_exact_is_error_at_most_threshold():
    d, r, ratio = 5, 1, 3.3
    row = lowrank.recovery_trial(d, r, ratio, method="rgn", seed=2)
    assert row["m"] == math.ceil(ratio * r * (2 * d - r))
    assert row["n_queries"] == d + row["m"]  # verify=0, no saturated re-measurement at these sizes
    err = row["rel_error_W"]
    assert row["exact"] == (err <= 1e-6)
    assert lowrank.recovery_trial(d, r, ratio, method="rgn", seed=2, threshold=err)["exact"] is True
    below = float(np.nextafter(err, 0.0))
    assert lowrank.recovery_trial(d, r, ratio, method="rgn", seed=2, threshold=below)["exact"] is False


def test_rgn_failure_threshold_has_the_absolute_floor_1e_8(monkeypatch):
    # tol = 1e-13: max(1e3 tol, 1e-8) = 1e-8; a final residual exactly 1e-8 is accepted, above refused.
    from companion.errors import SolverError

    real = lowrank._learn.solve_rgn

    def fake(res):
        def run(A, B, t, r, **kw):
            W, info = real(A, B, t, r, **kw)
            return W, dict(info, residual=res)

        return run

    d, r = 5, 1
    monkeypatch.setattr(lowrank._learn, "solve_rgn", fake(1e-8))
    lowrank.learn_low_rank(_oracle(d, r), r, method="rgn", verify=0)
    monkeypatch.setattr(lowrank._learn, "solve_rgn", fake(1.01e-8))
    with pytest.raises(SolverError):
        lowrank.learn_low_rank(_oracle(d, r), r, method="rgn", verify=0)


# --- the sketch's rank detection and its rank_tol diagnosis ------------------------------------


def _two_scale_head(s2, d=5, seed=0):
    from companion.attention import SingleHead

    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    V, _ = np.linalg.qr(rng.standard_normal((d, 2)))
    return SingleHead((U * [1.0, s2]) @ V.T, rng.standard_normal(d))


def test_sketch_detection_grows_the_cross_to_rank_plus_1_and_spends_k_2d_minus_k():
    d = 5
    rec = lowrank.learn_low_rank(ValueQueryOracle(_two_scale_head(1e-3, d)), None, method="sketch")
    g = rec.diagnostics
    assert rec.rank == g["rank_detected"] == 2 and g["rank_used"] == 2
    k = g["cross_size"]
    assert k == 3  # the first k with fewer than k nonzero singular values
    assert g["n_measurements"] == k * (2 * d - k)
    assert g["rank_tol_used"] == 1e-8  # float64 answers: rank_tol itself
    assert rec.n_learning_queries == d + k * (2 * d - k)


def test_sketch_refusal_names_rank_tol_when_it_cut_real_singular_values():
    import re

    with pytest.raises(OracleInconsistentError) as exc:
        lowrank.learn_low_rank(ValueQueryOracle(_two_scale_head(1e-3)), None, method="sketch", rank_tol=1e-2)
    msg = str(exc.value)
    assert "rank_tol=0.01 counted 1 singular value(s) of the 2 x 2 core as zero" in msg
    assert "returned at rank 1" in msg
    shown = float(re.search(r"relative ([0-9.e-]+), all above", msg).group(1))
    assert 1e-8 < shown <= 1e-2  # cut: above the rounding floor, at most rank_tol
    assert f"Lower rank_tol below {shown:.3g}" in msg


def test_sketch_refusal_at_rank_tol_1_says_every_singular_value_was_cut():
    with pytest.raises(OracleInconsistentError) as exc:
        lowrank.learn_low_rank(ValueQueryOracle(_two_scale_head(1e-3)), None, method="sketch", rank_tol=1.0)
    msg = str(exc.value)
    assert "counted every singular value of the 1 x 1 core as zero" in msg
    assert "none exceeds the largest" in msg and "returned at rank 0" in msg


def test_sketch_with_a_given_rank_refuses_a_nonzero_r_plus_1_th_core_value_only_when_k_exceeds_r():
    head = _two_scale_head(1e-3)  # rank 2
    with pytest.raises(OracleInconsistentError, match="singular value 2 of the 2 x 2 core is nonzero"):
        lowrank.learn_low_rank(ValueQueryOracle(head), 1, method="sketch", oversample=1)
    # oversample = 0: k = r, no core check; the verification refuses instead
    with pytest.raises(OracleInconsistentError, match="verification failed"):
        lowrank.learn_low_rank(ValueQueryOracle(head), 1, method="sketch", oversample=0)


def test_nuclear_rank_message_says_determined_from_m_equal_d_squared():
    checked = {"verify_tolerance": 1e-6, "n_verify_queries": 32}
    sv = np.array([1.0, 0.5])
    with pytest.raises(OracleInconsistentError) as at:
        lowrank._learn._check_nuclear_rank(sv, 1, 4, 16, 1e-8, checked)
    with pytest.raises(OracleInconsistentError) as below:
        lowrank._learn._check_nuclear_rank(sv, 1, 4, 15, 1e-8, checked)
    assert "one feasible point" in str(at.value) and "one feasible point" not in str(below.value)


def test_learn_low_rank_documented_defaults():
    import inspect

    p = inspect.signature(lowrank.learn_low_rank).parameters
    documented = {
        "method": "auto",
        "oversample": 1,
        "rank_tol": 1e-8,
        "scale": "auto",
        "solver_eps": 1e-9,
        "max_iter": 50,
        "tol": 1e-13,
        "verify": 32,
        "verify_rtol": 1e-6,
        "seed": 0,
    }
    assert {k: p[k].default for k in documented} == documented


@pytest.mark.parametrize("d, r", [(3, 1), (3, 3)])
def test_too_few_message_names_the_sketch_count_with_k_min_d_r_plus_1(d, r):
    k = min(d, r + 1)
    with pytest.raises(NotIdentifiableError, match=rf"method='sketch' \({d + k * (2 * d - k)} queries\)"):
        lowrank.learn_low_rank(_oracle(d, r), r, method="rgn", n_measurements=r * (2 * d - r) - 1)


def test_phase_transition_rates_are_means_over_seedsequence_seeded_trials():
    cases, ratios, n_trials, seed = [(5, 1)], [1.0, 2.2], 3, 4
    rates = lowrank.phase_transition(cases, ratios, method="rgn", n_trials=n_trials, seed=seed)
    for d, r in cases:
        ref = []
        for i, q in enumerate(ratios):
            hits = []
            for t in range(n_trials):
                s = int(np.random.SeedSequence([seed, d, r, i, t]).generate_state(1)[0])
                hits.append(lowrank.recovery_trial(d, r, q, method="rgn", seed=s)["exact"])
            ref.append(float(np.mean(hits)))
        assert list(rates[(d, r)]) == ref


def test_measure_bilinear_with_rows_and_cols_measures_l_i_transpose_W_r_j():
    head = random_single_head(4, rank=2, seed=6)
    rng = np.random.default_rng(2)
    L, RT = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    rows, cols = np.array([0, 3, 1, 1]), np.array([2, 0, 1, 3])
    oracle = ValueQueryOracle(head)
    t, info = lowrank.measure_bilinear(oracle, L, RT, head.v, scale=0.5, rows=rows, cols=cols)
    np.testing.assert_allclose(t, [L[i] @ head.W @ RT[j] for i, j in zip(rows, cols)], rtol=1e-9)
    assert oracle.n_queries == 4
