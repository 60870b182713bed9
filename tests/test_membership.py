"""Membership queries (±1 labels): this book's oracle and bisection learner."""

import numpy as np
import pytest

from companion.attention import MultiHead, SingleHead, random_single_head
from companion.errors import (BudgetExceededError, InvalidInputError, NotIdentifiableError,
                              OracleInconsistentError)
from companion.exact import learn_single_head
from companion.membership import (MembershipQueryOracle, compare_logits, learn_membership,
                                  membership_query_count)


def w_max_of(target):
    return 1.01 * float(np.linalg.norm(target.W))


# ---------------------------------------------------------------- the oracle

def test_label_is_plus_one_exactly_at_and_above_the_threshold():
    head = SingleHead(np.eye(2), np.array([0.5, -0.25]))
    X = np.array([[1.0, 0.0]])                        # f = 0.5
    assert MembershipQueryOracle(head, threshold=0.5)(X) == 1.0
    assert MembershipQueryOracle(head, threshold=np.nextafter(0.5, 1.0))(X) == -1.0
    assert MembershipQueryOracle(head)(np.zeros((1, 2))) == 1.0     # f = 0 >= 0


def test_label_oracle_counts_and_is_refused_by_value_learners():
    oracle = MembershipQueryOracle(random_single_head(3, seed=0), budget=5)
    y = oracle(np.random.default_rng(0).standard_normal((4, 2, 3)))
    assert set(np.unique(y)) <= {-1.0, 1.0} and oracle.n_queries == 4
    with pytest.raises(BudgetExceededError):
        oracle(np.zeros((2, 1, 3)))
    assert oracle.n_queries == 4
    with pytest.raises(TypeError, match="exact"):
        learn_single_head(MembershipQueryOracle(random_single_head(3, seed=0)))


# ---------------------------------------------------------------- one comparison

@pytest.mark.parametrize("sx,su", [(1, 1), (1, -1), (-1, 1), (-1, -1)])
@pytest.mark.parametrize("m", [-0.7, 0.0, 0.3])
def test_one_label_answers_whether_the_logit_exceeds_m(sx, su, m):
    # x = e_0, u = e_1; r = v / ||v||_inf exactly; t = u^T W x = W[1, 0].
    v = np.array([sx * 0.8, su * 1.0, 0.3])
    r = v / np.max(np.abs(v))
    for t, expected in [(m + 1e-9, True), (m - 1e-9, False)]:
        W = np.array([[0.4, -1.0, 0.2], [t, 0.7, 0.1], [0.3, 0.2, -0.5]])
        oracle = MembershipQueryOracle(SingleHead(W, 2.5 * v))
        got = compare_logits(oracle, np.array([[0.0, 1.0, 0.0]]), np.array([[1.0, 0.0, 0.0]]), r,
                             np.array([m]))
        assert bool(got[0]) is expected
        assert oracle.n_queries == 1


# ---------------------------------------------------------------- the learner

@pytest.mark.parametrize("d,bits", [(1, 20), (4, 12), (7, 30)])
def test_query_count_is_exact(d, bits):
    target = random_single_head(d, seed=d)
    oracle = MembershipQueryOracle(target)
    rec = learn_membership(oracle, W_max=w_max_of(target), bits=bits, verify=50)
    assert rec.n_queries == oracle.n_queries == membership_query_count(d, bits) + 50
    assert membership_query_count(d, bits) == bits * d * d + (bits + 3) * d - (bits + 1)
    assert rec.diagnostics["n_queries_v"] + rec.diagnostics["n_queries_W"] == membership_query_count(d, bits)


def test_query_count_with_zero_entries_of_v():
    target = random_single_head(5, seed=3)
    v = target.v.copy()
    v[[1, 3]] = 0.0
    head = SingleHead(target.W, v)
    oracle = MembershipQueryOracle(head)
    rec = learn_membership(oracle, W_max=w_max_of(head), bits=16, verify=0)
    assert rec.diagnostics["n_support"] == 3
    assert rec.n_queries == membership_query_count(5, 16, n_support=3) == 10 + 2 * 17 + 16 * 25
    np.testing.assert_array_equal(rec.v[[1, 3]], 0.0)


@pytest.mark.parametrize("bits", [10, 20, 40])
def test_precision_each_logit_within_its_bisection_halfwidth(bits):
    d = 6
    target = random_single_head(d, seed=11)
    rec = learn_membership(MembershipQueryOracle(target), W_max=w_max_of(target), bits=bits,
                           verify=0)
    U = rec.diagnostics["probes"]
    T_true, T_hat = U @ target.W @ U.T, U @ rec.W @ U.T
    hw = rec.diagnostics["logit_halfwidth"]
    np.testing.assert_allclose(hw, np.linalg.norm(U, axis=1)[:, None] * np.linalg.norm(U, axis=1)
                               * w_max_of(target) * 2.0**-bits, rtol=1e-12)
    # the bisection bound S 2^-b, plus the shift of the balance point by the 2^-(b+1) errors of r
    assert np.all(np.abs(T_hat - T_true) <= hw + 8 * 2.0**-bits * (np.abs(T_true) + 1.0))
    assert np.max(np.abs(T_hat - T_true) / hw) > 0.5      # not better than bisection can be
    v_true = target.v / np.max(np.abs(target.v))
    assert np.max(np.abs(rec.v - v_true)) <= 2.0 ** -(bits + 1)


