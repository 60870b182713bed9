"""A deployed attention layer: the vector oracle, the model, and learn_attention_layer (issue 35, first slice)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from scipy.special import erf

from companion.errors import (
    BudgetExceededError,
    InvalidInputError,
    OracleInconsistentError,
    PrecisionError,
    SolverError,
)
from companion.attention import random_single_head
from companion.exact import learn_single_head
from companion.layer import (
    FLOAT32_FLOOR_UNITS,
    FLOAT32_LINK_TOKENS,
    FLOAT32_RANK_UNITS,
    FLOAT32_VERIFY_UNITS,
    HEADS_UNRESOLVED,
    JOINT_FROM,
    LOW_GAP,
    MIN_GAP,
    AttentionLayer,
    directions_route_plan,
    identifiable_parameters,
    MiniLMBlock,
    load_block_reference,
    minilm_block,
    information_floor,
    layer_norm,
    learn_attention_layer,
    post_ln_symmetry,
    pre_ln_symmetry,
    random_attention_layer,
)
from companion.layer._joint import joint_plan, scale_plan
from companion.multihead import follow_up_count, rational_plan
from companion.oracles import PERTURB_ENV, ValueQueryOracle, VectorQueryOracle


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


def fresh(d, n=40, seed=123):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(1, 9, size=n)]


def max_rel_prediction_error(a, b, X):
    ya, yb = a(X), b(X)
    return float(np.max(np.linalg.norm(ya - yb, axis=1) / np.linalg.norm(ya, axis=1)))


# --- the vector oracle ------------------------------------------------------------------------------


def test_vector_oracle_shapes_counts_and_log():
    layer = random_attention_layer(4, 2, d_out=3, seed=0)
    oracle = VectorQueryOracle(layer, record=True)
    X = np.random.default_rng(0).standard_normal((5, 3, 4))
    one = oracle(X[0])
    assert one.shape == (3,) and np.array_equal(one, layer(X[0]))
    batch = oracle(X)
    assert batch.shape == (5, 3) and np.array_equal(batch, layer(X))
    mixed = oracle([X[0], X[1, :2], X[2, :1]])  # three lengths: grouped by length, answered in order
    assert mixed.shape == (3, 3) and np.allclose(mixed[1], layer(X[1, :2]), rtol=0, atol=1e-15)
    assert oracle.n_queries == 1 + 5 + 3 and len(oracle.log) == 9
    assert oracle.log[0][1].shape == (3,) and np.array_equal(oracle.log[0][1], one)
    assert (oracle.d, oracle.d_out) == (4, 3)


def test_vector_oracle_budget_is_refused_before_answering():
    oracle = VectorQueryOracle(random_attention_layer(4, 1, seed=0), budget=4)
    oracle(np.zeros((3, 2, 4)))
    with pytest.raises(BudgetExceededError, match="2 more queries requested, but only 1"):
        oracle(np.zeros((2, 2, 4)))
    assert oracle.n_queries == 3 and oracle.remaining == 1
    oracle(np.zeros((1, 2, 4)))  # exactly the budget is fine
    assert oracle.remaining == 0


def test_vector_oracle_validates_input_and_dimensions():
    layer = random_attention_layer(4, 1, seed=0)
    oracle = VectorQueryOracle(layer, precision="float32")
    assert oracle.precision == 2.0**-24
    with pytest.raises(InvalidInputError, match="last axis d=4"):
        oracle(np.zeros((2, 3)))
    with pytest.raises(InvalidInputError, match="NaN or inf"):
        oracle(np.full((1, 4), np.nan))
    with pytest.raises(InvalidInputError, match="d_out"):
        VectorQueryOracle(lambda X: X[:, -1], d=4)
    assert oracle.n_queries == 0


@pytest.mark.parametrize(
    "answer, match",
    [
        (lambda X: np.zeros((X.shape[0], 2)), r"shape \(1, 2\) .* d_out=3 .* shape \(1, 3\)"),
        (lambda X: np.zeros(X.shape[0]), r"shape \(1,\) .* shape \(1, 3\)"),
        (lambda X: np.full((X.shape[0], 3), np.inf), r"non-finite answer \(inf\).*Output entry 0"),
        (lambda X: [["a", "b", "c"]], r"returned list .* real numbers, an array of shape \(1, 3\)"),
        (lambda X: np.ones((X.shape[0], 3)) * 1j, "complex"),
    ],
    ids=["wrong-d_out", "scalar-answers", "inf", "strings", "complex"],
)
def test_vector_oracle_names_a_bad_target_output(answer, match):
    oracle = VectorQueryOracle(answer, d=4, d_out=3)
    with pytest.raises(OracleInconsistentError, match=match):
        oracle(np.zeros((1, 4)))
    assert oracle.n_queries == 0


def test_vector_oracle_perturbation_mode_moves_each_answer_by_k_ulps(monkeypatch):
    layer = random_attention_layer(4, 1, seed=0)
    X = np.random.default_rng(1).standard_normal((6, 3, 4))
    monkeypatch.setenv(PERTURB_ENV, "8")
    y = VectorQueryOracle(layer)(X)
    r = (y - layer(X)) / layer(X)
    assert np.allclose(np.abs(r), 8 * np.finfo(float).eps, rtol=1e-3)
    assert np.all(np.sign(r) == np.sign(r[:, :1])) and len(set(np.sign(r[:, 0]))) == 2  # one sign per query


def test_readout_is_a_scalar_oracle_counted_and_budgeted_by_the_vector_oracle():
    layer = random_attention_layer(4, 2, d_out=3, seed=0)
    vec = VectorQueryOracle(layer, budget=10)
    c = np.array([1.0, -2.0, 0.5])
    view = vec.readout(c)
    assert isinstance(view, ValueQueryOracle)
    X = np.random.default_rng(0).standard_normal((4, 3, 4))
    assert np.array_equal(view(X), layer(X) @ c) and isinstance(view(X[0]), float)
    assert vec.n_queries == 5 and view.n_queries == 5 and view.remaining == 5
    with pytest.raises(BudgetExceededError):
        view(np.zeros((6, 2, 4)))
    assert vec.n_queries == 5
    with pytest.raises(InvalidInputError, match=r"shape \(3\)"):
        vec.readout([1.0, 2.0])


def test_an_existing_learner_runs_unchanged_on_a_readout():
    """A bias-free one-head layer read through c is the head (W, M^T c): Theorem 4.1's learner recovers it."""
    d, rng = 5, np.random.default_rng(3)
    W = np.zeros((1, d + 1, d + 1))
    W[0, :d, :d] = rng.standard_normal((d, d)) / np.sqrt(d)
    M = np.zeros((1, 3, d + 1))
    M[0, :, :d] = rng.standard_normal((3, d))
    vec = VectorQueryOracle(AttentionLayer(W, M, np.zeros(3)))
    c = rng.standard_normal(3)
    rec = learn_single_head(vec.readout(c))
    assert rel(rec.W, W[0, :d, :d]) < 1e-10 and rel(rec.v, M[0, :, :d].T @ c) < 1e-12
    assert vec.n_queries == rec.n_queries == d + d * d + rec.diagnostics["n_verify_queries"]


# --- the model ----------------------------------------------------------------------------------------


def _native(d=6, H=2, dh=3, d_out=5, seed=0):
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((H, dh, d)) for _ in range(3))
    bq, bk, bv = (rng.standard_normal((H, dh)) for _ in range(3))
    return Q, bq, K, bk, V, bv, rng.standard_normal((d_out, H * dh)), rng.standard_normal(d_out)


def test_from_native_is_the_frameworks_computation():
    Q, bq, K, bk, V, bv, WO, bO = _native()
    layer = AttentionLayer.from_native(Q, bq, K, bk, V, bv, WO, bO)
    X = np.random.default_rng(1).standard_normal((7, 4, 6))
    heads = []
    for h in range(2):
        q = X[:, -1] @ Q[h].T + bq[h]
        k = X @ K[h].T + bk[h]
        s = np.einsum("bk,bnk->bn", q, k) / np.sqrt(3)
        a = np.exp(s - s.max(1, keepdims=True))
        a /= a.sum(1, keepdims=True)
        heads.append(np.einsum("bn,bnk->bk", a, X @ V[h].T + bv[h]))
    ref = np.concatenate(heads, axis=1) @ WO.T + bO
    assert np.max(np.abs(layer(X) - ref)) < 1e-12 * np.max(np.abs(ref))
    with pytest.raises(InvalidInputError, match="d_out=5 must equal d=6"):
        AttentionLayer.from_native(Q, bq, K, bk, V, bv, WO, bO, residual=True)


def test_canonical_form_keeps_the_function_merges_and_drops():
    Q, bq, K, bk, V, bv, WO, bO = _native(d=5, H=2, d_out=5)
    base = AttentionLayer.from_native(Q, bq, K, bk, V, bv, WO, bO, residual=True)
    rng = np.random.default_rng(2)
    Ws = np.concatenate([base.Ws, base.Ws[:1], rng.standard_normal((1, 6, 6))])  # a copy of head 0, a dead head
    Ms = np.concatenate([base.Ms, 0.5 * base.Ms[:1], np.zeros((1, 5, 6))])
    Ms[2, :, -1] = 1.0  # a dead head with a value bias: a constant
    layer = AttentionLayer(Ws, Ms, base.b_O, skip=base.skip)
    c = layer.canonical()
    assert c.n_heads == 2 and c.residual
    assert np.all(c.Ws[:, -1, :] == 0) and np.all(c.Ms[:, :, -1] == 0)
    X = fresh(5)
    assert max_rel_prediction_error(layer, c, X) < 1e-13
    assert np.array_equal(c.canonical().Ws, c.Ws)  # idempotent


def test_model_input_checks():
    with pytest.raises(InvalidInputError, match=r"Ws must have shape \(H, d \+ 1, d \+ 1\)"):
        AttentionLayer(np.zeros((1, 3, 4)), np.zeros((1, 2, 4)), np.zeros(2))
    with pytest.raises(InvalidInputError, match="Ms must have shape"):
        AttentionLayer(np.zeros((1, 3, 3)), np.zeros((2, 2, 3)), np.zeros(2))
    with pytest.raises(InvalidInputError, match="skip must have shape"):
        AttentionLayer(np.zeros((1, 3, 3)), np.zeros((1, 2, 3)), np.zeros(2), skip=np.eye(3))


# --- the learner ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d, H, residual",
    [(8, 1, False), (8, 2, True), (12, 3, False), (16, 2, True)],
    ids=["d8-H1", "d8-H2-residual", "d12-H3", "d16-H2-residual"],
)
def test_exact_recovery_of_random_layers(d, H, residual):
    target = random_attention_layer(d, H, residual=residual, seed=d + H)
    oracle = VectorQueryOracle(target)
    rec = learn_attention_layer(oracle, H=H)
    est, ref = rec.model, target.canonical()
    assert rec.n_heads == H and est.residual == residual
    assert rec.diagnostics["skip"] == ("identity" if residual else "none")
    # float64 rounding level after the joint polish (the heads' fits alone stop near 1e-10)
    assert rel(est.Ws, ref.Ws) < 1e-13 and rel(est.Ms, ref.Ms) < 1e-13 and rel(est.b_O, ref.b_O) < 1e-13
    assert max_rel_prediction_error(target, est, fresh(d)) <= 1e-13
    assert rec.diagnostics["verify_max_error"] <= 1e-13 and rec.diagnostics["polished"]
    # the readout route's heads (H < JOINT_FROM) stop near 1e-10, the polish takes them to rounding; the joint
    # route's (from JOINT_FROM heads) are at rounding before it
    joint = H >= JOINT_FROM
    assert rec.diagnostics["heads_learner"] == ("joint" if joint else "learn_canonical_rational")
    before = rec.diagnostics["polish_residual_before"]
    assert rec.diagnostics["polish_residual"] < 1e-14 and (before < 1e-13 if joint else before > 1e-12)
    # the counts, read from the oracle, against the scalar route and the information floor
    diag = rec.diagnostics
    assert rec.n_queries == oracle.n_queries
    assert rec.n_learning_queries == diag["n_learn_queries"]
    parts = ("n_probe_queries", "n_lstsq_queries", "n_head_queries", "n_polish_queries")
    assert rec.n_learning_queries == sum(diag[k] for k in parts) and diag["n_probe_queries"] == 20
    assert diag["n_lstsq_queries"] == (d + 1) + H * d + 8
    assert diag["n_polish_queries"] == 2 * information_floor(d, H, d) - (H * d + 8)
    if joint:
        assert diag["n_head_queries"] == joint_plan(d, H)
    else:
        assert diag["n_head_queries"] <= rational_plan(d + 1, H)["n_queries"] - (d + 1)
    assert diag["kim_count"] == follow_up_count(d, H)
    assert diag["heads_route_count"] == follow_up_count(d + 1, H) == 4 * H * (d + 1) ** 2 - 2 * H + 1
    # the problem as posed (residual="auto"): the skip is a matrix to fit, whatever it turns out to be
    assert diag["information_floor"] == information_floor(d, H, d, skip="matrix")
    assert diag["information_floor"] > information_floor(d, H, d, skip="identity" if residual else "none")


def test_canonical_form_is_what_is_recovered():
    """Two heads with one W~ and a head with M = 0: one canonical head is learned, with the M's summed."""
    base = random_attention_layer(8, 2, seed=5)
    Ws = np.stack([base.Ws[0], base.Ws[0], base.Ws[1]])
    Ms = np.stack([base.Ms[0], -0.25 * base.Ms[0], np.zeros_like(base.Ms[1])])
    target = AttentionLayer(Ws, Ms, base.b_O)
    rec = learn_attention_layer(VectorQueryOracle(target), H=1)
    ref = target.canonical()
    assert ref.n_heads == rec.n_heads == 1 and rec.message.startswith("found 1 head, skip")  # not "1 heads"
    assert rel(rec.model.Ms, ref.Ms) < 1e-8 and rel(rec.model.Ws, ref.Ws) < 1e-8


def test_a_general_skip_matrix_is_found_not_assumed():
    base = random_attention_layer(8, 2, d_out=5, seed=7)
    S = np.random.default_rng(7).standard_normal((5, 8))
    target = AttentionLayer(base.Ws, base.Ms, base.b_O, skip=S)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["skip"] == "matrix" and rel(rec.model.skip, S) < 1e-8
    with pytest.raises(OracleInconsistentError, match="residual=False, but the fitted skip matrix is not 0"):
        learn_attention_layer(VectorQueryOracle(target), H=2, residual=False)


def test_residual_option_checks_what_was_found():
    plain = random_attention_layer(6, 1, seed=3)
    with pytest.raises(OracleInconsistentError, match=r"^residual=True, but the fitted skip matrix is 0 \(\|\|S\|\|_F"):
        learn_attention_layer(VectorQueryOracle(plain), H=1, residual=True)
    rec = learn_attention_layer(
        VectorQueryOracle(random_attention_layer(6, 1, residual=True, seed=3)), H=1, residual=True
    )
    assert rec.model.residual and rec.diagnostics["skip_error"] < 1e-9


@pytest.mark.parametrize(
    "layernorm, eps",
    [(None, 1e-3), ("post", 1e-3), ("post", 1e-12), ("pre", 1e-3)],
    ids=["plain", "post", "bert", "pre"],
)
def test_residual_false_on_a_residual_block_names_the_option_on_every_route(layernorm, eps):
    """A new user's finding: residual=False on a residual post-LN block was refused with "could not learn this
    post-LN block (... or not an attention layer)", its chained cause (the skip) called not applicable. The skip
    found is the identity: the refusal names the option, on the gap's route, the row space's (eps 1e-12) and
    pre-LN's too, and states no other cause."""
    block = random_attention_layer(8, 2, residual=True, layernorm=layernorm, eps=eps, seed=0)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(block, d=8, d_out=8), H=2, residual=False)
    text = str(info.value)
    assert re.match(
        r"residual=False, but the fitted skip matrix is the identity \(\|\|S - I\|\|_F = \S+\): the target "
        r"adds x_N\. Pass residual='auto' \(the default\) or True\. Nothing was returned\.$",
        text,
    ), text
    assert float(re.search(r"= (\S+)\)", text).group(1)) < 1e-9


def test_without_polish_the_heads_fits_set_the_error():
    target = random_attention_layer(8, 2, residual=True, seed=10)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, polish=False)
    assert not rec.diagnostics["polished"] and rec.diagnostics["n_polish_queries"] == 0
    assert 1e-13 < max_rel_prediction_error(target, rec.model, fresh(8)) <= 1e-8


