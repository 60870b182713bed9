"""Tests of companion.ffn: kink search, canonical form, sign resolution, FFN extraction."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from companion.ffn import (
    FeedForward,
    align_networks,
    bits_of_precision,
    canonical_form,
    find_kinks,
    learn_ffn,
    random_feedforward,
    resolve_signs,
)
from companion.oracles import ValueQueryOracle


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-0.95, 0.95), min_size=1, max_size=6, unique=True),
       st.lists(st.floats(0.2, 3.0), min_size=6, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6))
def test_find_kinks_locates_every_kink_to_float_precision(locs, mags, neg):
    locs = np.array(sorted(locs))
    if len(locs) > 1 and np.min(np.diff(locs)) < 1e-3:
        return
    w = np.array(mags[: len(locs)]) * np.where(neg[: len(locs)], -1.0, 1.0)

    def g(t):
        return 0.3 * t + np.abs(t[:, None] - locs[None, :]) @ w

    kinks, n = find_kinks(g, -1.0, 1.0, scale=float(np.sum(np.abs(w)) + 1))
    assert kinks.shape == locs.shape
    assert np.max(np.abs(kinks - locs)) < 1e-12
    assert n < 40 * len(locs) + 10


def test_find_kinks_on_a_linear_function_finds_none():
    kinks, n = find_kinks(lambda t: 2.0 * t - 1.0, -1.0, 1.0, scale=1.0)
    assert kinks.size == 0 and n == 5


def test_find_kinks_gives_up_on_a_smooth_function():
    with pytest.raises(OracleInconsistentError, match="not piecewise linear"):
        find_kinks(lambda t: np.sin(5 * t), -1.0, 1.0, scale=1.0, max_evals=500)


def test_canonical_form_quotients_rescaling_and_permutation():
    net = random_feedforward(5, 7, seed=0)
    k = np.random.default_rng(1).uniform(0.1, 10, size=7)
    perm = np.random.default_rng(2).permutation(7)
    A1, w1 = canonical_form(net.A, net.w_o)
    A2, w2 = canonical_form((net.A * k)[:, perm], (net.w_o / k)[perm])
    assert np.allclose(A1, A2, atol=1e-14) and np.allclose(w1, w2, atol=1e-14)
    assert np.allclose(np.linalg.norm(A1, axis=0), 1.0)


def test_canonical_form_drops_zero_neurons_and_merges_parallel_ones():
    A = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    A_c, w_c = canonical_form(A, np.array([1.0, 0.5, 0.0]))
    assert A_c.tolist() == [[1.0], [0.0]] and w_c.tolist() == [2.0]


def test_align_networks_reports_width_mismatch():
    net = random_feedforward(3, 4, seed=0)
    err = align_networks(net.A[:, :3], net.w_o[:3], net.A, net.w_o)
    assert err["matched"] is False and err["direction_error"] == float("inf")


def test_bits_of_precision():
    assert bits_of_precision([1.0, 2.0 + 2.0**-30], [1.0, 2.0]) == 31.0
    assert bits_of_precision([1.0], [1.0]) == float("inf")


def test_resolve_signs_lstsq_and_milp_agree_with_truth():
    rng = np.random.default_rng(0)
    d, m = 6, 10
    U = rng.standard_normal((d, m))
    U /= np.linalg.norm(U, axis=0)
    c = rng.standard_normal(m)
    s_true = rng.choice([-1.0, 1.0], size=m)
    s, info = resolve_signs(U, c, (U * c) @ s_true)
    assert info["method"] == "milp" and info["status"] == "solved"
    assert np.array_equal(s, s_true)
    s2, info2 = resolve_signs(U[:, :4], c[:4], (U[:, :4] * c[:4]) @ s_true[:4])
    assert info2["method"] == "lstsq" and np.array_equal(s2, s_true[:4])


def test_resolve_signs_rejects_an_unreachable_linear_part():
    U = np.eye(3)[:, :2]
    with pytest.raises(OracleInconsistentError, match="linear part"):
        resolve_signs(U, np.array([1.0, 1.0]), np.array([1.0, 1.0, 1.0]))


@pytest.mark.parametrize("d,m", [(4, 2), (8, 8), (12, 6), (6, 12)])
def test_learn_ffn_recovers_the_canonical_network(d, m):
    net = random_feedforward(d, m, seed=d * m)
    oracle = ValueQueryOracle(net)
    rec = learn_ffn(oracle, seed=3)
    err = align_networks(rec.A, rec.w_o, net.A, net.w_o)
    assert err["matched"] and rec.A.shape == (d, m)
    assert err["direction_error"] < 1e-11 and err["weight_error"] < 1e-10
    assert rec.n_queries == oracle.n_queries
    assert rec.n_queries <= 14 * m * d + 2 * d + 64 + 40 * m
    x = np.random.default_rng(5).standard_normal((500, d))
    assert bits_of_precision(rec.network.forward(x), net.forward(x)) > 40


def test_learn_ffn_without_milp_time_returns_an_equivalent_wider_network():
    net = random_feedforward(4, 12, seed=1)
    rec = learn_ffn(ValueQueryOracle(net), milp_time_limit=1e-6, seed=0)
    if rec.diagnostics["signs_status"] == "solved":   # HiGHS may finish in presolve
        assert rec.A.shape[1] == 12
    else:
        assert rec.A.shape[1] == 14
    x = np.random.default_rng(0).standard_normal((300, 4))
    assert bits_of_precision(rec.network.forward(x), net.forward(x)) > 40


def test_learn_ffn_zero_network_is_not_identifiable():
    net = FeedForward(np.ones((3, 2)), np.zeros(2))
    with pytest.raises(NotIdentifiableError, match="answered 0"):
        learn_ffn(ValueQueryOracle(net))


def test_learn_ffn_rejects_bad_options_before_querying():
    oracle = ValueQueryOracle(random_feedforward(3, 2, seed=0))
    with pytest.raises(InvalidInputError, match="signs='x'"):
        learn_ffn(oracle, signs="x")
    with pytest.raises(InvalidInputError, match="max_planes=0"):
        learn_ffn(oracle, max_planes=0)
    assert oracle.n_queries == 0


def test_learn_ffn_detects_a_network_with_biases():
    class Biased:
        d = 3

        def __call__(self, X):
            return np.maximum(X[:, 0, :] @ np.array([1.0, -1.0, 0.5]) + 0.3, 0.0)

    with pytest.raises(OracleInconsistentError):
        learn_ffn(ValueQueryOracle(Biased()), max_planes=1)


def test_feedforward_reads_one_token_only():
    net = random_feedforward(2, 3, seed=0)
    with pytest.raises(InvalidInputError, match="one token"):
        net(np.zeros((2, 2)))


def test_merge_neurons_threshold_just_inside_and_outside():
    """Two kinks on one hyperplane are one neuron when |u_i^T u_j| > 1 - 1e-6, two below."""
    from companion.ffn import _merge_neurons

    def pair(cos):
        u = np.array([1.0, 0.0, 0.0])
        w = np.array([cos, np.sqrt(1.0 - cos**2), 0.0])
        return np.stack([u, w], axis=1), np.array([1.0, 2.0]), np.array([0.5, 1.0])

    for gap, n_kept in [(0.5e-6, 1), (0.9e-6, 1), (1.1e-6, 2), (2e-6, 2)]:
        U, c, q = _merge_neurons(*pair(1.0 - gap))
        assert U.shape[1] == n_kept, gap
        if n_kept == 1:                                    # the better-quality kink is kept
            assert c.tolist() == [2.0]


@pytest.mark.parametrize("d, m", [(8, 16), (16, 8), (32, 16)])
def test_the_query_count_the_docstring_states(d, m):
    """learn_ffn's docstring: n_learning_queries is 5.9 to 8.7 times m d on random bias-free networks
    (issue 19, item 24: it used to say about (m + 2)(d + 1), which is 4.5 to 6.8 times too few)."""
    for seed in range(3):
        rec = learn_ffn(ValueQueryOracle(random_feedforward(d, m, seed=seed)), seed=seed)
        per_md = rec.n_learning_queries / (m * d)
        assert 5.9 <= round(per_md, 2) <= 8.7, (d, m, seed, rec.n_learning_queries)
        assert rec.n_learning_queries > 4 * (m + 2) * (d + 1)
        assert rec.n_queries - rec.n_learning_queries == rec.diagnostics["n_verify_queries"]
