"""Oracles: counting, budgets, logs, bad input, and the approximate oracle's contract."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.attention import SingleHead, random_single_head
from companion.errors import BudgetExceededError, InvalidInputError, OracleInconsistentError
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle, round_significant


@pytest.fixture
def head():
    return random_single_head(3, seed=0)


def test_counts_each_sequence_once(head):
    oracle = ValueQueryOracle(head)
    rng = np.random.default_rng(0)
    oracle(rng.standard_normal((2, 3)))
    oracle(rng.standard_normal((5, 4, 3)))
    oracle([rng.standard_normal((1, 3)), rng.standard_normal((4, 3))])
    assert oracle.n_queries == 1 + 5 + 2
    assert oracle.remaining == np.inf


def test_answers_equal_the_target(head):
    X = np.random.default_rng(1).standard_normal((6, 3, 3))
    np.testing.assert_array_equal(ValueQueryOracle(head)(X), head(X))


def test_budget_refuses_before_answering(head):
    oracle = ValueQueryOracle(head, budget=5)
    oracle(np.ones((3, 1, 3)))
    with pytest.raises(BudgetExceededError, match=r"3 more queries requested, but only 2 of the budget of 5"):
        oracle(np.ones((3, 1, 3)))
    assert oracle.n_queries == 3           # the refused batch cost nothing
    oracle(np.ones((2, 1, 3)))
    assert oracle.remaining == 0
    with pytest.raises(BudgetExceededError):
        oracle.require(1)
    with pytest.raises(BudgetExceededError, match=r"needs 4 queries, but the oracle has only 0 left"):
        oracle.require(4, learner="me")


def test_log_keeps_copies(head):
    oracle = ValueQueryOracle(head, record=True)
    X = np.ones((2, 3))
    y = oracle(X)
    X[0, 0] = 99.0                          # mutating the caller's array changes no record
    (Xl, yl), = oracle.log
    assert Xl[0, 0] == 1.0 and yl == y


def test_target_receives_a_copy():
    seen = []

    class Sneaky:
        d = 2

        def __call__(self, X):
            X[...] = 0.0                     # a target that scribbles on its input
            seen.append(X)
            return np.zeros(X.shape[0])

    X = np.ones((1, 2, 2))
    ValueQueryOracle(Sneaky())(X)
    assert np.all(X == 1.0)


def test_non_finite_answer_is_refused():
    class Broken:
        d = 2

        def __call__(self, X):
            return np.full(X.shape[0], np.nan)

    with pytest.raises(OracleInconsistentError, match=r"non-finite answer \(nan\) for query 0"):
        ValueQueryOracle(Broken())(np.ones((1, 2)))


@pytest.mark.parametrize("X, message", [
    (np.array([[np.inf, 0, 0]]), r"NaN or inf"),
    (np.zeros((2, 4)), r"last axis d=3"),
    (np.zeros((0, 3)), r"N=0"),
    ([], r"empty list"),
])
def test_bad_queries(head, X, message):
    oracle = ValueQueryOracle(head)
    with pytest.raises(InvalidInputError, match=message):
        oracle(X)
    assert oracle.n_queries == 0


def test_bad_construction(head):
    with pytest.raises(InvalidInputError, match=r"d must be an integer"):
        ValueQueryOracle(lambda X: X[:, 0, 0], d=2.0)
    with pytest.raises(InvalidInputError, match=r"no attribute d"):
        ValueQueryOracle(lambda X: X[:, 0, 0])
    with pytest.raises(InvalidInputError, match=r"budget=-1 must be >= 0"):
        ValueQueryOracle(head, budget=-1)
    with pytest.raises(InvalidInputError, match=r"must be callable"):
        ValueQueryOracle(np.eye(3))
    with pytest.raises(InvalidInputError, match=r"noise='gauss' is not one of"):
        ApproxValueQueryOracle(head, 0.1, noise="gauss")
    with pytest.raises(InvalidInputError, match=r"tau=-0\.1 must be >= 0"):
        ApproxValueQueryOracle(head, -0.1)
    with pytest.raises(InvalidInputError, match=r'needs digits'):
        ApproxValueQueryOracle(head, 0.1, noise="round")


@pytest.mark.parametrize("noise, kwargs", [("uniform", {}), ("worst", {}), ("round", {"digits": 4})])
def test_approx_oracle_is_deterministic_and_within_tau(head, noise, kwargs):
    tau = None if noise == "round" else 1e-3
    oracle = ApproxValueQueryOracle(head, tau, noise=noise, seed=3, **kwargs)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((500, 3, 3)) / 3
    first = oracle(X)
    np.testing.assert_array_equal(first, oracle(X.copy()))                 # same X, same answer
    np.testing.assert_array_equal(first[:7], oracle(list(X[:7])))        # however it is sent
    assert np.all(np.abs(first - head(X)) <= oracle.tau)
    assert np.any(first != head(X))


def test_uniform_noise_depends_on_x_and_seed(head):
    X = np.random.default_rng(0).standard_normal((2000, 2, 3))
    e1 = ApproxValueQueryOracle(head, 1.0, seed=0)(X) - head(X)
    e2 = ApproxValueQueryOracle(head, 1.0, seed=1)(X) - head(X)
    assert abs(np.mean(e1)) < 0.05 and abs(np.std(e1) - 1 / np.sqrt(3)) < 0.03   # ~ U[-1, 1)
    assert abs(np.corrcoef(e1, e2)[0, 1]) < 0.1
    zero, negzero = np.zeros((1, 3)), -np.zeros((1, 3))
    oracle = ApproxValueQueryOracle(head, 1.0)
    assert oracle(zero) == oracle(negzero)


def test_worst_noise_signs():
    head = SingleHead(np.zeros((2, 2)), np.array([0.5, -0.25]))
    oracle = ApproxValueQueryOracle(head, 0.01, noise="worst")
    # length 1: pulled towards 0
    assert oracle(np.array([[1.0, 0.0]])) == pytest.approx(0.49)
    assert oracle(np.array([[0.0, 1.0]])) == pytest.approx(-0.24)
    # length 2: pushed away from the query token's own value x_N^T v
    X = np.array([[1.0, 0.0], [0.0, 1.0]])          # f = (0.5 - 0.25)/2 = 0.125 > x_N^T v = -0.25
    assert oracle(X) == pytest.approx(0.135)


def test_round_noise_and_its_contract():
    np.testing.assert_array_equal(round_significant(np.array([0.123456, -98765.0, 0.0]), 3),
                                  [0.123, -98800.0, 0.0])
    head = SingleHead(np.zeros((1, 1)), np.array([123.456]))
    with pytest.raises(OracleInconsistentError, match=r"moves it by .* > tau"):
        ApproxValueQueryOracle(head, None, noise="round", digits=3)(np.ones((1, 1)))
    ok = ApproxValueQueryOracle(head, 0.5, noise="round", digits=3)
    assert ok(np.ones((1, 1))) == 123.0


@settings(max_examples=40, deadline=None)
@given(tau=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1), b=st.integers(1, 20))
def test_property_uniform_within_tau(tau, seed, b):
    head = random_single_head(2, seed=1)
    X = np.random.default_rng(seed).standard_normal((b, 2, 2))
    y = ApproxValueQueryOracle(head, tau, seed=seed)(X)
    assert np.all(np.abs(y - head(X)) <= tau)


@pytest.mark.parametrize("digits", [1, 2, 3, 4, 6, 9])
def test_round_default_tau_is_the_rounding_error_below_one(digits):
    # §6 has |f*| <= 1; rounding y in (-1, 1) to k significant digits moves it by at most
    # 0.5 * 10**-k (not 0.5 * 10**(1 - k), the bound for |y| < 10, ten times larger)
    from companion.oracles import round_tau

    y = np.random.default_rng(digits).uniform(-1, 1, 200_000)
    y = np.concatenate([y, 0.1 + 10.0 ** -digits * (np.arange(1, 200) - 0.5),   # near half-units
                        [0.99999999, -0.99999999, 1.0, -1.0]])
    y = y[np.abs(y) <= 1.0]
    largest = float(np.max(np.abs(round_significant(y, digits) - y)))
    tau = ApproxValueQueryOracle(SingleHead(np.zeros((1, 1)), np.array([0.5])), None,
                                 noise="round", digits=digits).tau
    assert tau == round_tau(digits)
    assert largest <= tau <= 2 * largest
    assert abs(tau - 0.5 * 10.0 ** -digits) <= 2.0 ** -50


def test_round_default_tau_contract_at_the_scale_edge():
    # |f*| just below 1 is within the default tau; |f*| above 1 can move by 10x more and is refused
    from companion.oracles import round_tau

    head = SingleHead(np.zeros((1, 1)), np.array([0.99996]))
    assert ApproxValueQueryOracle(head, None, noise="round", digits=4)(np.ones((1, 1))) == 1.0
    assert round_tau(4) >= abs(1.0 - 0.99996)
    big = SingleHead(np.zeros((1, 1)), np.array([1.2345]))
    with pytest.raises(OracleInconsistentError, match=r"moves it by .* > tau"):
        ApproxValueQueryOracle(big, None, noise="round", digits=4)(np.ones((1, 1)))
    ok = ApproxValueQueryOracle(big, 0.5 * 10.0 ** (1 - 4), noise="round", digits=4)
    assert ok(np.ones((1, 1))) == pytest.approx(1.234)

def test_oracle_hands_library_heads_the_batch_and_copies_for_others():
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle

    head = random_single_head(5, rank=2, factored=True, seed=0)
    X = np.random.default_rng(0).standard_normal((4, 2, 5))
    before = X.copy()
    assert np.array_equal(ValueQueryOracle(head)(X), head(X)) and np.array_equal(X, before)

    class Mutating:
        d = 5

        def __call__(self, Z):
            Z[...] = 0.0                      # a careless target: the oracle must shield the learner
            return np.zeros(len(Z))

    ValueQueryOracle(Mutating())(X)
    assert np.array_equal(X, before)
