"""Pinned rules of ``companion.oracles``: the budget at its limit, the perturbation mode's range and
size, the formats' unit roundoffs, the precision measurements' formulas and query counts, the noise
models' tolerances at their boundaries, and the antisymmetrised oracle's factor 2, each recomputed
from the docstrings with plain numpy.
"""

import numpy as np
import pytest

from companion import oracles as O
from companion.attention import SingleHead, random_single_head
from companion.errors import BudgetExceededError, InvalidInputError, OracleInconsistentError

HEAD = SingleHead(np.array([[0.3, -0.1], [0.2, 0.5]]), np.array([0.5, -0.25]))


# --- budget -------------------------------------------------------------------------------


def test_a_batch_of_exactly_the_remaining_budget_is_answered_one_more_refused_uncounted():
    oracle = O.ValueQueryOracle(HEAD, budget=5)
    oracle(np.ones((2, 1, 2)))
    with pytest.raises(BudgetExceededError):
        oracle(np.ones((4, 1, 2)))
    assert oracle.n_queries == 2 and oracle.remaining == 3
    oracle.require(3)
    with pytest.raises(BudgetExceededError):
        oracle.require(4)
    oracle(np.ones((3, 1, 2)))
    assert oracle.n_queries == 5 and oracle.remaining == 0


def test_zero_budget_answers_nothing_and_negative_is_refused():
    with pytest.raises(BudgetExceededError):
        O.ValueQueryOracle(HEAD, budget=0)(np.ones((1, 1, 2)))
    with pytest.raises(InvalidInputError):
        O.ValueQueryOracle(HEAD, budget=-1)


# --- perturbation test mode ---------------------------------------------------------------


@pytest.mark.parametrize("raw, k", [("", 0), ("0", 0), (" 7 ", 7), ("1000", 1000)])
def test_perturbation_ulps_accepts_zero_to_1000(monkeypatch, raw, k):
    monkeypatch.setenv(O.PERTURB_ENV, raw)
    assert O.perturbation_ulps() == k


@pytest.mark.parametrize("raw", ["1001", "-1", "2.5", "x"])
def test_perturbation_ulps_refuses_outside(monkeypatch, raw):
    monkeypatch.setenv(O.PERTURB_ENV, raw)
    with pytest.raises(InvalidInputError):
        O.perturbation_ulps()


def test_perturb_moves_each_answer_by_exactly_k_eps_relative():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 3, 4))
    y = np.ones(300)
    rel = O.perturb(y, X, 5) - 1.0
    assert np.all(np.abs(rel) == 5 * 2.0**-52)
    assert 0.3 < np.mean(rel > 0) < 0.7  # both signs
    np.testing.assert_array_equal(O.perturb(y, X, 0), y)
    np.testing.assert_array_equal(O.perturb(y, X, 5), O.perturb(y, X.copy(), 5))  # deterministic


def test_perturbed_oracle_answers(monkeypatch):
    monkeypatch.setenv(O.PERTURB_ENV, "3")
    X = np.random.default_rng(1).standard_normal((20, 2, 2))
    y = O.ValueQueryOracle(HEAD)(X)
    np.testing.assert_array_equal(y, O.perturb(HEAD(X), X, 3))
    np.testing.assert_allclose(np.abs(y / HEAD(X) - 1.0), 3 * 2.0**-52, rtol=0.2)


# --- formats ----------------------------------------------------------------------------------


def test_unit_roundoff_is_two_to_minus_fraction_bits_plus_one():
    assert O.FORMATS == {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}
    for fmt, p in O.FORMATS.items():
        assert O.unit_roundoff(fmt) == 2.0 ** -(p + 1)
    assert O.unit_roundoff("float32") == np.finfo(np.float32).eps / 2
    assert O.unit_roundoff("float16") == np.finfo(np.float16).eps / 2


def test_nearest_format_switches_at_the_geometric_mean():
    mid = np.sqrt(2.0**-24 * 2.0**-11)  # float32 and float16
    assert O.nearest_format(mid * 0.99) == "float32"
    assert O.nearest_format(mid * 1.01) == "float16"
    assert O.nearest_format(0.0) == O.nearest_format(-1.0) == "float64"


