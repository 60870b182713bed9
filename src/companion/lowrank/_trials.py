"""Phase transitions and scale runs of the §5 learners (private; the chapter's and benchmarks' tools)."""

from __future__ import annotations

import numpy as np

from .._validation import check_choice, check_int, check_real
from ..errors import (
    InvalidInputError,
    NotIdentifiableError,
    SolverError,
)
from ._learn import (
    learn_low_rank,
)
from ._measure import (
    degrees_of_freedom,
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
    from ..attention import random_single_head
    from ..oracles import ValueQueryOracle

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
    from .._sweep import run_sweep

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
    ``learn_low_rank(..., method="sketch", oversample=0)`` (the floor ``d + r(2d - r)`` learning
    queries, plus re-measurements of saturated weights; its verification's queries counted apart). The
    oracle times its own calls, so ``oracle_s`` is the time the oracle alone spends answering exactly the
    learner's queries (its verification's included), measured side by side with the learner's total
    ``learner_s``. With ``memory``, a second, identical run under ``tracemalloc`` gives the
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
        ``d``, ``r``, ``queries`` (the learning queries, ``Recovery.n_learning_queries``), ``verify_queries``
        (every other query: the verification's on fresh queries and, where the learner measures the answers'
        precision, those queries too, as in ``diagnostics["n_verify_queries"]``), ``floor``, ``rel_error_W``
        (against ``W = K^T Q``, formed for the check only), ``learner_s``, ``oracle_s`` (the oracle's time for all
        of them), ``ratio`` and, with ``memory``, ``peak_bytes``.

    Examples
    --------
    >>> row = scaling_point(64, 2, seed=0, memory=False)
    >>> row["queries"] >= row["floor"] == 64 + degrees_of_freedom(64, 2), row["rel_error_W"] < 1e-10
    (True, True)
    >>> row["verify_queries"]  # learn_low_rank's default verify (no precision measured at this d)
    32
    """
    import time
    import tracemalloc

    from ..attention import random_single_head
    from ..oracles import ValueQueryOracle

    d = check_int(d, "d", minimum=1)
    r = check_int(rank, "rank", minimum=1, maximum=d, maximum_name="d")
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
            "queries": rec.n_learning_queries,
            "verify_queries": rec.n_queries - rec.n_learning_queries,
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
