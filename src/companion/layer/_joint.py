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

from ..errors import BudgetExceededError, NotIdentifiableError, OracleInconsistentError

__all__ = [
    "JOINT_FROM",
    "JOINT_RANK_TOL",
    "JOINT_SCALE_STEPS",
    "JOINT_SEPARATION",
    "LINK_SWAP_RATIO",
    "LINK_RETRIES",
    "joint_plan",
    "joint_separation",
    "learn_heads_joint",
    "scale_plan",
]

#: ``learn_attention_layer(heads="auto")`` runs this joint stage from this many heads (H given, no LayerNorm,
#: float64 answers, ``d_out >= H``); below it the readout route (one scalar readout).
JOINT_FROM = 3

#: The row space's rank: singular values above this fraction of the largest count (exact float64 answers:
#: the (H + 1)-th is at rounding, below 1e-13 of the largest, measured).
JOINT_RANK_TOL = 1e-9

#: Token scale of the heads' stage: tokens N(0, TOKEN_SCALE^2 I / d), rows delta of norm 1.
TOKEN_SCALE = 2.0

#: The joint stage doubles its token scale (:func:`_token_scale`) while its first row's two closest heads' shifts
#: differ by less than this (rms over the tokens). Measured (2026-12-04, MiniLM layer 0 on its true weights, all
#: 384 rows): the closest pair differs by 0.011 or more (median 0.016) at token scale 2, TOKEN_SCALE; 0.021 (0.030)
#: at 4; 0.041 (0.058) at 8; 0.080 (0.112) at 16, where the 99th percentile of |shift| is at most 1.56 (the tokens'
#: part of the shifts grows with the scale, the biases' part does not). With
#: the norms from the row space (answers to about 3e-14), the row whose closest heads differed by 0.014 had one
#: head that none of its 768 column starts reached (misfit 1.6e-3): the run stopped there.
JOINT_SEPARATION = 0.1

#: At most this many token scales are tried (TOKEN_SCALE times 1, 2, 4, ..., 2^(JOINT_SCALE_STEPS - 1)).
JOINT_SCALE_STEPS = 5

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
#: this (root mean square) are one head, whatever their misfits. Measured (2026-12-04, Keras 3 MultiHeadAttention
#: in float32, d = 8, H = 8, key_dim 2, seeds 0 to 2, every row): two heads' ``phi`` differ by 0.035 or more, the
#: fits that end at one head by 3.2e-3 or less (1e-2 is about their geometric mean); the first spurious minimum's
#: misfit is 195 times the worst head's or more. (The columns themselves are not compared: two heads' lay within
#: 4% of their norm.)
COLUMN_DISTINCT = 1e-2

#: ... and two fits are one head only if their ``phi`` values differ by at most COLUMN_SAME times the larger
#: misfit (rms): fits at float64's rounding tell heads apart far closer than COLUMN_DISTINCT. Measured (2026-12-04,
#: MiniLM layer 0, d = 384, H = 12, one row at the joint stage's token scale, 32 tokens, 768 fits at 2e-15 or
#: below): fits of one head differ by 3.2e-12 or less, of two heads by 3.2e-3 or more (twelve heads whose
#: log-poles span 0.23: with COLUMN_DISTINCT alone only 3 were distinct and the row had no start). 1e5 times
#: 2e-15 is 2e-10, between the two.
COLUMN_SAME = 1e5

#: A fit of a column stops at this rms misfit (its ``phi`` values are at most 1): float64's rounding.
COLUMN_FLOOR = 2e-15

#: The column start takes its starts from this many tokens' pencils at a time (``H`` starts each), until it has
#: ``H`` distinct heads. Measured (2026-12-04, MiniLM, three token scales): all twelve heads appeared among the
#: starts of the first 10 to 15 tokens; every start of 64 tokens took 1.9 s a row, 8 tokens' about a quarter.
COLUMN_START_TOKENS = 8

#: The column start stops taking starts when its ``H`` best distinct fits' misfits lie within this factor.
#: Measured (2026-12-04, MiniLM, one row): the first 8 tokens' starts gave eleven heads at 3.0e-16 to 1.7e-15 and,
#: twelfth, a spurious minimum at 2.1e-4; with all 64 tokens' starts the twelfth head came at 1.4e-15. (Float32
#: Keras: the first spurious minimum is 195 times the worst head's misfit or more, COLUMN_DISTINCT's measurement.)
#: Not a guarantee: MiniLM's block computed in float32 had a row (9) whose spurious twelfth fit lay 99.4 times above
#: its best head's misfit (13 times its worst's); a row that then misfits is restarted without the early stop
#: (:func:`_restarted`).
COLUMN_SPREAD = 100.0

#: The column start (:func:`_start_C_columns`) uses at most this many of a row's tokens, to start (every token's
#: pencil, H starts each) and to fit: with all of MiniLM's 409 (d = 384, H = 12: 4,908 starts over 409 tokens) a
#: row's start took minutes, and rows there need it. 64 tokens give 1,536 numbers for the H unknowns of a column;
#: the joint stage's rows below d = 40 have fewer tokens (d + 25), so there nothing changes.
COLUMN_TOKENS = 64

#: Tokens of a row in its joint fit of C and their log-poles (the rest get their poles from C).
LM_TOKENS = 24

#: A row's joint fit stops when its relative misfit (on its LM_TOKENS tokens) is at most this: float64's rounding.
#: Measured (2026-12-04, session 39, d = 64, H = 8, the bench row's 64 rows, started at 5.5e-10 to 8.0e-9 relative
#: misfit): one step reaches 5.1e-16 to 9.3e-16, thirty 5.0e-16 to 8.7e-16 (the last 29 steps, and each row's 10
#: refused dampings that ended them, were most of the fit's time).
LM_FLOOR = 2e-15

#: A token whose relative misfit is at most this counts in its row's fit whatever the row's median (100 times the
#: median misfit, squared, is the rule above it): at rounding level the tokens' misfits spread by more than that.
#: Measured (2026-12-04, a d = 32, H = 2 residual post-LN block at eps 1e-12, seed 1, its norms from the row
#: space): relative misfits 3.2e-15 to 7.8e-13 in one row, median 4.1e-14, and 13 of 57 tokens were dropped
#: without the floor (the row then had fewer than the d + 13 it needs). Far below the rows' tol, 1e-9.
USE_FLOOR = 1e-11

#: Link tokens per row (pairs at delta_0 + delta_i).
LINK_TOKENS = 2

#: A row whose link coefficients miss a permutation by more than the link's tolerance (``sqrt(tol)``) is linked
#: all the same when the permutation's own terms (coefficients one) fit its pair answers within that tolerance
#: (relative) and every transposition of the permutation fits them at least this many times worse (this book's own
#: rule, ``_joint._link``): then the answers tell the permutation from each of its neighbours, which is what a link
#: needs, while the coefficients' least squares is ill-conditioned along swaps of heads whose shifts lie close (the
#: amplitudes of the candidate terms are additive, ``Gamma_h(0) + Gamma_g(i)``, so two swapped pairs' terms differ
#: only through their shifts). Measured (2026-12-05, MiniLM layer 0 computed in float32, learner seed 0, the rows
#: of its joint stage captured before the links, FLOAT32_LINK_TOKENS): all 383 links chose the permutation of the
#: true heads (each row's heads labelled by the nearest true head), 63 of them with coefficients 0.032 to 0.134
#: from it (the run stopped there, ``data/results/minilm_block_float32_bda7623.json``, before this rule); the
#: permutations fitted the pair answers to 4.3e-4 to 1.8e-3 and their best transposition at least 7.3 times worse
#: (median 18).
LINK_SWAP_RATIO = 3.0

#: Rows a row that cannot be linked to row 0 tries to link through instead, the rows just before it, already linked
#: (this book's own rule): a pair at ``delta_j + delta_i`` ties row ``i``'s heads to row ``j``'s, which are in row
#: 0's order, through terms other than row 0's, where two of row ``i``'s heads whose terms with row 0's lie close can
#: lie apart; each link is judged by the same rule (``sqrt(tol)``, ``LINK_SWAP_RATIO``), and each try asks ``2 H``
#: new pair queries, at ``delta_j + delta_i``, at each link token (none where the budget has fewer left). Measured
#: (2026-12-06, MiniLM layer 0 served in float32, learner seed 0, two BLAS threads, commit 161c582): 296 rows linked
#: to row 0, 295 of them by their fit (one by its coefficients), the smallest ratio of a transposition's fit to the
#: permutation's 3.73 among those, and row 297 was refused at 2.96 (fit 5.1e-3, its best transposition 1.5e-2;
#: data/results/minilm_block_float32_161c582.json). Reproduced on rows 0 and 294 to 297 alone (the same queries;
#: data/results/minilm_block_float32_link297.json): through row 296 the ratio is 2.15, through row 295 3.21,
#: linked; the three links chose one permutation, that of the true heads.
LINK_RETRIES = 3


