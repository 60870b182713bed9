"""Tests of companion.lowrank: ROP measurements, the convex program, RGN, the sketch, errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import lowrank
from companion.numerics import rgn, rop
from companion.attention import SingleHead, random_single_head
from companion.errors import (BudgetExceededError, InvalidInputError, NotIdentifiableError,
                              OracleInconsistentError, SolverError)
from companion.lowrank import degrees_of_freedom, learn_low_rank
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle


def rel_err(A, B):
    return np.linalg.norm(A - B) / np.linalg.norm(B)


# --- measurements ------------------------------------------------------------------------------

def test_rop_identity_matches_bilinear_form():
    head = random_single_head(7, rank=2, seed=3)
    rng = np.random.default_rng(0)
    A, B = rop._gaussian_rop_design(7, 50, head.v, rng)
    t, info = lowrank.measure_bilinear(ValueQueryOracle(head), A, B, head.v)
    assert np.allclose(t, np.einsum("kd,de,ke->k", A, head.W, B), rtol=1e-10, atol=1e-12)
    assert info["n_requeries"] == 0


def test_measurements_rescale_saturated_queries_and_count_them():
    head = random_single_head(6, rank=2, W_norm=500.0, seed=1)   # logits of order 100 at c = 1
    oracle = ValueQueryOracle(head)
    rng = np.random.default_rng(0)
    A, B = rop._gaussian_rop_design(6, 40, head.v, rng)
    t, info = lowrank.measure_bilinear(oracle, A, B, head.v)
    assert info["n_requeries"] > 0
    assert oracle.n_queries == 40 + info["n_requeries"]
    assert np.allclose(t, np.einsum("kd,de,ke->k", A, head.W, B), rtol=1e-8)


def test_fixed_scale_saturation_raises():
    head = random_single_head(6, rank=2, W_norm=1e4, seed=1)
    A, B = rop._gaussian_rop_design(6, 20, head.v, np.random.default_rng(0))
    with pytest.raises(OracleInconsistentError, match="outside \\(0, 1\\)"):
        lowrank.measure_bilinear(ValueQueryOracle(head), A, B, head.v, scale=1.0)


@pytest.mark.parametrize("pattern", ["hash", "parity", "smooth"])
@pytest.mark.parametrize("ulps", [2, 4])
def test_saturated_table_head_is_finite_under_every_perturbation(monkeypatch, pattern, ulps):
    """Chapter 04's saturation table (d = 384, rank 4, the paper's c = 1 queries): under answers a
    few ulps off, with each sign pattern, the learner's measurements stay finite and accurate (the
    saturated ones re-measured), and at a fixed scale it raises rather than return sigma^-1 = inf.
    (The inf the table once showed under a 2-ulp perturbation was the chapter's own inline
    sigma^-1 of the lost measurements, whose median it took: not a learner's estimate.)"""
    from companion.oracles import PERTURB_ENV, PERTURB_PATTERN_ENV

    monkeypatch.setenv(PERTURB_ENV, str(ulps))
    monkeypatch.setenv(PERTURB_PATTERN_ENV, pattern)
    head = random_single_head(384, rank=4, seed=0)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((200, 384)), rng.standard_normal((200, 384))
    truth = np.einsum("kd,de,ke->k", A, head.W, B)
    t, info = lowrank.measure_bilinear(ValueQueryOracle(head), A, B, head.v)
    assert np.all(np.isfinite(t)) and info["n_requeries"] > 0
    assert np.max(np.abs(t - truth) / np.abs(truth)) < 1e-9
    with pytest.raises(OracleInconsistentError, match="outside \\(0, 1\\)"):
        lowrank.measure_bilinear(ValueQueryOracle(head), A, B, head.v, scale=1.0)


@pytest.mark.parametrize("change, match", [
    (lambda A, B, v: (A[:, :5], B, v), "d=6 columns"),
    (lambda A, B, v: (A, B[:10], v), "one row per measurement"),
    (lambda A, B, v: (A, B, v[:5]), "v must have shape"),
    (lambda A, B, v: (np.where(np.arange(6) == 2, np.inf, A), B, v), "finite"),
    (lambda A, B, v: (np.vstack([np.zeros((1, 6)), A[1:]]), B, v), "k=0"),
])
def test_measure_bilinear_refuses_bad_input_before_any_query(change, match):
    head = random_single_head(6, rank=2, seed=1)
    A, B = rop._gaussian_rop_design(6, 20, head.v, np.random.default_rng(0))
    oracle = ValueQueryOracle(head)
    with pytest.raises(InvalidInputError, match=match):
        lowrank.measure_bilinear(oracle, *change(A, B, head.v))
    for scale in ("fixed", 0.0, -1.0):
        with pytest.raises(InvalidInputError, match="scale"):
            lowrank.measure_bilinear(oracle, A, B, head.v, scale=scale)
    assert oracle.n_queries == 0


def test_design_redraws_left_vectors_orthogonal_to_v():
    v = np.zeros(5)
    v[0] = 1.0
    A, B = rop._gaussian_rop_design(5, 2000, v, np.random.default_rng(0))
    assert A.shape == B.shape == (2000, 5)
    assert np.min(np.abs(A @ v)) >= 1e-3 / np.sqrt(5)


# --- the convex program ------------------------------------------------------------------------

def test_nuclear_norm_problem_constraints_hold_at_the_truth():
    W = np.outer([1.0, 2.0, 0.0], [0.5, -1.0, 1.0])
    A, B = rop._gaussian_rop_design(3, 10, np.ones(3), np.random.default_rng(1))
    t = np.einsum("kd,de,ke->k", A, W, B)
    problem, Wvar = lowrank._nuclear._nuclear_norm_problem(A, B, t)
    Wvar.value = W
    assert all(np.max(c.violation()) < 1e-12 for c in problem.constraints)
    assert np.isclose(problem.objective.value, np.linalg.norm(W, "nuc"))


def test_solve_nuclear_recovers_rank_one():
    rng = np.random.default_rng(2)
    W = np.outer(rng.standard_normal(8), rng.standard_normal(8))
    A, B = rop._gaussian_rop_design(8, 3 * degrees_of_freedom(8, 1), np.ones(8), rng)
    What, info = lowrank._nuclear.solve_nuclear(A, B, np.einsum("kd,de,ke->k", A, W, B), eps=1e-9)
    assert info["status"] == "optimal" and info["solver"] == "SCS"
    assert rel_err(What, W) < 1e-6


def test_solve_nuclear_non_optimal_raises_solver_error():
    # 20 > d^2 = 9 random measurements: no 3 x 3 matrix satisfies them all (infeasible).
    rng = np.random.default_rng(2)
    A, B = rop._gaussian_rop_design(3, 20, np.ones(3), rng)
    with pytest.raises(SolverError, match="SCS stopped with status 'infeasible"):
        lowrank._nuclear.solve_nuclear(A, B, rng.standard_normal(20), eps=1e-9)


# --- Riemannian Gauss-Newton -------------------------------------------------------------------

@pytest.mark.parametrize("direct_max", [10**9, 0])   # direct lstsq and matrix-free LSQR
def test_rgn_exact_on_noiseless_measurements(direct_max):
    rng = np.random.default_rng(0)
    d, r = 30, 3
    W = rng.standard_normal((d, r)) @ rng.standard_normal((r, d))
    A, B = rop._gaussian_rop_design(d, 2 * degrees_of_freedom(d, r), np.ones(d), rng)
    What, info = rgn._rgn(A, B, np.einsum("kd,de,ke->k", A, W, B), r, max_iter=50,
                              tol=1e-13, direct_max=direct_max)
    assert rel_err(What, W) < 1e-10
    assert info["iterations"] <= 12
    assert (info["lsqr_iterations"] > 0) == (direct_max == 0)


def test_retract_is_truncated_svd():
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((9, 2)))
    V, _ = np.linalg.qr(rng.standard_normal((9, 2)))
    s = np.array([3.0, 1.0])
    X, Y = 0.1 * rng.standard_normal((9, 2)), 0.1 * rng.standard_normal((9, 2))
    U2, s2, V2 = rgn._retract(U, s, V, X, Y, 2)
    Z = (U * s) @ V.T + U @ X.T + Y @ V.T
    Uz, sz, Vzt = np.linalg.svd(Z)
    assert np.allclose((U2 * s2) @ V2.T, (Uz[:, :2] * sz[:2]) @ Vzt[:2])


