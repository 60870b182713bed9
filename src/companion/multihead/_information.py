"""How much the counts route's float64 answers say: one pair's shifts against a whole row's heads.

Private helper of :func:`companion.multihead.counts_information` and
:func:`companion.multihead.counts_length_bounds` (``benchmarks/why_H_stops.py``; this book's own analysis of
:func:`companion.multihead.learn_canonical_rational`, not the paper's or the follow-up's). Pair
``(i, k)`` of the route answers ``G_ik(s_t) = sum_h gamma_h sigma(s_t + R_h^T x_k)`` at the ``2 H``
sample points ``s_t = log(n_t / m_t)``. If the answers carry independent errors of standard
deviation ``sigma`` (float64 rounding, measured by :func:`extended_counts_answers`), the
Cramer-Rao bound for unbiased estimators of the unknowns ``theta`` is

    Cov(theta_hat) >= sigma^2 (J^T J)^{-1},     J = d G / d theta,

for Gaussian errors; for the rounding's own errors (deterministic, about uniform within an ulp) it
is the first-order standard deviation of the least-squares estimate, not a strict bound on every
estimator. It is computed from the singular value decomposition of ``J`` (``(J^T J)^{-1}`` formed
explicitly would square the condition number that is being measured).

* :func:`pair_bound`: one pair on its own, unknowns ``(gamma, l)`` (or ``l`` with the amplitudes
  known): the bound on each shift ``l_h``, in units of ``log r``.
* :func:`row_bound`: a row's joint fit, unknowns ``(gamma, R)`` over its ``K`` tokens: the bound on
  ``||R_h_hat - R_h|| / ||R_h||`` per head.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..errors import InvalidInputError
from ..numerics.rational import count_pairs, fit_rows_joint, ratio_design
from ._rowstart import shared_amplitude_start

#: The extended-precision type of :func:`extended_counts_answers` (numpy's ``longdouble``: 80-bit on
#: x86-64 Linux, 64-bit mantissa; no wider than float64 on some platforms, where it refuses).
_EXTENDED = np.longdouble


def _bound(J, sigma):
    """Per-parameter Cramer-Rao standard deviations ``sigma sqrt(diag((J^T J)^{-1}))``, batched:
    ``J`` of shape (..., M, p) gives (..., p); ``inf`` where ``J`` has rank below ``p``."""
    _, sv, Vt = np.linalg.svd(J, full_matrices=False)
    with np.errstate(divide="ignore"):
        inv = np.where(sv > 0, 1.0 / sv, np.inf) ** 2  # (..., p)
    return sigma * np.sqrt(np.einsum("...ij,...i->...j", Vt**2, inv))


def pair_bound(s, gamma, l, sigma, *, fixed_gamma=False, scales=None):
    """Cramer-Rao standard deviation of each shift of one pair's fit, batched over pairs.

    The samples are ``G(s_t) = sum_h gamma_h sigma(s_t + c_t l_h)``: ``c_t = 1`` is the route's
    design; a query of ``n`` copies of ``c x + delta`` then ``m`` copies of ``c x`` has the token
    scaled by ``c``, which scales every shift ``delta^T W_h x`` by ``c`` and leaves the amplitudes
    ``delta^T v_h`` as they are (this book's own design variant, measured in
    ``benchmarks/why_H_stops.py``).

    Parameters
    ----------
    s : ndarray of shape (S,)
        Sample points ``log r``.
    gamma, l : ndarray of shape (P, H)
        Amplitudes and shifts of each pair (the true ones: the bound is local).
    sigma : float or ndarray of shape (S,)
        Standard deviation of an answer's error (``> 0``), or of each sample's (the multi-scale
        design's answers round more at a larger scale: they are ``c x^T v + G`` before ``c x^T v`` is
        subtracted).
    fixed_gamma : bool, default=False
        The amplitudes known (shared by a row's pairs): only the ``H`` shifts are unknown.
    scales : ndarray of shape (S,), optional
        The token's scale ``c_t`` at each sample (default: all 1).

    Returns
    -------
    ndarray of shape (P, H)
        The bound on each shift, in units of ``log r``; ``inf`` where the pair's Jacobian is singular.

    Raises
    ------
    InvalidInputError
        If ``sigma`` is not positive and finite, or the shapes disagree.

    Examples
    --------
    One term ``c sigma(s + l)``: the Jacobian's columns are ``sigma(s + l)`` and
    ``c sigma'(s + l)``, and the bound is the ``(2, 2)`` entry of the inverse of their Gram matrix.

    >>> import numpy as np
    >>> from scipy.special import expit
    >>> s, c, l = np.linspace(-2, 2, 5), 1.5, 0.3
    >>> z = expit(s + l)
    >>> J = np.stack([z, c * z * (1 - z)], axis=1)
    >>> direct = 1e-3 * np.sqrt(np.linalg.inv(J.T @ J)[1, 1])
    >>> bool(np.isclose(pair_bound(s, np.array([[c]]), np.array([[l]]), 1e-3)[0, 0], direct))
    True
    """
    s, gamma, l = np.asarray(s, float), np.atleast_2d(np.asarray(gamma, float)), np.atleast_2d(np.asarray(l, float))
    if gamma.shape != l.shape:
        raise InvalidInputError(f"gamma and l must have the same shape (P, H); got {gamma.shape} and {l.shape}.")
    sd = np.asarray(sigma, float)
    if not (np.all(np.isfinite(sd)) and np.all(sd > 0)) or sd.ndim > 1 or (sd.ndim == 1 and sd.shape != s.shape):
        raise InvalidInputError(
            f"sigma={sigma!r} must be positive and finite (an answer's error s.d.), a float or one per "
            f"sample point (shape {s.shape})."
        )
    H = gamma.shape[1]
    c = np.ones(s.size) if scales is None else np.asarray(scales, float)
    if c.shape != s.shape:
        raise InvalidInputError(f"scales must have the shape of s, {s.shape}; got {c.shape}.")
    Z = expit(s[None, :, None] + c[None, :, None] * l[:, None, :])  # (P, S, H)
    B = gamma[:, None, :] * c[None, :, None] * Z * (1 - Z)
    J = B if fixed_gamma else np.concatenate([Z, B], axis=2)
    if sd.ndim == 1:  # whiten: sample t's row divided by its s.d.
        return _bound(J / sd[None, :, None], 1.0)[:, -H:]
    return _bound(J, float(sd))[:, -H:]


def row_bound(s, X, gamma, R, sigma):
    """Cramer-Rao relative error of each head of a row's joint fit over its tokens.

    Parameters
    ----------
    s : ndarray of shape (S,)
    X : ndarray of shape (K, d)
        The row's query tokens.
    gamma : ndarray of shape (H,)
    R : ndarray of shape (H, d)
        The row's amplitudes and rows (the true ones).
    sigma : float
        Standard deviation of an answer's error (``> 0``).

    Returns
    -------
    ndarray of shape (H,)
        ``sqrt(E ||R_h_hat - R_h||^2) / ||R_h||`` at the bound, per head (``inf`` if the Jacobian of
        the ``K S`` answers in the ``H (d + 1)`` unknowns is singular).

    Raises
    ------
    InvalidInputError
        If ``sigma`` is not positive and finite.

    Examples
    --------
    One head in ``d = 1``: the unknowns are ``(gamma, R)`` and the bound scales with ``sigma``.

    >>> import numpy as np
    >>> s, X = np.linspace(-2, 2, 4), np.array([[1.0], [-0.5], [2.0]])
    >>> b1 = row_bound(s, X, np.array([1.0]), np.array([[0.7]]), 1e-6)
    >>> b2 = row_bound(s, X, np.array([1.0]), np.array([[0.7]]), 2e-6)
    >>> bool(np.isclose(b2[0], 2 * b1[0]) and 0 < b1[0] < 1e-4)
    True
    """
    if not (np.isfinite(sigma) and sigma > 0):
        raise InvalidInputError(f"sigma={sigma!r} must be positive and finite (an answer's error s.d.).")
    s, X, gamma, R = (np.asarray(a, float) for a in (s, X, gamma, R))
    H, d = R.shape
    Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])  # (K, S, H)
    B = gamma * Z * (1 - Z)
    J = np.concatenate([Z.reshape(-1, H), (B[..., None] * X[:, None, None, :]).reshape(-1, H * d)], axis=1)
    sd = _bound(J, sigma)[H:].reshape(H, d)
    return np.linalg.norm(sd, axis=1) / np.linalg.norm(R, axis=1)


def extended_counts_answers(model, U, X, n, m):
    """The counts route's answers minus ``x^T v``, in numpy's extended precision (``longdouble``).

    ``G[k, t] = VQ(n_t copies of U[k], then m_t copies of X[k]) - X[k]^T sum_h v_h``, from the
    closed form of :func:`companion.multihead.learn_canonical_rational`'s Notes evaluated with the
    model's float64 parameters converted exactly to ``longdouble``: the reference against which
    float64 answers' rounding is measured.

    Parameters
    ----------
    model : MultiHead
        ``Ws`` of shape (H, d, d), ``vs`` of shape (H, d).
    U, X : ndarray of shape (K, d)
    n, m : ndarray of int, shape (S,)

    Returns
    -------
    ndarray of shape (K, S), dtype longdouble

    Raises
    ------
    InvalidInputError
        If ``longdouble`` is no wider than float64 on this platform (then there is no reference).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.multihead import random_multi_head
    >>> from companion.oracles import ValueQueryOracle
    >>> model = random_multi_head(4, 2, seed=0)
    >>> x, u = np.ones(4), np.ones(4) + np.eye(4)[0]
    >>> ref = extended_counts_answers(model, u[None], x[None], np.array([2]), np.array([1]))
    >>> VQ = ValueQueryOracle(model)(np.stack([u, u, x]))
    >>> bool(abs(float(ref[0, 0]) - (VQ - x @ model.vs.sum(axis=0))) < 1e-12)
    True
    """
    ld = _EXTENDED
    if np.finfo(ld).eps >= np.finfo(float).eps:
        raise InvalidInputError(
            "numpy's longdouble is no wider than float64 on this platform: there is no extended-precision "
            "reference to measure float64 rounding against (use an x86-64 machine)."
        )
    Ws, vs = np.asarray(model.Ws).astype(ld), np.asarray(model.vs).astype(ld)
    U, X = np.asarray(U).astype(ld), np.asarray(X).astype(ld)
    a = np.einsum("ke,hef,kf->kh", U, Ws, X)  # u^T W_h x
    b = np.einsum("ke,hef,kf->kh", X, Ws, X)  # x^T W_h x
    top = np.maximum(a, b)
    ea, eb = np.exp(a - top)[:, None, :], np.exp(b - top)[:, None, :]
    nn, mm = np.asarray(n).astype(ld)[None, :, None], np.asarray(m).astype(ld)[None, :, None]
    uv, xv = (U @ vs.T)[:, None, :], (X @ vs.T)[:, None, :]
    VQ = ((nn * ea * uv + mm * eb * xv) / (nn * ea + mm * eb)).sum(axis=2)
    return VQ - (X @ vs.sum(axis=0))[:, None]


def loewner_condition(r, G, H):
    """Condition number ``sigma_1 / sigma_H`` of each pair's Loewner matrix, batched over pairs.

    The matrix is ``companion.numerics.rational.interpolate_pairs``'s (support points ``0, r_1, r_3,
    ...``, test points ``r_2, r_4, ...``; shape (H, H + 1)); its null vector is the interpolant, so
    a change of the answers by ``eps`` relative moves it by about this number times ``eps``.

    Parameters
    ----------
    r : ndarray of shape (2 H,)
    G : ndarray of shape (P, 2 H)
    H : int

    Returns
    -------
    ndarray of shape (P,)

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import expit
    >>> r = np.array([0.5, 2.0])
    >>> G = expit(np.log(r) + 0.1)[None] * 1.3          # one head: a 1 x 2 Loewner matrix, rank 1
    >>> float(loewner_condition(r, G, 1)[0])
    1.0
    """
    r, G = np.asarray(r, float), np.atleast_2d(np.asarray(G, float))
    P = G.shape[0]
    zs = np.concatenate([[0.0], r[0::2]])
    zt = r[1::2]
    fs = np.concatenate([np.zeros((P, 1)), G[:, 0::2]], axis=1)
    ft = G[:, 1::2]
    Lw = (ft[:, :, None] - fs[:, None, :]) / (zt[:, None] - zs[None, :])
    sv = np.linalg.svd(Lw, compute_uv=False)
    with np.errstate(divide="ignore"):
        return sv[:, 0] / sv[:, H - 1]


# --------------------------------------------------------------------------------------------
# The table of benchmarks/why_H_stops.py
# --------------------------------------------------------------------------------------------

#: A shift's accuracy (log r units) that a start needs: the joint fit's basin is 1-3 % of R_h.
START_ACCURACY = 1e-2
#: Relative perturbations of the true heads from which the basin is probed.
RHOS = (0.01, 0.03, 0.1)
#: Token scales of the multi-scale design variant (``pair CRB scaled``).
SCALES = (0.5, 1.0, 2.0, 4.0)


def _answer_sd(G, exact):
    """The s.d. of the float64 answers ``G`` against ``exact``, at least ``eps max|G|`` (a rounding
    cannot be finer: the floor only matters where every answer happened to round exactly)."""
    return max(float(np.std((G - exact).astype(float))), float(np.finfo(float).eps * np.max(np.abs(G))))


def multiscale_counts(H, scales=SCALES):
    """The variant's queries: 2H // len(scales) ratios n/m (n + m <= 2H + 1, count_pairs) per token
    scale c, i.e. n copies of c x + delta then m copies of c x: at most the route's 2H queries per
    pair, of the same length. Returns (n, m, c), each of shape (S,), S <= 2H. Raises InvalidInputError
    if H < len(scales) / 2 (then no scale gets a sample)."""
    if 2 * H < len(scales):
        raise InvalidInputError(
            f"H={H}: the multi-scale design splits 2H = {2 * H} queries over {len(scales)} scales; "
            f"need H >= {-(-len(scales) // 2)} (or fewer scales)."
        )
    n, m = count_pairs(2 * H // len(scales), 2 * H + 1)
    k = len(scales)
    return np.tile(n, k), np.tile(m, k), np.repeat(np.asarray(scales, float), n.size)


def multiscale_design(H, scales=SCALES):
    """:func:`multiscale_counts` as sample points: (s, c), s = log(n / m), each of shape (S,)."""
    n, m, c = multiscale_counts(H, scales)
    return np.log(n / m), c


def learner_design(d, H, K, seed=0, scale=3.0, spread=1.5):
    """The directions ``P`` (rows), ``K`` tokens ``X`` and counts ``n, m`` of
    :func:`companion.multihead.learn_canonical_rational` with ``seed`` and its default ``scale`` and
    ``spread`` (its own draws, in its order; a redrawn row is not reproduced)."""
    n, m = ratio_design(H)
    rng = np.random.default_rng(seed)
    P, Rq = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(Rq))).T
    T = rng.standard_normal((K, d))
    norms = scale * np.exp(rng.uniform(-np.log(spread), np.log(spread), K))
    return P, T * (norms / np.linalg.norm(T, axis=1))[:, None], n, m


def basin(s, G, X, gam, R, rng, draws=2):
    """Largest rho in RHOS from which every draw of the joint fit converged (0.0 if none)."""
    g0, R0 = [], []
    for rho in RHOS:
        for _ in range(draws):
            g0.append(gam * (1 + rho * rng.standard_normal(gam.size)))
            E = rng.standard_normal(R.shape)
            R0.append(R + E * (rho * np.linalg.norm(R, axis=1) / np.linalg.norm(E, axis=1))[:, None])
    _, Rb, res, sc = fit_rows_joint(s, np.repeat(G[None], len(g0), 0), X, np.array(g0), np.array(R0), iters=300)
    err = np.max(np.linalg.norm(Rb - R, axis=2) / np.linalg.norm(R, axis=1), axis=1)
    ok = ((res <= 1e-9 * sc) & (err <= 1e-6)).reshape(len(RHOS), draws).all(axis=1)
    best = 0.0
    for rho, good in zip(RHOS, ok):
        if not good:
            break
        best = rho
    return best


def samples_needed(H, gam, L, sigma):
    """The fewest samples per pair (2H, 4H, 8H, ..., up to every ratio n/m with n + m <= 2H + 1,
    spread evenly in log r by count_pairs) at which the median pair CRB is at most START_ACCURACY;
    inf if none."""
    sizes = [2 * H * 2**j for j in range(8)]
    n_all = count_pairs(10**4, 2 * H + 1)[0].size
    for S in sorted({min(S, n_all) for S in sizes}):
        n, m = count_pairs(S, 2 * H + 1)
        if np.median(pair_bound(np.log(n / m), gam, L, sigma).max(axis=1)) <= START_ACCURACY:
            return n.size
    return np.inf


def information_row(target, P, X, n, m, Gs, cov, with_basin=True):
    """One row of :func:`companion.multihead.counts_information` (see there), from the design
    (:func:`learner_design`), the float64 answers ``Gs[i]`` (shape (K, S)) of rows ``i < len(Gs)``
    minus ``x^T v`` and :func:`companion.multihead.counts_start_coverage`'s ``cov``."""
    d, H = X.shape[1], target.Ws.shape[0]
    r, s = n / m, np.log(n / m)
    K = X.shape[0]
    rows = len(Gs)
    rng = np.random.default_rng(1)
    keys = "noise loewner pair pair_ok pair4 pairL fixed row shared basin needed pair_all scaled scaled_ok"
    out: dict[str, list] = {k: [] for k in keys.split()}
    for i in range(rows):
        gam = target.vs @ P[i]
        R = np.einsum("e,hef->hf", P[i], target.Ws)
        L = X @ R.T
        G = Gs[i]
        exact = extended_counts_answers(target, X + P[i], X, n, m)
        gmax = float(np.max(np.abs(G)))
        sigma = _answer_sd(G, exact)
        out["noise"].append(sigma / gmax)
        out["loewner"].append(np.median(loewner_condition(r, G, H)))
        Gm = np.repeat(gam[None], K, axis=0)
        pb = pair_bound(s, Gm, L, sigma).max(axis=1)
        out["pair"].append(np.median(pb))
        out["pair_ok"].append(np.mean(pb <= START_ACCURACY))
        out["pair4"].append(np.median(pair_bound(np.linspace(s[0], s[-1], 8 * H), Gm, L, sigma).max(axis=1)))
        out["pairL"].append(np.median(pair_bound(np.linspace(-5, 5, 2 * H), Gm, L, sigma).max(axis=1)))
        out["needed"].append(samples_needed(H, Gm, L, sigma))
        n_all, m_all = count_pairs(10**4, 2 * H + 1)
        out["pair_all"].append(np.median(pair_bound(np.log(n_all / m_all), Gm, L, sigma).max(axis=1)))
        s_c, c = multiscale_design(H)
        pc = pair_bound(s_c, Gm, L, sigma, scales=c).max(axis=1)
        out["scaled"].append(np.median(pc))
        out["scaled_ok"].append(np.mean(pc <= START_ACCURACY))
        out["fixed"].append(np.median(pair_bound(s, Gm, L, sigma, fixed_gamma=True).max(axis=1)))
        out["row"].append(np.max(row_bound(s, X, gam, R, sigma)))
        shared = shared_amplitude_start(s, G, X, gam, float(np.max(np.abs(s))))
        out["shared"].append(
            np.inf
            if shared is None
            else float(np.max(np.linalg.norm(shared[1] - R, axis=1) / np.linalg.norm(R, axis=1)))
        )
        if with_basin:
            out["basin"].append(basin(s, G, X, gam, R, rng))
    row = {
        "d": d,
        "H": H,
        "K / d": K / d,
        "noise": max(out["noise"]),
        "Loewner cond": float(np.median(out["loewner"])),
        "pair CRB": float(np.median(out["pair"])),
        f"pairs <= {START_ACCURACY:g}": float(np.mean(out["pair_ok"])),
        "pair CRB 4x S": float(np.median(out["pair4"])),
        "pair CRB L151": float(np.median(out["pairL"])),
        "pair CRB all n/m": float(np.median(out["pair_all"])),
        "pair CRB scaled": float(np.median(out["scaled"])),
        f"scaled <= {START_ACCURACY:g}": float(np.mean(out["scaled_ok"])),
        "fixed-gamma": float(np.median(out["fixed"])),
        "row CRB": float(max(out["row"])),
        "resolved / d": cov["fewest resolved / d"],
        "start err": cov["start error"],
        "shared err": float(max(out["shared"])),
    }
    row["S needed / 2H"] = float(max(out["needed"])) / (2 * H)
    if with_basin:
        row["basin min"], row["basin max"] = float(min(out["basin"])), float(max(out["basin"]))
    return row


def length_bounds(target, P, X, n, m, G, lengths, samples):
    """The rows of :func:`companion.multihead.counts_length_bounds` (see there), from row 0's
    float64 answers ``G`` (minus ``x^T v``) of the design (:func:`learner_design`)."""
    gam, R = target.vs @ P[0], np.einsum("e,hef->hf", P[0], target.Ws)
    sigma = _answer_sd(G, extended_counts_answers(target, X + P[0], X, n, m))
    Gm, L = np.repeat(gam[None], X.shape[0], 0), X @ R.T
    rows = []
    for Lmax in lengths:
        row = {"longest query": Lmax}
        for S in samples:
            ns, ms = count_pairs(S, Lmax)
            row[f"S = {S}"] = float(np.median(pair_bound(np.log(ns / ms), Gm, L, sigma).max(axis=1)))
        rows.append(row)
    return rows
