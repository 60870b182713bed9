"""The structured learner: heads in mutually orthogonal subspaces (private).

Part of :mod:`companion.multihead` (§7); :func:`companion.multihead.learn_orthogonal_heads`.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh, orth

from .._learner import (
    DEFAULT_VERIFY,
    check_verify,
    names_rounding,
    reserve,
)
from .._validation import check_int, check_real
from ..attention import MultiHead
from ..errors import NotIdentifiableError, OracleInconsistentError
from ..exact import check_exact_oracle, invert_two_token, remeasure_saturated
from ..numerics.rop import rop_queries
from ._common import BAND, heads_result, verify_heads


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


def probe_hessian_queries(oracle, v, x0, s):
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
        band=BAND,
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
#: which rounding at float32 swamps: a refusal there names the rounding, which alone makes it refuse
#: (whether the heads are also not orthogonal it cannot tell).
_orthogonal_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its subspaces come from finite-difference "
        "Hessians of the answers (step ~1e-3), which rounding at this level swamps, so the rounding "
        "alone makes it refuse, and this refusal cannot tell whether the heads are also outside "
        "mutually orthogonal subspaces. Ask a float64 server, or use detect_multi_head(oracle, "
        f"precision=...). (The check said: {err})"
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
        (stated, or measured after the refusal with 32 queries): the message names the rounding.

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
    M = probe_hessian_queries(oracle, v, x0, step)
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
    checked = verify_heads(
        oracle,
        MultiHead(Ws, vs),
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a sum of heads in mutually orthogonal subspaces, each cyclic with W^(h) != 0 "
        "(the assumptions of learn_orthogonal_heads)",
    )
    return heads_result(oracle, start, Ws, vs, verification=checked, message=message, diagnostics=diagnostics)
