"""The counts route's design (private): its counts and plans, its query tokens and pairs, its result.

Shared by both starts of :func:`companion.multihead.learn_canonical_rational` and its diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import check_int
from ..attention import MultiHead
from ..errors import InvalidInputError
from ._common import heads_result, verify_heads
from ._identifiability import canonical_form


@dataclass(frozen=True)
class CountsOptions:
    """The checked options of :func:`learn_canonical_rational`, read by both of its starts."""

    H_plan: int  #: ``H`` if given, else ``H_bound``: the heads the queries are planned for
    known: bool  #: whether ``H`` was given (else only the bound ``H_bound``)
    scale: float
    spread: float
    tol: float
    verify: int
    verify_rtol: float
    seed: int


def follow_up_count(d, H) -> int:
    """Kim, Kim & Guo's count ``4 H d^2 - 2 H + 1`` of value queries (of length ``<= 2 H + 1``).

    Examples
    --------
    >>> follow_up_count(64, 12)
    196585
    """
    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    return 4 * H * d * d - 2 * H + 1


def _fitting(K: int) -> str:
    """How many query tokens per row fit the count (an adversarial tester's H = 10**6 read "only -333324")."""
    return f"only {K} query tokens per row fit" if K > 0 else "no query token per row fits"


def rational_plan(d, H, *, spare_rows=2):
    """How :func:`learn_canonical_rational` spends ``4 H d^2 - 2 H + 1`` queries.

    Returns
    -------
    dict
        ``S`` (``2 H`` samples per pair), ``K`` (query tokens per row), ``n_link`` (tokens per
        link of two rows), ``n_pairs`` and ``n_queries`` (``d + S * n_pairs <= 4 H d^2 - 2 H + 1``),
        ``budget``, ``spare_rows`` (rows that may be redrawn within the budget: a direction along
        which a head's amplitude nearly vanishes leaves that head unresolved in its row).

    Raises
    ------
    InvalidInputError
        If fewer than ``d + 1`` tokens per row fit in the budget (then ``d`` is too small for ``H``).

    Examples
    --------
    >>> p = rational_plan(64, 12)
    >>> p["S"], p["K"], p["n_link"], p["n_queries"] <= p["budget"]
    (24, 117, 7, True)
    """
    budget = follow_up_count(d, H)
    S = 2 * H
    n_link = 0 if H == 1 else H * H // S + 1
    pairs = (budget - d) // S
    K = (pairs - (d - 1) * n_link) // (d + spare_rows)
    if K < d + 1:
        raise InvalidInputError(
            f"H={H} heads at d={d}: {_fitting(K)} in 4Hd^2 - 2H + 1 = {budget} "
            f"queries (need d + 1 = {d + 1}); use learn_canonical."
        )
    n_pairs = (d + spare_rows) * K + (d - 1) * n_link
    return {
        "S": S,
        "K": int(K),
        "n_link": int(n_link),
        "n_pairs": int(n_pairs),
        "n_queries": int(d + S * n_pairs),
        "budget": int(budget),
        "spare_rows": spare_rows,
    }


def moment_plan(d, H, *, spare_rows=2):
    """How :func:`learn_canonical_rational` with ``start="moments"`` spends ``4 H d^2 - 2 H + 1`` queries.

    This book's own design (:mod:`companion.multihead._star`): ``d`` length-1 queries for ``x^T v``; per centre
    ``2 N_BASE d`` tokens for the heads' span, ``ceil(1.5 C(H + 2, 3))`` moment tokens and the
    centre's own row of ``K`` tokens; then ``d - 1 + spare_rows`` star rows of ``K`` tokens. Every
    token costs ``2 H`` queries (the route's ratios). A second centre is planned where ``K`` stays at
    least ``1.5 d`` with it.

    Returns
    -------
    dict
        ``S``, ``K``, ``n_base_tokens`` (per centre), ``n_moment_tokens`` (per centre), ``n_centres``,
        ``spare_rows``, ``n_queries`` (at most, with every centre and spare row used) and ``budget``.

    Raises
    ------
    InvalidInputError
        If ``H > d`` (the heads' span is then all of R^d and Jennrich's algorithm does not apply) or
        fewer than ``d + 1`` tokens per row fit in the budget.

    Examples
    --------
    >>> p = moment_plan(64, 12)
    >>> p["S"], p["K"], p["n_centres"], p["n_moment_tokens"], p["n_queries"] <= p["budget"]
    (24, 98, 2, 546, True)
    """
    import math

    from ._star import MOMENT_OVERSAMPLE, N_BASE

    budget = follow_up_count(d, H)
    if H > d:
        raise InvalidInputError(
            f"start='moments' needs H <= d (the heads' span then has dimension H); got H={H}, d={d}. "
            "Use start='pairs' or learn_canonical."
        )
    S = 2 * H
    n_base = 2 * N_BASE * d
    n_mom = int(math.ceil(MOMENT_OVERSAMPLE * math.comb(H + 2, 3)))
    out = {"S": S, "n_base_tokens": n_base, "n_moment_tokens": n_mom, "spare_rows": spare_rows, "budget": budget}
    for n_centres in (2, 1):
        K = (budget - d - S * n_centres * (n_base + n_mom)) // (S * (n_centres + d - 1 + spare_rows))
        if K >= (1.5 * d if n_centres > 1 else d + 1):
            break
    if K < d + 1:
        raise InvalidInputError(
            f"H={H} heads at d={d}: {_fitting(K)} in 4Hd^2 - 2H + 1 = {budget} "
            f"queries with the moment start (need d + 1 = {d + 1}); use start='pairs' or learn_canonical."
        )
    n_queries = d + S * (n_centres * (n_base + n_mom + K) + (d - 1 + spare_rows) * K)
    return {**out, "K": int(K), "n_centres": n_centres, "n_queries": int(n_queries)}


#: Most queries per oracle call of :func:`ask_pairs` (a block of at most 1024 x 9 x 64 float64, 4.7 MB,
#: at d = 64, H = 4). Measured (2026-12-01, the counts route's own queries replayed on the exact
#: oracle, one BLAS thread): the oracle's time per query is least in blocks of about 1024, and in one
#: batch per length it is 1.2 (d = 32, H = 2) to 1.8 (d = 64, H = 2) times that; blocks of 128 cost
#: 1.2-1.5 times. The learner's own calls of up to d K queries (7,744 at d = 64) ran at 1.3 times it.
ASK_BLOCK = 1024


def heads_from_rows(P, Rw, Gam):
    """The canonical form of the heads whose rows along the directions ``P[i]`` (shape (d, d),
    invertible) are ``Rw[i, h] = W_h^T delta_i`` (shape (d, H, d)) and ``Gam[i, h] = delta_i^T v_h``
    (shape (d, H)): ``W_h = P^{-1} Rw[:, h]``, ``v_h = P^{-1} Gam[:, h]``, heads with equal ``W``
    merged (:func:`canonical_form`, ``atol=1e-6``)."""
    Pinv = np.linalg.inv(P)
    return canonical_form(MultiHead(np.einsum("di,ihe->hde", Pinv, Rw), (Pinv @ Gam).T), atol=1e-6)


def route_tokens(rng, k, d, scale, spread):
    """``k`` Gaussian directions in R^d with norms log-uniform in ``[scale / spread, scale * spread]``:
    shape (k, d), the query tokens of :func:`learn_canonical_rational`'s routes."""
    T = rng.standard_normal((k, d))
    norms = scale * np.exp(rng.uniform(-np.log(spread), np.log(spread), k))
    return T * (norms / np.linalg.norm(T, axis=1))[:, None]


def ask_pairs(oracle, U, X, n, m):
    """``VQ`` of ``n[t]`` copies of ``U[k]`` then ``m[t]`` copies of ``X[k]``: shape (K, S).

    The queries in the order ``t``, then ``k``, in calls of at most ASK_BLOCK queries."""
    K, d = X.shape
    out = np.empty((K, n.size))
    for t, (a, b) in enumerate(zip(n, m)):
        for lo in range(0, K, ASK_BLOCK):
            hi = min(K, lo + ASK_BLOCK)
            Q = np.empty((hi - lo, a + b, d))
            Q[:, :a] = U[lo:hi, None]
            Q[:, a:] = X[lo:hi, None]
            out[lo:hi, t] = oracle(Q)
    return out


#: From this many heads ``start="auto"`` takes the moment start (:mod:`companion.multihead._star`): the per-pair
#: start's largest ``H`` is 7 at d = 16 and 32 and 8 at d = 64 (seed 0), where the moment start learns
#: H = 9 to 12 at d = 64 (``benchmarks/bench_multihead.py``).
MOMENT_FROM = 9


def rational_result(oracle, count, model, lengths, d, opts, plan, *, extra, label=""):
    """The result of either start of :func:`learn_canonical_rational`: its diagnostics (the head
    count, the longest query of ``lengths``, the follow-up's count for ``opts.H_plan``, the ``plan``,
    then the start's own ``extra``), its message (``label`` appended to the count), its verification.
    ``count`` (:class:`companion._learner.QueryCount`) started at the learner's first query."""
    diagnostics = {
        "n_heads": model.n_heads,
        "max_len": int(np.max(lengths)),
        "kim_count": follow_up_count(d, opts.H_plan),
        "plan": plan,
        **extra,
    }
    message = (
        f"found {model.n_heads} heads from {count.total} queries of length <= "
        f"{diagnostics['max_len']} (4Hd^2 - 2H + 1 = {diagnostics['kim_count']}{label})"
    )
    what = "a sum of attention heads (learn_canonical_rational)"
    checked = verify_heads(oracle, model, opts.verify, rtol=opts.verify_rtol, seed=opts.seed + 1, what=what)
    return heads_result(
        oracle, count.start, model.Ws, model.vs, verification=checked, message=message, diagnostics=diagnostics
    )
