"""Rounding-error bounds of float64 computations: the bounds the chapters check their gaps against.

A chapter that compares two float64 computations of the same number (the native and the merged
form of a head, a model and the sum of its heads) states that they agree "to rounding". This
module makes that a bound computed from the run's own inputs, by the standard forward
error analysis of Higham (2002), *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM:

* :func:`unit_roundoff` -- ``u = eps / 2`` of a floating-point type (Higham §2.1);
* :func:`gamma` -- ``gamma_n = n u / (1 - n u)`` (Higham Lemma 3.1): a sum or inner product of
  ``n`` terms, in any order, errs by at most ``gamma_n`` times the sum of the terms' magnitudes
  (Higham eq. (3.5)), with or without fused multiply-adds;
* :func:`head_output_error` -- the first-order bound on the error of one float64 evaluation of a
  softmax head's output (this book's derivation from those two, in its Notes);
* :func:`answer_rounding_units` -- how many units ``u`` an oracle's float64 answer can be off,
  with or without the perturbation test mode of :mod:`companion.oracles` (``k`` ulps more).

Layer: shared numerics (see :mod:`companion.numerics`); no import from ``companion``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["unit_roundoff", "gamma", "head_output_error", "answer_rounding_units"]


def unit_roundoff(dtype=np.float64) -> float:
    """The unit roundoff ``u = eps / 2`` of a floating-point type (``2**-53`` for float64).

    Parameters
    ----------
    dtype : numpy floating dtype, default=numpy.float64

    Returns
    -------
    float

    Examples
    --------
    >>> unit_roundoff() == 2.0**-53, unit_roundoff(np.float32) == 2.0**-24
    (True, True)
    """
    return float(np.finfo(dtype).eps) / 2


def gamma(n, *, u=None) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of ``n`` rounded operations.

    Parameters
    ----------
    n : int or float
        Number of rounded operations in a chain (``n >= 0``), e.g. the terms of a sum.
    u : float, default=None
        Unit roundoff; by default float64's, :func:`unit_roundoff`.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``n < 0`` or ``n u >= 1`` (the bound does not exist: fewer operations, or a wider type).

    Notes
    -----
    Higham (2002), Lemma 3.1: if ``|delta_i| <= u`` and ``n u < 1``, then
    ``prod_i (1 + delta_i)^{+-1} = 1 + theta_n`` with ``|theta_n| <= gamma_n``; so a sum or
    inner product of ``n`` terms, in any order, errs by at most ``gamma_n sum_i |a_i b_i|``.

    Examples
    --------
    >>> round(gamma(10) / (10 * 2.0**-53), 12)
    1.0
    """
    u = unit_roundoff() if u is None else float(u)
    n = float(n)
    if n < 0 or n * u >= 1:
        raise ValueError(f"gamma_n needs 0 <= n u < 1; got n={n:g}, u={u:g}.")
    return n * u / (1 - n * u)


def answer_rounding_units(ulps=0) -> int:
    """The relative error of an oracle's float64 answer, in units of ``u``: 1, or ``2 k + 2`` perturbed.

    A learner's floor (``floor_W = kappa_W u`` in its diagnostics) assumes that each answer is the
    float64 evaluation of the target, one rounding ``u`` off. The perturbation test mode of
    :mod:`companion.oracles` (``COMPANION_PERTURB_ULPS=k``, :func:`companion.oracles.perturbation_ulps`)
    multiplies that answer by ``1 + k eps s(X)``, ``s = +-1``, and rounds the product: the answer is
    then up to ``(1 + u)(1 + 2 k u)(1 + u) - 1 = (2 k + 2) u`` off, to first order in ``u``. A floor
    computed at ``u`` is multiplied by this to be the floor at the answers' precision.

    Parameters
    ----------
    ulps : int, default=0
        The ``k`` of the test mode, ``0 <= k <= 1000`` (0: off, the answers are exact float64
        evaluations).

    Returns
    -------
    int
        ``1`` for ``k = 0``; ``2 k + 2`` otherwise.

    Raises
    ------
    ValueError
        If ``ulps`` is not an integer in ``[0, 1000]`` (the test mode's own range).

    Notes
    -----
    ``1 + k eps`` is a float64 number for ``k <= 1000`` (``2 k u < 2**-42``), so the factor is
    exact and the product is rounded once (Higham (2002) eq. (2.4)); the bound adds the three
    relative errors to first order. This book's derivation.

    Examples
    --------
    >>> answer_rounding_units(0), answer_rounding_units(4)
    (1, 10)
    """
    if isinstance(ulps, bool) or not isinstance(ulps, (int, np.integer)) or not 0 <= ulps <= 1000:
        raise ValueError(f"ulps={ulps!r} must be an integer in [0, 1000] (the perturbation test mode's k).")
    return 1 if ulps == 0 else 2 * int(ulps) + 2


