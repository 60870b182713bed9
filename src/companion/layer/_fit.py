"""The stages of learn_attention_layer on a layer without LayerNorm: heads, output maps, polish (this book's own)."""

from __future__ import annotations

import warnings

import numpy as np
from scipy.linalg import LinAlgWarning, solve

from ..errors import InvalidInputError
from ..oracles import VectorReadout, unit_roundoff
from ._model import centre, softmax

__all__ = [
    "LSTSQ_GATE",
    "POLISH_MAX_UNKNOWNS",
    "POLISH_SCORE_MARGIN",
    "LiftedReadout",
    "features",
    "fit_outputs",
    "polish",
    "polish_directions",
    "polish_directions_free",
    "polish_free",
    "FREE_POLISH_STEPS",
    "FREE_POLISH_SCALE_POWER",
    "HEAD_RANK_GAP",
    "HEAD_OWN_GAP",
    "POLISH_LN_GAMMA",
    "head_ranks",
    "map_ranks",
    "residual_and_jacobian",
    "group_by_length",
    "polish_row_queries",
]

#: Largest relative residual of the output maps' least squares before the polish; above it the target is refused.
LSTSQ_GATE = 1e-6

#: Largest number of the heads' rows' entries, ``H d (d + 1)``, the joint Gauss-Newton polish takes on (the output
#: maps are eliminated in each step, :func:`polish`); until 2026-12-04 the cap was 2000 on these and the output maps
#: together, which left post-LN blocks at d = 24 and 32, H = 2 unpolished (their heads, from scaled tokens, 1e-3
#: off: refused by the verification). The step's Jacobian holds ``B d_out H d (d + 1)`` floats (``B`` the queries):
#: measured (2026-12-04, one BLAS thread) at d = 32, H = 2 behind a post-LN, heads="readout" (2,112 entries, 359
#: queries), 194 MB a copy, peak RSS 0.73 GB, 21 CPU s for the whole learner; at the cap (d = 34, H = 2) about
#: 260 MB a copy.
POLISH_MAX_UNKNOWNS = 2500

#: The polish's multi-token queries (the least squares' and its own, lengths 2 to ``FIT_MAX_LEN``) carry at least this
#: many times ``d (d + 1)`` score differences (this book's own): a query of ``n`` tokens shows each head's rows
#: ``W~_h[:d, :]`` only through its ``n - 1`` free attention weights, ``H (n - 1)`` numbers for ``H d (d + 1)`` unknowns
#: whatever ``d_out`` is, so below ``sum (n - 1) = d (d + 1)`` the Gauss-Newton step has a null space: it fits its
#: queries to rounding and fresh ones worse than its start. Measured (2026-12-04, random_attention_layer residual
#: pre-LN, d = 32, H = 1, eps 1e-3, seeds 0 to 2, learner seed 0): with the information floor's count alone (195
#: queries, about 780 differences for 992 unknowns) the polish fitted its queries to 3.0e-16 and fresh ones to 1.1e-8 to
#: 1.3e-7 (unpolished 4.0e-8 to 6.6e-7); two were verified (6e-9 on 32 queries, tolerance 1e-8) though 200 fresh queries
#: were off by 1.1e-8 and 1.9e-8. With 587 queries: 4.4e-14 to 1.3e-13. Without LayerNorm at d = 32, H = 1: 6.8e-11 to
#: 2.4e-10, against 9.2e-16 to 1.5e-15.
POLISH_SCORE_MARGIN = 2

#: The longest of the least squares' and the dense polish's multi-token queries (lengths 2 to this; this book's
#: choice). The matrix-free float32 polish asks longer ones (``layer._directions.FREE_POLISH_MAX_LEN``).
FIT_MAX_LEN = 8

#: The dtype of the matrix-free polishes' Jacobian products (:class:`_PolishOperator`; this book's choice): they
#: polish float32 answers, and each Gauss-Newton step's LSMR stops at a relative 1e-3, so float32's products lose
#: nothing the step keeps, while the residual that accepts or rejects each step stays float64's. Measured
#: (2026-12-06, one BLAS thread, a post-LN block rounded to float32, d = 48, H = 12, eps 1e-12, seed 0, learner seed
#: 0): float64 and float32 products gave the same polish (LSMR 36, 38 and 12 iterations against 36, 39 and 12;
#: residual 2.01e-6 to 2.17e-8 both; verified at 1.45 u, 0.60 u from the exact block on 500 fresh queries), the polish
#: in 6.7 CPU s and 4.0 s; the features' memory is halved.
FREE_POLISH_PRODUCTS = np.float32

#: The most Gauss-Newton steps a matrix-free polish takes (each an LSMR solve; this book's choice). Measured
#: (2026-12-06): the blocks of ``layer._float32``'s documentation stop after two or three steps, each gaining less
#: than a factor 1.01 after; MiniLM's block served in float32 took all 8, the last lowering LSMR's linearised residual
#: by a factor 1.03 (data/results/minilm_block_float32_rows.json).
FREE_POLISH_STEPS = 8

#: The matrix-free directions' polish weights each query's residual by ``t^-FREE_POLISH_SCALE_POWER``, ``t`` the
#: query's token scale (``polish_directions_free``'s ``scales``; this book's rule). A change of the heads' rows moves a
#: query's direction by about ``t^2`` times more at token scale ``t``: unweighted, the queries at the largest scales
#: hold nearly all of the heads' rows' weight in the least squares, and LSMR, each step stopped at a relative 1e-3,
#: leaves the heads' error where those few queries barely constrain it. Measured (2026-12-06, this book's proxy of
#: MiniLM's polish, its script and every row in data/results/minilm_polish_diagnosis.json: post-LN residual blocks
#: rounded to float32, heads 0.015 to 0.1 times a random block's, start 3% off per head (one case 6%), queries of
#: lengths 2 to 32 at scales log-uniform from 1 to 16 (one case 8, one 4)): at d = 64, H = 8, powers 0 / 1 / 2 left
#: the heads 1.7e-5 / 1.0e-7 / 3.2e-7 off, the residual 52 / 1.1 / 5.4 times its value at the truth, in 636 / 314 /
#: 182 LSMR iterations. Powers 0 and 1 were compared in eight cases (d = 64, H = 8 with five head sizes, scales and
#: starts; d = 48, H = 12; d = 32 and 24, H = 4): in the seven at scale 8 or 16, power 1 left the heads 15 to 300 times
#: closer in 0.42 to 0.58 times the iterations; at scale 4 both reached the truth's residual (heads 5.1e-7 and 4.6e-7).
#: At MiniLM's size (served in float32; the polish re-run from a recorded run's inputs, the same file) the heads came
#: 14 times closer (median) and the residual to 1.003 times the true block's, yet fresh queries at scale 16 were
#: 40,691 u off: there the unknowns per head limited the heads (factored at their rank, :data:`HEAD_RANK_GAP`, 409 u).
FREE_POLISH_SCALE_POWER = 1

#: The least geometric mean over the heads of their largest gaps ``s_r / s_(r+1)`` (their rows' singular values) at
#: which :func:`head_ranks` factors the heads (this book's choice). A framework's heads share their size ``d_h``, and
#: each head's rows ``W~_h[:d, :] = W_Q~ W_K^T / sqrt(d_h)`` have rank ``d_h`` at most (Section 5's rank-``r`` heads);
#: the matrix-free polish then takes ``r (2 d + 1)`` unknowns a head, not ``d (d + 1)``. Measured (2026-12-06) on
#: the float32 route's heads before MiniLM's polish (2.7% off, median): 10.5, every head's at ``r = 32`` (``d_h``); on a
#: d = 64 head of rank 8 with 3%, 10% and 30% of its norm added as noise: 32, 10 and 3.4.
HEAD_RANK_GAP = 4

#: The least largest gap ``s_r / s_(r+1)`` of every single head for :func:`head_ranks` to factor (this book's choice):
#: below :data:`HEAD_RANK_GAP`, as one head's gap is noisier than the heads' mean. Measured (2026-12-06) on the heads
#: before MiniLM's polish: 3.9 to 34.5; a rank-16 head of a random block at d = 48 shows none up to ``d / 4``.
HEAD_OWN_GAP = 2

#: Whether the matrix-free polish on the answers (``polish_directions_free``'s ``norm``) moves the LayerNorm's
#: ``gamma`` with its ``beta`` (this book's choice: it does not; the row space gives ``gamma`` far closer than ``beta``,
#: 1.3e-7 against 2.2e-5 on MiniLM served in float32). Measured (2026-12-06): polished with ``beta``, ``gamma`` drifts
#: in its shape, not its scale (on MiniLM's block from 1.3e-7 to 1.3e-5 off, the learned block then 178 u off fresh
#: queries at token scale 1; data/results/minilm_polish_diagnosis.json, ``layernorm_rerun``); on the d = 32 proxy of
#: the tests (``_scaled_polish``), from exact to 1.0e-7, the residual 5.1 times the truth's in 492 LSMR iterations,
#: held 1.14 times in 203, the heads and ``beta`` as close (3.7e-8, 9.2e-8). On MiniLM's block, held (the same file,
#: ``gamma_held_rerun``): ``beta`` 2.2e-6 off, the heads 3.3e-6, fresh queries 14 u off at token scale 1 and 59 u at
#: 16, the float64 emulation itself 9.0 u and 7.9 u from the served block there.
POLISH_LN_GAMMA = False


