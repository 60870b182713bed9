"""Tests of companion.multihead._information: the Cramer-Rao bounds behind benchmarks/why_H_stops.py."""

import numpy as np
import pytest
from scipy.special import expit

from companion.multihead import _information as inf
from companion.numerics.rational import fit_rows_joint, polish_pairs, ratio_design
from companion.errors import InvalidInputError
from companion.multihead import random_multi_head
from companion.oracles import ValueQueryOracle


def test_pair_bound_is_the_spread_of_least_squares_under_noise_of_that_size():
    # Two heads, 8 samples: refit 400 noisy copies from the truth; the shifts' s.d. is the bound.
    s, gam, l, sigma = np.linspace(-3, 3, 8), np.array([1.0, -0.7]), np.array([-0.5, 1.2]), 1e-6
    bound = inf.pair_bound(s, gam[None], l[None], sigma)[0]
    rng = np.random.default_rng(0)
    G = expit(s[None, :, None] + l[None, None, :]) @ gam + sigma * rng.standard_normal((400, s.size))
    _, lh, _ = polish_pairs(s, G, np.repeat(gam[None], 400, 0), np.repeat(l[None], 400, 0), iters=50)
    spread = lh.std(axis=0)
    assert np.all(np.abs(spread / bound - 1) < 0.15), (spread, bound)
    assert np.all(bound > 1e-6) and np.all(bound < 1e-3)  # amplified, not lost, at H = 2


def test_pair_bound_with_the_amplitudes_known_is_never_larger():
    rng = np.random.default_rng(1)
    s = np.log(np.divide(*ratio_design(5)))
    gam, l = rng.standard_normal((20, 5)), 2.0 * rng.standard_normal((20, 5))
    free = inf.pair_bound(s, gam, l, 1e-15)
    fixed = inf.pair_bound(s, gam, l, 1e-15, fixed_gamma=True)
    assert np.all(fixed <= free * (1 + 1e-6))
    assert np.median(free / fixed) > 10  # and the amplitudes are what costs the free fit


def test_pair_bound_is_inf_for_a_head_the_samples_cannot_see():
    s = np.linspace(-2, 2, 4)
    # the second head has amplitude 0: its shift has no effect on the answers
    b = inf.pair_bound(s, np.array([[1.0, 0.0]]), np.array([[0.3, -0.2]]), 1e-12)
    assert np.isinf(b[0, 1]) or b[0, 1] > 1e6


def test_pair_bound_with_scaled_tokens_is_the_bound_of_the_scaled_shifts():
    # sigma(s + c l): the shift c l has the bound of an unscaled pair, so l's is that over c
    rng = np.random.default_rng(4)
    s, gam, l = np.linspace(-3, 3, 10), rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    for c in (0.5, 2.0):
        got = inf.pair_bound(s, gam, l, 1e-12, scales=np.full(s.size, c))
        # (to the SVD's rounding: these Jacobians have condition numbers up to about 1e10)
        assert np.allclose(got, inf.pair_bound(s, gam, c * l, 1e-12) / c, rtol=1e-4)
    mixed = inf.pair_bound(s, gam, l, 1e-12, scales=np.tile([0.5, 2.0], 5))
    assert np.all(np.isfinite(mixed)) and not np.allclose(mixed, inf.pair_bound(s, gam, l, 1e-12))
    with pytest.raises(InvalidInputError, match="scales must have the shape"):
        inf.pair_bound(s, gam, l, 1e-12, scales=np.ones(3))


def test_row_bound_is_the_spread_of_the_joint_fit_under_noise():
    rng = np.random.default_rng(2)
    s, X = np.log(np.divide(*ratio_design(2))), rng.standard_normal((8, 3))
    gam, R, sigma = np.array([1.0, -0.6]), rng.standard_normal((2, 3)), 1e-7
    bound = inf.row_bound(s, X, gam, R, sigma)
    G0 = expit(s[None, :, None] + (X @ R.T)[:, None, :]) @ gam
    N = 300
    G = G0[None] + sigma * rng.standard_normal((N,) + G0.shape)
    _, Rh, res, _ = fit_rows_joint(s, G, X, np.repeat(gam[None], N, 0), np.repeat(R[None], N, 0), iters=40)
    rms = np.sqrt(np.mean(np.sum((Rh - R) ** 2, axis=2), axis=0)) / np.linalg.norm(R, axis=1)
    assert np.all(np.abs(rms / bound - 1) < 0.2), (rms, bound)