def test_h_bound_and_unknown_h():
    target = random_attention_layer(6, 2, residual=True, seed=2)
    rec = learn_attention_layer(VectorQueryOracle(target), H_bound=3)
    assert rec.n_heads == 2 and rec.diagnostics["heads_learner"] == "learn_canonical_rational"
    assert max_rel_prediction_error(target, rec.model, fresh(6)) <= 1e-8


def _layernorm(X):
    m = X.mean(axis=-1, keepdims=True)
    return (X - m) / np.sqrt(((X - m) ** 2).mean(axis=-1, keepdims=True) + 1e-12)


class _PreLN:
    """x_N + the attention of LN(X) (pre-LN, as GPT-2): outside the class."""

    def __init__(self, layer):
        self.layer, self.d, self.d_out = layer, layer.d, layer.d_out

    def __call__(self, X):
        Z = _layernorm(X)
        return X[:, -1] + self.layer(Z)


class _TwoLayers:
    """A second layer over the first layer's outputs at every (causal) position: outside the class."""

    def __init__(self, first, second):
        self.first, self.second, self.d, self.d_out = first, second, first.d, second.d_out

    def __call__(self, X):
        return self.second(np.stack([self.first(X[:, : i + 1]) for i in range(X.shape[1])], axis=1))


@pytest.mark.parametrize(
    "which, cause",
    [
        ("two-layers", "the least squares for the output maps misfit|the heads' learner .* refused|disagrees"),
        ("masked", "the least squares for the output maps misfit|the heads' learner .* refused|disagrees"),
    ],
)
def test_other_targets_outside_the_class_are_refused(which, cause):
    if which == "masked":
        target = _Windowed(random_attention_layer(6, 2, residual=True, seed=2), window=3)
    else:
        target = _TwoLayers(random_attention_layer(6, 2, residual=True, seed=2), random_attention_layer(6, 2, seed=3))
    oracle = VectorQueryOracle(target)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
        learn_attention_layer(oracle, H=2)
    assert re.search(f"not an attention layer.*({cause})", str(info.value.__cause__))  # the stage's, chained


#: The order check's verdict (``layer._determinism.order_dependence``), raised before a stage's refusal stands on a
#: target that sees positions (a mask by position, causal layers stacked), that stage's refusal chained to it.
SEES_POSITIONS = "^not an attention layer: its answer at the last token changes when the tokens before it are put in"


class _Windowed:
    """A layer whose heads see only the last ``window`` tokens (a sliding-window mask): outside the class."""

    def __init__(self, layer, window):
        self.layer, self.window, self.d, self.d_out = layer, window, layer.d, layer.d_out

    def __call__(self, X):
        return self.layer(X[:, -self.window :])


def test_a_small_d_for_the_counts_route_names_the_robust_route():
    oracle = VectorQueryOracle(random_attention_layer(3, 1, seed=0))
    with pytest.raises(InvalidInputError, match="d \\+ 1 = 4 dimensions: .* without H and H_bound"):
        learn_attention_layer(oracle, H=1)
    assert oracle.n_queries == 0


def test_unknown_h_uses_the_robust_route():
    target = random_attention_layer(6, 2, residual=True, seed=2)
    rec = learn_attention_layer(VectorQueryOracle(target))
    assert rec.n_heads == 2 and rec.diagnostics["heads_learner"] == "learn_canonical"
    assert max_rel_prediction_error(target, rec.model, fresh(6)) <= 1e-13


def _rounded32(layer):
    return lambda X: layer(X).astype(np.float32).astype(np.float64)


def test_a_float32_server_is_learned_within_10x_its_floor():
    """A residual layer whose answers are rounded to float32 (floor 0.82 u): predictions to 7.4 u (measured)."""
    layer = random_attention_layer(6, 2, residual=True, seed=2)
    floor = floor_and_error(_rounded32(layer), layer, 6)
    assert 0.5 < floor <= 1.0
    for stated in (None, "float32"):
        rec = learn_attention_layer(VectorQueryOracle(_rounded32(layer), d=6, d_out=6, precision=stated), H=2)
        assert rec.n_heads == 2 and rec.diagnostics["skip"] == "identity"
        assert floor_and_error(_rounded32(layer), rec.model, 6) <= 10 * floor


def test_the_float32_route_needs_the_number_of_heads_and_no_pre_ln():
    """A post-LN is learned from the row space given H (tests/test_layer_float32_post.py); on the readout
    route it stays refused, as measured (its heads' stage resolved none of 12 float32 blocks)."""
    layer = random_attention_layer(6, 2, residual=True, seed=2)
    oracle = VectorQueryOracle(_rounded32(layer), d=6, d_out=6)
    with pytest.raises(PrecisionError, match="float32 numbers.*neither H nor H_bound is given"):
        learn_attention_layer(oracle)
    post = random_attention_layer(6, 2, residual=True, layernorm="post", eps=1e-3, seed=0)
    with pytest.raises(PrecisionError, match="float32 numbers.*has a post-LN.*resolved none of 12"):
        learn_attention_layer(VectorQueryOracle(_rounded32(post), d=6, d_out=6), H=2, heads="readout")
    rec = learn_attention_layer(VectorQueryOracle(_rounded32(post), d=6, d_out=6), H=2)  # measured: 39.8 u
    assert rec.diagnostics["heads_learner"] == "joint, norms from the row space"
    assert rec.diagnostics["verify_max_error"] <= FLOAT32_VERIFY_UNITS * U32
    pre = random_attention_layer(6, 2, residual=True, layernorm="pre", eps=1e-3, seed=0)
    with pytest.raises(PrecisionError, match="float32 numbers.*has a pre-LN"):
        learn_attention_layer(VectorQueryOracle(_rounded32(pre), d=6, d_out=6), H=2)


@pytest.mark.parametrize("which", ["two-layers", "masked", "gelu"])
def test_targets_outside_the_class_served_in_float32_are_refused_with_a_cause(which):
    base = random_attention_layer(6, 2, residual=True, seed=2)
    if which == "masked":
        target, cause = _Windowed(base, window=3), "could not resolve the layer's heads.*or not an attention layer"
    elif which == "two-layers":
        target = _TwoLayers(base, random_attention_layer(6, 2, seed=3))
        cause = "could not resolve the layer's heads.*or not an attention layer"
    else:
        target, cause = _After(base, "gelu"), "not an attention layer.*not affine in the token.*GELU"
    oracle = VectorQueryOracle(lambda X: target(X).astype(np.float32).astype(np.float64), d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS if which != "gelu" else cause) as info:
        learn_attention_layer(oracle, H=2)
    if which != "gelu":  # the heads' stage refusal, chained
        assert re.search(cause, str(info.value.__cause__))


@pytest.mark.parametrize("which", ["in-class", "masked-6", "masked-3"])
def test_float32_separation_with_the_true_heads_given(which):
    """The verification's separation at float32 (FLOAT32_VERIFY_UNITS = 60 u): with the true heads given, the
    output maps fitted and polished on float32 answers predict fresh ones to 0.9 u in the class; a mask over
    all 6 positions of length-8 queries misfits by 1.2e7 u, one over 3 is refused by the least squares."""
    from dataclasses import replace

    from companion.layer._fit import group_by_length
    from companion.layer._learn import _assemble, _options, _outputs

    base = random_attention_layer(6, 2, residual=True, seed=2)
    target = {"in-class": base, "masked-6": _Windowed(base, 6), "masked-3": _Windowed(base, 3)}[which]
    served = VectorQueryOracle(lambda X: target(X).astype(np.float32).astype(np.float64), d=6, d_out=6)
    o = replace(_options(served, 2, None, "auto", "auto", True, 0, None, 0), u=U32)
    rng = np.random.default_rng(0)
    X1 = np.concatenate([np.zeros((1, 1, 6)), np.eye(6)[:, None, :]])
    Xfit = [rng.standard_normal((int(n), 6)) / np.sqrt(6) for n in rng.integers(2, 9, size=20)]
    batches, answers = group_by_length(Xfit, served(Xfit))
    args = (served, base.canonical().Ws.copy(), [X1] + batches, [served(X1)] + answers, 400, o, rng)
    if which == "masked-3":
        with pytest.raises(OracleInconsistentError, match="least squares for the output maps misfit"):
            _outputs(*args, gate=1e-1)
        return
    Ws, Theta, _ = _outputs(*args, gate=1e-1)
    error = floor_and_error(served, _assemble(Ws, Theta, None, o, 6)[0], 6)
    if which == "in-class":
        assert error < 2.0
    else:
        assert error > 1e6 > 1e4 * FLOAT32_VERIFY_UNITS


@pytest.mark.parametrize("cap, dense", [(198, True), (197, False)], ids=["inside", "outside"])
def test_float32_polish_cap_just_inside_and_outside(monkeypatch, cap, dense):
    """The float32 route polishes densely up to FLOAT32_POLISH_MAX_UNKNOWNS unknowns (d = 6, H = 2: 84 key rows'
    entries and 114 of the output maps, 198), matrix-free above it (unpolished there until 2026-12-05), the cap moved
    to 198 and 197 here."""
    from dataclasses import replace

    from companion.layer import _learn
    from companion.layer._fit import group_by_length

    monkeypatch.setattr(_learn, "FLOAT32_POLISH_MAX_UNKNOWNS", cap)
    base = random_attention_layer(6, 2, residual=True, seed=2)
    served = VectorQueryOracle(_rounded32(base), d=6, d_out=6)
    o = replace(_learn._options(served, 2, None, "auto", "auto", True, 0, None, 0), u=U32)
    rng = np.random.default_rng(0)
    X1 = np.concatenate([np.zeros((1, 1, 6)), np.eye(6)[:, None, :]])
    Xfit = [rng.standard_normal((int(n), 6)) / np.sqrt(6) for n in rng.integers(2, 9, size=20)]
    batches, answers = group_by_length(Xfit, served(Xfit))
    Ws = base.canonical().Ws.copy()
    _, _, info = _learn._outputs(served, Ws, [X1] + batches, [served(X1)] + answers, 400, o, rng, gate=1e-1)
    assert info["polished"] and info["n_polish_queries"] == 400
    assert ("polish_lsmr_iterations" not in info) is dense


def test_float32_block_above_the_dense_polish_without_layernorm_is_polished_matrix_free():
    """H = 8 at d = 32 without LayerNorm, rounded to float32 (17,696 unknowns, above FLOAT32_POLISH_MAX_UNKNOWNS =
    5,000): unpolished, its heads about 1e-6 off, it was refused by its verification (65 u to 103 u at d = 32 and 64).
    Polished matrix-free on the answers (``_fit.polish_free``; measured 2026-12-05, learner seed 0: LSMR 36, 44 and 13
    iterations, the residual from 2.0e-6 to 1.8e-8), verified at 1.54 u, 1.88 u from the exact block on 500 fresh
    queries; about 2.3 CPU s. The bounds are about twice. With Theta's head blocks factored too (``_fit.map_ranks``,
    2026-12-07; the whole Theta's route in the same process in brackets): LSMR 27, 15 and 4 (24, 14 and 5), verified at
    0.65 u (0.77 u), 0.43 u (0.65 u) from the exact block on this test's 200 fresh queries."""
    block = random_attention_layer(32, 8, seed=0)
    served = VectorQueryOracle(_rounded32(block), d=32, d_out=32)
    rec = learn_attention_layer(served, H=8)
    diag = rec.diagnostics
    assert diag["polished"] and diag["heads_learner"] == "joint" and len(diag["polish_lsmr_iterations"]) >= 1
    assert diag["polish_rank"] == [4] * 8  # d_h = d / H: the heads' rows factored (_fit.head_ranks)
    assert diag["polish_map_rank"] == [4] * 8  # and Theta's head blocks (_fit.map_ranks)
    assert diag["polish_residual"] < 3e-2 * diag["polish_residual_before"]
    assert diag["verify_max_error"] <= 3 * U32
    assert floor_and_error(block, rec.model, 32) <= 4


@pytest.mark.parametrize("kappa, accepted", [(0.5, True), (2.0, False)], ids=["inside", "outside"])
def test_float32_verify_tolerance_just_inside_and_outside(kappa, accepted):
    """The float32 route's default tolerance, FLOAT32_VERIFY_UNITS u: the verification's one-token answers moved
    by kappa times it (plus the model's own error, up to 8 u here: 30 + 8 < 60 < 120 - 8)."""
    layer = random_attention_layer(6, 2, residual=True, seed=2)
    rtol = FLOAT32_VERIFY_UNITS * U32
    target = _OffOnOneToken(_Rounded32Layer(layer), kappa * rtol)
    if accepted:
        rec = learn_attention_layer(VectorQueryOracle(target), H=2)
        assert 0.3 * rtol < rec.diagnostics["verify_max_error"] <= rtol
    else:
        with pytest.raises(OracleInconsistentError, match="The verification failed") as info:
            learn_attention_layer(VectorQueryOracle(target), H=2)
        # the verification's own message, chained, not quoted (its verdict assumes float64 answers)
        assert re.search(r"disagrees .* u of float32; tolerance 3.58e-06", str(info.value.__cause__))
        assert "disagrees" not in str(info.value)


class _Rounded32Layer:
    def __init__(self, layer):
        self.layer, self.d, self.d_out = layer, layer.d, layer.d_out

    def __call__(self, X):
        return self.layer(X).astype(np.float32).astype(np.float64)


class _After:
    """A layer followed by an elementwise GELU or a post-LN with learned gamma, beta (outside the class)."""

    def __init__(self, layer, kind):
        self.layer, self.kind, self.d, self.d_out = layer, kind, layer.d, layer.d_out
        self.gamma = np.linspace(0.5, 1.5, layer.d_out)
        self.beta = np.linspace(-0.2, 0.3, layer.d_out)

    def __call__(self, X):
        y = self.layer(X)
        if self.kind == "gelu":
            return 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))
        m = y.mean(axis=1, keepdims=True)
        return self.gamma * (y - m) / np.sqrt(((y - m) ** 2).mean(axis=1, keepdims=True) + 1e-12) + self.beta


def test_a_gelu_after_the_block_is_refused_with_the_cause():
    target = _After(random_attention_layer(6, 2, residual=True, seed=2), "gelu")
    with pytest.raises(OracleInconsistentError, match="not affine in the token .* no LayerNorm signature .* GELU"):
        learn_attention_layer(VectorQueryOracle(target), H=2)


def test_berts_eps_is_learned_from_the_row_space_and_refused_without_h():
    """``_After`` is a post-LN with eps = 1e-12 (BERT's): the answers fix P u only up to its norm, which the
    row space gives back when H is given (tests/test_layer_directions.py); without H the learner refuses."""
    target = _After(random_attention_layer(6, 2, residual=True, seed=2), "post-ln")
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["heads_learner"] == "joint, norms from the row space"
    assert rec.diagnostics["verify_max_error"] < 1e-11
    with pytest.raises(PrecisionError, match="post-LN's eps is too small.*Given H"):
        learn_attention_layer(VectorQueryOracle(target), H_bound=2)
    # a new user read "not an attention layer ... a mask would do this" here: the option is named instead
    with pytest.raises(
        OracleInconsistentError,
        match="^layernorm='none', but .* a post-LN's signature: if the block "
        "has that LayerNorm, pass layernorm='auto' \\(or 'post'\\)",
    ) as info:
        learn_attention_layer(VectorQueryOracle(target), H=2, layernorm="none")
    assert "not an attention layer" not in str(info.value)


def test_pre_ln_options_check_what_is_found():
    pre = _PreLN(random_attention_layer(6, 2, seed=2))
    with pytest.raises(
        OracleInconsistentError, match="^layernorm='none', but .* signature of a pre-LN .* \\(or 'pre'\\)"
    ):
        learn_attention_layer(VectorQueryOracle(pre), H=2, layernorm="none")
    with pytest.raises(
        OracleInconsistentError, match="layernorm='pre', but .* affine .* no LayerNorm before its heads"
    ):
        learn_attention_layer(VectorQueryOracle(random_attention_layer(6, 2, seed=2)), H=2, layernorm="pre")
    oracle = VectorQueryOracle(random_attention_layer(2, 1, seed=0))
    with pytest.raises(InvalidInputError, match="layernorm='pre' needs d >= 3"):
        learn_attention_layer(oracle, H=1, layernorm="pre")
    assert oracle.n_queries == 0