def head_ranks(Ws) -> list[int] | None:
    """Each head's rank, at which the matrix-free polish factors its rows, or None (this book's own).

    On the heads' rows' singular values ``s_1 >= s_2 >= ...`` up to ``k = d // 4`` (above it the factors would save
    less than half the unknowns, and a near-square noise matrix's last singular values are far apart; below
    ``numpy.linalg.matrix_rank``'s tolerance they are zero): a head's rank is the ``k`` of its largest gap
    ``s_k / s_(k+1)``. Every head's gap must be at least ``HEAD_OWN_GAP``, and their geometric mean at least
    ``HEAD_RANK_GAP``; else None, every head unfactored. Each head is factored at its own rank: a factor beyond it
    would start at the noise's size and stall there (its Jacobian is as small; measured 2026-12-06, a d = 24, H = 5
    block of rank-4 heads served in float32, one head factored at 5: verified at 59 u, against 1.04 u at 4).

    ``Ws`` has shape ``(H, d + 1, d + 1)``, the rows ``Ws[:, :d, :]`` read.

    >>> rng = np.random.default_rng(0)
    >>> W = np.zeros((2, 13, 13)); W[:, :12, :] = rng.standard_normal((2, 12, 2)) @ rng.standard_normal((2, 2, 13))
    >>> noise = rng.standard_normal((2, 13, 13))
    >>> head_ranks(W), head_ranks(W + 1e-3 * noise), head_ranks(noise)
    ([2, 2], [2, 2], None)
    """
    d = Ws.shape[1] - 1
    return _block_ranks(Ws[:, :d, :])


def map_ranks(Theta, H: int) -> list[int] | None:
    """Each head's output map's rank, at which the matrix-free polish factors ``Theta``'s head blocks, or None
    (this book's own): :func:`head_ranks`'s rule (largest gaps up to ``min(d, d_out) // 4``, :data:`HEAD_OWN_GAP`,
    :data:`HEAD_RANK_GAP`) on the blocks ``M_h = Theta[h d:(h + 1) d]``, ``(d, d_out)``. A framework's head maps its
    value through ``W_V`` and ``W_O``, so ``M_h = W_V,h^T W_O,h^T`` has rank ``d_h`` at most (the value bias goes to
    the bias row); factored, ``M_h = P_h Q_h^T``, its ``s_h (d + d_out)`` unknowns replace ``d d_out``
    (:class:`_Maps`).

    ``Theta`` has shape ``(H d + d + 1, d_out)``: the head blocks, then the skip's rows and the bias.

    >>> rng = np.random.default_rng(0)
    >>> M = rng.standard_normal((2, 12, 2)) @ rng.standard_normal((2, 2, 12))
    >>> Theta = np.concatenate([M.reshape(24, 12), rng.standard_normal((13, 12))])
    >>> map_ranks(Theta, 2), map_ranks(Theta + 1e-3 * rng.standard_normal(Theta.shape), 2)
    ([2, 2], [2, 2])
    """
    d_out = Theta.shape[1]
    d = (Theta.shape[0] - 1) // (H + 1)
    return _block_ranks(Theta[: H * d].reshape(H, d, d_out))


def _block_ranks(M) -> list[int] | None:
    """:func:`head_ranks`'s rule on blocks ``M`` of shape ``(H, a, b)``: each block's rank at its largest gap of
    singular values up to ``min(a, b) // 4``, or None."""
    top = min(M.shape[1], M.shape[2]) // 4
    if top < 1:
        return None
    s = np.linalg.svd(M, compute_uv=False)[:, : top + 1]
    s = np.maximum(s, np.maximum(s[:, :1] * max(M.shape[1:]) * np.finfo(float).eps, np.finfo(float).tiny))
    logs = np.log(s[:, :-1] / s[:, 1:])  # (H, top)
    gaps = logs.max(axis=1)
    if np.min(gaps) < np.log(HEAD_OWN_GAP) or np.mean(gaps) < np.log(HEAD_RANK_GAP):
        return None
    return [int(k) + 1 for k in np.argmax(logs, axis=1)]


def polish_row_queries(d: int, max_len: int = FIT_MAX_LEN) -> int:
    """Multi-token queries (lengths 2 to ``max_len``, even) whose ``n - 1`` score differences total
    ``POLISH_SCORE_MARGIN d (d + 1)``: ``max_len / 2`` differences a query on average.

    >>> polish_row_queries(32), polish_row_queries(32, max_len=32)
    (528, 132)
    """
    return -(-POLISH_SCORE_MARGIN * d * (d + 1) * 2 // max_len)


class LiftedReadout(VectorReadout):
    """A scalar readout of a layer seen as a bias-free sum of heads in ``D = d + 1`` dimensions.

    A learner's token ``y = (z, t)`` in ``R^(d+1)`` is sent to the layer as
    ``x'_N = z_N / t_N`` for the last token and ``x'_i = x'_N + t_N (z_i - z_N)`` for the others,
    and the answer is ``(c^T o(X') - g(x'_N)) / t_N``, ``g`` the (affine) answer to the one-token
    query. Then every score difference is ``(y_i - y_N)^T W_L y_N`` with ``W_L = W~`` with its
    last row zeroed, and the answer is ``sum_h alpha_h^T (Y - 1 y_N^T) v_h`` with
    ``v_h = (M_h[:, :d]^T c, 0)``: a bias-free sum of heads minus ``y_N^T sum_h v_h``, a term
    the canonical learners remove with their one-token answers, which here are 0 and cost no
    query. This book's own reduction.
    """

    def __init__(self, vector, c, g, g0, precision=None):
        # an exact vector oracle states no precision: its answers are float64's, so the heads' learner
        # is told so (it would otherwise measure the precision of a target outside the class, too);
        # ``precision`` overrides it (the float32 route: answers found on float32's grid)
        u = vector.precision if vector.precision is not None else unit_roundoff("float64")
        u = u if precision is None else max(float(u), float(precision))
        super().__init__(self._lifted, d=vector.d + 1, precision=u)
        self.vector, self.c, self.g, self.g0 = vector, c, g, g0

    def _lifted(self, Y: np.ndarray) -> np.ndarray:
        if Y.shape[1] == 1:
            return np.zeros(Y.shape[0])
        z, t = Y[:, :, :-1], Y[:, :, -1]
        tN = t[:, -1]
        if np.any(tN == 0.0):
            raise InvalidInputError("a lifted query's last token has homogeneous coordinate 0; it has no layer input.")
        xN = z[:, -1, :] / tN[:, None]
        X = xN[:, None, :] + tN[:, None, None] * (z - z[:, -1:, :])
        y = self.vector(X) @ self.c
        return (y - (xN @ self.g + self.g0)) / tN

    def _evaluate(self, X: np.ndarray) -> np.ndarray:
        return self._lifted(X)


def features(Ws, X: np.ndarray) -> np.ndarray:
    """Rows ``[alpha_1^T X, ..., alpha_H^T X, x_N, 1]`` of the layer's linear least squares, ``(B, (H+1) d + 1)``."""
    B, N, d = X.shape
    Xt = np.concatenate([X, np.ones((B, N, 1))], axis=2)
    cols = []
    for W in Ws:
        alpha = softmax(np.einsum("bnk,bk->bn", Xt, Xt[:, -1, :] @ W.T))
        cols.append(np.einsum("bn,bnk->bk", alpha, X))
    cols += [X[:, -1, :], np.ones((B, 1))]
    return np.concatenate(cols, axis=1)


def group_by_length(Xs, Y):
    """``([(B_n, n, d) batches by increasing length n], [their answers])`` of a list of sequences."""
    lengths = sorted({x.shape[0] for x in Xs})
    idx = [[i for i, x in enumerate(Xs) if x.shape[0] == n] for n in lengths]
    return [np.stack([Xs[i] for i in ix]) for ix in idx], [Y[ix] for ix in idx]


def fit_outputs(Ws, batches, answers):
    """One least-squares problem for ``Theta = [M_1 .. M_H, S, b_O]`` over all outputs at once.

    Returns ``(Theta of shape ((H + 1) d + 1, d_out), relative residual, rank, condition)``.
    """
    Phi = np.concatenate([features(Ws, X) for X in batches])
    Y = np.concatenate(answers)
    colscale = np.maximum(np.linalg.norm(Phi, axis=0), np.finfo(float).tiny)
    Theta, _, rank, sv = np.linalg.lstsq(Phi / colscale, Y, rcond=None)
    Theta = Theta / colscale[:, None]
    resid = float(np.linalg.norm(Phi @ Theta - Y) / max(np.linalg.norm(Y), np.finfo(float).tiny))
    cond = float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf")
    full = rank == Phi.shape[1]
    return Theta, resid, full, cond


def residual_and_jacobian(Ws, Theta, Xs, Ys, jac):
    """``(r of shape (B, d_out), J_W of shape (B, d_out, H d (d + 1)) or None, Phi of shape (B, p))`` over the batches.

    ``r = Y - Phi Theta``; ``J_W`` is the derivative of ``Phi Theta`` in the heads' rows ``W~_h[:d, :]``; the
    derivative in ``Theta`` is ``Phi`` for every output, so it is not formed (:func:`polish` eliminates it).
    """
    H, d = Ws.shape[0], Ws.shape[1] - 1
    d_out = Theta.shape[1]
    rs, Js, Phis = [], [], []
    for X, Y in zip(Xs, Ys):
        B = X.shape[0]
        Xt = np.concatenate([X, np.ones(X.shape[:2] + (1,))], axis=2)
        feats, JW = [], []
        for h in range(H):
            alpha = softmax(np.einsum("bnk,bk->bn", Xt, Xt[:, -1, :] @ Ws[h].T))
            xbar = np.einsum("bn,bnk->bk", alpha, Xt)
            feats.append(xbar[:, :d])
            if jac:
                C = np.einsum("bn,bnk,bna->bka", alpha, Xt[:, :, :d] - xbar[:, None, :d], Xt[:, :, :d])
                G = np.einsum("ko,bka->boa", Theta[h * d : (h + 1) * d], C)
                JW.append(np.einsum("boa,bc->boac", G, Xt[:, -1, :]).reshape(B, d_out, d * (d + 1)))
        phi = np.concatenate(feats + [X[:, -1, :], np.ones((B, 1))], axis=1)
        rs.append(Y - phi @ Theta)
        Phis.append(phi)
        if jac:
            Js.append(np.concatenate(JW, axis=2))
    return np.concatenate(rs), (np.concatenate(Js) if jac else None), np.concatenate(Phis)


def polish(Ws, Theta, Xs, Ys, iters=4):
    """Gauss-Newton on the heads' rows and the output maps jointly over the batches ``Xs`` (list of (B, N, d)).

    ``Ys`` are the answers. Not refined: a post-LN's ``gamma``, ``beta``, a pre-LN's ``eps``.

    The unknowns are the identifiable rows ``W~_h[:d, :]`` and ``Theta`` ((H + 1) d + 1, d_out); the
    Jacobian of ``o`` in ``W~_h[a, b]`` is ``M_h sum_j alpha_j (x~_j - xbar) x~_j[a] x~_N[b]``, in ``Theta``
    it is ``Phi`` (the least squares' rows) for each output. Each Gauss-Newton step eliminates ``Theta``
    exactly: the heads' step ``dW`` solves the least squares of ``(I - Q Q^T) J_W`` (``Phi = Q R``, per output)
    against ``r``, then ``dTheta = R^{-1} Q^T (r - J_W dW)``: the same step as the full system's, whose dense
    Jacobian (``d_out`` copies of ``Phi``) is never formed (this book's own; memory ``B d_out H d (d + 1)``
    floats, not ``B d_out (H d (d + 1) + p d_out)``). Returns ``(Ws, Theta, relative residual before, after)``;
    a step that does not lower the residual is not taken.
    """
    from scipy.linalg import solve_triangular

    H, d = Ws.shape[0], Ws.shape[1] - 1
    nW = H * d * (d + 1)
    scale = max(float(np.linalg.norm(np.concatenate([Y.reshape(-1) for Y in Ys]))), np.finfo(float).tiny)
    r, J, Phi = residual_and_jacobian(Ws, Theta, Xs, Ys, True)
    Q, R = np.linalg.qr(Phi)
    first = best = float(np.linalg.norm(r)) / scale
    for it in range(iters):
        # the scaled normal equations: the step corrects an estimate already near 1e-10, and the
        # residual is evaluated exactly, so their squared condition costs nothing that matters
        Jp = (J - np.einsum("bp,pon->bon", Q, np.einsum("bp,bon->pon", Q, J))).reshape(-1, nW)
        rp = (r - Q @ (Q.T @ r)).reshape(-1)
        colscale = np.maximum(np.linalg.norm(Jp, axis=0), np.finfo(float).tiny)
        Js = Jp / colscale
        del Jp
        try:  # ill-conditioned normal equations warn (a new user saw it): the accepted step is judged on the residual
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LinAlgWarning)
                step = solve(Js.T @ Js, Js.T @ rp, assume_a="pos") / colscale
        except (np.linalg.LinAlgError, ValueError):
            step = np.linalg.lstsq(Js, rp, rcond=None)[0] / colscale
        del Js
        dT = solve_triangular(R, Q.T @ (r - np.einsum("bon,n->bo", J, step)))
        W_new = Ws.copy()
        W_new[:, :d, :] += step.reshape(H, d, d + 1)
        T_new = Theta + dT
        r_new, _, Phi_new = residual_and_jacobian(W_new, T_new, Xs, Ys, False)
        res = float(np.linalg.norm(r_new)) / scale
        if not res < best:
            break
        Ws, Theta, r, gain, best = W_new, T_new, r_new, best / res, res
        if gain < 4.0 or it == iters - 1:  # at the rounding floor: another step gains nothing
            break
        Q, R = np.linalg.qr(Phi_new)
        J = residual_and_jacobian(Ws, Theta, Xs, Ys, True)[1]
    return Ws, Theta, first, best