def test_bounds_refuse_a_sigma_that_is_not_positive():
    for bad in (0.0, -1e-16, np.inf, np.nan):
        with pytest.raises(InvalidInputError, match="sigma="):
            inf.pair_bound(np.zeros(2), np.ones((1, 1)), np.zeros((1, 1)), bad)
        with pytest.raises(InvalidInputError, match="sigma="):
            inf.row_bound(np.zeros(2), np.ones((2, 1)), np.ones(1), np.ones((1, 1)), bad)
    with pytest.raises(InvalidInputError, match="same shape"):
        inf.pair_bound(np.zeros(2), np.ones((1, 2)), np.zeros((1, 1)), 1e-3)


def test_extended_answers_match_the_oracle_to_its_rounding():
    d, H = 8, 3
    model = random_multi_head(d, H, seed=3)
    rng = np.random.default_rng(3)
    X = 3 * rng.standard_normal((6, d)) / np.sqrt(d)
    U = X + np.eye(d)[0]
    n, m = ratio_design(H)
    ref = inf.extended_counts_answers(model, U, X, n, m)
    assert ref.dtype == np.longdouble and ref.shape == (6, n.size)
    oracle = ValueQueryOracle(model)
    got = np.array([[oracle(np.concatenate([np.repeat(U[k][None], a, 0), np.repeat(X[k][None], b, 0)]))
                     for a, b in zip(n, m)] for k in range(6)]) - (X @ model.vs.sum(axis=0))[:, None]
    err = np.abs(got - ref.astype(float))
    scale = np.max(np.abs(got)) + np.max(np.abs(X @ model.vs.T))
    assert np.max(err) <= 64 * np.finfo(float).eps * scale  # float64's rounding, no more
    assert np.max(np.abs((got - ref))) > 0  # and the reference is finer than float64


def test_extended_answers_refuse_without_a_wider_type(monkeypatch):
    monkeypatch.setattr(inf, "_EXTENDED", np.float64)
    with pytest.raises(InvalidInputError, match="no wider than float64"):
        inf.extended_counts_answers(random_multi_head(2, 1, seed=0), np.ones((1, 2)), np.ones((1, 2)),
                                    np.array([1]), np.array([1]))


def test_loewner_condition_is_finite_at_H_heads_and_blows_up_with_one_too_many():
    s_n, s_m = ratio_design(3)
    r = s_n / s_m
    gam, l = np.array([1.0, -0.8, 0.5]), np.array([-1.0, 0.2, 1.1])
    G = expit(np.log(r)[:, None] + l[None]) @ gam
    assert inf.loewner_condition(r, G[None], 3)[0] < 1e8
    # two heads only, interpolated with three terms: the Loewner matrix loses rank
    G2 = expit(np.log(r)[:, None] + l[None, :2]) @ gam[:2]
    assert inf.loewner_condition(r, G2[None], 3)[0] > 1e12


def test_counts_information_a_pair_knows_far_less_than_its_row():
    from companion.multihead import counts_information

    c = counts_information(16, 7, n_rows=1, basin=False)
    assert c["K / d"] > 1 and 0 < c["noise"] < 1e-14  # float64's rounding, measured
    assert c["row CRB"] < 1e-9 and c["pair CRB"] > 1e3 * c["row CRB"]
    assert c["fixed-gamma"] <= c["pair CRB"] and c["pair CRB all n/m"] <= c["pair CRB"]
    assert 0.0 <= c["pairs <= 0.01"] <= 1.0 and "basin min" not in c


def test_counts_information_checks_its_arguments():
    from companion.multihead import counts_information, counts_length_bounds

    with pytest.raises(InvalidInputError, match="n_rows"):
        counts_information(8, 2, n_rows=9)
    with pytest.raises(InvalidInputError, match="samples"):
        counts_length_bounds(8, 2, lengths=(5,), samples=(3,))  # fewer than 2H = 4
    with pytest.raises(InvalidInputError, match="lengths"):
        counts_length_bounds(8, 2, lengths=(2,), samples=(4,))
    assert len(counts_length_bounds(8, 2, lengths=(5,), samples=(4,))) == 1  # 4 = 2H: just inside
