"""Unit tests of the named stages of the §4-§6 learners (issue 34), and of the views they use.

Each stage of ``learn_low_rank``, ``learn_low_rank_noisy``, ``learn_multi_head_transformer`` and
``learn_single_head`` is a private function of its module; each is tested here on a small case with
real values (counts read from the oracle, shapes, the values the stage hands on).
"""

from __future__ import annotations

import numpy as np
import pytest

from companion.attention import OneLayerTransformer, SingleHead, random_single_head
from companion.errors import BudgetExceededError, InvalidInputError, OracleInconsistentError
from companion.exact import learn_single_head
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle
from companion.transformer import BiasedOneLayerTransformer, ScaledAntisymmetrised

# --- ScaledAntisymmetrised (chapter 3's view, in the library) -------------------------------


def _biased(seed=0, d=4, m=6):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d, d)) / d
    A = rng.standard_normal((d, m)) / np.sqrt(d)
    b1 = np.abs(rng.standard_normal(m)) * np.where(rng.random(m) < 0.5, 1.0, -1.0)
    return BiasedOneLayerTransformer(W=W, A=A, b1=b1, w_o=rng.standard_normal(m), b2=0.3)


def test_scaled_antisymmetrised_is_the_head_c2_W_2ADw_o_at_a_small_scale():
    tf = _biased()
    c = 1e-3
    view = ScaledAntisymmetrised(ValueQueryOracle(tf), c)
    X = np.random.default_rng(1).standard_normal((20, 3, tf.d)) / np.sqrt(tf.d)
    head = SingleHead(c**2 * tf.W, 2 * tf.A @ ((tf.b1 > 0) * tf.w_o))
    np.testing.assert_allclose(view(X), head(X), rtol=0, atol=1e-11)
    assert view.n_queries == 40                       # two underlying queries per sequence
    assert isinstance(view(X[0]), float) and view.n_queries == 42


def test_scaled_antisymmetrised_without_biases_is_the_antisymmetrised_head_rescaled():
    tf = OneLayerTransformer(np.eye(2), np.array([[1.0, -2.0], [0.5, 1.0]]), np.array([1.0, 1.0]))
    X = [np.array([[1.0, 2.0]]), np.array([[1.0, 2.0], [-1.0, 0.5], [0.2, 0.1]])]   # ragged list
    got = ScaledAntisymmetrised(ValueQueryOracle(tf), 2.0)(X)
    np.testing.assert_allclose(got, SingleHead(4.0 * tf.W, tf.A @ tf.w_o)(X), rtol=1e-14)


def test_scaled_antisymmetrised_budget_tau_and_bad_input():
    tf = _biased()
    view = ScaledAntisymmetrised(ValueQueryOracle(tf, budget=9), 0.5)
    assert view.remaining == 4                       # 9 underlying queries: 4 whole sequences
    view.require(4)
    with pytest.raises(BudgetExceededError):
        view.require(5)                              # 10 > 9, refused before any query
    assert view.n_queries == 0
    assert ScaledAntisymmetrised(ApproxValueQueryOracle(tf, 1e-6), 0.5).tau == pytest.approx(4e-6, rel=1e-15)
    with pytest.raises(InvalidInputError, match="c"):
        ScaledAntisymmetrised(ValueQueryOracle(tf), 0.0)
    with pytest.raises(TypeError, match="ScaledAntisymmetrised wraps a value-query oracle"):
        ScaledAntisymmetrised(tf.W, 0.5)


def test_learn_single_head_on_the_scaled_view_recovers_W_as_chapter_3_does():
    tf = _biased(seed=2)
    c = 1e-3
    oracle = ValueQueryOracle(tf)
    rec = learn_single_head(ScaledAntisymmetrised(oracle, c), scale=1.0, verify=0)
    assert rec.n_queries == 2 * (tf.d + tf.d**2) == oracle.n_queries
    assert np.linalg.norm(rec.W / c**2 - tf.W) < 1e-3 * np.linalg.norm(tf.W)


# --- learn_low_rank: plan, method table, stages ---------------------------------------------

