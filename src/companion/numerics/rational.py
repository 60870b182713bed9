"""Fitting ``g(s) = sum_h c_h sigma(s + l_h)``: the one-dimensional problem behind learn_canonical.

Shared numerics (it imports nothing from ``companion``): the fits behind both canonical-form
learners of :mod:`companion.multihead` and the layer probe of :mod:`companion.pretrained` (this
book's construction, not the paper's; the module was ``companion._rational`` before issue 34, and its
underscored names stay private). A query of ``n`` copies of a token ``u`` followed by ``m`` copies of the query token
``x`` gives every head the weight ``r E_h / (r E_h + 1)`` on the copies, with ``r = n / m`` and
``E_h = exp((u - x)^T W_h x)``, so the answer minus ``x^T sum_h v_h`` is

    g(r) = sum_h c_h r / (r + p_h),   c_h = (u - x)^T v_h,   p_h = 1 / E_h,

a rational function of ``r`` of type (H, H) with real negative poles ``-p_h``; in ``s = log r`` it is
the sum of logistic functions ``sum_h c_h sigma(s + l_h)``, ``l_h = log E_h``.

* :func:`count_pairs` chooses the counts ``(n, m)`` so that ``s`` covers ``[-log(L-1), log(L-1)]``
  evenly with sequences of length ``n + m <= L`` (a real, well-spread parameter instead of the
  integers ``n = 1 .. 2H + 1``, whose monomial Vandermonde system is ill-conditioned).
* :func:`fit_free` finds ``H`` and the terms: AAA rational approximation [1]_
  (:class:`scipy.interpolate.AAA`) for the poles and residues, polished by Levenberg-Marquardt on
  the logistic form (:func:`scipy.optimize.least_squares`).
* :func:`fit_shifts` refits the shifts ``l_h`` when the amplitudes ``c_h`` are known (shared by
  every query with the same ``u - x``): the Jacobian then has one column per head instead of two,
  and nearly equal shifts stay resolvable.

References
----------
.. [1] Nakatsukasa, Sete, Trefethen, "The AAA algorithm for rational approximation", SIAM J. Sci.
   Comput. 40(3), 2018.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from scipy.interpolate import AAA
from scipy.linalg import cho_factor, cho_solve, get_lapack_funcs
from scipy.optimize import least_squares
from scipy.special import expit

_EPS = np.finfo(float).eps


def count_pairs(n_points, max_len):
    """Counts ``(n, m)`` with ``n + m <= max_len`` whose ``log(n / m)`` are spread evenly.

    Returns
    -------
    n, m : ndarray of int
        Coprime counts, sorted by ``n / m``; at most ``n_points`` of them (fewer if two targets
        round to the same fraction).

    Examples
    --------
    >>> n, m = count_pairs(5, 5)
    >>> (n / m).round(3).tolist()
    [0.25, 0.5, 1.0, 2.0, 4.0]
    """
    n, m = np.meshgrid(np.arange(1, max_len), np.arange(1, max_len), indexing="ij")
    ok = (n + m <= max_len) & (np.gcd(n, m) == 1)
    n, m = n[ok], m[ok]
    s = np.log(n / m)
    order = np.argsort(s)
    n, m, s = n[order], m[order], s[order]
    S = np.log(max_len - 1)
    idx = np.unique([int(np.argmin(np.abs(s - t))) for t in np.linspace(-S, S, n_points)])
    return n[idx], m[idx]


def logistic_sum(s, c, l):
    """``sum_h c_h sigma(s + l_h)`` for ``s`` of shape (K,)."""
    return expit(s[:, None] + l[None, :]) @ c


def logistic_jacobian(s, c, l):
    """Jacobian (K, 2H) of :func:`logistic_sum` at ``s`` in ``(c, l)``: ``sigma(s + l_h)`` and
    ``c_h sigma'(s + l_h)``."""
    z = expit(s[:, None] + np.asarray(l)[None, :])
    return np.hstack([z, np.asarray(c)[None, :] * z * (1 - z)])


def _polish(s, g, c, l):
    H = c.size

    def res(x):
        return logistic_sum(s, x[:H], x[H:]) - g

    def jac(x):
        return logistic_jacobian(s, x[:H], x[H:])

    sol = least_squares(
        res,
        np.concatenate([c, l]),
        jac=jac,
        method="lm",
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
        max_nfev=200 * (2 * H + 1),
    )
    return sol.x[:H], sol.x[H:], sol.fun, jac(sol.x)


def _sensitivity(J, scale):
    """Largest parameter change that a perturbation of the data at rounding level can cause."""
    sv = np.linalg.svd(J, compute_uv=False)
    if sv.size == 0 or sv[-1] == 0:
        return np.inf
    return float(_EPS * scale / sv[-1])


def pair_sensitivity(s, c, l, scale):
    """Rounding sensitivity of one pair's fit ``g(s) = sum_h c_h sigma(s + l_h)`` at ``(c, l)``.

    ``eps scale / sigma_min(J)``, ``J`` of shape (K, 2H) the Jacobian of the samples at ``s`` in
    ``(c, l)``: to first order the largest change of an amplitude or shift that a rounding of
    the answers (``scale`` their largest magnitude) can cause; ``inf`` if ``J`` is singular.
    """
    return _sensitivity(logistic_jacobian(s, c, l), scale)


