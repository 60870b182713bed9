"""The multi-scale design's prototype pieces (companion.multihead._multiscale; benchmarks/multiscale_pairs.py)."""

import numpy as np
import pytest
from scipy.special import expit

from companion.multihead import _information as inf
from companion.multihead import _multiscale as ms
from companion.errors import InvalidInputError
from companion.multihead import random_multi_head
from companion.oracles import ValueQueryOracle


def _pair(H=2, seed=0):
    rng = np.random.default_rng(seed)
    n, m, c = inf.multiscale_counts(H)
    gam, l = rng.uniform(0.5, 1.5, H) * rng.choice([-1, 1], H), np.sort(rng.uniform(-2, 2, H))
    s = np.log(n / m)
    G = (expit(s[:, None] + c[:, None] * l[None]) @ gam)[None]
    return s, c, G, gam, l


def test_multiscale_counts_keep_the_routes_count_and_length_and_need_one_sample_per_scale():
    for H in (2, 5, 12):
        n, m, c = inf.multiscale_counts(H)
        assert n.size <= 2 * H and int((n + m).max()) <= 2 * H + 1 and set(c) == {0.5, 1.0, 2.0, 4.0}
    n, m, c = inf.multiscale_counts(2)  # just inside: one ratio per scale
    assert n.size == 4 and np.unique(n / m).size == 1
    with pytest.raises(InvalidInputError, match="H=1"):  # just outside: 2H = 2 < 4 scales
        inf.multiscale_counts(1)
    s, c = inf.multiscale_design(12)
    assert s.size == c.size == 24


def test_a_scaled_token_scales_the_shifts_and_keeps_the_amplitudes():
    d, H = 6, 3
    model = random_multi_head(d, H, seed=1)
    oracle = ValueQueryOracle(model)
    rng = np.random.default_rng(0)
    X, delta = rng.standard_normal((4, d)), rng.standard_normal(d)
    n, m, c = inf.multiscale_counts(4)
    bX = X @ model.vs.sum(axis=0)
    G = ms.ask_multiscale(oracle, delta, X, n, m, c, bX)
    gam = model.vs @ delta
    L = X @ np.einsum("e,hef->hf", delta, model.Ws).T
    want = np.einsum("kth,h->kt", expit(np.log(n / m)[None, :, None] + c[None, :, None] * L[:, None, :]), gam)
    assert np.max(np.abs(G - want)) < 1e-12
    sd = ms.multiscale_sigma(model, delta, X, n, m, c, G)
    assert sd.shape == c.shape and np.all(sd > 0) and np.all(sd < 1e-13)
    assert np.all(sd[c == 4.0] == sd[c == 4.0][0])  # pooled per scale


def test_the_scale_2c_samples_are_the_scale_c_function_on_the_imaginary_axis():
    rng = np.random.default_rng(3)
    g, l = rng.standard_normal(5), 3 * rng.standard_normal(5)
    for c, rho in [(0.5, 0.3), (1.0, 2.0), (2.0, 7.0)]:
        assert np.isclose(ms.alias(g, l, c, rho), g @ expit(2 * np.log(rho) + 2 * c * l), rtol=1e-12, atol=1e-12)
        # not the scale-c samples themselves (the identity is about the doubled scale)
        assert not np.isclose(ms.alias(g, l, c, rho), g @ expit(2 * np.log(rho) + c * l), rtol=1e-6)


def test_polish_scaled_recovers_a_pair_from_a_near_start_and_keeps_fixed_amplitudes():
    s, c, G, gam, l = _pair()
    g, lh, res = ms.polish_scaled(s, c, G, gam[None] * 1.05, l[None] + 0.1, iters=100)
    assert np.max(np.abs(lh[0] - l)) < 1e-8 and np.max(np.abs(g[0] - gam)) < 1e-8 and res[0] < 1e-13
    g, lh, res = ms.polish_scaled(s, c, G, gam[None], l[None] + 0.1, iters=100, fixed_gamma=True)
    assert np.array_equal(g[0], gam) and np.max(np.abs(lh[0] - l)) < 1e-8