@pytest.mark.parametrize(
    "d, H, residual, eps",
    [(6, 2, True, 1e-5), (6, 1, True, 1e-12), (8, 2, False, 1e-3)],
    ids=["d6-H2-residual-1e-5", "d6-H1-residual-1e-12", "d8-H2-1e-3"],
)
def test_a_pre_ln_block_is_recovered(d, H, residual, eps):
    target = random_attention_layer(d, H, residual=residual, layernorm="pre", eps=eps, seed=0)
    oracle = VectorQueryOracle(target)
    rec = learn_attention_layer(oracle, H=H)
    est, ref = rec.model, target.canonical()
    assert rec.diagnostics["layernorm"] == "pre" and rec.n_heads == H and est.residual == residual
    assert est.eps == pytest.approx(eps, rel=1e-12)  # the eps fit: measured exact
    assert np.all(est.gamma == 1.0) and np.all(est.beta == 0.0)  # folded into the heads (pre_ln_symmetry)
    assert rel(est.Ws, ref.Ws) < 1e-12 and rel(est.Ms, ref.Ms) < 1e-12 and rel(est.b_O, ref.b_O) < 1e-12
    assert max_rel_prediction_error(target, est, fresh(d)) < 1e-12
    assert rec.n_queries == oracle.n_queries
    parts = ("n_probe_queries", "n_lstsq_queries", "n_head_queries", "n_polish_queries")
    assert rec.n_learning_queries == sum(rec.diagnostics[k] for k in parts)


def test_gpt_style_pre_ln_with_unit_gamma_is_learned():
    """``_PreLN``: x_N + o(LN(X)) with gamma = 1, beta = 0 and eps = 1e-12, built outside AttentionLayer."""
    target = _PreLN(random_attention_layer(6, 2, seed=2))
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.model.layernorm == "pre" and rec.model.residual and rec.model.eps == pytest.approx(1e-12, rel=1e-9)
    assert max_rel_prediction_error(VectorQueryOracle(target), rec.model, fresh(6)) < 1e-12


# --- a framework's layer: Keras 3 MultiHeadAttention with biases, computed by Keras in float64 ----------

os.environ.setdefault("KERAS_BACKEND", "numpy")


@pytest.fixture(scope="module")
def keras_float64():
    """Keras with its 64-to-32-bit promotion switched off, so that its own code computes in float64.

    Keras 3 on the numpy and jax backends maps float64 results to float32 (``BIT64_TO_BIT32_DTYPE``
    in ``keras.src.backend.common.dtypes``, "aligned with JAX's default"): a float64 layer answers
    in float32 (24 significant bits) unless that rule is lifted.
    """
    keras = pytest.importorskip("keras")
    from keras.src.backend.common import dtypes

    saved = dtypes.BIT64_TO_BIT32_DTYPE["float64"]
    dtypes.BIT64_TO_BIT32_DTYPE["float64"] = "float64"
    yield keras
    dtypes.BIT64_TO_BIT32_DTYPE["float64"] = saved


class KerasBlock:
    """``MultiHeadAttention(query=X, key=value=X, use_bias=True)`` at the last position, float64."""

    def __init__(self, keras, d, heads, key_dim, seed=0):
        keras.utils.set_random_seed(seed)
        self.layer = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim, use_bias=True, dtype="float64")
        x = np.zeros((1, 2, d))
        self.layer(x, x)
        rng = np.random.default_rng(seed)  # Keras initialises biases at 0: give them values
        self.layer.set_weights([w + 0.5 * rng.standard_normal(w.shape) for w in self.layer.get_weights()])
        self.d = self.d_out = d
        self.heads, self.key_dim = heads, key_dim

    def __call__(self, X):
        # return_attention_scores=True takes Keras's explicit path (einsum, softmax in the layer's dtype);
        # its fused dot_product_attention always takes the softmax in float32 on the numpy backend
        out, _ = self.layer(query=X, value=X, key=X, return_attention_scores=True)
        return np.asarray(out, dtype=np.float64)[:, -1, :]

    def native(self):
        """The layer's own weights as :meth:`AttentionLayer.from_native` reads them (checking only)."""
        L, H, dh = self.layer, self.heads, self.key_dim

        def per_head(dense):  # kernel (d, H, d_h) -> (H, d_h, d); bias (H, d_h)
            return np.asarray(dense.kernel.numpy()).transpose(1, 2, 0), np.asarray(dense.bias.numpy())

        (Q, bq), (K, bk), (V, bv) = (per_head(x) for x in (L._query_dense, L._key_dense, L._value_dense))
        W_O = np.asarray(L._output_dense.kernel.numpy()).reshape(H * dh, -1).T
        return AttentionLayer.from_native(Q, bq, K, bk, V, bv, W_O, np.asarray(L._output_dense.bias.numpy()))


@pytest.mark.parametrize("d", [8, 16])
def test_keras_with_8_heads_is_learned_from_all_outputs_jointly(keras_float64, d):
    """The readout route (learn_canonical_rational on one scalar readout) does not resolve 8 heads in d + 1 = 9
    or 17 dimensions (measured at d = 12 and 24 too, session 36), and still refuses them; the joint route
    (all d outputs, shared poles; the default from JOINT_FROM heads) learns them (session 37)."""
    block = KerasBlock(keras_float64, d, 8, 2)
    with pytest.raises(OracleInconsistentError, match="heads' learner on a random readout refused .* H = 8 at d = 8"):
        learn_attention_layer(VectorQueryOracle(block), H=8, heads="readout")
    rec = learn_attention_layer(VectorQueryOracle(block), H=8)
    assert rec.n_heads == 8 and rec.diagnostics["heads_learner"] == "joint"
    ref = block.native().canonical()
    assert rel(rec.model.Ws, ref.Ws) < 1e-11 and rel(rec.model.Ms, ref.Ms) < 1e-11
    assert max_rel_prediction_error(VectorQueryOracle(block), rec.model, fresh(d)) <= 1e-12


@pytest.mark.parametrize("heads, key_dim", [(2, 4), (4, 2)], ids=["H2", "H4"])
def test_keras_multi_head_attention_with_biases_is_recovered(keras_float64, heads, key_dim):
    block = KerasBlock(keras_float64, 8, heads, key_dim)
    X = np.random.default_rng(0).standard_normal((6, 5, 8))
    assert block(X).dtype == np.float64
    ours = block.native()
    assert max_rel_prediction_error(block, ours, X) < 1e-13  # from_native is Keras's computation
    rec = learn_attention_layer(VectorQueryOracle(block), H=heads)
    assert rec.n_heads == heads and rec.diagnostics["skip"] == "none"
    ref = ours.canonical()
    assert rel(rec.model.Ws, ref.Ws) < 1e-12 and rel(rec.model.Ms, ref.Ms) < 1e-12
    assert max_rel_prediction_error(VectorQueryOracle(block), rec.model, fresh(8)) <= 1e-12


class _OffOnOneToken:
    """The layer, plus ``kappa * rtol * ||o(X)||`` along a fixed unit vector on one-token queries of a
    token other than 0 and the basis vectors, after the learner's probes: only the verification asks
    those, so the learner's estimate is exact and its check sees a disagreement of exactly ``kappa * rtol``."""

    def __init__(self, layer, shift):
        self.layer, self.d, self.d_out, self.shift = layer, layer.d, layer.d_out, shift
        self.u = np.ones(layer.d_out) / np.sqrt(layer.d_out)
        self.probes = None  # the first call's queries, the learner's probe lines: never shifted

    def __call__(self, X):
        y = self.layer(X)
        if X.shape[1] == 1:
            x = X[:, 0, :]
            keys = [row.tobytes() for row in x]
            if self.probes is None:
                self.probes = set(keys)
            # a function of the query alone (the same answer when asked again, as the learner's replay asks)
            probe = (np.count_nonzero(x, axis=1) > 1) | ~np.isin(np.abs(x).max(axis=1), (0.0, 1.0))
            probe &= np.array([k not in self.probes for k in keys])
            y[probe] += self.shift * np.linalg.norm(y[probe], axis=1, keepdims=True) * self.u
        return y


@pytest.mark.parametrize("kappa, accepted", [(0.5, True), (2.0, False)], ids=["inside", "outside"])
def test_default_verify_rtol_just_inside_and_outside(kappa, accepted):
    import inspect
    import re

    rtol = float(re.search(r"None: ([0-9.e+-]+) for float64 answers", inspect.getdoc(learn_attention_layer))[1])
    target = _OffOnOneToken(random_attention_layer(6, 1, residual=True, seed=4), kappa * rtol)
    oracle = VectorQueryOracle(target)
    if accepted:
        rec = learn_attention_layer(oracle, H=1)
        assert 0.45 * rtol < rec.diagnostics["verify_max_error"] <= 0.5 * rtol * (1 + 1e-6)
    else:
        with pytest.raises(OracleInconsistentError, match="on 32 fresh queries the recovered layer disagrees"):
            learn_attention_layer(oracle, H=1)


# --- LayerNorm: what is identifiable, and the post-LN learned ---------------------------------------------


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no-skip"])
def test_post_ln_symmetry_gives_other_parameters_with_the_same_outputs(residual):
    layer = random_attention_layer(5, 2, residual=residual, layernorm="post", seed=1)
    X = fresh(5)
    for scale in (1.0, 2.5, -0.5):
        other = post_ln_symmetry(layer, scale=scale, seed=3)
        assert max_rel_prediction_error(layer, other, X) < 1e-13
        assert rel(other.Ms, layer.Ms) > 0.1 and (other.eps == layer.eps * scale**2)
        assert np.array_equal(other.gamma, np.sign(scale) * layer.gamma)
        # the canonical form is what the outputs determine: both parameter sets give the same one
        a, b = layer.canonical(), other.canonical()
        assert rel(a.Ms, b.Ms) < 1e-12 and rel(a.b_O, b.b_O) < 1e-12 and rel(a.gamma, b.gamma) < 1e-15
        if residual and scale == 1.0:  # the shift along 1 keeps a residual block one
            assert other.residual
    if residual:  # the identity skip fixes the scale and the sign: eps is identifiable
        assert layer.canonical().residual and layer.canonical().eps == pytest.approx(layer.eps, rel=1e-12)
        assert post_ln_symmetry(layer, scale=2.0).canonical().eps == pytest.approx(layer.eps, rel=1e-12)
    else:  # no skip: the scale is free, and the canonical form sets eps = 1
        assert layer.canonical().eps == pytest.approx(1.0, rel=1e-12)


def _directions_system(layer, X):
    """With the true heads given: the homogeneous linear system that the answers' directions alone put on the
    P-projected ``Theta = [M_1 .. M_H, S, b_O]`` (per query ``(I - n n^T) P Theta^T phi = 0``, ``n`` the direction of
    ``(y - beta) / gamma``, which is ``P u`` over its norm at every ``eps``); unknowns in a sum-zero basis."""
    from companion.layer._fit import features

    d = layer.d
    Y = layer(X)
    Z = (Y - layer.beta) / layer.gamma
    n = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    P = np.eye(d) - 1.0 / d
    Us = np.linalg.svd(P)[0][:, : d - 1]
    rows = [
        np.kron(features(layer.canonical().Ws, x[None])[0][None, :], (np.eye(d) - np.outer(v, v)) @ P @ Us)
        for x, v in zip(X, n)
    ]
    return np.concatenate(rows), P, Us


@pytest.mark.parametrize("eps", [1e-12, 1e-3])
def test_a_post_ln_blocks_directions_fix_it_up_to_one_scale_which_the_residual_fixes(eps):
    """This book's analysis of MiniLM's refusal (BERT's eps = 1e-12 leaves the answers' norm unreadable, MIN_GAP):
    the answers' directions alone, at any eps, determine a residual post-LN block's P-projected parameters up to one
    scale c (the one symmetry: c (x_N + o(X)) is seen as x_N + o(X)); the identity skip fixes c, since c x_N is
    not an attention output. Measured with the true heads (d = 8, H = 2, 120 queries; eps 1e-12 and 1e-3 alike): one
    null vector (1.8e-16 and 1.9e-16 of the largest singular value), the next at 4.5e-2; the null vector is the true
    parameters times c to 1.8e-15."""
    from companion.layer import random_attention_layer as ral

    layer = ral(8, 2, residual=True, layernorm="post", eps=eps, seed=0)
    A, P, Us = _directions_system(layer, fresh(8, n=120, seed=7))
    _, s, Vt = np.linalg.svd(A)
    assert s[-1] / s[0] < 1e-14 and s[-2] / s[0] > 1e-2
    can = layer.canonical()
    Theta = np.concatenate([m[:, :8].T for m in can.Ms] + [can.skip.T, can.b_O[None, :]])
    null, true = Vt[-1].reshape(-1, 7), Theta @ P @ Us
    c = float(np.sum(null * true) / np.sum(true * true))
    assert rel(null / c, true) < 1e-13
    assert rel(null[16:24] @ Us.T / c, P) < 1e-13  # the skip block is c P: S = I fixes c


def test_pre_ln_symmetry_folds_gamma_and_beta_into_the_heads():
    layer = random_attention_layer(5, 2, residual=True, layernorm="pre", seed=1)
    other = pre_ln_symmetry(layer, seed=2)
    X = fresh(5)
    assert max_rel_prediction_error(layer, other, X) < 1e-12
    assert np.all(other.gamma == 1.0) and np.all(other.beta == 0.0) and rel(other.Ws, layer.Ws) > 0.1
    a, b = layer.canonical(), other.canonical()
    assert rel(a.Ws, b.Ws) < 1e-12 and rel(a.Ms, b.Ms) < 1e-12 and a.eps == b.eps == layer.eps
    assert max_rel_prediction_error(layer, a, X) < 1e-12


def test_layer_norm_is_torchs_with_the_biased_variance():
    u = np.array([[1.0, 2.0, 4.0]])
    m, v = 7.0 / 3.0, np.mean((u - 7.0 / 3.0) ** 2)
    out = layer_norm(u, np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.5, 0.0]), 1e-5)
    assert np.allclose(out, np.array([1.0, 2.0, 3.0]) * (u - m) / np.sqrt(v + 1e-5) + [0.0, 0.5, 0.0], rtol=1e-15)


@pytest.mark.parametrize(
    "d, H, residual, eps",
    [(6, 2, True, 1e-3), (8, 1, False, 1e-3), (8, 2, True, 1e-2)],
    ids=["d6-H2-residual-1e-3", "d8-H1-1e-3", "d8-H2-residual-1e-2"],
)
def test_a_post_ln_block_is_recovered(d, H, residual, eps):
    target = random_attention_layer(d, H, residual=residual, layernorm="post", eps=eps, seed=d + H)
    oracle = VectorQueryOracle(target)
    rec = learn_attention_layer(oracle, H=H)
    est, ref = rec.model, target.canonical()
    assert rec.diagnostics["layernorm"] == "post" and rec.n_heads == H and est.residual == residual
    assert rel(est.gamma, ref.gamma) < 1e-13 and rel(est.beta, ref.beta) < 1e-12
    assert est.eps == pytest.approx(eps if residual else 1.0, rel=1e-10)
    assert rel(est.Ws, ref.Ws) < 1e-10 and rel(est.Ms, ref.Ms) < 1e-10 and rel(est.b_O, ref.b_O) < 1e-10
    # 1e-10: the next power of ten above twice the largest measured (2026-12-05, the three blocks, OpenBLAS's Haswell,
    # Sandybridge and SkylakeX kernels, 1 and 2 threads, and the answers perturbed by 4 ulps): predictions 2.6e-11 and
    # the verification 2.0e-11, both at d = 6 (Sandybridge, perturbed); 1e-11 held on the SkylakeX kernel only
    assert max_rel_prediction_error(target, est, fresh(d)) < 1e-10
    assert rec.diagnostics["polished"] and rec.diagnostics["verify_max_error"] < 1e-10
    assert rec.n_queries == oracle.n_queries


