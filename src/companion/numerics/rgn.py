"""Riemannian Gauss-Newton (RGN) on the rank-``r`` matrices, for rank-one-projection measurements.

Given measurements ``t_k ~ a_k^T W b_k`` (rows ``a_k``, ``b_k`` of ``A``, ``B``), RGN fits a rank-``r``
``W`` from the spectral start (Luo, Huang, Li & Zhang 2024): each iteration solves the
measurement least-squares problem in the tangent space at the iterate (:func:`_tangent_step`) and
retracts to rank ``r`` by a truncated SVD (:func:`_retract`).

* :func:`solve_rgn` -- exact measurements, stopping at a relative residual ``tol`` (``companion.lowrank``,
  ``method="rgn"``);
* :func:`solve_weighted_rgn` -- noisy measurements weighted by ``w_k``, keeping the iterate with the
  smallest residual (``companion.robust.learn_low_rank_noisy``);
* :func:`spectral_start`, :func:`rop_apply` (the measurement operator; :func:`rop_apply_factors`
  at ``W = F G``), :func:`_tangent_step`, :func:`_retract`, :func:`factor_svd` -- their steps.

Cost. The iterate is kept as factors ``U S V^T``; with ``alpha_k = U^T a_k`` and ``beta_k = V^T b_k``
(``A U`` and ``B V``, computed once per Gauss-Newton step) the fitted measurements are
``sum_j s_j alpha_kj beta_kj`` and the tangent-space operator and its adjoint are products of the
``(m, d)`` design with ``(d, r)`` or ``(m, r)`` matrices: ``O(m d r)`` work per application, BLAS
level 3, and no ``(m, d)`` temporary. Only the spectral start touches ``d x d`` (``O(m d^2)``, once,
in row chunks of :data:`_CHUNK_BYTES`; in float32 for :func:`solve_rgn`'s matrix-free runs).

What bounds :func:`solve_rgn`'s time (``benchmarks/bench_noisy_scale.py``, CPU time, one BLAS thread;
``d = 1024``, ``r = 32``, ``n = r (2d - r) = 64,512``, ``m = 2 n``). Each conjugate-gradient iteration
applies the tangent normal operator once: four ``(m, d) x (d, r)`` float32 products, ``4 m d r``
multiply-adds, ``4 r / d`` (an eighth) of the oracle's ``m d^2`` float64 ones (its scores
``W x_N``). It runs at 37--39 GMAC/s, the AVX2 float32 peak of OpenBLAS's kernel here
(16 multiply-adds a cycle), against the oracle's 20--22 GMAC/s in float64: 0.44 s, 1/14 of the
oracle's 6.1--6.7 s. The normal operator of ``m`` Gaussian rank-one projections on the
``n``-dimensional tangent space has a Marchenko-Pastur-like spectrum, on which conjugate gradients
gain at most ``(1/2) ln(m / n)`` nats per iteration (0.35 at ``m = 2 n``); from the spectral start
(relative residual 1.3) to the measurements' rounding (1e-13) is 30 nats, so at least 87
iterations (measured: 98, in 8 Gauss-Newton iterations), whatever the forcing schedule (one long
solve and many short ones cost the same): 6.3 oracle-times. With the design (``2 m d`` normals,
0.67 oracle-times), the spectral start (``m d^2`` float32 multiply-adds and a ``d x d`` SVD, 0.55)
and the residuals (10 fits of two ``(m, d) x (d, r)`` products, 0.6), the floor is about 9 times
the oracle, measured 10.3 (62.5 CPU s against 6.06, at a load of 10 on 2 cores). Three times the
oracle is out of reach at any ``m``: the oracle, the design and the spectral start all grow with
``m`` and take 2.2 oracle-times before the first iteration, which leaves the iterations and the
residuals 0.8, about 10 iterations, ``(1/2) ln(m / n) >= 3``: ``m >= 400 n``.

Layer: shared numerics (see :mod:`companion.numerics`); imports only :mod:`companion.numerics.rop`
(:func:`~companion.numerics.rop.design_product`), nothing from ``companion`` above. Private:
the learners call it, users call ``learn_low_rank(..., method="rgn")`` and ``learn_low_rank_noisy``.
"""

