"""Low-rank heads from rank-one projections (Theorems 5.1, 5.2) and at the degrees-of-freedom count (§5).

A head whose merged matrix ``W`` has rank ``r`` (the head dimension) has only ``r (2d - r)`` degrees
of freedom, far fewer than the ``d**2`` entries Theorem 4.1 reads one by one. Every learner here
rests on one measurement, the rank-one projection (ROP) of Cai & Zhang (2015) realised by a
two-token value query: for ``X = c [(a + b)^T; b^T]`` the two-token identity gives

.. math:: y = c\\,(b^\\top v + \\sigma(c^2\\, a^\\top W b)\\, a^\\top v), \\qquad
          a^\\top W b = \\sigma^{-1}\\big((y / c - b^\\top v) / a^\\top v\\big) / c^2,

so one query yields one bilinear measurement ``<a b^T, W>`` whenever ``a^T v != 0``. The scale
``c`` (the logit scales by ``c**2``, the answer by ``c``) keeps the sigmoid unsaturated.

Three ways to turn measurements into ``W``, one entry point :func:`learn_low_rank`:

* ``method="nuclear"``: Gaussian ROP and nuclear-norm minimisation through cvxpy, the program of
  Theorems 5.1 / 5.2 (the reference; small ``d`` only).
* ``method="rgn"``: the same Gaussian ROP measurements, solved by Riemannian Gauss-Newton on the
  rank-``r`` matrices from a spectral start (Luo, Huang, Li & Zhang 2024); scales to ``d`` in the
  hundreds.
* ``method="sketch"``: structured measurements of a randomly rotated ``W`` (a cross of ``k`` rows
  and ``k`` columns) and the stabilised generalised Nystrom formula (Nakatsukasa 2020); exact with
  ``k (2d - k) + d`` queries, ``k = r + 1``, against the floor ``r (2d - r) + d``. With
  ``rank=None`` the cross grows one row and column at a time until the rank shows.
* ``method="auto"`` (the default, this book's): ``"nuclear"`` where its program fits in
  ``NUCLEAR_MAX_BYTES``, else the sketch; the result's message states the choice.

Layer: one of the paper's sections (§5), above the shared numerics it uses with
:mod:`companion.robust`: the Gaussian design and :func:`rop_queries` live in
``companion.numerics.rop`` (re-exported here), the Gauss-Newton solver in
``companion.numerics.rgn``. :func:`measure_bilinear` (exact oracles, re-measuring saturated
queries) and the sketch are this module's own.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logit

from ._streaming import CHUNK_BYTES, answer_rop, chunk_queries
from ._validation import as_float_array, check_choice, check_int, check_real
from .errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError, PrecisionError, SolverError
from ._learner import (
    DEFAULT_VERIFY,
    AnswerPrecision,
    OracleView,
    best_relative_scale,
    build,
    check_verify,
    head_check_size,
    measurement_errors,
    reserve,
    saturation_band,
    suggests_bias,
    verify_head,
    verify_outputs,
)
from .exact import SATURATION, check_exact_oracle, read_value_vector, remeasure_saturated
from .errors import MESSAGES, CompanionError
from .numerics.rgn import _rgn
from .numerics.rop import _at_unit_max, _gaussian_rop_design, design_product, rop_queries
from .recovery import Recovery

__all__ = [
    "learn_low_rank",
    "LowRankRecovery",
    "degrees_of_freedom",
    "rop_queries",
    "measure_bilinear",
    "CHUNK_BYTES",
    "METHODS",
    "DEFAULT_OVERSAMPLING",
    "NUCLEAR_MAX_BYTES",
    "nuclear_program_size",
    "recovery_trial",
    "phase_transition",
    "transition_point",
    "nuclear_statistical_dimension",
    "DESIGNS",
    "scaling_point",
]

#: The methods of :func:`learn_low_rank`.
METHODS = ("nuclear", "rgn", "sketch")

#: Default number of Gaussian ROP measurements, as a multiple of ``r (2d - r)``, per method.
#: Measured (this book, ``benchmarks/nuclear_transition.py``: 12 rank-1 heads x 3 measurement
#: seeds at d = 24, exact = relative error below 1e-6): the nuclear norm recovers 0/36 at
#: 2 r(2d - r), 29/36 at 3 r(2d - r) (the former default; the others are off by up to 36 %),
#: 36/36 at 4x and at 5x; also 8/8 at 4x for d = 32 and d = 40. The default 5x sits one unit
#: above the smallest all-exact ratio. RGN is exact from 2.5x in the same kind of runs and raises
#: SolverError (never returns a wrong W silently) on the draws it cannot fit below.
DEFAULT_OVERSAMPLING = {"nuclear": 5.0, "rgn": 2.0}

_NOISE_FLOOR = 1e-12  # singular values of the sketch core below this are rounding noise

#: Memory cvxpy and SCS take per entry of the nuclear-norm program's measurement operator
#: (``m d^2`` entries: row ``k`` is ``vec(a_k b_k^T)``). Measured (this book, cvxpy 1.x, peak RSS of
#: ``Problem.get_problem_data(SCS)`` above the imports): 116 B at d = 32, 126 B at d = 48, 113 B at
#: d = 64 (r = 4, m = 5 r (2d - r)); the canonicalisation also takes about 3 s per 10^6 entries.
NUCLEAR_BYTES_PER_ENTRY = 128

#: Largest estimated memory of a nuclear-norm program :func:`learn_low_rank` and
#: :func:`companion.robust.learn_low_rank_noisy` build (2 GiB); above it they refuse before any
#: query. At the default ``m = 5 r (2d - r)`` this admits d <= 118, 94, 75, 60 for r = 1, 2, 4, 8;
#: the paper's ``learn_low_rank(oracle, 8)`` at d = 96 would need about 8 GB. Raise it (a module
#: attribute) to build larger programs on a larger machine.
NUCLEAR_MAX_BYTES = 2 * 2**30

_MESSAGES = {
    "too_few": (
        "n_measurements={m} cannot determine a rank-{r} {d} x {d} matrix: it has r(2d - r) = {dof} "
        "degrees of freedom, so at least {dof} measurements are needed (Theorem 5.2 uses "
        "C * r * 2d). Raise n_measurements, or use method='sketch' ({sketch} queries)."
    ),
    "rgn_failed": (
        "Riemannian Gauss-Newton stopped after {it} iterations with relative residual {res:.3g}: "
        "either m={m} measurements ({C:.2f} r(2d - r)) are too few for this draw (raise "
        "n_measurements or change seed), or rank(W*) > rank={r} (pass a larger rank)."
    ),
    "nuclear_too_big": (
        "{learner}(method='nuclear') at d={d} with m={m} measurements would build a convex program "
        "whose measurement operator has m d^2 = {entries:,} entries: about {gb:.1f} GB for cvxpy and "
        "SCS ({per} bytes per entry, measured), above companion.lowrank.NUCLEAR_MAX_BYTES = "
        "{limit:.1f} GB. Refused before any query. The scalable methods use the same kind of "
        "measurements without the program: method='rgn' (Riemannian Gauss-Newton from a spectral "
        "start on Gaussian rank-one projections; assumes rank(W*) <= rank={r} and enough "
        "measurements for this draw, and raises SolverError rather than return a wrong W) or, for "
        "an exact oracle, method='sketch' (a cross of rank + oversample rows and columns of a "
        "randomly rotated W, d + k(2d - k) queries; assumes rank(W*) <= rank, checked by the "
        "extra singular value). Or pass fewer n_measurements, or raise NUCLEAR_MAX_BYTES on a "
        "machine with the memory."
    ),
    "rank_small_rounding": (
        "the oracle's head has rank above the assumed rank={r}: singular value {i} of the {k} x {k} "
        "core is {s:.3g} relative, beyond its measured rounding level {noise:.3g} (twice the "
        "core's change when asked again at another scale; {prec}). Rounding cannot explain it: "
        "pass a larger rank, or rank=None with method='sketch' to detect it."
    ),
    "rank_small": (
        "the oracle's head has rank above the assumed rank={r}: {what} (relative {err:.3g} > "
        "rank_tol={tol:.3g}). Pass a larger rank, or rank=None with method='sketch' to detect it."
    ),
    "nuclear_rank": (
        "the oracle's head has rank above the assumed rank={r}: the nuclear-norm solution agrees with "
        "the oracle on {n} fresh queries, but its singular value {i} is {err:.3g} relative, above "
        "max(rank_tol, the check's tolerance) = {tol:.3g}.{determined} Pass a larger rank, or "
        "rank=None with method='sketch' to detect it."
    ),
    "determined": (
        " With m={m} >= d^2 = {d2} measurements the program has one feasible point, W* itself, "
        "whatever its rank; learn_single_head reads W* from d + d^2 = {exact} queries, fewer than "
        "these {ours}."
    ),
}


def degrees_of_freedom(d, r) -> int:
    """``r (2d - r)``: the dimension of the set of ``d x d`` matrices of rank ``r``.

    Examples
    --------
    >>> degrees_of_freedom(384, 32)
    23552
    """
    d = check_int(d, "d", minimum=1)
    r = check_int(r, "r", minimum=0, maximum=d)
    return r * (2 * d - r)


# ---------------------------------------------------------------------------------------------
# Measurements: one query per bilinear form a^T W b
# ---------------------------------------------------------------------------------------------


def nuclear_program_size(d, m) -> dict:
    """Size of the nuclear-norm program on ``m`` rank-one projections of a ``d x d`` matrix, unbuilt.

    Parameters
    ----------
    d : int
        Dimension, ``>= 1``.
    m : int
        Number of measurements (constraints), ``>= 1``.

    Returns
    -------
    dict
        ``variables``: ``d^2`` entries of ``W`` plus the two symmetric ``d x d`` blocks of the
        semidefinite form of ``||W||_*`` (``d^2 + d (d + 1)``); ``constraints``: ``m`` measurement
        rows and one semidefinite cone of size ``2d``; ``entries``: nonzeros of the measurement
        operator, ``m d^2``; ``bytes``: the estimated peak memory of cvxpy and SCS,
        ``NUCLEAR_BYTES_PER_ENTRY * m d^2`` (measured, see that constant).

    Raises
    ------
    InvalidInputError
        If ``d`` or ``m`` is not an integer ``>= 1``.

    Examples
    --------
    >>> size = nuclear_program_size(96, 5 * 8 * (2 * 96 - 8))     # the paper's default at d = 96, r = 8
    >>> size["entries"], round(size["bytes"] / 1e9, 1), size["bytes"] > NUCLEAR_MAX_BYTES
    (67829760, 8.7, True)
    """
    d = check_int(d, "d", minimum=1)
    m = check_int(m, "m", minimum=1)
    entries = m * d * d
    return {
        "variables": d * d + d * (d + 1),
        "constraints": m,
        "psd_cone": 2 * d,
        "entries": entries,
        "bytes": NUCLEAR_BYTES_PER_ENTRY * entries,
    }


def check_nuclear_size(d, m, r, learner: str) -> dict:
    """Raise :class:`~companion.errors.InvalidInputError` if the program exceeds ``NUCLEAR_MAX_BYTES``."""
    size = nuclear_program_size(d, m)
    if size["bytes"] > NUCLEAR_MAX_BYTES:
        raise InvalidInputError(
            _MESSAGES["nuclear_too_big"].format(
                learner=learner,
                d=d,
                m=m,
                r=r,
                entries=size["entries"],
                gb=size["bytes"] / 1e9,
                per=NUCLEAR_BYTES_PER_ENTRY,
                limit=NUCLEAR_MAX_BYTES / 1e9,
            )
        )
    return size


def _invert_rop(y, av, bv, c):
    """Solve ``y = c (b^T v + sigma(t) a^T v)`` for ``t`` (``= c^2 a^T W b``) and ``sigma(t)``."""
    alpha = (np.asarray(y) / c - bv) / av
    with np.errstate(divide="ignore", invalid="ignore"):
        return logit(alpha), alpha


def measure_bilinear(
    oracle, A, B, v, *, scale="auto", rows=None, cols=None, segments=None, c_start=1.0, band=SATURATION
):
    """Measure ``a_k^T W* b_k`` with one two-token value query each, keeping the sigmoid unsaturated.

    The rank-one projection of §5: the query ``c_k [(a_k + b_k)^T; b_k^T]``
    (:func:`rop_queries`) is answered ``c_k (b_k^T v* + sigma(c_k^2 a_k^T W* b_k) a_k^T v*)``, which
    is solved for ``a_k^T W* b_k``. The queries are built and sent in bounded chunks of
    ``CHUNK_BYTES`` bytes: no ``(m, 2, d)`` array is formed beyond ``A`` and ``B`` themselves.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of a single head ``f_{W*, v*}``, ``d = oracle.d``; it answers sequences of
        length 2. Every query is counted by the oracle.
    A, B : ndarray of shape (p, d) and (q, d)
        Left and right vectors as rows (with ``rows``/``cols``: their sources), float64 or
        float32 (used as they are: the queries are built from them in float64, exactly). Every
        ``a_k^T v`` must be nonzero (the answer is divided by it).
    v : ndarray of shape (d,)
        The value vector ``v*``, e.g. read off ``d`` length-1 queries by
        :func:`companion.exact.read_value_vector`.
    scale : "auto" or float, default="auto"
        ``"auto"``: every query starts at ``c = 1`` and a measurement whose attention weight falls
        outside ``[SATURATION, 1 - SATURATION]`` is re-measured at a smaller ``c`` (one extra query
        each, counted by the oracle). A float ``> 0`` fixes ``c``.
    rows, cols : ndarray of shape (m,) of int, default=None
        Measurement ``k`` uses ``a_k = A[rows[k]]`` and ``b_k = B[cols[k]]``; ``None``: ``A[k]``, ``B[k]``.
    segments : sequence of int, default=None
        Lengths of runs of measurements in which ``rows`` and ``cols`` are each constant or
        consecutive (the rows and columns of a cross), which are then sent without gathers.
    c_start : float, default=1.0
        With ``scale="auto"``, the scale every query starts at (e.g. one chosen for relative
        rounding by :func:`companion._learner.best_relative_scale`).
    band : float, default=SATURATION
        Weights outside ``[band, 1 - band]`` are re-measured (see
        :func:`companion._learner.saturation_band` for answers with coarse precision).

    Returns
    -------
    t : ndarray of shape (m,)
        The measurements ``a_k^T W* b_k``, to rounding (about 1e-15 relative for unsaturated
        weights).
    info : dict
        ``n_requeries`` (extra queries), ``scales`` (m,) the final ``c_k``, ``max_abs_logit``,
        ``av`` and ``bv`` (m,) the ``a_k^T v`` and ``b_k^T v``.

    Raises
    ------
    InvalidInputError
        If ``A``, ``B`` or ``v`` do not have ``d = oracle.d`` columns (entries) or are not
        finite, ``A`` and ``B`` differ in length without ``rows``/``cols``, some ``a_k^T v`` is
        0, or ``scale`` is neither ``"auto"`` nor a float ``> 0``; before the first query.
    OracleInconsistentError
        If a weight stays saturated after 40 re-measurements, or lies outside (0, 1) at a fixed
        scale: the oracle is not a softmax head, or ``scale`` is too large.

    Notes
    -----
    §5 of [1]_ with ``c = 1``; the scale ``c`` (the logit scales by ``c**2``, the answer by ``c``)
    and the re-measurement are this book's, shared with Theorem 4.1's learner
    (:func:`companion.exact.remeasure_saturated`).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> from companion.oracles import ValueQueryOracle
    >>> head = random_single_head(6, rank=2, seed=0)
    >>> rng = np.random.default_rng(1)
    >>> A, B = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    >>> oracle = ValueQueryOracle(head)
    >>> t, info = measure_bilinear(oracle, A, B, head.v)
    >>> bool(np.allclose(t, np.einsum("kd,de,ke->k", A, head.W, B), rtol=1e-12))
    True
    >>> oracle.n_queries == 4 + info["n_requeries"]
    True
    """
    d = int(oracle.d)
    # no copy of a float64 or float32 design (the queries are built in float64, exactly)
    A, B = (M if M.dtype == np.float32 else np.asarray(M, dtype=np.float64) for M in map(np.asarray, (A, B)))
    v = as_float_array(v, "v", ndim=1, shape=(d,))
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != d or B.shape[1] != d:
        raise InvalidInputError(f"A and B must be 2-d with d={d} columns; got {A.shape=}, {B.shape=}.")
    if rows is None and cols is None and A.shape[0] != B.shape[0]:
        raise InvalidInputError(
            f"A and B must have one row per measurement; got {A.shape=}, {B.shape=} (or pass rows and cols)."
        )
    if isinstance(scale, str):
        check_choice(scale, "scale", ("auto",))
    else:
        scale = check_real(scale, "scale", minimum=0.0, strict=True)
    auto = isinstance(scale, str)
    c0 = float(c_start) if auto else float(scale)
    av, bv = design_product(A, v), design_product(B, v)
    if rows is not None:
        av = av[rows]
    if cols is not None:
        bv = bv[cols]
    if not (np.all(np.isfinite(av)) and np.all(np.isfinite(bv))):  # NaN/inf in A or B shows here
        raise InvalidInputError("A and B must be finite; they contain NaN or inf.")
    if not np.all(av):
        k = int(np.flatnonzero(av == 0)[0])
        raise InvalidInputError(
            f"a_k^T v = 0 for measurement k={k}: the answer carries no information on a_k^T W b_k; redraw a_k."
        )
    m = av.shape[0]
    y = answer_rop(oracle, A, B, c0, rows=rows, cols=cols, segments=segments)
    T, alpha = _invert_rop(y, av, bv, c0)
    C = np.full(m, c0)
    n_requeries = 0
    if auto:

        def measure(idx, c):
            y_idx = answer_rop(
                oracle, A, B, c, rows=idx if rows is None else rows[idx], cols=idx if cols is None else cols[idx]
            )
            return _invert_rop(y_idx, av[idx], bv[idx], c)

        n_requeries = remeasure_saturated(measure, T, alpha, C, band=band)
    if not np.all(np.isfinite(T)):
        k = int(np.flatnonzero(~np.isfinite(T))[0])
        advice = "the oracle is not a single head" if auto else 'use scale="auto" or a smaller scale'
        raise OracleInconsistentError(
            f"the attention weight of measurement {k} is {alpha[k]!r}, outside (0, 1), so "
            f"sigma^-1 is undefined; {advice}."
        )
    info = {"n_requeries": n_requeries, "scales": C, "max_abs_logit": float(np.max(np.abs(T))), "av": av, "bv": bv}
    return T / C**2, info


# ---------------------------------------------------------------------------------------------
# The convex program of Theorems 5.1 / 5.2
# ---------------------------------------------------------------------------------------------


def _nuclear_norm_problem(A, B, t):
    """Form ``min ||W||_* s.t. a_k^T W b_k = t_k`` (k = 1..m) as a cvxpy problem.

    Returns
    -------
    problem : cvxpy.Problem
    W : cvxpy.Variable of shape (d, d)
    """
    import cvxpy as cp

    d = A.shape[1]
    W = cp.Variable((d, d))
    # a_k^T W b_k for all k at once: row k of (A W) times row k of B, summed.
    constraints = [cp.sum(cp.multiply(A @ W, B), axis=1) == t]
    return cp.Problem(cp.Minimize(cp.normNuc(W)), constraints), W


def _solve_nuclear(A, B, t, *, eps):
    """Solve :func:`_nuclear_norm_problem` with SCS; raise SolverError unless optimal.

    Returns
    -------
    W : ndarray of shape (d, d)
    info : dict
        ``solver``, ``status``, ``solve_iterations``, ``objective``.
    """
    import cvxpy as cp

    # The measurement operator is scaled so that its rows have unit norm on average: SCS's
    # stopping rule is absolute, and a well-scaled problem makes eps a relative accuracy.
    s = np.sqrt(np.mean(np.sum(A**2, 1) * np.sum(B**2, 1)))
    problem, W = _nuclear_norm_problem(A / np.sqrt(s), B / np.sqrt(s), t / s)
    # SCS, explicitly: the nuclear norm becomes an SDP of size 2d, which SCS (first-order, sparse)
    # solved 13 times faster than Clarabel (interior point) here; tight eps because "exact"
    # recovery is judged at relative error 1e-6.
    try:
        problem.solve(solver=cp.SCS, eps_abs=eps, eps_rel=eps, max_iters=200_000)
    except cp.error.SolverError as exc:
        raise SolverError(f"SCS failed on the nuclear-norm program: {exc}") from None
    info = {
        "solver": "SCS",
        "status": problem.status,
        "solve_iterations": int(problem.solver_stats.num_iters or 0),
        "objective": float(problem.value) if problem.value is not None else float("nan"),
    }
    if problem.status != cp.OPTIMAL:
        raise SolverError(
            f"SCS stopped with status {problem.status!r} on the nuclear-norm program "
            f"(eps={eps:g}, {info['solve_iterations']} iterations): the measurements may be "
            "inconsistent with any matrix (the oracle is not a single head), or the solver needs "
            "room: loosen solver_eps or use method='rgn'."
        )
    return np.asarray(W.value, dtype=np.float64), info


# ---------------------------------------------------------------------------------------------
# Query-optimal sketch
# ---------------------------------------------------------------------------------------------


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
    v = _at_unit_max(v)  # the bases depend on v's direction only
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


def _sketch(oracle, v, rank, *, oversample, rank_tol, scale, rng, prec):
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
                    _MESSAGES["rank_small_rounding"].format(
                        r=rank, i=rank + 1, k=k, s=s[rank] / s[0], noise=noise / s[0], prec=prec.describe()
                    )
                )
            raise OracleInconsistentError(
                _MESSAGES["rank_small"].format(
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
# ---------------------------------------------------------------------------------------------

from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True, eq=False, repr=False)  # keep Recovery's sorted, aligned repr
class LowRankRecovery(Recovery):
    """A :class:`~companion.recovery.Recovery` with the rank the learner used.

    Attributes
    ----------
    rank : int
        Rank of the returned ``W`` (the given rank, or the detected one with ``rank=None``), to
        the rank check's tolerance; with ``verify=0`` the nuclear-norm method makes no rank check,
        and its ``W`` may have a higher rank than this.
    method : str
        ``"nuclear"``, ``"rgn"`` or ``"sketch"``.
    """

    rank: int = 0
    method: str = ""


def _sign_normalised_svd(W, r, factors=None):
    """Top-``r`` SVD factors with each left singular vector's largest entry positive.

    With ``factors = (F, G)``, ``W = F G`` of rank ``rho``, the SVD comes from two thin QRs and an
    ``rho x rho`` SVD, ``O(d rho^2)`` work instead of ``O(d^3)``; singular values beyond ``rho``
    are then exactly 0.

    Returns
    -------
    U : ndarray of shape (d, r)
    s : ndarray of shape (r,)
    Vt : ndarray of shape (r, d)
    sv : ndarray of shape (min(r + 1, d),)
        The top ``r + 1`` singular values of ``W``.
    """
    if factors is None:
        U, s, Vt = np.linalg.svd(W)
        sv = s[: r + 1].copy()
    else:
        F, G = factors
        Qf, Rf = np.linalg.qr(F)
        Qg, Rg = np.linalg.qr(G.T)
        u, s, vt = np.linalg.svd(Rf @ Rg.T)
        U, Vt = Qf @ u, vt @ Qg.T
        sv = np.zeros(min(r + 1, W.shape[0]))
        sv[: min(s.size, sv.size)] = s[: sv.size]
    U, s, Vt = U[:, :r], s[:r], Vt[:r]
    flip = np.sign(U[np.argmax(np.abs(U), axis=0), np.arange(r)])
    flip[flip == 0] = 1.0
    return U * flip, s, Vt * flip[:, None], sv


@suggests_bias(
    "The low-rank methods assume no biases: learn_single_head(oracle, bias=True) learns such a layer "
    "on homogeneous tokens (x, 1)."
)
def learn_low_rank(
    oracle,
    rank,
    *,
    method="auto",
    n_measurements=None,
    oversample=1,
    rank_tol=1e-8,
    scale="auto",
    solver_eps=1e-9,
    max_iter=50,
    tol=1e-13,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
    precision=None,
    bias=False,
):
    """Recover a head whose merged ``W`` has rank at most ``rank`` from few value queries (§5).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for :math:`f_{W^*, v^*}` with ``d = oracle.d`` and ``v* != 0``. It must answer
        sequences of length 1 and 2 (1 to 8 with ``verify``).
    rank : int or None
        Upper bound ``r`` on ``rank(W*)``, ``1 <= r <= d``. ``None`` (only with
        ``method="sketch"``) detects the rank: the cross grows until its core is rank-deficient.
    method : {"auto", "nuclear", "rgn", "sketch"}, default="auto"
        ``"auto"`` (this book's default) picks a method that runs at the oracle's size:
        ``"nuclear"`` (the paper's) where its program fits ``NUCLEAR_MAX_BYTES``, else
        ``"sketch"`` (else ``"rgn"`` when ``n_measurements`` is given, since the sketch takes no
        ``m``); ``rank=None`` picks ``"sketch"``. The result's ``method`` and ``message`` say
        which ran and why. Name a method to run it whatever the size.
        ``"nuclear"``: ``m`` Gaussian ROP measurements and ``min ||W||_* s.t. <a_k b_k^T, W> = t_k``
        through cvxpy with SCS, the program of Theorems 5.1 / 5.2 (an SDP whose size
        :func:`nuclear_program_size` estimates; refused above ``NUCLEAR_MAX_BYTES``, 2 GiB, e.g.
        beyond d = 60 at rank 8 with the default ``m``).
        ``"rgn"``: the same measurements, Riemannian Gauss-Newton from a spectral start.
        ``"sketch"``: the cross of ``k = rank + oversample`` rows and columns of
        a randomly rotated ``W``; ``d + k (2d - k)`` queries.
    n_measurements : int, default=None
        Number ``m`` of Gaussian ROP measurements for ``"nuclear"`` / ``"rgn"``; at least
        ``r (2d - r)``. Default ``ceil(C r (2d - r))`` with ``C`` from ``DEFAULT_OVERSAMPLING``
        (5 for nuclear, above its measured transition near 3 to 4; 2 for rgn). Ignored by ``"sketch"``.
        From ``m = d**2`` on, the measurements alone determine every ``d x d`` matrix (the
        Gaussian ROP operator is injective with probability 1), whatever its rank: the rank
        assumption then buys nothing, and :func:`companion.exact.learn_single_head` needs fewer
        queries (``d + d**2``). The nuclear default reaches ``d**2`` when ``5 r (2d - r) >= d**2``,
        i.e. for ``d`` below about ``10 r``.
    oversample : int, default=1
        Extra rows and columns of the sketch's cross beyond ``rank`` (``>= 0``). With ``>= 1`` the
        extra singular value of the core checks the rank assumption for free.
    rank_tol : float, default=1e-8
        ``"sketch"``: a singular value of the cross's core below ``rank_tol`` times the
        largest (or below 1e-12) counts as zero; this decides the rank with ``rank=None`` and the
        rank check with ``oversample >= 1``. ``"nuclear"`` (with ``verify``): after the
        verification, a ``(rank + 1)``-th singular value of ``W`` above ``max(rank_tol,
        verify_tolerance)`` times the largest is refused, since the program does not use
        ``rank`` and may return a ``W`` of higher rank (always the case at ``m >= d**2`` for a
        target of higher rank). ``"rgn"`` returns rank ``rank`` by construction.
    scale : "auto" or float, default="auto"
        Scale ``c`` of the two-token queries; ``"auto"`` re-measures saturated ones at a smaller
        ``c`` (one extra query each, in ``diagnostics["n_requeries"]``).
    solver_eps : float, default=1e-9
        SCS's ``eps_abs`` and ``eps_rel`` for ``"nuclear"``.
    max_iter : int, default=50
        Largest number of Gauss-Newton iterations for ``"rgn"``.
    tol : float, default=1e-13
        ``"rgn"`` stops when the relative measurement residual is below ``tol``.
    verify : int, default=32
        Fresh random queries (lengths 1 to 8, never used for learning) on which the recovered head
        is compared with the oracle (:func:`companion.exact.verify_single_head`); 0 opts out. Every
        method assumes a single head with ``rank(W*) <= rank``; ``"nuclear"`` and ``"rgn"`` also
        assume that the ``m`` random measurements determine ``W*`` (true with high probability
        above the phase transition, not for every draw). The check turns a failure of any of these
        into an :class:`~companion.errors.OracleInconsistentError` instead of a wrong ``W``.
    verify_rtol : float, default=1e-6
        Largest relative disagreement the check accepts.
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for the measurement vectors and rotations.
    precision : None, "measure", str or float, default=None
        The relative rounding ``u`` of the answers, as in
        :func:`companion.exact.learn_single_head`. ``"sketch"``: the rank decision counts a
        singular value as zero below the rounding level of the core (see ``_sketch``), measured
        from the answers if the check fails and nobody stated ``u``; a known coarse ``u`` sets
        one probe scale for relative rounding from the cross's first row (``d`` re-measurements).
        Every method: the verification tolerance follows ``u``.
    bias : bool, default=False
        ``True``: the model has biases (this book's extension, as in
        :func:`companion.exact.learn_single_head`). ``v0`` (one query, a zero token), ``v``
        (``d``) and the score bias ``w`` (``d`` two-token queries ``[c u; 0]``, re-measured at
        ``c / 8`` when saturated) are read first; the chosen method then runs on the two-token
        answers with the ``w`` term taken out of each logit (a bias-free head with the same
        ``W``; it reads ``v`` again, ``d`` more queries), and the result is verified on the
        model itself, on random sequences. ``W`` and
        ``v`` are then ``(d + 1, d + 1)`` (zero last row) and ``(d + 1,)`` as with
        ``learn_single_head(oracle, bias=True)``; ``rank`` bounds the rank of the token block
        ``W``; ``diagnostics`` adds ``n_bias_queries`` (the ``2d + 1`` queries and their
        re-measurements) and ``identifiable``.

    Returns
    -------
    LowRankRecovery
        ``W`` (d, d), ``v`` (d,), ``n_queries`` from the oracle, ``rank``, ``method`` and
        ``diagnostics``: ``n_measurements``, ``n_requeries``, ``max_abs_logit``,
        ``singular_values`` (top ``rank + 1`` of ``W``), ``factor_U``, ``factor_s``, ``factor_Vt``
        (its top-``rank`` SVD, each column of ``U`` with its largest entry positive),
        and per method: ``solver``, ``status``, ``solve_iterations``, ``objective`` (nuclear);
        ``iterations``, ``residual``, ``residuals``, ``lsqr_iterations`` (rgn); ``cross_size``,
        ``core_singular_values``, ``rank_detected``, ``rank_used`` (the rank returned) (sketch);
        ``n_verify_queries`` and, with
        ``verify``, ``verify_max_error`` and ``verify_tolerance``; the answers' precision: ``precision``,
        ``precision_format``, ``precision_source``, ``n_precision_queries``, ``precision_kind``; and
        (sketch) ``rank_tol_used``,
        ``kappa_W``, ``floor_W``, ``floor_v`` (the rank threshold used and the attainable errors).
        ``n_queries`` counts the verification queries;
        ``n_learning_queries`` leaves them out.

    Raises
    ------
    TypeError
        If ``oracle`` is approximate (``tau > 0``).
    InvalidInputError
        For a bad ``rank``, ``method``, ``n_measurements``, ``oversample`` or tolerance, or
        ``rank=None`` with a method other than ``"sketch"``; or with ``"nuclear"``, if the
        program's estimated memory exceeds ``NUCLEAR_MAX_BYTES`` (the message names ``"rgn"`` and
        ``"sketch"`` and what they assume). Raised before the first query.
    NotIdentifiableError
        If ``n_measurements < r (2d - r)`` (raised before the first query: fewer measurements than
        degrees of freedom cannot determine ``W``), or if ``v* = 0``.
    BudgetExceededError
        If the oracle's budget is smaller than the planned queries (before the first query).
    OracleInconsistentError
        If the measurements contradict ``rank(W*) <= rank``: the sketch core has a nonzero
        ``(rank + 1)``-th singular value, or the verification queries disagree with the recovered
        head (e.g. ``"nuclear"`` below its phase transition returns a wrong ``W``; the check refuses
        it), or (``"nuclear"``) the verified ``W`` has a ``(rank + 1)``-th singular value above
        ``max(rank_tol, verify_tolerance)`` relative (see ``rank_tol``). When the sketch's
        check fails after ``rank_tol`` counted singular values above the rounding floor as zero
        (e.g. ``rank_tol=1.0``, which counts every one as zero), the message names ``rank_tol``,
        the values it cut, and the value to go below, instead of blaming the target. When the
        oracle answers a single zero token with a nonzero value (a layer with biases; a bias-free
        head answers 0), the message says so and names ``learn_single_head(oracle, bias=True)``.
    SolverError
        If ``"rgn"`` ends with a relative residual above ``max(1e3 tol, 1e-8)``: ``m`` was too few
        for this draw (see the phase transition in chapter 4), or ``rank(W*) > rank``.
    SolverError
        If SCS does not reach an optimal solution.
    PrecisionError
        Instead of either ``SolverError`` (``"nuclear"``, ``"rgn"``) when the answers carry
        float32 or coarser rounding (stated, or measured after the failure with 24 queries): the
        exact fit cannot hold, and the message names the rounding and ``method='sketch'``.

    Notes
    -----
    The ROP measurement ``a^T W b`` comes from one two-token query ``c [(a + b)^T; b^T]`` (§5 of
    [1]_, with the scale ``c`` added). Theorem 5.1 (Cai & Zhang [2]_): ``m = O(r (d1 + d2))``
    Gaussian ROP measurements and nuclear-norm minimisation recover every rank-``r`` matrix with
    probability ``1 - exp(-Omega(m))``; Theorem 5.2 turns this into ``d + C r (2d)`` value queries.
    ``"rgn"`` is Riemannian Gauss-Newton [3]_ on the same measurements. ``"sketch"`` measures
    ``M = L W R`` (``L``, ``R``
    orthogonal, random; every row of ``L`` has ``l^T v = ||v|| / sqrt(d)``) on ``k`` full rows and
    ``k`` full columns and returns ``W = L^T M_{:,K} (M_{K,K})^+_r M_{K,:} R^T``, the generalised
    Nystrom formula in its stabilised (truncated pseudo-inverse) form [4]_; a rank-``r`` matrix has
    ``r (2d - r)`` degrees of freedom, so ``k = r`` would be optimal and ``k = r + 1`` costs
    ``2(d - r) - 1`` more queries.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Cai, Zhang, "ROP: Matrix recovery via rank-one projections", Ann. Statist. 43(1), 2015.
    .. [3] Luo, Huang, Li, Zhang, "Recursive importance sketching for rank constrained least
       squares: algorithms and high-order convergence", Operations Research 72(1), 2024.
    .. [4] Nakatsukasa, "Fast and stable randomized low-rank matrix approximation", arXiv:2009.11392.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_single_head(40, rank=3, seed=0)
    >>> rec = learn_low_rank(ValueQueryOracle(target), 3, method="sketch")
    >>> rec.n_learning_queries, 40 + degrees_of_freedom(40, 3)   # d + (r+1)(2d-r-1) vs the floor
    (344, 271)
    >>> rec.n_queries                                    # plus 32 verification queries
    376
    >>> err = np.linalg.norm(rec.W - target.W) / np.linalg.norm(target.W)
    >>> bool(err < 1e-10), rec.rank
    (True, 3)
    """
    d = check_exact_oracle(oracle, "learn_low_rank")
    if not isinstance(bias, (bool, np.bool_)):
        raise InvalidInputError(f"bias must be True or False; got {bias!r}.")
    if bias:
        return _learn_low_rank_biased(
            oracle,
            rank,
            dict(
                method=method,
                n_measurements=n_measurements,
                oversample=oversample,
                rank_tol=rank_tol,
                scale=scale,
                solver_eps=solver_eps,
                max_iter=max_iter,
                tol=tol,
                seed=seed,
                precision=precision,
            ),
            verify=verify,
            verify_rtol=verify_rtol,
        )
    check_choice(method, "method", ("auto",) + METHODS)
    chosen = ""
    if method == "auto":
        method, chosen = _auto_method(d, rank, n_measurements)
    if rank is None:
        if method != "sketch":
            raise InvalidInputError(
                f"rank=None (detect the rank) needs method='sketch'; method={method!r} needs an "
                "upper bound on rank(W*) to size its measurements."
            )
        r = None
    else:
        r = check_int(rank, "rank", minimum=1, maximum=d)
    oversample = check_int(oversample, "oversample", minimum=0)
    rank_tol = check_real(rank_tol, "rank_tol", minimum=0.0, strict=True, maximum=1.0)
    if not isinstance(scale, str):
        scale = check_real(scale, "scale", minimum=0.0, strict=True)
    else:
        check_choice(scale, "scale", ("auto",))
    solver_eps = check_real(solver_eps, "solver_eps", minimum=0.0, strict=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    tol = check_real(tol, "tol", minimum=0.0, strict=True)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if method == "sketch":
        if n_measurements is not None:
            raise InvalidInputError(
                f"n_measurements={n_measurements!r} is not used by method='sketch', whose cross of "
                "k = rank + oversample rows and columns fixes d + k(2d - k) queries; use "
                "oversample instead."
            )
        planned = d + (min(d, r + oversample) * (2 * d - min(d, r + oversample)) if r else 0)
    else:
        dof = r * (2 * d - r)
        if n_measurements is None:
            m = int(math.ceil(DEFAULT_OVERSAMPLING[method] * dof))
        else:
            m = check_int(n_measurements, "n_measurements", minimum=1)
        if m < dof:
            k = min(d, r + 1)
            raise NotIdentifiableError(_MESSAGES["too_few"].format(m=m, r=r, d=d, dof=dof, sketch=d + k * (2 * d - k)))
        planned = d + m
        if method == "nuclear":
            check_nuclear_size(d, m, r, "learn_low_rank")
    start = reserve(oracle, planned + verify, "learn_low_rank")
    rng = np.random.default_rng(seed)
    prec = AnswerPrecision(oracle, precision, seed=seed + 2)
    if method == "sketch":  # its rank cut and saturation band follow u: measure it first
        prec.measure_first(planned + verify, always=r is None)  # a detected rank is decided once

    v = read_value_vector(oracle)
    if not np.any(v):
        raise NotIdentifiableError(MESSAGES["v_zero"])

    diagnostics = {}
    if method == "sketch":
        W, info = _sketch(oracle, v, r, oversample=oversample, rank_tol=rank_tol, scale=scale, rng=rng, prec=prec)
        diagnostics.update(info)
        diagnostics["n_measurements"] = oracle.n_queries - start - d - info["n_requeries"] - prec.n_queries
        r_out = info["rank_used"]
        how = f"a cross of {info['cross_size']} rows and columns" + (
            f", rank {info['rank_detected']} detected" if r is None else ""
        )
    else:
        # rgn solves in float32: its design is drawn in float32 (the same draws, rounded), which
        # the solver uses as it is, with no float64 copy (half the memory and its page faults)
        A, B = _gaussian_rop_design(d, m, v, rng, dtype=np.float32 if method == "rgn" else np.float64)
        t, info = measure_bilinear(oracle, A, B, v, scale=scale)
        diagnostics.update(n_measurements=m, n_requeries=info["n_requeries"], max_abs_logit=info["max_abs_logit"])
        try:
            if method == "nuclear":
                W, sinfo = _solve_nuclear(A, B, t, eps=solver_eps)
            else:
                W, sinfo = _rgn(A, B, t, r, max_iter=max_iter, tol=tol)
                if sinfo["residual"] > max(1e3 * tol, 1e-8):
                    raise SolverError(
                        _MESSAGES["rgn_failed"].format(
                            it=sinfo["iterations"], res=sinfo["residual"], m=m, C=m / dof, r=r
                        )
                    )
        except SolverError as err:
            _name_rounding(err, prec, method)
            raise
        diagnostics.update(sinfo)
        r_out = r
        how = f"{m} Gaussian rank-one projections ({method})"
    U, s, Vt, sv = _sign_normalised_svd(W, max(r_out, 0), factors=diagnostics.pop("factors", None))
    diagnostics["singular_values"] = sv
    diagnostics.update(factor_U=U, factor_s=s, factor_Vt=Vt)
    message = f"recovered a rank-{r_out} W and v from {d} + {oracle.n_queries - start - d} value queries: {how}"
    message = chosen + message
    if diagnostics.get("n_requeries"):
        message += f", including {diagnostics['n_requeries']} re-measurements of saturated queries"
    kappa_W = diagnostics.pop("kappa_W", 0.0)
    cut = diagnostics.pop("rank_tol_cut", None)
    try:
        checked = verify_head(
            oracle,
            W,
            v,
            verify,
            rtol=verify_rtol,
            seed=seed + 1,
            what=f"a single head with rank(W*) <= {r_out} recovered by {method!r}",
            precision=prec,
            size=head_check_size(W, v, kappa_W, 1.0),
            floor=lambda u: kappa_W * u,
            measure_if_coarse=method == "sketch",
        )
    except OracleInconsistentError as err:
        if cut is not None and cut.size:
            exc = OracleInconsistentError(_rank_tol_cut(err, cut, rank_tol, r_out, diagnostics, verify))
            exc.max_error, exc.tolerance = err.max_error, err.tolerance
            raise exc from err
        raise
    if method == "nuclear" and verify:
        _check_nuclear_rank(sv, r, d, m, rank_tol, checked)
    if method == "sketch":
        message = prec.report_floor(diagnostics, message, kappa_W)
    return build(
        LowRankRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=W,
        v=v,
        rank=int(r_out),
        method=method,
        precision=prec,
    )


def _auto_method(d, rank, n_measurements) -> tuple[str, str]:
    """``method="auto"``: the method :func:`learn_low_rank` runs, and the clause its message opens with.

    ``"nuclear"`` where its program (:func:`nuclear_program_size`, with the default or given
    ``m``) fits ``NUCLEAR_MAX_BYTES``; else ``"sketch"``, or ``"rgn"`` when ``n_measurements`` is
    given (the sketch takes none). ``rank`` and ``n_measurements`` are checked by the caller
    afterwards; a value they refuse picks ``"nuclear"`` here, whose checks then name it.
    """
    if rank is None:
        return "sketch", "method='auto' chose 'sketch' (rank=None: only the sketch detects the rank); "
    try:
        r = check_int(rank, "rank", minimum=1, maximum=d)
        m = (
            int(math.ceil(DEFAULT_OVERSAMPLING["nuclear"] * r * (2 * d - r)))
            if n_measurements is None
            else check_int(n_measurements, "n_measurements", minimum=1)
        )
    except InvalidInputError:
        return "nuclear", ""
    gb = nuclear_program_size(d, m)["bytes"] / 1e9
    if gb * 1e9 <= NUCLEAR_MAX_BYTES:
        return "nuclear", (
            f"method='auto' chose 'nuclear' (the paper's program, about {gb:.2g} GB, fits "
            f"NUCLEAR_MAX_BYTES = {NUCLEAR_MAX_BYTES / 1e9:.2g} GB); "
        )
    other = "sketch" if n_measurements is None else "rgn"
    return other, (
        f"method='auto' chose {other!r}: the paper's nuclear-norm program would need about {gb:.2g} GB "
        f"at d = {d}, above NUCLEAR_MAX_BYTES = {NUCLEAR_MAX_BYTES / 1e9:.2g} GB (pass method='nuclear' "
        "and raise that limit to run it); "
    )


def _name_rounding(err, prec, method):
    """Raise :class:`PrecisionError` if answers rounded to float32 or coarser explain ``err``.

    ``"nuclear"`` (an equality-constrained program) and ``"rgn"`` (stopped at a relative residual of
    ``max(1e3 tol, 1e-8)``) fit the measurements exactly; answers with relative rounding ``u`` make
    them inconsistent at about ``u`` times the measurements' condition, which neither program
    allows. The precision is the oracle's stated one, or measured now (24 queries, counted like
    verification). Returns (``err`` stands) for float64 answers or when no budget is left.
    """
    if not prec.known:
        try:
            prec.measure()
        except CompanionError:
            return
    if prec.rounding or prec.noise:
        raise PrecisionError(
            f"method={method!r} refused, and {prec.describe()}: it fits the rank-one projections "
            "exactly (as an equality-constrained program or to a residual of 1e-8), which rounded "
            "answers make inconsistent, so this refusal is the answers' rounding, not too few "
            "measurements or a rank above the assumed one. Use method='sketch' (it measures the "
            "rounding level of its cross and reports the attainable error), or "
            "companion.robust.learn_low_rank_noisy with tau at the answers' rounding (u times "
            f"their size). ({str(err).split(': ')[0]}.)"
        ) from err


def _rank_tol_cut(err, cut, rank_tol, r_out, info, n):
    """The message for a sketch refused because ``rank_tol`` counted real singular values as zero.

    ``cut`` holds the core's singular values (relative to the largest) that lie above the rounding
    floor but at most ``rank_tol``: dropping them made the returned rank ``r_out``, and the
    verification that then failed says nothing about the target.
    """
    k = info["cross_size"]
    every = "every singular value" if r_out == 0 else f"{cut.size} singular value(s)"
    why = (
        " (a singular value counts only above rank_tol times the largest, and none exceeds the largest)"
        if rank_tol >= 1.0
        else ""
    )
    shown = ", ".join(f"{c:.3g}" for c in cut[:4]) + (", ..." if cut.size > 4 else "")
    return (
        f"verification failed: on {n} fresh random queries the recovered model disagrees with the "
        f"oracle by up to {err.max_error:.3g} (relative; tolerance {err.tolerance:.3g}), because "
        f"rank_tol={rank_tol:g} counted {every} of the {k} x {k} core as zero{why}: relative "
        f"{shown}, all above the rounding floor. W was returned at rank {r_out}; the target was "
        f"not shown to break the rank assumption. Lower rank_tol below {float(cut.min()):.3g} "
        "(the default 1e-8 keeps every singular value above rounding)."
    )


def _check_nuclear_rank(sv, r, d, m, rank_tol, checked):
    """Refuse a verified nuclear-norm solution whose ``(r + 1)``-th singular value is not zero.

    The program never uses ``r`` (only ``m`` does), so its solution may have any rank: above the
    phase transition of a larger rank, and always once ``m >= d^2`` (the Gaussian ROP operator is
    then injective with probability 1, and the only feasible point is ``W*``). A singular value
    below ``max(rank_tol, verify_tolerance)`` times the largest counts as zero: the check that
    passed cannot tell a component that small.
    """
    if sv.size <= r or sv[0] == 0:
        return
    tol = max(rank_tol, checked["verify_tolerance"])
    if sv[r] > tol * sv[0]:
        determined = _MESSAGES["determined"].format(m=m, d2=d * d, exact=d + d * d, ours=d + m) if m >= d * d else ""
        raise OracleInconsistentError(
            _MESSAGES["nuclear_rank"].format(
                r=r, n=checked["n_verify_queries"], i=r + 1, err=sv[r] / sv[0], tol=tol, determined=determined
            )
        )


#: Measurement designs of :func:`recovery_trial`.
DESIGNS = ("rop", "gaussian")


def _gaussian_matrix_nuclear(W_true, m, rng, *, eps=1e-9):
    """``min ||W||_* s.t. <G_k, W> = <G_k, W*>`` with i.i.d. ``N(0, 1/d^2)`` matrices ``G_k``.

    The measurement model of the statistical-dimension theory (Amelunxen et al. 2014), which no
    value query realises: a query measures rank-one projections ``<a b^T, W>`` only. A reference.
    """
    import cvxpy as cp

    d = W_true.shape[0]
    G = rng.standard_normal((m, d, d)) / d
    t = np.einsum("kij,ij->k", G, W_true)
    W = cp.Variable((d, d))
    # cp.vec is column-major: entry i + j d of vec(W) is W[i, j].
    Gm = G.transpose(0, 2, 1).reshape(m, d * d)
    problem = cp.Problem(cp.Minimize(cp.normNuc(W)), [Gm @ cp.vec(W, order="F") == t])
    try:
        problem.solve(solver=cp.SCS, eps_abs=eps, eps_rel=eps, max_iters=200_000)
    except cp.error.SolverError as exc:
        raise SolverError(f"SCS failed on the nuclear-norm program: {exc}") from None
    if problem.status != cp.OPTIMAL:
        raise SolverError(f"SCS stopped with status {problem.status!r} on the nuclear-norm program.")
    return np.asarray(W.value, dtype=np.float64)


def recovery_trial(d, r, ratio, *, method, seed, threshold=1e-6, design="rop") -> dict:
    """One point of a phase transition: learn a random rank-``r`` head from ``m`` measurements.

    ``m = ceil(ratio * r (2d - r))``; the head is ``random_single_head(d, rank=r, seed=seed)``.
    A solver that does not converge (:class:`~companion.errors.SolverError`) counts as a failure.

    Parameters
    ----------
    d, r : int
        Dimension and rank.
    ratio : float
        Measurements per degree of freedom, ``m / (r (2d - r))``.
    method : {"nuclear", "rgn"}
        The Gaussian-measurement learner of :func:`learn_low_rank`.
    seed : int
        Seed of the head and of the measurements.
    threshold : float, default=1e-6
        Relative Frobenius error below which the recovery counts as exact.
    design : {"rop", "gaussian"}, default="rop"
        ``"rop"``: Gaussian rank-one projections read off value queries (:func:`learn_low_rank`).
        ``"gaussian"`` (``method="nuclear"`` only): ``m`` measurements ``<G_k, W*>`` with i.i.d.
        Gaussian matrices ``G_k`` taken straight from ``W*``, with no oracle: the model of the
        statistical-dimension prediction (:func:`nuclear_statistical_dimension`), as a reference.

    Returns
    -------
    dict
        ``m``, ``n_queries`` (0 for ``"gaussian"``), ``rel_error_W`` (None on a solver failure,
        or when ``m`` is below the degrees of freedom and the learner refuses) and ``exact`` (bool).
    """
    from .attention import random_single_head
    from .oracles import ValueQueryOracle

    check_choice(method, "method", ("nuclear", "rgn"))
    check_choice(design, "design", DESIGNS)
    if design == "gaussian" and method != "nuclear":
        raise InvalidInputError(f"design='gaussian' is solved by method='nuclear' only; got method={method!r}.")
    m = int(np.ceil(check_real(ratio, "ratio", minimum=0.0, strict=True) * degrees_of_freedom(d, r)))
    head = random_single_head(d, rank=r, seed=seed)
    if design == "gaussian":
        try:
            W = _gaussian_matrix_nuclear(head.W, m, np.random.default_rng(seed))
            err = float(np.linalg.norm(W - head.W) / np.linalg.norm(head.W))
        except SolverError:
            err = None
        return {"m": m, "n_queries": 0, "rel_error_W": err, "exact": err is not None and err <= threshold}
    oracle = ValueQueryOracle(head)
    # One BLAS thread: these solves are small, and on a shared machine threaded BLAS made a
    # trial up to 20 times slower; parallelism belongs to run_sweep's workers.
    from threadpoolctl import threadpool_limits

    try:
        with threadpool_limits(limits=1, user_api="blas"):
            rec = learn_low_rank(oracle, r, method=method, n_measurements=m, verify=0, seed=seed)
        err = rec.relative_errors(head)["W"]
    except (SolverError, NotIdentifiableError):  # a ratio below 1: fewer m than r(2d - r), refused
        err = None
    return {"m": m, "n_queries": oracle.n_queries, "rel_error_W": err, "exact": err is not None and err <= threshold}


def _trial_seed(seed, d, r, i_ratio, t):
    """An independent seed for every (d, r, ratio, trial): SeedSequence of the tuple."""
    return int(np.random.SeedSequence([seed, d, r, i_ratio, t]).generate_state(1)[0])


def phase_transition(
    cases, ratios, *, method, n_trials, seed, n_jobs=1, backend="sequential", name=None, design="rop"
) -> dict:
    """Probability of exact recovery against ``m / (r (2d - r))`` for several ``(d, r)``.

    Every ``(d, r, ratio, trial)`` is one :func:`recovery_trial` with its own random head and
    measurements: the seed of a trial is drawn from ``numpy.random.SeedSequence([seed, d, r, i, t])``
    (``i`` the index of the ratio), so no head is reused across ratios or cases and the success
    counts at different ratios are independent. The trials run through
    :func:`companion.sweeps.run_sweep` (``n_jobs`` and ``backend="dask"`` spread them over cores or
    a cluster; ``name`` saves the rows with provenance).

    Parameters
    ----------
    cases : sequence of (int, int)
        The ``(d, r)`` pairs.
    ratios : sequence of float
        Measurements per degree of freedom.
    method : {"nuclear", "rgn"}
        Learner.
    n_trials : int
        Random heads per grid point.
    seed : int
        Base seed.
    n_jobs, backend, name
        Passed to :func:`~companion.sweeps.run_sweep`.
    design : {"rop", "gaussian"}, default="rop"
        Passed to :func:`recovery_trial`.

    Returns
    -------
    dict
        ``(d, r) -> list of success rates`` in the order of ``ratios``.

    Examples
    --------
    >>> rates = phase_transition([(6, 1)], [1.0, 3.0], method="rgn", n_trials=2, seed=0)
    >>> rates[(6, 1)][-1]
    1.0
    """
    from .sweeps import run_sweep

    n_trials = check_int(n_trials, "n_trials", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    check_choice(design, "design", DESIGNS)
    points = [
        {
            "d": int(d),
            "r": int(r),
            "ratio": float(q),
            "method": method,
            "design": design,
            "seed": _trial_seed(seed, int(d), int(r), i, t),
        }
        for d, r in cases
        for i, q in enumerate(ratios)
        for t in range(n_trials)
    ]
    rows = run_sweep(recovery_trial, points, n_jobs=n_jobs, backend=backend, progress=False, name=name)
    out = {}
    for d, r in cases:
        out[(int(d), int(r))] = [
            float(
                np.mean(
                    [row["exact"] for row in rows if (row["d"], row["r"], row["ratio"]) == (int(d), int(r), float(q))]
                )
            )
            for q in ratios
        ]
    return out


def transition_point(ratios, rates, level=0.5) -> float:
    """The ratio at which the success rate first reaches ``level``, by linear interpolation.

    Parameters
    ----------
    ratios : sequence of float
        Increasing grid of ``m / (r (2d - r))``.
    rates : sequence of float
        Success rates on that grid (from :func:`phase_transition`).
    level : float, default=0.5
        The success rate that marks the transition.

    Returns
    -------
    float
        The interpolated ratio; ``nan`` if no rate reaches ``level``, ``ratios[0]`` if the first does.

    Examples
    --------
    >>> transition_point([1.0, 2.0, 3.0], [0.0, 0.2, 0.8])
    2.5
    """
    q = np.asarray(ratios, dtype=np.float64)
    p = np.asarray(rates, dtype=np.float64)
    if q.shape != p.shape or q.ndim != 1 or np.any(np.diff(q) <= 0):
        raise InvalidInputError(f"ratios must be increasing and match rates; got {q.shape=}, {p.shape=}.")
    hit = np.flatnonzero(p >= level)
    if hit.size == 0:
        return float("nan")
    k = int(hit[0])
    if k == 0:
        return float(q[0])
    return float(q[k - 1] + (level - p[k - 1]) * (q[k] - q[k - 1]) / (p[k] - p[k - 1]))


def nuclear_statistical_dimension(d, r, *, n_samples=400, seed=0) -> float:
    """Statistical dimension of the nuclear norm's descent cone at a rank-``r`` ``d x d`` matrix.

    The number of Gaussian-matrix measurements at which nuclear-norm minimisation switches from
    failing to succeeding (Amelunxen, Lotz, McCoy & Tropp 2014 [1]_), computed by their recipe

    .. math:: \\delta \\approx \\inf_{\\tau \\ge 0} \\; r(2d - r) + r\\tau^2
              + \\mathbb E \\sum_{i=1}^{d-r} (\\sigma_i(G') - \\tau)_+^2 ,

    with ``G'`` a ``(d - r) x (d - r)`` standard Gaussian matrix (the expectation by Monte Carlo
    over ``n_samples`` draws; the infimum over ``tau`` by a bounded scalar search).

    Parameters
    ----------
    d, r : int
        Size and rank, ``1 <= r <= d``.
    n_samples : int, default=400
        Monte Carlo draws of ``G'``.
    seed : int, default=0
        Seed of the draws.

    Returns
    -------
    float
        The estimate of ``delta``; between ``r (2d - r)`` and ``d**2``.

    Notes
    -----
    Derivation (this book's, following [1]_ §4). At ``X = U S V^T`` the subdifferential of
    ``||.||_*`` is ``{U V^T + Z : U^T Z = 0, Z V = 0, ||Z|| <= 1}``. Split a Gaussian ``G`` into its
    part in the tangent space ``T = {U A^T + B V^T}`` (dimension ``r (2d - r)``) and the part
    ``G' = (I - U U^T) G (I - V V^T)`` orthogonal to it. The distance from ``G`` to
    ``tau * subdifferential`` is then ``||P_T G - tau U V^T||_F^2`` (expectation
    ``r (2d - r) + r tau^2``) plus the distance from ``G'`` to the spectral-norm ball of radius
    ``tau``, ``sum_i (sigma_i(G') - tau)_+^2``. [1]_ bound the statistical dimension above by the
    infimum over ``tau`` of the expectation, with an error at most
    ``2 sup ||s||_F / ||X / ||X||_F||_* <= 2 sqrt(d)`` (their error bound for this recipe, §4).
    The prediction is for measurements ``<G_k, W>`` with i.i.d. Gaussian matrices; rank-one
    projections are not of that kind, so it is a yardstick for them, not a theorem.

    References
    ----------
    .. [1] Amelunxen, Lotz, McCoy, Tropp, "Living on the edge: phase transitions in convex programs
       with random data", Information and Inference 3(3), 2014.

    Examples
    --------
    >>> delta = nuclear_statistical_dimension(8, 1, seed=0)
    >>> bool(degrees_of_freedom(8, 1) < delta < 64)
    True
    """
    from scipy.optimize import minimize_scalar

    d = check_int(d, "d", minimum=1)
    r = check_int(r, "r", minimum=1, maximum=d)
    n_samples = check_int(n_samples, "n_samples", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    dof = r * (2 * d - r)
    n = d - r
    if n == 0:
        return float(dof)
    rng = np.random.default_rng(seed)
    sv = np.linalg.svd(rng.standard_normal((n_samples, n, n)), compute_uv=False)

    def J(tau):
        return dof + r * tau * tau + float(np.mean(np.sum(np.maximum(sv - tau, 0.0) ** 2, axis=1)))

    res = minimize_scalar(J, bounds=(0.0, float(sv.max())), method="bounded", options={"xatol": 1e-10})
    return float(min(res.fun, J(0.0)))


def scaling_point(d, rank, *, seed, memory=True, threads=1) -> dict:
    """Cost of the sketch at size ``d`` against the oracle's own cost, measured in this process.

    The target is ``random_single_head(d, rank=rank, factored=True, seed=seed)``; the learner is
    ``learn_low_rank(..., method="sketch", oversample=0)`` (the floor ``d + r(2d - r)`` queries,
    plus re-measurements). The oracle times its own calls, so ``oracle_s`` is the time the oracle
    alone spends answering exactly the learner's queries, measured side by side with the learner's
    total ``learner_s``. With ``memory``, a second, identical run under ``tracemalloc`` gives the
    peak of the memory allocated while learning (the target's own arrays are allocated before).

    Parameters
    ----------
    d, rank : int
        Dimension and rank, ``1 <= rank <= d``.
    seed : int
        Seed of the head and of the learner.
    memory : bool, default=True
        Also measure the peak allocation (a second run).
    threads : int or None, default=1
        BLAS threads during both runs (``threadpoolctl``); ``None`` leaves them as they are. One
        thread keeps timings steady on shared cores, where idle BLAS threads spin-wait.

    Returns
    -------
    dict
        ``d``, ``r``, ``queries``, ``floor``, ``rel_error_W`` (against ``W = K^T Q``, formed for the
        check only), ``learner_s``, ``oracle_s``, ``ratio`` and, with ``memory``, ``peak_bytes``.

    Examples
    --------
    >>> row = scaling_point(64, 2, seed=0, memory=False)
    >>> row["queries"] >= row["floor"] == 64 + degrees_of_freedom(64, 2), row["rel_error_W"] < 1e-10
    (True, True)
    """
    import time
    import tracemalloc

    from .attention import random_single_head
    from .oracles import ValueQueryOracle

    d = check_int(d, "d", minimum=1)
    r = check_int(rank, "rank", minimum=1, maximum=d)
    seed = check_int(seed, "seed", minimum=0)

    class _TimedOracle(ValueQueryOracle):
        seconds = 0.0

        def __call__(self, X):
            t0 = time.perf_counter()
            try:
                return super().__call__(X)
            finally:
                self.seconds += time.perf_counter() - t0

    from threadpoolctl import threadpool_limits

    threads = None if threads is None else check_int(threads, "threads", minimum=1)
    head = random_single_head(d, rank=r, factored=True, seed=seed)
    with threadpool_limits(limits=threads):
        oracle = _TimedOracle(head)
        t0 = time.perf_counter()
        rec = learn_low_rank(oracle, r, method="sketch", oversample=0, seed=seed)
        seconds = time.perf_counter() - t0
        row = {
            "d": d,
            "r": r,
            "queries": rec.n_queries,
            "floor": d + degrees_of_freedom(d, r),
            "rel_error_W": rec.relative_errors(head)["W"],
            "learner_s": seconds,
            "oracle_s": oracle.seconds,
            "ratio": seconds / oracle.seconds,
        }
        del rec
        if memory:
            tracemalloc.start()
            try:
                learn_low_rank(ValueQueryOracle(head), r, method="sketch", oversample=0, seed=seed)
                row["peak_bytes"] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
    return row


# --------------------------------------------------------------------------------------------
# Biases: learn_low_rank(oracle, rank, bias=True)
# --------------------------------------------------------------------------------------------

_BIAS_ROUNDS = 40  # re-measurement rounds of the score-bias queries, each at 1/8 of the scale


class _Debiased(OracleView):
    """A layer with biases, seen through its one- and two-token answers as the bias-free head ``(W, v)``.

    With ``v0``, ``v`` and ``w`` known, a one-token answer ``y = v0 + x^T v`` becomes ``x^T v`` and a
    two-token answer ``y = v0 + b^T v + sigma(t) (a - b)^T v``, ``t = (a - b)^T (W b + w)``, becomes
    ``b^T v + sigma(t - (a - b)^T w) (a - b)^T v``: what the bias-free head answers. Counter, budget
    and precision are the model's oracle's. Longer sequences get the model's answer less ``v0``:
    the low-rank methods learn from one and two tokens and only measure the answers' rounding on
    longer ones, which the offset does not change (verification runs on the model itself).
    """

    def __init__(self, oracle, v0, v, w):
        super().__init__(oracle)
        self.v0, self.v, self.w = float(v0), v, w

    @property
    def tau(self) -> float:
        return 0.0

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        single = X.ndim == 2
        X3 = X[None] if single else X
        y = np.asarray(self.oracle(X3), dtype=np.float64).reshape(-1) - self.v0
        if X3.shape[1] == 2:
            a, b = X3[:, 0, :], X3[:, 1, :]
            g, bv = (a - b) @ self.v, b @ self.v
            with np.errstate(divide="ignore", invalid="ignore"):
                t = logit((y - bv) / g) - (a - b) @ self.w
            y = bv + g / (1.0 + np.exp(-t))
        return float(y[0]) if single else y


def _learn_low_rank_biased(oracle, rank, options, *, verify, verify_rtol):
    """``learn_low_rank(..., bias=True)``: read ``v0``, ``v``, ``w``, run the method de-biased, verify."""
    from .exact import probe_matrix
    from .attention import SingleHead

    d = int(oracle.d)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    start = reserve(oracle, 2 * d + 1 + verify, "learn_low_rank")
    X1 = np.zeros((d + 1, 1, d))
    X1[1:, 0, :] = np.eye(d)
    y1 = np.asarray(oracle(X1), dtype=np.float64)
    v0, v = float(y1[0]), y1[1:] - y1[0]
    if not np.any(v):
        raise NotIdentifiableError(MESSAGES["v_zero"] + " (Here the token part v~[:d] is 0.)")
    U = probe_matrix(v, "basis")
    uv = U @ v
    c = np.ones(d)
    n_re = 0

    def ask(idx):
        X = np.zeros((len(idx), 2, d))
        X[:, 0, :] = U[idx] * c[idx, None]
        alpha = (np.asarray(oracle(X), dtype=np.float64).reshape(-1) - v0) / (c[idx] * uv[idx])
        return alpha

    alpha = ask(np.arange(d))
    band = SATURATION
    for _ in range(_BIAS_ROUNDS):
        sat = np.flatnonzero(~((alpha >= band) & (alpha <= 1.0 - band)))
        if sat.size == 0:
            break
        c[sat] *= 0.125
        alpha[sat] = ask(sat)
        n_re += sat.size
    else:
        raise OracleInconsistentError(
            f"the score bias: attention weights stayed saturated after {_BIAS_ROUNDS} re-measurements; "
            "the oracle does not behave like a softmax head with biases."
        )
    uw = logit(alpha) / c  # u_l^T w
    w = np.linalg.solve(U, uw)
    n_bias = int(oracle.n_queries) - start
    inner = learn_low_rank(_Debiased(oracle, v0, v, w), rank, **options, verify=0)
    W_full = np.zeros((d + 1, d + 1))
    W_full[:d, :d], W_full[:d, d] = inner.W, w
    v_full = np.append(v, v0)
    head = SingleHead(W_full, v_full)

    def lift(x):
        return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)

    prec = AnswerPrecision(oracle, options.get("precision"), seed=int(options.get("seed", 0)) + 2)
    base_size = head_check_size(W_full, v_full, 0.0, 1.0)
    checked = verify_outputs(
        oracle,
        lambda X: head([lift(np.asarray(x)) for x in X]),
        lambda x: float(np.max(np.abs(lift(x) @ v_full))),
        verify,
        rtol=verify_rtol,
        seed=int(options.get("seed", 0)) + 1,
        what=f"a single head with biases and rank(W) <= {inner.rank} (on homogeneous inputs)",
        precision=prec,
        size=lambda x: base_size(lift(x)),
    )
    diagnostics = {k: val for k, val in inner.diagnostics.items() if not k.startswith(("verify_", "n_verify"))}
    diagnostics.update(n_bias_queries=n_bias, identifiable="W[:d, :], v")
    diagnostics["n_requeries"] = int(diagnostics.get("n_requeries", 0)) + n_re
    message = (
        f"with biases: v0, v and the score bias w from {n_bias} queries, then "
        + inner.message
        + "; last row of W~ set to 0"
    )
    return build(
        LowRankRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=W_full,
        v=v_full,
        rank=inner.rank,
        method=inner.method,
        precision=prec,
    )