# --- the sketch --------------------------------------------------------------------------------

def test_sketch_bases_are_orthogonal_with_equal_value_projections():
    v = np.array([3.0, 0.0, -1.0, 2.0])
    L, R = lowrank._sketch._sketch_bases(v, np.random.default_rng(0))
    assert np.allclose(L @ L.T, np.eye(4)) and np.allclose(R @ R.T, np.eye(4))
    assert np.allclose(L @ v, np.linalg.norm(v) / 2)


@pytest.mark.parametrize("n", [None, 1, 2, 3, 100])
def test_cross_indices_cover_the_cross_once(n):
    d, k = 7, 3
    i, j, seg = lowrank._sketch._cross_indices(d, 0, k, n)
    assert i.size == k * (2 * d - k)
    mask = np.zeros((d, d), int)
    np.add.at(mask, (i, j), 1)
    expected = np.zeros((d, d), int)
    expected[:k, :] = 1
    expected[:, :k] = 1
    assert np.array_equal(mask, expected)
    i2, j2, _ = lowrank._sketch._cross_indices(d, 1, 3, n)
    assert i2.size == k * (2 * d - k) - (2 * d - 1)
    if n is not None:
        # every run is a piece of one row or one column, at most n long
        assert sum(seg) == i.size and max(seg) <= n
        starts = np.cumsum([0] + seg[:-1])
        for s0, ln in zip(starts, seg):
            ii, jj = i[s0:s0 + ln], j[s0:s0 + ln]
            assert (np.all(ii == ii[0]) and np.all(np.diff(jj) == 1)) or \
                   (np.all(jj == jj[0]) and np.all(np.diff(ii) == 1))