from __future__ import annotations

import numpy as np

from .rop import design_product, row_chunks

#: Rows of the design handled at once where a product would otherwise build an ``(m, d)``
#: temporary (the spectral start, :func:`rop_apply`): at most this many bytes per chunk.
_CHUNK_BYTES = 4 * 2**20


#: :func:`solve_rgn` also stops when an iteration brings less than 2-fold progress at a relative
#: residual already below this many times ``tol``: the residual has reached the measurements'
#: float64 rounding (``learn_low_rank`` accepts up to ``1e3 tol``).
_STALL_FLOOR = 1e3

#: :func:`solve_rgn`'s matrix-free tangent solves stop at the first CGLS iteration that lowers the
#: squared tangent least-squares residual by less than this fraction: at the measurements'
#: rounding, the step has nothing left to fit (it saves the final Gauss-Newton iteration's solve).
_STAGNATION = 1e-2

#: Bytes of one row chunk of ``A`` (and of ``B``) in :func:`_tangent_step`'s fused normal-operator
#: pass: small enough to stay in a core's cache between the forward and the adjoint product.
_CG_CHUNK_BYTES = 2**20

#: Smallest forcing of :func:`solve_rgn`'s tangent solves (their float32 CGLS reaches about this).
_FORCING_MIN = 1e-4

#: Largest forcing of :func:`solve_rgn`'s tangent solves (its default ``forcing``): the forcing is the
#: relative residual itself, ``max(_FORCING_MIN, rel)``, capped here so that a start with
#: ``rel >= 1`` still gets a step. Far from the solution a Gauss-Newton step gains less than its
#: inner solve's accuracy, so a tight solve there is wasted (``d = 384``, ``r = 12``: 92 inner
#: iterations instead of 119 with the cap at ``3e-2``, the same with it at 0.3 or 0.7; ``d = 48``,
#: ``r = 4``: 99 instead of 117; at ``d = 30``, ``r = 3`` it loses, 113 against 105).
_FORCING = 0.5

#: :func:`solve_rgn` measures its fit in float32 (relative error about ``1e-7``) while the previous
#: relative residual exceeds this: the residual is then known to ``1e-4`` of itself, as closely as
#: the tangent solves' smallest forcing asks. A float32 residual at or below it is measured again
#: in float64, as is every residual the run stops on.
_COARSE_FIT = 1e-3

#: Largest ``(m, 2 d r)`` tangent design solved directly by :func:`solve_weighted_rgn`.
_DIRECT_MAX_WEIGHTED = 2_000_000


def single_precision(A, B, r):
    """float32 copies of ``A``, ``B`` for the matrix-free tangent solves of :func:`solve_weighted_rgn`,
    or ``None`` where its tangent problems are solved directly (at most
    :data:`_DIRECT_MAX_WEIGHTED` entries)."""
    m, d = A.shape
    if m * 2 * d * r <= _DIRECT_MAX_WEIGHTED:
        return None
    return A.astype(np.float32), B.astype(np.float32)


def _chunks(m, d):
    """``(start, end)`` row ranges of at most :data:`_CHUNK_BYTES` bytes of a float64 ``(m, d)`` array."""
    return row_chunks(m, d, _CHUNK_BYTES)


