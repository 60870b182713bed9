"""Pinned formulas, budgets and thresholds of ``companion.multihead`` (§7 and this book's learners).

Equivalence constructions and the canonical form's tolerances (relative to ``max(1, ||W||_F)`` and
to the largest ``||v||``), the comparison's ``10 atol``, the verification's disagreement formula,
every learner's up-front budget (exact, and one query short refused before the first query), the
follow-up's count and the counts route's plan, recomputed from the docstrings.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion import multihead as mh
from companion.attention import MultiHead
from companion.errors import BudgetExceededError, InvalidInputError, OracleInconsistentError
from companion.oracles import ValueQueryOracle


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def _model(Ws, vs):
    return MultiHead(np.asarray(Ws, float), np.asarray(vs, float))


# --- constructions --------------------------------------------------------------------------------


def test_proposition_7_1_repeats_A_and_scales_b_by_each_weight():
    A, b = np.arange(9.0).reshape(3, 3), np.array([1.0, -2.0, 0.5])
    m = mh.proposition_7_1(A, b, [0.2, 0.3, 0.5])
    assert m.n_heads == 3
    for h, w in enumerate([0.2, 0.3, 0.5]):
        np.testing.assert_array_equal(m.Ws[h], A)
        np.testing.assert_allclose(m.vs[h], w * b, rtol=1e-15)


def test_weights_sum_tolerance_is_1e_12_times_max_1_and_sum_abs():
    A, b = np.eye(2), np.ones(2)
    # sum |w| = 9 + 9e-12: the tolerance is 9e-12 (not 1e-12)
    mh.proposition_7_1(A, b, [5.0, -4.0 + 8e-12])
    with pytest.raises(InvalidInputError):
        mh.proposition_7_1(A, b, [5.0, -4.0 + 1.1e-11])
    with pytest.raises(InvalidInputError):
        mh.proposition_7_1(A, b, [])


def test_split_head_puts_the_new_heads_last_and_add_cancelling_heads_appends():
    m = _model([np.eye(2), 2 * np.eye(2)], [[1.0, 0.0], [0.0, 1.0]])
    s = mh.split_head(m, 0, [0.25, 0.75])
    np.testing.assert_array_equal(s.Ws[0], 2 * np.eye(2))
    np.testing.assert_allclose(s.vs[1:], [[0.25, 0.0], [0.75, 0.0]], rtol=1e-15)
    with pytest.raises(InvalidInputError):
        mh.split_head(m, 2, [1.0])
    c = mh.add_cancelling_heads(m, np.ones((2, 2)), [[1.0, 2.0], [-1.0, -2.0]])
    assert c.n_heads == 4
    np.testing.assert_array_equal(c.Ws[2], np.ones((2, 2)))


def test_cancelling_sum_tolerance_is_1e_12_times_max_1_and_sum_abs():
    m = _model([np.eye(2)], [[1.0, 0.0]])
    big = 1e3  # sum |vs| = 4e3: tolerance 4e-9
    mh.add_cancelling_heads(m, np.eye(2), [[big, big], [-big + 3e-9, -big]])
    with pytest.raises(InvalidInputError):
        mh.add_cancelling_heads(m, np.eye(2), [[big, big], [-big + 5e-9, -big]])


def test_permute_heads_takes_head_perm_k():
    m = _model([np.eye(2), 2 * np.eye(2), 3 * np.eye(2)], np.eye(3)[:, :2] + 1)
    p = mh.permute_heads(m, [2, 0, 1])
    np.testing.assert_array_equal(p.Ws[0], m.Ws[2])
    np.testing.assert_array_equal(p.vs[1], m.vs[0])
    with pytest.raises(InvalidInputError):
        mh.permute_heads(m, [0, 0, 1])


# --- canonical form and comparison --------------------------------------------------------------


@pytest.mark.parametrize("gap, merged", [(0.5e-7, True), (1.5e-7, False)])
def test_canonical_form_merges_W_within_atol_times_norm_of_the_first_W(gap, merged):
    # ||W_0||_F = 100: the merge tolerance is 1e-9 * 100 = 1e-7 (relative, not absolute 1e-9).
    W0 = np.diag([100.0, 0.0])
    W1 = W0 + np.diag([0.0, gap])
    c = mh.canonical_form(_model([W0, W1], [[1.0, 0.0], [0.5, 1.0]]))
    assert c.n_heads == (1 if merged else 2)
    if merged:
        np.testing.assert_allclose(c.Ws[0], (W0 + W1) / 2, rtol=1e-15)  # the mean of the group's W
        np.testing.assert_allclose(c.vs[0], [1.5, 1.0], rtol=1e-15)  # the sum of its v


def test_canonical_form_merge_tolerance_is_absolute_below_norm_1():
    W0 = np.diag([0.01, 0.0])
    for gap, n in [(0.9e-9, 1), (1.1e-9, 2)]:
        c = mh.canonical_form(_model([W0, W0 + np.diag([0.0, gap])], [[1.0, 0.0], [0.0, 1.0]]))
        assert c.n_heads == n


@pytest.mark.parametrize("size, kept", [(0.9e-6, False), (1.1e-6, True)])
def test_canonical_form_drops_v_at_most_atol_times_the_largest_v(size, kept):
    # largest ||v|| = 1000: a merged v is dropped when ||v|| <= 1e-9 * 1000 = 1e-6
    m = _model([np.eye(2), 2 * np.eye(2)], [[1000.0, 0.0], [0.0, size]])
    assert mh.canonical_form(m).n_heads == (2 if kept else 1)


def test_canonical_form_drops_v_exactly_at_atol_times_the_largest_v():
    size = 1e-9 * 1000.0
    m = _model([np.eye(2), 2 * np.eye(2)], [[1000.0, 0.0], [0.0, size]])
    assert mh.canonical_form(m).n_heads == 1  # ||v|| = atol * max ||v^(h)||: dropped (<=)


def test_canonical_form_drop_level_is_atol_times_max_1_and_the_largest_v():
    # largest ||v|| = 0.1 < 1: the level is atol * 1 = 1e-9, not 1e-10
    m = _model([np.eye(2), 2 * np.eye(2)], [[0.1, 0.0], [0.0, 5e-10]])
    assert mh.canonical_form(m).n_heads == 1
    m = _model([np.eye(2), 2 * np.eye(2)], [[0.1, 0.0], [0.0, 2e-9]])
    assert mh.canonical_form(m).n_heads == 2


def test_cancelling_sum_tolerance_has_the_floor_1e_12_for_small_values():
    m = _model([np.eye(2)], [[1.0, 0.0]])
    # sum |vs| = 2e-3 < 1: the tolerance is 1e-12 (max(1, .)), so a 5e-13 remainder is accepted
    mh.add_cancelling_heads(m, np.eye(2), [[1e-3, 0.0], [-1e-3 + 5e-13, 0.0]])
    with pytest.raises(InvalidInputError):
        mh.add_cancelling_heads(m, np.eye(2), [[1e-3, 0.0], [-1e-3 + 2e-12, 0.0]])


def test_match_terms_takes_a_term_within_match_tol_and_a_third_of_the_gap():
    gamma0 = np.array([1.0, 1.0024])  # gap 0.0024: a third is 0.0008; _MATCH_TOL * top = 1.0024e-3
    for off, used in [(0.0007, True), (0.0009, False)]:
        gam = np.array([[1.0 + off, 1.0024]])
        use, L = mh._pairstart.match_terms(gam, np.array([[0.3, 0.7]]), np.array([True]), gamma0)
        assert use.tolist() == [[used, True]]
        assert L[0, 1] == 0.7 and L[0, 0] == (0.3 if used else 0.0)
    gamma0 = np.array([1.0, 2.0])  # far apart: _MATCH_TOL = 1e-3 of the largest (2e-3) binds
    for off, used in [(1.9e-3, True), (2.1e-3, False)]:
        use, _ = mh._pairstart.match_terms(np.array([[1.0 + off, 2.0]]), np.zeros((1, 2)), np.array([True]), gamma0)
        assert use[0, 0] == used
    use, _ = mh._pairstart.match_terms(np.array([[1.0, 2.0]]), np.zeros((1, 2)), np.array([False]), gamma0)
    assert not use.any()  # a pair whose fit misfits is not used


def test_canonical_form_of_cancelling_heads_is_the_zero_head_and_heads_are_sorted():
    z = mh.canonical_form(_model([np.eye(2), np.eye(2)], [[1.0, 2.0], [-1.0, -2.0]]))
    assert z.n_heads == 1
    np.testing.assert_array_equal(z.Ws, np.zeros((1, 2, 2)))
    np.testing.assert_array_equal(z.vs, np.zeros((1, 2)))
    c = mh.canonical_form(_model([np.eye(2) * 3, np.eye(2) * -1, np.eye(2)], np.ones((3, 2))))
    assert [float(W[0, 0]) for W in c.Ws] == [-1.0, 1.0, 3.0]


def test_match_heads_errors_are_relative_frobenius_and_l2():
    ref = _model([np.eye(2), 2 * np.eye(2)], [[1.0, 0.0], [0.0, 2.0]])
    est = _model([2 * np.eye(2) + 0.02, np.eye(2) * 1.01, 5 * np.eye(2)], [[0.0, 2.2], [1.0, 0.01], [1.0, 1.0]])
    out = mh.match_heads(ref, est)
    assert out["pairs"] == [(0, 1), (1, 0)]
    assert out["W_errors"][0] == approx(np.linalg.norm(0.01 * np.eye(2)) / np.linalg.norm(np.eye(2)), rel=1e-12)
    assert out["W_errors"][1] == approx(
        np.linalg.norm(np.full((2, 2), 0.02)) / np.linalg.norm(2 * np.eye(2)), rel=1e-12
    )
    assert out["v_errors"][0] == approx(0.01, rel=1e-12)
    assert out["v_errors"][1] == approx(0.2 / 2.0, rel=1e-12)
    assert out["max_W_error"] == max(out["W_errors"]) and out["max_v_error"] == max(out["v_errors"])
    assert out["unmatched_reference"] == [] and out["unmatched_estimate"] == [2]


def test_match_heads_error_is_absolute_against_a_zero_reference():
    out = mh.match_heads(_model([np.zeros((2, 2))], [[0.0, 0.0]]), _model([np.full((2, 2), 0.5)], [[0.3, 0.4]]))
    assert out["W_errors"][0] == approx(1.0, rel=1e-14)
    assert out["v_errors"][0] == approx(0.5, rel=1e-14)


@pytest.mark.parametrize("rel, same", [(0.9e-8, True), (1.1e-8, False)])
def test_equivalent_accepts_match_errors_up_to_10_atol(rel, same):
    W = np.diag([1.0, 0.0])  # ||W||_F = 1: absolute = relative
    a = _model([W], [[1.0, 0.0]])
    b = _model([W + np.diag([0.0, rel])], [[1.0, 0.0]])
    assert mh.equivalent(a, b) is same


def test_random_multi_head_orthogonal_heads_live_in_orthogonal_blocks():
    m = mh.random_multi_head(6, 3, orthogonal=True, head_dim=2, seed=0)
    for i in range(3):
        for j in range(3):
            if i != j:
                np.testing.assert_allclose(m.Ws[i] @ m.Ws[j], 0, atol=1e-12)
                np.testing.assert_allclose(m.Ws[i] @ m.vs[j], 0, atol=1e-12)
                assert abs(m.vs[i] @ m.vs[j]) < 1e-12
        assert np.linalg.matrix_rank(m.Ws[i]) == 2
    with pytest.raises(InvalidInputError):
        mh.random_multi_head(6, 3, orthogonal=True, head_dim=3, seed=0)  # 3 * 3 > 6
    assert mh.random_multi_head(7, 3, seed=0).Ws.shape == (3, 7, 7)
    assert np.linalg.matrix_rank(mh.random_multi_head(7, 3, seed=0).Ws[0]) == 7 // 3  # head_dim = d // H


# --- verification -----------------------------------------------------------------------------


def _disagreement(target, model, d, n, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=n)  # lengths 1 .. 8, tokens N(0, I_d / d)
    X = [rng.standard_normal((int(k), d)) / math.sqrt(d) for k in lengths]
    worst = 0.0
    for x in X:
        scale = max(1e-12, float(np.max(np.abs(x @ model.vs.T).sum(axis=1))))
        worst = max(worst, abs(float(target(x[None])[0]) - float(model(x[None])[0])) / scale)
    return worst


def test_verify_model_disagreement_formula_and_its_rtol_at_equality():
    target = mh.random_multi_head(4, 2, seed=0)
    model = _model(target.Ws, target.vs * np.array([[1.0], [1.0 + 1e-4]]))
    err = mh.verify_model(ValueQueryOracle(target), model, 12, rtol=1.0, seed=3)
    assert err == approx(_disagreement(target, model, 4, 12, 3), rel=1e-9)
    assert mh.verify_model(ValueQueryOracle(target), model, 12, rtol=err, seed=3) == err
    with pytest.raises(OracleInconsistentError):
        mh.verify_model(ValueQueryOracle(target), model, 12, rtol=float(np.nextafter(err, 0)), seed=3)


def test_detect_multi_head_budget_is_d_plus_d2_plus_verify_before_any_query():
    d, verify = 4, 10
    oracle = ValueQueryOracle(mh.random_multi_head(d, 2, seed=0), budget=d + d * d + verify - 1)
    with pytest.raises(BudgetExceededError):
        mh.detect_multi_head(oracle, verify=verify)
    assert oracle.n_queries == 0
    from companion.attention import random_single_head

    oracle = ValueQueryOracle(random_single_head(d, seed=0), budget=d + d * d + verify)
    det = mh.detect_multi_head(oracle, verify=verify)
    assert det.single_head and det.n_queries == oracle.n_queries <= d + d * d + verify


# --- learn_orthogonal_heads ---------------------------------------------------------------------


def test_hessian_queries_are_w_plus_t_x0_then_t_x0_at_t_s_and_2s():
    d, s = 3, 1e-3
    x0 = np.array([0.6, 0.0, 0.8])
    Wdir, iu, X = mh._orthogonal._hessian_queries(d, x0, s)
    n = d * (d + 1) // 2
    assert X.shape == (2 * n, 2, d) and Wdir.shape == (n, d)
    for k, (i, j) in enumerate(zip(*iu)):
        w = np.zeros(d)
        w[i] += 1.0
        if i != j:
            w[j] += 1.0  # e_i + e_j off the diagonal, e_i on it
        np.testing.assert_array_equal(Wdir[k], w)
        np.testing.assert_allclose(X[k], [w + s * x0, s * x0], rtol=1e-15)
        np.testing.assert_allclose(X[n + k], [w + 2 * s * x0, 2 * s * x0], rtol=1e-15)


def test_learn_orthogonal_heads_budget_and_counts():
    d, verify = 6, 5
    target = mh.random_multi_head(d, 2, orthogonal=True, seed=0)
    need = d + d * (d + 1) + d * d + verify
    oracle = ValueQueryOracle(target, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        mh.learn_orthogonal_heads(oracle, verify=verify)
    assert oracle.n_queries == 0
    rec = mh.learn_orthogonal_heads(ValueQueryOracle(target, budget=need), verify=verify)
    dims = rec.diagnostics["head_dims"]
    assert sorted(dims) == [3, 3]
    # d length-1, d (d + 1) Hessian queries, d per probe (one probe per dimension of each head)
    assert rec.n_learning_queries == d + d * (d + 1) + d * sum(dims) + rec.diagnostics["n_requeries"]
    assert rec.diagnostics["n_verify_queries"] == verify
    assert mh.equivalent(rec.model, target, atol=1e-6)
    lam = rec.diagnostics["hessian_eigenvalues"]
    assert np.all(np.diff(np.abs(lam)) <= 0)  # sorted by |lambda|, largest first


# --- the follow-up's count and the counts route ---------------------------------------------------


@pytest.mark.parametrize("d, H", [(1, 1), (6, 2), (64, 12)])
def test_follow_up_count_is_4_H_d2_minus_2_H_plus_1(d, H):
    assert mh.follow_up_count(d, H) == 4 * H * d * d - 2 * H + 1


def _plan_ref(d, H, spare=2):
    budget = 4 * H * d * d - 2 * H + 1
    S = 2 * H
    n_link = 0 if H == 1 else H * H // S + 1
    K = ((budget - d) // S - (d - 1) * n_link) // (d + spare)
    return budget, S, n_link, K


@pytest.mark.parametrize("d, H", [(6, 2), (8, 3), (16, 6), (64, 12), (5, 1)])
def test_rational_plan_formulas(d, H):
    budget, S, n_link, K = _plan_ref(d, H)
    p = mh.rational_plan(d, H)
    assert (p["budget"], p["S"], p["n_link"], p["K"], p["spare_rows"]) == (budget, S, n_link, K, 2)
    assert p["n_pairs"] == (d + 2) * K + (d - 1) * n_link
    assert p["n_queries"] == d + S * p["n_pairs"] <= budget


def test_rational_plan_refuses_fewer_than_d_plus_1_tokens_per_row_only():
    edge = below = None
    for d in range(1, 40):
        for H in range(1, 40):
            K = _plan_ref(d, H)[3]
            if K == d + 1 and edge is None:
                edge = (d, H)
            if K == d and below is None:
                below = (d, H)
    assert edge is not None and below is not None
    assert mh.rational_plan(*edge)["K"] == edge[0] + 1
    with pytest.raises(InvalidInputError):
        mh.rational_plan(*below)


def test_learn_canonical_rational_budget_is_the_plan_plus_verify_and_outputs_follow_the_docs():
    d, H, verify = 6, 2, 7
    target = mh.random_multi_head(d, H, seed=0)
    need = mh.rational_plan(d, H)["n_queries"] + verify
    oracle = ValueQueryOracle(target, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        mh.learn_canonical_rational(oracle, H=H, verify=verify)
    assert oracle.n_queries == 0
    rec = mh.learn_canonical_rational(ValueQueryOracle(target, budget=need), H=H, verify=verify)
    g = rec.diagnostics
    assert rec.n_learning_queries <= 4 * H * d * d - 2 * H + 1
    assert g["kim_count"] == 4 * H * d * d - 2 * H + 1
    assert g["max_len"] == 2 * H + 1
    assert g["n_verify_queries"] == verify and g["n_heads"] == H
    assert mh.equivalent(rec.model, target, atol=1e-8)
    with pytest.raises(InvalidInputError):
        mh.learn_canonical_rational(ValueQueryOracle(target), H=2, H_bound=3)
    with pytest.raises(InvalidInputError):
        mh.learn_canonical_rational(ValueQueryOracle(target))


def test_learn_canonical_budget_formula_and_diagnostics():
    d, H, verify = 4, 2, 6
    n_points = 4 * H + 4
    from companion.numerics.rational import count_pairs

    n, m = count_pairs(n_points, 128)
    n_x = math.ceil(2.0 * d)
    n_link = max(3, math.ceil(2 * H * H / n_points))
    need = d + d * n_x * n.size + (d - 1) * n_link * n.size + verify
    target = mh.random_multi_head(d, H, seed=0)
    oracle = ValueQueryOracle(target, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        mh.learn_canonical(oracle, H=H, verify=verify)
    assert oracle.n_queries == 0
    oracle = ValueQueryOracle(target)
    rec = mh.learn_canonical(oracle, H=H, verify=verify)
    g = rec.diagnostics
    assert g["kim_count"] == 4 * H * d * d - 2 * H + 1
    assert g["n_points"] == n.size and g["max_len"] == int(np.max(n + m)) <= 128
    assert g["n_learn_queries"] == rec.n_queries - verify == rec.n_learning_queries
    assert g["n_tokens"] >= n_x
    # learning queries: d length-1, n_points per (row, token), n_points per link token of d - 1 rows
    assert g["n_redrawn_rows"] == 0 and g["n_tokens"] == n_x  # this draw: no row redrawn, no token added
    assert g["n_learn_queries"] == d + n.size * (d * n_x + (d - 1) * n_link)
    assert mh.equivalent(rec.model, target, atol=1e-8)


def test_learn_canonical_n_points_default_is_4H_plus_4_with_H_8_when_unknown():
    from companion.numerics.rational import count_pairs

    d = 4
    target = mh.random_multi_head(d, 1, seed=2)
    n8, _ = count_pairs(4 * 8 + 4, 128)
    n_x = 2 * d
    n_link = max(3, math.ceil(2 * 64 / (4 * 8 + 4)))
    need = d + d * n_x * n8.size + (d - 1) * n_link * n8.size
    oracle = ValueQueryOracle(target, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        mh.learn_canonical(oracle, verify=0)
    assert oracle.n_queries == 0


# --- the counts route's documented labelling rules --------------------------------------------


def test_counts_route_constants():
    assert mh._pairstart.START_TOL == 1e-6
    assert mh._pairstart.MATCH_TOL == 1e-3
    assert mh._pairstart.WELL_CONDITIONED == 1e-4
    assert mh._pairstart.REPAIR_FACTOR == 3.0


def test_count_terms_smallest_h_resolving_a_quarter_and_half_the_best():
    t = 1e-6  # resolved: misfit <= _START_TOL (equality counts)
    # h = 1 resolves 1/4 (= 0.25 >= quarter, but < half of h = 2's 3/4); h = 2 resolves 3/4
    misfit = np.array([[t, 1, 1, 1], [t, t, t, 1], [t, t, t, t]])
    assert mh._pairstart.count_terms(misfit) == 2
    # h = 1 at 2/4 = half of h = 2's 4/4: the smallest such h
    assert mh._pairstart.count_terms(np.array([[t, t, 1, 1], [t, t, t, t]])) == 1
    # below a quarter nowhere resolved enough
    assert mh._pairstart.count_terms(np.array([[1.0] * 5, [t, 1, 1, 1, 1]])) is None
    assert mh._pairstart.count_terms(np.array([[np.nextafter(t, 1)] * 4, [t, 1, 1, 1]])) == 2


def test_rough_is_a_misfit_above_1e_10_of_the_scale():
    assert mh._pairstart.is_rough(np.array([2e-10, float(np.nextafter(2e-10, 1))]), np.array([2.0, 2.0])).tolist() == [False, True]


def test_apart_heads_farther_than_2e_2_of_the_largest_amplitude():
    g = np.array([50.0, 10.0, 11.0, 12.5])  # largest 50: a gap must exceed 2e-2 * 50 = 1 (exactly 1: not apart)
    assert mh._pairstart.apart(g).tolist() == [True, False, False, True]


def test_agreeing_pairs_within_1e_2_of_a_pairs_largest_amplitude():
    gs = np.array([[1.0, 2.0], [1.0, 2.0 + 0.019], [1.0 + 0.021, 2.0], [5.0, 6.0]])
    assert mh._pairstart.agreeing(gs).tolist() == [True, True, False, False]
    assert mh._pairstart.agreeing(gs, fit=np.array([False, True, True, True])).tolist() == [False, True, False, False]


@pytest.mark.parametrize("orthogonal", [True, False])
def test_probe_hessian_is_sym_sum_v_h_W_h_x0_from_d_d_plus_1_queries(orthogonal):
    d = 4
    t = mh.random_multi_head(d, 2, orthogonal=orthogonal, seed=1)
    x0 = np.array([0.5, -0.5, 0.5, 0.5])
    oracle = ValueQueryOracle(t)
    M = mh.probe_hessian(oracle, t.vs.sum(0), x0)
    assert oracle.n_queries == d * (d + 1)
    exact = sum(np.outer(vh, W @ x0) + np.outer(W @ x0, vh) for W, vh in zip(t.Ws, t.vs)) / 2
    np.testing.assert_allclose(M, exact, atol=1e-7 * np.max(np.abs(exact)))


def test_ask_pairs_calls_the_oracle_in_blocks_of_at_most_ASK_BLOCK_queries_in_order():
    """_ask_pairs: n[t] copies of U[k] then m[t] copies of X[k], ratio by ratio and token by token,
    in calls of at most _ASK_BLOCK queries (K = 2 _ASK_BLOCK + 3 needs three per ratio), and the
    same answers as one call per ratio."""
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle

    rng = np.random.default_rng(0)
    K, d = 2 * mh._route.ASK_BLOCK + 3, 3
    U, X = rng.standard_normal((K, d)), rng.standard_normal((K, d))
    n, m = np.array([1, 2]), np.array([2, 1])
    target = random_single_head(d, seed=0)
    sizes = []

    class Spy(ValueQueryOracle):
        def __call__(self, Q):
            sizes.append(Q.shape[0])
            return super().__call__(Q)

    spy = Spy(target)
    out = mh._route.ask_pairs(spy, U, X, n, m)
    assert sizes == [mh._route.ASK_BLOCK, mh._route.ASK_BLOCK, 3] * 2 and spy.n_queries == 2 * K
    for t in range(2):
        Q = np.concatenate([np.repeat(U[:, None], n[t], axis=1), np.repeat(X[:, None], m[t], axis=1)], axis=1)
        assert np.array_equal(out[:, t], ValueQueryOracle(target)(Q))