def test_as_precision_accepts_up_to_one_half_and_refuses_zero():
    assert O.as_precision(0.5) == 0.5
    assert O.as_precision("bfloat16") == 2.0**-8
    for bad in (np.nextafter(0.5, 1.0), 0.0, -1e-3):
        with pytest.raises(InvalidInputError):
            O.as_precision(bad)


def test_stated_precision_reads_the_oracle_or_the_wrapped_one():
    oracle = O.ValueQueryOracle(HEAD, precision="float32")
    assert O.stated_precision(oracle) == 2.0**-24
    assert O.stated_precision(O.AntisymmetrisedOracle(oracle)) == 2.0**-24
    assert O.stated_precision(O.ValueQueryOracle(HEAD)) is None


def test_round_bfloat16_ties_to_even():
    y = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, -(1.0 + 2.0**-8)])
    np.testing.assert_array_equal(O.round_bfloat16(y), [1.0, 1.0 + 2.0**-6, 1.0 + 2.0**-7, -1.0])


def test_significant_bits():
    assert O.significant_bits(np.array([1.0])) == 1
    assert O.significant_bits(np.array([1.5, 1.0])) == 2
    assert O.significant_bits(np.array([1.0 + 2.0**-52])) == 53
    assert O.significant_bits(np.array([0.0, np.inf])) == 0
    assert O.significant_bits(np.float32(1 / 3)) == 24


# --- measure_precision / measure_one_token_precision ----------------------------------------------


class Recording:
    """A float32-rounding head oracle that records the batches it answers."""

    def __init__(self, head, budget=None):
        self.inner = O.ValueQueryOracle(lambda X: np.float32(head(X)).astype(np.float64), d=head.d, budget=budget)
        self.d, self.batches = head.d, []

    @property
    def n_queries(self):
        return self.inner.n_queries

    def require(self, n, learner=""):
        self.inner.require(n, learner=learner)

    def __call__(self, X):
        X = np.asarray(X)
        y = self.inner(X)
        self.batches.append((X.copy(), np.asarray(y)))
        return y


