"""The multi-scale design of the counts route: a prototype per-pair solver (this book's own; not wired in).

Private prototype (issue 21 item 3; ``benchmarks/multiscale_pairs.py`` measures it; the design is the
lead that ``benchmarks/why_H_stops.py`` left). A query of ``n`` copies of ``c x + delta`` then ``m``
copies of ``c x`` answers, minus ``c x^T sum_h v_h``,

    G(s, c) = sum_h gamma_h sigma(s + c l_h),   s = log(n / m),   gamma_h = delta^T v_h,   l_h = delta^T W_h x,

so the token's scale ``c`` scales every shift and leaves the amplitudes alone; a pair's ``2 H`` queries
are split over the scales ``c = 0.5, 1, 2, 4`` (:func:`companion.multihead._information.multiscale_counts`: the
count and the longest query of the route's design). The samples at one scale are no longer enough for
an interpolation (``H / 2`` of them for ``2 H`` unknowns), so a per-pair solver must be global over all
scales. What this module tries (batched over pairs):

* :func:`varpro_multistart`: variable projection (the amplitudes eliminated by least squares)
  Levenberg-Marquardt from random shift vectors;
* :func:`coordinate_pairs`: matching pursuit over a grid of shifts, then cyclic coordinate descent
  with each head moved to its grid-global optimum given the others, then :func:`polish_scaled`.

Measured (``benchmarks/multiscale_pairs.py``, d = 64, row 0 of the learner's design, all its pairs, seed
0, 2026-12-01): neither finds a pair's terms, at H = 10 or 12 (0 of 117 or 118 pairs within 1e-2), and
the reason is local: from the TRUE amplitudes and the true shifts moved by 1e-2, 300 steps of Levenberg-
Marquardt bring 7.6 % (H = 10) and 0 % (H = 12) of the pairs back to 1e-6 (from 1e-3: 24 % and 3 %). A
1e-2 change of the shifts changes the answers by about 1e-9 relative (the misfit there is 1e-11): the
valley is flat, and a local method finishes only from about 1e-3. Yet the information is there: a
perfect per-pair solver (the Cramer-Rao bound with each scale's measured rounding,
:func:`companion.multihead._information.pair_bound`) would give each head within 1e-2 at 1.47 d / 1.44 d tokens at
H = 12 (rows 0 / 1; a head's start row needs more than d, the route's design gives 0.55 d / 0.70 d) and
1.7 d / 1.5 d at H = 10. And 2 H samples for 2 H unknowns, with no interpolation identity behind them,
need not have one solution: at H = 2 two term sets (amplitudes 1, 0.5 at shifts -0.5, 0.5; and 0.60,
0.91 at -0.80, 0.23) fit the four samples to rounding (``tests/test_multiscale.py``), while the route's
design is one rational function with a unique interpolant. With the amplitudes known (a row's pairs
share them) the multi-scale pair is better posed than the route's (shifts 0.1 off: 53 % of pairs back to
1e-6 against 5.1 % at H = 10; 21 % against 0 at H = 12), but a start 0.1 off in every head is what no
search here reached. So the design alone does not give H = 12, and it is not wired into
:func:`companion.multihead.learn_canonical_rational`.

An identity for an algebraic solver (not built; :func:`alias`, tested): with ``F_c(z) = sum_h
gamma_h z / (z + exp(-c l_h))``, the scale-``c`` samples are ``F_c(r)`` at ``r = n / m`` and

    G(2 log rho, 2 c) = Re F_c(i rho),

the scale ``2 c`` sees the scale-``c`` rational function on the imaginary axis (``4 c``: the mean of
``F_c`` at the four points ``z^4 = -rho^4``); the denominators across scales are Graeffe root-squaring
iterates of one another (poles ``q, q^2, q^4, q^8``, ``q = exp(-l / 2)``). The equations are then
quadratic, not linear, in the interpolant's coefficients: no Loewner null vector solves them.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import expit

from ..numerics.rational import interpolate_pairs, polish_pairs
from ..oracles import ValueQueryOracle
from ._information import extended_counts_answers, multiscale_counts, pair_bound

__all__ = [
    "alias",
    "ask_multiscale",
    "coordinate_pairs",
    "multiscale_counts",
    "multiscale_sigma",
    "pair_starts",
    "polish_scaled",
    "varpro_multistart",
    "varpro_pairs",
]

#: Shifts are kept within this bound (log r units): beyond it a term is flat at every sample.
_SHIFT_CLIP = 60.0


def ask_multiscale(oracle, delta, X, n, m, c, bX):
    """``G[k, t] = VQ(n_t copies of c_t x_k + delta, then m_t copies of c_t x_k) - c_t x_k^T v``.

    ``X`` (K, d), ``n, m, c`` (S,), ``bX`` (K,) ``= X @ sum_h v_h``; returns (K, S). One oracle call
    per query (all K tokens batched)."""
    K, d = X.shape
    out = np.empty((K, n.size))
    for t, (a, b, ct) in enumerate(zip(n, m, c)):
        Q = np.empty((K, a + b, d))
        Q[:, :a] = ct * X[:, None] + delta
        Q[:, a:] = ct * X[:, None]
        out[:, t] = np.asarray(oracle(Q), float) - ct * bX
    return out


def multiscale_sigma(model, delta, X, n, m, c, G):
    """Each sample's rounding s.d. (S,): the float64 answers ``G`` (:func:`ask_multiscale`) against the
    same in extended precision, pooled over the tokens per scale (at least ``eps max |G|``). Raises
    InvalidInputError where numpy's longdouble is no wider than float64 (extended_counts_answers)."""
    exact = np.stack(
        [
            np.asarray(extended_counts_answers(model, ct * X + delta, ct * X, n[t : t + 1], m[t : t + 1]), float)[:, 0]
            for t, ct in enumerate(c)
        ],
        axis=1,
    )
    floor = np.finfo(float).eps * float(np.max(np.abs(G)))
    sd = np.empty(c.size)
    for ct in np.unique(c):
        sd[c == ct] = max(float(np.std(G[:, c == ct] - exact[:, c == ct])), floor)
    return sd


