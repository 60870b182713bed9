"""The recovered layers' geometry and the line search of :func:`companion.ffn.learn_relu_network`.

Private: the known prefix of a network (its activations, Jacobians and the points where every
later layer is active), the gradients and critical points along lines, and the sharpening of a
layer's planes on critical points placed on them (Carlini, Jagielski &
Mironov 2020, in this book's own implementation). Split from :mod:`companion.ffn.deep`, which
imports every function below and is its only user (:class:`Crossing` serves :func:`sharpen`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import linprog

from ._kinks import EPS as _EPS
from ..errors import OracleInconsistentError
from ._kinks import find_kinks

# --------------------------------------------------------------------------------------------
# The known prefix of the network


def prefix(layers, X, *, jacobian=True):
    """Activations ``h`` (n, m), Jacobians ``dh/dx`` (n, m, d) and activation patterns of the recovered
    layers at ``X`` (n, d). With ``jacobian=False`` the Jacobians are None: they take ``n m d`` floats,
    12.8 GB for the 500,000 answers of an (80; 40, 20) network, where the readout needs ``h`` only."""
    n, d = X.shape
    H = X
    J = np.broadcast_to(np.eye(d), (n, d, d)) if jacobian else None
    patterns = []
    for W, b in layers:
        Z = H @ W + b
        act = Z > 0
        patterns.append(act)
        H = np.where(act, Z, 0.0)
        if jacobian:
            J = act[:, :, None] * np.einsum("im,nid->nmd", W, J)
    return H, J, patterns


def all_active_map(layers, d):
    """The affine map ``x -> (z_1, ..., z_l)`` of every recovered neuron's pre-activation where all are active."""
    A, c = np.eye(d), np.zeros(d)  # h = A^T x + c
    maps = []
    for W, b in layers:
        A, c = A @ W, c @ W + b
        maps.append((A, c))
    if not maps:
        return np.zeros((d, 0)), np.zeros(0)
    return np.concatenate([M for M, _ in maps], axis=1), np.concatenate([v for _, v in maps])


def active_points(layers, d, n, rng, *, box=30.0):
    """``n`` random inputs at which every neuron of the recovered layers is active (no query).

    Each coordinate of ``h_1`` on its own log-uniform scale, kept where the later layers are all
    active (points near every face and corner of the region, where a plane may cross it only);
    if too few are kept, the rest by hit-and-run from the point of largest margin
    (:func:`scipy.optimize.linprog`). An empty array if no input activates them all.
    """
    if not layers:
        return rng.standard_normal((n, d))
    W1, b1 = layers[0]
    pinv = np.linalg.pinv(W1.T)  # (d, m1): W1^T (pinv y) = y
    out: list = []
    for _ in range(20):
        Y = np.exp(rng.uniform(np.log(1e-3), np.log(1e1), (20 * n, W1.shape[1])))
        X = (Y - b1) @ pinv.T
        _, _, pats = prefix(layers, X, jacobian=False)
        ok = np.all(np.concatenate(pats, axis=1), axis=1)
        out.extend(X[ok][: n - len(out)])
        if len(out) >= n:
            return np.asarray(out).reshape(-1, d)
    M, c = all_active_map(layers, d)
    norms = np.linalg.norm(M, axis=0)
    # max t subject to (M^T x + c) / |M_i| >= t and |x_j| <= box - t: a point with room on every side
    eye = np.eye(d)
    res = linprog(
        np.concatenate([np.zeros(d), [-1.0]]),
        A_ub=np.block([[-(M / norms).T, np.ones((M.shape[1], 1))], [eye, np.ones((d, 1))], [-eye, np.ones((d, 1))]]),
        b_ub=np.concatenate([c / norms, np.full(2 * d, box)]),
        bounds=[(None, None)] * d + [(None, 1.0)],
    )
    if res.x is None or res.x[-1] <= 0:
        return np.asarray(out).reshape(-1, d)
    x = res.x[:d]
    step = 0
    while len(out) < n:
        u = rng.standard_normal(d)
        z0, dz = x @ M + c, u @ M
        with np.errstate(divide="ignore"):
            t = -z0 / dz
        pos, neg = u > 0, u < 0
        lo = max(
            float(np.max(t[dz > 0], initial=-np.inf)),
            float(np.max((-box - x[pos]) / u[pos], initial=-np.inf)),
            float(np.max((box - x[neg]) / u[neg], initial=-np.inf)),
        )
        hi = min(
            float(np.min(t[dz < 0], initial=np.inf)),
            float(np.min((box - x[pos]) / u[pos], initial=np.inf)),
            float(np.min((-box - x[neg]) / u[neg], initial=np.inf)),
        )
        x = x + rng.uniform(lo, hi) * u
        step += 1
        if step >= 10 and step % 3 == 0:
            out.append(x.copy())
    return np.asarray(out).reshape(-1, d)