from companion.errors import NotIdentifiableError  # noqa: E402
from companion.lowrank import _learn as lr  # noqa: E402
from companion._learner import AnswerPrecision, QueryCount  # noqa: E402

_LR = dict(method="auto", n_measurements=None, oversample=1, rank_tol=1e-8, scale="auto", solver_eps=1e-9,
           max_iter=50, tol=1e-13, verify=32, verify_rtol=1e-6, seed=0, precision=None)


def test_low_rank_plan_counts_the_queries_of_each_method():
    d, r = 10, 2
    nuclear = lr._plan(d, r, **_LR)                              # auto: the program fits at d = 10
    assert (nuclear.method, nuclear.m, nuclear.planned) == ("nuclear", 5 * r * (2 * d - r), d + 180)
    assert nuclear.chosen.startswith("method='auto' chose 'nuclear'")
    rgn = lr._plan(d, r, **dict(_LR, method="rgn"))
    assert (rgn.m, rgn.planned, rgn.chosen) == (72, d + 72, "")   # 2 r (2d - r)
    sketch = lr._plan(d, r, **dict(_LR, method="sketch"))
    assert (sketch.m, sketch.planned) == (None, d + 3 * (2 * d - 3))   # k = r + 1
    assert lr._plan(d, None, **_LR).method == "sketch"


def test_low_rank_plan_refuses_before_any_query():
    with pytest.raises(NotIdentifiableError, match="n_measurements=35 cannot determine"):
        lr._plan(10, 2, **dict(_LR, method="rgn", n_measurements=35))   # r (2d - r) = 36
    assert lr._plan(10, 2, **dict(_LR, method="rgn", n_measurements=36)).m == 36
    with pytest.raises(InvalidInputError, match="not used by method='sketch'"):
        lr._plan(10, 2, **dict(_LR, method="sketch", n_measurements=40))
    with pytest.raises(InvalidInputError, match="rank=None"):
        lr._plan(10, None, **dict(_LR, method="rgn"))


def test_low_rank_method_table_names_every_method():
    from companion.lowrank import METHODS

    assert sorted(lr._METHOD_STAGES) == sorted(METHODS)


@pytest.mark.parametrize("method", ["nuclear", "rgn", "sketch"])
def test_low_rank_method_stage_returns_the_rank_r_W_and_counts_its_queries(method):
    d, r = 8, 2
    target = random_single_head(d, rank=r, seed=3)
    oracle = ValueQueryOracle(target)
    plan = lr._plan(d, r, **dict(_LR, method=method))
    count = QueryCount(oracle)
    fit = lr._METHOD_STAGES[method](oracle, target.v.copy(), plan, np.random.default_rng(0),
                                    AnswerPrecision(oracle), count)
    assert fit.rank == r and fit.W.shape == (d, d)
    assert np.linalg.norm(fit.W - target.W) < 1e-6 * np.linalg.norm(target.W)
    assert count.total == plan.planned - d + fit.diagnostics.get("n_requeries", 0)   # v was not read here
    assert fit.diagnostics["n_measurements"] == plan.planned - d


def test_low_rank_verify_stage_names_rank_tol_when_it_cut_real_singular_values():
    d = 6
    target = random_single_head(d, rank=2, seed=1)
    oracle = ValueQueryOracle(target)
    plan = lr._plan(d, 2, **dict(_LR, method="sketch", rank_tol=0.9))
    wrong = np.outer(target.W[:, 0], target.W[0])            # a rank-1 W: fails the check
    diagnostics = {"rank_tol_cut": np.array([0.5]), "cross_size": 3}
    with pytest.raises(OracleInconsistentError, match="rank_tol=0.9 counted 1 singular value"):
        lr._verify_low_rank(oracle, wrong, target.v, plan, AnswerPrecision(oracle), 0.0, 1, diagnostics)
    # 32 checks, then 32 queries measuring the answers' precision (float64: not the cause)
    assert oracle.n_queries == 64 and "rank_tol_cut" not in diagnostics
    checked = lr._verify_low_rank(oracle, target.W, target.v, plan, AnswerPrecision(oracle), 0.0, 2, {})
    assert checked["n_verify_queries"] == 32 and checked["verify_max_error"] < 1e-12


