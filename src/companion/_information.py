"""How much the counts route's float64 answers say: one pair's shifts against a whole row's heads.

Private helper of ``benchmarks/why_H_stops.py`` (this book's own analysis of
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

from .errors import InvalidInputError

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


def pair_bound(s, gamma, l, sigma, *, fixed_gamma=False):
    """Cramer-Rao standard deviation of each shift of one pair's fit, batched over pairs.

    Parameters
    ----------
    s : ndarray of shape (S,)
        Sample points ``log r``.
    gamma, l : ndarray of shape (P, H)
        Amplitudes and shifts of each pair (the true ones: the bound is local).
    sigma : float
        Standard deviation of an answer's error (``> 0``).
    fixed_gamma : bool, default=False
        The amplitudes known (shared by a row's pairs): only the ``H`` shifts are unknown.

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
    if not (np.isfinite(sigma) and sigma > 0):
        raise InvalidInputError(f"sigma={sigma!r} must be positive and finite (an answer's error s.d.).")
    H = gamma.shape[1]
    Z = expit(s[None, :, None] + l[:, None, :])  # (P, S, H)
    B = gamma[:, None, :] * Z * (1 - Z)
    J = B if fixed_gamma else np.concatenate([Z, B], axis=2)
    return _bound(J, sigma)[:, -H:]


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

    The matrix is :func:`companion._rational.interpolate_pairs`'s (support points ``0, r_1, r_3,
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