def _off(y, W):
    """``(I - w w^T) y`` per query: ``y`` ``(B, d_out)`` off the unit directions ``W`` ``(B, d_out)``."""
    return y - np.einsum("bo,bo->b", y, W)[:, None] * W


def _direction_residual(Ws, Theta, Xs, What, jac):
    """``(r, J)`` of :func:`polish_directions`: shapes ``(B d_out,)`` and ``(B d_out, H d (d + 1) + p d_out)`` or None.

    ``r_k = (P - w_k w_k^T) u_k / |P u_k|`` for ``u = Phi Theta`` and unit directions ``w_k`` (rows of ``What``);
    ``J`` its derivative with the denominator held fixed (its derivative adds ``O(|r|)``: the Kaufman
    approximation of variable projection)."""
    d_out, p = Theta.shape[1], Theta.shape[0]
    zero = [np.zeros((X.shape[0], d_out)) for X in Xs]
    r, JW, Phi = residual_and_jacobian(Ws, Theta, Xs, zero, jac)
    P = centre(d_out)
    v = -r @ P  # P u (r = -Phi Theta)
    nv = np.linalg.norm(v, axis=1)[:, None]
    res = _off(v, What) / nv
    if not jac:
        return res.reshape(-1), None
    B, nW = JW.shape[0], JW.shape[2]
    J = np.empty((B, d_out, nW + p * d_out))  # filled in place: the Jacobian is the polish's memory
    JW -= JW.mean(axis=1, keepdims=True)  # P J_W
    JW -= What[:, :, None] * np.einsum("bo,bon->bn", What, JW)[:, None, :]
    np.divide(JW, nv[:, :, None], out=J[:, :, :nW])
    del JW
    Proj = (P[None] - What[:, :, None] * What[:, None, :]) / nv[:, :, None]  # (B, d_out, d_out)
    # Theta[q, c] at column q d_out + c
    np.einsum("bq,boc->boqc", Phi, Proj, out=J[:, :, nW:].reshape(B, d_out, p, d_out))
    return res.reshape(-1), J.reshape(-1, J.shape[2])


def polish_directions(Ws, Theta, Xs, directions, iters=8):
    """Gauss-Newton on the heads' rows and ``Theta`` against the directions of a post-LN's answers (this book's own).

    Behind a post-LN whose norms are not read (``companion.layer._directions``) a query's answer gives only the
    direction ``w_k`` of ``P u_k`` (``u = Phi Theta``, ``P`` the centring). The residual
    ``(P - w_k w_k^T) u_k / |P u_k|`` is the part of the predicted ``P u_k`` off that direction, relative: variable
    projection (Golub & Pereyra 1973) of the per-query scales, with Kaufman's (1975) Jacobian. It is invariant to
    scaling ``Theta``, so the steps are minimum-norm least squares (damped by ``1e-12`` of the normal matrix's
    diagonal). ``Xs`` are batches ``(B, N, d)``, ``directions`` their answers' directions ``(B, d_out)``. Dense:
    the Jacobian holds ``B d_out (H d (d + 1) + p d_out)`` floats, ``p = (H + 1) d + 1`` (measured 2026-12-05: the
    learner's peak RSS 1.1 GB at d = 22, H = 4, 4,466 unknowns and 670 queries, 13 CPU s in all). Returns ``(Ws, Theta,
    relative residual before, after)``; a step that does not lower the residual is not taken, and the steps stop
    when one gains less than a factor 1.01.
    """
    H, d = Ws.shape[0], Ws.shape[1] - 1
    nW, d_out, p = H * d * (d + 1), Theta.shape[1], Theta.shape[0]
    What = np.concatenate(directions)
    What = What / np.linalg.norm(What, axis=1, keepdims=True)
    r, J = _direction_residual(Ws, Theta, Xs, What, True)
    first = best = float(np.linalg.norm(r)) / np.sqrt(What.shape[0])
    for _ in range(iters):
        colscale = np.maximum(np.linalg.norm(J, axis=0), np.finfo(float).tiny)
        J /= colscale  # in place: J is formed again at the next step
        A = J.T @ J
        A[np.diag_indices_from(A)] *= 1.0 + 1e-12
        try:
            step = -solve(A, J.T @ r, assume_a="pos") / colscale
        except (np.linalg.LinAlgError, ValueError):
            step = -np.linalg.lstsq(J, r, rcond=None)[0] / colscale
        del J, A
        W_new = Ws.copy()
        W_new[:, :d, :] += step[:nW].reshape(H, d, d + 1)
        T_new = Theta + step[nW:].reshape(p, d_out)
        r_new = _direction_residual(W_new, T_new, Xs, What, False)[0]
        res = float(np.linalg.norm(r_new)) / np.sqrt(What.shape[0])
        if not res < best:
            break
        Ws, Theta, gain, best = W_new, T_new, best / res, res
        if gain < 1.01:
            break
        r, J = _direction_residual(Ws, Theta, Xs, What, True)
    return Ws, Theta, first, best


