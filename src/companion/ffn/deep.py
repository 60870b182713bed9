"""ReLU networks with biases and ``k >= 1`` hidden layers: the model and its extraction (issue 37).

``h_0 = x``, ``h_l = ReLU(W_l^T h_{l-1} + b_l)``, ``f(x) = W_{k+1}^T h_k + b_{k+1}``; extracted layer
by layer from critical points along lines (Carlini, Jagielski & Mironov 2020), in this book's own
implementation (see :func:`learn_relu_network`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._learner import COARSE_FACTOR, FLOAT64_U, AnswerPrecision, QueryCount, refuse_stated_rounding
from .._validation import as_float_array, as_sequences, check_int, check_real
from ..errors import (
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
)
from ..recovery import Recovery
from ._kinks import bits_of_precision
from ._geometry import (  # the known prefix, gradients, critical points and sharpening (split out for size)
    active_points as _active_points,
    line_kinks as _line_kinks,
    prefix as _prefix,
    readable as _readable,
    readable_points as _readable_points,
    segment as _segment,
    sharpen as _sharpen,
)
from ._dead import DEAD_FIT_RTOL, check_dead_fit, detected_last_cap, dropped_text, may_drop, verify_refusal
from ._refit import REFIT_POINTS, SIDES_MAX_PLANES, refit_last_layer
from ._kinks import rounding_advice


@dataclass(frozen=True, eq=False)
class ReLUNetwork:
    """A ReLU network with biases, ``k >= 1`` hidden layers and one output.

    ``h_0 = x``, ``h_l = ReLU(W_l^T h_{l-1} + b_l)`` for ``l = 1..k``, ``f(x) = W_{k+1}^T h_k + b_{k+1}``.

    Parameters
    ----------
    weights : sequence of k + 1 array-likes
        ``W_l`` of shape ``(m_{l-1}, m_l)`` with ``m_0 = d``; the last, the readout, of shape (m_k,)
        or (m_k, 1).
    biases : sequence of k + 1 array-likes
        ``b_l`` of shape (m_l,); the last a scalar (or shape (1,)).

    Attributes
    ----------
    d : int
        Input dimension.
    widths : tuple of int
        ``(m_1, ..., m_k)``.

    Raises
    ------
    InvalidInputError
        If there is no hidden layer, the shapes disagree, or an entry is NaN or inf; when called,
        if a query is not of length 1.

    Examples
    --------
    >>> import numpy as np
    >>> net = ReLUNetwork([np.array([[1.0, -1.0]]), np.array([1.0, 1.0])], [np.array([0.0, 0.0]), 0.5])
    >>> net.forward(np.array([[2.0], [-3.0]]))   # |x| + 1/2
    array([2.5, 3.5])
    """

    weights: Any  # a sequence; stored as a tuple of read-only arrays
    biases: Any

    def __post_init__(self):
        weights, biases = list(self.weights), list(self.biases)
        if len(weights) < 2 or len(weights) != len(biases):
            raise InvalidInputError(
                f"a ReLUNetwork needs k + 1 >= 2 weight matrices and as many biases; got {len(weights)} "
                f"weights and {len(biases)} biases."
            )
        Ws, bs = [], []
        prev = None
        for i, (W, b) in enumerate(zip(weights, biases)):
            last = i == len(weights) - 1
            W = np.asarray(W, dtype=np.float64)
            if last and W.ndim == 1:
                W = W[:, None]
            W = as_float_array(W, f"weights[{i}]", ndim=2, shape=(prev, 1) if last else (prev, None))
            b = np.atleast_1d(np.asarray(b, dtype=np.float64))
            b = as_float_array(b, f"biases[{i}]", ndim=1, shape=(W.shape[1],))
            if W.shape[0] == 0 or W.shape[1] == 0:
                raise InvalidInputError(f"weights[{i}] has an empty dimension: shape {W.shape}.")
            prev = W.shape[1]
            for a in (W, b):
                a.flags.writeable = False
            Ws.append(W)
            bs.append(b)
        object.__setattr__(self, "weights", tuple(Ws))
        object.__setattr__(self, "biases", tuple(bs))

    @property
    def d(self) -> int:
        return self.weights[0].shape[0]

    @property
    def widths(self) -> tuple:
        return tuple(W.shape[1] for W in self.weights[:-1])

    @property
    def n_parameters(self) -> int:
        return int(sum(W.size + b.size for W, b in zip(self.weights, self.biases)))

    def forward(self, x) -> np.ndarray:
        """Evaluate on points ``x`` of shape (B, d); returns (B,)."""
        h = as_float_array(x, "x", ndim=2, shape=(None, self.d))
        for W, b in zip(self.weights[:-1], self.biases[:-1]):
            h = np.maximum(h @ W + b, 0.0)
        return (h @ self.weights[-1] + self.biases[-1])[:, 0]

    def __call__(self, X):
        """Evaluate on length-1 sequences ``(1, d)`` (float), ``(B, 1, d)`` or a list (``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        lengths = {s.shape[0] for s in seqs} if isinstance(seqs, list) else {seqs.shape[1]}
        if lengths != {1}:
            raise InvalidInputError(f"a ReLUNetwork reads one token; got sequences of lengths {sorted(lengths)}.")
        out = self.forward(np.concatenate([s.reshape(-1, self.d) for s in seqs]))
        return float(out[0]) if single else out

    def __repr__(self):
        return f"ReLUNetwork(d={self.d}, widths={self.widths})"


def random_relu_network(d, widths, *, seed, bias_scale=0.5) -> ReLUNetwork:
    """A random network: weights ``N(0, 1/fan_in)``, biases ``N(0, bias_scale^2)``.

    Parameters
    ----------
    d : int
        Input dimension, ``>= 1``.
    widths : sequence of int
        Hidden widths ``(m_1, ..., m_k)``, ``k >= 1``.
    seed : int
        Seed of ``numpy.random.default_rng``.
    bias_scale : float, default=0.5
        Standard deviation of every bias (the readout's too).

    Returns
    -------
    ReLUNetwork

    Examples
    --------
    >>> random_relu_network(10, (8, 8), seed=0).widths
    (8, 8)
    """
    d = check_int(d, "d", minimum=1)
    widths = [check_int(m, "widths[i]", minimum=1) for m in widths]
    if not widths:
        raise InvalidInputError("widths must list at least one hidden layer.")
    bias_scale = check_real(bias_scale, "bias_scale", minimum=0.0)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    sizes = [d, *widths, 1]
    weights = [rng.standard_normal((a, b)) / np.sqrt(a) for a, b in zip(sizes[:-1], sizes[1:])]
    biases = [bias_scale * rng.standard_normal(b) for b in sizes[1:]]
    return ReLUNetwork(weights, biases)


@dataclass(frozen=True, eq=False, repr=False)
class ReLUNetworkRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a deep ReLU network: adds ``weights`` and ``biases``.

    ``W`` is None; ``v`` is the readout weights ``W_{k+1}`` (m_k,). ``network`` is the
    :class:`ReLUNetwork` they make (kept as arrays, so that the result saves and loads).
    """

    weights: tuple = ()  # the network's arrays, so that the result saves and loads as arrays
    biases: tuple = ()

    @property
    def network(self) -> ReLUNetwork:
        """The recovered network, a :class:`ReLUNetwork` of ``weights`` and ``biases``."""
        return ReLUNetwork(self.weights, self.biases)

    @property
    def d(self) -> int:
        return self.network.d


# --------------------------------------------------------------------------------------------
# One layer


def _layer_neurons(layers, kinks, width, d, min_lines, tol=1e-7):
    """Normals ``(w, b)`` (unit norm, up to sign) of the next layer, from the kinks found inside the
    region where the recovered layers are all active; returns ``(eta (m_prev + 1, k), members)``."""
    X = np.stack([k.x for k in kinks])
    H, _, _ = _prefix(layers, X, jacobian=False)
    _, J, _ = _prefix(layers, np.stack([k.sides[0] for k in kinks]))
    clusters: list = []  # [sum of aligned etas, lines, members, reference eta]
    for i, kink in enumerate(kinks):
        Ji = J[i]  # (m_prev, d), the same on both sides (see _readable)
        w, res, rank, sv = np.linalg.lstsq(Ji.T, kink.jump, rcond=None)
        if rank < Ji.shape[0] or sv[-1] < 1e-8 * sv[0]:
            continue
        if np.linalg.norm(Ji.T @ w - kink.jump) > 1e-6 * np.linalg.norm(kink.jump):
            continue  # not in the span of the known layer's gradients
        b = -float(w @ H[i])
        eta = np.concatenate([w, [b]])
        eta /= np.linalg.norm(eta)
        for cl in clusters:
            ref = cl[3]
            sgn = 1.0 if eta @ ref >= 0 else -1.0
            if np.max(np.abs(sgn * eta - ref)) <= tol:
                cl[0] += sgn * eta
                cl[1].add(kink.line)
                cl[2].append(i)
                break
        else:
            clusters.append([eta.copy(), {kink.line}, [i], eta])
    clusters = [cl for cl in clusters if len(cl[1]) >= min_lines]
    clusters.sort(key=lambda cl: -len(cl[1]))
    P_all = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    if width is None:
        chosen = clusters
    else:
        chosen = clusters[:width]
        if len(chosen) < width:
            raise NotIdentifiableError(
                f"layer {len(layers) + 1}: found {len(chosen)} of the {width} neurons (hyperplanes met on at "
                f"least {min_lines} lines and split by others); a neuron whose hyperplane misses the region "
                "where all earlier layers are active cannot be seen by this learner. Raise n_lines or max_batches."
            )
    if not chosen:
        return np.zeros((0 if not layers else layers[-1][0].shape[1] + 1, 0)), []
    etas = []
    for cl in chosen:
        eta0 = cl[0] / np.linalg.norm(cl[0])
        # The critical points lie on the hyperplane to float64 (find_kinks intersects lines): the
        # smallest correction orthogonal to eta0 that puts them on it refines the gradients' eta0.
        P = P_all[cl[2]]
        B = np.linalg.svd(eta0[:, None], full_matrices=True)[0][:, 1:]
        c = np.linalg.lstsq(P @ B, -(P @ eta0), rcond=None)[0]
        eta = eta0 + B @ c
        etas.append(eta / np.linalg.norm(eta))
    return np.stack(etas, axis=1), [cl[2] for cl in chosen]


def _flat_neurons(layers, kinks, cand, members, rtol=1e-6):
    """Which candidate planes are neurons of the layer being read, not pieces of the next one.

    Inside ``R_{l-1}`` a neuron ``k`` of layer ``l + 1`` bends where a neuron of layer ``l`` turns;
    its piece is flat within one cell of layer ``l``'s arrangement, and repeats on the lines through
    that cell. There its gradient jump is the same vector at every kink when layer ``l + 1`` is the
    last hidden one (the readout weighs it, whatever the pattern). A neuron ``a`` of layer ``l``
    jumps by ``(df/dh_a) grad z_a``, whose size changes with the pattern of the layers after it.
    So a candidate whose jumps differ in size by more than ``rtol`` is a neuron of layer ``l``; one
    whose kinks two such neurons' planes separate spans two cells, and is one too (this book's own
    test; Carlini et al. 2020 filter by repetition alone). Returns the indices, in the given order.
    """
    X = np.stack([k.x for k in kinks])
    H, _, _ = _prefix(layers, X, jacobian=False)
    P = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    sure = []
    for j, idx in enumerate(members):
        size = np.array([np.linalg.norm(kinks[i].jump) for i in idx])
        if size.max() > (1.0 + rtol) * size.min():
            sure.append(j)
    good = list(sure)
    for j, idx in enumerate(members):
        if j in sure:
            continue
        side = P[idx] @ cand[:, sure]
        margin = 1e-9 * np.max(np.abs(P[idx]), axis=1, keepdims=True)
        if np.any((side.min(axis=0) < -margin.max()) & (side.max(axis=0) > margin.max())):
            good.append(j)
    return sorted(good)


def _partial_clusters(layers, kinks, m, tol):
    """Partial normals ``w_S / b`` of the last layer from ``kinks``, merged where they agree on shared
    coordinates (Carlini et al. 2020's unification): ``[v (m,) with NaN where unseen, lines, kink
    indices]``, most-met first."""
    clusters = []
    for i, kink in enumerate(kinks):
        H, J, pats = _prefix(layers, kink.sides[0][None])
        S = pats[-1][0]
        Hx, _, _ = _prefix(layers, kink.x[None], jacobian=False)
        wS, *_ = np.linalg.lstsq(J[0][S].T, kink.jump, rcond=None)
        if np.linalg.norm(J[0][S].T @ wS - kink.jump) > 1e-6 * np.linalg.norm(kink.jump):
            continue
        b = -float(wS @ Hx[0][S])
        if abs(b) <= 1e-9 * np.linalg.norm(wS):
            continue
        v = np.full(m, np.nan)
        v[S] = wS / b
        clusters.append([v, {kink.line}, [i]])
    # Merge partial normals that agree on their shared coordinates (at least one): one pass,
    # each into the first merged normal it agrees with (fragments with no shared coordinate stay apart).
    merged: list = []
    for v, ls, idx in sorted(clusters, key=lambda cl: -int((~np.isnan(cl[0])).sum())):
        for cl in merged:
            both = ~np.isnan(v) & ~np.isnan(cl[0])
            if not both.any():
                continue
            ref = max(float(np.max(np.abs(v[both]))), float(np.max(np.abs(cl[0][both]))))
            if np.max(np.abs(v[both] - cl[0][both])) <= tol * ref:
                cl[0] = np.where(np.isnan(cl[0]), v, cl[0])
                cl[1] |= ls
                cl[2] += idx
                break
        else:
            merged.append([v.copy(), set(ls), list(idx)])
    clusters = merged
    clusters.sort(key=lambda cl: -len(cl[1]))
    return clusters


#: Whether widths are detected after the first layer by the jumps' sizes (_choose_planes); a switch
#: for the measurement of it (benchmarks/ffn_deep.md).
DETECT_DEEP = True

#: Whether, widths detected, a layer after one whose jumps showed another (DETECT_DEEP) is read as the
#: last layer of a deep network (anywhere, from partial normals, at most as wide as the layer before);
#: a switch for the measurement of it (benchmarks/ffn_deep.md).
DETECT_LAST = True

#: Whether, widths detected, a layer with another after it that comes out narrower than the one
#: before is searched with all ``max_batches`` batches (a switch for the measurement of it).
DETECT_SHORT = True

#: Whether the last layer of a deep network runs :func:`_targeted_search` (a switch for the tests,
#: which show what it adds).
TARGETED_SEARCH = True

#: Lines the targeted search (:func:`_targeted_search`) spends on each weight ``w_ki`` missing from
#: a partial normal, and the starting points it tries for them (no query: the recovered layers give
#: the points). This book's choice, measured on seeds 0-19 of (10; 8, 8, 8) (benchmarks/ffn_deep.md).
TARGETED_LINES = 2
TARGETED_STARTS = 12
#: Clean answered points on which the targeted search's refit reads the signs (the first reading
#: takes 4000): on seed 1 of (10; 8, 8, 8) 4000 chose a wrong sign vector and 12,000 or 40,000 the
#: right one (measured 2026-12-04); this book's choice, the refit's REFIT_POINTS.
SIGN_POINTS = REFIT_POINTS
#: Rounds of the targeted search: a weight found may show where another missing one is reached.
TARGETED_ROUNDS = 2


def _toward_crossing(layers, v, i, x, rng, iters=12):
    """A point (no query) where neuron ``i`` of the layer before the last is just active and the
    partial normal ``v`` (``v^T h + 1 = 0``, unseen weights 0) predicts a crossing of its plane, and a
    direction along which ``z_i`` stays put and the predicted plane is crossed; None if Newton's
    steps on the piecewise-linear map do not settle (another start is tried)."""
    W, b = layers[-1]
    v0 = np.nan_to_num(v, nan=0.0)
    for _ in range(iters):
        H1, J1, _ = _prefix(layers[:-1], x[None])
        z = H1[0] @ W + b
        G = J1[0].T @ W  # (d, m): gradients of the last recovered layer's pre-activations
        act = z > 0
        zk = float(v0[act] @ z[act]) + 1.0
        gk = G[:, act] @ v0[act]
        gi = G[:, i]
        eps = 0.05 * float(np.linalg.norm(gi))  # a step of about 0.05 inside neuron i's active side
        r = np.array([eps - z[i], -zk])
        if abs(r[0]) <= 1e-9 * max(eps, 1e-300) and abs(zk) <= 1e-9 and act[i]:
            sv = np.linalg.svd(G[:, act], compute_uv=False)
            if sv[-1] <= 1e-8 * sv[0]:
                return None  # the jump there would not give w_S (layer 1 too little active)
            u = gi / np.linalg.norm(gi)
            q = gk - (gk @ u) * u
            if np.linalg.norm(q) <= 1e-9 * np.linalg.norm(gk):
                return None
            q /= np.linalg.norm(q)
            e = rng.standard_normal(x.size)
            e -= (e @ u) * u + (e @ q) * q
            q = q + 0.3 * e / max(float(np.linalg.norm(e)), 1e-300)
            return x, q / np.linalg.norm(q)
        A = np.stack([gi, gk])
        x = x + np.linalg.lstsq(A, r, rcond=None)[0]
    return None


def _targeted_search(f, layers, full, kinks, keep, d, rng, scale, span=1.0):
    """Carlini et al. 2020's targeted search for the weights partial signatures missed (a stage of
    :func:`learn_relu_network`'s last layer).

    A weight ``w_ki`` is missing from neuron ``k``'s partial normal when neuron ``i`` of the layer
    before was off at every kink of ``k``. The recovered layers locate, without a query, points
    where ``i`` is just active and ``k``'s plane is predicted to lie (unseen weights 0; with ``i``
    barely on, ``w_ki h_i`` moves the plane little), and a direction along which ``i`` stays on and
    the plane is crossed. Kinks on a short line there (``|t| <= span``) have ``i`` in their active
    set, so they carry ``w_ki``, and :func:`_partial_clusters` merges them into ``k``'s normal.
    ``TARGETED_LINES`` lines per missing weight, ``TARGETED_ROUNDS`` rounds. Returns the kinks, the
    given ones first.
    """
    kinks = list(kinks)
    m = layers[-1][0].shape[1]
    line = 2 * 10**6
    for _ in range(TARGETED_ROUNDS):
        todo = [(cl[0], i) for cl in full for i in np.flatnonzero(np.isnan(cl[0]))]
        if not todo:
            break
        for v, i in todo:
            found = 0
            # Starts where the earlier layers are all active: there the Jacobian has full rank.
            starts = _active_points(layers[:-1], d, TARGETED_STARTS, rng)
            for x_start in starts:
                got = _toward_crossing(layers, v, i, x_start, rng)
                if got is None:
                    continue
                x0, q = got
                kinks.extend(_line_kinks(f, x0, q, -span, span, scale, line, step=1e-3, keep=keep))
                line += 1
                found += 1
                if found >= TARGETED_LINES:
                    break
        full = [cl for cl in _partial_clusters(layers, kinks, m, 1e-6) if len(cl[1]) >= 2][: len(full)]
    return kinks


def _last_layer_partial(f, layers, width, d, rng, scale, span, lines, max_batches, tol=1e-6):
    """The last hidden layer from kinks anywhere: normals on the active part of the layer before.

    At a kink of a neuron of the last layer, with ``S`` the active neurons of the layer before, the
    jump is ``kappa J_S^T w_S``: it gives ``w_S / b`` (``b = -w_S^T h_S(x*)``), free of the jump's
    scale and sign. Kinks of one neuron agree where their ``S`` overlap, and are merged into its
    whole ``w / b`` (Carlini et al. 2020's unification of partial signatures). The signs, and the
    readout, come from one least-squares fit of the answers on ``ReLU(z_k)``, ``z_k`` and 1 (``z_k
    = (w_k / b_k)^T h + 1``): ``ReLU(-z) = ReLU(z) - z``, so neuron ``k`` is on where ``z_k > 0``
    if its coefficient on ``z_k`` is 0, and where ``z_k < 0`` if it is minus that on ``ReLU(z_k)``
    (this book's reading of the last layer's signs). Returns ``(eta (m + 1, width), kinks)``.
    """
    m = layers[-1][0].shape[1]

    def keep(before, after):
        _, J, pb = _prefix(layers, before)
        _, _, pa = _prefix(layers, after, jacobian=False)
        same = np.all(np.concatenate(pb, axis=1) == np.concatenate(pa, axis=1), axis=1)
        ok = same & (pb[-1].sum(axis=1) >= 2)
        for i in np.flatnonzero(ok):
            S = pb[-1][i]
            sv = np.linalg.svd(J[i][S], compute_uv=False)
            ok[i] = sv[-1] > 1e-8 * sv[0]
        return ok

    kinks: list = []
    clusters: list = []
    full: list = []
    seen = (-1, -1)
    want = np.zeros(m, dtype=bool)  # neurons of the layer before missing from a neuron's normal
    for batch in range(max_batches):
        pool = rng.standard_normal((400 * lines, d)) * rng.choice([1.0, 2.0, 3.0], (400 * lines, 1))
        if want.any():
            # Lines through points where the missing neurons are active (no query to find them).
            _, _, pp = _prefix(layers, pool, jacobian=False)
            hit = pp[-1][:, want].any(axis=1)
            pool = np.concatenate([pool[hit], pool[~hit]])
        for li in range(2 * lines):
            x0 = pool[li]
            q = rng.standard_normal(d)
            q /= np.linalg.norm(q)
            kinks.extend(_line_kinks(f, x0, q, -span, span, scale, 2 * batch * lines + li, step=1e-3, keep=keep))
        clusters = _partial_clusters(layers, kinks, m, tol)
        full = [cl for cl in clusters if len(cl[1]) >= 2]
        complete = sum(not np.any(np.isnan(cl[0])) for cl in full)
        want = np.zeros(m, dtype=bool)
        for cl in full:
            want |= np.isnan(cl[0])
        if complete >= width or (batch >= 1 and (len(full), complete) == seen and not want.any()):
            break
        seen = (len(full), complete)
    if not full:
        raise NotIdentifiableError(
            f"layer {len(layers) + 1} (the last): no neuron met on two lines after {max_batches} batches of "
            f"{lines} lines. Raise n_lines or max_batches."
        )
    X = np.stack([k.x for k in kinks])
    H, _, _ = _prefix(layers, X, jacobian=False)
    P_all = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)

    def complete(search_rng):
        """Run :func:`_targeted_search` on the normals kept, and merge every kink again:
        ``((etas, missing), n_kinks)``, or None if it found no kink."""
        more = _targeted_search(f, layers, full[:width], kinks, keep, d, search_rng, scale)
        if len(more) == len(kinks):
            return None
        done = [cl for cl in _partial_clusters(layers, more, m, tol) if len(cl[1]) >= 2][:width]
        H, _, _ = _prefix(layers, np.stack([k.x for k in more]), jacobian=False)
        return _normals(done, np.concatenate([H, np.ones((H.shape[0], 1))], axis=1), m), len(more)

    return _normals(full[:width], P_all, m), len(kinks), 2 * lines * (batch + 1), complete


def _normals(cls, P_all, m):
    """``(etas (m + 1, k), missing (m,))`` of partial normals ``cls``, each refined on its kinks (rows
    of ``P_all``)."""
    etas = []
    # A neuron that is never crossed is dead where the lines went (common in random deep networks):
    # left out. A weight from a neuron of the layer before that was never active at a kink is 0:
    # the verification decides (diagnostics count both).
    for cl in cls:
        eta0 = np.concatenate([np.nan_to_num(cl[0], nan=0.0), [1.0]])
        eta0 /= np.linalg.norm(eta0)
        P = P_all[cl[2]]
        B = np.linalg.svd(eta0[:, None], full_matrices=True)[0][:, 1:]
        c = np.linalg.lstsq(P @ B, -(P @ eta0), rcond=None)[0]
        eta = eta0 + B @ c
        etas.append(eta / np.linalg.norm(eta))
    missing = np.zeros(m, dtype=bool)
    for cl in cls:
        missing |= np.isnan(cl[0])
    return np.stack(etas, axis=1), missing


def _last_signs(layers, etas, X, y, missing, rng, max_points=4000):
    """Signs of the last layer: of the ``2^k`` sign vectors, the one whose least-squares readout
    fits the answers best, on points where no neuron of the layer before with a missing weight is
    active (a wrong sign leaves a residual the size of that neuron's contribution)."""
    H, _, pats = _prefix(layers, X, jacobian=False)
    clean = ~pats[-1][:, missing].any(axis=1)
    H, y = H[clean], y[clean]
    if H.shape[0] > max_points:
        pick = rng.choice(H.shape[0], max_points, replace=False)
        H, y = H[pick], y[pick]
    Z = H @ etas[:-1] + etas[-1]
    k = etas.shape[1]
    best, best_res = None, np.inf
    for code in range(2**k):
        sg = np.array([1.0 if (code >> j) & 1 == 0 else -1.0 for j in range(k)])
        F = np.concatenate([np.maximum(Z * sg, 0.0), np.ones((Z.shape[0], 1))], axis=1)
        coef = np.linalg.lstsq(F, y, rcond=None)[0]
        res = float(np.max(np.abs(F @ coef - y)))
        if res < best_res:
            best, best_res = sg, res
    return best


def _signs(layers, etas, members, kinks):
    """Which side of its hyperplane each new neuron is active on.

    At a kink of neuron ``j``, the gradients beside it are combinations of the new neurons' gradients
    (independent when the widths do not grow); neuron ``j``'s coefficient vanishes on the side where it is
    off, and is the jump on the side where it is on (Carlini et al. 2020's contractive sign test)."""
    Wn, bn = etas[:-1], etas[-1]
    signs = np.zeros(etas.shape[1])
    for j, idx in enumerate(members):
        votes = []
        for i in idx:
            kink = kinks[i]
            sides = np.stack(kink.sides)
            H, J, _ = _prefix(layers, sides)
            coef = []
            for s in range(2):
                M = J[s].T @ Wn  # (d, m_new): gradients of the new pre-activations
                gam = np.linalg.lstsq(M, kink.grads[s], rcond=None)[0]
                coef.append(abs(gam[j]) * np.linalg.norm(M[:, j]))
            big, small = max(coef), min(coef)
            if big == 0.0 or small > 1e-6 * big:
                continue
            on = int(np.argmax(coef))
            z = float(H[on] @ Wn[:, j] + bn[j])
            votes.append(1.0 if z > 0 else -1.0)
        if not votes:
            raise NotIdentifiableError(
                f"layer {len(layers) + 1}, neuron {j}: no kink of it showed the side on which it is active "
                "(its coefficient did not vanish on either side); its sign is not determined here."
            )
        if min(votes) != max(votes):
            raise OracleInconsistentError(
                f"layer {len(layers) + 1}, neuron {j}: its kinks disagree on the side where it is active; the "
                "oracle is not a ReLU network of this form."
            )
        signs[j] = votes[0]
    return signs


def _readout(layers, X, y):
    """Least-squares readout ``(w, b)`` of the recovered layers on answered points, and its relative residual."""
    H, _, _ = _prefix(layers, X, jacobian=False)
    F = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    coef = np.linalg.lstsq(F, y, rcond=None)[0]
    res = float(np.max(np.abs(F @ coef - y))) / max(float(np.max(np.abs(y))), np.finfo(float).tiny)
    return coef[:-1], float(coef[-1]), res


def learn_relu_network(
    oracle,
    *,
    widths=None,
    n_lines=None,
    max_batches=6,
    span=None,
    max_layers=8,
    verify=256,
    verify_rtol=2.0**-30,
    seed=0,
    sharpen=True,
):
    """Extract a ReLU network with biases and ``k >= 1`` hidden layers from one-token value queries.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle whose answers on one-token queries ``[x^T]`` are a :class:`ReLUNetwork`'s
        ``f(x)`` (float64).
    widths : sequence of int, optional
        The hidden widths ``(m_1, ..., m_k)``. If None, they are detected: the first layer's
        neurons are the hyperplanes met on at least half as many lines as the most-met one; after
        the first, batches of lines are searched while a batch confirms a new plane (all
        ``max_batches`` for a layer with another after it that is narrower than the one before:
        ``DETECT_SHORT``), and the planes
        met on two lines are the last layer's neurons if none of them jumps by different sizes,
        else those that do (or that such planes separate) are the layer's. The layer after one
        whose planes jump by different sizes is read as the last (anywhere, from partial normals,
        at most as wide as the widest layer before, as a dead neuron narrows a layer detected but
        not the one after; a neuron no line crossed is left out); the depth also
        ends when no plane is met where every recovered neuron is active. Measured to work at depth
        1 and 2 (``random_relu_network(10, (8, 8))`` seeds 0-5, ``(16, (12, 10))`` seeds 1-2) and
        on 16 of 20 draws of depth 3 (``(10, (8, 8, 8))`` seeds 0-19, 2026-12-04; the others refused,
        benchmarks/ffn_deep.md); depth 4 was refused (``(10, (8, 8, 8, 8))`` seeds 0-1: at layer 2,
        whose planes then include pieces of deeper neurons').
    n_lines : int, optional
        Random lines searched for critical points per layer; default ``max(12, 3 m)``, at most
        ``MAX_LINES = 48``, with ``m`` the previous layer's width (``m = d`` for the first layer
        when ``widths`` are detected; three lines for it when they are given).
    max_batches : int, default=6
        Batches of ``n_lines`` lines per layer at most: another is searched while the neurons met
        on two lines grow in number (or fall short of the given width).
    span : float, optional
        Half-length of each line; default ``3 sqrt(d)`` (inputs are of the scale ``N(0, I_d)``).
    max_layers : int, default=8
        Deepest network tried when ``widths`` is None.
    verify : int, default=256
        Fresh points ``N(0, I_d)`` (never used for learning) on which the recovered network is
        compared with the oracle; ``0`` opts out.
    verify_rtol : float, default=2**-30
        Largest accepted worst-case relative error ``max |f_hat - f| / max |f|`` on them.
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for the lines and the verification points.

    Returns
    -------
    ReLUNetworkRecovery
        ``network``: a :class:`ReLUNetwork` equal to the target up to the symmetries of ReLU
        networks (per-neuron positive rescaling, permutations; each hidden neuron's ``(w, b)`` has
        unit norm); ``v`` its readout; ``W`` None. ``diagnostics``: ``widths``, ``n_probe_queries``
        (4, the answers' scale), ``n_kinks`` (per layer), ``n_lines`` (per layer),
        ``n_layer_queries`` (per layer, kink search and gradients; ``n_learning_queries`` is
        ``n_probe_queries`` plus their sum), ``n_readout_points``, ``readout_residual``, ``n_verify_queries``,
        ``verify_rel_error`` and ``verify_bits`` (``-log2`` of it: the field's bits of precision);
        at depth >= 3 also ``refit_rounds``, ``refit_residual`` (the last layer's refit, relative
        to the answers), ``refit_thin_sides`` (sides of its planes the answers leave thin) and
        ``targeted_search`` (``"not run"``: the first refit fit every answer; ``"kept"`` or
        ``"not kept"``: the refit after it left a smaller residual, or not; ``"no kink found"``).
        ``dropped``: the layers returned narrower than their given widths, each
        ``{"layer", "given", "returned", "last"}`` (empty when nothing was dropped, or widths were
        detected); ``widths_given`` when widths were given; ``dead_fit_residual`` when a layer
        before the last was returned narrower (below). The result's message then names what was dropped.

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option, or ``widths`` that grow (``m_1 > d`` or ``m_l > m_{l-1}``).
    NotIdentifiableError
        If a detected layer is wider than the one before it (outside the class), a neuron was
        not met inside the region where all earlier layers are active and is not dead (below),
        or with ``verify=0``, or its sign was not shown.
    OracleInconsistentError
        If the answers are not piecewise linear, disagree on a neuron's sign, or the recovered
        network disagrees with the oracle on the fresh points (with ``verify=0``, on the answers
        already spent) by more than ``verify_rtol``.
    PrecisionError
        If two critical points along a line are closer than float64 resolves.

    Notes
    -----
    The method of Carlini, Jagielski & Mironov 2020 [1]_ (critical points along lines, layer-by-layer
    signature recovery), in this book's own implementation and with this book's simplification:
    layer ``l`` is read only inside the region ``R_{l-1}`` where every neuron of layers ``1..l-1``
    is active, which the recovered layers locate without a query. There ``h_{l-1}`` is an affine
    map of ``x`` of full rank (the widths do not grow), so

    * every kink on a line inside ``R_{l-1}`` belongs to layer ``l`` or deeper; its gradient jump
      is ``kappa A^T w`` with ``A`` the known Jacobian of ``h_{l-1}``, which gives ``w`` up to
      scale, and ``b = -w^T h_{l-1}(x*)`` at the critical point ``x*``;
    * layer-``l`` neurons are flat in ``h_{l-1}``: the same unit ``(w, b)`` comes back from many
      lines; deeper neurons bend, and repeat only within one cell;
    * signs: beside a kink of neuron ``j`` the gradient of ``f`` is a combination of the layer's
      gradients ``A^T w_i``; ``j``'s coefficient is zero on the side where ``j`` is off (the
      contractive sign test; Canales-Martinez et al. 2024 [2]_ treat the general case);
    * the readout is a least-squares fit of the answers already spent on ``h_k``.

    Beyond that simplification, this book's own steps for depth 3 (measured, not proved):

    * inside ``R_{l-1}`` a neuron of layer ``l + 1`` is flat within one cell of layer ``l``'s
      arrangement and repeats on the lines through it. When layer ``l + 1`` is the last, its
      jump is the same vector at every kink (the readout weighs it), while a neuron of layer
      ``l`` jumps by ``df/dh`` times its gradient, whose size changes with the later pattern: a
      plane whose jumps change in size, or whose kinks such a plane separates, is kept;
    * the last layer of a network of depth 3 or more is read anywhere (``R_{k-1}`` is often thin
      and its neurons miss it): at a kink the active part ``S`` of layer ``k - 1`` gives
      ``w_S / b``; kinks that agree on their shared coordinates are merged (Carlini et al.'s
      unification); a neuron never crossed is left out (dead where the lines went), a weight never
      seen is 0; its signs are the sign vector whose least-squares readout fits the answers best;
    * that last layer is then refit on the answers already spent (no query): with the layers
      below known the answers are ``sum_k c_k ReLU(e_k^T (h, 1)) + c``, linear in ``c_k e_k`` once
      the activation patterns are fixed, so patterns and normals alternate until no pattern
      moves; a neuron is added from the points the fit leaves unexplained, or, at the given
      width, the plane whose removal fits best is taken out first; the rounds stop two rounds
      after the last smaller residual; a neuron on at every answered point is fit on ``h`` alone and
      kept on at every point (only its sum with the readout's constant reaches the answers), and
      if a residual is left, the plane best turned into one on at every point is tried (a neuron no
      kink crossed, carried by a plane that turns off where it does not). If the guessed sides
      leave a residual, the fit is redone
      free of the sides (``ReLU(-z) = ReLU(z) - z``: planes and an affine part, the sides read
      after) and taken only if it fits every answer and the answered points on each side of each
      plane span all ``m + 1`` dimensions (else the answers do not determine it there).
    * if that refit still leaves a residual on the answers, Carlini et al.'s targeted search: for
      each weight ``w_ki`` missing from a partial normal, lines where neuron ``i`` of the layer
      before is just on and ``k``'s plane is predicted (the recovered layers give both without a
      query; :func:`_targeted_search`); every kink is merged again, the signs read on up to
      ``SIGN_POINTS`` answered points, and the refit on every answer with the smaller residual kept.
      On ``random_relu_network(10, (8, 8, 8))`` seeds 0-19 (2026-12-04, session 40): all 20
      recovered, at 40.3 to 47.4 bits on fresh inputs (seed 0 with widths (8, 8, 5): three
      neurons of layer 3 are dead; seeds 13 and 18 with (8, 7, 8): a dead layer-2 neuron left out,
      below; seed 4 by the fit free of the sides; seeds 1, 7, 8 and 18 by the targeted search;
      seeds 3 and 14 by the neuron kept on at every point). Before the refit, seed 0 of seeds 0-5
      was recovered.

    A neuron whose hyperplane misses ``R_{l-1}`` is not found. **Dead neurons** (Carlini et al.
    2020: a neuron never active on the input domain computes nothing, is unrecoverable and
    functionally absent): with widths given and ``verify > 0``, a layer that yields fewer neurons
    than given after ``max_batches`` batches is returned narrower, its missing neurons taken as
    dead, only if (a) the sign test passes on the neurons found (beside a kink the gradient is a
    combination of the active neurons' gradients: a dead neuron adds none, a live missing one
    keeps a found neuron's coefficient from vanishing), (b) the whole network without them fits
    every answer already spent to ``DEAD_FIT_RTOL`` (2^-40, relative; no query), and (c) the
    verification on fresh points passes (the certificate; its tolerance is not widened). Else it
    refuses, naming the missing neuron as live. The layer after may then be wider than the one
    returned, when it is the last of a network of depth 3 or more (read from partial signatures);
    a middle layer wider than the one before is refused (the sign test needs widths that do not
    grow). For layer 2 this is sharp (this book's derivation): ``h_1 >= 0`` and, when ``W_1`` has
    rank ``m_1``, ``h_1`` maps ``R_1`` onto the open orthant, so a layer-2 plane misses ``R_1``
    only if its weights and bias are all ``<= 0`` (off on every input: dead) or all ``>= 0`` (on
    at every input: live, refused by (a)). "Dead" is established on the domain asked, not on all
    of ``R^d``: seed 18 of ``random_relu_network(10, (8, 8, 8))``, returned ``(8, 7, 8)`` at 43.7
    bits on ``N(0, I)`` inputs, has a layer-2 neuron active on none of 200,000 ``N(0, I)`` inputs
    but on 3.5e-5 of ``3 N(0, I)`` ones, where that network is off as the target without the
    neuron is (7.6 bits). Queries: ``n_lines`` kink searches per layer plus
    ``2 (2 d + 1)`` for the gradients beside each kink; counted, not bounded.

    References
    ----------
    .. [1] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic extraction of neural network
       models", CRYPTO 2020.
    .. [2] I. A. Canales-Martinez, J. Chavez-Saab, A. Hambitzer, F. Rodriguez-Henriquez,
       N. Satpute, A. Shamir, "Polynomial time cryptanalytic extraction of neural network models",
       EUROCRYPT 2024.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> net = random_relu_network(10, (8, 8), seed=0)
    >>> rec = learn_relu_network(ValueQueryOracle(net), widths=(8, 8))
    >>> rec.network.widths, rec.diagnostics["verify_bits"] > 35
    ((8, 8), True)
    """
    opts = _relu_options(oracle, widths, n_lines, span, max_layers, max_batches, verify, verify_rtol, seed)
    d, widths = opts.d, opts.widths
    count = QueryCount(oracle)
    rng, answers, X_check, scale = _begin(oracle, opts, count)
    layers: list = []
    diag: dict = {"n_kinks": [], "n_lines": [], "n_layer_queries": []}
    depth = len(widths) if widths is not None else opts.max_layers
    deeper = False  # widths detected: layer 2 or later showed a layer after it (_choose_planes)
    dropped: list = []  # widths given: the layers returned narrower (their missing neurons taken as dead)
    for layer in range(depth):
        # The last layer of a deep network, read anywhere: at the given depth, or, detecting, the layer
        # after one whose jumps showed another (at most as wide as the layer before: widths do not grow).
        last = len(layers) >= 2 and (layer == depth - 1 if widths is not None else deeper and DETECT_LAST)
        with count.stage(f"layer {layer + 1}"):
            if last:
                width = widths[layer] if widths is not None else detected_last_cap(layers)
                new, n_kinks, n_lines_used, refit, searched = _read_last_layer(
                    answers, layers, width, d, rng, scale, opts
                )
                diag.update(
                    refit_rounds=refit.rounds,
                    refit_residual=refit.res,
                    refit_thin_sides=len(refit.thin),
                    targeted_search=searched,
                )
            else:
                new, n_kinks, n_lines_used, deeper = _read_layer(
                    answers, layers, layer, depth, d, rng, scale, opts, sharpen
                )
        diag["n_kinks"].append(n_kinks)
        diag["n_lines"].append(n_lines_used)
        diag["n_layer_queries"].append(count[f"layer {layer + 1}"])
        if new is None:
            break  # widths detected: no new hyperplane where every recovered neuron is active (verified below)
        layers.append(new)
        if widths is not None and new[0].shape[1] < widths[layer]:
            dropped.append({"layer": layer + 1, "given": widths[layer], "returned": int(new[0].shape[1]), "last": last})
        if last:
            break
    Xa, ya = answers.all()
    w_out, b_out, res = _readout(layers, Xa, ya)
    net = ReLUNetwork([W for W, _ in layers] + [w_out], [b for _, b in layers] + [b_out])
    n_learning = count.total
    diag["dropped"] = dropped
    if widths is not None:
        diag["widths_given"] = list(widths)
    if any(not dr["last"] for dr in dropped):
        # A layer before the last came out short of its given width: its missing neurons are taken as
        # dead only if the network without them fits every answer already spent (no query).
        diag["dead_fit_residual"] = check_dead_fit(dropped, net, widths, Xa, ya, DEAD_FIT_RTOL)
    with count.stage("verify"):
        rel, bits = _verify_network(oracle, net, X_check)
    diag.update(
        n_probe_queries=count["probe"],
        widths=list(net.widths),
        n_readout_points=int(Xa.shape[0]),
        readout_residual=res,
        n_verify_queries=count["verify"],
        verify_rel_error=rel,
        verify_bits=bits,
    )
    if opts.verify and not rel <= opts.verify_rtol and "dead_fit_residual" in diag:
        fit = diag["dead_fit_residual"]
        raise verify_refusal(dropped, net.widths, widths, fit, rel, opts.verify_rtol, opts.verify)
    if opts.verify and not rel <= opts.verify_rtol and "refit_residual" in diag:
        raise OracleInconsistentError(
            f"the recovered network (widths {net.widths}) disagrees with the oracle by {rel:.3g} > "
            f"verify_rtol={opts.verify_rtol:.3g} on {opts.verify} fresh points. Its layers 1 to {len(layers) - 1} "
            f"were read from critical points; the last layer's refit on the {Xa.shape[0]} answered points "
            f"stopped after {diag['refit_rounds']} rounds with a residual of {diag['refit_residual']:.3g} of the "
            "answers ("
            + (
                "a last-layer plane its partial signatures placed too far off for the refit to move it, or a side "
                "guessed wrong"
                if diag["refit_residual"] > 2.0**-40
                else "every answered point fit, the fresh ones not: the answers do not determine the last layer"
            )
            + "), and the fit free of the sides found "
            f"{diag['refit_thin_sides']} side(s) of a plane whose answered points span fewer than "
            f"{layers[-2][0].shape[1] + 1} dimensions, where the answers do not determine the fit. "
            "Pass another seed, or raise n_lines."
        )
    if opts.verify and not rel <= opts.verify_rtol:
        raise OracleInconsistentError(
            f"the recovered network (widths {net.widths}) disagrees with the oracle by {rel:.3g} > "
            f"verify_rtol={opts.verify_rtol:.3g} on {opts.verify} fresh points: the target is not a ReLU network "
            "whose widths do not grow, or a neuron was missed. Raise n_lines or pass another seed."
        )
    if not opts.verify and not res <= opts.verify_rtol:  # no fresh point checks it: the answers spent do
        raise OracleInconsistentError(
            f"the recovered network (widths {net.widths}) misfits the {Xa.shape[0]} answers already spent by "
            f"{res:.3g} > verify_rtol={opts.verify_rtol:.3g}, and verify=0 leaves no other check, so it is not "
            "returned. Pass verify > 0 (its refusal names the cause), raise n_lines or pass another seed."
        )
    return ReLUNetworkRecovery(
        W=None,
        v=net.weights[-1][:, 0].copy(),
        n_queries=count.total,
        message=f"extracted widths {net.widths} from {n_learning} length-1 queries; {bits:.1f} bits on fresh points"
        + (f" ({dropped_text(dropped, net.widths, widths)}, verified)" if dropped else ""),
        diagnostics=diag,
        weights=tuple(net.weights),
        biases=tuple(net.biases),
    )


# --------------------------------------------------------------------------------------------
# The stages of learn_relu_network


@dataclass(frozen=True)
class _Options:
    d: int
    widths: list | None
    n_lines: int | None
    span: float
    max_layers: int
    max_batches: int
    verify: int
    verify_rtol: float
    seed: int


def _relu_options(oracle, widths, n_lines, span, max_layers, max_batches, verify, verify_rtol, seed) -> _Options:
    """Check every option before any query (and refuse an oracle that states float32 answers)."""
    from ..exact import check_exact_oracle

    d = check_exact_oracle(oracle, "learn_relu_network")
    refuse_stated_rounding(
        oracle,
        "the kink search intersects lines through answers exact to float64 rounding (rounded answers bend every piece)",
        what="network",
    )
    if widths is not None:
        widths = [check_int(m, "widths[i]", minimum=1) for m in widths]
        if not widths:
            raise InvalidInputError("widths must list at least one hidden layer, or be None to detect them.")
        for prev, m in zip([d, *widths[:-1]], widths):
            if m > prev:
                raise InvalidInputError(
                    f"widths={tuple(widths)} grow ({m} > {prev}); learn_relu_network handles networks whose "
                    "widths do not grow (d >= m_1 >= m_2 >= ...)."
                )
    return _Options(
        d=d,
        widths=widths,
        n_lines=None if n_lines is None else check_int(n_lines, "n_lines", minimum=2),
        span=3.0 * np.sqrt(d) if span is None else check_real(span, "span", minimum=0.0, strict=True),
        max_layers=check_int(max_layers, "max_layers", minimum=1),
        max_batches=check_int(max_batches, "max_batches", minimum=1),
        verify=check_int(verify, "verify", minimum=0),
        verify_rtol=check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True),
        seed=check_int(seed, "seed", minimum=0),
    )


def _begin(oracle, opts, count):
    """The first stage: the learner's generator, the record of its answers, the verification's fresh
    points (drawn first) and the probe's answer scale (counted as ``"probe"``)."""
    rng = np.random.default_rng(opts.seed)
    answers = _Answers(oracle)
    X_check = rng.standard_normal((opts.verify, opts.d))
    with count.stage("probe"):
        scale = _probe_scale(answers, oracle, rng, opts.seed)
    return rng, answers, X_check, scale


class _Answers:
    """One-token queries ``f(x)`` for points ``x`` (n, d), every answer kept for the readout."""

    def __init__(self, oracle):
        self.oracle, self.xs, self.ys = oracle, [], []

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(self.oracle(x[:, None, :]), dtype=np.float64)
        self.xs.append(x)
        self.ys.append(y)
        return y

    def unrecorded(self, x):
        """The answers at ``x`` (n, d), asked (and counted by the oracle) but not kept for the readout."""
        return np.asarray(self.oracle(np.asarray(x, dtype=np.float64)[:, None, :]), dtype=np.float64)

    def all(self):
        return np.concatenate(self.xs), np.concatenate(self.ys)


def _probe_scale(f, oracle, rng, seed) -> float:
    """The answers' scale from 4 random points; refuse answers coarser than float64 there."""
    y_probe = f(rng.standard_normal((4, oracle.d)))
    # Answers at random points from a float64 server need all 53 bits; float32's have 24. Refuse
    # coarse answers now (4 queries), not after the kink search has spent ~1e5 on them.
    prec = AnswerPrecision(oracle, seed=seed + 7)
    if prec.read(y_probe) and prec.u > COARSE_FACTOR * FLOAT64_U:
        raise PrecisionError(
            rounding_advice(
                "learn_relu_network",
                prec,
                f"not run: the {y_probe.size} answers at random points carry at most "
                f"{round(-np.log2(prec.u))} significant bits",
            )
        )
    return max(float(np.max(np.abs(y_probe))), 1e-300)


#: Lines a batch at most, after the first layer (``3 m_prev`` below it). On Carlini et al.'s 80-40-20-1,
#: 120 lines met each layer-2 plane on about 50 lines, at ``2 (2 d + 1) = 322`` queries a kink; a
#: plane short of two lines takes another batch. No network of the depth-3 record or of the bench's
#: rows (``m_prev <= 16``) reaches it. This book's choice (benchmarks/ffn_peers.md).
MAX_LINES = 48


def _lines_per_batch(opts, layers, prev) -> int:
    if opts.n_lines is not None:
        return opts.n_lines
    if not layers and opts.widths is not None:
        return 3  # every line crosses every plane of layer 1: two lines confirm it, a third for spare
    return min(max(12, 3 * prev), MAX_LINES)


def _read_last_layer(f, layers, width, d, rng, scale, opts):
    """The last layer of a network of depth >= 3, read anywhere from partial normals (R_{l-1} is thin),
    then refit on the answers already spent (:func:`refit_last_layer`)."""
    lines = _lines_per_batch(opts, layers, layers[-1][0].shape[1])
    _active_points(layers, d, lines, rng)  # drawn and unused, so that a seed gives the runs measured before
    (etas, missing), n_k, n_l, complete = _last_layer_partial(
        f, layers, width, d, rng, scale, opts.span, lines, opts.max_batches
    )
    fit = _fit_last_layer(layers, etas, missing, *f.all(), width, rng, opts)
    status = "not run"
    if fit.res > 2.0**-40 and TARGETED_SEARCH:
        # The refit leaves a residual on the answers: search for the weights the partial normals miss
        # (Carlini et al.'s targeted search), and refit on every answer; the smaller residual is kept.
        done = complete(np.random.default_rng([opts.seed, 4]))
        status = "no kink found"
        if done is not None:
            (etas, missing), n_k = done
            trial = _fit_last_layer(layers, etas, missing, *f.all(), width, rng, opts, sign_points=SIGN_POINTS)
            status = "kept" if trial.res < fit.res else "not kept"
            fit = trial if trial.res < fit.res else fit
    return (fit.E[:-1], fit.E[-1]), n_k, n_l, fit, status


def _fit_last_layer(layers, etas, missing, Xa, ya, width, rng, opts, sign_points=4000):
    """Signs and refit of the last layer's normals on the answers (:func:`refit_last_layer`)."""
    signs = _last_signs(layers, etas, Xa, ya, missing, rng, max_points=sign_points)
    fit = refit_last_layer(layers, etas * signs, Xa, ya, width, np.random.default_rng([opts.seed, 3]), sided=True)
    if fit.res > 2.0**-40 and width <= SIDES_MAX_PLANES:
        # The guessed sides leave a residual (a wrong side is kept by the sided fit): fit free of the
        # sides, and take it only where the answered points determine it (no thin side). Reading the
        # sides tries 2^width subsets, so a wider last layer keeps the sided fit (SIDES_MAX_PLANES).
        free = refit_last_layer(layers, etas, Xa, ya, width, np.random.default_rng([opts.seed, 3]))
        if free.res <= 2.0**-40 and not free.thin:
            fit = free
        else:
            fit.thin = free.thin
    return fit


def _search_lines(f, layers, bases, lines, n_batches, inside, d, rng, scale, span):
    """One batch of kink searches: lines through ``R_{l-1}``, and (after the first batch, or if it is
    empty) lines where only the last recovered layer is all active."""
    kinks: list = []
    ends = _active_points(layers, d, lines, rng) if layers else bases[::-1]
    for li, x0 in enumerate(bases):
        # Inside R_{l-1} (convex), the line through two of its random points crosses it far.
        q = rng.standard_normal(d) if not layers or li >= ends.shape[0] else ends[li] - x0
        q /= np.linalg.norm(q)
        lo, hi = _segment(layers, x0, q, span, d)
        if hi - lo <= 1e-9 * span:
            continue
        kinks.extend(_line_kinks(f, x0, q, lo, hi, scale, li + lines * n_batches, step=1e-3))
    if layers and (n_batches > 1 or not inside):
        # Lines that leave R_{l-1}: where the last recovered layer is all active, the earlier
        # ones need only keep the Jacobian's rank (R_{l-1} may be small or empty).
        keep = _readable(layers)
        for li, x0 in enumerate(_readable_points(layers, d, lines, rng)):
            q = rng.standard_normal(d)
            q /= np.linalg.norm(q)
            line_id = 10**6 + li + lines * n_batches
            kinks.extend(_line_kinks(f, x0, q, -0.5 * span, 0.5 * span, scale, line_id, step=1e-3, keep=keep))
    return kinks


def _choose_planes(layers, kinks, target_width, last, d):
    """The candidate planes that are this layer's neurons: ``(etas, members, deeper)``; ``deeper`` is
    True when widths are detected after the first layer and the jumps show a layer after this one."""
    cand, cand_members = _layer_neurons(layers, kinks, None, d, min_lines=2)
    deeper = False
    if target_width is None and layers and DETECT_DEEP:
        # Detected, a layer after the first (this book's rule): a plane whose jumps change in size
        # is a neuron of a layer with one after it (_flat_neurons); if none does, this is the last
        # layer, and every plane met on two lines is one of its neurons.
        sizes = [np.array([np.linalg.norm(kinks[i].jump) for i in m]) for m in cand_members]
        if not any(z.max() > (1.0 + 1e-6) * z.min() for z in sizes):
            good = list(range(cand.shape[1]))
        else:
            good = _flat_neurons(layers, kinks, cand, cand_members)
            deeper = True
    elif target_width is None:
        # Detected (depth 1 measured): planes met on at least half as many lines as the most-met.
        most = max((len({kinks[i].line for i in m}) for m in cand_members), default=0)
        good = [j for j, m in enumerate(cand_members) if len({kinks[i].line for i in m}) >= 0.5 * most]
    elif last:
        good = list(range(min(cand.shape[1], target_width)))  # no deeper neuron: every plane is one
    elif not layers:
        # Layer 1 of a deeper network: every line crosses every plane of it, while a deeper neuron's
        # kinks fit a plane only inside one linear region of layer 1, so on fewer lines. The planes
        # kept must be met on more lines than the first one left out; on a tie, another batch (a tie
        # kept a deeper neuron's plane in place of a layer-1 neuron's: seed 1 of (10; 8, 8, 8)).
        met = [len({kinks[i].line for i in m}) for m in cand_members]
        k = min(cand.shape[1], target_width)
        good = list(range(k if k == len(met) or met[k - 1] > met[k] else k - 1))
    else:
        good = _flat_neurons(layers, kinks, cand, cand_members)[:target_width]
    return cand[:, good], [cand_members[j] for j in good], deeper


def _read_layer(f, layers, layer, depth, d, rng, scale, opts, sharpen):
    """Layer ``l``'s neurons ``(W, b)`` (or None when detecting and none is left), kinks, lines, and
    whether the jumps show a layer after it (widths detected after the first layer; see _choose_planes)."""
    prev = layers[-1][0].shape[1] if layers else d
    lines = _lines_per_batch(opts, layers, prev)
    bases = _active_points(layers, d, lines, rng)
    inside = bases.shape[0] > 0  # R_{l-1} is not empty
    kinks: list = []
    n_batches = 0
    target_width = None if opts.widths is None else opts.widths[layer]
    etas, members, signs = np.zeros((prev + 1, 0)), [], None
    n_seen, deeper = 0, False
    while n_batches < opts.max_batches:
        # Batches of lines until the given width is confirmed (or, detecting, until a batch
        # confirms no new neuron); a hyperplane crossing a small part of R_{l-1} needs more lines.
        n_batches += 1
        kinks.extend(_search_lines(f, layers, bases, lines, n_batches, inside, d, rng, scale, opts.span))
        if not kinks:
            bases = _active_points(layers, d, lines, rng)
            continue
        etas, members, deeper = _choose_planes(layers, kinks, target_width, layer == depth - 1, d)
        if target_width is None and layers and DETECT_DEEP and etas.shape[1] > n_seen:
            # Detecting after the first layer: another batch while a batch confirms a new plane.
            n_seen = etas.shape[1]
            if n_batches < opts.max_batches:
                bases = _active_points(layers, d, lines, rng)
                continue
        if DETECT_SHORT and target_width is None and deeper and etas.shape[1] < prev and n_batches < opts.max_batches:
            # Detecting, a layer with another after it came out narrower than the one before: search
            # every batch, as a given width short would (a plane crossing R_{l-1} rarely needs more lines).
            bases = _active_points(layers, d, lines, rng)
            continue
        if target_width is None or etas.shape[1] >= target_width:
            try:
                signs = _signs(layers, etas, members, kinks) if etas.shape[1] <= prev else None
            except NotIdentifiableError:
                if n_batches >= opts.max_batches:
                    raise
                signs = None  # a neuron whose sign no kink showed yet: another batch of lines
            else:
                break
        bases = _active_points(layers, d, lines, rng)
    n_lines_used = int(lines * n_batches)
    if target_width is not None and etas.shape[1] < target_width and not may_drop(opts):
        raise NotIdentifiableError(
            f"layer {len(layers) + 1}: confirmed {etas.shape[1]} of the {target_width} neurons on "
            f"{n_lines_used} lines; a neuron whose hyperplane misses the region where all earlier "
            "layers are active cannot be seen by this learner. Raise n_lines or max_batches"
            + (
                "; or pass verify > 0: with it, a layer short of its given width is taken as having dead "
                "neurons (active on no input asked) and the verification decides."
                if not opts.verify
                else "."
            )
        )
    if etas.shape[1] == 0 and opts.widths is None and layers:
        return None, len(kinks), n_lines_used, False
    if etas.shape[1] == 0:
        raise NotIdentifiableError(
            f"layer {len(layers) + 1}: no hyperplane confirmed; the function has no critical point on "
            f"{n_lines_used} lines, or its neurons miss the region where earlier layers are all active."
        )
    if etas.shape[1] > prev:
        raise NotIdentifiableError(
            f"layer {len(layers) + 1} has {etas.shape[1]} neurons, more than the {prev} before it: "
            "learn_relu_network handles networks whose widths do not grow"
            + (
                f" (layer {len(layers)} was returned narrower than the {opts.widths[layer - 1]} given, its "
                "missing neurons taken as dead; a layer wider than the one before is read only as the last "
                "layer of a network of depth 3 or more, from partial signatures)."
                if opts.widths is not None and layers and prev < opts.widths[layer - 1]
                else "."
            )
            + (
                " With widths detected, a network of depth 4 or more may be refused so too (the planes kept "
                "for this layer then include pieces of deeper neurons'): pass widths."
                if opts.widths is None and layers
                else ""
            )
        )
    if signs is None:
        try:
            signs = _signs(layers, etas, members, kinks)
        except NotIdentifiableError as exc:
            if target_width is None or etas.shape[1] >= target_width:
                raise
            # Short of the given width: beside a kink the gradient is a combination of the layer's
            # active neurons' gradients; a dead neuron adds none, a live missing one (on every input
            # there, say) does, and the found neurons' coefficients then do not vanish.
            raise NotIdentifiableError(
                f"layer {len(layers) + 1}: confirmed {etas.shape[1]} of the {target_width} neurons on "
                f"{n_lines_used} lines, and a missing one is live, not dead: beside the kinks found no side "
                "makes a confirmed neuron's gradient coefficient vanish, as when the gradients there also carry "
                "a missing neuron's (a dead one adds none), e.g. one active on every input, whose hyperplane "
                f"misses the region where all earlier layers are active, where this learner reads. ({exc})"
            ) from exc
    if sharpen:
        etas = _sharpen(f, layers, etas, d, rng, scale, opts.span)
    return (etas[:-1] * signs[None, :], etas[-1] * signs), len(kinks), n_lines_used, deeper


def _verify_network(oracle, net, X_check):
    """Worst-case relative error and bits of ``net`` against the oracle on fresh points (counted)."""
    if not X_check.shape[0]:
        return float("nan"), float("nan")
    y_check = np.asarray(oracle(X_check[:, None, :]), dtype=np.float64)
    y_hat = net.forward(X_check)
    ref = max(float(np.max(np.abs(y_check))), np.finfo(float).tiny)
    return float(np.max(np.abs(y_hat - y_check))) / ref, bits_of_precision(y_hat, y_check)