# --------------------------------------------------------------------------------------------
# Gradients and critical points


def gradients_sym(f, X, h, scale, *, max_halvings=10):
    """Gradients of ``f`` at ``X`` (n, d) by symmetric differences, each checked for linearity.

    ``2 d + 1`` queries a point; a point whose forward and backward differences disagree (a step
    crossed a kink) is re-measured with an 8 times smaller step.
    """
    n, d = X.shape
    G = np.empty((n, d))
    f0 = f(X)
    steps = np.broadcast_to(np.asarray(h, dtype=np.float64), (n,)).copy()
    todo = np.arange(n)
    E = np.eye(d)
    for _ in range(max_halvings):
        if todo.size == 0:
            break
        P = np.concatenate(
            [X[todo, None, :] + steps[todo, None, None] * E, X[todo, None, :] - steps[todo, None, None] * E], axis=1
        )
        fp = f(P.reshape(-1, d)).reshape(todo.size, 2 * d)
        fw, bw = fp[:, :d], fp[:, d:]
        curv = np.abs(fw + bw - 2.0 * f0[todo, None])
        G[todo] = (fw - bw) / (2.0 * steps[todo, None])
        # The rounding of an answer grows with the terms of the linear piece, sum_j |g_j x_j|, not only
        # with |f|: far from the origin (|x| ~ 1e3 at seed 5 of (12; 12, 10)) the shifted inputs'
        # rounding alone moved the curvature past a tolerance in |f|, on a function that is linear there.
        terms = np.sum(np.abs(G[todo]) * np.abs(X[todo]), axis=1)[:, None]
        tol = 64 * _EPS * (scale + np.abs(f0[todo, None]) + np.abs(fw) + np.abs(bw) + terms)
        bad = np.any(curv > tol, axis=1)
        steps[todo[bad]] /= 8.0
        todo = todo[bad]
    if todo.size:
        raise OracleInconsistentError(
            f"{todo.size} gradient(s) stayed curved after {max_halvings} step reductions: the function "
            "is not piecewise linear (not a ReLU network)."
        )
    return G, f0


@dataclass
class Kink:
    x: np.ndarray  # the critical point (d,)
    jump: np.ndarray  # gradient after minus gradient before, along the line (d,)
    sides: tuple  # (x_before, x_after)
    grads: tuple  # (grad_before, grad_after)
    line: int


def line_kinks(f, x0, q, lo, hi, scale, line_id, *, step, keep=None):
    """The critical points of ``f`` on ``x0 + t q``, ``lo <= t <= hi``, with the gradients beside each.

    ``keep(before, after)`` (no query) selects the kinks whose gradients are measured.
    """

    def g(ts):
        return f(x0[None, :] + ts[:, None] * q[None, :])

    ts, _ = find_kinks(g, lo, hi, scale=scale)
    if ts.size == 0:
        return []
    edges = np.concatenate([[lo], ts, [hi]])
    gaps = np.minimum(np.diff(edges)[:-1], np.diff(edges)[1:])
    delta = 0.25 * gaps
    before = x0[None, :] + (ts - delta)[:, None] * q[None, :]
    after = x0[None, :] + (ts + delta)[:, None] * q[None, :]
    if keep is not None:
        sel = keep(before, after)
        ts, delta, before, after = ts[sel], delta[sel], before[sel], after[sel]
        if ts.size == 0:
            return []
    hs = np.minimum(0.25 * delta, step)
    G, _ = gradients_sym(f, np.concatenate([before, after]), np.concatenate([hs, hs]), scale)
    k = ts.size
    return [
        Kink(x0 + t * q, G[k + i] - G[i], (before[i], after[i]), (G[i], G[k + i]), line_id) for i, t in enumerate(ts)
    ]


def readable(layers):
    """``keep(before, after)`` for :func:`line_kinks`: the kinks of a later layer (the recovered
    layers' pattern is the same on both sides) where the last recovered layer is all active and
    the Jacobian of ``h`` has full rank, so that the jump gives the whole normal."""

    def keep(before, after):
        if not layers:
            return np.ones(before.shape[0], dtype=bool)
        _, J, pb = prefix(layers, before)
        _, _, pa = prefix(layers, after, jacobian=False)
        same = np.all(np.concatenate(pb, axis=1) == np.concatenate(pa, axis=1), axis=1)
        full = np.all(pb[-1], axis=1)
        ok = same & full
        for i in np.flatnonzero(ok):
            sv = np.linalg.svd(J[i], compute_uv=False)
            ok[i] = sv[-1] > 1e-8 * sv[0]
        return ok

    return keep


