"""Rank-one-projection (ROP) measurements of a merged matrix ``W`` (shared by §5 and §6).

One two-token value query ``c [(a + b)^T; b^T]`` measures the rank-one projection
``<a b^T, W> = a^T W b`` of Cai & Zhang (2015) through the two-token identity: its answer is
``c (b^T v + sigma(c^2 a^T W b) a^T v)``. This module holds what every ROP learner shares:

* ``gaussian_rop_design`` -- Gaussian left and right vectors ``a_k, b_k ~ N(0, I_d / d)``,
  with :func:`_redraw_small` (also Theorem 4.1's Gaussian probes) redrawing a small ``a^T v``;
* :func:`rop_queries` -- the queries themselves (``companion._streaming.answer_rop`` builds the
  same values chunk by chunk; Theorem 4.1's, Theorem 6.2's and the orthogonal-heads learner's
  queries are these with ``b = e_j``);
* :func:`rop_scales`, :func:`rop_error_bound` -- the scales that keep the logit in Lemma 6.1's
  window whatever ``W*`` with ``||W*||_F <= W_max``, and the bound on one noisy measurement.

Layer: shared numerics (see :mod:`companion.numerics`); no import from ``companion``. Public
names are re-exported where users import them: ``companion.lowrank.rop_queries``,
``companion.robust.rop_scales``, ``companion.robust.rop_error_bound``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

__all__ = ["rop_queries", "rop_scales", "rop_error_bound", "design_product"]

_SMALL_AV = 1e-3  # a Gaussian left vector with |a^T v| < 1e-3 ||v|| / sqrt(d) is redrawn


def rop_queries(A, B, c=1.0) -> np.ndarray:
    """The two-token queries ``c_k [(a_k + b_k)^T; b_k^T]`` of rank-one projections.

    Parameters
    ----------
    A, B : ndarray of shape (m, d)
        Left vectors ``a_k`` and right vectors ``b_k`` as rows.
    c : float or ndarray of shape (m,), default=1.0
        Scale of each query.

    Returns
    -------
    ndarray of shape (m, 2, d)

    Notes
    -----
    By the two-token identity ``f([u^T; x^T]) = x^T v + sigma(u^T W x - x^T W x)(u^T v - x^T v)``
    with ``u = c (a + b)`` and ``x = c b``, the answer is
    ``c (b^T v + sigma(c^2 a^T W b) a^T v)`` (§5 of [1]_ with ``c = 1``).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> head = random_single_head(3, seed=0)
    >>> a, b = np.array([[1.0, 0.5, 0.0]]), np.array([[0.0, 1.0, -1.0]])
    >>> y = head(rop_queries(a, b))
    >>> alpha = (y - b @ head.v) / (a @ head.v)
    >>> bool(np.allclose(np.log(alpha / (1 - alpha)), a @ head.W @ b[0]))
    True
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    m, d = np.broadcast_shapes(A.shape, B.shape)
    X = np.empty((m, 2, d))  # one (m, 2, d) array, no temporaries
    np.add(A, B, out=X[:, 0])
    X[:, 1] = B
    X *= np.reshape(np.asarray(c, dtype=np.float64), (-1, 1, 1))
    return X


