"""Extraction of a bias-free one-hidden-layer ReLU network from value queries (§4.1).

The network ``f(x) = w_o^T ReLU(A^T x)`` with ``A`` of shape (d, m) and ``w_o`` of shape (m,) is what a
one-layer Transformer computes on length-1 queries. It is piecewise linear and positively
homogeneous (``f(cx) = c f(x)`` for ``c > 0``), so

* along a line ``x(t) = p + t q`` it is piecewise linear in ``t``, with one kink where the line
  crosses each neuron's hyperplane ``a_i^T x = 0``; the kinks are found to float64 precision by
  intersecting the linear pieces on either side (Carlini, Jagielski & Mironov 2020);
* the gradient jumps across hyperplane ``i`` by ``c_i u_i``, with ``u_i = a_i / ||a_i||`` (oriented
  along the line) and ``c_i = w_i ||a_i||``, read off finite differences on both sides (Rolnick &
  Kording 2020); this fixes every neuron up to the sign of ``a_i``;
* since ``ReLU(z) = (z + |z|) / 2``, ``f(x) = (A w_o)^T x / 2 + sum_i c_i |u_i^T x| / 2``: the signs
  ``s_i`` (``a_i = s_i ||a_i|| u_i``) enter only through the linear part
  ``f(x) - f(-x) = (A w_o)^T x = (sum_i s_i c_i u_i)^T x``, a linear system in ``s in {-1, 1}^m``.
  For ``m <= d`` it is solved by least squares; for ``m > d`` it is a binary program, solved with
  :func:`scipy.optimize.milp` (HiGHS) under a time limit. Two sign vectors that both solve it give
  the *same function*, so no query can tell them apart.

Positive rescaling ``(a_i, w_i) -> (a_i / k, k w_i)`` and permutations leave ``f`` unchanged, so
networks are compared in a canonical form: unit-norm columns, zero neurons dropped, parallel neurons
merged, columns sorted (:func:`canonical_form`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linear_sum_assignment, linprog, milp

from ._learner import COARSE_FACTOR, FLOAT64_U, AnswerPrecision, names_rounding, refuse_stated_rounding
from ._validation import as_float_array, as_sequences, check_int, check_real
from .errors import (
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
    SolverError,
)
from .recovery import Recovery

__all__ = [
    "FeedForward",
    "random_feedforward",
    "canonical_form",
    "align_networks",
    "find_kinks",
    "resolve_signs",
    "bits_of_precision",
    "learn_ffn",
    "FFNRecovery",
    "ReLUNetwork",
    "ReLUNetworkRecovery",
    "random_relu_network",
    "learn_relu_network",
]

_EPS = float(np.finfo(np.float64).eps)
_FRACTIONS = (0.2371, 0.4937, 0.7529)  # quarter, half and three-quarter points of find_kinks


def _relu(z):
    return np.maximum(z, 0.0)


@dataclass(frozen=True, eq=False)
class FeedForward:
    """A bias-free one-hidden-layer ReLU network ``x -> w_o^T ReLU(A^T x)``.

    Parameters
    ----------
    A : array-like of shape (d, m)
        Input weights; column ``i`` is neuron ``i``'s direction ``a_i``.
    w_o : array-like of shape (m,)
        Output weights.

    Attributes
    ----------
    d, m : int
        Input dimension and width.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf; when called, if a query is not of
        length 1 (an FFN reads one token).

    Notes
    -----
    The FFN of the one-layer Transformer of §4.1 of [1]_, which on length-1 queries is exactly this
    network. It is called like a model (one token ``(1, d)``, a batch ``(B, 1, d)`` or a list of
    length-1 sequences), so that :class:`~companion.oracles.ValueQueryOracle` can wrap it;
    :meth:`forward` evaluates it on points ``(B, d)``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> net = FeedForward(A=np.array([[1.0, -1.0], [0.0, 0.0]]), w_o=np.array([1.0, 1.0]))
    >>> net.forward(np.array([[2.0, 5.0], [-3.0, 1.0]]))   # |x_1|
    array([2., 3.])
    """

    A: np.ndarray
    w_o: np.ndarray

    def __post_init__(self):
        A = as_float_array(self.A, "A", ndim=2)
        d, m = A.shape
        if d == 0:
            raise InvalidInputError(f"A must have shape (d, m) with d >= 1; got A.shape={A.shape}.")
        w_o = as_float_array(self.w_o, "w_o", ndim=1, shape=(m,))
        for name, a in (("A", A), ("w_o", w_o)):
            a = np.array(a, dtype=np.float64, copy=True)
            a.flags.writeable = False
            object.__setattr__(self, name, a)

    @property
    def d(self) -> int:
        return self.A.shape[0]

    @property
    def m(self) -> int:
        return self.A.shape[1]

    def forward(self, x) -> np.ndarray:
        """Evaluate on points ``x`` of shape (B, d); returns (B,)."""
        x = as_float_array(x, "x", ndim=2, shape=(None, self.d))
        return _relu(x @ self.A) @ self.w_o

    def __call__(self, X):
        """Evaluate on length-1 sequences ``(1, d)`` (float), ``(B, 1, d)`` or a list (``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        lengths = {s.shape[0] for s in seqs} if isinstance(seqs, list) else {seqs.shape[1]}
        if lengths != {1}:
            raise InvalidInputError(
                f"a FeedForward network reads one token; got sequences of lengths {sorted(lengths)}. "
                "Use companion.attention.OneLayerTransformer for longer sequences."
            )
        out = self.forward(np.concatenate([s.reshape(-1, self.d) for s in seqs]))
        return float(out[0]) if single else out

    def __repr__(self):
        return f"FeedForward(d={self.d}, m={self.m})"


def random_feedforward(d, m, *, seed) -> FeedForward:
    """A random network with ``A`` entries ``N(0, 1/d)`` and ``w_o`` entries ``N(0, 1/m)``.

    Parameters
    ----------
    d, m : int
        Input dimension and width, both ``>= 1``.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    FeedForward

    Examples
    --------
    >>> net = random_feedforward(3, 5, seed=0)
    >>> net.A.shape, net.w_o.shape
    ((3, 5), (5,))
    """
    d = check_int(d, "d", minimum=1)
    m = check_int(m, "m", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    return FeedForward(rng.standard_normal((d, m)) / np.sqrt(d), rng.standard_normal(m) / np.sqrt(m))


def canonical_form(A, w_o, *, tol=1e-9):
    """The canonical representative of a network under rescaling, permutation and merging.

    Parameters
    ----------
    A : array-like of shape (d, m)
    w_o : array-like of shape (m,)
    tol : float, default=1e-9
        Neurons with ``|w_i| ||a_i||`` below ``tol`` times the largest are dropped; neurons whose
        unit directions agree to within ``tol`` (the same sign) are merged, their ``c_i`` summed.

    Returns
    -------
    A_c : ndarray of shape (d, k)
        Unit-norm columns ``a_i / ||a_i||``, sorted lexicographically (first coordinate first).
    w_c : ndarray of shape (k,)
        ``w_i ||a_i||``: the same function, ``w_c^T ReLU(A_c^T x) = w_o^T ReLU(A^T x)``.

    Notes
    -----
    ``w ReLU(a^T x) = (k w) ReLU(a^T x / k)`` for every ``k > 0``: the rescaling symmetry of a ReLU
    neuron, which canonical forms of extracted networks quotient out (Rolnick & Kording 2020,
    Carlini et al. 2020). The sign of ``a_i`` is *not* a symmetry of a single neuron.

    Examples
    --------
    >>> import numpy as np
    >>> A_c, w_c = canonical_form(np.array([[0.0, 3.0], [2.0, 0.0]]), np.array([1.0, -1.0]))
    >>> A_c.tolist(), w_c.tolist()
    ([[0.0, 1.0], [1.0, 0.0]], [2.0, -3.0])
    """
    A = as_float_array(A, "A", ndim=2)
    w = as_float_array(w_o, "w_o", ndim=1, shape=(A.shape[1],))
    tol = check_real(tol, "tol", minimum=0.0)
    norms = np.linalg.norm(A, axis=0)
    c = w * norms
    keep = np.abs(c) > tol * max(float(np.max(np.abs(c), initial=0.0)), np.finfo(float).tiny)
    U = A[:, keep] / norms[keep]
    c = c[keep]
    # Merge neurons with the same unit direction.
    merged_U, merged_c = [], []
    for i in range(U.shape[1]):
        for k, u in enumerate(merged_U):
            if np.max(np.abs(u - U[:, i])) <= tol:
                merged_c[k] += c[i]
                break
        else:
            merged_U.append(U[:, i].copy())
            merged_c.append(float(c[i]))
    if not merged_U:
        return np.zeros((A.shape[0], 0)), np.zeros(0)
    U = np.stack(merged_U, axis=1)
    c = np.asarray(merged_c)
    order = np.lexsort(U[::-1])  # first coordinate is the primary key
    return U[:, order], c[order]


def align_networks(A_hat, w_hat, A, w_o):
    """Errors between two networks after canonical alignment (for evaluation, never for learning).

    Both are put in :func:`canonical_form`; neurons are matched by the Hungarian algorithm
    (:func:`scipy.optimize.linear_sum_assignment`) on the distance of their unit directions.

    Returns
    -------
    dict
        ``width_hat``, ``width`` (canonical widths), ``direction_error`` (largest
        ``||u_hat_i - u_i||_2`` over matched neurons), ``weight_error`` (largest
        ``|c_hat_i - c_i| / |c_i|``), ``linear_error`` (``||A_hat w_hat - A w_o|| / ||A w_o||``)
        and ``matched`` (True if the widths agree). Errors are ``inf`` when the widths differ.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.array([[1.0, 0.0], [0.0, 1.0]]); w = np.array([1.0, 2.0])
    >>> align_networks(2 * A[:, ::-1], w[::-1] / 2, A, w)["direction_error"]
    0.0
    """
    Uh, ch = canonical_form(A_hat, w_hat)
    U, c = canonical_form(A, w_o)
    lin_ref = np.asarray(A, float) @ np.asarray(w_o, float)
    lin_err = float(np.linalg.norm(np.asarray(A_hat, float) @ np.asarray(w_hat, float) - lin_ref))
    lin_err /= max(float(np.linalg.norm(lin_ref)), np.finfo(float).tiny)
    out = {"width_hat": int(Uh.shape[1]), "width": int(U.shape[1]), "linear_error": lin_err}
    if Uh.shape[1] != U.shape[1] or U.shape[1] == 0:
        return out | {
            "direction_error": float("inf") if Uh.shape[1] != U.shape[1] else 0.0,
            "weight_error": float("inf") if Uh.shape[1] != U.shape[1] else 0.0,
            "matched": Uh.shape[1] == U.shape[1],
        }
    cost = np.linalg.norm(Uh[:, :, None] - U[:, None, :], axis=0)
    rows, cols = linear_sum_assignment(cost)
    return out | {
        "direction_error": float(np.max(cost[rows, cols])),
        "weight_error": float(np.max(np.abs(ch[rows] - c[cols]) / np.abs(c[cols]))),
        "matched": True,
    }


def bits_of_precision(y_hat, y) -> float:
    """``-log2(max_i |y_hat_i - y_i| / max_i |y_i|)``: Carlini et al.'s measure of extraction fidelity.

    Returns ``inf`` when the outputs agree exactly (the chapter caps it at 53 for display).

    Examples
    --------
    >>> bits_of_precision([1.0, 2.0 + 2.0**-30], [1.0, 2.0])
    31.0
    """
    y_hat = np.asarray(y_hat, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    err = float(np.max(np.abs(y_hat - y)))
    scale = float(np.max(np.abs(y)))
    if err == 0.0:
        return float("inf")
    return float(-np.log2(err / max(scale, np.finfo(float).tiny)))


# --------------------------------------------------------------------------------------------
# Critical points along a line


def find_kinks(g, lo, hi, *, scale, rtol=1024 * _EPS, min_width=1e-12, max_evals=100_000):
    """All kinks of a continuous piecewise-linear function ``g`` on ``[lo, hi]``.

    Parameters
    ----------
    g : callable
        Maps an array of points ``t`` (k,) to values (k,); each point costs one query.
    lo, hi : float
        The interval, ``lo < hi``.
    scale : float
        Typical size of ``|g|`` and of its slopes, ``> 0``: values are compared to within
        ``rtol * scale * (1 + |t|)``.
    rtol : float, default=1024 * eps
        Relative tolerance of a value predicted by a line through two far-apart points.
    min_width : float, default=1e-12
        Relative width below which an interval that still holds a kink is no longer split: it is
        reported as one kink if the lines of its neighbours explain it, else ``PrecisionError``.
    max_evals : int, default=100000
        Largest number of evaluations of ``g``.

    Returns
    -------
    kinks : ndarray of shape (k,)
        Kink locations, sorted.
    n_evals : int
        Points evaluated.

    Raises
    ------
    OracleInconsistentError
        If more than ``max_evals`` evaluations were needed (``g`` is not piecewise linear).
    PrecisionError
        If an interval holds slope change that one kink there does not explain (the lines of its
        two sides do not meet in it, or ``g`` beside their crossing is off them): two or more kinks
        closer than float64 resolves at this scale (see Notes). Another line separates them.

    Notes
    -----
    Carlini, Jagielski & Mironov 2020 [1]_, §4.3: on an interval with one kink, the lines through
    the pieces at its two ends meet exactly at the kink. For ``[l, r]`` with test points
    ``q_1, m, q_3`` near its quarters: if ``g(q_1), g(m), g(q_3)`` lie on the chord, there is no kink; otherwise the
    lines through ``(l, q_1)`` and ``(q_3, r)`` meet at ``t``, which is accepted if ``g`` at ``m``
    and right beside ``t`` (at ``t -+ e`` with ``e |slope change|`` far above rounding) lies on the
    right line; else the interval is halved. A kink is located to float64 precision: both lines are
    fitted through points a quarter interval apart. Kinks whose slope changes cancel at all test
    points are missed (measure zero for random lines).

    *Close kinks* (this book's own analysis). Let ``delta = rtol scale (1 + |t|)`` be the accuracy
    of the values, and two kinks with slope changes ``c_1, c_2`` a distance ``w`` apart,
    ``c = min(|c_1|, |c_2|)``. The best one-kink fit differs from ``g`` by at most ``c w`` (the
    middle piece's excursion from the outer lines: ``|c_1 c_2| w / |c_1 + c_2|`` for equal signs,
    ``c w`` for opposite ones), so for ``w <= delta / c`` no test at accuracy ``delta`` can tell the
    pair from one kink: one kink is reported, the float64 limit. Resolving the pair needs the
    middle slope, measured over the search's leaves inside the middle piece (a fraction of ``w``
    wide) to within ``4 delta / width`` each, to differ from both sides by more than the errors.
    Measured (``tests/test_ffn.py``: 41 positions, 5 pairs of slope changes): for
    ``w >= 64 delta / c`` both kinks are returned (to within ``8 delta / c``) or
    :class:`~companion.errors.PrecisionError` is raised, never one or none; at ``32 delta / c`` some pairs come back
    as one kink, as does every pair at ``w <= 4 delta / c``. A kink left within rounding of a split
    point (both leaves beside it pass as linear) is recovered afterwards from the slopes of the
    leaves, with no new query; only an interval whose slope change is not explained costs two more.

    References
    ----------
    .. [1] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic extraction of neural network
       models", CRYPTO 2020.

    Examples
    --------
    >>> import numpy as np
    >>> g = lambda t: np.abs(t - 0.3) + 2 * np.maximum(t + 0.5, 0)
    >>> kinks, n = find_kinks(g, -1.0, 1.0, scale=1.0)
    >>> np.round(kinks, 12).tolist()
    [-0.5, 0.3]
    """
    lo, hi = float(lo), float(hi)
    width = hi - lo
    cache = {}

    def ev(ts):
        ts = [float(t) for t in ts]
        new = [t for t in dict.fromkeys(ts) if t not in cache]
        if new:
            if len(cache) + len(new) > max_evals:
                raise OracleInconsistentError(
                    f"kink search used more than max_evals={max_evals} queries on [{lo:g}, {hi:g}]; "
                    "the function is not piecewise linear with finitely many kinks."
                )
            for t, y in zip(new, np.asarray(g(np.asarray(new)), dtype=np.float64)):
                cache[t] = float(y)
        return [cache[t] for t in ts]

    ev([lo, hi])
    stack = [(lo, hi)]
    kinks = []
    # The leaves of the search tile [lo, hi]: (l, r, slope at l, width it was measured over,
    # slope at r, its width), slopes None on an interval narrower than min_width.
    leaves = []
    while stack:
        l, r = stack.pop()
        w = r - l
        # Test and split points at "unround" fractions, so that kinks at round numbers (e.g. a
        # network with integer weights) never fall exactly on a split point.
        q1, m, q3 = l + _FRACTIONS[0] * w, l + _FRACTIONS[1] * w, l + _FRACTIONS[2] * w
        gl, g1, gm, g3, gr = ev([l, q1, m, q3, r])
        tol = rtol * scale * (1.0 + max(abs(l), abs(r)))
        chord = (gr - gl) / w
        if all(abs(gx - (gl + chord * (x - l))) <= tol for x, gx in ((q1, g1), (m, gm), (q3, g3))):
            leaves.append((l, r, chord, w, chord, w))
            continue  # linear on [l, r]
        if w <= min_width * width:
            leaves.append((l, r, None, 0.0, None, 0.0))  # its kink(s): see _hidden_kinks
            continue
        s1 = (g1 - gl) / (q1 - l)
        s2 = (gr - g3) / (r - q3)
        if abs(s1 - s2) > 0:
            t = (gr - gl + s1 * l - s2 * r) / (s1 - s2)
            line_m = gl + s1 * (m - l) if m <= t else gr + s2 * (m - r)
            e = max(16 * tol / abs(s1 - s2), 1e-3 * min_width * width)
            # t must sit well inside (q1, q3): the lines meet at q1 (q3) when the kink is left
            # of q1 (right of q3), and a test point must fit between.
            if q1 + 2 * e < t < q3 - 2 * e and abs(gm - line_m) <= tol:
                ga, gb = ev([t - e, t + e])
                if abs(ga - (gl + s1 * (t - e - l))) <= tol and abs(gb - (gr + s2 * (t + e - r))) <= tol:
                    kinks.append(t)
                    leaves.append((l, r, s1, q1 - l, s2, r - q3))
                    continue
        stack.append((l, m))
        stack.append((m, r))
    kinks.extend(_hidden_kinks(sorted(leaves), lambda t: ev([t])[0], rtol, scale, 1e-6 * width))
    return np.sort(np.asarray(kinks, dtype=np.float64)), len(cache)


def _hidden_kinks(leaves, g_at, rtol, scale, narrow):
    """Kinks the interval search of :func:`find_kinks` left between its leaves (cached answers only).

    The leaves tile ``[lo, hi]``; each knows the slope at its two ends, measured over a width
    ``h`` to within ``4 tol / h`` (``tol = rtol scale (1 + |t|)``), or nothing (narrower than
    ``min_width``). Two close kinks make the search halve intervals until each sits in leaves too
    narrow to measure a slope: those pass as linear, and the kink is found nowhere. So walk the
    leaves with an *anchor*, a well-measured slope since the last kink: where the next slope
    differs from it by more than both errors, the gap between them holds slope change. The lines
    of the two sides meet at ``t``; one kink at ``t`` explains the gap if the cached answers in it
    lie on those lines to within their error; then ``t`` is a kink. Otherwise the gap holds two or
    more kinks closer than float64 resolves along this line: :class:`~companion.errors.PrecisionError`.

    Only where the search went deep (a leaf at most ``narrow`` wide between or beside the two) is
    a slope difference taken for a kink: the search splits that far only around close kinks, while
    a function that is not piecewise linear (a slowly changing slope) leaves wide leaves, and is
    the verification's to refuse.
    """
    found = []
    anchor = None  # (position, slope, slope error, width of its leaf)
    gap, gap_width = [], np.inf  # leaf boundaries since the anchor, the narrowest leaf among them
    for l, r, sl, wl, sr, wr in leaves:
        if sl is None:
            if anchor is not None:
                gap, gap_width = gap + [l, r], min(gap_width, r - l)
            continue
        el = 4.0 * rtol * scale * (1.0 + abs(l)) / wl
        er = 4.0 * rtol * scale * (1.0 + abs(r)) / wr
        is_kink = sl != sr or wl != wr
        deep = anchor is not None and min(anchor[3], gap_width, r - l) <= narrow
        if deep and abs(sl - anchor[1]) > anchor[2] + el:
            found.append(_one_kink(anchor[:3], (l, sl, el), gap, g_at, rtol, scale))
            anchor, gap, gap_width = (r, sr, er, r - l), [], np.inf
        elif is_kink or anchor is None or er <= 0.5 * anchor[2]:
            # A leaf beside a kink is consistent with both sides within its error; only one at
            # least twice as well measured (twice as wide) replaces the anchor.
            anchor, gap, gap_width = (r, sr, er, r - l), [], np.inf
        else:
            gap, gap_width = gap + [l, r], min(gap_width, r - l)
    # Leaves narrower than min_width before the first slope or after the last (a kink within
    # min_width of lo or hi) have one side only: each is reported as one kink, at its middle.
    for edge in (leaves, leaves[::-1]):
        for l, r, sl, *_ in edge:
            if sl is not None:
                break
            found.append(l + _FRACTIONS[1] * (r - l))
    return found


def _one_kink(a, b, gap, g_at, rtol, scale):
    """The kink explaining the slope change between anchor ``a`` and the leaf end ``b``, or raise."""
    (xa, sa, ea), (xb, sb, eb) = a, b
    tol = rtol * scale * (1.0 + max(abs(xa), abs(xb)))
    ya, yb = g_at(xa), g_at(xb)
    t = (yb - ya + sa * xa - sb * xb) / (sa - sb)
    ok = xa <= t <= xb
    for x in gap:
        line = ya + sa * (x - xa) if x <= t else yb + sb * (x - xb)
        ok = ok and abs(g_at(x) - line) <= 2.0 * tol + ea * abs(x - xa) + eb * abs(x - xb)
    if ok:
        # As in the interval search: g right beside t must lie on the line of its side (two new
        # queries; this path is taken only where the search left slope change unexplained).
        e = 16.0 * tol / abs(sb - sa)
        beside = ((t - e, ya + sa * (t - e - xa), xa, ea), (t + e, yb + sb * (t + e - xb), xb, eb))
        for x, line, x0, e0 in beside:
            ok = ok and abs(g_at(x) - line) <= 2.0 * tol + e0 * abs(x - x0)
    if ok:
        return t
    raise PrecisionError(
        f"find_kinks: [{xa:.17g}, {xb:.17g}] (width {xb - xa:.3g}) holds slope change {sb - sa:.6g} "
        f"(slopes {sa:.6g} left, {sb:.6g} right) that one kink does not explain: two or more kinks "
        f"closer than float64 resolves along this line (answers to {tol:.3g}); a line in another "
        "direction separates them."
    )


# --------------------------------------------------------------------------------------------
# Gradients of the pieces


def _gradients(f, Y, steps, scale, *, max_halvings=12):
    """Gradients of the homogeneous piecewise-linear ``f`` at the points ``Y`` (k, d).

    Forward differences ``(f(y + h e_j) - f(y)) / h``; a point whose gradient fails Euler's identity
    ``grad^T y = f(y)`` (a step crossed a hyperplane) is re-measured with an 8 times smaller step.
    """
    k, d = Y.shape
    G = np.empty((k, d))
    fy = f(Y)
    todo = np.arange(k)
    steps = np.asarray(steps, dtype=np.float64).copy()
    n_retries = 0
    for _ in range(max_halvings):
        if todo.size == 0:
            break
        P = Y[todo, None, :] + steps[todo, None, None] * np.eye(d)[None]
        fp = f(P.reshape(-1, d)).reshape(todo.size, d)
        G[todo] = (fp - fy[todo, None]) / steps[todo, None]
        resid = np.abs(np.einsum("kd,kd->k", G[todo], Y[todo]) - fy[todo])
        ynorm = np.linalg.norm(Y[todo], axis=1)
        tol = 64 * _EPS * scale * ynorm * (1.0 + np.sqrt(d) * ynorm / steps[todo])
        bad = resid > tol
        n_retries += int(bad.sum())
        steps[todo[bad]] /= 8.0
        todo = todo[bad]
    if todo.size:
        raise OracleInconsistentError(
            f"{todo.size} gradient(s) failed Euler's identity grad^T x = f(x) after {max_halvings} "
            "step reductions; the function is not a bias-free ReLU network."
        )
    return G, fy, n_retries


def _line_neurons(f, p, q, scale, *, span):
    """Kinks of ``f`` on the line ``p + t q``, ``|t| <= span``, and the gradient jump at each.

    Returns unit directions U (d, k) oriented along ``q``, coefficients c (k,), the kink points'
    angles in the (p, q) plane, and the smallest segment length next to each kink.
    """

    def g(ts):
        return f(p[None, :] + ts[:, None] * q[None, :])

    kinks, n_evals = find_kinks(g, -span, span, scale=scale)
    edges = np.concatenate([[-span], kinks, [span]])
    lengths = np.diff(edges)
    mids = 0.5 * (edges[:-1] + edges[1:])
    Y = p[None, :] + mids[:, None] * q[None, :]
    G, _, n_retries = _gradients(f, Y, 0.125 * lengths, scale)
    jumps = G[1:] - G[:-1]  # (k, d): c_i u_i, u_i oriented along q
    c = np.linalg.norm(jumps, axis=1) * np.sign(jumps @ q)
    U = (jumps / c[:, None]).T if kinks.size else np.zeros((p.size, 0))
    gap = np.minimum(lengths[:-1], lengths[1:])
    angles = np.mod(np.arctan2(kinks, 1.0), np.pi)  # direction p + t q  <->  angle atan(t)
    return U, c, angles, gap, n_evals + Y.shape[0] * (p.size + 1), n_retries


def _refine(f, U, c, b, rng, *, max_rho=1.0):
    """Re-measure every neuron's hyperplane from ``d - 1`` kinks located on lines across it.

    For neuron ``i`` with approximate unit normal ``u``, take an orthonormal basis ``z_1..z_{d-1}``
    of ``u``'s complement and the lines ``z_k + t u``. The approximate network predicts where the
    other hyperplanes cross each line; on ``[-rho_k, rho_k]``, half-way to the nearest of them, the
    only kink is neuron ``i``'s, at ``t_k``, found by intersecting the lines through
    ``g(-rho), g(-rho/2)`` and ``g(rho/2), g(rho)`` (4 queries). The true normal is ``u + delta``
    with ``delta^T z_k = -t_k`` (exact to first order). Then the coefficients ``c`` are fitted to
    all these answers by linear least squares, given the linear part ``b``. A crossing outside the
    inner half ``|t_k| < rho_k / 2``, or within ``1e-6 rho_k`` of its edge (where one kink in an
    outer quarter puts it, wherever that kink is), raises :class:`OracleInconsistentError`.
    """
    d, m = U.shape
    if m == 0 or d == 1:
        return U.copy(), c.copy(), 0
    steps = np.array([-1.0, -0.5, 0.5, 1.0])
    bases, rhos, points = [], [], []
    for i in range(m):
        u = U[:, i]
        Qm, _ = np.linalg.qr(np.column_stack([u, rng.standard_normal((d, d - 1))]))
        Z = Qm[:, 1:]  # (d, d-1), orthogonal to u
        others = np.delete(np.arange(m), i)
        if others.size:
            T = -(U[:, others].T @ Z) / (U[:, others].T @ u)[:, None]  # crossings of the others
            rho = np.minimum(0.5 * np.min(np.abs(T), axis=0), max_rho)
        else:
            rho = np.full(d - 1, max_rho)
        bases.append(Z)
        rhos.append(rho)
        ts = rho[:, None] * steps[None, :]  # (d-1, 4)
        points.append(Z.T[:, None, :] + ts[:, :, None] * u[None, None, :])
    P = np.concatenate([p.reshape(-1, d) for p in points])
    G = f(P).reshape(m, d - 1, 4)
    U_new = np.empty_like(U)
    for i in range(m):
        rho = rhos[i]
        g = G[i]
        s1 = (g[:, 1] - g[:, 0]) / (0.5 * rho)
        s2 = (g[:, 3] - g[:, 2]) / (0.5 * rho)
        # left line: g0 + s1 (t + rho); right line: g3 + s2 (t - rho)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (g[:, 3] - g[:, 0] - s2 * rho - s1 * rho) / (s1 - s2)
        # One kink at t* in an outer quarter (rho/2 < |t*| < rho) makes one pair a chord across
        # it, and the chords then cross at exactly t = -/+ rho/2 whatever t* is: that edge is refused
        # too (with a margin for rounding), else |t| < rho/2 would be decided by the last bit.
        edge = np.abs(np.abs(t) - 0.5 * rho) <= 1e-6 * rho
        if not (np.all(np.isfinite(t)) and np.all(np.abs(t) < 0.5 * rho)) or np.any(edge):
            raise OracleInconsistentError(
                f"re-measuring neuron {i}: no single kink near its hyperplane (two recovered "
                "neurons share it, or a neuron was missed)."
            )
        u = U[:, i] - bases[i] @ t
        U_new[:, i] = u / np.linalg.norm(u)
    # With the directions fixed, f(x) = b^T x / 2 + sum_i c_i |u_i^T x| / 2 is linear in c:
    # least squares on the same answers (no new query).
    rhs = 2.0 * G.reshape(-1) - P @ b
    c_new = np.linalg.lstsq(np.abs(P @ U_new), rhs, rcond=None)[0]
    return U_new, c_new, int(P.shape[0])


# --------------------------------------------------------------------------------------------
# Signs


def resolve_signs(U, c, b, *, method="auto", time_limit=10.0, rtol=1e-7):
    """Signs ``s in {-1, 1}^m`` with ``sum_i s_i c_i u_i = b`` (the network's linear part).

    Parameters
    ----------
    U : ndarray of shape (d, m)
        Unit neuron directions.
    c : ndarray of shape (m,)
        Neuron coefficients ``w_i ||a_i||``.
    b : ndarray of shape (d,)
        The linear part ``A w_o``, read from ``f(e_j) - f(-e_j)``.
    method : {"auto", "lstsq", "milp"}, default="auto"
        ``"lstsq"`` solves ``M s = b`` (``M = U diag(c)``) by least squares and rounds: exact when
        ``M`` has full column rank (``m <= d``). ``"milp"`` solves the binary program with
        :func:`scipy.optimize.milp` (HiGHS). ``"auto"`` uses ``"lstsq"`` when ``rank M = m`` and
        ``"milp"`` otherwise.
    time_limit : float, default=10.0
        Seconds allowed to the MILP solver.
    rtol : float, default=1e-7
        Accepted residual ``||M s - b||_inf`` relative to ``sum_i |c_i|``.

    Returns
    -------
    s : ndarray of shape (m,) or None
        The signs, or None if the solver stopped at its time limit without a solution.
    info : dict
        ``method`` used, ``status`` (``"solved"`` or ``"time_limit"``), ``residual`` and
        ``seconds`` (wall-clock time of the solve, for benchmarks only).

    Raises
    ------
    OracleInconsistentError
        If no sign vector fits (the residual stays above ``rtol``): the oracle is not a bias-free
        ReLU network of the recovered neurons.
    SolverError
        If HiGHS fails for another reason (its status and message are given).

    Notes
    -----
    ``w ReLU(a^T x) - (-w) ReLU(-a^T x) = w a^T x``: the sign of ``a_i`` changes only the linear
    part (§4.1 of Bhattamishra et al. 2026). With ``s = 2z - 1``, ``z in {0, 1}^m`` the constraint is
    ``2 M z = b + M 1``, an equality-constrained 0-1 program; for generic ``M`` its solution is
    unique, but the branch and bound of HiGHS can explore up to ``2^(m - d)`` nodes.

    Examples
    --------
    >>> import numpy as np
    >>> U = np.eye(3)[:, :2]; c = np.array([2.0, -1.0]); s_true = np.array([-1.0, 1.0])
    >>> s, info = resolve_signs(U, c, U @ (s_true * c))
    >>> s.tolist(), info["method"]
    ([-1.0, 1.0], 'lstsq')
    """
    U = np.asarray(U, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = c.size
    M = U * c[None, :]
    total = float(np.sum(np.abs(c))) or 1.0
    atol = rtol * total
    if method == "auto":
        method = "lstsq" if m <= U.shape[0] and np.linalg.matrix_rank(M) == m else "milp"
    start = time.perf_counter()
    if m == 0:
        s, status = np.zeros(0), "solved"
    elif method == "lstsq":
        s = np.sign(np.linalg.lstsq(M, b, rcond=None)[0])
        s[s == 0] = 1.0
        status = "solved"
    elif method == "milp":
        rhs = b + M.sum(axis=1)
        res = milp(
            np.zeros(m),
            integrality=np.ones(m),
            bounds=Bounds(0, 1),
            constraints=LinearConstraint(2 * M, rhs - atol, rhs + atol),
            options={"time_limit": float(time_limit), "presolve": True},
        )
        if res.x is not None:
            s, status = 2.0 * np.round(res.x) - 1.0, "solved"
        elif res.status == 1:
            s, status = None, "time_limit"
        elif res.status == 2:
            raise OracleInconsistentError(
                "no sign vector s in {-1, 1}^m gives the measured linear part A w_o (the 0-1 program is "
                "infeasible): the oracle is not a bias-free ReLU network of the recovered neurons."
            )
        else:
            raise SolverError(f"scipy.optimize.milp (HiGHS) stopped with status {res.status}: {res.message}")
    else:
        raise InvalidInputError(f"method={method!r} is not one of {{'auto', 'lstsq', 'milp'}}.")
    seconds = time.perf_counter() - start
    residual = float("nan") if s is None else float(np.max(np.abs(M @ s - b), initial=0.0))
    if s is not None and residual > atol:
        raise OracleInconsistentError(
            f"the best sign vector leaves a residual {residual:.3g} > {atol:.3g} in the linear part "
            "A w_o: the oracle is not a bias-free ReLU network of the recovered neurons."
        )
    return s, {"method": method, "status": status, "residual": residual, "seconds": seconds}


# --------------------------------------------------------------------------------------------
# The learner


@dataclass(frozen=True, eq=False, repr=False)
class FFNRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a ReLU network: adds ``A`` (d, m) and ``w_o`` (m,).

    ``W`` is None (a network has no attention); ``v`` is the linear part ``A w_o``.
    """

    A: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    w_o: np.ndarray = None  # type: ignore[assignment]

    @property
    def d(self) -> int:
        return int(np.shape(self.v)[0])

    @property
    def network(self) -> FeedForward:
        """The recovered network as a :class:`FeedForward` model."""
        return FeedForward(self.A, self.w_o)


def _merge_neurons(U, c, quality, tol=1e-6):
    """Drop duplicate neurons (same hyperplane: ``|u_i^T u_j| > 1 - tol``), keeping the best quality."""
    order = np.argsort(-quality)
    kept = []
    for i in order:
        if all(abs(float(U[:, i] @ U[:, k])) < 1 - tol for k in kept):
            kept.append(i)
    kept = np.sort(np.asarray(kept, dtype=int))
    return U[:, kept], c[kept], quality[kept]


#: The FFN learner locates kinks by intersecting lines through answers exact to float64 rounding:
#: a refusal at float32 or coarser answers names the rounding, not a target outside the bias-free
#: ReLU class (companion._learner.names_rounding, measured on one-token queries).
def _rounding_advice(learner, prec, err):
    cls = "ReLU networks" if learner == "learn_relu_network" else "the bias-free ReLU class"
    return (
        f"{learner} refused, and {prec.describe()}: its kink search intersects lines through "
        "answers exact to float64 rounding, and rounding at this level bends every piece (the "
        "search then finds kinks everywhere), so this refusal is the answers' rounding, not a "
        f"target outside {cls}. No FFN learner here works from answers this "
        f"coarse; ask a float64 server. (The search said: {err})"
    )


_names_rounding = names_rounding(_rounding_advice, one_token=True)


@_names_rounding
def learn_ffn(
    oracle, *, signs="auto", refine=True, milp_time_limit=10.0, max_planes=3, verify=64, verify_rtol=1e-9, seed=0
):
    """Extract a bias-free ReLU network ``x -> w_o^T ReLU(A^T x)`` from length-1 value queries.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle whose answers on one-token queries ``[x^T]`` are ``w_o^T ReLU(A^T x)``: a
        :class:`FeedForward` target, or a one-layer Transformer. The width ``m`` is not needed.
    signs : {"auto", "lstsq", "milp"}, default="auto"
        How the neuron signs are resolved; see :func:`resolve_signs`.
    milp_time_limit : float, default=10.0
        Seconds allowed to the 0-1 program when ``m > d``. If it runs out, the learner returns an
        *equivalent* network of width ``m + 2`` instead (``diagnostics["signs_status"]`` is
        ``"time_limit"``): it computes the same function, but its neurons are not the target's.
        The same happens, with status ``"no_fit"``, when no sign vector fits (two neurons of the
        target share a hyperplane, as in ``ReLU(z) + ReLU(-z) = |z|``).
    max_planes : int, default=3
        Random 2-planes to scan for kinks. The first one finds every neuron with probability 1;
        another is scanned only if the verification fails or :func:`find_kinks` reports two kinks
        along a line closer than float64 resolves.
    verify : int, default=64
        Fresh random points (length-1 queries, never used for learning) on which the extracted
        network is compared with the oracle; they also choose between planes. ``0`` opts out: the
        first plane's network is returned unchecked.
    verify_rtol : float, default=1e-9
        Largest accepted ``max |f_hat - f| / max |f|`` on them.
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for the planes and the verification points.

    Returns
    -------
    FFNRecovery
        ``A`` of shape (d, k) with unit-norm columns and ``w_o`` of shape (k,), in
        :func:`canonical_form` (``k = m`` for a generic target, ``m + 2`` after a MILP time-out);
        ``v = A w_o``; ``W`` is None. ``diagnostics``: ``n_planes``, ``n_linear_queries`` (``2d``),
        ``n_scan_queries`` (kink search, gradients and refinement on the planes), ``n_verify_queries``
        (``n_learning_queries = n_linear_queries + n_scan_queries``), ``n_step_retries``,
        ``plane_failures`` (why each rejected plane failed), ``signs_method``, ``signs_status``,
        ``signs_seconds``, ``verify_rel_error`` (also as
        ``verify_max_error``; NaN with ``verify=0``) and ``verify_bits``. ``n_queries`` counts the
        verification points; ``n_learning_queries`` leaves them out.

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option.
    NotIdentifiableError
        If the oracle answers 0 everywhere it was asked (an empty network has no parameters).
    OracleInconsistentError
        If the answers are not those of a bias-free ReLU network (Euler's identity fails, no sign
        vector fits, or the verification still fails after ``max_planes`` planes).
    PrecisionError
        If on every one of the ``max_planes`` planes :func:`find_kinks` found two kinks along a line
        closer than float64 resolves (see its Notes): a plane where that happens is redrawn. Also
        before any query if the oracle states a rounding ``2**10`` times float64's or coarser
        (``oracle.precision``, float32 or coarser); after the ``2d`` linear-part and the
        ``verify`` verification queries if those answers (at random points) carry so few
        significant bits (:func:`companion.oracles.significant_bits`: float32's 24, not float64's
        53); and instead of ``OracleInconsistentError`` when such rounding is measured after the
        refusal (16 one-token queries, :func:`companion.oracles.measure_one_token_precision`):
        the message names the rounding, not the target.

    Notes
    -----
    Critical-point extraction in the style of Carlini, Jagielski & Mironov 2020 [2]_ and Rolnick &
    Kording 2020 [3]_, simplified by the absence of biases (§4.1 of [1]_). Every hyperplane passes
    through the origin, so one random 2-plane span(p, q) meets all of them: the lines ``p + t q`` and
    ``q - t p``, ``|t| <= 1.1``, cover its directions. Queries: ``2d`` for the linear part, then
    finite-difference gradients of the linear pieces, the kink search and the re-measured
    hyperplanes. Kinks are found by intersecting lines, not by bisection, so no step depends on a
    target precision. The count is **measured, not proved**: on random bias-free networks
    (``random_feedforward``) with d in {8, 16, 32}, m in {d/2, d, 2d} (not m = 64 at d = 32) and
    seeds 0, 1, 2, ``n_learning_queries`` was 5.9 to 8.7 times ``m d`` (e.g. 3,148 to 3,506 at
    d = 32, m = 16), 4.5 to 6.8 times ``(m + 2)(d + 1)``, falling slowly with d; the default
    verification adds ``verify`` queries. Over that range the count grows like ``m d``; no bound is
    claimed beyond it (``tests/test_ffn.py`` checks the range).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic extraction of neural network
       models", CRYPTO 2020.
    .. [3] D. Rolnick, K. Kording, "Reverse-engineering deep ReLU networks", ICML 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> net = random_feedforward(6, 4, seed=1)
    >>> rec = learn_ffn(ValueQueryOracle(net))
    >>> err = align_networks(rec.A, rec.w_o, net.A, net.w_o)
    >>> rec.A.shape, err["direction_error"] < 1e-10 and err["weight_error"] < 1e-10
    ((6, 4), True)
    """
    from .exact import check_exact_oracle

    d = check_exact_oracle(oracle, "learn_ffn")
    refuse_stated_rounding(
        oracle,
        "the kink search intersects lines through answers exact to float64 rounding (rounded answers bend every piece)",
        what="network",
    )
    if signs not in ("auto", "lstsq", "milp"):
        raise InvalidInputError(f"signs={signs!r} is not one of {{'auto', 'lstsq', 'milp'}}.")
    milp_time_limit = check_real(milp_time_limit, "milp_time_limit", minimum=0.0, strict=True)
    max_planes = check_int(max_planes, "max_planes", minimum=1)
    verify = check_int(verify, "verify", minimum=0)
    verify_rtol = check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    start = oracle.n_queries

    def f(x):
        return np.asarray(oracle(np.asarray(x, dtype=np.float64)[:, None, :]), dtype=np.float64)

    # Linear part b = A w_o from f(e_j) - f(-e_j) (2d queries); also sets the scale.
    E = np.eye(d)
    fpm = f(np.concatenate([E, -E]))
    b = fpm[:d] - fpm[d:]
    n_linear = oracle.n_queries - start
    X_check = rng.standard_normal((verify, d)) / np.sqrt(d)
    scale = float(np.max(np.abs(fpm)))

    n_retries = 0
    before = oracle.n_queries
    y_check = f(X_check) if verify else np.zeros(0)
    n_verify = oracle.n_queries - before
    # The verification points are random, so a float64 server's answers there need all 53 bits:
    # answers with COARSE_FACTOR times float64's rounding or coarser (float32 has 24 bits) are
    # refused now, before the kink search spends its queries on them (it would fail on every
    # plane, about 1e5 queries each at d = 32, and be refused for the same rounding).
    prec = AnswerPrecision(oracle, seed=seed + 7)
    if prec.read(y_check) and prec.u > COARSE_FACTOR * FLOAT64_U:
        raise PrecisionError(
            _rounding_advice(
                "learn_ffn",
                prec,
                f"not run: the answers at the {verify} verification points carry at most "
                f"{round(-np.log2(prec.u))} significant bits",
            )
        )
    failures = []
    n_close = 0  # planes refused because two kinks along a line were closer than float64 resolves
    for plane in range(max_planes):
        P, _ = np.linalg.qr(rng.standard_normal((d, 2)))
        p, q = P[:, 0], P[:, 1]
        if scale == 0.0:
            scale = float(np.max(np.abs(f(np.stack([p, q, -p, -q])))))
            if scale == 0.0:
                if not np.any(y_check):
                    raise NotIdentifiableError(
                        "the oracle answered 0 on every query: the network computes 0 and has no identifiable neurons."
                    )
                scale = float(np.max(np.abs(y_check)))
        try:
            parts = [_line_neurons(f, base, direction, scale, span=1.1) for base, direction in ((p, q), (q, -p))]
            U = np.concatenate([pt[0] for pt in parts], axis=1)
            c = np.concatenate([pt[1] for pt in parts])
            quality = np.concatenate([pt[3] * np.abs(pt[1]) for pt in parts])
            n_retries += sum(pt[5] for pt in parts)
            U, c, quality = _merge_neurons(U, c, quality)
            if refine:
                U, c, _ = _refine(f, U, c, b, rng)
            try:
                s, info = resolve_signs(U, c, b, method=signs, time_limit=milp_time_limit)
            except OracleInconsistentError:
                # No sign vector fits, e.g. two neurons share a hyperplane (w|a^T x| has no
                # width-1 form): fall back on the equivalent network of width m + 2.
                s, info = None, {"method": signs, "status": "no_fit", "seconds": 0.0}
        except (OracleInconsistentError, PrecisionError) as exc:
            failures.append(str(exc))
            n_close += isinstance(exc, PrecisionError)
            continue
        A_hat, w_hat = _assemble(U, c, s, b)
        if verify == 0:
            rel = float("nan")
            break
        y_hat = _relu(X_check @ A_hat) @ w_hat
        ref = max(float(np.max(np.abs(y_check))), np.finfo(float).tiny)
        rel = float(np.max(np.abs(y_hat - y_check))) / ref
        if rel <= verify_rtol:
            break
        failures.append(f"relative disagreement {rel:.3g} > verify_rtol={verify_rtol:.3g} on {verify} fresh points")
    else:
        if n_close == max_planes:
            raise PrecisionError(
                f"on each of max_planes={max_planes} random planes two neurons' kinks along a line were "
                f"closer than float64 resolves (last: {failures[-1]}); the answers are consistent with a "
                "ReLU network, but these neurons cannot be separated at this precision. Raise max_planes "
                "or pass another seed."
            )
        raise OracleInconsistentError(
            f"no extraction from {max_planes} random planes matched the oracle (last: "
            f"{failures[-1]}): the target is not a bias-free ReLU network, or has kinks too close "
            "to separate. Raise max_planes."
        )
    A_c, w_c = canonical_form(A_hat, w_hat, tol=1e-12)
    n_total = oracle.n_queries - start
    diagnostics = {
        "n_planes": plane + 1,
        "n_linear_queries": n_linear,
        "n_verify_queries": n_verify,
        "n_scan_queries": n_total - n_linear - n_verify,
        "n_step_retries": n_retries,
        "plane_failures": failures,
        "signs_method": info["method"],
        "signs_status": info["status"],
        "signs_seconds": info["seconds"],
        "verify_rel_error": rel,
        "verify_max_error": rel,
        "verify_bits": float(-np.log2(rel)) if rel > 0 else (float("inf") if rel == 0 else rel),
    }
    width = U.shape[1]
    message = (
        f"extracted {width} neurons from {n_total} length-1 queries "
        f"({plane + 1} plane(s)); signs by {info['method']}: {info['status']}"
    )
    if s is None:
        message += f"; returned an equivalent network of width {A_c.shape[1]} (not the target's neurons)"
    return FFNRecovery(W=None, v=A_c @ w_c, n_queries=n_total, message=message, diagnostics=diagnostics, A=A_c, w_o=w_c)


def _assemble(U, c, s, b):
    """Network from directions, coefficients and signs; without signs, add two neurons for the rest
    of the linear part (``r^T x = ReLU(r^T x) - ReLU(-r^T x)``): an equivalent network of width m + 2."""
    if s is not None:
        return U * s[None, :], c.copy()
    s = np.sign(np.linalg.lstsq(U * c[None, :], b, rcond=None)[0])
    s[s == 0] = 1.0
    r = b - (U * c[None, :]) @ s
    nr = float(np.linalg.norm(r))
    if nr == 0.0:
        return U * s[None, :], c.copy()
    rhat = r / nr
    A = np.concatenate([U * s[None, :], rhat[:, None], -rhat[:, None]], axis=1)
    w = np.concatenate([c, [0.5 * nr, -0.5 * nr]])
    return A, w


# ============================================================================================
# ReLU networks with biases and several hidden layers


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
# The known prefix of the network


def _prefix(layers, X):
    """Activations ``h`` (n, m) and Jacobians ``dh/dx`` (n, m, d) of the recovered layers at ``X`` (n, d)."""
    n, d = X.shape
    H = X
    J = np.broadcast_to(np.eye(d), (n, d, d))
    patterns = []
    for W, b in layers:
        Z = H @ W + b
        act = Z > 0
        patterns.append(act)
        H = np.where(act, Z, 0.0)
        J = act[:, :, None] * np.einsum("im,nid->nmd", W, J)
    return H, J, patterns


def _all_active_map(layers, d):
    """The affine map ``x -> (z_1, ..., z_l)`` of every recovered neuron's pre-activation where all are active."""
    A, c = np.eye(d), np.zeros(d)  # h = A^T x + c
    maps = []
    for W, b in layers:
        A, c = A @ W, c @ W + b
        maps.append((A, c))
    if not maps:
        return np.zeros((d, 0)), np.zeros(0)
    return np.concatenate([M for M, _ in maps], axis=1), np.concatenate([v for _, v in maps])


def _active_points(layers, d, n, rng, *, box=30.0):
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
        _, _, pats = _prefix(layers, X)
        ok = np.all(np.concatenate(pats, axis=1), axis=1)
        out.extend(X[ok][: n - len(out)])
        if len(out) >= n:
            return np.asarray(out).reshape(-1, d)
    M, c = _all_active_map(layers, d)
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


def _gradients_sym(f, X, h, scale, *, max_halvings=10):
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
        tol = 64 * _EPS * (scale + np.abs(f0[todo, None]) + np.abs(fw) + np.abs(bw))
        G[todo] = (fw - bw) / (2.0 * steps[todo, None])
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
class _Kink:
    x: np.ndarray  # the critical point (d,)
    jump: np.ndarray  # gradient after minus gradient before, along the line (d,)
    sides: tuple  # (x_before, x_after)
    grads: tuple  # (grad_before, grad_after)
    line: int


def _line_kinks(f, x0, q, lo, hi, scale, line_id, *, step, keep=None):
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
    G, _ = _gradients_sym(f, np.concatenate([before, after]), np.concatenate([hs, hs]), scale)
    k = ts.size
    return [
        _Kink(x0 + t * q, G[k + i] - G[i], (before[i], after[i]), (G[i], G[k + i]), line_id) for i, t in enumerate(ts)
    ]


def _readable(layers):
    """``keep(before, after)`` for :func:`_line_kinks`: the kinks of a later layer (the recovered
    layers' pattern is the same on both sides) where the last recovered layer is all active and
    the Jacobian of ``h`` has full rank, so that the jump gives the whole normal."""

    def keep(before, after):
        if not layers:
            return np.ones(before.shape[0], dtype=bool)
        _, J, pb = _prefix(layers, before)
        _, _, pa = _prefix(layers, after)
        same = np.all(np.concatenate(pb, axis=1) == np.concatenate(pa, axis=1), axis=1)
        full = np.all(pb[-1], axis=1)
        ok = same & full
        for i in np.flatnonzero(ok):
            sv = np.linalg.svd(J[i], compute_uv=False)
            ok[i] = sv[-1] > 1e-8 * sv[0]
        return ok

    return keep


def _readable_points(layers, d, n, rng):
    """Up to ``n`` random inputs where the last recovered layer is all active with a full-rank
    Jacobian (earlier layers in any pattern): the bases of the lines that leave ``R_{l-1}``."""
    keep = _readable(layers)
    out = []
    for scale in (1.0, 2.0, 0.5, 4.0, 1.0, 2.0):
        X = scale * rng.standard_normal((40 * n, d))
        out.extend(X[keep(X, X)][: n - len(out)])
        if len(out) >= n:
            break
    return np.asarray(out).reshape(-1, d)


def _segment(layers, x0, q, span, d):
    """The part of ``x0 + t q``, ``|t| <= span``, on which every recovered neuron stays active."""
    M, c = _all_active_map(layers, d)
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
# One layer


def _layer_neurons(layers, kinks, width, d, min_lines, tol=1e-7):
    """Normals ``(w, b)`` (unit norm, up to sign) of the next layer, from the kinks found inside the
    region where the recovered layers are all active; returns ``(eta (m_prev + 1, k), members)``."""
    X = np.stack([k.x for k in kinks])
    H, _, _ = _prefix(layers, X)
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


def _sharpen(f, layers, etas, d, rng, scale, span, *, extra=4, delta=1e-3):
    """Each neuron's ``(w, b)`` refit on ``m_prev + extra`` critical points placed on its plane.

    The coarse plane (from the gradient jumps) predicts where a random line inside ``R_{l-1}``
    crosses it. Three answers on each side, ``delta`` apart, give the two linear pieces; where they
    meet is the critical point to float64 (Carlini et al.'s intersection of lines). A side that is not
    linear (another kink is near) drops that line. The plane through the points is the singular
    vector of ``[h_{l-1}(x_i), 1]`` of the smallest singular value. Six queries a point.
    """
    m_prev = etas.shape[0] - 1
    need = m_prev + extra
    offs = delta * np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    out = []
    for j in range(etas.shape[1]):
        eta = etas[:, j]
        pts: list = []
        for _attempt in range(8):
            # Segments between points of R_{l-1} (convex) on either side of the plane cross it inside.
            pool = _active_points(layers, d, 20 * need, rng)
            if pool.shape[0] == 0:
                break
            side = _prefix(layers, pool)[0] @ eta[:-1] + eta[-1] > 0
            pos, neg = pool[side], pool[~side]
            k = 2 * (need - len(pts))
            if pos.shape[0] and neg.shape[0]:
                bases = pos[rng.integers(pos.shape[0], size=k)]
                Q = neg[rng.integers(neg.shape[0], size=k)] - bases
            else:
                bases, Q = pool[:k], rng.standard_normal((min(k, pool.shape[0]), d))
            Q /= np.linalg.norm(Q, axis=1, keepdims=True)
            H0, J0, _ = _prefix(layers, bases)
            z0 = H0 @ eta[:-1] + eta[-1]
            dz = np.einsum("nmd,nd->nm", J0, Q) @ eta[:-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                t_star = -z0 / dz
            ok = np.isfinite(t_star) & (np.abs(t_star) < span)
            rows = []
            for i in np.flatnonzero(ok):
                lo, hi = _segment(layers, bases[i], Q[i], span, d)
                if lo + 4 * delta < t_star[i] < hi - 4 * delta:
                    rows.append(i)
            rows = rows[: need - len(pts)]
            if not rows:
                continue
            T = t_star[rows][:, None] + offs[None, :]
            Xq = bases[rows][:, None, :] + T[:, :, None] * Q[rows][:, None, :]
            y = f(Xq.reshape(-1, d)).reshape(len(rows), 6)
            for r, i in enumerate(rows):
                t, v = T[r], y[r]
                sl, sr = (v[2] - v[0]) / (t[2] - t[0]), (v[5] - v[3]) / (t[5] - t[3])
                tol = 64 * _EPS * (scale + np.max(np.abs(v)))
                lin_l = abs(v[0] + sl * (t[1] - t[0]) - v[1]) <= tol
                lin_r = abs(v[3] + sr * (t[4] - t[3]) - v[4]) <= tol
                if not (lin_l and lin_r) or abs(sl - sr) <= 1e-6 * max(abs(sl), abs(sr), scale):
                    continue
                tc = (v[3] - sr * t[3] - v[0] + sl * t[0]) / (sl - sr)
                if abs(tc - t_star[i]) < delta:
                    pts.append(bases[i] + tc * Q[i])
            if len(pts) >= need:
                break
        if len(pts) < m_prev + 1:
            out.append(eta)
            continue
        H, _, _ = _prefix(layers, np.asarray(pts))
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
    H, _, _ = _prefix(layers, X)
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
        _, _, pa = _prefix(layers, after)
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
            _, _, pp = _prefix(layers, pool)
            hit = pp[-1][:, want].any(axis=1)
            pool = np.concatenate([pool[hit], pool[~hit]])
        for li in range(2 * lines):
            x0 = pool[li]
            q = rng.standard_normal(d)
            q /= np.linalg.norm(q)
            kinks.extend(_line_kinks(f, x0, q, -span, span, scale, 2 * batch * lines + li, step=1e-3, keep=keep))
        clusters = []
        for i, kink in enumerate(kinks):
            H, J, pats = _prefix(layers, kink.sides[0][None])
            S = pats[-1][0]
            Hx, _, _ = _prefix(layers, kink.x[None])
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
    H, _, _ = _prefix(layers, X)
    P_all = np.concatenate([H, np.ones((H.shape[0], 1))], axis=1)
    etas = []
    # A neuron that is never crossed is dead where the lines went (common in random deep networks):
    # left out. A weight from a neuron of the layer before that was never active at a kink is 0:
    # the verification decides (diagnostics count both).
    for cl in full[:width]:
        eta0 = np.concatenate([np.nan_to_num(cl[0], nan=0.0), [1.0]])
        eta0 /= np.linalg.norm(eta0)
        P = P_all[cl[2]]
        B = np.linalg.svd(eta0[:, None], full_matrices=True)[0][:, 1:]
        c = np.linalg.lstsq(P @ B, -(P @ eta0), rcond=None)[0]
        eta = eta0 + B @ c
        etas.append(eta / np.linalg.norm(eta))
    missing = np.zeros(m, dtype=bool)
    for cl in full[:width]:
        missing |= np.isnan(cl[0])
    return np.stack(etas, axis=1), missing, len(kinks), 2 * lines * (batch + 1)


def _last_signs(layers, etas, X, y, missing, rng, max_points=4000):
    """Signs of the last layer: of the ``2^k`` sign vectors, the one whose least-squares readout
    fits the answers best, on points where no neuron of the layer before with a missing weight is
    active (a wrong sign leaves a residual the size of that neuron's contribution)."""
    H, _, pats = _prefix(layers, X)
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
    H, _, _ = _prefix(layers, X)
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
        The hidden widths ``(m_1, ..., m_k)``. If None, they are detected: a layer's neurons are
        the hyperplanes met on at least two lines, and the depth ends when a readout of the
        recovered layers fits every answer so far. Detection is measured to work at depth 1 only:
        at depth 2 a deeper neuron's piece repeats across lines and the learner refuses (the
        verification fails); pass ``widths`` for deeper networks.
    n_lines : int, optional
        Random lines searched for critical points per layer; default ``max(12, 3 m)`` with
        ``m`` the previous layer's width (``d`` for the first).
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
        ``verify_rel_error`` and ``verify_bits`` (``-log2`` of it: the field's bits of precision).

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option, or ``widths`` that grow (``m_1 > d`` or ``m_l > m_{l-1}``).
    NotIdentifiableError
        If a detected layer is wider than the one before it (outside the class), a neuron was
        not met inside the region where all earlier layers are active, or its sign was not shown.
    OracleInconsistentError
        If the answers are not piecewise linear, disagree on a neuron's sign, or the recovered
        network disagrees with the oracle on the fresh points by more than ``verify_rtol``.
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
      seen is 0; its signs are the sign vector whose least-squares readout fits the answers best.
      On ``random_relu_network(10, (8, 8, 8))`` seeds 0-5 this recovers seed 0 (36.4 bits,
      widths (8, 8, 5): three neurons of layer 3 are dead) and refuses the other five (the
      verification fails: a neuron or a weight was not seen).

    A neuron whose hyperplane misses ``R_{l-1}`` is not found (rare for random networks; the
    learner refuses, naming the layer). Queries: ``n_lines`` kink searches per layer plus
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
    from .exact import check_exact_oracle

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
    if n_lines is not None:
        n_lines = check_int(n_lines, "n_lines", minimum=2)
    span = 3.0 * np.sqrt(d) if span is None else check_real(span, "span", minimum=0.0, strict=True)
    max_layers = check_int(max_layers, "max_layers", minimum=1)
    max_batches = check_int(max_batches, "max_batches", minimum=1)
    verify = check_int(verify, "verify", minimum=0)
    verify_rtol = check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    start = oracle.n_queries
    answered_x: list = []
    answered_y: list = []

    def f(x):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(oracle(x[:, None, :]), dtype=np.float64)
        answered_x.append(x)
        answered_y.append(y)
        return y

    X_check = rng.standard_normal((verify, d))
    y_probe = f(rng.standard_normal((4, d)))  # the scale of the answers
    scale = max(float(np.max(np.abs(y_probe))), 1e-300)
    # Answers at random points from a float64 server need all 53 bits; float32's have 24. Refuse
    # coarse answers now (4 queries), not after the kink search has spent ~1e5 on them.
    prec = AnswerPrecision(oracle, seed=seed + 7)
    if prec.read(y_probe) and prec.u > COARSE_FACTOR * FLOAT64_U:
        raise PrecisionError(
            _rounding_advice(
                "learn_relu_network",
                prec,
                f"not run: the {y_probe.size} answers at random points carry at most "
                f"{round(-np.log2(prec.u))} significant bits",
            )
        )

    layers: list = []
    diag = {"n_probe_queries": oracle.n_queries - start, "n_kinks": [], "n_lines": [], "n_layer_queries": []}
    depth = len(widths) if widths is not None else max_layers
    for layer in range(depth):
        before = oracle.n_queries
        prev = layers[-1][0].shape[1] if layers else d
        if n_lines is not None:
            lines = n_lines
        elif not layers and widths is not None:
            lines = 3  # every line crosses every plane of layer 1: two lines confirm it, a third for spare
        else:
            lines = max(12, 3 * prev)
        bases = _active_points(layers, d, lines, rng)
        inside = bases.shape[0] > 0  # R_{l-1} is not empty
        if widths is not None and len(layers) >= 2 and layer == depth - 1:
            # The last layer of a deep network: R_{l-1} is often thin, and most of its neurons miss
            # it; read them anywhere, from partial normals.
            etas, missing, n_k, n_l = _last_layer_partial(
                f, layers, widths[layer], d, rng, scale, span, lines, max_batches
            )
            Xa, ya = np.concatenate(answered_x), np.concatenate(answered_y)
            signs = _last_signs(layers, etas, Xa, ya, missing, rng)
            layers.append((etas[:-1] * signs[None, :], etas[-1] * signs))
            diag["n_kinks"].append(n_k)
            diag["n_lines"].append(n_l)
            diag["n_layer_queries"].append(oracle.n_queries - before)
            break
        kinks: list = []
        n_batches = 0
        target_width = None if widths is None else widths[layer]
        etas, members = np.zeros((prev + 1, 0)), []
        signs = None
        while n_batches < max_batches:
            # Batches of lines until the given width is confirmed (or, detecting, until a batch
            # confirms no new neuron); a hyperplane crossing a small part of R_{l-1} needs more lines.
            n_batches += 1
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
            if not kinks:
                bases = _active_points(layers, d, lines, rng)
                continue
            cand, cand_members = _layer_neurons(layers, kinks, None, d, min_lines=2)
            if target_width is None:
                # Detected (depth 1 measured): planes met on at least half as many lines as the most-met.
                most = max((len({kinks[i].line for i in m}) for m in cand_members), default=0)
                good = [j for j, m in enumerate(cand_members) if len({kinks[i].line for i in m}) >= 0.5 * most]
            elif not layers or layer == depth - 1:
                # Layer 1: every line crosses every plane of it. The last layer: no deeper neuron.
                good = list(range(min(cand.shape[1], target_width)))
            else:
                good = _flat_neurons(layers, kinks, cand, cand_members)[:target_width]
            etas, members = cand[:, good], [cand_members[j] for j in good]
            if target_width is None or len(good) >= target_width:
                try:
                    signs = _signs(layers, etas, members, kinks) if etas.shape[1] <= prev else None
                except NotIdentifiableError:
                    if n_batches >= max_batches:
                        raise
                    signs = None  # a neuron whose sign no kink showed yet: another batch of lines
                else:
                    break
            bases = _active_points(layers, d, lines, rng)
        diag["n_kinks"].append(len(kinks))
        diag["n_lines"].append(int(lines * n_batches))
        if target_width is not None and etas.shape[1] < target_width:
            raise NotIdentifiableError(
                f"layer {len(layers) + 1}: confirmed {etas.shape[1]} of the {target_width} neurons on "
                f"{lines * n_batches} lines; a neuron whose hyperplane misses the region where all earlier "
                "layers are active cannot be seen by this learner. Raise n_lines or max_batches."
            )
        if etas.shape[1] == 0 and widths is None and layers:
            diag["n_layer_queries"].append(oracle.n_queries - before)
            break  # no new hyperplane where every recovered neuron is active: the depth ends (verified below)
        if etas.shape[1] == 0:
            raise NotIdentifiableError(
                f"layer {len(layers) + 1}: no hyperplane confirmed; the function has no critical point on "
                f"{lines * n_batches} lines, or its neurons miss the region where earlier layers are all active."
            )
        if etas.shape[1] > prev:
            raise NotIdentifiableError(
                f"layer {len(layers) + 1} has {etas.shape[1]} neurons, more than the {prev} before it: "
                "learn_relu_network handles networks whose widths do not grow."
            )
        if signs is None:
            signs = _signs(layers, etas, members, kinks)
        if sharpen:
            etas = _sharpen(f, layers, etas, d, rng, scale, span)
        layers.append((etas[:-1] * signs[None, :], etas[-1] * signs))
        diag["n_layer_queries"].append(oracle.n_queries - before)
    Xa, ya = np.concatenate(answered_x), np.concatenate(answered_y)
    w_out, b_out, res = _readout(layers, Xa, ya)
    n_learning = oracle.n_queries - start
    net = ReLUNetwork([W for W, _ in layers] + [w_out], [b for _, b in layers] + [b_out])
    if verify:
        y_check = np.asarray(oracle(X_check[:, None, :]), dtype=np.float64)
        y_hat = net.forward(X_check)
        ref = max(float(np.max(np.abs(y_check))), np.finfo(float).tiny)
        rel = float(np.max(np.abs(y_hat - y_check))) / ref
        bits = bits_of_precision(y_hat, y_check)
    else:
        rel, bits = float("nan"), float("nan")
    diag.update(
        widths=list(net.widths),
        n_readout_points=int(Xa.shape[0]),
        readout_residual=res,
        n_verify_queries=oracle.n_queries - start - n_learning,
        verify_rel_error=rel,
        verify_bits=bits,
    )
    if verify and not rel <= verify_rtol:
        raise OracleInconsistentError(
            f"the recovered network (widths {net.widths}) disagrees with the oracle by {rel:.3g} > "
            f"verify_rtol={verify_rtol:.3g} on {verify} fresh points: the target is not a ReLU network "
            "whose widths do not grow, or a neuron was missed. Raise n_lines or pass another seed."
        )
    return ReLUNetworkRecovery(
        W=None,
        v=net.weights[-1][:, 0].copy(),
        n_queries=oracle.n_queries - start,
        message=f"extracted widths {net.widths} from {n_learning} length-1 queries; {bits:.1f} bits on fresh points",
        diagnostics=diag,
        weights=tuple(net.weights),
        biases=tuple(net.biases),
    )
