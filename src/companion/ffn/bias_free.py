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

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linear_sum_assignment, milp

from .._learner import COARSE_FACTOR, FLOAT64_U, AnswerPrecision, QueryCount, names_rounding, refuse_stated_rounding
from .._validation import as_float_array, as_sequences, check_choice, check_int, check_real
from ..errors import (
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
    SolverError,
)
from ..recovery import Recovery
from ._kinks import EPS as _EPS
from ._kinks import find_kinks, rounding_advice
from ._kinks import relu as _relu


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


_names_rounding = names_rounding(rounding_advice, one_token=True)


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
    from ..exact import check_exact_oracle

    d = check_exact_oracle(oracle, "learn_ffn")
    refuse_stated_rounding(
        oracle,
        "the kink search intersects lines through answers exact to float64 rounding (rounded answers bend every piece)",
        what="network",
    )
    check_choice(signs, "signs", ("auto", "lstsq", "milp"))
    milp_time_limit = check_real(milp_time_limit, "milp_time_limit", minimum=0.0, strict=True)
    max_planes = check_int(max_planes, "max_planes", minimum=1)
    verify = check_int(verify, "verify", minimum=0)
    verify_rtol = check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    count = QueryCount(oracle)

    def f(x):
        return np.asarray(oracle(np.asarray(x, dtype=np.float64)[:, None, :]), dtype=np.float64)

    with count.stage("linear"):  # b = A w_o from f(e_j) - f(-e_j); also sets the scale
        fpm = f(np.concatenate([np.eye(d), -np.eye(d)]))
    b, scale = fpm[:d] - fpm[d:], float(np.max(np.abs(fpm)))
    X_check = rng.standard_normal((verify, d)) / np.sqrt(d)
    with count.stage("verify"):
        y_check = f(X_check) if verify else np.zeros(0)
    _refuse_coarse_answers(oracle, y_check, seed)
    scan = _PlaneScan(failures=[])
    with count.stage("scan"):  # kink search, gradients and refinement on the planes
        for plane in range(max_planes):
            try:
                net, scale = _plane_network(f, rng, d, b, scale, y_check, refine, signs, milp_time_limit, scan)
            except (OracleInconsistentError, PrecisionError) as exc:
                scan.failures.append(str(exc))
                scan.n_close += isinstance(exc, PrecisionError)
                continue
            rel = _verify_error(net, X_check, y_check) if verify else float("nan")
            if not verify or rel <= verify_rtol:
                break
            scan.failures.append(
                f"relative disagreement {rel:.3g} > verify_rtol={verify_rtol:.3g} on {verify} fresh points"
            )
        else:
            _refuse_every_plane(scan, max_planes)
    return _ffn_recovery(net, rel, plane + 1, scan, count)


@dataclass
class _PlaneScan:
    """What :func:`learn_ffn`'s planes leave behind: why each rejected plane failed, how many of
    them failed because two kinks were closer than float64 resolves, and the kink search's retries."""

    failures: list
    n_close: int = 0
    n_retries: int = 0


def _refuse_coarse_answers(oracle, y_check, seed):
    """Stage of :func:`learn_ffn`: refuse answers too coarse for the kink search, read off the
    verification answers (no query). The verification points are random, so a float64 server's
    answers there need all 53 bits: answers with COARSE_FACTOR times float64's rounding or coarser
    (float32 has 24 bits) are refused now, before the kink search spends its queries on them (it
    would fail on every plane, about 1e5 queries each at d = 32, and be refused for the same
    rounding)."""
    prec = AnswerPrecision(oracle, seed=seed + 7)
    if prec.read(y_check) and prec.u > COARSE_FACTOR * FLOAT64_U:
        raise PrecisionError(
            rounding_advice(
                "learn_ffn",
                prec,
                f"not run: the answers at the {len(y_check)} verification points carry at most "
                f"{round(-np.log2(prec.u))} significant bits",
            )
        )


