"""Pinned rules of ``companion.exact`` (Theorem 4.1's learner): each threshold at its boundary and on
both sides, each documented formula recomputed independently with plain numpy, each loop count.

The expected values come from the docstrings and the paper (``shared/paper/NOTES.md`` §4), never
from a run of the code.
"""

import numpy as np
import pytest
from scipy.optimize import brentq

from companion import exact
from companion.attention import SingleHead, random_single_head
from companion.errors import BudgetExceededError, NotIdentifiableError, OracleInconsistentError
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle


def _sigma(t):
    return 1.0 / (1.0 + np.exp(-t))


# --- probe_matrix, basis probes: |v_l| < |v_p| / 2 (strict) replaces e_l by e_l + e_p ----------


def test_basis_probe_exactly_at_half_the_largest_entry_is_kept():
    v = np.array([4.0, 2.0, -2.0, 1.0])  # |v_1| = |v_2| = |v_0| / 2 exactly: kept; |v_3| < 2: replaced
    U = exact.probe_matrix(v, "basis")
    expected = np.eye(4)
    expected[3, 0] = 1.0
    np.testing.assert_array_equal(U, expected)


def test_basis_probe_just_below_half_is_replaced_and_just_above_kept():
    half = 2.0
    v = np.array([4.0, np.nextafter(half, 0.0), np.nextafter(half, 9.0), 0.0])
    U = exact.probe_matrix(v, "basis")
    expected = np.eye(4)
    expected[1, 0] = expected[3, 0] = 1.0  # just below half, and the paper's v_l = 0
    np.testing.assert_array_equal(U, expected)


def test_basis_probe_pivot_is_the_largest_entry_in_absolute_value():
    v = np.array([1.0, -5.0, 3.0])  # p = 1 (|-5|), not 2 (the largest signed entry)
    U = exact.probe_matrix(v, "basis")
    expected = np.eye(3)
    expected[0, 1] = 1.0  # |1| < 2.5
    np.testing.assert_array_equal(U, expected)  # |3| >= 2.5: kept
    assert np.all(np.abs(U @ v) >= np.abs(v[1]) / 2)


# --- probe_matrix, Gaussian probes: rows N(0, I/d); |u^T v| < 0.1 ||v|| / sqrt(d) redrawn -------


def test_gaussian_probes_are_standard_normal_over_sqrt_d_and_clear_the_floor():
    d, seed = 6, 3
    v = np.array([1.0, -2.0, 0.5, 0.0, 3.0, 1.0])
    U = exact.probe_matrix(v, "gaussian", seed=seed)
    first = np.random.default_rng(seed).standard_normal((d, d)) / np.sqrt(d)
    floor = 0.1 * np.linalg.norm(v) / np.sqrt(d)
    assert exact.GAUSSIAN_PROBE_FLOOR == 0.1
    kept = np.abs(first @ v) >= floor
    assert kept.sum() >= 1
    np.testing.assert_allclose(U[kept], first[kept], rtol=1e-15)  # rows above the floor: the first draw
    assert np.all(np.abs(U @ v) >= floor)


# --- remeasure_saturated: band [b, 1 - b] inclusive, shrink c^2 by 1/max(|t|, 1) or 1/64, 40 rounds


def _never(idx, c):
    raise AssertionError("re-measured a weight inside the band")


def test_weights_exactly_at_the_band_edges_are_not_remeasured():
    b = exact.SATURATION
    assert b == 1e-3
    alpha = np.array([b, 1.0 - b, 0.5])
    t = np.log(alpha / (1 - alpha))
    assert exact.remeasure_saturated(_never, t, alpha, np.ones(3)) == 0


def test_weights_just_outside_the_band_are_remeasured_once_each():
    b = exact.SATURATION
    alpha = np.array([np.nextafter(b, 0.0), np.nextafter(1.0 - b, 2.0), 0.5])
    t = np.log(alpha / (1 - alpha))
    c = np.ones(3)
    asked = []

    def measure(idx, c_idx):
        asked.append(list(idx))
        return np.zeros(len(idx)), np.full(len(idx), 0.5)

    assert exact.remeasure_saturated(measure, t, alpha, c) == 2
    assert asked == [[0, 1]]
    # c^2 divided by |t| (about 6.9 here): c = 1 / sqrt(|t|)
    np.testing.assert_allclose(c[:2], 1.0 / np.sqrt(np.abs(np.log(b / (1 - b)))), rtol=1e-6)
    assert c[2] == 1.0


