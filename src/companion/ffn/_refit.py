"""The last hidden layer of a deep ReLU network refit on the answers already spent (this book's stage).

Private to :mod:`companion.ffn.deep` (:func:`~companion.ffn.deep.learn_relu_network`), apart only to keep
that module within the project's size limit; it needs nothing but numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Answered points the last layer's refit fits on (a random subset of the answers already spent;
#: the last fit uses them all). This book's choice: 20,000 points of 9 coordinates keep a fit within
#: about 0.1 s at widths 8, and are far more than the 81 unknowns.
REFIT_POINTS = 20_000

#: Rounds of the refit's remove-and-add loop without a new smallest residual after which it stops
#: (this book's rule: a round that does not lower the residual left a state already tried or a worse
#: one). Measured on seeds 0-19 of (10; 8, 8, 8): the 12 draws recovered with all ``2 width`` rounds
#: are recovered with the same queries (seed 9 at 41.5 bits, was 41.7); a stricter rule (the residual
#: must fall by half) lost seed 4.
STALL_ROUNDS = 2


#: Most crossed planes whose sides :func:`choose_sides` reads: it tries every subset, ``2^K`` of them
#: (this book's limit: 2^16 subsets take about half a second; at K = 30 they would take hours). A
#: last layer wider than this keeps the sided fit (:func:`learn_relu_network`'s verification decides).
SIDES_MAX_PLANES = 16


@dataclass
class PlaneFit:
    """One orientation-free fit: ``y = sum_k [F e_k > 0] F p_k + F a`` (:func:`fit_planes`)."""

    E: np.ndarray  # (m + 1, K) unit normals, each oriented as it was given
    P: np.ndarray  # (m + 1, K) slopes on the side F e_k > 0 (0 for a neuron not crossed)
    a: np.ndarray  # (m + 1,) the affine part, the constant last
    crossed: np.ndarray  # (K,) bool: the plane separates the points (both patterns occur)
    r: np.ndarray  # residuals
    res: float  # max |r| / max |y|


def fit_planes(F, E, y, iters=30) -> PlaneFit:
    """Alternating least squares for ``y = sum_k [F e_k > 0] F p_k + F a``, free of orientation.

    With the layer below known, the answers are ``sum_k c_k ReLU(s_k e_k^T F) + c`` (``F = (h, 1)``).
    ``ReLU(-z) = ReLU(z) - z``, so whichever side a neuron is on, it is ``[F e_k > 0] F p_k`` plus an
    affine term, and every such term, and every neuron on at all the points, is one affine ``F a``.
    So the side each neuron is on need not be known to fit the planes (:func:`choose_sides` reads it
    from ``a`` after). The patterns come from ``E``, then ``p_k`` and ``a`` by least squares, ``e_k``
    their directions, until no pattern moves. A plane that does not separate the points (its neuron
    is on at all of them, or off) is left out of the fit: its block would repeat ``F a``'s, and the
    least-squares split between the two would move the plane at random.
    """
    ref = max(float(np.max(np.abs(y))), np.finfo(float).tiny)
    E = E / np.maximum(np.linalg.norm(E, axis=0), np.finfo(float).tiny)
    act = (F @ E) > 0
    n = F.shape[1]
    for _ in range(iters):
        crossed = act.any(axis=0) & (~act).any(axis=0)
        idx = np.flatnonzero(crossed)
        D = np.concatenate([act[:, k : k + 1] * F for k in idx] + [F], axis=1)
        sol = np.linalg.lstsq(D, y, rcond=None)[0]
        r = y - D @ sol
        P = np.zeros_like(E)
        P[:, idx] = sol[:-n].reshape(idx.size, n).T
        a = sol[-n:]
        new = E.copy()
        norms = np.linalg.norm(P[:, idx], axis=0)
        ok = norms > 0
        dirs = P[:, idx[ok]] / norms[ok]
        new[:, idx[ok]] = dirs * np.where(np.sum(dirs * E[:, idx[ok]], axis=0) < 0, -1.0, 1.0)
        new_act = (F @ new) > 0
        moved = bool(np.any(new_act != act))
        E, act = new, new_act
        if not moved:
            break
    return PlaneFit(E, P, a, crossed, r, float(np.max(np.abs(r))) / ref)


def fit_patterns(F, E, y, iters=30):
    """Alternating least squares for ``y = sum_k [F e_k > 0] F p_k + c`` with each side kept as given
    (``e_k`` on the side where its neuron is on): the patterns from ``E``, then ``p_k`` (``c_k e_k``)
    by least squares, ``e_k`` their directions kept on their side, until no pattern moves. Returns
    ``(E, residuals, max |residual| / max |y|)``.

    A neuron on at every point is fit on ``h`` alone and kept on at every point: its block would
    repeat the constant's column, and the least-squares split between the two moved its plane's
    offset at random, into the points (this book's finding: on seeds 7 and 14 of (10; 8, 8, 8) such
    a neuron, on at every one of 10^6 ``N(0, I)`` inputs, was then cut by its own plane, and the fit
    started at the target's own normals left 6e-6 and 5e-3 of the answers; with the offset kept
    clear of the points, 1e-14 and 2e-14). Its offset puts the smallest pre-activation over the
    points at their spread: where it would turn off, beyond the points, they do not determine."""
    K = E.shape[1]
    ref = max(float(np.max(np.abs(y))), np.finfo(float).tiny)
    r = y
    for _ in range(iters):
        act = (F @ E) > 0
        on = act.all(axis=0)
        blocks = [F[:, :-1] if on[k] else act[:, k : k + 1] * F for k in range(K)]
        D = np.concatenate(blocks + [np.ones((F.shape[0], 1))], axis=1)
        sol = np.linalg.lstsq(D, y, rcond=None)[0]
        r = y - D @ sol
        P = np.zeros_like(E)
        at = 0
        for k, block in enumerate(blocks):
            P[: block.shape[1], k] = sol[at : at + block.shape[1]]
            at += block.shape[1]
        new = P / np.maximum(np.linalg.norm(P, axis=0), np.finfo(float).tiny)
        new *= np.where(np.sum(new * E, axis=0) < 0, -1.0, 1.0)
        for k in np.flatnonzero(on):
            z = F[:, :-1] @ new[:-1, k]
            spread = float(np.max(z) - np.min(z))
            new[-1, k] = (spread if spread > 0 else 1.0) - float(np.min(z))  # on at every point, with room
            new[:, k] /= np.linalg.norm(new[:, k])
        moved = bool(np.any(act != ((F @ new) > 0)))
        E = new
        if not moved:
            break
    return E, r, float(np.max(np.abs(r))) / ref


def _sided(F, E, y, iters=30) -> PlaneFit:
    """:func:`fit_patterns` as a :class:`PlaneFit` (every plane counted as crossed, no affine part)."""
    E, r, res = fit_patterns(F, E, y, iters)
    return PlaneFit(E, E, np.zeros(F.shape[1]), np.ones(E.shape[1], dtype=bool), r, res)


def choose_sides(fit: PlaneFit, width, F, rtol=1e-8):
    """The last layer's normals, each on the side where its neuron is on, from an orientation-free fit.

    Turning neuron ``k`` to the side ``F e_k < 0`` moves ``p_k`` into the affine part. The sides are
    the subset ``S`` of the crossed planes for which ``a_h + sum_{k in S} p_{k,h}`` (the weights on
    ``h``, not the constant) is smallest, ``2^K`` subsets. What is left, ``r``, is the sum of the
    neurons on at every answered point; if it is not 0 (relative ``rtol``) and the width allows, one
    neuron is added that is on at every answered point and carries it (``r^T F + beta``, with
    ``beta`` a margin above the points' ``-r^T F``; the readout's constant takes ``-beta``): only
    their sum reaches the answers. Returns ``E`` of shape ``(m + 1, k)``.
    """
    idx = np.flatnonzero(fit.crossed)
    if idx.size > SIDES_MAX_PLANES:
        raise ValueError(f"choose_sides tries 2^K subsets; K = {idx.size} > SIDES_MAX_PLANES = {SIDES_MAX_PLANES}")
    Ph, ah = fit.P[:-1, idx], fit.a[:-1]
    size = max(float(np.max(np.abs(Ph), initial=0.0)), float(np.max(np.abs(ah))), np.finfo(float).tiny)
    best, best_norm = np.zeros(idx.size, dtype=bool), np.inf
    for code in range(2**idx.size):
        S = np.array([(code >> j) & 1 == 1 for j in range(idx.size)], dtype=bool)
        norm = float(np.max(np.abs(ah + Ph[:, S].sum(axis=1))))
        if norm < best_norm:
            best, best_norm = S, norm
    E = fit.E[:, idx] * np.where(best, -1.0, 1.0)[None, :]
    r = fit.a + fit.P[:, idx[best]].sum(axis=1)
    if best_norm > rtol * size and E.shape[1] < width:
        z = F[:, :-1] @ r[:-1]
        beta = 4.0 * (float(np.max(np.abs(z))) - float(np.min(z)))  # z + beta > 0 at every point, with room
        e = np.concatenate([r[:-1], [beta]])
        E = np.concatenate([E, (e / np.linalg.norm(e))[:, None]], axis=1)
    return E


@dataclass
class Refit:
    """What :func:`refit_last_layer` returns: the normals, and what the fit left."""

    E: np.ndarray  # (m + 1, k) normals, each on the side where its neuron is on
    rounds: int  # remove-and-add rounds run
    res: float  # max |residual| / max |y| of the last fit, on every answered point
    thin: list  # (m + 1,) vectors t: sides {F t > 0} of a plane whose answered points span < m + 1 dims


def refit_last_layer(layers, E, X, y, width, rng, tol=2.0**-40, *, sided=False) -> Refit:
    """The last layer's normals ``E`` (``(m + 1, k)``) refit on the answered points ``X``, ``y``
    (this book's stage, not in Carlini et al. 2020); returns them on the side where each neuron is on.

    Partial signatures leave weights unseen (set to 0), neurons unmet and sides guessed; with the
    layers below known, the answers are ``sum_k c_k ReLU(e_k^T (h, 1)) + c``, fit free of the sides
    by :func:`fit_planes`. While the fit leaves a residual above ``tol``, a neuron is added from the
    points it leaves unexplained (fewer than ``width`` planes), or, at ``width``, the one whose
    removal fits best is taken out first (a plane that is not a neuron's); after ``STALL_ROUNDS``
    rounds without a smaller residual it stops (the state then repeats or worsens: refused draws
    cost 36-47 CPU s in ``2 width`` rounds before). A last fit uses every answered point, and
    :func:`choose_sides` reads the sides. The verification on fresh points decides.
    """
    # Rounds: at most 2 width (a plane out and one in per missing neuron), fewer by STALL_ROUNDS.
    H = X
    for W, b in layers:
        H = np.maximum(H @ W + b, 0.0)
    F_all = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    pick = rng.choice(F_all.shape[0], min(REFIT_POINTS, F_all.shape[0]), replace=False)
    F, ys = F_all[pick], y[pick]
    fitter = _sided if sided else fit_planes
    fit = fitter(F, E, ys)
    best, stall, rounds = fit, 0, 0
    while rounds < 2 * width and best.res > tol and stall < STALL_ROUNDS:
        rounds += 1
        E = fit.E[:, fit.crossed]  # a plane no point crosses holds nothing the affine part does not
        if E.shape[1] >= width:
            trials = [(fitter(F, np.delete(E, k, axis=1), ys, iters=5).res, k) for k in range(E.shape[1])]
            fit = fitter(F, np.delete(E, min(trials)[1], axis=1), ys)
        else:
            big = np.abs(fit.r) > 1e-3 * np.max(np.abs(fit.r))  # where the missing neuron is on
            p = np.linalg.lstsq(F[big], fit.r[big], rcond=None)[0]
            e = p / np.linalg.norm(p)
            e = e if np.mean(F[big] @ e > 0) >= 0.5 else -e  # (the sided fit keeps this side)
            fit = fitter(F, np.concatenate([E, e[:, None]], axis=1), ys)
        if fit.res < best.res:
            best, stall = fit, 0
        else:
            stall += 1
    if sided and best.res > tol:
        # A neuron on at every point may have no plane of its own among the partial normals (no kink
        # crossed it), its part carried by a plane that turns off where that neuron does not: try each
        # plane turned into one on at every point (e_{m+1}; fit_patterns keeps it on), the best one kept
        # if it fits better (this book's step: seed 7 of (10; 8, 8, 8), 7.1e-5 of the answers to 1e-14).
        trials = [(_sided(F, _turned_on(best.E, k), ys, iters=5).res, k) for k in range(best.E.shape[1])]
        turned = _sided(F, _turned_on(best.E, min(trials)[1]), ys)
        if turned.res < best.res:
            best = turned
    if sided:
        last = _sided(F_all, best.E, y)
        return Refit(last.E, rounds, last.res, [])
    last = fit_planes(F_all, best.E[:, best.crossed], y)
    return Refit(choose_sides(last, width, F_all), rounds, last.res, thin_sides(last, F_all))


def _turned_on(E, k):
    """``E`` with its plane ``k`` replaced by ``e_{m+1}``: a neuron on at every point (``F e = 1``)."""
    E = E.copy()
    E[:, k] = 0.0
    E[-1, k] = 1.0
    return E


def thin_sides(fit: PlaneFit, F):
    """The sides of the fitted planes on which the answered points do not determine the fit.

    On each side of a crossed plane the fit's slopes are read from the points there; if those points
    (rows of ``F``, ``(h, 1)``) span fewer than ``m + 1`` dimensions (a side met only along a few
    lines), the least-squares slopes are not determined by the answers, and the fit is right on the
    answered points and wrong beside them (seed 4 of (10; 8, 8, 8): 692 points spanning 7 of 9
    dimensions, fit to 3e-14 on them and off by 0.2 on fresh points). Returns the vectors ``t``
    with the side ``{F t > 0}``, for :func:`learn_relu_network` to ask points there.
    """
    n = F.shape[1]
    out = []
    for k in np.flatnonzero(fit.crossed):
        on = (F @ fit.E[:, k]) > 0
        for side, t in ((on, fit.E[:, k]), (~on, -fit.E[:, k])):
            sv = np.linalg.svd(F[side], compute_uv=False)
            if sv.size < n or sv[-1] <= 1e-9 * sv[0]:
                out.append(t)
    return out