def fit_free(s, g, *, max_terms=None, rtol=1e-12, sensitivity=True):
    """Fit ``g(s) = sum_h c_h sigma(s + l_h)`` with the number of terms found from the data.

    Parameters
    ----------
    s : ndarray of shape (K,)
        Sample points ``log(n / m)``.
    g : ndarray of shape (K,)
        Answers minus ``x^T v``.
    max_terms : int, default=None
        Largest number of terms tried; ``None`` means ``(K - 1) // 2``.
    rtol : float
        Relative accuracy at which AAA stops adding support points.
    sensitivity : bool
        Compute ``info["sensitivity"]`` (an SVD of the Jacobian); otherwise it is NaN.

    Returns
    -------
    c, l : ndarray of shape (H,)
        Amplitudes and shifts, sorted by ``l``.
    info : dict
        ``residual`` (largest absolute misfit), ``sensitivity`` (rounding-level parameter error
        bound from the Jacobian), ``scale`` (largest ``|g|``).
    """
    K = s.size
    scale = float(np.max(np.abs(g))) if K else 0.0
    empty = (np.zeros(0), np.zeros(0), {"residual": scale, "sensitivity": 0.0, "scale": scale})
    if scale == 0.0:
        return empty
    max_terms = (K - 1) // 2 if max_terms is None else max_terms
    r = np.exp(s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            a = AAA(r, g, rtol=rtol, max_terms=max_terms + 1, clean_up=False)
            pol, res = a.poles(), a.residues()
        except (ValueError, np.linalg.LinAlgError):
            return empty[0], empty[1], {"residual": np.inf, "sensitivity": np.inf, "scale": scale}
    keep = (np.abs(pol.imag) <= 1e-6 * np.abs(pol)) & (pol.real < 0) & (np.abs(res) > 1e-9 * scale * np.abs(pol))
    p = -pol.real[keep]
    c = -res.real[keep] / p  # g = sum c - sum c p / (r + p): residue -c p at -p
    l = -np.log(p)
    if c.size == 0:
        return empty[0], empty[1], {"residual": scale, "sensitivity": 0.0, "scale": scale}
    c, l, fun, J = _polish(s, g, c, l)
    order = np.argsort(l)
    sens = _sensitivity(J, scale) if sensitivity else np.nan
    return c[order], l[order], {"residual": float(np.max(np.abs(fun))), "sensitivity": sens, "scale": scale}


def fit_shifts(s, g, c, l0):
    """Refit the shifts ``l`` of ``g(s) = sum_h c_h sigma(s + l_h)`` with the amplitudes ``c`` fixed.

    Returns
    -------
    l : ndarray of shape (H,)
    info : dict
        ``residual`` (largest misfit).
    """

    def res(x):
        return logistic_sum(s, c, x) - g

    def jac(x):
        z = expit(s[:, None] + x[None, :])
        return c[None, :] * z * (1 - z)

    sol = least_squares(res, l0, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=200 * (c.size + 1))
    return sol.x, {"residual": float(np.max(np.abs(sol.fun)))}


def fit_row(s, G, X, c0, R0):
    """Joint fit of ``G[k, t] = sum_h c_h sigma(s_t + r_h^T x_k)`` over all tokens ``x_k``.

    Parameters
    ----------
    s : ndarray of shape (K,)
    G : ndarray of shape (n_x, K)
    X : ndarray of shape (n_x, d)
    c0 : ndarray of shape (H,)
    R0 : ndarray of shape (H, d)
        Starting amplitudes and rows.

    Returns
    -------
    c : ndarray of shape (H,)
    R : ndarray of shape (H, d)
    info : dict
        ``residual`` (largest misfit), ``sensitivity`` (rounding-level parameter error bound),
        ``scale`` (largest ``|G|``).
    """
    H, d = R0.shape
    n_x, K = G.shape
    scale = float(np.max(np.abs(G)))

    def unpack(p):
        return p[:H], p[H:].reshape(H, d)

    def res(p):
        c, R = unpack(p)
        Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])  # (n_x, K, H)
        return (Z @ c - G).ravel()

    def jac(p):
        c, R = unpack(p)
        Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])
        dZ = c * Z * (1 - Z)  # (n_x, K, H)
        Jr = dZ[..., None] * X[:, None, None, :]  # (n_x, K, H, d)
        return np.concatenate([Z.reshape(n_x * K, H), Jr.reshape(n_x * K, H * d)], axis=1)

    sol = least_squares(
        res, np.concatenate([c0, R0.ravel()]), jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=100
    )
    c, R = unpack(sol.x)
    J = jac(sol.x)
    lam_min = float(np.linalg.eigvalsh(J.T @ J)[0])  # sigma_min^2; cheaper than an SVD of J
    sens = _EPS * scale / np.sqrt(lam_min) if lam_min > 0 else np.inf
    return c, R, {"residual": float(np.max(np.abs(sol.fun))), "sensitivity": float(sens), "scale": scale}


# --------------------------------------------------------------------------------------------
# The counts route (learn_canonical_rational): 2H samples per pair, batched over pairs
# --------------------------------------------------------------------------------------------


def ratio_design(H):
    """``2 H`` counts ``(n, m)`` with ``n + m <= 2 H + 1``, ``n, m >= 1``, spread evenly in ``log(n / m)``.

    ``n`` copies of ``u`` then ``m`` copies of the query token ``x``: the longest query has
    ``2 H + 1`` tokens, the follow-up's bound. The ratios ``r = n / m`` cover ``[1 / (2H), 2H]``.

    Examples
    --------
    >>> n, m = ratio_design(1)
    >>> (n / m).tolist(), int((n + m).max())
    ([0.5, 2.0], 3)
    >>> n, m = ratio_design(12)
    >>> n.size, int((n + m).max()), len(set((n / m).tolist()))
    (24, 25, 24)
    """
    a, b = _ratio_design(int(H))
    return a.copy(), b.copy()


