"""The heads' stage on all outputs jointly: shared poles, amplitude vectors (this book's own construction).

A query of ``n`` copies of ``u = x + delta`` followed by ``m`` copies of ``x`` (the query token last)
is answered, less the one-token answer ``o([x])`` (affine in ``x``, known from ``d + 1`` queries), by

    G(r) = sum_h phi(r, p_h) Gamma_h,   phi(r, p) = r / (r + p),   r = n / m,

with ``p_h = exp(-delta^T W~_h[:d, :] x~)`` and ``Gamma_h = M_h[:, :d] delta`` in ``R^{d_out}``: every
output shares the poles ``p_h``, and the amplitude vectors ``Gamma_h`` depend on the row ``delta`` only.
Within a row the answers of every token span the same ``H``-dimensional row space
``span(Gamma_h)``; projected onto it, ``Z_k = G_k V = Phi(p_k) C`` with one ``H x H`` matrix ``C`` for
the whole row. The stage:

1. per row, the row space ``V`` from the SVD of all its tokens' answers (its rank is ``H``);
2. per token, the poles from a Loewner pencil (two interleaved halves of the ``2 H`` ratios), and
   ``C_k`` from them by least squares; the heads matched across tokens by their rows of ``C_k``
   (amplitude vectors, far apart), ``C`` their median. Where no token's pencil gives ``H`` real positive
   poles (float32's rounding, ``H = 8`` poles within a decade), each column of ``C^{-1}`` is fitted over all
   the row's tokens at once instead (:func:`_start_C_columns`: ``Z_k b`` is one pole's ``phi`` at every token);
3. alternating least squares: the poles of every token from ``Z_k C^{-1}`` (one pole per column, a
   linear fit, well conditioned even for a pole outside the ratios' window), then ``C`` from all
   tokens at once;
4. the shifts ``-log p`` of each head are linear in ``x~``: the row ``W~_h[:d, :]^T delta`` by weighted
   least squares over the row's tokens;
5. rows linked to row 0 by pairs at ``delta_0 + delta_i``: their answers are a combination of the
   ``H^2`` terms that the candidate matches (head ``h`` of row 0, ``g`` of row ``i``) predict, with
   coefficient 1 on the matched ones and 0 elsewhere (least squares, then an assignment problem).

Nothing here inverts a scalar rational interpolant: no step loses a digit per head.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lstsq
from scipy.optimize import linear_sum_assignment

from ..errors import NotIdentifiableError, OracleInconsistentError

__all__ = ["JOINT_FROM", "JOINT_RANK_TOL", "joint_plan", "learn_heads_joint"]

#: ``learn_attention_layer(heads="auto")`` runs this joint stage from this many heads (H given, no LayerNorm,
#: float64 answers, ``d_out >= H``); below it the readout route (one scalar readout).
JOINT_FROM = 3

#: The row space's rank: singular values above this fraction of the largest count (exact float64 answers:
#: the (H + 1)-th is at rounding, below 1e-13 of the largest, measured).
JOINT_RANK_TOL = 1e-9

#: Token scale of the heads' stage: tokens N(0, TOKEN_SCALE^2 I / d), rows delta of norm 1.
TOKEN_SCALE = 2.0

#: Extra tokens per row beyond the d + 1 that fix a row of W~_h[:d, :].
EXTRA_TOKENS = 24

#: Starting log-poles are clipped to [-LOGP_START, LOGP_START] (a pole estimated at 0 or infinity has no gradient).
LOGP_START = 20.0

#: A token's Loewner poles start the row when each is within this fraction of the real axis (their real parts are
#: used). Measured: 0.05 let near-real spurious poles start Keras float64 H = 8 rows (d = 8, 16) that then misfit.
START_IMAG = 1e-6

#: Largest change of a log-pole in one step of a token's fit (its misfit is flat far outside the window).
LOG_STEP = 3.0

#: The column start (:func:`_start_C_columns`, when no token's pencil starts the row) keeps log-poles within
#: +-COLUMN_LOGP (a pole at e^8, about 3000, has phi at most 5.3e-3 in H = 8's window of ratios, 1/16 to 16; the
#: fit's trivial minimum, a column 0 with every pole at infinity, stays out of reach).
COLUMN_LOGP = 8.0

#: Two fitted columns of ``C^{-1}`` whose ``phi`` values (over the row's tokens and ratios) differ by less than
#: this (root mean square) are one head. Measured (2026-12-04, Keras 3 MultiHeadAttention in float32, d = 8,
#: H = 8, key_dim 2, seeds 0 to 2, every row): two heads' ``phi`` differ by 0.035 or more, the fits that end at one
#: head by 3.2e-3 or less (1e-2 is about their geometric mean); the first spurious minimum's misfit is 195 times
#: the worst head's or more. (The columns themselves are not compared: two heads' lay within 4% of their norm.)
COLUMN_DISTINCT = 1e-2

#: Tokens of a row in its joint fit of C and their log-poles (the rest get their poles from C).
LM_TOKENS = 24

#: Link tokens per row (pairs at delta_0 + delta_i).
LINK_TOKENS = 2


def _ratios(H: int):
    """``(n, m)`` of the ``2 H`` ratios ``r = n / m``, ``n + m = 2 H + 1`` (from ``1 / 2H`` to ``2 H``)."""
    n = np.arange(1, 2 * H + 1)
    return n, 2 * H + 1 - n


def joint_plan(d: int, H: int, link_tokens: int = LINK_TOKENS) -> int:
    """The queries of :func:`learn_heads_joint` (its one-token queries are the caller's)."""
    n_tok = d + 1 + EXTRA_TOKENS
    return 2 * H * (d * n_tok + (d - 1) * link_tokens)


def _pair_queries(delta, X, H):
    """Queries of ``n`` copies of ``x + delta`` and ``m`` of ``x``: ``(len(X) * 2H, 2H + 1, d)``, token-major."""
    n, m = _ratios(H)
    L = 2 * H + 1
    K, d = X.shape
    first = np.arange(L)[None, :] < n[:, None]  # (2H, L): the first n positions hold u
    Q = X[:, None, None, :] + first[None, :, :, None] * delta[None, None, None, :]  # (K, 2H, L, d)
    return Q.reshape(K * 2 * H, L, d)


def _loewner_poles(Z, r):
    """Per token, the ``H`` poles of ``Z(r) = sum_h phi(r, p_h) C_h`` from a Loewner pencil: ``(K, H)`` complex."""
    K, R, H = Z.shape
    f = Z / r[None, :, None]  # sum_h C_h / (r + p_h)
    mu, la = np.arange(0, R, 2), np.arange(1, R, 2)
    dm = r[mu][:, None] - r[la][None, :]
    fm, fl = f[:, mu, None, :], f[:, None, la, :]  # (K, H, 1, H), (K, 1, H, H)
    L = (fm - fl) / dm[None, :, :, None]
    Ls = (r[mu][None, :, None, None] * fm - r[la][None, None, :, None] * fl) / dm[None, :, :, None]
    # stack the H coordinates: (K, H * H, H) pencils Ls x = lambda L x, lambda = -p
    Lst = L.transpose(0, 3, 1, 2).reshape(K, H * len(mu), len(la))
    Lsst = Ls.transpose(0, 3, 1, 2).reshape(K, H * len(mu), len(la))
    return -np.linalg.eigvals(np.linalg.pinv(Lst) @ Lsst)


def _phi(r, p):
    """``phi(r, p) = r / (r + p)``: ``(..., R, H)`` for ``p`` of shape ``(..., H)``."""
    return r[:, None] / (r[:, None] + p[..., None, :])


def _poles_given_C(Z, Cinv, r):
    """Each token's poles with ``C`` fixed: column ``h`` of ``Z_k C^{-1}`` is ``phi(r, p_kh)``; ``(K, H)``, weights."""
    Phi = Z @ Cinv  # (K, R, H)
    # (r + p) phi = r  ->  p phi = r (1 - phi): a linear least-squares fit of p per column
    num = np.einsum("krh,r->kh", Phi * (1.0 - Phi), r)
    den = np.einsum("krh,krh->kh", Phi, Phi)
    p = num / np.maximum(den, np.finfo(float).tiny)
    p = np.maximum(p, np.finfo(float).tiny)
    # the sensitivity of phi to log p (d phi / d log p = -r p / (r + p)^2): a shift's weight
    sens = np.sqrt(np.sum((r[None, :, None] * p[:, None, :] / (r[None, :, None] + p[:, None, :]) ** 2) ** 2, axis=1))
    return p, sens


def _row(oracle, delta, X, o1, H, r, rank_tol=JOINT_RANK_TOL):
    """One row: its answers, row space, ``C`` (ALS), the poles per token, the amplitude vectors ``Gamma``."""
    K = X.shape[0]
    G = oracle(_pair_queries(delta, X, H)).reshape(K, 2 * H, -1) - o1(X)[:, None, :]
    # the row space from the SVD of the stack (the Gram matrix's eigenvectors, cheaper, left Keras float64 H = 8
    # rows (d = 16) without a start: measured)
    # the singular values and right vectors of the stack are those of its triangular factor (backward stable;
    # the stack's left vectors are never formed)
    _, s, Vt = np.linalg.svd(np.linalg.qr(G.reshape(K * 2 * H, -1), mode="r"))
    if s[0] == 0.0:
        return G, s, 0, None, None
    rank = int(np.sum(s > rank_tol * s[0]))
    V = Vt[:H].T
    Z = G @ V  # (K, 2H, H)
    return G, s, rank, V, Z


def _start_C(Z, r, H):
    """``C`` from the tokens' Loewner poles: heads matched across tokens by their amplitude rows, medians."""
    P = _loewner_poles(Z, r)
    good = np.all(np.abs(P.imag) <= START_IMAG * np.abs(P), axis=1) & np.all(P.real > 0, axis=1)
    if not np.any(good):
        return None
    Phi = _phi(r, P[good].real)  # (K', R, H)
    Cs = np.linalg.pinv(Phi) @ Z[good]
    conds = np.linalg.cond(Phi)
    order = np.argsort(conds)
    ref = Cs[order[0]]
    aligned = []
    for j in order[: max(1, len(order) // 2)]:  # the better-conditioned half of the tokens
        cost = np.linalg.norm(ref[:, None, :] - Cs[j][None, :, :], axis=2)
        _, perm = linear_sum_assignment(cost)
        aligned.append(Cs[j][perm])
    return np.median(np.stack(aligned), axis=0)


def _column_poles(Y, r, logp=None, steps=20):
    """Per start and token the log-pole of the one-pole fit ``Y ~ phi(r, p)`` (Newton in ``log p``, within
    ``+-COLUMN_LOGP``); ``Y`` of shape ``(S, K, R)``, returns ``(S, K)``."""
    if logp is None:  # the linear estimate: (r + p) phi = r
        num = np.einsum("skr,r->sk", Y * (1.0 - Y), r)
        den = np.einsum("skr,skr->sk", Y, Y)
        logp = np.log(np.clip(num / np.maximum(den, np.finfo(float).tiny), np.exp(-COLUMN_LOGP), np.exp(COLUMN_LOGP)))
    for _ in range(steps):
        p = np.exp(logp)[..., None]
        a = -r * p / (r + p) ** 2  # d phi / d log p
        e = Y - r / (r + p)
        step = np.sum(a * e, -1) / (np.sum(a * a, -1) + np.finfo(float).tiny)
        logp = np.clip(logp + np.clip(step, -2.0, 2.0), -COLUMN_LOGP, COLUMN_LOGP)
    return logp


def _column_misfits(Z, B, logp, r):
    Y = np.einsum("krh,sh->skr", Z, B)
    return np.sum((Y - r / (r + np.exp(logp)[..., None])) ** 2, axis=(1, 2))


def _fit_columns(Z, B, r, iters=30):
    """Each start ``b`` (a row of ``B``, shape ``(S, H)``) fitted so that ``Z_k b`` is one pole's
    ``phi(r, p_k)`` at every token ``k`` at once: Levenberg-Marquardt on ``b`` with the tokens' log-poles
    eliminated (variable projection: per token the Jacobian's pole column projected out, the poles refitted
    after each step). Returns ``(B, rms misfit per start)``."""
    S = B.shape[0]
    K, R, H = Z.shape
    ZZ = np.einsum("krh,krg->hg", Z, Z)
    logp = _column_poles(np.einsum("krh,sh->skr", Z, B), r)
    cur = _column_misfits(Z, B, logp, r)
    lam = np.full(S, 1e-4)
    for _ in range(iters):
        p = np.exp(logp)[..., None]
        a = -r * p / (r + p) ** 2  # (S, K, R)
        e = np.einsum("krh,sh->skr", Z, B) - r / (r + p)
        aa = np.sum(a * a, -1) + np.finfo(float).tiny
        aZ = np.einsum("skr,krh->skh", a, Z) / np.sqrt(aa)[..., None]
        N = ZZ[None] - np.einsum("skh,skg->shg", aZ, aZ)  # sum_k Z_k^T (I - a a^T / a^T a) Z_k
        g = np.einsum("krh,skr->sh", Z, e) - np.einsum("skh,sk->sh", aZ, np.sum(a * e, -1) / np.sqrt(aa))
        diag = np.einsum("shh->sh", N)
        for _ in range(6):
            A = N + (lam[:, None] * diag + np.finfo(float).tiny)[:, :, None] * np.eye(H)[None]
            Bn = B - np.linalg.solve(A, g[..., None])[..., 0]
            lpn = _column_poles(np.einsum("krh,sh->skr", Z, Bn), r, logp, steps=6)
            new = _column_misfits(Z, Bn, lpn, r)
            ok = new < cur
            B, logp = np.where(ok[:, None], Bn, B), np.where(ok[:, None], lpn, logp)
            cur, lam = np.where(ok, new, cur), np.where(ok, lam / 10.0, lam * 10.0)
            if np.all(ok):
                break
    return B, np.sqrt(cur / (K * R))


def _start_C_columns(Z, r, H):
    """``C`` from the columns of ``C^{-1}``, each fitted on all the row's tokens at once (:func:`_fit_columns`).

    Column ``h`` of ``C^{-1}`` turns every token's ``Z_k`` into one pole's ``phi(r, p_kh)``: ``C`` is shared by
    the tokens, so each column is fitted on all of them (``H`` unknowns from ``K R`` numbers), where a token's
    own pencil resolves ``H`` close poles from ``2 H`` numbers only. Started from the columns of every token's
    pencil (however wrong its poles), the fits end at the ``H`` columns or at distinct spurious minima; the
    ``H`` best distinct ones (``COLUMN_DISTINCT``) give ``C``. None if fewer than ``H`` are distinct.
    """
    P = np.abs(_loewner_poles(Z, r).real) + np.finfo(float).eps  # the tokens' poles, real and positive
    finite = np.all(np.isfinite(P), axis=1)
    Cs = np.linalg.pinv(_phi(r, P[finite])) @ Z[finite]  # (K', H, H)
    B = np.linalg.pinv(Cs).transpose(0, 2, 1).reshape(-1, H)  # every token's columns of C_k^{-1}, as rows
    B = B[np.all(np.isfinite(B), axis=1)]
    B, mis = _fit_columns(Z, B, r)
    Y = np.einsum("krh,sh->skr", Z, B).reshape(len(B), -1)  # each fit's phi values: a head's, if it is one
    chosen: list[int] = []
    for j in np.argsort(mis):
        if all(np.sqrt(np.mean((Y[j] - Y[k]) ** 2)) > COLUMN_DISTINCT for k in chosen):
            chosen.append(int(j))
        if len(chosen) == H:
            return np.linalg.inv(B[chosen].T)
    return None


def _token_misfits(Z, C, r, logp):
    return np.sum((Z - _phi(r, np.exp(logp)) @ C) ** 2, axis=(1, 2))


def _poles_gn(Z, C, r, logp, steps=16):
    """Levenberg-Marquardt on each token's log-poles with ``C`` fixed (batched over tokens; a step is taken
    only where it lowers that token's misfit): the least squares of ``Z_k``."""
    K, R, H = Z.shape
    lam = np.full(K, 1e-6)
    cur = _token_misfits(Z, C, r, logp)
    for _ in range(steps):
        p = np.exp(logp)
        Phi = _phi(r, p)  # (K, R, H)
        psi = r[None, :, None] * p[:, None, :] / (r[None, :, None] + p[:, None, :]) ** 2  # -d Phi / d log p
        E = Z - Phi @ C  # (K, R, H)
        # J[k, (r, j), h] = -psi[k, r, h] C[h, j]; normal equations (J^T J + lam diag) step = -J^T e
        JtJ = (psi.transpose(0, 2, 1) @ psi) * (C @ C.T)[None]
        Jte = -np.sum(psi * (E @ C.T), axis=1)
        diag = np.einsum("khh->kh", JtJ)
        for _ in range(8):
            A = JtJ + (lam[:, None] * diag + np.finfo(float).tiny)[:, :, None] * np.eye(H)[None]
            step = np.clip(np.linalg.solve(A, Jte[..., None])[..., 0], -LOG_STEP, LOG_STEP)  # a trust region
            new = np.clip(logp - step, -40.0, 40.0)
            mis = _token_misfits(Z, C, r, new)
            ok = mis < cur
            moved = float(np.max(np.abs(np.where(ok[:, None], step, 0.0))))
            logp = np.where(ok[:, None], new, logp)
            cur = np.where(ok, mis, cur)
            lam = np.where(ok, lam / 10.0, lam * 10.0)
            if np.all(ok):
                break
        if not np.any(ok) or moved < 1e-12:  # converged: no token moves its poles by more than rounding
            break
    return logp


def _joint_lm(Z, C, r, logp, iters=30):
    """Levenberg-Marquardt on ``C`` and every token's log-poles together (the poles' blocks eliminated by their
    Schur complement: an ``H^2`` system per step). Alternating alone stalls near 1e-6 (measured, d = 16, H = 8)."""
    K, R, H = Z.shape
    I = np.eye(H)

    def total(C, logp):
        return float(np.sum((Z - _phi(r, np.exp(logp)) @ C) ** 2))

    cur, lam = total(C, logp), 1e-8
    for _ in range(iters):
        p = np.exp(logp)
        Phi = _phi(r, p)
        psi = r[None, :, None] * p[:, None, :] / (r[None, :, None] + p[:, None, :]) ** 2
        E = Z - Phi @ C
        A = (psi.transpose(0, 2, 1) @ psi) * (C @ C.T)[None]  # (K, H, H)
        PsiPhi = psi.transpose(0, 2, 1) @ Phi  # (K, H, H): psi^T Phi
        B = -PsiPhi[:, :, :, None] * C[None, :, None, :]  # (K, h, g, j): d/d logp_h against C[g, j]
        B = B.reshape(K, H, H * H)
        gp = -np.sum(psi * (E @ C.T), axis=1)
        gC = (Phi.reshape(-1, H).T @ E.reshape(-1, H)).reshape(H * H)
        FtF = Phi.reshape(-1, H).T @ Phi.reshape(-1, H)
        Jc = np.kron(FtF, I)  # over (g, j), (g', j')
        dA = np.einsum("khh->kh", A)
        dC = np.diag(Jc).copy()
        for _ in range(10):
            # Marquardt's damping, with a floor: a pole far outside the window has almost no gradient
            Ad = A + (lam * dA + 1e-12 * dA.max(axis=1, keepdims=True) + np.finfo(float).tiny)[:, :, None] * I[None]
            AiB = np.linalg.solve(Ad, B)  # (K, H, H^2)
            Aig = np.linalg.solve(Ad, gp[..., None])[..., 0]
            S = Jc + lam * np.diag(dC) - B.reshape(K * H, H * H).T @ AiB.reshape(K * H, H * H)
            rhs = gC - B.reshape(K * H, H * H).T @ Aig.reshape(K * H)
            try:
                step_C = np.linalg.solve(S, rhs)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            step_p = Aig - AiB @ step_C
            C_new, lp_new = C + step_C.reshape(H, H), np.clip(logp + step_p, -40.0, 40.0)
            new = total(C_new, lp_new)
            if new < cur:
                gain = cur / max(new, np.finfo(float).tiny)
                C, logp, cur, lam = C_new, lp_new, new, lam / 10.0
                break
            lam *= 10.0
        else:
            break
        if gain < 1.0 + 1e-3:
            break
    return C, logp


def _als(Z, C, r):
    """The row's fit from its start: log-poles per token with ``C`` fixed, then all jointly (:func:`_joint_lm`).

    Returns ``(C, poles, weights, misfit, tokens used)``.
    """
    logp = None
    for _ in range(4):
        # a pole far outside the ratios' window is read from 1 - phi (or phi) near C's error: started from the
        # linear estimate (clipped into reach) and from where it stands, the token keeps the better fit; each
        # joint fit lowers C's error, and with it the linear estimate's
        p, _ = _poles_given_C(Z, np.linalg.inv(C), r)
        fresh = _poles_gn(Z, C, r, np.clip(np.log(p), -LOGP_START, LOGP_START))
        if logp is not None:
            kept = _poles_gn(Z, C, r, logp)
            better = _token_misfits(Z, C, r, kept) < _token_misfits(Z, C, r, fresh)
            fresh = np.where(better[:, None], kept, fresh)
        logp = fresh
        # a token whose poles are stuck (a pole far outside the window, started wrong) would pull C off: only
        # tokens within 100 times the median misfit count, here and in the fit of C
        mis = _token_misfits(Z, C, r, logp)
        use = np.flatnonzero(mis <= 100.0 * np.median(mis))
        if np.sqrt(np.sum(mis[use]) / np.sum(Z[use] ** 2)) <= 1e-13:
            break
        # C (H^2 numbers) needs few tokens: the joint fit runs on the LM_TOKENS whose worst-determined pole is the
        # best determined (a pole inside the ratios' window); the next pass gives every token its poles from C
        p = np.exp(logp[use])
        worst = np.min(np.sum((r[None, :, None] * p[:, None, :] / (r[None, :, None] + p[:, None, :]) ** 2) ** 2, 1), 1)
        sel = use[np.argsort(-worst)[:LM_TOKENS]]
        C, _ = _joint_lm(Z[sel], C, r, logp[sel])
    p = np.exp(logp)
    sens = np.sqrt(np.sum((r[None, :, None] * p[:, None, :] / (r[None, :, None] + p[:, None, :]) ** 2) ** 2, axis=1))
    sens = sens * np.linalg.norm(C, axis=1)[None, :]
    # the misfit of the tokens the joint fit used; the others (a pole so far out that its head's term is at
    # rounding) get no weight in the shifts' fit
    mis = _token_misfits(Z, C, r, logp)
    use = mis <= 100.0 * np.median(mis)
    sens = np.where(use[:, None], sens, 0.0)
    misfit = float(np.sqrt(np.sum(mis[use]) / np.sum(Z[use] ** 2)))
    return C, p, sens, misfit, int(np.sum(use))


def learn_heads_joint(
    oracle, o1, H, rng, *, tol=1e-9, rank_tol=JOINT_RANK_TOL, scale=TOKEN_SCALE, link_tokens=LINK_TOKENS
):
    """The heads' ``W~_h`` (shape ``(H, d + 1, d + 1)``, last rows 0) from the vector answers jointly.

    ``o1(X)`` is the one-token answer at each token of ``X`` (shape ``(K, d)`` to ``(K, d_out)``); each row is
    linked to row 0 through ``link_tokens`` tokens (``joint_plan(d, H, link_tokens)`` queries in all).
    Returns ``(Ws, info)``. Raises :class:`NotIdentifiableError` when the answers show no head and
    :class:`OracleInconsistentError` (with the numbers) when a row's rank is not ``H`` or its fit misfits.
    """
    d = int(oracle.d)
    n_tok = d + 1 + EXTRA_TOKENS
    r = (lambda nm: nm[0] / nm[1])(_ratios(H))
    D = np.linalg.qr(rng.standard_normal((d, d)))[0]  # rows delta_i: an orthonormal basis
    X = rng.standard_normal((n_tok, d)) * (scale / np.sqrt(d))
    Xt = np.concatenate([X, np.ones((n_tok, 1))], axis=1)
    rows, gammas, misfits = [], [], []
    for i in range(d):
        G, s, rank, V, Z = _row(oracle, D[i], X, o1, H, r, rank_tol)
        if s[0] == 0.0:
            raise NotIdentifiableError("the answers of a pair of tokens do not depend on the ratio: no head")
        if rank != H:
            raise OracleInconsistentError(
                f"row {i}: the answers of its {n_tok} tokens span a row space of rank {rank}, not H = {H} "
                f"(singular values {', '.join(f'{v / s[0]:.1e}' for v in s[: H + 2])} of the largest; rank counted "
                f"above {rank_tol:.1e} of the largest)"
            )
        C = _start_C(Z, r, H)
        if C is None:  # no token's pencil resolves the H poles (float32, H = 8): the columns of C^{-1} from all
            C = _start_C_columns(Z, r, H)
            if C is None:
                raise OracleInconsistentError(
                    f"row {i}: no token's Loewner pencil gave {H} real positive poles, and the fits of C^{{-1}}'s "
                    f"columns over the row's {n_tok} tokens found fewer than {H} distinct ones"
                )
        C, p, sens, misfit, n_used = _als(Z, C, r)
        misfits.append(misfit)
        if not misfit <= tol or n_used < d + 1 + EXTRA_TOKENS // 2:
            raise OracleInconsistentError(
                f"row {i}: the joint fit of {H} heads over {n_used} of its {n_tok} tokens (shared poles, amplitude "
                f"vectors) misfits by {misfit:.2e} relative (tol={tol:g}; at least {d + 1 + EXTRA_TOKENS // 2} "
                "tokens needed)"
            )
        w = sens / np.max(sens, axis=0, keepdims=True)
        shifts = -np.log(p)  # (K, H): delta_i^T W~_h[:d, :] x~_k
        # per head a weighted least squares over the tokens (normal equations, batched over heads: Xt is well
        # conditioned, N(0, scale^2 I / d) tokens and a column of ones)
        Aw = np.einsum("kh,ka,kb->hab", w * w, Xt, Xt)
        R = np.linalg.solve(Aw, np.einsum("kh,ka->ha", w * w * shifts, Xt)[..., None])[..., 0]
        rows.append(R)  # (H, d + 1)
        gammas.append(C @ V.T)  # (H, d_out): Gamma_h(delta_i)
    # link each row to row 0: a pair at delta_0 + delta_i at token x answers sum_h phi(p) (Gamma_h(0) + Gamma_h(i))
    # with shifts s_h(0) + s_h(i); every candidate (h of row 0, g of row i) predicts one such term from the rows
    # found, and the answers are a least-squares combination of the H^2 candidates with coefficient 1 on the H
    # matched ones and 0 elsewhere (the row spaces alone cannot link heads whose M_h has rank 1: measured, d = 8,
    # H = 5, head_dim 1)
    XL = rng.standard_normal((link_tokens, d)) * (scale / np.sqrt(d))
    XLt = np.concatenate([XL, np.ones((link_tokens, 1))], axis=1)
    link_err = 0.0
    for i in range(1, d):
        GL = oracle(_pair_queries(D[0] + D[i], XL, H)).reshape(link_tokens, 2 * H, -1) - o1(XL)[:, None, :]
        shifts = (XLt @ rows[0].T)[:, :, None] + (XLt @ rows[i].T)[:, None, :]  # (L, h, g)
        Phi = r[None, :, None, None] / (r[None, :, None, None] + np.exp(-shifts)[:, None, :, :])  # (L, K, h, g)
        amp = gammas[0][:, None, :] + gammas[i][None, :, :]  # (h, g, d_out)
        design = np.einsum("lkhg,hgo->lkohg", Phi, amp).reshape(-1, H * H)
        coef = lstsq(design, GL.reshape(-1), lapack_driver="gelsy")[0].reshape(H, H)  # QR with pivoting
        _, perm = linear_sum_assignment(np.abs(coef - 1.0))
        off = coef.copy()
        off[np.arange(H), perm] -= 1.0
        link_err = max(link_err, float(np.abs(off).max()))
        rows[i], gammas[i] = rows[i][perm], gammas[i][perm]
    if not link_err <= np.sqrt(tol):
        raise OracleInconsistentError(f"the rows could not be linked (largest link misfit {link_err:.2e})")
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = np.einsum("ia,ihb->hab", D, np.stack(rows))
    info = {"joint_max_row_misfit": float(max(misfits)), "joint_link_misfit": link_err, "joint_tokens": n_tok}
    return Ws, info