def alias(gamma, l, c, rho):
    """``Re F_c(i rho)`` for ``F_c(z) = sum_h gamma_h z / (z + exp(-c l_h))``: equal to the scale-``2c``
    sample ``sum_h gamma_h sigma(2 log rho + 2 c l_h)`` (the identity of the module docstring).

    >>> import numpy as np
    >>> from scipy.special import expit
    >>> g, l = np.array([1.0, -0.4]), np.array([0.3, -1.2])
    >>> bool(np.isclose(alias(g, l, 1.0, 0.7), g @ expit(2 * np.log(0.7) + 2 * l)))
    True
    """
    z = 1j * rho
    return float(np.real(np.sum(gamma * z / (z + np.exp(-c * np.asarray(l))))))


def _parts(s, c, G, gamma, l):
    Z = expit(s[None, :, None] + c[None, :, None] * l[:, None, :])  # (P, S, H)
    return Z, np.einsum("psh,ph->ps", Z, gamma) - G


def _solve(A, g):
    with np.errstate(all="ignore"):
        try:
            return np.linalg.solve(A, g[..., None])[..., 0]
        except np.linalg.LinAlgError:
            return np.einsum("pij,pj->pi", np.linalg.pinv(A), g)


def polish_scaled(s, c, G, gamma, l, *, iters=60, fixed_gamma=False):
    """Levenberg-Marquardt on ``G[p, t] = sum_h gamma_h sigma(s_t + c_t l_h)``, batched over rows ``p``.

    ``s, c`` (S,), ``G`` (P, S), ``gamma, l`` (P, H) the start; with ``fixed_gamma`` only the shifts
    move. Returns ``gamma, l`` (P, H) and the rms misfit per row (P,)."""
    P, H = gamma.shape
    theta = np.concatenate([gamma, l], axis=1).astype(float)
    mu = np.full(P, 1e-3)
    free = slice(H, 2 * H) if fixed_gamma else slice(0, 2 * H)
    ii = np.arange(H if fixed_gamma else 2 * H)
    Z, res = _parts(s, c, G, theta[:, :H], theta[:, H:])
    cost = np.sum(res**2, axis=1)
    for _ in range(iters):
        B = theta[:, None, :H] * c[None, :, None] * Z * (1 - Z)
        J = B if fixed_gamma else np.concatenate([Z, B], axis=2)
        A = J.transpose(0, 2, 1) @ J
        A[:, ii, ii] += mu[:, None] * (np.einsum("pii->pi", A) + 1e-300)
        new = theta.copy()
        new[:, free] -= _solve(A, np.einsum("psi,ps->pi", J, res))
        new[:, H:] = np.clip(new[:, H:], -_SHIFT_CLIP, _SHIFT_CLIP)
        Zn, rn = _parts(s, c, G, new[:, :H], new[:, H:])
        cn = np.sum(rn**2, axis=1)
        better = np.isfinite(cn) & (cn < cost)
        theta[better], Z[better], res[better], cost[better] = new[better], Zn[better], rn[better], cn[better]
        mu = np.where(better, mu / 10, mu * 10).clip(1e-12, 1e12)
    return theta[:, :H], theta[:, H:], np.sqrt(cost / s.size)


