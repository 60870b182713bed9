"""Pinned rules of ``companion.membership`` (this book's ±1-label learner): the query counts, the
bit limits, the bisection half-widths, the oracle's ``>=`` and the verification bound
``slack (2 R^2 E_W s + R sqrt(d) 2^-bits)`` with ``E_W = ||U^-1||_2^2 ||halfwidth||_F``, each
recomputed from the module's docstrings with plain numpy.
"""

import numpy as np
import pytest

from companion import membership as M
from companion.attention import SingleHead, random_single_head
from companion.errors import BudgetExceededError, InvalidInputError, NotIdentifiableError, OracleInconsistentError
from companion.oracles import ValueQueryOracle


def _sigma(t):
    return 1.0 / (1.0 + np.exp(-t))


def test_oracle_label_is_plus_one_at_exactly_the_threshold():
    head = SingleHead(np.eye(2), np.array([1.0, 0.0]))
    assert M.MembershipQueryOracle(head)(np.array([[0.0, 1.0]])) == 1.0  # f = 0 >= 0
    o = M.MembershipQueryOracle(head, threshold=0.5)
    assert o(np.array([[0.5, 0.0]])) == 1.0  # f = 0.5 >= 0.5
    assert o(np.array([[np.nextafter(0.5, 0.0), 0.0]])) == -1.0
    assert M.MembershipQueryOracle(head).tau == float("inf")


@pytest.mark.parametrize("d, bits, n_s", [(1, 1, 1), (3, 5, 2), (4, 10, 4), (5, 7, 1)])
def test_membership_query_count_formula(d, bits, n_s):
    assert M.membership_query_count(d, bits, n_support=n_s) == 2 * d + (n_s - 1) * (bits + 1) + bits * d * d
    assert M.membership_query_count(d, bits) == 2 * d + (d - 1) * (bits + 1) + bits * d * d


def test_counts_per_step_with_a_zero_entry_of_v():
    d, bits = 3, 6
    head = SingleHead(0.3 * np.eye(d), np.array([1.0, 0.0, -0.7]))
    oracle = M.MembershipQueryOracle(head)
    rec = M.learn_membership(oracle, W_max=2.0, bits=bits, verify=0)
    diag = rec.diagnostics
    assert diag["n_support"] == 2
    assert diag["n_queries_v"] == 2 * d + (2 - 1) * (bits + 1)
    assert diag["n_queries_W"] == bits * d * d
    assert rec.n_queries == M.membership_query_count(d, bits, n_support=2) == oracle.n_queries
    assert diag["n_verify_queries"] == 0 and rec.n_learning_queries == rec.n_queries
    assert diag["p"] == 0 and diag["bits"] == bits


