"""Tests of companion.lowrank: ROP measurements, the convex program, RGN, the sketch, errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import lowrank
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
    A, B = lowrank._gaussian_rop_design(7, 50, head.v, rng)
    t, info = lowrank._measure_bilinear(ValueQueryOracle(head), A, B, head.v)
    assert np.allclose(t, np.einsum("kd,de,ke->k", A, head.W, B), rtol=1e-10, atol=1e-12)
    assert info["n_requeries"] == 0


def test_measurements_rescale_saturated_queries_and_count_them():
    head = random_single_head(6, rank=2, W_norm=500.0, seed=1)   # logits of order 100 at c = 1
    oracle = ValueQueryOracle(head)
    rng = np.random.default_rng(0)
    A, B = lowrank._gaussian_rop_design(6, 40, head.v, rng)
    t, info = lowrank._measure_bilinear(oracle, A, B, head.v)
    assert info["n_requeries"] > 0
    assert oracle.n_queries == 40 + info["n_requeries"]
    assert np.allclose(t, np.einsum("kd,de,ke->k", A, head.W, B), rtol=1e-8)


def test_fixed_scale_saturation_raises():
    head = random_single_head(6, rank=2, W_norm=1e4, seed=1)
    A, B = lowrank._gaussian_rop_design(6, 20, head.v, np.random.default_rng(0))
    with pytest.raises(OracleInconsistentError, match="outside \\(0, 1\\)"):
        lowrank._measure_bilinear(ValueQueryOracle(head), A, B, head.v, scale=1.0)


def test_design_redraws_left_vectors_orthogonal_to_v():
    v = np.zeros(5)
    v[0] = 1.0
    A, B = lowrank._gaussian_rop_design(5, 2000, v, np.random.default_rng(0))
    assert A.shape == B.shape == (2000, 5)
    assert np.min(np.abs(A @ v)) >= 1e-3 / np.sqrt(5)


# --- the convex program ------------------------------------------------------------------------

def test_nuclear_norm_problem_constraints_hold_at_the_truth():
    W = np.outer([1.0, 2.0, 0.0], [0.5, -1.0, 1.0])
    A, B = lowrank._gaussian_rop_design(3, 10, np.ones(3), np.random.default_rng(1))
    t = np.einsum("kd,de,ke->k", A, W, B)
    problem, Wvar = lowrank._nuclear_norm_problem(A, B, t)
    Wvar.value = W
    assert all(np.max(c.violation()) < 1e-12 for c in problem.constraints)
    assert np.isclose(problem.objective.value, np.linalg.norm(W, "nuc"))


def test_solve_nuclear_recovers_rank_one():
    rng = np.random.default_rng(2)
    W = np.outer(rng.standard_normal(8), rng.standard_normal(8))
    A, B = lowrank._gaussian_rop_design(8, 3 * degrees_of_freedom(8, 1), np.ones(8), rng)
    What, info = lowrank._solve_nuclear(A, B, np.einsum("kd,de,ke->k", A, W, B), eps=1e-9)
    assert info["status"] == "optimal" and info["solver"] == "SCS"
    assert rel_err(What, W) < 1e-6


def test_solve_nuclear_non_optimal_raises_solver_error():
    # 20 > d^2 = 9 random measurements: no 3 x 3 matrix satisfies them all (infeasible).
    rng = np.random.default_rng(2)
    A, B = lowrank._gaussian_rop_design(3, 20, np.ones(3), rng)
    with pytest.raises(SolverError, match="SCS stopped with status 'infeasible"):
        lowrank._solve_nuclear(A, B, rng.standard_normal(20), eps=1e-9)


# --- Riemannian Gauss-Newton -------------------------------------------------------------------

@pytest.mark.parametrize("direct_max", [10**9, 0])   # direct lstsq and matrix-free LSQR
def test_rgn_exact_on_noiseless_measurements(direct_max):
    rng = np.random.default_rng(0)
    d, r = 30, 3
    W = rng.standard_normal((d, r)) @ rng.standard_normal((r, d))
    A, B = lowrank._gaussian_rop_design(d, 2 * degrees_of_freedom(d, r), np.ones(d), rng)
    What, info = lowrank._rgn(A, B, np.einsum("kd,de,ke->k", A, W, B), r, max_iter=50,
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
    U2, s2, V2 = lowrank._retract(U, s, V, X, Y, 2)
    Z = (U * s) @ V.T + U @ X.T + Y @ V.T
    Uz, sz, Vzt = np.linalg.svd(Z)
    assert np.allclose((U2 * s2) @ V2.T, (Uz[:, :2] * sz[:2]) @ Vzt[:2])


# --- the sketch --------------------------------------------------------------------------------

def test_sketch_bases_are_orthogonal_with_equal_value_projections():
    v = np.array([3.0, 0.0, -1.0, 2.0])
    L, R = lowrank._sketch_bases(v, np.random.default_rng(0))
    assert np.allclose(L @ L.T, np.eye(4)) and np.allclose(R @ R.T, np.eye(4))
    assert np.allclose(L @ v, np.linalg.norm(v) / 2)


def test_cross_indices_cover_the_cross_once():
    d, k = 7, 3
    i, j = lowrank._cross_indices(d, 0, k)
    assert i.size == k * (2 * d - k)
    mask = np.zeros((d, d), int)
    np.add.at(mask, (i, j), 1)
    expected = np.zeros((d, d), int)
    expected[:k, :] = 1
    expected[:, :k] = 1
    assert np.array_equal(mask, expected)
    i2, j2 = lowrank._cross_indices(d, 1, 3)
    assert i2.size == k * (2 * d - k) - (2 * d - 1)


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
    ({"rank": 11}, "rank=11 must be <= 10"),
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

    from companion.lowrank import phase_transition, recovery_trial

    rates = phase_transition([(6, 1)], [1.0, 3.0], method="rgn", n_trials=3, seed=1, name="pt_small")
    assert rates[(6, 1)][1] == 1.0                       # 3 r(2d - r) measurements: always exact
    saved = json.loads((results_tmp / "sweeps" / "pt_small.json").read_text())
    assert len(saved["rows"]) == 6 and saved["rows"][0]["m"] == 11
    trial = recovery_trial(6, 1, 3.0, method="rgn", seed=1003)
    assert trial["exact"] and trial["n_queries"] == 6 + 33 and trial["rel_error_W"] < 1e-10