def test_measure_precision_formula_and_queries():
    head = random_single_head(5, seed=0)
    n, length = 6, 4
    oracle = Recording(head)
    m = O.measure_precision(oracle, n=n, length=length, seed=3)
    # the invariance pairs, n // 2 tiny steps and repeats, and (float32 answers are quantized) the family
    assert m["n_queries"] == 3 * n + 2 * (n // 2) + O.FAMILY_POINTS == oracle.n_queries
    (X0, y0), (X1, y1), (P, y2), (R, y3), (T, _), (A, y5), (F, _) = oracle.batches
    X, y1 = np.concatenate([X0, X1]), np.concatenate([y0, y1])  # the first n // 2 asked alone
    np.testing.assert_allclose(X, np.random.default_rng(3).standard_normal((n, length, 5)) / np.sqrt(5), rtol=1e-15)
    np.testing.assert_array_equal(A, X[: n // 2])
    np.testing.assert_array_equal(y5, y1[: n // 2])
    assert np.allclose(np.abs(T / X[: n // 2] - 1), O.TINY_STEP, rtol=1e-2) and F.shape == (O.FAMILY_POINTS, length, 5)
    assert m["quantized"] and m["kind"] == "rounding" and m["u_repeat"] == 0
    np.testing.assert_array_equal(P[:, -1], X[:, -1])
    np.testing.assert_array_equal(P[:, :-1], X[:, -2::-1])
    assert R.shape == (n, 2 * length, 5)
    np.testing.assert_array_equal(R[:, 0], X[:, 0])
    np.testing.assert_array_equal(R[:, 1], X[:, 0])
    np.testing.assert_array_equal(R[:, -1], X[:, -1])
    Y = np.stack([y1, y2, y3])
    spread = np.median(Y.max(axis=0) - Y.min(axis=0)) / np.sqrt(np.mean(Y**2))
    assert m["u_spread"] == pytest.approx(spread, rel=1e-12)
    assert m["u_granularity"] == 2.0 ** -m["bits"] and m["bits"] <= 24
    assert m["u"] == max(spread, 2.0 ** -m["bits"])
    assert m["format"] == "float32"


def test_measure_precision_budget_is_3n_before_the_first_query_and_length_at_least_3():
    head = random_single_head(3, seed=0)
    need = 3 * 4 + 2 * 2 + O.FAMILY_POINTS  # float32 answers: quantized, so the family is asked too
    oracle = Recording(head, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        O.measure_precision(oracle, n=4)
    assert oracle.n_queries == 0
    assert O.measure_precision(Recording(head, budget=need), n=4)["n_queries"] == need
    O.measure_precision(Recording(head), n=2, length=3)
    with pytest.raises(InvalidInputError):
        O.measure_precision(Recording(head), n=2, length=2)


def test_measure_one_token_precision_formula_and_queries():
    from companion.ffn import FeedForward

    net = FeedForward(np.array([[1.0, -0.5], [0.3, 0.8], [0.0, 1.0]]), np.array([1.0, -2.0]))
    oracle = Recording(net)
    n = 5
    m = O.measure_one_token_precision(oracle, n=n, seed=2)
    assert m["n_queries"] == 2 * n == oracle.n_queries
    (Xq, y), = oracle.batches
    x = np.random.default_rng(2).standard_normal((n, 3)) / np.sqrt(3)
    np.testing.assert_allclose(Xq[:n, 0], x, rtol=1e-15)
    np.testing.assert_allclose(Xq[n:, 0], 3.0 * x, rtol=1e-15)
    y1, y3 = y[:n], y[n:] / 3
    assert m["u_spread"] == pytest.approx(np.median(np.abs(y3 - y1)) / np.sqrt(np.mean(y1**2)), rel=1e-12)
    assert m["u"] == 2.0 ** -m["bits"] and m["format"] == "float32"
    with pytest.raises(BudgetExceededError):
        O.measure_one_token_precision(Recording(net, budget=2 * n - 1), n=n)


# --- ApproxValueQueryOracle ---------------------------------------------------------------------


def test_round_tau_is_half_a_unit_in_the_last_digit_plus_two_to_minus_50():
    for k in (1, 3, 17):
        assert O.round_tau(k) == 0.5 * 10.0**-k + 2.0**-50
    for bad in (0, 18):
        with pytest.raises(InvalidInputError):
            O.round_tau(bad)


def test_round_significant_recomputed():
    y = np.array([0.123456, -98.7654, 0.0, 3.14159e-7])
    np.testing.assert_allclose(O.round_significant(y, 3), [0.123, -98.8, 0.0, 3.14e-7], rtol=1e-14)


def test_default_tolerances_of_the_format_noise_models():
    assert O.FORMAT_TAU == {"float16": 2.0**-12, "bfloat16": 2.0**-9 + 2.0**-25}
    assert O.ApproxValueQueryOracle(HEAD, None, noise="float16").tau == 2.0**-12
    assert O.ApproxValueQueryOracle(HEAD, None, noise="round", digits=4).tau == O.round_tau(4)
    with pytest.raises(InvalidInputError):
        O.ApproxValueQueryOracle(HEAD, None)
    with pytest.raises(InvalidInputError):
        O.ApproxValueQueryOracle(HEAD, -1e-9)


def test_float16_rounding_error_exactly_tau_is_answered_and_just_above_refused():
    y0 = 1.0 + 2.0**-11  # a tie in float16: rounds to 1.0, error 2^-11

    def target(X):
        return np.full(len(X), y0)

    X = np.ones((1, 1, 2))
    assert O.ApproxValueQueryOracle(target, 2.0**-11, noise="float16", d=2)(X) == 1.0
    with pytest.raises(OracleInconsistentError):
        O.ApproxValueQueryOracle(target, np.nextafter(2.0**-11, 0.0), noise="float16", d=2)(X)


def test_decimal_rounding_error_exactly_tau_is_answered_and_just_above_refused():
    y0 = 0.12345

    def target(X):
        return np.full(len(X), y0)

    err = abs(O.round_significant(np.array([y0]), 3)[0] - y0)
    X = np.ones((1, 1, 2))
    assert O.ApproxValueQueryOracle(target, err, noise="round", digits=3, d=2)(X) == pytest.approx(0.123)
    with pytest.raises(OracleInconsistentError):
        O.ApproxValueQueryOracle(target, np.nextafter(err, 0.0), noise="round", digits=3, d=2)(X)


def test_uniform_noise_stays_within_tau_and_is_deterministic():
    tau = 1e-3
    oracle = O.ApproxValueQueryOracle(HEAD, tau, seed=4)
    X = np.random.default_rng(0).standard_normal((500, 3, 2))
    y = oracle(X)
    assert np.max(np.abs(y - HEAD(X))) <= tau
    assert np.max(np.abs(y - HEAD(X))) > 0.9 * tau  # uses the whole band
    np.testing.assert_array_equal(oracle(X), y)


def test_worst_noise_signs():
    tau = 1e-3
    oracle = O.ApproxValueQueryOracle(HEAD, tau, noise="worst")
    X1 = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # f* = 0.5, -0.25: pulled towards 0
    np.testing.assert_allclose(oracle(X1), [0.5 - tau, -0.25 + tau], rtol=0, atol=1e-15)
    X2 = np.random.default_rng(1).standard_normal((30, 2, 2))
    f = HEAD(X2)
    s = np.sign(f - X2[:, -1, :] @ HEAD.v)
    np.testing.assert_allclose(oracle(X2), f + tau * s, rtol=0, atol=1e-15)


def test_antisymmetrised_oracle_counts_two_per_sequence_and_halves_the_budget():
    base = O.ApproxValueQueryOracle(HEAD, 1e-4, budget=11)
    anti = O.AntisymmetrisedOracle(base)
    assert anti.tau == 2e-4
    assert anti.remaining == 5  # 11 // 2
    anti.require(5)
    with pytest.raises(BudgetExceededError):
        anti.require(6)
    X = np.random.default_rng(2).standard_normal((3, 2, 2))
    y = anti(X)
    assert base.n_queries == 6 == anti.n_queries
    np.testing.assert_allclose(y, HEAD(X) - HEAD(-X), atol=2e-4)


def test_target_returning_nan_or_the_wrong_count_is_an_inconsistent_oracle():
    with pytest.raises(OracleInconsistentError):
        O.ValueQueryOracle(lambda X: np.full(len(X), np.nan), d=2)(np.ones((2, 1, 2)))
    with pytest.raises(OracleInconsistentError, match=r"3 answers \(an array of shape \(3,\)\) for a batch of 2"):
        O.ValueQueryOracle(lambda X: np.zeros(3), d=2)(np.ones((2, 1, 2)))
    # one row per query is not one number per query: the message shows the shape (a user's finding)
    with pytest.raises(OracleInconsistentError, match=r"8 answers \(an array of shape \(4, 2\)\) for a batch of 4 "
                                                      r"queries: .* one number per query, shape \(4,\)"):
        O.ValueQueryOracle(lambda X: np.zeros((len(X), 2)), d=2)(np.ones((4, 1, 2)))
    # and says what to do with a vector-valued model (a new user's finding)
    with pytest.raises(OracleInconsistentError, match=r"targets\.from_callable\(\.\.\., readout=c\), or ask it "
                                                      r"through companion\.oracles\.VectorQueryOracle"):
        O.ValueQueryOracle(lambda X: np.zeros((len(X), 2)), d=2)(np.ones((4, 1, 2)))


def test_record_keeps_every_query_and_answer_in_order():
    oracle = O.ValueQueryOracle(HEAD, record=True)
    X = [np.ones((1, 2)), np.array([[1.0, 0.0], [0.0, 1.0]])]
    y = oracle(X)
    assert len(oracle.log) == 2
    for (x, a), x0, y0 in zip(oracle.log, X, y):
        np.testing.assert_array_equal(x, x0)
        assert a == y0


def test_hash_noise_is_in_minus_one_one_and_depends_on_the_query_and_seed():
    X = np.random.default_rng(0).standard_normal((2000, 2, 3))
    u = O._hash_uniform(X, 5)
    assert np.all((u >= -1) & (u < 1)) and abs(np.mean(u)) < 0.05
    np.testing.assert_array_equal(u, O._hash_uniform(X.copy(), 5))
    assert np.mean(u == O._hash_uniform(X, 6)) < 0.01
    Z = np.zeros((1, 1, 3))
    assert O._hash_uniform(Z, 0)[0] == O._hash_uniform(-Z, 0)[0]  # -0.0 is 0.0


def test_construction_refusals():
    with pytest.raises(InvalidInputError):
        O.ApproxValueQueryOracle(HEAD, 1e-3, digits=3)  # digits only with noise="round"
    with pytest.raises(InvalidInputError):
        O.ApproxValueQueryOracle(HEAD, None, noise="round")
    with pytest.raises(InvalidInputError):
        O.ApproxValueQueryOracle(lambda X: np.zeros(len(X)), 1e-3, noise="worst", d=2)
    served = O.ApproxValueQueryOracle(HEAD, 0.5, noise="none")
    X = np.ones((3, 2, 2))
    np.testing.assert_array_equal(served(X), HEAD(X))


def test_round_to_each_format():
    x = np.array([1.0 + 2.0**-30, 1.0 / 3.0, 1e-3])
    np.testing.assert_array_equal(O.round_to(x, "float64"), x)
    np.testing.assert_array_equal(O.round_to(x, "float32"), x.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(O.round_to(x, "float16"), x.astype(np.float16).astype(np.float64))
    np.testing.assert_array_equal(O.round_to(x, "bfloat16"), O.round_bfloat16(x))
    assert np.all(np.abs(O.round_to(x, "bfloat16") - x) <= 2.0**-8 * np.abs(x) * (1 + 2.0**-16))


def test_measure_precision_of_a_zero_oracle_is_zero():
    m = O.measure_precision(O.ValueQueryOracle(lambda X: np.zeros(len(X)), d=2), n=2)
    assert m["u"] == m["u_spread"] == m["u_granularity"] == 0.0 and m["bits"] == 0 and m["format"] == "float64"


# --- an adversarial tester's findings (session 44) -----------------------------------------------------


def test_complex_answers_are_refused_not_cut_to_their_real_part():
    with pytest.raises(OracleInconsistentError, match="returned complex answers for a batch of 1 queries"):
        O.ValueQueryOracle(lambda X: np.ones(len(X)) * 1j, d=2)(np.ones((1, 1, 2)))


def test_a_d_that_disagrees_with_the_model_and_a_record_that_is_not_a_bool_are_refused():
    from companion.attention import random_single_head

    head = random_single_head(3, seed=0)
    assert O.ValueQueryOracle(head, d=3).d == 3  # agreeing: accepted
    with pytest.raises(InvalidInputError, match=r"d=4 disagrees with the target's own d=3; omit d, or pass d=3"):
        O.ValueQueryOracle(head, d=4)
    with pytest.raises(InvalidInputError, match="record must be True or False; got 'no'"):
        O.ValueQueryOracle(head, record="no")


def test_a_readout_names_its_vector_oracles_budget():
    from companion.attention import random_single_head
    from companion.errors import BudgetExceededError
    from companion.exact import learn_single_head

    head = random_single_head(3, seed=0)
    V = O.VectorQueryOracle(lambda X: np.stack([head(X), 2 * head(X)], axis=1), d=3, d_out=2, budget=10)
    with pytest.raises(BudgetExceededError, match="only 10 left of its budget of 10"):
        learn_single_head(V.readout([1, 0]))
    with pytest.raises(BudgetExceededError, match="only 10 of the budget of 10 remain"):
        V.readout([1, 0])(np.ones((11, 1, 3)))
    assert V.readout([1, 0]).budget == 10


def test_a_target_returning_None_a_seed_beyond_uint64_and_a_non_bool_progress_are_named():
    from companion.attention import random_single_head

    with pytest.raises(OracleInconsistentError, match="the target returned None for a batch of 1 queries"):
        O.ValueQueryOracle(lambda X: None, d=2)(np.ones((1, 1, 2)))
    head = random_single_head(3, seed=0)
    assert O.ApproxValueQueryOracle(head, 0.1, seed=2**64 - 1)(np.ones((1, 1, 3))).shape == (1,)  # just inside
    with pytest.raises(InvalidInputError, match=r"seed=18446744073709551616 must be <= 18446744073709551615"):
        O.ApproxValueQueryOracle(head, 0.1, seed=2**64)  # just outside: refused before any query
    with pytest.raises(InvalidInputError, match="progress must be None, True or False; got 'no'"):
        O.ValueQueryOracle(head, progress="no")