def varpro_pairs(s, c, G, l, *, iters=100):
    """Variable projection Levenberg-Marquardt (Golub and Pereyra, with Kaufman's Jacobian
    ``(I - Q Q^T) dZ/dl gamma``) over the shifts ``l`` (P, H), the amplitudes the least squares of
    every step. Returns ``gamma, l`` (P, H) and the rms misfit (P,)."""
    P, H = l.shape
    l = np.array(l, float)

    def parts(l):
        Z = expit(s[None, :, None] + c[None, :, None] * l[:, None, :])
        Q, Rq = np.linalg.qr(Z)
        gq = np.einsum("psh,ps->ph", Q, G)
        res = G - np.einsum("psh,ph->ps", Q, gq)
        return Z, Q, _solve(Rq, gq), res

    Z, Q, gam, res = parts(l)
    cost = np.sum(res**2, axis=1)
    cost = np.where(np.isfinite(cost), cost, np.inf)
    mu = np.full(P, 1e-2)
    ii = np.arange(H)
    for _ in range(iters):
        dZ = c[None, :, None] * Z * (1 - Z) * gam[:, None, :]
        J = dZ - Q @ (Q.transpose(0, 2, 1) @ dZ)
        A = J.transpose(0, 2, 1) @ J
        A[:, ii, ii] += mu[:, None] * (np.einsum("pii->pi", A) + 1e-300)
        new = np.clip(l + np.nan_to_num(_solve(A, np.einsum("psi,ps->pi", J, res))), -_SHIFT_CLIP, _SHIFT_CLIP)
        Zn, Qn, gn, rn = parts(new)
        cn = np.sum(rn**2, axis=1)
        better = np.isfinite(cn) & (cn < cost) & np.isfinite(gn).all(axis=1)
        l[better], Z[better], Q[better], gam[better], res[better], cost[better] = (
            new[better],
            Zn[better],
            Qn[better],
            gn[better],
            rn[better],
            cn[better],
        )
        mu = np.where(better, mu / 5, mu * 5).clip(1e-12, 1e12)
    return gam, l, np.sqrt(cost / s.size)


def _sorted(g, l):
    o = np.argsort(l, axis=1)
    return np.take_along_axis(g, o, 1), np.take_along_axis(l, o, 1)


