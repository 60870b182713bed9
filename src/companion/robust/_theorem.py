"""Lemma 6.1 and Theorem 6.2's algorithm: the clipped inversion, the proof's tolerance, the learner (private).

Re-exported by :mod:`companion.robust`; read the package's docstring first.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, logit

from .._learner import DEFAULT_VERIFY, build, check_verify, reserve, verify_noisy
from .._validation import check_int, check_real
from ..attention import SingleHead, random_single_head
from ..errors import InvalidInputError, OracleInconsistentError
from ..exact import read_value_vector
from ..numerics.rop import rop_queries
from ..recovery import Recovery

#: Lemma 6.1's clipping level sigma(-1/2) ~ 0.3775: a logit in [-1/2, 1/2] gives a weight in
#: [TAU_CLIP, 1 - TAU_CLIP].
TAU_CLIP = float(expit(-0.5))

#: Lipschitz constant of sigma^-1 on [TAU_CLIP, 1 - TAU_CLIP]: 1 / (TAU_CLIP (1 - TAU_CLIP)) ~ 4.255,
#: which Lemma 6.1 rounds up to 5.
LIPSCHITZ_6_1 = 1.0 / (TAU_CLIP * (1.0 - TAU_CLIP))

#: The constant of the tolerance in Theorem 6.2's proof, tau <= mu eps_W / (C W_max^2 d) (the theorem states O(.)).
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


def check_oracle(oracle, learner: str) -> tuple[int, float]:
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
    >>> from scipy.special import logit
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
    """The accuracies Theorem 6.2's proof guarantees at tolerance ``tau``, its condition inverted (this book's): the
    inverse of :func:`sufficient_tolerance`.

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


def robust_query_block(d, cols, *, a, b, U=None) -> np.ndarray:
    """:func:`robust_queries` for every column of ``cols`` at once, in the same order: shape
    ``(len(cols) k, 2, d)``, the same values (``b u_i`` plus ``a`` in column ``j``), built in one array
    instead of one call per column (at d = 384 the per-column calls took a fifth of
    :func:`learn_robust_lstsq`'s time)."""
    U = np.eye(d) if U is None else U
    cols = np.asarray(cols, dtype=np.intp)
    k = U.shape[0]
    X = np.zeros((cols.size, k, 2, d))
    X[:, :, 0, :] = np.reshape(b, (-1, 1)) * U
    X[np.arange(cols.size), :, 0, cols] += a
    X[np.arange(cols.size), :, 1, cols] = a
    return X.reshape(cols.size * k, 2, d)


def column_blocks(d):
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
        ``verify_allowed_W``, ``verify_allowed_v``, ``verify_vacuous_bound`` (the errors, ``"W"`` or
        ``"v"``, whose own bound was at least the estimate's norm: not allowed).

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
    d, tau = check_oracle(oracle, "learn_robust")
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
    for cols in column_blocks(d):
        y = np.asarray(oracle(robust_query_block(d, cols, a=a, b=b))).reshape(len(cols), d)
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