def spectral_start(A, B, t, r, low=None):
    """Top-``r`` SVD of ``(d^2 / m) sum_k t_k a_k b_k^T``, whose expectation is ``W`` when
    ``a, b ~ N(0, I / d)``. Returns ``U`` (d, r), ``s`` (r,), ``V`` (d, r).

    The ``d x d`` sum is accumulated over row chunks (no ``(m, d)`` temporary), from the float32
    copies ``low = (A, B)`` when given (:func:`solve_rgn`'s matrix-free solves: an ``O(m d^2)`` product,
    as costly as the oracle's own answers at ``d = 1024``, 1.7 times faster in float32; the start
    moves by float32's rounding, far below its own distance to ``W``), else in float64."""
    m, d = A.shape
    As, Bs = (A, B) if low is None else low
    ts = t.astype(As.dtype)
    M = np.zeros((d, d), dtype=As.dtype)
    for s0, e in _chunks(m, d):
        M += As[s0:e].T @ (ts[s0:e, None] * Bs[s0:e])
    M = M.astype(np.float64) * (d * d / m)
    U, s, Vt = np.linalg.svd(M)
    return U[:, :r], s[:r], Vt[:r].T


def rop_apply(A, B, W):
    """The measurement operator: ``(a_k^T W b_k)_k``, shape (m,), in row chunks."""
    m, d = A.shape
    out = np.empty(m)
    for s0, e in _chunks(m, d):
        out[s0:e] = np.einsum("kd,kd->k", A[s0:e] @ W, B[s0:e])
    return out


def _factor_products(A, B, U, s, V, low=None):
    """``alpha = A U``, ``beta = B V`` (m, r) and the fitted measurements ``a_k^T U S V^T b_k``.

    With ``low`` (float32 copies of ``A``, ``B``) the products are float32 (``alpha``, ``beta``
    float32, the fit float64 from float32 sums: about ``1e-7`` relative), at half the cost."""
    if low is not None:
        dt = low[0].dtype
        alpha, beta = low[0] @ U.astype(dt), low[1] @ V.astype(dt)
        return alpha, beta, np.einsum("kr,kr->k", alpha * s.astype(dt), beta).astype(np.float64)
    alpha, beta = design_product(A, U), design_product(B, V)
    return alpha, beta, np.einsum("kr,kr->k", alpha * s, beta)


def rop_apply_factors(A, B, F, G):
    """The measurement operator at ``W = F G`` ((d, k) and (k, d)): ``O(m d k)``, never forming ``W``."""
    return np.einsum("kr,kr->k", A @ F, B @ G.T)


def factor_svd(F, G):
    """Thin SVD ``U, s, V`` of ``F G`` ((d, k) and (k, d)) through two thin QRs, ``O(d k^2)``."""
    Qf, Rf = np.linalg.qr(F)
    Qg, Rg = np.linalg.qr(G.T)
    u, s, vt = np.linalg.svd(Rf @ Rg.T)
    return Qf @ u, s, Qg @ vt.T