def test_a_post_ln_block_above_the_former_polish_cap_is_recovered():
    """d = 24, H = 2 (1,200 head-row entries; with the output maps 2,952 unknowns, above the former cap of 2000 on
    them all): unpolished, its heads from scaled tokens (least-squares residual 9.1e-4) failed the verification;
    the polish, the output maps eliminated, takes it to rounding (measured 1.6e-14, fresh 1.3e-14)."""
    d = 24
    target = random_attention_layer(d, 2, residual=True, layernorm="post", eps=0.1, seed=0)
    # The readout route's heads' stage (auto takes the joint stage here) refuses this block at one learner seed of
    # 0 to 3, which one set by the rounding (measured 2026-12-05: seed 0 on OpenBLAS's Haswell kernel, seed 2 on
    # Sandybridge's, none on SkylakeX's), naming the next seed: the test takes the first seed learned, as a user told
    # to try the next seed would, and allows one refusal.
    refusals = []
    for seed in range(4):
        try:
            rec = learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout", seed=seed)
            break
        except OracleInconsistentError as exc:
            assert f"try seed={seed + 1}" in str(exc)
            refusals.append(seed)
    assert len(refusals) <= 1
    # unpolished, the least squares leave a residual far above the verification's 1e-8 (9.1e-4 at learner seed 0 on
    # SkylakeX's kernel, 8.7e-6 at seed 1 on Haswell's)
    assert rec.diagnostics["polished"] and rec.diagnostics["lstsq_residual"] > 1e-6
    assert rec.diagnostics["verify_max_error"] < 1e-12
    assert max_rel_prediction_error(target, rec.model, fresh(d)) < 1e-12


def test_a_residual_block_above_the_former_polish_cap_is_learned_not_refused():
    """d = 24, H = 2 residual block (random_attention_layer seed 1): with the former cap (2000 on all unknowns, here
    2,952) it was unpolished and refused with "the target does not add x_N" (||S - I||_F = 1.97e-7), a false verdict;
    polished (1,200 heads' rows' entries), the skip is I to 3.5e-15 (measured) and the block verifies."""
    target = random_attention_layer(24, 2, residual=True, seed=1)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, residual=True)
    assert rec.diagnostics["polished"] and rec.diagnostics["skip"] == "identity"
    assert rec.diagnostics["skip_error"] < 1e-12 and rec.diagnostics["verify_max_error"] < 1e-12


def test_an_unpolished_skip_check_states_no_verdict(monkeypatch):
    """With the polish skipped (the cap moved to 0 here) the same block's skip is I only to about 2e-7: the refusal
    says the polish did not run and names both causes, not "the target does not add x_N"."""
    from companion.layer import _learn

    monkeypatch.setattr(_learn, "POLISH_MAX_UNKNOWNS", 0)
    target = random_attention_layer(24, 2, residual=True, seed=1)
    with pytest.raises(OracleInconsistentError, match="the polish did not run .*an in-class block can end here too"):
        learn_attention_layer(VectorQueryOracle(target), H=2, residual=True)


def test_the_polish_step_is_the_full_gauss_newton_step():
    """polish eliminates the output maps: its step is the least squares over [J_W, I_dout (x) Phi] (formed here)."""
    from companion.layer._fit import residual_and_jacobian, fit_outputs, group_by_length, polish

    d, H = 5, 2
    target = random_attention_layer(d, H, residual=True, seed=1)
    rng = np.random.default_rng(0)
    Xp = [rng.standard_normal((int(n), d)) / np.sqrt(d) for n in rng.integers(2, 9, size=120)]
    Xs, Ys = group_by_length(Xp, target(Xp))
    Ws = target.Ws + 1e-4 * rng.standard_normal(target.Ws.shape)
    Ws[:, -1, :] = 0.0
    Theta = fit_outputs(Ws, Xs, Ys)[0]
    r, JW, Phi = residual_and_jacobian(Ws, Theta, Xs, Ys, True)
    B, d_out, p = Phi.shape[0], Theta.shape[1], Theta.shape[0]
    JT = np.einsum("bj,oq->bojq", Phi, np.eye(d_out)).reshape(B * d_out, p * d_out)
    full = np.linalg.lstsq(np.concatenate([JW.reshape(B * d_out, -1), JT], axis=1), r.reshape(-1), rcond=None)[0]
    W1, T1, before, after = polish(Ws, Theta, Xs, Ys, iters=1)
    assert after < 1e-3 * before
    assert rel(W1[:, :d, :] - Ws[:, :d, :], full[: H * d * (d + 1)].reshape(H, d, d + 1)) < 1e-9
    assert rel(T1 - Theta, full[H * d * (d + 1) :].reshape(p, d_out)) < 1e-9


@pytest.mark.parametrize("cap, polished", [(84, True), (83, False)], ids=["inside", "outside"])
def test_polish_cap_counts_the_heads_rows_just_inside_and_outside(monkeypatch, cap, polished):
    """At float64 POLISH_MAX_UNKNOWNS counts the heads' rows' entries only (d = 6, H = 2: 84), moved to 84 and 83."""
    from companion.layer import _learn
    from companion.layer._fit import group_by_length

    monkeypatch.setattr(_learn, "POLISH_MAX_UNKNOWNS", cap)
    base = random_attention_layer(6, 2, residual=True, seed=2)
    oracle = VectorQueryOracle(base)
    o = _learn._options(oracle, 2, None, "auto", "auto", True, 0, None, 0)
    rng = np.random.default_rng(0)
    X1 = np.concatenate([np.zeros((1, 1, 6)), np.eye(6)[:, None, :]])
    Xfit = [rng.standard_normal((int(n), 6)) / np.sqrt(6) for n in rng.integers(2, 9, size=20)]
    batches, answers = group_by_length(Xfit, oracle(Xfit))
    Ws = base.canonical().Ws.copy()
    _, _, info = _learn._outputs(oracle, Ws, [X1] + batches, [oracle(X1)] + answers, 40, o, rng)
    assert info["polished"] is polished and info["n_polish_queries"] == (40 if polished else 0)


def test_a_post_ln_with_a_small_eps_is_refused_for_the_precision_it_costs_on_the_readout_route():
    """eps = 1e-5 (PyTorch's default): the heads' queries reach 1 - |z|^2/d_out near 1e-8, refused, not wrong, on
    the readout route alone; by default the learner then takes the norms from the row space and learns it."""
    target = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-5, seed=10)
    with pytest.raises(
        PrecisionError, match=r"1 - \|z\|\^2/d_out = eps / \(var \+ eps\) seen was .*inferred from the gap"
    ):
        learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout")
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["directions_after"].startswith("the ") and rec.diagnostics["verify_max_error"] < 1e-11


def test_layernorm_post_on_a_layer_without_one_is_refused():
    with pytest.raises(OracleInconsistentError, match="layernorm='post', but the one-token answers are affine"):
        learn_attention_layer(VectorQueryOracle(random_attention_layer(6, 1, seed=0)), H=1, layernorm="post")


@pytest.fixture(scope="module")
def keras32():
    return pytest.importorskip("keras")


class KerasBlock32:
    """Keras ``MultiHeadAttention(use_bias=True)`` as served: float32 weights and arithmetic."""

    def __init__(self, keras, d, heads, key_dim, seed=0):
        keras.utils.set_random_seed(seed)
        self.layer = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim, use_bias=True)
        x = np.zeros((1, 2, d), dtype=np.float32)
        self.layer(x, x)
        rng = np.random.default_rng(seed)
        self.layer.set_weights([w + 0.5 * rng.standard_normal(w.shape) for w in self.layer.get_weights()])
        self.d = self.d_out = d

    def __call__(self, X):
        X = X.astype(np.float32)
        return np.asarray(self.layer(query=X, value=X, key=X), dtype=np.float64)[:, -1, :]


def keras32_native(block, heads, key_dim):
    """The float32 Keras layer's own weights, computed in float64: the reference of the float32 floor."""
    L = block.layer

    def per_head(dense):
        kernel = np.asarray(dense.kernel.numpy(), np.float64).transpose(1, 2, 0)
        return kernel, np.asarray(dense.bias.numpy(), np.float64)

    (Q, bq), (K, bk), (V, bv) = (per_head(x) for x in (L._query_dense, L._key_dense, L._value_dense))
    W_O = np.asarray(L._output_dense.kernel.numpy(), np.float64).reshape(heads * key_dim, -1).T
    return AttentionLayer.from_native(Q, bq, K, bk, V, bv, W_O, np.asarray(L._output_dense.bias.numpy(), np.float64))


U32 = 2.0**-24


def floor_and_error(served, model, d):
    """Over 200 fresh queries: the largest relative distance of ``model`` to the served answers, in u."""
    rng = np.random.default_rng(99)
    X = [rng.standard_normal((int(n), d)) / np.sqrt(d) for n in rng.integers(1, 9, size=200)]
    y = VectorQueryOracle(served, d=d, d_out=d)(X)
    return float(np.max(np.linalg.norm(model(X) - y, axis=1) / np.linalg.norm(y, axis=1))) / U32


@pytest.mark.parametrize("d, key_dim, seed", [(8, 4, 0), (6, 3, 1)], ids=["d8-s0", "d6-s1"])
def test_keras_float32_with_2_heads_is_learned_within_10x_its_floor(keras32, d, key_dim, seed):
    """The float32 route (session 36): Keras 3 MultiHeadAttention(use_bias=True) served in float32, H = 2.
    Its floor (float32 against its own weights in float64) is 3.9 u and 4.6 u; the learned layer predicts
    the served answers to 8.4 u and 13.0 u (measured), within 10 floors; every head in canonical form."""
    block = KerasBlock32(keras32, d, 2, key_dim, seed=seed)
    assert block(np.ones((1, 3, d))).dtype == np.float64
    exact = keras32_native(block, 2, key_dim)
    floor = floor_and_error(block, exact, d)
    assert 1.0 < floor <= FLOAT32_FLOOR_UNITS
    for stated in (None, "float32"):  # found on float32's grid, or stated
        rec = learn_attention_layer(VectorQueryOracle(block, precision=stated), H=2)
        assert rec.n_heads == 2 and rec.diagnostics["skip"] == "none"
        assert rec.diagnostics["verify_tolerance"] == FLOAT32_VERIFY_UNITS * U32
        error = floor_and_error(block, rec.model, d)
        assert error <= 10 * floor and error < FLOAT32_VERIFY_UNITS
        ref = exact.canonical()  # each head, to the float32 answers' precision (about 1e-4 relative)
        assert rel(rec.model.Ws, ref.Ws) < 1e-3 and rel(rec.model.Ms, ref.Ms) < 1e-3


def _keras32_learned_by_the_joint_route(keras32, H, seed, *, canonical_rtol):
    """A Keras float32 block at d = 8 (key_dim 2) learned by the joint route: H heads, no skip, fresh
    queries within 10x of float32's floor and the verification's units, every head in canonical form."""
    block = KerasBlock32(keras32, 8, H, 2, seed=seed)
    exact = keras32_native(block, H, 2)
    floor = floor_and_error(block, exact, 8)
    rec = learn_attention_layer(VectorQueryOracle(block), H=H)
    assert rec.n_heads == H and rec.diagnostics["heads_learner"] == "joint" and rec.diagnostics["skip"] == "none"
    error = floor_and_error(block, rec.model, 8)
    assert error <= 10 * floor and error < FLOAT32_VERIFY_UNITS
    ref = exact.canonical()
    assert rel(rec.model.Ws, ref.Ws) < canonical_rtol and rel(rec.model.Ms, ref.Ms) < canonical_rtol


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_keras_float32_with_4_heads_is_learned_by_the_joint_route(keras32, seed):
    """Keras 3 MultiHeadAttention(use_bias=True) in float32, H = 4, d = 8 (key_dim 2): the readout route refused it
    (session 36); the joint route learns it at learner seed 0, predicting the served answers to 10.6 u, 12.4 u and
    7.7 u on 200 fresh queries (floors 4.2 u, 5.6 u, 4.1 u; measured, FLOAT32_LINK_TOKENS = 8), every head in
    canonical form."""
    _keras32_learned_by_the_joint_route(keras32, 4, seed, canonical_rtol=1e-5)  # measured 8e-7 to 1.1e-6 (Ws)


