"""Pinned formulas and budgets of ``companion.pretrained`` (a real MiniLM head as a target).

BERT's attention at the last token and the merged homogeneous head ``(W~, v~)`` recomputed from
the stored per-head weights with plain numpy (scores divided by ``sqrt(32)``, every bias where the
docstring puts it), the layer and head ranges, and the homogeneous learner's ``(d + 1)^2`` count,
its budget and its 1-norm condition number.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from companion import pretrained as pt
from companion.attention import random_single_head
from companion.errors import BudgetExceededError, InvalidInputError
from companion.oracles import ValueQueryOracle


def approx(expected, rel=1e-6, abs=0.0):
    """``pytest.approx`` without its default absolute tolerance 1e-12, which would accept any value
    next to the tiny ones pinned here (rounding sensitivities of 1e-15, slacks of 1e-16)."""
    return pytest.approx(expected, rel=rel, abs=abs)


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _bert_head_output(X, bh):
    """One head's attention output (384,) at the last token, BERT's way, from its own slices."""
    q = bh.Q @ X[-1] + bh.b_Q
    k = X @ bh.K.T + bh.b_K
    v = X @ bh.V.T + bh.b_V
    a = _softmax(k @ q / math.sqrt(32.0))
    return bh.O @ (a @ v)


def test_model_constants_and_ranges():
    assert (pt.N_LAYERS, pt.N_HEADS, pt.D_MODEL, pt.D_HEAD) == (6, 12, 384, 32)
    pt.load_bert_head(5, 11)
    for layer, head in [(6, 0), (0, 12), (-1, 0)]:
        with pytest.raises(InvalidInputError):
            pt.load_bert_head(layer, head)


def test_bert_attention_output_of_one_head_recomputed_from_its_slices():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 384))
    bh = pt.load_bert_head(1, 3)
    c = pt.default_readout()
    ref = c @ (_bert_head_output(X, bh) + bh.b_O)  # the output bias once
    assert pt.bert_attention_output(X, 1, head=3) == approx(ref, rel=1e-11)
    vec = pt.bert_attention_vector(X, 1, head=3)
    np.testing.assert_allclose(vec, _bert_head_output(X, bh) + bh.b_O, rtol=1e-10, atol=1e-12)


def test_bert_full_layer_is_the_sum_of_its_heads_plus_one_output_bias():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 384))
    heads = [pt.load_bert_head(0, h) for h in range(12)]
    ref = sum(_bert_head_output(X, bh) for bh in heads) + heads[0].b_O
    np.testing.assert_allclose(pt.bert_attention_vector(X, 0), ref, rtol=1e-10, atol=1e-12)


def test_default_readout_is_a_unit_vector_from_the_stored_draw():
    c = pt.default_readout()
    g = np.asarray(pt.load_weights()["readout"], dtype=np.float64)
    np.testing.assert_allclose(c, g / np.linalg.norm(g), rtol=1e-15)
    assert float(c @ c) == approx(1.0, rel=1e-14)


def test_load_head_without_bias_is_KtQ_over_sqrt_32_and_VtOtc():
    bh = pt.load_bert_head(2, 5)
    c = pt.default_readout()
    head = pt.load_head(2, 5, bias=False)
    np.testing.assert_allclose(head.W, bh.K.T @ bh.Q / math.sqrt(32.0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(head.v, bh.V.T @ (bh.O.T @ c), rtol=1e-12, atol=1e-15)


def test_load_head_with_bias_is_the_homogeneous_merged_head():
    bh = pt.load_bert_head(0, 7)
    rng = np.random.default_rng(2)
    c = rng.standard_normal(384)  # used as given, not normalised
    head = pt.load_head(0, 7, readout=c)
    s = math.sqrt(32.0)
    W = np.zeros((385, 385))
    W[:384, :384] = bh.K.T @ bh.Q / s
    W[:384, 384] = bh.K.T @ bh.b_Q / s
    np.testing.assert_allclose(head.W, W, rtol=1e-12, atol=1e-14)
    w_o = bh.O.T @ c
    v = np.append(bh.V.T @ w_o, bh.b_V @ w_o + c @ bh.b_O)
    np.testing.assert_allclose(head.v, v, rtol=1e-12, atol=1e-14)
    X = rng.standard_normal((4, 384))
    ref = c @ (_bert_head_output(X, bh) + bh.b_O)
    assert float(head(pt.homogeneous(X)[None])[0]) == approx(ref, rel=1e-10)
    with pytest.raises(InvalidInputError):
        pt.load_head(0, 7, readout=np.zeros(384))


def test_homogeneous_appends_a_one_to_every_token():
    X = np.arange(12.0).reshape(2, 3, 2)
    H = pt.homogeneous(X)
    np.testing.assert_array_equal(H[..., :2], X)
    np.testing.assert_array_equal(H[..., 2], np.ones((2, 3)))


def test_biased_pairs_tokens():
    """The token parts of the homogeneous queries of learn_single_head(bias=True) (exact._biased_pairs)."""
    from companion import exact

    U = np.array([[1.0, 2.0], [3.0, -1.0]])
    c = np.array([0.5, 0.25])
    X = exact._biased_pairs(U, 1, c, 2)
    for k in range(2):
        np.testing.assert_allclose(X[k, 0], c[k] * (U[k] + np.eye(2)[1]), rtol=1e-15)
        np.testing.assert_allclose(X[k, 1], c[k] * np.eye(2)[1], rtol=1e-15)
    X = exact._biased_pairs(U, 2, c, 2)  # j = d: [(c u, 1); (0, 1)]
    np.testing.assert_allclose(X[0], [[0.5, 1.0], [0.0, 0.0]], rtol=1e-15)


def test_constants_of_the_homogeneous_learner():
    from companion import exact

    assert exact._MAX_ROUNDS == 40
    assert exact._BIAS_SHRINK == 0.125


def test_learn_homogeneous_head_count_budget_and_diagnostics():
    d1, verify = 5, 6
    target = random_single_head(d1, seed=3)
    need = d1 * d1 + verify
    oracle = ValueQueryOracle(target, budget=need - 1)
    with pytest.raises(BudgetExceededError):
        pt.learn_homogeneous_head(oracle, verify=verify)
    assert oracle.n_queries == 0
    oracle = ValueQueryOracle(target, budget=need)  # exactly the budget: accepted
    rec = pt.learn_homogeneous_head(oracle, verify=verify, scale=0.5)
    g = rec.diagnostics
    assert g["n_requeries"] == 0  # this draw: no saturated probe at c = 0.5
    assert rec.n_learning_queries == d1 * d1 and rec.n_queries == need
    assert g["n_verify_queries"] == verify
    np.testing.assert_allclose(rec.W[: d1 - 1], target.W[: d1 - 1], rtol=1e-9, atol=1e-11)
    np.testing.assert_array_equal(rec.W[d1 - 1], np.zeros(d1))  # the canonical zero last row
    np.testing.assert_allclose(rec.v, target.v, rtol=1e-12, atol=1e-14)
    assert g["cond_probes"] == approx(np.linalg.cond(g["probes"], 1), rel=1e-9)
    assert g["identifiable"] == "W[:d, :], v"


def test_homogeneous_errors_are_relative_on_the_first_d_rows_and_on_v():
    from types import SimpleNamespace

    target = random_single_head(4, seed=5)
    W = target.W.copy()
    W[:3] += 0.01
    W[3] += 100.0  # the last row is not identifiable: not counted
    v = target.v * 1.02
    errs = pt.homogeneous_errors(SimpleNamespace(W=W, v=v), target)
    assert errs["W"] == approx(0.01 * math.sqrt(12) / np.linalg.norm(target.W[:3]), rel=1e-12)
    assert errs["v"] == approx(0.02, rel=1e-12)


def test_learn_homogeneous_head_needs_d_plus_1_at_least_2():
    pt.learn_homogeneous_head(ValueQueryOracle(random_single_head(2, seed=0)), verify=0)
    with pytest.raises(InvalidInputError):
        pt.learn_homogeneous_head(ValueQueryOracle(random_single_head(1, seed=0)), verify=0)


def test_factor_scored_head_answers_as_the_dense_head_to_rounding():
    from companion.attention import SingleHead

    head = pt.load_head(3, 2)
    dense = SingleHead(np.asarray(head.W), np.asarray(head.v))
    X = pt.homogeneous(np.random.default_rng(4).standard_normal((3, 6, 384)))
    y, y_dense = head(X), dense(X)
    np.testing.assert_allclose(y, y_dense, rtol=1e-12, atol=1e-12 * np.max(np.abs(y_dense)))
