"""Pinned rules of ``companion._learner`` (the skeleton every learner shares): each threshold at
its boundary and on both sides, each documented formula recomputed independently with plain numpy
from its docstring, each count.
"""

import numpy as np
import pytest
from scipy.optimize import brentq

from companion import _learner as L
from companion.attention import SingleHead, random_single_head
from companion.errors import (
    BudgetExceededError,
    InvalidInputError,
    OracleInconsistentError,
    PrecisionError,
)
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle

U64 = 2.0**-53  # half an ulp of 1 in float64


def _sigma(t):
    return 1.0 / (1.0 + np.exp(-t))


class ConstantOracle:
    """An oracle answering every query with ``value`` (counts its queries and their lengths)."""

    def __init__(self, d, value, precision=None):
        self.d, self.value, self.n_queries, self.lengths = d, value, 0, []
        if precision is not None:
            self.precision = precision

    def __call__(self, X):
        X = list(X)
        self.n_queries += len(X)
        self.lengths.extend(len(x) for x in X)
        return np.full(len(X), self.value)


def test_float64_u_is_half_an_ulp_of_one():
    assert L.FLOAT64_U == 2.0**-53


def test_best_logit_solves_t_tanh_t_over_2_equals_one():
    # argmax t sigma'(t): d/dt [t s (1 - s)] = s (1 - s) (1 + t (1 - 2 s)) = 0  <=>  t tanh(t/2) = 1
    t_star = brentq(lambda t: t * np.tanh(t / 2) - 1.0, 0.5, 3.0, xtol=1e-15)
    assert L.BEST_LOGIT == pytest.approx(t_star, rel=1e-8)
    assert L.BEST_LOGIT == pytest.approx(1.5434, abs=1e-4)


@pytest.mark.parametrize("value", [0.4, 0.03, 7.0, 150.0])
def test_best_relative_scale_for_one_value_is_the_power_of_two_nearest_sqrt_t_star_over_L(value):
    # one value: the cost 1 / (c^2 sigma'(c^2 L)) is least at c^2 L = t*; c rounded to 2^k in log2
    t_star = brentq(lambda t: t * np.tanh(t / 2) - 1.0, 0.5, 3.0)
    log2_c = 0.5 * np.log2(t_star / value)
    assert abs(log2_c - np.floor(log2_c) - 0.5) > 0.05, "a value away from a rounding tie"
    assert L.best_relative_scale([value]) == 2.0 ** np.round(log2_c)
    assert L.best_relative_scale([-value]) == 2.0 ** np.round(log2_c)  # |L|


def test_best_relative_scale_for_many_values_minimises_the_summed_cost():
    values = np.array([0.05, 0.4, 2.0, -1.0])
    grid = np.linspace(-8, 8, 160001)  # log2 c
    c2 = 4.0**grid
    t = c2[:, None] * np.abs(values)[None, :]
    with np.errstate(over="ignore", divide="ignore"):
        cost = np.sum(1.0 / (c2[:, None] * _sigma(t) * _sigma(-t)), axis=1)
    best = grid[np.argmin(cost)]
    assert abs(best - np.floor(best) - 0.5) > 0.05
    assert L.best_relative_scale(values) == 2.0 ** np.round(best)


def test_best_relative_scale_of_zeros_is_one():
    assert L.best_relative_scale([0.0, 0.0]) == 1.0


def test_measurement_errors_formula_at_the_scale_used_and_at_the_best_logit():
    rng = np.random.default_rng(0)
    k = 5
    u, Lv, C = 2.0**-24, rng.standard_normal(k), rng.uniform(0.5, 2.0, k)
    av, bv = rng.standard_normal(k), rng.standard_normal(k)
    t = C**2 * Lv
    a = _sigma(t)
    expected = u * np.abs(bv + a * av) / (np.abs(av) * C**2 * a * (1 - a))
    np.testing.assert_allclose(L.measurement_errors(u, Lv, C, av, bv), expected, rtol=1e-12)
    t_star = brentq(lambda s: s * np.tanh(s / 2) - 1.0, 0.5, 3.0, xtol=1e-15)
    best = u * np.abs(bv + a * av) / np.abs(av) * np.abs(Lv) / (t_star * _sigma(t_star) * _sigma(-t_star))
    np.testing.assert_allclose(L.measurement_errors(u, Lv, C, av, bv, best=True), best, rtol=1e-8)