@functools.lru_cache(maxsize=32)
def _ratio_design(H):
    """:func:`ratio_design`'s counts, computed once per ``H`` (the caller gets copies)."""
    L = 2 * H + 1
    a, b = np.meshgrid(np.arange(1, L), np.arange(1, L), indexing="ij")
    ok = (a + b <= L) & (np.gcd(a, b) == 1)
    a, b = a[ok], b[ok]
    s = np.log(a / b)
    order = np.argsort(s)
    a, b, s = a[order], b[order], s[order]
    taken = np.zeros(s.size, bool)
    for t in np.linspace(s[0], s[-1], 2 * H):
        j = int(np.argmin(np.where(taken, np.inf, np.abs(s - t))))
        taken[j] = True
    return a[taken], b[taken]


def _negative_real(lam):
    """Poles ``lam`` (complex) taken as real and negative: ``|Im lam| <= 1e-6 |lam|``, ``Re lam < 0``.

    ``numpy.linalg.eigvals`` of a real matrix returns real eigenvalues with a zero imaginary part;
    a conjugate pair this close to the axis is taken as a double real pole (two heads with nearly
    equal shifts at that token) split by rounding. Measured at H = 2 (samples at ``r`` in
    ``[1/4, 4]``, poles near -1.3): imaginary parts of true complex poles are reproduced only above
    about 3e-5 relative; below, the computed pair is real or its imaginary part is rounding.
    """
    return (np.abs(lam.imag) <= 1e-6 * np.abs(lam)) & (lam.real < 0)


#: Largest number of heads at which :func:`interpolate_pairs` takes the Loewner null vector from a
#: QR factorization instead of an SVD (Householder reflections vectorized over the pairs,
#: :func:`_null_vectors`; 0.4-0.55 of a stacked LAPACK QR's time, which was a fifth of the SVD's),
#: the poles from the ``H x H`` block left by deflating ``zeta`` (:func:`_barycentric_poles`; for
#: ``H <= 2`` the roots of the barycentric
#: numerator, :func:`_numerator_roots`) and the amplitudes by modified Gram-Schmidt
#: (:func:`_lstsq_mgs`) instead of a batched QR. These differ from the SVD and the full
#: eigenvalue problem only where the Loewner matrix is ill conditioned, i.e. in rounding noise (a
#: cross product for the null vector at H = 2 was tried: it left 3 of 1,856 pairs of d = 32 misfitting
#: their own samples by up to 1e-8, to be polished, against none). Measured on the pairs of
#: ``random_multi_head(32, H, seed=0)``: the shifts
#: agree to a median 7.6e-14 at H = 2 and 2.5e-11 at H = 4 (QR), and 1.9e-8 at H = 7, where half
#: of the pairs differ by more than 1e-6. From H = 5 on the SVD and the full eigenvalue problem are
#: kept, bit for bit: the shared-amplitude start's threshold (:data:`companion._rowstart.ACCEPT`)
#: was calibrated on their rounding at d = 64, H = 8, and the QR's there accepts a wrong shift
#: below it (misfit 3.7e-10 relative), while ACCEPT = 3e-10 loses H = 8 at d = 64 (row 37 misfits
#: by 0.04).
_SMALL_H = 4


def _barycentric_poles(zs, w, zeta, *, deflate=True):
    """Zeros of the barycentric denominator ``q(z) = sum_j w_j / (z - z_j)``, one set per row of ``w``.

    ``M = diag(zs) + a 1^T`` with ``a = w (zeta - zs) / sum(w)`` has the eigenvalues ``zeta`` and
    the zeros of ``q`` (an eigenvalue ``lam`` other than the ``z_j`` solves
    ``sum_j a_j / (lam - z_j) = 1``, which is ``q(lam) (lam - zeta) = 0``), and ``M w = zeta w``.
    With ``deflate``, a Householder reflection ``Q`` (symmetric, orthogonal) with
    ``Q e_1 = +-w / |w|`` gives ``Q M Q = [[zeta, *], [0, M']]``, and the poles are the eigenvalues
    of the ``H x H`` block ``M'`` (:func:`numpy.linalg.eigvals`; ``M'`` is assembled from ``w`` and
    ``zs`` without forming ``M``), and for ``H <= 2`` the roots of ``q``'s numerator polynomial
    (:func:`_numerator_roots`: the quadratic formula, no matrix and no LAPACK call). Without
    ``deflate``, they are :func:`numpy.linalg.eigvals` of ``M`` without the eigenvalue nearest ``zeta``.

    Parameters
    ----------
    zs : ndarray of shape (H + 1,)
        Support points, all different from ``zeta``.
    w : ndarray of shape (P, H + 1)
        Barycentric weights, each row nonzero.
    zeta : float
        A point far from the poles.
    deflate : bool, default=True
        Deflate ``zeta`` (:func:`interpolate_pairs` up to ``H = _SMALL_H``); ``False``: the full
        eigenvalue problem of ``M``.

    Returns
    -------
    ndarray of shape (P, H), complex
        The ``H`` zeros of each row's ``q`` (a complex pair is conjugate).
    """
    P, n = w.shape
    if deflate and n <= 3:
        return _numerator_roots(zs, w)
    W = w.sum(axis=1, keepdims=True)
    W = np.where(np.abs(W) > 0, W, np.finfo(float).tiny)
    a = -w * (zs - zeta) / W
    if not deflate:
        M = np.zeros((P, n, n)) + np.diag(zs) + a[:, :, None]
        lam = np.linalg.eigvals(M)  # poles and zeta
        drop = np.argmin(np.abs(lam - zeta), axis=1)
        return np.delete(lam, drop[:, None] + n * np.arange(P)[:, None], axis=None).reshape(P, n - 1)
    y = w / np.linalg.norm(w, axis=1, keepdims=True)
    y[:, 0] += np.where(y[:, 0] >= 0, 1.0, -1.0)  # Q = I - 2 y y^T / |y|^2: Q e_1 = -+w / |w|
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    # Q M Q = M - 2 y (y^T M) - 2 (M y) y^T + 4 (y^T M y) y y^T with M = diag(zs) + a 1^T, without
    # forming M: y^T M = y zs + (y . a) 1^T and M y = zs y + a (1 . y); only the block M' (rows and
    # columns 1:) is assembled.
    u = y * zs + np.einsum("pi,pi->p", y, a)[:, None]  # y^T M
    c = zs * y + a * y.sum(axis=1, keepdims=True)  # M y
    mu = np.einsum("pi,pi->p", y, c)  # y^T M y
    y1, u1, c1 = y[:, 1:], u[:, 1:], c[:, 1:]
    B = a[:, 1:, None] - 2 * y1[:, :, None] * (u1 - 2 * mu[:, None] * y1)[:, None, :]
    B -= 2 * c1[:, :, None] * y1[:, None, :]
    B[:, np.arange(n - 1), np.arange(n - 1)] += zs[1:]  # (P, H, H): M'
    return np.linalg.eigvals(B)


