"""Critical points along a line and the field's bits of precision (shared by both FFN learners)."""

from __future__ import annotations


import numpy as np

from ..errors import (
    OracleInconsistentError,
    PrecisionError,
)

EPS = float(np.finfo(np.float64).eps)
FRACTIONS = (0.2371, 0.4937, 0.7529)  # quarter, half and three-quarter points of find_kinks


def relu(z):
    return np.maximum(z, 0.0)


def bits_of_precision(y_hat, y) -> float:
    """``-log2(max_i |y_hat_i - y_i| / max_i |y_i|)``: bits of agreement relative to the largest output.

    This book's measure of extraction fidelity. Carlini et al. (2020) report the absolute worst case,
    ``-log2(max_i |y_hat_i - y_i|)``, on inputs of their own scale; the two agree when the largest output
    is 1.

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


def find_kinks(g, lo, hi, *, scale, rtol=1024 * EPS, min_width=1e-12, max_evals=100_000):
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
        q1, m, q3 = l + FRACTIONS[0] * w, l + FRACTIONS[1] * w, l + FRACTIONS[2] * w
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
            found.append(l + FRACTIONS[1] * (r - l))
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


#: The FFN learner locates kinks by intersecting lines through answers exact to float64 rounding:
#: a refusal at float32 or coarser answers names the rounding (companion._learner.names_rounding,
#: measured on one-token queries), which alone makes it refuse; whether the target is also outside
#: the class it cannot tell.
def rounding_advice(learner, prec, err) -> str:
    """The refusal of an FFN learner (``learner``, its name) whose answers carry rounding
    ``prec`` (an ``AnswerPrecision``) coarser than float64's, naming the rounding; ``err``: the
    search's own message."""
    cls = "ReLU networks" if learner == "learn_relu_network" else "the bias-free ReLU class"
    return (
        f"{learner} refused, and {prec.describe()}: its kink search intersects lines through "
        "answers exact to float64 rounding, and rounding at this level bends every piece (the "
        "search then finds kinks everywhere), so the rounding alone makes it refuse, and this "
        f"refusal cannot tell whether the target is also outside {cls}. No FFN learner here works "
        f"from answers this coarse; ask a float64 server. (The search said: {err})"
    )