def test_the_global_searches_find_an_easy_pair():
    s, c, G, gam, l = _pair()
    g, lh, res = ms.varpro_multistart(s, c, G, 2, starts=16)
    assert np.max(np.abs(lh[0] - l)) < 1e-6 and np.max(np.abs(g[0] - gam)) < 1e-6
    # the coordinate search is a start, not a solver: from it the polish finds these terms, while
    # for _pair()'s amplitudes (-1.14, -0.77) it stops at a misfit of 1.5e-2 (measured)
    gam, l = np.array([1.2, -0.7]), np.array([-1.93, 1.25])
    G = (expit(s[:, None] + c[:, None] * l[None]) @ gam)[None]
    g, lh = ms.coordinate_pairs(s, c, G, 2)
    assert np.all(np.isin(lh[0], np.linspace(-15, 15, 3001)))  # grid points: a start only
    g, lh, res = ms.polish_scaled(s, c, G, g, lh, iters=200)  # a start: the polish finishes it
    assert np.max(np.abs(lh[0] - l)) < 1e-8 and np.max(np.abs(g[0] - gam)) < 1e-8


def test_a_pairs_multiscale_samples_can_have_two_exact_solutions():
    # 2H samples for 2H unknowns and no interpolation identity: at H = 2 (one ratio per scale) the
    # terms (1, 0.5) at (-0.5, 0.5) and the polish's answer from the coordinate start both fit to
    # rounding, far apart; the route's design (one rational function) has a unique interpolant.
    n, m, c = inf.multiscale_counts(2)
    s = np.log(n / m)
    gam, l = np.array([1.0, 0.5]), np.array([-0.5, 0.5])
    G = (expit(s[:, None] + c[:, None] * l[None]) @ gam)[None]
    g, lh, res = ms.polish_scaled(s, c, G, *ms.coordinate_pairs(s, c, G, 2), iters=200)
    assert res[0] < 1e-15 and np.max(np.abs(np.sort(lh[0]) - l)) > 0.1
    assert np.max(np.abs(expit(s[:, None] + c[:, None] * lh[0][None]) @ g[0] - G[0])) < 1e-15


def test_pair_bound_takes_one_sigma_per_sample():
    rng = np.random.default_rng(5)
    s, gam, l = np.linspace(-3, 3, 8), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    one = inf.pair_bound(s, gam, l, 1e-12)
    assert np.allclose(inf.pair_bound(s, gam, l, np.full(8, 1e-12)), one, rtol=1e-10)
    sd = np.full(8, 1e-12)
    sd[4:] = 1e-9  # half the samples far noisier: the bound grows, but less than the noise
    worse = inf.pair_bound(s, gam, l, sd)
    assert np.all(worse > one) and np.all(worse < 1e3 * one)
    with pytest.raises(InvalidInputError, match="one per"):
        inf.pair_bound(s, gam, l, np.full(7, 1e-12))
    with pytest.raises(InvalidInputError, match="positive"):
        inf.pair_bound(s, gam, l, np.r_[np.full(7, 1e-12), 0.0])


def test_multiscale_pair_starts_measures_both_designs_and_checks_its_sizes():
    from companion.multihead import multiscale_pair_starts, rational_plan

    rows = {r["start"]: r for r in multiscale_pair_starts(8, 2, n_pairs=6, starts=8)}  # H = 2: just inside
    assert rows["route (Loewner + LM)"]["median shift err"] < 1e-10 and rows["route (Loewner + LM)"]["real poles"] == 1
    assert rows["ms CRB (perfect solver)"]["median shift err"] < 1e-10
    assert rows["ms basin 0.001"]["shift <= 1e-6"] == 1.0  # two heads: every local fit finishes
    assert {"ms varpro x8", "ms greedy + CD + LM", "route fixed-gamma basin 1", "ms fixed-gamma basin 0.3"} <= set(rows)
    K = rational_plan(8, 2)["K"]
    for kw, name in [({"H": 1}, "H=1"), ({"row": 8}, "row=8"), ({"n_pairs": K + 1}, f"n_pairs={K + 1}"),
                     ({"starts": 0}, "starts=0")]:
        args = {"d": 8, "H": 2, "n_pairs": 2, **kw}
        with pytest.raises(InvalidInputError, match=name):
            multiscale_pair_starts(args.pop("d"), args.pop("H"), **args)
    assert len(multiscale_pair_starts(8, 2, row=7, n_pairs=K, starts=1)) == 14  # just inside each bound