@pytest.mark.parametrize("seed", [1, pytest.param(0, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_keras_float32_with_8_heads_is_learned_from_the_columns_start(keras32, seed):
    """Keras 3 MultiHeadAttention(use_bias=True) in float32, H = 8, d = 8 (key_dim 2). Session 37 refused it: no
    token's Loewner pencil resolves 8 poles clustered within a decade under float32's rounding. The columns of
    C^{-1}, each fitted over all of a row's tokens, start the rows (session 38); seed 1 also needs the float32 rank
    threshold FLOAT32_RANK_UNITS (its row 6's 8th singular value is 132 u). Measured on 200 fresh queries: 7.3 u,
    15.4 u and 12.7 u at seeds 0, 1, 2 (floors 3.3 u, 4.5 u, 5.7 u), every head in canonical form (Ws to 1.1e-6 to
    1.3e-6 relative)."""
    _keras32_learned_by_the_joint_route(keras32, 8, seed, canonical_rtol=1e-4)


@pytest.mark.parametrize("which", ["masked", "two-layers", "gelu"])
def test_keras_float32_with_8_heads_outside_the_class_is_refused(keras32, which):
    """The columns' start does not let a target outside the class through: a sliding-window mask over the last 3
    tokens and a second Keras layer end at the joint stage (fewer than 8 distinct columns, measured), a GELU at the
    probes: misses the signatures by 2.2e-2, within OUTSIDE_BAND = 5e-2 (where bfloat16 arithmetic was measured too),
    so refused naming both causes, no verdict."""
    block = KerasBlock32(keras32, 8, 8, 2)
    if which == "masked":
        target = _Windowed(block, 3)
    elif which == "two-layers":
        target = _TwoLayers(block, KerasBlock32(keras32, 8, 8, 2, seed=5))
    else:
        target = _After(block, "gelu")
    served = VectorQueryOracle(lambda X: target(X).astype(np.float32).astype(np.float64), d=8, d_out=8)
    refusal = "either a target outside the class, or answers" if which == "gelu" else "not an attention layer"
    with pytest.raises(OracleInconsistentError, match=refusal):
        learn_attention_layer(served, H=8)


@pytest.mark.slow
def test_keras_float32_with_8_heads_at_d_16_is_learned(keras32):
    """8 heads (key_dim 2) at d = 16 in float32 (session 38; refused before: with 2 link tokens a link's coefficients
    were off by 3.7e-2, and 4,496 unknowns were above POLISH_MAX_UNKNOWNS). With FLOAT32_LINK_TOKENS = 8 (link misfit
    1.5e-4) and the polish up to FLOAT32_POLISH_MAX_UNKNOWNS: 6.6 u on 200 fresh queries (floor 2.8 u; measured),
    13,047 queries, about 50 CPU s."""
    block = KerasBlock32(keras32, 16, 8, 2)
    exact = keras32_native(block, 8, 2)
    floor = floor_and_error(block, exact, 16)
    rec = learn_attention_layer(VectorQueryOracle(block), H=8)
    assert rec.n_heads == 8 and rec.diagnostics["heads_learner"] == "joint" and rec.diagnostics["polished"]
    error = floor_and_error(block, rec.model, 16)
    assert error <= 10 * floor and error < FLOAT32_VERIFY_UNITS
    assert rel(rec.model.Ws, exact.canonical().Ws) < 1e-4


@pytest.mark.parametrize("units, rank", [(60, 7), (68, 8)], ids=["inside", "outside"])
def test_float32_rank_threshold_just_inside_and_outside(units, rank):
    """A row's H-th singular value counts at FLOAT32_RANK_UNITS u of the largest (64 u): 60 u is rounding, 68 u a
    head."""
    from companion.layer._joint import _ratios, _row

    H, K, d = 8, 4, 8
    rng = np.random.default_rng(0)
    U = np.linalg.qr(rng.standard_normal((K * 2 * H, H)))[0]
    s = np.array([1.0, 0.5, 0.3, 0.1, 0.05, 0.01, 0.003, units * U32])
    A = (U * s) @ np.linalg.qr(rng.standard_normal((d, d)))[0][:H]  # (K 2H, d): singular values s
    n, m = _ratios(H)
    _, sv, found, _, _ = _row(
        lambda Q: A, np.zeros(d), np.zeros((K, d)), lambda X: np.zeros((len(X), d)), H, n / m, FLOAT32_RANK_UNITS * U32
    )
    assert sv[-1] / sv[0] == pytest.approx(units * U32, rel=1e-6) and found == rank


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_columns_start_finds_c_where_no_token_pencil_does(seed):
    """A synthetic row like Keras float32's H = 8: eight poles per token, log-linear in the token with small
    slopes (all within about a decade), answers with 1e-6 relative noise. No token's Loewner pencil gives 8 real
    positive poles; the columns' start finds C (rows matched) to 1.3e-5 to 5.7e-5 (measured)."""
    from scipy.optimize import linear_sum_assignment

    from companion.layer._joint import _phi, _ratios, _start_C, _start_C_columns

    H, K, d = 8, 33, 8
    rng = np.random.default_rng(seed)
    n, m = _ratios(H)
    r = n / m
    Xt = np.concatenate([rng.standard_normal((K, d)) * 2 / np.sqrt(d), np.ones((K, 1))], axis=1)
    p = np.exp(Xt @ (0.3 * rng.standard_normal((H, d + 1))).T)
    C = rng.standard_normal((H, H))
    Z0 = _phi(r, p) @ C
    Z = Z0 + 1e-6 * np.sqrt(np.mean(Z0**2)) * rng.standard_normal(Z0.shape)
    assert _start_C(Z, r, H) is None
    found = _start_C_columns(Z, r, H)
    rows, cols = linear_sum_assignment(np.linalg.norm(C[:, None] - found[None], axis=2))
    assert np.max(np.linalg.norm(C[rows] - found[cols], axis=1) / np.linalg.norm(C[rows], axis=1)) < 1e-4


@pytest.mark.parametrize("H", [2, 3])
def test_joint_fit_schur_step_without_b_equals_the_plain_solve(H):
    """The joint fit's step with the cross block B contracted (_pole_schur, _pole_cross_t, _pole_cross) equals the
    plain solve of the whole formed system [[A, B], [B^T, J_C]] on a small case (K = 5 tokens; measured 2.2e-15 and
    2.3e-15 relative at H = 2, 3), and the Schur complement B^T A^-1 B the formed product's (2e-16, 4e-16)."""
    from companion.layer._joint import _phi, _pole_cross, _pole_cross_t, _pole_schur, _psi, _ratios

    K = 5
    rng = np.random.default_rng(H)
    n, m = _ratios(H)
    r = n / m
    p = np.exp(rng.standard_normal((1, K, H)))
    C = rng.standard_normal((1, H, H))
    Phi, psi = _phi(r, p), _psi(r, p)  # (1, K, R, H)
    PsiPhi = np.swapaxes(psi, 2, 3) @ Phi
    A = (np.swapaxes(psi, 2, 3) @ psi) * (C @ np.swapaxes(C, 1, 2))[:, None] + 0.1 * np.eye(H)  # damped
    B = -(PsiPhi[..., None] * C[:, None, :, None, :]).reshape(K * H, H * H)  # the formed cross block
    Phif = Phi.reshape(K * len(r), H)
    Jc = np.kron(Phif.T @ Phif, np.eye(H)) + 0.1 * np.eye(H * H)
    gp, gC = rng.standard_normal((1, K, H)), rng.standard_normal((1, H * H))
    A_full = np.zeros((K * H, K * H))
    for k in range(K):
        A_full[k * H : (k + 1) * H, k * H : (k + 1) * H] = A[0, k]
    full = np.block([[A_full, B], [B.T, Jc]])
    want = np.linalg.solve(full, np.concatenate([gp.ravel(), gC.ravel()]))
    Ai = np.linalg.inv(A)
    schur = _pole_schur(Ai, PsiPhi, C)
    formed = B.T @ np.linalg.solve(A_full, B)
    assert np.max(np.abs(schur[0] - formed)) <= 1e-14 * np.max(np.abs(formed))
    Aig = (Ai @ gp[..., None])[..., 0]
    step_C = np.linalg.solve(Jc - schur[0], gC[0] - _pole_cross_t(PsiPhi, C, Aig)[0])
    step_p = Aig - (Ai @ _pole_cross(PsiPhi, C, step_C[None])[..., None])[..., 0]
    got = np.concatenate([step_p.ravel(), step_C])
    assert np.max(np.abs(got - want)) <= 1e-13 * np.max(np.abs(want))


def test_float16_and_bfloat16_stated_precisions_are_refused_before_the_first_query(keras32):
    block = KerasBlock32(keras32, 8, 2, 4)
    for fmt in ("float16", "bfloat16"):
        stated = VectorQueryOracle(block, precision=fmt)
        with pytest.raises(PrecisionError, match="oracle states a precision u=.*coarser than float32's"):
            learn_attention_layer(stated, H=2)
        assert stated.n_queries == 0


# --- MiniLM layer 0's whole block (residual, post-LN), against transformers ---------------------------


def test_minilm_block_is_what_transformers_computes():
    ref = load_block_reference()
    assert ref["eps"] == 1e-12 and ref["gamma"].dtype == np.float32 and ref["meta"]["transformers"] == "5.24.0"
    block, served = minilm_block(), MiniLMBlock("float32")
    assert (block.n_heads, block.d, block.layernorm, block.residual) == (12, 384, "post", True)
    for group in ref["groups"].values():
        X, want = group["x"].astype(np.float64), group["f64_block"]
        assert np.max(np.abs(block(X) - want)) <= 1e-14 * np.max(np.abs(want))  # measured 1.4e-15
        want32 = group["f32_block"].astype(np.float64)
        # float32 arithmetic in another order than PyTorch's: measured within 3.2 float32 epsilons
        assert np.max(np.abs(served(X) - want32)) <= 16 * 2.0**-23 * np.max(np.abs(want32))


def test_minilm_blocks_plan_is_refused_before_any_query_below_its_budget():
    """MiniLM's whole block is no longer refused for its eps (its norms come from the row space): the plan, the
    joint heads' stage's 3,842,880 queries (float32 links reserved), its token scale's four doublings at most (39,264:
    the recorded run used three) and the first stages', binds instead (benchmarks/minilm_block.py runs it). The plan
    counts the largest path the answers may take: that route failing at a small gap, then the row space's route
    (``directions_route_plan``; MiniLM's first answers take it at once). A budget one query short of the plan is
    refused before any query."""
    plan = 20 + 385 + (12 * 384 + 8) + joint_plan(384, 12, FLOAT32_LINK_TOKENS) + scale_plan(384, 12)
    assert scale_plan(384, 12) == 4 * 2 * 12 * 409
    oracle = VectorQueryOracle(minilm_block(), budget=plan)
    with pytest.raises(BudgetExceededError, match="needs 7784752 queries") as info:
        learn_attention_layer(oracle, H=12)
    assert info.value.needed == 3901807 + directions_route_plan(384, 384, 12, 32, False) and oracle.n_queries == 0
    assert 3901807 > plan
    oracle = VectorQueryOracle(minilm_block(), budget=7784751)
    with pytest.raises(BudgetExceededError):
        learn_attention_layer(oracle, H=12)
    assert oracle.n_queries == 0


def test_without_H_the_plan_reserves_the_robust_heads_stage_before_any_query():
    """Without H or H_bound the plan counts the robust heads' route (learn_canonical's plan at d + 1 = 6, its
    H_plan = 8, less its 6 length-1 queries, which the basis answers): 3,312 of the 3,558 reserved, which a session
    found missing (the learner then ran out of budget in the heads' stage, its probes' queries spent). Measured: the
    run below asks 2,838. One query short of the reservation is refused before the first query; at it, it runs."""
    from companion.multihead import canonical_plan

    target = random_attention_layer(5, 1, seed=0)
    assert canonical_plan(6, verify=0) - 6 == 3312
    oracle = VectorQueryOracle(target, budget=3557)
    with pytest.raises(BudgetExceededError, match=r"at least: without H.*needs 3558 queries") as info:
        learn_attention_layer(oracle)
    assert info.value.needed == 3558 and oracle.n_queries == 0
    oracle = VectorQueryOracle(target, budget=3558)
    rec = learn_attention_layer(oracle)
    assert rec.n_heads == 1 and oracle.n_queries == 2838


def test_a_faint_head_behind_a_post_ln_is_refused_and_another_seed_recovers_it():
    """On the readout route a head too faint at learner seed 0 is refused, naming the next seed, which learns it.
    Given H (heads "auto"), the row space's route follows that failure (since 2026-12-06; refused before)."""
    target = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-2, seed=1)
    with pytest.raises(OracleInconsistentError, match="Behind a post-LN .* too faint .* try seed=1"):
        learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout")
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout", seed=1)
    assert rec.diagnostics["verify_max_error"] < 1e-11
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["directions_after"] == "the heads failed at gap 3.9e-05"
    assert rec.diagnostics["verify_max_error"] < 1e-11


def test_a_post_ln_block_the_layernorms_inversion_defeats_is_refused_naming_it():
    """d = 24, H = 2, eps = 0.1 (random_attention_layer seed 1), in the class: its heads' stage fails (smallest gap
    8.6e-6, above LOW_GAP); the refusal names the LayerNorm's inversion and the gap, and learner seed 1 recovers it.
    Which stage fails is the rounding's (OpenBLAS's Sandybridge kernel: the verification, measured 2026-12-05)."""
    target = random_attention_layer(24, 2, residual=True, layernorm="post", eps=0.1, seed=1)
    with pytest.raises(
        OracleInconsistentError,
        match=r"the LayerNorm's inversion costing the heads' stage its precision.*the (heads|verification) failed; "
        r"the smallest 1 - \|z\|\^2/d_out seen was \d\.\de-0[56].*lifted readout.*try seed=1",
    ):
        learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout")  # auto: the joint stage here
    # learned at seed 1 (at seed 2 on Sandybridge's kernel, where seed 1 is refused the same way)
    from companion.layer import try_seeds

    run = try_seeds(VectorQueryOracle(target), range(1, 4), H=2, heads="readout", require=True)
    assert run.recovery.diagnostics["verify_max_error"] < 1e-12 and len(run.refused) <= 1


@pytest.mark.parametrize(
    "d, eps, learner", [(20, 1e-2, "learn_canonical_rational"), (21, 1e-2, "joint"), (24, 1e-2, "joint")]
)
def test_behind_a_post_ln_the_joint_stage_runs_from_post_joint_from(d, eps, learner):
    """POST_JOINT_FROM = 21: d = 20 keeps the readout route, from 21 the joint stage reads the denormalised answers.
    d = 24, eps = 1e-2, seed 0 was refused by the readout route (heads 0.37 off through the LayerNorm's
    inversion); the joint stage learns it (measured 7.4e-12 unpolished, lstsq residual 2.6e-13)."""
    from companion.layer._learn import POST_JOINT_FROM

    assert POST_JOINT_FROM == 21
    target = random_attention_layer(d, 2, residual=True, layernorm="post", eps=eps, seed=0)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["heads_learner"] == learner and rec.diagnostics["layernorm"] == "post"
    assert rec.diagnostics["verify_max_error"] < 1e-10
    assert max_rel_prediction_error(target, rec.model, fresh(d)) < 1e-10
    if learner == "joint":
        assert rec.diagnostics["lstsq_residual"] < 1e-11  # the heads exact from the joint stage


def test_behind_a_post_ln_the_joint_stage_learns_three_heads():
    """d = 8, H = 3 behind a post-LN: the readout route refuses it (heads="readout", the test below); from
    JOINT_FROM heads the joint stage runs on the denormalised answers and learns it (measured 2.2e-13)."""
    target = random_attention_layer(8, 3, residual=True, layernorm="post", eps=1e-2, seed=0)
    rec = learn_attention_layer(VectorQueryOracle(target), H=3)
    assert rec.diagnostics["heads_learner"] == "joint" and rec.n_heads == 3
    assert rec.diagnostics["verify_max_error"] < 1e-11
    assert max_rel_prediction_error(target, rec.model, fresh(8)) < 1e-11


def test_a_masked_block_behind_a_post_ln_is_refused_by_the_joint_stage_naming_both_causes():
    """A sliding-window mask (the last 3 tokens) on a d = 8, H = 3 post-LN block: refused, never returned; the
    order check's verdict, and chained to it the refusal of the row space's route (which follows the joint stage's
    failure on the norms from the gap since 2026-12-06) names the mask among the causes and the gap seen (6.8e-4)."""
    target = random_attention_layer(8, 3, residual=True, layernorm="post", eps=1e-2, seed=0)
    masked = VectorQueryOracle(lambda X: target(np.asarray(X)[:, -3:, :]), d=8, d_out=8)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
        learn_attention_layer(masked, H=3)
    assert re.search(  # the joint stage's refusal, chained
        r"could not learn this post-LN block \(its answers scaled by their row space are not a sum of H heads: "
        r"fewer or more heads than H, a mask.*\): the heads failed at gap 6\.8e-04 on the norms from the gap, so",
        str(info.value.__cause__),
    )


@pytest.mark.parametrize(
    "d, eps, exact_below, ln_above", [(24, 0.1, 1e-5, 1e-3), (16, 1e-2, 1e-6, 1e-4)], ids=["d24", "d16"]
)
def test_behind_a_post_ln_the_heads_precision_is_lost_in_the_layernorms_inversion(d, eps, exact_below, ln_above):
    """The cause POST_HEADS_PRECISION states: at d = 24 (eps = 0.1, seed 0) the heads' stage on scaled tokens returns
    heads off by 3.9e-6 from the exact pre-LN answers P u / sqrt(eps), by 1.1e-2 through the LayerNorm's inversion
    (exact gamma, beta); at d = 16 (eps = 1e-2, seed 0), 2.0e-7 and 7.2e-4."""
    from companion.layer import AttentionLayer, _learn
    from companion.layer._model import centre
    from companion.layer._norm import Denormalised, PostLN

    def head_error(Ws, ref):
        A, R = Ws.copy(), ref.copy()
        A[:, -1, :], R[:, -1, :] = 0.0, 0.0
        return min(max(rel(A[i], R[j]) for i, j in enumerate(p)) for p in ((0, 1), (1, 0)))

    target = random_attention_layer(d, 2, residual=True, layernorm="post", eps=eps, seed=0)
    bare = AttentionLayer(target.Ws, target.Ms, target.b_O, skip=target.skip)
    P = centre(d)
    exact = VectorQueryOracle(lambda X: bare(X) @ P.T / np.sqrt(eps), d=d, d_out=d)
    norm = PostLN(target.gamma.copy(), target.beta.copy())
    inverted = Denormalised(VectorQueryOracle(target), norm)
    X1 = np.concatenate([np.zeros((1, 1, d)), np.eye(d)[:, None, :]])
    o = _learn._options(inverted, 2, None, "auto", "post", True, 32, None, 0)
    Ws_exact, _ = _learn._learn_heads(exact, exact(X1), o, rho=_learn.HEADS_SCALE)
    Ws_ln, _ = _learn._learn_heads(inverted, norm.denormalise(target(X1)), o, rho=_learn.HEADS_SCALE)
    ref = target.canonical().Ws
    assert head_error(Ws_exact, ref) < exact_below < ln_above < head_error(Ws_ln, ref)


# --- reader's findings on chapter 09 (session 34) ---------------------------------------------------------


def test_information_floor_counts_identifiable_parameters_per_answer():
    """A dimension count: identifiable parameters over free numbers per answer, per layer kind."""
    # d = 6, H = 2, post-LN residual: 2*6*7 + 2*5*6 + 5 + 2*6 + 1 = 162 over 5 free numbers per answer
    assert identifiable_parameters(6, 2, 6, skip="identity", layernorm="post") == (162, 5)
    assert information_floor(6, 2, 6, skip="identity", layernorm="post") == 33  # ceil(162 / 5) = ceil(32.4)
    # MiniLM layer 0: 12*384*385 + 12*383*384 + 383 + 768 + 1 = 3,540,096 over 383 -> 9,243.1
    assert identifiable_parameters(384, 12, 384, skip="identity", layernorm="post") == (3_540_096, 383)
    assert information_floor(384, 12, 384, skip="identity", layernorm="post") == 9244
    # without LayerNorm: 2*8*9 + 2*8*8 + 8 (+ 64 for a skip matrix) over 8
    assert identifiable_parameters(8, 2, 8, skip="none") == (280, 8)
    assert information_floor(8, 2, 8) == information_floor(8, 2, 8, skip=True) == -(-(280 + 64) // 8) == 43
    assert information_floor(8, 2, 8, skip="identity") == information_floor(8, 2, 8, skip=False) == 35
    # post-LN without an identity skip: eps set to 1 fixes the scale, so eps is not counted
    assert identifiable_parameters(6, 2, 6, skip="none", layernorm="post") == (161, 5)
    assert identifiable_parameters(6, 2, 6, skip="matrix", layernorm="post") == (161 + 30, 5)
    # pre-LN: gamma, beta folded into heads seen on d - 1 directions: 2*5*6 + 2*6*5 + 6 + 1 + 36
    assert identifiable_parameters(6, 2, 6, layernorm="pre") == (163, 6)
    with pytest.raises(InvalidInputError, match="skip"):
        information_floor(6, 2, 6, skip="diagonal")


def test_a_post_ln_skip_is_normalised_not_identified():
    """Skip 0.5 I and eps 1e-3 give the outputs of skip I and eps 4e-3: reported as a normalisation, not a finding."""
    base = random_attention_layer(6, 2, residual=True, layernorm="post", eps=1e-3, seed=0)
    half = AttentionLayer(
        base.Ws, base.Ms, base.b_O, skip=0.5 * np.eye(6), layernorm="post", gamma=base.gamma, beta=base.beta, eps=1e-3
    )
    for residual in ("auto", True):  # residual=True cannot tell the two apart
        rec = learn_attention_layer(VectorQueryOracle(half), H=2, residual=residual)
        assert rec.diagnostics["skip"] == "multiple of identity"
        assert rec.eps == pytest.approx(4e-3, rel=1e-9)  # right only under the normalisation S = I
        assert "normalised to I (eps assumes c = 1)" in rec.message
        assert "not a finding" in rec.diagnostics["skip_normalisation"]


def test_a_post_ln_refusal_by_the_heads_learner_states_no_false_verdict():
    """H = 3 behind a post-LN is in the class: the headline names both causes, not 'not an attention layer'."""
    target = random_attention_layer(8, 3, residual=True, layernorm="post", eps=1e-2, seed=0)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(target), H=3, heads="readout")  # auto: the joint stage learns it
    assert str(info.value).startswith(
        "could not learn this post-LN block (the LayerNorm's inversion costing the heads' stage its precision, a head "
        "too faint in the readout, more heads"
    )
    # the joint stage's advice, as the readout route's refusal without LayerNorm gives it (a tester's finding)
    assert str(info.value).endswith(
        "try seed=1; heads='joint' (every output at once) may resolve them (behind a post-LN it learned 30 of 30 "
        "blocks, H = 2, d = 8 to 32)."
    )
    target = random_attention_layer(8, 8, seed=0)  # no LayerNorm: the readout route's own headline
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(target), H=8, heads="readout")
    assert str(info.value).startswith(HEADS_UNRESOLVED)


def test_a_precision_refusal_after_a_failed_stage_says_the_precision_is_inferred():
    """PyTorch's eps = 1e-5 at d = 8, seed 0: a later stage fails with the smallest gap 2.1e-8 below LOW_GAP (on the
    readout route alone: by default the norms from the row space follow, tests/test_layer_directions.py)."""
    target = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    with pytest.raises(PrecisionError, match="inferred from the gap, not measured") as info:
        learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout")
    assert info.value.smallest_gap == pytest.approx(2.13e-8, rel=1e-2) and info.value.smallest_gap < LOW_GAP


def test_a_pre_ln_block_too_small_for_its_heads_stage_is_refused_without_a_verdict():
    """d = 5, H = 2 pre-LN: the heads live in d - 1 = 4 coordinates, too few for two heads in the readout route's
    plan at any seed (it said "try seed=1" before): an input error naming the robust route, which learns it."""
    target = random_attention_layer(5, 2, residual=True, layernorm="pre", eps=1e-3, seed=0)
    with pytest.raises(
        InvalidInputError, match="d - 1 = 4 .*at any seed .*not a verdict .*Without H and H_bound the robust route"
    ) as e:
        learn_attention_layer(VectorQueryOracle(target), H=2)
    assert "try seed" not in str(e.value)
    rec = learn_attention_layer(VectorQueryOracle(target))
    assert rec.n_heads == 2 and rec.diagnostics["layernorm"] == "pre"
    assert rec.diagnostics["verify_max_error"] < 1e-12


# --- pre-LN refusals after the heads' stage (session 35) --------------------------------------------------


def _first_learned(target, H, start):
    for s in range(start, start + 4):
        try:
            return s, learn_attention_layer(VectorQueryOracle(target), H=H, seed=s)
        except (OracleInconsistentError, SolverError):
            continue
    return None, None


def test_a_pre_ln_failure_after_its_heads_stage_states_no_false_verdict():
    """d = 6, H = 2, seed 1 (eps 1e-2): in the class, but learner seed 1's heads leave ||S_v|| = 0.18.
    Before: 'not an attention layer'. Now both causes are named and another seed learns it."""
    target = random_attention_layer(6, 2, layernorm="pre", residual=True, eps=1e-2, seed=1)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(target), H=2, seed=1)
    assert str(info.value).startswith("could not learn this pre-LN block (a head too faint in the readout, more heads")
    assert "try seed=2" in str(info.value)  # the next seed of the call (learner seed 1)
    s, rec = _first_learned(target, 2, 2)
    assert rec is not None and rec.diagnostics["verify_max_error"] < 1e-11