def test_budget_is_the_full_support_count_plus_verify_exactly():
    d, bits, verify = 3, 4, 7
    head = SingleHead(0.3 * np.eye(d), np.array([1.0, 0.0, -0.7]))  # support 2, still reserved for d
    need = M.membership_query_count(d, bits) + verify
    oracle = M.MembershipQueryOracle(head, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        M.learn_membership(oracle, W_max=2.0, bits=bits, verify=verify)
    assert oracle.n_queries == 0
    rec = M.learn_membership(M.MembershipQueryOracle(head, budget=need), W_max=2.0, bits=bits, verify=verify)
    assert rec.n_queries == M.membership_query_count(d, bits, n_support=2) + verify


def test_bits_limits_one_and_52_accepted_zero_and_53_refused():
    head = SingleHead(0.1 * np.eye(2), np.array([1.0, 0.8]))
    for bits in (0, 53):
        oracle = M.MembershipQueryOracle(head)
        with pytest.raises(InvalidInputError):
            M.learn_membership(oracle, W_max=1.0, bits=bits, verify=0)
        assert oracle.n_queries == 0
    assert M.learn_membership(M.MembershipQueryOracle(head), W_max=1.0, bits=1, verify=0).diagnostics["bits"] == 1
    rec = M.learn_membership(M.MembershipQueryOracle(head), W_max=1.0, bits=52, verify=0)
    np.testing.assert_allclose(rec.W, head.W, atol=1e-12)


def test_refusals_threshold_W_max_slack_and_oracle_kind():
    head = SingleHead(0.1 * np.eye(2), np.array([1.0, 0.8]))
    with pytest.raises(InvalidInputError):
        M.learn_membership(M.MembershipQueryOracle(head, threshold=0.1), W_max=1.0)
    with pytest.raises(InvalidInputError):
        M.learn_membership(M.MembershipQueryOracle(head), W_max=0.0)
    with pytest.raises(InvalidInputError):
        M.learn_membership(M.MembershipQueryOracle(head), W_max=1.0, verify_slack=-1.0)
    with pytest.raises(TypeError):
        M.learn_membership(ValueQueryOracle(head), W_max=1.0)


def test_zero_v_is_refused_after_the_2d_sign_labels():
    oracle = M.MembershipQueryOracle(SingleHead(np.eye(3), np.zeros(3)))
    with pytest.raises(NotIdentifiableError):
        M.learn_membership(oracle, W_max=1.0)
    assert oracle.n_queries == 6


def test_tournament_ties_go_to_the_later_entry():
    # |v_1| >= |v_0| is labelled +1 at equality, so p moves to 1.
    rec = M.learn_membership(
        M.MembershipQueryOracle(SingleHead(0.2 * np.eye(2), np.array([0.5, -0.5]))), W_max=1.0, bits=8, verify=0
    )
    assert rec.diagnostics["p"] == 1
    assert rec.v[1] == -1.0 and abs(rec.v[0] - 1.0) <= 2.0**-9  # |v_0 / v_1| = 1 to 2^-(bits + 1)


def test_ratio_of_v_is_within_half_a_bisection_step():
    bits = 12
    v = np.array([0.3, -1.2, 0.9, 0.05])
    rec = M.learn_membership(M.MembershipQueryOracle(SingleHead(0.1 * np.eye(4), v)), W_max=1.0, bits=bits, verify=0)
    r = v / np.max(np.abs(v))
    assert np.max(np.abs(rec.v - r)) <= 2.0 ** -(bits + 1)
    assert rec.v[1] == -1.0


def test_logit_halfwidth_is_norm_u_norm_x_W_max_over_2_to_the_bits():
    bits, W_max = 9, 3.0
    v = np.array([1.0, 0.2, -0.8])  # |v_1| < 1/2: probe e_1 + e_0, norm sqrt(2)
    rec = M.learn_membership(M.MembershipQueryOracle(SingleHead(0.1 * np.eye(3), v)), W_max=W_max, bits=bits, verify=0)
    U = rec.diagnostics["probes"]
    expected_U = np.eye(3)
    expected_U[1, 0] = 1.0
    np.testing.assert_array_equal(U, expected_U)
    n = np.sqrt(np.sum(U**2, axis=1))
    np.testing.assert_allclose(rec.diagnostics["logit_halfwidth"], np.outer(n, n) * W_max * 2.0**-bits, rtol=1e-15)


def test_recovered_W_within_the_bisection_half_widths():
    bits = 20
    target = random_single_head(3, seed=5)
    W_max = 2 * np.linalg.norm(target.W)
    rec = M.learn_membership(M.MembershipQueryOracle(target), W_max=W_max, bits=bits, verify=0)
    U = rec.diagnostics["probes"]
    T_true = U @ target.W @ U.T
    T_hat = U @ rec.W @ U.T
    # r's error (2^-(b+1)) moves the balance point: allow a few half-widths
    assert np.all(np.abs(T_hat - T_true) <= 8 * rec.diagnostics["logit_halfwidth"])


def test_bisection_at_the_edge_raises_from_two_bits_but_not_at_one():
    head = SingleHead(np.array([[5.0, 0.0], [0.0, 0.1]]), np.array([1.0, 0.8]))
    oracle = M.MembershipQueryOracle(head)
    with pytest.raises(OracleInconsistentError, match="W_max=1 is too small"):
        M.learn_membership(oracle, W_max=1.0, bits=2, verify=0)
    M.learn_membership(M.MembershipQueryOracle(head), W_max=1.0, bits=1, verify=0)


def test_design_balance_point_recomputed():
    rng = np.random.default_rng(2)
    r_x, r_u, m = rng.standard_normal(6), rng.standard_normal(6), np.array([0.7, -0.3, 0.0, 2.0, -1.5, 0.0])
    kappa, c2 = M._design(r_x, r_u, m)
    y_star = -np.sign(r_x * r_u) * np.sign(m)
    np.testing.assert_allclose(kappa, -r_x / (_sigma(y_star) * r_u), rtol=1e-14)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_allclose(c2, np.where(m == 0, 1.0, y_star / (kappa * m)), rtol=1e-14)
    assert np.all(c2 > 0)
    # at t = m, the answer r_x + sigma(c^2 kappa t) kappa r_u is 0 (the balance point)
    t = m
    np.testing.assert_allclose(r_x + _sigma(c2 * kappa * t) * kappa * r_u, 0.0, atol=1e-12)


def test_compare_logits_answers_t_greater_than_m():
    rng = np.random.default_rng(3)
    d, k = 3, 40
    W, v = rng.standard_normal((d, d)), rng.standard_normal(d)
    U, X = rng.standard_normal((k, d)), rng.standard_normal((k, d))
    t = np.einsum("kd,de,ke->k", U, W, X)
    m = t + rng.choice([-1, 1], k) * rng.uniform(1e-3, 1.0, k)
    oracle = M.MembershipQueryOracle(SingleHead(W, v))
    np.testing.assert_array_equal(M.compare_logits(oracle, U, X, v, m), t > m)
    assert oracle.n_queries == k


# --- the verification bound ----------------------------------------------------------------


def _bound(X, v_hat, d, bits, E_W, slack):
    R = np.max(np.sqrt(np.sum(X**2, axis=1)))
    s = np.max(np.abs(X @ v_hat))
    return slack * (2.0 * R**2 * E_W * s + R * np.sqrt(d) * 2.0**-bits)


def _flipping_target(head, lo, hi):
    """The head, with the sign of f flipped on queries of length >= 3 where lo(X) < |f(X)| < hi(X)."""

    def target(X):
        X = np.asarray(X)
        f = head(X)
        if X.shape[1] >= 3:
            for b in range(X.shape[0]):
                if lo(X[b]) < abs(f[b]) < hi(X[b]):
                    f[b] = -f[b]
        return f

    return target


D, BITS, W_MAX, SLACK = 4, 10, 8.0, 2.0
V = np.array([1.0, 0.75, -0.625, 0.875])  # every |v_l| >= 1/2: the probes are the identity
HEAD = SingleHead(0.3 * np.eye(D) + 0.1, V)
HALF = W_MAX * 2.0**-BITS  # every logit's half-width (||e_l|| = 1)
E_W_2 = 1.0 * np.sqrt(D * D) * HALF  # ||I^-1||_2^2 ||halfwidth||_F
E_W_F = D * np.sqrt(D * D) * HALF  # the Frobenius norm would give d times more


def _run(lo, hi, verify=300):
    oracle = M.MembershipQueryOracle(_flipping_target(HEAD, lo, hi), d=D)
    return M.learn_membership(oracle, W_max=W_MAX, bits=BITS, verify=verify, verify_slack=SLACK, seed=1)


def test_verification_tolerates_flipped_labels_inside_the_documented_bound():
    def lo(x):
        return 0.0

    def hi(x):
        return 0.7 * _bound(x, V, D, BITS, E_W_2, SLACK)

    rec = _run(lo, hi)
    assert rec.diagnostics["n_verify_disagreements"] > 5  # the test flips labels, and they are allowed
    assert rec.diagnostics["n_verify_queries"] == 300


def test_verification_refuses_flipped_labels_just_outside_the_documented_bound():
    # between 1.3 x the bound with ||U^-1||_2^2 and 0.7 x the bound with ||U^-1||_F^2 (or slack x 2, ...)
    def lo(x):
        return 1.3 * _bound(x, V, D, BITS, E_W_2, SLACK)

    def hi(x):
        return 0.7 * _bound(x, V, D, BITS, E_W_F, SLACK)

    with pytest.raises(OracleInconsistentError, match="exceeds its error bound"):
        _run(lo, hi)


def test_verification_queries_are_counted_apart():
    rec = _run(lambda x: 1.0, lambda x: 0.0, verify=50)
    assert rec.n_queries == M.membership_query_count(D, BITS) + 50
    assert rec.n_learning_queries == M.membership_query_count(D, BITS)


def test_single_support_v_spends_no_ratio_queries():
    d, bits = 3, 5
    rec = M.learn_membership(
        M.MembershipQueryOracle(SingleHead(0.2 * np.eye(d), np.array([0.0, -0.4, 0.0]))), W_max=1.0, bits=bits, verify=0
    )
    assert rec.diagnostics["n_queries_v"] == 2 * d  # n_s - 1 = 0 comparisons, no bisection
    assert rec.diagnostics["p"] == 1 and rec.v.tolist() == [0.0, -1.0, 0.0]
    assert rec.n_queries == M.membership_query_count(d, bits, n_support=1)


def test_verification_queries_are_lengths_one_to_eight_of_normal_over_sqrt_d_tokens():
    d, n, seed = 3, 40, 5
    head = SingleHead(0.2 * np.eye(d), np.array([1.0, 0.7, -0.6]))
    oracle = M.MembershipQueryOracle(head, record=True)
    rec = M.learn_membership(oracle, W_max=1.0, bits=20, verify=n, seed=seed)
    asked = [x for x, _ in oracle.log[-n:]]
    rng = np.random.default_rng(seed)
    expected = [rng.standard_normal((int(k), d)) / np.sqrt(d) for k in rng.integers(1, 9, size=n)]
    assert [len(x) for x in asked] == [len(x) for x in expected]
    for x, e in zip(asked, expected):
        np.testing.assert_allclose(x, e, rtol=1e-14)
    assert rec.diagnostics["n_verify_queries"] == n


def test_default_verify_slack_is_two():
    # flipped labels between 1.3 x the bound at slack 1 and 0.7 x the bound at slack 2: allowed
    # by the default slack (2.0), refused with slack 1.
    def lo(x):
        return 1.3 * _bound(x, V, D, BITS, E_W_2, 1.0)

    def hi(x):
        return 0.7 * _bound(x, V, D, BITS, E_W_2, 2.0)

    oracle = M.MembershipQueryOracle(_flipping_target(HEAD, lo, hi), d=D)
    rec = M.learn_membership(oracle, W_max=W_MAX, bits=BITS, verify=300, seed=1)
    assert rec.diagnostics["n_verify_disagreements"] > 5
    oracle = M.MembershipQueryOracle(_flipping_target(HEAD, lo, hi), d=D)
    with pytest.raises(OracleInconsistentError):
        M.learn_membership(oracle, W_max=W_MAX, bits=BITS, verify=300, verify_slack=1.0, seed=1)