# --- saturation_band: max(band, 2 n u), n = 8 roundings ------------------------------------


def test_saturation_band_is_band_until_sixteen_u_exceeds_it():
    assert L.TWO_TOKEN_ROUNDINGS == 8
    band = 1e-3
    u_edge = band / 16
    assert L.saturation_band(u_edge, band) == pytest.approx(band, rel=1e-15)
    assert L.saturation_band(u_edge * 0.5, band) == band
    assert L.saturation_band(u_edge * 2, band) == pytest.approx(2 * band, rel=1e-15)
    assert L.saturation_band(2.0**-8, band) == pytest.approx(16 * 2.0**-8, rel=1e-15)  # bfloat16
    assert L.saturation_band(U64, band) == band


# --- rounding_size: sqrt(2 ln(2 n / 1e-6)) sqrt(n), n floored at 1 ------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 800, 12345])
def test_rounding_size_is_lambda_sqrt_n_with_a_one_in_a_million_false_alarm(n):
    lam = np.sqrt(2 * np.log(2 * n / 1e-6))
    assert L.P_FALSE_ALARM == 1e-6
    assert L.rounding_size(n) == pytest.approx(lam * np.sqrt(n), rel=1e-12)


def test_rounding_size_floors_n_at_one():
    assert L.rounding_size(0) == L.rounding_size(0.5) == pytest.approx(np.sqrt(2 * np.log(2e6)), rel=1e-12)


def test_rounding_tolerance_is_size_times_u():
    assert L.rounding_tolerance(2.0**-24, 37.5) == 37.5 * 2.0**-24


# --- head_check_size: s(2d + 3N) (rho + 2 B) + learned ------------------------------------------


def test_head_check_size_recomputed_from_its_docstring():
    rng = np.random.default_rng(1)
    d, N = 4, 3
    W, v, x = rng.standard_normal((d, d)), rng.standard_normal(d), rng.standard_normal((N, d))
    kW, kv = 3.0, 0.5
    out = np.max(np.abs(x @ v))
    B = np.max(np.abs(x) @ np.abs(W) @ np.abs(x[-1]))
    rho = np.max(np.abs(x) @ np.abs(v)) / out
    n = 2 * d + 3 * N
    s = np.sqrt(2 * np.log(2 * n / 1e-6)) * np.sqrt(n)
    norms = np.sqrt(np.sum(x**2, axis=1))
    # a score error moves f by twice itself relative to the output scale; a value error, divided by it
    learned = 2 * kW * np.sqrt(np.sum(W**2)) * norms.max() * norms[-1] + kv * np.sqrt(v @ v) * norms.max() / out
    expected = s * (rho + 2 * B) + learned
    assert L.head_check_size(W, v, kW, kv)(x) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("scale", [1e-12, 1e-20, 1e100, 1e300])
def test_head_check_size_does_not_change_when_v_is_scaled(scale):
    """f's relative error does not change when v is scaled, nor may its check: the score term was
    divided by the output scale too, so v scaled by 1e-12 got a check 2.8e4 times looser (a fresh
    user's finding, 2026-12-02)."""
    rng = np.random.default_rng(1)
    W, v, x = rng.standard_normal((4, 4)), rng.standard_normal(4), rng.standard_normal((3, 4))
    assert L.head_check_size(W, scale * v, 3.0, 0.5)(x) == pytest.approx(
        L.head_check_size(W, v, 3.0, 0.5)(x), rel=1e-12)


# --- AnswerPrecision: coarse above 4 u64 (strict) ---------------------------------------------


def test_precision_is_coarse_strictly_above_four_float64_units():
    o = ConstantOracle(2, 0.0)
    assert not L.AnswerPrecision(o, 4 * U64).coarse
    assert L.AnswerPrecision(o, np.nextafter(4 * U64, 1.0)).coarse
    assert not L.AnswerPrecision(o, None).coarse
    assert L.AnswerPrecision(o, None).value == U64


