"""The entry point :func:`learn_low_rank`: options, plan, the method's stages, the result (private)."""

from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np
from scipy.special import logit

from .._learner import (
    QueryCount,
    DEFAULT_VERIFY,
    AnswerPrecision,
    OracleView,
    build,
    check_verify,
    head_check_size,
    reserve,
    suggests_bias,
    verify_head,
    verify_outputs,
)
from .._validation import check_choice, check_int, check_real
from ..errors import (
    MESSAGES,
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
    SolverError,
)
from ..exact import SATURATION, check_exact_oracle, read_value_vector
from ..numerics.rgn import solve_rgn
from ..numerics.rop import gaussian_rop_design
from ..recovery import Recovery
from ._measure import (
    LOWRANK_MESSAGES,
    DEFAULT_OVERSAMPLING,
    METHODS,
    nuclear_max_bytes,
    check_nuclear_size,
    measure_bilinear,
    nuclear_program_size,
)
from ._nuclear import (
    solve_nuclear,
)
from ._sketch import (
    sketch_cross,
)


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
        ``"rgn"``: the same measurements, Riemannian Gauss-Newton from a spectral start. Its cost has
        a measured floor of about 9 times the oracle's own CPU time at d = 1024, r = 32 (the
        conjugate-gradient iterations alone cost about 6 oracle-times; ``benchmarks/bench_noisy_scale.py``
        guards it at 10 times): for exact answers the sketch is the scalable route (1.85 times the
        oracle's own time at that size, ``benchmarks/bench_scale.py``); ``"rgn"`` is for a fixed
        budget of Gaussian measurements.
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
        singular value as zero below the rounding level of the core (see ``sketch_cross``), measured
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
        float32 or coarser rounding (stated, or measured after the failure with 32 queries): the
        exact fit cannot hold, and the message names the rounding and ``method='sketch'``, and says
        that it cannot rule out too few measurements or a larger rank. Not for ``"rgn"`` when its
        residual exceeds ``RGN_ROUNDING_UNITS`` times the answers' ``u``, which rounding does not
        explain: its ``SolverError`` then stands, saying so.

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
    >>> from companion.lowrank import degrees_of_freedom, learn_low_rank
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
    options = dict(
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
    )
    if bias:
        return _learn_low_rank_biased(oracle, rank, options, verify=verify, verify_rtol=verify_rtol)
    plan = _plan(d, rank, verify=verify, verify_rtol=verify_rtol, **options)
    start = reserve(oracle, plan.planned + plan.verify, "learn_low_rank")
    count = QueryCount(oracle)
    prec = AnswerPrecision(oracle, precision, seed=plan.seed + 2)
    if plan.method == "sketch":  # its rank cut and saturation band follow u: measure it first
        prec.measure_first(plan.planned + plan.verify, always=plan.r is None)  # a detected rank is decided once
    with count.stage("v"):
        v = read_value_vector(oracle)
    if not np.any(v):
        raise NotIdentifiableError(MESSAGES["v_zero"])
    fit = _METHOD_STAGES[plan.method](oracle, v, plan, np.random.default_rng(plan.seed), prec, count)
    diagnostics = dict(fit.diagnostics)
    U, s, Vt, sv = _sign_normalised_svd(fit.W, max(fit.rank, 0), factors=diagnostics.pop("factors", None))
    diagnostics.update(singular_values=sv, factor_U=U, factor_s=s, factor_Vt=Vt)
    message = plan.chosen + f"recovered a rank-{fit.rank} W and v from {d} + {count.total - d} value queries: {fit.how}"
    if diagnostics.get("n_requeries"):
        what = "re-measurements of saturated queries" + (
            # the sketch's probe scale and core noise level for answers coarser than float64 (_sketch.py)
            ", the probes' scale and the noise level of coarse answers" if prec.coarse else ""
        )
        message += f", including {diagnostics['n_requeries']} further queries ({what})"
    kappa_W = diagnostics.pop("kappa_W", 0.0)
    checked = _verify_low_rank(oracle, fit.W, v, plan, prec, kappa_W, fit.rank, diagnostics)
    if plan.method == "nuclear" and plan.verify:
        _check_nuclear_rank(sv, plan.r, d, plan.m, plan.rank_tol, checked)
    if plan.method == "sketch":
        message = prec.report_floor(diagnostics, message, kappa_W)
    return build(
        LowRankRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=fit.W,
        v=v,
        rank=int(fit.rank),
        method=plan.method,
        precision=prec,
    )


@dataclass(frozen=True)
class _Plan:
    """The checked options of one :func:`learn_low_rank` run, and the queries it plans.

    ``method`` is the method that runs (``"auto"`` resolved; ``chosen`` opens the message when it
    was), ``r`` the rank bound (None: detect it, sketch only), ``m`` the Gaussian measurements
    (None for the sketch) and ``planned`` the learning queries (``d + m``, or ``d + k (2d - k)``).
    """

    method: str
    chosen: str
    r: int | None
    m: int | None
    planned: int
    oversample: int
    rank_tol: float
    scale: str | float
    solver_eps: float
    max_iter: int
    tol: float
    verify: int
    verify_rtol: float
    seed: int


@dataclass(frozen=True)
class _Fit:
    """What a method's stage hands on: ``W`` (d, d), its rank, its diagnostics, and how it was measured."""

    W: np.ndarray
    rank: int
    diagnostics: dict
    how: str


def _plan(
    d,
    rank,
    *,
    method,
    n_measurements,
    oversample,
    rank_tol,
    scale,
    solver_eps,
    max_iter,
    tol,
    verify,
    verify_rtol,
    seed,
    precision,
) -> _Plan:
    """Stage 1 of :func:`learn_low_rank`: check every option, resolve ``"auto"``, count the queries.

    Raises before any query: :class:`InvalidInputError` for a bad option (or a nuclear program over
    ``NUCLEAR_MAX_BYTES``), :class:`NotIdentifiableError` for fewer measurements than degrees of
    freedom. ``precision`` is checked by :class:`~companion._learner.AnswerPrecision`.
    """
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
        r = check_int(rank, "rank", minimum=1, maximum=d, maximum_name="d")
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
    m, planned = _plan_queries(d, r, method, n_measurements, oversample)
    return _Plan(
        method, chosen, r, m, planned, oversample, rank_tol, scale, solver_eps, max_iter, tol, verify, verify_rtol, seed
    )


def _plan_queries(d, r, method, n_measurements, oversample) -> tuple:
    """``(m, planned)``: the Gaussian measurements (None for the sketch) and the learning queries.

    Raises :class:`InvalidInputError` for ``n_measurements`` with the sketch or a nuclear program
    over the memory limit, :class:`NotIdentifiableError` for ``m < r (2d - r)``.
    """
    if method == "sketch":
        if n_measurements is not None:
            raise InvalidInputError(
                f"n_measurements={n_measurements!r} is not used by method='sketch', whose cross of "
                "k = rank + oversample rows and columns fixes d + k(2d - k) queries; use "
                "oversample instead."
            )
        k = min(d, r + oversample) if r else 0
        return None, d + k * (2 * d - k)
    dof = r * (2 * d - r)
    if n_measurements is None:
        m = int(math.ceil(DEFAULT_OVERSAMPLING[method] * dof))
    else:
        m = check_int(n_measurements, "n_measurements", minimum=1)
    if m < dof:
        k = min(d, r + 1)
        raise NotIdentifiableError(
            LOWRANK_MESSAGES["too_few"].format(m=m, r=r, d=d, dof=dof, sketch=d + k * (2 * d - k))
        )
    if method == "nuclear":
        check_nuclear_size(d, m, r, "learn_low_rank")
    return m, d + m


def _sketch_stage(oracle, v, plan, rng, prec, count) -> _Fit:
    """The sketch's stage: the cross of :func:`~._sketch.sketch_cross`; counts its measurements.

    ``n_measurements`` is the stage's queries less its re-measurements and any precision queries
    the stage spent (:meth:`AnswerPrecision.measure` after a failed rank check).
    """
    before = prec.n_queries
    with count.stage("sketch"):
        W, info = sketch_cross(
            oracle, v, plan.r, oversample=plan.oversample, rank_tol=plan.rank_tol, scale=plan.scale, rng=rng, prec=prec
        )
    info = dict(info, n_measurements=count["sketch"] - info["n_requeries"] - (prec.n_queries - before))
    how = f"a cross of {info['cross_size']} rows and columns" + (
        f", rank {info['rank_detected']} detected" if plan.r is None else ""
    )
    return _Fit(W, int(info["rank_used"]), info, how)


def _gaussian_stage(solve):
    """A Gaussian-ROP method's stage: measure ``m`` rank-one projections, then ``solve`` them."""

    def stage(oracle, v, plan, rng, prec, count) -> _Fit:
        d, m = len(v), plan.m
        # rgn solves in float32: its design is drawn in float32 (the same draws, rounded), which
        # the solver uses as it is, with no float64 copy (half the memory and its page faults)
        A, B = gaussian_rop_design(d, m, v, rng, dtype=np.float32 if plan.method == "rgn" else np.float64)
        with count.stage("measure"):
            try:
                t, info = measure_bilinear(oracle, A, B, v, scale=plan.scale)
            except OracleInconsistentError as err:
                _name_saturation_rounding(err, prec)
                raise
        diagnostics = dict(n_measurements=m, n_requeries=info["n_requeries"], max_abs_logit=info["max_abs_logit"])
        try:
            W, sinfo = solve(A, B, t, plan)
        except SolverError as err:
            _name_rounding(err, prec, plan.method)
            raise
        diagnostics.update(sinfo)
        return _Fit(W, plan.r, diagnostics, f"{m} Gaussian rank-one projections ({plan.method})")

    return stage


def _solve_nuclear_stage(A, B, t, plan):
    """``"nuclear"``: the convex program of Theorems 5.1 / 5.2 (cvxpy, SCS at ``solver_eps``)."""
    return solve_nuclear(A, B, t, eps=plan.solver_eps)


def _solve_rgn_stage(A, B, t, plan):
    """``"rgn"``: Riemannian Gauss-Newton; :class:`SolverError` above the residual ``max(1e3 tol, 1e-8)``."""
    W, sinfo = solve_rgn(A, B, t, plan.r, max_iter=plan.max_iter, tol=plan.tol)
    if sinfo["residual"] > max(1e3 * plan.tol, 1e-8):
        dof = plan.r * (2 * A.shape[1] - plan.r)
        err = SolverError(
            LOWRANK_MESSAGES["rgn_failed"].format(
                it=sinfo["iterations"], res=sinfo["residual"], m=plan.m, C=plan.m / dof, r=plan.r
            )
        )
        err.residual = float(sinfo["residual"])  # for _name_rounding: rounding explains a small one only
        raise err
    return W, sinfo


#: ``method=`` of :func:`learn_low_rank` -> its stage ``(oracle, v, plan, rng, prec, count) -> _Fit``.
_METHOD_STAGES = {
    "nuclear": _gaussian_stage(_solve_nuclear_stage),
    "rgn": _gaussian_stage(_solve_rgn_stage),
    "sketch": _sketch_stage,
}


def _verify_low_rank(oracle, W, v, plan, prec, kappa_W, r_out, diagnostics):
    """The final stage: :func:`verify_head` on fresh queries; a sketch whose ``rank_tol`` cut real
    singular values is refused with a message naming ``rank_tol`` (:func:`_rank_tol_cut`)."""
    cut = diagnostics.pop("rank_tol_cut", None)
    try:
        return verify_head(
            oracle,
            W,
            v,
            plan.verify,
            rtol=plan.verify_rtol,
            seed=plan.seed + 1,
            what=f"a single head with rank(W*) <= {r_out} recovered by {plan.method!r}",
            precision=prec,
            size=head_check_size(W, v, kappa_W, 1.0),
            floor=lambda u: kappa_W * u,
            measure_if_coarse=plan.method == "sketch",
        )
    except OracleInconsistentError as err:
        if cut is not None and cut.size:
            exc = OracleInconsistentError(_rank_tol_cut(err, cut, plan.rank_tol, r_out, diagnostics, plan.verify))
            exc.max_error, exc.tolerance = err.max_error, err.tolerance
            raise exc from err
        raise


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
        r = check_int(rank, "rank", minimum=1, maximum=d, maximum_name="d")
        m = (
            int(math.ceil(DEFAULT_OVERSAMPLING["nuclear"] * r * (2 * d - r)))
            if n_measurements is None
            else check_int(n_measurements, "n_measurements", minimum=1)
        )
    except InvalidInputError:
        return "nuclear", ""
    gb = nuclear_program_size(d, m)["bytes"] / 1e9
    limit = nuclear_max_bytes()
    if gb * 1e9 <= limit:
        return "nuclear", (
            f"method='auto' chose 'nuclear' (the paper's program, about {gb:.2g} GB, fits "
            f"NUCLEAR_MAX_BYTES = {limit / 1e9:.2g} GB); "
        )
    other = "sketch" if n_measurements is None else "rgn"
    return other, (
        f"method='auto' chose {other!r}: the paper's nuclear-norm program would need about {gb:.2g} GB "
        f"at d = {d}, above NUCLEAR_MAX_BYTES = {limit / 1e9:.2g} GB (pass method='nuclear' "
        "and raise that limit to run it); "
    )


#: ``method="rgn"``'s relative residual on answers rounded at ``u``, for heads of the class (this book's,
#: measured 2026-12-05: d = 10 to 32, r = 2 to 4, seeds 0 to 2): 15 u to 118 u at float32, 12 u to 67 u at
#: bfloat16. A residual above this many u is not the rounding's (an adversarial tester's case: rank 2
#: assumed of a full-rank head at float32, residual 0.349 = 5.9e6 u, had been blamed on the rounding).
RGN_ROUNDING_UNITS = 1e3


def _name_saturation_rounding(err, prec):
    """Raise :class:`PrecisionError` if coarse answers explain weights that stayed saturated (``err``).

    A weight re-measured at a smaller scale ``c`` is read from ``y / c``, whose rounding grows as ``c`` shrinks: at
    bfloat16 (``u = 2**-8``) a Keras layer's weights stayed outside the band after 40 re-measurements, and the
    learner said "the oracle does not behave like a softmax head" (an outside reader, 2026-12-05). The precision is
    the oracle's stated one, or measured now (32 queries); float64 answers, or no budget left, leave ``err``.
    """
    if "stayed saturated" not in str(err):
        return
    if not prec.ensure_known():
        return
    if prec.rounding or prec.noise:  # as companion._learner.names_rounding judges: COARSE_FACTOR times float64's
        raise PrecisionError(
            f"{err.args[0].split(';')[0]}, and {prec.describe()}: a weight re-measured at a smaller scale is read "
            "from the answer divided by that scale, whose rounding keeps it out of the band, so the rounding alone "
            "explains it; this refusal is not a verdict on the target. Serve the model at float32 or finer (then "
            "method='sketch'), or use companion.robust.learn_low_rank_noisy with tau at the answers' rounding."
        ) from err


def _name_rounding(err, prec, method):
    """Raise :class:`PrecisionError` if answers rounded to float32 or coarser explain ``err``.

    ``"nuclear"`` (an equality-constrained program) and ``"rgn"`` (stopped at a relative residual of
    ``max(1e3 tol, 1e-8)``) fit the measurements exactly; answers with relative rounding ``u`` make
    them inconsistent at about ``u`` times the measurements' condition, which neither program
    allows. The precision is the oracle's stated one, or measured now (32 queries, counted like
    verification). Returns (``err`` stands) for float64 answers or when no budget is left.
    """
    if not prec.ensure_known():
        return
    residual = getattr(err, "residual", None)
    if prec.rounding and residual is not None and residual > RGN_ROUNDING_UNITS * prec.value:
        err.args = (
            f"{err} Not the rounding: {prec.describe()}, and the relative residual {residual:.3g} is "
            f"{residual / prec.value:.2g} u, where rounding left at most 118 u on heads of the class "
            f"(measured; this learner blames the rounding up to RGN_ROUNDING_UNITS = {RGN_ROUNDING_UNITS:g} u).",
        )
        return
    if prec.rounding or prec.noise:
        raise PrecisionError(
            f"method={method!r} refused, and {prec.describe()}: it fits the rank-one projections "
            "exactly (as an equality-constrained program or to a residual of 1e-8), which rounded "
            "answers make inconsistent, so the rounding alone makes it refuse; this refusal cannot "
            "rule out too few measurements or a rank above the assumed one as well. Use "
            "method='sketch' (it measures the rounding level of its cross and reports the attainable "
            "error), or companion.robust.learn_low_rank_noisy with tau at the answers' rounding (u "
            f"times their size). ({str(err).split(': ')[0]}.)"
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
        determined = (
            LOWRANK_MESSAGES["determined"].format(m=m, d2=d * d, exact=d + d * d, ours=d + m) if m >= d * d else ""
        )
        raise OracleInconsistentError(
            LOWRANK_MESSAGES["nuclear_rank"].format(
                r=r, n=checked["n_verify_queries"], i=r + 1, err=sv[r] / sv[0], tol=tol, determined=determined
            )
        )


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
    from ..attention import SingleHead
    from ..exact import probe_matrix

    d = int(oracle.d)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    start = reserve(oracle, 2 * d + 1 + verify, "learn_low_rank")
    count = QueryCount(oracle)
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
    n_bias = count.total  # v0, v and the score bias w, with their re-measurements
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