def _tangent_step(
    A, B, res, U, V, *, direct_max, rtol, alpha=None, beta=None, max_iter=None, low=None, stagnation=None
):
    """Least-squares step in the tangent space at ``U S V^T``: ``min ||Phi(U X^T + Y V^T) - res||``.

    With ``alpha_k = U^T a_k`` and ``beta_k = V^T b_k`` the residual is linear in ``(X, Y)``:
    ``a_k^T U X^T b_k + a_k^T Y V^T b_k = b_k^T X alpha_k + a_k^T Y beta_k``. Row weights ``w_k`` enter
    through ``alpha = w * (A U)``, ``beta = w * (B V)`` (and a weighted ``res``); ``alpha``, ``beta``
    default to ``A U``, ``B V``.

    Solved directly (``numpy.linalg.lstsq``, minimum norm) when the ``(m, 2 d r)`` design matrix has
    at most ``direct_max`` entries. Else matrix-free by conjugate gradients on the normal
    equations (Hestenes & Stiefel 1952; the iterates of CGLS and of LSQR, Paige & Saunders 1982) in the
    coordinates ``(X, Y)`` with ``U^T Y = 0``: they remove the ``r^2`` gauge directions and are
    isometric (``||U X^T + Y V^T||_F^2 = ||X||_F^2 + ||Y||_F^2``), so for the isotropic Gaussian design
    the normal operator is close to ``(m / d^2) I`` (condition number measured 20 at ``m = 3 r (2d -
    r)``; 124 with the noisy learner's weights). Each iteration applies the normal operator
    ``Phi^* Phi`` once: four ``(m, d) x (d, r)``-sized products in one pass over the design, each
    row chunk of ``A`` and ``B`` (:data:`_CG_CHUNK_BYTES`) serving the forward and the adjoint
    product while it is in cache, in the precision of ``low`` (float32 copies ``(A, B)``;
    ``None``: float64). The normal-equation residual ``S`` follows by the recurrence
    ``S <- S - step Phi^* Phi P`` and the squared least-squares residual
    ``||Phi(U X^T + Y V^T) - res||^2`` falls by ``step gamma`` (``gamma = ||S||^2``) at each step, so
    no residual vector is kept. The iteration stops when ``||S||`` is at most ``rtol`` times its
    start, after ``max_iter`` (default ``2 d r``) iterations, or, with ``stagnation``, at the first
    iteration that lowers the squared least-squares residual by less than the fraction
    ``stagnation`` of it (the residual has reached what the tangent space can fit: for exact
    measurements, their rounding). ``Y`` is projected on ``U^T Y = 0`` once more at the end (the
    recurrence drifts off it by float32 rounding).

    Returns
    -------
    X, Y : ndarray of shape (d, r)
    iterations : int
        Conjugate-gradient iterations (0 for a direct solve).
    """
    m, d = A.shape
    r = U.shape[1]
    E = A @ U if alpha is None else alpha
    C = B @ V if beta is None else beta
    if m * 2 * d * r <= direct_max:
        K = np.concatenate(
            [(B[:, :, None] * E[:, None, :]).reshape(m, d * r), (A[:, :, None] * C[:, None, :]).reshape(m, d * r)],
            axis=1,
        )
        z, *_ = np.linalg.lstsq(K, res, rcond=None)
        return z[: d * r].reshape(d, r), z[d * r :].reshape(d, r), 0

    # The inner solve runs in the precision of ``low`` (float32 copies of A, B): it only needs
    # ``rtol`` >> float32's 6e-8 relative accuracy, while the residuals stay in float64.
    Al, Bl = (A, B) if low is None else low
    dt = Al.dtype
    El, Cl, Ul = E.astype(dt, copy=False), C.astype(dt, copy=False), U.astype(dt, copy=False)

    def adjoint(y):
        # (C^T A)^T, not A^T C: the same product, with the long (m) axis contiguous in both
        # operands of the GEMM.
        Y = ((y[:, None] * Cl).T @ Al).T
        Y -= Ul @ (Ul.T @ Y)
        return ((y[:, None] * El).T @ Bl).T, Y

    rows = max(1, _CG_CHUNK_BYTES // (Al.itemsize * d))
    bounds = [(s0, min(m, s0 + rows)) for s0 in range(0, m, rows)]

    def normal(PX, PY):
        # ||Phi(P)||^2 and Phi^T Phi(P) in one pass over the design: each row chunk of A and B
        # (at most _CG_CHUNK_BYTES each, so it stays in cache) serves the forward and the adjoint
        # product (measured 14 % faster than two passes at d = 1024, r = 32, float32).
        GX, GY, qq = np.zeros((r, d), dtype=dt), np.zeros((r, d), dtype=dt), 0.0
        for s0, e in bounds:
            a, b, Ek, Ck = Al[s0:e], Bl[s0:e], El[s0:e], Cl[s0:e]
            q = np.einsum("kr,kr->k", b @ PX, Ek)
            q += np.einsum("kr,kr->k", a @ PY, Ck)
            qq += float(np.dot(q, q))
            GX += (q[:, None] * Ek).T @ b
            GY += (q[:, None] * Ck).T @ a
        GY = GY.T
        GY -= Ul @ (Ul.T @ GY)
        return qq, GX.T, GY

    X, Y = np.zeros((d, r), dtype=dt), np.zeros((d, r), dtype=dt)
    rr2 = float(np.dot(res, res))
    SX, SY = adjoint(np.asarray(res, dtype=dt))
    PX, PY = SX.copy(), SY.copy()
    gamma = float(np.sum(SX * SX, dtype=np.float64) + np.sum(SY * SY, dtype=np.float64))
    stop = (rtol**2) * gamma
    its, limit = 0, 2 * d * r if max_iter is None else max_iter
    while gamma > stop and its < limit:
        qq, NX, NY = normal(PX, PY)
        if not qq > 0.0:
            break
        step = gamma / qq
        X += dt.type(step) * PX
        Y += dt.type(step) * PY
        its += 1
        if stagnation is not None:
            drop = gamma * step  # = gamma^2 / qq, the fall of the squared least-squares residual
            if drop < stagnation * rr2:
                break
            rr2 -= drop
        SX -= dt.type(step) * NX
        SY -= dt.type(step) * NY
        gamma_new = float(np.sum(SX * SX, dtype=np.float64) + np.sum(SY * SY, dtype=np.float64))
        ratio = dt.type(gamma_new / gamma)
        PX *= ratio
        PX += SX
        PY *= ratio
        PY += SY
        gamma = gamma_new
    X, Y = X.astype(np.float64), Y.astype(np.float64)
    Y -= U @ (U.T @ Y)  # U^T Y = 0 again: the recurrence for S drifts off it by float32 rounding
    return X, Y, its


def _retract(U, s, V, X, Y, r):
    """Rank-``r`` truncated SVD of ``U S V^T + U X^T + Y V^T``, through two thin QRs."""
    Qa, Ra = np.linalg.qr(np.concatenate([U, Y], axis=1))
    Qb, Rb = np.linalg.qr(np.concatenate([V * s + X, V], axis=1))
    Us, ss, Vst = np.linalg.svd(Ra @ Rb.T)
    return Qa @ Us[:, :r], ss[:r], Qb @ Vst[:r].T


def solve_rgn(A, B, t, r, *, max_iter, tol, direct_max=200_000, forcing=_FORCING):
    """Riemannian Gauss-Newton for ``t_k = a_k^T W b_k`` over the rank-``r`` matrices.

    From the spectral start, each iteration solves the measurement least-squares problem in the
    tangent space at the current iterate (:func:`_tangent_step`) and retracts to rank ``r`` by a
    truncated SVD (:func:`_retract`): Gauss-Newton on the manifold of rank-``r`` matrices, which
    converges quadratically near an exact solution (Luo, Huang, Li & Zhang 2024). The tangent
    problem is solved inexactly, to a relative normal-equation residual ``min(forcing, max(rel,
    _FORCING_MIN))`` at relative residual ``rel``: an inexact Newton method whose forcing is the
    residual itself, which keeps Gauss-Newton's quadratic convergence (Dembo, Eisenstat &
    Steihaug 1982), at far fewer inner iterations in all than exact solves. Far from the solution
    the step gains less than a tight solve would give, so the default cap ``forcing =
    _FORCING`` leaves those solves loose (measured at ``d = 384``, ``r = 12``, exact measurements:
    7 Gauss-Newton iterations with 1, 3, 6, 9, 18, 27, 28 inner iterations, 92 in all, against 119
    with the cap at ``3e-2``). Each Gauss-Newton iteration measures its residual with two
    ``(m, d) x (d, r)`` products: in float32 while the previous relative residual exceeds
    ``_COARSE_FIT`` (matrix-free runs), else in float64, and in float64 whenever the run stops on
    it. A matrix-free solve also stops when its
    residual stagnates (``_STAGNATION``: at the measurements' rounding; the final iteration's solve
    took 2 inner iterations instead of 10 there).
    A tangent problem solved matrix-free has its rows scaled to unit norm in the tangent space (row
    equilibration: the problem is consistent near an exact solution, so this changes its
    conditioning, not its solution; it cut the inner iterations by 40 % at ``d = 256``) and is
    solved in float32 (the residuals stay in float64). Stops when ``rel = ||Phi(W) - t|| / ||t||``
    is at most ``tol``, after ``max_iter`` iterations, when 5 iterations bring no 2-fold progress,
    or when one brings none below ``_STALL_FLOOR * tol`` (rounding level).

    Returns
    -------
    W : ndarray of shape (d, d)
    info : dict
        ``iterations``, ``residual`` (final relative residual), ``residuals`` (history),
        ``lsqr_iterations`` (total inner conjugate-gradient iterations; 0 for direct solves), ``factors``
        (``(U S, V^T)``, whose product is ``W``).
    """
    m, d = A.shape
    low = None
    if m * 2 * d * r > direct_max:  # a float32 design (exact in float32) is its own float32 copy
        low = (A, B) if A.dtype == np.float32 else (A.astype(np.float32), B.astype(np.float32))
    U, s, V = spectral_start(A, B, t, r, low=low)
    An, Bn = (A, B) if low is None else low  # row norms, for the equilibration only
    na2 = np.einsum("kd,kd->k", An, An).astype(np.float64)
    nb2 = np.einsum("kd,kd->k", Bn, Bn).astype(np.float64)
    tnorm = np.linalg.norm(t)
    history, total = [], 0

    def measure(coarse):
        alpha, beta, fit = _factor_products(A, B, U, s, V, low=low if coarse else None)
        res = t - fit
        return alpha, beta, res, float(np.linalg.norm(res) / tnorm) if tnorm > 0 else 0.0

    def done(it, rel):
        stalled = it >= 1 and rel > 0.5 * history[-1] and rel <= _STALL_FLOOR * tol  # at rounding level
        return rel <= tol or it == max_iter or stalled or (it >= 5 and rel > 0.5 * history[-5])

    for it in range(max_iter + 1):
        coarse = low is not None and (not history or history[-1] > _COARSE_FIT)
        alpha, beta, res, rel = measure(coarse)
        if coarse and (rel <= _COARSE_FIT or done(it, rel)):
            alpha, beta, res, rel = measure(False)
        stop = done(it, rel)
        history.append(rel)
        if stop:
            break
        # Matrix-free: rows scaled to unit tangent-space norm (row equilibration). Near an exact
        # solution the tangent problem is consistent, so the scaling changes not the step but the
        # conditioning. (A direct solve gains nothing from it and keeps the plain rows.)
        om = np.ones(m)
        if low is not None:
            a2, b2 = np.einsum("kr,kr->k", alpha, alpha), np.einsum("kr,kr->k", beta, beta)
            om = 1.0 / np.sqrt(np.maximum(a2 * nb2 + np.maximum(na2 - a2, 0.0) * b2, np.finfo(float).tiny))
        rows = {"alpha": om[:, None] * alpha, "beta": om[:, None] * beta, "low": low}
        eta = min(forcing, max(_FORCING_MIN, rel))  # the forcing falls with the residual
        X, Y, its = _tangent_step(A, B, om * res, U, V, direct_max=direct_max, rtol=eta, stagnation=_STAGNATION, **rows)
        total += its
        U, s, V = _retract(U, s, V, X, Y, r)
    info = {"iterations": it, "residual": history[-1], "residuals": history, "lsqr_iterations": total}
    info["factors"] = (U * s, V.T)
    return (U * s) @ V.T, info


def solve_weighted_rgn(A, B, t, w, r, *, max_iter, start=None, rtol=1e-6, patience=3, inner_rtol=1e-1, low=None):
    """Rank-``r`` weighted least squares ``min sum_k w_k^2 (<a_k b_k^T, W> - t_k)^2`` by
    Riemannian Gauss-Newton (the steps of :func:`solve_rgn`) from the spectral start.

    The start is ``start`` (factors ``U, s, V``) or the unweighted spectral one
    (``E[(d^2/m) sum t_k a_k b_k^T] = W`` for the Gaussian design); the steps use the weighted rows
    ``w_k a_k``, ``w_k t_k`` (through ``w * (A U)`` and ``w * (B V)``: no weighted copy of ``A``).
    With noise the residual does not vanish (and Gauss-Newton need not decrease it
    monotonically): the loop stops at the first iteration that lowers the smallest residual so far
    by less than a relative ``rtol`` (converged), or when ``patience`` iterations in a row fail to
    lower it by ``rtol`` (stalled), and returns the iterate with the smallest residual. The tangent
    problems are solved inexactly, to a relative normal-equation residual ``inner_rtol`` (inexact
    Gauss-Newton, as in :func:`solve_rgn`; the final fit is the same to the stopping rule's accuracy,
    measured at ``d = 96`` with half the inner iterations of solves to 1e-3 and a twentieth of
    those to 1e-12, the previous setting), in float32 when matrix-free
    (``low``: float32 copies of ``A``, ``B``; made here if not given).

    Returns
    -------
    W : ndarray of shape (d, d)
    info : dict
        ``iterations``, ``stop`` (why the loop ended: ``"converged"``, ``"stalled"``, ``"exact"``,
        ``"diverged"`` or ``"max_iter"``, the last without meeting a stopping rule), ``residual``,
        ``residuals``, ``lsqr_iterations``, ``factors``
        (``(U S, V^T)``, whose product is the returned ``W``).
    """
    m, d = A.shape
    U, s, V = spectral_start(A, B, t, r) if start is None else start
    tw = t * w
    tnorm = np.linalg.norm(tw)
    history, best, stalled, total = [], (np.inf, None), 0, 0
    for it in range(max_iter + 1):
        alpha, beta, fit = _factor_products(A, B, U, s, V)
        res = tw - w * fit
        rel = float(np.linalg.norm(res) / tnorm) if tnorm > 0 else 0.0
        history.append(rel)
        converged = best[0] * (1 - rtol) <= rel < best[0]  # a decrease, by less than rtol
        stalled = 0 if rel < best[0] * (1 - rtol) else stalled + 1
        if rel < best[0]:
            best = (rel, (U, s, V))
        if rel == 0 or it == max_iter or converged or stalled >= patience:
            stop = (
                "exact" if rel == 0 else "converged" if converged else "stalled" if stalled >= patience else "max_iter"
            )
            break
        if low is None:
            low = single_precision(A, B, r)
        rows = {"alpha": w[:, None] * alpha, "beta": w[:, None] * beta, "low": low}
        X, Y, its = _tangent_step(A, B, res, U, V, direct_max=_DIRECT_MAX_WEIGHTED, rtol=inner_rtol, **rows)
        total += its
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
            stop = "diverged"
            break  # a diverged step: keep the best iterate (its fit is checked)
        try:
            U, s, V = _retract(U, s, V, X, Y, r)
        except np.linalg.LinAlgError:
            stop = "diverged"
            break
    Ub, sb, Vb = best[1]
    info = {"iterations": it, "stop": stop, "residual": best[0], "residuals": history, "lsqr_iterations": total}
    info["factors"] = (Ub * sb, Vb.T)
    return (Ub * sb) @ Vb.T, info


# The former private names, kept for code and tests that import them.
_rgn = solve_rgn
_weighted_rgn = solve_weighted_rgn
_factor_svd = factor_svd
_rop_apply = rop_apply
_rop_apply_factors = rop_apply_factors
_single_precision = single_precision
_spectral_start = spectral_start