@settings(max_examples=15, deadline=None)
@given(d=st.integers(2, 40), r=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_sketch_query_count_and_exactness(d, r, seed):
    r = min(r, d)
    target = random_single_head(d, rank=r, seed=seed)
    oracle = ValueQueryOracle(target)
    rec = learn_low_rank(oracle, r, method="sketch", seed=seed)
    k = min(d, r + 1)
    assert rec.n_queries == oracle.n_queries == d + k * (2 * d - k) + rec.diagnostics["n_requeries"] + 32
    assert rec.n_learning_queries == rec.n_queries - 32 and rec.diagnostics["verify_max_error"] < 1e-6
    assert rel_err(rec.W, target.W) < 1e-8
    assert np.allclose(rec.v, target.v)
    assert rec.rank == r


def test_sketch_query_optimal_at_minilm_size():
    d, r = 384, 32
    target = random_single_head(d, rank=r, seed=0)
    rec = learn_low_rank(ValueQueryOracle(target), r, method="sketch")
    assert rel_err(rec.W, target.W) < 1e-8
    assert rec.n_learning_queries <= 1.05 * (degrees_of_freedom(d, r) + d)


@pytest.mark.parametrize("r", [1, 4, 9])
def test_sketch_detects_unknown_rank_with_O_d_extra_queries(r):
    d = 50
    target = random_single_head(d, rank=r, seed=r)
    rec = learn_low_rank(ValueQueryOracle(target), None, method="sketch")
    assert rec.rank == r and rec.diagnostics["rank_detected"] == r
    assert rec.n_learning_queries == d + (r + 1) * (2 * d - r - 1) + rec.diagnostics["n_requeries"]
    assert rel_err(rec.W, target.W) < 1e-8


def test_sketch_overestimated_rank_still_exact():
    target = random_single_head(30, rank=2, seed=4)
    rec = learn_low_rank(ValueQueryOracle(target), 5, method="sketch")
    assert rec.rank == 2 and rel_err(rec.W, target.W) < 1e-8


def test_sketch_full_rank_uses_whole_matrix():
    target = random_single_head(6, seed=0)
    rec = learn_low_rank(ValueQueryOracle(target), 6, method="sketch")
    assert rec.n_queries == 6 + 36 + rec.diagnostics["n_requeries"] + 32
    assert rel_err(rec.W, target.W) < 1e-10


def test_sketch_rank_too_small_raises():
    target = random_single_head(20, rank=4, seed=0)
    with pytest.raises(OracleInconsistentError, match="rank above the assumed rank=2"):
        learn_low_rank(ValueQueryOracle(target), 2, method="sketch")


def test_sketch_zero_W():
    head = SingleHead(np.zeros((5, 5)), np.arange(1.0, 6.0))
    rec = learn_low_rank(ValueQueryOracle(head), None, method="sketch")
    assert rec.rank == 0 and np.all(rec.W == 0)


# --- the entry point ---------------------------------------------------------------------------

def test_nuclear_end_to_end_theorem_5_2():
    d, r = 10, 2
    target = random_single_head(d, rank=r, seed=0)
    oracle = ValueQueryOracle(target)
    rec = learn_low_rank(oracle, r, method="nuclear")
    m = 5 * degrees_of_freedom(d, r)             # the default: 5 r(2d - r), above the transition
    assert rec.diagnostics["n_measurements"] == m == 180
    assert rec.n_queries == d + m + rec.diagnostics["n_requeries"] + 32
    assert rec.diagnostics["n_verify_queries"] == 32 and rec.diagnostics["verify_max_error"] < 1e-6
    assert rel_err(rec.W, target.W) < 1e-6
    assert rec.diagnostics["status"] == "optimal"


def test_rgn_end_to_end_with_verify():
    d, r = 40, 3
    target = random_single_head(d, rank=r, seed=5)
    rec = learn_low_rank(ValueQueryOracle(target), r, method="rgn", verify=10)
    assert rel_err(rec.W, target.W) < 1e-10
    assert rec.n_queries == d + 2 * degrees_of_freedom(d, r) + 10 + rec.diagnostics["n_requeries"]
    assert rec.diagnostics["verify_max_error"] < 1e-6


def test_rgn_too_small_rank_raises_solver_error():
    target = random_single_head(20, rank=5, seed=0)
    with pytest.raises(SolverError, match="rank\\(W\\*\\) > rank=2"):
        learn_low_rank(ValueQueryOracle(target), 2, method="rgn", n_measurements=300)


def test_factors_are_sign_normalised():
    target = random_single_head(12, rank=2, seed=0)
    rec = learn_low_rank(ValueQueryOracle(target), 2, method="sketch")
    U, s, Vt = (rec.diagnostics[k] for k in ("factor_U", "factor_s", "factor_Vt"))
    assert np.allclose((U * s) @ Vt, rec.W)
    assert np.all(U[np.argmax(np.abs(U), axis=0), [0, 1]] > 0)


def test_too_few_measurements_raise_before_any_query():
    oracle = ValueQueryOracle(random_single_head(10, rank=2, seed=0))
    with pytest.raises(NotIdentifiableError, match="n_measurements=30 cannot determine a rank-2"):
        learn_low_rank(oracle, 2, method="rgn", n_measurements=30)
    assert oracle.n_queries == 0


def test_budget_checked_before_first_query():
    oracle = ValueQueryOracle(random_single_head(10, rank=2, seed=0), budget=50)
    with pytest.raises(BudgetExceededError, match="learn_low_rank needs"):
        learn_low_rank(oracle, 2, method="sketch")
    assert oracle.n_queries == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0}, "rank=0 must be >= 1"),
    ({"rank": 11}, "rank=11 must be <= d = 10"),
    ({"rank": 2, "method": "svd"}, "method='svd' is not one of"),
    ({"rank": None, "method": "rgn"}, "rank=None .* needs method='sketch'"),
    ({"rank": 2, "method": "sketch", "n_measurements": 100}, "not used by method='sketch'"),
    ({"rank": 2, "oversample": -1}, "oversample=-1 must be >= 0"),
    ({"rank": 2, "scale": "big"}, "scale='big' is not one of"),
])
def test_invalid_inputs(kwargs, match):
    oracle = ValueQueryOracle(random_single_head(10, rank=2, seed=0))
    rank = kwargs.pop("rank")
    with pytest.raises(InvalidInputError, match=match):
        learn_low_rank(oracle, rank, **kwargs)
    assert oracle.n_queries == 0


