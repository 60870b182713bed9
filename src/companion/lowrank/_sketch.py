"""The query-optimal sketch: a cross of rows and columns of a randomly rotated ``W`` and the
stabilised generalised Nystrom formula (Nakatsukasa 2020) (private).
"""

from __future__ import annotations

import math

import numpy as np

from .._learner import (
    best_relative_scale,
    measurement_errors,
    saturation_band,
)
from .._streaming import chunk_queries
from ..errors import (
    OracleInconsistentError,
)
from ..exact import SATURATION
from ..numerics.rop import at_unit_max
from ._measure import (
    LOWRANK_MESSAGES,
    measure_bilinear,
)

# ---------------------------------------------------------------------------------------------
# Query-optimal sketch
# ---------------------------------------------------------------------------------------------


_NOISE_FLOOR = 1e-12  # singular values of the sketch core below this are rounding noise


def _haar(d, rng):
    """A Haar-random orthogonal ``d x d`` matrix (QR of a Gaussian with the sign fix of Mezzadri)."""
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    Q *= np.sign(np.diag(R))
    return Q


def _sketch_bases(v, rng):
    """Orthogonal left basis ``L`` (rows) with ``L v = (||v|| / sqrt(d)) 1`` and right basis ``R``.

    ``L = H G``: ``G`` Haar-random and ``H`` the Householder reflection taking ``G v`` to
    ``||v|| / sqrt(d)`` times the all-ones vector, so every left vector has the same, largest
    possible, ``|l_i^T v|`` while ``L`` stays orthogonal (``W = L^T M R^T`` needs no inversion).
    ``R = L^T P^T`` for a random permutation ``P``: the right vectors are the rows of ``L`` in
    random order, orthogonal too, and cost no second ``O(d^3)`` factorisation. ``R`` is returned
    transposed and C-contiguous (``RT[j] = r_j``).
    """
    d = v.shape[0]
    v = at_unit_max(v)  # the bases depend on v's direction only
    L = _haar(d, rng)
    g = L @ v
    target = np.full(d, np.linalg.norm(v) / math.sqrt(d))
    w = g - target
    nw = np.linalg.norm(w)
    if nw != 0:
        L -= np.outer(2.0 * w / nw**2, w @ L)  # in place: no second d x d array
    return L, L[rng.permutation(d)]


def _nystrom_factors(M_cols, M_rows, k, rank, rank_tol):
    """``M_cols core^+ M_rows = F G`` with ``core = M_rows[:, :k]`` truncated at rank ``rank`` (or tol).

    The stabilised generalised Nystrom form (Nakatsukasa 2020): the core's pseudo-inverse keeps
    only singular values above ``rank_tol * s_1``, applied through its SVD factors.

    Returns
    -------
    F : ndarray of shape (d, rho)
    G : ndarray of shape (rho, d)
    s : ndarray of shape (k,)
        Singular values of the core.
    rho : int
        The rank used.
    """
    core = M_rows[:, :k]
    Uc, s, Vct = np.linalg.svd(core)
    rho = _numerical_rank(s, rank_tol)
    if rank is not None:
        rho = min(rho, rank)
    return M_cols @ (Vct[:rho].T / s[:rho]), Uc[:, :rho].T @ M_rows, s, rho


def _numerical_rank(s, rank_tol):
    """Number of singular values above ``max(rank_tol * s_1, 1e-12)``.

    The absolute floor is the rounding noise of one measurement: the sketch's left and right
    vectors are unit vectors, so a measurement is a logit of order ``||W||``, inverted by
    ``sigma^{-1}`` to about 1e-15 absolute.
    """
    return int(np.sum(s > max(rank_tol * s[0], _NOISE_FLOOR))) if s.size else 0