# --- learn_low_rank_noisy: plan, measurements, solver table, certificates ---------------------

from companion.robust import _noisy as nz  # noqa: E402
from companion.robust import random_margin_head  # noqa: E402

_NZ = dict(W_max=4.0, tau=None, n_measurements=None, method="rgn", logit_max=0.5, solver_eps=1e-7, max_iter=30,
           verify=32, verify_rtol=0.1, seed=0)


def test_noisy_plan_sizes_m_and_takes_tau_from_the_oracle():
    plan = nz._plan_noisy(10, 1e-6, 2, **_NZ)
    assert (plan.m, plan.tau, plan.r) == (3 * 2 * 18, 1e-6, 2)          # NOISY_OVERSAMPLING r (2d - r)
    assert nz._plan_noisy(10, 1e-6, 2, **dict(_NZ, tau=0.0)).tau == 0.0
    assert nz._plan_noisy(10, 0.0, 2, **dict(_NZ, n_measurements=36)).m == 36
    with pytest.raises(NotIdentifiableError, match="n_measurements=35 cannot determine"):
        nz._plan_noisy(10, 0.0, 2, **dict(_NZ, n_measurements=35))


def test_noisy_measurements_bound_every_t_within_delta():
    head = random_margin_head(10, W_max=4.0, mu=0.1, rank=2, seed=0)
    oracle = ApproxValueQueryOracle(head, 1e-6)
    plan = nz._plan_noisy(10, 1e-6, 2, **_NZ)
    rops = nz._measure_noisy(oracle, head.v.copy(), plan, np.random.default_rng(0))
    assert oracle.n_queries == plan.m and rops.A.shape == (plan.m, 10)
    truth = np.einsum("kd,de,ke->k", rops.A, head.W, rops.B)
    assert np.all(np.abs(rops.t - truth) <= rops.delta) and rops.n_clipped == 0
    assert rops.w.max() == 1.0 and np.all(rops.w > 0)
    assert rops.diagnostics(plan)["max_abs_logit"] <= 0.5 + 1e-9          # Lemma 6.1's window


@pytest.mark.parametrize("method", ["rgn", "nuclear"])
def test_noisy_solver_table_fits_and_certifies(method):
    head = random_margin_head(6, W_max=4.0, mu=0.1, rank=1, seed=1)
    oracle = ApproxValueQueryOracle(head, 1e-7)
    plan = nz._plan_noisy(6, 1e-7, 1, **dict(_NZ, method=method))
    rops = nz._measure_noisy(oracle, head.v.copy(), plan, np.random.default_rng(0))
    W, info, fit, factors, how = nz._NOISY_SOLVERS[method](rops, plan)
    assert np.linalg.norm(W - head.W) < 1e-3 * np.linalg.norm(head.W)
    np.testing.assert_allclose(fit, np.einsum("kd,de,ke->k", rops.A, W, rops.B), rtol=1e-6, atol=1e-12)
    assert (factors is None) == (method == "nuclear") and how
    clause = nz._certify_noisy(rops, plan, W, fit, factors, info)
    assert clause == "" and info["fit_ratio"] <= nz.FIT_SLACK
    assert info["excess_norm_W"] <= np.linalg.norm(W - head.W)            # a lower bound on the error
    assert sorted(nz._NOISY_SOLVERS) == sorted(nz.NOISY_METHODS)


# --- learn_multi_head_transformer: plan, heads, regions, pattern slack, verification ---------

from companion.oracles import AntisymmetrisedOracle  # noqa: E402
from companion.transformer import _multi_head as mh  # noqa: E402
from companion.transformer import random_multi_head_transformer  # noqa: E402


def _mht_plan(tf, **kw):
    args = dict(H=2, H_bound=None, route="rational", margin=100.0, verify=32, verify_rtol=1e-6, seed=0)
    args.update(kw)
    return mh._plan_mht(ValueQueryOracle(tf), tf.d, **args)