def _sequences(X):
    if isinstance(X, (list, tuple)):
        return [np.asarray(x, dtype=np.float64) for x in X]
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 2:
        return [X]
    if X.ndim != 3:
        raise ValueError(f"X must be (N, d), (B, N, d) or a list of (N_i, d); got shape {X.shape}.")
    return list(X)


def head_output_error(X, W_abs, v_abs, *, score_terms=None, value_terms=None, u=None) -> np.ndarray:
    """First-order bound on the rounding error of one evaluation of a softmax head's output.

    For ``f(X) = sum_i alpha_i y_i`` with ``alpha = softmax(x_i^T W x_N)`` and ``y_i = x_i^T v``,
    evaluated in floating point in any order, returns per sequence ``E(X)`` with
    ``|fl(f(X)) - f(X)| <= E(X)`` up to terms of order ``u^2``.

    Parameters
    ----------
    X : ndarray of shape (N, d) or (B, N, d), or a list of (N_i, d)
        The inputs.
    W_abs : ndarray of shape (d, d)
        An entrywise bound on the magnitudes in the score computation: ``|W|`` for a merged head
        evaluated from ``W``, ``|K|^T |Q|`` for a native one (or for ``W = K^T Q`` formed in
        floating point).
    v_abs : ndarray of shape (d,)
        The same for the values: ``|v|``, or ``|V|^T |w_o|``.
    score_terms : int, default=None
        Rounded operations in one score ``x_i^T W x_N``: ``2 d`` by default (two products of
        length ``d``); ``2 d + r`` for the native form or a ``W`` formed from rank-``r`` factors.
    value_terms : int, default=None
        Rounded operations in one value ``x_i^T v``: ``d`` by default; ``d + r`` for ``V^T w_o``.
    u : float, default=None
        Unit roundoff; float64's by default.

    Returns
    -------
    ndarray of shape (B,)
        ``E(X) = (2 gamma_{k_s + 2} S + gamma_{2 N + k_v + 2}) V`` with ``S = max_i |x_i|^T W_abs
        |x_N|``, ``V = max_i |x_i|^T v_abs``, ``k_s``, ``k_v`` the score and value terms.

    Raises
    ------
    ValueError
        If the shapes disagree.

    Notes
    -----
    This book's derivation, from Higham (2002) eq. (3.5) and Lemma 3.1 (first order in ``u``):

    1. Each score errs by at most ``gamma_{k_s} |x_i|^T W_abs |x_N| <= gamma_{k_s} S``; subtracting
       the largest score (softmax's shift) adds ``u |s_i - s_max| <= 2 u S``: ``|delta_i| <= Delta
       = gamma_{k_s + 2} S``.
    2. Score errors ``delta`` move the weights by ``d alpha_i = alpha_i (delta_i - sum_j alpha_j
       delta_j)``, so the output by ``sum_i alpha_i delta_i (y_i - f)``, at most ``2 Delta
       max_i |y_i| <= 2 Delta V``.
    3. ``exp`` (within one ulp, ``2 u``), the sum of ``N`` weights, the division and the weighted sum
       of ``N`` values: ``gamma_{2 N + 2}`` times ``sum_i alpha_i |y_i| <= V``.
    4. Each value errs by at most ``gamma_{k_v} |x_i|^T v_abs <= gamma_{k_v} V``.

    Adding them (``gamma_a + gamma_b <= gamma_{a + b}``) gives ``E``.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM, 2002.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> head = random_single_head(4, seed=0)
    >>> X = np.random.default_rng(1).standard_normal((3, 5, 4))
    >>> E = head_output_error(X, np.abs(head.W), np.abs(head.v))
    >>> E.shape, bool(np.all((E > 0) & (E < 1e-12)))
    ((3,), True)
    """
    W_abs = np.abs(np.asarray(W_abs, dtype=np.float64))
    v_abs = np.abs(np.asarray(v_abs, dtype=np.float64))
    d = v_abs.shape[0]
    if W_abs.shape != (d, d):
        raise ValueError(f"W_abs must be (d, d) = ({d}, {d}) for v_abs of shape ({d},); got {W_abs.shape}.")
    k_s = 2 * d if score_terms is None else int(score_terms)
    k_v = d if value_terms is None else int(value_terms)
    out = []
    for x in _sequences(X):
        if x.ndim != 2 or x.shape[1] != d:
            raise ValueError(f"each sequence must be (N, {d}); got shape {x.shape}.")
        a = np.abs(x)
        S = float(np.max(a @ (W_abs @ a[-1])))
        V = float(np.max(a @ v_abs))
        out.append((2 * gamma(k_s + 2, u=u) * S + gamma(2 * x.shape[0] + k_v + 2, u=u)) * V)
    return np.array(out)