def test_precision_diagnostics_values():
    o = ConstantOracle(2, 0.0, precision=2.0**-24)
    p = L.AnswerPrecision(o)
    assert p.diagnostics() == {
        "precision": 2.0**-24,
        "precision_source": "stated",
        "precision_format": "float32",
        "n_precision_queries": 0,
        "precision_kind": "rounding",
    }
    d = L.AnswerPrecision(ConstantOracle(2, 0.0)).diagnostics()
    assert d == {
        "precision": U64,
        "precision_source": "float64 assumed",
        "precision_format": "float64",
        "n_precision_queries": 0,
        "precision_kind": "rounding",
    }
    diag = {}
    p.report_floor(diag, "", 3.0)
    assert diag == {"kappa_W": 3.0, "floor_W": 3.0 * 2.0**-24, "floor_v": 2.0**-24}


# --- check_verify and reserve ----------------------------------------------------------------


def test_check_verify_accepts_zero_and_refuses_negative_or_zero_rtol():
    assert L.check_verify(0, 1e-9) == (0, 1e-9)
    with pytest.raises(InvalidInputError):
        L.check_verify(-1, 1e-9)
    with pytest.raises(InvalidInputError):
        L.check_verify(1, 0.0)


def test_reserve_accepts_exactly_the_remaining_budget_and_refuses_one_more():
    oracle = ValueQueryOracle(SingleHead(np.eye(2), np.ones(2)), budget=10)
    oracle(np.ones((3, 1, 2)))
    assert L.reserve(oracle, 7, "x") == 3
    with pytest.raises(BudgetExceededError):
        L.reserve(oracle, 8, "x")
    assert oracle.n_queries == 3


def test_default_verify_and_max_length():
    assert L.DEFAULT_VERIFY == 32
    assert L.VERIFY_MAX_LEN == 8


def test_random_queries_lengths_one_to_eight_and_tokens_scale_over_sqrt_d():
    d, n, seed, scale = 5, 400, 3, 2.5
    X = L.random_queries(d, n, seed=seed, scale=scale)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=n)
    assert [len(x) for x in X] == list(lengths)
    assert set(lengths) == set(range(1, 9))
    first = rng.standard_normal((int(lengths[0]), d)) * scale / np.sqrt(d)
    np.testing.assert_allclose(X[0], first, rtol=1e-14)


def test_random_queries_unit_ball_scales_long_tokens_to_norm_one_only():
    X = L.random_queries(3, 50, seed=0, scale=3.0)
    Y = L.random_queries(3, 50, seed=0, scale=3.0, unit_ball=True)
    for x, y in zip(X, Y):
        norms = np.linalg.norm(x, axis=1)
        np.testing.assert_allclose(y, x / np.maximum(1.0, norms)[:, None], rtol=1e-15)
        assert np.all(np.linalg.norm(y, axis=1) <= 1 + 1e-15)


# --- verify_outputs: err <= tol passes (inclusive), median tol >= 1/2 is vacuous ------------------


def _zero(X):
    return np.zeros(len(X))


def _one(x):
    return 1.0


def test_verify_outputs_accepts_a_disagreement_exactly_at_rtol_and_refuses_just_above():
    err = 2.0**-20
    info = L.verify_outputs(ConstantOracle(3, err), _zero, _one, 6, rtol=err, seed=0)
    assert info == {"n_verify_queries": 6, "verify_max_error": err, "verify_tolerance": err}
    with pytest.raises(OracleInconsistentError) as exc:
        L.verify_outputs(ConstantOracle(3, err), _zero, _one, 6, rtol=np.nextafter(err, 0.0), seed=0)
    assert exc.value.max_error == err


def test_verify_outputs_divides_by_the_output_scale():
    err, scale = 0.25, 8.0
    info = L.verify_outputs(ConstantOracle(2, err), _zero, lambda x: scale, 3, rtol=1.0, seed=0)
    assert info["verify_max_error"] == err / scale


def test_verify_outputs_tolerance_is_max_of_rtol_and_size_times_u():
    u = 2.0**-10
    prec = L.AnswerPrecision(ConstantOracle(2, 0.0), u)
    info = L.verify_outputs(
        ConstantOracle(2, 0.0), _zero, _one, 4, rtol=1e-12, seed=0, precision=prec, size=lambda x: 8.0
    )
    assert info["verify_tolerance"] == 8.0 * u
    info = L.verify_outputs(ConstantOracle(2, 0.0), _zero, _one, 4, rtol=0.2, seed=0, precision=prec, size=lambda x: 64.0)
    assert info["verify_tolerance"] == 0.2