def test_mht_plan_applies_the_shared_H_rule_and_sizes_the_heads_step():
    tf = random_multi_head_transformer(6, 2, 4, seed=0)
    plan = _mht_plan(tf)
    assert (plan.H, plan.H_bound, plan.H_plan) == (2, None, 2)
    assert _mht_plan(tf, route="robust").n_heads_plan == 2 * (6 + 36)     # antisymmetrised d + d^2
    assert _mht_plan(tf, H=None, H_bound=3).H_plan == 3
    with pytest.raises(InvalidInputError, match="give exactly one of H"):
        _mht_plan(tf, H=None)
    with pytest.raises(InvalidInputError, match="route='robust' needs H"):
        _mht_plan(tf, H=None, H_bound=2, route="robust")


def test_mht_heads_and_regions_stages_recover_Ws_and_Bs_on_the_true_ffn():
    tf = random_multi_head_transformer(6, 2, 4, seed=0)
    oracle = ValueQueryOracle(tf)
    plan = _mht_plan(tf)
    heads = mh._heads_stage(AntisymmetrisedOracle(oracle), plan)
    assert heads.Ws.shape == (2, 6, 6)
    A, w = tf.Bs.sum(axis=0), tf.w_o
    before = oracle.n_queries
    regions = mh._regions_stage(oracle, A, w, tf.Ws, plan)
    assert oracle.n_queries - before == 2 * 6 * 4                        # H d queries in each of k regions
    np.testing.assert_allclose(regions.Bs, tf.Bs, rtol=0, atol=1e-8 * np.abs(tf.Bs).max())
    assert mh._pattern_slack(regions, A, tf.Ws, plan.margin) > 1.0
    model = mh.MultiHeadTransformer(tf.Ws, regions.Bs, w)
    checked = mh._verify_mht(oracle, model, plan, heads, regions.cond, 2)
    assert checked["n_verify_queries"] == 32 and checked["verify_max_error"] < 1e-8


def test_mht_pattern_slack_refuses_value_matrices_that_cross_a_kink():
    tf = random_multi_head_transformer(6, 2, 4, seed=0)
    plan = _mht_plan(tf)
    A, w = tf.Bs.sum(axis=0), tf.w_o
    regions = mh._regions_stage(ValueQueryOracle(tf), A, w, tf.Ws, plan)
    wrong = mh._Regions(1e4 * regions.Bs, regions.S, regions.mus, regions.cond, regions.queries)
    with pytest.raises(OracleInconsistentError, match="crossed a kink"):
        mh._pattern_slack(wrong, A, tf.Ws, plan.margin)


# --- learn_single_head: the column stage and the relative scale ------------------------------

from companion import exact as ex  # noqa: E402
from companion.exact import SATURATION, probe_matrix  # noqa: E402


def test_single_head_column_stage_reads_every_logit_with_d_squared_queries():
    d = 5
    target = random_single_head(d, seed=0)
    oracle = ValueQueryOracle(target)
    U = probe_matrix(target.v, "basis")
    T, C, n_re = ex._measure_columns(oracle, U, target.v, U @ target.v, 1.0, auto=True, band=SATURATION)
    assert oracle.n_queries == d * d + n_re and n_re == 0
    np.testing.assert_allclose(T / C**2, U @ target.W, rtol=1e-12, atol=1e-13)   # L = U W
    assert np.all(C == 1.0)


def test_single_head_column_stage_refuses_a_weight_outside_0_1_at_a_fixed_scale():
    d = 3
    target = SingleHead(400.0 * np.eye(d), np.ones(d))          # logits 400: the weight rounds to 1
    oracle = ValueQueryOracle(target)
    U = probe_matrix(target.v, "basis")
    with pytest.raises(OracleInconsistentError, match='outside \\(0, 1\\).*use scale="auto"'):
        ex._measure_columns(oracle, U, target.v, U @ target.v, 1.0, auto=False, band=SATURATION)


def test_single_head_relative_scale_is_a_power_of_two_near_the_best_logit():
    d = 4
    target = random_single_head(d, seed=1)
    oracle = ValueQueryOracle(target)
    U = probe_matrix(target.v, "basis")
    c, n = ex._relative_scale(oracle, U, target.v, U @ target.v, 1.0, SATURATION)
    assert n == oracle.n_queries == d                          # the first column, no re-measurement
    assert np.log2(c) == int(np.log2(c))