class _PolishOperator:
    """The Jacobian of a polish's residual as products only (matrix-free; this book's own): of
    :func:`polish_directions`'s (``What`` given) or of :func:`polish`'s on the answers themselves (``Ys`` given).

    Built at ``(Ws, Theta)`` on batches ``Xs`` with unit directions ``What`` or answers ``Ys`` (per batch). With
    ``u = Phi Theta``, ``v = P u`` and ``Proj_k = (I - w_k w_k^T) P``, the directions' residual is
    ``Proj_k u_k / |v_k|``; the answers' is ``u_k - y_k`` (``Proj_k = I``, no ``1 / |v_k|``). A step ``(dW, dTheta)``
    moves ``u_k`` by ``sum_h M_h^T sum_n alpha_n (x_n - xbar_h) x_n^T dW_h x~_N + dTheta^T phi_k`` (``M_h`` the
    rows ``Theta[h d:(h + 1) d]``): each product is a few matrix products of ``O(B (H d (d + 1) + p d_out))``
    flops; the Jacobian's entries (``B d_out`` times as many) are never formed.

    ``weights`` (per batch, ``(B,)``; directions only) multiply each query's residual, and so its row of the Jacobian.
    Built with ``factors = (A, B)`` (:class:`_Factored`'s) its products take and give the heads' factors' step and
    gradient; with ``maps = (P, Q)`` (:class:`_Maps`'s: ``M_h = P_h Q_h^T``), Theta's as ``(dP, dQ, dSb)`` (``dSb`` the
    skip's and bias's rows, whole), ``u_k`` moving by ``sum_h (dxbar_h P_h + xbar_h dP_h) Q_h^T + (xbar_h P_h) dQ_h^T +
    x~_N dSb``: ``B (2 H d s + 2 H s d_out + (d + 1) d_out)`` multiply-adds a product, not ``B p d_out`` (``s`` the
    largest rank). ``ln = (answers, gamma, beta)`` in place of ``What``: the directions ``(y - beta) / gamma`` of the
    answers (per batch), and the LayerNorm's ``gamma`` (unless ``ln_gamma`` is False) and ``beta`` unknowns too
    (``matvec``'s ``dln``, ``rmatvec``'s third block and ``ln_column_norms``, each ``(2, d_out)``, or ``(1, d_out)``:
    ``beta``'s alone, with ``ln_gamma`` False), their Jacobian exact (the unit direction ``w`` moves by ``-(I - w w^T) q
    / |zt|``, ``q = (dbeta + zt dgamma) / gamma``, ``zt = (y - beta) / gamma``). The residual is float64's. The
    products, the column norms and the features they use are in the dtype of ``products`` (the batches cast, once a
    polish; float64's ``Xs`` where None); the Gram matrix is accumulated in float64 whatever the products' dtype.
    """

    def __init__(
        self,
        Ws,
        Theta,
        Xs,
        What=None,
        Ys=None,
        products=None,
        weights=None,
        ln=None,
        ln_gamma=True,
        factors=None,
        maps=None,
    ):
        if ln is not None:  # the directions from the answers and the LayerNorm's (gamma, beta), themselves unknowns
            if What is not None:
                raise ValueError("_PolishOperator takes directions What or the LayerNorm's answers ln, not both")
            answers, self.gamma, self.beta = ln
            self.zt = [(Y - self.beta) / self.gamma for Y in answers]  # (y - beta) / gamma, per batch
            What = [z / np.linalg.norm(z, axis=1, keepdims=True) for z in self.zt]
        self.ln, self.ln_gamma = ln is not None, bool(ln_gamma)
        self.ln_rows = (1 + self.ln_gamma) if self.ln else 0  # the LayerNorm's unknowns: (gamma,) beta; none
        if (What is None) == (Ys is None):
            raise ValueError("_PolishOperator takes directions What or answers Ys, one of them")
        if weights is not None and What is None:
            raise ValueError("_PolishOperator weighs the directions' residual only (weights with What)")
        self.H, self.d = Ws.shape[0], Ws.shape[1] - 1
        self.p, self.d_out = Theta.shape
        products = Xs if products is None else products
        dtype = products[0].dtype if len(products) else np.dtype(float)
        self.Theta, self.M = Theta, Theta[: self.H * self.d].astype(dtype)
        self.batches, self.f, self.vhat = [], [], []
        # the heads' rows factored, W~_h[:d, :] = A_h B_h^T (:class:`_Factored`): a step (dA, dB) moves dW_h x~_N
        # through B_h^T x~_N (kept per batch) and A_h, about 3 d r_h multiply-adds a head and query, not d (d + 1)
        self.factors = None if factors is None else tuple(F.astype(dtype) for F in factors)
        # and the tokens' A_h^T x_n, (B, H, N, r), kept per batch: x_n^T A_h dB_h^T x~_N in N r multiply-adds a head
        # and query, not d r (and the adjoint's A_h^T X^T e_h likewise). Measured (2026-12-08, one BLAS thread, in one
        # process: d = 384, H = 12, heads and maps of rank 32, 28,990 random queries of 2 to 32 tokens, the
        # post-LN's directions): an LSMR iteration's two products 2.56 -> 2.42 CPU s (three each, alternated), the
        # operator's build 3.8-4.3 -> 5.3-5.5 s once warm (one a Gauss-Newton step, about 55 iterations)
        self.xB, self.XA = [], []
        # Theta's head blocks factored, M_h = P_h Q_h^T (:class:`_Maps`): xbar_h P_h kept per batch, (H, B, s), and
        # the tokens' P_h^T x_n, (B, H, N, s): a step moves xbar_h P_h by g_h (X P_h) - (sum g_h) xbar_h P_h, N s
        # multiply-adds a head and query where forming dxbar_h and then dxbar_h P_h took N d + d s (and the adjoint
        # likewise). Measured (2026-12-07, one BLAS thread, in one process: d = 384, H = 12, heads and maps of rank 32,
        # 4,000 random queries of 2 to 32 tokens): an LSMR iteration's two products 0.495 -> 0.321 CPU s, the heads'
        # column norms 6.29 -> 0.95 s
        self.maps = None if maps is None else tuple(F.astype(dtype) for F in maps)
        self.E, self.XP = [], []
        # the residual (float64) through the factors where given: W~_h x~_N = A_h (B_h^T x~_N) (its last entry from
        # Ws' last row) and u = sum_h (xbar_h P_h) Q_h^T + x~_N Sb, O(B H d r) multiply-adds a batch where Ws and
        # Theta whole took O(B H d^2) and O(B H d d_out); the products' B_h^T x~_N and xbar_h P_h are these, cast.
        # The same residual to 1e-15; the build (the same 28,990 queries) 10.9 -> 8.8 CPU s cold
        H, d = self.H, self.d
        if factors is not None:
            A64, Bf64 = factors[0], factors[1].transpose(1, 0, 2).reshape(d + 1, -1)  # B_h side by side
        if maps is not None:
            P64, Qs64 = maps[0], maps[1].transpose(0, 2, 1).reshape(-1, self.d_out)  # Q_h^T stacked
        for i, (X, Xp) in enumerate(zip(Xs, products)):
            B = X.shape[0]
            xN = np.concatenate([X[:, -1, :], np.ones((B, 1))], axis=1)
            if factors is None:
                q = (xN @ Ws.transpose(2, 0, 1).reshape(d + 1, -1)).reshape(B, H, d + 1)  # W~_h x~_N
                sc = q[:, :, :d] @ X.transpose(0, 2, 1) + q[:, :, d:]
            else:
                xB = (xN @ Bf64).reshape(B, H, -1).transpose(1, 0, 2)  # B_h^T x~_N, (H, B, r)
                sc = (xB @ A64.transpose(0, 2, 1)).transpose(1, 0, 2) @ X.transpose(0, 2, 1)
                sc += (xN @ Ws[:, d, :].T)[:, :, None]
                self.xB.append(xB.astype(dtype))
            alpha = softmax(sc)  # (B, H, N)
            phi = np.concatenate([(alpha @ X).reshape(B, H * d), xN], axis=1)  # xbar_h, then x~_N
            if maps is None:
                v = phi @ Theta
            else:
                E = phi[:, : H * d].reshape(B, H, d).transpose(1, 0, 2) @ P64  # xbar_h P_h, (H, B, s)
                v = E.transpose(1, 0, 2).reshape(B, -1) @ Qs64 + xN @ Theta[H * d :]
                self.E.append(E.astype(dtype))
            if What is None:  # the answers: u - y, nothing projected or scaled
                W, nv, r = None, None, v - Ys[i]
            else:
                W = What[i]
                v -= v.mean(axis=1, keepdims=True)
                nv = np.linalg.norm(v, axis=1)
                if weights is not None:  # query k's residual times w_k: its |v_k| over w_k, in every product
                    nv = nv / weights[i]
                r = _off(v, W) / nv[:, None]
                if self.ln:  # w = zt / |zt| moves by -(I - w w^T) q / |zt|, q = (dbeta + zt dgamma) / gamma
                    self.f.append((1.0 if weights is None else weights[i]) / np.linalg.norm(self.zt[i], axis=1))
                    self.vhat.append(v / np.linalg.norm(v, axis=1, keepdims=True))
            xN, alpha, phi = xN.astype(dtype), alpha.astype(dtype), phi.astype(dtype)
            self.batches.append((Xp, xN, alpha, phi, W, nv, r))
            # the tokens' P_h^T x_n and A_h^T x_n, (B, H, N, s) and (B, H, N, r), by one product
            self._token_coordinates(Xp)

    def _token_coordinates(self, X):
        """Append batch ``X``'s (``(B, N, d)``) tokens' coordinates on the maps' ``P_h`` to ``XP`` and on the heads'
        factors ``A_h`` to ``XA``, each ``(B, H, N, rank)`` (where built with them): one matrix product."""
        pairs = [
            (F, out)
            for F, out in ((self.maps and self.maps[0], self.XP), (self.factors and self.factors[0], self.XA))
            if F is not None
        ]
        if not pairs:
            return
        B, N, d = X.shape
        C = X.reshape(B * N, d) @ np.concatenate([F.transpose(1, 0, 2).reshape(d, -1) for F, _ in pairs], axis=1)
        at = 0
        for F, out in pairs:
            H, k = F.shape[0], F.shape[2]
            out.append(np.ascontiguousarray(C[:, at : at + H * k].reshape(B, N, H, k).transpose(0, 2, 1, 3)))
            at += H * k

    def residual(self):
        return np.concatenate([b[-1].reshape(-1) for b in self.batches])

    @staticmethod
    def _proj(y, W, nv):
        """``(I - w w^T) P y / |v|`` per query (``y`` itself on the answers)."""
        if W is None:
            return y
        return _off(y - y.mean(axis=1, keepdims=True), W) / nv[:, None]

    @staticmethod
    def _proj_t(y, W, nv):
        if W is None:
            return y
        y = _off(y, W) / nv[:, None]
        return y - y.mean(axis=1, keepdims=True)

    def matvec(self, dW, dT, dln=None):
        """``J (dW, dTheta)``: ``dW`` of shape ``(H, d, d + 1)`` (or, built with ``factors``, the factors' step
        ``(dA, dB)`` of their shapes: ``dW_h = dA_h B_h^T + A_h dB_h^T``, never formed), ``dT`` ``(p, d_out)`` (or,
        built with ``maps``, ``(dP, dQ, dSb)`` of shapes ``(H, d, s)``, ``(H, d_out, s)``, ``(d + 1, d_out)``:
        ``dM_h = dP_h Q_h^T + P_h dQ_h^T``, never formed) (and with ``ln``, ``dln`` of shape ``(2, d_out)``:
        ``dgamma``, ``dbeta``; ``(1, d_out)``, ``dbeta``, with ``ln_gamma`` False); returns ``(B d_out,)``."""
        H, d, out = self.H, self.d, []
        dtype, factored, mapped = self.M.dtype, isinstance(dW, tuple), isinstance(dT, tuple)
        if factored:  # the factors' step (dA, dB): dW_h x~_N = dA_h B_h^T x~_N + A_h dB_h^T x~_N
            dA, dB = (F.astype(dtype) for F in dW)
            dBf = dB.transpose(1, 0, 2).reshape(d + 1, -1)
        else:
            dWf = dW.reshape(H * d, d + 1).T.astype(dtype)
        if mapped:  # du = sum_h [dxbar_h P_h + xbar_h dP_h, xbar_h P_h] [Q_h, dQ_h]^T + x~_N dSb
            P, Q = self.maps
            dP, dQ, dSb = (F.astype(dtype) for F in dT)
            QQ = np.concatenate([Q, dQ], axis=2).transpose(0, 2, 1).reshape(-1, self.d_out)  # (H 2 s, d_out)
        else:
            dT = dT.astype(dtype)
        for i, (X, xN, alpha, phi, W, nv, _) in enumerate(self.batches):
            B = X.shape[0]
            if factored:  # x_n^T dW_h x~_N = x_n^T dA_h (B_h^T x~_N) + (A_h^T x_n) . (dB_h^T x~_N)
                xdB = (xN @ dBf).reshape(B, H, -1)  # dB_h^T x~_N, (B, H, r)
                a = (self.xB[i] @ dA.transpose(0, 2, 1)).transpose(1, 0, 2)  # dA_h B_h^T x~_N, (B, H, d)
                g = a @ X.transpose(0, 2, 1) + (self.XA[i] @ xdB[:, :, :, None])[:, :, :, 0]
                g *= alpha  # alpha_n x_n^T dW_h x~_N, (B, H, N)
            else:
                g = alpha * ((xN @ dWf).reshape(B, H, d) @ X.transpose(0, 2, 1))  # alpha_n x_n^T dW_h x~_N
            xbar = phi[:, : H * d].reshape(B, H, d)
            if mapped:  # dxbar_h P_h = g_h (X P_h) - (sum g_h) xbar_h P_h, dxbar_h never formed
                c = (g[:, :, None, :] @ self.XP[i])[:, :, 0, :].transpose(1, 0, 2)  # (H, B, s)
                c += xbar.transpose(1, 0, 2) @ dP - g.sum(axis=2).T[:, :, None] * self.E[i]
                du = np.concatenate([c, self.E[i]], axis=2).transpose(1, 0, 2).reshape(B, -1) @ QQ
                du += phi[:, H * d :] @ dSb
            else:
                dxbar = g @ X - g.sum(axis=2)[:, :, None] * xbar
                du = phi @ dT + dxbar.reshape(B, H * d) @ self.M
            r = self._proj(du.astype(float), W, nv)
            if dln is not None:
                # r = w_k (vhat - (vhat . w) w): dr = f ((vhat . a) w + (vhat . w) a), a = (I - w w^T) q
                q = (dln[-1] + self.zt[i] * dln[0] if self.ln_gamma else np.broadcast_to(dln[0], W.shape)) / self.gamma
                a = _off(q, W)
                vh = self.vhat[i]
                r += self.f[i][:, None] * (
                    np.einsum("bo,bo->b", vh, a)[:, None] * W + np.einsum("bo,bo->b", vh, W)[:, None] * a
                )
            out.append(r.reshape(-1))
        return np.concatenate(out)

    def rmatvec(self, y):
        """``J^T y``: ``(dW of shape (H, d, d + 1), dTheta of shape (p, d_out))`` (built with ``factors``, the
        factors' ``(gA, gB) = (gW_h B_h, gW_h^T A_h)`` in place of ``dW``; with ``maps``, ``(gP, gQ, gSb) =
        (gM_h Q_h, gM_h^T P_h, gSb)`` in place of ``dTheta``), and with ``ln`` the ``(2, d_out)`` of ``dgamma``,
        ``dbeta`` third (``(1, d_out)``, ``dbeta``, with ``ln_gamma`` False)."""
        H, d, i = self.H, self.d, 0
        gT, gL = np.zeros((self.p, self.d_out)), np.zeros((self.ln_rows, self.d_out))
        if self.maps is not None:  # Theta's factors' gradient (gP, gQ, gSb): gM never formed
            P, Q = self.maps
            s = P.shape[2]
            Qs = Q.transpose(1, 0, 2).reshape(self.d_out, H * s)  # [Q_1 ... Q_H], (d_out, H s)
            gP, gQ, gSb = np.zeros(P.shape), np.zeros(Q.shape), np.zeros((d + 1, self.d_out))
        if self.factors is None:
            gW = np.zeros((H * d, d + 1))
        else:  # the factors' gradient (gA, gB): gW_h B_h and gW_h^T A_h, gW never formed
            A = self.factors[0]
            gA, gB = np.zeros(A.shape), np.zeros((H, d + 1, A.shape[2]))
        for k, (X, xN, alpha, phi, W, nv, _) in enumerate(self.batches):
            B = X.shape[0]
            yk = y[i : i + B * self.d_out].reshape(B, self.d_out)
            z = self._proj_t(yk, W, nv).astype(self.M.dtype)
            i += B * self.d_out
            xbar = phi[:, : H * d].reshape(B, H, d)
            if self.maps is None:
                gT += phi.T @ z
                m = (z @ self.M.T).reshape(B, H, d)  # M_h z
                e = alpha * (m @ X.transpose(0, 2, 1) - np.einsum("bha,bha->bh", xbar, m)[:, :, None])
            else:
                zQ = (z @ Qs).reshape(B, H, s).transpose(1, 0, 2)  # Q_h^T z, (H, B, s)
                gP += xbar.transpose(1, 2, 0) @ zQ
                gQ += (z.T @ self.E[k].transpose(1, 0, 2).reshape(B, -1)).reshape(-1, H, s).transpose(1, 0, 2)
                gSb += phi[:, H * d :].T @ z
                # (x_n - xbar_h)^T M_h z = (P_h^T x_n - P_h^T xbar_h) . Q_h^T z, M_h z never formed
                xz = (self.XP[k] @ zQ.transpose(1, 0, 2)[:, :, :, None])[:, :, :, 0]  # (B, H, N)
                e = alpha * (xz - np.einsum("hbs,hbs->bh", self.E[k], zQ)[:, :, None])
            if self.factors is None:
                gW += (e @ X).reshape(B, H * d).T @ xN
            else:
                E = (e @ X).transpose(1, 2, 0)  # (H, d, B)
                gA += E @ self.xB[k]
                EA = (e[:, :, None, :] @ self.XA[k])[:, :, 0, :].reshape(B, -1)  # A_h^T E_h per query, (B, H r)
                gB += (xN.T @ EA).reshape(d + 1, H, -1).transpose(1, 0, 2)
            if self.ln:  # the adjoint: q = f (I - w w^T) ((w . y) vhat + (vhat . w) y)
                vh = self.vhat[k]
                t = np.einsum("bo,bo->b", W, yk)[:, None] * vh + np.einsum("bo,bo->b", vh, W)[:, None] * yk
                q = self.f[k][:, None] * _off(t, W)
                gL += np.stack([np.sum(q * self.zt[k], axis=0)] * self.ln_gamma + [np.sum(q, axis=0)]) / self.gamma
        heads = gW.reshape(H, d, d + 1) if self.factors is None else (gA, gB)
        theta = gT if self.maps is None else (gP, gQ, gSb)
        if self.ln:
            return heads, theta, gL
        return heads, theta

    def ln_column_norms(self):
        """``|J e_j|`` over ``(gamma, beta)``, shape ``(2, d_out)`` (``beta``'s alone, ``(1, d_out)``, with
        ``ln_gamma`` False), in closed form."""
        c = np.zeros((self.ln_rows, self.d_out))
        for k, (_, _, _, _, W, _, _) in enumerate(self.batches):
            q = (self.f[k] ** 2)[:, None] * (1.0 - W * W)
            c += np.stack([np.sum(q * self.zt[k] ** 2, axis=0)] * self.ln_gamma + [np.sum(q, axis=0)])
        return np.sqrt(c) / np.abs(self.gamma)

    def column_norms(self):
        """``|J e_j|`` over the heads' rows, shape ``(H, d, d + 1)``, in closed form.

        A head's column ``(a, c)`` is ``x~_N[c] Proj_k Z_hk diag(alpha) X[:, a] / |v_k|`` with
        ``Z_hk[:, n] = M_h^T (x_n - xbar_h)`` (``Proj_k = I``, no ``1 / |v_k|`` on the answers): ``B N d d_out``
        flops per head (``N`` the tokens); with ``maps``, ``Z Z^T = Yp K Yp^T`` from the tokens' ``P_h``
        coordinates ``Yp`` and ``K = Q_c^T Proj_k Q_c`` (``Q_h`` centred over the outputs), ``(s, s)`` a query:
        ``B N (N + s) s``."""
        H, d = self.H, self.d
        cW = np.zeros((H, d, d + 1))
        for i, (X, xN, alpha, phi, W, nv, _) in enumerate(self.batches):
            for h in range(H):
                if self.maps is None:
                    Z = (X - phi[:, None, h * d : (h + 1) * d]) @ self.M[h * d : (h + 1) * d]  # (B, N, d_out)
                    if W is not None:
                        Wp = W.astype(Z.dtype)
                        Z -= Z.mean(axis=2, keepdims=True)
                        Z -= (Z @ Wp[:, :, None]) * Wp[:, None, :]
                    ZZ = Z @ Z.transpose(0, 2, 1)
                else:  # Z = Yp Q_h^T, Yp = (X - xbar_h) P_h: Z Z^T = Yp K Yp^T, K = Q_c^T (I - w w^T) Q_c, (s, s)
                    Yp = self.XP[i][:, h] - self.E[i][h][:, None, :]  # (B, N, s)
                    Qh = self.maps[1][h]
                    if W is None:
                        K = np.broadcast_to(Qh.T @ Qh, (X.shape[0],) + (Qh.shape[1],) * 2)
                    else:  # centred over the outputs, then off each query's direction
                        Qc = Qh - Qh.mean(axis=0)
                        qw = W.astype(Qc.dtype) @ Qc  # (B, s)
                        K = (Qc.T @ Qc)[None] - qw[:, :, None] * qw[:, None, :]
                    ZZ = (Yp @ K) @ Yp.transpose(0, 2, 1)
                Y = alpha[:, h, :, None] * X  # (B, N, d)
                q = np.einsum("bna,bna->ba", ZZ @ Y, Y)
                if W is not None:
                    q /= (nv * nv)[:, None]
                cW[h] += q.T @ (xN * xN)
        return np.sqrt(cW)

    def gram(self):
        """``sum_k phi_k phi_k^T / |v_k|^2``, ``(p, p)``: ``Theta``'s block of the normal matrix is about it
        times ``I - 1 1^T / d_out`` (the directions' rank-one parts aside); on the answers ``Phi^T Phi`` times
        ``I`` exactly."""
        G = np.zeros((self.p, self.p))
        for _, _, _, phi, _, nv, _ in self.batches:
            A = phi.astype(float) if nv is None else phi / nv[:, None]
            G += A.T @ A
        return G

    def gram_blocks(self):
        """:meth:`gram`'s diagonal blocks that :class:`_Maps` uses: each head's ``xbar_h``'s, ``(H, d, d)``, and the
        skip's and bias's features' ``x~_N``, ``(d + 1, d + 1)``; float64, ``B (H d^2 + (d + 1)^2)`` flops."""
        H, d = self.H, self.d
        Gx, Gs = np.zeros((H, d, d)), np.zeros((d + 1, d + 1))
        for _, _, _, phi, _, nv, _ in self.batches:
            A = phi.astype(float) if nv is None else phi / nv[:, None]
            xb = A[:, : H * d].reshape(-1, H, d).transpose(1, 0, 2)
            Gx += xb.transpose(0, 2, 1) @ xb
            Gs += A[:, H * d :].T @ A[:, H * d :]
        return Gx, Gs


