"""Pinned formulas, budgets and thresholds of ``companion.robust`` (§6 and this book's additions).

Theorem 6.2's tolerance and guarantee, Lemma 6.1's constants, the probe-scale bounds, the
least-squares learner's counts and bounds, and the noisy low-rank learner's per-measurement
bounds and checks, each recomputed from its docstring with plain numpy. The answers come from
``ApproxValueQueryOracle(..., noise="none")`` where a test recomputes them: exact answers, stated tau.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion import robust
from companion.attention import SingleHead
from companion.errors import (
    BudgetExceededError,
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
)
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


EPS = float(np.finfo(float).eps)


# --- Lemma 6.1 and Theorem 6.2 --------------------------------------------------------------


def test_lemma_6_1_constants():
    assert robust.TAU_CLIP == approx(1 / (1 + math.exp(0.5)), rel=1e-15)
    assert robust.LIPSCHITZ_6_1 == approx(1 / (sig(0.5) * sig(-0.5)), rel=1e-14)
    assert 4.25 < robust.LIPSCHITZ_6_1 < 5
    assert robust._theorem.THEOREM_6_2_CONSTANT == 80.0


def test_margin_rounding_is_4_d_eps_mu():
    assert robust._theorem.margin_rounding(7, 0.3) == approx(4 * 7 * EPS * 0.3, rel=1e-15)


def test_clipped_logit_clips_to_tau_clip_and_one_minus_it():
    a = np.array([-0.2, 0.1, 0.4, 0.5, 0.6, 0.9, 1.3])
    out = robust.clipped_logit(a)
    lo = 1 / (1 + math.exp(0.5))
    ref = np.log(np.clip(a, lo, 1 - lo) / (1 - np.clip(a, lo, 1 - lo)))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-15)
    assert out.min() == approx(-0.5, rel=1e-12) and out.max() == approx(0.5, rel=1e-12)
    np.testing.assert_allclose(
        robust.clipped_logit(a, tau_clip=0.1), np.log(np.clip(a, 0.1, 0.9) / (1 - np.clip(a, 0.1, 0.9))), rtol=1e-12
    )
    with pytest.raises(InvalidInputError):
        robust.clipped_logit(a, tau_clip=0.5)
    robust.clipped_logit(a, tau_clip=float(np.nextafter(0.5, 0)))


def test_lemma_6_1_bound_is_the_distance_times_the_lipschitz_constant():
    ah, ast = np.array([0.2, 0.5, 0.9]), np.array([0.4, 0.5, 0.6])
    np.testing.assert_allclose(robust.lemma_6_1_bound(ah, ast), np.abs(ah - ast) / (sig(0.5) * sig(-0.5)), rtol=1e-13)


@pytest.mark.parametrize(
    "eps_W, eps_v, binding",
    [(1e-3, 1.0, "W"), (1e6, 1e6, "mu"), (1e6, 1e-5, "v")],
)
def test_sufficient_tolerance_is_the_min_of_three_terms(eps_W, eps_v, binding):
    mu, W_max, d = 0.2, 3.0, 5
    terms = {"W": mu * eps_W / (80 * W_max**2 * d), "mu": mu / 2, "v": eps_v / math.sqrt(d)}
    got = robust.sufficient_tolerance(mu=mu, eps_W=eps_W, eps_v=eps_v, W_max=W_max, d=d)
    assert got == approx(min(terms.values()), rel=1e-14)
    assert got == approx(terms[binding], rel=1e-14)


def test_guaranteed_error_formulas_and_the_mu_over_2_edge():
    mu, W_max, d = 0.2, 3.0, 5
    for tau in (1e-7, 1e-3, 0.1):  # 0.1 = mu / 2 exactly: still guaranteed
        eW, ev = robust.guaranteed_error(tau, mu=mu, W_max=W_max, d=d)
        assert eW == approx(80 * W_max**2 * d * tau / mu, rel=1e-14)
        assert ev == approx(math.sqrt(d) * tau, rel=1e-14)
    eW, ev = robust.guaranteed_error(float(np.nextafter(0.1, 1)), mu=mu, W_max=W_max, d=d)
    assert eW == ev == math.inf
    # the inverse of sufficient_tolerance
    tau = robust.sufficient_tolerance(mu=mu, eps_W=0.01, eps_v=1.0, W_max=W_max, d=d)
    assert robust.guaranteed_error(tau, mu=mu, W_max=W_max, d=d)[0] == approx(0.01, rel=1e-13)


def test_theorem_6_2_setting_needs_W_max_at_least_2():
    robust.sufficient_tolerance(mu=0.1, eps_W=1, eps_v=1, W_max=2.0, d=3)
    with pytest.raises(InvalidInputError):
        robust.sufficient_tolerance(mu=0.1, eps_W=1, eps_v=1, W_max=float(np.nextafter(2.0, 0)), d=3)


def test_random_margin_head_margin_up_to_one_over_sqrt_d():
    head = robust.random_margin_head(4, W_max=3.0, mu=0.5, seed=1)  # mu = 1/sqrt(4): every |v_i| = mu
    np.testing.assert_allclose(np.abs(head.v), 0.5, rtol=1e-15)
    assert np.linalg.norm(head.W) == approx(3.0, rel=1e-12)
    with pytest.raises(InvalidInputError):
        robust.random_margin_head(4, W_max=3.0, mu=float(np.nextafter(0.5, 1)), seed=1)
    head = robust.random_margin_head(9, W_max=3.0, mu=0.1, W_norm=2.0, seed=2)
    assert np.min(np.abs(head.v)) >= 0.1 and np.linalg.norm(head.v) <= 1.0
    assert np.max(np.abs(head.v)) < 1 / 3
    assert np.linalg.norm(head.W) == approx(2.0, rel=1e-12)


def test_robust_queries_tokens_are_b_u_plus_a_e_j_then_a_e_j():
    U = np.array([[1.0, 2.0, 0.0], [0.0, -1.0, 1.0]])
    X = robust.robust_queries(3, 2, a=0.5, b=0.25, U=U)
    e = np.array([0.0, 0.0, 1.0])
    for i in range(2):
        np.testing.assert_allclose(X[i, 0], 0.25 * U[i] + 0.5 * e, rtol=1e-15)
        np.testing.assert_allclose(X[i, 1], 0.5 * e, rtol=1e-15)
    X = robust.robust_queries(3, 0, a=0.5, b=0.25)
    np.testing.assert_allclose(X[:, 0], 0.25 * np.eye(3) + 0.5 * np.eye(3)[0], rtol=1e-15)


def test_column_blocks_hold_32_mib_of_queries_and_cover_every_column():
    assert robust._theorem._CHUNK_BYTES == 32 * 2**20
    d = 1000  # 16 d^2 = 16 MB: 2 columns per block
    blocks = robust._theorem.column_blocks(d)
    assert [len(b) for b in blocks[:-1]] == [2] * (len(blocks) - 1)
    assert [j for b in blocks for j in b] == list(range(d))
    assert [len(b) for b in robust._theorem.column_blocks(2000)][:3] == [1, 1, 1]  # max(1, .)


# --- learn_robust -------------------------------------------------------------------------------


def _margin_head(d=4, seed=3):
    return robust.random_margin_head(d, W_max=3.0, mu=0.2, seed=seed)


def test_learn_robust_budget_is_d_plus_d2_plus_verify_exactly():
    d, verify = 4, 5
    head = _margin_head(d)
    oracle = ApproxValueQueryOracle(head, 1e-6, budget=d + d * d + verify - 1)
    with pytest.raises(BudgetExceededError):
        robust.learn_robust(oracle, W_max=3.0, mu=0.2, verify=verify)
    assert oracle.n_queries == 0
    oracle = ApproxValueQueryOracle(head, 1e-6, budget=d + d * d + verify)
    rec = robust.learn_robust(oracle, W_max=3.0, mu=0.2, verify=verify)
    assert rec.n_queries == d + d * d + verify and rec.n_learning_queries == d + d * d


def test_learn_robust_refuses_tau_above_mu_over_2_with_verify_only():
    head = _margin_head()
    oracle = ApproxValueQueryOracle(head, float(np.nextafter(0.1, 1)), noise="none")
    with pytest.raises(InvalidInputError, match="mu/2"):
        robust.learn_robust(oracle, W_max=3.0, mu=0.2)
    assert oracle.n_queries == 0
    oracle = ApproxValueQueryOracle(head, 0.1, noise="none", budget=0)
    with pytest.raises(BudgetExceededError):  # tau = mu / 2: past the guarantee check
        robust.learn_robust(oracle, W_max=3.0, mu=0.2)
    oracle = ApproxValueQueryOracle(head, float(np.nextafter(0.1, 1)), noise="none")
    rec = robust.learn_robust(oracle, W_max=3.0, mu=0.2, verify=0)
    assert rec.diagnostics["eps_W_guaranteed"] == math.inf


def test_learn_robust_diagnostics_follow_the_documented_formulas():
    d, tau, W_max, mu = 4, 1e-5, 3.0, 0.2
    head = _margin_head(d)
    rec = robust.learn_robust(ApproxValueQueryOracle(head, tau, noise="none"), W_max=W_max, mu=mu)
    g = rec.diagnostics
    a, b = 0.5, 1 / W_max
    assert g["a"] == a and g["b"] == approx(b, rel=1e-15) and g["tau"] == tau
    np.testing.assert_allclose(rec.v, head.v, rtol=1e-12)
    assert g["min_abs_v"] == approx(np.min(np.abs(head.v)), rel=1e-12)
    assert g["eps_W_guaranteed"] == approx(80 * W_max**2 * d * tau / mu, rel=1e-13)
    assert g["eps_v_guaranteed"] == approx(math.sqrt(d) * tau, rel=1e-13)
    L = 1 / (sig(0.5) * sig(-0.5))
    post = L * tau * (1 + (1 + a) / b) / (a * b) * math.sqrt(d * np.sum(1 / head.v**2))
    assert g["eps_W_posterior"] == approx(post, rel=1e-10)
    # alpha_hat: the weight of entry (i, j), sigma(a b W_ij); W_hat its clipped logit / (a b)
    np.testing.assert_allclose(g["alpha_hat"], sig(a * b * head.W), rtol=1e-10)
    np.testing.assert_allclose(rec.W, head.W, rtol=1e-8, atol=1e-10)
    lo = 1 / (1 + math.exp(0.5))
    assert g["n_clipped"] == int(np.sum((g["alpha_hat"] < lo) | (g["alpha_hat"] > 1 - lo)))


def test_learn_robust_margin_check_at_mu_exactly_and_just_above():
    v = np.array([0.2, -0.3, 0.25])
    head = SingleHead(np.eye(3) * 0.5, v)
    robust.learn_robust(ValueQueryOracle(head), W_max=3.0, mu=0.2, verify=0)  # min |v_i| = mu: kept
    # within the rounding slack 4 d eps mu = 5.3e-16 above |v_0|: kept too
    robust.learn_robust(ValueQueryOracle(head), W_max=3.0, mu=0.2 + 4e-16, verify=0)
    with pytest.raises(OracleInconsistentError, match=r"v_hat\[0\]"):
        robust.learn_robust(ValueQueryOracle(head), W_max=3.0, mu=0.2 * (1 + 1e-12), verify=0)


def test_learn_robust_margin_slack_is_tau_plus_rounding():
    # exact answers, stated tau = 0.01: |v_hat_i| = 0.2 passes for mu up to 0.21, refused above.
    head = SingleHead(np.eye(3) * 0.5, np.array([0.2, -0.3, 0.25]))
    robust.learn_robust(ApproxValueQueryOracle(head, 0.01, noise="none"), W_max=3.0, mu=0.21 * (1 - 1e-14), verify=0)
    with pytest.raises(OracleInconsistentError):
        robust.learn_robust(ApproxValueQueryOracle(head, 0.01, noise="none"), W_max=3.0, mu=0.21 * (1 + 1e-9), verify=0)


# --- probe scales -----------------------------------------------------------------------------


def _entry_bound_ref(b, tau, mu, W_max, a=0.5, probe_norm=1.0):
    x = a * b * probe_norm * W_max
    if tau >= mu:
        return math.inf
    d_alpha = (1 + a + b * probe_norm * sig(x)) * tau / (b * (mu - tau))
    return float(d_alpha / (sig(x) * sig(-x)) / (a * b))


@pytest.mark.parametrize("b, a, pn", [(0.25, 0.5, 1.0), (0.1, 0.3, 2**0.5), (1.0, 0.5, 1.0)])
def test_entry_error_bound_formula(b, a, pn):
    got = robust.entry_error_bound(b, tau=1e-4, mu=0.1, W_max=4.0, a=a, probe_norm=pn)
    assert got == approx(_entry_bound_ref(b, 1e-4, 0.1, 4.0, a, pn), rel=1e-13)


def test_entry_error_bound_is_infinite_from_tau_equal_mu():
    assert robust.entry_error_bound(0.25, tau=0.1, mu=0.1, W_max=4.0) == math.inf
    assert np.isfinite(robust.entry_error_bound(0.25, tau=float(np.nextafter(0.1, 0)), mu=0.1, W_max=4.0))


def test_best_scale_cap_is_one_minus_a_over_probe_norm_and_interior_minimum_otherwise():
    assert robust.best_scale(4.0) == 0.5
    assert robust.best_scale(2.0, probe_norm=2**0.5) == approx(0.5 / 2**0.5, rel=1e-15)
    b = robust.best_scale(100.0)
    grid = np.exp(np.linspace(np.log(b) - 1, np.log(min(b * math.e, 0.5)), 2001))
    vals = [_entry_bound_ref(x, 1.0, 2.0, 100.0) for x in grid]
    b_grid = grid[int(np.argmin(vals))]
    assert b == approx(b_grid, rel=2e-3)
    assert b < 0.5
    assert b * 0.5 * 100.0 == approx(2.4, abs=0.05)  # largest logit x = a b W_max near 2.4


def test_n_queries_lstsq_is_R_d_plus_d2_plus_R_ceil_sqrt_d_minus_1_d():
    for d, R in [(1, 1), (4, 2), (5, 3), (9, 1), (10, 2)]:
        assert robust.n_queries_lstsq(d, R) == R * (d + d * d) + R * (math.ceil(math.sqrt(d)) - 1) * d
    assert robust.n_queries_lstsq(9, 1) == 90 + 2 * 9  # perfect square: ceil(3) = 3


def test_lstsq_scales_step_down_by_0_3_and_pivot_scales_interleave():
    c, bs = robust._lstsq._lstsq_scales(4.0, 5, 4, 0.3)
    np.testing.assert_allclose(c, [1.0, 0.925, 0.85, 0.775], rtol=1e-15)
    K = 4 * (3 - 1)
    piv = 0.3 * (1 - 0.3 * (np.arange(K) + 1 / 3) / K)
    np.testing.assert_allclose(bs, np.concatenate([0.3 * c, piv]), rtol=1e-15)


def _lstsq_logit_ref(b, tau, delta_v, denom, W_max, a=0.5):
    x = math.sqrt(2) * a * b * W_max
    d_alpha = (tau + (a + 2 * b * sig(x)) * delta_v) / (b * denom)
    return d_alpha / (sig(x) * sig(-x)) / (a * b)


def test_lstsq_logit_error_formula():
    got = robust._lstsq._lstsq_logit_error(np.array([0.2, 0.35]), 1e-5, 3e-5, 0.4, 4.0)
    np.testing.assert_allclose(got, [_lstsq_logit_ref(b, 1e-5, 3e-5, 0.4, 4.0) for b in (0.2, 0.35)], rtol=1e-13)


@pytest.mark.parametrize("R", [1, 3])
def test_lstsq_error_bound_formula_and_rank_doubling(R):
    tau, v_inf, W_max, d = 1e-6, 0.3, 4.0, 6
    c, bs = robust._lstsq._lstsq_scales(W_max, d, R, "best")
    delta_v = tau * np.sum(c) / np.sum(c * c)
    eps = max(_lstsq_logit_ref(b, tau, delta_v, v_inf - delta_v, W_max) for b in bs)
    eW, ev = robust.lstsq_error_bound(tau, v_inf=v_inf, W_max=W_max, d=d, repeats=R)
    assert ev == approx(math.sqrt(d) * delta_v, rel=1e-13)
    assert eW == approx(eps * math.sqrt(d * (4 * d - 3)), rel=1e-12)
    assert robust.lstsq_error_bound(tau, v_inf=v_inf, W_max=W_max, d=d, repeats=R, rank=2)[0] == approx(
        2 * eW, rel=1e-14
    )
    assert robust.lstsq_error_bound(tau, v_inf=v_inf, W_max=W_max, d=d, repeats=R, rank=d)[0] == approx(eW, rel=1e-14)


def test_lstsq_error_bound_infinite_at_v_inf_equal_2_delta_v():
    # R = 1: delta_v = tau.
    assert robust.lstsq_error_bound(0.125, v_inf=0.25, W_max=4.0, d=3)[0] == math.inf
    assert np.isfinite(robust.lstsq_error_bound(0.125, v_inf=float(np.nextafter(0.25, 1)), W_max=4.0, d=3)[0])


# --- learn_robust_lstsq -------------------------------------------------------------------------


def test_learn_robust_lstsq_budget_is_n_queries_lstsq_plus_verify():
    d, R, verify = 4, 2, 6
    head = _margin_head(d)
    need = robust.n_queries_lstsq(d, R) + verify
    oracle = ApproxValueQueryOracle(head, 1e-7, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        robust.learn_robust_lstsq(oracle, W_max=3.0, repeats=R, verify=verify)
    assert oracle.n_queries == 0
    rec = robust.learn_robust_lstsq(
        ApproxValueQueryOracle(head, 1e-7, budget=need), W_max=3.0, repeats=R, verify=verify
    )
    assert rec.n_queries == need and rec.n_learning_queries == robust.n_queries_lstsq(d, R)


@pytest.mark.parametrize("rank", [None, 2])
def test_learn_robust_lstsq_bounds_recomputed_from_the_pivot_and_signs(rank):
    d, R, tau, W_max = 5, 2, 1e-6, 3.0
    W = robust.random_margin_head(d, W_max=W_max, mu=0.1, rank=2, seed=8).W
    head = SingleHead(W, np.array([0.1, -0.4, 0.2, -0.05, 0.3]))
    rec = robust.learn_robust_lstsq(ApproxValueQueryOracle(head, tau, noise="none"), W_max=W_max, repeats=R, rank=rank)
    g = rec.diagnostics
    v = rec.v
    np.testing.assert_allclose(v, head.v, rtol=1e-10)
    p = int(np.argmax(np.abs(v)))
    assert g["pivot"] == p == 1
    np.testing.assert_array_equal(g["signs"], np.where(v * v[p] < 0, -1.0, 1.0))
    c = 1 - 0.3 * np.arange(R) / R
    np.testing.assert_allclose(g["v_scales"], c, rtol=1e-15)
    v_noise = tau * np.sum(c) / np.sum(c * c)
    assert g["eps_v_bound"] == approx(math.sqrt(d) * v_noise, rel=1e-13)
    b0 = robust.best_scale(W_max, probe_norm=2**0.5)
    np.testing.assert_allclose(g["scales"], b0 * c, rtol=1e-14)
    K = R * (math.ceil(math.sqrt(d)) - 1)
    all_b = np.concatenate([b0 * c, b0 * (1 - 0.3 * (np.arange(K) + 1 / 3) / K)])
    uv = np.array([v[p] if i == p else v[i] + g["signs"][i] * v[p] for i in range(d)])
    row = np.array([max(_lstsq_logit_ref(b, tau, v_noise, abs(uv[i]), W_max) for b in all_b) for i in range(d)])
    entry = row + np.where(np.arange(d) == p, 0.0, row[p])
    bound = math.sqrt(d) * np.linalg.norm(entry) * (2.0 if rank is not None else 1.0)
    assert g["eps_W_bound"] == approx(bound, rel=1e-12)
    assert np.linalg.norm(rec.W - head.W) <= g["eps_W_bound"]


def test_learn_robust_lstsq_refuses_when_every_v_hat_is_within_the_read_out_error():
    # R = 1: v_noise = tau. |v_i| = tau exactly is within it (refused); just above is identified.
    tau = 0.125
    head = SingleHead(np.zeros((2, 2)), np.array([0.125, -0.0625]))
    with pytest.raises(NotIdentifiableError):
        robust.learn_robust_lstsq(ApproxValueQueryOracle(head, tau, noise="none"), W_max=1.0, repeats=1, verify=0)
    head = SingleHead(np.zeros((2, 2)), np.array([float(np.nextafter(0.125, 1)), -0.0625]))
    robust.learn_robust_lstsq(ApproxValueQueryOracle(head, tau, noise="none"), W_max=1.0, repeats=1, verify=0)


# --- learn_low_rank_noisy: constants, counts and per-measurement bounds ---------------------------


def test_noisy_learner_constants():
    assert robust._noisy.NOISY_OVERSAMPLING == 3.0
    assert robust._noisy.FIT_SLACK == 1.0 + 1e-6
    assert robust._noisy.SKIP_SECOND_START_FIT == 1.0
    assert robust._noisy.START_RUN_RTOL == 1e-4
    assert robust._noisy.START_RUN_INNER_RTOL == 0.3
    assert robust._noisy.UNDETERMINED_RATIO == 1.0
    assert robust._noisy.AMBIGUITY_SLACK == 1e-9


def _low_rank_head(d=6, r=1, seed=4):
    return robust.random_margin_head(d, W_max=3.0, mu=0.1, W_norm=2.0, rank=r, seed=seed)


def test_noisy_default_m_is_ceil_3_dof_and_budget_d_plus_m_plus_verify():
    d, r, verify = 6, 1, 4
    head = _low_rank_head(d, r)
    m = math.ceil(3 * r * (2 * d - r))
    oracle = ApproxValueQueryOracle(head, 1e-6, budget=d + m + verify - 1)
    with pytest.raises(BudgetExceededError):
        robust.learn_low_rank_noisy(oracle, r, W_max=3.0, verify=verify)
    assert oracle.n_queries == 0
    rec = robust.learn_low_rank_noisy(
        ApproxValueQueryOracle(head, 1e-6, budget=d + m + verify), r, W_max=3.0, verify=verify
    )
    assert rec.diagnostics["n_measurements"] == m
    assert rec.n_queries == d + m + verify and rec.n_learning_queries == d + m


def test_noisy_too_few_measurements_below_dof_not_at_it():
    d, r = 6, 2
    dof = r * (2 * d - r)
    head = _low_rank_head(d, r)
    oracle = ApproxValueQueryOracle(head, 1e-6)
    with pytest.raises(NotIdentifiableError):
        robust.learn_low_rank_noisy(oracle, r, W_max=3.0, n_measurements=dof - 1)
    assert oracle.n_queries == 0
    with pytest.raises(BudgetExceededError):
        robust.learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-6, budget=0), r, W_max=3.0, n_measurements=dof)


def test_noisy_diagnostics_recomputed_from_the_design_the_answers_and_W():
    from companion.numerics.rop import _gaussian_rop_design, rop_queries

    # "uniform" noise is a hash of the query and the oracle's seed: a second oracle answers the
    # same queries with the same noise, so the answers can be asked again here.
    d, r, tau, W_max, seed, lm = 6, 1, 1e-4, 3.0, 3, 0.7
    head = _low_rank_head(d, r)
    rec = robust.learn_low_rank_noisy(
        ApproxValueQueryOracle(head, tau, seed=9), r, W_max=W_max, seed=seed, logit_max=lm, verify=0
    )
    g = rec.diagnostics
    m = g["n_measurements"]
    A, B = _gaussian_rop_design(d, m, rec.v, np.random.default_rng(seed))
    na, nb, nab = (np.linalg.norm(M, axis=1) for M in (A, B, A + B))
    c = np.minimum(np.minimum(1 / nab, 1 / nb), np.sqrt(lm / (W_max * na * nb)))
    np.testing.assert_allclose(g["scales"], c, rtol=1e-13)
    y = ApproxValueQueryOracle(head, tau, seed=9)(rop_queries(A, B, c))
    av, bv = A @ rec.v, B @ rec.v
    alpha = (y / c - bv) / av
    lo, hi = sig(-lm), sig(lm)
    assert g["n_clipped"] == int(np.sum((alpha < lo) | (alpha > hi)))
    ac = np.clip(alpha, lo, hi)
    t = np.log(ac / (1 - ac)) / c**2
    d_alpha = tau * (1 / c + np.abs(B).sum(1) + hi * np.abs(A).sum(1)) / np.abs(av)
    ends = [np.clip(ac - d_alpha, lo, hi), np.clip(ac + d_alpha, lo, hi)]
    den = np.minimum(ends[0] * (1 - ends[0]), ends[1] * (1 - ends[1]))
    delta = np.minimum(d_alpha / den, 2 * lm) / c**2
    np.testing.assert_allclose(g["delta"], delta, rtol=1e-9)
    assert g["max_abs_logit"] == approx(np.max(np.abs(t * c**2)), rel=1e-9)
    fit = np.einsum("kd,de,ke->k", A, rec.W, B)
    assert g["max_violation"] == approx(np.max(np.abs(fit - t) / delta), rel=1e-6)
    w = (1 / delta) / np.max(1 / delta)
    assert g["fit_ratio"] == approx(np.sum(w * (fit - t) ** 2) / np.sum(w * delta**2), rel=1e-6)
    assert g["excess_norm_W"] == max(np.linalg.norm(rec.W) - W_max, 0.0)
    sv = np.linalg.svd(rec.W, compute_uv=False)
    np.testing.assert_allclose(g["singular_values"], sv[: r + 1], rtol=1e-9, atol=1e-12)
    assert g["converged"] == (g["stop"] != "max_iter")
    assert g["tau"] == tau
    assert 1e-3 < g["max_violation"] < 1 and 1e-6 < g["fit_ratio"] < 1  # real noise: nontrivial values


def test_fit_ratio_weights_residuals_and_bounds_alike_unsquared():
    res, delta, w = np.array([1.0, 2.0]), np.array([2.0, 1.0]), np.array([0.5, 1.0])
    assert robust._noisy._fit_ratio(res, delta, w) == approx((0.5 * 1 + 1 * 4) / (0.5 * 4 + 1 * 1), rel=1e-15)


def test_check_fit_refuses_only_above_fit_slack(monkeypatch):
    monkeypatch.setattr(robust._noisy, "FIT_SLACK", 4.0)
    kw = dict(r=1, tau=1e-3, W_max=2.0)
    one = np.ones(1)
    assert robust._noisy._check_fit(np.array([2.0]), one, one, **kw) == 4.0  # exactly FIT_SLACK: accepted
    with pytest.raises(OracleInconsistentError):
        robust._noisy._check_fit(np.array([float(np.nextafter(2.0, 3))]), one, one, **kw)
    assert robust._noisy._check_fit(np.array([3.0]), one, one, refuse=False, **kw) == 9.0


def test_interval_is_the_set_of_s_meeting_every_bound():
    res, delta, g = np.array([0.1, -0.2, 0.0, 0.3]), np.array([0.5, 0.4, 1.0, 0.3]), np.array([1.0, -2.0, 0.0, 0.5])
    lo, hi = robust._noisy._interval(res, delta, g)
    s = np.linspace(-3, 3, 60001)
    ok = np.all(np.abs(res[:, None] + s[None, :] * g[:, None]) <= delta[:, None] + 1e-12, axis=0)
    assert lo == approx(s[ok].min(), abs=2e-4) and hi == approx(s[ok].max(), abs=2e-4)
    # exact ends: from k = 0: s in [-0.6, 0.4]; k = 1: -2 s in [-0.2, 0.6] -> s in [-0.3, 0.1]; k = 3: s in [-1.2, 0]
    assert (lo, hi) == (approx(-0.3, rel=1e-14), approx(0.0, abs=1e-15))


def test_ambiguity_with_loose_bounds_is_the_W_max_sphere_and_with_tight_ones_min_delta_over_g():
    rng = np.random.default_rng(0)
    d, m = 4, 30
    A, B = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    u, v = rng.standard_normal(d), rng.standard_normal(d)
    u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
    factors = (2.0 * u[:, None], v[None, :])  # W_0 = 2 u v^T, ||W_0||_F = 2
    res = np.zeros(m)
    loose = robust._noisy._ambiguity(A, B, res, np.full(m, 1e300), factors, W_max=3.0)
    assert loose == approx(2.0 + 3.0, rel=1e-12)  # s from -(2 + 3) to 3 - 2
    delta = rng.uniform(1e-4, 2e-4, m)
    g = np.einsum("ki,i,kj,j->k", A, u, B, v)  # <a_k b_k^T, u v^T>
    tight = robust._noisy._ambiguity(A, B, res, delta, factors, W_max=3.0)
    assert tight == approx(np.min(delta / np.abs(g)), rel=1e-10)
    assert robust._noisy._ambiguity(A, B, res, delta, (np.zeros((d, 1)), np.zeros((1, d))), W_max=3.0) == 0.0


def _info(excess, ambiguity):
    return {"excess_norm_W": excess, "ambiguity_W": ambiguity, "fit_ratio": 0.5}


def test_check_determined_thresholds_at_equality():
    W = np.diag([3.0, 4.0, 0.0])  # ||W||_F = 5
    kw = dict(W_max=4.0, rtol=0.1, r=2, m=40, tau=1e-3, max_iter=30)
    size = min(5.0, 4.0)
    allowed = 0.1 * size + 1e-9 * size + 1e-12  # verify_noisy's allowance (companion._learner.error_allowance)
    undet = 1.0 * size + 1e-9 * size + 1e-12
    assert robust._noisy._check_determined(_info(allowed, 0.0), W, **kw) == ""
    with pytest.raises(PrecisionError):
        robust._noisy._check_determined(_info(float(np.nextafter(allowed, 1)), 0.0), W, **kw)
    assert robust._noisy._check_determined(_info(0.0, allowed), W, **kw) == ""
    clause = robust._noisy._check_determined(_info(0.0, float(np.nextafter(allowed, 1))), W, **kw)
    assert "not certified" in clause
    assert "not certified" in robust._noisy._check_determined(_info(0.0, float(np.nextafter(undet, 0))), W, **kw)
    with pytest.raises(PrecisionError):
        robust._noisy._check_determined(_info(0.0, undet), W, **kw)  # reaching UNDETERMINED_RATIO refuses
    assert "not determined" in robust._noisy._check_determined(_info(0.0, undet), W, refuse=False, **kw)
    # size = min(||W||_F, W_max): with W_max = 10 the size is ||W||_F = 5
    kw10 = dict(kw, W_max=10.0)
    assert robust._noisy._check_determined(_info(0.1 * 5.0 + 1e-9 * 5.0 + 1e-12, 0.0), W, **kw10) == ""
    with pytest.raises(PrecisionError):
        robust._noisy._check_determined(_info(float(np.nextafter(0.1 * 5.0 + 1e-9 * 5.0 + 1e-12, 1)), 0.0), W, **kw10)


def test_the_three_noisy_allowances_are_one_rule():
    """verify_noisy, the consistency check and the determination check allowed 1e-9 of the norm, 1e-9 of rtol times it,
    and no 1e-12 (session 48's review): one helper now serves all three, and each refuses just above its value."""
    from companion._learner import ALLOWANCE_SLACK, error_allowance

    assert ALLOWANCE_SLACK == 1e-9 and robust.AMBIGUITY_SLACK == ALLOWANCE_SLACK
    assert error_allowance(0.1, 4.0) == 0.1 * 4.0 + 1e-9 * 4.0 + 1e-12
    assert error_allowance(0.1, 4.0, own=0.7) == 0.7 + 1e-9 * 4.0 + 1e-12
    assert error_allowance(0.1, 4.0, own=0.2) == error_allowance(0.1, 4.0)  # rtol times the size wins
    allowed = error_allowance(0.1, float(np.sqrt(3)))  # _check_consistent at ||W||_F = sqrt(3) < W_max
    A = B = np.eye(3)[:1]
    for proof, raises in ((allowed, False), (float(np.nextafter(allowed, 1)) + 1e-15, True)):
        res = np.array([1.0 + proof])
        kw = dict(r=1, tau=1e-4, W_max=4.0, rtol=0.1, refuse=True)
        if raises:
            with pytest.raises(OracleInconsistentError, match="above the allowed"):
                robust._noisy._check_consistent(A, B, res, np.array([1.0]), np.eye(3), {}, **kw)
        else:
            assert "within the allowance" in robust._noisy._check_consistent(
                A, B, res, np.array([1.0]), np.eye(3), {}, **kw
            )


def test_noisy_nuclear_rank_check_at_rtol_exactly():
    robust._noisy._check_nuclear_rank(np.diag([1.0, 0.1, 0.0]), 1, tau=1e-3, rtol=0.1)
    with pytest.raises(OracleInconsistentError):
        robust._noisy._check_nuclear_rank(np.diag([1.0, float(np.nextafter(0.1, 1)), 0.0]), 1, tau=1e-3, rtol=0.1)
    robust._noisy._check_nuclear_rank(np.diag([1.0, 0.5]), 2, tau=1e-3, rtol=0.1)  # no (r + 1)-th value


def test_norm_bound_check_starts_above_1_plus_rtol_W_max():
    rng = np.random.default_rng(1)
    d, m = 3, 40
    A, B = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    delta = np.full(m, 1e-9)
    for scale, refused in [(1.0, False), (float(np.nextafter(1.0, 2)) * (1 + 1e-6), True)]:
        W = np.zeros((d, d))
        W[0, 0] = (1.0 + 0.1) * 2.0 * scale
        fit = np.einsum("kd,de,ke->k", A, W, B)
        if refused:
            with pytest.raises(OracleInconsistentError, match="pin its scale"):
                robust._noisy._check_norm_bound(W, fit, fit.copy(), delta, W_max=2.0, rtol=0.1)
        else:
            assert robust._noisy._check_norm_bound(W, fit, fit.copy(), delta, W_max=2.0, rtol=0.1) is None
    # a wide interval (the answers leave the scale open): no refusal
    W = np.zeros((d, d))
    W[0, 0] = 3.0
    fit = np.einsum("kd,de,ke->k", A, W, B)
    assert robust._noisy._check_norm_bound(W, fit, fit.copy(), np.full(m, 1e3), W_max=2.0, rtol=0.1) is None


def test_learn_robust_lstsq_refuses_a_W_hat_above_W_max_plus_its_bound():
    # Exact answers, stated tau = 1e-13: eps_W_bound is tiny, so ||W_hat||_F = ||W*||_F is refused
    # for W_max just below it (by more than sqrt(eps) W_max) and accepted at W_max = ||W*||_F.
    W = np.diag([0.6, -0.8, 0.0])  # ||W||_F = 1: every column norm below it, no logit clipped
    head = SingleHead(W, np.array([0.3, -0.5, 0.4]))
    oracle = ApproxValueQueryOracle(head, 1e-13, noise="none")
    rec = robust.learn_robust_lstsq(oracle, W_max=1.0, repeats=1, verify=0)
    assert rec.diagnostics["eps_W_bound"] < 1e-9
    np.testing.assert_allclose(rec.W, W, atol=1e-9)
    with pytest.raises(OracleInconsistentError, match="exceeds W_max"):
        robust.learn_robust_lstsq(
            ApproxValueQueryOracle(head, 1e-13, noise="none"), W_max=1.0 - 1e-6, repeats=1, verify=0
        )


def test_ambiguity_with_an_offset_measures_the_distance_from_W_hat():
    rng = np.random.default_rng(3)
    d, m = 4, 20
    A, B = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    u, v = rng.standard_normal(d), rng.standard_normal(d)
    u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
    factors = (2.0 * u[:, None], v[None, :])  # W_0 = 2 u v^T
    D = np.outer(u, v)
    offset = 0.1 * rng.standard_normal((d, d))  # W_0 - W_hat
    got = robust._noisy._ambiguity(A, B, np.zeros(m), np.full(m, 1e300), factors, W_max=3.0, offset=offset)
    # s in [-(2 + 3), 3 - 2] along D (||W_0 + s D||_F <= 3); the distance is ||offset + s D||_F
    ref = max(np.linalg.norm(offset + x * D) for x in (-5.0, 1.0))
    assert got == approx(ref, rel=1e-12)


def _norm_bound_case(nW, c, W_max=2.0, rtol=0.1, seed=5):
    """W = nW e_1 e_1^T, exact fit, bounds delta_k = c |g_k|: the allowed s along W's direction is
    [-c, c] (up to the sqrt(eps) max |t| rounding margin)."""
    rng = np.random.default_rng(seed)
    d, m = 3, 30
    A, B = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    W = np.zeros((d, d))
    W[0, 0] = nW
    fit = np.einsum("kd,de,ke->k", A, W, B)
    return W, fit, c * np.abs(fit / nW), dict(W_max=W_max, rtol=rtol)


@pytest.mark.parametrize(
    "nW, c, refused",
    [
        (2.25, 0.01, True),  # pinned (0.01 <= 0.225) and 2.24 > 2.2: refused
        (2.25, 0.1, False),  # pinned, but 2.25 - 0.1 = 2.15 <= 2.2: a head within W_max (1 + rtol)
        (10.0, 0.5, True),  # pinned (0.5 <= 1.0), 9.5 > 2.2
        (10.0, 1.5, False),  # 1.5 > rtol ||W|| = 1: the answers leave the scale open
    ],
)
def test_norm_bound_refuses_only_a_pinned_scale_all_above_1_plus_rtol_W_max(nW, c, refused):
    W, fit, delta, kw = _norm_bound_case(nW, c)
    if refused:
        with pytest.raises(OracleInconsistentError, match="pin its scale"):
            robust._noisy._check_norm_bound(W, fit, fit.copy(), delta, **kw)
    else:
        assert robust._noisy._check_norm_bound(W, fit, fit.copy(), delta, **kw) is None


def test_noisy_learner_at_tau_0_reports_no_certification_keys():
    head = _low_rank_head()
    rec = robust.learn_low_rank_noisy(ValueQueryOracle(head), 1, W_max=3.0)
    g = rec.diagnostics
    assert g["tau"] == 0.0
    for key in ("fit_ratio", "ambiguity_W", "excess_norm_W"):
        assert key not in g
    np.testing.assert_allclose(rec.W, head.W, rtol=1e-6, atol=1e-8)


def test_noisy_learners_documented_defaults():
    import inspect

    p = inspect.signature(robust.learn_low_rank_noisy).parameters
    documented = {
        "method": "rgn",
        "logit_max": 0.5,
        "solver_eps": 1e-7,
        "max_iter": 30,
        "verify": 32,
        "verify_rtol": 0.1,
    }
    assert {k: p[k].default for k in documented} == documented
    for f, extra in ((robust.learn_robust, {}), (robust.learn_robust_lstsq, {"repeats": 4, "scale": "best"})):
        p = inspect.signature(f).parameters
        assert {k: p[k].default for k in ("verify", "verify_rtol", *extra)} == {
            "verify": 32,
            "verify_rtol": 0.1,
            **extra,
        }


def test_noisy_clip_window_is_sigma_of_plus_minus_logit_max():
    # logit_max = 0.7 and W_max = ||W*||_F at d = 2: some logits exceed 1/2, none leaves the window.
    head = robust.random_margin_head(2, W_max=3.0, mu=0.1, W_norm=2.0, rank=1, seed=4)
    oracle = ApproxValueQueryOracle(head, 1e-6, seed=9)
    rec = robust.learn_low_rank_noisy(oracle, 1, W_max=2.0, logit_max=0.7, n_measurements=200, verify=0)
    assert 0.5 < rec.diagnostics["max_abs_logit"] <= 0.7 * (1 + 1e-3)
    assert rec.diagnostics["n_clipped"] == 0


def test_noisy_excess_norm_is_the_frobenius_excess_over_W_max():
    head = robust.random_margin_head(6, W_max=3.0, mu=0.1, W_norm=2.0, rank=2, seed=4)
    rec = robust.learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-6, seed=9), 2, W_max=1.5, verify=0)
    excess = rec.diagnostics["excess_norm_W"]
    assert excess == approx(np.linalg.norm(rec.W) - 1.5, rel=1e-12) and excess > 0.1
    assert "not determined by the answers" in rec.message  # verify=0: said, not raised


# Written after held-out round 5 (benchmarks/mutants_heldout_round5_after.md): its robust survivor.


@pytest.mark.parametrize("d", [4, 16])
def test_learn_robust_allows_v_errors_up_to_sqrt_d_tau(d):
    """learn_robust's verification allows ||v_hat - v*|| up to sqrt(d) tau (each entry of v_hat is
    within tau: the docstring), plus verify_noisy's 1e-9 ||v_hat|| and 1e-12; with a small verify_rtol
    that is the allowance reported. Worst-case noise puts every entry tau off: ||v_hat - v*|| is
    exactly sqrt(d) tau, inside it."""
    tau, mu = 1e-4, 0.5 / np.sqrt(d)
    head = robust.random_margin_head(d, W_max=4.0, mu=mu, seed=0)
    rec = robust.learn_robust(ApproxValueQueryOracle(head, tau, noise="worst"), W_max=4.0, mu=mu, verify_rtol=1e-9)
    nv = float(np.linalg.norm(rec.v))
    assert rec.diagnostics["verify_allowed_v"] == np.sqrt(d) * tau + 1e-9 * nv + 1e-12
    assert np.linalg.norm(rec.v - head.v) == pytest.approx(np.sqrt(d) * tau, rel=1e-9, abs=0)
