"""The rank-one projection measurements of §5: sizes, limits and :func:`measure_bilinear` (private).

Re-exported by :mod:`companion.lowrank`; read the package's docstring first.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logit

from .._streaming import answer_rop
from .._validation import as_float_array, check_choice, check_int, check_real
from ..errors import (
    InvalidInputError,
    OracleInconsistentError,
)
from ..exact import SATURATION, remeasure_saturated
from ..numerics.rop import design_product

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


def nuclear_max_bytes() -> int:
    """``companion.lowrank.NUCLEAR_MAX_BYTES`` as it is now: read from the package at each call, so
    that a user who raises the package's attribute (as documented) raises the limit every check uses."""
    import sys

    return int(sys.modules[__package__].NUCLEAR_MAX_BYTES)


LOWRANK_MESSAGES = {
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
    limit = nuclear_max_bytes()
    if size["bytes"] > limit:
        raise InvalidInputError(
            LOWRANK_MESSAGES["nuclear_too_big"].format(
                learner=learner,
                d=d,
                m=m,
                r=r,
                entries=size["entries"],
                gb=size["bytes"] / 1e9,
                per=NUCLEAR_BYTES_PER_ENTRY,
                limit=limit / 1e9,
            )
        )
    return size


def invert_rop(y, av, bv, c):
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
    T, alpha = invert_rop(y, av, bv, c0)
    C = np.full(m, c0)
    n_requeries = 0
    if auto:

        def measure(idx, c):
            y_idx = answer_rop(
                oracle, A, B, c, rows=idx if rows is None else rows[idx], cols=idx if cols is None else cols[idx]
            )
            return invert_rop(y_idx, av[idx], bv[idx], c)

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