def polish_directions_free(
    Ws,
    Theta,
    Xs,
    directions,
    iters=None,
    lsmr_iters=100,
    lsmr_tol=1e-3,
    scales=None,
    rank=None,
    norm=None,
    map_rank=None,
):
    """:func:`polish_directions` matrix-free: each Gauss-Newton step by LSMR (Fong & Saunders 2011,
    ``scipy.sparse.linalg.lsmr``) on :class:`_PolishOperator`'s products (this book's own).

    Preconditioned on the right, once at the start: the heads' rows by their columns' norms, ``Theta`` by the Cholesky
    factor ``L`` of its Gram matrix (:meth:`_PolishOperator.gram`, column-scaled by ``D``): ``dTheta = D^-1 L^-T y``, so
    that its block is near-orthonormal (its columns, the features, are strongly correlated; :class:`_Full`), or, with
    ``map_rank``, its factors by their blocks' own (:class:`_Maps`). Memory ``O(B N H d + B p +
    p^2)`` floats, not ``B d_out`` times the unknowns. Same residual, same acceptance as :func:`polish_directions`; with
    ``scales`` (per batch, ``(B,)``: each query's token scale ``t``) each query's residual is weighted by
    ``t^-FREE_POLISH_SCALE_POWER`` (the reason and the measurements are the constant's) and the residuals returned are
    the weighted one's rms. With ``rank`` (an int, or one per head, as :func:`head_ranks` gives) each head's rows are
    factored at it (:class:`_Factored`), from their best fit of that rank; the start itself is returned if that fit and
    its steps never lower its residual. With ``map_rank`` (one per head, as :func:`map_ranks` gives) Theta's head blocks
    are factored likewise (:class:`_Maps`). Returns ``(Ws, Theta, relative residual before, after, info)``, ``info`` the
    LSMR iterations per step and the ranks (``rank``, ``map_rank``: one per head, or None). With ``norm`` (the
    LayerNorm's ``gamma``, ``beta``; :class:`~companion.layer._norm.PostLN`), ``directions`` are the answers ``y``
    themselves, the directions ``(y - beta) / gamma`` are built from them at each point and ``beta`` is polished with
    the rest, ``gamma`` held unless :data:`POLISH_LN_GAMMA` (``info["gamma"]``, ``info["beta"]``; this book's own: on
    float32 answers the row space's ``beta`` is a few 1e-5 off, and the heads fitted to its directions take its error
    in).

    Each step is inexact, LSMR stopped at ``lsmr_tol`` (its ``atol`` and ``btol``) or ``lsmr_iters``. Measured
    (2026-12-05, the float32 route's polish at d = 32, H = 4 and d = 48, H = 12, against 1,000 fresh queries' exact
    directions): at 1e-6, 155 and 139 iterations in two steps, to 1.49 u and 1.25 u; at 1e-3, 72 and 63, to 1.60 u
    and 1.27 u; at 1e-2, 69 and 58 in six and four steps, to 1.87 u and 1.45 u. A Kronecker-factored (K-FAC-like)
    preconditioner of each head's block took as many iterations as its columns' norms. Nor did a coarse start on
    every fourth query of each batch pay (tried 2026-12-07, MiniLM's first stage served in float32, replayed from the
    9c4371f run's inputs on one BLAS thread): its five steps (450 LSMR iterations, 361 CPU s) gained 2.0 to 2.6 times
    each after the first, against about 5 on all the queries, and left the residual on all of them at 1.8e-5, where
    two steps on all (118 iterations, 454 CPU s) leave 1.4e-5: with 3.75 answers' numbers an unknown the quarter's
    least squares is worse conditioned, and its steps fit its own queries.
    """
    if norm is None:
        data = {"What": [W / np.linalg.norm(W, axis=1, keepdims=True) for W in directions]}
    else:  # directions are the answers themselves: (y - beta) / gamma built at each point, beta polished
        data = {"ln": (directions, np.asarray(norm.gamma, float), np.asarray(norm.beta, float))}
        data["ln_gamma"] = POLISH_LN_GAMMA  # gamma an unknown, or held where the row space put it
    n_queries = sum(W.shape[0] for W in directions)
    if scales is None:
        weights, scale = None, np.sqrt(n_queries)
    else:
        weights = [np.asarray(t, dtype=float) ** -FREE_POLISH_SCALE_POWER for t in scales]
        scale = np.sqrt(sum(float(w @ w) for w in weights))  # the weighted residual's rms
    data = {**data, "weights": weights}
    return _polish_free(Ws, Theta, Xs, data, scale, iters, lsmr_iters, lsmr_tol, rank, map_rank)


