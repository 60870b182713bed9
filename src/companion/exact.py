"""Exact recovery of one attention head from d + d² value queries (Theorem 4.1).

Two kinds of query suffice:

1. Length 1, ``X = [e_i^T]``: the softmax of one score is 1, so ``VQ(X) = v_i``.
2. Length 2, ``X = c [(u + e_j)^T; e_j^T]`` for a probe ``u``: by the two-token identity
   ``f([a^T; x^T]) = x^T v + sigma(a^T W x - x^T W x) (a^T v - x^T v)`` the answer is
   ``y = c (v_j + sigma(c^2 u^T W e_j) u^T v)``, so
   ``u^T W e_j = sigma^{-1}((y / c - v_j) / u^T v) / c^2``.

``d`` linearly independent probes with ``u^T v != 0`` give column ``j`` of ``W`` by one linear
solve. The paper's queries have ``c = 1``; the scale ``c`` (the score is bilinear in the tokens,
so the logit scales by ``c^2`` while the answer scales by ``c``) keeps the sigmoid away from 0 and
1 for targets with a large ``W``, where ``c = 1`` would leave only a bound on the logit.

Layer: one of the paper's sections (§4), above the skeleton (``_learner``) and the shared
numerics: the length-2 queries are rank-one projections with ``b = e_j``
(:func:`companion.numerics.rop.rop_queries`), and the Gaussian probes are redrawn by the same rule
as the ROP design. Its own helpers (:func:`read_value_vector`, :func:`invert_two_token`,
:func:`remeasure_saturated`) serve every learner that inverts the sigmoid.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack, lu_factor, lu_solve
from scipy.special import expit, logit

from ._streaming import chunk_queries
from ._validation import check_choice, check_int, check_real
from ._learner import (
    BEST_LOGIT,
    DEFAULT_VERIFY,
    AnswerPrecision,
    OracleView,
    best_relative_scale,
    build,
    check_verify,
    head_check_size,
    reserve,
    saturation_band,
    verify_head,
    suggests_bias,
    verify_outputs,
)
from .attention import SingleHead
from .errors import MESSAGES, InvalidInputError, NotIdentifiableError, OracleInconsistentError
from .numerics.rop import _redraw_small, rop_queries
from .recovery import Recovery

__all__ = [
    "learn_single_head",
    "read_value_vector",
    "probe_matrix",
    "column_queries",
    "invert_two_token",
    "verify_single_head",
    "remeasure_saturated",
    "check_exact_oracle",
    "TokenPart",
    "sweep",
    "sweep_point",
    "SATURATION",
    "GAUSSIAN_PROBE_FLOOR",
]

#: An attention weight outside [SATURATION, 1 - SATURATION] is re-measured at a smaller scale.
SATURATION = 1e-3
_MAX_ROUNDS = 40  # each round shrinks the logit at least 6.9-fold
#: Gaussian probes with ``|u^T v|`` below this multiple of ||v|| / sqrt(d) are redrawn (probe_matrix).
GAUSSIAN_PROBE_FLOOR = 0.1
_BLIND_SHRINK = 1 / 64  # factor on c^2 when sigma^-1 gave no estimate (alpha rounded to 0 or 1)


def check_exact_oracle(oracle, learner: str) -> int:
    """Return ``oracle.d``; raise TypeError if the oracle is not exact (``tau > 0``) or not an oracle."""
    if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
        raise TypeError(
            f"{learner} needs a value-query oracle (callable, with attributes d and n_queries), "
            f"got {type(oracle).__name__}; wrap the model in companion.oracles.ValueQueryOracle."
        )
    tau = getattr(oracle, "tau", 0.0)
    if tau:
        raise TypeError(MESSAGES["needs_exact"].format(learner=learner, cls=type(oracle).__name__, tau=tau))
    return int(oracle.d)


def read_value_vector(oracle) -> np.ndarray:
    """Read ``v`` off ``d`` length-1 queries ``[e_i^T]`` (Theorem 4.1, step 1).

    Returns
    -------
    ndarray of shape (d,)
        ``VQ([e_i^T])`` for ``i = 1 .. d``.
    """
    d = int(oracle.d)
    n = chunk_queries(d, 1)
    v = np.empty(d)
    X = np.zeros((min(n, d), 1, d))
    for i0 in range(0, d, n):  # in chunks: no d x d identity at large d
        i1 = min(d, i0 + n)
        X[np.arange(i1 - i0), 0, np.arange(i0, i1)] = 1.0
        v[i0:i1] = oracle(X[: i1 - i0])
        X[np.arange(i1 - i0), 0, np.arange(i0, i1)] = 0.0
    return v


def probe_matrix(v, probes="basis", *, seed=0) -> np.ndarray:
    """Probe vectors ``u_l`` (rows) with ``u_l^T v != 0`` and full rank (Theorem 4.1, step 3).

    Parameters
    ----------
    v : ndarray of shape (d,)
        The value vector, nonzero.
    probes : {"basis", "gaussian"}, default="basis"
        ``"basis"``: ``u_l = e_l``, replaced by ``e_l + e_p`` (``p = argmax |v|``) when ``v_l = 0``
        (the paper's rule) and, for precision, whenever ``|v_l| < |v_p| / 2``, so that
        ``|u_l^T v| >= |v_p| / 2`` for every probe. ``"gaussian"``: rows i.i.d. ``N(0, I_d / d)``;
        a row with ``|u^T v| < GAUSSIAN_PROBE_FLOOR ||v|| / sqrt(d)`` (0.1) is redrawn (no query is
        spent on it): about ``erf(0.1 / sqrt(2))`` = 8 % of rows, a departure from the paper's
        ``N(0, I_d)`` that keeps the denominator ``u^T v`` away from 0.
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for ``"gaussian"``.

    Returns
    -------
    ndarray of shape (d, d)
        The probes as rows.
    """
    v = np.asarray(v, dtype=np.float64)
    d = v.shape[0]
    check_choice(probes, "probes", ("basis", "gaussian"))
    if probes == "basis":
        p = int(np.argmax(np.abs(v)))
        U = np.eye(d)
        small = np.abs(v) < 0.5 * np.abs(v[p])
        U[small, p] += 1.0
        return U
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    return _redraw_small(rng.standard_normal((d, d)) / np.sqrt(d), v, GAUSSIAN_PROBE_FLOOR, rng)


def column_queries(U, j, c) -> np.ndarray:
    """The length-2 queries ``c_l [(u_l + e_j)^T; e_j^T]`` for column ``j``.

    Parameters
    ----------
    U : ndarray of shape (k, d)
        Probes as rows.
    j : int
        Column index, ``0 <= j < d``.
    c : float or ndarray of shape (k,)
        Scale of each query.

    Returns
    -------
    ndarray of shape (k, 2, d)
    """
    k, d = U.shape
    return rop_queries(U, np.broadcast_to(np.eye(1, d, j), (k, d)), c)  # the ROP with b = e_j


def invert_two_token(y, v_j, uv, c):
    """Solve ``y = c (v_j + sigma(t) u^T v)`` for the logit ``t`` and the attention weight.

    Parameters
    ----------
    y : ndarray of shape (k,)
        Oracle answers to :func:`column_queries`.
    v_j : float
        Entry ``j`` of the value vector.
    uv : ndarray of shape (k,)
        ``u_l^T v`` for each probe.
    c : float or ndarray of shape (k,)
        The query scales.

    Returns
    -------
    t : ndarray of shape (k,)
        ``sigma^{-1}(alpha)``, which equals ``c^2 u_l^T W e_j``.
    alpha : ndarray of shape (k,)
        The attention weight ``(y / c - v_j) / u^T v`` on the first token.
    """
    alpha = (np.asarray(y) / c - v_j) / uv
    with np.errstate(divide="ignore", invalid="ignore"):
        return logit(alpha), alpha


def remeasure_saturated(measure, t, alpha, c, *, band=SATURATION, what="softmax head"):
    """Re-measure, at smaller query scales, every measurement whose attention weight is saturated.

    A weight outside ``[band, 1 - band]`` leaves ``sigma^{-1}`` imprecise (or undefined at 0 and 1).
    Scaling a two-token query by ``c`` scales its logit by ``c^2`` (the score is bilinear), so each
    saturated measurement is asked again with ``c^2`` divided by its estimated ``|t|`` (which lands
    near ``|t| = 1``), or by 64 when the weight rounded to 0 or 1 and gave no estimate.

    Parameters
    ----------
    measure : callable
        ``measure(idx, c_idx) -> (t_idx, alpha_idx)`` asks the queries of the measurements ``idx``
        at scales ``c_idx`` and inverts them (e.g. with :func:`invert_two_token`).
    t, alpha, c : ndarray of shape (k,)
        Measured logits, weights and current scales; updated in place (views are fine).
    band : float, default=SATURATION
        Weights outside ``[band, 1 - band]`` are re-measured.
    what : str
        The model the oracle is assumed to be, for the error message.

    Returns
    -------
    int
        Number of re-measurements, i.e. extra queries.

    Raises
    ------
    OracleInconsistentError
        If weights are still saturated after 40 rounds: the oracle does not behave like a
        ``what``.
    """
    n = 0
    for _ in range(_MAX_ROUNDS + 1):
        sat = np.flatnonzero(~((alpha >= band) & (alpha <= 1.0 - band)))
        if sat.size == 0:
            return n
        if _ == _MAX_ROUNDS:
            break
        t_sat = np.abs(t[sat])
        shrink = np.where(
            np.isfinite(t_sat) & (alpha[sat] > 0) & (alpha[sat] < 1), 1.0 / np.maximum(t_sat, 1.0), _BLIND_SHRINK
        )
        c[sat] *= np.sqrt(shrink)
        t[sat], alpha[sat] = measure(sat, c[sat])
        n += sat.size
    raise OracleInconsistentError(
        f"{sat.size} attention weights stayed saturated after {_MAX_ROUNDS} re-measurements; "
        f"the oracle does not behave like a {what}."
    )


def verify_single_head(oracle, W, v, n, *, rtol=1e-6, scale=1.0, seed=0):
    """Compare the oracle with the head ``(W, v)`` on ``n`` fresh random queries.

    Queries have random lengths 1 to 8 and tokens ``N(0, scale^2 I_d / d)``. The disagreement on a
    query is ``|VQ(X) - f_{W,v}(X)|`` divided by the output scale ``max_i |x_i^T v|``.

    Returns
    -------
    float
        The largest relative disagreement.

    Raises
    ------
    OracleInconsistentError
        If it exceeds ``rtol``: the oracle is not the single head ``(W, v)``.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import SingleHead
    >>> from companion.oracles import ValueQueryOracle
    >>> head = SingleHead(np.eye(2), np.array([1.0, -1.0]))
    >>> verify_single_head(ValueQueryOracle(head), head.W, head.v, 5)
    0.0
    """
    n = check_int(n, "n", minimum=1)
    try:
        info = verify_head(
            oracle,
            W,
            v,
            n,
            rtol=rtol,
            seed=seed,
            scale=scale,
            what="a single attention head",
        )
    except OracleInconsistentError as exc:
        raise OracleInconsistentError(f"the oracle is not a single attention head: {exc}") from None
    return info["verify_max_error"]


_BIAS_ADVICE = "Pass bias=True to learn it on homogeneous tokens (x, 1)."


@suggests_bias(_BIAS_ADVICE)
def learn_single_head(
    oracle,
    *,
    probes="basis",
    scale="auto",
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
    precision=None,
    bias=False,
):
    """Recover the merged parameters (W, v) of one attention head from exact value queries.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for :math:`f_{W^*, v^*}` with ``d = oracle.d``. It must answer sequences of
        length 1 and 2 (and 1 to 8 with ``verify``); its budget, if set, must allow
        ``d + d**2 + verify`` queries.
    probes : {"basis", "gaussian"}, default="basis"
        Deterministic probes (Theorem 4.1, step 3) or i.i.d. Gaussian probes; see
        :func:`probe_matrix`.
    scale : "auto" or float, default="auto"
        Scale ``c`` of the length-2 queries. ``"auto"`` starts at ``c = 1`` (the paper's queries) and
        re-measures, at a smaller ``c``, every probe whose attention weight falls outside
        ``[SATURATION, 1 - SATURATION]`` = [0.001, 0.999], where ``sigma^{-1}`` loses precision.
        **Each re-measurement is one extra query**, counted by the oracle and reported in
        ``diagnostics["n_requeries"]``; a head with moderate logits (``|u^T W e_j| < 6.9``) needs
        none. A float fixes ``c`` and never re-measures.
    verify : int, default=32
        Number of fresh random queries (lengths 1 to 8, never used for learning) on which the
        recovered head is compared with the oracle (:func:`verify_single_head`); 0 opts out.
        Theorem 4.1 assumes that the oracle *is* a single softmax head; the check turns a target
        outside that class (several heads, a Transformer, a mask) into an error instead of a wrong
        ``W``.
    verify_rtol : float, default=1e-6
        Largest relative disagreement accepted by the check.
    seed : int, default=0
        Seed of the Gaussian probes and of the verification queries.
    precision : None, "measure", str or float, default=None
        The relative rounding ``u`` of the answers (this book's, for served models): a format
        (``"float32"``, ``"bfloat16"``, ...) or a float; ``"measure"`` measures it first
        (:func:`companion.oracles.measure_precision`, 32 queries, 48 for quantized answers,
        counted with the verification);
        ``None`` takes the oracle's stated ``precision``, else measures it first where that costs
        at most 2 % of the planned queries (``d >= 49``), else assumes float64 and measures it
        only if the verification fails. A known ``u`` coarser than float64's (i) widens the
        saturation band to :func:`companion._learner.saturation_band`, (ii) with
        ``scale="auto"``, sets one probe scale for relative rounding from the first column
        (:func:`companion._learner.best_relative_scale`; that column is asked again: ``d``
        queries, in ``diagnostics["n_scale_queries"]`` and in ``n_requeries``), and (iii) sets
        the verification tolerance to ``size(X) * u``
        (:func:`companion._learner.head_check_size`) where that exceeds ``verify_rtol``.
    bias : bool, default=False
        ``True``: the model has biases (query, key, value or output; this book's extension). It is
        learned as a head on homogeneous tokens ``x~ = (x, 1)`` in ``d + 1`` dimensions from
        ``(d + 1)**2`` queries whose token parts the oracle answers (see Notes), with the same
        saturation band and verification but no probe scale for relative rounding (step (ii) of
        ``precision``: its logits are not ``c^2`` times one value), so on coarse answers its
        ``floor_W`` underestimates the error more (an outside reader, 2026-12-05, a Keras layer served
        in float32, d = 16, seeds 0 to 9: the error was 8.7 to 19.4 times ``floor_W``, against 1.6 to
        18.2 without biases); ``W`` is then ``(d + 1, d + 1)`` with a zero last row
        and ``v`` is ``(d + 1,)``, its last entry the constant offset ``v0``. A bias-free run that
        fails while the oracle answers a single zero token with a nonzero value (a bias-free head
        answers 0) says so and suggests ``bias=True``.

    Returns
    -------
    Recovery
        ``W`` of shape (d, d), ``v`` of shape (d,); ``n_queries`` equals ``d + d**2`` plus
        re-measurements, the precision measurement's queries (``n_precision_queries``, where ``u`` is
        measured) and ``verify`` (``n_learning_queries`` leaves out the last two).
        Precision diagnostics: ``precision`` (the ``u`` used), ``precision_source``,
        ``precision_format``, ``n_precision_queries``, ``precision_kind`` (what a measurement
        found: rounding, noise, outside the class), ``floor_W`` and ``floor_v`` (the relative
        errors one rounding ``u`` of every answer causes at the best probe scale: the attainable
        accuracy, see Notes), ``kappa_W`` (``floor_W / u``, the conditioning).
        ``diagnostics`` holds ``probes`` (the probe matrix
        ``(d, d)``), ``cond_probes`` (LAPACK's estimate of its 1-norm condition number), ``logits``
        (``(d, d)``: the measured
        ``c^2 u_l^T W e_j``, row ``l``, column ``j``), ``scales`` (``(d, d)``: each probe's final
        ``c``), ``n_requeries`` (the learning queries asked again, beyond ``d + d**2``),
        ``n_scale_queries`` (those of them that chose the probe scale for coarse answers),
        ``max_abs_logit``, ``n_verify_queries`` and, with ``verify``,
        ``verify_max_error`` and ``verify_tolerance``.

    Raises
    ------
    TypeError
        If ``oracle`` is approximate (``tau > 0``): use :func:`companion.robust.learn_robust`.
    InvalidInputError
        For an unknown ``probes``, a bad ``scale``, or a negative ``verify``.
    NotIdentifiableError
        If the recovered v is 0. Then f is identically 0 (with ``bias=True``: the constant
        ``v0``, the token part of ``v~`` being 0), and no query reveals W.
    BudgetExceededError
        If the budget is below ``d + d**2 + verify``: raised before the first query. Re-measurements
        beyond that raise when they would pass the budget.
    OracleInconsistentError
        If an attention weight stays saturated after 40 re-measurements, or the verification
        queries disagree with the recovered head (the oracle is not a single head); with
        ``bias=False`` and a nonzero answer to a single zero token, the message suggests
        ``bias=True``.

    Notes
    -----
    Theorem 4.1 of Bhattamishra et al. 2026 [1]_. Length-1 queries return v. For
    ``X = c [(u + e_j)^T; e_j^T]`` the output is ``c (v_j + sigma(c^2 u^T W e_j) u^T v)``, solved for
    ``u^T W e_j``; ``d`` probes give column ``j`` through one LU factorisation of the probe matrix,
    shared by all columns. The scale ``c`` is not in the paper (which takes ``c = 1``); it changes
    nothing in exact arithmetic and keeps full float64 precision when ``||W||`` is large.

    The floor (this book's): one relative rounding ``u |y|`` of the answer to probe ``l``, column
    ``j`` moves the measured ``u_l^T W e_j`` by ``e_lj = u |v_j + alpha u_l^T v| |L_lj| /
    (|u_l^T v| t* sigma'(t*))`` at the best logit ``t*``
    (:func:`companion._learner.best_relative_scale`), and the solve with the probes amplifies
    ``||E||_F`` by about ``||U^-1||_F / sqrt(d)``: ``floor_W = ||U^-1||_F ||E||_F /
    (sqrt(d) ||W||_F)``, conditioning times precision. ``v`` is read once: ``floor_v = u``.

    With ``bias=True`` (this book's): scores ``(W_q x_N + b_q)^T (W_k x_i + b_k)`` and values
    ``w_o^T (W_v x_i + b_v) + b_o`` are those of a bias-free head on ``x~ = (x, 1)``, whose
    ``W~ = [[W, w], [r^T, s]]``, ``v~ = (v, v0)``. The queries ``[0]`` and ``[e_i]`` give ``v0``
    and ``v``; ``[(c u, 1); (0, 1)]`` gives ``u^T w`` (``d`` queries); ``[(c (u + e_j), 1);
    (c e_j, 1)]`` gives ``c^2 u^T W e_j + c u^T w`` (``d^2``): ``(d + 1)^2`` in all, the number of
    identifiable unknowns. Every logit is a difference ``(x~_i - x~_N)^T W~ x~_N``, so the last
    row ``(r, s)`` never enters and is returned as 0. A saturated probe is asked again at ``c / 8``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_single_head(4, seed=0)
    >>> rec = learn_single_head(ValueQueryOracle(target))
    >>> rec.n_learning_queries, np.allclose(rec.W, target.W) and np.allclose(rec.v, target.v)
    (20, True)
    >>> rec.n_queries, rec.diagnostics["n_verify_queries"]      # d + d**2, plus 32 to verify
    (52, 32)

    A head with biases, learned on homogeneous tokens (a head in ``d + 1`` dimensions whose
    oracle sees only the token part):

    >>> from companion.attention import SingleHead
    >>> rng = np.random.default_rng(0)
    >>> biased = SingleHead(rng.standard_normal((5, 5)), rng.standard_normal(5))
    >>> oracle = ValueQueryOracle(lambda X: biased([np.c_[x, np.ones(len(x))] for x in X]), d=4)
    >>> rec = learn_single_head(oracle, bias=True)
    >>> rec.n_learning_queries, bool(np.allclose(rec.W[:4], biased.W[:4]))
    (25, True)
    """
    d = check_exact_oracle(oracle, "learn_single_head")
    check_choice(probes, "probes", ("basis", "gaussian"))
    auto = isinstance(scale, str)
    if auto:
        check_choice(scale, "scale", ("auto",))
        c0 = 1.0
    else:
        c0 = check_real(scale, "scale", minimum=0.0, strict=True)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if not isinstance(bias, (bool, np.bool_)):
        raise InvalidInputError(f"bias must be True or False; got {bias!r}.")
    if bias:
        return _learn_biased(
            oracle,
            d,
            probes=probes,
            c0=c0,
            verify=verify,
            verify_rtol=verify_rtol,
            seed=seed,
            precision=precision,
            learner="learn_single_head",
        )
    start = reserve(oracle, d + d * d + verify, "learn_single_head")
    prec = AnswerPrecision(oracle, precision, seed=seed + 2)
    prec.measure_first(d + d * d + verify)  # the probe scale and the saturation band follow u
    band = saturation_band(prec.value, SATURATION)

    # Step 1: v from d length-1 queries.
    v = read_value_vector(oracle)
    if not np.any(v):
        raise NotIdentifiableError(MESSAGES["v_zero"])

    # Step 3 (probes), then step 2 column by column, in batches of whole columns.
    U = probe_matrix(v, probes, seed=seed)
    uv = U @ v
    n_scale = 0
    if auto and prec.coarse:
        c0, n_scale = _relative_scale(oracle, U, v, uv, c0, band)
    T, C, n_re = _measure_columns(oracle, U, v, uv, c0, auto=auto, band=band)
    n_requeries = n_scale + n_re
    L = T / C**2  # L[l, j] = u_l^T W e_j
    lu = lu_factor(U)
    W = lu_solve(lu, L)
    rcond, _ = lapack.dgecon(lu[0], np.linalg.norm(U, 1), norm="1")  # LAPACK 1-norm estimate

    diagnostics = {
        "probes": U,
        "cond_probes": float(1.0 / rcond) if rcond > 0 else float("inf"),
        "logits": T,
        "scales": C,
        "n_requeries": n_requeries,
        "n_scale_queries": n_scale,
        "max_abs_logit": float(np.max(np.abs(T))),
    }
    kappa_W = probe_floor(U, lu, T, C, v, uv, W)
    extra = [f"{n_scale} queries that chose the probes' scale for the answers' relative rounding"] if n_scale else []
    extra += [f"{n_re} re-measurements of saturated probes"] if n_re else []
    message = f"recovered W and v from d + d^2 = {d + d * d} value queries (the algorithm of Theorem 4.1)" + "".join(
        f" and {part}" for part in extra
    )
    checked = verify_head(
        oracle,
        W,
        v,
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        scale=float(np.sqrt(np.median(C))),
        what="a single attention head (Theorem 4.1's assumption)",
        precision=prec,
        size=head_check_size(W, v, kappa_W, 1.0),
        floor=lambda u: kappa_W * u,
        measure_if_coarse=True,
    )
    message = prec.report_floor(diagnostics, message, kappa_W)
    return build(
        Recovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        precision=prec,
        W=W,
        v=v,
    )


def _relative_scale(oracle, U, v, uv, c0, band):
    """One probe scale for answers with relative rounding (a known coarse ``u``), from the first
    column at ``c0`` (asked again by :func:`_measure_columns`): ``(c, queries spent)``, ``c`` from
    :func:`~companion._learner.best_relative_scale` (``d`` queries and the re-measurements)."""
    d = U.shape[0]
    t0, a0 = invert_two_token(oracle(column_queries(U, 0, c0)), v[0], uv, c0)
    c_first = np.full(d, c0)
    n = d + remeasure_saturated(
        lambda idx, c: invert_two_token(oracle(column_queries(U[idx], 0, c)), v[0], uv[idx], c),
        t0,
        a0,
        c_first,
        band=band,
    )
    return best_relative_scale(t0 / c_first**2), n


def _measure_columns(oracle, U, v, uv, c0, *, auto, band):
    """Step 2 of Theorem 4.1, column by column in batches of whole columns: ``(T, C, n_requeries)``.

    ``T[l, j]`` is the measured logit ``c^2 u_l^T W e_j`` and ``C[l, j]`` its final scale ``c``;
    with ``auto`` a saturated probe is asked again at a smaller scale
    (:func:`remeasure_saturated`). Raises :class:`OracleInconsistentError` if a weight is outside
    ``(0, 1)`` (``sigma^{-1}`` undefined).
    """
    d = U.shape[0]
    T = np.empty((d, d))  # T[l, j] = measured logit c^2 u_l^T W e_j
    C = np.full((d, d), c0)  # C[l, j] = final scale c of that probe
    n_requeries = 0
    # One buffer of whole columns, reused: its first tokens hold c u_l, and only entry j of the
    # two tokens changes from column to column, so the queries cost O(d) to build per column.
    # The values are bit-for-bit those of column_queries(U, j, c0).
    cols_per_batch = max(1, chunk_queries(d) // d)
    Xbuf = np.zeros((min(cols_per_batch, d), d, 2, d))
    Xbuf[:, :, 0, :] = U * c0
    for j0 in range(0, d, cols_per_batch):
        cols = range(j0, min(d, j0 + cols_per_batch))
        for k, j in enumerate(cols):
            Xbuf[k, :, 0, j] = (U[:, j] + 1.0) * c0
            Xbuf[k, :, 1, j] = c0
        y = oracle(Xbuf[: len(cols)].reshape(len(cols) * d, 2, d)).reshape(len(cols), d)
        for k, j in enumerate(cols):
            Xbuf[k, :, 0, j] = U[:, j] * c0
            Xbuf[k, :, 1, j] = 0.0
        for k, j in enumerate(cols):
            T[:, j], alpha = invert_two_token(y[k], v[j], uv, c0)
            if auto:

                def measure(idx, c, j=j):
                    return invert_two_token(oracle(column_queries(U[idx], j, c)), v[j], uv[idx], c)

                n_requeries += remeasure_saturated(measure, T[:, j], alpha, C[:, j], band=band)
    if not np.all(np.isfinite(T)):
        l, j = np.argwhere(~np.isfinite(T))[0]
        advice = "the oracle is not a single head" if auto else 'use scale="auto"'
        raise OracleInconsistentError(
            f"the attention weight for probe {l}, column {j} is outside (0, 1), so sigma^-1 is undefined; {advice}."
        )
    return T, C, n_requeries


def probe_floor(U, lu, T, C, v, uv, W) -> float:
    """``floor_W / u`` of :func:`learn_single_head`: the relative error of ``W`` per unit rounding.

    See the Notes of :func:`learn_single_head`; ``T``, ``C`` are the measured logits and scales,
    ``lu`` the LU factors of the probes ``U``.
    """
    d = U.shape[0]
    L = T / C**2
    alpha = expit(T)
    s_best = BEST_LOGIT * expit(BEST_LOGIT) * expit(-BEST_LOGIT)
    E = np.abs(v[None, :] + alpha * uv[:, None]) * np.abs(L) / (np.abs(uv)[:, None] * s_best)
    U_inv_F = float(np.linalg.norm(lu_solve(lu, np.eye(d))))
    nW = float(np.linalg.norm(W))
    return U_inv_F * float(np.linalg.norm(E)) / (np.sqrt(d) * nW) if nW > 0 else 0.0


def sweep_point(d, *, seed, probes="basis", entry_scale=None, scale="auto") -> dict:
    """One sweep point: learn a random head of dimension ``d`` and report queries and errors.

    The head is ``random_single_head(d, seed=seed + d)``; with ``entry_scale`` its ``W`` is rescaled
    to entries of root-mean-square ``entry_scale`` (``||W||_F = entry_scale * d``).

    Returns
    -------
    dict
        ``n_queries`` (the learning queries: d + d**2 plus the re-asked probes, without the
        queries that measure the answers' precision, ``n_precision_queries``, asked first at
        d >= 49), ``d_plus_d2``, ``n_requeries``, ``n_precision_queries``, ``rel_error_W``,
        ``rel_error_v``.
    """
    from .attention import random_single_head
    from .oracles import ValueQueryOracle

    d = check_int(d, "d", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    W_norm = None if entry_scale is None else check_real(entry_scale, "entry_scale", minimum=0.0) * d
    target = random_single_head(d, W_norm=W_norm, seed=seed + d)
    rec = learn_single_head(ValueQueryOracle(target), probes=probes, scale=scale, verify=0, seed=seed)
    err = rec.relative_errors(target)
    return {
        "n_queries": rec.n_learning_queries,
        "d_plus_d2": d + d * d,
        "n_requeries": rec.diagnostics["n_requeries"],
        "n_precision_queries": rec.diagnostics["n_precision_queries"],
        "rel_error_W": err["W"],
        "rel_error_v": err["v"],
    }


def sweep(d_values, *, seed, probes="basis", entry_scale=None, scale="auto", n_jobs=1, backend="sequential", name=None):
    """Run :func:`sweep_point` for every ``d`` through :func:`companion.sweeps.run_sweep`.

    Parameters
    ----------
    d_values : sequence of int
        Input dimensions.
    seed : int
        Base seed; the head for dimension ``d`` is ``random_single_head(d, seed=seed + d)``.
    probes : {"basis", "gaussian"}, default="basis"
        Probe family, as in :func:`learn_single_head`.
    entry_scale : float, default=None
        If given, a large-norm target: entries of ``W`` with root-mean-square ``entry_scale``.
    scale : "auto" or float, default="auto"
        Passed to :func:`learn_single_head`.
    n_jobs, backend, name
        Passed to :func:`~companion.sweeps.run_sweep` (parallel workers, joblib backend, and the
        name under which to save the rows with provenance).

    Returns
    -------
    list of dict
        Keys ``d``, ``n_queries``, ``d_plus_d2``, ``n_requeries``, ``n_precision_queries``,
        ``rel_error_W``, ``rel_error_v`` (as :func:`sweep_point`).

    Examples
    --------
    >>> rows = sweep([2, 3], seed=0)
    >>> [(r["d"], r["n_queries"]) for r in rows], max(r["rel_error_W"] for r in rows) < 1e-12
    ([(2, 6), (3, 12)], True)
    """
    from ._sweep import run_sweep

    points = [{"d": d, "seed": seed, "probes": probes, "entry_scale": entry_scale, "scale": scale} for d in d_values]
    rows = run_sweep(sweep_point, points, n_jobs=n_jobs, backend=backend, progress=False, name=name)
    keep = ("d", "n_queries", "d_plus_d2", "n_requeries", "n_precision_queries", "rel_error_W", "rel_error_v")
    return [{k: r[k] for k in keep} for r in rows]


# --------------------------------------------------------------------------------------------
# Biases: learning on homogeneous tokens (learn_single_head(oracle, bias=True))
# --------------------------------------------------------------------------------------------

_BIAS_SHRINK = 0.125  # scale factor of a saturated homogeneous probe per re-measurement round


class TokenPart(OracleView):
    """An oracle on homogeneous tokens ``(x, 1)``, seen as an oracle on the token part ``x``.

    For a model defined on tokens whose last coordinate is a constant 1 (the MiniLM heads of
    :mod:`companion.pretrained`): ``TokenPart(oracle)`` answers ``(N, d)`` queries by appending the
    1, so that ``learn_single_head(TokenPart(oracle), bias=True)`` learns it. Counter, budget,
    tolerance and precision are the wrapped oracle's.

    Parameters
    ----------
    oracle : ValueQueryOracle
        With ``oracle.d >= 2``.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import SingleHead
    >>> from companion.oracles import ValueQueryOracle
    >>> inner = ValueQueryOracle(SingleHead(np.eye(3), np.arange(3.0)))
    >>> part = TokenPart(inner)
    >>> part.d, part(np.array([[1.0, 0.0]])), inner.n_queries
    (2, 2.0, 1)
    """

    def __init__(self, oracle):
        super().__init__(oracle)
        self.d = check_int(self.d - 1, "oracle.d - 1", minimum=1)

    @staticmethod
    def _lift(x):
        x = np.asarray(x, dtype=np.float64)
        return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)

    def __call__(self, X):
        if isinstance(X, (list, tuple)):
            return self.oracle([self._lift(x) for x in X])
        return self.oracle(self._lift(X))


def _biased_block(U, cols, c, d):
    """:func:`_biased_pairs` for every column of ``cols`` at once, in the same order and to the last
    bit, built in one array (a 385-dimensional head asks 148,225 of them: the per-column arrays
    and their concatenation were a fifth of the learner's time)."""
    k = U.shape[0]
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (k,))
    X = np.zeros((len(cols), k, 2, d))
    X[:, :, 0, :] = U * c[:, None]
    inner = [n for n, j in enumerate(cols) if j < d]
    if inner:
        at = np.asarray([cols[n] for n in inner], dtype=np.intp)
        X[np.asarray(inner)[:, None], np.arange(k)[None, :], :, at[:, None]] += c[None, :, None]
    return X.reshape(len(cols) * k, 2, d)


def _biased_pairs(U, j, c, d):
    """Token parts of ``[(c (u_l + e_j), 1); (c e_j, 1)]`` (``j < d``) or ``[(c u_l, 1); (0, 1)]`` (``j = d``)."""
    k = U.shape[0]
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), (k,))
    X = np.zeros((k, 2, d))
    X[:, 0, :] = U * c[:, None]
    if j < d:
        X[:, :, j] += c[:, None]
    return X


def _learn_biased(oracle, d, *, probes, c0, verify, verify_rtol, seed, precision, learner):
    """``learn_single_head(oracle, bias=True)``: Theorem 4.1 on homogeneous tokens (see its Notes)."""
    d1 = d + 1
    start = reserve(oracle, d1 * d1 + verify, learner)
    prec = AnswerPrecision(oracle, precision, seed=seed + 2)
    prec.measure_first(d1 * d1 + verify)  # as without bias: the scale and the band follow u
    band = saturation_band(prec.value, SATURATION)

    # Step 1: v0 = VQ([0]) and v_i + v0 = VQ([e_i]).
    X1 = np.zeros((d1, 1, d))
    X1[1:, 0, :] = np.eye(d)
    y1 = np.asarray(oracle(X1), dtype=np.float64)
    v0, v = float(y1[0]), y1[1:] - y1[0]
    if not np.any(v):
        raise NotIdentifiableError(MESSAGES["v_zero_biased"].format(v0=v0))
    U = probe_matrix(v, probes, seed=seed)
    uv = U @ v

    # Steps 2 and 3: column d is w (second token 0), columns j < d give c^2 u^T W e_j + c u^T w;
    # a probe whose weight leaves [band, 1 - band] is asked again at c / 8.
    T = np.empty((d, d1))
    C = np.full((d, d1), c0)
    n_requeries = 0

    def invert(y, j, rows, c):
        vj = v[j] if j < d else 0.0
        return invert_two_token(np.asarray(y) - v0, vj, uv[rows], c)

    rows = np.arange(d)
    per_batch = max(1, chunk_queries(d1) // d)
    order = [d] + list(range(d))
    for b0 in range(0, d1, per_batch):
        cols = order[b0 : b0 + per_batch]
        y = np.asarray(oracle(_biased_block(U, cols, c0, d)))
        for k, j in enumerate(cols):
            T[:, j], alpha = invert(y[k * d : (k + 1) * d], j, rows, c0)
            for _ in range(_MAX_ROUNDS):
                sat = ~((alpha >= band) & (alpha <= 1.0 - band))
                if not np.any(sat):
                    break
                C[sat, j] *= _BIAS_SHRINK
                T[sat, j], alpha[sat] = invert(oracle(_biased_pairs(U[sat], j, C[sat, j], d)), j, rows[sat], C[sat, j])
                n_requeries += int(sat.sum())
            else:
                raise OracleInconsistentError(
                    f"column {j}: attention weights stayed saturated after {_MAX_ROUNDS} re-measurements "
                    "on homogeneous tokens; the oracle does not behave like a softmax head with biases."
                )
    lu = lu_factor(U)
    uw = T[:, d] / C[:, d]  # u_l^T w
    L = (T[:, :d] - C[:, :d] * uw[:, None]) / C[:, :d] ** 2  # u_l^T W e_j
    W_full = np.zeros((d1, d1))
    W_full[:d, :d] = lu_solve(lu, L)
    W_full[:d, d] = lu_solve(lu, uw)
    v_full = np.append(v, v0)
    rcond, _ = lapack.dgecon(lu[0], np.linalg.norm(U, 1), norm="1")
    diagnostics = {
        "probes": U,
        "cond_probes": float(1.0 / rcond) if rcond > 0 else float("inf"),
        "n_requeries": n_requeries,
        "n_scale_queries": 0,  # the homogeneous probes keep their scale (no relative-rounding step)
        "max_abs_logit": float(np.max(np.abs(T))),
        "identifiable": "W[:d, :], v",
    }
    kappa_W = probe_floor(U, lu, T[:, :d], C[:, :d], v, uv, W_full[:d, :d])
    message = (
        f"recovered the identifiable rows of W~ and v~ from (d + 1)^2 = {d1 * d1} value queries on "
        "homogeneous tokens (x, 1) (this book's extension of Theorem 4.1 to biases); last row of W~ set to 0"
        + (f"; {n_requeries} re-measurements" if n_requeries else "")
    )
    head = SingleHead(W_full, v_full)
    base_size = head_check_size(W_full, v_full, kappa_W, 1.0)

    def lift(x):
        return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)

    checked = verify_outputs(
        oracle,
        lambda X: head([lift(np.asarray(x)) for x in X]),
        lambda x: float(np.max(np.abs(lift(x) @ v_full))),
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a single head on homogeneous inputs (a head with biases)",
        precision=prec,
        size=lambda x: base_size(lift(x)),
        floor=lambda u: kappa_W * u,
        measure_if_coarse=True,
    )
    message = prec.report_floor(diagnostics, message, kappa_W)
    return build(
        Recovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        precision=prec,
        W=W_full,
        v=v_full,
    )