def _cross_indices(d, k0, k1, n=None):
    """Entries of ``M`` added when a cross of ``k0`` rows/columns grows to ``k1``.

    Row ``k`` brings columns ``k .. d-1`` and column ``k`` rows ``k+1 .. d-1``. With ``n``, the
    entries come in runs (a piece of one row, or of one column) of at most ``n`` entries, rows
    first, ordered by blocks of ``n`` columns so that consecutive runs share their right vectors.

    Returns
    -------
    rows, cols : ndarray of shape (m,) of int
    segments : list of int
        Lengths of the runs (``None`` without ``n``).
    """
    rows, cols, seg = [], [], []
    if n is None:
        for k in range(k0, k1):
            rows.append(np.full(d - k, k))  # row k, columns k .. d-1
            cols.append(np.arange(k, d))
            rows.append(np.arange(k + 1, d))  # column k, rows k+1 .. d-1
            cols.append(np.full(d - k - 1, k))
    else:
        for j0 in range(k0, d, n):  # row pieces, one block of columns at a time
            j1 = min(d, j0 + n)
            for i in range(k0, min(k1, j1)):
                js = np.arange(max(i, j0), j1)
                rows.append(np.full(js.size, i))
                cols.append(js)
                seg.append(js.size)
        for k in range(k0, k1):  # column pieces
            for i0 in range(k + 1, d, n):
                i1 = min(d, i0 + n)
                rows.append(np.arange(i0, i1))
                cols.append(np.full(i1 - i0, k))
                seg.append(i1 - i0)
    if not rows:
        return np.zeros(0, int), np.zeros(0, int), ([] if n is not None else None)
    return np.concatenate(rows), np.concatenate(cols), (seg if n is not None else None)


