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
    # a user's finding: a complex W lost its imaginary part with only numpy's ComplexWarning
    (np.eye(2) * (1 + 1j), np.zeros(2), r"W must be a real array; got a complex one \(complex128\).*W\.real"),
    (np.eye(2), [1j, 0], r"v must be a real array; got a complex one"),
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
    (np.ones((1, 2), dtype=np.complex64), r"X must be a real array; got a complex one \(complex64\)"),
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


# --- FactoredHead: the native form, never a d x d matrix ------------------------------------------

def test_factored_head_is_the_dense_head_of_the_same_draws():
    from companion.attention import FactoredHead

    rng = np.random.default_rng(3)
    dense = random_single_head(9, rank=3, seed=4)
    fact = random_single_head(9, rank=3, factored=True, seed=4)
    assert isinstance(fact, FactoredHead) and fact.r == 3 and fact.d == 9
    assert np.array_equal(fact.W, dense.W) and np.array_equal(fact.v, dense.v)
    X = rng.standard_normal((70, 3, 9))
    np.testing.assert_allclose(fact(X), [reference(dense.W, dense.v, x) for x in X], rtol=1e-12, atol=1e-13)
    seqs = [rng.standard_normal((n, 9)) for n in (1, 2, 5)]
    np.testing.assert_allclose(fact(seqs), dense(seqs), rtol=1e-12, atol=1e-13)
    assert fact.rank == 3 and fact.to_single_head().rank == 3
    # with W_norm: the factored norm comes from r x r Gram matrices
    a = random_single_head(9, rank=3, W_norm=2.5, factored=True, seed=4)
    assert np.linalg.norm(a.W) == pytest.approx(2.5, rel=1e-13)
    b = random_single_head(9, rank=3, W_norm=2.5, seed=4)
    np.testing.assert_allclose(a.W, b.W, rtol=1e-13, atol=1e-14)


def test_factored_head_rank_counts_dependent_factors():
    from companion.attention import FactoredHead

    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((3, 4, 10))
    K[3] = K[0] + K[1]                                  # K rank 3: W = K^T Q has rank 3
    head = FactoredHead(Q, K, V, np.ones(4))
    assert head.rank == 3 == np.linalg.matrix_rank(head.W)
    K[3] = K[0] + K[1] + 1e-3 * rng.standard_normal(10)  # just outside: rank 4 again
    assert FactoredHead(Q, K, V, np.ones(4)).rank == 4


def test_factored_head_never_forms_a_d_by_d_matrix():
    import tracemalloc

    d, r = 4096, 4
    tracemalloc.start()
    head = random_single_head(d, rank=r, factored=True, seed=0)
    y = head(np.random.default_rng(0).standard_normal((8, 2, d)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert y.shape == (8,)
    assert peak < 8 * d * d / 64                       # a d x d float64 matrix would be 128 MB
    assert max(a.size for a in head.native) == r * d


@pytest.mark.parametrize("kwargs, message", [
    ({"Q": np.ones((2, 3)), "K": np.ones((2, 4)), "V": np.ones((2, 3)), "w_o": np.ones(2)}, "K must have shape"),
    ({"Q": np.ones((2, 3)), "K": np.ones((2, 3)), "V": np.ones((2, 3)), "w_o": np.ones(3)}, "w_o must have shape"),
    ({"Q": np.ones((0, 3)), "K": np.ones((0, 3)), "V": np.ones((0, 3)), "w_o": np.ones(0)}, "r, d >= 1"),
])
def test_factored_head_rejects_bad_shapes(kwargs, message):
    from companion.attention import FactoredHead

    with pytest.raises(InvalidInputError, match=message):
        FactoredHead(**kwargs)
    with pytest.raises(InvalidInputError, match="factored must be True or False"):
        random_single_head(4, factored="yes", seed=0)


@pytest.mark.parametrize("n_runs", [1, 16, 17, 40, 200])
def test_dense_head_with_shared_query_tokens_matches_reference(n_runs):
    # Runs of equal last tokens take the fused path (<= 16 runs), the repeat path (<= B/2 runs)
    # or the plain product; all agree with the reference.
    rng = np.random.default_rng(n_runs)
    head = random_single_head(6, seed=1)
    B = 200
    X = rng.standard_normal((B, 2, 6))
    owner = np.sort(rng.integers(0, n_runs, B)) if n_runs < B else np.arange(B)
    X[:, 1, :] = rng.standard_normal((max(n_runs, 1), 6))[owner]
    np.testing.assert_allclose(head(X), [reference(head.W, head.v, x) for x in X], rtol=1e-12, atol=1e-13)
