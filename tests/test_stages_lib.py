"""Unit tests of the named stages of the §4-§6 learners (issue 34), and of the views they use.

Each stage of ``learn_low_rank``, ``learn_low_rank_noisy``, ``learn_multi_head_transformer`` and
``learn_single_head`` is a private function of its module; each is tested here on a small case with
real values (counts read from the oracle, shapes, the values the stage hands on).
"""

from __future__ import annotations

import numpy as np
import pytest

from companion.attention import OneLayerTransformer, SingleHead, random_single_head
from companion.errors import BudgetExceededError, InvalidInputError
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