def test_a_pre_ln_out_of_reach_is_a_solver_error_and_another_seed_reaches_it():
    """d = 12, H = 2, seed 0 (a reader's draw of chapter 09): learner seed 0's heads' stage asks a normalised
    token of mean square 2.51; learner seeds 1 to 3 reach it. The seed's queries, not the target nor an argument: a
    SolverError (an InvalidInputError before, which the taxonomy keeps for arguments)."""
    target = random_attention_layer(12, 2, layernorm="pre", residual=True, eps=1e-3, seed=0)
    with pytest.raises(
        SolverError, match=r"at this seed's queries \(not a verdict on the target\).*asks 2\.51.*try seed=1\.$"
    ):
        learn_attention_layer(VectorQueryOracle(target), H=2, seed=0)
    s, rec = _first_learned(target, 2, 1)
    assert rec is not None and rec.n_heads == 2 and rec.diagnostics["verify_max_error"] < 1e-11


# --- pre-LN blocks at larger d (session 40) ------------------------------------------------------------


def test_the_polish_asks_enough_queries_for_the_heads_rows():
    """d = 32, H = 1 pre-LN (eps 1e-3, seed 1), readout route: the information floor's count alone gave the polish
    195 multi-token queries (about 780 score differences for 992 heads' rows' entries); it fitted them to 3e-16, was
    verified at 5.9e-9 on 32 queries (tolerance 1e-8) and was off by 1.1e-8 on 200 fresh ones. Now the polish asks
    polish_row_queries(32) - (32 + 8) = 488."""
    from companion.layer._fit import POLISH_SCORE_MARGIN, polish_row_queries

    assert polish_row_queries(32) == 528 == POLISH_SCORE_MARGIN * 32 * 33 // 4
    target = random_attention_layer(32, 1, layernorm="pre", residual=True, eps=1e-3, seed=1)
    rec = learn_attention_layer(VectorQueryOracle(target), H=1, heads="readout")
    assert rec.diagnostics["heads_learner"] == "learn_canonical_rational" and rec.diagnostics["polished"]
    assert rec.diagnostics["n_polish_queries"] == 488
    fresh200 = fresh(32, n=200, seed=777)
    assert max_rel_prediction_error(target, rec.model, fresh200) < 1e-12  # measured 8.5e-14 (was 1.1e-8)


@pytest.mark.parametrize("d, joint", [(15, False), (16, True)], ids=["d15-readout", "d16-joint"])
def test_a_pre_ln_block_takes_the_joint_heads_stage_from_pre_joint_from(d, joint):
    from companion.layer._learn import PRE_JOINT_FROM

    assert PRE_JOINT_FROM == 16
    target = random_attention_layer(d, 2, layernorm="pre", residual=True, eps=1e-3, seed=0)
    if not joint:  # the readout route at d = 15: learner seed 0 asks a mean square of 2.91, seed 1 reaches it
        with pytest.raises(SolverError, match=r"asks 2\.91: .*try seed=1"):
            learn_attention_layer(VectorQueryOracle(target), H=2)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, seed=0 if joint else 1)
    assert rec.diagnostics["heads_learner"] == ("joint" if joint else "learn_canonical_rational")
    assert max_rel_prediction_error(target, rec.model, fresh(d, n=200, seed=777)) < 1e-12


def test_a_masked_pre_ln_block_is_refused_by_the_joint_stage():
    """A sliding-window mask (the last 3 tokens) on a d = 16, H = 2 pre-LN block (eps 1e-3, seed 0): the joint stage
    on the normalised tokens refuses it, naming the mask among the causes (no verdict); nothing is returned."""
    target = random_attention_layer(16, 2, layernorm="pre", residual=True, eps=1e-3, seed=0)
    masked = VectorQueryOracle(lambda X: target(np.asarray(X)[:, -3:, :]), d=16, d_out=16)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
        learn_attention_layer(masked, H=2)
    assert re.search(r"^the heads' learner could not resolve .*joint heads' stage.*a mask", str(info.value.__cause__))


@pytest.mark.slow  # the readout route's refusal, polished first: about 12 CPU s
def test_a_pre_ln_block_the_readout_route_refused_at_d32_is_learned():
    """d = 32, H = 2, eps 1e-5, seed 1: the readout route's heads (normalised tokens scaled by PRE_HEADS_SCALE)
    misfit the least squares by 1.9e-2 at learner seed 0 on OpenBLAS's SkylakeX and Sandybridge kernels (on Haswell's
    the same route learned it, measured 2026-12-05: the refusal is the rounding's pick) and seeds 1 to 3 are out of
    its reach; the joint stage on the normalised tokens learns it (measured fresh 4.1e-13 on 200 queries)."""
    target = random_attention_layer(32, 2, layernorm="pre", residual=True, eps=1e-5, seed=1)
    try:
        readout = learn_attention_layer(VectorQueryOracle(target), H=2, heads="readout")
    except OracleInconsistentError as exc:  # never a verdict
        assert str(exc).startswith("could not learn this pre-LN block (a head too faint")
    else:  # verified when returned
        assert max_rel_prediction_error(target, readout.model, fresh(32, n=200, seed=777)) < 1e-8
    rec = learn_attention_layer(VectorQueryOracle(target), H=2)
    assert rec.diagnostics["heads_learner"] == "joint" and rec.n_heads == 2
    assert rec.model.eps == pytest.approx(1e-5, rel=1e-10)
    assert max_rel_prediction_error(target, rec.model, fresh(32, n=200, seed=777)) < 1e-11


def test_dimension_count_is_for_the_problem_as_posed():
    """residual="auto": the skip is fitted, so the count has a skip matrix (a fresh reader found the
    message's 27 for d = 6, H = 2, the count had the skip been known to be I, beside 'the learner fits
    it and never assumes it'); residual=True states the identity, and the count drops by d_out d."""
    target = random_attention_layer(6, 2, residual=True, seed=0)
    auto = learn_attention_layer(VectorQueryOracle(target), H=2)
    told = learn_attention_layer(VectorQueryOracle(target), H=2, residual=True)
    assert auto.diagnostics["information_floor"] == information_floor(6, 2, 6, skip="matrix") == 33
    assert told.diagnostics["information_floor"] == information_floor(6, 2, 6, skip="identity") == 27
    assert "dimension count, with the skip as posed, 33 vector queries" in auto.message


# --- MiniLM's post-LN: is MIN_GAP's rule right at d = 384? (session 36) ------------------------------------


@pytest.mark.parametrize("factor, accepted", [(1.01, True), (0.99, False)], ids=["inside", "outside"])
def test_min_gap_just_inside_and_outside(factor, accepted):
    """A post-LN answer whose 1 - |z|^2/d_out is just above MIN_GAP is de-normalised, just below refused."""
    from companion.layer._norm import PostLN

    d_out = 8
    z = np.zeros((1, d_out))
    z[0, :2] = np.sqrt(d_out * (1.0 - factor * MIN_GAP) / 2.0) * np.array([1.0, -1.0])  # |z|^2/d_out = 1 - gap
    norm = PostLN(np.ones(d_out), np.zeros(d_out))
    assert norm.gaps(z)[0] == pytest.approx(factor * MIN_GAP, rel=1e-4)
    if accepted:
        assert np.all(np.isfinite(norm.denormalise(z)))
    else:
        with pytest.raises(PrecisionError, match="post-LN's eps is too small"):
            norm.denormalise(z)


def test_minilm_answers_carry_the_direction_of_pu_to_rounding_and_its_norm_to_about_1e_6():
    """The measurement behind MIN_GAP at d = 384 (chapter 09): MiniLM's basis answers, de-normalised with the
    block's own gamma and beta, give P u's direction to 3.3e-16 and its norm to 5.4e-7 (median; 2.4e-6 largest),
    at most 2.7 times the rule's 2**-53 / gap: the gap is too small, and the rule is right."""
    block = minilm_block()
    before = block.with_(layernorm=None, gamma=None, beta=None, eps=None)
    X1 = [np.zeros((1, 384))] + [np.eye(384)[[i]] for i in range(384)]
    U1 = before(X1)
    Pu = (U1 - U1.mean(axis=1, keepdims=True)) / np.sqrt(block.eps)
    gap = block.eps / ((Pu * Pu).mean(axis=1) * block.eps + block.eps)
    z = (block(X1) - block.beta) / block.gamma
    back = z / np.sqrt(1.0 - (z * z).mean(axis=1))[:, None]
    norm_err = np.abs(np.linalg.norm(back, axis=1) / np.linalg.norm(Pu, axis=1) - 1.0)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    assert np.max(np.linalg.norm(unit(back) - unit(Pu), axis=1)) < 1e-15
    assert 1e-7 < np.median(norm_err) < 2e-6 and np.max(norm_err) < 1e-5
    assert np.max(norm_err * gap / 2.0**-53) < 10.0
    assert np.sum(gap < MIN_GAP) == 7  # the basis answers that trip the check (chapter 09)


@pytest.mark.parametrize("route", ["float64", "float32"])
@pytest.mark.parametrize("factor, named", [(0.9, True), (1.1, False)], ids=["inside", "outside"])
def test_skip_naming_tolerance_just_inside_and_outside(route, factor, named):
    """A fitted skip within SKIP_RTOL (float64) or FLOAT32_SKIP_UNITS u (float32) of I or 0 is named so."""
    from dataclasses import replace

    from companion.layer._float32 import FLOAT32_SKIP_UNITS
    from companion.layer._learn import SKIP_RTOL, _name_skip, _options

    o = _options(VectorQueryOracle(random_attention_layer(4, 1, seed=0)), 1, None, "auto", "auto", True, 0, None, 0)
    if route == "float32":
        o = replace(o, u=U32)
    stol = FLOAT32_SKIP_UNITS * U32 if route == "float32" else SKIP_RTOL
    E = np.zeros((4, 4))
    E[0, 1] = 1.0
    S = np.eye(4) + factor * stol * 2.0 * E  # ||S||_F = 2.0 (to rounding): the tolerance scales with it
    assert _name_skip(S, np.eye(4), 1.0, o)[0] == ("identity" if named else "matrix")
    assert _name_skip(factor * stol * E, np.eye(4), 1.0, o)[0] == ("none" if named else "matrix")


# --- session 36: refusals that name the real cause -----------------------------------------------------------


def test_an_in_class_block_served_in_float32_is_never_told_it_is_outside_the_class():
    """Chapter 09's default block (d = 6, H = 2, seed 0), served in float32, at learner seed 0: the heads fitted at
    float32 leave the least squares' residual at 0.15, above its gate. Before: 'not an attention layer ... A mask,
    a second layer or another nonlinearity would do this', a false verdict. Now both causes; seed 1 learns it."""
    from companion.layer._learn import FLOAT32_UNRESOLVED

    plain = random_attention_layer(6, 2, residual=True, seed=0)
    served = _rounded32(plain)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(served, d=6, d_out=6), H=2, seed=0)
    text = str(info.value)
    assert text.startswith(FLOAT32_UNRESOLVED) and "least squares failed" in text and "try seed=1" in text
    # a reader found the least squares' own verdict quoted inside this no-verdict refusal: now chained only
    assert "would do this" not in text and "would do this" in str(info.value.__cause__)
    rec = learn_attention_layer(VectorQueryOracle(served, d=6, d_out=6), H=2, seed=1)
    assert rec.diagnostics["verify_max_error"] <= FLOAT32_VERIFY_UNITS * U32