def varpro_multistart(s, c, G, H, *, starts=64, spread=8.0, iters=100, seed=0):
    """:func:`varpro_pairs` from ``starts`` random sorted shift vectors per pair (uniform in
    ``[-spread, spread]``), the best misfit kept. Returns ``gamma, l`` (P, H), sorted by ``l``, and
    the misfit (P,)."""
    rng = np.random.default_rng(seed)
    P = G.shape[0]
    l0 = np.sort(rng.uniform(-spread, spread, (P * starts, H)), axis=1)
    g, l, res = varpro_pairs(s, c, np.repeat(G, starts, axis=0), l0, iters=iters)
    res = np.where(np.isfinite(res), res, np.inf).reshape(P, starts)
    best = np.argmin(res, axis=1)
    idx = np.arange(P) * starts + best
    return (*_sorted(g[idx], l[idx]), res[np.arange(P), best])


def coordinate_pairs(s, c, G, H, *, grid=None, sweeps=30, seed=0):
    """Matching pursuit then cyclic coordinate descent over a grid of shifts, batched over pairs.

    Heads are added one at a time, each at the grid shift (default 3001 points in ``[-15, 15]``)
    and least-squares amplitude that best explain the residual; then every sweep (in a random
    order) moves each head to its grid-global optimum with the others fixed. Returns ``gamma, l``
    (P, H), sorted by ``l`` (a start for :func:`polish_scaled`)."""
    grid = np.linspace(-15, 15, 3001) if grid is None else np.asarray(grid, float)
    A = expit(s[None, :] + c[None, :] * grid[:, None])  # (N, S)
    nA = np.sum(A**2, axis=1)
    P = G.shape[0]
    rng = np.random.default_rng(seed)
    g, l = np.zeros((P, H)), np.zeros((P, H))
    pr = np.arange(P)

    def term(h):
        return g[:, h, None] * expit(s[None] + c[None] * l[:, h, None])

    E = G.astype(float).copy()  # g = 0: no head yet
    for sweep in range(sweeps):
        for h in rng.permutation(H) if sweep else range(H):
            E += term(h)
            AE = E @ A.T  # (P, N)
            j = np.argmax(AE**2 / nA[None], axis=1)
            g[:, h], l[:, h] = AE[pr, j] / nA[j], grid[j]
            E -= term(h)
    return _sorted(g, l)


# --------------------------------------------------------------------------------------------
# The table of benchmarks/multiscale_pairs.py (companion.multihead.multiscale_pair_starts)
# --------------------------------------------------------------------------------------------

#: A shift's accuracy (log r units) that a start needs (as companion.multihead._information.START_ACCURACY).
START_ACCURACY = 1e-2
#: Moves of the true shifts from which the local fits are started (amplitudes free / held).
BASIN_RHOS = (1e-3, 1e-2, 0.1)
FIXED_RHOS = (0.1, 0.3, 1.0)


def _errors(g, l, gam, L):
    """Per pair: the worst head's ``|l_hat - l|`` and ``|gamma_hat - gamma| / |gamma|``, terms matched
    to heads by an optimal assignment; ``inf`` for a pair without a start. Shape (P, 2)."""
    out = np.full((L.shape[0], 2), np.inf)
    for p in range(L.shape[0]):
        if not (np.all(np.isfinite(l[p])) and np.all(np.isfinite(g[p]))):
            continue
        C = np.abs(l[p][:, None] - L[p][None]) + np.abs(g[p][:, None] - gam[None]) / np.abs(gam[None])
        a, b = linear_sum_assignment(C)
        out[p] = np.max(np.abs(l[p][a] - L[p][b])), np.max(np.abs(g[p][a] - gam[b]) / np.abs(gam[b]))
    return out


def _summary(name, H, E, **extra):
    row = {
        "H": H,
        "start": name,
        "median shift err": float(np.median(E[:, 0])),
        "median ampl err": float(np.median(E[:, 1])),
        f"shift <= {START_ACCURACY:g}": float(np.mean(E[:, 0] <= START_ACCURACY)),
        "shift <= 1e-6": float(np.mean(E[:, 0] <= 1e-6)),
    }
    row.update(extra)
    return row


