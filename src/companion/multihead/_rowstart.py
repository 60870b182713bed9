"""A row's start for the counts route from all of its pairs at once: the amplitudes they share.

Private helper of :func:`companion.multihead.learn_canonical_rational` (this book's construction, not
the paper's or the follow-up's). Pair ``(i, k)`` of the route (direction ``delta_i``, token ``x_k``,
``2 H`` ratios ``r``) samples

    G_ik(r) = sum_h gamma_ih r / (r + exp(-R_ih^T x_k)),   gamma_ih = delta_i^T v_h,   R_ih = W_h^T delta_i,

so the tokens of a row share the amplitudes ``gamma_ih`` and the rows ``R_ih`` (the log-poles are
linear in ``x_k``), not the poles: there is no common denominator for a vector-fitting or set-valued
AAA fit, and random tokens give no shift structure for a Prony or matrix-pencil method. What the
shared amplitudes buy is conditioning: with them known, a pair's ``H`` shifts from its ``2 H`` samples
have a rounding sensitivity of 5e-11 at ``H = 8`` and 2.3e-9 at ``H = 12``, against 0.09 and 31 for the
pair's free fit of amplitudes and shifts (:func:`companion.multihead.counts_conditioning`). So
:func:`shared_amplitude_start`

1. fits every pair freely (the interpolation with every pole taken real,
   ``companion.numerics.rational.interpolate_pairs`` with ``realise``, then Levenberg-Marquardt), and
   assigns its terms to the row's heads by amplitude (the optimal one-to-one assignment);
2. refits every pair's shifts with the row's amplitudes fixed and takes those of the pairs that
   then fit to :data:`ACCEPT` (inside the window);
3. refits the other pairs from the shifts that the rows so far predict (the known shifts kept, the
   rest ``x_k^T R_h`` of a least squares over the known ones), up to ten rounds while pairs are
   added: the tokens of the row work together here;
4. fits ``R_h`` by least trimmed squares over the accepted shifts (:func:`trimmed_rows`; a
   fixed-amplitude fit can also reach rounding level with two heads of nearly equal amplitude
   swapped, or two flat tail terms traded: those are its outliers). The joint fit of the row then
   refines the amplitudes with the rows.

Measured (seed 0, 2026-12-01): at d = 64, H = 8, 54 to 81 of 119 pairs per row are accepted by
step 2, and step 3 takes the rows that the per-head start of
:func:`companion.multihead.learn_canonical_rational` could not start (5 of 64) to more than 100
tokens per head; the route then learns H = 8 at d = 64 (refused before). At H = 9 a row whose
step 2 leaves about 0.9 d tokens per head does not grow (the minimum-norm prediction is too far
off), and at H = 12 only 9 to 12 of 117 pairs pass step 2 (a pair's fixed-amplitude fit has spurious
minima): this start does not reach H = 12. Given the true amplitudes (``benchmarks/why_H_stops.py``,
d = 64, rows 0 and 1 of the learner's design) its largest start error per head is 1.5e-7 at H = 6,
1.5e-8 at H = 7 and 0.13 at H = 8, and it refuses from H = 9: the shared amplitudes are not the only
missing piece (a pair's fixed-amplitude fit is not convex), while the row's joint fit has a Cramer-Rao
bound of about 1e-11 relative at every H up to 12 (:mod:`companion.multihead._information`).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from ..numerics.rational import interpolate_pairs, polish_pairs

#: Relative misfit (to the row's largest answer) at which a pair's fixed-amplitude fit gives its
#: shifts to the start (the amplitudes, shared by the pairs that resolved all heads, are off by
#: about 1e-9 relative; measured d = 64, H = 8: 81 of 119 pairs of a row, some wrong at a head).
ACCEPT = 1e-9


def shared_amplitude_shifts(s, G, gamma0, *, accept=ACCEPT):
    """Every pair's shifts, refitted with the row's amplitudes fixed (steps 1 and 2 of the module).

    Parameters
    ----------
    s : ndarray of shape (S,)
        Sample points ``log r``, ``S >= 2 H``.
    G : ndarray of shape (K, S)
        The row's answers minus ``x_k^T v``.
    gamma0 : ndarray of shape (H,)
        The row's amplitudes.

    Returns
    -------
    L : ndarray of shape (K, H)
        Every pair's shifts, head by head.
    ok : ndarray of shape (K,) bool
        The pairs whose fixed-amplitude fit misfits by at most ``accept`` times ``max |G|``.
    """
    K, S = G.shape
    H = gamma0.size
    sub = np.unique(np.round(np.linspace(0, S - 1, 2 * H)).astype(int))
    g0, l0 = interpolate_pairs(np.exp(s[sub]), G[:, sub], H, realise=True)
    bad = ~(np.isfinite(g0).all(axis=1) & np.isfinite(l0).all(axis=1))
    g0[bad], l0[bad] = 0.0, 0.0
    g1, l1, _ = polish_pairs(s, G, g0, l0)
    L = np.empty((K, H))
    for k in range(K):
        head, term = linear_sum_assignment(np.abs(g1[k][None, :] - gamma0[:, None]))
        L[k, head] = l1[k, term]
    _, L, res = polish_pairs(s, G, np.repeat(gamma0[None], K, axis=0), L, fixed_gamma=True, iters=60)
    return L, res <= accept * np.max(np.abs(G))


def trimmed_rows(X, L, use, *, keep=0.8, rounds=8, strict=True):
    """``R_h`` with ``X R_h ~ L[:, h]`` over the tokens ``use[:, h]``, by least trimmed squares.

    Each round keeps the ``max(d + 8, keep * n)`` tokens of smallest residual; at the end the tokens
    within ``max(1e-5, 3 * median)`` of the fit give the final least squares (if more than ``d``).

    Parameters
    ----------
    X : ndarray of shape (K, d)
    L : ndarray of shape (K, H)
    use : ndarray of shape (K, H) bool

    Returns
    -------
    R : ndarray of shape (H, d), or None
        None if some head has at most ``d`` tokens in ``use`` and ``strict`` (otherwise that head's
        row is the minimum-norm least squares over them: a prediction, not a start).
    """
    K, d = X.shape
    H = L.shape[1]
    if strict and np.min(use.sum(axis=0)) <= d:
        return None
    R = np.empty((H, d))
    for h in range(H):
        idx = np.flatnonzero(use[:, h])
        cur = idx
        for _ in range(rounds):
            Rh = np.linalg.lstsq(X[cur], L[cur, h], rcond=None)[0]
            res = np.abs(X[idx] @ Rh - L[idx, h])
            new = idx[np.argsort(res)[: max(d + 8, int(keep * cur.size))]]
            if np.array_equal(np.sort(new), np.sort(cur)):
                break
            cur = new
        res = np.abs(X[idx] @ Rh - L[idx, h])
        good = idx[res <= max(1e-5, 3 * float(np.median(res)))]
        R[h] = np.linalg.lstsq(X[good], L[good, h], rcond=None)[0] if good.size > d else Rh
    return R


def shared_amplitude_start(s, G, X, gamma0, window, known=None):
    """A row's start ``(gamma, R)`` from all of its pairs with the amplitudes shared, or None.

    Parameters
    ----------
    s : ndarray of shape (S,)
    G : ndarray of shape (K, S)
    X : ndarray of shape (K, d)
    gamma0 : ndarray of shape (H,)
    window : float
        Largest ``|log r|`` sampled; shifts beyond ``window + 6`` are flat in it and not used.
    known : tuple of ndarray of shape (K, H), optional
        ``(use, L)``: shifts already known (the per-head start's), used where a pair's
        fixed-amplitude fit is not accepted.

    Returns
    -------
    (gamma, R) with shapes (H,) and (H, d), or None if some head's shift is known at ``d`` or
    fewer pairs.
    """
    gamma = np.asarray(gamma0, dtype=float)
    L, ok = shared_amplitude_shifts(s, G, gamma)
    scale = float(np.max(np.abs(G)))
    inside = np.abs(L) <= window + 6
    use = ok[:, None] & inside
    if known is not None:
        L = np.where(use, L, known[1])
        use = use | known[0]
    for _ in range(10):
        # The pairs not accepted, refitted from the shifts that the rows so far predict.
        redo = np.flatnonzero(~ok)
        if redo.size == 0:
            break
        pred = np.where(use[redo], L[redo], X[redo] @ trimmed_rows(X, L, use, strict=False).T)
        Gm = np.repeat(gamma[None], redo.size, axis=0)
        _, Lp, res = polish_pairs(s, G[redo], Gm, pred, fixed_gamma=True, iters=60)
        new = res <= ACCEPT * scale
        if not new.any():
            break
        k = redo[new]
        ok[k], L[k] = True, Lp[new]
        use[k] = np.abs(Lp[new]) <= window + 6
    R = trimmed_rows(X, L, use)
    return None if R is None else (gamma, R)
