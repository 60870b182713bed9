"""Multi-head attention (§7): non-identifiability, canonical form, detection and a structured learner.

A multi-head model ``f^H(X) = sum_h alpha(X, W^(h))^T X v^(h)`` is a sum of single heads
(:class:`~companion.attention.MultiHead`). Its parameters are not identifiable from its function
(Proposition 7.1): heads with the same ``W`` can trade value vector mass, heads can be permuted, and
heads whose value vectors cancel add nothing. This module holds

* constructions of distinct parameter sets with the same function: :func:`proposition_7_1`,
  :func:`permute_heads`, :func:`split_head`, :func:`add_cancelling_heads`;
* the canonical form (merge heads with equal ``W`` by summing their ``v``, drop heads with ``v = 0``,
  sort), :func:`canonical_form`, with :func:`match_heads` and :func:`equivalent` to compare models;
* :func:`detect_multi_head`: the single-head learner of Theorem 4.1 followed by fresh verification
  queries, which flag an oracle that is not one head;
* random targets: :func:`random_multi_head` (general or with heads in orthogonal subspaces);
* the learners, each returning a :class:`MultiHeadRecovery` and verifying it by default:

  - :func:`learn_orthogonal_heads`: heads living in mutually orthogonal subspaces (the structural
    assumption named in §7), every head recovered up to permutation without knowing ``H`` or the
    subspaces;
  - :func:`learn_canonical`: general multi-head targets, recovered in canonical form (this book's
    construction, with ``H`` given or bounded);
  - :func:`learn_canonical_rational`: the same canonical form through the counts route, at the
    follow-up's query count (this book's derivation of its abstract; :func:`rational_plan` and
    :func:`follow_up_count` give its counts).

  A single head is :func:`companion.exact.learn_single_head`'s; :func:`detect_multi_head` says
  which of the two an oracle needs.

Layer: one of the paper's sections (§7), above §4 (``exact``: the single-head learner and its
inversion), the skeleton (``_learner``) and the shared numerics (its isolation queries are
:func:`companion.numerics.rop.rop_queries`); the canonical-form learners' fits live in the private
module ``_rational`` beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh, orth
from scipy.optimize import linear_sum_assignment

from ._validation import as_float_array, check_int, check_real
from .attention import MultiHead, SingleHead
from .errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from .exact import check_exact_oracle, invert_two_token, learn_single_head, remeasure_saturated
from ._learner import (
    COARSE_FACTOR,
    DEFAULT_VERIFY,
    AnswerPrecision,
    build,
    check_verify,
    names_rounding,
    reserve,
    verify_head,
    verify_outputs,
)
from .numerics.rop import rop_queries
from .recovery import Recovery

__all__ = [
    "proposition_7_1",
    "permute_heads",
    "split_head",
    "add_cancelling_heads",
    "canonical_form",
    "match_heads",
    "equivalent",
    "random_multi_head",
    "Detection",
    "detect_multi_head",
    "verify_model",
    "MultiHeadRecovery",
    "learn_orthogonal_heads",
]

#: Attention weights outside [_BAND, 1 - _BAND] are re-measured at a smaller scale. Tighter than
#: Theorem 4.1's SATURATION: a probe is only approximately inside its head's subspace, and
#: sigma^-1 amplifies that leakage by 1 / (alpha (1 - alpha)).
_BAND = 0.05
_EPS = np.finfo(float).eps


def _as_model(model, name="model") -> MultiHead:
    if isinstance(model, MultiHead):
        return model
    if isinstance(model, SingleHead):
        return MultiHead(model.W[None], model.v[None])
    raise InvalidInputError(
        f"{name} must be a MultiHead or SingleHead; got {type(model).__name__}. "
        "Build one with companion.attention.MultiHead(Ws, vs)."
    )


def _check_weights(weights, name, *, total):
    w = as_float_array(weights, name, ndim=1)
    if w.size == 0:
        raise InvalidInputError(f"{name} is empty; give at least one weight.")
    if abs(w.sum() - total) > 1e-12 * max(1.0, np.abs(w).sum()):
        raise InvalidInputError(f"{name} must sum to {total:g}; got sum {w.sum()!r}. Normalise them, e.g. w / w.sum().")
    return w


# --------------------------------------------------------------------------------------------
# Constructions of equivalent parameter sets
# --------------------------------------------------------------------------------------------


def proposition_7_1(A, b, weights) -> MultiHead:
    """The construction of Proposition 7.1: ``H`` heads ``W^(h) = A``, ``v^(h) = lambda_h b``.

    Parameters
    ----------
    A : array-like of shape (d, d)
        The query-key matrix shared by every head.
    b : array-like of shape (d,)
        The common direction of the value vectors.
    weights : array-like of shape (H,)
        The ``lambda_h``; they must sum to 1 (the paper takes them ``>= 0``; any real weights
        summing to 1 give the same function).

    Returns
    -------
    MultiHead
        ``H`` heads computing exactly the single head ``f_{A, b}``, whatever the weights.

    Raises
    ------
    InvalidInputError
        If shapes disagree, an entry is not finite, or the weights do not sum to 1.

    Notes
    -----
    Proposition 7.1 of [1]_: ``sum_h alpha(X, A)^T X (lambda_h b) = alpha(X, A)^T X b``, so the
    parameters ``(W^(h), v^(h))`` are not identifiable from the function, and no analogue of
    Theorem 4.1 holds for multi-head attention without further structure.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A, b, X = rng.standard_normal((3, 3)), rng.standard_normal(3), rng.standard_normal((5, 3))
    >>> m1 = proposition_7_1(A, b, [0.5, 0.5])
    >>> m2 = proposition_7_1(A, b, [0.9, 0.1])
    >>> bool(np.isclose(m1(X), m2(X))), bool(np.allclose(m1.vs, m2.vs))
    (True, False)
    """
    head = SingleHead(A, b)
    w = _check_weights(weights, "weights", total=1.0)
    H = w.size
    return MultiHead(np.repeat(head.W[None], H, axis=0), w[:, None] * head.v[None])


def permute_heads(model, perm) -> MultiHead:
    """Reorder the heads of ``model``: head ``k`` of the result is head ``perm[k]`` of ``model``.

    Raises
    ------
    InvalidInputError
        If ``perm`` is not a permutation of ``range(H)``.

    Examples
    --------
    >>> import numpy as np
    >>> m = random_multi_head(4, 2, seed=0)
    >>> bool(np.array_equal(permute_heads(m, [1, 0]).vs, m.vs[::-1]))
    True
    """
    model = _as_model(model)
    perm = np.asarray(perm)
    if perm.shape != (model.n_heads,) or not np.array_equal(np.sort(perm), np.arange(model.n_heads)):
        raise InvalidInputError(f"perm must be a permutation of range(H={model.n_heads}); got {perm.tolist()!r}.")
    return MultiHead(model.Ws[perm], model.vs[perm])


def split_head(model, h, weights) -> MultiHead:
    """Replace head ``h`` by ``len(weights)`` heads with the same ``W`` and ``v`` scaled by the weights.

    Parameters
    ----------
    model : MultiHead or SingleHead
    h : int
        Index of the head to split, ``0 <= h < H``.
    weights : array-like of shape (k,)
        Weights summing to 1; the new heads are placed at the end.

    Raises
    ------
    InvalidInputError
        If ``h`` is out of range or the weights do not sum to 1.

    Examples
    --------
    >>> import numpy as np
    >>> m = random_multi_head(4, 2, seed=0)
    >>> s = split_head(m, 0, [0.25, 0.75])
    >>> s.n_heads, equivalent(s, m)
    (3, True)
    """
    model = _as_model(model)
    h = check_int(h, "h", minimum=0, maximum=model.n_heads - 1)
    w = _check_weights(weights, "weights", total=1.0)
    keep = [k for k in range(model.n_heads) if k != h]
    Ws = np.concatenate([model.Ws[keep], np.repeat(model.Ws[h][None], w.size, axis=0)])
    vs = np.concatenate([model.vs[keep], w[:, None] * model.vs[h][None]])
    return MultiHead(Ws, vs)


def add_cancelling_heads(model, W, vs) -> MultiHead:
    """Append heads that all use ``W`` and whose value vectors ``vs`` sum to zero.

    Parameters
    ----------
    model : MultiHead or SingleHead
    W : array-like of shape (d, d)
        Query-key matrix of the new heads (any matrix).
    vs : array-like of shape (k, d)
        Their value vectors, ``k >= 2``, with ``vs.sum(axis=0) == 0``.

    Raises
    ------
    InvalidInputError
        If shapes disagree or the value vectors do not sum to zero.

    Examples
    --------
    >>> import numpy as np
    >>> m = random_multi_head(3, 1, seed=0)
    >>> c = add_cancelling_heads(m, np.eye(3), [[1.0, 2.0, 0.0], [-1.0, -2.0, 0.0]])
    >>> c.n_heads, equivalent(c, m)
    (3, True)
    """
    model = _as_model(model)
    d = model.d
    W = as_float_array(W, "W", ndim=2, shape=(d, d))
    vs = as_float_array(vs, "vs", ndim=2, shape=(None, d))
    total = vs.sum(axis=0)
    if np.max(np.abs(total)) > 1e-12 * max(1.0, float(np.abs(vs).sum())):
        raise InvalidInputError(
            f"vs must sum to the zero vector; got sum with max |entry| {np.max(np.abs(total)):.3g}. "
            "Append -vs.sum(axis=0) as a last row."
        )
    k = vs.shape[0]
    return MultiHead(np.concatenate([model.Ws, np.repeat(W[None], k, axis=0)]), np.concatenate([model.vs, vs]))


# --------------------------------------------------------------------------------------------
# Canonical form and comparison
# --------------------------------------------------------------------------------------------


def canonical_form(model, *, atol=1e-9) -> MultiHead:
    """The canonical form: merge heads with equal ``W`` (summing their ``v``), drop ``v = 0``, sort.

    Parameters
    ----------
    model : MultiHead or SingleHead
    atol : float, default=1e-9
        Two heads have "equal" ``W`` when ``||W_i - W_j||_F <= atol * max(1, ||W_i||_F)``; a merged
        head is dropped when ``||v||_2 <= atol * max(1, largest ||v^(h)||_2)``.

    Returns
    -------
    MultiHead
        Heads with pairwise different ``W`` and nonzero ``v``, sorted lexicographically by the
        entries of ``W`` (then ``v``). If every head cancels, the function is identically 0 and the
        result is the single head ``(0, 0)``.

    Raises
    ------
    InvalidInputError
        If ``model`` is not a model or ``atol`` is negative.

    Notes
    -----
    Two models with equal canonical forms compute the same function (each construction of
    Proposition 7.1 [1]_ and :func:`permute_heads`, :func:`split_head`,
    :func:`add_cancelling_heads` leaves it unchanged). Equality of canonical forms is the
    notion of identifiability that later work recovers from queries [2]_.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, arXiv 2608.03294, 2026.

    Examples
    --------
    >>> import numpy as np
    >>> m = proposition_7_1(np.eye(2), [1.0, -1.0], [0.2, 0.3, 0.5])
    >>> c = canonical_form(m)
    >>> c.n_heads, c.vs.tolist()
    (1, [[1.0, -1.0]])
    """
    model = _as_model(model)
    atol = check_real(atol, "atol", minimum=0.0)
    Ws, vs = model.Ws, model.vs
    groups: list[list[int]] = []
    for h in range(model.n_heads):
        for g in groups:
            W0 = Ws[g[0]]
            if np.linalg.norm(Ws[h] - W0) <= atol * max(1.0, np.linalg.norm(W0)):
                g.append(h)
                break
        else:
            groups.append([h])
    vscale = max(1.0, float(np.max(np.linalg.norm(vs, axis=1))))
    merged = [(Ws[g].mean(axis=0), vs[g].sum(axis=0)) for g in groups]
    merged = [(W, v) for W, v in merged if np.linalg.norm(v) > atol * vscale]
    if not merged:
        d = model.d
        return MultiHead(np.zeros((1, d, d)), np.zeros((1, d)))
    # Lexicographic by the entries of W, then v: Python's comparison of the (finite) entries as lists
    # is numpy.lexsort's order (both stable) without its d^2 + d passes over the heads.
    order = sorted(range(len(merged)), key=lambda i: merged[i][0].ravel().tolist() + merged[i][1].tolist())
    return MultiHead(np.array([merged[i][0] for i in order]), np.array([merged[i][1] for i in order]))


def match_heads(reference, estimate):
    """Pair the heads of two models to minimise the total relative error (Hungarian algorithm).

    Parameters
    ----------
    reference, estimate : MultiHead or SingleHead
        Models with the same ``d``; the number of heads may differ (unmatched heads are reported).

    Returns
    -------
    dict
        ``"pairs"``: list of ``(h_reference, h_estimate)``; ``"W_errors"``, ``"v_errors"``: for each
        pair, ``||W_est - W_ref||_F / ||W_ref||_F`` and ``||v_est - v_ref||_2 / ||v_ref||_2`` (absolute
        when the reference is 0); ``"max_W_error"``, ``"max_v_error"``; ``"unmatched_reference"``,
        ``"unmatched_estimate"``: indices left without a partner.

    Notes
    -----
    Uses :func:`scipy.optimize.linear_sum_assignment` on the cost
    ``relerr(W) + relerr(v)``.

    Examples
    --------
    >>> m = random_multi_head(4, 3, seed=1)
    >>> out = match_heads(m, permute_heads(m, [2, 0, 1]))
    >>> out["pairs"], out["max_W_error"]
    ([(0, 1), (1, 2), (2, 0)], 0.0)
    """
    ref, est = _as_model(reference, "reference"), _as_model(estimate, "estimate")
    if ref.d != est.d:
        raise InvalidInputError(f"the models have different d: {ref.d} and {est.d}.")
    nW = np.maximum(np.linalg.norm(ref.Ws, axis=(1, 2)), np.finfo(float).tiny)[:, None]
    nv = np.maximum(np.linalg.norm(ref.vs, axis=1), np.finfo(float).tiny)[:, None]
    eW = np.linalg.norm(ref.Ws[:, None] - est.Ws[None], axis=(2, 3)) / np.where(nW > 1e-300, nW, 1.0)
    ev = np.linalg.norm(ref.vs[:, None] - est.vs[None], axis=2) / np.where(nv > 1e-300, nv, 1.0)
    rows, cols = linear_sum_assignment(eW + ev)
    pairs = [(int(r), int(c)) for r, c in zip(rows, cols)]
    W_err = [float(eW[r, c]) for r, c in pairs]
    v_err = [float(ev[r, c]) for r, c in pairs]
    return {
        "pairs": pairs,
        "W_errors": W_err,
        "v_errors": v_err,
        "max_W_error": max(W_err),
        "max_v_error": max(v_err),
        "unmatched_reference": sorted(set(range(ref.n_heads)) - set(rows.tolist())),
        "unmatched_estimate": sorted(set(range(est.n_heads)) - set(cols.tolist())),
    }


def equivalent(model_a, model_b, *, atol=1e-9) -> bool:
    """True if the two models have the same canonical form (up to ``atol``, relative).

    Examples
    --------
    >>> import numpy as np
    >>> A, b = np.eye(2), np.array([1.0, 2.0])
    >>> equivalent(proposition_7_1(A, b, [0.3, 0.7]), SingleHead(A, b))
    True
    """
    ca = canonical_form(model_a, atol=atol)
    cb = canonical_form(model_b, atol=atol)
    if ca.n_heads != cb.n_heads:
        return False
    m = match_heads(ca, cb)
    return bool(m["max_W_error"] <= 10 * atol and m["max_v_error"] <= 10 * atol)


# --------------------------------------------------------------------------------------------
# Random targets
# --------------------------------------------------------------------------------------------


def random_multi_head(d, n_heads, *, orthogonal=False, head_dim=None, seed) -> MultiHead:
    """Draw a random ``H``-head model, optionally with heads in mutually orthogonal subspaces.

    Parameters
    ----------
    d : int
        Input dimension, ``d >= 1``.
    n_heads : int
        Number of heads ``H >= 1``.
    orthogonal : bool, default=False
        ``False``: every head ``W^(h) = K^(h)T Q^(h)`` with Gaussian ``Q^(h), K^(h)`` of shape
        ``(head_dim, d)`` (entries of ``K`` scaled by ``1/sqrt(head_dim)``) and Gaussian ``v^(h)``,
        so the heads overlap. ``True``: a random orthonormal basis of R^d (QR of a Gaussian matrix,
        signs fixed) is cut into ``H`` blocks ``B_h`` of ``head_dim`` columns, and
        ``W^(h) = B_h G_h B_h^T``, ``v^(h) = B_h g_h`` with ``G_h`` entries ``N(0, 1/head_dim)`` and
        ``g_h ~ N(0, I)``: the paper's structural assumption of §7.
    head_dim : int, default=None
        ``d_h``; ``None`` means ``d // n_heads`` (which must then be >= 1). With ``orthogonal``,
        ``n_heads * head_dim <= d`` is required.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    MultiHead

    Raises
    ------
    InvalidInputError
        If a size is out of range.

    Examples
    --------
    >>> import numpy as np
    >>> m = random_multi_head(6, 3, orthogonal=True, seed=0)
    >>> bool(np.allclose(m.Ws[0] @ m.Ws[1], 0) and np.isclose(m.vs[0] @ m.vs[2], 0))
    True
    """
    d = check_int(d, "d", minimum=1)
    H = check_int(n_heads, "n_heads", minimum=1)
    if head_dim is None:
        if d // H < 1:
            raise InvalidInputError(f"n_heads={H} must be <= d={d} when head_dim is not given.")
        dh = d // H
    else:
        dh = check_int(head_dim, "head_dim", minimum=1, maximum=d)
    if orthogonal and H * dh > d:
        raise InvalidInputError(f"orthogonal heads need n_heads * head_dim <= d; got {H} * {dh} > {d}. Lower head_dim.")
    seed = check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    if not orthogonal:
        Q = rng.standard_normal((H, dh, d))
        K = rng.standard_normal((H, dh, d)) / np.sqrt(dh)
        V = rng.standard_normal((H, dh, d))
        w_o = rng.standard_normal(H * dh) / np.sqrt(dh)
        return MultiHead.from_native(Q, K, V, w_o)
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    Q = Q * np.sign(np.diag(R))
    Ws = np.empty((H, d, d))
    vs = np.empty((H, d))
    for h in range(H):
        B = Q[:, h * dh : (h + 1) * dh]
        Ws[h] = B @ (rng.standard_normal((dh, dh)) / np.sqrt(dh)) @ B.T
        vs[h] = B @ rng.standard_normal(dh)
    return MultiHead(Ws, vs)


# --------------------------------------------------------------------------------------------
# Detection: is the oracle one head?
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    """Outcome of :func:`detect_multi_head`.

    Attributes
    ----------
    single_head : bool
        True if a single head explains the oracle on the verification queries.
    max_error : float
        Largest relative disagreement between the oracle and the recovered head on the verification
        queries; ``inf`` when Theorem 4.1's inversion already failed (an attention weight outside
        (0, 1)).
    n_queries : int
        Queries spent, read from the oracle.
    recovery : Recovery or None
        What the single-head learner returned (``None`` if it raised).
    message : str
    """

    single_head: bool
    max_error: float
    n_queries: int
    recovery: Recovery | None
    message: str


def detect_multi_head(oracle, *, verify=64, rtol=1e-6, seed=0, precision=None) -> Detection:
    """Run the single-head learner, then test its answer on ``verify`` fresh random queries.

    Parameters
    ----------
    oracle : ValueQueryOracle
        An exact oracle of dimension ``d``; its budget must allow ``d + d**2 + verify`` queries plus
        any re-measurements of the single-head learner.
    verify : int, default=64
        Number of verification queries (random lengths 1 to 8), ``>= 1``.
    rtol : float, default=1e-6
        Largest relative disagreement that still counts as "one head".
    seed : int, default=0
        Seed of the verification queries.
    precision : None, "measure", str or float, default=None
        The relative rounding ``u`` of the answers, as in
        :func:`companion.exact.learn_single_head` (stated by the oracle if None, else measured
        when the float64 check fails). "One head" then means a disagreement within the larger of
        ``rtol`` and the rounding tolerance ``size(X) u``
        (:func:`companion._learner.head_check_size`), so a float32-served single head is not
        called multi-head, while a multi-head layer, whose disagreement does not shrink with
        ``u``, still is.

    Returns
    -------
    Detection

    Raises
    ------
    TypeError
        If the oracle is approximate.
    InvalidInputError
        If ``verify < 1`` or ``rtol <= 0``.
    NotIdentifiableError
        If the length-1 queries return 0 (then ``sum_h v^(h) = 0`` and the learner cannot start).
    PrecisionError
        If the answers are too coarse (float16, bfloat16) for the check to tell one head from
        several (:func:`companion._learner.verify_outputs`).

    Notes
    -----
    On a multi-head oracle the length-1 queries still return ``sum_h v^(h)`` exactly, but the
    two-token answers are sums of several sigmoids, so Theorem 4.1's inversion [1]_ returns a
    matrix that fits only the queries it used. Fresh queries of other lengths expose it
    (:func:`companion.exact.verify_single_head`); on a single-head oracle the disagreement stays at
    rounding level.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> detect_multi_head(ValueQueryOracle(random_multi_head(4, 2, seed=0))).single_head
    False
    >>> from companion.attention import random_single_head
    >>> detect_multi_head(ValueQueryOracle(random_single_head(4, seed=0))).single_head
    True
    """
    d = check_exact_oracle(oracle, "detect_multi_head")
    verify = check_int(verify, "verify", minimum=1)
    rtol = check_real(rtol, "rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    if hasattr(oracle, "require"):
        oracle.require(d + d * d + verify, learner="detect_multi_head")
    start = oracle.n_queries
    if precision is None:  # the check's tolerance follows u: measure it first when cheap (as the learner does)
        first = AnswerPrecision(oracle, None, seed=seed + 2)
        if first.measure_first(d + d * d + verify) and first.kind == "rounding":
            precision = first.u
    try:
        rec = learn_single_head(oracle, verify=0, precision=precision)
    except OracleInconsistentError as exc:
        return Detection(
            False,
            float("inf"),
            oracle.n_queries - start,
            None,
            f"not a single head: Theorem 4.1's inversion failed ({exc})",
        )
    from ._learner import head_check_size

    prec = AnswerPrecision(oracle, precision if precision != "measure" else rec.diagnostics["precision"], seed=seed + 2)
    scale = float(np.sqrt(np.median(rec.diagnostics["scales"])))
    size = head_check_size(rec.W, rec.v, rec.diagnostics["kappa_W"], 1.0)
    try:
        info = verify_head(
            oracle,
            rec.W,
            rec.v,
            verify,
            rtol=rtol,
            seed=seed,
            scale=scale,
            precision=prec,
            size=size,
            what="a single attention head",
        )
        single, err, tol = True, info["verify_max_error"], info["verify_tolerance"]
        msg = (
            f"consistent with a single head: largest relative disagreement {err:.3g} on "
            f"{verify} fresh queries (tolerance {tol:.3g}; {prec.describe()})"
        )
    except OracleInconsistentError as exc:
        single, err = False, getattr(exc, "max_error", float("inf"))
        why = str(exc).replace("nothing was returned. Pass verify=0 to get the unverified estimate anyway.", "")
        msg = f"not a single head: {why.rstrip()} The single-head fit that failed the check is in .recovery."
    return Detection(single, float(err), oracle.n_queries - start, rec, msg)


def verify_model(
    oracle, model, n, *, rtol=1e-6, seed=0, what="a sum of heads in mutually orthogonal subspaces"
) -> float:
    """Largest relative disagreement between ``oracle`` and ``model`` on ``n`` random queries.

    Queries have random lengths 1 to 8 and tokens ``N(0, I_d / d)``; the disagreement is
    ``|VQ(X) - model(X)| / max(1e-12, max_i sum_h |x_i^T v^(h)|)``.

    Parameters
    ----------
    oracle : ValueQueryOracle
        The oracle; ``n`` of its queries are spent.
    model : MultiHead or SingleHead
        The model to compare with it.
    n : int
        Number of queries, ``>= 1``.
    rtol : float, default=1e-6
        Largest disagreement accepted.
    seed : int, default=0
        Seed of the random queries.
    what : str
        What the oracle is assumed to be, for the error message.

    Returns
    -------
    float
        The largest disagreement.

    Raises
    ------
    OracleInconsistentError
        If it exceeds ``rtol``.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(4, 2, seed=0)
    >>> verify_model(ValueQueryOracle(target), target, 10)
    0.0
    """
    model = _as_model(model)
    n = check_int(n, "n", minimum=1)
    return _verify_heads(oracle, model, n, rtol=rtol, seed=seed, what=what)["verify_max_error"]


def _verify_heads(oracle, model, n, *, rtol, seed, what):
    """:func:`~companion._learner.verify_outputs` for a sum of heads, relative to
    ``max_i sum_h |x_i^T v^(h)|``; returns its verification record (for ``build``)."""
    vs = model.vs
    return verify_outputs(
        oracle,
        model,
        lambda x: max(1e-12, float(np.max(np.abs(x @ vs.T).sum(axis=1)))),
        n,
        rtol=rtol,
        seed=seed,
        what=what,
    )


# --------------------------------------------------------------------------------------------
# Structured learner: heads in mutually orthogonal subspaces
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class MultiHeadRecovery(Recovery):
    """A :class:`~companion.recovery.Recovery` for a multi-head target.

    Attributes
    ----------
    Ws : ndarray of shape (H, d, d)
        The recovered heads' query-key matrices.
    vs : ndarray of shape (H, d)
        Their value vectors.
    W, v
        ``sum_h W^(h)`` and ``sum_h v^(h)`` (the latter is what length-1 queries return).
    n_queries, message, diagnostics
        As for :class:`~companion.recovery.Recovery`.
    """

    Ws: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    vs: np.ndarray = None  # type: ignore[assignment]

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    @property
    def model(self) -> MultiHead:
        """The recovered model as a :class:`~companion.attention.MultiHead`."""
        return MultiHead(self.Ws, self.vs)


def _heads_result(oracle, start, Ws, vs, **fields) -> MultiHeadRecovery:
    """A multi-head learner's result: heads ``Ws`` (H, d, d), ``vs`` (H, d) and their sums ``W``, ``v``.

    ``fields`` (``verification``, ``message``, ``diagnostics``) go to :func:`companion._learner.build`,
    which reads ``n_queries`` from the oracle's counter since ``start``.
    """
    return build(MultiHeadRecovery, oracle, start, W=Ws.sum(axis=0), v=vs.sum(axis=0), Ws=Ws, vs=vs, **fields)


def _hessian_queries(d, x0, s):
    """Queries ``[(w + t x0)^T; (t x0)^T]`` for ``w`` in {e_k} and {e_k + e_l, k < l}, t in (s, 2s)."""
    iu = np.triu_indices(d)
    Wdir = np.zeros((iu[0].size, d))
    Wdir[np.arange(iu[0].size), iu[0]] = 1.0
    Wdir[np.arange(iu[0].size), iu[1]] += np.where(iu[0] != iu[1], 1.0, 0.0)
    X = np.zeros((2, Wdir.shape[0], 2, d))
    for k, t in enumerate((s, 2 * s)):
        X[k, :, 0, :] = Wdir + t * x0
        X[k, :, 1, :] = t * x0
    return Wdir, iu, X.reshape(-1, 2, d)


def _probe_hessian(oracle, v, x0, s):
    """The symmetric matrix ``M = sym(sum_h v^(h) (W^(h) x0)^T)`` from ``d (d + 1)`` queries.

    For ``u = w + t x0``, ``x = t x0`` the answer is
    ``t x0^T v + w^T v / 2 + (1/2) sum_h (w^T v^(h)) tanh(t w^T W^(h) x0 / 2)``; the last term divided
    by ``t`` tends to ``w^T M w / 2`` with an error ``O(t^2)``, removed by Richardson extrapolation
    over ``t = s, 2s`` (error ``O(s^4)``).
    """
    d = v.shape[0]
    Wdir, iu, X = _hessian_queries(d, x0, s)
    n = Wdir.shape[0]
    y = oracle(X).reshape(2, n)
    base = Wdir @ v / 2
    D1 = 2 * (y[0] - s * (x0 @ v) - base) / s
    D2 = 2 * (y[1] - 2 * s * (x0 @ v) - base) / (2 * s)
    q = (4 * D1 - D2) / 3 * 2  # = w^T M w with M = sym(sum_h v_h a_h^T)
    Q = np.zeros((d, d))
    Q[iu] = q
    diag = np.diag(Q).copy()
    M = np.diag(diag)
    off = iu[0] != iu[1]
    k, l = iu[0][off], iu[1][off]
    M[k, l] = (Q[k, l] - diag[k] - diag[l]) / 2
    M[l, k] = M[k, l]
    return M


def _measure_row(oracle, z, v, uv):
    """``z^T W^(h)`` for a probe ``z`` in the subspace of head ``h``, from ``d`` queries (+ re-measures).

    Query ``j`` is ``c [(z + e_j)^T; e_j^T]``; every other head sees logit 0 and ``z^T v^(h') = 0``,
    so the answer is ``c v_j + c sigma(c^2 z^T W^(h) e_j) z^T v`` as for one head (Theorem 4.1).
    """
    d = v.shape[0]
    eye = np.eye(d)
    c = np.ones(d)

    def queries(idx):  # rank-one projections with a = z, b = e_j
        return rop_queries(np.broadcast_to(z, (idx.size, d)), eye[idx], c[idx])

    idx = np.arange(d)
    t, alpha = invert_two_token(oracle(queries(idx)), v, uv, c)
    n_re = remeasure_saturated(
        lambda j, cj: invert_two_token(oracle(queries(j)), v[j], uv, cj),
        t,
        alpha,
        c,
        band=_BAND,
        what="sum of heads in mutually orthogonal subspaces",
    )
    if not np.all(np.isfinite(t)):
        raise OracleInconsistentError(
            "an attention weight fell outside (0, 1) for a probe inside a head's subspace: the "
            "oracle does not satisfy the assumption of heads in mutually orthogonal subspaces."
        )
    return t / c**2, n_re


def _grow_subspace(oracle, q, v, tol, max_probes):
    """Krylov growth from ``q`` under ``W^(h)T``: returns probes ``Z``, rows ``R = W^(h)T Z``, basis.

    At most ``max_probes`` probes (``d`` minus the dimensions already found: orthogonal subspaces
    of R^d add up to at most ``d``); one more raises :class:`OracleInconsistentError`.
    """
    d = v.shape[0]
    K = q[:, None] / np.linalg.norm(q)
    Z, R = [], []
    n_re = 0
    while True:
        if Z:
            Zm = np.array(Z).T
            rest = K - Zm @ np.linalg.lstsq(Zm, K, rcond=None)[0]
            if np.max(np.linalg.norm(rest, axis=0)) <= tol:
                break
            b = rest[:, int(np.argmax(np.linalg.norm(rest, axis=0)))]
            b = b / np.linalg.norm(b)
            Pz = orth(Zm)
            p = Pz @ (Pz.T @ v)
            p = p / max(np.linalg.norm(p), np.finfo(float).tiny)
            z = b + p if abs(b @ v) < 0.5 * abs(p @ v) else b
            z = z / np.linalg.norm(z)
        else:
            z = K[:, 0]
        if len(Z) == max_probes:
            raise OracleInconsistentError(
                f"the heads found so far span more than d={d} dimensions: their subspaces are not "
                "mutually orthogonal, so the oracle is not a sum of heads in orthogonal subspaces "
                "(the assumption of learn_orthogonal_heads); use learn_canonical for general heads."
            )
        uv = float(z @ v)
        if abs(uv) <= tol * np.linalg.norm(v):
            raise NotIdentifiableError(
                "a probe inside a head's subspace has z^T v = 0, so its row of W cannot be read; "
                "the head's value vector may be 0 (then the head is invisible)."
            )
        r, k = _measure_row(oracle, z, v, uv)
        n_re += k
        Z.append(z)
        R.append(r)
        res = r - K @ (K.T @ r)
        if np.linalg.norm(res) > tol * max(np.linalg.norm(r), 1.0) and K.shape[1] < d:
            K = np.column_stack([K, res / np.linalg.norm(res)])
            K = orth(K)
    return np.array(Z).T, np.array(R).T, K, n_re


#: The orthogonal-heads learner reads each head's subspace off finite-difference Hessians (step 1e-3),
#: which rounding at float32 swamps: a refusal there names the rounding, not non-orthogonal heads.
_orthogonal_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its subspaces come from finite-difference "
        "Hessians of the answers (step ~1e-3), which rounding at this level swamps, so this refusal "
        "is the answers' rounding, not heads outside mutually orthogonal subspaces. Ask a float64 "
        f"server, or use detect_multi_head(oracle, precision=...). (The check said: {err})"
    )
)


@_orthogonal_rounding
def learn_orthogonal_heads(oracle, *, step=1e-3, tol=1e-6, verify=DEFAULT_VERIFY, verify_rtol=1e-5, seed=0):
    """Recover the heads of a multi-head oracle whose heads live in mutually orthogonal subspaces.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d`` for ``f^H = sum_h f_{W^(h), v^(h)}`` where, for mutually
        orthogonal subspaces ``S_1, ..., S_H`` of R^d, ``W^(h) = P_h W^(h) P_h`` and
        ``v^(h) in S_h`` (``P_h`` the orthogonal projector onto ``S_h``). Neither ``H`` nor the
        subspaces are given. Beyond orthogonality the learner needs, for every head:

        * ``v^(h) != 0`` and ``W^(h) != 0`` (a head with ``W^(h) = 0`` has a zero Hessian block
          and is never found; its uniform attention is then missing from the model);
        * ``W^(h)`` restricted to ``S_h`` is *cyclic* (non-derogatory): no eigenvalue has two
          independent eigenvectors, so the Krylov sequence of ``W^(h)T`` from a probe spans
          ``S_h``. A multiple of the identity on a subspace of dimension >= 2, or
          ``diag(1, 1, 2)``, breaks it: the head is split into several wrong heads;
        * ``S_h`` is spanned by ``v^(h)`` and the columns of ``W^(h)``;
        * a generic ``x0`` (the seed): the heads' nonzero Hessian eigenvalues are distinct.

        Random heads (:func:`random_multi_head` with ``orthogonal=True``) satisfy all of these
        with probability 1. A target that breaks one is refused by the verification.
    step : float, default=1e-3
        Size ``s`` of the query token in the Hessian probe, ``0 < s <= 0.1``.
    tol : float, default=1e-6
        Relative threshold for a nonzero eigenvalue of the Hessian and for a new direction of a
        subspace, ``0 < tol < 1``.
    verify : int, default=32
        Fresh random queries (lengths 1 to 8, never used for learning) on which the recovered
        model is compared with the oracle (:func:`verify_model`); 0 opts out.
    verify_rtol : float, default=1e-5
        Largest relative disagreement accepted by the check. The Hessian step leaves errors of
        about 1e-7 on heads with entries of size 30 (measured), and a target outside the
        assumptions disagrees by 1e-2 or more.
    seed : int, default=0
        Seed of the random query token ``x0`` of the Hessian probe.

    Returns
    -------
    MultiHeadRecovery
        ``Ws`` (H, d, d), ``vs`` (H, d) in the order found; ``n_queries`` equals
        ``d + d (d + 1) + d * sum_h dim S_h`` (``2 d^2 + 2 d`` when the subspaces fill R^d) plus
        re-measurements of saturated probes and ``verify`` (``n_learning_queries`` leaves out the
        ``verify``); never more than ``2 d^2 + 2 d`` before the re-measurements. ``diagnostics``
        holds ``hessian_eigenvalues`` (sorted by magnitude), ``head_dims``, ``n_requeries``,
        ``n_verify_queries`` and, with ``verify``, ``verify_max_error`` and ``verify_tolerance``
        (the tolerance it was held to).

    Raises
    ------
    TypeError
        If the oracle is approximate.
    InvalidInputError
        For ``step``, ``tol``, ``verify`` out of range.
    BudgetExceededError
        If the oracle's budget is below ``2 d^2 + 2 d + verify`` (the count when the subspaces fill
        R^d, the most the learner asks before re-measurements), before the first query; or if the
        re-measurements of saturated probes then pass the budget.
    NotIdentifiableError
        If ``sum_h v^(h) = 0`` or the Hessian probe is 0 (no head visible).
    OracleInconsistentError
        If an attention weight of an isolated head leaves (0, 1), the subspaces found would span
        more than ``d`` dimensions, or the verification fails: the oracle's heads are not in
        orthogonal subspaces.
    PrecisionError
        Instead of ``OracleInconsistentError`` when the answers carry float32 or coarser rounding
        (stated, or measured after the refusal with 24 queries): the message names the rounding.

    Notes
    -----
    §7 of [1]_ names this structure and sketches a learner through the Hessian with respect to a
    probe vector and block diagonalisation [2]_. Here:

    1. Length-1 queries give ``v = sum_h v^(h)`` (``d`` queries).
    2. Hessian probe. For ``u = w + t x0``, ``x = t x0`` the two-token identity gives
       ``f = t x0^T v + (1/2) sum_h (w^T v^(h)) (1 + tanh(t w^T W^(h) x0 / 2))``; its slope in ``t``
       at 0 is the quadratic form of ``M = sym(sum_h v^(h) (W^(h) x0)^T) / 2``, read off for
       ``w = e_k, e_k + e_l`` with Richardson extrapolation over ``t = s, 2s`` (``d (d + 1)``
       queries). ``M`` is block diagonal along the ``S_h``: each eigenvector with a nonzero
       eigenvalue lies in a single ``S_h`` (two per head).
    3. Isolation. For ``z in S_h`` the query ``[(z + e_j)^T; e_j^T]`` gives every other head logit 0
       and weight ``z^T v^(h') = 0``, so the answer is ``v_j + sigma(z^T W^(h) e_j) z^T v`` with
       ``z^T v = z^T v^(h)``: Theorem 4.1's inversion reads the row ``z^T W^(h)`` exactly
       (``d`` queries). That row lies in ``S_h`` again, so starting from an eigenvector and adding
       each new row (a Krylov sequence of ``W^(h)T``) spans ``S_h`` after ``dim S_h`` probes.
       Then ``W^(h) = B C^{-T} R^T`` (``B`` an orthonormal basis of ``S_h``, ``Z = B C`` the probes,
       ``R = W^(h)T Z`` the rows) and ``v^(h) = B B^T v``. A probe whose attention weight falls
       outside [0.05, 0.95] is re-measured at a smaller scale ``c`` (one query each, as in
       :func:`companion.exact.learn_single_head` but with a tighter band, since ``sigma^{-1}``
       amplifies the probe's tiny leakage into other subspaces by ``1 / (alpha (1 - alpha))``).

    Eigenvectors already inside a found subspace are skipped, so ``H`` is found, not given. The
    only approximation is step 2 (eigenvectors to about 1e-10); the recovered heads inherit it.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Murota, Kanno, Kojima, Kojima, "A numerical algorithm for block-diagonal decomposition of
       matrix \\*-algebras with application to semidefinite programming", Japan J. Indust. Appl.
       Math. 27, 2010.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(6, 3, orthogonal=True, seed=0)
    >>> rec = learn_orthogonal_heads(ValueQueryOracle(target))
    >>> rec.n_heads, rec.n_learning_queries, match_heads(target, rec.model)["max_W_error"] < 1e-7
    (3, 84, True)
    >>> rec.n_queries                                     # plus 32 verification queries
    116
    """
    d = check_exact_oracle(oracle, "learn_orthogonal_heads")
    step = check_real(step, "step", minimum=0.0, strict=True, maximum=0.1)
    tol = check_real(tol, "tol", minimum=0.0, strict=True, maximum=0.5)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    # The most it can ask before re-measurements: d + d (d + 1) + d * sum_h dim S_h with the sum
    # at its largest, d (the subspaces are orthogonal; _grow_subspace refuses to go beyond).
    start = reserve(oracle, d + d * (d + 1) + d * d + verify, "learn_orthogonal_heads")

    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)
    if not np.any(v):
        raise NotIdentifiableError(
            "the length-1 queries return sum_h v^(h) = 0; with heads in orthogonal subspaces this "
            "means every v^(h) = 0 and f is identically 0."
        )
    x0 = np.random.default_rng(seed).standard_normal(d)
    x0 /= np.linalg.norm(x0)
    M = _probe_hessian(oracle, v, x0, step)
    lam, U = eigh(M)
    order = np.argsort(-np.abs(lam))
    lam, U = lam[order], U[:, order]
    if np.abs(lam[0]) == 0:
        raise NotIdentifiableError("the Hessian probe is 0: no head is visible from this x0.")
    keep = np.abs(lam) > tol * np.abs(lam[0])

    bases, Ws, vs, n_re = [], [], [], 0
    for q in U[:, keep].T:
        if bases:
            F = np.column_stack(bases)
            if np.linalg.norm(q - F @ (F.T @ q)) < 0.5:
                continue  # inside a subspace already found
            q = q - F @ (F.T @ q)
        Z, R, B, k = _grow_subspace(oracle, q, v, tol, d - sum(b.shape[1] for b in bases))
        n_re += k
        C = B.T @ Z
        Ws.append(B @ np.linalg.solve(C.T, R.T))
        vs.append(B @ (B.T @ v))
        bases.append(B)
    Ws, vs = np.array(Ws), np.array(vs)
    diagnostics = {
        "hessian_eigenvalues": lam,
        "head_dims": [int(B.shape[1]) for B in bases],
        "n_requeries": n_re,
    }
    message = f"found {len(bases)} heads in orthogonal subspaces of dimensions {diagnostics['head_dims']}"
    checked = _verify_heads(
        oracle,
        MultiHead(Ws, vs),
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a sum of heads in mutually orthogonal subspaces, each cyclic with W^(h) != 0 "
        "(the assumptions of learn_orthogonal_heads)",
    )
    return _heads_result(oracle, start, Ws, vs, verification=checked, message=message, diagnostics=diagnostics)


# --------------------------------------------------------------------------------------------
# General heads: the canonical form from value queries (this book's construction)
# --------------------------------------------------------------------------------------------


def _repeat_queries(u, x, n, m):
    """Sequences of ``n[k]`` copies of ``u`` followed by ``m[k]`` copies of ``x`` (query token last)."""
    return [np.concatenate([np.repeat(u[None], a, axis=0), np.repeat(x[None], b, axis=0)]) for a, b in zip(n, m)]


def _ask_rows(oracle, delta, Xs, n, m, v):
    """``g[k, :] = VQ(n copies of x_k + delta, m copies of x_k) - x_k^T v`` for every probe ``x_k``."""
    seqs = []
    for x in Xs:
        seqs.extend(_repeat_queries(x + delta, x, n, m))
    y = np.asarray(oracle(seqs), dtype=np.float64).reshape(len(Xs), n.size)
    return y - (Xs @ v)[:, None]


def _row_terms(s, G, H, tol, need, fits=None):
    """Amplitudes shared by the rows of ``G`` and, for each row, the shifts (or NaN if unresolved).

    Every row of ``G`` is ``sum_h c_h sigma(s + l_{h,k})`` with the same ``c``. Free fits give ``H``
    (if not given) and the amplitudes (from the best-conditioned fit); the shifts of each row are
    then refitted with the amplitudes fixed. If fewer than ``need`` rows are resolved, the
    amplitudes are re-solved by linear least squares over the resolved rows and the refit repeated.
    """
    from scipy.special import expit

    from ._rational import fit_free, fit_shifts

    fits = list(fits or [])
    fits += [fit_free(s, g, sensitivity=False) for g in G[len(fits) :]]
    sizes = np.array([f[0].size for f in fits])
    good = [k for k, f in enumerate(fits) if f[2]["residual"] <= tol * max(f[2]["scale"], 1e-300)]
    if H is None:
        if not good:
            return None, None, fits
        H_row = int(np.bincount(sizes[good]).argmax())
    else:
        H_row = H
    ref = [k for k in good if sizes[k] == H_row]
    if not ref:  # no fit at tolerance: start from looser fits (the row fit refines)
        ref = [
            k for k, f in enumerate(fits) if sizes[k] == H_row and f[2]["residual"] <= 1e-6 * max(f[2]["scale"], 1e-300)
        ]
    if not ref or H_row == 0:  # no fit, or no head visible along this row
        return None, None, fits
    sens = [fit_free(s, G[k])[2]["sensitivity"] for k in ref[:8]]
    c = fits[ref[int(np.argmin(sens))]][0]
    L = np.full((G.shape[0], H_row), np.nan)
    for _ in range(2):
        for k, (ck, lk, info) in enumerate(fits):
            if ck.size != H_row:
                continue
            rows, cols = linear_sum_assignment(np.abs(ck[:, None] - c[None, :]))
            l0 = np.empty(H_row)
            l0[cols] = lk[rows]
            lk2, inf2 = fit_shifts(s, G[k], c, l0)
            # a term far outside the window of log r is unresolved
            inside = np.max(np.abs(lk2)) <= np.max(np.abs(s)) + 20
            L[k] = lk2 if inf2["residual"] <= tol * info["scale"] and inside else np.nan
        ok = np.flatnonzero(np.all(np.isfinite(L), axis=1))
        if ok.size >= need or ok.size == 0:
            break
        A = np.concatenate([expit(s[:, None] + L[k][None, :]) for k in ok])
        c = np.linalg.lstsq(A, G[ok].ravel(), rcond=None)[0]
    return c, L, fits


_COARSE_FACTOR = COARSE_FACTOR  # the one factor of companion._learner.names_rounding

#: Both canonical-form routes fit sums of logistic terms to float64 rounding: a refusal at float32 or
#: coarser answers names the rounding (companion._learner.names_rounding), not a wrong H.
_names_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} could not resolve the heads, and {prec.describe()}: its fits of logistic sums "
        "need answers exact to float64 rounding, so this refusal is the answers' rounding, not a wrong "
        "H or a target outside the class. At this precision use detect_multi_head(oracle, "
        "precision=...) to tell one head from several; no canonical-form learner here works from "
        f"answers this coarse. (The fit said: {err})"
    )
)


@_names_rounding
def learn_canonical(
    oracle,
    H=None,
    *,
    scale=4.0,
    max_len=128,
    n_points=None,
    oversample=2.0,
    max_tokens_factor=8.0,
    row_retries=2,
    tol=1e-9,
    verify=64,
    verify_rtol=1e-6,
    seed=0,
):
    """Recover the canonical form of a general multi-head target from value queries.

    The robust route: several times the follow-up's ``4 H d^2 - 2 H + 1`` queries, and sequences
    up to ``max_len`` tokens, but it resolves more heads per pair. When queries are expensive and
    ``H`` is small, :func:`learn_canonical_rational` asks at most that count, of length
    ``<= 2 H + 1``; use this one where that route refuses (``benchmarks/bench_multihead.py``
    measures the largest ``H`` of both per ``d``).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d`` for ``f^H = sum_h f_{W_h, v_h}`` (any heads; no
        structural assumption). The learner asks sequences of length up to ``max_len``.
    H : int, default=None
        Number of heads of the canonical form, if known; ``None`` detects it (the number of
        logistic terms found in the best-conditioned fits).
    scale : float, default=4.0
        Norm of the query token ``x``; the shifts ``(u - x)^T W_h x`` grow with it, which spreads
        the heads apart (``0 < scale <= 100``).
    max_len : int, default=128
        Longest sequence, ``>= 5``; the counts ratio ``r = n / m`` spans ``[1 / (L-1), L-1]``.
    n_points : int, default=None
        Counts ``(n, m)`` per probe pair; ``None`` means ``4 H + 4`` (with ``H = 8`` when
        ``H=None``).
    oversample : float, default=2.0
        Query tokens per row as a multiple of ``d`` (``>= 1``); extra tokens replace the ones
        whose fit is ill-conditioned.
    max_tokens_factor : float, default=8.0
        When fewer than ``d + 2`` tokens of a row resolve every head, ``ceil(d / 2)`` more tokens
        are drawn (and used by every later row), up to ``max_tokens_factor * d`` tokens
        (``>= oversample``).
    row_retries : int, default=2
        New random directions tried for a row whose fit fails or sees fewer heads than the
        others (a head's amplitude ``delta_i^T v_h`` nearly 0), ``>= 0``.
    tol : float, default=1e-9
        Largest relative misfit and rounding sensitivity accepted for a fit.
    verify : int, default=64
        Fresh random queries on which the result is checked (:func:`verify_model`); ``0`` opts out.
    verify_rtol : float, default=1e-6
        Largest relative disagreement accepted by the check.
    seed : int, default=0
        Seed of the random orthonormal directions ``u - x`` and query tokens ``x``.

    Returns
    -------
    MultiHeadRecovery
        ``Ws``, ``vs`` of the canonical form (:func:`canonical_form` order). ``n_queries`` is read
        from the oracle (learning plus ``verify``). ``diagnostics``: ``n_heads``, ``max_len``
        (longest sequence asked), ``n_points`` (sequence lengths per token), ``n_tokens`` (query
        tokens), ``n_learn_queries``, ``n_verify_queries``, ``kim_count``
        (``4 H d^2 - 2 H + 1``), ``resolved_fraction`` (fits accepted per row),
        ``max_sensitivity``, ``verify_tolerance``, ``reference_row`` (the row the others are linked to),
        ``n_redrawn_rows`` (row directions drawn again), ``max_link_error`` (largest mismatch of a
        linked row), ``verify_max_error``.

    Raises
    ------
    PrecisionError
        If the fits refuse and the answers' precision (stated, or measured with 24 more queries)
        is far coarser than float64's (float32 or coarser): the rounding, not ``H`` or the model, is the cause.
    TypeError
        If the oracle is approximate.
    InvalidInputError
        If a parameter is out of range.
    NotIdentifiableError
        If ``sum_h v_h = 0`` and no term is found (``f`` is identically 0).
    OracleInconsistentError
        If too few fits are well conditioned to solve for a head's row, rows cannot be linked, the
        rows disagree on ``H``, or the verification fails: raised instead of returning a wrong model.

    Notes
    -----
    This book's construction (not in [1]_; [2]_ proves a different algorithm). A query of ``n``
    copies of ``u = x + delta`` followed by ``m`` copies of ``x`` gives every head the weight
    ``sigma(log(n/m) + l_h)`` on the copies, ``l_h = delta^T W_h x``, so

        VQ - x^T v = sum_h c_h sigma(log(n/m) + l_h),   c_h = delta^T v_h

    (the private module ``companion._rational``). For each row direction ``delta_i`` (an orthonormal basis) and
    ``ceil(oversample d)`` tokens ``x_k`` (Gaussian, norm ``scale``) the sum is fitted (AAA, then
    Levenberg-Marquardt); the amplitudes ``delta_i^T v_h`` are shared by all ``x_k`` and label the
    heads within the row, the shifts give ``delta_i^T W_h x_k``, and least squares over the
    accepted ``x_k`` gives the row ``delta_i^T W_h``, refined by one joint fit of the row over
    all tokens (the shifts are linear in ``x_k``). When fewer than ``d + 2`` tokens resolve every
    head, more tokens are drawn; when a row still fails, or sees fewer heads than the others (an
    amplitude ``delta_i^T v_h`` near 0), its direction is redrawn (``row_retries``) and the rows
    are solved with the inverse of the direction matrix. Rows are linked to a reference row ``i0``
    by fits at ``delta_i0 + delta_i``, whose terms are the sums of one term of each row. Heads with
    equal ``W`` give one term (their ``v`` add up) and heads with ``v_h = 0`` give none, so the
    result is the canonical form.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, arXiv 2608.03294, 2026.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(4, 2, seed=0)
    >>> rec = learn_canonical(ValueQueryOracle(target))
    >>> rec.n_heads, equivalent(rec.model, target, atol=1e-8)
    (2, True)
    """
    from ._rational import count_pairs, fit_row

    d = check_exact_oracle(oracle, "learn_canonical")
    if H is not None:
        H = check_int(H, "H", minimum=1)
    scale = check_real(scale, "scale", minimum=0.0, strict=True, maximum=100.0)
    max_len = check_int(max_len, "max_len", minimum=5)
    H_plan = 8 if H is None else H
    n_points = 4 * H_plan + 4 if n_points is None else check_int(n_points, "n_points", minimum=3)
    oversample = check_real(oversample, "oversample", minimum=1.0)
    max_tokens_factor = check_real(max_tokens_factor, "max_tokens_factor", minimum=oversample)
    row_retries = check_int(row_retries, "row_retries", minimum=0)
    tol = check_real(tol, "tol", minimum=0.0, strict=True, maximum=1e-2)
    verify = check_int(verify, "verify", minimum=0)
    verify_rtol = check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    n, m = count_pairs(n_points, max_len)
    s = np.log(n / m)
    n_x = int(np.ceil(oversample * d))
    n_link = max(3, int(np.ceil(2 * H_plan**2 / n_points)))
    max_tokens = int(np.ceil(max_tokens_factor * d))
    if hasattr(oracle, "require"):
        oracle.require(d + d * n_x * n.size + (d - 1) * n_link * n.size + verify, learner="learn_canonical")
    start = oracle.n_queries
    rng = np.random.default_rng(seed)
    P, R = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(R))).T  # rows delta_i, orthonormal
    Xs = rng.standard_normal((n_x, d))
    Xs *= scale / np.linalg.norm(Xs, axis=1, keepdims=True)
    X_link = rng.standard_normal((n_link, d))
    X_link *= scale / np.linalg.norm(X_link, axis=1, keepdims=True)

    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)

    def learn_row(i, H_row):
        """``(c, R, fraction, sensitivity)`` of row direction ``P[i]``; extends ``Xs`` if needed."""
        nonlocal Xs
        G = _ask_rows(oracle, P[i], Xs, n, m, v)
        fits = None
        while True:
            c, L, fits = _row_terms(s, G, H_row, tol, d + 2, fits)
            n_ok = 0 if L is None else int(np.all(np.isfinite(L), axis=1).sum())
            if n_ok >= d + 2 or Xs.shape[0] >= max_tokens:
                break
            # Too few tokens resolved all heads: ask more tokens (shared by the later rows).
            if Xs.shape[0] == G.shape[0]:
                extra = rng.standard_normal((int(np.ceil(d / 2)), d))
                extra *= scale / np.linalg.norm(extra, axis=1, keepdims=True)
                Xs = np.vstack([Xs, extra])
            G = np.vstack([G, _ask_rows(oracle, P[i], Xs[G.shape[0] :], n, m, v)])
        n_x = Xs.shape[0]
        if G.shape[0] < n_x:
            G = np.vstack([G, _ask_rows(oracle, P[i], Xs[G.shape[0] :], n, m, v)])
            c, L, fits = _row_terms(s, G, H_row, tol, d + 2, fits)
        if c is None and np.all(np.abs(G) <= 1e-12 * max(1.0, float(np.max(np.abs(v), initial=0.0)))):
            raise NotIdentifiableError(
                f"row {i}: the answers are x^T v for every query token, with no head's softmax "
                "visible: the heads' values cancel (e.g. v and -v on equal W), so the canonical form "
                "has no heads and no W is identifiable from these queries."
            )
        if c is None:
            raise OracleInconsistentError(
                f"row {i}: no well-conditioned fit of the logistic sum among {n_x} query tokens "
                f"(tolerance {tol:g}); "
                + (f"H={H} may be wrong (try H=None to detect it), or " if H is not None else "")
                + "raise max_len or scale, or give H; the oracle may also not be a sum of heads."
            )
        ok = np.all(np.isfinite(L), axis=1)
        for _ in range(3):  # drop tokens whose shifts disagree with the others (mislabelled)
            if ok.sum() < d:
                break
            R0 = np.linalg.lstsq(Xs[ok], L[ok], rcond=None)[0].T  # (H_i, d): delta_i^T W_h
            miss = np.full(n_x, np.inf)
            miss[ok] = np.max(np.abs(Xs[ok] @ R0.T - L[ok]), axis=1)
            ok = miss <= max(1e-7, 10 * np.median(miss[ok]))
        if ok.sum() < d or np.linalg.cond(Xs[ok]) > 1e6:
            raise OracleInconsistentError(
                f"row {i}: only {int(ok.sum())} of {n_x} fits resolved the {c.size} heads "
                f"consistently (need {d} with well-conditioned tokens); "
                + (f"H={H} may be wrong (try H=None to detect it), or " if H is not None else "")
                + "raise max_tokens_factor, max_len or scale."
            )
        c, R, info = fit_row(s, G, Xs, c, R0)
        if info["residual"] > 1e3 * _EPS * info["scale"] * np.sqrt(G.size) or info["sensitivity"] > tol:
            raise OracleInconsistentError(
                f"row {i}: the joint fit of {c.size} heads over {n_x} tokens has misfit "
                f"{info['residual'] / info['scale']:.2g} and rounding sensitivity "
                f"{info['sensitivity']:.2g} (tolerance {tol:g}); raise max_len or scale."
            )
        return c, R, float(ok.mean()), info["sensitivity"]

    def redraw(i):
        """A new direction for row i (a head's amplitude may vanish along the old one)."""
        for _ in range(100):
            q = rng.standard_normal(d)
            Pn = P.copy()
            Pn[i] = q / np.linalg.norm(q)
            if np.linalg.cond(Pn) < 10 * d:
                P[i] = Pn[i]
                return
        P[i] = Pn[i]

    out = [None] * d
    n_redrawn = 0
    for i in range(d):
        for attempt in range(row_retries + 1):
            try:
                out[i] = learn_row(i, H)
                break
            except OracleInconsistentError:
                if attempt == row_retries:
                    raise
                redraw(i)
                n_redrawn += 1
    H_found = max(o[0].size for o in out)
    for i in range(d):
        attempt = 0
        while out[i][0].size != H_found:  # a head invisible along this direction
            if attempt == row_retries:
                raise OracleInconsistentError(
                    f"row {i} sees {out[i][0].size} heads, other rows {H_found}, after "
                    f"{row_retries} new directions; change seed."
                )
            redraw(i)
            n_redrawn += 1
            attempt += 1
            try:
                out[i] = learn_row(i, H_found)
            except OracleInconsistentError:
                pass
    amps = [o[0] for o in out]
    rows = [o[1] for o in out]
    fractions = [o[2] for o in out]
    sens = [o[3] for o in out]

    # Link every row to a reference row through fits at delta_i0 + delta_i.
    gaps = [np.min(np.diff(np.sort(a))) if a.size > 1 else np.inf for a in amps]
    i0 = int(np.argmax(gaps))
    perms = [None] * d
    perms[i0] = np.arange(H_found)
    link_err = []
    from scipy.special import expit

    for i in range(d):
        if i == i0:
            continue
        if H_found == 1:
            perms[i] = np.arange(1)
            continue
        delta = P[i0] + P[i]
        G = _ask_rows(oracle, delta, X_link, n, m, v)
        # Every candidate term (head h of row i0 with head g of row i) has known shifts at the link
        # tokens, so the link answers are linear in the H^2 candidate amplitudes beta_hg; the true
        # pairs have beta_hg = c_h(i0) + c_g(i), the others 0.
        shifts = (
            np.einsum("hd,kd->kh", rows[i0], X_link)[:, :, None] + np.einsum("gd,kd->kg", rows[i], X_link)[:, None, :]
        )  # (n_link, H, H)
        A = expit(s[None, :, None, None] + shifts[:, None]).reshape(n_link * n.size, -1)
        beta = np.linalg.lstsq(A, G.ravel(), rcond=None)[0].reshape(H_found, H_found)
        pred = amps[i0][:, None] + amps[i][None, :]
        r_idx, c_idx = linear_sum_assignment(np.abs(beta - pred) - np.abs(beta))
        sel = np.zeros((H_found, H_found), bool)
        sel[r_idx, c_idx] = True
        miss = max(np.max(np.abs(beta - pred)[sel]), np.max(np.abs(beta)[~sel], initial=0.0))
        link_err.append(float(miss / np.max(np.abs(pred[sel]))))
        if link_err[-1] > 1e-3:
            raise OracleInconsistentError(
                f"rows {i0} and {i} could not be linked: the best pairing of their heads misfits "
                f"the link queries by {link_err[-1]:.3g} (relative)."
            )
        perms[i] = c_idx
    Rw = np.array([rows[i][perms[i]] for i in range(d)])  # (d, H, d): delta_i^T W_h
    Cv = np.array([amps[i][perms[i]] for i in range(d)])  # (d, H): delta_i^T v_h
    n_learn = oracle.n_queries - start
    model = _heads_from_rows(P, Rw, Cv)  # rows delta_i, redrawn ones included
    diagnostics = {
        "n_heads": model.n_heads,
        "max_len": int(np.max(n + m)),
        "n_points": int(n.size),
        "n_learn_queries": int(n_learn),
        "kim_count": int(4 * model.n_heads * d * d - 2 * model.n_heads + 1),
        "resolved_fraction": float(np.min(fractions)),
        "max_sensitivity": float(np.max(sens)),
        "reference_row": i0,
        "n_tokens": int(Xs.shape[0]),
        "n_redrawn_rows": n_redrawn,
        "max_link_error": max(link_err, default=0.0),
    }
    message = f"found {model.n_heads} heads from {n_learn} queries of length <= {diagnostics['max_len']}"
    try:
        checked = _verify_heads(oracle, model, verify, rtol=verify_rtol, seed=seed + 1, what="a sum of attention heads")
    except OracleInconsistentError as exc:
        raise OracleInconsistentError(
            f"learn_canonical: the recovered {model.n_heads}-head canonical form fails "
            f"verification ({str(exc).split(':')[0]}); the oracle is not a sum of attention "
            "heads, or its heads are too close to resolve (try a larger scale or max_len)."
        ) from exc
    return _heads_result(
        oracle, start, model.Ws, model.vs, verification=checked, message=message, diagnostics=diagnostics
    )


__all__ += ["learn_canonical"]


# --------------------------------------------------------------------------------------------
# General heads at the follow-up's count: rational interpolation in the number of copies
# --------------------------------------------------------------------------------------------

#: Relative misfit at which a pair's own interpolation is good enough to start a row's joint fit
#: (measured: the joint fit converges from about 1 % errors in the amplitudes and shifts).
_START_TOL = 1e-6

#: Relative amplitude agreement (to the row's largest) at which a term of a pair's own fit is taken
#: as that row's head for the start (measured at d = 32, H = 8: 1e-3 keeps about 35 of 55 tokens
#: per head with shift errors below 5e-4 for 95 %; the outliers are trimmed by _start_rows).
_MATCH_TOL = 1e-3

#: Rounding sensitivity of a pair's own fit (relative to the row's largest answer,
#: :func:`companion._rational.pair_sensitivity`) at or below which pairs that disagree on the
#: amplitudes (to 1 %, _agreeing) are not put down to float64: a hundred times below that
#: agreement, rounding cannot move an amplitude that far, and the refusal names a wrong H instead.
_WELL_CONDITIONED = 1e-4

#: A pair is used for a head's refit in _repair_start where that one term, against the others at the
#: start, misfits by at most this factor times the median over the row's pairs (the others' start
#: errors set the level: about 1e-4 relative at d = 32, H = 7).
_REPAIR_FACTOR = 3.0


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
            f"H={H} heads at d={d}: only {K} query tokens per row fit in 4Hd^2 - 2H + 1 = {budget} "
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

    This book's own design (:mod:`companion._star`): ``d`` length-1 queries for ``x^T v``; per centre
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
            f"H={H} heads at d={d}: only {K} query tokens per row fit in 4Hd^2 - 2H + 1 = {budget} "
            f"queries with the moment start (need d + 1 = {d + 1}); use start='pairs' or learn_canonical."
        )
    n_queries = d + S * (n_centres * (n_base + n_mom + K) + (d - 1 + spare_rows) * K)
    return {**out, "K": int(K), "n_centres": n_centres, "n_queries": int(n_queries)}


def _match_terms(gam, sh, fit, gamma0):
    """Which terms of each pair's own fit are the row's heads: ``(use, L)`` of shape (K, H).

    Head ``h`` is taken at pair ``k`` (``use[k, h]``, shift ``L[k, h]``) where the nearest of the
    pair's amplitudes ``gam[k]`` is within _MATCH_TOL of ``gamma0[h]`` (relative to the largest
    ``|gamma0|``) and within a third of the gap from ``gamma0[h]`` to the nearest other head's
    amplitude, and ``h`` is that term's nearest head, among the pairs with ``fit`` (a misfit small
    enough to trust the terms). Two heads of one row with nearly equal amplitudes (measured at
    d = 64, H = 7: 0.6391 and 0.6406) otherwise swap their shifts at some tokens. Batched over
    rows: ``gam``, ``sh`` of shape (N, K, H), ``fit`` (N, K) and ``gamma0`` (N, H) give (N, K, H).
    """
    one = gamma0.ndim == 1
    if one:
        gam, sh, fit, gamma0 = gam[None], sh[None], fit[None], gamma0[None]
    H = gamma0.shape[1]
    dist = np.abs(gam[:, :, None, :] - gamma0[:, None, :, None])  # (N, K, head, term)
    dist = np.where(np.isfinite(dist) & fit[:, :, None, None], dist, np.inf)
    j = np.argmin(dist, axis=3)
    dmin = dist.min(axis=3)
    gap = np.abs(gamma0[:, :, None] - gamma0[:, None, :]) + np.diag(np.full(H, np.inf))
    mutual = np.argmin(np.take_along_axis(dist, j[:, :, None, :], axis=3), axis=2) == np.arange(H)
    top = np.max(np.abs(gamma0), axis=1)[:, None, None]
    use = (dmin <= _MATCH_TOL * top) & (dmin <= gap.min(axis=2)[:, None, :] / 3) & mutual
    L = np.where(use, np.take_along_axis(np.nan_to_num(sh, nan=0.0), j, axis=2), 0.0)
    return (use[0], L[0]) if one else (use, L)


def _repair_start(s, G, X, gamma, R, window):
    """A row's start with each head refitted alone against the others (``None`` if none improves).

    For head ``h``, every pair's answers minus the other heads' terms (at the start) are one logistic
    term ``gamma_h sigma(s + l)`` of known amplitude: its shift is found per pair by a grid over
    ``|l| <= window + 6`` then Levenberg-Marquardt, kept where that one term fits to _REPAIR_FACTOR
    times the median misfit, and ``R_h`` is their least-squares fit (_start_rows). The new ``R_h``
    replaces the old where it lowers the row's largest misfit. Measured (d = 32, H = 7, seed 0): the
    three rows that refused each had one head off by 0.4-1.1 relative while the others were within
    1e-2; a head resolved at few tokens (amplitude small, or shifts outside the window) is the case.
    """
    from scipy.special import expit

    from ._rational import polish_pairs

    H = gamma.size

    def misfit(Rm):
        return float(np.max(np.abs(expit(s[None, :, None] + (X @ Rm.T)[:, None, :]) @ gamma - G)))

    best, R, changed = misfit(R), R.copy(), False
    grid = np.linspace(-window - 6, window + 6, 97)
    for h in np.argsort(-np.abs(gamma)):
        others = np.arange(H) != h
        Gr = G - expit(s[None, :, None] + (X @ R[others].T)[:, None, :]) @ gamma[others]  # (K, S)
        cost = np.sum((gamma[h] * expit(s[None, None, :] + grid[None, :, None]) - Gr[:, None, :]) ** 2, axis=2)
        l0 = grid[np.argmin(cost, axis=1)][:, None]
        _, l, res = polish_pairs(s, Gr, np.full((Gr.shape[0], 1), gamma[h]), l0, fixed_gamma=True)
        ok = res <= _REPAIR_FACTOR * np.median(res)
        if ok.sum() <= X.shape[1]:
            continue
        cand = R.copy()
        cand[h] = _start_rows(X, l, window, ok[:, None])[0]
        c = misfit(cand)
        if c < best:
            best, R, changed = c, cand, True
    return R if changed else None


class _TriuIndices(dict):
    """``d -> (rows, cols, tri)``: the upper-triangle indices of a ``d x d`` matrix and, for each of
    its entries, the position in the upper triangle (symmetric), computed once per ``d``."""

    def __missing__(self, d):
        up = np.triu_indices(d)
        tri = np.zeros((d, d), np.intp)
        tri[up] = np.arange(up[0].size)
        self[d] = (up[0], up[1], np.maximum(tri, tri.T))
        return self[d]


_TRIU = _TriuIndices()


def _start_rows(X, L, window, resolved=None):
    """Rows ``R_h`` with ``X R_h ~ L[:, h]`` by least squares per head, over the shifts inside the
    window of ``log r`` (one far outside it is poorly determined), trimmed of outliers (a head whose
    amplitude is small along this row has some badly resolved shifts) while ``d + 1`` remain.
    ``resolved`` (shape (K, H), default all): the tokens at which each head's shift is known.
    Batched over rows sharing the tokens ``X``: ``L``, ``resolved`` of shape (N, K, H) give
    (N, H, d); each row stops trimming on its own, with the same result as alone."""
    one = L.ndim == 2
    L = L[None] if one else L
    K, d = X.shape
    resolved = np.ones(L.shape, bool) if resolved is None else (resolved[None] if one else resolved)
    use = resolved & (np.abs(L) <= window + 4)  # (N, K, H)
    few = use.sum(axis=1) <= d
    use = np.where(few[:, None, :], resolved, use)
    N, _, H = L.shape
    R = np.empty((N, H, d))
    XXu = X[:, _TRIU[d][0]] * X[:, _TRIU[d][1]]  # x_k x_k^T of every token, upper triangle only
    tri = _TRIU[d][2]  # where each entry of a d x d matrix is in it
    diag = np.arange(d)
    act = np.ones((N, H), bool)  # the heads still trimming (each on its own: the rest keep their R_h)
    for _ in range(4):
        # Every head still trimming at once: the normal equations of its least squares, with a ridge
        # of 1e-12 relative (the minimum-norm solution where fewer than d tokens are used); one matrix
        # product with the tokens' x_k x_k^T (half the time of a product per head).
        rows, heads = np.nonzero(act)
        ua = use[rows, :, heads]  # (n, K)
        La = L[rows, :, heads]
        Wt = ua.astype(float)
        A = (Wt @ XXu)[:, tri]  # (n, d, d)
        A[:, diag, diag] += 1e-12 * np.einsum("nii->n", A)[:, None] / d + 1e-300
        Ra = np.linalg.solve(A, ((Wt * La) @ X)[..., None])[..., 0]
        R[rows, heads] = Ra
        miss = np.abs(Ra @ X.T - La)  # (n, K)
        # The median over the used tokens of each head (np.nanmedian's masked path costs a quarter of
        # the learner at d = 64): sort with the unused last and average the two middle ones.
        srt = np.sort(np.where(ua, miss, np.inf), axis=1)
        n_use = ua.sum(axis=1)
        cnt = np.maximum(n_use, 1)[:, None]
        med = 0.5 * (np.take_along_axis(srt, (cnt - 1) // 2, axis=1) + np.take_along_axis(srt, cnt // 2, axis=1))
        keep = ua & (miss <= 10 * med + 1e-12)
        n_keep = keep.sum(axis=1)
        go = ~((n_keep <= d) | (n_keep == n_use))
        if not go.any():
            break
        act[:] = False
        act[rows[go], heads[go]] = True
        use[rows[go], :, heads[go]] = keep[go]
    return R[0] if one else R


def _count_terms(misfit):
    """The number of terms of row 0's pairs, from ``misfit`` of shape (H_0, K): the relative misfit
    of each pair's own fit with ``h = 1 .. H_0`` terms (``inf`` where it failed). ``None`` if none fits.

    A pair is resolved by ``h`` terms where it misfits by at most _START_TOL. The count is the
    smallest ``h`` that resolves a quarter of the pairs and at least half as many as the best ``h``:
    with fewer terms than heads, the pairs along which a head's term is nearly flat in the window of
    ``log r`` are resolved too, and with more, the surplus poles are complex at most pairs. Measured
    on row 0 of the heads of ``random_multi_head_transformer(6, 2, 4, seed=1)``: 2, 7 and 1 of its
    7 pairs with 1, 2 and 3 terms; of ``random_multi_head(8, 3, seed=1)``: 0.0, 0.3, 1.0 and 0.0 of
    its pairs with 1 to 4 terms.
    """
    frac = np.mean(misfit <= _START_TOL, axis=1)
    ok = (frac >= 0.25) & (frac >= 0.5 * frac.max())
    return int(np.argmax(ok)) + 1 if ok.any() else None


def _rough(res, scale):
    """Whether a pair's own fit misfits by more than 1e-10 relative to ``scale``: then its shifts
    gain from a refit (all terms free, or with the row's amplitudes fixed)."""
    return res > 1e-10 * scale


def _agreeing(gs, fit=None):
    """The largest group of pairs whose amplitudes (rows of ``gs``, shape (P, H), each sorted) agree
    with one of them to 1e-2 relative (to that pair's largest): shape (P,) bool. Batched over rows:
    ``gs`` of shape (N, P, H) with ``fit`` (N, P), the pairs that take part (default all), gives
    (N, P), ``False`` off ``fit``."""
    one = gs.ndim == 2
    gs = gs[None] if one else gs
    fit = np.ones(gs.shape[:2], bool) if fit is None else (fit[None] if one else fit)
    # close[n, p, q]: every amplitude of pair q within 1e-2 of pair p's largest from pair p's (NaN
    # never is), one head and one side at a time: two comparisons with the interval's ends into one
    # boolean buffer (no float temporary of shape (N, P, P): 0.7 of the time of |difference| <= top)
    gt = np.ascontiguousarray(gs.transpose(0, 2, 1))  # (N, H, P)
    top = 1e-2 * np.max(np.abs(gs), axis=2)[:, None, :]  # (N, 1, P)
    lo, hi = gt - top, gt + top
    close = fit[:, :, None] & fit[:, None, :]
    cmp = np.empty(close.shape, bool)
    for h in range(gs.shape[2]):
        close &= np.greater_equal(gt[:, h, None, :], lo[:, h, :, None], out=cmp)
        close &= np.less_equal(gt[:, h, None, :], hi[:, h, :, None], out=cmp)
    best = np.argmax(np.einsum("npq->np", close.view(np.uint8), dtype=np.int32), axis=1)  # counts
    agree = close[np.arange(gs.shape[0]), best]
    return agree[0] if one else agree


def _apart(gamma0):
    """Heads whose amplitude is farther than 2e-2 (relative to the largest; twice the pairs'
    agreement, _agreeing) from every other head's: shape (H,) bool, or (N, H) for ``gamma0`` of
    shape (N, H). Sorted by amplitude, their order cannot swap between pairs."""
    H = gamma0.shape[-1]
    gap = np.abs(gamma0[..., :, None] - gamma0[..., None, :]) + np.diag(np.full(H, np.inf))
    return gap.min(axis=-1) > 2e-2 * np.max(np.abs(gamma0), axis=-1, keepdims=True)


#: Most queries per oracle call of :func:`_ask_pairs` (a block of at most 1024 x 9 x 64 float64, 4.7 MB,
#: at d = 64, H = 4). Measured (2026-12-01, the counts route's own queries replayed on the exact
#: oracle, one BLAS thread): the oracle's time per query is least in blocks of about 1024, and in one
#: batch per length it is 1.2 (d = 32, H = 2) to 1.8 (d = 64, H = 2) times that; blocks of 128 cost
#: 1.2-1.5 times. The learner's own calls of up to d K queries (7,744 at d = 64) ran at 1.3 times it.
_ASK_BLOCK = 1024


def _heads_from_rows(P, Rw, Gam):
    """The canonical form of the heads whose rows along the directions ``P[i]`` (shape (d, d),
    invertible) are ``Rw[i, h] = W_h^T delta_i`` (shape (d, H, d)) and ``Gam[i, h] = delta_i^T v_h``
    (shape (d, H)): ``W_h = P^{-1} Rw[:, h]``, ``v_h = P^{-1} Gam[:, h]``, heads with equal ``W``
    merged (:func:`canonical_form`, ``atol=1e-6``)."""
    Pinv = np.linalg.inv(P)
    return canonical_form(MultiHead(np.einsum("di,ihe->hde", Pinv, Rw), (Pinv @ Gam).T), atol=1e-6)


def _route_tokens(rng, k, d, scale, spread):
    """``k`` Gaussian directions in R^d with norms log-uniform in ``[scale / spread, scale * spread]``:
    shape (k, d), the query tokens of :func:`learn_canonical_rational`'s routes."""
    T = rng.standard_normal((k, d))
    norms = scale * np.exp(rng.uniform(-np.log(spread), np.log(spread), k))
    return T * (norms / np.linalg.norm(T, axis=1))[:, None]


def _ask_pairs(oracle, U, X, n, m):
    """``VQ`` of ``n[t]`` copies of ``U[k]`` then ``m[t]`` copies of ``X[k]``: shape (K, S).

    The queries in the order ``t``, then ``k``, in calls of at most _ASK_BLOCK queries."""
    K, d = X.shape
    out = np.empty((K, n.size))
    for t, (a, b) in enumerate(zip(n, m)):
        for lo in range(0, K, _ASK_BLOCK):
            hi = min(K, lo + _ASK_BLOCK)
            Q = np.empty((hi - lo, a + b, d))
            Q[:, :a] = U[lo:hi, None]
            Q[:, a:] = X[lo:hi, None]
            out[lo:hi, t] = oracle(Q)
    return out


#: From this many heads ``start="auto"`` takes the moment start (:mod:`companion._star`): the per-pair
#: start's largest ``H`` is 7 at d = 16 and 32 and 8 at d = 64 (seed 0), where the moment start learns
#: H = 9 to 12 at d = 64 (``benchmarks/bench_multihead.py``).
MOMENT_FROM = 9


def _rational_result(oracle, start, model, lengths, d, H_plan, plan, *, extra, label="", verify, verify_rtol, seed):
    """The result of either start of :func:`learn_canonical_rational`: its diagnostics (the head
    count, the longest query of ``lengths``, the follow-up's count for ``H_plan``, the ``plan``, then
    the start's own ``extra``), its message (``label`` appended to the count), its verification."""
    n_learn = oracle.n_queries - start
    diagnostics = {
        "n_heads": model.n_heads,
        "max_len": int(np.max(lengths)),
        "kim_count": follow_up_count(d, H_plan),
        "plan": plan,
        **extra,
    }
    message = (
        f"found {model.n_heads} heads from {n_learn} queries of length <= "
        f"{diagnostics['max_len']} (4Hd^2 - 2H + 1 = {diagnostics['kim_count']}{label})"
    )
    what = "a sum of attention heads (learn_canonical_rational)"
    checked = _verify_heads(oracle, model, verify, rtol=verify_rtol, seed=seed + 1, what=what)
    return _heads_result(
        oracle, start, model.Ws, model.vs, verification=checked, message=message, diagnostics=diagnostics
    )


def _learn_canonical_moments(oracle, d, H_plan, known, *, scale, spread, tol, verify, verify_rtol, seed):
    """:func:`learn_canonical_rational` with ``start="moments"`` (this book's own; see :mod:`companion._star`)."""
    from ._rational import fit_row_joint, fit_rows_joint, ratio_design
    from ._star import (
        ETA,
        MOMENT_SCALE,
        N_BASE,
        STAR_EPS,
        TAYLOR_DEGREE,
        WEAK_CENTRE,
        head_subspace,
        jennrich,
        power_sums,
        symmetric_fit,
        track_rows,
    )

    plan = moment_plan(d, H_plan)
    start = reserve(oracle, plan["n_queries"] + verify, "learn_canonical_rational")
    n, m = ratio_design(H_plan)
    s = np.log(n / m)
    K = plan["K"]
    rng = np.random.default_rng(seed)

    def tokens(k):
        return _route_tokens(rng, k, d, scale, spread)

    def unit(q):
        return q / np.linalg.norm(q)

    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)  # d length-1 queries: x^T v
    X = tokens(K)
    XX = np.einsum("ka,kb->kab", X, X).reshape(K, d * d)

    def ask(delta, T):
        return _ask_pairs(oracle, T + delta, T, n, m) - (T @ v)[:, None]

    def centre(delta):
        """Steps 1 and 2 of companion._star at one centre, then its own row: (gamma, R, G0, info)."""
        eta = ETA * scale
        E = eta * np.eye(d)
        D = []
        for _ in range(N_BASE):
            x0 = unit(rng.standard_normal(d)) * scale
            G = ask(delta, np.vstack([x0 + E, x0 - E]))
            D.append(((G[:d] - G[d:]) / (2 * eta)).T)
        D = np.vstack(D)
        sv = head_subspace(D, d)[1]
        if float(np.max(np.abs(D))) <= 1e-13 * max(1.0, float(np.max(np.abs(v)))):
            raise NotIdentifiableError(
                "every answer's gradient in x vanishes along the centre's direction: no head's softmax "
                "is visible (the values cancel); the canonical form has no heads here."
            )
        H = H_plan if known else int(np.sum(sv > _RANK_TOL))
        if H > H_plan:
            raise OracleInconsistentError(
                f"the heads' span along the centre has dimension {H} (singular values above "
                f"{_RANK_TOL:g} of the largest), more than H_bound={H_plan}: pass a larger H_bound."
            )
        U = head_subspace(D, H)[0]
        Z = rng.standard_normal((plan["n_moment_tokens"], H)) * (MOMENT_SCALE * scale / np.sqrt(H))
        P, taylor = power_sums(s, ask(delta, Z @ U.T), float(delta @ v), min(TAYLOR_DEGREE, s.size - 3))
        C, gam, gap = jennrich(symmetric_fit(Z, P[:, 1], 2), symmetric_fit(Z, P[:, 2], 3), rng)
        G0 = ask(delta, X)
        info = {
            "subspace_sv": sv[: H + 1].tolist(),
            "taylor_misfit": float(np.max(taylor)),
            "jennrich_gap": gap,
            "amplitude_ratio": 0.0,
            "H": H,
            "centre_residual": np.inf,
        }
        if gap <= 0.0:
            return None, None, G0, info
        gb, Rb, rb, sb = fit_rows_joint(s, G0[None], X, gam[None], (C @ U.T)[None], XX=XX)
        g0, R0, r0 = gb[0], Rb[0], float(rb[0] / sb[0])
        if r0 > tol:
            g0, R0, fit = fit_row_joint(s, G0, X, g0, R0, XX=XX, iters=30)
            r0 = fit["residual"] / fit["scale"]
        info["centre_residual"] = r0
        if r0 > tol:
            return None, None, G0, info
        info["amplitude_ratio"] = float(np.min(np.abs(g0)) / np.max(np.abs(g0)))
        return g0, R0, G0, info

    found = []
    for c in range(plan["n_centres"]):
        delta0 = unit(rng.standard_normal(d))
        g0, R0, G0, info = centre(delta0)
        found.append((info["amplitude_ratio"], c, delta0, g0, R0, G0, info))
        if g0 is not None and info["amplitude_ratio"] >= WEAK_CENTRE:
            break
    ratio, _, delta0, g0, R0, G0, info = max(found, key=lambda f: (f[3] is not None, f[0]))
    if g0 is None:
        raise OracleInconsistentError(
            f"the moment start failed at all {len(found)} centres (Jennrich eigenvalue gap "
            f"{info['jennrich_gap']:.2g}, Taylor misfit {info['taylor_misfit']:.2g} relative, centre's joint "
            f"fit {info['centre_residual']:.2g} relative, tol={tol:g}): a Taylor misfit above 1e-10 means "
            "the moment tokens' shifts are too large for the series (lower scale), or the oracle is not a "
            "sum of softmax heads (a residual or bias term adds what no head's series has); otherwise use "
            "learn_canonical."
        )
    # The star: rows delta_0 + eps q_i, q_i an orthonormal basis of delta_0's complement.
    Q = np.linalg.qr(np.column_stack([delta0, rng.standard_normal((d, d - 1))]))[0][:, 1:].T
    Q *= np.sign(Q @ rng.standard_normal(d))[:, None]
    P = np.vstack([delta0, delta0[None] + STAR_EPS * Q])
    G = np.stack([ask(P[i], X) for i in range(1, d)]) if d > 1 else np.empty((0, K, s.size))
    spare, redrawn = plan["spare_rows"], 0
    gam, R, rel, tracked = track_rows(s, G, X, g0, R0, G0, tol=tol, XX=XX, max_serial=spare)
    for i in np.flatnonzero(rel > tol):
        while rel[i] > tol and spare:
            # A new offset for this row: along the old one a head may be nearly invisible.
            spare -= 1
            redrawn += 1
            q = rng.standard_normal(d)
            P[i + 1] = delta0 + STAR_EPS * unit(q - (q @ delta0) * delta0)
            G[i] = ask(P[i + 1], X)
            gi, Ri, ri, _ = track_rows(s, G[i : i + 1], X, g0, R0, G0, tol=tol, XX=XX)
            gam[i], R[i], rel[i] = gi[0], Ri[0], ri[0]
    if np.any(rel > tol):
        bad = np.flatnonzero(rel > tol)
        raise OracleInconsistentError(
            f"{bad.size} of the star's {d - 1} rows (first: {int(bad[0]) + 1}) misfit by up to "
            f"{float(np.max(rel)):.2g} relative after continuation from the centre (tol={tol:g}); the "
            f"centre's smallest amplitude is {ratio:.2g} of its largest (a head nearly invisible there is "
            f"nearly invisible in every row of the star): use learn_canonical, or another seed."
        )
    worst = float(max(info["centre_residual"], float(np.max(rel, initial=0.0))))
    model = _heads_from_rows(P, np.vstack([R0[None], R]), np.vstack([g0[None], gam]))
    extra = {
        "start": "moments",
        "n_centres_tried": len(found),
        "centre_amplitude_ratio": ratio,
        "subspace_sv": info["subspace_sv"],
        "taylor_misfit": info["taylor_misfit"],
        "jennrich_gap": info["jennrich_gap"],
        "n_tracked_rows": tracked,
        "n_redrawn_rows": redrawn,
        "max_row_residual": worst,
    }
    return _rational_result(
        oracle,
        start,
        model,
        n + m,
        d,
        H_plan,
        plan,
        extra=extra,
        label="; moment start",
        verify=verify,
        verify_rtol=verify_rtol,
        seed=seed,
    )


#: Singular values of the stacked gradients (relative to the largest) above which a direction is a
#: head's, when only ``H_bound`` is known (measured d = 64, H = 12: the H-th at 9e-5 to 8e-4, the
#: (H + 1)-st at 2e-10 to 2e-9).
_RANK_TOL = 1e-7


@_names_rounding
def learn_canonical_rational(
    oracle,
    H=None,
    *,
    H_bound=None,
    start="auto",
    scale=3.0,
    spread=1.5,
    tol=1e-9,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
):
    """Canonical form of a general multi-head target from ``<= 4 H d^2 - 2 H + 1`` value queries.

    The route at the follow-up's count [2]_: every query is ``n`` copies of a token ``u`` followed
    by ``m`` copies of the query token ``x`` with ``n + m <= 2 H + 1``. Use :func:`learn_canonical`
    (the robust route: longer queries, several times the queries) when this one refuses, which it
    does where float64 cannot separate ``H`` heads from ``2 H`` samples per pair (measured: see
    ``benchmarks/bench_multihead.py``).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d`` for ``f = sum_h f_{W_h, v_h}`` (any heads).
    H : int, default=None
        Number of heads of the canonical form, if known.
    H_bound : int, default=None
        A known upper bound ``H_0`` on it, used when ``H`` is not given: the learner then asks
        ``<= 4 H_0 d^2 - 2 H_0 + 1`` queries of length ``<= 2 H_0 + 1`` and finds the number of
        heads on row 0: the smallest ``h`` whose interpolation through ``2 h`` of the ``2 H_0``
        samples fits all of them for a quarter of the pairs and for at least half as many pairs
        as the ``h`` that fits the most (with fewer terms than heads, the pairs along which a
        head's term is flat still fit; with more, the surplus poles are complex at most pairs).
        Exactly one of ``H`` and ``H_bound`` must be given.
    start : {"auto", "pairs", "moments"}, default="auto"
        How each row's joint fit is started. ``"pairs"``: from the pairs' own interpolations
        (below), the design of rows ``delta_i`` in an orthonormal basis. ``"moments"``: this book's
        moment start (:mod:`companion._star`, :func:`moment_plan`): one centre row solved from the
        heads' span and Jennrich's algorithm on Taylor moments, the other rows a star around it
        started from the centre's solution; needs ``H <= d`` and ``2 H >= 4`` samples per token.
        With only ``H_bound``, ``H`` is then the number of singular values of the gradients above
        ``_RANK_TOL`` = 1e-7 of the largest. ``"auto"``: ``"moments"`` from ``H`` (or ``H_bound``)
        ``>= MOMENT_FROM`` = 9 where :func:`moment_plan` accepts ``d``, else ``"pairs"``.
    scale : float, default=3.0
        Median norm of the query tokens ``x`` (``0 < scale <= 100``); the shifts
        ``(u - x)^T W_h x`` grow with it. Tune it to ``||W_h||``: about 3 for entries of order 1.
    spread : float, default=1.5
        Token norms are log-uniform in ``[scale / spread, scale * spread]`` (``>= 1``). Measured
        (``benchmarks/bench_multihead.py``, seed 0): ``spread = 1.5`` recovers ``H = 6`` at
        ``d = 8, 16, 32, 64``; at ``H = 7`` it fails (a row's joint fit does not converge from its
        start). With the per-head start (below) ``spread = 3.0`` also recovers ``H = 6`` at
        ``d = 16`` (seeds 0, 1), where the whole-pair start refused.
    tol : float, default=1e-9
        Largest relative misfit of a row's joint fit (``0 < tol <= 1e-2``).
    verify : int, default=32
        Fresh random queries of lengths 1 to 8 on which the result is checked, counted apart
        (``n_learning_queries`` is the follow-up's count); ``0`` opts out.
    verify_rtol : float, default=1e-6
        Largest relative disagreement accepted by the check.
    seed : int, default=0
        Seed of the directions ``u - x`` and the query tokens.

    Returns
    -------
    MultiHeadRecovery
        ``Ws``, ``vs`` of the canonical form. ``n_learning_queries <= 4 H d^2 - 2 H + 1``
        (``rational_plan(d, H)["n_queries"]``). ``diagnostics``: ``n_heads``, ``max_len``
        (``<= 2 H + 1``), ``kim_count``, ``plan``, ``resolved_fraction`` (pairs of the worst row
        whose own interpolation resolved every head), ``max_row_residual``, ``max_link_error``, ``n_redrawn_rows``,
        ``n_shared_start_rows`` (rows learned from the shared-amplitude start, where the per-head
        start failed), ``n_verify_queries`` and, with ``verify``, ``verify_max_error`` and
        ``verify_tolerance``.
        With the moment start, instead of the pair and link fields: ``start`` (``"moments"``),
        ``n_centres_tried``, ``centre_amplitude_ratio`` (the chosen centre's smallest
        ``|gamma_h| / max |gamma|``: the result's error grows as it falls), ``subspace_sv``,
        ``taylor_misfit``, ``jennrich_gap``, ``n_tracked_rows`` (rows that needed the
        continuation), ``n_redrawn_rows`` and ``max_row_residual``.

    Raises
    ------
    PrecisionError
        If the fits refuse and the answers' precision (stated, or measured with 24 more queries)
        is far coarser than float64's (float32 or coarser): the rounding, not ``H`` or the model, is the cause.
    TypeError
        If the oracle is approximate.
    InvalidInputError
        If neither or both of ``H``, ``H_bound`` are given, a parameter is out of range, or ``d``
        is too small for ``H`` (:func:`rational_plan`).
    BudgetExceededError
        If the budget is below the plan's count plus ``verify``; raised before the first query.
    NotIdentifiableError
        If the answers show no head at all (``f`` is ``x^T v`` on every query: the values cancel).
    OracleInconsistentError
        If too few pairs of a row are resolved by their own interpolation to start the joint fit
        (float64 conditioning; the message gives the numbers, and names too small an ``H`` or
        ``H_bound`` instead when the pairs' fits are well conditioned, rounding sensitivity at
        most ``_WELL_CONDITIONED`` = 1e-4, yet disagree), a row's joint fit does not reach
        ``tol``, two rows cannot be linked, or the verification fails.

    Notes
    -----
    This book's derivation from the follow-up's abstract [2]_ (its algorithm is not public).
    For a query of ``n`` copies of ``u = x + delta`` followed by ``m`` copies of ``x`` (the query
    token last), head ``h`` puts weight ``n e^{a_h}`` on the copies of ``u`` and ``m e^{b_h}`` on
    those of ``x`` (``a_h = u^T W_h x``, ``b_h = x^T W_h x``), so with ``r = n / m``::

        VQ = sum_h (r e^{a_h} u^T v_h + e^{b_h} x^T v_h) / (r e^{a_h} + e^{b_h})
           = x^T v + sum_h gamma_h r / (r + p_h),   gamma_h = delta^T v_h,
             p_h = exp(-delta^T W_h x),   v = sum_h v_h,

    a rational function of ``r`` of type ``(H, H)`` with ``2 H + 1`` parameters, fixed by ``2 H + 1``
    samples (``r = 0``, the query ``x`` alone, and ``2 H`` ratios with ``n + m <= 2 H + 1``). Its
    poles ``-p_h`` give ``delta^T W_h x`` and its residues ``-gamma_h p_h`` the value terms.
    Here ``x^T v`` comes from ``d`` length-1 queries ``e_j`` (then ``G(0) = 0`` is known for every
    pair), and every pair costs ``2 H`` queries.

    Rows ``delta_i`` (an orthonormal basis) share the tokens ``x_k``; within a row the amplitudes
    ``gamma_h = delta_i^T v_h`` are the same for every token and label the heads, and the shifts
    ``delta_i^T W_h x_k`` are linear in ``x_k``. Each pair is interpolated on its own
    (:func:`companion._rational.interpolate_pairs`, then Levenberg-Marquardt where the interpolant
    misfits its own samples), batched over all pairs; the amplitudes shared by the pairs whose
    ``H`` terms agree, and for each head the shifts of every pair with a term of that head's
    amplitude (to ``_MATCH_TOL``), start the joint fit of the row over all its tokens (Gauss-Newton batched
    over the rows, :func:`companion._rational.fit_rows_joint`; a row that misfits after it gets
    :func:`companion._rational.fit_row_joint`, then a new direction), which is far better
    conditioned than any single pair: a collision of two poles at one token is resolved by the
    others. Rows are linked to row 0 through ``n_link`` pairs at ``delta_0 + delta_i``, whose
    answers are linear in the ``H^2`` candidate terms (head ``h`` of row 0 with head ``g`` of row ``i``). Then
    ``v_h = sum_i gamma_h(i) delta_i`` and ``W_h = sum_i delta_i (delta_i^T W_h)``. Heads with equal
    ``W`` give one term, so the result is the canonical form.

    A pair that misses some heads (a shift outside the window, two colliding) still gives the
    others: head ``h``'s start row is a least-squares fit over every pair with a term of ``h``'s
    amplitude (to ``_MATCH_TOL``, mutually nearest, within a third of the gap to the next head's
    amplitude). A row whose joint fit misfits from that start gets each head refitted alone against
    the others' start terms (``_repair_start``) and one more joint fit.

    Float64 limits the start, not the joint fit: a single pair's interpolation of ``H`` logistic
    terms from ``2 H`` samples in ``|log r| <= log 2H`` loses about a digit per head, so fewer
    tokens per head are resolved by their own pair as ``H`` grows, and a head's start row needs
    more than ``d`` of the ``K ~ 1.8 d`` tokens. Measured at ``d = 64``
    (``benchmarks/bench_multihead.py``): the fewest resolved per head, over 4 rows, is ``1.5 d``
    at ``H = 6``, ``1.1 d`` at ``H = 8``, ``0.55 d`` at ``H = 10`` and ``0.11 d`` at ``H = 12``,
    while the rounding sensitivity of the row's joint fit stays ``<= 1e-7`` (``3.3e-10`` at
    ``H = 8``, :func:`counts_conditioning`). The largest ``H`` from the per-head start alone is 7 at ``d = 16, 32, 64``
    and 6 at ``d = 8`` (seed 0, the Haswell kernel; 5 under SkylakeX, where row 2 of ``H = 6``
    misfits by 2.3e-8), 8 at ``d = 64`` with the shared-amplitude start below.

    Where a row's per-head start fails (after its repair), this book's shared-amplitude start
    (:mod:`companion._rowstart`) uses all of the row's pairs together: their amplitudes
    ``gamma_h`` are shared (the poles are not), and with them fixed a pair's shifts have a rounding
    sensitivity of 5e-11 at ``H = 8`` against 0.09 free (:func:`counts_conditioning`). Every pair is
    refitted so, the pairs not accepted are refitted again from the shifts that the accepted ones
    predict through ``X R^T``, and ``R_h`` is a least trimmed squares fit; the row's batched joint fit
    follows (``n_shared_start_rows`` counts the rows it learned). It does not reach ``H = 12``: the
    joint fit's basin there is about 3 %, and the starts tried are listed with their measured errors
    in :func:`counts_start_coverage`.

    The moment start (``start="moments"``, the default from ``H = 9``; this book's own,
    :mod:`companion._star`) needs no pair to resolve its heads: one centre row is solved from the
    heads' span (central differences) and Jennrich's algorithm on the Taylor moments of small
    tokens, and a star of rows around it is started from the centre's solution (with a continuation
    in the data where a row misfits). Measured 2026-12-02 (verification off, one BLAS thread, the
    SkylakeX kernel): at ``d = 64``, ``H = 12`` it learns seeds 0 to 5 with 169,840 to 191,440
    queries of the count 196,585 (length at most 25), the ``W_h`` to 1.3e-9 to 2.7e-9 relative and
    the ``v_h`` to 6e-12 to 3e-11, in 6.4 to 8.8 s (two runs side by side on the two cores; 13.4 s
    on seed 5, whose second centre leaves 18 rows to the continuation); the benchmark's time
    against the oracle's, and its seeds, are in
    ``data/results/bench_multihead.json``. The star's rows differ by ``STAR_EPS`` = 0.01, so their
    errors are divided by it, and the rows of a head weak at the centre are the least determined
    (``centre_amplitude_ratio`` 0.016 to 0.049): the rows' joint fits must end at rounding level.
    Stopping them as soon as their mean misfit was within 100 eps (before 2026-12-02) left the
    ``W_h`` at 7.0e-9, 4.8e-8, 5.6e-7 and 1.1e-7 on seeds 0 to 3. The verification checks the
    function to ``verify_rtol``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, "Provably Learning Multi-Head Attention with Queries", arXiv 2608.03294,
       2026 (abstract).

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(6, 2, seed=0)
    >>> rec = learn_canonical_rational(ValueQueryOracle(target), H=2)
    >>> rec.n_heads, rec.n_learning_queries <= follow_up_count(6, 2), rec.diagnostics["max_len"]
    (2, True, 5)
    >>> equivalent(rec.model, target, atol=1e-8)
    True
    """
    from scipy.special import expit

    from ._rational import (
        fit_row_joint,
        fit_rows_joint,
        interpolate_pairs,
        pair_sensitivity,
        polish_pairs,
        ratio_design,
    )
    from ._rowstart import shared_amplitude_start

    d = check_exact_oracle(oracle, "learn_canonical_rational")
    if (H is None) == (H_bound is None):
        raise InvalidInputError(
            f"give exactly one of H (the number of heads) and H_bound (a bound on it); got "
            f"H={H!r}, H_bound={H_bound!r}."
        )
    known = H is not None
    H_plan = check_int(H if known else H_bound, "H" if known else "H_bound", minimum=1)
    scale = check_real(scale, "scale", minimum=0.0, strict=True, maximum=100.0)
    spread = check_real(spread, "spread", minimum=1.0)
    tol = check_real(tol, "tol", minimum=0.0, strict=True, maximum=1e-2)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if start not in ("auto", "pairs", "moments"):
        raise InvalidInputError(f"start must be 'auto', 'pairs' or 'moments'; got start={start!r}.")
    if start == "auto":
        start = "pairs"
        if H_plan >= MOMENT_FROM:
            try:
                moment_plan(d, H_plan)
                start = "moments"
            except InvalidInputError:
                pass
    if start == "moments":
        if 2 * H_plan < 4:
            raise InvalidInputError(
                f"start='moments' needs 2H >= 4 samples per token for its Taylor fit; got H={H_plan}. "
                "Use start='pairs'."
            )
        return _learn_canonical_moments(
            oracle,
            d,
            H_plan,
            known,
            scale=scale,
            spread=spread,
            tol=tol,
            verify=verify,
            verify_rtol=verify_rtol,
            seed=seed,
        )
    plan = rational_plan(d, H_plan)
    start = reserve(oracle, plan["n_queries"] + verify, "learn_canonical_rational")

    n, m = ratio_design(H_plan)
    r = n / m
    s = np.log(r)
    K, n_link = plan["K"], plan["n_link"]
    rng = np.random.default_rng(seed)
    P, Rq = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(Rq))).T  # rows delta_i, orthonormal

    def tokens(k):
        return _route_tokens(rng, k, d, scale, spread)

    X = tokens(K)
    X_link = tokens(n_link)
    XX = np.einsum("ka,kb->kab", X, X).reshape(K, d * d)
    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)  # d length-1 queries
    bX = X @ v

    amps, rows, fractions, residuals = [], [], [], []
    head_tokens = {}  # row: the fewest tokens at which a pair's own fit resolved one of its heads
    H_row = H_plan if known else None
    spare = plan["spare_rows"]
    n_redrawn = 0
    shared_rows = []  # rows learned from the shared-amplitude start (companion._rowstart)
    start_terms = {}  # row: the per-head start's (use, L)

    def pair_fits(G, h):
        """Each pair on its own (batched): interpolation through 2h samples, then LM on all."""
        if 2 * h == s.size:  # every sample interpolated: the interpolant's misfit is the pair's
            gam, sh, res = interpolate_pairs(r, G, h, misfit=True)
            ok = np.isfinite(res)
        else:
            sub = np.unique(np.round(np.linspace(0, s.size - 1, 2 * h)).astype(int))
            gam, sh = interpolate_pairs(r[sub], G[:, sub], h)
            ok = np.all(np.isfinite(sh), axis=1)
            res = np.full(G.shape[0], np.inf)
            res[ok] = np.max(
                np.abs(np.einsum("psh,ph->ps", expit(s[None, :, None] + sh[ok][:, None, :]), gam[ok]) - G[ok]), axis=1
            )
        if ok.any():
            # Polish only the pairs whose interpolant misfits its own samples (most, at large H).
            rough = np.flatnonzero(ok)[_rough(res[ok], np.max(np.abs(G[ok]), axis=1))]
            if rough.size:
                gam[rough], sh[rough], res[rough] = polish_pairs(s, G[rough], gam[rough], sh[rough])
        return gam, sh, res

    def check_visible(i, G):
        gmax = float(np.max(np.abs(G)))
        if gmax <= 1e-13 * max(1.0, float(np.max(np.abs(bX)))):
            raise NotIdentifiableError(
                f"row {i}: every answer equals x^T v: no head's softmax is visible along "
                "delta_i, so the values cancel (e.g. v and -v on equal W); the canonical form has "
                "no heads here."
            )
        return gmax

    def choose_terms(G):
        """Only a bound H_0: the number of terms h found from the pairs of row 0 (_count_terms)."""
        gmax = float(np.max(np.abs(G)))
        h = _count_terms(np.array([pair_fits(G, h_try)[2] for h_try in range(1, H_plan + 1)]) / gmax)
        if h is None:
            raise OracleInconsistentError(
                f"no number of terms up to H_bound={H_plan} fits a quarter of the pairs of row 0 to "
                f"{_START_TOL:g} relative; the oracle may not be a sum of heads, or H_bound is too small."
            )
        return h

    def label_rows(G, fits):
        """Rows' amplitudes, each shared by its row's resolved pairs, batched over rows: ``G`` of
        shape (N, K, S) and its pairs' own fits ``(gam, sh, res)`` of shape (N, K, H), (N, K, H),
        (N, K). Returns ``gamma0`` (N, H), ``agree`` (N, K), the terms ``gam``, ``sh`` sorted by
        amplitude where the pair fits, ``fit`` (N, K), ``rough`` (N,), ``gmax`` (N,) and ``ok``
        (N,): the rows that can start (label_row says why one cannot)."""
        gam, sh, res = fits
        gmax = np.max(np.abs(G), axis=(1, 2))
        fit = res <= _START_TOL * gmax[:, None]  # a start only: the joint fit refines it to tol
        # Label the heads by their amplitudes, shared by every pair of the row: sort each pair's
        # terms by amplitude (the optimal matching in one dimension) and keep the largest group
        # of pairs that agree to 1 %.
        order = np.argsort(gam, axis=2)
        gam = np.where(fit[..., None], np.take_along_axis(gam, order, axis=2), gam)
        sh = np.where(fit[..., None], np.take_along_axis(sh, order, axis=2), sh)
        agree = _agreeing(gam, fit)
        n_agree = agree.sum(axis=1)
        # The median over each row's agreeing pairs (as np.median: the mean of the two middle ones).
        srt = np.sort(np.where(agree[..., None], gam, np.inf), axis=1)
        cnt = np.maximum(n_agree, 1)[:, None, None]
        gamma0 = 0.5 * (np.take_along_axis(srt, (cnt - 1) // 2, axis=1) + np.take_along_axis(srt, cnt // 2, axis=1))
        # ``rough``: some resolved pair misfits by more than 1e-10 relative, so its shifts gain
        # from a refit with the row's amplitudes fixed (far better conditioned than the free fit).
        rough = _rough(np.max(np.where(agree, res, -np.inf), axis=1), gmax)
        return gamma0[:, 0], agree, gam, sh, fit, rough, gmax, n_agree >= 2

    def label_row(i, G, fits=None):
        """One row's label_rows: (gamma0, agree, gam, sh, fit, rough), or the reason it cannot start."""
        check_visible(i, G)
        gam, sh, res = pair_fits(G, H_row) if fits is None else fits
        gamma0, agree, gam, sh, fit, rough, gmax, ok = label_rows(G[None], (gam[None], sh[None], res[None]))
        if not fit.any():
            raise OracleInconsistentError(
                f"row {i}: none of the {K} pairs is resolved by its own interpolation of {H_row} "
                f"terms from {2 * H_plan} samples (float64 conditioning grows with H; best misfit "
                f"{np.min(res) / gmax[0]:.2g} relative, tol={tol:g}); use learn_canonical, or lower "
                "scale."
            )
        if not ok[0]:
            # Rounding explains pairs that disagree only where their fits are ill conditioned: a
            # well-conditioned disagreement is a wrong H (or a target that is not a sum of heads).
            fitted = np.flatnonzero(fit[0])[:8]
            sens = float(np.median([pair_sensitivity(s, gam[0, k], sh[0, k], gmax[0]) for k in fitted]))
            if sens <= _WELL_CONDITIONED * gmax[0]:
                raise OracleInconsistentError(
                    f"row {i}: only {int(agree.sum())} of {K} pairs agree on the amplitudes of "
                    f"{H_row} heads, although each pair's fit is well conditioned (rounding "
                    f"sensitivity {sens / gmax[0]:.1g} relative, median of {fitted.size} pairs, at most "
                    f"{_WELL_CONDITIONED:g}): rounding does not explain it. The oracle has more heads "
                    f"than {H_row} (pass a larger H or H_bound), or is not a sum of heads."
                )
            raise OracleInconsistentError(
                f"row {i}: only {int(agree.sum())} of {K} pairs resolved all {H_row} heads "
                f"consistently on their own (need 2 to start the joint fit): float64 "
                f"cannot separate {H_row} logistic terms from {2 * H_plan} samples at most tokens "
                f"(rounding sensitivity of a pair's fit {sens / gmax[0]:.1g} relative, median of "
                f"{fitted.size}); use learn_canonical, or try another scale."
            )
        return gamma0[0], agree[0], gam[0], sh[0], fit[0], bool(rough[0])

    def start_rows(gamma0, agree, gam, sh, fit):
        """Rows R0 by least squares per head, over every token where that head is resolved, batched
        over rows (the arrays of label_rows): R0 (N, H, d) and the fewest tokens per head (N,).

        A pair that misses some heads (a shift outside the window, two shifts colliding) still
        resolves the others: head ``h`` is taken from pair ``k`` where one of the pair's terms has
        head ``h``'s amplitude to _MATCH_TOL (relative to the largest). With the whole-pair
        agreement alone, fewer than ``d`` tokens per row are resolved from H = 7 on, and the
        minimum-norm start leaves R0 in their span, too far off for the joint fit."""
        window = float(np.max(np.abs(s)))
        use, L = _match_terms(gam, sh, fit, gamma0)
        # The pairs that resolve all heads (sorted by amplitude like gamma0) add every head whose
        # amplitude is farther than twice their agreement (1 %) from the others: there the order
        # cannot swap.
        a = agree[:, :, None] & _apart(gamma0)[:, None, :]
        use, L = use | a, np.where(a, sh, L)
        # (use, L) also serve the shared-amplitude start, if this one fails (start_terms)
        return _start_rows(X, L, window, use), use.sum(axis=1).min(axis=1), use, L

    def start_row(i, G, fits=None):
        """A row's start for the joint fit: amplitudes shared by its resolved pairs, rows R0."""
        gamma0, agree, gam, sh, fit, rough = label_row(i, G, fits)
        if rough:
            sh[agree] = polish_pairs(
                s, G[agree], np.repeat(gamma0[None], agree.sum(), axis=0), sh[agree], fixed_gamma=True
            )[1]
        R0, fewest, use, L = start_rows(gamma0[None], agree[None], gam[None], sh[None], fit[None])
        head_tokens[i], start_terms[i] = int(fewest[0]), (use[0], L[0])
        return gamma0, R0[0], int(agree.sum())

    def finish_row(i, G, gamma0, R0, n_agree, tried=False):
        """The serial joint fit (with its MINPACK fallback near convergence) and its check; where it
        misfits (or ``tried``: the batched fit already did from this start), the start with its
        worst-resolved heads refitted one at a time (_repair_start), then the joint fit again."""
        info = {"residual": np.inf, "scale": 1.0}
        if not tried:
            gamma, R, info = fit_row_joint(s, G, X, gamma0, R0, XX=XX, iters=30)
        if info["residual"] > tol * info["scale"]:
            R1 = _repair_start(s, G, X, gamma0, R0, float(np.max(np.abs(s))))
            if R1 is not None:
                gamma, R, info = fit_row_joint(s, G, X, gamma0, R1, XX=XX, iters=30)
        if info["residual"] > tol * info["scale"]:
            # This book's start from all of the row's pairs with their amplitudes shared
            # (companion._rowstart), only where the per-head start failed.
            shared = shared_amplitude_start(s, G, X, gamma0, float(np.max(np.abs(s))), start_terms.get(i))
            if shared is not None:  # the batched Levenberg-Marquardt (no MINPACK fallback: bounded)
                gb, Rb, rb, sb = fit_rows_joint(s, G[None], X, shared[0][None], shared[1][None], XX=XX)
                if rb[0] <= tol * sb[0]:
                    gamma, R, info = gb[0], Rb[0], {"residual": float(rb[0]), "scale": float(sb[0])}
                    shared_rows.append(i)
        if info["residual"] > tol * info["scale"]:
            raise OracleInconsistentError(
                f"row {i}: the joint fit of {H_row} heads over {K} tokens misfits by "
                f"{info['residual'] / info['scale']:.2g} relative (tol={tol:g}), starting from "
                f"{n_agree} pairs that resolved all heads; the fewest tokens at which a pair's own "
                f"fit resolved a head: {head_tokens.get(i, 0)} (a head's start row needs more than "
                f"d={d}; float64 conditioning of {H_row} terms from {2 * H_plan} samples per pair "
                "lowers it as H grows); use learn_canonical."
            )
        return gamma, R, n_agree / K, info["residual"] / info["scale"]

    def learn_row(i, G=None, fits=None):
        if G is None:  # a redrawn direction: ask its pairs now
            G = _ask_pairs(oracle, X + P[i], X, n, m) - bX[:, None]
        return finish_row(i, G, *start_row(i, G, fits))

    # Every row's pairs in blocks of _ASK_BLOCK queries, and every pair's own fit batched over all rows.
    G_all = (
        _ask_pairs(oracle, (X[None] + P[:, None]).reshape(-1, d), np.tile(X, (d, 1)), n, m) - np.tile(bX, d)[:, None]
    ).reshape(d, K, -1)
    if H_row is None:
        check_visible(0, G_all[0])
        H_row = choose_terms(G_all[0])
    fits_all = [f.reshape(d, K, *f.shape[1:]) for f in pair_fits(G_all.reshape(d * K, -1), H_row)]
    # Every row's start (labels and start rows batched over the rows), then all joint fits batched
    # (fit_rows_joint); a row that misfits after it gets the serial fit (and its fallback), then a
    # new direction.
    for i in np.flatnonzero(np.max(np.abs(G_all), axis=(1, 2)) <= 1e-13 * max(1.0, float(np.max(np.abs(bX))))):
        check_visible(int(i), G_all[i])  # the first row that shows no head raises
    gamma0, agree, gam, sh, fit, rough, _, ok = label_rows(G_all, fits_all)
    sel = agree & (ok & rough)[:, None]  # the fixed-amplitude refits of every rough row in one batch
    if sel.any():
        sh[sel] = polish_pairs(s, G_all[sel], gamma0[np.nonzero(sel)[0]], sh[sel], fixed_gamma=True)[1]
    ids = np.flatnonzero(ok)
    starts, batched = {}, {}
    if ids.size:
        R0, fewest, use, L = start_rows(gamma0[ids], agree[ids], gam[ids], sh[ids], fit[ids])
        n_agree = agree.sum(axis=1)
        for j, i in enumerate(ids):
            head_tokens[int(i)], start_terms[int(i)] = int(fewest[j]), (use[j], L[j])
            starts[int(i)] = (gamma0[i], R0[j], int(n_agree[i]))
        gb, Rb, resb, scb = fit_rows_joint(s, G_all[ids], X, gamma0[ids], R0, XX=XX)
        for j, i in enumerate(ids.tolist()):
            if resb[j] <= tol * scb[j]:
                batched[i] = (gb[j], Rb[j], starts[i][2] / K, resb[j] / scb[j])
            else:
                starts[i] = (*starts[i], True)  # finish_row repairs this start
    for i in range(d):
        G_i, fits_i = G_all[i], tuple(f[i] for f in fits_all)
        while True:
            try:
                if i in batched:
                    out = batched[i]
                elif i in starts and G_i is G_all[i]:
                    out = finish_row(i, G_i, *starts[i])
                else:
                    out = learn_row(i, G_i, fits_i)
                break
            except OracleInconsistentError:
                if spare == 0:
                    raise
                # A new direction for row i: along the old one a head's amplitude may vanish.
                spare -= 1
                n_redrawn += 1
                for _ in range(100):
                    q = rng.standard_normal(d)
                    Pn = P.copy()
                    Pn[i] = q / np.linalg.norm(q)
                    if np.linalg.cond(Pn) < 10 * d:
                        break
                P[i] = Pn[i]
                G_i, fits_i = None, None
        amps.append(out[0])
        rows.append(out[1])
        fractions.append(out[2])
        residuals.append(out[3])
    Hf = H_row

    # Link every row to row 0: the answers at delta_0 + delta_i are linear in the H^2 candidates.
    perms = [np.arange(Hf)] * d
    link_err = []
    bL = X_link @ v
    if Hf > 1 and d > 1:  # every link pair asked at once (_ask_pairs), their fits batched over rows
        G_link = (
            _ask_pairs(oracle, (X_link[None] + P[0] + P[1:, None]).reshape(-1, d), np.tile(X_link, (d - 1, 1)), n, m)
            - np.tile(bL, d - 1)[:, None]
        ).reshape(d - 1, n_link, -1)
        # shifts[i, k, h, g]: head h of row 0 with head g of row i + 1 at link token k
        XR = X_link @ np.array(rows).transpose(0, 2, 1)  # (d, k, H)
        shifts = XR[0][None, :, :, None] + XR[1:, :, None, :]
        beta = amps[0][None, :, None] + np.array(amps[1:])[:, None, :]  # (d - 1, H, H)
        A = (expit(s[None, None, :, None, None] + shifts[:, :, None]) * beta[:, None, None]).reshape(
            d - 1, n_link * s.size, Hf * Hf
        )
        # The least squares of every link at once: a stacked pseudo-inverse with numpy.linalg.lstsq's
        # cutoff (singular values below eps * max(shape) times the largest are dropped).
        coefs = (np.linalg.pinv(A, rcond=_EPS * max(A.shape[1:])) @ G_link.reshape(d - 1, -1, 1)).reshape(d - 1, Hf, Hf)
        pick = np.array([linear_sum_assignment(-coef) for coef in coefs])  # (d - 1, 2, H)
        rix = np.arange(d - 1)[:, None]
        sa = shifts[rix, :, pick[:, 0], pick[:, 1]].transpose(0, 2, 1)  # (d - 1, k, H): the pairing's shifts
        sb = beta[rix, pick[:, 0], pick[:, 1]]  # (d - 1, H)
        fitted = (expit(s[None, None, :, None] + sa[:, :, None, :]) * sb[:, None, None, :]).sum(axis=3)
        errs = np.max(np.abs(fitted - G_link), axis=(1, 2)) / np.max(np.abs(G_link), axis=(1, 2))
        for i in range(1, d):
            err, (a, b) = float(errs[i - 1]), pick[i - 1]
            link_err.append(err)
            if err > 1e3 * tol:
                sel = np.zeros((Hf, Hf), bool)
                sel[a, b] = True
                raise OracleInconsistentError(
                    f"rows 0 and {i} could not be linked: the best pairing of their {Hf} heads "
                    f"misfits the {n_link} link pairs by {err:.2g} relative (coefficients "
                    f"{np.sort(coefs[i - 1][sel])[:2].round(3).tolist()}...); use learn_canonical."
                )
            perm = np.empty(Hf, int)
            perm[a] = b
            perms[i] = perm
    Gam = np.array([amps[i][perms[i]] for i in range(d)])  # (d, H): delta_i^T v_h
    Rw = np.array([rows[i][perms[i]] for i in range(d)])  # (d, H, d): delta_i^T W_h
    model = _heads_from_rows(P, Rw, Gam)  # P orthonormal unless a row was redrawn
    extra = {
        "resolved_fraction": float(np.min(fractions)),
        "max_row_residual": float(np.max(residuals)),
        "max_link_error": max(link_err, default=0.0),
        "n_redrawn_rows": n_redrawn,
        "n_shared_start_rows": len(shared_rows),
    }
    return _rational_result(
        oracle, start, model, n + m, d, H_plan, plan, extra=extra, verify=verify, verify_rtol=verify_rtol, seed=seed
    )


__all__ += ["learn_canonical_rational", "follow_up_count", "rational_plan", "moment_plan", "MOMENT_FROM"]


def counts_conditioning(d, H, *, shift_std=3.0, n_draws=20, seed=0):
    """Rounding sensitivity of the counts route: one pair on its own against a joint row fit.

    Random amplitudes ``gamma ~ N(0, I_H)``, row vectors ``R_h ~ N(0, shift_std^2 I_d / d)`` and
    tokens of unit norm (shifts of standard deviation ``shift_std``), sampled at the ratios of
    :func:`companion._rational.ratio_design`. The sensitivity is ``eps * max|G| / sigma_min(J)``
    for the Jacobian ``J`` of the samples with respect to the unknowns: the largest change of an
    unknown that a rounding-level change of the answers can cause.

    Returns
    -------
    dict
        ``"pair"``: median over ``n_draws`` pairs of the free fit of ``(gamma, l)`` from ``2 H``
        samples; ``"pair_fixed_gamma"``: the same with the amplitudes known; ``"row"``: the joint
        fit of ``(gamma, R)`` over the ``K`` tokens of :func:`rational_plan` (median of 3 draws).

    Examples
    --------
    >>> c = counts_conditioning(8, 2)
    >>> bool(c["pair"] < 1e-10 and c["row"] < 1e-10)
    True
    """
    from scipy.special import expit

    from ._rational import ratio_design

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    shift_std = check_real(shift_std, "shift_std", minimum=0.0, strict=True)
    n_draws = check_int(n_draws, "n_draws", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    n, m = ratio_design(H)
    s = np.log(n / m)

    def sens(J, scale):
        sv = np.linalg.svd(J, compute_uv=False)
        return float(_EPS * scale / sv[-1]) if sv[-1] > 0 else np.inf

    free, fixed = [], []
    for _ in range(n_draws):
        g, l = rng.standard_normal(H), shift_std * rng.standard_normal(H)
        Z = expit(s[:, None] + l[None])
        scale = max(1.0, float(np.max(np.abs(Z @ g))))
        B = g * Z * (1 - Z)
        free.append(sens(np.hstack([Z, B]), scale))
        fixed.append(sens(B, scale))
    K = rational_plan(d, H)["K"]
    rows = []
    for _ in range(3):
        g, R = rng.standard_normal(H), shift_std * rng.standard_normal((H, d)) / np.sqrt(d)
        X = rng.standard_normal((K, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        Z = expit(s[None, :, None] + (X @ R.T)[:, None, :])
        B = g * Z * (1 - Z)
        J = np.hstack([Z.reshape(-1, H), (B[..., None] * X[:, None, None, :]).reshape(-1, H * d)])
        rows.append(sens(J, max(1.0, float(np.max(np.abs(Z @ g))))))
    return {"pair": float(np.median(free)), "pair_fixed_gamma": float(np.median(fixed)), "row": float(np.median(rows))}


__all__ += ["counts_conditioning"]


def _resolved_heads(g, sh, gam, L):
    """Shape (K, H) bool: head ``h`` is resolved at token ``k`` where the fitted term of pair ``k``
    (amplitudes ``g``, shifts ``sh``, shape (K, H), NaN where the fit failed) nearest to the true
    amplitude ``gam[h]`` has it to _MATCH_TOL (relative to the largest ``|gam|``) and the true shift
    ``L[k, h]`` to 1e-2 (absolute, in ``log r``)."""
    dist = np.abs(g[:, None, :] - gam[None, :, None])
    dist = np.where(np.isfinite(dist), dist, np.inf)
    j = np.argmin(dist, axis=2)
    hit = np.take_along_axis(dist, j[..., None], 2)[..., 0] <= _MATCH_TOL * np.max(np.abs(gam))
    return hit & (np.abs(np.take_along_axis(np.nan_to_num(sh), j, 1) - L) <= 1e-2)


def counts_start_coverage(d, H, *, n_rows=4, scale=3.0, spread=1.5, seed=0) -> dict:
    """Why the counts route stops: tokens per head that a pair's own fit resolves, against ``d``.

    For ``n_rows`` row directions of :func:`learn_canonical_rational`'s design (its ``K`` tokens of
    median norm ``scale``, its ``2 H`` ratios) and the target ``random_multi_head(d, H, seed=seed)``,
    every pair is fitted on its own as the learner does (interpolation, then Levenberg-Marquardt),
    on exact answers, and head ``h`` counts as resolved at a token where a fitted term has ``h``'s
    true amplitude to ``_MATCH_TOL`` (relative to the row's largest) and its shift to 1e-2. A head's
    start row is a least-squares fit over those tokens, so it needs more than ``d`` of them.

    The start error is that fit's (:func:`_start_rows`, over the resolved tokens with their fitted
    shifts, labelled by the true amplitudes: the best this per-pair start can do), relative per head,
    ``||R0_h - R_h|| / ||R_h||``. Measured at ``d = 64`` (defaults, 4 rows; this book's own,
    2026-12-01): largest (median) over heads and rows 8e-4 (1e-4) at ``H = 8``, 0.70 (0.51) at
    ``H = 10`` and 0.97 (0.86) at ``H = 12``: below ``d`` resolved tokens the least squares is
    underdetermined and the start is the minimum-norm row. A row's joint fit
    (:func:`companion._rational.fit_row_joint`) converged to rounding level from the true heads
    perturbed by 1 % (3 draws of 3) and 3 % (2 of 3) at ``d = 32``, ``H = 12``, and by 3 % at
    ``d = 64`` (one row of the learner's design, seed 0; 10 % at ``H = 10``), and from 10 % in no
    draw at ``H = 12``: the start, not the joint fit, is what is missing.

    What a row's tokens share (this book's derivation): pair ``(i, k)`` is
    ``G_ik(r) = sum_h gamma_ih r / (r + exp(-R_ih^T x_k))`` with ``gamma_ih = delta_i^T v_h`` and
    ``R_ih = W_h^T delta_i``, so the tokens of a row share the amplitudes ``gamma_ih`` and the rows
    ``R_ih`` (the log-poles are linear in ``x_k``), not the poles: a common-denominator fit (vector
    fitting, set-valued AAA) has no shared poles to find, and random tokens give the log-poles no
    shift structure for a Prony or matrix-pencil method. The shared amplitudes do fix the
    conditioning (:func:`counts_conditioning`: one pair's shifts with the amplitudes known, 2.3e-9 at
    ``H = 12`` against 31 for the free fit) but not the start: tried at ``d = 64``, ``H = 12`` with
    the true amplitudes and none reached the 3 % above (2026-12-01): each pair's shifts refitted
    with the amplitudes fixed, from its free fit's terms assigned by amplitude and after five rounds
    of pairwise swaps (13 of 117 pairs of row 0 at rounding level, 4 of them with a shift off by
    more than 1e-3: spurious minima); a penalty continuation pulling every pair's free shifts toward
    ``X R^T`` (median shift error 0.6 to 1.0 after it); a robust least squares over every pair's
    amplitude-assigned shifts (65 % within 0.3, 27 % off by more than 1; start error 0.6 to 1.1),
    and least absolute deviations over them with the amplitude-matched ones weighted up (start error
    0.7 to 1.1: about a third of ``K = 1.83 d`` equations corrupted is beyond what an L1 fit corrects).
    What was kept: the shared-amplitude start of :mod:`companion._rowstart` (every pair refitted
    with the amplitudes fixed, then the pairs not accepted refitted again from the shifts the rows so
    far predict), tried where the per-head start fails. It learns ``H = 8`` at ``d = 64`` (5 of 64
    rows), not ``H = 8`` at ``d = 16, 32`` nor ``H = 9`` at ``d = 64`` (a row whose accepted pairs
    stay below ``d`` per head does not grow), nor ``H = 12``.

    Returns
    -------
    dict
        ``d``, ``H``, ``"K / d"`` (all tokens of a row), ``"fewest resolved / d"`` (over heads and
        rows), ``"median resolved / d"``, ``"start error"`` (the largest relative start error over
        heads and rows) and ``"median start error"`` (over heads and rows).

    Raises
    ------
    InvalidInputError
        If a size is out of range, or ``d`` is too small for ``H`` (:func:`rational_plan`).

    Examples
    --------
    >>> c = counts_start_coverage(16, 2, n_rows=2)
    >>> bool(c["fewest resolved / d"] > 1.0), c["K / d"] == rational_plan(16, 2)["K"] / 16
    (True, True)
    """
    from scipy.special import expit

    from ._rational import interpolate_pairs, polish_pairs, ratio_design

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    n_rows = check_int(n_rows, "n_rows", minimum=1, maximum=d)
    scale = check_real(scale, "scale", minimum=0.0, strict=True)
    spread = check_real(spread, "spread", minimum=1.0)
    seed = check_int(seed, "seed", minimum=0)
    target = random_multi_head(d, H, seed=seed)
    K = rational_plan(d, H)["K"]
    n, m = ratio_design(H)
    r = n / m
    s = np.log(r)
    rng = np.random.default_rng(seed)
    P = np.linalg.qr(rng.standard_normal((d, d)))[0].T
    X = rng.standard_normal((K, d))
    X *= (scale * np.exp(rng.uniform(-np.log(spread), np.log(spread), K)) / np.linalg.norm(X, axis=1))[:, None]
    counts, start_errors = [], []
    for i in range(n_rows):
        gam = target.vs @ P[i]
        R_true = np.einsum("e,hef->hf", P[i], target.Ws)
        L = X @ R_true.T
        G = expit(s[None, :, None] + L[:, None, :]) @ gam
        g0, l0 = interpolate_pairs(r, G, H)
        ok = np.isfinite(l0).all(axis=1)
        g, sh = np.full((K, H), np.nan), np.full((K, H), np.nan)
        if ok.any():
            g[ok], sh[ok], _ = polish_pairs(s, G[ok], g0[ok], l0[ok])
        hit = _resolved_heads(g, sh, gam, L)
        counts.append(hit.sum(axis=0))
        # The start from those tokens: each head's fitted shift (its nearest-amplitude term).
        dist = np.abs(g[:, None, :] - gam[None, :, None])
        near = np.argmin(np.where(np.isfinite(dist), dist, np.inf), axis=2)
        L_fit = np.where(hit, np.take_along_axis(np.nan_to_num(sh), near, axis=1), 0.0)
        R0 = _start_rows(X, L_fit, float(np.max(np.abs(s))), hit)
        start_errors.append(np.linalg.norm(R0 - R_true, axis=1) / np.linalg.norm(R_true, axis=1))
    resolved = np.concatenate(counts)
    errors = np.concatenate(start_errors)
    return {
        "d": d,
        "H": H,
        "K / d": K / d,
        "fewest resolved / d": float(resolved.min()) / d,
        "median resolved / d": float(np.median(resolved)) / d,
        "start error": float(errors.max()),
        "median start error": float(np.median(errors)),
    }


__all__ += ["counts_start_coverage"]


def _counts_design_answers(d, H, n_rows, seed):
    """The target ``random_multi_head(d, H, seed=seed)``, :func:`learn_canonical_rational`'s design
    (``companion._information.learner_design``) and the float64 answers minus ``x^T v`` of its rows
    ``0 .. n_rows - 1``, each of shape (K, 2 H)."""
    from ._information import learner_design
    from .oracles import ValueQueryOracle

    K = rational_plan(d, H)["K"]
    target = random_multi_head(d, H, seed=seed)
    P, X, n, m = learner_design(d, H, K, seed)
    oracle = ValueQueryOracle(target)
    bX = X @ np.asarray(oracle(np.eye(d)[:, None, :]))
    return target, P, X, n, m, [_ask_pairs(oracle, X + P[i], X, n, m) - bX[:, None] for i in range(n_rows)]


def counts_information(d, H, *, n_rows=2, basin=True, seed=0) -> dict:
    """Where float64 stops the counts route: what one pair's answers fix, against a whole row's.

    This book's own analysis (``benchmarks/why_H_stops.py`` prints it per ``H``). For rows ``0 ..
    n_rows - 1`` of :func:`learn_canonical_rational`'s own design (its directions, ``K`` tokens and
    ``2 H`` ratios, ``seed``) on ``random_multi_head(d, H, seed=seed)``, with the true heads of each
    row, the float64 answers' error is measured against the same answers in extended precision, and
    from its standard deviation ``sigma`` the Cramer-Rao bounds ``sigma^2 (J^T J)^{-1}`` of the
    unknowns follow (for Gaussian errors; for rounding, the first-order spread of the least-squares
    estimate): of one pair's shifts (in ``log r``; the pair's worst head, median over pairs) and of a
    row's heads in its joint fit (``||R_h_hat - R_h|| / ||R_h||``, worst head). A start that labels
    heads pair by pair needs the first at most ``1e-2`` (the joint fit's basin is 1-3 % of ``R_h``)
    at more than ``d`` of the ``K`` tokens. Measured at ``d = 64`` (2026-12-01): the row's bound is
    about 1e-11 at every ``H`` up to 12, the pair's median 1.5e-4 at ``H = 6``, 0.17 at ``H = 8``
    and 42 at ``H = 12``.

    Parameters
    ----------
    d, H : int
        Dimension and number of heads (:func:`rational_plan` must accept them).
    n_rows : int, default=2
        Rows of the design analysed (``1 <= n_rows <= d``).
    basin : bool, default=True
        Also probe the row's joint fit from the true heads perturbed by 1 %, 3 % and 10 % (two
        draws each, batched Levenberg-Marquardt, 300 steps): seconds per row at ``d = 64``.
    seed : int, default=0

    Returns
    -------
    dict
        ``d``, ``H``, ``"K / d"``; ``noise`` (the answers' error s.d. relative to the row's largest
        answer, worst row); ``"Loewner cond"`` (median ``sigma_1 / sigma_H`` of the pairs'
        interpolation matrices); ``"pair CRB"`` and ``"pairs <= 0.01"`` (median pair bound, and the
        fraction of pairs at most ``1e-2``); ``"pair CRB 4x S"`` (``8 H`` samples in the same window),
        ``"pair CRB L151"`` (``2 H`` samples over ``|log r| <= 5``), ``"pair CRB all n/m"`` (every
        ratio with ``n + m <= 2 H + 1``), ``"S needed / 2H"`` (the fewest samples, doubling, at which
        the median is at most ``1e-2``; ``inf`` if none); ``"pair CRB scaled"`` and
        ``"scaled <= 0.01"`` (the ``2 H`` queries split over token scales ``c = 0.5, 1, 2, 4``:
        ``n`` copies of ``c x + delta`` then ``m`` copies of ``c x``, a design this book has not
        built); ``"fixed-gamma"`` (the pair bound with the amplitudes known); ``"row CRB"``;
        ``"resolved / d"`` and ``"start err"`` (:func:`counts_start_coverage`); ``"shared err"``
        (the shared-amplitude start of ``companion._rowstart`` given the true amplitudes; ``inf``
        where it refuses); with ``basin``, ``"basin min"`` and ``"basin max"`` over the rows (the
        largest perturbation from which every draw reached rounding level; 0.0 if none).

    Raises
    ------
    InvalidInputError
        If a size is out of range, ``d`` is too small for ``H``, or numpy's ``longdouble`` is no
        wider than float64 on this platform (no reference to measure the rounding against).

    Examples
    --------
    >>> c = counts_information(8, 2, n_rows=1, basin=False)
    >>> bool(c["row CRB"] < 1e-10 and c["pair CRB"] < 1e-6 and c["pairs <= 0.01"] == 1.0)
    True
    """
    from ._information import information_row

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    n_rows = check_int(n_rows, "n_rows", minimum=1, maximum=d)
    seed = check_int(seed, "seed", minimum=0)
    target, P, X, n, m, Gs = _counts_design_answers(d, H, n_rows, seed)
    cov = counts_start_coverage(d, H, n_rows=n_rows, seed=seed)
    return information_row(target, P, X, n, m, Gs, cov, with_basin=bool(basin))


def counts_length_bounds(d, H, *, lengths=(25, 50, 100, 200, 400, 1000), samples=(24, 96, 400), seed=0):
    """The median pair bound of :func:`counts_information` (row 0) with longer queries and more samples.

    Every ratio ``n / m`` with ``n + m <= L`` is allowed and ``S`` of them are taken, spread evenly
    in ``log r`` (``companion._rational.count_pairs``): what a start that labels heads pair by pair
    would need beyond the route's ``2 H`` queries of length ``2 H + 1``. Measured at ``d = 64``,
    ``H = 12`` (2026-12-01): 33 at the design's ``L = 25``, ``S = 24``; 0.98 with ``S = 400`` at
    ``L = 25``; 0.087 at ``L = 1000``, ``S = 400``, against the ``1e-2`` a start needs.

    Parameters
    ----------
    d, H : int
    lengths : sequence of int
        Longest query lengths ``L >= 3``.
    samples : sequence of int
        Samples per pair ``S >= 2 H`` (fewer are taken where fewer ratios exist).
    seed : int, default=0

    Returns
    -------
    list of dict
        One per length: ``"longest query"`` and ``"S = <S>"`` for each ``S``, the median pair bound.

    Raises
    ------
    InvalidInputError
        If a size is out of range, or as :func:`counts_information`.

    Examples
    --------
    >>> rows = counts_length_bounds(8, 2, lengths=(5, 9), samples=(4,))
    >>> [r["longest query"] for r in rows], bool(rows[0]["S = 4"] < 1e-6)
    ([5, 9], True)
    """
    from ._information import length_bounds

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    lengths = [check_int(L, "lengths", minimum=3) for L in lengths]
    samples = [check_int(S, "samples", minimum=2 * H) for S in samples]
    target, P, X, n, m, Gs = _counts_design_answers(d, H, 1, check_int(seed, "seed", minimum=0))
    return length_bounds(target, P, X, n, m, Gs[0], lengths, samples)


__all__ += ["counts_information", "counts_length_bounds"]


def multiscale_pair_starts(d, H, *, row=0, n_pairs=None, starts=64, seed=0) -> list:
    """Per-pair starts on the route's design against the multi-scale design: errors and bounds.

    This book's own measurement of a design variant not built into :func:`learn_canonical_rational`
    (``benchmarks/multiscale_pairs.py`` prints it; the prototype is ``companion._multiscale``). A
    query of ``n`` copies of ``c x + delta`` then ``m`` copies of ``c x`` answers, minus
    ``c x^T sum_h v_h``, ``sum_h gamma_h sigma(log(n / m) + c l_h)``: the token's scale ``c`` scales
    the shifts ``l_h = delta^T W_h x`` and keeps the amplitudes ``gamma_h = delta^T v_h``; the
    variant splits a pair's ``2 H`` queries over ``c = 0.5, 1, 2, 4`` (the same count and longest
    query). For row ``row`` of the route's own design (its direction and first ``n_pairs`` tokens,
    ``seed``) on ``random_multi_head(d, H, seed=seed)``, each start's error per pair against the true
    terms (the worst head, terms matched by an optimal assignment). Measured at ``d = 64``
    (2026-12-01, rows 0 and 1): a perfect per-pair solver on the variant would resolve every head to
    ``1e-2`` at 1.44-1.47 d tokens at ``H = 12`` (0.55-0.70 d on the route's design; a head's start
    row needs more than d), but no global search built here finds the pairs' terms (0 or 1 of 117
    within ``1e-2``).

    Parameters
    ----------
    d, H : int
        Dimension and number of heads (:func:`rational_plan` must accept them; ``H >= 2``).
    row : int, default=0
        The design's row (``0 <= row < d``).
    n_pairs : int, optional
        The row's first ``n_pairs`` tokens (default: all ``K`` of :func:`rational_plan`).
    starts : int, default=64
        Random starts per pair of the variable-projection search (``>= 1``).
    seed : int, default=0

    Returns
    -------
    list of dict
        One per start, with ``H``, ``start`` and ``"median shift err"`` (log r units) and
        ``"shift <= 0.01"`` (fraction of pairs): ``"route (Loewner + LM)"`` (the route's own pair
        fit, with ``"real poles"``, the fraction of pairs whose interpolant has ``H`` real negative
        poles), ``"route CRB (perfect solver)"`` and ``"ms CRB (perfect solver)"`` (the Cramer-Rao
        bound with the answers' measured rounding, per scale; with ``"head tokens / d"``: the fewest
        tokens at which one head is within ``1e-2``, over ``d``), ``"ms varpro x<starts>"``,
        ``"ms greedy + CD + LM"`` (with ``"median misfit"``, rms), ``"ms basin <rho>"`` (a fit from
        the true terms with the shifts moved by ``rho``) and ``"<design> fixed-gamma basin <rho>"``
        (the same with the amplitudes held at the truth); the error rows also give
        ``"median ampl err"`` (relative) and ``"shift <= 1e-6"``.

    Raises
    ------
    InvalidInputError
        If a size is out of range, ``d`` is too small for ``H`` (:func:`rational_plan`), or numpy's
        ``longdouble`` is no wider than float64 here (no reference for the rounding).

    Examples
    --------
    Two heads at ``d = 8``: both designs resolve every pair, and a perfect solver is far inside
    ``1e-2``.

    >>> rows = {r["start"]: r for r in multiscale_pair_starts(8, 2, n_pairs=6, starts=8)}
    >>> rows["route (Loewner + LM)"]["shift <= 1e-6"], rows["ms CRB (perfect solver)"]["shift <= 0.01"]
    (1.0, 1.0)
    """
    from ._information import learner_design
    from ._multiscale import pair_starts

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=2)
    row = check_int(row, "row", minimum=0, maximum=d - 1)
    starts = check_int(starts, "starts", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    K = rational_plan(d, H)["K"]
    n_pairs = K if n_pairs is None else check_int(n_pairs, "n_pairs", minimum=1, maximum=K)
    target = random_multi_head(d, H, seed=seed)
    P, X, n, m = learner_design(d, H, K, seed)
    return pair_starts(target, P[row], X[:n_pairs], n, m, starts=starts)


__all__ += ["multiscale_pair_starts"]


def probe_hessian(oracle, v, x0, step=1e-3):
    """The symmetric matrix ``M = sym(sum_h v^(h) (W^(h) x0)^T)`` of :func:`learn_orthogonal_heads`.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d``; ``d (d + 1)`` of its queries are spent.
    v : array-like of shape (d,)
        ``sum_h v^(h)`` (the answers to the length-1 queries ``e_j``).
    x0 : array-like of shape (d,)
        The probe's query token direction.
    step : float, default=1e-3
        Size ``s`` of the query token, ``0 < s <= 0.1`` (Richardson extrapolation over ``s, 2s``).

    Returns
    -------
    ndarray of shape (d, d)

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> t = random_multi_head(4, 2, orthogonal=True, seed=0)
    >>> x0 = np.ones(4) / 2
    >>> M = probe_hessian(ValueQueryOracle(t), t.vs.sum(0), x0)
    >>> exact = sum(np.outer(vh, W @ x0) + np.outer(W @ x0, vh) for W, vh in zip(t.Ws, t.vs)) / 2
    >>> bool(np.allclose(M, exact, atol=1e-8))
    True
    """
    d = check_exact_oracle(oracle, "probe_hessian")
    v = as_float_array(v, "v", ndim=1, shape=(d,))
    x0 = as_float_array(x0, "x0", ndim=1, shape=(d,))
    step = check_real(step, "step", minimum=0.0, strict=True, maximum=0.1)
    return _probe_hessian(oracle, v, x0, step)


def count_pairs(n_points, max_len):
    """Counts ``(n, m)`` with ``n + m <= max_len`` spread evenly in ``log(n / m)`` (the robust route's).

    See :func:`companion._rational.count_pairs`.

    Examples
    --------
    >>> n, m = count_pairs(5, 5)
    >>> (n / m).round(3).tolist()
    [0.25, 0.5, 1.0, 2.0, 4.0]
    """
    from ._rational import count_pairs as _count_pairs

    return _count_pairs(check_int(n_points, "n_points", minimum=1), check_int(max_len, "max_len", minimum=2))


def fit_logistic_sum(s, g):
    """Fit ``g(s) = sum_h c_h sigma(s + l_h)`` with the number of terms found (AAA, then LM).

    Parameters
    ----------
    s : array-like of shape (K,)
        Sample points ``log(n / m)``.
    g : array-like of shape (K,)
        Answers minus ``x^T v``.

    Returns
    -------
    c, l : ndarray of shape (H,)
        Amplitudes and shifts, sorted by ``l``.
    info : dict
        ``residual``, ``sensitivity``, ``scale`` (:func:`companion._rational.fit_free`).

    Examples
    --------
    >>> import numpy as np
    >>> n, m = count_pairs(20, 64)
    >>> s = np.log(n / m)
    >>> g = 1.0 / (1 + np.exp(-(s - 1.0))) - 0.5 / (1 + np.exp(-(s + 1.0)))
    >>> c, l, info = fit_logistic_sum(s, g)
    >>> c.round(8).tolist(), l.round(8).tolist()
    ([1.0, -0.5], [-1.0, 1.0])
    """
    from ._rational import fit_free

    s = as_float_array(s, "s", ndim=1)
    g = as_float_array(g, "g", ndim=1, shape=s.shape)
    return fit_free(s, g)


__all__ += ["probe_hessian", "count_pairs", "fit_logistic_sum"]