def test_verify_outputs_median_tolerance_above_the_one_percent_ceiling_is_vacuous_at_it_is_not():
    u = 2.0**-10
    assert L.VACUOUS_TOLERANCE == 0.5 and L.VERIFY_CEILING == 0.01
    prec = L.AnswerPrecision(ConstantOracle(2, 0.0), u)
    above = np.nextafter(L.VERIFY_CEILING / u, np.inf)
    with pytest.raises(PrecisionError, match="above the ceiling of 1%"):
        L.verify_outputs(ConstantOracle(2, 0.0), _zero, _one, 5, rtol=1e-9, seed=0, precision=prec, size=lambda x: above)
    info = L.verify_outputs(
        ConstantOracle(2, 0.0), _zero, _one, 5, rtol=1e-9, seed=0, precision=prec, size=lambda x: L.VERIFY_CEILING / u
    )
    assert info["verify_tolerance"] <= L.VERIFY_CEILING


def test_verify_outputs_with_zero_queries_asks_nothing():
    o = ConstantOracle(2, 1.0)
    assert L.verify_outputs(o, _zero, _one, 0, rtol=1e-9, seed=0) == {"n_verify_queries": 0}
    assert o.n_queries == 0


def test_verify_outputs_asks_n_queries_of_lengths_one_to_eight():
    o = ConstantOracle(2, 0.0)
    L.verify_outputs(o, _zero, _one, 64, rtol=1e-9, seed=1)
    assert o.n_queries == 64 and min(o.lengths) == 1 and max(o.lengths) == 8


def test_verify_head_output_scale_is_max_abs_x_v():
    head = SingleHead(np.zeros((2, 2)), np.array([3.0, -1.0]))
    offset = 0.5

    class Shifted(ConstantOracle):
        def __call__(self, X):
            X = list(X)
            self.n_queries += len(X)
            self.xs = X
            return head(X) + offset

    o = Shifted(2, 0.0)
    info = L.verify_head(o, head.W, head.v, 10, rtol=10.0, seed=0)
    expected = max(offset / np.max(np.abs(x @ head.v)) for x in o.xs)
    assert info["verify_max_error"] == pytest.approx(expected, rel=1e-12)


# --- refuse_stated_rounding: u > 2^10 u64 (strict) -------------------------------------------------


def test_refuse_stated_rounding_strictly_above_1024_float64_units():
    assert L.COARSE_FACTOR == 2.0**10
    L.refuse_stated_rounding(ConstantOracle(2, 0.0, precision=1024 * U64), "why")
    L.refuse_stated_rounding(ConstantOracle(2, 0.0), "why")
    with pytest.raises(PrecisionError):
        L.refuse_stated_rounding(ConstantOracle(2, 0.0, precision=np.nextafter(1024 * U64, 1.0)), "why")


# --- verify_noisy: n_v = max(1, n // 4) length-1 queries, the allowances ---------------------------


@pytest.mark.parametrize("n, n_v", [(1, 1), (3, 1), (4, 1), (7, 1), (8, 2), (13, 3)])
def test_verify_noisy_spends_a_quarter_at_least_one_on_length_one_queries(n, n_v):
    head = random_single_head(3, seed=0)
    oracle = ValueQueryOracle(head, record=True)
    info = L.verify_noisy(oracle, head.W, head.v, n, tau=0.0, W_max=10.0, rtol=1e-6, seed=0)
    lengths = [len(x) for x, _ in oracle.log]
    assert lengths.count(1) == n_v
    assert lengths.count(2) == n - n_v
    assert info["n_verify_queries"] == n == oracle.n_queries


def test_verify_noisy_with_zero_v_spends_only_the_length_one_queries():
    oracle = ValueQueryOracle(SingleHead(np.eye(2), np.zeros(2)))
    info = L.verify_noisy(oracle, np.eye(2), np.zeros(2), 8, tau=0.0, W_max=4.0, rtol=1e-6, seed=0)
    assert info["n_verify_queries"] == 2 == oracle.n_queries
    assert info["verify_error_W"] == 0.0


