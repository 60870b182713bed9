"""Proposition 7.1: parameter sets with the same function, the canonical form, random targets (private).

Part of :mod:`companion.multihead` (§7); the public names are re-exported there.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from .._validation import as_float_array, check_int, check_real
from ..attention import MultiHead, SingleHead
from ..errors import InvalidInputError
from ._common import as_model


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
    model = as_model(model)
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
    model = as_model(model)
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
    model = as_model(model)
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
    model = as_model(model)
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
    ref, est = as_model(reference, "reference"), as_model(estimate, "estimate")
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
    >>> from companion.attention import SingleHead
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