def _ratios(H: int):
    """``(n, m)`` of the ``2 H`` ratios ``r = n / m``, ``n + m = 2 H + 1`` (from ``1 / 2H`` to ``2 H``)."""
    n = np.arange(1, 2 * H + 1)
    return n, 2 * H + 1 - n


def joint_plan(d: int, H: int, link_tokens: int = LINK_TOKENS) -> int:
    """The number of queries the joint heads' stage asks (its one-token queries are the caller's).

    Parameters
    ----------
    d : int
        Token dimension (the block reads ``(N, d)`` queries).
    H : int
        Number of heads.
    link_tokens : int, default=LINK_TOKENS
        Tokens per linking row (``FLOAT32_LINK_TOKENS`` on the float32 route).

    Returns
    -------
    int
        ``2 H (d (d + 1 + EXTRA_TOKENS) + (d - 1) link_tokens)``: ``d`` rows of ``d + 1 + EXTRA_TOKENS`` tokens
        and ``d - 1`` links of ``link_tokens``, each asked at the ``2 H`` ratios ``n / m`` of queries
        ``2 H + 1`` tokens long (this book's own design, module docstring). No query is asked.
    """
    n_tok = d + 1 + EXTRA_TOKENS
    return 2 * H * (d * n_tok + (d - 1) * link_tokens)


def scale_plan(d: int, H: int, scales: int = JOINT_SCALE_STEPS) -> int:
    """The queries the token scale's doublings may add to :func:`joint_plan`: at most ``scales - 1`` rows of
    ``2 H (d + 1 + EXTRA_TOKENS)`` (:func:`_token_scale`; each doubling asks the first row again). A plan that
    reserves them is never short, whichever scale the answers choose. No query is asked."""
    return (scales - 1) * 2 * H * (d + 1 + EXTRA_TOKENS)


def _pair_queries(delta, X, H, out=None):
    """Queries of ``n`` copies of ``x + delta`` and ``m`` of ``x``: ``(len(X) * 2H, 2H + 1, d)``, token-major.

    Written into ``out`` (of that shape) when given: the rows' batches reuse one buffer, as the oracle keeps no
    reference to a batch (it hands a reading-only target the batch itself, any other a copy, and records copies).
    Each ratio's two blocks are copied whole: at MiniLM's size (409 tokens, H = 12: 754 MB a row) 0.13 s a row,
    against 0.20 s for one broadcast sum ``x + first * delta`` (measured 2026-12-07, one BLAS thread; the same
    batch, bit for bit)."""
    n, m = _ratios(H)
    L = 2 * H + 1
    K, d = X.shape
    if out is None:
        out = np.empty((K * 2 * H, L, d))
    blocks, u = out.reshape(K, 2 * H, L, d), X + delta
    for j, nj in enumerate(n):  # ratio j: its first n_j positions hold u = x + delta, the others x
        blocks[:, j, :nj] = u[:, None, :]
        blocks[:, j, nj:] = X[:, None, :]
    return out


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
    # the pencil's least-squares reduction Lst^+ Lsst by QR (cheaper than pinv's SVD: Lst has full column rank where
    # the token has H distinct poles); pinv where a triangular factor is singular
    with np.errstate(all="ignore"):
        try:
            Q, R = np.linalg.qr(Lst)
            M = np.linalg.solve(R, np.swapaxes(Q, 1, 2) @ Lsst)
        except np.linalg.LinAlgError:
            M = np.full(Lsst.shape[:1] + (len(la), len(la)), np.nan)
    if not np.all(np.isfinite(M)):
        M = np.linalg.pinv(Lst) @ Lsst
    return -np.linalg.eigvals(M)


def _phi(r, p):
    """``phi(r, p) = r / (r + p)``: ``(..., R, H)`` for ``p`` of shape ``(..., H)``."""
    return r[:, None] / (r[:, None] + p[..., None, :])


def _linear_poles(Y, r):
    """The linear estimate of one pole per column: ``Y`` of shape ``(..., R)`` fitted by ``phi(r, p)`` through
    ``(r + p) phi = r``, i.e. ``p phi = r (1 - phi)`` by least squares in ``p``; returns ``(...)`` (may be 0 or
    negative where ``Y`` is no ``phi``: the callers clip)."""
    num = np.sum(Y * (1.0 - Y) * r, axis=-1)
    den = np.sum(Y * Y, axis=-1)
    return num / np.maximum(den, np.finfo(float).tiny)


def _poles_given_C(Z, Cinv, r):
    """Each token's poles with ``C`` fixed: column ``h`` of ``Z_k C^{-1}`` is ``phi(r, p_kh)``.

    ``Z`` of shape ``(..., K, R, H)``, ``Cinv`` ``(..., H, H)``; returns ``(..., K, H)``, at least the smallest
    positive float."""
    Phi = Z @ Cinv[..., None, :, :]  # (..., K, R, H)
    return np.maximum(_linear_poles(np.swapaxes(Phi, -1, -2), r), np.finfo(float).tiny)


def _row(oracle, delta, X, o1, H, r, rank_tol=JOINT_RANK_TOL, out=None):
    """One row: its answers, their singular values, rank, row space ``V`` and projections ``Z = G V``.

    ``out``: a buffer for the row's queries (:func:`_pair_queries`)."""
    K = X.shape[0]
    G = oracle(_pair_queries(delta, X, H, out)).reshape(K, 2 * H, -1) - o1(X)[:, None, :]
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
    """``C`` from the tokens' Loewner poles (one row, ``Z`` of shape ``(K, R, H)``; :func:`_start_Cs`), or None."""
    C = _start_Cs(Z[None], r, H)[0]
    return None if np.isnan(C[0, 0]) else C


