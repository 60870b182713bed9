"""The last hidden layer of a deep ReLU network refit on the answers already spent (this book's stage).

Private to :mod:`companion.ffn.deep` (:func:`~companion.ffn.deep.learn_relu_network`), apart only to keep
that module within the project's size limit; it needs nothing but numpy.
"""

from __future__ import annotations

import numpy as np

#: Answered points the last layer's refit fits on (a random subset of the answers already spent;
#: the last fit uses them all). This book's choice: 20,000 points of 9 coordinates keep a fit within
#: about 0.1 s at widths 8, and are far more than the 73 unknowns.
REFIT_POINTS = 20_000


def fit_patterns(F, E, y, iters=30):
    """Alternating least squares for ``y = sum_k [F e_k > 0] F p_k + c``: the activation patterns
    from ``E`` (columns ``e_k``, unit norm), then ``p_k`` (``c_k e_k`` with the readout ``c_k``) by
    least squares, ``e_k`` their directions kept on the side where the neuron is on, until no
    pattern moves. Returns ``(E, residuals, max |residual| / max |y|)``."""
    K = E.shape[1]
    ref = max(float(np.max(np.abs(y))), np.finfo(float).tiny)
    for _ in range(iters):
        act = (F @ E) > 0
        D = np.concatenate([act[:, k : k + 1] * F for k in range(K)] + [np.ones((F.shape[0], 1))], axis=1)
        sol = np.linalg.lstsq(D, y, rcond=None)[0]
        r = y - D @ sol
        P = sol[:-1].reshape(K, -1).T
        new = P / np.maximum(np.linalg.norm(P, axis=0), np.finfo(float).tiny)
        new *= np.where(np.sum(new * E, axis=0) < 0, -1.0, 1.0)
        moved = bool(np.any(act != ((F @ new) > 0)))
        E = new
        if not moved:
            break
    return E, r, float(np.max(np.abs(r))) / ref


def refit_last_layer(layers, E, X, y, width, rng, tol=2.0**-40):
    """The last layer's normals ``E`` (``(m + 1, k)``, each on the side where its neuron is on) refit
    on the answered points ``X``, ``y`` (this book's stage, not in Carlini et al. 2020).

    Partial signatures leave weights unseen (set to 0) and neurons unmet; with the layers below
    known, the answers are ``sum_k c_k ReLU(e_k^T (h, 1)) + c``, linear in ``c_k e_k`` once the
    activation patterns are fixed: :func:`fit_patterns`. While the fit leaves a residual, a neuron
    is added from the points it leaves unexplained (fewer than ``width``), or, at ``width``, the one
    whose removal fits best is taken out first (a plane that is not a neuron's). The verification
    on fresh points decides.
    """
    H = X
    for W, b in layers:
        H = np.maximum(H @ W + b, 0.0)
    F_all = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    E = E / np.linalg.norm(E, axis=0)
    pick = rng.choice(F_all.shape[0], min(REFIT_POINTS, F_all.shape[0]), replace=False)
    F, ys = F_all[pick], y[pick]
    E, r, res = fit_patterns(F, E, ys)
    for _ in range(2 * width):
        if res <= tol:
            break
        if E.shape[1] >= width:
            trials = [(fit_patterns(F, np.delete(E, k, axis=1), ys, iters=5)[2], k) for k in range(E.shape[1])]
            E, r, res = fit_patterns(F, np.delete(E, min(trials)[1], axis=1), ys)
            continue
        big = np.abs(r) > 1e-3 * np.max(np.abs(r))  # where the missing neuron is on
        p = np.linalg.lstsq(F[big], r[big], rcond=None)[0]
        e = p / np.linalg.norm(p)
        e = e if np.mean(F[big] @ e > 0) >= 0.5 else -e
        E, r, res = fit_patterns(F, np.concatenate([E, e[:, None]], axis=1), ys)
    return fit_patterns(F_all, E, y)[0]