def test_verify_noisy_allowances_recomputed():
    head = random_single_head(3, seed=1)
    nW, nv = np.linalg.norm(head.W), np.linalg.norm(head.v)
    below_W, below_v = np.nextafter(nW, 0.0), np.nextafter(nv, 0.0)
    cases = (
        (0.5 * nW, None, None, 100.0, []),
        (10 * nW, 0.5 * nW, 0.5 * nv, 1e-3, []),
        (10 * nW, below_W, below_v, 1e-3, []),  # just inside: a bound below the norm is allowed
        (10 * nW, nW, nv, 1e-3, ["W", "v"]),  # just outside: at the norm it certifies nothing
        (10 * nW, 1.0, 2.0, 1e-3, ["W", "v"]),
    )
    for W_max, allowed_W, allowed_v, rtol, vacuous in cases:
        info = L.verify_noisy(
            ValueQueryOracle(head), head.W, head.v, 8, tau=0.0, W_max=W_max, rtol=rtol, seed=0,
            allowed_W=allowed_W, allowed_v=allowed_v,
        )
        m = min(nW, W_max)
        exp_W = max(rtol * m, 0.0 if "W" in vacuous else allowed_W or 0.0) + 1e-9 * m + 1e-12
        exp_v = max(rtol * nv, 0.0 if "v" in vacuous else allowed_v or 0.0) + 1e-9 * nv + 1e-12
        assert info["verify_allowed_W"] == pytest.approx(exp_W, rel=1e-12)
        assert info["verify_allowed_v"] == pytest.approx(exp_v, rel=1e-12)
        assert info["verify_vacuous_bound"] == vacuous


def test_verify_noisy_refuses_what_a_vacuous_bound_would_have_excused():
    """The adversarial tester's case in miniature: a wrong W whose certified error is above rtol of
    its norm but below the learner's bound; a bound at least the norm is not allowed, and the
    refusal says why; a bound just below the norm still excuses it."""
    target = random_single_head(3, W_norm=1.0, seed=3)
    W_model = target.W + 0.5 * np.eye(3)
    nW = np.linalg.norm(W_model)
    oracle = ApproxValueQueryOracle(target, 1e-4, seed=0)
    kw = dict(tau=1e-4, W_max=2.0, rtol=1e-3, seed=0)
    info = L.verify_noisy(oracle, W_model, target.v, 40, allowed_W=np.nextafter(nW, 0.0), **kw)
    assert 0 < info["verify_error_W"] < nW and info["verify_vacuous_bound"] == []
    with pytest.raises(OracleInconsistentError, match=r"the learner's own error bound is at least that norm"):
        L.verify_noisy(oracle, W_model, target.v, 40, allowed_W=nW, **kw)