def test_approximate_oracle_rejected():
    oracle = ApproxValueQueryOracle(random_single_head(5, rank=1, seed=0), 1e-3)
    with pytest.raises(TypeError, match="needs an exact value-query oracle"):
        learn_low_rank(oracle, 1, method="sketch")


def test_zero_value_vector_not_identifiable():
    oracle = ValueQueryOracle(SingleHead(np.eye(4), np.zeros(4)))
    with pytest.raises(NotIdentifiableError, match="value vector v is 0"):
        learn_low_rank(oracle, 1, method="sketch")


def test_degrees_of_freedom():
    assert degrees_of_freedom(10, 10) == 100 and degrees_of_freedom(10, 1) == 19


def test_phase_transition_runs_through_the_sweep_runner(results_tmp):
    import json

    import companion.book  # noqa: F401  (the book's writer saves a named sweep)
    from companion.lowrank import phase_transition, recovery_trial

    rates = phase_transition([(6, 1)], [1.0, 3.0], method="rgn", n_trials=3, seed=1, name="pt_small")
    assert rates[(6, 1)][1] == 1.0                       # 3 r(2d - r) measurements: always exact
    saved = json.loads((results_tmp / "sweeps" / "pt_small.json").read_text())
    assert len(saved["rows"]) == 6 and saved["rows"][0]["m"] == 11
    trial = recovery_trial(6, 1, 3.0, method="rgn", seed=1003)
    assert trial["exact"] and trial["n_queries"] == 6 + 33 and trial["rel_error_W"] < 1e-10


# ------------------------------------------------------------------------------------------
# Phase transition: independent heads, the 50% point, the statistical dimension
# ------------------------------------------------------------------------------------------

def test_phase_transition_draws_an_independent_head_per_trial(monkeypatch):
    from companion import lowrank

    seen = []

    def fake_trial(d, r, ratio, *, method, seed, design="rop"):
        seen.append((d, r, ratio, seed))
        return {"m": 1, "n_queries": 1, "rel_error_W": 0.0, "exact": ratio > 1.5}

    monkeypatch.setattr(lowrank._trials, "recovery_trial", fake_trial)  # the module that calls it
    rates = lowrank.phase_transition([(6, 1), (8, 2)], [1.0, 2.0], method="rgn", n_trials=3, seed=0)
    assert rates == {(6, 1): [0.0, 1.0], (8, 2): [0.0, 1.0]}
    seeds = [s for *_, s in seen]
    assert len(seen) == 12 and len(set(seeds)) == 12            # no head reused across ratios
    again = lowrank.phase_transition([(6, 1)], [1.0, 2.0], method="rgn", n_trials=3, seed=0)
    assert again == {(6, 1): [0.0, 1.0]} and [s for *_, s in seen[12:]] == seeds[:6]   # reproducible


def test_transition_point():
    from companion.lowrank import transition_point

    assert transition_point([1.0, 2.0, 3.0], [0.0, 0.2, 0.8]) == pytest.approx(2.5)
    assert transition_point([1.0, 2.0], [0.6, 1.0]) == 1.0
    assert np.isnan(transition_point([1.0, 2.0], [0.0, 0.49]))
    assert transition_point([1.0, 2.0], [0.0, 0.5]) == 2.0                 # just reaches the level
    with pytest.raises(InvalidInputError, match="increasing"):
        transition_point([2.0, 1.0], [0.0, 1.0])


def test_nuclear_statistical_dimension_against_a_closed_form():
    # r = d - 1: G' is 1 x 1, E (|g| - tau)_+^2 = 2 ((1 + tau^2) Q(tau) - tau phi(tau))
    from scipy.optimize import minimize_scalar
    from scipy.stats import norm

    from companion.lowrank import degrees_of_freedom, nuclear_statistical_dimension

    d, r = 5, 4
    dof = degrees_of_freedom(d, r)

    def J(tau):
        return dof + r * tau**2 + 2 * ((1 + tau**2) * norm.sf(tau) - tau * norm.pdf(tau))

    exact = minimize_scalar(J, bounds=(0, 5), method="bounded").fun
    est = nuclear_statistical_dimension(d, r, n_samples=20_000, seed=1)
    assert est == pytest.approx(exact, rel=2e-3)
    assert nuclear_statistical_dimension(3, 3) == 9.0                       # full rank: the whole space
    # the values chapter 4 compares with: delta / r(2d - r) at (8, 1), (8, 2), (12, 2)
    ratios = [nuclear_statistical_dimension(dd, rr, seed=0) / degrees_of_freedom(dd, rr)
              for dd, rr in [(8, 1), (8, 2), (12, 2)]]
    np.testing.assert_allclose(ratios, [1.798, 1.511, 1.684], atol=0.01)