def _numerator_roots(zs, w):
    """:func:`_barycentric_poles` for ``H <= 2``: the roots of the numerator
    ``N(z) = q(z) prod_j (z - z_j) = sum_j w_j prod_{i != j} (z - z_i)`` of degree ``H`` (no matrix).

    ``H = 2``: ``N(z) = a z^2 + b z + c`` with ``a = sum_j w_j``,
    ``b = -sum_j w_j sum_{i != j} z_i``, ``c = sum_j w_j prod_{i != j} z_i``, by the quadratic formula
    without cancellation (the root of larger modulus ``-(b + sign(b) sqrt(b^2 - 4 a c)) / (2 a)``, the
    other ``c`` over ``a`` times it), a negative discriminant giving the conjugate pair;
    ``H = 1``: ``(w_0 z_1 + w_1 z_0) / (w_0 + w_1)``. A root that is not finite (a zero leading
    coefficient: a pole at infinity) is NaN, which is not real and negative.
    """
    P, n = w.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        if n == 2:
            lam = ((w[:, 0] * zs[1] + w[:, 1] * zs[0]) / (w[:, 0] + w[:, 1]))[:, None].astype(complex)
        else:
            z0, z1, z2 = zs
            a = w.sum(axis=1)
            b = -(w[:, 0] * (z1 + z2) + w[:, 1] * (z0 + z2) + w[:, 2] * (z0 + z1))
            c = w[:, 0] * (z1 * z2) + w[:, 1] * (z0 * z2) + w[:, 2] * (z0 * z1)
            disc = b * b - 4 * a * c
            root = np.sqrt(np.abs(disc))
            big = -0.5 * (b + np.copysign(root, b))  # a times the root of larger modulus
            real = disc >= 0
            x1 = np.where(real, big / a, -0.5 * b / a)
            x2 = np.where(real, c / big, -0.5 * b / a)
            im = np.where(real, 0.0, 0.5 * root / np.abs(a))
            lam = np.stack([x1 + 1j * im, x2 - 1j * im], axis=1)
    return np.where(np.isfinite(lam), lam, np.nan)


def _null_vectors(A):
    """The last column of the complete QR factor ``Q`` of every ``A`` of shape (P, H + 1, H): a unit
    vector orthogonal to the ``H`` columns (the null vector of ``A^T``), shape (P, H + 1).

    Householder reflections as LAPACK's ``dgeqrf`` chooses them (``beta = -sign(alpha) |x|``, no
    reflection where the column below the diagonal is zero), then ``Q e_{H+1}`` by applying them in
    reverse, as ``dorgqr``; vectorized over ``P`` (``H`` steps of array operations instead of a
    LAPACK call per matrix: 0.4 of the time of :func:`numpy.linalg.qr` at ``H = 2``, 0.5 at ``H = 4``).
    """
    A = np.array(A, dtype=float)
    P, n, H = A.shape
    refl = []
    for k in range(H):
        x = A[:, k:, k]  # (P, n - k)
        alpha = x[:, 0]
        below = np.sqrt(np.einsum("pi,pi->p", x[:, 1:], x[:, 1:]))
        beta = -np.copysign(np.hypot(alpha, below), alpha)
        flat = below == 0
        v = x / np.where(flat, 1.0, alpha - beta)[:, None]
        v[:, 0] = 1.0
        tau = np.where(flat, 0.0, (beta - alpha) / np.where(flat, 1.0, beta))
        if k + 1 < H:
            rest = A[:, k:, k + 1 :]
            rest -= (tau[:, None] * np.einsum("pi,pij->pj", v, rest))[:, None, :] * v[:, :, None]
        refl.append((v, tau))
    q = np.zeros((P, n))
    q[:, -1] = 1.0
    for k in range(H - 1, -1, -1):
        v, tau = refl[k]
        q[:, k:] -= (tau * np.einsum("pi,pi->p", v, q[:, k:]))[:, None] * v
    return q


