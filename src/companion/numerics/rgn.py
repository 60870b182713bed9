"""Riemannian Gauss-Newton (RGN) on the rank-``r`` matrices, for rank-one-projection measurements.

Given measurements ``t_k ~ a_k^T W b_k`` (rows ``a_k``, ``b_k`` of ``A``, ``B``), RGN fits a rank-``r``
``W`` from the spectral start (Luo, Huang, Li & Zhang 2024): each iteration solves the
measurement least-squares problem in the tangent space at the iterate (:func:`_tangent_step`) and
retracts to rank ``r`` by a truncated SVD (:func:`_retract`).

* :func:`_rgn` -- exact measurements, stopping at a relative residual ``tol`` (``companion.lowrank``,
  ``method="rgn"``);
* :func:`_weighted_rgn` -- noisy measurements weighted by ``w_k``, keeping the iterate with the
  smallest residual (``companion.robust.learn_low_rank_noisy``);
* :func:`_spectral_start`, :func:`_rop_apply` (the measurement operator), :func:`_tangent_step`,
  :func:`_retract` -- their steps.

Layer: shared numerics (see :mod:`companion.numerics`); no import from ``companion``. Private:
the learners call it, users call ``learn_low_rank(..., method="rgn")`` and ``learn_low_rank_noisy``.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsqr


def _spectral_start(A, B, t, r):
    """Top-``r`` SVD of ``(d^2 / m) sum_k t_k a_k b_k^T``, whose expectation is ``W`` when
    ``a, b ~ N(0, I / d)``. Returns ``U`` (d, r), ``s`` (r,), ``V`` (d, r)."""
    m, d = A.shape
    U, s, Vt = np.linalg.svd((d * d / m) * (A.T @ (t[:, None] * B)))
    return U[:, :r], s[:r], Vt[:r].T


def _rop_apply(A, B, W):
    """The measurement operator: ``(a_k^T W b_k)_k``, shape (m,)."""
    return np.einsum("kd,kd->k", A @ W, B)


def _tangent_step(A, B, res, U, V, *, direct_max, rtol):
    """Least-squares step in the tangent space at ``U S V^T``: ``min ||Phi(U X^T + Y V^T) - res||``.

    With ``e_k = U^T a_k`` and ``c_k = V^T b_k`` the residual is linear in ``(X, Y)``:
    ``a_k^T U X^T b_k + a_k^T Y V^T b_k = b_k^T X e_k + a_k^T Y c_k``. Solved directly
    (``numpy.linalg.lstsq``, minimum norm) when the ``(m, 2 d r)`` design matrix has at most
    ``direct_max`` entries, else matrix-free by LSQR (scipy), which also returns the minimum-norm
    solution of this rank-deficient (``r^2`` gauge directions) system.

    Returns
    -------
    X, Y : ndarray of shape (d, r)
    iterations : int
        LSQR iterations (0 for a direct solve).
    """
    m, d = A.shape
    r = U.shape[1]
    E, C = A @ U, B @ V
    n = 2 * d * r
    if m * n <= direct_max:
        K = np.concatenate(
            [(B[:, :, None] * E[:, None, :]).reshape(m, d * r), (A[:, :, None] * C[:, None, :]).reshape(m, d * r)],
            axis=1,
        )
        z, *_ = np.linalg.lstsq(K, res, rcond=None)
        its = 0
    else:

        def matvec(z):
            X, Y = z[: d * r].reshape(d, r), z[d * r :].reshape(d, r)
            return np.einsum("kr,kr->k", B @ X, E) + np.einsum("kr,kr->k", A @ Y, C)

        def rmatvec(y):
            return np.concatenate([(B.T @ (y[:, None] * E)).ravel(), (A.T @ (y[:, None] * C)).ravel()])

        op = LinearOperator((m, n), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
        z, _, its, *_ = lsqr(op, res, atol=rtol, btol=rtol, iter_lim=2000)
    return z[: d * r].reshape(d, r), z[d * r :].reshape(d, r), int(its)


def _retract(U, s, V, X, Y, r):
    """Rank-``r`` truncated SVD of ``U S V^T + U X^T + Y V^T``, through two thin QRs."""
    Qa, Ra = np.linalg.qr(np.concatenate([U, Y], axis=1))
    Qb, Rb = np.linalg.qr(np.concatenate([V * s + X, V], axis=1))
    Us, ss, Vst = np.linalg.svd(Ra @ Rb.T)
    return Qa @ Us[:, :r], ss[:r], Qb @ Vst[:r].T


def _rgn(A, B, t, r, *, max_iter, tol, direct_max=200_000):
    """Riemannian Gauss-Newton for ``t_k = a_k^T W b_k`` over the rank-``r`` matrices.

    From the spectral start, each iteration solves the measurement least-squares problem in the
    tangent space at the current iterate (:func:`_tangent_step`) and retracts to rank ``r`` by a
    truncated SVD (:func:`_retract`): Gauss-Newton on the manifold of rank-``r`` matrices, which
    converges quadratically near an exact solution (Luo, Huang, Li & Zhang 2024). Stops when the
    relative residual ``||Phi(W) - t|| / ||t||`` is at most ``tol``, after ``max_iter`` iterations,
    or when 5 iterations bring no 2-fold progress.

    Returns
    -------
    W : ndarray of shape (d, d)
    info : dict
        ``iterations``, ``residual`` (final relative residual), ``residuals`` (history),
        ``lsqr_iterations`` (total; 0 for direct solves).
    """
    U, s, V = _spectral_start(A, B, t, r)
    tnorm = np.linalg.norm(t)
    history, total = [], 0
    for it in range(max_iter + 1):
        W = (U * s) @ V.T
        res = t - _rop_apply(A, B, W)
        rel = float(np.linalg.norm(res) / tnorm) if tnorm > 0 else 0.0
        history.append(rel)
        if rel <= tol or it == max_iter or (it >= 5 and rel > 0.5 * history[-6]):
            break
        X, Y, its = _tangent_step(A, B, res, U, V, direct_max=direct_max, rtol=max(1e-15, min(1e-6, 1e-3 * rel)))
        total += its
        U, s, V = _retract(U, s, V, X, Y, r)
    return W, {"iterations": it, "residual": history[-1], "residuals": history, "lsqr_iterations": total}


def _weighted_rgn(A, B, t, w, r, *, max_iter, start=None, rtol=1e-6, patience=3):
    """Rank-``r`` weighted least squares ``min sum_k w_k^2 (<a_k b_k^T, W> - t_k)^2`` by
    Riemannian Gauss-Newton (the steps of :func:`_rgn`) from the spectral start.

    The start is ``start`` (factors ``U, s, V``) or the unweighted spectral one
    (``E[(d^2/m) sum t_k a_k b_k^T] = W`` for the Gaussian design); the steps use the weighted rows
    ``w_k a_k``, ``w_k t_k``. With noise the residual does not
    vanish (and Gauss-Newton need not decrease it monotonically): the loop stops when ``patience``
    iterations in a row fail to cut the smallest residual so far by a relative ``rtol``, and returns
    the iterate with the smallest residual.
    """
    U, s, V = _spectral_start(A, B, t, r) if start is None else start
    Aw, tw = A * w[:, None], t * w
    tnorm = np.linalg.norm(tw)
    history, best, stalled = [], (np.inf, None), 0
    for it in range(max_iter + 1):
        W = (U * s) @ V.T
        res = tw - _rop_apply(Aw, B, W)
        rel = float(np.linalg.norm(res) / tnorm) if tnorm > 0 else 0.0
        history.append(rel)
        stalled = 0 if rel < best[0] * (1 - rtol) else stalled + 1
        if rel < best[0]:
            best = (rel, W)
        if rel == 0 or it == max_iter or stalled >= patience:
            break
        X, Y, _ = _tangent_step(Aw, B, res, U, V, direct_max=2_000_000, rtol=1e-12)
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
            break  # a diverged step: keep the best iterate (its fit is checked)
        try:
            U, s, V = _retract(U, s, V, X, Y, r)
        except np.linalg.LinAlgError:
            break
    return best[1], {"iterations": it, "residual": best[0], "residuals": history}