def _start_Cs(Z, r, H):
    """Per row ``C`` from its tokens' Loewner poles: heads matched across tokens by their amplitude rows, medians.

    ``Z`` of shape ``(B, K, R, H)`` (``B`` rows); returns ``(B, H, H)``, NaN for a row where no token's pencil gives
    ``H`` real positive poles. The pencils (in passes of ``2**17 // H**3`` tokens), pseudo-inverses and condition
    numbers of all rows batched."""
    B, K, R, _ = Z.shape
    flat = Z.reshape(B * K, R, H)
    # tokens per pass: each pencil holds about 12 H^3 floats, in arrays of H^3 a token; a pass whose arrays hold
    # 2**17 floats (1 MB) each stays in cache and reuses its memory (the same poles, bit for bit: each token's
    # pencil is its own). Measured (2026-12-07, one BLAS thread): 5,696 tokens at H = 8 from 171 to 142 ms (256 a
    # pass, against all at once), 8,000 at H = 12 from 680 to 475 ms (75 a pass, against 8,000); all of MiniLM's
    # 157,000 at once had taken about 15 GB
    step = max(1, 2**17 // H**3)
    P = np.concatenate([_loewner_poles(flat[a : a + step], r) for a in range(0, B * K, step)]).reshape(B, K, H)
    good = np.all(np.abs(P.imag) <= START_IMAG * np.abs(P), axis=2) & np.all(P.real > 0, axis=2)
    C = np.full((B, H, H), np.nan)
    if not np.any(good):
        return C
    Phi = _phi(r, P[good].real)  # (good tokens of all rows, R, H), row-major
    U, sv, Vt = np.linalg.svd(Phi, full_matrices=False)  # one SVD: the pseudo-inverse and the condition number
    inv = np.where(sv > 1e-15 * sv[:, :1], 1.0 / np.maximum(sv, np.finfo(float).tiny), 0.0)  # pinv's cut-off
    Cs = (np.swapaxes(Vt, 1, 2) * inv[:, None, :]) @ (np.swapaxes(U, 1, 2) @ Z[good])
    conds = sv[:, 0] / sv[:, -1]
    ends = np.cumsum(np.sum(good, axis=1))
    for b in np.flatnonzero(np.any(good, axis=1)):
        rows = slice(ends[b] - np.sum(good[b]), ends[b])
        Cb = Cs[rows]
        order = np.argsort(conds[rows])[: max(1, len(Cb) // 2)]  # the better-conditioned half of the tokens
        cost = np.linalg.norm(Cb[order[0]][None, :, None, :] - Cb[order][:, None, :, :], axis=3)
        aligned = [Cb[j][linear_sum_assignment(c)[1]] for j, c in zip(order, cost)]
        C[b] = np.median(np.stack(aligned), axis=0)
    return C


def _column_poles(Y, r, logp=None, steps=20):
    """Per start and token the log-pole of the one-pole fit ``Y ~ phi(r, p)`` (Newton in ``log p``, within
    ``+-COLUMN_LOGP``); ``Y`` of shape ``(S, K, R)``, returns ``(S, K)``. Each step forms ``1 / (r + p)`` once and
    its sums without temporaries: measured (2026-12-07, one BLAS thread, 96 starts of 64 synthetic tokens at
    H = 12, 20 steps) 29 against 45 ms, the log-poles within 4.4e-16 of the earlier arithmetic's."""
    tiny = np.finfo(float).tiny
    if logp is None:  # the linear estimate (:func:`_linear_poles`), clipped into the window
        logp = np.log(np.clip(_linear_poles(Y, r), np.exp(-COLUMN_LOGP), np.exp(COLUMN_LOGP)))
    for _ in range(steps):
        p = np.exp(logp)[..., None]
        q = 1.0 / (r + p)
        phi = r * q
        b = phi * q
        b *= p  # r p / (r + p)^2 = -d phi / d log p
        e = Y - phi
        step = -np.einsum("...r,...r->...", b, e) / (np.einsum("...r,...r->...", b, b) + tiny)
        logp = np.clip(logp + np.clip(step, -2.0, 2.0), -COLUMN_LOGP, COLUMN_LOGP)
    return logp


def _through(Z, B):
    """``Z_k b_s`` for every start and token: ``(S, K, R)`` from ``Z`` ``(K, R, H)`` and ``B`` ``(S, H)`` (one
    matrix product; ``einsum("krh,sh->skr")``)."""
    K, R, H = Z.shape
    return (B @ Z.reshape(K * R, H).T).reshape(len(B), K, R)


def _column_misfits(Z, B, logp, r):
    e = _through(Z, B) - r / (r + np.exp(logp)[..., None])
    return np.einsum("skr,skr->s", e, e)


def _fit_columns(Z, B, r, iters=30):
    """Each start ``b`` (a row of ``B``, shape ``(S, H)``) fitted so that ``Z_k b`` is one pole's
    ``phi(r, p_k)`` at every token ``k`` at once: Levenberg-Marquardt on ``b`` with the tokens' log-poles
    eliminated (variable projection: per token the Jacobian's pole column projected out, the poles refitted
    after each step). Each start keeps its own damping and stops on its own: when its rms misfit is at
    ``COLUMN_FLOOR``, when no damping lowers it, or when a step gains less than 0.1%. Returns
    ``(B, rms misfit per start)``. Its sums over tokens are matrix products: measured (2026-12-07, one BLAS thread,
    with :func:`_column_poles`' arithmetic) a column start (:func:`_start_C_columns`, every start) on 409 synthetic
    tokens at H = 12 took 1.2 to 1.3 CPU s against 2.0 to 2.3 with ``einsum``, its ``C`` within 4e-11
    (relative) of the earlier arithmetic's."""
    S = B.shape[0]
    K, R, H = Z.shape
    tiny = np.finfo(float).tiny
    Zf = Z.reshape(K * R, H)
    ZZ = Zf.T @ Zf
    B = B.copy()
    logp = _column_poles(_through(Z, B), r)
    cur = _column_misfits(Z, B, logp, r)
    lam = np.full(S, 1e-4)
    active = np.ones(S, dtype=bool)
    for _ in range(iters):
        ia = np.flatnonzero(active & (cur > COLUMN_FLOOR**2 * K * R))
        if not ia.size:
            break
        Ba, la = B[ia], logp[ia]
        p = np.exp(la)[..., None]
        a = -r * p / (r + p) ** 2  # (n, K, R)
        e = _through(Z, Ba) - r / (r + p)
        ae = np.einsum("skr,skr->sk", a, e)
        aa = np.einsum("skr,skr->sk", a, a) + tiny
        aZ = (a.transpose(1, 0, 2) @ Z).transpose(1, 0, 2) / np.sqrt(aa)[..., None]  # (n, K, H)
        N = ZZ[None] - aZ.transpose(0, 2, 1) @ aZ  # sum_k Z_k^T (I - a a^T / a^T a) Z_k
        g = e.reshape(len(ia), K * R) @ Zf - ((ae / np.sqrt(aa))[:, None, :] @ aZ)[:, 0, :]
        diag = np.einsum("shh->sh", N)
        pend, gain = np.arange(len(ia)), np.ones(len(ia))  # the starts still trying a damping, their gains
        for _ in range(6):
            sel = ia[pend]
            A = N[pend] + (lam[sel][:, None] * diag[pend] + tiny)[:, :, None] * np.eye(H)[None]
            Bn = Ba[pend] - np.linalg.solve(A, g[pend][..., None])[..., 0]
            lpn = _column_poles(_through(Z, Bn), r, la[pend], steps=6)
            new = _column_misfits(Z, Bn, lpn, r)
            ok = new < cur[sel]
            acc = sel[ok]
            gain[pend[ok]] = cur[acc] / np.maximum(new[ok], tiny)
            B[acc], logp[acc], cur[acc] = Bn[ok], lpn[ok], new[ok]
            lam[acc] /= 10.0
            lam[sel[~ok]] *= 10.0
            pend = pend[~ok]
            if not pend.size:
                break
        stalled = gain < 1.0 + 1e-3
        stalled[pend] = True
        active[ia[stalled]] = False
    return B, np.sqrt(cur / (K * R))


def _distinct(Y, mis, H):
    """The ``H`` best fits (rows of ``Y``, their ``phi`` values; ``mis`` their misfits) that are distinct heads, by
    misfit; fewer if there are not ``H``. Two fits are one head when their ``phi`` values differ (root mean square)
    by at most ``min(COLUMN_DISTINCT, COLUMN_SAME * the larger misfit)``."""
    chosen: list[int] = []
    for j in np.argsort(mis):
        same = min(COLUMN_DISTINCT, COLUMN_SAME * mis[j])  # mis[j] is the larger: fits are taken by misfit
        if all(np.sqrt(np.mean((Y[j] - Y[k]) ** 2)) > same for k in chosen):
            chosen.append(int(j))
        if len(chosen) == H:
            break
    return chosen


def _start_C_columns(Z, r, H, early=True, first=0):
    """``C`` from the columns of ``C^{-1}``, each fitted on all the row's tokens at once (:func:`_fit_columns`).

    Column ``h`` of ``C^{-1}`` turns every token's ``Z_k`` into one pole's ``phi(r, p_kh)``: ``C`` is shared by
    the tokens, so each column is fitted on all of them (``H`` unknowns from ``K R`` numbers), where a token's
    own pencil resolves ``H`` close poles from ``2 H`` numbers only. Started from the columns of the tokens'
    pencils (however wrong their poles), the fits end at the ``H`` columns or at distinct spurious minima; the
    ``H`` best distinct ones (:func:`_distinct`) give ``C``. None if fewer than ``H`` are distinct. The starts
    come ``COLUMN_START_TOKENS`` tokens' at a time; the start stops early once the ``H`` best distinct fits'
    misfits lie within a factor ``COLUMN_SPREAD`` (a spurious minimum is far above the heads'); with
    ``early=False`` it takes every start of its ``COLUMN_TOKENS`` tokens (:func:`_restarted`), and ``first`` the
    tokens ``first`` to ``first + COLUMN_TOKENS`` (the first ones by default; :func:`_restarted` tries the others).
    """
    Z = Z[first : first + COLUMN_TOKENS]  # a subset of the row's tokens starts and fits the columns (C is the row's)
    Bs, mis, Ys = np.empty((0, H)), np.empty(0), np.empty((0, Z.shape[0] * Z.shape[1]))
    for a in range(0, len(Z), COLUMN_START_TOKENS):
        Za = Z[a : a + COLUMN_START_TOKENS]
        P = np.abs(_loewner_poles(Za, r).real) + np.finfo(float).eps  # the tokens' poles, real and positive
        finite = np.all(np.isfinite(P), axis=1)
        Cs = np.linalg.pinv(_phi(r, P[finite])) @ Za[finite]  # (K', H, H)
        B = np.linalg.pinv(Cs).transpose(0, 2, 1).reshape(-1, H)  # every token's columns of C_k^{-1}, as rows
        B, m = _fit_columns(Z, B[np.all(np.isfinite(B), axis=1)], r)
        Y = _through(Z, B).reshape(len(B), -1)  # each fit's phi values: a head's, if it is one
        Bs, mis, Ys = np.concatenate([Bs, B]), np.concatenate([mis, m]), np.concatenate([Ys, Y])
        chosen = _distinct(Ys, mis, H)
        if early and len(chosen) == H and mis[chosen[-1]] <= COLUMN_SPREAD * mis[chosen[0]]:
            break  # H heads of like misfits: no later start would replace one
    return np.linalg.inv(Bs[chosen].T) if len(chosen) == H else None


def _token_misfits(Z, C, r, logp):
    """Per row and token the squared misfit of ``Z`` (``(B, K, R, H)``) by ``Phi(p) C`` (``C`` of shape
    ``(B, H, H)``, ``logp`` ``(B, K, H)``): ``(B, K)``."""
    return np.sum((Z - _phi(r, np.exp(logp)) @ C[:, None]) ** 2, axis=(2, 3))


def _psi(r, p):
    """``-d phi / d log p = r p / (r + p)^2``: ``(..., R, H)`` for ``p`` of shape ``(..., H)``."""
    return r[:, None] * p[..., None, :] / (r[:, None] + p[..., None, :]) ** 2


def _poles_gn(Z, C, r, logp, steps=16):
    """Levenberg-Marquardt on each token's log-poles with ``C`` fixed (batched over rows and tokens, ``Z`` of shape
    ``(B, K, R, H)``; a step is taken only where it lowers that token's misfit): the least squares of ``Z_k``."""
    H = Z.shape[3]
    Cb = C[:, None]  # (B, 1, H, H)
    CCt = Cb @ np.swapaxes(Cb, 2, 3)
    lam = np.full(Z.shape[:2], 1e-6)
    cur = _token_misfits(Z, C, r, logp)
    for _ in range(steps):
        p = np.exp(logp)
        psi = _psi(r, p)  # (B, K, R, H)
        E = Z - _phi(r, p) @ Cb
        # J[k, (r, j), h] = -psi[k, r, h] C[h, j]; normal equations (J^T J + lam diag) step = -J^T e
        JtJ = (np.swapaxes(psi, 2, 3) @ psi) * CCt
        Jte = -np.sum(psi * (E @ np.swapaxes(Cb, 2, 3)), axis=2)
        diag = np.einsum("bkhh->bkh", JtJ)
        for _ in range(8):
            A = JtJ + (lam[..., None] * diag + np.finfo(float).tiny)[..., None] * np.eye(H)
            step = np.clip(np.linalg.solve(A, Jte[..., None])[..., 0], -LOG_STEP, LOG_STEP)  # a trust region
            new = np.clip(logp - step, -40.0, 40.0)
            mis = _token_misfits(Z, C, r, new)
            ok = mis < cur
            moved = float(np.max(np.abs(np.where(ok[..., None], step, 0.0))))
            logp = np.where(ok[..., None], new, logp)
            cur = np.where(ok, mis, cur)
            lam = np.where(ok, lam / 10.0, lam * 10.0)
            if np.all(ok):
                break
        if not np.any(ok) or moved < 1e-12:  # converged: no token moves its poles by more than rounding
            break
    return logp


def _solve_rows(S, rhs):
    """``S x = rhs`` per row (``(B, n, n)``, ``(B, n)``); a singular row's ``x`` is NaN."""
    try:
        return np.linalg.solve(S, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        x = np.full(rhs.shape, np.nan)
        for b in range(len(S)):
            try:
                x[b] = np.linalg.solve(S[b], rhs[b])
            except np.linalg.LinAlgError:
                pass
        return x


def _pole_schur(Ai, PsiPhi, C):
    """``B^T A^-1 B`` of the joint fit's normal equations, with ``B`` never formed (:func:`_joint_lm`).

    ``Ai`` ``(n, K, H, H)``: each token's inverse (damped) block of its log-poles; ``PsiPhi`` ``(n, K, H, H)``:
    ``psi_k^T Phi_k``; ``C`` ``(n, H, H)``. The cross block ``B_k[h, (g, j)] = -(psi^T Phi)_k[h, g] C[h, j]``
    (``d / d log p_h`` against ``C[g, j]``) gives

        (B^T A^-1 B)[(g, j), (f, l)] = sum_{h, i} W[h, g, i, f] C[h, j] C[i, l],
        W[h, g, i, f] = sum_k (psi^T Phi)_k[h, g] Ai_k[h, i] (psi^T Phi)_k[i, f],

    ``K H^4 + 2 H^5`` products per row where the formed ``B^T (A^-1 B)`` takes ``K H^5`` and a solve with ``H^2``
    right-hand sides. Returns ``(n, H^2, H^2)``, rows and columns ordered ``(g, j)``.
    """
    n, K, H, _ = Ai.shape
    T = (Ai[..., None] * PsiPhi[:, :, None, :, :]).reshape(n, K, H, H * H)  # (n, k, h, (i, f))
    W = np.swapaxes(PsiPhi, 1, 2).transpose(0, 1, 3, 2) @ np.swapaxes(T, 1, 2)  # (n, h, g, (i, f))
    U = W.reshape(n, H, H**3).transpose(0, 2, 1) @ C  # (n, (g, i, f), j)
    U = U.reshape(n, H, H, H, H).transpose(0, 1, 3, 4, 2).reshape(n, H**3, H) @ C  # (n, (g, f, j), l)
    return U.reshape(n, H, H, H, H).transpose(0, 1, 3, 2, 4).reshape(n, H * H, H * H)


def _pole_cross_t(PsiPhi, C, y):
    """``B^T y`` for ``y`` of shape ``(n, K, H)`` (``B`` as in :func:`_pole_schur`, not formed): ``(n, H^2)``."""
    v = np.einsum("nkhg,nkh->nhg", PsiPhi, y)
    return -(np.swapaxes(v, 1, 2) @ C).reshape(len(C), -1)


def _pole_cross(PsiPhi, C, x):
    """``B x`` for ``x`` of shape ``(n, H^2)`` ordered ``(g, j)`` (``B`` as in :func:`_pole_schur`): ``(n, K, H)``."""
    H = C.shape[1]
    return -np.sum(PsiPhi * (C @ np.swapaxes(x.reshape(-1, H, H), 1, 2))[:, None], axis=3)


def _joint_lm(Z, C, r, logp, iters=30):
    """Levenberg-Marquardt on ``C`` and every token's log-poles together, per row (``Z`` of shape ``(B, K, R, H)``,
    the rows batched, each with its own damping and its own stop; the poles' blocks eliminated by their Schur
    complement: an ``H^2`` system per row and step). Alternating alone stalls near 1e-6 (measured, d = 16, H = 8)."""
    B, K, R, H = Z.shape
    I = np.eye(H)
    tiny = np.finfo(float).tiny

    def total(Z, C, logp):
        return np.sum((Z - _phi(r, np.exp(logp)) @ C[:, None]) ** 2, axis=(1, 2, 3))

    C, logp = C.copy(), logp.copy()
    cur, lam = total(Z, C, logp), np.full(B, 1e-8)
    Z2 = np.sum(Z**2, axis=(1, 2, 3))
    active = np.ones(B, dtype=bool)
    for _ in range(iters):
        ia = np.flatnonzero(active)
        if not ia.size:
            break
        Za, Ca, la = Z[ia], C[ia], logp[ia]
        n = len(ia)
        p = np.exp(la)
        Phi, psi = _phi(r, p), _psi(r, p)  # (n, K, R, H)
        E = Za - Phi @ Ca[:, None]
        A = (np.swapaxes(psi, 2, 3) @ psi) * (Ca @ np.swapaxes(Ca, 1, 2))[:, None]  # (n, K, H, H)
        PsiPhi = np.swapaxes(psi, 2, 3) @ Phi  # (n, K, H, H): psi^T Phi
        gp = -np.sum(psi * (E @ np.swapaxes(Ca, 1, 2)[:, None]), axis=2)  # (n, K, H)
        Phif, Ef = Phi.reshape(n, K * R, H), E.reshape(n, K * R, H)
        gC = (np.swapaxes(Phif, 1, 2) @ Ef).reshape(n, H * H)
        FtF = np.swapaxes(Phif, 1, 2) @ Phif
        Jc = (FtF[:, :, None, :, None] * I[None, None, :, None, :]).reshape(n, H * H, H * H)  # kron(FtF, I)
        dA = np.einsum("nkhh->nkh", A)
        dC = np.einsum("nii->ni", Jc)
        floor = 1e-12 * dA.max(axis=2, keepdims=True) + tiny
        pending, gain = np.ones(n, dtype=bool), np.zeros(n)
        for _ in range(10):
            jp = np.flatnonzero(pending)
            if not jp.size:
                break
            lj = lam[ia[jp]]
            # Marquardt's damping, with a floor: a pole far outside the window has almost no gradient
            Ad = A[jp] + (lj[:, None, None] * dA[jp] + floor[jp])[..., None] * I
            # the cross block B (d / d logp against C) is never formed (:func:`_pole_schur`); one inverse of each
            # token's pole block serves its H^2 + 1 right-hand sides
            Ai = np.linalg.inv(Ad)  # (m, K, H, H)
            Aig = (Ai @ gp[jp][..., None])[..., 0]
            PP, Cj = PsiPhi[jp], Ca[jp]
            S = Jc[jp] - _pole_schur(Ai, PP, Cj)
            S[:, np.arange(H * H), np.arange(H * H)] += lj[:, None] * dC[jp]
            rhs = gC[jp] - _pole_cross_t(PP, Cj, Aig)
            step_C = _solve_rows(S, rhs)
            solved = np.all(np.isfinite(step_C), axis=1)
            step_C = np.where(solved[:, None], step_C, 0.0)
            step_p = Aig - (Ai @ _pole_cross(PP, Cj, step_C)[..., None])[..., 0]
            C_new = Ca[jp] + step_C.reshape(-1, H, H)
            lp_new = np.clip(la[jp] + step_p, -40.0, 40.0)
            new = total(Za[jp], C_new, lp_new)
            ok = solved & (new < cur[ia[jp]])
            acc, rows = jp[ok], ia[jp[ok]]
            gain[acc] = cur[rows] / np.maximum(new[ok], tiny)
            C[rows], logp[rows], cur[rows] = C_new[ok], lp_new[ok], new[ok]
            lam[rows] /= 10.0
            lam[ia[jp[~ok]]] *= 10.0
            pending[acc] = False
        # a row stops when no damping lowered its misfit, or when its step gained less than 0.1%
        active[ia[pending | (gain < 1.0 + 1e-3)]] = False
        active &= cur > LM_FLOOR**2 * Z2  # at rounding: no step can lower the misfit but by chance
    return C, logp


def _als(Z, C, r, lm_tokens=LM_TOKENS):
    """The rows' fits from their starts: log-poles per token with ``C`` fixed, then all jointly (:func:`_joint_lm`).

    ``Z`` of shape ``(B, K, R, H)`` (``B`` rows, fitted together in one array pass, each stopping on its own),
    ``C`` ``(B, H, H)``; the joint fits run on ``lm_tokens`` tokens of a row. Returns ``(C, poles (B, K, H),
    weights (B, K, H), misfit (B,), tokens used (B,))``.
    """
    B, K, R, H = Z.shape
    Z2 = np.sum(Z**2, axis=(2, 3))  # (B, K)
    C = C.copy()
    logp = np.zeros((B, K, H))
    act = np.arange(B)  # the rows still fitting
    for it in range(4):
        Za, Ca = Z[act], C[act]
        # a pole far outside the ratios' window is read from 1 - phi (or phi) near C's error: started from the
        # linear estimate (clipped into reach) and from where it stands, the token keeps the better fit; each
        # joint fit lowers C's error, and with it the linear estimate's
        p = _poles_given_C(Za, np.linalg.inv(Ca), r)
        fresh = _poles_gn(Za, Ca, r, np.clip(np.log(p), -LOGP_START, LOGP_START))
        if it:
            kept = _poles_gn(Za, Ca, r, logp[act])
            better = _token_misfits(Za, Ca, r, kept) < _token_misfits(Za, Ca, r, fresh)
            fresh = np.where(better[..., None], kept, fresh)
        logp[act] = fresh
        # a token whose poles are stuck (a pole far outside the window, started wrong) would pull C off: only
        # tokens within 100 times the median misfit count, here and in the fit of C
        mis = _token_misfits(Za, Ca, r, fresh)
        use = mis <= 100.0 * np.median(mis, axis=1, keepdims=True)
        going = np.sqrt(np.sum(mis * use, axis=1) / np.sum(Z2[act] * use, axis=1)) > 1e-13
        act, Za, Ca, fresh, use = act[going], Za[going], Ca[going], fresh[going], use[going]
        if not act.size:
            break
        # C (H^2 numbers) needs few tokens: the joint fit runs on the LM_TOKENS whose worst-determined pole is the
        # best determined (a pole inside the ratios' window); the next pass gives every token its poles from C
        worst = np.where(use, np.min(np.sum(_psi(r, np.exp(fresh)) ** 2, axis=2), axis=2), -np.inf)
        order = np.argsort(-worst, axis=1)
        n_use = np.sum(use, axis=1)
        full = n_use >= lm_tokens
        if np.any(full):
            sel = order[full, :lm_tokens]
            Zs = np.take_along_axis(Za[full], sel[:, :, None, None], axis=1)
            C[act[full]] = _joint_lm(Zs, Ca[full], r, np.take_along_axis(fresh[full], sel[:, :, None], axis=1))[0]
        for j in np.flatnonzero(~full):  # a row with fewer usable tokens: alone
            sel = order[j, : n_use[j]]
            C[act[j]] = _joint_lm(Za[j][None, sel], Ca[j][None], r, fresh[j][None, sel])[0][0]
    p = np.exp(logp)
    sens = np.sqrt(np.sum(_psi(r, p) ** 2, axis=2)) * np.linalg.norm(C, axis=2)[:, None, :]
    # the misfit of the tokens the joint fit used; the others (a pole so far out that its head's term is at
    # rounding) get no weight in the shifts' fit
    mis = _token_misfits(Z, C, r, logp)
    use = (mis <= 100.0 * np.median(mis, axis=1, keepdims=True)) | (mis <= USE_FLOOR**2 * np.sum(Z**2, axis=(2, 3)))
    sens = np.where(use[..., None], sens, 0.0)
    misfit = np.sqrt(np.sum(mis * use, axis=1) / np.sum(Z2 * use, axis=1))
    return C, p, sens, misfit, np.sum(use, axis=1)


def _restarted(Z, r, H, fit, tol, pencil, need=0):
    """The rows' fits (``fit``, :func:`_als`'s tuple for ``Z`` of shape ``(B, K, R, H)``) with each row that fails
    (misfit above ``tol``, or fewer than ``need`` tokens used) fitted again until it passes (this book's own): a row
    within ``tol`` fits ``C`` on every token from its fit; a row above it restarts from the column start
    (:func:`_start_C_columns`), with its early stop if the tokens' pencils started the row (``pencil``, ``(B,)``
    bool), then without (every start of its ``COLUMN_TOKENS`` tokens), then without on each later window of
    ``COLUMN_TOKENS`` tokens, each start's fit refitted on every token if it fails. Each row keeps its best fit;
    rows that pass are not touched, and neither ``tol`` nor ``need`` moves: a restart finds a fit, never a looser
    test. The first row that still fails ends the restarts (the stage refuses
    it: a target outside the class costs one row's restarts, about 1.5 CPU s at MiniLM's size, measured).

    Measured (2026-12-05, the float32 route's settings, the stage's rows at learner seed 0): on random blocks
    rounded to float32 (d = 32 and 64, H = 8, seeds 0 to 2, with and without the residual) the pencils started 0 to
    5 of a stage's rows at local minima (misfits 0.08 to 0.63), where the truth's poles and C fit every row at
    3.8e-8 to 1.1e-7 (no stage of the six at d = 32 passed); restarted, every row fitted at 9.0e-8 to 4.1e-7.
    MiniLM's block computed in float32 (d = 384, H = 12, need 397 of 409 tokens; rows 0 to 60, the truth's poles
    and C at 1.5e-5 to 7.6e-5): 7 rows failed. Rows 9, 29, 49, 56 misfit by 0.031 to 0.12, their column starts
    stopped early at a spurious minimum (row 9: eleven heads at 1.8e-6 to 1.3e-5 and a twelfth fit at 1.76e-4,
    inside COLUMN_SPREAD of the best); without the early stop they fitted at 4.2e-5 to 1.1e-4. Rows 20, 28, 47
    fitted at 1.1e-4 to 1.8e-4 but used 394 to 396 tokens (C on LM_TOKENS tokens left the others at 10 to 20 times
    the median misfit); C on every token: 1.2e-5 to 1.8e-5, all 409 used. The whole run (rows 0 to 383) stopped at
    row 20 before the second rule, and at row 362 with it (the run at ccedba4, in git's history of
    data/results/minilm_block_float32.json): no start of its
    first 64 tokens reached one head, whose column fits them at 1.6e-5; the column start on tokens 64 to 127 found
    all twelve, and the row fitted at 1.7e-4 (403 of 409 tokens used). A target outside the class costs the
    windows' starts too (five more at MiniLM's size; none where a row has at most 2 ``COLUMN_TOKENS`` tokens)."""
    C, p, sens, mis, used = fit
    K = Z.shape[1]

    def fails(m, u):
        return not (m <= tol and u >= need)

    windows = [(False, a) for a in range(COLUMN_TOKENS, K - COLUMN_TOKENS + 1, COLUMN_TOKENS)]

    def refits(i):
        """Row ``i``'s new fits, in order, each computed only when the one before it fails."""
        if mis[i] <= tol:  # within tol, too few tokens used: C on every token, from its fit (C on LM_TOKENS
            yield _als(Z[i][None], C[i][None], r, K)  # tokens follows their rounding)
        # the column start with its early stop (True) or without, on the tokens from ``first``
        for early, first in ([(True, 0)] if pencil[i] else []) + [(False, 0)] + windows:
            Ci = _start_C_columns(Z[i], r, H, early=early, first=first)
            if Ci is not None:
                new = _als(Z[i][None], Ci[None], r)
                yield _als(Z[i][None], new[0], r, K) if fails(new[3][0], new[4][0]) else new

    for i in np.flatnonzero(~(mis <= tol) | (used < need)):
        for new in refits(i):
            if (fails(new[3][0], new[4][0]), new[3][0]) < (fails(mis[i], used[i]), mis[i]):
                C[i], p[i], sens[i], mis[i], used[i] = (a[0] for a in new)
            if not fails(mis[i], used[i]):
                break
        if fails(mis[i], used[i]):  # the stage refuses its first row that still fails: no later row is restarted
            break
    return C, p, sens, mis, used


def _matched(coef):
    """The assignment of ``coef`` (``(H, H)``) to a permutation's indicator, and its largest deviation from it."""
    _, perm = linear_sum_assignment(np.abs(coef - 1.0))
    off = coef.copy()
    off[np.arange(len(coef)), perm] -= 1.0
    return perm, float(np.abs(off).max())


#: The probabilistic rounding bound's multiple (Higham and Mary 2019, "A new approach to probabilistic rounding error
#: analysis", SIAM J. Sci. Comput. 41(5): under their model, roundings independent and of mean zero, an inner
#: product of ``n`` terms carries a relative backward error of at most about ``lambda sqrt(n) u`` with a failure
#: probability at most ``n`` times ``2 exp(-lambda^2 (1 - u)^2 / 2)``) that :func:`link_rounding` takes (this
#: book's choice: at 10, ``n`` times 3.9e-22). Measured (2026-12-07, MiniLM layer 0 served in float32, learner
#: seed 0, its first six links):
#: the normal equations' coefficients within 6.0e-10 of the QR's, their Gram matrix's condition numbers 3.8e7 to
#: 1.0e8, the bound 3.9e-6 to 1.1e-5, the coefficients 0.051 to 0.084 from a permutation (``sqrt(tol)`` = 0.032);
#: the QR and its design took 1.8 to 2.2 CPU s a link here (the other core busy), each link 5 ms without them; at
#: bf4a189, with the QR in each of its 383 links, the float32 links took 425 s outside the oracle.
LINK_ROUNDING_LAMBDA = 10.0


def link_rounding(G, coef, n: int) -> float:
    """How far (largest entry) rounding can move the link coefficients ``coef`` (``(H^2,)``) solved from the normal
    equations of Gram matrix ``G`` (``(H^2, H^2)``), sums of about ``n`` terms, from the exact least squares; the
    design's QR carries no more (this book's bound): ``LINK_ROUNDING_LAMBDA sqrt(n + H^2) kappa(G) u |coef|``, the
    first-order forward error of a linear solve (Higham 2002, *Accuracy and Stability of Numerical Algorithms*, Thm
    7.2) with the backward errors of forming ``G``, the right-hand side and the solve taken at Higham and Mary's
    probabilistic ``lambda sqrt(n) u`` (:data:`LINK_ROUNDING_LAMBDA`) in place of the worst case's ``n u``.
    Infinite where ``G`` is singular to float64."""
    kappa = float(np.linalg.cond(G))
    size = np.sqrt(n + G.shape[0]) * np.finfo(float).eps / 2 * LINK_ROUNDING_LAMBDA
    if not np.isfinite(kappa) or kappa * size >= 0.5:
        return float("inf")
    return float(kappa * size / (1.0 - kappa * size) * np.linalg.norm(coef))


def _link(Phi, amp, GL, tol_link):
    """The heads of row ``i`` matched to row 0's: the least-squares coefficients of the ``H^2`` candidate terms
    ``Phi[l, k, h, g] amp[h, g, :]`` (``Phi`` of shape ``(L, K, H, H)``, ``amp`` ``(H, H, d_out)``) in the answers
    ``GL`` (``(L, K, d_out)``), assigned to a permutation. Returns ``(perm, linked, stats)``: ``stats["coef"]`` is
    the coefficients' largest deviation from the permutation's indicator; where it is above ``tol_link`` also
    ``stats["fit"]``, the permutation's relative residual with coefficients one, and ``stats["swap"]``, its best
    transposition's. ``linked`` is whether the coefficients lie within ``tol_link`` of the permutation or, failing
    that, the fit is within ``tol_link`` and every transposition fits at least ``LINK_SWAP_RATIO`` times worse.

    The normal equations first: the design's Gram matrix is ``(P^T P) * (A A^T)`` (``P``: the ``Phi`` values, ``A``:
    the amplitudes), ``H^2 x H^2`` from products of ``H^2`` columns, without forming the ``L K d_out x H^2``
    design. Where they miss a permutation by more than ``tol_link`` (their rounding is the design's condition number
    squared) the design's own least squares (QR with pivoting) decides, as it always did before (session 38), unless
    they miss it by more than twice :func:`link_rounding` beyond ``tol_link``: both solutions lie within that of the
    exact least squares, so the QR cannot link where they did not, and its ``L K d_out x H^2`` design is not formed."""
    H = Phi.shape[2]
    P, A = Phi.reshape(-1, H * H), amp.reshape(H * H, -1)
    Y = GL.reshape(P.shape[0], -1)
    G = (P.T @ P) * (A @ A.T)
    try:
        coef = np.linalg.solve(G, np.sum(P * (Y @ A.T), axis=0))
        perm, err = _matched(coef.reshape(H, H))
        if err <= tol_link:
            return perm, True, {"coef": err}
        decided = err - tol_link > 2.0 * link_rounding(G, coef, P.shape[0] + A.shape[1])
    except np.linalg.LinAlgError:
        decided = False
    if not decided:  # the normal equations' rounding could hide coefficients within tol_link: the design's own QR
        design = (P[:, None, :] * A.T[None, :, :]).reshape(-1, H * H)  # rows (l, k, o), columns (h, g)
        perm, err = _matched(lstsq(design, Y.reshape(-1), lapack_driver="gelsy")[0].reshape(H, H))  # pivoted QR
        if err <= tol_link:
            return perm, True, {"coef": err}
    # the permutation's own fit against each transposition's: |E - D|^2 = |E|^2 - 2 <E, D> + |D|^2, D the swap's
    # change of terms (coefficients +1, +1, -1, -1), its products from G and E's with every term
    m = np.arange(H) * H + perm  # the matched terms' columns
    E = Y - P[:, m] @ A[m]
    e = np.sum(P * (E @ A.T), axis=0)  # <E, term (h, g)>
    a, b = np.triu_indices(H, 1)
    cols = np.stack([a * H + perm[b], b * H + perm[a], m[a], m[b]], axis=1)  # (pairs, 4)
    c = np.array([1.0, 1.0, -1.0, -1.0])
    DD = np.einsum("i,pij,j->p", c, G[cols[:, :, None], cols[:, None, :]], c)
    norm2, fit2 = float(np.sum(Y**2)), float(np.sum(E**2))
    swap2 = np.maximum(fit2 - 2.0 * (e[cols] @ c) + DD, 0.0)
    fit, swap = np.sqrt(fit2 / norm2), float(np.sqrt(np.min(swap2) / norm2))
    return perm, bool(fit <= tol_link and swap >= LINK_SWAP_RATIO * fit), {"coef": err, "fit": fit, "swap": swap}


def _link_pair(oracle, o1, D, a, b, XL, rows, gammas, r, tol_link):
    """Row ``b``'s heads matched to row ``a``'s (:func:`_link`) from pair queries at ``D[a] + D[b]`` at the tokens
    ``XL`` (shape ``(L, d)``): ``2 H L`` queries. A pair at ``delta_a + delta_b`` answers, at token ``x``, a sum of
    terms with shifts ``s_h(a) + s_g(b)`` and amplitudes ``Gamma_h(a) + Gamma_g(b)`` (both linear in ``delta``)."""
    H, L = len(rows[a]), len(XL)
    XLt = np.concatenate([XL, np.ones((L, 1))], axis=1)
    GL = oracle(_pair_queries(D[a] + D[b], XL, H)).reshape(L, 2 * H, -1) - o1(XL)[:, None, :]
    shifts = (XLt @ rows[a].T)[:, :, None] + (XLt @ rows[b].T)[:, None, :]  # (L, h, g)
    Phi = r[None, :, None, None] / (r[None, :, None, None] + np.exp(-shifts)[:, None, :, :])  # (L, K, h, g)
    amp = gammas[a][:, None, :] + gammas[b][None, :, :]  # (h, g, d_out)
    return _link(Phi, amp, GL, tol_link)


def _linked_through(oracle, o1, D, i, XL, rows, gammas, r, tol_link):
    """Row ``i`` linked through the ``LINK_RETRIES`` rows before it (already in row 0's order): ``(perm, stats, j)``
    of the first that links it, else ``(None, tried, None)``, ``tried`` each try's ``(j, stats)``. Stops where the
    budget has fewer than a try's ``2 H L`` queries left."""
    tried = []
    for j in range(i - 1, max(0, i - 1 - LINK_RETRIES), -1):
        remaining = getattr(oracle, "remaining", None)
        if remaining is not None and remaining < 2 * len(rows[j]) * len(XL):
            break
        try:
            perm, linked, st = _link_pair(oracle, o1, D, j, i, XL, rows, gammas, r, tol_link)
        except BudgetExceededError:  # a budget on the oracle the row-space scaling wraps
            break
        if linked:
            return perm, st, j
        tried.append((j, st))
    return None, tried, None


def _unlinked(i, st, tried, tol_link) -> OracleInconsistentError:
    """The refusal for row ``i``, which linked neither to row 0 (``st``) nor through the rows ``tried``."""

    def told(s):
        return f"coefficients {s['coef']:.2e} off" + (
            f", fit {s['fit']:.2e}, best transposition {s['swap']:.2e}" if "fit" in s else ""
        )

    through = (
        f" Nor through the rows before it (LINK_RETRIES = {LINK_RETRIES}): "
        + "; ".join(f"row {j}: {told(s)}" for j, s in tried)
        + "."
        if tried
        else ""
    )
    return OracleInconsistentError(
        f"row {i} could not be linked to row 0: the coefficients of its pair answers miss a permutation by "
        f"{st['coef']:.2e} (tol {tol_link:.2g}), and with coefficients one the permutation fits them to "
        f"{st['fit']:.2e} relative, its best transposition to {st['swap']:.2e} (a link needs a fit within "
        f"{tol_link:.2g} and every transposition at least LINK_SWAP_RATIO = {LINK_SWAP_RATIO:g} times worse).{through}"
    )


def joint_separation(shifts):
    """How far apart the heads' shifts are, as the joint stage's token scale rule reads them (this book's own).

    Parameters
    ----------
    shifts : ndarray, shape (K, H)
        Per token and head the shift ``delta^T W~_h[:d, :] x~`` of a pair query's row ``delta`` (``-log p``).

    Returns
    -------
    tuple of float
        The closest two heads' shifts' difference, root mean square over the tokens (``inf`` for one head), and
        the 99th percentile of ``|shift|``. :func:`_token_scale` doubles the scale while the first is below
        ``JOINT_SEPARATION`` and twice the second stays within ``log 2H``.
    """
    q99 = float(np.quantile(np.abs(shifts), 0.99))
    if shifts.shape[1] < 2:
        return np.inf, q99
    gaps = np.sqrt(np.mean((shifts[:, :, None] - shifts[:, None, :]) ** 2, axis=0))
    return float(np.min(gaps[np.triu_indices(shifts.shape[1], 1)])), q99


def _token_scale(oracle, delta, X0, o1, H, r, rank_tol, out, scale, tol, scales=JOINT_SCALE_STEPS):
    """The token scale of the joint stage, set from the answers of its first row (this book's own rule).

    Row ``delta``'s tokens ``X0 * scale / sqrt(d)`` are asked and fitted; while the fit fails, or the two closest
    heads' shifts ``delta^T W~_h[:d, :] x~`` differ by less than ``JOINT_SEPARATION`` (rms over the tokens) with
    room for twice the shifts in the ratios' window (99th percentile of ``|shift|`` below half ``log 2H``), the
    scale doubles, at most ``scales - 1`` times (one row's ``2 H K`` queries each): the tokens' part of each
    shift grows with the scale. A rank below ``H`` doubles the scale too: a head's singular value grows with
    the scale, the answers' rounding less (measured on MiniLM's block served in float32, row 0, in u of its
    largest: the 12th 14,319, 28,499, 56,411, 111,533 at scales 2, 4, 8, 16; the 13th 512, 764, 756, 1,631; one BLAS
    thread, data/results/minilm_block_float32_rows_9a28bce.json).
    Returns ``(scale, the row at that scale as :func:`_row` gives it)``; a row that shows no head or a rank above
    ``H``, or the last scale's row, is returned at once, for the caller's checks."""
    d = X0.shape[1]
    for step in range(scales):
        row = _row(oracle, delta, X0 * (scale / np.sqrt(d)), o1, H, r, rank_tol, out=out)
        _, s, rank, _, Z = row
        if s[0] == 0.0 or rank > H or step == scales - 1:
            return scale, row
        if rank < H:  # a head below the rank's threshold at this scale
            scale *= 2.0
            continue
        C = _start_C(Z, r, H)
        pencil = C is not None
        C = _start_C_columns(Z, r, H) if C is None else C
        if C is not None:
            _, p, _, mis, _ = _restarted(Z[None], r, H, _als(Z[None], C[None], r), tol, [pencil])
            sep, q99 = joint_separation(-np.log(p[0]))
            if mis[0] <= tol and (sep >= JOINT_SEPARATION or 2.0 * q99 > np.log(2 * H)):
                return scale, row
        scale *= 2.0
    raise AssertionError("unreachable: the last step returns")


def learn_heads_joint(
    oracle,
    o1,
    H,
    rng,
    *,
    tol=1e-9,
    rank_tol=JOINT_RANK_TOL,
    scale=TOKEN_SCALE,
    link_tokens=LINK_TOKENS,
    scales=JOINT_SCALE_STEPS,
):
    """The heads' ``W~_h`` (shape ``(H, d + 1, d + 1)``, last rows 0) from the vector answers jointly.

    ``o1(X)`` is the one-token answer at each token of ``X`` (shape ``(K, d)`` to ``(K, d_out)``); each row is
    linked to row 0 through ``link_tokens`` tokens (``joint_plan(d, H, link_tokens)`` queries in all, and one row's
    ``2 H (d + 1 + EXTRA_TOKENS)`` more for each doubling of the token scale: :func:`_token_scale` tries up to
    ``scales`` scales from ``scale``; ``info["joint_token_scale"]`` is the one used), or, where that link fails,
    through one of the ``LINK_RETRIES`` rows before it (``2 H link_tokens`` more queries a try, outside the plan;
    ``info["joint_links_through"]`` counts the rows linked so). A row whose fit misfits is
    fitted again from more starts (:func:`_restarted`).
    Returns ``(Ws, info)``; ``info["amplitudes"]`` holds each head's ``M_h[:, :d]`` (shape ``(H, d_out, d)``, in
    the heads' order of ``Ws``) from the rows' amplitude vectors. Raises :class:`NotIdentifiableError` when
    the answers show no head and :class:`OracleInconsistentError` (with the numbers) when a row's rank is not
    ``H`` or its fit misfits.
    """
    d = int(oracle.d)
    n_tok = d + 1 + EXTRA_TOKENS
    r = (lambda nm: nm[0] / nm[1])(_ratios(H))
    D = np.linalg.qr(rng.standard_normal((d, d)))[0]  # rows delta_i: an orthonormal basis
    X0 = rng.standard_normal((n_tok, d))
    # the rows' answers, row by row (a row of rank other than H stops the queries), their batches in one buffer:
    # a fresh 12 MB batch per row (d = 64, H = 8) made the allocator return and re-fault memory, about 1 CPU s of
    # page faults in all (measured, session 39)
    Q = np.empty((n_tok * 2 * H, 2 * H + 1, d))
    scale, first = _token_scale(oracle, D[0], X0, o1, H, r, rank_tol, Q, scale, tol, scales)
    X = X0 * (scale / np.sqrt(d))
    Xt = np.concatenate([X, np.ones((n_tok, 1))], axis=1)
    Zs, Vs = [], []
    for i in range(d):
        _, s, rank, V, Z = first if i == 0 else _row(oracle, D[i], X, o1, H, r, rank_tol, out=Q)
        if s[0] == 0.0:
            raise NotIdentifiableError("the answers of a pair of tokens do not depend on the ratio: no head")
        if rank != H:
            raise OracleInconsistentError(
                f"row {i}: the answers of its {n_tok} tokens span a row space of rank {rank}, not H = {H} "
                f"(singular values {', '.join(f'{v / s[0]:.1e}' for v in s[: H + 2])} of the largest; rank counted "
                f"above {rank_tol:.1e} of the largest)"
            )
        Zs.append(Z)
        Vs.append(V)
    # the d rows are fits of the same shapes: started and fitted in one array pass (batched over rows)
    Z = np.stack(Zs)  # (d, K, R, H)
    C = _start_Cs(Z, r, H)
    pencil = ~np.isnan(C[:, 0, 0])
    for i in np.flatnonzero(~pencil):
        # no token's pencil resolves the H poles (float32, H = 8): the columns of C^{-1} from all tokens
        Ci = _start_C_columns(Z[i], r, H)
        if Ci is None:
            raise OracleInconsistentError(
                f"row {i}: no token's Loewner pencil gave {H} real positive poles, and the fits of C^{{-1}}'s "
                f"columns over the row's {n_tok} tokens found fewer than {H} distinct ones"
            )
        C[i] = Ci
    # a row whose fit misfits is fitted again from more starts (float32's rows, :func:`_restarted`)
    need = d + 1 + EXTRA_TOKENS // 2  # tokens a row's fit must use (the shifts' least squares)
    C, p, sens, misfits, n_used = _restarted(Z, r, H, _als(Z, C, r), tol, pencil, need)
    for i in range(d):
        if not misfits[i] <= tol or n_used[i] < need:
            raise OracleInconsistentError(
                f"row {i}: the joint fit of {H} heads over {n_used[i]} of its {n_tok} tokens (shared poles, "
                f"amplitude vectors) misfits by {misfits[i]:.2e} relative (tol={tol:g}; at least "
                f"{d + 1 + EXTRA_TOKENS // 2} tokens needed)"
            )
    w2 = (sens / np.max(sens, axis=1, keepdims=True)) ** 2  # (d, K, H)
    shifts = -np.log(p)  # (d, K, H): delta_i^T W~_h[:d, :] x~_k
    # per row and head a weighted least squares over the tokens (normal equations, batched over rows and heads:
    # Xt is well conditioned, N(0, scale^2 I / d) tokens and a column of ones)
    XX = (Xt[:, :, None] * Xt[:, None, :]).reshape(n_tok, -1)  # (K, (d + 1)^2)
    R = np.empty((d, H, d + 1))
    step = max(1, 2**24 // (H * (d + 1) ** 2))  # rows per pass: the normal matrices of all d rows at d = 384,
    for a in range(0, d, step):  # H = 12 would take 5.5 GB
        # one product for the pass's rows and heads, (rows H, K) (K, (d + 1)^2): batched over the rows it read XX
        # once a row; the same numbers, in 12.6 CPU s instead of 26.6 at d = 384, H = 12 (measured 2026-12-08, one
        # BLAS thread, random weights)
        w = np.swapaxes(w2[a : a + step], 1, 2)  # (rows, H, K)
        Aw = (w.reshape(-1, n_tok) @ XX).reshape(-1, H, d + 1, d + 1)
        rhs = (w * np.swapaxes(shifts[a : a + step], 1, 2)) @ Xt
        R[a : a + step] = np.linalg.solve(Aw, rhs[..., None])[..., 0]  # (rows, H, d + 1)
    rows = list(R)
    gammas = list(C @ np.swapaxes(np.stack(Vs), 1, 2))  # (H, d_out) each: Gamma_h(delta_i)
    # link each row to row 0: a pair at delta_0 + delta_i at token x answers sum_h phi(p) (Gamma_h(0) + Gamma_h(i))
    # with shifts s_h(0) + s_h(i); every candidate (h of row 0, g of row i) predicts one such term from the rows
    # found, and the answers are a least-squares combination of the H^2 candidates with coefficient 1 on the H
    # matched ones and 0 elsewhere (the row spaces alone cannot link heads whose M_h has rank 1: measured, d = 8,
    # H = 5, head_dim 1)
    XL = rng.standard_normal((link_tokens, d)) * (scale / np.sqrt(d))
    link_err, swapped, through = 0.0, [], 0
    for i in range(1, d):
        perm, linked, st = _link_pair(oracle, o1, D, 0, i, XL, rows, gammas, r, np.sqrt(tol))
        if not linked:  # through the rows before it (LINK_RETRIES); else no later row is asked
            found, got, _ = _linked_through(oracle, o1, D, i, XL, rows, gammas, r, np.sqrt(tol))
            if found is None:
                raise _unlinked(i, st, got, np.sqrt(tol))
            perm, st, through = found, got, through + 1
        link_err = max(link_err, st["coef"])
        if "fit" in st:  # linked by its fit against its transpositions (LINK_SWAP_RATIO)
            swapped.append(st["swap"] / st["fit"])
        rows[i], gammas[i] = rows[i][perm], gammas[i][perm]
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = np.einsum("ia,ihb->hab", D, np.stack(rows))
    info = {"joint_max_row_misfit": float(np.max(misfits)), "joint_link_misfit": link_err, "joint_tokens": n_tok}
    # rows linked by their fit (LINK_SWAP_RATIO), and the smallest ratio of a transposition's fit to theirs
    info.update(joint_links_by_fit=len(swapped), joint_link_swap_ratio=min(swapped, default=float("inf")))
    info["joint_links_through"] = through  # rows linked through a row before them (LINK_RETRIES)
    info["joint_token_scale"] = scale
    # M_h[:, :d] (H, d_out, d) = sum_i Gamma_h(i) delta_i^T (the rows delta_i orthonormal)
    info["amplitudes"] = np.einsum("ia,iho->hoa", D, np.stack(gammas))
    return Ws, info