def test_verify_noisy_certified_v_error_is_the_largest_length_one_gap_minus_tau():
    d, n, tau, seed = 3, 8, 0.01, 4
    target = random_single_head(d, seed=2)
    v_model = target.v + np.array([0.3, 0.0, -0.2])
    # rtol = 100: neither error refused (a bound of the learner's own at least the norm would not count)
    info = L.verify_noisy(ValueQueryOracle(target), target.W, v_model, n, tau=tau, W_max=20.0, rtol=100.0, seed=seed)
    x = np.random.default_rng(seed).standard_normal((n // 4, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    expected = np.max(np.abs(x @ (target.v - v_model))) - tau
    assert expected > 0
    assert info["verify_error_v"] == pytest.approx(expected, rel=1e-9)
    # a lower bound on ||v - v*||
    assert info["verify_error_v"] <= np.linalg.norm(target.v - v_model)


def test_verify_noisy_refuses_a_certified_error_above_the_allowance():
    target = random_single_head(3, seed=2)
    v_model = target.v + np.array([0.3, 0.0, -0.2])
    with pytest.raises(OracleInconsistentError):
        L.verify_noisy(ValueQueryOracle(target), target.W, v_model, 8, tau=0.01, W_max=20.0, rtol=1e-3, seed=4)


def test_verify_noisy_certified_W_error_is_a_sound_lower_bound_and_positive_for_a_wrong_W():
    target = random_single_head(3, W_norm=1.0, seed=3)
    W_model = target.W + 0.5 * np.eye(3)
    tau = 1e-4
    oracle = ApproxValueQueryOracle(target, tau, seed=0)
    info = L.verify_noisy(oracle, W_model, target.v, 40, tau=tau, W_max=2.0, rtol=10.0, seed=0, allowed_W=10.0)
    assert 0 < info["verify_error_W"] <= np.linalg.norm(W_model - target.W)


# --- build: n_queries from the oracle, precision queries counted with verification ---------------


def test_build_reads_n_queries_from_the_oracle_and_adds_precision_queries_to_verification():
    from companion.recovery import Recovery

    o = ConstantOracle(2, 0.0)
    o.n_queries = 17
    prec = L.AnswerPrecision(o, 2.0**-24)
    prec.n_queries = 5
    rec = L.build(Recovery, o, 4, verification={"n_verify_queries": 3}, precision=prec, W=np.eye(2), v=np.ones(2))
    assert rec.n_queries == 13
    assert rec.diagnostics["n_verify_queries"] == 8
    assert rec.n_learning_queries == 5
    assert rec.diagnostics["precision"] == 2.0**-24
    rec = L.build(Recovery, o, 4, W=np.eye(2), v=np.ones(2))
    assert rec.diagnostics["n_verify_queries"] == 0 and rec.n_learning_queries == 13


def test_verified_message_names_the_counts_and_errors():
    assert L.verified_message({"n_verify_queries": 0}) == ""
    assert "verified on 5 fresh queries (largest disagreement 1.0e-07, tolerance 1.0e-06)" in L.verified_message(
        {"n_verify_queries": 5, "verify_max_error": 1e-7, "verify_tolerance": 1e-6}
    )
    assert "at least 2.0e-03 in W, 0.0e+00 in v" in L.verified_message(
        {"n_verify_queries": 5, "verify_error_W": 2e-3, "verify_error_v": 0.0}
    )


def test_verification_defaults_read_from_the_signatures():
    import inspect

    from companion.exact import learn_single_head

    p = inspect.signature(learn_single_head).parameters
    assert L.verification_defaults(["learn_single_head"]) == {
        "learn_single_head": (p["verify"].default, p["verify_rtol"].default)
    }
    with pytest.raises(InvalidInputError):
        L.verification_defaults(["learn_nothing"])


# --- AnswerPrecision.measure and names_rounding ------------------------------------------------


def test_measure_spends_32_queries_or_16_one_token_and_only_once():
    """24 for the invariance pairs, 4 repeats and 4 tiny steps (a float64 head is not quantized: no family)."""
    head = random_single_head(3, seed=0)
    oracle = ValueQueryOracle(head)
    p = L.AnswerPrecision(oracle, seed=1)
    assert p.measure() is True
    assert p.n_queries == 32 == oracle.n_queries and p.source == "measured" and p.format == "float64"
    assert p.kind == "float64" and p.measure() is False and oracle.n_queries == 32
    from companion.ffn import FeedForward

    o2 = ValueQueryOracle(FeedForward(np.eye(3), np.ones(3)))
    q = L.AnswerPrecision(o2)
    q.measure(one_token=True)
    assert q.n_queries == 16 == o2.n_queries
    assert L.AnswerPrecision(oracle, "measure").n_queries == 32


def _failing(oracle, *, seed=0):
    raise OracleInconsistentError("the body refused")


def test_names_rounding_turns_a_refusal_at_stated_float32_into_a_precision_error():
    run = L.names_rounding(lambda learner, prec, err: f"{learner}: rounding {prec.u:.3g}")(_failing)
    head = random_single_head(3, seed=0)
    with pytest.raises(PrecisionError, match="_failing: rounding 5.96e-08"):
        run(ValueQueryOracle(head, precision="float32"))
    oracle = ValueQueryOracle(head, precision=1024 * U64)  # exactly COARSE_FACTOR u64: not coarse
    with pytest.raises(OracleInconsistentError, match="the body refused"):
        run(oracle)
    assert oracle.n_queries == 0  # stated: nothing measured


def test_names_rounding_measures_unknown_precision_with_32_or_16_queries():
    head = random_single_head(3, seed=0)
    for one_token, n in ((False, 32), (True, 16)):
        run = L.names_rounding(lambda learner, prec, err: "rounding", one_token=one_token)(_failing)
        oracle = ValueQueryOracle(head)
        with pytest.raises(OracleInconsistentError, match="the body refused"):
            run(oracle)
        assert oracle.n_queries == n


def test_names_rounding_keeps_the_original_error_when_no_budget_is_left_to_measure():
    run = L.names_rounding(lambda learner, prec, err: "rounding")(_failing)
    oracle = ValueQueryOracle(random_single_head(3, seed=0), budget=23)
    with pytest.raises(OracleInconsistentError, match="the body refused"):
        run(oracle)
    assert oracle.n_queries == 0


def test_verify_outputs_measures_an_unstated_precision_only_when_the_check_fails():
    head = random_single_head(3, seed=0)
    oracle = ValueQueryOracle(head)
    prec = L.AnswerPrecision(oracle)
    L.verify_head(oracle, head.W, head.v, 10, rtol=1e-9, seed=0, precision=prec, size=lambda x: 1.0)
    assert prec.n_queries == 0 and oracle.n_queries == 10
    wrong = head.v * (1 + 1e-3)
    with pytest.raises(OracleInconsistentError):
        L.verify_head(oracle, head.W, wrong, 10, rtol=1e-9, seed=0, precision=prec, size=lambda x: 1.0)
    assert prec.n_queries == 32 and oracle.n_queries == 10 + 10 + 32


def test_verify_outputs_with_lift_draws_in_d_minus_one_dimensions():
    o = ConstantOracle(3, 0.0)
    seen = []

    def lift(x):
        seen.append(x.shape[1])
        return np.hstack([x, np.ones((len(x), 1))])

    L.verify_outputs(o, _zero, _one, 5, rtol=1e-9, seed=0, lift=lift)
    assert seen == [2] * 5 and o.n_queries == 5


def test_verify_noisy_certified_W_error_recomputed_from_the_docstring():
    from scipy.special import expit, logit

    from companion.numerics.rop import _gaussian_rop_design, rop_error_bound, rop_queries, rop_scales

    d, n, seed, tau, W_max = 3, 12, 5, 1e-4, 3.0
    target = random_single_head(d, W_norm=1.5, seed=4)
    W_model = target.W + 0.3 * np.eye(d)
    oracle = ApproxValueQueryOracle(target, tau, seed=1)
    info = L.verify_noisy(oracle, W_model, target.v, n, tau=tau, W_max=W_max, rtol=10.0, seed=seed, allowed_W=10.0)
    rng = np.random.default_rng(seed)
    n_v = max(1, n // 4)
    rng.standard_normal((n_v, d))
    A, B = _gaussian_rop_design(d, n - n_v, target.v, rng)
    c = rop_scales(A, B, W_max=W_max)
    y = ApproxValueQueryOracle(target, tau, seed=1)(rop_queries(A, B, c))
    av = A @ target.v
    alpha = (y / c - B @ target.v) / av
    lo = expit(-0.5)  # Lemma 6.1's clip
    t = logit(np.clip(alpha, lo, 1 - lo)) / c**2
    delta, _ = rop_error_bound(alpha, tau=tau, c=c, A=A, B=B, av_hat=av)
    gap = np.abs(t - np.einsum("kd,de,ke->k", A, W_model, B)) - delta
    expected = np.max(gap / (np.linalg.norm(A, axis=1) * np.linalg.norm(B, axis=1)))
    assert expected > 0
    assert info["verify_error_W"] == pytest.approx(expected, rel=1e-9)


def test_ensure_known_measures_once_and_keeps_the_diagnosis_without_budget():
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle

    head = random_single_head(4, seed=0)
    stated = L.AnswerPrecision(ValueQueryOracle(head, precision="float32"))
    assert stated.ensure_known() and stated.n_queries == 0 and stated.source == "stated"
    broke = L.AnswerPrecision(ValueQueryOracle(head, budget=0))
    assert not broke.ensure_known() and not broke.known
    measured = L.AnswerPrecision(ValueQueryOracle(head))
    assert measured.ensure_known() and measured.source == "measured" and measured.n_queries > 0
