"""Learning one attention head from approximate value queries (§6: Lemma 6.1, Theorem 6.2) and beyond.

A served model does not answer exactly: it rounds. The approximate oracle AVQ(X; tau) of §6 returns
any value within ``tau`` of f*(X), deterministically, so repeating a query gains nothing. Under the
assumptions of §6 — ``||W*||_F <= W_max`` (known, ``W_max >= 2``), ``||v*||_2 <= 1``, tokens of norm at
most 1 and a margin ``min_i |v*_i| >= mu > 0`` — the paper's learner reads ``v`` off length-1 queries
and each entry ``W_ij`` off one length-2 query whose logit is at most 1/2 in magnitude:

* :func:`learn_robust` — Theorem 6.2 exactly as stated (``a = 1/2``, ``b = 1/W_max``, clip, sigma^-1,
  divide by ``ab``), ``d + d**2`` queries.
* :func:`clipped_logit`, :func:`lemma_6_1_bound` — Lemma 6.1, the Lipschitz step behind it.
* :func:`sufficient_tolerance`, :func:`guaranteed_error` — the theorem's tolerance for given
  accuracies, and its inverse: the accuracy guaranteed at a given tolerance.
* :func:`random_margin_head` — random targets that satisfy the assumptions of §6.

Beyond the paper:

* :func:`entry_error_bound`, :func:`best_scale` — the theorem's per-entry error bound as a function of
  the probe scale ``b``, and the ``b`` that minimises it (the paper fixes ``b = 1/W_max``).
* :func:`learn_robust_lstsq` — margin-free probes ``e_i + s_i e_p`` at the best scale, repeated at
  ``R`` distinct scales and combined by weighted least squares: about ``R (d + d**2)`` queries
  (:func:`n_queries_lstsq`).
* :func:`learn_low_rank_noisy` — a rank-``r`` head from ``d + m`` approximate queries: Gaussian
  rank-one projections (§5) at scales that keep Lemma 6.1's window (:func:`rop_scales`), a bound on
  each measurement's error (:func:`rop_error_bound`), and a noise-aware solver (nuclear norm with
  the bounds as constraints, or weighted rank-``r`` Gauss-Newton). The paper leaves this case open.

Layer: one of the paper's sections (§6), above the shared numerics it uses with
:mod:`companion.lowrank`: :func:`rop_scales` and :func:`rop_error_bound` live in
``companion.numerics.rop`` (re-exported here), the weighted Gauss-Newton solver in
``companion.numerics.rgn``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from ._streaming import answer_rop
from ._validation import check_choice, check_int, check_real
from .attention import SingleHead, random_single_head
from .errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError, PrecisionError, SolverError
from .exact import read_value_vector
from .lowrank import LowRankRecovery, check_nuclear_size, degrees_of_freedom
from ._learner import DEFAULT_VERIFY, build, check_verify, reserve, verify_noisy
from .numerics.rgn import (
    _factor_svd,
    _rop_apply,
    _rop_apply_factors,
    _single_precision,
    _spectral_start,
    _weighted_rgn,
)
from .numerics.rop import _gaussian_rop_design, rop_error_bound, rop_queries, rop_scales
from .recovery import Recovery

__all__ = [
    "TAU_CLIP",
    "LIPSCHITZ_6_1",
    "clipped_logit",
    "lemma_6_1_bound",
    "sufficient_tolerance",
    "guaranteed_error",
    "random_margin_head",
    "robust_queries",
    "learn_robust",
    "entry_error_bound",
    "best_scale",
    "learn_robust_lstsq",
    "lstsq_error_bound",
    "n_queries_lstsq",
    "NOISY_METHODS",
    "rop_scales",
    "rop_error_bound",
    "learn_low_rank_noisy",
]

#: Lemma 6.1's clipping level sigma(-1/2) ~ 0.3775: a logit in [-1/2, 1/2] gives a weight in
#: [TAU_CLIP, 1 - TAU_CLIP].
TAU_CLIP = float(expit(-0.5))

#: Lipschitz constant of sigma^-1 on [TAU_CLIP, 1 - TAU_CLIP]: 1 / (TAU_CLIP (1 - TAU_CLIP)) ~ 4.255,
#: which Lemma 6.1 rounds up to 5.
LIPSCHITZ_6_1 = 1.0 / (TAU_CLIP * (1.0 - TAU_CLIP))

#: The constant of Theorem 6.2's tolerance tau <= mu eps_W / (C W_max^2 d).
THEOREM_6_2_CONSTANT = 80.0

_MARGIN_MESSAGE = (
    "the margin assumption fails: |v_hat[{i}]| = {v:.3g} < mu - tau = {mu:.3g} - {tau:.3g}, so "
    "|v*[{i}]| < mu={mu:.3g} for every head consistent with the oracle. Theorem 6.2 needs "
    "min_i |v*_i| >= mu: pass a smaller mu (its guarantee grows like 1/mu), or use "
    "learn_robust_lstsq, whose probes need no margin."
)


def margin_rounding(d, mu) -> float:
    """Slack of the margin check of :func:`learn_robust` for float64 rounding: ``4 d eps mu``.

    ``|v_hat_i| < mu - tau - margin_rounding(d, mu)`` refutes the margin; a read-off within a few
    ulps of ``mu - tau`` (the worst noise on a head with ``|v*_i| = mu``) does not.

    Examples
    --------
    >>> margin_rounding(8, 0.1) == 4 * 8 * 2.0**-52 * 0.1
    True
    """
    return 4.0 * d * float(np.finfo(np.float64).eps) * mu


_CHUNK_BYTES = 32 * 2**20  # size of one batch of length-2 queries sent to the oracle


def _check_oracle(oracle, learner: str) -> tuple[int, float]:
    """Return ``(d, tau)`` of a value-query oracle; raise TypeError for anything else."""
    if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
        raise TypeError(
            f"{learner} needs a value-query oracle (callable, with attributes d and n_queries), "
            f"got {type(oracle).__name__}; wrap the model in "
            "companion.oracles.ApproxValueQueryOracle."
        )
    tau = float(getattr(oracle, "tau", 0.0))
    if not np.isfinite(tau):
        raise TypeError(
            f"{learner} needs answers within a finite tolerance tau of f*; {type(oracle).__name__} "
            f"has tau={tau} (a label oracle says nothing about |f*|): use "
            "companion.membership.learn_membership for labels."
        )
    return int(oracle.d), tau


# --------------------------------------------------------------------------------------------
# Lemma 6.1
# --------------------------------------------------------------------------------------------


def clipped_logit(alpha, *, tau_clip=TAU_CLIP):
    """``sigma^{-1}(clip(alpha; tau_clip, 1 - tau_clip))``, the inversion step of Theorem 6.2.

    Parameters
    ----------
    alpha : float or ndarray
        Estimated attention weights; any real values (noise may push them outside [0, 1]).
    tau_clip : float, default=TAU_CLIP
        Clipping level, ``0 < tau_clip < 1/2``.

    Returns
    -------
    float or ndarray
        Same shape as ``alpha``; every entry lies in ``[-sigma^-1(1 - tau_clip), sigma^-1(1 - tau_clip)]``
        (``[-1/2, 1/2]`` for the default).

    Raises
    ------
    InvalidInputError
        If ``tau_clip`` is not in (0, 1/2).

    Examples
    --------
    >>> round(float(clipped_logit(0.5)), 8), round(float(clipped_logit(2.0)), 8)
    (0.0, 0.5)
    """
    tau_clip = check_real(tau_clip, "tau_clip", minimum=0.0, strict=True, maximum=0.5)
    if tau_clip == 0.5:
        raise InvalidInputError("tau_clip=0.5 leaves an empty window; it must be in (0, 1/2).")
    return logit(np.clip(alpha, tau_clip, 1.0 - tau_clip))


def lemma_6_1_bound(alpha_hat, alpha_star):
    """Lemma 6.1's bound on ``|sigma^-1(clip(alpha_hat)) - sigma^-1(alpha_star)|``.

    Parameters
    ----------
    alpha_hat : float or ndarray
        Any estimates of the weight (broadcast against ``alpha_star``).
    alpha_star : float or ndarray
        True weights, each in ``[TAU_CLIP, 1 - TAU_CLIP]``.

    Returns
    -------
    float or ndarray
        ``|alpha_hat - alpha_star| / (TAU_CLIP (1 - TAU_CLIP))``, at most ``5 |alpha_hat - alpha_star|``.

    Raises
    ------
    InvalidInputError
        If some ``alpha_star`` lies outside ``[TAU_CLIP, 1 - TAU_CLIP]``, where the lemma says nothing.

    Notes
    -----
    Lemma 6.1 of Bhattamishra et al. 2026 [1]_: clipping to the window is 1-Lipschitz and leaves
    ``alpha_star`` in place, and sigma^-1 has derivative ``1 / (p (1 - p)) <= LIPSCHITZ_6_1`` there.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> a_hat, a_star = 0.9, 0.6
    >>> lhs = abs(clipped_logit(a_hat) - logit(a_star))
    >>> bool(lhs <= lemma_6_1_bound(a_hat, a_star) <= 5 * abs(a_hat - a_star))
    True
    """
    alpha_hat = np.asarray(alpha_hat, dtype=np.float64)
    alpha_star = np.asarray(alpha_star, dtype=np.float64)
    lo, hi = TAU_CLIP, 1.0 - TAU_CLIP
    outside = (alpha_star < lo - 1e-15) | (alpha_star > hi + 1e-15)
    if np.any(outside):
        bad = float(alpha_star[outside].flat[0]) if alpha_star.ndim else float(alpha_star)
        raise InvalidInputError(
            f"alpha_star={bad!r} is outside [TAU_CLIP, 1 - TAU_CLIP] = [{lo:.4f}, {hi:.4f}]; "
            "Lemma 6.1 holds only there (logits in [-1/2, 1/2])."
        )
    out = np.abs(alpha_hat - alpha_star) * LIPSCHITZ_6_1
    return float(out) if out.ndim == 0 else out


# --------------------------------------------------------------------------------------------
# Theorem 6.2: tolerance and guarantee
# --------------------------------------------------------------------------------------------


def _check_setting(mu, W_max, d):
    mu = check_real(mu, "mu", minimum=0.0, strict=True, maximum=1.0)
    W_max = check_real(W_max, "W_max", minimum=2.0)
    d = check_int(d, "d", minimum=1)
    return mu, W_max, d


def sufficient_tolerance(*, mu, eps_W, eps_v, W_max, d) -> float:
    """The tolerance Theorem 6.2 needs for ``||W_hat - W*||_F <= eps_W`` and ``||v_hat - v*|| <= eps_v``.

    Parameters
    ----------
    mu : float
        Margin, ``0 < mu <= 1``: a known lower bound on ``min_i |v*_i|``.
    eps_W, eps_v : float
        Target accuracies, ``> 0``.
    W_max : float
        Known bound on ``||W*||_F``, ``W_max >= 2``.
    d : int
        Input dimension.

    Returns
    -------
    float
        ``min(mu eps_W / (80 W_max**2 d), mu / 2, eps_v / sqrt(d))``.

    Raises
    ------
    InvalidInputError
        If an argument is out of range.

    Notes
    -----
    Theorem 6.2 of Bhattamishra et al. 2026 [1]_ with ``tau_f = tau_v = tau``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> f"{sufficient_tolerance(mu=0.1, eps_W=0.1, eps_v=0.1, W_max=2, d=4):.6g}"
    '7.8125e-06'
    """
    mu, W_max, d = _check_setting(mu, W_max, d)
    eps_W = check_real(eps_W, "eps_W", minimum=0.0, strict=True)
    eps_v = check_real(eps_v, "eps_v", minimum=0.0, strict=True)
    return float(min(mu * eps_W / (THEOREM_6_2_CONSTANT * W_max**2 * d), mu / 2, eps_v / np.sqrt(d)))


def guaranteed_error(tau, *, mu, W_max, d):
    """The accuracies Theorem 6.2 guarantees at tolerance ``tau``: the inverse of :func:`sufficient_tolerance`.

    Parameters
    ----------
    tau : float or ndarray
        Tolerance(s) of the oracle, ``>= 0``.
    mu, W_max, d
        As for :func:`sufficient_tolerance`.

    Returns
    -------
    eps_W : float or ndarray
        ``80 W_max**2 d tau / mu``, the smallest ``eps_W`` for which ``tau`` is sufficient.
    eps_v : float or ndarray
        ``sqrt(d) tau``.

    Both are ``inf`` where ``tau > mu / 2``: there the theorem guarantees nothing.

    Raises
    ------
    InvalidInputError
        If an argument is out of range or ``tau`` is negative.

    Examples
    --------
    >>> [round(e, 10) for e in guaranteed_error(7.8125e-06, mu=0.1, W_max=2, d=4)]
    [0.1, 1.5625e-05]
    >>> guaranteed_error(0.06, mu=0.1, W_max=2, d=4)
    (inf, inf)
    """
    mu, W_max, d = _check_setting(mu, W_max, d)
    tau = np.asarray(tau, dtype=np.float64)
    if not np.all(np.isfinite(tau)) or np.any(tau < 0):
        raise InvalidInputError(f"tau must be finite and >= 0; got {tau!r}.")
    ok = tau <= mu / 2
    eps_W = np.where(ok, THEOREM_6_2_CONSTANT * W_max**2 * d * tau / mu, np.inf)
    eps_v = np.where(ok, np.sqrt(d) * tau, np.inf)
    if eps_W.ndim == 0:
        return float(eps_W), float(eps_v)
    return eps_W, eps_v


def random_margin_head(d, *, W_max, mu, W_norm=None, rank=None, seed) -> SingleHead:
    """A random head that satisfies the assumptions of §6.

    Parameters
    ----------
    d : int
        Input dimension.
    W_max : float
        Bound on ``||W||_F`` (``>= 2``).
    mu : float
        Margin, ``0 < mu <= 1 / sqrt(d)`` (a larger margin is impossible with ``||v|| <= 1``).
    W_norm : float, default=None
        ``||W||_F``; defaults to ``W_max`` (the largest allowed, the hardest case).
    rank : int, default=None
        Rank of ``W`` (passed to :func:`~companion.attention.random_single_head`); ``None`` is full.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    SingleHead
        ``W`` from :func:`~companion.attention.random_single_head` rescaled to ``W_norm``;
        ``v_i = s_i (mu + (1/sqrt(d) - mu) u_i)`` with random signs ``s_i`` and ``u_i ~ U[0, 1)``, so
        ``min |v_i| >= mu`` and ``||v|| <= 1``.

    Raises
    ------
    InvalidInputError
        If ``mu > 1 / sqrt(d)`` or ``W_norm > W_max``.

    Examples
    --------
    >>> import numpy as np
    >>> head = random_margin_head(4, W_max=3.0, mu=0.2, seed=0)
    >>> bool(np.min(np.abs(head.v)) >= 0.2), bool(np.linalg.norm(head.v) <= 1)
    (True, True)
    >>> round(float(np.linalg.norm(head.W)), 8)
    3.0
    """
    d = check_int(d, "d", minimum=1)
    W_max = check_real(W_max, "W_max", minimum=2.0)
    mu = check_real(mu, "mu", minimum=0.0, strict=True)
    if mu > 1 / np.sqrt(d):
        raise InvalidInputError(
            f"mu={mu} > 1/sqrt(d)={1 / np.sqrt(d):.4g}: no v with ||v|| <= 1 has min |v_i| >= mu; lower mu or d."
        )
    W_norm = W_max if W_norm is None else check_real(W_norm, "W_norm", minimum=0.0, maximum=W_max)
    seed = check_int(seed, "seed", minimum=0)
    W = random_single_head(d, rank=rank, W_norm=W_norm, seed=seed).W
    rng = np.random.default_rng([seed, 6])
    signs = rng.choice([-1.0, 1.0], size=d)
    v = signs * (mu + (1 / np.sqrt(d) - mu) * rng.random(d))
    return SingleHead(W, v)


# --------------------------------------------------------------------------------------------
# Theorem 6.2: the learner
# --------------------------------------------------------------------------------------------


def robust_queries(d, j, *, a, b, U=None) -> np.ndarray:
    """The length-2 queries ``[(b u_i + a e_j)^T; (a e_j)^T]`` for column ``j``, one per probe ``u_i``.

    Parameters
    ----------
    d : int
        Input dimension.
    j : int
        Column index.
    a, b : float or ndarray of shape (k,)
        Scales of the query token ``a e_j`` and of the probe.
    U : ndarray of shape (k, d), default=None
        Probes as rows; ``None`` means ``U = I`` (Theorem 6.2's probes ``e_i``).

    Returns
    -------
    ndarray of shape (k, 2, d)
        The logit of query ``i`` is ``a b u_i^T W e_j`` and its answer ``a v_j + sigma(logit) b u_i^T v``.
    """
    U = np.eye(d) if U is None else U
    k = U.shape[0]
    # the rank-one projection of W with left vectors b u_i and right vector a e_j
    return rop_queries(np.reshape(b, (-1, 1)) * U, np.broadcast_to(np.reshape(a, (-1, 1)) * np.eye(1, d, j), (k, d)))


def _column_blocks(d):
    per = max(1, _CHUNK_BYTES // (16 * d * d))
    return [range(j0, min(d, j0 + per)) for j0 in range(0, d, per)]


def learn_robust(oracle, *, W_max, mu, verify=DEFAULT_VERIFY, verify_rtol=0.1, seed=0):
    """Recover (W, v) to accuracy eps from approximate value queries (Theorem 6.2).

    Parameters
    ----------
    oracle : ApproxValueQueryOracle or ValueQueryOracle
        Oracle within ``tau = oracle.tau`` of :math:`f_{W^*, v^*}`; its budget must allow
        ``d + d**2`` queries.
    W_max : float
        A known bound ``||W*||_F <= W_max``, with ``W_max >= 2`` (Theorem 6.2's assumption).
    mu : float
        A known lower bound on ``min_i |v*_i|`` (the margin), ``0 < mu <= 1``.
    verify : int, default=32
        Fresh queries (8 of length 1, 24 rank-one projections; never used for learning) that
        certify lower bounds on the errors of the result (``companion._learner.verify_noisy``);
        0 opts out. The learner assumes a single head within ``tau`` of the answers (the oracle's
        ``tau`` is its real tolerance) with ``||W*||_F <= W_max``, the margin ``mu``, and tokens
        in the unit ball. If the fresh answers prove ``||W_hat - W*||_F`` larger than both the
        a-posteriori bound ``eps_W_posterior`` and ``verify_rtol ||W_hat||_F`` (or ``||v_hat - v*||``
        larger than ``sqrt(d) tau`` and ``verify_rtol ||v_hat||``), an assumption is false and the
        learner raises instead of returning.
    verify_rtol : float, default=0.1
        Relative error always allowed by the check.
    seed : int, default=0
        Seed of the verification queries.

    Returns
    -------
    Recovery
        ``W`` (d, d), ``v`` (d,), ``n_queries`` equal to ``d + d**2 + verify``
        (``n_learning_queries``: ``d + d**2``). ``diagnostics``: ``a``, ``b``,
        ``tau`` (the oracle's), ``alpha_hat`` ((d, d): the estimated weight of query (i, j)),
        ``n_clipped`` (weights outside the Lemma 6.1 window), ``min_abs_v``, ``eps_W_guaranteed``,
        ``eps_v_guaranteed`` from :func:`guaranteed_error` (``inf`` when ``tau > mu/2``),
        ``eps_W_posterior`` (the same bound with the measured ``|v_hat_i|`` in place of ``mu``:
        ``LIPSCHITZ_6_1 tau (1 + (1 + a)/b) / (a b) sqrt(d sum_i v_hat_i^-2)``), and the
        verification's ``n_verify_queries``, ``verify_error_W``, ``verify_error_v``,
        ``verify_allowed_W``, ``verify_allowed_v``.

    Raises
    ------
    InvalidInputError
        With ``verify`` on (the default), if ``tau > mu / 2``: the theorem's guarantee is then
        infinite and the margin cannot be checked, before any query.
    TypeError
        If ``oracle`` is not a value-query oracle, or answers labels (``tau = inf``, a
        :class:`~companion.membership.MembershipQueryOracle`); before any query.
    InvalidInputError
        If ``W_max < 2`` or ``mu`` is not in (0, 1].
    BudgetExceededError
        If the budget is below ``d + d**2``; raised before the first query.
    OracleInconsistentError
        If some ``|v_hat_i| < mu - tau`` (or ``v_hat_i = 0``): no head consistent with the answers
        has the margin ``mu``. The message names ``mu`` and the entry. Also if an attention weight
        falls outside the clip window by more than the noise allows: then ``|W*_ij| > W_max``, the
        assumption ``||W*||_F <= W_max`` is false and the guarantee would not hold.

    Notes
    -----
    Theorem 6.2 of Bhattamishra et al. 2026 [1]_. ``v_hat_i = AVQ([e_i^T])``. For entry (i, j), with
    ``a = 1/2`` and ``b = 1/W_max``, the query ``X = [(b e_i + a e_j)^T; (a e_j)^T]`` (tokens of norm
    at most 1) has logit ``a b W*_ij``, in [-1/2, 1/2], and answer ``a v*_j + sigma(a b W*_ij) b v*_i``.
    So ``alpha_hat = (y_hat - a v_hat_j) / (b v_hat_i)`` and
    ``W_hat_ij = sigma^-1(clip(alpha_hat; TAU_CLIP, 1 - TAU_CLIP)) / (a b)`` (Lemma 6.1). With
    ``tau <= mu eps_W / (80 W_max**2 d)``, ``tau <= mu / 2`` and ``tau <= eps_v / sqrt(d)`` the result
    satisfies ``||W_hat - W*||_F <= eps_W`` and ``||v_hat - v*||_2 <= eps_v``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ApproxValueQueryOracle
    >>> head = random_margin_head(4, W_max=2.0, mu=0.2, seed=0)
    >>> tau = sufficient_tolerance(mu=0.2, eps_W=0.1, eps_v=0.1, W_max=2.0, d=4)
    >>> rec = learn_robust(ApproxValueQueryOracle(head, tau, noise="worst"), W_max=2.0, mu=0.2)
    >>> rec.n_learning_queries, rec.n_queries, bool(np.linalg.norm(rec.W - head.W) <= 0.1)
    (20, 52, True)
    """
    d, tau = _check_oracle(oracle, "learn_robust")
    W_max = check_real(W_max, "W_max", minimum=2.0)
    mu = check_real(mu, "mu", minimum=0.0, strict=True, maximum=1.0)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if verify and not np.isfinite(guaranteed_error(tau, mu=mu, W_max=W_max, d=d)[0]):
        raise InvalidInputError(
            f"tau={tau:.3g} > mu/2={mu / 2:.3g}: Theorem 6.2 gives no guarantee and the margin "
            "min_i |v*_i| >= mu cannot be checked through noise this large, so the estimate could be "
            "wrong by any amount. Use a more precise oracle, learn_robust_lstsq (no margin), or "
            "verify=0 to get the unguaranteed estimate anyway."
        )
    start = reserve(oracle, d + d * d + verify, "learn_robust")

    # Step 1: v_hat from d length-1 queries; check the margin.
    v_hat = read_value_vector(oracle)
    # The answers carry float64 rounding besides tau: a head with |v*_i| = mu answered with the
    # worst noise reads |v_hat_i| = mu - tau up to a few ulps (a length-d dot product rounds by
    # up to d eps |v_i|), which is no failed margin; below that slack it is one.
    small = (np.abs(v_hat) < mu - tau - margin_rounding(d, mu)) | (v_hat == 0)
    if np.any(small):
        i = int(np.flatnonzero(small)[np.argmin(np.abs(v_hat[small]))])
        raise OracleInconsistentError(_MARGIN_MESSAGE.format(i=i, v=abs(v_hat[i]), mu=mu, tau=tau))

    # Step 2: one query per entry, logit a b W_ij in [-1/2, 1/2].
    a, b = 0.5, 1.0 / W_max
    alpha_hat = np.empty((d, d))
    for cols in _column_blocks(d):
        X = np.concatenate([robust_queries(d, j, a=a, b=b) for j in cols])
        y = np.asarray(oracle(X)).reshape(len(cols), d)
        for k, j in enumerate(cols):
            alpha_hat[:, j] = (y[k] - a * v_hat[j]) / (b * v_hat)
    W_hat = clipped_logit(alpha_hat) / (a * b)

    # Under the assumptions every true weight lies in the clip window [TAU_CLIP, 1 - TAU_CLIP], and
    # |alpha_hat - alpha*| <= tau (1 + (1 + a) / b) / |v_hat_i|. A weight further outside means the
    # logit a b W*_ij exceeds 1/2: ||W*||_F > W_max, or the oracle is not a single head.
    slack = 1.01 * tau * (1.0 + (1.0 + a) / b) / np.abs(v_hat)[:, None] + 1e-12
    outside = (alpha_hat < TAU_CLIP - slack) | (alpha_hat > 1.0 - TAU_CLIP + slack)
    if np.any(outside):
        i, j = (int(k) for k in np.argwhere(outside)[0])
        raise OracleInconsistentError(
            f"the attention weight of entry ({i}, {j}) is {alpha_hat[i, j]:.4f}, outside the window "
            f"[{TAU_CLIP:.4f}, {1 - TAU_CLIP:.4f}] by more than the noise allows ({int(outside.sum())} "
            f"entries): |W*_ij| exceeds W_max={W_max:g}, so ||W*||_F <= W_max is false, or the "
            f"answers err by more than the oracle's tau={tau:.3g} (the window allows for tau "
            "only), or the oracle is not a single head. Pass a larger W_max, or the answers' real "
            "tau; the guarantee would not hold."
        )

    eps_W, eps_v = guaranteed_error(tau, mu=mu, W_max=W_max, d=d)
    n_clipped = int(np.sum((alpha_hat < TAU_CLIP) | (alpha_hat > 1 - TAU_CLIP)))
    diagnostics = {
        "a": a,
        "b": b,
        "tau": tau,
        "alpha_hat": alpha_hat,
        "n_clipped": n_clipped,
        "min_abs_v": float(np.min(np.abs(v_hat))),
        "eps_W_guaranteed": eps_W,
        "eps_v_guaranteed": eps_v,
    }
    guarantee = (
        f"guaranteed ||W - W*||_F <= {eps_W:.3g}, ||v - v*|| <= {eps_v:.3g}"
        if np.isfinite(eps_W)
        else f"no guarantee (tau={tau:.3g} > mu/2={mu / 2:.3g})"
    )
    message = f"recovered W and v from d + d^2 = {d + d * d} approximate value queries (Theorem 6.2); {guarantee}"
    diagnostics["eps_W_posterior"] = float(
        LIPSCHITZ_6_1 * tau * (1.0 + (1.0 + a) / b) / (a * b) * np.sqrt(d * np.sum(v_hat**-2.0))
    )
    checked = verify_noisy(
        oracle,
        W_hat,
        v_hat,
        verify,
        tau=tau,
        W_max=W_max,
        allowed_W=min(eps_W, diagnostics["eps_W_posterior"]),
        allowed_v=np.sqrt(d) * tau,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a single head within tau with ||W*||_F <= W_max and margin mu",
    )
    return build(
        Recovery, oracle, start, verification=checked, message=message, diagnostics=diagnostics, W=W_hat, v=v_hat
    )


# --------------------------------------------------------------------------------------------
# Beyond the paper: the probe scale and a least-squares learner
# --------------------------------------------------------------------------------------------


def entry_error_bound(b, *, tau, mu, W_max, a=0.5, probe_norm=1.0):
    """Theorem 6.2's worst-case bound on ``|W_hat_ij - W*_ij|`` when the probe scale is ``b``.

    The proof of Theorem 6.2 carried out for any ``b`` instead of ``1/W_max``: with
    ``x = a b probe_norm W_max`` the largest logit, clip to ``[sigma(-x), sigma(x)]``, and

    ``|W_hat_ij - W*_ij| <= (1 + a + b sigma(x)) tau / (b (mu - tau)) / (sigma(x) sigma(-x)) / (a b)``.

    Parameters
    ----------
    b : float or ndarray
        Probe scale(s), ``> 0``.
    tau : float
        Oracle tolerance, ``0 <= tau < mu``.
    mu : float
        Lower bound on ``|u^T v*|`` for the probes used (the margin for ``u = e_i``).
    W_max : float
        Bound on ``||W*||_F`` (and so on every ``|u^T W* e_j| / ||u||``).
    a : float, default=0.5
        Scale of the query token ``a e_j``.
    probe_norm : float, default=1.0
        ``||u||`` of the probes (``sqrt(2)`` for :func:`learn_robust_lstsq`'s probes).

    Returns
    -------
    float or ndarray
        The bound, ``inf`` where ``tau >= mu``.

    Examples
    --------
    >>> e1 = entry_error_bound(0.25, tau=1e-4, mu=0.1, W_max=4.0)   # the paper's b = 1/W_max
    >>> e2 = entry_error_bound(best_scale(4.0), tau=1e-4, mu=0.1, W_max=4.0)
    >>> bool(e2 < e1)
    True
    """
    b = np.asarray(b, dtype=np.float64)
    x = a * b * probe_norm * W_max
    sig = expit(x)
    with np.errstate(divide="ignore"):
        d_alpha = np.where(tau < mu, (1 + a + b * probe_norm * sig) * tau / (b * (mu - tau)), np.inf)
    out = d_alpha / (sig * expit(-x)) / (a * b)
    return float(out) if out.ndim == 0 else out


def best_scale(W_max, *, a=0.5, probe_norm=1.0, b_max=None) -> float:
    """The probe scale ``b`` that minimises :func:`entry_error_bound` (Theorem 6.2 fixes ``b = 1/W_max``).

    Parameters
    ----------
    W_max : float
        Bound on ``||W*||_F``, ``> 0``.
    a : float, default=0.5
        Scale of the query token.
    probe_norm : float, default=1.0
        ``||u||`` of the probes.
    b_max : float, default=None
        Largest scale allowed; defaults to ``(1 - a) / probe_norm``, which keeps every token of the
        query within the unit ball (§6 assumes ``||x_i|| <= 1``, so ``|f*| <= 1``).

    Returns
    -------
    float
        The minimiser. It does not depend on ``tau`` or ``mu``: they scale the bound by
        ``tau / (mu - tau)``. Without the cap it puts the largest logit near 2.4 (where
        ``x**2 sigma'(x)`` peaks), against 1/2 for the paper's choice.

    Examples
    --------
    >>> best_scale(4.0)                       # capped by the unit-ball constraint
    0.5
    >>> round(best_scale(100.0) * 100.0, 1)   # ~ 2.4 / (a W_max) for large W_max
    4.7
    """
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    b_max = (1.0 - a) / probe_norm if b_max is None else check_real(b_max, "b_max", minimum=0.0, strict=True)

    def f(log_b):
        return np.log(entry_error_bound(np.exp(log_b), tau=1.0, mu=2.0, W_max=W_max, a=a, probe_norm=probe_norm))

    hi = np.log(b_max)
    res = minimize_scalar(f, bounds=(hi - 12.0, hi), method="bounded", options={"xatol": 1e-10})
    b = float(np.exp(res.x))
    return b_max if f(hi) <= f(np.log(b)) + 1e-12 else b


def n_queries_lstsq(d, repeats) -> int:
    """Queries :func:`learn_robust_lstsq` sends: ``R (d + d**2) + R (ceil(sqrt(d)) - 1) d``.

    Examples
    --------
    >>> n_queries_lstsq(4, 2), n_queries_lstsq(384, 1)
    (48, 155136)
    """
    d = check_int(d, "d", minimum=1)
    R = check_int(repeats, "repeats", minimum=1)
    return R * (d + d * d) + R * (int(np.ceil(np.sqrt(d))) - 1) * d


def _lstsq_scales(W_max, d, R, scale, a=0.5):
    """The length-1 scales ``c`` and every probe scale ``b`` that :func:`learn_robust_lstsq` uses."""
    probe_norm = np.sqrt(2.0)
    b0 = best_scale(W_max, a=a, probe_norm=probe_norm) if isinstance(scale, str) else float(scale)
    factors = 1.0 - 0.3 * np.arange(R) / R
    K = R * (int(np.ceil(np.sqrt(d))) - 1)
    b_pivot = b0 * (1.0 - 0.3 * (np.arange(K) + 1.0 / 3.0) / max(K, 1))
    return factors, np.concatenate([b0 * factors, b_pivot])


def _lstsq_logit_error(b, tau, delta_v, denom, W_max, a=0.5):
    """Bound on ``|T_hat_ij - u_i^T W* e_j|`` from one pass at probe scale ``b`` (see
    :func:`lstsq_error_bound`); ``denom`` is a lower bound on ``|u_i^T v_hat|``."""
    x = np.sqrt(2.0) * a * b * W_max
    sig = expit(x)
    d_alpha = (tau + (a + 2.0 * b * sig) * delta_v) / (b * denom)
    return d_alpha / (sig * expit(-x)) / (a * b)


def lstsq_error_bound(tau, *, v_inf, W_max, d, repeats=1, scale="best", rank=None):
    """Worst-case error of :func:`learn_robust_lstsq` in terms of ``||v*||_inf`` (no margin).

    This book's bound (not in the paper); the proof is in :func:`learn_robust_lstsq`'s Notes.

    Parameters
    ----------
    tau : float
        Oracle tolerance, ``>= 0``.
    v_inf : float
        ``||v*||_inf``, the largest ``|v*_i|`` (``> 0``); any lower bound on it also gives a bound.
    W_max : float
        Bound on ``||W*||_F`` (``> 0``).
    d : int
        Input dimension.
    repeats, scale, rank
        As passed to :func:`learn_robust_lstsq`.

    Returns
    -------
    eps_W : float
        Bound on ``||W_hat - W*||_F``; ``inf`` unless ``v_inf > 2 delta_v`` with ``delta_v`` the
        read-out error of ``v`` (``tau`` for ``repeats=1``).
    eps_v : float
        Bound on ``||v_hat - v*||_2``: ``sqrt(d) delta_v``.

    Examples
    --------
    >>> eps_W, eps_v = lstsq_error_bound(1e-6, v_inf=0.3, W_max=4.0, d=6)
    >>> bool(eps_W < 1e-2), eps_v == 6**0.5 * 1e-6
    (True, True)
    """
    tau = check_real(tau, "tau", minimum=0.0)
    v_inf = check_real(v_inf, "v_inf", minimum=0.0, strict=True)
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    d = check_int(d, "d", minimum=1)
    R = check_int(repeats, "repeats", minimum=1)
    c, bs = _lstsq_scales(W_max, d, R, scale)
    delta_v = tau * float(np.sum(np.abs(c)) / (c @ c))
    eps_v = float(np.sqrt(d) * delta_v)
    if v_inf <= 2.0 * delta_v:
        return float("inf"), eps_v
    eps = float(np.max(_lstsq_logit_error(bs, tau, delta_v, v_inf - delta_v, W_max)))
    eps_W = eps * float(np.sqrt(d * (4.0 * d - 3.0)))
    return (2.0 * eps_W if rank is not None and rank < d else eps_W), eps_v


def learn_robust_lstsq(
    oracle, *, W_max, repeats=4, scale="best", rank=None, verify=DEFAULT_VERIFY, verify_rtol=0.1, seed=0
):
    """Spend ``repeats`` times the queries of Theorem 6.2 to cut the error, without a margin.

    Parameters
    ----------
    oracle : ApproxValueQueryOracle or ValueQueryOracle
        Oracle within ``tau`` of :math:`f_{W^*, v^*}`; its budget must allow :func:`n_queries_lstsq` queries.
    W_max : float
        A known bound on ``||W*||_F`` (``> 0``).
    repeats : int, default=4
        ``R >= 1``: every measurement is made at ``R`` distinct scales.
    scale : "best" or float, default="best"
        Probe scale ``b`` of the first pass: :func:`best_scale` for probes of norm ``sqrt(2)``, or a
        float in ``(0, (1 - a)/sqrt(2)]``. Pass ``r`` uses ``b (1 - 0.3 r / R)``.
    rank : int, default=None
        A known bound on ``rank(W*)`` (e.g. the head dimension). If given, the estimate is replaced
        by its best rank-``rank`` approximation (truncated SVD, Eckart-Young), which removes most of
        the entrywise noise outside the column and row spaces of ``W*``.
    verify : int, default=32
        Fresh queries (8 of length 1, 24 rank-one projections; never used for learning) that
        certify lower bounds on the errors (``companion._learner.verify_noisy``); 0 opts out.
        The learner assumes a single head within ``tau`` of the answers with
        ``||W*||_F <= W_max`` (and ``rank(W*) <= rank`` if given). If the fresh answers prove
        ``||W_hat - W*||_F > verify_rtol ||W_hat||_F`` (or the same for ``v``), it raises.
    verify_rtol : float, default=0.1
        Relative error the check allows.
    seed : int, default=0
        Seed of the verification queries.

    Returns
    -------
    Recovery
        ``W`` (d, d), ``v`` (d,), ``n_queries`` from :func:`n_queries_lstsq` plus ``verify``
        (``n_learning_queries`` leaves out the ``verify``). ``diagnostics``: ``pivot`` (p),
        ``signs``, ``scales`` (the R values of b), ``v_scales`` (the R values of c), ``n_clipped``,
        ``tau``, ``rank``, ``eps_W_bound`` and ``eps_v_bound`` (the guarantee below, from the
        answers alone), and the verification's ``n_verify_queries``, ``verify_error_W``,
        ``verify_error_v``, ``verify_allowed_W``, ``verify_allowed_v``.

    Raises
    ------
    TypeError
        If ``oracle`` is not a value-query oracle, or answers labels (``tau = inf``, a
        :class:`~companion.membership.MembershipQueryOracle`); before any query.
    InvalidInputError
        For ``W_max <= 0``, ``repeats < 1``, a bad ``scale`` or ``rank`` not in [1, d].
    BudgetExceededError
        If the budget is below :func:`n_queries_lstsq`; raised before the first query.
    NotIdentifiableError
        If every ``|v_hat_i|`` is within the read-out error allowed by ``tau``: ``v*`` may be 0.
    OracleInconsistentError
        If ``||W_hat||_F > W_max + eps_W_bound`` (plus float64 rounding): the guarantee
        ``||W_hat - W*||_F <= eps_W_bound`` and ``||W*||_F <= W_max`` cannot both hold, so an
        assumption is false (most likely ``W_max``, which the message says to raise); any
        ``verify``, no query, as :func:`learn_robust` refuses a weight outside its window. Also if
        the verification fails.

    Notes
    -----
    Not in the paper. Three changes to Theorem 6.2's learner [1]_:

    1. *Margin-free probes.* With ``p = argmax_i |v_hat_i|`` and ``s_i = sign(v_hat_i v_hat_p)``,
       row ``i != p`` is probed with ``u_i = e_i + s_i e_p``, so ``|u_i^T v| = |v_i| + |v_p| >= |v_p|``
       however small ``v_i`` is; then ``W_ij = u_i^T W e_j - s_i W_pj``.
    2. *Best scale.* ``b`` minimises Theorem 6.2's own per-entry bound (:func:`best_scale`).
    3. *Repeats.* ``v`` from ``[c_r e_i^T]`` and every logit at ``R`` distinct scales; the logits are
       combined with inverse-variance weights ``(b_r^2 sigma'(t_r))^2`` and ``v`` by least squares.
       A deterministic oracle answers distinct queries with different errors, so uniform or rounding
       errors average out like ``1/sqrt(R)``; an adversary (``noise="worst"``) can bias them all.
    4. *Rank.* With ``rank=r``, the truncated SVD of the estimate: i.i.d. entry errors of size s
       cost about ``s d`` in Frobenius norm before and ``s sqrt(2 r d)`` after.

    **Guarantee (this book's; no margin).** Let every answer be within ``tau`` of ``f*``,
    ``||W*||_F <= W_max``, ``V = ||v*||_inf`` and ``delta_v = tau sum(c) / sum(c**2)`` (``tau`` for
    ``R = 1``). If ``V > 2 delta_v`` then, with ``x_b = sqrt(2) a b W_max`` and the maximum over
    every probe scale ``b`` used,

    ``||v_hat - v*||_2 <= sqrt(d) delta_v``,
    ``eps = max_b (tau + (a + 2 b sigma(x_b)) delta_v) / (b (V - delta_v) sigma(x_b) sigma(-x_b) a b)``,
    ``|W_hat_pj - W*_pj| <= eps``, ``|W_hat_ij - W*_ij| <= 2 eps`` (``i != p``), so
    ``||W_hat - W*||_F <= sqrt(d (4d - 3)) eps`` (twice that with ``rank``, by Eckart-Young:
    ``||P_r(W_hat) - W*|| <= ||P_r(W_hat) - W_hat|| + ||W_hat - W*|| <= 2 ||W_hat - W*||``).
    :func:`lstsq_error_bound` evaluates it.

    *Proof.* Each ``v_hat_i`` is a least-squares fit of ``y_r = c_r v*_i + e_r``, ``|e_r| <= tau``,
    so ``|v_hat_i - v*_i| <= delta_v``. The pivot has ``|v_hat_p| >= |v_hat_{i*}| >= V - delta_v``
    (``i*`` the largest entry of ``v*``), and ``|u_i^T v_hat| = |v_hat_i| + |v_hat_p| >= V - delta_v``
    for every row. Query ``(i, j)`` at scale ``b`` has logit ``t* = a b u_i^T W* e_j``, with
    ``|t*| <= a b ||u_i|| ||W* e_j|| <= x_b``, and answer ``f = a v*_j + sigma(t*) b u_i^T v*``. With
    ``y = f + e`` and ``Delta = v_hat - v*``,
    ``alpha_hat - sigma(t*) = (e - a Delta_j - sigma(t*) b u_i^T Delta) / (b u_i^T v_hat)``, and
    ``|u_i^T Delta| <= ||u_i||_1 delta_v <= 2 delta_v``, ``sigma(t*) <= sigma(x_b)``. Clipping to
    ``[sigma(-x_b), sigma(x_b)]``, which holds ``sigma(t*)``, is 1-Lipschitz, and ``sigma^-1`` has
    slope at most ``1 / (sigma(x_b) sigma(-x_b))`` there (Lemma 6.1's argument); dividing by ``a b`` gives
    the error ``eps`` of one pass's estimate of ``T_ij = u_i^T W* e_j``. The weighted mean of the
    passes errs by at most the largest pass error. Finally ``W_ij = T_ij - s_i T_pj`` is exact for
    the true ``T``, whatever the signs ``s_i``, so its error is at most ``2 eps``. No entry of ``v*``
    other than the largest enters: the bound needs no margin. ``diagnostics["eps_W_bound"]`` is the
    same bound with the observed ``|u_i^T v_hat|`` in place of ``V - delta_v``, row by row, so it is
    computed from the answers alone.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ApproxValueQueryOracle
    >>> head = random_margin_head(4, W_max=2.0, mu=0.2, seed=0)
    >>> rec = learn_robust_lstsq(ApproxValueQueryOracle(head, 1e-6), W_max=2.0, repeats=2)
    >>> rec.n_learning_queries, bool(np.linalg.norm(rec.W - head.W) < 1e-3)
    (48, True)
    """
    d, tau = _check_oracle(oracle, "learn_robust_lstsq")
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    R = check_int(repeats, "repeats", minimum=1)
    rank = None if rank is None else check_int(rank, "rank", minimum=1, maximum=d)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    a, probe_norm = 0.5, np.sqrt(2.0)
    b_cap = (1.0 - a) / probe_norm
    if isinstance(scale, str):
        if scale != "best":
            raise InvalidInputError(f"scale={scale!r} must be 'best' or a float in (0, {b_cap:.4g}].")
        b0 = best_scale(W_max, a=a, probe_norm=probe_norm)
    else:
        b0 = check_real(scale, "scale", minimum=0.0, strict=True, maximum=b_cap)
    start = reserve(oracle, n_queries_lstsq(d, R) + verify, "learn_robust_lstsq")
    factors = 1.0 - 0.3 * np.arange(R) / R
    c = factors  # scales of the length-1 queries
    bs = b0 * factors  # probe scales

    # v by least squares over y_r = c_r v_i + noise.
    Y = np.stack([np.asarray(oracle(cr * np.eye(d)[:, None, :])) for cr in c])
    v_hat = (c @ Y) / (c @ c)
    v_noise = tau * float(np.sum(np.abs(c)) / (c @ c))  # |v_hat_i - v*_i| <= v_noise
    if not np.any(np.abs(v_hat) > v_noise):
        raise NotIdentifiableError(
            f"every |v_hat_i| is at most {v_noise:.3g}, the read-out error allowed by tau={tau:g}: "
            "v* may be 0, then f is identically 0 and W is not identifiable. A smaller tau is needed."
        )
    p = int(np.argmax(np.abs(v_hat)))
    s = np.where(np.sign(v_hat * v_hat[p]) < 0, -1.0, 1.0)
    U = np.eye(d)
    U[np.arange(d) != p, p] += s[np.arange(d) != p]
    uv = U @ v_hat

    num = np.zeros((d, d))
    den = np.zeros((d, d))
    n_clipped = 0
    # Row p enters every other row (W_ij = T_ij - s_i T_pj), so it gets ceil(sqrt(d)) times the
    # repeats: R (ceil(sqrt(d)) - 1) d extra queries, small against R d^2.
    K = R * (int(np.ceil(np.sqrt(d))) - 1)
    b_pivot = b0 * (1.0 - 0.3 * (np.arange(K) + 1.0 / 3.0) / max(K, 1))
    passes = [(b, np.arange(d)) for b in bs] + [(b, np.array([p])) for b in b_pivot]
    for b, rows in passes:
        x_max = a * b * probe_norm * W_max
        lo = float(expit(-x_max))
        for cols in _column_blocks(d):
            X = np.concatenate([robust_queries(d, j, a=a, b=b, U=U[rows]) for j in cols])
            y = np.asarray(oracle(X)).reshape(len(cols), len(rows))
            for k, j in enumerate(cols):
                alpha = (y[k] - a * v_hat[j]) / (b * uv[rows])
                n_clipped += int(np.sum((alpha < lo) | (alpha > 1 - lo)))
                alpha = np.clip(alpha, lo, 1 - lo)
                t = logit(alpha) / (a * b)
                w = (b * b * alpha * (1 - alpha)) ** 2
                num[rows, j] += w * t
                den[rows, j] += w
    T = num / den  # T[i, j] ~ u_i^T W e_j
    W_hat = T - np.outer(np.where(np.arange(d) == p, 0.0, s), T[p])
    if rank is not None and rank < d:
        Us, sv, Vt = np.linalg.svd(W_hat)
        W_hat = (Us[:, :rank] * sv[:rank]) @ Vt[:rank]
    message = (
        f"recovered W and v from {oracle.n_queries - start} approximate value queries "
        f"(margin-free probes, b = {b0:.3g}, {R} scales, {R + K} for the pivot row)"
    )
    # The guarantee of the Notes, with the observed denominators |u_i^T v_hat| row by row.
    all_b = np.concatenate([bs, b_pivot])
    row_err = np.max(_lstsq_logit_error(all_b[None, :], tau, v_noise, np.abs(uv)[:, None], W_max, a=a), axis=1)
    entry = row_err + np.where(np.arange(d) == p, 0.0, row_err[p])
    eps_W_bound = float(np.sqrt(d) * np.linalg.norm(entry))
    if rank is not None and rank < d:
        eps_W_bound *= 2.0  # Eckart-Young: the truncation at most doubles it
    # ||W* - W_hat||_F <= eps_W_bound under the assumptions, so ||W_hat||_F <= W_max + eps_W_bound:
    # a larger ||W_hat||_F proves one of them false (no query needed), as learn_robust's window does.
    norm_W = float(np.linalg.norm(W_hat))
    if norm_W > W_max + eps_W_bound + np.sqrt(np.finfo(float).eps) * W_max:  # float64 rounding
        raise OracleInconsistentError(
            f"||W_hat||_F = {norm_W:.3g} exceeds W_max={W_max:g} by more than the guaranteed error "
            f"eps_W_bound={eps_W_bound:.3g} (from the answers, under the assumptions): so "
            "||W*||_F <= W_max is false, or the oracle errs by more than tau, or it is not a single "
            f"head. Pass W_max >= {norm_W:.3g} (it also sets the probe scales), or the answers' real "
            f"tau (the bound assumes tau={tau:.3g}); the guarantee would not hold."
        )
    diagnostics = {
        "pivot": p,
        "signs": s,
        "scales": bs,
        "v_scales": c,
        "n_clipped": n_clipped,
        "tau": tau,
        "rank": rank,
        "eps_W_bound": eps_W_bound,
        "eps_v_bound": float(np.sqrt(d) * v_noise),
    }
    checked = verify_noisy(
        oracle,
        W_hat,
        v_hat,
        verify,
        tau=tau,
        tau_v=v_noise,
        W_max=W_max,
        allowed_W=eps_W_bound,
        allowed_v=np.sqrt(d) * v_noise,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a single head within tau with ||W*||_F <= W_max",
    )
    return build(
        Recovery, oracle, start, verification=checked, message=message, diagnostics=diagnostics, W=W_hat, v=v_hat
    )


# --------------------------------------------------------------------------------------------
# Beyond the paper: noisy low-rank recovery from rank-one projections
# --------------------------------------------------------------------------------------------

#: Solvers of :func:`learn_low_rank_noisy`.
NOISY_METHODS = ("rgn", "nuclear")

#: Default number of Gaussian ROP measurements of :func:`learn_low_rank_noisy`, as a multiple of
#: ``r (2d - r)``.
NOISY_OVERSAMPLING = 3.0

#: ``learn_low_rank_noisy(method="rgn")`` refuses a fit whose weighted residual exceeds this many
#: times the largest one ``W*`` may have (1 in exact arithmetic: the fit minimises the weighted
#: residual over rank-``r`` matrices, and ``W*`` is one with ``|r_k| <= delta_k``); the margin
#: above 1 covers float64 rounding of the residuals. This book's check.
FIT_SLACK = 1.0 + 1e-6

#: ``learn_low_rank_noisy(method="rgn")`` skips its run from the spectral start when the run from
#: the sqrt-weighted solution fits with ``fit_ratio`` at most this (as ``W*`` does): that fit is
#: already consistent with every answer, and the second run would cost as much again. This book's
#: rule (issue 22, item 5).
SKIP_SECOND_START_FIT = 1.0

#: The sqrt-weighted run of ``learn_low_rank_noisy(method="rgn")`` only gives the start of the run
#: that is kept, so it stops at a relative residual decrease below ``START_RUN_RTOL`` (the kept runs:
#: 1e-6) and solves its tangent problems to ``START_RUN_INNER_RTOL`` (the kept runs: 0.1); at
#: d = 384, r = 32 this halves its inner iterations. This book's choice (issue 22, item 5).
START_RUN_RTOL = 1e-4
START_RUN_INNER_RTOL = 0.3

_NOISY_MESSAGES = {
    "infeasible": (
        "SCS found the noise-aware nuclear-norm program {status}: no matrix meets all {m} "
        "constraints |<a_k b_k^T, W> - t_k| <= delta_k, which every head with ||W*||_F <= "
        "W_max={W_max:g} answered within tau={tau:.3g} would. Either ||W*||_F > W_max (raise W_max), "
        "the oracle errs by more than tau (raise tau), or it is not a single head."
    ),
    "inaccurate": (
        "SCS stopped with status {status!r} on the noise-aware nuclear-norm program "
        "(eps={eps:g}, {its} iterations); loosen solver_eps or use method='rgn'."
    ),
    "fit": (
        "the best rank-{r} fit leaves a weighted residual fit_ratio={ratio:.3g} times the largest "
        "one a head with rank(W*) <= {r} and ||W*||_F <= W_max={W_max:g} answering within "
        "tau={tau:.3g} can leave (at most 1): rank(W*) > {r} (raise rank), ||W*||_F > W_max, the "
        "oracle errs by more than tau, or it is not a single head; or Gauss-Newton stopped in a "
        "wrong minimum (try another seed or method='nuclear')."
    ),
}


def _noisy_nuclear(A, B, t, delta, *, eps, tau, W_max):
    """``min ||W||_* s.t. |<a_k b_k^T, W> - t_k| <= delta_k`` with SCS; SolverError unless optimal."""
    import cvxpy as cp

    # The same normalisation as companion.lowrank._solve_nuclear: unit-norm rows on average, so
    # SCS's absolute stopping rule acts as a relative one.
    s = np.sqrt(np.mean(np.sum(A**2, 1) * np.sum(B**2, 1)))
    An, Bn = A / np.sqrt(s), B / np.sqrt(s)
    d = A.shape[1]
    W = cp.Variable((d, d))
    constraints = [cp.abs(cp.sum(cp.multiply(An @ W, Bn), axis=1) - t / s) <= delta / s]
    problem = cp.Problem(cp.Minimize(cp.normNuc(W)), constraints)
    # SCS, explicitly: the nuclear norm is an SDP of size 2d, which SCS (first-order) solves far
    # faster than an interior-point solver at these sizes, and it reports infeasibility, which
    # here means that the assumptions (W_max, tau) are wrong. cvxpy's default could change.
    try:
        problem.solve(solver=cp.SCS, eps_abs=eps, eps_rel=eps, max_iters=100_000)
    except cp.error.SolverError as exc:
        raise SolverError(f"SCS failed on the noise-aware nuclear-norm program: {exc}") from None
    its = int(problem.solver_stats.num_iters or 0)
    info = {
        "solver": "SCS",
        "status": problem.status,
        "solve_iterations": its,
        "objective": float(problem.value) if problem.value is not None else float("nan"),
    }
    if problem.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        raise SolverError(_NOISY_MESSAGES["infeasible"].format(status=problem.status, m=len(t), W_max=W_max, tau=tau))
    if problem.status != cp.OPTIMAL:
        raise SolverError(_NOISY_MESSAGES["inaccurate"].format(status=problem.status, eps=eps, its=its))
    return np.asarray(W.value, dtype=np.float64), info


def _one_blas_thread():
    """Limit BLAS to one thread (threadpoolctl); a no-op context if threadpoolctl is missing."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        from contextlib import nullcontext

        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _fit_ratio(res, delta, w) -> float:
    """``sum w res^2 / sum w delta^2``: at most 1 for ``W*`` (``|res_k| <= delta_k``)."""
    return float(np.sum(w * res**2) / max(float(np.sum(w * delta**2)), np.finfo(float).tiny))


def _check_fit(res, delta, w, *, r, tau, W_max, refuse=True) -> float:
    """``sum w res^2 / sum w delta^2``; with ``refuse``, raise if it exceeds ``FIT_SLACK``."""
    ratio = _fit_ratio(res, delta, w)
    if refuse and ratio > FIT_SLACK:
        raise OracleInconsistentError(_NOISY_MESSAGES["fit"].format(ratio=ratio, r=r, tau=tau, W_max=W_max))
    return ratio


#: ``learn_low_rank_noisy(method="rgn")`` refuses its ``W`` as undetermined when a head of rank at
#: most ``r`` with ``||W||_F <= W_max`` that meets every measurement's bound ``delta_k`` (as ``W*``
#: does) lies at least ``UNDETERMINED_RATIO min(||W_hat||_F, W_max)`` from ``W_hat``: the answers
#: then cannot exclude a relative error of 1, an estimate no better than 0. Below that, an
#: ``ambiguity_W`` above the verification's allowance is reported in the message. This book's rule
#: (issue 22, item 5: a MiniLM head in float16 and bfloat16).
UNDETERMINED_RATIO = 1.0

#: Relative margin of the thresholds of :func:`_check_determined` (float64 rounding at the edge).
AMBIGUITY_SLACK = 1e-9


#: Relative margin by which :func:`_widened` passes a point's own largest violation.
OWN_VIOLATION_MARGIN = 1e-9


def _widened(res, bound):
    """``bound`` (m,) scaled up to the point's own largest violation ``max_k |res_k| / bound_k``
    when that is above 1, and by :data:`OWN_VIOLATION_MARGIN` beyond it, so that the point
    (``s = 0``) is inside every :func:`_interval` built on the result however its last bound
    rounds. Scaled exactly to the violation, the point sat on one bound, and an interval came out
    ``[-7.8e-08, -2.2e-18]`` under the Prescott kernel: :func:`_check_norm_bound` then missed a
    pinned ``||W_hat||_F > W_max``, and :func:`_ambiguity` skips such a direction, so its bound
    came out smaller."""
    with np.errstate(divide="ignore", invalid="ignore"):
        own = float(np.max(np.abs(res) / np.maximum(bound, np.finfo(float).tiny), initial=0.0))
    return bound * max(1.0, own * (1.0 + OWN_VIOLATION_MARGIN))


def _interval(res, delta, g):
    """The interval of ``s`` with ``|res_k + s g_k| <= delta_k`` for every ``k`` (``(lo, hi)``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = (-delta - res) / g, (delta - res) / g
    moving = g != 0
    lo = float(np.max(np.minimum(a, b)[moving], initial=-np.inf))
    hi = float(np.min(np.maximum(a, b)[moving], initial=np.inf))
    return lo, hi


def _ambiguity(A, B, res, delta, factors, *, W_max, offset=None):
    """A lower bound on ``max ||W - W_hat||_F`` over the heads the measurements allow.

    ``W_0 = U S V^T`` (``factors``, ``(U S, V^T)``), ``res = <a_k b_k^T, W_0> - t_k``. Along
    the unit directions ``D = W_0 / ||W_0||_F`` (the scale) and ``u_i v_i^T`` (each singular
    component), ``W_0 + s D`` keeps rank at most ``r``; the measurements allow it while
    ``|res_k + s <a_k b_k^T, D>| <= delta_k`` for every ``k`` and ``||W_0 + s D||_F <= W_max``.
    Every such ``W`` is as consistent with the answers as ``W*`` is, so no error below the
    largest ``||W_0 + s D - W_hat||_F`` is certified: ``|s|`` when ``W_0 = W_hat``, the default,
    else with ``offset = W_0 - W_hat`` (d, d). ``O(m d r)``; 0 if no direction has an allowed point.
    """
    U, sv, V = _factor_svd(*factors)
    nW = float(np.linalg.norm(sv))
    if nW == 0:
        return 0.0
    AU, BV = A @ U, B @ V
    # (g, <W_0, D>): the scale direction, then one per singular component
    directions = [(np.einsum("ki,ki,i->k", AU, BV, sv) / nW, nW)]
    directions += [(AU[:, i] * BV[:, i], sv[i]) for i in range(len(sv))]
    # (||offset||^2, <offset, D>) for ||offset + s D||^2 = e2 + 2 s q + s^2
    if offset is None:
        e2, qs = 0.0, [0.0] * len(directions)
    else:
        e2 = float(np.sum(offset**2))
        qs = [float(np.sum(offset * ((U * sv) @ V.T))) / nW]
        qs += [float(U[:, i] @ offset @ V[:, i]) for i in range(len(sv))]
    best = 0.0
    for (g, p), q in zip(directions, qs):
        lo, hi = _interval(res, delta, g)
        # ||W_0 + s D||^2 = nW^2 + 2 s p + s^2 <= W_max^2
        disc = p**2 - nW**2 + W_max**2
        if disc < 0:
            continue
        lo, hi = max(lo, -p - np.sqrt(disc)), min(hi, -p + np.sqrt(disc))
        if lo <= hi:
            best = max(best, *(float(np.sqrt(max(e2 + 2 * x * q + x * x, 0.0))) for x in (lo, hi)))
    return best


def _nuclear_ambiguity(A, B, t, delta, w, W, r, *, W_max, max_iter):
    """:func:`_ambiguity` for a noise-aware nuclear-norm solution ``W`` (the certification rgn's
    fit gets), on its rank-``r`` part (:func:`_check_nuclear_rank` bounds the rest).

    The program's solution sits where many bounds are active, which pinches the directions of
    :func:`_ambiguity`; so they are also measured from the rank-``r`` least-squares fit (weights
    ``w``) started there, whose own distance from ``W`` counts when it meets every bound within
    ``W_max``, as ``W*`` does. From the rank-``r`` part the bounds are widened by its own largest
    violation (SCS's tolerance and the cut singular values), so that the directions start from an
    allowed point. Without this a ``W`` off by 0.77 at ``tau = 1e-3`` (d = 8, rank 2) came back
    verified, as fresh queries certify lower bounds only.
    """
    U, s, Vt = np.linalg.svd(W)
    factors = (U[:, :r] * s[:r], Vt[:r])
    res_r = _rop_apply_factors(A, B, *factors) - t
    ambiguity = _ambiguity(A, B, res_r, _widened(res_r, delta), factors, W_max=W_max)
    with _one_blas_thread():
        W_ls, info_ls = _weighted_rgn(A, B, t, w, r, max_iter=max_iter, start=(U[:, :r], s[:r], Vt[:r].T))
    res_ls = _rop_apply_factors(A, B, *info_ls["factors"]) - t
    ambiguity = max(ambiguity, _ambiguity(A, B, res_ls, delta, info_ls["factors"], W_max=W_max, offset=W_ls - W))
    if np.all(np.abs(res_ls) <= delta) and np.linalg.norm(W_ls) <= W_max:
        ambiguity = max(ambiguity, float(np.linalg.norm(W_ls - W)))
    return ambiguity


def _check_norm_bound(W, fit, t, delta, *, W_max, rtol):
    """Refuse a ``W_hat`` whose answers pin its scale above ``W_max`` (§6's ``||W*||_F <= W_max``).

    As :func:`learn_robust` refuses a weight outside Lemma 6.1's window, this refuses, with no new
    query, a fit the assumption does not explain. Along ``W_hat``'s own direction ``D = W_hat /
    ||W_hat||_F`` (rank unchanged), the heads ``W_hat + s D`` meeting every bound
    ``|<a_k b_k^T, W> - t_k| <= delta_k`` (``delta_k`` plus ``sqrt(eps) max |t|`` for float64
    rounding, so that ``tau = 0`` has a floor; all scaled up by ``W_hat``'s own largest violation
    if above 1, a solver's tolerance) have ``s`` in an interval ``[lo, hi]``
    (:func:`_interval`), so norms ``||W_hat||_F + s``. It refuses when the answers *pin* the scale
    there, ``-lo <= rtol ||W_hat||_F``, and the smallest of those norms is still above
    ``(1 + rtol) W_max``. When the interval is wide (the answers leave the scale open, as at a
    coarse ``tau``), ``W_hat``'s excess over ``W_max`` is not evidence against ``W_max``, and the
    undetermined-``W`` check (:func:`_check_determined`) speaks instead. ``fit`` is
    ``<a_k b_k^T, W_hat>``.
    """
    nW = float(np.linalg.norm(W))
    if nW <= (1.0 + rtol) * W_max or nW == 0:
        return
    bound = delta + np.sqrt(np.finfo(float).eps) * float(np.max(np.abs(t), initial=0.0))
    # a solver's solution may exceed the bounds by its tolerance: widened to W_hat's own violation
    bound = _widened(fit - t, bound)
    lo, hi = _interval(fit - t, bound, fit / nW)
    if not (lo <= 0.0 <= hi) or -lo > rtol * nW or nW + lo <= (1.0 + rtol) * W_max:
        return
    raise OracleInconsistentError(
        f"||W_hat||_F = {nW:.3g} exceeds W_max={W_max:g}, and the answers pin its scale: along "
        f"W_hat's direction the heads meeting all {t.size} bounds |<a_k b_k^T, W> - t_k| <= delta_k "
        f"(which every head within tau of the answers meets) have ||W||_F in [{nW + lo:.4g}, "
        f"{nW + hi:.4g}], all above W_max: W_hat is not W*. Either ||W*||_F > W_max (near "
        f"{nW:.3g}: pass W_max >= {nW:.3g}, which also sets the query scales), or the fit missed "
        f"W* (too few measurements for this tau: raise n_measurements, or lower tau), or the "
        f"oracle errs by more than tau, or it is not a single head; verify=0 returns the fit."
    )


def _check_nuclear_rank(W, r, *, tau, rtol):
    """Refuse a noise-aware nuclear-norm solution whose ``(r + 1)``-th singular value exceeds ``rtol``.

    The program never uses ``r`` (as in :func:`companion.lowrank.learn_low_rank`'s exact nuclear
    method), so it may return a higher rank: always for a target of higher rank once ``m >= d^2``,
    and, at a large ``tau``, by spreading the noise over extra directions. Either way a ``W``
    that far (Eckart-Young: ``sigma_{r+1}``) from every rank-``r`` matrix is not the rank-``r``
    result the learner returns.
    """
    sv = np.linalg.svd(W, compute_uv=False)
    if sv.size <= r or sv[0] == 0 or sv[r] <= rtol * sv[0]:
        return
    raise OracleInconsistentError(
        f"the noise-aware nuclear-norm solution has singular value {r + 1} at {sv[r] / sv[0]:.3g} "
        f"relative, above verify_rtol={rtol:g}: it is not a rank-{r} head (the program does not use "
        f"rank). Either rank(W*) > {r} (pass a larger rank), or the answers at tau={tau:.3g} do not "
        "pin W and the program spread their noise over extra directions (raise n_measurements, "
        "lower tau, or use method='rgn', which fits rank r and says when W is not determined)."
    )


_UNDETERMINED = (
    "the answers do not determine W at this precision: {evidence}. At tau={tau:.3g} the m={m} "
    "rank-one projections leave a set of rank-{r} heads consistent with every answer (as W* is) "
    "larger than the error the result would claim, although the fit is within the answers' "
    "rounding (fit_ratio={fit_ratio:.2g}){stopped}. Raise n_measurements, or ask at a higher "
    "precision (smaller tau); pass verify=0 to get the undetermined estimate anyway."
)


def _check_determined(info, W, *, W_max, rtol, r, m, tau, max_iter, refuse=True) -> str:
    """Refuse an undetermined ``W`` (:class:`PrecisionError`), or return the message's clause.

    Undetermined: ``excess_norm_W`` exceeds the verification's allowance
    ``rtol min(||W||_F, W_max)`` (a proven error, as :func:`companion._learner.verify_noisy`
    refuses), or ``ambiguity_W`` reaches ``UNDETERMINED_RATIO min(||W||_F, W_max)``; both times
    ``1 + AMBIGUITY_SLACK``. Then it raises, or without ``refuse`` returns the clause
    ``"; not determined by the answers: ..."``. Otherwise it returns ``""``, or, if
    ``ambiguity_W`` exceeds the allowance, a clause that says no error below it is certified.
    """
    size = min(float(np.linalg.norm(W)), W_max)
    allowed = rtol * size * (1 + AMBIGUITY_SLACK) + 1e-12
    head = f"a rank-{r} head with ||W||_F <= W_max={W_max:g} within every bound delta_k lies"
    if info["excess_norm_W"] > allowed:
        evidence = (
            f"||W_hat||_F exceeds W_max={W_max:g}, so ||W_hat - W*||_F >= {info['excess_norm_W']:.3g}, "
            f"more than the {allowed:.3g} the verification allows (verify_rtol={rtol:g})"
        )
    elif info["ambiguity_W"] >= UNDETERMINED_RATIO * size * (1 + AMBIGUITY_SLACK):
        evidence = (
            f"{head} ||W - W_hat||_F={info['ambiguity_W']:.3g} from W_hat, at least "
            f"{UNDETERMINED_RATIO:g} x min(||W_hat||_F, W_max)={size:.3g}"
        )
    elif info["ambiguity_W"] > allowed:
        return f"; not certified to verify_rtol={rtol:g}: {head} {info['ambiguity_W']:.2g} from W"
    else:
        return ""
    if not refuse:
        return f"; not determined by the answers: {evidence}"
    stopped = "" if info.get("converged", True) else f"; Gauss-Newton stopped at max_iter={max_iter}"
    raise PrecisionError(
        _UNDETERMINED.format(evidence=evidence, tau=tau, m=m, r=r, fit_ratio=info["fit_ratio"], stopped=stopped)
    )


def learn_low_rank_noisy(
    oracle,
    rank,
    *,
    W_max,
    tau=None,
    n_measurements=None,
    method="rgn",
    logit_max=0.5,
    solver_eps=1e-7,
    max_iter=30,
    verify=DEFAULT_VERIFY,
    verify_rtol=0.1,
    seed=0,
):
    """Recover a head with ``rank(W*) <= r`` from approximate value queries: noisy ROP.

    Parameters
    ----------
    oracle : ApproxValueQueryOracle or ValueQueryOracle
        Oracle within ``tau`` of :math:`f_{W^*, v^*}` (§6), ``v* != 0``; answers sequences of length 1 and 2.
    rank : int
        Upper bound ``r`` on ``rank(W*)``, ``1 <= r <= d``.
    W_max : float
        Known bound ``||W*||_F <= W_max`` (``> 0``); it sets the query scales.
    tau : float, default=None
        Tolerance assumed for the answers (``>= 0``); ``None`` takes ``oracle.tau``.
    n_measurements : int, default=None
        Number ``m >= r (2d - r)`` of Gaussian ROP measurements; default
        ``ceil(3 r (2d - r))`` (``NOISY_OVERSAMPLING``).
    method : {"rgn", "nuclear"}, default="rgn"
        ``"nuclear"``: ``min ||W||_* s.t. |<a_k b_k^T, W> - t_k| <= delta_k`` through cvxpy and SCS
        (an SDP of size 2d: keep ``d`` small, say up to 30). ``"rgn"``: rank-``r`` least squares
        weighted by ``1 / delta_k``, by Riemannian Gauss-Newton; scales to ``d`` in the hundreds.
    logit_max : float, default=0.5
        Largest logit of a query (``0 < logit_max <= 5``); ``1/2`` is Lemma 6.1's window.
    solver_eps : float, default=1e-7
        SCS's ``eps_abs`` and ``eps_rel`` (``"nuclear"``).
    max_iter : int, default=30
        Largest number of Gauss-Newton iterations (``"rgn"``).
    verify : int, default=32
        Fresh queries (8 of length 1, 24 rank-one projections; never used for learning) that
        certify lower bounds on the errors (``companion._learner.verify_noisy``); 0 opts out.
        The learner assumes a single head within ``tau`` of the answers with ``||W*||_F <= W_max``
        and ``rank(W*) <= rank``, and ``"rgn"`` that Gauss-Newton reached the right minimum. If
        the fresh answers prove ``||W_hat - W*||_F > verify_rtol ||W_hat||_F`` (or the same for
        ``v``, beyond ``sqrt(d) tau``), it raises. No upper bound on ``||W_hat - W*||_F`` is
        certified (it would need the design's restricted isometry constant); ``"rgn"`` also
        raises when the answers provably leave ``W*`` undetermined, and says so in the message
        when they do not pin it to ``verify_rtol`` (``ambiguity_W``, ``excess_norm_W``; Raises).
    verify_rtol : float, default=0.1
        Relative error the check allows.
    seed : int, default=0
        Seed of ``numpy.random.default_rng`` for the measurement vectors (and, plus 1, of the
        verification queries).

    Returns
    -------
    LowRankRecovery
        ``W`` (d, d) of rank at most ``r`` (``"rgn"``; ``"nuclear"`` returns the program's solution),
        ``v`` (d,), ``n_queries = d + m``, ``rank``, ``method``. ``diagnostics``: ``tau``,
        ``n_measurements``, ``scales`` (m,), ``delta`` (m,) the per-measurement bounds of
        :func:`rop_error_bound`, ``n_clipped``, ``max_abs_logit`` (estimated), and the solver's
        ``status``, ``solve_iterations``, ``objective`` (nuclear) or ``iterations``, ``stop`` (why
        Gauss-Newton stopped, ``"max_iter"`` when it ran out of iterations), ``converged``
        (``stop != "max_iter"``; when False the message says so too), ``residual``,
        ``residuals``, ``lsqr_iterations`` (inner conjugate-gradient iterations of the run kept; CGLS,
        whose iterates are LSQR's), ``start`` (``"sqrt-weighted"``, or ``"spectral"`` when the run
        from the spectral start, made only if the first fit is not certified, fits better) and
        ``fit_ratio`` (rgn: the weighted residual ``sum_k w_k r_k^2`` over ``sum_k w_k delta_k^2``,
        at most 1 for a global minimiser when the assumptions hold), ``max_violation``
        (``max_k |<a_k b_k^T, W> - t_k| / delta_k``, at most 1 for ``W*``), ``singular_values``
        (top ``r + 1`` of ``W``), with ``tau > 0`` ``ambiguity_W`` (a lower bound on how far
        from ``W`` (for ``"nuclear"``, from its rank-r part) a head of rank at most r with
        ``||W||_F <= W_max`` meeting every bound delta_k, as ``W*`` does, can lie; no smaller
        error is certified) and ``excess_norm_W``
        (``max(||W||_F - W_max, 0)``, a lower bound on ``||W - W*||_F``), and the
        verification's ``n_verify_queries``, ``verify_error_W``,
        ``verify_error_v``, ``verify_allowed_W``, ``verify_allowed_v``. ``n_queries`` counts the
        verification queries; ``n_learning_queries`` (``d + m``) leaves them out.

    Raises
    ------
    TypeError
        If ``oracle`` is not a value-query oracle, or answers labels (``tau = inf``, a
        :class:`~companion.membership.MembershipQueryOracle`); before any query.
    InvalidInputError
        For a bad ``rank``, ``W_max``, ``tau``, ``method``, ``logit_max`` or solver option, or
        ``"nuclear"`` above :data:`companion.lowrank.NUCLEAR_MAX_BYTES` (estimated by
        :func:`companion.lowrank.nuclear_program_size`); before the first query.
    NotIdentifiableError
        If ``n_measurements < r (2d - r)`` (before the first query), or if ``v_hat = 0``.
    BudgetExceededError
        If the budget is below ``d + m``; before the first query.
    SolverError
        If SCS does not reach an optimal solution, in particular if the program is infeasible:
        then no head with ``||W*||_F <= W_max`` answered within ``tau`` (the message says which
        assumption to relax).
    OracleInconsistentError
        ``"rgn"``, ``tau > 0``, ``verify > 0`` (the default; the check spends no query): if the
        weighted residual of the rank-``r`` fit exceeds
        ``FIT_SLACK`` times the largest one a head inside the assumptions allows
        (``fit_ratio > FIT_SLACK``): no rank-``r`` head with ``||W*||_F <= W_max`` answered within
        ``tau``, or Gauss-Newton stopped in a wrong minimum. Also if the verification fails.
        ``"nuclear"`` with ``verify``: if the solution's ``(r + 1)``-th singular value exceeds
        ``verify_rtol`` relative (the program does not use ``rank``): ``rank(W*) > rank``, or
        the answers do not pin ``W`` at this ``tau``.
        Either method, any ``tau``, ``verify > 0`` (as :func:`learn_robust` refuses a weight
        outside its window; no query): if ``||W_hat||_F > (1 + verify_rtol) W_max`` and the
        answers pin the scale there (along ``W_hat``'s direction they allow norms within
        ``verify_rtol ||W_hat||_F`` of it, all above ``(1 + verify_rtol) W_max``): then
        ``W_hat`` is not ``W*`` (no head along it meets both the bounds and ``W_max``), and the
        message names both causes, ``||W*||_F > W_max`` (the ``W_max`` to pass) and a fit that
        missed ``W*`` (too few measurements for this ``tau``). ``verify=0`` returns the fit.
    PrecisionError
        Either method, ``tau > 0``, ``verify > 0``: if ``excess_norm_W`` exceeds
        ``verify_rtol min(||W||_F, W_max)``, or ``ambiguity_W`` reaches
        ``UNDETERMINED_RATIO min(||W||_F, W_max)`` (both times ``1 + AMBIGUITY_SLACK``): the
        answers, at their precision ``tau`` and this ``m``, do not determine ``W*`` (say, a
        MiniLM head served in float16). More measurements or a smaller ``tau`` are needed;
        ``verify=0`` returns the estimate anyway, and says in its message that it is not
        determined. An ``ambiguity_W`` between the two is said in the message ("not certified
        to verify_rtol").

    Notes
    -----
    Not in the paper, which treats approximate queries (§6) and low rank (§5) separately [1]_. One
    two-token query ``c_k [(a_k + b_k)^T; b_k^T]`` (:func:`companion.lowrank.rop_queries`) gives the
    rank-one projection ``<a_k b_k^T, W*>`` of Cai & Zhang [2]_ through the weight
    ``alpha = (y / c - b^T v) / a^T v``. The scale ``c_k`` (:func:`rop_scales`) keeps both tokens in
    the unit ball and the logit ``c**2 a^T W* b`` within ``[-1/2, 1/2]`` whatever ``W*`` with
    ``||W*||_F <= W_max``, so the weight is clipped to Lemma 6.1's window and inverted, and every
    measurement gets a bound ``delta_k`` (:func:`rop_error_bound`, of order
    ``tau W_max^{3/2} ||a||^{3/2} ||b||^{3/2} / |a^T v|``). ``W*`` is feasible for the nuclear-norm
    program, which is the noisy ROP estimator of [2]_ with an entrywise (rather than l1) constraint;
    its error is ``O(||delta|| / sqrt(m))`` times the operator's inverse restricted isometry
    constant. The Gauss-Newton alternative [3]_ solves the rank-constrained least squares instead.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Cai, Zhang, "ROP: Matrix recovery via rank-one projections", Ann. Statist. 43(1), 2015.
    .. [3] Luo, Huang, Li, Zhang, "Recursive importance sketching for rank constrained least
       squares: algorithms and high-order convergence", Operations Research, 2023.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ApproxValueQueryOracle
    >>> head = random_margin_head(10, W_max=4.0, mu=0.1, rank=2, seed=0)
    >>> rec = learn_low_rank_noisy(ApproxValueQueryOracle(head, 1e-6), 2, W_max=4.0)
    >>> rec.n_learning_queries, 10 + 3 * 2 * (2 * 10 - 2)
    (118, 118)
    >>> bool(np.linalg.norm(rec.W - head.W) < 1e-2), int(np.linalg.matrix_rank(rec.W))
    (True, 2)
    """
    d, oracle_tau = _check_oracle(oracle, "learn_low_rank_noisy")
    r = check_int(rank, "rank", minimum=1, maximum=d)
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    tau = oracle_tau if tau is None else check_real(tau, "tau", minimum=0.0)
    check_choice(method, "method", NOISY_METHODS)
    logit_max = check_real(logit_max, "logit_max", minimum=0.0, strict=True, maximum=5.0)
    solver_eps = check_real(solver_eps, "solver_eps", minimum=0.0, strict=True)
    max_iter = check_int(max_iter, "max_iter", minimum=1)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    dof = degrees_of_freedom(d, r)
    if n_measurements is None:
        m = int(np.ceil(NOISY_OVERSAMPLING * dof))
    else:
        m = check_int(n_measurements, "n_measurements", minimum=1)
    if m < dof:
        raise NotIdentifiableError(
            f"n_measurements={m} cannot determine a rank-{r} {d} x {d} matrix: it has r(2d - r) = "
            f"{dof} degrees of freedom. Raise n_measurements to at least {dof} (with noise, "
            f"{int(np.ceil(NOISY_OVERSAMPLING * dof))} or more)."
        )
    if method == "nuclear":
        check_nuclear_size(d, m, r, "learn_low_rank_noisy")
    start = reserve(oracle, d + m + verify, "learn_low_rank_noisy")
    rng = np.random.default_rng(seed)

    v_hat = read_value_vector(oracle)
    if not np.any(v_hat):
        raise NotIdentifiableError("every v_hat_i is 0: f is (within tau) identically 0 and W is not identifiable.")
    A, B = _gaussian_rop_design(d, m, v_hat, rng)
    c = rop_scales(A, B, W_max=W_max, logit_max=logit_max)
    y = answer_rop(oracle, A, B, c)  # in bounded chunks: no (m, 2, d) array
    av, bv = A @ v_hat, B @ v_hat
    alpha_hat = (y / c - bv) / av
    lo = float(expit(-logit_max))
    n_clipped = int(np.sum((alpha_hat < lo) | (alpha_hat > 1 - lo)))
    t = logit(np.clip(alpha_hat, lo, 1 - lo)) / c**2
    delta, _ = rop_error_bound(alpha_hat, tau=tau, c=c, A=A, B=B, av_hat=av, logit_max=logit_max)

    diagnostics = {
        "tau": tau,
        "n_measurements": m,
        "scales": c,
        "delta": delta,
        "n_clipped": n_clipped,
        "max_abs_logit": float(np.max(np.abs(t * c**2))),
    }
    undetermined = ""  # the message's clause when W is not certified to verify_rtol
    w = 1.0 / np.maximum(delta, np.finfo(float).tiny) if tau > 0 else np.ones(m)
    w = w / np.max(w)
    if method == "nuclear":
        W, info = _noisy_nuclear(A, B, t, delta, eps=solver_eps, tau=tau, W_max=W_max)
        fit = _rop_apply(A, B, W)
        how = "noise-aware nuclear-norm program (SCS)"
    else:
        # Two runs: from the solution of the problem with the milder weights sqrt(w), whose
        # landscape has fewer spurious minima, and, unless that fit is certified (fit_ratio <= 1:
        # consistent with the answers, as W* is), from the spectral start; the better is kept.
        # Many (m x 2dr) least-squares solves: one BLAS thread is faster, and on a busy
        # machine several threads spin-wait (measured 6 times slower on 2 shared cores).
        with _one_blas_thread():
            low = _single_precision(A, B, r)
            spectral = _spectral_start(A, B, t, r)
            start_run = {"rtol": START_RUN_RTOL, "inner_rtol": START_RUN_INNER_RTOL, "low": low}
            _, info_half = _weighted_rgn(A, B, t, np.sqrt(w), r, max_iter=max_iter, start=spectral, **start_run)
            Uh, sh, Vh = _factor_svd(*info_half["factors"])
            W, info = _weighted_rgn(A, B, t, w, r, max_iter=max_iter, start=(Uh[:, :r], sh[:r], Vh[:, :r]), low=low)
            info["start"] = "sqrt-weighted"
            if tau == 0 or _fit_ratio(_rop_apply_factors(A, B, *info["factors"]) - t, delta, w) > SKIP_SECOND_START_FIT:
                W1, info1 = _weighted_rgn(A, B, t, w, r, max_iter=max_iter, start=spectral, low=low)
                if info1["residual"] < info["residual"]:
                    W, info = W1, dict(info1, start="spectral")
        factors = info.pop("factors")
        fit = _rop_apply_factors(A, B, *factors)  # O(m d r): W = F G never applied
        how = f"weighted rank-{r} least squares (Riemannian Gauss-Newton)"
        info["converged"] = info["stop"] != "max_iter"
    if verify:
        _check_norm_bound(W, fit, t, delta, W_max=W_max, rtol=verify_rtol)
        if method == "nuclear":
            _check_nuclear_rank(W, r, tau=tau, rtol=verify_rtol)
    if tau > 0:
        if method == "nuclear":
            info["fit_ratio"] = _fit_ratio(fit - t, delta, w)
            info["ambiguity_W"] = _nuclear_ambiguity(A, B, t, delta, w, W, r, W_max=W_max, max_iter=max_iter)
        else:
            info["fit_ratio"] = _check_fit(fit - t, delta, w, r=r, tau=tau, W_max=W_max, refuse=verify > 0)
            info["ambiguity_W"] = _ambiguity(A, B, fit - t, delta, factors, W_max=W_max)
        info["excess_norm_W"] = max(float(np.linalg.norm(W)) - W_max, 0.0)
        undetermined = _check_determined(
            info, W, W_max=W_max, rtol=verify_rtol, r=r, m=m, tau=tau, max_iter=max_iter, refuse=verify > 0
        )
    diagnostics.update(info)
    with np.errstate(divide="ignore", invalid="ignore"):
        # at most 1 for W*: a larger value certifies W != W*
        diagnostics["max_violation"] = float(np.max(np.abs(fit - t) / delta))
    diagnostics["singular_values"] = np.linalg.svd(W, compute_uv=False)[: r + 1]
    message = (
        f"recovered a rank-{r} W and v from {d} + {m} approximate value queries "
        f"(tau={tau:.3g}): {m} Gaussian rank-one projections, {how}"
    )
    if n_clipped:
        message += f"; {n_clipped} weights clipped to Lemma 6.1's window"
    if not diagnostics.get("converged", True):
        message += f"; Gauss-Newton stopped at max_iter={max_iter} before its stopping rule"
    message += undetermined
    checked = verify_noisy(
        oracle,
        W,
        v_hat,
        verify,
        tau=tau,
        W_max=W_max,
        allowed_v=np.sqrt(d) * tau,
        rtol=verify_rtol,
        seed=seed + 1,
        what=f"a single head within tau with ||W*||_F <= W_max and rank <= {r}",
    )
    return build(
        LowRankRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=W,
        v=v_hat,
        rank=r,
        method=method,
    )