def test_scale_of_v_is_not_identifiable_and_the_result_is_v_over_its_max():
    target = random_single_head(4, seed=5)
    a = learn_membership(MembershipQueryOracle(target), W_max=10.0, bits=24, verify=0)
    b = learn_membership(MembershipQueryOracle(SingleHead(target.W, 7.0 * target.v)), W_max=10.0,
                         bits=24, verify=0)
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.v, b.v)
    assert np.max(np.abs(a.v)) == 1.0


def test_w_max_threshold_just_inside_and_just_outside():
    target = random_single_head(4, seed=2)
    probe = learn_membership(MembershipQueryOracle(target), W_max=50.0, bits=8, verify=0)
    U = probe.diagnostics["probes"]
    n = np.linalg.norm(U, axis=1)
    needed = float(np.max(np.abs(U @ target.W @ U.T) / (n[:, None] * n[None, :])))
    learn_membership(MembershipQueryOracle(target), W_max=needed * 1.001, bits=20, verify=0)
    with pytest.raises(OracleInconsistentError, match="W_max"):
        learn_membership(MembershipQueryOracle(target), W_max=needed * 0.999, bits=20, verify=0)


def test_refusals_before_the_first_query():
    target = random_single_head(3, seed=0)
    with pytest.raises(InvalidInputError, match="threshold"):
        learn_membership(MembershipQueryOracle(target, threshold=0.1), W_max=5.0)
    for bad in ({"bits": 0}, {"bits": 53}, {"W_max": 0.0}, {"verify": -1}):
        oracle = MembershipQueryOracle(target)
        with pytest.raises(InvalidInputError):
            learn_membership(oracle, **({"W_max": 5.0} | bad))
        assert oracle.n_queries == 0
    needed = membership_query_count(3, 10) + 5
    with pytest.raises(BudgetExceededError):
        learn_membership(MembershipQueryOracle(target, budget=needed - 1), W_max=5.0, bits=10, verify=5)
    learn_membership(MembershipQueryOracle(target, budget=needed), W_max=5.0, bits=10, verify=5)
    with pytest.raises(TypeError):
        learn_membership(lambda X: 0.0, W_max=5.0)


def test_zero_value_vector_is_not_identifiable():
    with pytest.raises(NotIdentifiableError, match="v\\* = 0"):
        learn_membership(MembershipQueryOracle(SingleHead(np.eye(3), np.zeros(3))), W_max=5.0)


def test_verification_catches_an_oracle_that_is_not_a_single_head():
    a, b = random_single_head(4, seed=1), random_single_head(4, seed=2)
    two = MultiHead(np.stack([a.W, b.W]), np.stack([a.v, b.v]))
    with pytest.raises(OracleInconsistentError):
        learn_membership(MembershipQueryOracle(two), W_max=50.0, bits=30, verify=200)


def test_n_learning_queries_leaves_out_the_verification():
    """Fails before the fix: no n_verify_queries in diagnostics, so n_learning_queries counted them."""
    target = random_single_head(3, seed=5)
    rec = learn_membership(MembershipQueryOracle(target), W_max=8.0, bits=12)
    assert rec.diagnostics["n_verify_queries"] == 200
    assert rec.n_learning_queries == membership_query_count(3, 12) == rec.n_queries - 200
    rec0 = learn_membership(MembershipQueryOracle(target), W_max=8.0, bits=12, verify=0)
    assert rec0.diagnostics["n_verify_queries"] == 0 and rec0.n_learning_queries == rec0.n_queries


def test_an_offset_head_stuck_at_the_edge_is_not_blamed_on_W_max_alone():
    """An adversarial tester's finding: f + 0.1 (||W*|| about 3, W_max = 1e4) was told 'W_max is too
    small, pass a larger W_max', which never helps; the message names both causes and how to tell."""
    from companion.attention import SingleHead
    from companion.errors import OracleInconsistentError
    from companion.membership import MembershipQueryOracle, learn_membership

    rng = np.random.default_rng(0)
    head = SingleHead(rng.standard_normal((4, 4)), rng.standard_normal(4))
    with pytest.raises(OracleInconsistentError, match=r"Either W_max=10000 is too small, or the oracle is not a "
                                                      r"single head .*constant offset"):
        learn_membership(MembershipQueryOracle(lambda X: head(X) + 0.1, d=4), W_max=1e4, bits=20)
    assert np.linalg.norm(head.W) < 1e4
