"""The moment start of the counts route: one row solved from Taylor moments, the others by continuation.

Private helper of :func:`companion.multihead.learn_canonical_rational` with ``start="moments"``.
This is this book's own construction (neither the paper's nor the follow-up's [2]_), written for
the ``H`` at which no pair's own interpolation resolves its heads (``H >= 9`` at ``d = 64``:
:func:`companion.multihead.counts_information`). It keeps the route's queries (``n`` copies of
``u = x + delta`` then ``m`` copies of ``x``, ``n + m <= 2 H + 1``) and its count
``4 H d^2 - 2 H + 1``, and replaces the per-pair start by three steps.

With ``s = log(n / m)``, ``gamma_h = delta^T v_h`` and ``R_h = W_h^T delta``, the answers of one row
(direction ``delta``) minus ``x^T v`` are

    G(s, x) = sum_h gamma_h sigma(s + R_h^T x),                                         (1)

a sum of ``H`` logistic ridge functions of the token ``x``, all with weight 1 on ``s``.

1. **The heads' span** (:func:`head_subspace`). By (1),
   ``grad_x G(s, x) = sum_h gamma_h sigma'(s + R_h^T x) R_h`` lies in ``span{R_h}`` for every ``s``
   and ``x``: central differences at ``x_0 +- eta e_j`` (``j = 1..d``, two base tokens ``x_0``)
   give ``2 H`` gradients per base, whose leading ``H`` right singular vectors are an orthonormal
   basis ``U`` of that span (error ``O(eta^2)``, measured 1.7e-7 at ``d = 64``, ``H = 12``).
2. **Jennrich's algorithm on the Taylor moments** (:func:`power_sums`, :func:`symmetric_fit`,
   :func:`jennrich`). For tokens ``x = U z`` with ``z`` small (shifts ``c_h^T z`` with
   ``c_h = U^T R_h`` below about 0.4), the Taylor series of ``sigma`` gives

       G(s, U z) = sum_j sigma^(j)(s) / j! * P_j(z),    P_j(z) = sum_h gamma_h (c_h^T z)^j,    (2)

   so a least-squares fit of the ``2 H`` samples on ``sigma^(j)(s)``, ``j = 1..J``
   (``P_0 = delta^T v`` is known), gives the power sums ``P_j`` at each token. ``P_2`` and ``P_3``
   are the quadratic and cubic forms of the symmetric tensors ``M_2 = sum_h gamma_h c_h c_h^T`` and
   ``M_3 = sum_h gamma_h c_h (x) c_h (x) c_h`` (least squares over the monomials), and for any
   ``w``, ``M_3(w) M_2^{-1} = C^T diag(C w) C^{-T}`` (``C`` with rows ``c_h``): its eigenvectors
   are the ``c_h`` and its eigenvalues ``c_h^T w`` fix their scale (Jennrich's simultaneous
   diagonalisation, Harshman 1970; Leurgans, Ross & Abel 1993). The amplitudes ``gamma_h`` follow
   from ``M_2`` by least squares. Measured at ``d = 64``, ``H = 12``: every ``R_h`` to 1e-6
   relative, deep inside the basin (1-3 %) of the row's joint fit, which then reaches rounding level.
3. **The other rows by continuation** (:func:`track_rows`). The rows are a star around that centre,
   ``delta_i = delta_0 + eps q_i`` with ``q_i`` an orthonormal basis of ``delta_0``'s complement:
   their heads differ from the centre's by ``O(eps)`` relative, so the centre's solution starts every
   row's joint fit, and the heads keep their labels (no link pairs). A row that misfits from there
   (it stalls at a spurious minimum, about 1e-7 relative) is fitted again from it with more
   damping, and if it misfits still, tracked along the data ``G_0 + t (G_i - G_0)``,
   ``t = 1/T .. 1``, each step's fit starting from the last. Then ``[W_h^T]`` and ``[v_h]``
   follow from the rows by inverting the star's matrix, whose differences divide the rows' errors
   by ``eps`` (measured at d = 64, H = 12, seeds 0-5: the ``W_h`` to 1.3e-9 to 2.7e-9 relative,
   the heads weakest at the centre the least accurate).

A head whose amplitude nearly vanishes at the centre is nearly invisible in every row of its star
(``gamma_h(delta_i) = gamma_h(delta_0) + eps q_i^T v_h``); the route then draws a second centre
within the count where it has room, and keeps the centre whose smallest amplitude is largest.

References
----------
.. [1] R. A. Harshman, "Foundations of the PARAFAC procedure", UCLA Working Papers in Phonetics 16,
   1970 (the simultaneous diagonalisation credited there to R. Jennrich).
.. [2] Kim, Kim, Guo, "Provably Learning Multi-Head Attention with Queries", arXiv 2608.03294, 2026.
.. [3] S. E. Leurgans, R. T. Ross, R. B. Abel, "A decomposition for three-way arrays", SIAM J.
   Matrix Anal. Appl. 14 (1993) 1064-1083.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.polynomial import polynomial as npoly
from scipy.special import expit

from ..numerics.rational import fit_row_joint, fit_rows_joint

#: Step of the central differences of step 1, relative to the base token's norm: their error is
#: ``O(eta^2)`` and their rounding ``O(eps_64 / eta)``; 1e-4 balances both near 1e-8 (measured
#: d = 64, H = 12: the span to 1.7e-7 with two bases, singular value H + 1 at 2e-10 of the first).
ETA = 1e-4

#: Base tokens of step 1 (each costs ``2 d`` tokens): one leaves the span to 4e-6, two to 1.7e-7.
N_BASE = 2

#: Degree of the Taylor fit of step 2 (``J <= 2 H - 3`` samples' worth; J = 9 gives ``P_2``, ``P_3``
#: to 2e-8 and 3e-8 relative at shifts up to 0.37, measured d = 64, H = 12).
TAYLOR_DEGREE = 9

#: Norm of the moment tokens ``U z`` relative to the route's ``scale``: ``scale / 100`` keeps their
#: shifts below about 0.4 for heads with ``||R_h|| <= 4 scale`` (measured d = 64, H = 12).
MOMENT_SCALE = 1e-2

#: Moment tokens per cubic monomial of ``z`` (``C(H + 2, 3)`` of them).
MOMENT_OVERSAMPLE = 1.5

#: Offset of the star's rows (``||delta_i - delta_0|| = eps``). Measured at d = 64, H = 12 (seeds
#: 0-5, 98 to 115 tokens per row): 0.02 starts 9 to all 63 rows in their basin and leaves some rows
#: unlearned after the continuation where the centre's smallest amplitude is below 0.04 of its
#: largest; 0.01 learned every row there; the result's error grows as 1 / eps. Again 2026-12-02,
#: with the damped second fit (RETRY_DAMPING): 0.02 refuses seeds 0, 3 and 5 (9 to 26 rows misfit).
STAR_EPS = 0.01

#: Damped steps of each row's first fit from the centre's solution. Measured d = 64, H = 12, seeds
#: 0-5 (63 rows each): the rows that converge do so in 6 to 10 steps, a few in 16 to 46; the others
#: stall at a misfit of 1e-7 to 1e-6 relative (a spurious minimum: an exact Gauss-Newton step there
#: changes nothing) and used all of the 60 steps they were given before.
FIRST_ITERS = 15

#: The first damping of the second fit from the centre's solution, for the rows the first left
#: (the first has Levenberg-Marquardt's 1e-8: Gauss-Newton steps). Measured d = 64, H = 12, seed 0:
#: 11 of 63 rows stall with 1e-8, 4 with 1e-7, none with 1e-6, 1 with 3e-6; on seed 3, 0 with
#: 1e-8 and 4 with 1e-6. Which rows stall moves with the damping, so the two tries together leave
#: fewer (seed 0: none of the 15 the first left; seed 5: 18 of 32) than either alone.
RETRY_DAMPING = 1e-6

#: Steps of the continuation of :func:`track_rows`.
HOMOTOPY_STEPS = 2

#: Damped steps of each of the continuation's intermediate fits (``t < 1``), at most. Their data
#: ``G_0 + t (G_i - G_0)`` is no sum of ``H`` logistic ridges, so those fits never reach rounding level:
#: they stop when a step leaves more than ``STEP_STALL`` of the cost, and only carry the start along.
STEP_ITERS = 15

#: See STEP_ITERS. Measured d = 64, H = 12, seed 5 (18 rows tracked): 4 steps with no stall rule
#: took 2,109 row evaluations, 2 steps with 0.5 took 1,414, with the same rows learned.
STEP_STALL = 0.5

#: Smallest ``|gamma_h| / max |gamma|`` at a centre below which the route draws a second centre
#: if the count leaves room (measured: a centre at 0.011 left 10 of 64 rows unlearned; 0.03 learned).
WEAK_CENTRE = 0.02


def sigma_derivatives(s, J):
    """``sigma^(j)(s)`` for ``j = 0..J``: shape (S, J + 1), each a polynomial in ``sigma(s)``.

    ``sigma' = sigma (1 - sigma)``, so ``sigma^(j) = p_j(sigma)`` with ``p_0(y) = y`` and
    ``p_{j+1} = p_j' * y (1 - y)``.

    Examples
    --------
    >>> import numpy as np
    >>> B = sigma_derivatives(np.array([0.0]), 3)
    >>> B.round(6).tolist()
    [[0.5, 0.25, 0.0, -0.125]]
    """
    s = np.asarray(s, dtype=float)
    p = [np.array([0.0, 1.0])]
    dy = np.array([0.0, 1.0, -1.0])  # y (1 - y)
    for _ in range(int(J)):
        p.append(npoly.polymul(npoly.polyder(p[-1]), dy))
    y = expit(s)
    return np.stack([npoly.polyval(y, c) for c in p], axis=1)


def power_sums(s, G, total, J=TAYLOR_DEGREE):
    """The power sums ``P_j = sum_h gamma_h l_h^j``, ``j = 1..J``, of each token from (2).

    Parameters
    ----------
    s : ndarray of shape (S,)
        ``log(n / m)`` of the samples (``S >= J + 1``).
    G : ndarray of shape (K, S)
        Answers minus ``x^T v`` of ``K`` tokens whose shifts ``l_h`` are small.
    total : float
        ``P_0 = sum_h gamma_h = delta^T v``.
    J : int
        Degree of the Taylor fit.

    Returns
    -------
    P : ndarray of shape (K, J)
        ``P[:, j - 1] = P_j``.
    misfit : ndarray of shape (K,)
        Largest misfit of each token's fit relative to its largest ``|G|``: about 1e-15 where the
        series converges within ``J`` terms, larger where the shifts are too large for it.
    """
    B = sigma_derivatives(s, J)
    rhs = (G - total * B[:, 0]).T  # (S, K)
    coef = np.linalg.lstsq(B[:, 1:], rhs, rcond=None)[0]  # (J, K)
    misfit = np.max(np.abs(B[:, 1:] @ coef - rhs), axis=0) / np.maximum(np.max(np.abs(G), axis=1), 1e-300)
    return coef.T * np.array([math.factorial(j) for j in range(1, J + 1)]), misfit


def symmetric_fit(Z, y, order):
    """The symmetric tensor ``M`` of shape ``(n,) * order`` with ``M(z, ..., z) ~ y`` by least squares.

    Parameters
    ----------
    Z : ndarray of shape (K, n)
        Points (``K`` at least the number ``C(n + order - 1, order)`` of monomials).
    y : ndarray of shape (K,)
        Values of a homogeneous polynomial of degree ``order`` at them.

    Examples
    --------
    >>> import numpy as np
    >>> Z = np.random.default_rng(0).standard_normal((10, 2))
    >>> M = symmetric_fit(Z, Z[:, 0] * Z[:, 1], 2)
    >>> (M.round(12) + 0.0).tolist()
    [[0.0, 0.5], [0.5, 0.0]]
    """
    n = Z.shape[1]
    idx = list(itertools.combinations_with_replacement(range(n), order))
    A = np.stack([np.prod(Z[:, list(t)], axis=1) for t in idx], axis=1)
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    M = np.zeros((n,) * order)
    for c, t in zip(coef, idx):
        perms = set(itertools.permutations(t))
        for p in perms:
            M[p] = c / len(perms)
    return M


def jennrich(M2, M3, rng, tries=8):
    """The rows ``c_h`` and amplitudes ``gamma_h`` of ``M_2 = sum gamma_h c_h c_h^T`` and the cubic ``M_3``.

    Eigen-decomposes ``M_3(w) M_2^{-1} = C^T diag(C w) C^{-T}`` for ``tries`` random ``w`` and keeps
    the ``w`` whose eigenvalues are farthest apart relative to the largest (the eigenvectors are the
    better determined the larger that gap); each eigenvector ``e`` gives ``c = e * lambda / (w^T e)``.

    Parameters
    ----------
    M2 : ndarray of shape (n, n)
    M3 : ndarray of shape (n, n, n)
    rng : numpy.random.Generator
    tries : int

    Returns
    -------
    C : ndarray of shape (n, n)
        Rows ``c_h``.
    gamma : ndarray of shape (n,)
    gap : float
        Smallest distance between two eigenvalues relative to the largest ``|lambda|`` (0.0 when
        some are complex: then no head's row is real).

    Examples
    --------
    >>> import numpy as np
    >>> C = np.array([[1.0, 0.2], [-0.3, 1.0]]); g = np.array([2.0, -1.0])
    >>> M2 = np.einsum("h,ha,hb->ab", g, C, C); M3 = np.einsum("h,ha,hb,hc->abc", g, C, C, C)
    >>> Ch, gh, gap = jennrich(M2, M3, np.random.default_rng(0))
    >>> order = np.argsort(gh)
    >>> bool(np.allclose(Ch[order], C[[1, 0]]) and np.allclose(gh[order], [-1.0, 2.0]))
    True
    """
    n = M2.shape[0]
    M2inv = np.linalg.pinv(M2)
    best = (-1.0, None, None, None)
    for _ in range(int(tries)):
        w = rng.standard_normal(n)
        lam, E = np.linalg.eig(np.einsum("abc,c->ab", M3, w) @ M2inv)
        top = float(np.max(np.abs(lam))) or 1.0
        if np.max(np.abs(lam.imag)) > 1e-8 * top:
            gap = 0.0
        else:
            lam, E = lam.real, E.real
            apart = np.abs(lam[:, None] - lam[None, :]) + np.diag(np.full(n, np.inf))
            gap = float(np.min(apart)) / top if n > 1 else 1.0
        if gap > best[0]:
            best = (gap, lam, E, w)
    gap, lam, E, w = best
    if gap <= 0.0:
        return np.full((n, n), np.nan), np.full(n, np.nan), 0.0
    C = (E * (lam / (w @ E))).T
    A = np.stack([np.outer(c, c).ravel() for c in C], axis=1)
    gamma = np.linalg.lstsq(A, M2.ravel(), rcond=None)[0]
    return C, gamma, gap


def head_subspace(D, H):
    """An orthonormal basis ``U`` (shape (d, H)) of the heads' span from stacked gradients ``D``.

    ``D`` of shape (M, d): rows ``grad_x G(s_t, x_0)`` (step 1). Returns ``U`` and the singular
    values of ``D`` relative to the largest (shape (min(M, d),)): the ``H + 1``-st measures the
    differences' error, the ``H``-th the weakest head's share.
    """
    _, sv, Vt = np.linalg.svd(D, full_matrices=False)
    return Vt[:H].T, sv / sv[0]


def track_rows(s, G, X, gamma0, R0, G0, *, tol, XX=None, steps=HOMOTOPY_STEPS, max_serial=None):
    """Every row's joint fit from one start ``(gamma0, R0)``: a first fit of ``FIRST_ITERS`` steps, a
    second from the same start with ``RETRY_DAMPING`` for the rows it leaves, and continuation for
    those that still misfit.

    Parameters
    ----------
    s : ndarray of shape (S,)
    G : ndarray of shape (N, K, S)
        The rows' answers.
    X : ndarray of shape (K, d)
    gamma0 : ndarray of shape (H,)
    R0 : ndarray of shape (H, d)
        The centre's heads, fitted to ``G0``.
    G0 : ndarray of shape (K, S)
        The centre's answers at the same tokens.
    tol : float
        Largest relative misfit accepted.
    max_serial : int, optional
        The rows still misfitting after the continuation get the serial fit of
        ``companion.numerics.rational.fit_row_joint`` (with its MINPACK fallback, up to minutes per row
        at ``H (d + 1) ~ 400`` unknowns) only if there are at most this many (the caller's spare
        rows: with more, it refuses anyway). None: always.

    Returns
    -------
    gamma : ndarray of shape (N, H)
    R : ndarray of shape (N, H, d)
    relative : ndarray of shape (N,)
        Each row's largest misfit relative to its largest ``|G|``.
    tracked : int
        Rows that needed the continuation (neither fit from the start reached ``tol``).
    """
    N = G.shape[0]
    start = np.repeat(gamma0[None], N, 0), np.repeat(R0[None], N, 0)
    gamma, R, res, sc = fit_rows_joint(s, G, X, *start, XX=XX, iters=FIRST_ITERS)
    bad = np.flatnonzero(res > tol * sc)
    tracked = 0
    if bad.size:  # a second try from the centre, more damped
        g1, R1, r1, _ = fit_rows_joint(
            s, G[bad], X, start[0][bad], start[1][bad], XX=XX, iters=FIRST_ITERS, damping=RETRY_DAMPING
        )
        gamma[bad], R[bad], res[bad] = g1, R1, r1
        bad = bad[r1 > tol * sc[bad]]
    if bad.size:
        tracked = int(bad.size)
        gh, Rh = start[0][bad], start[1][bad]
        for t in np.linspace(0.0, 1.0, int(steps) + 1)[1:]:
            last = t == 1.0
            gh, Rh, rh, _ = fit_rows_joint(
                s,
                G0 + t * (G[bad] - G0),
                X,
                gh,
                Rh,
                XX=XX,
                iters=120 if last else STEP_ITERS,
                stall=None if last else STEP_STALL,
            )
        gamma[bad], R[bad], res[bad] = gh, Rh, rh
        still = bad[res[bad] > tol * sc[bad]]
        if max_serial is not None and still.size > max_serial:
            still = still[:0]  # too many to redraw: the caller refuses without the serial fits
        for i in still:  # the serial fit with its MINPACK fallback
            g1, R1, info = fit_row_joint(s, G[i], X, gamma[i], R[i], XX=XX, iters=30)
            if info["residual"] < res[i]:
                gamma[i], R[i], res[i] = g1, R1, info["residual"]
    return gamma, R, res / sc, tracked
