"""The single-head regressor of §3 against a direct per-sequence implementation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.attention import MultiHead, SingleHead, attention_weights, random_single_head
from companion.errors import InvalidInputError


def reference(W, v, X):
    """f_{W,v}(X) for one sequence, written the slow, obvious way (exp of shifted scores)."""
    s = np.array([x @ W @ X[-1] for x in X])
    a = np.exp(s - s.max())
    a /= a.sum()
    return float(a @ (X @ v))


def test_matches_reference_on_batches_and_lists():
    rng = np.random.default_rng(0)
    head = random_single_head(5, seed=1)
    X = rng.standard_normal((7, 4, 5))
    expected = [reference(head.W, head.v, x) for x in X]
    np.testing.assert_allclose(head(X), expected, rtol=1e-13, atol=1e-13)
    seqs = [rng.standard_normal((n, 5)) for n in (1, 3, 3, 6, 2)]
    np.testing.assert_allclose(head(seqs), [reference(head.W, head.v, x) for x in seqs],
                               rtol=1e-13, atol=1e-13)
    assert isinstance(head(X[0]), float)
    assert head(X[0]) == pytest.approx(expected[0], rel=1e-13)


def test_length_one_returns_x_dot_v():
    head = random_single_head(4, seed=2)
    x = np.array([[0.5, -1.0, 2.0, 0.25]])
    assert head(x) == pytest.approx(float(x[0] @ head.v), rel=1e-15)


def test_known_value_two_tokens():
    # W = 0: equal scores, the output is the mean of x_i^T v.
    head = SingleHead(np.zeros((2, 2)), np.array([1.0, 3.0]))
    assert head(np.array([[1.0, 0.0], [0.0, 1.0]])) == 2.0
    # W = log(3) e1 e1^T with x_N = e1: scores (log 3, 0) -> weights (3/4, 1/4) on (x_1, x_2) = (e1, e2)?
    W = np.zeros((2, 2))
    W[0, 0] = np.log(3.0)
    head = SingleHead(W, np.array([1.0, 3.0]))
    # X = [e1; e1]: both scores log 3 -> mean of v_1, v_1 = 1
    assert head(np.array([[1.0, 0.0], [1.0, 0.0]])) == pytest.approx(1.0)
    # X = [e2; e1]: scores (e2^T W e1, e1^T W e1) = (0, log 3) -> weights (1/4, 3/4)
    assert head(np.array([[0.0, 1.0], [1.0, 0.0]])) == pytest.approx(0.25 * 3.0 + 0.75 * 1.0)


def test_softmax_is_stable_for_huge_scores():
    head = SingleHead(1e6 * np.eye(3), np.array([1.0, 2.0, 3.0]))
    X = np.array([[10.0, 0, 0], [0, 0, 10.0], [0, 0, 1.0]])
    y = head(X)
    assert np.isfinite(y) and y == pytest.approx(X[1] @ head.v)  # all weight on token 2
    a = attention_weights(X[None], head.W)
    assert np.all(np.isfinite(a)) and a[0, 1] == 1.0


def test_from_native_merges_parameters():
    rng = np.random.default_rng(3)
    Q, K, V = (rng.standard_normal((2, 4)) for _ in range(3))
    w_o = rng.standard_normal(2)
    head = SingleHead.from_native(Q, K, V, w_o)
    np.testing.assert_allclose(head.W, K.T @ Q)
    np.testing.assert_allclose(head.v, V.T @ w_o)
    X = rng.standard_normal((3, 4))
    q, keys, vals = Q @ X[-1], X @ K.T, X @ V.T
    a = np.exp(keys @ q - (keys @ q).max())
    assert head(X) == pytest.approx(float(w_o @ vals.T @ (a / a.sum())), rel=1e-13)
    with pytest.raises(InvalidInputError, match=r"K must have shape \(2, 4\)"):
        SingleHead.from_native(Q, K[:, :3], V, w_o)


def test_parameters_are_copied_and_frozen():
    W = np.eye(2)
    head = SingleHead(W, np.ones(2))
    W[0, 0] = 5.0
    assert head.W[0, 0] == 1.0
    with pytest.raises(ValueError):
        head.W[0, 0] = 2.0


def test_random_single_head_rank_norm_seed():
    h = random_single_head(8, rank=3, W_norm=2.5, v_norm=0.5, seed=4)
    assert h.rank == 3
    assert np.linalg.norm(h.W) == pytest.approx(2.5)
    assert np.linalg.norm(h.v) == pytest.approx(0.5)
    np.testing.assert_array_equal(h.W, random_single_head(8, rank=3, W_norm=2.5, v_norm=0.5, seed=4).W)
    assert not np.array_equal(h.W, random_single_head(8, rank=3, W_norm=2.5, v_norm=0.5, seed=5).W)
    Q, K, V, w_o = h.native
    np.testing.assert_allclose(K.T @ Q, h.W, rtol=1e-12, atol=1e-14)
    assert random_single_head(1, seed=0).d == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"d": 2.5}, r"d must be an integer; got 2\.5"),
    ({"d": 0}, r"d=0 must be >= 1"),
    ({"d": True}, r"d must be an integer"),
    ({"d": 4, "rank": 5}, r"rank=5 must be <= 4"),
    ({"d": 4, "W_norm": -1.0}, r"W_norm=-1\.0 must be >= 0"),
    ({"d": 4, "v_norm": float("nan")}, r"v_norm=nan must be finite"),
])
def test_random_single_head_rejects_bad_input(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        random_single_head(**kwargs, seed=0)


@pytest.mark.parametrize("W, v, message", [
    (np.zeros((2, 3)), np.zeros(2), r"W must be square"),
    (np.zeros((2, 2)), np.zeros(3), r"v must have shape \(2\)"),
    (np.array([[np.nan, 0], [0, 0]]), np.zeros(2), r"W contains NaN or inf"),
    (np.zeros((2, 2)), np.array([np.inf, 0]), r"v contains NaN or inf"),
    (np.zeros((0, 0)), np.zeros(0), r"d=0"),
])
def test_single_head_rejects_bad_parameters(W, v, message):
    with pytest.raises(InvalidInputError, match=message):
        SingleHead(W, v)


@pytest.mark.parametrize("X, message", [
    (np.zeros((2, 3)), r"last axis d=2"),
    (np.zeros((0, 2)), r"length N=0"),
    (np.zeros((0, 2, 2)), r"empty batch"),
    (np.zeros(2), r"2 or 3 dimensions"),
    ([], r"empty list"),
    ([np.zeros((1, 2)), np.zeros((0, 2))], r"X\[1\] is an empty sequence"),
    (np.array([[0.0, np.nan]]), r"X contains NaN or inf"),
    ([["a", "b"]], r"X\[0\] must be a real array"),
])
def test_call_rejects_bad_queries(X, message):
    with pytest.raises(InvalidInputError, match=message):
        SingleHead(np.eye(2), np.ones(2))(X)


def test_multihead_is_the_sum_of_its_heads():
    h1, h2 = random_single_head(3, seed=1), random_single_head(3, seed=2)
    mh = MultiHead(np.stack([h1.W, h2.W]), np.stack([h1.v, h2.v]))
    X = np.random.default_rng(0).standard_normal((5, 4, 3))
    np.testing.assert_allclose(mh(X), h1(X) + h2(X), rtol=1e-14)
    assert mh.n_heads == 2 and len(mh.heads) == 2


@settings(max_examples=50, deadline=None)
@given(d=st.integers(1, 6), n=st.integers(1, 6), seed=st.integers(0, 2**31),
       log_scale=st.floats(-3, 2))
def test_property_permuting_context_tokens_changes_nothing(d, n, seed, log_scale):
    rng = np.random.default_rng(seed)
    head = random_single_head(d, W_norm=10.0**log_scale * d, seed=seed % 1000)
    X = rng.standard_normal((n, d))
    perm = np.concatenate([rng.permutation(n - 1), [n - 1]])
    assert head(X[perm]) == pytest.approx(head(X), rel=1e-12, abs=1e-12)
    assert head(X) == pytest.approx(reference(head.W, head.v, X), rel=1e-11, abs=1e-11)
    # the output is a convex combination of the token values
    vals = X @ head.v
    assert vals.min() - 1e-12 <= head(X) <= vals.max() + 1e-12


def test_large_batches_with_shared_query_tokens_match_the_reference():
    """Batches of >= 64 sequences compute W x_N once per distinct last token; results must not change."""
    rng = np.random.default_rng(11)
    head = random_single_head(6, seed=3)
    X = rng.standard_normal((150, 3, 6))
    X[:, -1, :] = rng.standard_normal((5, 6))[rng.integers(0, 5, size=150)]   # 5 distinct query tokens
    X[7, -1, 0] = -0.0 if X[7, -1, 0] == 0 else X[7, -1, 0]
    np.testing.assert_allclose(head(X), [reference(head.W, head.v, x) for x in X], rtol=1e-13, atol=1e-13)
    Y = rng.standard_normal((100, 2, 6))                                       # all distinct
    np.testing.assert_allclose(head(Y), [reference(head.W, head.v, y) for y in Y], rtol=1e-13, atol=1e-13)
