"""Fitting ``g(s) = sum_h c_h sigma(s + l_h)``: the one-dimensional problem behind learn_canonical.

Private helpers of :func:`companion.multihead.learn_canonical` (this book's construction, not the
paper's). A query of ``n`` copies of a token ``u`` followed by ``m`` copies of the query token
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

import warnings

import numpy as np
from scipy.interpolate import AAA
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


def _polish(s, g, c, l):
    H = c.size

    def res(x):
        return logistic_sum(s, x[:H], x[H:]) - g

    def jac(x):
        z = expit(s[:, None] + x[None, H:])
        return np.hstack([z, x[None, :H] * z * (1 - z)])

    sol = least_squares(res, np.concatenate([c, l]), jac=jac, method="lm", xtol=1e-15, ftol=1e-15,
                        gtol=1e-15, max_nfev=200 * (2 * H + 1))
    return sol.x[:H], sol.x[H:], sol.fun, jac(sol.x)


def _sensitivity(J, scale):
    """Largest parameter change that a perturbation of the data at rounding level can cause."""
    sv = np.linalg.svd(J, compute_uv=False)
    if sv.size == 0 or sv[-1] == 0:
        return np.inf
    return float(_EPS * scale / sv[-1])


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
    keep = ((np.abs(pol.imag) <= 1e-6 * np.abs(pol)) & (pol.real < 0)
            & (np.abs(res) > 1e-9 * scale * np.abs(pol)))
    p = -pol.real[keep]
    c = -res.real[keep] / p              # g = sum c - sum c p / (r + p): residue -c p at -p
    l = -np.log(p)
    if c.size == 0:
        return empty[0], empty[1], {"residual": scale, "sensitivity": 0.0, "scale": scale}
    c, l, fun, J = _polish(s, g, c, l)
    order = np.argsort(l)
    sens = _sensitivity(J, scale) if sensitivity else np.nan
    return c[order], l[order], {"residual": float(np.max(np.abs(fun))), "sensitivity": sens,
                                "scale": scale}


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

    sol = least_squares(res, l0, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15,
                        max_nfev=200 * (c.size + 1))
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
        Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])          # (n_x, K, H)
        return (Z @ c - G).ravel()

    def jac(p):
        c, R = unpack(p)
        Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])
        dZ = (c * Z * (1 - Z))                                        # (n_x, K, H)
        Jr = dZ[..., None] * X[:, None, None, :]                       # (n_x, K, H, d)
        return np.concatenate([Z.reshape(n_x * K, H), Jr.reshape(n_x * K, H * d)], axis=1)

    sol = least_squares(res, np.concatenate([c0, R0.ravel()]), jac=jac, method="lm", xtol=1e-15,
                        ftol=1e-15, gtol=1e-15, max_nfev=100)
    c, R = unpack(sol.x)
    J = jac(sol.x)
    lam_min = float(np.linalg.eigvalsh(J.T @ J)[0])       # sigma_min^2; cheaper than an SVD of J
    sens = _EPS * scale / np.sqrt(lam_min) if lam_min > 0 else np.inf
    return c, R, {"residual": float(np.max(np.abs(sol.fun))), "sensitivity": float(sens),
                  "scale": scale}
