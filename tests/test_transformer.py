"""Tests of the one-layer Transformer: model, antisymmetrised oracle, learn_one_layer."""

import numpy as np
import pytest

from companion.attention import OneLayerTransformer, SingleHead
from companion.errors import BudgetExceededError, InvalidInputError, NotIdentifiableError
from companion.oracles import AntisymmetrisedOracle, ValueQueryOracle
from companion.transformer import evaluate, learn_one_layer, output_precision, random_one_layer


def test_from_native_matches_the_native_formula():
    rng = np.random.default_rng(0)
    d, r, m = 4, 2, 5
    Q, K = rng.standard_normal((r, d)), rng.standard_normal((r, d))
    V, W1, w2 = rng.standard_normal((d, d)), rng.standard_normal((m, d)), rng.standard_normal(m)
    tf = OneLayerTransformer.from_native(Q, K, V, W1, w2)
    X = rng.standard_normal((3, d))
    s = X @ K.T @ Q @ X[-1]
    alpha = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    expected = w2 @ np.maximum(W1 @ (V @ (alpha @ X)), 0.0)
    assert tf(X) == pytest.approx(expected, rel=1e-13)


def test_shapes_are_checked():
    with pytest.raises(InvalidInputError, match="w_o must have shape"):
        OneLayerTransformer(np.eye(2), np.ones((2, 3)), np.ones(2))


def test_scores_are_invariant_under_negation_and_antisymmetrisation_gives_a_head():
    tf = random_one_layer(5, 7, seed=1)
    X = np.random.default_rng(2).standard_normal((10, 4, 5))
    head = SingleHead(tf.W, tf.A @ tf.w_o)
    anti = AntisymmetrisedOracle(ValueQueryOracle(tf))
    assert np.allclose(anti(X), head(X), rtol=1e-12, atol=1e-14)
    assert anti.n_queries == 20 and anti.oracle.n_queries == 20


def test_antisymmetrised_oracle_respects_the_budget_before_answering():
    base = ValueQueryOracle(random_one_layer(3, 2, seed=0), budget=5)
    anti = AntisymmetrisedOracle(base)
    with pytest.raises(BudgetExceededError):
        anti(np.zeros((3, 1, 3)))
    assert base.n_queries == 0 and anti.remaining == 2


@pytest.mark.parametrize("d,m", [(3, 2), (6, 6), (5, 9)])
def test_learn_one_layer_recovers_W_and_the_canonical_ffn(d, m):
    tf = random_one_layer(d, m, seed=10 * d + m)
    oracle = ValueQueryOracle(tf)
    rec = learn_one_layer(oracle)
    err = evaluate(rec, tf, n=300)
    assert err["matched"] and err["W_error"] < 1e-12
    assert err["direction_error"] < 1e-11 and err["weight_error"] < 1e-10
    assert err["bits"] > 40
    assert rec.n_queries == oracle.n_queries
    assert rec.diagnostics["n_queries_attention"] == 2 * d * d   # the d length-1 queries reuse the FFN's [+-e_j]
    assert rec.diagnostics["n_reused"] == 2 * d
    assert rec.n_queries == rec.diagnostics["n_queries_ffn"] + rec.diagnostics["n_queries_attention"] + 32
    assert rec.diagnostics["n_verify_queries"] == 64 + 32 == rec.diagnostics["ffn"]["n_verify_queries"] + 32
    assert rec.n_learning_queries == rec.n_queries - 96 and rec.diagnostics["verify_max_error"] < 1e-6
    assert rec.diagnostics["v_mismatch"] < 1e-12


def test_zero_linear_part_is_not_identifiable():
    # Two neurons a and -a with equal output weights: w ReLU(a.x) + w ReLU(-a.x) = w |a.x|, A w_o = 0.
    a = np.array([1.0, 0.5, -0.3])
    tf = OneLayerTransformer(np.eye(3), np.stack([a, -a], axis=1), np.array([1.0, 1.0]))
    with pytest.raises(NotIdentifiableError, match="A w_o = 0"):
        learn_one_layer(ValueQueryOracle(tf))


def test_output_precision_of_a_model_with_itself_is_infinite():
    tf = random_one_layer(3, 2, seed=0)
    assert output_precision(tf, tf, n=20) == float("inf")