def _bound_row(name, H, d, per_head):
    worst = per_head.max(axis=1)
    return {
        "H": H,
        "start": name,
        "median shift err": float(np.median(worst)),
        f"shift <= {START_ACCURACY:g}": float(np.mean(worst <= START_ACCURACY)),
        "head tokens / d": float((per_head <= START_ACCURACY).sum(axis=0).min() / d),
    }


def pair_starts(target, delta, X, n0, m0, *, starts=64, seed=1):
    """The rows of :func:`companion.multihead.multiscale_pair_starts` (see there) for one row of the
    learner's design: direction ``delta`` (d,), tokens ``X`` (P, d), the route's counts ``n0, m0``."""
    d, H = X.shape[1], target.Ws.shape[0]
    oracle = ValueQueryOracle(target)
    bX = X @ np.asarray(oracle(np.eye(d)[:, None, :]))
    gam = target.vs @ delta
    L = X @ np.einsum("e,hef->hf", delta, target.Ws).T
    Pn = X.shape[0]
    Gm = np.repeat(gam[None], Pn, 0)
    rows = []
    # the route's design and its own per-pair fit
    ones = np.ones(n0.size)
    s0 = np.log(n0 / m0)
    G0 = ask_multiscale(oracle, delta, X, n0, m0, ones, bX)
    t0 = time.perf_counter()
    g, l = interpolate_pairs(n0 / m0, G0, H)
    ok = np.all(np.isfinite(l), axis=1)
    if ok.any():
        g[ok], l[ok], _ = polish_pairs(s0, G0[ok], g[ok], l[ok])
    rows.append(
        _summary(
            "route (Loewner + LM)",
            H,
            _errors(g, l, gam, L),
            **{"real poles": float(ok.mean()), "s": time.perf_counter() - t0},
        )
    )
    sigma0 = multiscale_sigma(target, delta, X, n0, m0, ones, G0)
    rows.append(_bound_row("route CRB (perfect solver)", H, d, pair_bound(s0, Gm, L, sigma0)))
    # the multi-scale design
    n, m, c = multiscale_counts(H)
    s = np.log(n / m)
    G = ask_multiscale(oracle, delta, X, n, m, c, bX)
    sigma = multiscale_sigma(target, delta, X, n, m, c, G)  # each scale's rounding, (S,)
    rows.append(_bound_row("ms CRB (perfect solver)", H, d, pair_bound(s, Gm, L, sigma, scales=c)))
    t0 = time.perf_counter()
    g, l, res = varpro_multistart(s, c, G, H, starts=starts)
    rows.append(
        _summary(
            f"ms varpro x{starts}",
            H,
            _errors(g, l, gam, L),
            **{"median misfit": float(np.median(res)), "s": time.perf_counter() - t0},
        )
    )
    t0 = time.perf_counter()
    g, l = coordinate_pairs(s, c, G, H)
    g, l, res = polish_scaled(s, c, G, g, l, iters=100)
    rows.append(
        _summary(
            "ms greedy + CD + LM",
            H,
            _errors(g, l, gam, L),
            **{"median misfit": float(np.median(res)), "s": time.perf_counter() - t0},
        )
    )
    rng = np.random.default_rng(seed)
    for rho in BASIN_RHOS:
        l0 = L + rho * rng.choice([-1.0, 1.0], L.shape)
        g, l, res = polish_scaled(s, c, G, Gm, l0, iters=300)
        rows.append(_summary(f"ms basin {rho:g}", H, _errors(g, l, gam, L), **{"median misfit": float(np.median(res))}))
    for name, (ss, cc, GG) in {"route": (s0, ones, G0), "ms": (s, c, G)}.items():
        for rho in FIXED_RHOS:
            l0 = L + rho * rng.choice([-1.0, 1.0], L.shape)
            g, l, res = polish_scaled(ss, cc, GG, Gm, l0, iters=300, fixed_gamma=True)
            rows.append(
                _summary(
                    f"{name} fixed-gamma basin {rho:g}",
                    H,
                    _errors(g, l, gam, L),
                    **{"median misfit": float(np.median(res))},
                )
            )
    return rows
