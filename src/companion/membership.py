"""Learning one attention head from membership queries (±1 labels): this book's derivation.

The ICML version of Bhattamishra et al. adds an appendix on membership queries, learned "by
bisection in place of inverting the sigmoid". We have not seen that appendix's body; the oracle
and the learner below are this book's own, derived here, and may differ from the paper's.

**Oracle.** ``MQ(X) = +1 if f*(X) >= threshold else -1`` (:class:`MembershipQueryOracle`), with a
fixed, public threshold, 0 by default: the label a binary classifier built on the head's score
would give. The learner cannot move the threshold (a learner-chosen threshold would be a comparison
oracle, and bisection on it would read any value query to ``b`` bits with ``b`` labels, which
trivialises the question).

**What is identifiable** (threshold 0). ``f_{W, c v} = c f_{W, v}`` has the labels of ``f_{W, v}``
for every ``c > 0``, so the scale of ``v`` is lost; ``W`` and ``v / ||v||_inf`` are not.

**Learner** (:func:`learn_membership`), with ``b = bits``:

1. ``2d`` labels of ``[+-e_i^T]``: ``v_i != 0`` iff they differ, and then the label of ``[e_i^T]``
   is ``sign(v_i)``.
2. ``n_s - 1`` labels (``n_s`` nonzero entries) of ``[|e_i| - |e_k|]``-type queries
   ``[(s_i e_i - s_k e_k)^T]`` find ``p = argmax_i |v_i|``: the label says whether
   ``|v_i| >= |v_k|``.
3. For each other nonzero entry, ``b`` labels of ``[(s_i e_i - lam s_p e_p)^T]`` bisect
   ``lam`` in ``[0, 1]`` for ``|v_i| / |v_p|``: the label flips at ``lam = |v_i / v_p|``. So
   ``r = v / |v_p| = v / ||v||_inf`` to ``2**-(b+1)`` per entry.
4. For every pair (probe ``u``, query token ``x``), ``b`` labels bisect the logit
   ``t = u^T W x`` in ``[-S, S]``, ``S = ||u|| ||x|| W_max``. One label answers "is ``t > m``?"
   for any threshold ``m``: query ``c [(x + kappa u)^T; x^T]``. By the two-token identity the
   answer's sign is ``sign(r_x + sigma(c^2 kappa t) kappa r_u)`` (``r_x = x^T r``,
   ``r_u = u^T r``). The probe length ``kappa = -r_x / (sigma(y*) r_u)`` puts the flip at
   ``c^2 kappa t = y*``, and the scale ``c^2 = y* / (kappa m)`` moves it to ``t = m``
   (``y* = +-1``, the sign that makes ``c^2 > 0``; ``y* = 0`` and ``c = 1`` for ``m = 0``).
   Then the label is ``sign(r_u)`` exactly when ``t > m``. No sigmoid is inverted: the sigmoid
   only sets the balance point, at a known ``y*``.
   Probes and query tokens are the rows of :func:`companion.exact.probe_matrix` for ``r``
   (``e_l``, or ``e_l + e_p`` when ``|r_l| < 1/2``), so ``T = U W U^T`` and
   ``W = U^{-1} T U^{-T}``.

Queries: ``2d + (n_s - 1)(b + 1) + b d**2``; with all entries of ``v`` nonzero,
``b d**2 + (b + 3) d - (b + 1)``: about ``b`` times Theorem 4.1's ``d + d**2``, one bit per query.
Each logit is found to ``S 2**-b`` if ``r`` were exact; the errors of ``r`` (``2**-(b+1)``) move
the balance point and add a relative error of order ``2**-b`` (measured in the chapter).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ._learner import QueryCount
from ._validation import check_int, check_real
from .errors import NotIdentifiableError, OracleInconsistentError, InvalidInputError
from .oracles import ValueQueryOracle
from .recovery import Recovery

__all__ = ["MembershipQueryOracle", "learn_membership", "membership_query_count", "compare_logits"]


class MembershipQueryOracle(ValueQueryOracle):
    """Membership-query oracle: the ±1 label ``+1 if f*(X) >= threshold else -1`` (this book's).

    Parameters
    ----------
    target : callable
        The model, as for :class:`~companion.oracles.ValueQueryOracle`.
    threshold : float, default=0.0
        The fixed, public threshold of the classifier ``sign(f* - threshold)``. The learner cannot
        change it.
    d, budget, record
        As for :class:`~companion.oracles.ValueQueryOracle`.

    Attributes
    ----------
    tau : float
        ``inf``: a label says nothing about ``|f*(X)|``, so the value-query learners
        (which refuse an oracle with ``tau > 0``) refuse this one instead of reading labels as values.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import SingleHead
    >>> oracle = MembershipQueryOracle(SingleHead(np.eye(2), np.array([0.5, -0.25])))
    >>> oracle(np.array([[1.0, 0.0]])), oracle(np.array([[0.0, 1.0]])), oracle.n_queries
    (1.0, -1.0, 2)
    """

    tau = float("inf")

    def __init__(self, target, *, threshold=0.0, d=None, budget=None, record=False):
        super().__init__(target, d=d, budget=budget, record=record)
        self.threshold = check_real(threshold, "threshold")

    def _answer(self, X: np.ndarray) -> np.ndarray:
        return np.where(self._evaluate(X) >= self.threshold, 1.0, -1.0)

    def __repr__(self):
        budget = "" if self.budget is None else f", budget={self.budget}"
        return f"MembershipQueryOracle(d={self.d}, threshold={self.threshold:g}, n_queries={self.n_queries}{budget})"


def membership_query_count(d, bits, *, n_support=None) -> int:
    """Queries of :func:`learn_membership` (without verification): ``2d + (n_s - 1)(b + 1) + b d**2``.

    Parameters
    ----------
    d : int
        Input dimension.
    bits : int
        Bisection steps per logit and per ratio of ``v``.
    n_support : int, default=None
        Number of nonzero entries of ``v*``; ``None`` means ``d``.

    Examples
    --------
    >>> membership_query_count(4, 10), 4 + 4**2
    (201, 20)
    """
    d = check_int(d, "d", minimum=1)
    bits = check_int(bits, "bits", minimum=1)
    n_s = d if n_support is None else check_int(n_support, "n_support", minimum=1, maximum=d)
    return 2 * d + (n_s - 1) * (bits + 1) + bits * d * d


def _design(r_x, r_u, m):
    """Probe length ``kappa`` and squared scale ``c2`` for the test "t > m" (see the module notes)."""
    m = np.asarray(m, dtype=np.float64)
    y_star = -np.sign(r_x * r_u) * np.sign(m)  # 0 where m == 0
    kappa = -r_x / (expit(y_star) * r_u)
    with np.errstate(divide="ignore"):
        c2 = np.where(m == 0.0, 1.0, 1.0 / np.abs(kappa * m))
    return kappa, c2


def compare_logits(oracle, U, Xq, r, m):
    """One label per row: is ``u_k^T W x_k > m_k``? (Step 4 of the module notes; one query each.)

    Parameters
    ----------
    oracle : MembershipQueryOracle
        Threshold-0 label oracle.
    U, Xq : ndarray of shape (k, d)
        Probes ``u_k`` and query tokens ``x_k``, with ``u_k^T r != 0`` and ``x_k^T r != 0``.
    r : ndarray of shape (d,)
        The value vector up to a positive scale (its estimate).
    m : ndarray of shape (k,)
        Thresholds.

    Returns
    -------
    ndarray of bool, shape (k,)
        True where the label says ``t_k > m_k``.
    """
    r_x, r_u = Xq @ r, U @ r
    kappa, c2 = _design(r_x, r_u, m)
    c = np.sqrt(c2)[:, None]
    X = np.stack([c * (Xq + kappa[:, None] * U), c * Xq], axis=1)
    labels = np.asarray(oracle(X), dtype=np.float64)
    return labels == np.sign(r_u)


def _labels(oracle, X):
    return np.asarray(oracle(np.asarray(X, dtype=np.float64)[:, None, :]), dtype=np.float64)


def learn_membership(oracle, *, W_max, bits=30, verify=200, verify_slack=2.0, seed=0):
    """Recover ``W*`` and ``v* / ||v*||_inf`` of one head from ±1 labels, ``bits`` labels per entry.

    This book's learner for the membership-query setting (the paper's appendix, whose body we have
    not seen, may proceed differently); the steps are in the module notes.

    Parameters
    ----------
    oracle : MembershipQueryOracle
        Label oracle with threshold 0 for a single head ``f_{W*, v*}``; ``d = oracle.d``.
    W_max : float
        Known bound on ``||W*||_2`` (``||W*||_F`` will do), ``> 0``. Each logit
        ``u^T W* x`` is bisected in ``[-S, S]``, ``S = ||u|| ||x|| W_max``.
    bits : int, default=30
        Bisection steps per logit (and per ratio ``v_i / v_p``), ``1 <= bits <= 52``.
    verify : int, default=200
        Fresh random queries (lengths 1 to 8) on which the labels of the recovered head are
        compared with the oracle's; 0 skips the check. Counted in ``n_queries``, reported apart.
    verify_slack : float, default=2.0
        A disagreement counts only where the recovered head's output ``|f_hat(X)|`` exceeds the
        first-order error bound ``2 R**2 E_W s + R sqrt(d) 2**-bits`` times ``verify_slack``, with
        ``R = max_i ||x_i||``, ``s = max_i |x_i^T v_hat|`` and
        ``E_W = ||U^{-1}||_2**2 ||logit_halfwidth||_F`` (softmax weights move by at most
        ``2 max_i |Delta s_i|`` in l1). Nearer the boundary a ``bits``-bit estimate may
        legitimately disagree. The bound and the slack are this book's.
    seed : int, default=0
        Seed of the verification queries.

    Returns
    -------
    Recovery
        ``W`` of shape (d, d); ``v`` of shape (d,), the estimate of ``v* / ||v*||_inf`` (the
        scale of ``v*`` is not identifiable from labels). ``n_queries`` is
        :func:`membership_query_count` plus ``verify``. ``diagnostics``: ``bits``, ``p`` (index of
        the largest ``|v_i|``), ``n_support``, ``n_queries_v``, ``n_queries_W``,
        ``logit_halfwidth`` (``(d, d)``: the final bisection half-width ``S 2**-bits`` of each
        logit), ``probes`` (``(d, d)``), ``n_verify_queries`` (``verify``; ``n_learning_queries``
        leaves them out) and, with ``verify``, ``n_verify_disagreements`` (labels that differ within
        the error bound, allowed).

    Raises
    ------
    TypeError
        If ``oracle`` is not a :class:`MembershipQueryOracle`.
    InvalidInputError
        For ``threshold != 0``, ``W_max <= 0``, ``bits`` outside ``[1, 52]`` or ``verify < 0``.
    NotIdentifiableError
        If every ``[+-e_i^T]`` has the label +1: ``v* = 0`` and ``f* = 0``.
    BudgetExceededError
        Before the first query, if the budget is below the count for a full-support ``v*``.
    OracleInconsistentError
        If a bisection ends at ``+-S`` (``W_max`` is too small, or the oracle is not a head), or the
        verification finds a disagreement outside the margin.

    Notes
    -----
    Membership queries are in the appendix added to the ICML version of Bhattamishra et al.
    2026 [1]_; the derivation here is this book's. One label is one bit, so ``b`` bits per
    parameter cost ``b`` labels each: the count is about ``b (d + d**2)``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> target = random_single_head(4, seed=0)
    >>> rec = learn_membership(MembershipQueryOracle(target), W_max=10.0, bits=30, verify=0)
    >>> rec.n_queries, float(np.max(np.abs(rec.W - target.W))) < 1e-6
    (581, True)
    """
    if not isinstance(oracle, MembershipQueryOracle):
        raise TypeError(f"learn_membership needs a MembershipQueryOracle; got {type(oracle).__name__}.")
    if oracle.threshold != 0.0:
        raise InvalidInputError(
            f"threshold={oracle.threshold!r}: learn_membership handles the threshold 0 only "
            "(sign(f*)); with a nonzero threshold the steps differ. Use threshold=0."
        )
    d = int(oracle.d)
    W_max = check_real(W_max, "W_max", minimum=0.0, strict=True)
    bits = check_int(bits, "bits", minimum=1, maximum=52)
    verify = check_int(verify, "verify", minimum=0)
    seed = check_int(seed, "seed", minimum=0)
    verify_slack = check_real(verify_slack, "verify_slack", minimum=0.0)
    oracle.require(membership_query_count(d, bits) + verify, learner="learn_membership")
    count = QueryCount(oracle)
    E = np.eye(d)

    # Step 1: support and signs of v.
    lab = _labels(oracle, np.concatenate([E, -E]))
    support = lab[:d] != lab[d:]
    if not np.any(support):
        raise NotIdentifiableError("every query [+-e_i] has the label +1, so v* = 0 and f* = 0: no label reveals W.")
    s = np.where(support, lab[:d], 0.0)
    idx = np.flatnonzero(support)

    # Step 2: p = argmax |v_i| by a tournament of comparisons |v_i| >= |v_k|.
    p = int(idx[0])
    for i in idx[1:]:
        if _labels(oracle, [s[i] * E[i] - s[p] * E[p]])[0] > 0:  # +1: |v_i| - |v_p| >= 0
            p = int(i)

    # Step 3: |v_i / v_p| by bisection on lam in [0, 1].
    rest = idx[idx != p]
    lo, hi = np.zeros(rest.size), np.ones(rest.size)
    for _ in range(bits if rest.size else 0):
        mid = 0.5 * (lo + hi)
        X = s[rest, None] * E[rest] - mid[:, None] * s[p] * E[p][None, :]
        above = _labels(oracle, X) > 0  # |v_i| - mid |v_p| >= 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    r = np.zeros(d)
    r[p] = s[p]
    r[rest] = s[rest] * 0.5 * (lo + hi)
    n_v = count.total  # steps 1-3: every query so far

    # Step 4: every logit u_l^T W x_j by bisection in [-S, S].
    with count.stage("W"):
        from .exact import probe_matrix

        U = probe_matrix(r, "basis")
        norms = np.linalg.norm(U, axis=1)
        L, J = np.meshgrid(np.arange(d), np.arange(d), indexing="ij")
        Up, Xq = U[L.ravel()], U[J.ravel()]
        S = norms[L.ravel()] * norms[J.ravel()] * W_max
        lo, hi = -S.copy(), S.copy()
        went_up, went_down = np.zeros(S.size, bool), np.zeros(S.size, bool)
        for _ in range(bits):
            mid = 0.5 * (lo + hi)
            above = compare_logits(oracle, Up, Xq, r, mid)
            went_up |= above
            went_down |= ~above
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        stuck = ~went_down | ~went_up
        if bits >= 2 and np.any(stuck):
            k = int(np.flatnonzero(stuck)[0])
            raise OracleInconsistentError(
                f"the bisection of logit {k} ended at the edge of [-S, S] with S={S[k]:.3g}: no logit "
                f"within ||u|| ||x|| W_max fits its labels. Either W_max={W_max:g} is too small, or the "
                "oracle is not a single head whose labels are the signs of f (a constant offset or a "
                "bias shifts every label, and then no logit fits at any W_max). If ||W*||_F <= W_max "
                "is known, it is the oracle; else pass a larger W_max: a bisection that ends at the "
                "edge again points to the oracle."
            )
        T = (0.5 * (lo + hi)).reshape(d, d)
        Uinv = np.linalg.inv(U)
        W = Uinv @ T @ Uinv.T
    n_W = count["W"]

    diagnostics = {
        "bits": bits,
        "p": p,
        "n_support": int(idx.size),
        "n_queries_v": n_v,
        "n_queries_W": n_W,
        "logit_halfwidth": (S * 2.0**-bits).reshape(d, d),
        "probes": U,
    }
    message = f"recovered W and v / ||v||_inf from {n_v + n_W} labels ({bits} bisection steps per entry)"
    diagnostics["n_verify_queries"] = verify
    if verify:
        E_W = float(np.linalg.norm(Uinv, 2) ** 2 * np.linalg.norm(diagnostics["logit_halfwidth"]))
        diagnostics["n_verify_disagreements"] = _verify_labels(oracle, W, r, verify, E_W, bits, verify_slack, seed)
        message += f"; verified on {verify} fresh queries"
    return Recovery(W=W, v=r, n_queries=count.total, message=message, diagnostics=diagnostics)


def _verify_labels(oracle, W, v, n, E_W, bits, slack, seed):
    """Compare labels on ``n`` fresh queries; raise on a disagreement outside the error bound."""
    from .attention import SingleHead

    d = W.shape[0]
    rng = np.random.default_rng(seed)
    X = [rng.standard_normal((int(k), d)) / np.sqrt(d) for k in rng.integers(1, 9, size=n)]
    y = np.asarray(oracle(X), dtype=np.float64)
    f_hat = SingleHead(W, v)(X)
    R = np.array([np.max(np.linalg.norm(x, axis=1)) for x in X])
    scale = np.array([np.max(np.abs(x @ v)) for x in X])
    bound = slack * (2.0 * R**2 * E_W * scale + R * np.sqrt(d) * 2.0**-bits)
    disagree = np.where(f_hat >= 0.0, 1.0, -1.0) != y
    clear = disagree & (np.abs(f_hat) > bound)
    if np.any(clear):
        k = int(np.flatnonzero(clear)[0])
        raise OracleInconsistentError(
            f"on {n} fresh queries the recovered head's label disagrees with the oracle's where "
            f"|f_hat| = {abs(f_hat[k]):.3g} exceeds its error bound {bound[k]:.3g}: the oracle is "
            "not a single head with threshold 0 (or W_max is wrong)."
        )
    return int(np.sum(disagree))