def test_gaussian_design_reference():
    from companion.lowrank import recovery_trial

    ok = recovery_trial(6, 1, 3.0, method="nuclear", seed=0, design="gaussian")
    assert ok["exact"] and ok["n_queries"] == 0 and ok["m"] == 33
    assert not recovery_trial(6, 1, 1.0, method="nuclear", seed=0, design="gaussian")["exact"]
    with pytest.raises(InvalidInputError, match="design='gaussian'"):
        recovery_trial(6, 1, 3.0, method="rgn", seed=0, design="gaussian")

# --- streaming: bounded chunks, the same queries -------------------------------------------------

@pytest.mark.parametrize("chunk", [16 * 5, 16 * 5 * 3, 2**30])
def test_answer_rop_sends_the_queries_of_rop_queries_in_chunks(monkeypatch, chunk, shape_log):
    from companion import _streaming

    monkeypatch.setattr(_streaming, "CHUNK_BYTES", chunk)      # 1, 3 or all queries per chunk
    rng = np.random.default_rng(0)
    head = random_single_head(5, rank=2, seed=1)
    A, B = rng.standard_normal((2, 4, 5))
    rows, cols = np.array([0, 0, 0, 2, 3, 1, 1]), np.array([1, 2, 3, 3, 3, 0, 0])
    for c in (1.0, 0.5, rng.uniform(0.5, 2.0, 7)):
        oracle = shape_log(head, record=True)
        y = _streaming.answer_rop(oracle, A, B, c, rows=rows, cols=cols, segments=[3, 2, 2])
        X = lowrank.rop_queries(A[rows], B[cols], c)
        assert np.array_equal(np.stack([x for x, _ in oracle.log]), X)   # bit for bit, in order
        # the answers to rounding: BLAS may round a product differently in batches of other sizes
        np.testing.assert_allclose(y, ValueQueryOracle(head)(X), rtol=1e-14, atol=1e-15)
        assert max(oracle.batches) <= max(1, chunk // (16 * 5))
    with pytest.raises(ValueError, match="segments sum to 6"):
        _streaming.answer_rop(oracle, A, B, rows=rows, cols=cols, segments=[3, 3])


def test_sketch_chunked_equals_unchunked(monkeypatch, shape_log):
    from companion import _streaming

    head = random_single_head(40, rank=3, factored=True, seed=2)
    out = {}
    for chunk in (16 * 40 * 7, 2**30):                          # 7 queries per chunk; all at once
        monkeypatch.setattr(_streaming, "CHUNK_BYTES", chunk)
        oracle = shape_log(head, record=True)
        rec = lowrank.learn_low_rank(oracle, 3, method="sketch", seed=0, verify=0)
        out[chunk] = (rec, oracle)
    (a, oa), (b, ob) = out[16 * 40 * 7], out[2**30]
    assert a.n_queries == b.n_queries == 40 + 4 * (80 - 4)
    # 14 length-1 or 7 two-token queries per chunk, against one batch per cross piece
    assert max(oa.batches) == 14 and max(ob.batches) == 40 - 1 + 1
    assert sorted(x.tobytes() for x, _ in oa.log) == sorted(x.tobytes() for x, _ in ob.log)
    np.testing.assert_allclose(a.W, b.W, rtol=1e-12, atol=1e-12 * np.linalg.norm(b.W))
    assert a.relative_errors(head)["W"] < 1e-11


def test_sketch_memory_is_d_squared_plus_a_chunk(monkeypatch, shape_log):
    import tracemalloc

    from companion import _streaming

    d, r = 256, 16
    monkeypatch.setattr(_streaming, "CHUNK_BYTES", 64 * 2**10)
    head = random_single_head(d, rank=r, factored=True, seed=0)
    oracle = shape_log(head)
    tracemalloc.start()
    rec = lowrank.learn_low_rank(oracle, r, method="sketch", oversample=0, seed=0, verify=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    m = rec.n_queries
    # u is measured first (32 queries for float64 answers): the sketch's cut and band follow it
    assert rec.diagnostics["n_precision_queries"] == 32
    assert m == d + lowrank.degrees_of_freedom(d, r) + rec.diagnostics["n_requeries"] + 32
    assert rec.relative_errors(head)["W"] < 1e-10
    assert max(oracle.batches) <= 64 * 2**10 // (8 * d)      # 64 KiB of length-1 (or half as many length-2) queries
    # L, R, M, W and QR workspace: about ten d x d arrays; all queries at once would be m x 2 x d
    assert peak < 10 * 8 * d * d < m * 2 * d * 8 / 2


def test_factored_svd_of_the_sketch_matches_the_dense_svd():
    rng = np.random.default_rng(0)
    F, G = rng.standard_normal((30, 4)), rng.standard_normal((4, 30))
    W = F @ G
    U1, s1, V1, sv1 = lowrank._learn._sign_normalised_svd(W, 4)
    U2, s2, V2, sv2 = lowrank._learn._sign_normalised_svd(W, 4, factors=(F, G))
    np.testing.assert_allclose(s1, s2, rtol=1e-13)
    np.testing.assert_allclose(U1, U2, atol=1e-12)
    np.testing.assert_allclose(V1, V2, atol=1e-12)
    assert sv2[4] == 0.0 and sv1[4] < 1e-13 * s1[0]


def test_rgn_and_noisy_learner_stream_their_queries(monkeypatch, shape_log):
    from companion import _streaming, robust

    monkeypatch.setattr(_streaming, "CHUNK_BYTES", 16 * 12 * 10)  # 10 two-token queries per chunk
    head = random_single_head(12, rank=2, seed=0)
    oracle = shape_log(head)
    rec = lowrank.learn_low_rank(oracle, 2, method="rgn", n_measurements=4 * 40, seed=0, verify=0)
    assert rec.relative_errors(head)["W"] < 1e-8 and max(oracle.batches) <= 20
    noisy_head = robust.random_margin_head(12, W_max=4.0, mu=0.1, rank=2, seed=0)
    batches = []
    rec = robust.learn_low_rank_noisy(_Recorder(ApproxValueQueryOracle(noisy_head, 1e-7), batches),
                                      2, W_max=4.0, verify=0)
    assert len(batches) > 3 and max(batches) <= 20       # 20 length-1 or 10 length-2 per chunk
    assert np.linalg.norm(rec.W - noisy_head.W) < 1e-3


class _Recorder:
    """Passes calls to an oracle and records the batch sizes."""

    def __init__(self, oracle, batches):
        self._o, self.batches = oracle, batches
        self.d, self.tau = oracle.d, oracle.tau

    @property
    def n_queries(self):
        return self._o.n_queries

    def require(self, n, **kw):
        return self._o.require(n, **kw)

    def __call__(self, X):
        self.batches.append(np.shape(X)[0])
        return self._o(X)


# ----------------------------------------------------------------- the nuclear program's size limit

def test_nuclear_size_limit_just_inside_and_outside_without_building():
    """Refused before any query above NUCLEAR_MAX_BYTES; just inside, the learner goes on (to the budget)."""
    from companion.errors import BudgetExceededError

    d = 64
    per_m = lowrank.NUCLEAR_BYTES_PER_ENTRY * d * d
    m_max = lowrank.NUCLEAR_MAX_BYTES // per_m             # 4096 measurements at d = 64
    assert lowrank.nuclear_program_size(d, m_max)["bytes"] <= lowrank.NUCLEAR_MAX_BYTES
    assert lowrank.nuclear_program_size(d, m_max + 1)["bytes"] > lowrank.NUCLEAR_MAX_BYTES
    target = random_single_head(d, rank=2, seed=0)
    inside = ValueQueryOracle(target, budget=0)           # passes the size check, then the budget stops it
    with pytest.raises(BudgetExceededError):
        lowrank.learn_low_rank(inside, 2, method="nuclear", n_measurements=int(m_max))
    outside = ValueQueryOracle(target)
    with pytest.raises(InvalidInputError, match=r"m d\^2 = 16,781,312 entries.*method='rgn'.*method='sketch'"):
        lowrank.learn_low_rank(outside, 2, method="nuclear", n_measurements=int(m_max) + 1)
    assert outside.n_queries == 0
    # A tenfold change of either constant moves the limit: the paper's default at d = 96, r = 8.
    big = lowrank.nuclear_program_size(96, 5 * 8 * (2 * 96 - 8))
    assert big["entries"] == 7360 * 96**2 and big["variables"] == 2 * 96**2 + 96 and big["psd_cone"] == 192
    assert 8.6e9 < big["bytes"] < 8.8e9
    with pytest.raises(InvalidInputError, match="d=96 with m=7360"):
        lowrank.learn_low_rank(ValueQueryOracle(random_single_head(96, rank=8, seed=0)), 8, method="nuclear")


def test_auto_method_switches_at_the_nuclear_size_limit():
    """method='auto' runs nuclear just inside NUCLEAR_MAX_BYTES and the scalable method just outside."""
    d = 64
    m_max = int(lowrank.NUCLEAR_MAX_BYTES // (lowrank.NUCLEAR_BYTES_PER_ENTRY * d * d))
    inside, why_in = lowrank._learn._auto_method(d, 2, m_max)
    outside, why_out = lowrank._learn._auto_method(d, 2, m_max + 1)
    assert (inside, outside) == ("nuclear", "rgn")       # n_measurements given: the sketch takes none
    assert "fits NUCLEAR_MAX_BYTES" in why_in and "above NUCLEAR_MAX_BYTES" in why_out
    # the default m = 5 r (2d - r): r = 3 fits at d = 64 (2950 < 4096 measurements), r = 8 does not
    assert lowrank._learn._auto_method(d, 3, None)[0] == "nuclear"
    assert lowrank._learn._auto_method(d, 8, None)[0] == "sketch"
    assert lowrank._learn._auto_method(d, None, None)[0] == "sketch"


def test_default_method_runs_at_d_64():
    """Fails before the fix: learn_low_rank(oracle, 8) refused at d = 64 (a 2.5 GB program by the module's estimate)."""
    target = random_single_head(64, rank=8, seed=0)
    rec = lowrank.learn_low_rank(ValueQueryOracle(target), 8)
    assert rec.method == "sketch"
    assert rec.message.startswith("method='auto' chose 'sketch': the paper's nuclear-norm program would need about 2.5 GB")
    assert rec.relative_errors(target)["W"] < 1e-8
    with pytest.raises(InvalidInputError, match="NUCLEAR_MAX_BYTES"):
        lowrank.learn_low_rank(ValueQueryOracle(target), 8, method="nuclear")   # the paper's, by name


def test_noisy_nuclear_size_limit_refused_before_any_query():
    from companion import robust
    from companion.oracles import ApproxValueQueryOracle

    head = robust.random_margin_head(96, W_max=4.0, mu=0.1, rank=8, seed=0)
    oracle = ApproxValueQueryOracle(head, 1e-6)
    with pytest.raises(InvalidInputError, match="learn_low_rank_noisy.*method='rgn'"):
        robust.learn_low_rank_noisy(oracle, 8, W_max=4.0, method="nuclear", n_measurements=20_000)
    assert oracle.n_queries == 0


def test_sketch_rank_tol_just_inside_and_outside():
    """A third direction whose core singular value is 0.29 rank_tol passes, 2.9 rank_tol is refused.

    The direction is drawn and projected off W's row and column spaces: the singular vectors of W's
    zero singular values (U[:, 5] before) are any basis of its null spaces, one per LAPACK kernel
    (Sandybridge's gave 1.05 rank_tol at the size Haswell's gave 0.28, and refused): _off_spaces."""
    from companion.errors import OracleInconsistentError

    head = random_single_head(12, rank=2, seed=0)
    s0 = np.linalg.norm(head.W, 2)
    for rel, ok in [(4e-9, True), (4e-8, False)]:
        target = SingleHead(head.W + rel * s0 * _off_spaces(head.W, 2, seed=1), head.v)
        if ok:
            rec = lowrank.learn_low_rank(ValueQueryOracle(target), 2, method="sketch", verify=0)
            core = rec.diagnostics["core_singular_values"]
            assert 0.1 * lowrank_rank_tol() < core[2] / core[0] < lowrank_rank_tol()
        else:
            with pytest.raises(OracleInconsistentError, match="rank above the assumed rank=2"):
                lowrank.learn_low_rank(ValueQueryOracle(target), 2, method="sketch", verify=0)


def _off_spaces(W, r, *, seed):
    """A unit rank-one direction ``a b^T`` with ``a``, ``b`` drawn from ``seed`` and projected off the
    column and row spaces of the rank-``r`` matrix ``W``: the same on every machine, unlike the
    singular vectors of ``W``'s zero singular values (any basis of its null spaces, one per LAPACK
    kernel)."""
    U, _, Vt = np.linalg.svd(W)
    a, b = np.random.default_rng(seed).standard_normal((2, W.shape[0]))
    a, b = a - U[:, :r] @ (U[:, :r].T @ a), b - Vt[:r].T @ (Vt[:r] @ b)
    return np.outer(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))


def lowrank_rank_tol():
    import inspect

    return inspect.signature(lowrank.learn_low_rank).parameters["rank_tol"].default


def test_rop_design_redraws_exactly_below_its_floor():
    """|a^T v| >= 1e-3 ||v|| / sqrt(d) for every row, and rows between 1e-3 and 1e-2 of it are kept."""
    d, m = 16, 40_000
    v = np.random.default_rng(1).standard_normal(d)
    A, B = rop._gaussian_rop_design(d, m, v, np.random.default_rng(2))
    ratio = np.abs(A @ v) / (np.linalg.norm(v) / np.sqrt(d))
    assert ratio.min() >= 1e-3 and A.shape == B.shape == (m, d)
    kept_small = np.sum(ratio < 1e-2)           # about m * (0.8 % - 0.08 %) = 290 rows
    assert 150 < kept_small < 450


# ---------------------------------------------------------------- nuclear norm at m >= d^2


def test_nuclear_from_d2_measurements_determines_any_rank_and_refuses_the_rank_claim():
    """At m = d^2 the program's only feasible point is W*, of any rank; one fewer does not fix it.

    Before the fix, learn_low_rank(full-rank oracle, 1, method="nuclear", n_measurements=d**2)
    returned the full-rank W* with rank=1 and rank-1 factors, verified.
    """
    from companion.errors import OracleInconsistentError

    d = 6
    target = random_single_head(d, seed=2)                          # rank 6, assumed rank 1
    at = learn_low_rank(ValueQueryOracle(target), 1, method="nuclear", n_measurements=d * d, verify=0)
    assert rel_err(at.W, target.W) < 1e-8                           # determined: W* itself
    below = learn_low_rank(ValueQueryOracle(target), 1, method="nuclear", n_measurements=d * d - 1,
                           verify=0)
    assert rel_err(below.W, target.W) > 1e-3                        # one short: not determined
    with pytest.raises(OracleInconsistentError,
                       match=r"rank above the assumed rank=1.*singular value 2.*m=36 >= d\^2 = 36"):
        learn_low_rank(ValueQueryOracle(target), 1, method="nuclear", n_measurements=d * d)
    with pytest.raises(OracleInconsistentError, match="verification failed") as short:
        learn_low_rank(ValueQueryOracle(target), 1, method="nuclear", n_measurements=d * d - 1)
    assert "d^2" not in str(short.value)
    # A target inside the assumption keeps its result at m >= d^2, rank and factors included.
    low = random_single_head(d, rank=1, seed=2)
    rec = learn_low_rank(ValueQueryOracle(low), 1, method="nuclear", n_measurements=d * d)
    assert rec.rank == 1 and rel_err(rec.W, low.W) < 1e-8
    F = rec.diagnostics["factor_U"] * rec.diagnostics["factor_s"] @ rec.diagnostics["factor_Vt"]
    assert rel_err(F, low.W) < 1e-8


def test_nuclear_rank_check_threshold_just_inside_and_outside():
    """A (r+1)-th singular value of 1e-4 relative: refused above it by rank_tol or verify_rtol, kept below."""
    from companion.errors import OracleInconsistentError

    d = 6
    head = random_single_head(d, rank=1, seed=3)
    target = SingleHead(head.W + 1e-4 * np.linalg.norm(head.W, 2) * _off_spaces(head.W, 1, seed=2), head.v)

    def run(**kw):
        return learn_low_rank(ValueQueryOracle(target), 1, method="nuclear", n_measurements=d * d, **kw)

    rec = run(rank_tol=2e-4, verify_rtol=2.5e-5)                     # rank_tol just above
    sv = rec.diagnostics["singular_values"]
    assert rec.rank == 1 and 0.9e-4 < sv[1] / sv[0] < 1.1e-4
    assert run(rank_tol=1e-8, verify_rtol=2e-4).rank == 1           # the check's tolerance above
    for kw in ({"rank_tol": 5e-5, "verify_rtol": 2.5e-5}, {"rank_tol": 1e-8, "verify_rtol": 5e-5}):
        with pytest.raises(OracleInconsistentError, match="singular value 2 is 0.0001 relative"):
            run(**kw)


@pytest.mark.parametrize("method", ["rgn", "nuclear"])
@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_rop_learners_take_values_at_the_ends_of_float64(method, scale):
    """The ROP design's redraw rule compared ``|a^T v|`` with ``floor ||v|| / sqrt(d)``: at v scaled
    by 1e300, ``||v||`` overflowed to inf and every learner on the ROP design failed with an
    overflow (2026-12-02). The rule depends on v's direction only."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((8, 2)) @ rng.standard_normal((2, 8)) / 3
    v = rng.standard_normal(8)
    with np.errstate(all="raise"):
        rec = learn_low_rank(ValueQueryOracle(SingleHead(W, scale * v)), 2, method=method, seed=0)
    assert np.linalg.norm(rec.W - W) <= 1e-12 * np.linalg.norm(W)
    assert np.allclose(rec.v / scale, v, rtol=1e-13, atol=0)


def test_a_layer_with_biases_is_pointed_to_learn_single_head_bias_true():
    """Fails before the fix: '... stayed saturated ...; the oracle does not behave like a softmax head'."""
    from companion.attention import SingleHead
    from companion.errors import OracleInconsistentError

    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((9, 2)), rng.standard_normal((9, 2))
    head = SingleHead(3.0 * A @ B.T, rng.standard_normal(9))     # rank 2 in homogeneous coordinates
    oracle = ValueQueryOracle(lambda X: head([np.c_[x, np.ones(len(x))] for x in X]), d=8)
    with pytest.raises(OracleInconsistentError, match=r"learn_single_head\(oracle, bias=True\)"):
        lowrank.learn_low_rank(oracle, 2, method="sketch")


@pytest.mark.parametrize("method", ["sketch", "rgn"])
def test_bias_true_learns_a_low_rank_layer_with_biases(method):
    from companion.attention import SingleHead

    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((9, 2)), rng.standard_normal((9, 2))
    head = SingleHead(3.0 * A @ B.T, rng.standard_normal(9))          # token block of rank 2, plus w
    oracle = ValueQueryOracle(lambda X: head([np.c_[x, np.ones(len(x))] for x in X]), d=8)
    rec = lowrank.learn_low_rank(oracle, 2, method=method, bias=True)
    assert rec.W.shape == (9, 9) and rec.rank == 2 and rec.method == method
    np.testing.assert_allclose(rec.W[:8], head.W[:8], rtol=0, atol=1e-10)
    np.testing.assert_allclose(rec.v, head.v, rtol=0, atol=1e-12)
    assert rec.diagnostics["n_bias_queries"] >= 2 * 8 + 1 and rec.message.startswith("with biases")
    assert rec.n_queries == oracle.n_queries


def test_bias_true_with_too_small_a_rank_is_refused():
    from companion.attention import SingleHead
    from companion.errors import OracleInconsistentError

    rng = np.random.default_rng(2)
    head = SingleHead(rng.standard_normal((7, 7)), rng.standard_normal(7))
    oracle = ValueQueryOracle(lambda X: head([np.c_[x, np.ones(len(x))] for x in X]), d=6)
    with pytest.raises(OracleInconsistentError):
        lowrank.learn_low_rank(oracle, 1, method="sketch", bias=True)