def readable_points(layers, d, n, rng):
    """Up to ``n`` random inputs where the last recovered layer is all active with a full-rank
    Jacobian (earlier layers in any pattern): the bases of the lines that leave ``R_{l-1}``."""
    keep = readable(layers)
    out = []
    for scale in (1.0, 2.0, 0.5, 4.0, 1.0, 2.0):
        X = scale * rng.standard_normal((40 * n, d))
        out.extend(X[keep(X, X)][: n - len(out)])
        if len(out) >= n:
            break
    return np.asarray(out).reshape(-1, d)


def segment(layers, x0, q, span, d):
    """The part of ``x0 + t q``, ``|t| <= span``, on which every recovered neuron stays active."""
    M, c = all_active_map(layers, d)
    lo, hi = -span, span
    if M.shape[1]:
        z0 = x0 @ M + c
        dz = q @ M
        with np.errstate(divide="ignore"):
            t = -z0 / dz
        lo = max(lo, float(np.max(t[dz > 0], initial=-np.inf)))
        hi = min(hi, float(np.min(t[dz < 0], initial=np.inf)))
    pad = 1e-6 * (hi - lo)
    return lo + pad, hi - pad


# --------------------------------------------------------------------------------------------
# Sharpening a layer's planes on critical points placed on them


class Crossing(NamedTuple):
    """Where a line's two linear pieces meet, and the test of :func:`sharpen` right beside it.

    ``f`` is asked at ``tc - e`` and ``tc + e``, each answer to lie within ``tol`` of its side's line
    (``lines_at``). ``testable`` is whether the offset ``16 tol / |slope change|`` stayed below
    ``delta / 2``: if not, the slopes differ too little for the test to tell one kink from two
    within ``delta``, so the point is asked at ``e = delta / 2`` (counted, to keep the random stream
    the targeted search was measured on) and then dropped, whatever ``f`` answers.
    """

    row: int  # the line's index among the drawn segments
    tc: float  # where the two pieces meet, along the line
    e: float  # the test's offset either side of tc: min(16 tol / |slope change|, delta / 2)
    lines_at: tuple  # the two pieces' values at tc -+ the unclipped offset (unread unless testable)
    tol: float  # the answers' rounding level on this line
    testable: bool  # 16 tol / |slope change| < delta / 2: else the point fails its test

    @classmethod
    def at(cls, row, tc, e, delta, lines_at, tol) -> Crossing:
        """The crossing with its test at ``min(e, delta / 2)``, testable iff ``e < delta / 2``."""
        return cls(row, tc, min(e, 0.5 * delta), lines_at, tol, bool(e < 0.5 * delta))

    def passes(self, answers) -> bool:
        """``answers`` (f at ``tc - e``, ``tc + e``) lie on their sides' lines, and the test could tell."""
        return bool(
            self.testable
            and abs(answers[0] - self.lines_at[0]) <= self.tol
            and abs(answers[1] - self.lines_at[1]) <= self.tol
        )