def test_shrink_is_one_over_abs_logit_floored_at_one_and_one_over_64_blind():
    t = np.array([-10.0, 0.5, np.inf, 3.0])
    alpha = np.array([_sigma(-10.0), 0.9999, 1.0, 0.0])  # 0.9999 with |t| < 1: shrink floored at 1
    c = np.full(4, 2.0)

    def measure(idx, c_idx):
        return np.zeros(len(idx)), np.full(len(idx), 0.5)

    exact.remeasure_saturated(measure, t, alpha, c)
    expected = 2.0 * np.sqrt([1 / 10, 1.0, 1 / 64, 1 / 64])  # alpha 0 or 1 gives no estimate: 1/64
    np.testing.assert_allclose(c, expected, rtol=1e-14)


def test_saturated_weights_get_exactly_40_remeasurements_then_raise():
    calls = []

    def stuck(idx, c_idx):
        calls.append(len(idx))
        return np.full(len(idx), 50.0), np.ones(len(idx))

    with pytest.raises(OracleInconsistentError, match="after 40 re-measurements"):
        exact.remeasure_saturated(stuck, np.array([50.0]), np.array([1.0]), np.ones(1))
    assert len(calls) == 40


def test_a_weight_unsaturated_by_the_40th_remeasurement_is_accepted():
    calls = []

    def late(idx, c_idx):
        calls.append(1)
        ok = len(calls) == 40
        return np.full(len(idx), 0.0 if ok else 50.0), np.full(len(idx), 0.5 if ok else 1.0)

    assert exact.remeasure_saturated(late, np.array([50.0]), np.array([1.0]), np.ones(1)) == 40


# --- invert_two_token and column_queries: y = c (v_j + sigma(c^2 u^T W e_j) u^T v) -----------------