def polish_free(Ws, Theta, Xs, Ys, iters=None, lsmr_iters=100, lsmr_tol=1e-3, rank=None, map_rank=None):
    """:func:`polish` matrix-free (this book's own): the answers' residual ``Phi Theta - Y`` (no projection, no
    scaling), by :func:`polish_directions_free`'s LSMR steps, preconditioning and acceptance (a step that does not
    lower the residual is not taken; the steps stop when one gains less than a factor 1.01), on the same
    :class:`_PolishOperator`. Returns ``(Ws, Theta, relative residual before, after, info)``, the residuals
    relative to ``|Y|`` as :func:`polish`'s, ``info`` the LSMR iterations per step; ``rank`` and ``map_rank`` as
    :func:`polish_directions_free`'s."""
    scale = max(float(np.linalg.norm(np.concatenate([Y.reshape(-1) for Y in Ys]))), np.finfo(float).tiny)
    return _polish_free(Ws, Theta, Xs, {"Ys": Ys}, scale, iters, lsmr_iters, lsmr_tol, rank, map_rank)


def _polish_free(Ws, Theta, Xs, data, scale, iters, lsmr_iters, lsmr_tol, rank=None, map_rank=None):
    """Gauss-Newton by LSMR on :class:`_PolishOperator` built on ``data`` (``What`` or ``Ys``); residuals over
    ``scale``. With ``rank``, on each head's rows factored, ``W~_h[:d, :] = A_h B_h^T`` (:class:`_Factored`); with
    ``map_rank``, on Theta's head blocks factored, ``M_h = P_h Q_h^T`` (:class:`_Maps`; else Theta whole,
    :class:`_Full`); with ``data["ln"] = (answers, gamma, beta)`` the LayerNorm's ``beta`` is an unknown too
    (``gamma`` also if :data:`POLISH_LN_GAMMA`), the directions ``(y - beta) / gamma`` built again at each point, and
    ``info`` holds them polished."""
    from scipy.sparse.linalg import LinearOperator, lsmr

    H, d = Ws.shape[0], Ws.shape[1] - 1
    d_out = Theta.shape[1]
    iters = FREE_POLISH_STEPS if iters is None else iters
    products = [X.astype(FREE_POLISH_PRODUCTS) for X in Xs]  # cast once: each step builds its operator again
    op = _PolishOperator(Ws, Theta, Xs, products=products, **data)
    r = op.residual()
    first = best = float(np.linalg.norm(r)) / scale
    start, start_data = (Ws, Theta), data
    nL = op.ln_rows * d_out
    heads = _Rows(Ws[:, :d, :]) if rank is None else _Factored(Ws[:, :d, :], rank)
    maps = _Full(Theta) if map_rank is None else _Maps(Theta, H, map_rank)
    if rank is not None or map_rank is not None:  # from the best fits of those ranks: the factors' point
        Ws = Ws.copy()
        Ws[:, :d, :] = heads.W()
        Theta = maps.Theta()
        op = _PolishOperator(Ws, Theta, Xs, products=products, factors=heads.factors(), maps=maps.maps(), **data)
        r = op.residual()
        best = float(np.linalg.norm(r)) / scale
    tiny = np.finfo(float).tiny
    sF = heads.scales(op.column_norms())
    nW, nT = sF.size, maps.size
    sL = 1.0 / np.maximum(op.ln_column_norms(), tiny) if nL else None
    maps.prepare(op)  # Theta's preconditioner, from the start's features

    def step(op, r):
        """The Gauss-Newton step ``(dW, dTheta)`` by LSMR, and its iterations."""

        def dln_of(x):
            return x[nW + nT :].reshape(-1, d_out) * sL if nL else None

        def mv(x):
            return op.matvec(heads.tangent(x[:nW] * sF), maps.tangent(x[nW : nW + nT]), dln_of(x))

        def rmv(y):
            g = op.rmatvec(y)
            gW = heads.adjoint(g[0]) * sF
            return np.concatenate([gW, maps.adjoint(g[1])] + ([(g[2] * sL).ravel()] if nL else []))

        A = LinearOperator((r.size, nW + nT + nL), matvec=mv, rmatvec=rmv, dtype=float)
        x, _, its = lsmr(A, -r, atol=lsmr_tol, btol=lsmr_tol, maxiter=lsmr_iters)[:3]
        return x[:nW] * sF, maps.tangent(x[nW : nW + nT]), dln_of(x), int(its)

    steps = []
    for _ in range(iters):
        dW, dT, dln, its = step(op, r)
        steps.append(its)
        del op  # its features, B p floats, are built again at the new point
        W_new = Ws.copy()
        moved, moved_maps = heads.moved(dW), maps.moved(dT)
        W_new[:, :d, :] = moved.W()
        T_new = moved_maps.Theta()
        data_new = data
        if nL:
            answers, gamma, beta = data["ln"]
            gamma = gamma + dln[0] if data.get("ln_gamma", True) else gamma  # held: beta's row alone
            data_new = {**data, "ln": (answers, gamma, beta + dln[-1])}
        op = _PolishOperator(
            W_new, T_new, Xs, products=products, factors=moved.factors(), maps=moved_maps.maps(), **data_new
        )
        r_new = op.residual()
        res = float(np.linalg.norm(r_new)) / scale
        if not res < best:
            break
        Ws, Theta, r, gain, best, heads, maps, data = W_new, T_new, r_new, best / res, res, moved, moved_maps, data_new
        if gain < 1.01:
            break
    if best >= first:  # the factored start and its steps never beat the start itself
        (Ws, Theta), best, data = start, first, start_data
    ranks = None if rank is None else np.broadcast_to(np.asarray(rank, dtype=int), (H,)).tolist()
    m_ranks = None if map_rank is None else np.broadcast_to(np.asarray(map_rank, dtype=int), (H,)).tolist()
    info = {"lsmr_iterations": steps, "rank": ranks, "map_rank": m_ranks}
    if nL:
        info["gamma"], info["beta"] = data["ln"][1], data["ln"][2]
    return Ws, Theta, first, best, info