def _plane_network(f, rng, d, b, scale, y_check, refine, signs, milp_time_limit, scan):
    """Stage of :func:`learn_ffn`: the network read off one random 2-plane, ``((A, w_o, s, info,
    width), scale)``; ``s`` is None when the signs did not resolve (``A``, ``w_o`` then the
    equivalent network of width m + 2). Raises what :func:`_line_neurons` raises on a bad plane."""
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
    parts = [_line_neurons(f, base, direction, scale, span=1.1) for base, direction in ((p, q), (q, -p))]
    U = np.concatenate([pt[0] for pt in parts], axis=1)
    c = np.concatenate([pt[1] for pt in parts])
    quality = np.concatenate([pt[3] * np.abs(pt[1]) for pt in parts])
    scan.n_retries += sum(pt[5] for pt in parts)
    U, c, quality = _merge_neurons(U, c, quality)
    if refine:
        U, c, _ = _refine(f, U, c, b, rng)
    try:
        s, info = resolve_signs(U, c, b, method=signs, time_limit=milp_time_limit)
    except OracleInconsistentError:
        # No sign vector fits, e.g. two neurons share a hyperplane (w|a^T x| has no width-1 form):
        # fall back on the equivalent network of width m + 2.
        s, info = None, {"method": signs, "status": "no_fit", "seconds": 0.0}
    A_hat, w_hat = _assemble(U, c, s, b)
    return (A_hat, w_hat, s, info, U.shape[1]), scale


def _verify_error(net, X_check, y_check) -> float:
    """``max |f_hat - f| / max |f|`` of the plane's network on the verification points."""
    y_hat = _relu(X_check @ net[0]) @ net[1]
    ref = max(float(np.max(np.abs(y_check))), np.finfo(float).tiny)
    return float(np.max(np.abs(y_hat - y_check))) / ref


def _refuse_every_plane(scan, max_planes):
    """Stage of :func:`learn_ffn`: no plane gave a verified network; the refusal names why."""
    if scan.n_close == max_planes:
        raise PrecisionError(
            f"on each of max_planes={max_planes} random planes two neurons' kinks along a line were "
            f"closer than float64 resolves (last: {scan.failures[-1]}); the answers are consistent with a "
            "ReLU network, but these neurons cannot be separated at this precision. Raise max_planes "
            "or pass another seed."
        )
    raise OracleInconsistentError(
        f"no extraction from {max_planes} random planes matched the oracle (last: "
        f"{scan.failures[-1]}): the target is not a bias-free ReLU network, or has kinks too close "
        "to separate. Raise max_planes."
    )


def _ffn_recovery(net, rel, n_planes, scan, count):
    """Stage of :func:`learn_ffn`: the network in :func:`canonical_form`, its diagnostics and message."""
    A_hat, w_hat, s, info, width = net
    A_c, w_c = canonical_form(A_hat, w_hat, tol=1e-12)
    diagnostics = {
        "n_planes": n_planes,
        "n_linear_queries": count["linear"],
        "n_verify_queries": count["verify"],
        "n_scan_queries": count["scan"],
        "n_step_retries": scan.n_retries,
        "plane_failures": scan.failures,
        "signs_method": info["method"],
        "signs_status": info["status"],
        "signs_seconds": info["seconds"],
        "verify_rel_error": rel,
        "verify_max_error": rel,
        "verify_bits": float(-np.log2(rel)) if rel > 0 else (float("inf") if rel == 0 else rel),
    }
    message = (
        f"extracted {width} neurons from {count.total} length-1 queries "
        f"({n_planes} plane(s)); signs by {info['method']}: {info['status']}"
    )
    if s is None:
        message += f"; returned an equivalent network of width {A_c.shape[1]} (not the target's neurons)"
    return FFNRecovery(
        W=None, v=A_c @ w_c, n_queries=count.total, message=message, diagnostics=diagnostics, A=A_c, w_o=w_c
    )


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