def gaussian_rop_design(d, m, v, rng, dtype=np.float64):
    """Gaussian ROP vectors ``a_k, b_k ~ N(0, I_d / d)`` (rows of ``A``, ``B``), shape (m, d) each.

    A left vector with ``|a^T v| < 1e-3 ||v|| / sqrt(d)`` (probability 8e-4) is redrawn: it would
    divide the answer by almost 0. The ``1/d`` variance (the paper's is 1) rescales the
    measurement operator only, which changes neither the nuclear-norm program's solution nor the
    least-squares fits, and keeps ``a^T W b`` of order ``||W||_F / d``.

    ``dtype=np.float32``: the same draws rounded to float32, made in row chunks of
    :data:`_DRAW_CHUNK_BYTES` (no float64 ``(m, d)`` array): a design that float32 holds exactly,
    so that a float32 solver (``companion.numerics.rgn._rgn``) needs no copy of it and the
    measurements are of exactly these vectors; half the memory (at ``d = 1024``, ``m = 129,024``:
    1.06 GB instead of 2.1 GB, each fresh GB costing about 1 CPU s of page faults here).
    """
    A, B = np.empty((m, d), dtype=dtype), np.empty((m, d), dtype=dtype)
    if A.dtype == np.float64:
        for M in (A, B):  # in place: the values of rng.standard_normal((m, d)) / sqrt(d), no temporary
            rng.standard_normal(out=M)
            M /= math.sqrt(d)
        return _redraw_small(A, v, _SMALL_AV, rng), B
    n = max(1, _DRAW_CHUNK_BYTES // (8 * d))
    buf = np.empty((min(n, m), d))
    for M in (A, B):  # row chunks of the same stream: the values of the float64 draw, rounded
        for s0 in range(0, m, n):
            e = min(m, s0 + n)
            rng.standard_normal(out=buf[: e - s0])
            buf[: e - s0] /= math.sqrt(d)
            M[s0:e] = buf[: e - s0]
    return _redraw_small(A, v, _SMALL_AV, rng), B


#: Rows of a float32 design drawn at once by ``gaussian_rop_design`` (float64 bytes).
_DRAW_CHUNK_BYTES = 4 * 2**20


def row_chunks(m, d, nbytes):
    """``(start, end)`` row ranges covering ``0 .. m``, each at most ``nbytes`` bytes of a float64
    ``(m, d)`` array (one row at least): the chunking of :func:`design_product` and of
    ``companion.numerics.rgn``'s products."""
    n = max(1, nbytes // (8 * d))
    return [(s, min(m, s + n)) for s in range(0, m, n)]


def design_product(A, M) -> np.ndarray:
    """``A @ M`` in float64 for a design ``A`` stored in float64 or float32.

    Parameters
    ----------
    A : ndarray of shape (m, d), float64 or float32
        Left or right vectors as rows (a float32 design of ``gaussian_rop_design``).
    M : ndarray of shape (d,) or (d, k)
        float64.

    Returns
    -------
    ndarray of shape (m,) or (m, k), float64
        ``A @ M``; for a float32 ``A`` computed in row chunks of ``_DRAW_CHUNK_BYTES`` bytes, each
        upcast to float64 in cache, so no float64 copy of ``A`` is made (``numpy.matmul`` of a
        float32 and a float64 array casts the whole float32 array first) and the result is the
        float64 product of the float32 values.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.arange(6, dtype=np.float32).reshape(3, 2) / 3
    >>> M = np.array([[1.0, 0.5], [0.25, 1.0]])
    >>> bool(np.array_equal(design_product(A, M), A.astype(np.float64) @ M))
    True
    """
    if A.dtype == np.float64:
        return A @ M
    m, d = A.shape
    out = np.empty((m,) + np.shape(M)[1:])
    for s0, e in row_chunks(m, d, _DRAW_CHUNK_BYTES):
        out[s0:e] = A[s0:e].astype(np.float64) @ M
    return out


def at_unit_max(v):
    """``v`` divided by its largest ``|entry|`` (``v`` itself if it is zero): the same direction, with
    a norm in ``[1, sqrt(d)]``, for rules that depend on ``v``'s direction only (``||v||`` overflows
    at ``v`` scaled by 1e300 and underflows at 1e-300).

    >>> import numpy as np
    >>> at_unit_max(np.array([1e300, -2e300])).tolist(), at_unit_max(np.zeros(2)).tolist()
    ([0.5, -1.0], [0.0, 0.0])
    """
    vmax = float(np.max(np.abs(v), initial=0.0))
    return v / vmax if vmax > 0 else v


def _redraw_small(A, v, floor, rng):
    """Redraw, in place, each row ``a`` of ``A`` (drawn ``N(0, I_d / d)``) with ``|a^T v| < floor ||v|| / sqrt(d)``.

    The one rule for Gaussian vectors that divide an answer by ``a^T v``: the ROP design's left
    vectors (``floor`` = 1e-3) and Theorem 4.1's Gaussian probes
    (``companion.exact.GAUSSIAN_PROBE_FLOOR``, 0.1). Redrawn rows come from ``rng`` in row order,
    until none is left below the floor. Returns ``A``.
    """
    d = A.shape[1]
    v = at_unit_max(v)  # the rule depends on v's direction only
    cut = floor * np.linalg.norm(v) / math.sqrt(d)
    bad = np.abs(design_product(A, v)) < cut
    while np.any(bad):
        A[bad] = rng.standard_normal((int(bad.sum()), d)) / math.sqrt(d)
        bad = np.abs(design_product(A, v)) < cut
    return A


def rop_scales(A, B, *, W_max, logit_max=0.5) -> np.ndarray:
    """Scales ``c_k`` of the ROP queries ``c_k [(a_k + b_k)^T; b_k^T]`` under §6's assumptions.

    Parameters
    ----------
    A, B : ndarray of shape (m, d)
        Left and right vectors (rows), nonzero.
    W_max : float
        Known bound on ``||W*||_F`` (so on ``||W*||_2``), ``> 0``.
    logit_max : float, default=0.5
        Largest logit allowed; ``1/2`` is Lemma 6.1's window.

    Returns
    -------
    ndarray of shape (m,)
        The largest ``c_k`` with both tokens in the unit ball (``c ||a + b|| <= 1``, ``c ||b|| <= 1``)
        and ``c**2 ||a|| ||b|| W_max <= logit_max``, so the logit ``c**2 a^T W* b`` lies in
        ``[-logit_max, logit_max]`` for every admissible ``W*``.

    Examples
    --------
    >>> import numpy as np
    >>> c = rop_scales(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), W_max=4.0)
    >>> round(float(c[0]) ** 2 * 4.0, 12)     # the logit bound binds: c^2 W_max = 1/2
    0.5
    """
    na, nb = np.linalg.norm(A, axis=1), np.linalg.norm(B, axis=1)
    return np.minimum.reduce([1.0 / np.linalg.norm(A + B, axis=1), 1.0 / nb, np.sqrt(logit_max / (W_max * na * nb))])


def rop_error_bound(alpha_hat, *, tau, c, A, B, av_hat, logit_max=0.5):
    """Bound on the error of one noisy ROP measurement ``t_hat_k`` of ``<a_k b_k^T, W*>``.

    Parameters
    ----------
    alpha_hat : ndarray of shape (m,)
        Estimated attention weights ``(y_hat / c - b^T v_hat) / (a^T v_hat)`` (before clipping).
    tau : float
        The oracle's tolerance (length-1 and length-2 answers), ``>= 0``.
    c : ndarray of shape (m,)
        Query scales from :func:`rop_scales`.
    A, B : ndarray of shape (m, d)
        Left and right vectors.
    av_hat : ndarray of shape (m,)
        ``a_k^T v_hat``, nonzero.
    logit_max : float, default=0.5
        The logit bound the scales guarantee.

    Returns
    -------
    delta : ndarray of shape (m,)
        ``|t_hat_k - a_k^T W* b_k| <= delta_k`` for every head the answers are consistent with.
    d_alpha : ndarray of shape (m,)
        The bound on ``|alpha_hat_k - alpha*_k|`` behind it.

    Notes
    -----
    With ``|y_hat - y| <= tau`` and ``|v_hat_i - v*_i| <= tau``,
    ``alpha_hat - alpha* = (e / c - b^T (v_hat - v*) - alpha* a^T (v_hat - v*)) / a^T v_hat``, so

    ``|alpha_hat - alpha*| <= tau (1 / c + ||b||_1 + sigma(x) ||a||_1) / |a^T v_hat| = d_alpha``

    with ``x = logit_max``. As in Lemma 6.1 [1]_, ``alpha*`` lies in the window
    ``[sigma(-x), sigma(x)]`` and clipping ``alpha_hat`` to it moves it no farther from ``alpha*``;
    both then lie in ``I = [clip(alpha_hat) - d_alpha, clip(alpha_hat) + d_alpha]`` intersected with
    the window, on which ``sigma^-1`` has slope at most ``1 / min_I p (1 - p)``. Hence the logit errs by
    at most ``min(d_alpha / min_I p (1 - p), 2x)`` and ``t = logit / c**2`` by that over ``c**2``.
    Lemma 6.1 is the case ``I`` = the whole window (slope ``1 / (sigma(x) sigma(-x))``).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> delta, d_alpha = rop_error_bound(np.array([0.5]), tau=1e-4, c=np.array([0.5]),
    ...                                  A=np.ones((1, 2)), B=np.ones((1, 2)), av_hat=np.array([1.0]))
    >>> round(float(d_alpha[0]), 8), round(float(delta[0] / d_alpha[0]), 4)   # slope ~ 4, c^2 = 1/4
    (0.00052449, 16.0)
    """
    x = float(logit_max)
    lo, hi = float(expit(-x)), float(expit(x))
    d_alpha = tau * (1.0 / c + np.abs(B).sum(1) + hi * np.abs(A).sum(1)) / np.abs(av_hat)
    a_c = np.clip(alpha_hat, lo, hi)
    p_lo = np.clip(a_c - d_alpha, lo, hi)
    p_hi = np.clip(a_c + d_alpha, lo, hi)
    # p (1 - p) is concave: its minimum over an interval is at an end point.
    slope_den = np.minimum(p_lo * (1 - p_lo), p_hi * (1 - p_hi))
    delta_logit = np.minimum(d_alpha / slope_den, 2 * x)
    return delta_logit / c**2, d_alpha


# The former private names, kept for code and tests that import them.
_gaussian_rop_design = gaussian_rop_design
_at_unit_max = at_unit_max