def _lstsq_mgs(Z, G):
    """``argmin |Z gamma - G|`` for every pair: ``Z`` of shape (P, S, H), ``G`` (P, S) give (P, H).

    Modified Gram-Schmidt on the columns of ``Z`` with ``G`` carried along as one more column, which
    is backward stable for least squares (Bjorck, "Solving linear least squares problems by
    Gram-Schmidt orthogonalization", BIT 7, 1967), then back substitution; vectorized over the
    pairs (``H`` steps of array operations, no LAPACK call per pair). A pair with an exactly zero
    pivot (a column that is 0 at every sample, or exactly dependent) gets the minimum-norm
    amplitudes (``numpy.linalg.pinv``), as the batched QR's singular solve did; a nearly dependent
    one (two nearly equal shifts) gets large amplitudes of opposite signs, as with the QR.
    """
    P, S, H = Z.shape
    Q = Z.transpose(0, 2, 1).copy()  # (P, H, S): the columns, orthonormalized in place
    b = np.array(G, dtype=float)
    R = np.zeros((P, H, H))
    c = np.empty((P, H))
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(H):
            R[:, k, k] = np.sqrt(np.einsum("ps,ps->p", Q[:, k], Q[:, k]))
            Q[:, k] /= R[:, k, k][:, None]
            if k + 1 < H:
                R[:, k, k + 1 :] = np.einsum("ps,pjs->pj", Q[:, k], Q[:, k + 1 :])
                Q[:, k + 1 :] -= R[:, k, k + 1 :, None] * Q[:, k][:, None, :]
            c[:, k] = np.einsum("ps,ps->p", Q[:, k], b)
            b -= c[:, k][:, None] * Q[:, k]
        x = np.empty((P, H))
        for i in range(H - 1, -1, -1):
            x[:, i] = (c[:, i] - np.einsum("pj,pj->p", R[:, i, i + 1 :], x[:, i + 1 :])) / R[:, i, i]
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        x[bad] = np.einsum("phs,ps->ph", np.linalg.pinv(Z[bad]), G[bad])
    return x


def interpolate_pairs(r, G, H, *, realise=False, misfit=False):
    """Type-(H, H) rational interpolation of ``G(r) = sum_h gamma_h r / (r + p_h)``, one per row of ``G``.

    Every row of ``G`` (shape ``(P, 2H)``, sampled at ``r`` of shape ``(2H,)``) together with the
    known value ``G(0) = 0`` is ``2 H + 1`` samples of a rational function of type ``(H, H)``; its
    barycentric interpolant (a Loewner null vector, support points ``0, r_1, r_3, ...``, by QR up
    to ``H = _SMALL_H``, by SVD above) has the poles ``-p_h`` (:func:`_barycentric_poles`).
    Batched over the ``P`` rows.

    With ``realise``, every pole ``lam`` is taken as the real negative ``-|Re lam|`` (clipped to
    ``[1e-12, 1e12]``) instead: no NaN rows, a start for a refit (:mod:`companion._rowstart`), not
    a result.

    With ``misfit``, also the largest ``|sum_h gamma_h sigma(log r + l_h) - G|`` of each row over its
    samples (``inf`` in the NaN rows), from the logistic terms the amplitudes were fitted with.

    Returns
    -------
    gamma, l : ndarray of shape (P, H)
        Amplitudes and shifts ``l_h = -log p_h``, sorted by ``l``; NaN in rows where fewer than
        ``H`` poles are real and negative (unless ``realise``).
    res : ndarray of shape (P,)
        Only with ``misfit``: the largest misfit of each row.
    """
    P, S = G.shape
    zs = np.concatenate([[0.0], r[0::2]])  # H + 1 support points
    zt = r[1::2]  # H test points
    fs = np.concatenate([np.zeros((P, 1)), G[:, 0::2]], axis=1)
    ft = G[:, 1::2]
    Lw = (ft[:, :, None] - fs[:, None, :]) / (zt[:, None] - zs[None, :])  # (P, H, H + 1)
    small = H <= _SMALL_H
    if small:  # the last column of a complete QR of Lw^T: orthogonal to Lw's rows
        w = _null_vectors(Lw.transpose(0, 2, 1))  # (P, H + 1)
    else:  # the last right singular vector
        w = np.linalg.svd(Lw)[2][:, -1, :]
    lam = _barycentric_poles(zs, w, 1.0 + r.max(), deflate=small)  # zeta: a point far from the poles
    real = _negative_real(lam)
    if realise:
        lam = -np.clip(np.abs(lam.real), 1e-12, 1e12)
        real = np.ones_like(real)
    good = real.all(axis=1)
    p = np.where(real, -lam.real, 1.0)
    l = -np.log(p)
    Z = expit(np.log(r)[None, :, None] + l[:, None, :])  # (P, 2H, H)
    # The amplitudes by least squares, only where every pole is real: up to _SMALL_H by modified
    # Gram-Schmidt vectorized over the pairs (_lstsq_mgs: a third of the time of the batched QR and
    # its solve at H = 2 and 4), above through a batched QR (a batched pinv's SVDs cost 15 times as
    # much: a fifth of the learner at d = 32, H = 4).
    gamma = np.full((P, H), np.nan)
    if good.any():
        Zg, Gg = Z[good], G[good]
        if small:
            gamma[good] = _lstsq_mgs(Zg, Gg)
        else:
            try:
                Q, Rq = np.linalg.qr(Zg)
                gamma[good] = np.linalg.solve(Rq, Q.transpose(0, 2, 1) @ Gg[..., None])[..., 0]
            except np.linalg.LinAlgError:  # two exactly equal shifts: the minimum-norm amplitudes
                gamma[good] = np.einsum("phs,ps->ph", np.linalg.pinv(Zg), Gg)
    if misfit:
        res = np.full(P, np.inf)
        if good.any():
            res[good] = np.max(np.abs(np.einsum("psh,ph->ps", Zg, gamma[good]) - Gg), axis=1)
    order = np.argsort(l, axis=1)
    l = np.take_along_axis(l, order, axis=1)
    gamma = np.take_along_axis(gamma, order, axis=1)
    l[~good] = np.nan
    gamma[~good] = np.nan
    return (gamma, l, res) if misfit else (gamma, l)