def test_a_post_ln_failure_is_blamed_on_the_gap_just_below_low_gap_only():
    """LOW_GAP (1e-6, measured): a failed stage after a smallest gap just below it is a PrecisionError, just above
    it the in-class causes without a verdict; the real cases: PyTorch's eps = 1e-5 at d = 8 (seed 0), learner seed
    1, gap 2.3e-7 (before: 'could not learn', with LOW_GAP = 1e-7), and eps = 1e-3, learner seed 3, gap 6.7e-6."""
    from companion.layer._learn import _post_unresolved

    cause = OracleInconsistentError("the heads' learner refused")
    assert isinstance(_post_unresolved(cause, 0.99 * LOW_GAP, "heads", 0), PrecisionError)
    outside = _post_unresolved(cause, 1.01 * LOW_GAP, "heads", 0)
    assert isinstance(outside, OracleInconsistentError) and str(outside).startswith("could not learn this post-LN")
    target = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    with pytest.raises(PrecisionError, match="inferred from the gap, not measured") as info:  # readout route alone
        learn_attention_layer(VectorQueryOracle(target), H=2, seed=1, heads="readout")
    assert info.value.smallest_gap == pytest.approx(2.30e-7, rel=2e-2)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, seed=2)  # other queries keep the gap at 2.4e-6
    assert rec.diagnostics["verify_max_error"] < 1e-9
    # the control: the same weights at eps = 1e-3 are learned at three or four of learner seeds 0 to 3 (measured
    # 2026-12-05: the verification at 1.9e-12 to 8.4e-12). The one refusal, at a seed the rounding picks (seed 3
    # on OpenBLAS's SkylakeX kernel, seed 0 on Haswell's, none of the four on Sandybridge's), names no verdict.
    learned = 0
    for seed in range(4):
        try:
            rec = learn_attention_layer(VectorQueryOracle(target.with_(eps=1e-3)), H=2, seed=seed)
        except OracleInconsistentError as exc:
            assert str(exc).startswith(
                "could not learn this post-LN block"
            ) and f"try seed={seed + 1}; heads='joint'" in str(exc)
            continue
        assert rec.diagnostics["verify_max_error"] < 1e-10
        learned += 1
    assert learned >= 3


def test_a_refusal_names_the_next_seed_of_the_call_that_refused():
    """Issue 34's review: the refusals said 'try seed=1' whatever the seed. A refusal at learner seed 3 (d = 8, H = 2,
    post-LN at PyTorch's eps = 1e-5, the readout route: the inferred gap's PrecisionError, on every OpenBLAS kernel
    measured; the block at eps = 1e-3, refused at a seed the rounding picks, was this test's call before) now says
    'try seed=4'; each message's builder, at seed 3, too."""
    from companion.layer._learn import _float32_unresolved, _post_unresolved, _pre_unresolved

    target = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    with pytest.raises(PrecisionError, match="inferred from the gap, not measured") as info:
        learn_attention_layer(VectorQueryOracle(target), H=2, seed=3, heads="readout")
    assert "try seed=4." in str(info.value) and "try seed=1" not in str(info.value)
    cause = OracleInconsistentError("the heads' learner refused")
    for err in (
        _post_unresolved(cause, 0.99 * LOW_GAP, "heads", 3),  # the inferred gap's PrecisionError
        _post_unresolved(cause, 1.01 * LOW_GAP, "heads", 3),
        _pre_unresolved(cause, 3),
        _float32_unresolved(cause, "least squares", 3),
    ):
        assert "try seed=4." in str(err) and "try seed=1" not in str(err)


def test_every_no_verdict_refusal_chains_its_stage_by_one_sentence():
    """Issue 34's review: the post-LN gap's refusal built its own chaining sentence ('its OracleInconsistentError,
    chained as this error's __cause__, states a verdict for exact norms'); it now says, as the other four refusals,
    that the verdict does not apply here (the gap below LOW_GAP leaves the norms 2^-53 / gap from exact, which is
    what that verdict assumes). One builder, chained_cause, writes that sentence for all six (the joint post-LN's, session 40)."""
    from companion.layer._learn import _FLOAT32_WHY, _float32_unresolved, _post_unresolved, _pre_unresolved
    from companion.layer._norm import chained_cause, inferred_gap_message

    cause = OracleInconsistentError("the heads' learner refused: not an attention layer")
    sentence = (
        "The stage raised OracleInconsistentError; its own message, whose verdict assumes exact norms and so does "
        "not apply here, is this error's __cause__."
    )
    assert chained_cause(cause, "assumes exact norms") == sentence
    inferred = inferred_gap_message(0.99 * LOW_GAP, cause, "heads' stage", seed=3)
    assert inferred.startswith("the heads' stage failed while the smallest 1 - |z|^2/d_out = eps / (var + eps) seen")
    assert inferred.endswith("try seed=4. Nothing was returned. " + sentence)
    assert "chained as this error's __cause__" not in inferred  # the duplicate's own wording, gone
    post = "does not account for the scaled tokens of the heads behind a post-LN"
    for err, why in (
        (_post_unresolved(cause, 0.99 * LOW_GAP, "heads' stage", 3), "assumes exact norms"),
        (_post_unresolved(cause, 1.01 * LOW_GAP, "heads' stage", 3), post),
        (
            _post_unresolved(cause, 1.01 * LOW_GAP, "joint heads' stage", 3, joint=True),
            "does not account for the LayerNorm",
        ),
        (_pre_unresolved(cause, 3), "does not account for the scaled tokens of the heads behind a pre-LN"),
        (_float32_unresolved(cause, "least squares", 3), _FLOAT32_WHY),
    ):
        assert chained_cause(cause, why) in str(err)
        assert str(err).count("__cause__") == 1 and "the heads' learner refused" not in str(err)
    assert str(_post_unresolved(cause, 0.99 * LOW_GAP, "heads' stage", 3)) == inferred


# --- try_seeds: the refusals' advice, followed (session 37) -------------------------------------------


def test_try_seeds_stops_at_the_first_seed_learned_and_keeps_each_refusal():
    """PyTorch's eps = 1e-5 at d = 8 (chapter 09), the readout route alone: learner seeds 0 and 1 refused for the
    gap, seed 2 learned (by default the norms from the row space follow each refusal)."""
    from companion.layer import try_seeds

    block = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    oracle = VectorQueryOracle(block)
    run = try_seeds(oracle, range(5), H=2, heads="readout")
    assert [o.seed for o in run.outcomes] == [0, 1, 2]  # seeds 3, 4 not tried
    assert [o.kind for o in run.outcomes] == ["PrecisionError", "PrecisionError", "learned"]
    assert run.refused == [0, 1] and run.learned_seed == 2
    assert run.outcomes[0].error.smallest_gap == pytest.approx(2.13e-8, rel=1e-2)
    assert run.recovery is run.outcomes[2].recovery and run.recovery.diagnostics["verify_max_error"] < 1e-9
    # the oracle's count ran on over the three seeds; each recovery counts its own seed's queries
    assert oracle.n_queries > run.recovery.n_queries > 0


def test_try_seeds_tries_every_seed_or_raises_the_last_refusal():
    from companion.layer import try_seeds

    block = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    run = try_seeds(VectorQueryOracle(block), [0, 1], H=2, heads="readout", until_learned=False)
    assert run.recovery is None and run.learned_seed is None and run.refused == [0, 1]
    with pytest.raises(PrecisionError, match="inferred from the gap") as info:
        try_seeds(VectorQueryOracle(block), [0, 1], H=2, heads="readout", require=True)
    assert "try seed=2" in str(info.value)  # the last seed's own refusal
    assert info.value.smallest_gap == pytest.approx(2.30e-7, rel=2e-2)  # seed 1's gap
    assert str(info.value).endswith(
        "(try_seeds: refused at every learner seed tried: seed 0: PrecisionError; seed 1: PrecisionError.)"
    )
    # until_learned=False goes on past a learned seed
    run = try_seeds(VectorQueryOracle(block), [1, 2, 3], H=2, heads="readout", until_learned=False)
    assert len(run.outcomes) == 3 and run.learned_seed == 2 and run.refused == [1]


def test_try_seeds_raises_bad_input_at_once():
    """A refusal before the first query is about the input, not a seed: raised, not recorded as an outcome."""
    from companion.layer import try_seeds

    oracle = VectorQueryOracle(random_attention_layer(6, 2, residual=True, seed=0))
    with pytest.raises(InvalidInputError, match="residual='yes'"):
        try_seeds(oracle, range(3), H=2, residual="yes")
    with pytest.raises(InvalidInputError, match="seeds is empty"):
        try_seeds(oracle, [], H=2)
    with pytest.raises(InvalidInputError, match="seed=-1 must be >= 0"):
        try_seeds(oracle, [0, -1], H=2)
    with pytest.raises(InvalidInputError, match="sets the learner's seed itself"):
        try_seeds(oracle, [0], H=2, seed=1)
    with pytest.raises(TypeError, match="VectorQueryOracle"):
        try_seeds(random_attention_layer(6, 2, seed=0), [0], H=2)
    assert oracle.n_queries == 0


# --- the heads' stage on all outputs jointly (issue 35: "use the outputs jointly"; session 37) ---------------


def test_joint_heads_stage_learns_eight_heads_where_the_readout_route_refuses():
    """d = 16, H = 8 (random_attention_layer seed 0): the readout route refuses (measured: d = 8, 16, 32 at H = 8,
    seeds 0 and 1), the joint route learns every head to rounding, with joint_plan(d, H) heads' queries."""
    target = random_attention_layer(16, 8, residual=True, seed=1)
    with pytest.raises(OracleInconsistentError, match=HEADS_UNRESOLVED):
        learn_attention_layer(VectorQueryOracle(target), H=8, heads="readout")
    rec = learn_attention_layer(VectorQueryOracle(target), H=8)
    diag, ref = rec.diagnostics, target.canonical()
    assert diag["heads_learner"] == "joint" and rec.n_heads == 8 and diag["skip"] == "identity"
    assert diag["n_head_queries"] == joint_plan(16, 8) == 2 * 8 * (16 * (16 + 1 + 24) + 15 * 2)
    assert rel(rec.model.Ws, ref.Ws) < 1e-12 and rel(rec.model.Ms, ref.Ms) < 1e-12
    assert diag["verify_max_error"] < 1e-12


@pytest.mark.slow
def test_joint_heads_stage_learns_the_bench_row_d64_h8():
    """bench_layer's d = 64, H = 8 residual row (seed 0): refused by the readout route (the joint fit of a row
    misfit by 0.024 after 130,317 queries); learned by the joint route from 93,789 queries (measured)."""
    target = random_attention_layer(64, 8, residual=True, seed=0)
    oracle = VectorQueryOracle(target)
    rec = learn_attention_layer(oracle, H=8)
    ref = target.canonical()
    assert rec.diagnostics["heads_learner"] == "joint" and oracle.n_queries == 93_789
    assert rel(rec.model.Ws, ref.Ws) < 1e-12 and rec.diagnostics["verify_max_error"] < 1e-12


def test_joint_heads_stage_refusals_name_the_cause():
    """A wrong H shows as the row space's rank (4 heads, H = 3 given); a mask over the last 3 tokens (outside the
    class) misfits the shared-pole fit; both under the headline that names both causes."""
    four = random_attention_layer(8, 4, residual=True, seed=0)
    with pytest.raises(OracleInconsistentError, match=r"rank 4, not H = 3") as info:
        learn_attention_layer(VectorQueryOracle(four), H=3)
    assert str(info.value).startswith(HEADS_UNRESOLVED)
    three = random_attention_layer(8, 3, residual=True, seed=0)
    masked = VectorQueryOracle(lambda Xs: three(np.asarray(Xs)[:, -3:]), d=8, d_out=8)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
        learn_attention_layer(masked, H=3)
    stage = str(info.value.__cause__)  # the joint stage's refusal, chained to the order check's verdict
    assert stage.startswith(HEADS_UNRESOLVED) and "joint heads' stage" in stage


def test_heads_option_is_checked_before_the_first_query():
    oracle = VectorQueryOracle(random_attention_layer(6, 3, seed=0))
    with pytest.raises(InvalidInputError, match="heads"):
        learn_attention_layer(oracle, H=3, heads="vector")
    with pytest.raises(InvalidInputError, match="heads='joint' needs H"):
        learn_attention_layer(oracle, H_bound=3, heads="joint")
    with pytest.raises(InvalidInputError, match="heads='joint' runs on blocks without a pre-LN"):
        learn_attention_layer(oracle, H=3, heads="joint", layernorm="pre")
    # a pre-LN found from the answers (behind a post-LN the joint stage runs: POST_JOINT_FROM)
    block = VectorQueryOracle(random_attention_layer(8, 3, layernorm="pre", residual=True, seed=0))
    with pytest.raises(InvalidInputError, match="runs on blocks without a pre-LN; this one has a pre-LN"):
        learn_attention_layer(block, H=3, heads="joint")
    narrow = VectorQueryOracle(random_attention_layer(6, 3, d_out=2, seed=0))
    with pytest.raises(InvalidInputError, match="d_out >= H"):
        learn_attention_layer(narrow, H=3, heads="joint")
    assert oracle.n_queries == 0 and narrow.n_queries == 0


def test_seed_run_summary_names_the_seeds_in_good_english():
    """Chapter 09 printed 'refused at learner seed(s) 0' (a reader, session 37): the clause comes
    from SeedRun.summary, singular and plural right."""
    from companion.errors import PrecisionError
    from companion.layer import SeedOutcome, SeedRun

    no = [SeedOutcome(s, error=PrecisionError("gap")) for s in range(3)]
    yes = SeedOutcome(3, recovery=object())
    assert SeedRun((yes,)).summary == "learned at the first learner seed"
    assert (
        SeedRun((no[0], SeedOutcome(1, recovery=object()))).summary == "refused at learner seed 0 and learned at seed 1"
    )
    assert SeedRun((no[0], no[1], no[2], yes)).summary == "refused at learner seeds 0, 1 and 2 and learned at seed 3"
    assert SeedRun(tuple(no)).summary == "refused at every learner seed tried (0 to 2)"


def test_the_pre_ln_readout_routes_seed_advice_names_a_block_no_later_seed_learned():
    """Session 40: 'all 60 are learned within 4 consecutive seeds' was the refusals' whole advice, but this
    d = 10 block, learned at learner seed 0, fails at seeds 1 to 4; the messages now say so."""
    from companion.layer import try_seeds
    from companion.layer._learn import _PRE_SEEDS_NOT_ALL

    block = random_attention_layer(10, 2, layernorm="pre", residual=True, eps=1e-3, seed=0)
    run = try_seeds(VectorQueryOracle(block), range(5), H=2, until_learned=False)
    assert [o.kind for o in run.outcomes] == [
        "learned",
        "SolverError",
        "OracleInconsistentError",
        "SolverError",
        "SolverError",
    ]
    assert "try seed=2" in str(run.outcomes[1].error) and _PRE_SEEDS_NOT_ALL in str(run.outcomes[1].error)
    assert "failed at learner seeds 1 to 4" in _PRE_SEEDS_NOT_ALL


def test_heads_refusal_with_H_wrong_by_one_names_the_H_given():
    """An adversarial tester's finding: a residual block of 2 heads learned with H = 1 was refused as
    'more heads than it resolves at this size, or not an attention layer', never naming the H given."""
    from companion.errors import OracleInconsistentError
    from companion.layer import learn_attention_layer, random_attention_layer
    from companion.oracles import VectorQueryOracle

    target = random_attention_layer(6, 2, residual=True, seed=2)
    with pytest.raises(OracleInconsistentError, match=r"or the layer has other than the H = 1 heads given"):
        learn_attention_layer(VectorQueryOracle(target), 1)


def test_a_sliding_window_is_refused_on_long_verification_queries():
    """An adversarial tester's sliding windows of 8 and 9 tokens (with H given the learner asks nothing longer than 8
    tokens) were returned, verified on lengths 1 to 8, and off by 1.3 at N = 20; a second tester's windows of 43 to 63
    passed lengths drawn from 9 to 64. A quarter of the verification queries (at least one) now have lengths from 9 to
    VERIFY_LONG_LEN = 256, spaced geometrically, the longest always among them: every window below 256 is seen."""
    from companion.layer import VERIFY_LONG_LEN, VERIFY_LONG_SHARE, verify_queries
    from companion.layer._verify import long_lengths

    assert (VERIFY_LONG_LEN, VERIFY_LONG_SHARE) == (256, 0.25)
    assert long_lengths(8).tolist() == [9, 15, 23, 38, 61, 98, 159, 256] and long_lengths(1).tolist() == [256]
    lengths = [len(x) for x in verify_queries(6, 32, seed=1)]
    assert max(lengths[:24]) <= 8 and lengths[24:] == long_lengths(8).tolist() and len(lengths) == 32
    assert [len(x) for x in verify_queries(6, 1, seed=1)] == [256] and verify_queries(6, 0, seed=1) == []
    layer = random_attention_layer(6, 2, residual=True, seed=0)
    for window in (8, 9, 63, 255):  # the verification refuses; the order check then names the cause (2026-12-06)
        with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
            learn_attention_layer(VectorQueryOracle(lambda X, w=window: layer(X[:, -w:]), d=6, d_out=6), H=2)
        assert re.search("^not an attention layer.*on 32 fresh queries", str(info.value.__cause__))
    rec = learn_attention_layer(VectorQueryOracle(layer), H=2)
    assert rec.diagnostics["verify_max_error"] < 1e-12


