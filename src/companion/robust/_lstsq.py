"""Beyond the paper: the probe scale that minimises Theorem 6.2's bound, and the least-squares learner (private)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from .._learner import QueryCount, DEFAULT_VERIFY, build, check_verify, reserve, verify_noisy
from .._validation import check_int, check_real
from ..errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from ..recovery import Recovery
from ._theorem import (
    check_oracle,
    column_blocks,
    robust_query_block,
)

# --------------------------------------------------------------------------------------------
# Beyond the paper: the probe scale and a least-squares learner
# --------------------------------------------------------------------------------------------


def entry_error_bound(b, *, tau, mu, W_max, a=0.5, probe_norm=1.0):
    """The worst-case bound of Theorem 6.2's proof on ``|W_hat_ij - W*_ij|``, its steps carried out exactly for a
    probe scale ``b`` (this book's computation).

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
        ``verify_error_v``, ``verify_allowed_W``, ``verify_allowed_v``, ``verify_vacuous_bound``
        (the errors, ``"W"`` or ``"v"``, whose own bound was at least the estimate's norm: not allowed).

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
    >>> from companion.robust import learn_robust_lstsq, random_margin_head
    >>> head = random_margin_head(4, W_max=2.0, mu=0.2, seed=0)
    >>> rec = learn_robust_lstsq(ApproxValueQueryOracle(head, 1e-6), W_max=2.0, repeats=2)
    >>> rec.n_learning_queries, bool(np.linalg.norm(rec.W - head.W) < 1e-3)
    (48, True)
    """
    d, tau = check_oracle(oracle, "learn_robust_lstsq")
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    R = check_int(repeats, "repeats", minimum=1)
    rank = None if rank is None else check_int(rank, "rank", minimum=1, maximum=d, maximum_name="d")
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    a, probe_norm = 0.5, np.sqrt(2.0)
    b0 = _probe_scale(scale, W_max, a, probe_norm)
    start = reserve(oracle, n_queries_lstsq(d, R) + verify, "learn_robust_lstsq")
    count = QueryCount(oracle)
    c = 1.0 - 0.3 * np.arange(R) / R  # scales of the length-1 queries; b0 c those of the probes
    v_hat, v_noise = _read_v_repeated(oracle, c, d, tau)
    p, s, U = _pivot_probes(v_hat, d)
    # Row p enters every other row (W_ij = T_ij - s_i T_pj), so it gets ceil(sqrt(d)) times the
    # repeats: R (ceil(sqrt(d)) - 1) d extra queries, small against R d^2.
    K = R * (int(np.ceil(np.sqrt(d))) - 1)
    bs, b_pivot = b0 * c, b0 * (1.0 - 0.3 * (np.arange(K) + 1.0 / 3.0) / max(K, 1))
    passes = [(b, np.arange(d)) for b in bs] + [(b, np.array([p])) for b in b_pivot]
    T, n_clipped = _weighted_logits(oracle, passes, U, v_hat, a=a, probe_norm=probe_norm, W_max=W_max)
    W_hat = T - np.outer(np.where(np.arange(d) == p, 0.0, s), T[p])
    if rank is not None and rank < d:
        Us, sv, Vt = np.linalg.svd(W_hat)
        W_hat = (Us[:, :rank] * sv[:rank]) @ Vt[:rank]
    eps_W_bound = _lstsq_error_bound(np.concatenate([bs, b_pivot]), tau, v_noise, np.abs(U @ v_hat), W_max, a, p, rank)
    _refuse_too_large(W_hat, W_max, eps_W_bound, tau)
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
    message = (
        f"recovered W and v from {count.total} approximate value queries "
        f"(margin-free probes, b = {b0:.3g}, {R} scales, {R + K} for the pivot row)"
    )
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


def _probe_scale(scale, W_max, a, probe_norm) -> float:
    """Option stage of :func:`learn_robust_lstsq`: the probe scale ``b0``, ``"best"`` or checked."""
    b_cap = (1.0 - a) / probe_norm
    if isinstance(scale, str):
        if scale != "best":
            raise InvalidInputError(f"scale={scale!r} must be 'best' or a float in (0, {b_cap:.4g}].")
        return best_scale(W_max, a=a, probe_norm=probe_norm)
    return check_real(scale, "scale", minimum=0.0, strict=True, maximum=b_cap)


def _read_v_repeated(oracle, c, d, tau):
    """Stage of :func:`learn_robust_lstsq`: ``v`` by least squares over ``y_r = c_r v_i + noise``
    (``len(c) d`` length-1 queries); ``(v_hat, v_noise)`` with ``|v_hat_i - v*_i| <= v_noise``."""
    Y = np.stack([np.asarray(oracle(cr * np.eye(d)[:, None, :])) for cr in c])
    v_hat = (c @ Y) / (c @ c)
    v_noise = tau * float(np.sum(np.abs(c)) / (c @ c))
    if not np.any(np.abs(v_hat) > v_noise):
        raise NotIdentifiableError(
            f"every |v_hat_i| is at most {v_noise:.3g}, the read-out error allowed by tau={tau:g}: "
            "v* may be 0, then f is identically 0 and W is not identifiable. A smaller tau is needed."
        )
    return v_hat, v_noise


def _pivot_probes(v_hat, d):
    """Stage of :func:`learn_robust_lstsq`: the pivot ``p`` (largest ``|v_hat_p|``), the signs ``s``
    and the probes ``U = I + s e_p^T`` off row ``p`` (so that every ``|u_i^T v_hat| >= |v_hat_p|``)."""
    p = int(np.argmax(np.abs(v_hat)))
    s = np.where(np.sign(v_hat * v_hat[p]) < 0, -1.0, 1.0)
    U = np.eye(d)
    U[np.arange(d) != p, p] += s[np.arange(d) != p]
    return p, s, U


def _weighted_logits(oracle, passes, U, v_hat, *, a, probe_norm, W_max):
    """Stage of :func:`learn_robust_lstsq`: ``T[i, j] ~ u_i^T W e_j``, the logits of every pass
    ``(b, rows)`` weighted by ``(b^2 alpha (1 - alpha))^2``, and the number of clipped weights."""
    d = U.shape[0]
    uv = U @ v_hat
    num = np.zeros((d, d))
    den = np.zeros((d, d))
    n_clipped = 0
    for b, rows in passes:
        x_max = a * b * probe_norm * W_max
        lo = float(expit(-x_max))
        for cols in column_blocks(d):
            y = np.asarray(oracle(robust_query_block(d, cols, a=a, b=b, U=U[rows]))).reshape(len(cols), len(rows))
            for k, j in enumerate(cols):
                alpha = (y[k] - a * v_hat[j]) / (b * uv[rows])
                n_clipped += int(np.sum((alpha < lo) | (alpha > 1 - lo)))
                alpha = np.clip(alpha, lo, 1 - lo)
                t = logit(alpha) / (a * b)
                w = (b * b * alpha * (1 - alpha)) ** 2
                num[rows, j] += w * t
                den[rows, j] += w
    return num / den, n_clipped


def _lstsq_error_bound(all_b, tau, v_noise, abs_uv, W_max, a, p, rank) -> float:
    """Stage of :func:`learn_robust_lstsq`: the guarantee of its Notes, ``||W* - W_hat||_F <=
    eps_W_bound``, with the observed denominators ``|u_i^T v_hat|`` row by row."""
    d = abs_uv.size
    row_err = np.max(_lstsq_logit_error(all_b[None, :], tau, v_noise, abs_uv[:, None], W_max, a=a), axis=1)
    entry = row_err + np.where(np.arange(d) == p, 0.0, row_err[p])
    eps_W_bound = float(np.sqrt(d) * np.linalg.norm(entry))
    if rank is not None and rank < d:
        eps_W_bound *= 2.0  # Eckart-Young: the truncation at most doubles it
    return eps_W_bound


def _refuse_too_large(W_hat, W_max, eps_W_bound, tau):
    """Stage of :func:`learn_robust_lstsq`: ``||W* - W_hat||_F <= eps_W_bound`` under the assumptions,
    so ``||W_hat||_F <= W_max + eps_W_bound``: a larger ``||W_hat||_F`` proves one of them false (no
    query needed), as :func:`learn_robust`'s window does."""
    norm_W = float(np.linalg.norm(W_hat))
    if norm_W > W_max + eps_W_bound + np.sqrt(np.finfo(float).eps) * W_max:  # float64 rounding
        raise OracleInconsistentError(
            f"||W_hat||_F = {norm_W:.3g} exceeds W_max={W_max:g} by more than the guaranteed error "
            f"eps_W_bound={eps_W_bound:.3g} (from the answers, under the assumptions): so "
            "||W*||_F <= W_max is false, or the oracle errs by more than tau, or it is not a single "
            f"head. Pass W_max >= {norm_W:.3g} (it also sets the probe scales), or the answers' real "
            f"tau (the bound assumes tau={tau:.3g}); the guarantee would not hold."
        )


# --------------------------------------------------------------------------------------------