def sharpen(f, layers, etas, d, rng, scale, span, *, extra=None, delta=1e-3):
    """Each neuron's ``(w, b)`` refit on ``m_prev + extra`` critical points placed on its plane
    (``extra`` by default ``max(4, m_prev // 4)``: on Carlini et al.'s 80-40-20-1, 44 points in 41
    dimensions left layer 2's planes 3e-12 off and the network at 36.9 bits; 50 points, 5e-14 and
    42.6 bits; networks with ``m_prev < 20`` keep 4).

    The coarse plane (from the gradient jumps) predicts where a random line inside ``R_{l-1}``
    crosses it. Three answers on each side, ``delta`` apart, give the two linear pieces; where they
    meet is the critical point to float64 (Carlini et al.'s intersection of lines). A side that is not
    linear (another kink is near) drops that line. Two kinks within ``delta`` of the crossing leave
    both sides linear, and the lines then meet between them, off the plane: so ``f`` is asked right
    beside the meeting point (``e = 16 tol / |slope change|``), where it must lie on each side's line
    (the test of :func:`~companion.ffn._kinks.find_kinks`); else the line is dropped. Measured on
    Carlini et al.'s 80-40-20-1 (``train_models.py 80-40-20-1 42``): without it two layer-1 planes
    were refit 2.5e-7 off (such points pass the 1e-6 test below) and the network verified to 2^-22.
    The plane through the points is the singular vector of ``[h_{l-1}(x_i), 1]`` of the smallest
    singular value. Eight queries a point.
    """
    m_prev = etas.shape[0] - 1
    need = m_prev + (max(4, m_prev // 4) if extra is None else extra)
    offs = delta * np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    out = []
    for j in range(etas.shape[1]):
        eta = etas[:, j]
        pts: list = []
        good: list = []  # whether each point passed the test beside it (see below)
        for _attempt in range(8):
            # Segments between points of R_{l-1} (convex) on either side of the plane cross it inside.
            pool = active_points(layers, d, 20 * need, rng)
            if pool.shape[0] == 0:
                break
            side = prefix(layers, pool, jacobian=False)[0] @ eta[:-1] + eta[-1] > 0
            pos, neg = pool[side], pool[~side]
            k = 2 * (need - len(pts))
            if pos.shape[0] and neg.shape[0]:
                bases = pos[rng.integers(pos.shape[0], size=k)]
                Q = neg[rng.integers(neg.shape[0], size=k)] - bases
            else:
                bases, Q = pool[:k], rng.standard_normal((min(k, pool.shape[0]), d))
            Q /= np.linalg.norm(Q, axis=1, keepdims=True)
            H0, J0, _ = prefix(layers, bases)
            z0 = H0 @ eta[:-1] + eta[-1]
            dz = np.einsum("nmd,nd->nm", J0, Q) @ eta[:-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                t_star = -z0 / dz
            ok = np.isfinite(t_star) & (np.abs(t_star) < span)
            rows = []
            for i in np.flatnonzero(ok):
                lo, hi = segment(layers, bases[i], Q[i], span, d)
                if lo + 4 * delta < t_star[i] < hi - 4 * delta:
                    rows.append(i)
            rows = rows[: need - len(pts)]
            if not rows:
                continue
            T = t_star[rows][:, None] + offs[None, :]
            Xq = bases[rows][:, None, :] + T[:, :, None] * Q[rows][:, None, :]
            y = f(Xq.reshape(-1, d)).reshape(len(rows), 6)
            found: list[Crossing] = []
            for r, i in enumerate(rows):
                t, v = T[r], y[r]
                sl, sr = (v[2] - v[0]) / (t[2] - t[0]), (v[5] - v[3]) / (t[5] - t[3])
                tol = 64 * _EPS * (scale + np.max(np.abs(v)))
                lin_l = abs(v[0] + sl * (t[1] - t[0]) - v[1]) <= tol
                lin_r = abs(v[3] + sr * (t[4] - t[3]) - v[4]) <= tol
                if not (lin_l and lin_r) or abs(sl - sr) <= 1e-6 * max(abs(sl), abs(sr), scale):
                    continue
                tc = (v[3] - sr * t[3] - v[0] + sl * t[0]) / (sl - sr)
                e = 16 * tol / abs(sl - sr)
                if abs(tc - t_star[i]) < delta:
                    lines_at = (v[0] + sl * (tc - e - t[0]), v[3] + sr * (tc + e - t[3]))
                    found.append(Crossing.at(i, tc, e, delta, lines_at, tol))
            if found:
                Xb = np.concatenate(
                    [[bases[c.row] + (c.tc - c.e) * Q[c.row], bases[c.row] + (c.tc + c.e) * Q[c.row]] for c in found]
                )
                # Asked and counted, not kept for the readout and the last layer's refit: a point e beside
                # a kink adds nothing there, and kept, it would move the refit's random subsets of the
                # answers (the depth-3 draws the targeted search recovers are sensitive to them).
                yb = f.unrecorded(Xb).reshape(len(found), 2)
                for c, vb in zip(found, yb):
                    pts.append(bases[c.row] + c.tc * Q[c.row])
                    good.append(c.passes(vb))
            # Every point counts towards ``need`` whether it passed or not, so that the lines drawn (and
            # the random stream after them) are those measured before the test: the depth-3 draws that
            # the targeted search recovers (seeds 1, 7, 8 of (10; 8, 8, 8)) are sensitive to that stream.
            if len(pts) >= need:
                break
        pts = [x for x, ok in zip(pts, good) if ok]
        if len(pts) < m_prev + 1:
            out.append(eta)
            continue
        H, _, _ = prefix(layers, np.asarray(pts), jacobian=False)
        P = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
        Pn = P / np.linalg.norm(P, axis=1, keepdims=True)
        # A point of another plane met near the predicted crossing is far off the coarse plane: drop it.
        Pn = Pn[np.abs(Pn @ eta) <= 1e-6]
        if Pn.shape[0] < m_prev + 1:
            out.append(eta)
            continue
        v = np.linalg.svd(Pn)[2][-1]
        v = v if v @ eta >= 0 else -v
        # Keep the refit only if it is the same plane (the coarse one is good to about 2^-35).
        out.append(v if np.max(np.abs(v - eta)) <= 1e-6 else eta)
    return np.stack(out, axis=1)