def polish_pairs(s, G, gamma, l, *, iters=30, fixed_gamma=False):
    """Levenberg-Marquardt on ``G[p] = sum_h gamma_h sigma(s + l_h)``, batched over the rows.

    With ``fixed_gamma`` only the shifts move (the amplitudes shared by a row of pairs are known):
    ``H`` unknowns from ``2 H`` samples, far better conditioned than the free fit.

    Returns
    -------
    gamma, l : ndarray of shape (P, H)
    residual : ndarray of shape (P,)
        Largest absolute misfit of each row.
    """
    P, H = gamma.shape
    theta = np.concatenate([gamma, l], axis=1)
    mu = np.full(P, 1e-3)
    free = slice(H, 2 * H) if fixed_gamma else slice(0, 2 * H)
    nf = H if fixed_gamma else 2 * H

    def parts(th):
        Z = expit(s[None, :, None] + th[:, None, H:])
        res = np.einsum("psh,ph->ps", Z, th[:, :H]) - G
        return Z, res

    Z, res = parts(theta)
    cost = np.sum(res**2, axis=1)
    ii = np.arange(nf)
    done = np.zeros(P, bool)
    for _ in range(iters):
        B = theta[:, None, :H] * Z * (1 - Z)  # d/dl
        J = B if fixed_gamma else np.concatenate([Z, B], axis=2)
        A = J.transpose(0, 2, 1) @ J  # batched BLAS: a fifth of the time of the einsum
        g = np.einsum("psi,ps->pi", J, res)
        D = np.einsum("pii->pi", A) + 1e-300
        A[:, ii, ii] += mu[:, None] * D  # Levenberg-Marquardt damping, in place
        step = -np.linalg.solve(A, g[..., None])[..., 0]
        new = theta.copy()
        new[:, free] += step
        Zn, rn = parts(new)
        cn = np.sum(rn**2, axis=1)
        better = np.isfinite(cn) & (cn < cost)
        settled = ~better | (cost - cn <= 1e-3 * cost)
        theta[better], Z[better], res[better], cost[better] = new[better], Zn[better], rn[better], cn[better]
        mu = np.where(better, mu / 10, mu * 10).clip(1e-12, 1e12)
        done = done & settled if _ else settled
        if done.all() and _ >= 3:  # every pair converged or stuck
            break
    return theta[:, :H], theta[:, H:], np.max(np.abs(res), axis=1)


def fit_row_joint(s, G, X, gamma, R, *, XX=None, iters=8):
    """Joint Levenberg-Marquardt of ``G[k, t] = sum_h gamma_h sigma(s_t + R_h^T x_k)`` over a row.

    The normal equations are assembled blockwise (``(B_k^T B_k) kron x_k x_k^T`` summed by one
    matrix product over the tokens), so one step costs ``O(K H^2 d^2 + (H d)^3)``.

    Parameters
    ----------
    s : ndarray of shape (S,)
    G : ndarray of shape (K, S)
    X : ndarray of shape (K, d)
    gamma : ndarray of shape (H,)
    R : ndarray of shape (H, d)
    XX : ndarray of shape (K, d * d), optional
        ``x_k x_k^T`` flattened (shared by every row with the same tokens).

    Returns
    -------
    gamma : ndarray of shape (H,)
    R : ndarray of shape (H, d)
    info : dict
        ``residual`` (largest misfit), ``scale`` (largest ``|G|``), ``iterations``.
    """

    K, S = G.shape
    H, d = R.shape
    XX = np.einsum("ka,kb->kab", X, X).reshape(K, d * d) if XX is None else XX
    scale = float(np.max(np.abs(G)))

    def parts(gm, Rm):
        Z = expit(s[None, :, None] + (X @ Rm.T)[:, None, :])  # (K, S, H)
        return Z, Z @ gm - G

    start = np.concatenate([gamma, R.ravel()])
    Z, res = parts(gamma, R)
    cost = float(np.sum(res**2))
    floor = (_EPS * scale) ** 2 * G.size  # rounding level of the data
    mu = 1e-3
    it = 0
    for it in range(1, iters + 1):
        if cost <= floor:
            break
        B = gamma * Z * (1 - Z)  # (K, S, H)
        Agg = np.einsum("ksh,ksg->hg", Z, Z)
        C = np.einsum("ksh,ksg->khg", Z, B).reshape(K, H * H)
        AgR = (C.T @ X).reshape(H, H, d).reshape(H, H * d)
        M = np.einsum("ksh,ksg->khg", B, B).reshape(K, H * H)
        ARR = (M.T @ XX).reshape(H, H, d, d).transpose(0, 2, 1, 3).reshape(H * d, H * d)
        A = np.block([[Agg, AgR], [AgR.T, ARR]])
        g = np.concatenate([np.einsum("ksh,ks->h", Z, res), (np.einsum("ksh,ks->kh", B, res).T @ X).ravel()])
        diag = np.diag(A) + 1e-12 * np.max(np.diag(A))
        improved = converged = False
        for _ in range(16):
            try:
                step = -cho_solve(cho_factor(A + mu * np.diag(diag), check_finite=False), g, check_finite=False)
            except np.linalg.LinAlgError:
                mu *= 10
                continue
            gn, Rn = gamma + step[:H], R + step[H:].reshape(H, d)
            Zn, rn = parts(gn, Rn)
            cn = float(np.sum(rn**2))
            if np.isfinite(cn) and cn < cost:
                converged = cn > 0.5 * cost and cn <= 1e4 * floor  # at rounding level, slowing
                gamma, R, Z, res, cost = gn, Rn, Zn, rn, cn
                mu = max(mu / 10, 1e-12)
                improved = True
                break
            mu *= 10
        if not improved or converged:
            break
    if 1e4 * floor < cost <= (1e-6 * scale) ** 2 * G.size:
        # The normal equations square the condition number of the Jacobian; where they stall close
        # to the answer, the QR-based Levenberg-Marquardt of MINPACK (scipy.optimize.least_squares)
        # finishes. From a start that is far off (a misfit above 1e-6 relative after the steps above)
        # it would take seconds to fail as well: the caller then redraws the row.
        def fun(p):
            return parts(p[:H], p[H:].reshape(H, d))[1].ravel()

        def jac(p):
            Zp = expit(s[None, :, None] + (X @ p[H:].reshape(H, d).T)[:, None, :])
            Bp = p[:H] * Zp * (1 - Zp)
            return np.concatenate(
                [Zp.reshape(K * S, H), (Bp[..., None] * X[:, None, None, :]).reshape(K * S, H * d)], axis=1
            )

        sol = least_squares(fun, start, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=50 * (H + 1))
        if np.sum(sol.fun**2) < cost:
            gamma, R = sol.x[:H], sol.x[H:].reshape(H, d)
            Z, res = parts(gamma, R)
        it += int(sol.nfev)
    return gamma, R, {"residual": float(np.max(np.abs(res))), "scale": scale, "iterations": it}