def _whitener(G):
    """``T = D^-1 L^-T`` with ``T^T G T`` the identity (to rounding and jitter), ``L`` the Cholesky factor of ``G``
    scaled to a unit diagonal (``D`` its diagonal's roots), ``G`` of shape ``(..., n, n)``: a step ``T y`` moves
    features of Gram matrix ``G`` orthonormally. Jitter ``1e-13``, ``1e-10``, ``1e-7`` of the unit diagonal as
    needed (the features' near-collinear columns: a preconditioner needs no more); the identity if none serves."""
    tiny = np.finfo(float).tiny
    D = np.sqrt(np.maximum(np.diagonal(G, axis1=-2, axis2=-1), tiny))
    Gs = G / (D[..., :, None] * D[..., None, :])
    eye = np.eye(G.shape[-1])
    for jitter in (1e-13, 1e-10, 1e-7):
        try:
            L = np.linalg.cholesky(Gs + jitter * eye)
            break
        except np.linalg.LinAlgError:
            L = None
    if L is None:
        return np.broadcast_to(eye, G.shape) / D[..., :, None]
    return np.swapaxes(np.linalg.inv(L), -1, -2) / D[..., :, None]


class _Full:
    """Theta itself, ``(p, d_out)``: the matrix-free polish's output maps unfactored (:class:`_Maps`' interface),
    preconditioned on the right by the Cholesky factor ``L`` of its features' Gram matrix
    (:meth:`_PolishOperator.gram`, column-scaled by ``D``): ``dTheta = D^-1 L^-T y``, so that its block is
    near-orthonormal (its columns, the features, are strongly correlated)."""

    def __init__(self, Theta):
        self._T = Theta
        self.size = Theta.size

    def Theta(self):
        return self._T

    def maps(self):
        return None

    def prepare(self, op):
        """The preconditioner ``(L, D)``, once, from the operator at the start."""
        from scipy.linalg import cho_factor

        G = op.gram()
        p = G.shape[0]
        tiny = np.finfo(float).tiny
        self.D = np.sqrt(np.maximum(np.diag(G), tiny))
        G /= np.outer(self.D, self.D)
        for jitter in (1e-13, 1e-10, 1e-7):  # the features' near-collinear columns: a preconditioner needs no more
            try:
                L = cho_factor(G + jitter * np.eye(p), lower=True, overwrite_a=True)[0]
                break
            except np.linalg.LinAlgError:
                L = None
        self.L = np.eye(p) if L is None else L

    def tangent(self, y):
        """The preconditioned step ``y`` (flat) as ``dTheta``, ``(p, d_out)``."""
        from scipy.linalg import solve_triangular

        return solve_triangular(self.L, y.reshape(self._T.shape), lower=True, trans="T") / self.D[:, None]

    def adjoint(self, g):
        """:meth:`tangent`'s adjoint on the operator's ``gTheta``, flat."""
        from scipy.linalg import solve_triangular

        return solve_triangular(self.L, g / self.D[:, None], lower=True).ravel()

    def moved(self, dT):
        out = _Full(self._T + dT)
        out.L, out.D = self.L, self.D
        return out