def test_a_non_finite_answer_inside_a_stage_is_raised_as_it_is():
    """An adversarial tester's target answering NaN on large tokens was refused as the heads' stage failing ("could not
    resolve the heads ... or not an attention layer"), the real cause last: it is now the oracle's own refusal."""
    layer = random_attention_layer(6, 2, residual=True, seed=0)
    nan_on_large = VectorQueryOracle(lambda X: np.where(X[:, -1:, 0] > 1.5, np.nan, layer(X)), d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match=r"^the oracle's target returned a non-finite answer \(nan\)"):
        learn_attention_layer(nan_on_large, H=2)
    # a new user's loop over __cause__ and __context__ hung (NaN on queries longer than 8 tokens, behind a post-LN):
    # the error was raised inside the handler of the error whose chain led back to it; the chain now ends
    post = random_attention_layer(8, 2, residual=True, layernorm="post", eps=0.1, seed=1)
    nan_on_long = VectorQueryOracle(lambda X: post(X) * (1.0 if X.shape[1] <= 8 else np.nan), d=8, d_out=8)
    with pytest.raises(OracleInconsistentError, match=r"^the oracle's target returned a non-finite answer") as info:
        learn_attention_layer(nan_on_long, H=2)
    # and nothing more is asked after it: no replay of the kept queries (the NaN lay in the error's chain, not on it)
    # and no fallback route (the user's run asked 3,876 queries; this one 1,326 before)
    assert nan_on_long.n_queries == 647
    seen, link = [], info.value
    while link is not None and len(seen) < 50:
        assert all(link is not x for x in seen)
        seen.append(link)
        link = link.__cause__ or link.__context__
    assert link is None
    assert learn_attention_layer.__name__ == "learn_attention_layer" and "Parameters" in learn_attention_layer.__doc__


def test_the_readout_routes_refusal_advises_the_joint_stage_where_it_applies():
    """An adversarial tester's in-class blocks refused by the readout route (W scaled by 5) were learned by
    heads='joint', which the refusal did not name; it now does where the joint stage applies (H given, d_out >= H, no
    pre-LN), and the joint stage learns the block. Float32 answers with heads='joint' are learned, not refused."""
    base = random_attention_layer(6, 2, residual=True, seed=0)
    steep = base.with_(Ws=base.Ws * 5)
    with pytest.raises(OracleInconsistentError, match="heads='joint' \\(every output at once\\) may resolve them"):
        learn_attention_layer(VectorQueryOracle(steep), H=2, heads="readout")
    assert learn_attention_layer(VectorQueryOracle(steep), H=2, heads="joint").diagnostics["verify_max_error"] < 1e-10
    f32 = VectorQueryOracle(lambda X: base(X).astype(np.float32).astype(float), d=6, d_out=6)
    rec = learn_attention_layer(f32, H=2, heads="joint")
    assert rec.diagnostics["heads_learner"] == "joint" and rec.diagnostics["verify_max_error"] < 1e-6


def test_a_scalar_readout_given_to_the_vector_oracle_is_pointed_to_its_vector():
    from companion.targets import from_callable

    base = random_attention_layer(6, 2, residual=True, seed=0)
    scalar = from_callable(lambda X: base(X), d=6, readout=np.ones(6))
    with pytest.raises(OracleInconsistentError, match=r"give VectorQueryOracle its `\.vector`"):
        VectorQueryOracle(scalar, d=6, d_out=6)(np.zeros((2, 3, 6)))


def test_a_verify_rtol_below_the_answers_rounding_is_named_not_the_target():
    """An adversarial tester's verify_rtol = 1e-20 refused a correct layer (disagreement 2.4e-15) as "not an attention
    layer": below float64's unit roundoff it is refused before any query; above it, a failed check within the answers'
    rounding (256 u = 2.8e-14) names verify_rtol; just above the disagreement, the layer is learned."""
    layer = random_attention_layer(6, 2, residual=True, seed=0)
    oracle = VectorQueryOracle(layer)
    with pytest.raises(InvalidInputError, match="below float64's unit roundoff"):
        learn_attention_layer(oracle, H=2, verify_rtol=1e-20)
    assert oracle.n_queries == 0
    with pytest.raises(InvalidInputError, match="within what the answers' rounding explains .* raise it"):
        learn_attention_layer(VectorQueryOracle(layer), H=2, verify_rtol=1.2e-16)
    assert (
        learn_attention_layer(VectorQueryOracle(layer), H=2, verify_rtol=1e-14).diagnostics["verify_max_error"] < 1e-14
    )
    with pytest.raises(InvalidInputError, match="no query token per row fits"):
        learn_attention_layer(VectorQueryOracle(layer), H=10**6)


def test_a_post_ln_at_d_out_below_4_is_refused_without_a_verdict():
    """An adversarial tester's post-LN block at d_out = 3 (layernorm="auto") was called "not an attention layer ...
    (e.g. GELU)": a post-LN's hyperplane is not read below d_out = 4, so the refusal names both causes; the block
    without a LayerNorm is learned, and layernorm="post" is refused before any query."""
    post = random_attention_layer(6, 2, d_out=3, layernorm="post", seed=0)
    with pytest.raises(
        OracleInconsistentError, match="^could not learn this target.*a post-LN block or a nonlinearity"
    ):
        learn_attention_layer(VectorQueryOracle(post), H=2)
    plain = random_attention_layer(6, 2, d_out=3, seed=0)
    assert learn_attention_layer(VectorQueryOracle(plain), H=2).diagnostics["verify_max_error"] < 1e-13
    oracle = VectorQueryOracle(post)
    with pytest.raises(InvalidInputError, match="d_out"):
        learn_attention_layer(oracle, H=2, layernorm="post")
    assert oracle.n_queries == 0


def test_a_scalar_oracle_of_a_model_with_vector_outputs_is_pointed_to_its_vector():
    """A second tester's finding: learn_attention_layer(from_keras(layer).oracle()) said to wrap "the layer" in a
    VectorQueryOracle, where the model's ``.vector`` is meant."""
    from companion.targets import from_callable

    block = random_attention_layer(6, 2, residual=True, seed=0)
    model = from_callable(block, 6, batched=True, readout=np.ones(6))
    with pytest.raises(TypeError, match=r"give VectorQueryOracle that model's `\.vector` .*not its `\.oracle\(\)`"):
        learn_attention_layer(model.oracle(), H=2)
    with pytest.raises(TypeError, match=r"Wrap the layer in VectorQueryOracle\(layer\)\.$"):
        learn_attention_layer(block, H=2)
    rec = learn_attention_layer(VectorQueryOracle(model.vector, d=6, d_out=6), H=2)
    assert rec.diagnostics["verify_max_error"] < 1e-12


@pytest.mark.parametrize("served", ["post-LN", "float32"])
def test_a_verify_rtol_below_the_routes_reach_names_verify_rtol_not_the_block(served):
    """A second tester's finding: a verify_rtol below what the post-LN or float32 route reaches (though above float64's
    rounding) was refused as the block ("could not learn ... try seed=1"). Within the route's default tolerance it
    now names verify_rtol; just above the error found, the same seed learns."""
    from companion.layer import try_seeds

    if served == "post-LN":
        block = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-3, seed=0)
        make = lambda: VectorQueryOracle(block)  # noqa: E731
    else:
        block = random_attention_layer(6, 2, residual=True, seed=0)
        make = lambda: VectorQueryOracle(lambda X: block(X).astype(np.float32), d=6, d_out=6)  # noqa: E731
    run = try_seeds(make(), range(4), H=2, require=True)
    seed, err = run.learned_seed, run.recovery.diagnostics["verify_max_error"]
    with pytest.raises(InvalidInputError, match=r"within this route's default tolerance .* raise it") as info:
        learn_attention_layer(make(), H=2, seed=seed, verify_rtol=err / 4)
    assert f"above verify_rtol={err / 4:.3g}" in str(info.value)
    rec = learn_attention_layer(make(), H=2, seed=seed, verify_rtol=err * 4)
    assert rec.diagnostics["verify_max_error"] == err


def test_a_window_behind_a_post_ln_without_H_is_not_blamed_on_eps_alone():
    """A second tester's finding: a sliding window behind a post-LN (eps = 1e-3, H not given) got a PrecisionError
    calling the eps "the likely cause". The gap below LOW_GAP makes eps a cause; the message now names both."""
    block = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-3, seed=0)
    with pytest.raises(OracleInconsistentError, match=SEES_POSITIONS) as info:
        learn_attention_layer(VectorQueryOracle(_Windowed(block, window=3)))
    stage = info.value.__cause__  # since 2026-12-06 the order check names the window; the stage's refusal chained
    assert isinstance(stage, PrecisionError) and "inferred from the gap" in str(stage)
    assert "eps can be the cause" in str(stage) and "likely cause" not in str(stage)
    assert "A target outside the class (a mask, a second layer) ends here too" in str(stage)
    assert "no verdict is stated" in str(stage)


def test_relative_errors_compares_canonical_forms_with_heads_matched():
    """LayerRecovery.relative_errors (the new user's crash: it read W and v, which AttentionLayer lacks)."""
    import dataclasses

    target = random_attention_layer(8, 2, residual=True, layernorm="post", eps=0.1, seed=0)
    rec = learn_attention_layer(VectorQueryOracle(target), H=2, heads="joint")
    errs = rec.relative_errors(target)
    assert sorted(errs) == ["Ms", "Ws", "b_O", "beta", "eps", "gamma", "skip"]
    assert max(errs.values()) < 1e-8
    # the same function with its heads in the other order: matched, not compared by position
    swapped = target.with_(Ws=target.Ws[::-1], Ms=target.Ms[::-1])
    assert rec.relative_errors(swapped) == pytest.approx(errs, abs=1e-12)
    # a known error in one head's token rows: the canonical Ws error is its norm over all heads'
    truth = target.canonical()
    delta = np.zeros_like(rec.Ws)
    delta[1, :8, :] = 1e-3 * np.random.default_rng(1).standard_normal((8, 9))
    off = dataclasses.replace(rec, Ws=rec.Ws + delta).relative_errors(target)
    want = np.linalg.norm(delta) / np.linalg.norm(truth.Ws)
    assert off["Ws"] == pytest.approx(want, rel=1e-6)
    assert off["Ms"] == pytest.approx(errs["Ms"], abs=1e-12)
    with pytest.raises(InvalidInputError, match=r"heads, no skip, layernorm\) .* \(8, 8, 2, False, 'post'\)"):
        rec.relative_errors(random_attention_layer(8, 3, residual=True, layernorm="post", seed=0))
    with pytest.raises(InvalidInputError, match="compares against an AttentionLayer; got SingleHead"):
        rec.relative_errors(random_single_head(8, seed=0))


def test_a_post_ln_budget_is_refused_before_the_first_query_at_its_largest_path():
    """A new user's post-LN block (d = 8, H = 2, eps 1e-5) with a budget between the plan then counted (783) and
    what its path asked spent 585 queries before a BudgetExceededError: a route failed at a small gap and the row
    space's route followed, which the plan did not count. The plan now counts that path (a failed route at any gap
    since 2026-12-06); one query less is refused
    with nothing asked, and the plan's budget is enough. The path's own count moves with the arithmetic (1,914 on
    OpenBLAS's Haswell kernel, 2,008 on SkylakeX: where the first route fails), the plan's does not."""
    target = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-5, seed=1)
    probe = VectorQueryOracle(target, budget=1)
    with pytest.raises(
        BudgetExceededError, match="a post-LN route that fails, then its norms from the row space"
    ) as info:
        learn_attention_layer(probe, H=2)
    needed = info.value.needed
    d, H = 8, 2
    first = 4 * 5 + (d + 1) + (H * d + 8) + 2 * information_floor(d, H, d) - (H * d + 8)  # probe, basis, fit, polish
    heads = rational_plan(d + 1, H)["n_queries"] - (d + 1)  # the readout route's (the joint stage's from H = 3)
    assert (
        directions_route_plan(d, d, H, 32, False) == 2 * d + 1 + joint_plan(d, H, 8) + scale_plan(d, H) + 32
    )  # 8 links
    assert needed == first + heads + 32 + directions_route_plan(d, d, H, 32, False) == 2640
    short = VectorQueryOracle(target, budget=needed - 1)
    with pytest.raises(BudgetExceededError):
        learn_attention_layer(short, H=2)
    assert short.n_queries == 0
    rec = learn_attention_layer(VectorQueryOracle(target, budget=needed), H=2)
    assert rec.diagnostics["heads_learner"] == "joint, norms from the row space" and 1900 < rec.n_queries < needed
    # without a LayerNorm to find, the plan is the direct route's
    with pytest.raises(BudgetExceededError) as plain:
        learn_attention_layer(VectorQueryOracle(target, budget=1), H=2, layernorm="none")
    assert plain.value.needed == first + heads + 32 == 783


@pytest.mark.parametrize("eps, error", [(0.1, OracleInconsistentError), (1e-5, PrecisionError)])
def test_a_post_ln_refused_without_h_names_h(eps, error):
    """A new user's post-LN blocks were refused without H at every seed, told to try another seed or a larger eps;
    with H they are learned. The refusal now says H was not given (its measurement is this block's)."""
    target = random_attention_layer(8, 2, residual=True, layernorm="post", eps=eps, seed=1)
    with pytest.raises(error, match=r"H was not given: behind a post-LN .* give H, the number of heads"):
        learn_attention_layer(VectorQueryOracle(target))
    assert learn_attention_layer(VectorQueryOracle(target), H=2).diagnostics["verify_max_error"] < 1e-8


def test_a_layernorm_without_its_parameters_names_which_are_missing():
    """A new user read "got gamma=False, beta=False" for parameters not given (None)."""
    with pytest.raises(InvalidInputError, match=r"got gamma None, beta given, eps=1e-05\.$"):
        AttentionLayer(
            np.zeros((1, 5, 5)), np.zeros((1, 4, 5)), np.zeros(4), layernorm="post", beta=np.zeros(4), eps=1e-5
        )


def test_a_float32_readout_refusal_with_h_given_names_the_joint_stage():
    """A new user's float32 blocks (d = 8, H = 2) refused by the readout route were learned with heads='joint', which
    that refusal did not name; it now does, with H given."""
    target = random_attention_layer(8, 2, residual=True, seed=2)
    served = VectorQueryOracle(lambda X: target(X).astype(np.float32), d=8, d_out=8)
    with pytest.raises(OracleInconsistentError, match="with H given, heads='joint' runs the joint stage at any H"):
        learn_attention_layer(served, H=2)
    served = VectorQueryOracle(lambda X: target(X).astype(np.float32), d=8, d_out=8)
    rec = learn_attention_layer(served, H=2, heads="joint")
    assert rec.diagnostics["verify_max_error"] <= FLOAT32_VERIFY_UNITS * 2.0**-24


def test_a_pre_ln_with_three_heads_below_the_joint_stage_says_another_seed_is_unlikely_to_help():
    """A new user's pre-LN blocks with H = 3 at d = 12 were refused at every seed, each refusal advising the next seed;
    measured since: 10 of 10 random blocks (d = 8 to 15) at learner seeds 0 to 2. The refusal now says so. Where
    this block ends moves with the arithmetic: at the pre-LN stage on OpenBLAS's Haswell kernel (that refusal), in
    the heads' learner on SkylakeX, whose refusal names H = 3 behind a LayerNorm and advises no seed."""
    from companion.layer._learn import _pre_unresolved

    target = random_attention_layer(8, 3, residual=True, layernorm="pre", eps=1e-3, seed=0)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(target), H=3)
    text = str(info.value)
    unlikely = "with H = 3 none was learned: 10 of 10 blocks, d = 8 to 15"
    assert unlikely in text or ("H = 3 behind a LayerNorm" in text and "try seed" not in text), text
    assert unlikely in str(_pre_unresolved(OracleInconsistentError("the stage's own message"), seed=0))