def sketch_cross(oracle, v, rank, *, oversample, rank_tol, scale, rng, prec):
    """Measure a growing cross of ``M = L W R`` and return ``W = L^T (Nystrom of M) R^T``.

    Memory: ``L``, ``R``, ``M`` and ``W`` (``d x d`` each) and one chunk of queries; ``W`` is
    assembled from its rank-``rho`` factors, ``O(d^2 rho)`` work.

    A singular value of the core counts as zero below the largest of ``rank_tol * s_1``, 1e-12
    and, once the answers' precision is known to be coarser than float64's (stated, or measured
    because the float64 decision found too high a rank), the core's *measured* rounding level:
    the ``k x k`` core is asked again at a scale ``sqrt(3/2)`` larger (not a power of two, so
    every product is rounded anew; ``k^2`` queries, counted as re-measurements), and the level is
    ``2 ||M_1 - M_2||_2``. Two independent roundings ``N_1``, ``N_2`` of the core have
    ``||N_1 - N_2||_2`` about ``sqrt(2) ||N_1||_2``, and a singular value that is zero in exact
    arithmetic is at most ``||N_1||_2`` after rounding (Weyl), so the level sits a factor
    ``2 sqrt(2)`` above what rounding can create. It is measured, not modelled: it holds however
    the framework accumulates (float32 sums for bfloat16 kernels, or not).
    """
    d = v.shape[0]
    L, RT = _sketch_bases(v, rng)
    M = np.full((d, d), np.nan)
    E_best = np.zeros((d, d))  # ... at the best scale (the floor)
    n_req = 0
    max_logit = 0.0
    n = chunk_queries(d)
    band = saturation_band(prec.value, SATURATION)
    c_start = 1.0
    if prec.coarse and isinstance(scale, str):
        # One scale for relative rounding, from the first row of the cross at c = 1 (asked again).
        t, info = measure_bilinear(oracle, L, RT, v, scale=scale, rows=np.zeros(d, int), cols=np.arange(d), band=band)
        n_req += d + info["n_requeries"]
        c_start = best_relative_scale(t)

    def grow(k0, k1):
        nonlocal n_req, max_logit
        i, j, seg = _cross_indices(d, k0, k1, n)
        if i.size:
            t, info = measure_bilinear(
                oracle, L, RT, v, scale=scale, rows=i, cols=j, segments=seg, c_start=c_start, band=band
            )
            M[i, j] = t
            E_best[i, j] = measurement_errors(1.0, t, info["scales"], info["av"], info["bv"], best=True)
            n_req += info["n_requeries"]
            max_logit = max(max_logit, info["max_abs_logit"])

    levels = {}

    def core_level(k):
        """``2 ||M_1 - M_2||_2`` of the ``k x k`` core asked at two scales (see above)."""
        nonlocal n_req
        if k not in levels:
            i, j = (a.ravel() for a in np.meshgrid(np.arange(k), np.arange(k), indexing="ij"))
            t, info = measure_bilinear(
                oracle, L, RT, v, scale=scale, rows=i, cols=j, c_start=c_start * math.sqrt(1.5), band=band
            )
            n_req += i.size + info["n_requeries"]
            levels[k] = 2.0 * float(np.linalg.norm(t.reshape(k, k) - M[:k, :k], 2))
        return levels[k]

    def rank_of(s, k):
        noise = core_level(k) if prec.coarse else 0.0
        return int(np.sum(s > max(rank_tol * s[0], _NOISE_FLOOR, noise))) if s.size else 0, noise

    if rank is not None:
        k = min(d, rank + oversample)
        grow(0, k)
        s = np.linalg.svd(M[:k, :k], compute_uv=False)
        if k > rank and rank_of(s, k)[0] > rank and prec.measure():
            pass  # re-decided below with the measured u
        rho_k, noise = rank_of(s, k)
        if k > rank and rho_k > rank:
            if prec.coarse:
                raise OracleInconsistentError(
                    LOWRANK_MESSAGES["rank_small_rounding"].format(
                        r=rank, i=rank + 1, k=k, s=s[rank] / s[0], noise=noise / s[0], prec=prec.describe()
                    )
                )
            raise OracleInconsistentError(
                LOWRANK_MESSAGES["rank_small"].format(
                    r=rank,
                    what=f"singular value {rank + 1} of the {k} x {k} core is nonzero",
                    err=s[rank] / s[0],
                    tol=max(rank_tol, noise / s[0]),
                )
            )
        detected = None
    else:
        # Stop at the second rank-deficient core in a row: a random k x k compression of a rank-r W
        # (k <= r) is nearly singular by chance with probability about k times its threshold (a
        # Keras float32 layer at d = 384, rank 96, stopped at a core of 62 whose last singular value
        # was 1.3e-05 relative, under float32's 2.2e-05); bordered by one more row and column it is
        # not, while every core past r stays deficient. With float64 answers the threshold (1e-8) makes
        # such a chance stop negligible, and the first deficient core decides, as before.
        k, short, confirm = 0, 0, 2 if prec.coarse else 1
        while True:
            grow(k, k + 1)
            k += 1
            s = np.linalg.svd(M[:k, :k], compute_uv=False)
            short = short + 1 if rank_of(s, k)[0] < k else 0
            if k == d or short == confirm:
                break
        detected = rank_of(s, k)[0]
    tol_used = max(rank_tol, rank_of(s, k)[1] / s[0]) if s.size and s[0] > 0 else rank_tol
    # Singular values that count as zero only because of rank_tol (above every other floor): if the
    # check then fails, rank_tol is the cause, not the target (see _rank_tol_cut).
    floor = max(_NOISE_FLOOR, rank_of(s, k)[1]) if s.size else _NOISE_FLOOR
    cut = s[(s > floor) & (s <= rank_tol * s[0])] if s.size else s
    if k == d:
        rho = rank_of(s, k)[0]
        W = L.T @ M @ RT
        amp = 1.0
    else:
        F, G, s, rho = _nystrom_factors(M[:, :k], M[:k, :], k, rank, tol_used)
        factors = (L.T @ F, G @ RT)
        W = factors[0] @ factors[1]
        amp = 1.0 + float(np.linalg.norm(F, 2) * np.linalg.norm(G, 2)) / max(float(s[0]), _NOISE_FLOOR)
    nW = float(np.linalg.norm(W))
    measured = ~np.isnan(M)
    kappa = amp * float(np.linalg.norm(E_best[measured])) / nW if nW > 0 else 0.0
    info = {
        "cross_size": k,
        "core_singular_values": s,
        "rank_detected": detected,
        "n_requeries": n_req,
        "max_abs_logit": max_logit,
        "rank_used": rho,
        "kappa_W": kappa,
        "rank_tol_used": tol_used,
        "rank_tol_cut": cut / s[0] if cut.size else cut,
    }
    if k < d:
        info["factors"] = factors  # W = F G, rank rho: its SVD in O(d rho^2)
    return W, info


# ---------------------------------------------------------------------------------------------
# Entry point