class _Maps:
    """Theta with its head blocks factored, ``M_h = P_h Q_h^T`` (``P_h`` of shape ``(d, s_h)``, ``Q_h``
    ``(d_out, s_h)``), the skip's and bias's rows ``Sb`` (``(d + 1, d_out)``) whole (this book's own): the matrix-free
    polish's output maps at ranks ``s_h`` (:func:`map_ranks`), ``sum_h s_h (d + d_out) + (d + 1) d_out`` unknowns
    instead of ``p d_out``. Held as ``(H, d, s)`` and ``(H, d_out, s)``, ``s`` the largest rank, the columns beyond
    each head's own zero and kept so; balanced (``P = U S^1/2``, ``Q = V S^1/2``) at each point, as
    :class:`_Factored`.

    Preconditioned on the right, per head: ``dP_h = T_x,h y / |Q_h|`` (columnwise), ``T_x,h`` the whitener
    (:func:`_whitener`) of ``xbar_h``'s Gram matrix (:meth:`_PolishOperator.gram_blocks`, from the start's features),
    so that ``xbar_h dP_h Q_h^T`` is orthonormal in ``y`` (``Q_h``'s columns are orthogonal, balanced);
    ``dQ_h = y T_e,h^T``, ``T_e,h`` the whitener of ``xbar_h P_h``'s Gram ``P_h^T G_x,h P_h`` (at each point);
    ``dSb = T_s y``, ``T_s`` the skip's and bias's features' whitener. The directions' projections aside, these are
    the blocks' own Gauss-Newton metrics."""

    def __init__(self, Theta, H, ranks):
        p, d_out = Theta.shape
        d = (p - 1) // (H + 1)
        self.H, self.d = H, d
        self.ranks = np.broadcast_to(np.asarray(ranks, dtype=int), (H,))
        s = int(self.ranks.max())
        self.mask = (np.arange(s)[None, :] < self.ranks[:, None])[:, None, :].astype(float)  # (H, 1, s)
        self.P, self.Q = _balanced(Theta[: H * d].reshape(H, d, d_out), self.mask)
        self.Sb = Theta[H * d :].copy()
        self.size = self.P.size + self.Q.size + self.Sb.size

    def Theta(self):
        return np.concatenate([(self.P @ self.Q.transpose(0, 2, 1)).reshape(-1, self.Q.shape[1]), self.Sb])

    def maps(self):
        """``(P, Q)``: :class:`_PolishOperator`'s ``maps``."""
        return self.P, self.Q

    def prepare(self, op):
        """The whiteners of ``xbar_h``'s and of the skip's and bias's features' Gram matrices, once, from the
        operator at the start; ``dQ_h``'s and the columns' scales at this point."""
        self.Gx, Gs = op.gram_blocks()
        self.Tx, self.Ts = _whitener(self.Gx), _whitener(Gs)
        self._at_point()

    def _at_point(self):
        tiny = np.finfo(float).tiny
        Ge = self.P.transpose(0, 2, 1) @ self.Gx @ self.P  # xbar_h P_h's Gram, (H, s, s)
        Ge += (1.0 - self.mask) * np.eye(self.mask.shape[2])  # beyond each head's rank: the identity, masked out
        self.Te = _whitener(Ge)
        self.qs = self.mask / np.maximum(np.linalg.norm(self.Q, axis=1, keepdims=True), tiny)  # (H, 1, s)

    def _split(self, x):
        nP, nQ = self.P.size, self.Q.size
        return x[:nP].reshape(self.P.shape), x[nP : nP + nQ].reshape(self.Q.shape), x[nP + nQ :].reshape(self.Sb.shape)

    def tangent(self, y):
        """The preconditioned step ``y`` (flat) as ``(dP, dQ, dSb)``, zero beyond each head's rank."""
        yP, yQ, yS = self._split(y)
        return (self.Tx @ yP) * self.qs, (yQ @ self.Te.transpose(0, 2, 1)) * self.mask, self.Ts @ yS

    def adjoint(self, g):
        """:meth:`tangent`'s adjoint on the operator's ``(gP, gQ, gSb)``, flat."""
        gP, gQ, gS = g
        a = self.Tx.transpose(0, 2, 1) @ (gP * self.qs)
        return np.concatenate([a.ravel(), ((gQ * self.mask) @ self.Te).ravel(), (self.Ts.T @ gS).ravel()])

    def moved(self, dT):
        """The maps after the step ``(dP, dQ, dSb)``, balanced again; the whiteners of the start carried, ``dQ_h``'s
        and the columns' scales at the new point."""
        dP, dQ, dSb = dT
        out = _Maps.__new__(_Maps)
        out.H, out.d, out.ranks, out.mask, out.size = self.H, self.d, self.ranks, self.mask, self.size
        out.P, out.Q = _rebalanced(self.P + dP, self.Q + dQ, self.mask)
        out.Sb = self.Sb + dSb
        if hasattr(self, "Gx"):
            out.Gx, out.Tx, out.Ts = self.Gx, self.Tx, self.Ts
            out._at_point()
        return out


class _Rows:
    """The heads' rows ``W~_h[:d, :]`` themselves, ``(H, d, d + 1)``: :class:`_Factored`'s interface on the
    unfactored unknowns, for :func:`_polish_free`."""

    def __init__(self, W):
        self._W = W

    def W(self):
        return self._W

    def dW(self, x):
        return x.reshape(self._W.shape)

    def grad(self, gW):
        return gW.reshape(-1)

    tangent, adjoint = dW, grad  # the operator's products take and give the rows themselves

    def factors(self):
        return None

    def scales(self, cW):
        """The preconditioner, flat: one over the rows' column norms ``cW``."""
        return (1.0 / np.maximum(cW, np.finfo(float).tiny)).reshape(-1)

    def moved(self, x):
        return _Rows(self._W + x.reshape(self._W.shape))


class _Factored:
    """Heads' rows of ranks ``r_h``, ``W~_h[:d, :] = A_h B_h^T`` (``A_h`` of shape ``(d, r_h)``, ``B_h``
    ``(d + 1, r_h)``; this book's own): the matrix-free polish's unknowns on heads of known ranks, ``sum_h r_h (2 d +
    1)`` of them instead of ``H d (d + 1)``. Held as ``(H, d, r)`` and ``(H, d + 1, r)``, ``r`` the largest rank, the
    columns beyond each head's own zero and kept so (``mask``). A step ``(dA, dB)`` moves the rows by
    ``dA B^T + A dB^T`` (Gauss-Newton linearises the product); the factors are balanced (``A = U S^1/2``,
    ``B = V S^1/2`` from the rows' SVD) at each point, which leaves the step's ``r_h^2`` gauge directions (``A G``,
    ``B G^-T``) to LSMR's least-norm step."""

    def __init__(self, W, ranks):
        self.ranks = np.broadcast_to(np.asarray(ranks, dtype=int), (W.shape[0],))
        r = int(self.ranks.max())
        self.mask = (np.arange(r)[None, :] < self.ranks[:, None])[:, None, :].astype(float)  # (H, 1, r)
        self.A, self.B = _balanced(W, self.mask)

    def W(self):
        return self.A @ self.B.transpose(0, 2, 1)

    def _split(self, x):
        nA = self.A.size
        return x[:nA].reshape(self.A.shape) * self.mask, x[nA:].reshape(self.B.shape) * self.mask

    def dW(self, x):
        """``dA B^T + A dB^T``, ``(H, d, d + 1)``, of the flat step ``x = (dA, dB)``."""
        dA, dB = self._split(x)
        return dA @ self.B.transpose(0, 2, 1) + self.A @ dB.transpose(0, 2, 1)

    def grad(self, gW):
        """The adjoint of :meth:`dW`: ``(gW B, gW^T A)`` flat (zero beyond each head's rank)."""
        return self._flat(gW @ self.B, gW.transpose(0, 2, 1) @ self.A)

    def factors(self):
        """``(A, B)``: :class:`_PolishOperator`'s ``factors``, whose products take :meth:`tangent`'s step and give
        :meth:`adjoint`'s gradient without forming ``dW`` (``(H, d, d + 1)``) or ``gW``."""
        return self.A, self.B

    def tangent(self, x):
        """The flat step ``x`` as the factors' ``(dA, dB)`` (zero beyond each head's rank), for the operator's
        :meth:`_PolishOperator.matvec` (equal to :meth:`dW`'s there)."""
        return self._split(x)

    def adjoint(self, g):
        """The operator's factors' gradient ``(gA, gB)`` flat, zero beyond each head's rank."""
        return self._flat(*g)

    def _flat(self, gA, gB):
        return np.concatenate([(gA * self.mask).ravel(), (gB * self.mask).ravel()])

    def column_norms(self, cW):
        """The factors' columns' norms estimated from the rows' (``cW``, ``(H, d, d + 1)``), their cross terms left
        out: ``|J dA_ak|^2 ~ sum_c cW_ac^2 B_ck^2``, ``|J dB_ck|^2 ~ sum_a cW_ac^2 A_ak^2``; zero beyond the ranks."""
        c2 = cW * cW
        return np.sqrt(c2 @ (self.B * self.B)), np.sqrt(c2.transpose(0, 2, 1) @ (self.A * self.A))

    def scales(self, cW):
        """The preconditioner over ``(dA, dB)``, flat: one over :meth:`column_norms`, zero beyond the ranks."""
        sA, sB = self.column_norms(cW)
        tiny = np.finfo(float).tiny
        return np.concatenate([(self.mask / np.maximum(sA, tiny)).ravel(), (self.mask / np.maximum(sB, tiny)).ravel()])

    def moved(self, x):
        """The factors after the step ``x`` (``(dA, dB)`` flat), balanced again."""
        dA, dB = self._split(x)
        out = _Factored.__new__(_Factored)
        out.ranks, out.mask = self.ranks, self.mask
        out.A, out.B = _rebalanced(self.A + dA, self.B + dB, self.mask)
        return out


def _balanced(M, mask):
    """Blocks ``M`` (``(H, a, b)``) truncated to the ranks ``mask`` (``(H, 1, r)``, ones up to each block's rank)
    keeps, as balanced factors ``(U S^1/2, V S^1/2)`` of shapes ``(H, a, r)`` and ``(H, b, r)`` (their SVD's)."""
    r = mask.shape[2]
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    s = np.sqrt(s[:, None, :r]) * mask
    return U[:, :, :r] * s, Vt[:, :r, :].transpose(0, 2, 1) * s


def _rebalanced(A, B, mask):
    """The factors ``(A, B)`` of ``A B^T`` balanced again (as :func:`_balanced`), by the QR factors' small SVD."""
    QA, RA = np.linalg.qr(A)
    QB, RB = np.linalg.qr(B)
    U, s, Vt = np.linalg.svd(RA @ RB.transpose(0, 2, 1))
    s = np.sqrt(s[:, None, :]) * mask  # the product's rank is each head's: beyond it, rounding only
    return QA @ (U * s), QB @ (Vt.transpose(0, 2, 1) * s)