def fit_rows_joint(s, G, X, gamma, R, *, XX=None, iters=60, stall=None, damping=1e-8, max_bytes=2**27):
    """:func:`fit_row_joint`'s Levenberg-Marquardt steps for many rows at once (batched linear algebra).

    Rows share the sample points ``s`` and the tokens ``X``; each row keeps its own damping and
    stops on its own. No MINPACK fallback: a row that is not at rounding level afterwards is for
    the caller to refit with :func:`fit_row_joint`.

    Parameters
    ----------
    s : ndarray of shape (S,)
    G : ndarray of shape (N, K, S)
    X : ndarray of shape (K, d)
    gamma : ndarray of shape (N, H)
    R : ndarray of shape (N, H, d)
    XX : ndarray of shape (K, d * d), optional
    iters : int
        Largest number of damped steps tried per row (a rejected step counts).
    stall : float, optional
        A row also stops when an accepted step leaves more than this fraction of its cost
        (``0 < stall < 1``): for data that no sum of ``H`` heads fits exactly (the continuation's
        intermediate data), whose fits stop at a nonzero minimum instead of rounding level. None:
        only at rounding level, when stuck, or at ``iters``.
    damping : float
        Levenberg-Marquardt's first damping ``mu`` (relative to the normal matrix's diagonal):
        1e-8, Gauss-Newton steps from the first, for starts that are close.
    max_bytes : int
        Rows are processed in chunks whose normal matrices take at most about this many bytes.

    Returns
    -------
    gamma : ndarray of shape (N, H)
    R : ndarray of shape (N, H, d)
    residual, scale : ndarray of shape (N,)
        Largest misfit and largest ``|G|`` of each row.
    """
    N, K, S = G.shape
    H, d = R.shape[1:]
    XX = np.einsum("ka,kb->kab", X, X).reshape(K, d * d) if XX is None else XX
    p = H * (d + 1)
    chunk = max(1, int(max_bytes // (8 * 4 * p * p + 8 * 6 * K * S * H)))
    gamma, R = gamma.astype(float).copy(), R.astype(float).copy()
    residual, scale = np.empty(N), np.max(np.abs(G), axis=(1, 2))
    for lo in range(0, N, chunk):
        sl = slice(lo, min(N, lo + chunk))
        gamma[sl], R[sl], residual[sl] = _fit_rows_chunk(
            s, G[sl], X, XX, gamma[sl], R[sl], scale[sl], iters, stall, damping
        )
    return gamma, R, residual, scale


@functools.lru_cache(maxsize=8)
def _normal_layout(H, d):
    """Where each entry of the normal matrix of :func:`fit_rows_joint` (shape (p, p), ``p = H (d + 1)``)
    comes from, as indices into ``[raw, Agg, AgR]`` flattened (see :func:`_fit_rows_chunk`): ``raw``
    holds one ``d x d`` block per head pair ``h <= g`` and only its upper triangle, since
    ``A_{hg} = sum_k (B_k^T B_k)_{hg} x_k x_k^T`` is symmetric and ``A_{gh} = A_{hg}``.

    Returns the index map (read-only) and the upper-triangle indices of ``H`` and of ``d``.
    """
    T, D2 = H * (H + 1) // 2, d * (d + 1) // 2

    def tri(n):
        t = np.zeros((n, n), np.intp)
        t[np.triu_indices(n)] = np.arange(n * (n + 1) // 2)
        return np.maximum(t, t.T)

    hh, ii = np.repeat(np.arange(H), d), np.tile(np.arange(d), H)
    idx = np.empty((H * (d + 1), H * (d + 1)), np.intp)
    idx[H:, H:] = tri(H)[hh[:, None], hh[None, :]] * D2 + tri(d)[ii[:, None], ii[None, :]]
    idx[:H, :H] = T * D2 + np.arange(H * H).reshape(H, H)
    idx[:H, H:] = T * D2 + H * H + np.arange(H)[:, None] * (H * d) + (hh * d + ii)[None, :]
    idx[H:, :H] = idx[:H, H:].T
    idx.flags.writeable = False
    return idx, np.triu_indices(H), np.triu_indices(d)


def _fit_rows_chunk(s, G, X, XX, gamma, R, scale, iters, stall=None, damping=1e-8):
    n, K, S = G.shape
    H, d = R.shape[1:]
    idx, (h0, h1), (j0, j1) = _normal_layout(H, d)
    XXu = XX[:, j0 * d + j1]  # the upper triangles of x_k x_k^T
    potrf, potrs = get_lapack_funcs(("potrf", "potrs"), (XX,))
    Z, res = _parts_rows(s, X, G, gamma, R)
    cost = np.sum(res**2, axis=(1, 2))
    floor = (_EPS * scale) ** 2 * K * S
    mu = np.full(n, float(damping))
    fails = np.zeros(n, int)
    done = cost <= floor
    for _ in range(iters):
        a = np.flatnonzero(~done)
        if a.size == 0:
            break
        Za, ra, ga = (Z, res, gamma) if a.size == n else (Z[a], res[a], gamma[a])
        B = ga[:, None, None, :] * Za * (1 - Za)  # (a, K, S, H)
        Zf = Za.reshape(a.size, K * S, H)
        Agg = Zf.transpose(0, 2, 1) @ Zf
        C = (Za.transpose(0, 1, 3, 2) @ B).reshape(a.size, K, H * H)
        AgR = (C.transpose(0, 2, 1) @ X).reshape(a.size, H * H * d)
        M = (B.transpose(0, 1, 3, 2) @ B)[:, :, h0, h1]  # (a, K, T): the head pairs h <= g
        # (B_k^T B_k) kron x_k x_k^T summed over the tokens: one matrix product for all rows, over
        # the distinct head pairs and the upper triangles only (a quarter of the full product at
        # large H), then every entry of the normal matrix gathered in one pass (_normal_layout).
        raw = (M.transpose(0, 2, 1).reshape(-1, K) @ XXu).reshape(a.size, -1)
        A = np.take(np.concatenate([raw, Agg.reshape(a.size, H * H), AgR], axis=1), idx, axis=1)
        gB = (B.transpose(0, 1, 3, 2) @ ra[..., None])[..., 0]  # (a, K, H)
        g = np.concatenate(
            [
                (Zf.transpose(0, 2, 1) @ ra.reshape(a.size, K * S, 1))[..., 0],
                (gB.transpose(0, 2, 1) @ X).reshape(a.size, -1),
            ],
            axis=1,
        )
        diag = np.einsum("nii->ni", A)
        diag = diag + 1e-12 * diag.max(axis=1, keepdims=True)
        ii = np.arange(A.shape[1])
        A[:, ii, ii] += mu[a, None] * diag
        # Cholesky (the damped normal matrix is positive definite; half the work of an LU, by LAPACK
        # directly: scipy's cho_factor checks cost more than the factorization below p ~ 150), with
        # LU then least squares for a matrix that rounding leaves indefinite or singular.
        step = np.empty_like(g)
        for j in range(a.size):
            # A[j].T is A[j] (symmetric) in Fortran order: LAPACK's lower triangle without the
            # transposing copy that a C-ordered argument costs (measured 4.4 vs 5.6 ms at p = 780)
            c, info = potrf(A[j].T, lower=True, overwrite_a=False, clean=False)
            if info == 0:
                step[j] = -potrs(c, g[j], lower=True)[0]
                continue
            try:
                step[j] = -np.linalg.solve(A[j], g[j])
            except np.linalg.LinAlgError:
                step[j] = np.linalg.lstsq(A[j], -g[j], rcond=None)[0]
        gn, Rn = ga + step[:, :H], R[a] + step[:, H:].reshape(a.size, H, d)
        Zn, rn = _parts_rows(s, X, G[a], gn, Rn)
        cn = np.sum(rn**2, axis=(1, 2))
        cost_before = cost[a]
        better = np.isfinite(cn) & (cn < cost_before)
        slowing = ~better | (cn > 0.5 * cost_before)
        b = a[better]
        gamma[b], R[b], Z[b], res[b], cost[b] = gn[better], Rn[better], Zn[better], rn[better], cn[better]
        mu[a] = np.where(better, np.maximum(mu[a] / 10, 1e-12), mu[a] * 10)
        fails[a] = np.where(better, 0, fails[a] + 1)
        # Stop at rounding level: within 100 eps of the data in the mean (cost within 1e4 of
        # ``floor``) once a step no longer halves the cost (rejected or not), or when stuck. Measured
        # d = 64, H = 12, seeds 0-5 (moment start): a row's last Gauss-Newton step takes its cost from
        # 1e4 to 1e5 floor down to 2 to 10 floor, where it stays; stopping as soon as the cost was
        # within 1e4 (before 2026-12-02) skipped that step and left the heads 3 to 200 times less
        # accurate (W error 7.0e-9 to 5.6e-7 on seeds 0-3, against 1.3e-9 to 2.7e-9): the rows'
        # Jacobians have condition numbers of about 2e6.
        near = cost[a] <= 1e4 * floor[a]
        done[a] = (near & slowing) | (fails[a] >= 16) | (cost[a] <= floor[a])
        if stall is not None:
            done[a] |= better & (cn > stall * cost_before)
    return gamma, R, np.max(np.abs(res), axis=(1, 2))


def _parts_rows(s, X, G, gm, Rm):
    """``Z = sigma(s_t + R_h^T x_k)`` of shape (n, K, S, H) and the misfit ``Z gamma - G``."""
    Z = expit(s[None, None, :, None] + (Rm @ X.T).transpose(0, 2, 1)[:, :, None, :])
    return Z, np.einsum("nksh,nh->nks", Z, gm) - G
