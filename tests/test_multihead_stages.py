"""Each named stage of the canonical-form learners, on its own (issue 34: learners as named stages).

The counts route (``learn_canonical_rational``: ``_counts`` dispatches to the pair start in
``_pairstart`` or the moment start in ``_moments``) and the robust route (``learn_canonical``,
``_canonical``) run as stages over small frozen records; these tests call each stage with a small
target and check its real output, and that the stages in order give the learner's own result.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from companion.errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from companion.multihead import (
    MOMENT_FROM,
    equivalent,
    learn_canonical,
    learn_canonical_rational,
    random_multi_head,
    rational_plan,
)
from companion.multihead import _canonical, _common, _counts, _moments, _pairstart, _route
from companion.attention import MultiHead
from companion.oracles import ValueQueryOracle


def _opts(H=2, known=True, **kw):
    base = dict(scale=3.0, spread=1.5, tol=1e-9, verify=0, verify_rtol=1e-6, seed=0)
    return _route.CountsOptions(H, known, **{**base, **kw})


def _pair_design(d=6, H=2, seed=0, H_plan=None):
    target = random_multi_head(d, H, seed=seed)
    oracle = ValueQueryOracle(target)
    rng = np.random.default_rng(0)
    H_plan = H if H_plan is None else H_plan
    design, P = _pairstart.make_design(oracle, rng, d, _opts(H_plan), rational_plan(d, H_plan))
    return target, oracle, rng, design, P


# ------------------------------------------------------------------------------- shared rules


def test_visibility_floor_is_INVISIBLE_times_the_value_scale_at_least_one():
    assert _common.INVISIBLE == 1e-13
    assert _common.visibility_floor([0.5, -4.0]) == pytest.approx(4e-13, rel=1e-15)
    assert _common.visibility_floor([1e-3]) == 1e-13           # max(1, ...): never below INVISIBLE
    assert _common.visibility_floor([], rel=1e-12) == 1e-12


def test_a_row_just_inside_the_floor_is_invisible_and_just_outside_is_not():
    _, _, _, design, _ = _pair_design()
    floor = _common.visibility_floor(design.bX)
    G = np.zeros((design.K, design.s.size))
    G[0, 0] = 0.99 * floor
    with pytest.raises(NotIdentifiableError, match="row 3: every answer equals x\\^T v"):
        _pairstart.check_visible(design, 3, G)
    G[0, 0] = 1.01 * floor
    assert _pairstart.check_visible(design, 3, G) == pytest.approx(1.01 * floor)


def test_redraw_direction_replaces_one_row_by_a_unit_vector_keeping_P_well_conditioned():
    rng = np.random.default_rng(0)
    P = np.eye(5)
    _common.redraw_direction(rng, P, 2)
    assert np.linalg.norm(P[2]) == pytest.approx(1.0)
    assert np.array_equal(np.delete(P, 2, axis=0), np.delete(np.eye(5), 2, axis=0))
    assert np.linalg.cond(P) < 10 * 5


# ------------------------------------------------------------------------------- counts route: options


def test_check_options_applies_the_H_rule_once_and_records_which_was_given():
    opts = _counts.check_options(None, 4, scale=3, spread=1.5, tol=1e-9, verify=32, verify_rtol=1e-6, seed=1)
    assert (opts.H_plan, opts.known, opts.scale, opts.verify, opts.seed) == (4, False, 3.0, 32, 1)
    assert _counts.check_options(3, None, scale=3, spread=1.5, tol=1e-9, verify=0, verify_rtol=1e-6, seed=0).known
    with pytest.raises(InvalidInputError, match="give exactly one of H"):
        _counts.check_options(2, 3, scale=3, spread=1.5, tol=1e-9, verify=0, verify_rtol=1e-6, seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.tol = 1.0


def test_choose_start_dispatches_auto_at_MOMENT_FROM_and_checks_the_moments_sample_count():
    assert set(_counts.STARTS) == {"pairs", "moments"}
    assert _counts.STARTS["pairs"] is _pairstart.learn_pairs
    assert _counts.STARTS["moments"] is _moments.learn_moments
    assert _counts.choose_start("auto", 64, MOMENT_FROM - 1) == "pairs"
    assert _counts.choose_start("auto", 64, MOMENT_FROM) == "moments"
    assert _counts.choose_start("auto", 8, MOMENT_FROM) == "pairs"          # H > d: moment_plan refuses
    assert _counts.choose_start("moments", 8, 2) == "moments"
    with pytest.raises(InvalidInputError, match="needs 2H >= 4 samples"):
        _counts.choose_start("moments", 8, 1)
    with pytest.raises(InvalidInputError, match="start must be 'auto', 'pairs' or 'moments'"):
        _counts.choose_start("pair", 8, 2)


# ------------------------------------------------------------------------------- counts route: pair start


def test_make_design_asks_only_the_d_length_one_queries_and_draws_orthonormal_rows():
    target, oracle, _, design, P = _pair_design()
    plan = rational_plan(6, 2)
    assert oracle.n_queries == 6
    assert np.allclose(design.v, target.vs.sum(axis=0), atol=1e-15)
    assert design.X.shape == (plan["K"], 6) and design.X_link.shape == (plan["n_link"], 6)
    assert np.allclose(P @ P.T, np.eye(6), atol=1e-12)
    assert int(np.max(design.n + design.m)) <= 2 * 2 + 1
    assert design.window == pytest.approx(float(np.max(np.abs(np.log(design.n / design.m)))))


def test_ask_row_pairs_returns_each_pairs_answers_minus_x_v_and_counts_them():
    target, oracle, _, design, P = _pair_design()
    G = _pairstart.ask_row_pairs(oracle, design, P[:2])
    S = design.s.size
    assert G.shape == (2, design.K, S)
    assert oracle.n_queries == 6 + 2 * design.K * S
    k, t, i = 3, 1, 1
    u, x = design.X[k] + P[i], design.X[k]
    seq = np.vstack([np.repeat(u[None], design.n[t], 0), np.repeat(x[None], design.m[t], 0)])
    assert G[i, k, t] == pytest.approx(float(target(seq)) - float(x @ design.v), abs=1e-12)


def test_pair_fits_recover_a_pairs_two_logistic_terms():
    _, _, _, design, _ = _pair_design()
    s = design.s
    gam, sh = np.array([[0.7, -1.3]]), np.array([[0.4, -0.9]])
    G = np.einsum("psh,ph->ps", 1 / (1 + np.exp(-(s[None, :, None] + sh[:, None, :]))), gam)
    g, l, res = _pairstart.pair_fits(design, G, 2)
    order = np.argsort(g[0])
    assert np.allclose(g[0][order], [-1.3, 0.7], atol=1e-8)
    assert np.allclose(l[0][order], [-0.9, 0.4], atol=1e-8)
    assert res[0] <= 1e-10


def test_choose_terms_finds_the_number_of_heads_from_row_zero():
    target, oracle, _, design, P = _pair_design(d=8, H=3, seed=1, H_plan=4)   # only the bound 4 known
    G0 = _pairstart.ask_row_pairs(oracle, design, P[:1])[0]
    assert _pairstart.choose_terms(design, G0) == 3


def test_start_row_and_finish_row_recover_the_rows_terms():
    target, oracle, _, design, P = _pair_design()
    G = _pairstart.ask_row_pairs(oracle, design, P[:1])[0]
    start = _pairstart.start_row(design, 0, G, None, 2)
    true_gamma = target.vs @ P[0]
    assert np.allclose(np.sort(start.gamma0), np.sort(true_gamma), rtol=1e-2)
    assert start.R0.shape == (2, 6) and start.use.shape == (design.K, 2) and not start.tried
    assert start.fewest > 6
    row = _pairstart.finish_row(design, 0, G, start, 2)
    assert row.strategy == "joint" and row.residual <= 1e-9
    assert np.allclose(np.sort(row.gamma), np.sort(true_gamma), atol=1e-9)
    # R[h] = delta_0^T W_h: the row of head h along delta_0
    order = np.argsort(row.gamma)
    true_R = np.einsum("i,hij->hj", P[0], target.Ws)[np.argsort(true_gamma)]
    assert np.allclose(row.R[order], true_R, atol=1e-7)


def test_finish_row_tries_the_named_strategies_in_order_and_names_the_last_misfit(monkeypatch):
    assert [name for name, _ in _pairstart.ROW_STRATEGIES] == ["joint", "repaired start", "shared amplitudes"]
    target, oracle, _, design, P = _pair_design()
    G = _pairstart.ask_row_pairs(oracle, design, P[:1])[0]
    start = dataclasses.replace(_pairstart.start_row(design, 0, G, None, 2), tried=True)
    tried = []

    def spy(name, out):
        return lambda *a: tried.append(name) or out

    bad = (np.zeros(2), np.zeros((2, 6)), 5e-3, 1.0)
    monkeypatch.setattr(_pairstart, "ROW_STRATEGIES", (
        ("joint", lambda d, g, st: None if st.tried else bad),
        ("repaired start", spy("repaired start", bad)),
        ("shared amplitudes", spy("shared amplitudes", None)),
    ))
    with pytest.raises(OracleInconsistentError, match=r"row 0: the joint fit of 2 heads .* misfits by 0.005 relative"):
        _pairstart.finish_row(design, 0, G, start, 2)
    assert tried == ["repaired start", "shared amplitudes"]           # the batched fit already failed: no joint
    good = (np.ones(2), np.ones((2, 6)), 1e-12, 1.0)
    monkeypatch.setattr(_pairstart, "ROW_STRATEGIES", (("joint", spy("joint", None)), ("shared amplitudes",
                                                                                       spy("x", good))))
    row = _pairstart.finish_row(design, 0, G, start, 2)
    assert row.strategy == "shared amplitudes" and row.residual == 1e-12
    assert row.fraction == start.n_agree / design.K


def test_batch_starts_fits_every_row_of_an_easy_target_in_one_batch():
    _, oracle, _, design, P = _pair_design()
    G_all = _pairstart.ask_row_pairs(oracle, design, P)
    fits = [f.reshape(6, design.K, *f.shape[1:]) for f in _pairstart.pair_fits(design, G_all.reshape(6 * design.K, -1), 2)]
    starts, fitted = _pairstart.batch_starts(design, G_all, fits)
    assert sorted(fitted) == list(range(6)) and sorted(starts) == list(range(6))
    assert all(row.strategy == "batched" and row.residual <= 1e-9 for row in fitted.values())
    assert not any(st.tried for st in starts.values())


def test_fit_rows_redraws_a_refusing_row_and_refuses_when_no_spare_row_is_left(monkeypatch):
    _, oracle, rng, design, P = _pair_design()
    G_all = _pairstart.ask_row_pairs(oracle, design, P)
    fits = [f.reshape(6, design.K, *f.shape[1:]) for f in _pairstart.pair_fits(design, G_all.reshape(6 * design.K, -1), 2)]
    real = _pairstart.batch_starts
    monkeypatch.setattr(_pairstart, "batch_starts", lambda *a: ({}, {i: r for i, r in real(*a)[1].items() if i}))
    calls = []
    real_learn = _pairstart.learn_row

    def learn_row(oracle, design, P, i, G, fits, H_row):
        calls.append(G is None)
        if len(calls) == 1:
            raise OracleInconsistentError("row 0 refuses once")
        return real_learn(oracle, design, P, i, G, fits, H_row)

    monkeypatch.setattr(_pairstart, "learn_row", learn_row)
    P0 = P.copy()
    before = oracle.n_queries
    rows, n_redrawn = _pairstart.fit_rows(oracle, design, P, rng, G_all, fits, 2, 1)
    assert n_redrawn == 1 and calls == [False, True]                  # the redrawn row asks its pairs anew
    assert not np.allclose(P[0], P0[0]) and np.array_equal(P[1:], P0[1:])
    assert oracle.n_queries - before == design.K * design.s.size
    assert len(rows) == 6
    calls.clear()
    with pytest.raises(OracleInconsistentError, match="refuses once"):
        _pairstart.fit_rows(oracle, design, P, rng, G_all, fits, 2, 0)


def test_link_rows_permutes_each_rows_heads_onto_row_zeros():
    target, oracle, rng, design, P = _pair_design()
    G_all = _pairstart.ask_row_pairs(oracle, design, P)
    fits = [f.reshape(6, design.K, *f.shape[1:]) for f in _pairstart.pair_fits(design, G_all.reshape(6 * design.K, -1), 2)]
    rows, _ = _pairstart.fit_rows(oracle, design, P, rng, G_all, fits, 2, 0)
    before = oracle.n_queries
    perms, err = _pairstart.link_rows(oracle, design, P, rows)
    assert oracle.n_queries - before == 5 * design.X_link.shape[0] * design.s.size
    assert len(err) == 5 and max(err) <= 1e-9
    Gam = np.array([row.gamma[p] for row, p in zip(rows, perms)])   # (d, H): delta_i^T v_h, one head per column
    vs = np.linalg.solve(P, Gam).T
    assert equivalent(MultiHead(np.zeros((2, 6, 6)), vs), MultiHead(np.zeros((2, 6, 6)), target.vs), atol=1e-8)


def test_learn_pairs_is_the_learners_pairs_route():
    target = random_multi_head(6, 2, seed=0)
    a, b = ValueQueryOracle(target), ValueQueryOracle(target)
    rec = _pairstart.learn_pairs(a, 6, _opts(2, verify=32))
    ref = learn_canonical_rational(b, H=2, start="pairs")
    assert rec.n_queries == ref.n_queries == 246 and rec.n_learning_queries == 246 - 32
    assert np.array_equal(rec.Ws, ref.Ws) and rec.diagnostics["n_shared_start_rows"] == 0


# ------------------------------------------------------------------------------- counts route: moment start


def _moment_design(d=16, H=5, seed=0, known=True):
    target = random_multi_head(d, H, seed=seed)
    oracle = ValueQueryOracle(target)
    rng = np.random.default_rng(0)
    plan = _route.moment_plan(d, H)
    design = _moments.make_design(oracle, rng, d, _opts(H, known), plan)
    return target, oracle, rng, design


def test_moment_head_span_finds_H_from_the_gradients_singular_values():
    target, oracle, rng, design = _moment_design(known=False)
    delta = np.eye(16)[0]
    U, sv, H = _moments.head_span(oracle, design, rng, delta)
    assert H == 5 and U.shape == (16, 5)
    assert sv[4] > _moments.RANK_TOL * sv[0] > sv[5]
    # the span holds the rows W_h^T delta of every head
    rows = np.einsum("i,hij->hj", delta, target.Ws)
    assert np.allclose(U @ (U.T @ rows.T), rows.T, atol=1e-6)


def test_moment_centre_and_star_recover_the_heads():
    target, oracle, rng, design = _moment_design()
    centre, n_tried = _moments.choose_centre(oracle, design, rng)
    assert n_tried >= 1 and centre.gamma is not None
    assert np.allclose(np.sort(centre.gamma), np.sort(target.vs @ centre.delta), atol=1e-8)
    assert centre.info["centre_residual"] <= 1e-9 and 0 < centre.ratio <= 1
    P, gam, R, rel, tracked, redrawn = _moments.fit_star(oracle, design, rng, centre)
    assert P.shape == (16, 16) and gam.shape == (15, 5) and np.all(rel <= 1e-9)
    assert np.allclose(np.linalg.norm(P[1:] - centre.delta, axis=1), _moments._star.STAR_EPS)


def test_learn_moments_is_the_learners_moment_route():
    target = random_multi_head(16, 5, seed=0)
    rec = _moments.learn_moments(ValueQueryOracle(target), 16, _opts(5))
    ref = learn_canonical_rational(ValueQueryOracle(target), H=5, start="moments", verify=0)
    assert rec.n_queries == ref.n_queries and rec.diagnostics["start"] == "moments"
    assert equivalent(rec.model, target, atol=1e-7)


# ------------------------------------------------------------------------------- the robust canonical route


def _canonical_design(d=6, H=2, seed=0):
    target = random_multi_head(d, H, seed=seed)
    oracle = ValueQueryOracle(target)
    opts = _canonical.check_options(
        H, scale=4.0, max_len=128, n_points=None, oversample=2.0, max_tokens_factor=8.0, row_retries=2,
        tol=1e-9, verify=0, verify_rtol=1e-6, seed=0)
    from companion.numerics.rational import count_pairs

    n, m = count_pairs(opts.n_points, opts.max_len)
    rng = np.random.default_rng(0)
    design, P, Xs = _canonical.make_design(oracle, rng, d, opts, n, m, 12, 3)
    return target, oracle, rng, design, P, Xs


def test_canonical_check_options_plans_for_eight_heads_without_H():
    opts = _canonical.check_options(None, scale=4.0, max_len=128, n_points=None, oversample=2.0,
                                    max_tokens_factor=8.0, row_retries=2, tol=1e-9, verify=64,
                                    verify_rtol=1e-6, seed=0)
    assert (opts.H, opts.H_plan, opts.n_points) == (None, 8, 36)
    with pytest.raises(InvalidInputError, match="max_tokens_factor"):
        _canonical.check_options(2, scale=4.0, max_len=128, n_points=None, oversample=2.0,
                                 max_tokens_factor=1.5, row_retries=2, tol=1e-9, verify=64,
                                 verify_rtol=1e-6, seed=0)


def test_canonical_learn_row_recovers_the_rows_amplitudes_and_rows():
    target, oracle, rng, design, P, Xs = _canonical_design()
    assert oracle.n_queries == 6 and design.max_tokens == 48
    row, Xs2 = _canonical.learn_row(oracle, design, rng, P, Xs, 0, 2)
    assert Xs2.shape[0] >= Xs.shape[0]
    assert np.allclose(np.sort(row.c), np.sort(target.vs @ P[0]), atol=1e-8)
    assert row.sensitivity <= 1e-9 and 0 < row.fraction <= 1


def test_canonical_rows_and_links_give_the_canonical_form():
    target, oracle, rng, design, P, Xs = _canonical_design()
    rows, Xs, n_redrawn = _canonical.learn_rows(oracle, design, rng, P, Xs, 2)
    i0, perms, err = _canonical.link_rows(oracle, design, P, rows)
    assert len(rows) == 6 and n_redrawn == 0 and len(err) == 5 and max(err) <= 1e-3
    assert sorted(perms[i0]) == [0, 1]
    Rw = np.array([rows[i].R[perms[i]] for i in range(6)])
    Cv = np.array([rows[i].c[perms[i]] for i in range(6)])
    assert equivalent(_route.heads_from_rows(P, Rw, Cv), target, atol=1e-7)


def test_canonical_invisible_floor_is_looser_than_the_counts_routes():
    assert _canonical.CANONICAL_INVISIBLE == 1e-12 > _common.INVISIBLE
    target = MultiHead(np.stack([np.eye(4), np.eye(4)]), np.stack([np.ones(4), -np.ones(4)]))  # values cancel
    with pytest.raises(NotIdentifiableError, match="heads' values cancel"):
        learn_canonical(ValueQueryOracle(target), H=1, verify=0)


def test_canonical_ask_row_terms_asks_more_tokens_only_while_too_few_resolve():
    target, oracle, rng, design, P, Xs = _canonical_design()
    S = design.n.size
    before = oracle.n_queries
    G, c, L, Xs2 = _canonical.ask_row_terms(oracle, design, rng, P[0], Xs, 2)
    assert Xs2.shape[0] == Xs.shape[0] == G.shape[0] == 12        # 12 tokens resolve d + 2 = 8: none added
    assert oracle.n_queries - before == 12 * S
    assert int(np.all(np.isfinite(L), axis=1).sum()) >= 8 and c.size == 2
    few = Xs[:4]                                                   # 4 tokens cannot resolve d + 2 = 8
    G, c, L, Xs3 = _canonical.ask_row_terms(oracle, design, rng, P[0], few, 2)
    assert Xs3.shape[0] > 4 and G.shape[0] == Xs3.shape[0] and Xs3.shape[0] % 3 == 1   # ceil(d / 2) = 3 at a time
    assert np.array_equal(Xs3[:4], few)


def test_canonical_result_names_the_learner_when_the_verification_fails():
    target = random_multi_head(6, 2, seed=0)
    oracle = ValueQueryOracle(target)
    count = _canonical.QueryCount(oracle)
    wrong = MultiHead(target.Ws[:1], target.vs[:1])                # one of the two heads
    opts = _canonical.check_options(2, scale=4.0, max_len=128, n_points=None, oversample=2.0,
                                    max_tokens_factor=8.0, row_retries=2, tol=1e-9, verify=8,
                                    verify_rtol=1e-6, seed=0)
    with pytest.raises(OracleInconsistentError, match="learn_canonical: the recovered 1-head canonical form fails"):
        _canonical.canonical_result(oracle, count, wrong, {"max_len": 5}, opts)
    rec = _canonical.canonical_result(ValueQueryOracle(target), count, target, {"max_len": 5}, opts)
    assert rec.n_heads == 2 and rec.diagnostics["n_verify_queries"] == 8