def test_column_queries_and_inversion_follow_the_two_token_identity():
    rng = np.random.default_rng(0)
    d, j, c = 4, 2, np.array([0.5, 1.0, 2.0, 0.25])
    W, v = rng.standard_normal((d, d)), rng.standard_normal(d)
    U = rng.standard_normal((d, d))
    X = exact.column_queries(U, j, c)
    e = np.eye(d)[j]
    for l in range(d):
        np.testing.assert_array_equal(X[l], c[l] * np.stack([U[l] + e, e]))
    y = SingleHead(W, v)(X)
    t_true = c**2 * (U @ W[:, j])
    np.testing.assert_allclose(y, c * (v[j] + _sigma(t_true) * (U @ v)), rtol=1e-12)
    t, alpha = exact.invert_two_token(y, v[j], U @ v, c)
    np.testing.assert_allclose(t, t_true, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(alpha, _sigma(t_true), rtol=1e-12)


# --- learn_single_head: budget, counts, diagnostics values -------------------------------------


def test_budget_exactly_d_plus_d2_plus_verify_is_accepted():
    d, verify = 3, 5
    target = random_single_head(d, seed=1)
    oracle = ValueQueryOracle(target, budget=d + d * d + verify)
    rec = exact.learn_single_head(oracle, verify=verify)
    assert rec.n_queries == d + d * d + verify == oracle.n_queries
    assert rec.n_learning_queries == d + d * d
    assert rec.diagnostics["n_verify_queries"] == verify


def test_budget_one_short_is_refused_before_the_first_query():
    d, verify = 3, 5
    oracle = ValueQueryOracle(random_single_head(d, seed=1), budget=d + d * d + verify - 1)
    with pytest.raises(BudgetExceededError):
        exact.learn_single_head(oracle, verify=verify)
    assert oracle.n_queries == 0


def test_requeries_are_counted_in_n_queries_and_diagnostics():
    d = 3
    target = random_single_head(d, W_norm=60.0, seed=2)  # large logits: re-measured
    oracle = ValueQueryOracle(target)
    rec = exact.learn_single_head(oracle, verify=4)
    k = rec.diagnostics["n_requeries"]
    assert k > 0
    assert rec.n_queries == d + d * d + k + 4 == oracle.n_queries
    assert rec.n_learning_queries == d + d * d + k
    np.testing.assert_allclose(rec.W, target.W, rtol=1e-8, atol=1e-8 * np.abs(target.W).max())


def test_fixed_scale_logits_scales_and_max_abs_logit_are_c2_u_W():
    d, c = 3, 0.5
    target = random_single_head(d, seed=4)
    rec = exact.learn_single_head(ValueQueryOracle(target), scale=c, verify=0)
    diag = rec.diagnostics
    U = exact.probe_matrix(target.v, "basis")
    np.testing.assert_array_equal(diag["probes"], U)
    np.testing.assert_array_equal(diag["scales"], np.full((d, d), c))
    expected = c**2 * U @ target.W  # logits[l, j] = c^2 u_l^T W e_j
    np.testing.assert_allclose(diag["logits"], expected, rtol=1e-9, atol=1e-12)
    assert diag["max_abs_logit"] == pytest.approx(np.abs(expected).max(), rel=1e-9)
    assert diag["n_requeries"] == 0


def test_fixed_scale_never_remeasures_and_names_the_saturated_probe():
    d = 2
    W = np.array([[800.0, 0.0], [0.0, 1.0]])
    oracle = ValueQueryOracle(SingleHead(W, np.array([1.0, 1.0])))
    with pytest.raises(OracleInconsistentError, match=r"probe 0, column 0 .*use scale=\"auto\""):
        exact.learn_single_head(oracle, scale=1.0, verify=0)
    assert oracle.n_queries == d + d * d


def test_zero_value_vector_is_refused_after_the_d_length_one_queries():
    d = 3
    oracle = ValueQueryOracle(SingleHead(np.eye(d), np.zeros(d)))
    with pytest.raises(NotIdentifiableError):
        exact.learn_single_head(oracle)
    assert oracle.n_queries == d


def test_approximate_oracle_refused_before_any_query():
    oracle = ApproxValueQueryOracle(random_single_head(2, seed=0), 1e-3)
    with pytest.raises(TypeError):
        exact.learn_single_head(oracle)
    assert oracle.n_queries == 0


def test_cond_probes_is_the_one_norm_condition_number_of_the_probes():
    # v = (1, 0.1, 0.1): probes e_0, e_1 + e_0, e_2 + e_0. ||U||_1 = 3 = ||U^-1||_1, so
    # cond_1 = 9, while the inf-norm condition number is 2 * 2 = 4.
    W = np.diag([0.3, -0.2, 0.1])
    rec = exact.learn_single_head(ValueQueryOracle(SingleHead(W, np.array([1.0, 0.1, 0.1]))), verify=0)
    U = rec.diagnostics["probes"]
    assert np.linalg.cond(U, 1) == pytest.approx(9.0, rel=1e-12)
    assert rec.diagnostics["cond_probes"] == pytest.approx(9.0, rel=1e-12)


def test_gaussian_cond_probes_matches_numpy_one_norm_condition():
    target = random_single_head(5, seed=7)
    rec = exact.learn_single_head(ValueQueryOracle(target), probes="gaussian", seed=3, verify=0)
    U = rec.diagnostics["probes"]
    c1 = np.linalg.cond(U, 1)
    # LAPACK's dgecon estimates ||U^-1||_1 from below, within a factor 3 in practice
    assert c1 / 3 <= rec.diagnostics["cond_probes"] <= c1 * (1 + 1e-12)


def _best_logit():
    # t* = argmax t sigma'(t): d/dt [t s (1 - s)] = 0  <=>  1 = t tanh(t / 2)
    return brentq(lambda t: t * np.tanh(t / 2) - 1.0, 0.5, 3.0, xtol=1e-14)


def test_kappa_W_is_the_documented_floor_per_unit_rounding():
    d = 4
    target = random_single_head(d, seed=11)
    rec = exact.learn_single_head(ValueQueryOracle(target), probes="gaussian", seed=2, verify=0)
    diag = rec.diagnostics
    U, T, C, v = diag["probes"], diag["logits"], diag["scales"], rec.v
    t_star = _best_logit()
    s_best = t_star * _sigma(t_star) * (1 - _sigma(t_star))
    L = T / C**2
    alpha = _sigma(T)
    uv = U @ v
    E = np.abs(v[None, :] + alpha * uv[:, None]) * np.abs(L) / (np.abs(uv)[:, None] * s_best)
    Uinv_F = np.sqrt(np.sum(np.linalg.inv(U) ** 2))
    expected = Uinv_F * np.sqrt(np.sum(E**2)) / (np.sqrt(d) * np.sqrt(np.sum(rec.W**2)))
    assert diag["kappa_W"] == pytest.approx(expected, rel=1e-10)
    u = 2.0**-53
    assert diag["floor_W"] == pytest.approx(expected * u, rel=1e-10, abs=0)
    assert diag["floor_v"] == u


def test_probe_floor_is_zero_for_a_zero_W():
    rec = exact.learn_single_head(ValueQueryOracle(SingleHead(np.zeros((2, 2)), np.array([1.0, 2.0]))), verify=0)
    assert rec.diagnostics["kappa_W"] == 0.0
    np.testing.assert_array_equal(rec.W, np.zeros((2, 2)))


def test_coarse_precision_spends_d_first_column_requeries_at_a_power_of_two_scale():
    d = 3
    target = random_single_head(d, seed=5)
    rec = exact.learn_single_head(ValueQueryOracle(target), precision="float32", verify=0)
    C = rec.diagnostics["scales"]
    c = C[0, 0]
    assert np.log2(c) == np.round(np.log2(c))
    assert rec.diagnostics["n_requeries"] >= d
    assert rec.n_learning_queries == d + d * d + rec.diagnostics["n_requeries"]


def test_sweep_point_counts_and_entry_scale():
    row = exact.sweep_point(3, seed=0, entry_scale=2.0)
    assert row["d_plus_d2"] == 12
    assert row["n_queries"] == 12 + row["n_requeries"]
    assert row["rel_error_W"] < 1e-9


def test_sweep_point_counts_learning_queries_apart_from_the_precision_measurement():
    """At d = 64 the learner measures the answers' precision first: the sweep's count (chapter 02's
    'exactly d + d^2 queries') is the learning count, the measurement a column of its own."""
    row = exact.sweep_point(64, seed=0)
    assert row["n_queries"] == 64 + 64 * 64 + row["n_requeries"]
    assert row["n_precision_queries"] > 0
    small = exact.sweep_point(8, seed=0)
    assert small["n_precision_queries"] == 0 and small["n_queries"] == 72 + small["n_requeries"]


def test_verification_queries_have_scale_sqrt_of_the_median_probe_scale_and_seed_plus_one():
    d, verify, seed = 3, 6, 2
    target = random_single_head(d, W_norm=200.0, seed=2)  # most probes re-measured: median c < 1
    oracle = ValueQueryOracle(target, record=True)
    rec = exact.learn_single_head(oracle, verify=verify, seed=seed)
    C = rec.diagnostics["scales"]
    scale = np.sqrt(np.median(C))
    assert scale < 0.9
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(1, 9, size=verify)
    expected = [rng.standard_normal((int(m), d)) * (scale / np.sqrt(d)) for m in lengths]
    asked = [x for x, _ in oracle.log[-verify:]]
    assert [len(x) for x in asked] == [len(x) for x in expected]
    for x, e in zip(asked, expected):
        np.testing.assert_allclose(x, e, rtol=1e-13)


def test_verify_single_head_error_is_relative_to_max_abs_x_v():
    head = SingleHead(np.eye(2), np.array([1.0, -1.0]))
    shifted = SingleHead(np.eye(2), np.array([1.0, -1.0]) * (1 + 1e-3))
    err = exact.verify_single_head(ValueQueryOracle(shifted), head.W, head.v, 8, rtol=1e-2)
    assert err == pytest.approx(1e-3, rel=1e-9)  # f scales with v: |df| / max|x v| = 1e-3 on every query
    with pytest.raises(OracleInconsistentError, match="not a single attention head"):
        exact.verify_single_head(ValueQueryOracle(shifted), head.W, head.v, 8, rtol=0.9e-3)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_chunked_reads_and_column_batches_give_the_same_queries_and_head(monkeypatch, chunk):
    # Force chunks of `chunk` one-token queries and `chunk` columns per batch (d = 5: a partial
    # last chunk): every entry of v and every column of W is asked once, at its own place.
    d = 5
    target = random_single_head(d, seed=9)
    monkeypatch.setattr(exact, "chunk_queries", lambda dd, n_tokens=2: chunk if n_tokens == 1 else chunk * dd)
    oracle = ValueQueryOracle(target, record=True)
    rec = exact.learn_single_head(oracle, verify=0, scale=0.5)
    assert oracle.n_queries == d + d * d
    ones = [x for x, _ in oracle.log[:d]]
    for i, x in enumerate(ones):
        np.testing.assert_array_equal(x, np.eye(d)[i : i + 1])
    U = exact.probe_matrix(target.v, "basis")
    twos = np.array([x for x, _ in oracle.log[d:]])
    expected = np.concatenate([exact.column_queries(U, j, 0.5) for j in range(d)])
    np.testing.assert_array_equal(twos, expected)
    np.testing.assert_allclose(rec.W, target.W, rtol=1e-9, atol=1e-12)


def test_coarse_precision_widens_the_saturation_band_to_sixteen_u():
    # bfloat16: band max(1e-3, 2 * 8 * u) = 1/16. The first column (entries 0.1) sets c^2 = 16
    # (logit 1.6, next to t* = 1.54); W[0, 1] = 0.25 then has logit 4, weight 0.982: outside
    # [1/16, 15/16] (re-measured), inside [1e-3, 1 - 1e-3] (float64's band would keep it).
    u = 2.0**-8
    W = np.array([[0.1, 0.25, 0.0], [0.1, 0.0, 0.0], [0.1, 0.0, 0.0]])
    head = SingleHead(W, np.ones(3))
    rec = exact.learn_single_head(ValueQueryOracle(head), precision="bfloat16", verify=0)
    assert rec.diagnostics["scales"][1, 1] == 4.0  # c = 4 where nothing was re-measured
    assert rec.diagnostics["n_requeries"] == 3 + 1  # the first column asked again, then W[0, 1]
    alpha = _sigma(rec.diagnostics["logits"])
    assert np.all((alpha >= 16 * u) & (alpha <= 1 - 16 * u))
    assert rec.diagnostics["scales"][0, 1] < 4.0


def test_stated_float32_verification_tolerance_is_size_times_u_with_kappa_v_one():
    d, verify, seed = 3, 16, 0
    u = 2.0**-24
    target = random_single_head(d, seed=6)
    oracle = ValueQueryOracle(target, record=True)
    rec = exact.learn_single_head(oracle, precision="float32", verify=verify, seed=seed)
    diag = rec.diagnostics
    assert diag["precision"] == u and diag["precision_source"] == "given"
    W, v, kW = rec.W, rec.v, diag["kappa_W"]
    xs = [x for x, _ in oracle.log[-verify:]]
    ys = np.array([y for _, y in oracle.log[-verify:]])
    f_hat = SingleHead(W, v)(xs)
    out = np.array([np.max(np.abs(x @ v)) for x in xs])
    err = np.abs(ys - f_hat) / out
    i = int(np.argmax(err))
    x = xs[i]
    n = 2 * d + 3 * len(x)
    s = np.sqrt(2 * np.log(2 * n / 1e-6)) * np.sqrt(n)
    B = np.max(np.abs(x) @ np.abs(W) @ np.abs(x[-1]))
    rho = np.max(np.abs(x) @ np.abs(v)) / out[i]
    norms = np.linalg.norm(x, axis=1)
    learned = 2 * kW * np.linalg.norm(W) * norms.max() * norms[-1] + 1.0 * np.linalg.norm(v) * norms.max() / out[i]
    expected = max(1e-6, (s * (rho + 2 * B) + learned) * u)
    assert diag["verify_max_error"] == pytest.approx(err[i], rel=1e-9, abs=1e-18)
    assert diag["verify_tolerance"] == pytest.approx(expected, rel=1e-10)


def test_coarse_first_column_scale_uses_the_bilinear_values_t_over_c_squared():
    # First column 20 (logit 20 at c = 1, re-measured at c^2 = 1/20): its bilinear values are
    # t / c^2 = 20, so the probe scale is the power of two nearest sqrt(t* / 20), 2^-2 = 0.25.
    W = np.zeros((3, 3))
    W[:, 0] = 20.0
    W[1, 2] = 1.0
    rec = exact.learn_single_head(ValueQueryOracle(SingleHead(W, np.ones(3))), precision="float32", verify=0)
    t_star = brentq(lambda t: t * np.tanh(t / 2) - 1.0, 0.5, 3.0)
    log2_c = 0.5 * np.log2(t_star / 20.0)
    assert abs(log2_c - np.floor(log2_c) - 0.5) > 0.1
    c0 = 2.0 ** np.round(log2_c)
    assert c0 == 0.25
    assert rec.diagnostics["scales"][0, 1] == c0  # W[0, 1] = 0: never re-measured
    np.testing.assert_allclose(rec.W, W, atol=1e-9)


@pytest.mark.parametrize("tau", [1e-15, 1e-9, 1e-3])
def test_every_positive_tau_is_refused_before_any_query(tau):
    oracle = ApproxValueQueryOracle(random_single_head(2, seed=0), tau)
    with pytest.raises(TypeError, match="tau"):
        exact.learn_single_head(oracle)
    assert oracle.n_queries == 0
    with pytest.raises(TypeError):
        exact.check_exact_oracle(oracle, "x")
    assert exact.check_exact_oracle(ValueQueryOracle(random_single_head(2, seed=0)), "x") == 2


def test_a_callable_without_d_or_n_queries_is_not_an_oracle():
    head = random_single_head(2, seed=0)
    with pytest.raises(TypeError, match="ValueQueryOracle"):
        exact.learn_single_head(head)
