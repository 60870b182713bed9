"""The counts route's pair start (private): each pair's own terms, matched into a row's start.

:func:`companion.multihead.learn_canonical_rational` with ``start="pairs"`` is :func:`learn_pairs`,
whose named stages are functions over three frozen records (:class:`PairDesign`: what is asked and
fitted with; :class:`RowStart`: a row's start; :class:`RowFit`: a row's fitted terms):

1. :func:`make_design` -- directions, tokens, the ``d`` length-1 answers;
2. :func:`ask_row_pairs` -- every row's pairs; :func:`pair_fits` -- each pair's own terms
   (with only ``H_bound``, :func:`choose_terms` counts them on row 0);
3. :func:`batch_starts` -- every row's labels (:func:`label_rows`) and start
   (:func:`start_rows`), then their joint fits, batched;
4. :func:`fit_rows` -- the rows the batch left, through :data:`ROW_STRATEGIES` (the joint fit, the
   repaired start, the shared-amplitude start), with new directions while spare rows remain;
5. :func:`link_rows` -- every row's heads permuted onto row 0's;
6. the result (:func:`companion.multihead._route.rational_result`).

The matching helpers above the stages (:func:`match_terms`, ``fit_start_rows``,
:func:`count_terms`, :func:`agreeing`, :func:`apart`, :func:`repair_start`) are the pieces the
stages share with the diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import expit

from .._learner import QueryCount, reserve
from ..errors import NotIdentifiableError, OracleInconsistentError
from ..numerics.rational import (
    fit_row_joint,
    fit_rows_joint,
    interpolate_pairs,
    pair_sensitivity,
    polish_pairs,
    ratio_design,
)
from . import _rowstart
from ._common import EPS, redraw_direction, visibility_floor
from ._route import ask_pairs, heads_from_rows, rational_plan, rational_result, route_tokens

#: Relative misfit at which a pair's own interpolation is good enough to start a row's joint fit
#: (measured: the joint fit converges from about 1 % errors in the amplitudes and shifts).
START_TOL = 1e-6

#: Relative amplitude agreement (to the row's largest) at which a term of a pair's own fit is taken
#: as that row's head for the start (measured at d = 32, H = 8: 1e-3 keeps about 35 of 55 tokens
#: per head with shift errors below 5e-4 for 95 %; the outliers are trimmed by fit_start_rows).
MATCH_TOL = 1e-3

#: Rounding sensitivity of a pair's own fit (relative to the row's largest answer,
#: :func:`companion.numerics.rational.pair_sensitivity`) at or below which pairs that disagree on the
#: amplitudes (to 1 %, agreeing) are not put down to float64: a hundred times below that
#: agreement, rounding cannot move an amplitude that far, and the refusal names a wrong H instead.
WELL_CONDITIONED = 1e-4

#: A pair is used for a head's refit in repair_start where that one term, against the others at the
#: start, misfits by at most this factor times the median over the row's pairs (the others' start
#: errors set the level: about 1e-4 relative at d = 32, H = 7).
REPAIR_FACTOR = 3.0


def match_terms(gam, sh, fit, gamma0):
    """Which terms of each pair's own fit are the row's heads: ``(use, L)`` of shape (K, H).

    Head ``h`` is taken at pair ``k`` (``use[k, h]``, shift ``L[k, h]``) where the nearest of the
    pair's amplitudes ``gam[k]`` is within MATCH_TOL of ``gamma0[h]`` (relative to the largest
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
    use = (dmin <= MATCH_TOL * top) & (dmin <= gap.min(axis=2)[:, None, :] / 3) & mutual
    L = np.where(use, np.take_along_axis(np.nan_to_num(sh, nan=0.0), j, axis=2), 0.0)
    return (use[0], L[0]) if one else (use, L)


def repair_start(s, G, X, gamma, R, window):
    """A row's start with each head refitted alone against the others (``None`` if none improves).

    For head ``h``, every pair's answers minus the other heads' terms (at the start) are one logistic
    term ``gamma_h sigma(s + l)`` of known amplitude: its shift is found per pair by a grid over
    ``|l| <= window + 6`` then Levenberg-Marquardt, kept where that one term fits to REPAIR_FACTOR
    times the median misfit, and ``R_h`` is their least-squares fit (fit_start_rows). The new ``R_h``
    replaces the old where it lowers the row's largest misfit. Measured (d = 32, H = 7, seed 0): the
    three rows that refused each had one head off by 0.4-1.1 relative while the others were within
    1e-2; a head resolved at few tokens (amplitude small, or shifts outside the window) is the case.
    """

    from ..numerics.rational import polish_pairs

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
        ok = res <= REPAIR_FACTOR * np.median(res)
        if ok.sum() <= X.shape[1]:
            continue
        cand = R.copy()
        cand[h] = fit_start_rows(X, l, window, ok[:, None])[0]
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


def fit_start_rows(X, L, window, resolved=None):
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


def count_terms(misfit):
    """The number of terms of row 0's pairs, from ``misfit`` of shape (H_0, K): the relative misfit
    of each pair's own fit with ``h = 1 .. H_0`` terms (``inf`` where it failed). ``None`` if none fits.

    A pair is resolved by ``h`` terms where it misfits by at most START_TOL. The count is the
    smallest ``h`` that resolves a quarter of the pairs and at least half as many as the best ``h``:
    with fewer terms than heads, the pairs along which a head's term is nearly flat in the window of
    ``log r`` are resolved too, and with more, the surplus poles are complex at most pairs. Measured
    on row 0 of the heads of ``random_multi_head_transformer(6, 2, 4, seed=1)``: 2, 7 and 1 of its
    7 pairs with 1, 2 and 3 terms; of ``random_multi_head(8, 3, seed=1)``: 0.0, 0.3, 1.0 and 0.0 of
    its pairs with 1 to 4 terms.
    """
    frac = np.mean(misfit <= START_TOL, axis=1)
    ok = (frac >= 0.25) & (frac >= 0.5 * frac.max())
    return int(np.argmax(ok)) + 1 if ok.any() else None


def is_rough(res, scale):
    """Whether a pair's own fit misfits by more than 1e-10 relative to ``scale``: then its shifts
    gain from a refit (all terms free, or with the row's amplitudes fixed)."""
    return res > 1e-10 * scale


def agreeing(gs, fit=None):
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


def apart(gamma0):
    """Heads whose amplitude is farther than 2e-2 (relative to the largest; twice the pairs'
    agreement, agreeing) from every other head's: shape (H,) bool, or (N, H) for ``gamma0`` of
    shape (N, H). Sorted by amplitude, their order cannot swap between pairs."""
    H = gamma0.shape[-1]
    gap = np.abs(gamma0[..., :, None] - gamma0[..., None, :]) + np.diag(np.full(H, np.inf))
    return gap.min(axis=-1) > 2e-2 * np.max(np.abs(gamma0), axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# The pair start's stages: design, each pair's own fit, row starts, row fits, links
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairDesign:
    """What the pair start asks and fits with, fixed before its pairs are asked.

    ``n``, ``m`` (shape (S,)): copies of ``u`` and of ``x`` per sample (ratios ``r = n / m``,
    ``s = log r``); ``X`` (K, d): the rows' shared query tokens, ``XX`` (K, d * d) their
    ``x x^T``; ``X_link`` (n_link, d): the link tokens; ``v`` (d,): the length-1 answers, so
    ``bX = X v``; ``H_plan``, ``tol`` from the options.
    """

    d: int
    H_plan: int
    tol: float
    n: np.ndarray
    m: np.ndarray
    X: np.ndarray
    XX: np.ndarray
    X_link: np.ndarray
    v: np.ndarray

    @property
    def r(self) -> np.ndarray:
        return self.n / self.m

    @property
    def s(self) -> np.ndarray:
        return np.log(self.n / self.m)

    @property
    def K(self) -> int:
        return int(self.X.shape[0])

    @property
    def bX(self) -> np.ndarray:
        return self.X @ self.v

    @property
    def window(self) -> float:
        """The half-width of the window of ``log r``: shifts far outside it are poorly determined."""
        return float(np.max(np.abs(self.s)))


@dataclass(frozen=True)
class RowStart:
    """One row's start for its joint fit.

    ``gamma0`` (H,): the amplitudes its resolved pairs share; ``R0`` (H, d): the start rows;
    ``n_agree``: pairs that resolved every head; ``fewest``: the fewest tokens at which a pair's own
    fit resolved one of its heads; ``use``, ``L`` (K, H): the per-head start's terms (what the
    shared-amplitude start reuses); ``tried``: the batched joint fit already failed from it.
    """

    gamma0: np.ndarray
    R0: np.ndarray
    n_agree: int
    fewest: int
    use: np.ndarray
    L: np.ndarray
    tried: bool = False


@dataclass(frozen=True)
class RowFit:
    """One row's fitted terms: ``gamma`` (H,) = ``delta_i^T v_h``, ``R`` (H, d) = ``delta_i^T W_h``;
    ``fraction`` of its pairs that resolved every head, relative ``residual``, and the ``strategy``
    (:data:`ROW_STRATEGIES`, or ``"batched"``) that fitted it."""

    gamma: np.ndarray
    R: np.ndarray
    fraction: float
    residual: float
    strategy: str


def make_design(oracle, rng, d, opts, plan) -> tuple:
    """The design and the rows ``P`` (d, d; orthonormal, redrawn in place later): the directions and
    tokens from ``rng``, then ``d`` length-1 queries for ``v``."""
    n, m = ratio_design(opts.H_plan)
    P, Rq = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(Rq))).T  # rows delta_i, orthonormal
    X = route_tokens(rng, plan["K"], d, opts.scale, opts.spread)
    X_link = route_tokens(rng, plan["n_link"], d, opts.scale, opts.spread)
    XX = np.einsum("ka,kb->kab", X, X).reshape(X.shape[0], d * d)
    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)  # d length-1 queries
    return PairDesign(d, opts.H_plan, opts.tol, n, m, X, XX, X_link, v), P


def ask_row_pairs(oracle, design, P) -> np.ndarray:
    """Every row's pairs ``G[i, k, t] = VQ - x_k^T v`` at ``u = x_k + delta_i``: shape (rows, K, S)."""
    X, d, rows = design.X, design.d, P.shape[0]
    U = (X[None] + P[:, None]).reshape(-1, d)
    G = ask_pairs(oracle, U, np.tile(X, (rows, 1)), design.n, design.m) - np.tile(design.bX, rows)[:, None]
    return G.reshape(rows, design.K, -1)


def pair_fits(design, G, h) -> tuple:
    """Each pair on its own (batched over the rows of ``G``, shape (P, S)): interpolation through
    ``2 h`` samples, then Levenberg-Marquardt where the interpolant misfits. ``(gam, sh, res)``:
    shapes (P, h), (P, h), (P,)."""
    r, s = design.r, design.s
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
        rough = np.flatnonzero(ok)[is_rough(res[ok], np.max(np.abs(G[ok]), axis=1))]
        if rough.size:
            gam[rough], sh[rough], res[rough] = polish_pairs(s, G[rough], gam[rough], sh[rough])
    return gam, sh, res


def check_visible(design, i, G) -> float:
    """``max |G|`` of row ``i``; raises :class:`NotIdentifiableError` if no head shows in it."""
    gmax = float(np.max(np.abs(G)))
    if gmax <= visibility_floor(design.bX):
        raise NotIdentifiableError(
            f"row {i}: every answer equals x^T v: no head's softmax is visible along "
            "delta_i, so the values cancel (e.g. v and -v on equal W); the canonical form has "
            "no heads here."
        )
    return gmax


def choose_terms(design, G) -> int:
    """Only a bound ``H_0``: the number of terms found from the pairs ``G`` of row 0 (count_terms)."""
    check_visible(design, 0, G)
    gmax = float(np.max(np.abs(G)))
    h = count_terms(np.array([pair_fits(design, G, h_try)[2] for h_try in range(1, design.H_plan + 1)]) / gmax)
    if h is None:
        raise OracleInconsistentError(
            f"no number of terms up to H_bound={design.H_plan} fits a quarter of the pairs of row 0 to "
            f"{START_TOL:g} relative; the oracle may not be a sum of heads, or H_bound is too small."
        )
    return h


def label_rows(G, fits) -> tuple:
    """Rows' amplitudes, each shared by its row's resolved pairs, batched over rows: ``G`` of
    shape (N, K, S) and its pairs' own fits ``(gam, sh, res)`` of shape (N, K, H), (N, K, H),
    (N, K). Returns ``gamma0`` (N, H), ``agree`` (N, K), the terms ``gam``, ``sh`` sorted by
    amplitude where the pair fits, ``fit`` (N, K), ``rough`` (N,), ``gmax`` (N,) and ``ok``
    (N,): the rows that can start (label_row says why one cannot)."""
    gam, sh, res = fits
    gmax = np.max(np.abs(G), axis=(1, 2))
    fit = res <= START_TOL * gmax[:, None]  # a start only: the joint fit refines it to tol
    # Label the heads by their amplitudes, shared by every pair of the row: sort each pair's
    # terms by amplitude (the optimal matching in one dimension) and keep the largest group
    # of pairs that agree to 1 %.
    order = np.argsort(gam, axis=2)
    gam = np.where(fit[..., None], np.take_along_axis(gam, order, axis=2), gam)
    sh = np.where(fit[..., None], np.take_along_axis(sh, order, axis=2), sh)
    agree = agreeing(gam, fit)
    n_agree = agree.sum(axis=1)
    # The median over each row's agreeing pairs (as np.median: the mean of the two middle ones).
    srt = np.sort(np.where(agree[..., None], gam, np.inf), axis=1)
    cnt = np.maximum(n_agree, 1)[:, None, None]
    gamma0 = 0.5 * (np.take_along_axis(srt, (cnt - 1) // 2, axis=1) + np.take_along_axis(srt, cnt // 2, axis=1))
    # ``rough``: some resolved pair misfits by more than 1e-10 relative, so its shifts gain
    # from a refit with the row's amplitudes fixed (far better conditioned than the free fit).
    rough = is_rough(np.max(np.where(agree, res, -np.inf), axis=1), gmax)
    return gamma0[:, 0], agree, gam, sh, fit, rough, gmax, n_agree >= 2


def label_row(design, i, G, fits, H_row) -> tuple:
    """One row's label_rows: ``(gamma0, agree, gam, sh, fit, rough)``, or the reason it cannot start."""
    check_visible(design, i, G)
    K, H_plan = design.K, design.H_plan
    gam, sh, res = pair_fits(design, G, H_row) if fits is None else fits
    gamma0, agree, gam, sh, fit, rough, gmax, ok = label_rows(G[None], (gam[None], sh[None], res[None]))
    if not fit.any():
        raise OracleInconsistentError(
            f"row {i}: none of the {K} pairs is resolved by its own interpolation of {H_row} "
            f"terms from {2 * H_plan} samples (float64 conditioning grows with H; best misfit "
            f"{np.min(res) / gmax[0]:.2g} relative, tol={design.tol:g}); use learn_canonical, or lower "
            "scale."
        )
    if not ok[0]:
        # Rounding explains pairs that disagree only where their fits are ill conditioned: a
        # well-conditioned disagreement is a wrong H (or a target that is not a sum of heads).
        fitted = np.flatnonzero(fit[0])[:8]
        sens = float(np.median([pair_sensitivity(design.s, gam[0, k], sh[0, k], gmax[0]) for k in fitted]))
        if sens <= WELL_CONDITIONED * gmax[0]:
            raise OracleInconsistentError(
                f"row {i}: only {int(agree.sum())} of {K} pairs agree on the amplitudes of "
                f"{H_row} heads, although each pair's fit is well conditioned (rounding "
                f"sensitivity {sens / gmax[0]:.1g} relative, median of {fitted.size} pairs, at most "
                f"{WELL_CONDITIONED:g}): rounding does not explain it. The oracle has more heads "
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


def start_rows(design, gamma0, agree, gam, sh, fit) -> tuple:
    """Rows ``R0`` by least squares per head, over every token where that head is resolved, batched
    over rows (the arrays of label_rows): ``R0`` (N, H, d), the fewest tokens per head (N,) and the
    terms used, ``use`` and ``L`` (N, K, H).

    A pair that misses some heads (a shift outside the window, two shifts colliding) still
    resolves the others: head ``h`` is taken from pair ``k`` where one of the pair's terms has
    head ``h``'s amplitude to MATCH_TOL (relative to the largest). With the whole-pair
    agreement alone, fewer than ``d`` tokens per row are resolved from H = 7 on, and the
    minimum-norm start leaves R0 in their span, too far off for the joint fit."""
    use, L = match_terms(gam, sh, fit, gamma0)
    # The pairs that resolve all heads (sorted by amplitude like gamma0) add every head whose
    # amplitude is farther than twice their agreement (1 %) from the others: there the order
    # cannot swap.
    a = agree[:, :, None] & apart(gamma0)[:, None, :]
    use, L = use | a, np.where(a, sh, L)
    # (use, L) also serve the shared-amplitude start, if this one fails
    return fit_start_rows(design.X, L, design.window, use), use.sum(axis=1).min(axis=1), use, L


def start_row(design, i, G, fits, H_row) -> RowStart:
    """A row's start for the joint fit: amplitudes shared by its resolved pairs, rows R0."""
    gamma0, agree, gam, sh, fit, rough = label_row(design, i, G, fits, H_row)
    if rough:
        sh[agree] = polish_pairs(
            design.s, G[agree], np.repeat(gamma0[None], agree.sum(), axis=0), sh[agree], fixed_gamma=True
        )[1]
    R0, fewest, use, L = start_rows(design, gamma0[None], agree[None], gam[None], sh[None], fit[None])
    return RowStart(gamma0, R0[0], int(agree.sum()), int(fewest[0]), use[0], L[0])


def batch_starts(design, G_all, fits_all) -> tuple:
    """Every row's start (labels and start rows batched over the rows), then all joint fits batched
    (``companion.numerics.rational.fit_rows_joint``). Returns ``starts`` (row -> RowStart, for
    the rows that can start; ``tried`` where the batched fit misfits) and ``fitted`` (row -> RowFit)."""
    s, X, K, tol = design.s, design.X, design.K, design.tol
    gamma0, agree, gam, sh, fit, rough, _, ok = label_rows(G_all, fits_all)
    sel = agree & (ok & rough)[:, None]  # the fixed-amplitude refits of every rough row in one batch
    if sel.any():
        sh[sel] = polish_pairs(s, G_all[sel], gamma0[np.nonzero(sel)[0]], sh[sel], fixed_gamma=True)[1]
    ids = np.flatnonzero(ok)
    starts: dict[int, RowStart] = {}
    fitted: dict[int, RowFit] = {}
    if not ids.size:
        return starts, fitted
    R0, fewest, use, L = start_rows(design, gamma0[ids], agree[ids], gam[ids], sh[ids], fit[ids])
    n_agree = agree.sum(axis=1)
    gb, Rb, resb, scb = fit_rows_joint(s, G_all[ids], X, gamma0[ids], R0, XX=design.XX)
    for j, i in enumerate(ids.tolist()):
        start = RowStart(gamma0[i], R0[j], int(n_agree[i]), int(fewest[j]), use[j], L[j])
        if resb[j] <= tol * scb[j]:
            fitted[i] = RowFit(gb[j], Rb[j], start.n_agree / K, float(resb[j] / scb[j]), "batched")
        starts[i] = replace(start, tried=i not in fitted)
    return starts, fitted


# The per-row fallbacks, in order: each returns ``(gamma, R, residual, scale)`` or None.


def _joint_fit(design, G, start):
    """The serial joint fit from the start (with its MINPACK fallback near convergence)."""
    if start.tried:  # the batched fit already did, from this start
        return None
    gamma, R, info = fit_row_joint(design.s, G, design.X, start.gamma0, start.R0, XX=design.XX, iters=30)
    return gamma, R, info["residual"], info["scale"]


def _repaired_fit(design, G, start):
    """The start with its worst-resolved heads refitted one at a time (repair_start), then the joint fit."""
    R1 = repair_start(design.s, G, design.X, start.gamma0, start.R0, design.window)
    if R1 is None:
        return None
    gamma, R, info = fit_row_joint(design.s, G, design.X, start.gamma0, R1, XX=design.XX, iters=30)
    return gamma, R, info["residual"], info["scale"]


def _shared_amplitude_fit(design, G, start):
    """This book's start from all of the row's pairs with their amplitudes shared
    (:mod:`companion.multihead._rowstart`), then the batched Levenberg-Marquardt (no MINPACK
    fallback: bounded); kept only where it reaches ``tol``."""
    s, X = design.s, design.X
    shared = _rowstart.shared_amplitude_start(s, G, X, start.gamma0, design.window, (start.use, start.L))
    if shared is None:
        return None
    gb, Rb, rb, sb = fit_rows_joint(s, G[None], X, shared[0][None], shared[1][None], XX=design.XX)
    if rb[0] > design.tol * sb[0]:
        return None
    return gb[0], Rb[0], float(rb[0]), float(sb[0])


#: A row's fallbacks, tried in order until one fits to ``tol``: ``(name, function)``.
ROW_STRATEGIES = (
    ("joint", _joint_fit),
    ("repaired start", _repaired_fit),
    ("shared amplitudes", _shared_amplitude_fit),
)


def finish_row(design, i, G, start, H_row) -> RowFit:
    """A row's fit by the first of ROW_STRATEGIES that reaches ``tol``, or the refusal with the
    last misfit."""
    misfit = np.inf
    for name, strategy in ROW_STRATEGIES:
        out = strategy(design, G, start)
        if out is None:
            continue
        gamma, R, residual, scale = out
        misfit = residual / scale
        if residual <= design.tol * scale:
            return RowFit(gamma, R, start.n_agree / design.K, float(misfit), name)
    raise OracleInconsistentError(
        f"row {i}: the joint fit of {H_row} heads over {design.K} tokens misfits by "
        f"{misfit:.2g} relative (tol={design.tol:g}), starting from "
        f"{start.n_agree} pairs that resolved all heads; the fewest tokens at which a pair's own "
        f"fit resolved a head: {start.fewest} (a head's start row needs more than "
        f"d={design.d}; float64 conditioning of {H_row} terms from {2 * design.H_plan} samples per pair "
        "lowers it as H grows); use learn_canonical."
    )


def learn_row(oracle, design, P, i, G, fits, H_row) -> RowFit:
    """Row ``i`` from its start (asking its pairs first if ``G`` is None: a redrawn direction)."""
    if G is None:
        G = ask_row_pairs(oracle, design, P[i : i + 1])[0]
    return finish_row(design, i, G, start_row(design, i, G, fits, H_row), H_row)


def fit_rows(oracle, design, P, rng, G_all, fits_all, H_row, spare) -> tuple:
    """Every row's fit: the batched ones, else the row's fallbacks; where a row still refuses, a new
    direction for it (``P`` is redrawn in place), while ``spare`` rows remain. Returns the
    RowFits and the number of rows redrawn."""
    starts, fitted = batch_starts(design, G_all, fits_all)
    out, n_redrawn = [], 0
    for i in range(design.d):
        G_i: np.ndarray | None = G_all[i]
        fits_i: tuple | None = tuple(f[i] for f in fits_all)
        while True:
            try:
                if i in fitted:
                    row = fitted[i]
                elif i in starts and G_i is G_all[i]:
                    row = finish_row(design, i, G_i, starts[i], H_row)
                else:
                    row = learn_row(oracle, design, P, i, G_i, fits_i, H_row)
                break
            except OracleInconsistentError:
                if spare == 0:
                    raise
                # A new direction for row i: along the old one a head's amplitude may vanish.
                spare -= 1
                n_redrawn += 1
                redraw_direction(rng, P, i)
                G_i, fits_i = None, None
        out.append(row)
    return out, n_redrawn


def link_rows(oracle, design, P, rows) -> tuple:
    """Every row linked to row 0: the answers at ``delta_0 + delta_i`` are linear in the ``H^2``
    candidate terms (head ``h`` of row 0 with head ``g`` of row ``i``). Returns each row's
    permutation of its heads onto row 0's and the links' relative misfits."""
    d, s, X_link, tol = design.d, design.s, design.X_link, design.tol
    Hf, n_link = rows[0].gamma.size, X_link.shape[0]
    perms = [np.arange(Hf)] * d
    link_err: list[float] = []
    if Hf == 1 or d == 1:
        return perms, link_err
    # every link pair asked at once (ask_pairs), their fits batched over rows
    bL = X_link @ design.v
    U = (X_link[None] + P[0] + P[1:, None]).reshape(-1, d)
    G_link = (
        ask_pairs(oracle, U, np.tile(X_link, (d - 1, 1)), design.n, design.m) - np.tile(bL, d - 1)[:, None]
    ).reshape(d - 1, n_link, -1)
    # shifts[i, k, h, g]: head h of row 0 with head g of row i + 1 at link token k
    XR = X_link @ np.array([row.R for row in rows]).transpose(0, 2, 1)  # (d, k, H)
    shifts = XR[0][None, :, :, None] + XR[1:, :, None, :]
    amps = [row.gamma for row in rows]
    beta = amps[0][None, :, None] + np.array(amps[1:])[:, None, :]  # (d - 1, H, H)
    A = (expit(s[None, None, :, None, None] + shifts[:, :, None]) * beta[:, None, None]).reshape(
        d - 1, n_link * s.size, Hf * Hf
    )
    # The least squares of every link at once: a stacked pseudo-inverse with numpy.linalg.lstsq's
    # cutoff (singular values below eps * max(shape) times the largest are dropped).
    coefs = (np.linalg.pinv(A, rcond=EPS * max(A.shape[1:])) @ G_link.reshape(d - 1, -1, 1)).reshape(d - 1, Hf, Hf)
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
    return perms, link_err


def learn_pairs(oracle, d, opts):
    """:func:`~companion.multihead.learn_canonical_rational` with ``start="pairs"``: plan and
    reserve, the design, every row's pairs and their own fits, the rows' fits, the links, the result."""
    plan = rational_plan(d, opts.H_plan)
    reserve(oracle, plan["n_queries"] + opts.verify, "learn_canonical_rational")
    count = QueryCount(oracle)
    rng = np.random.default_rng(opts.seed)
    design, P = make_design(oracle, rng, d, opts, plan)
    G_all = ask_row_pairs(oracle, design, P)  # every row's pairs, in blocks of ASK_BLOCK queries
    H_row = opts.H_plan if opts.known else choose_terms(design, G_all[0])
    fits_all = [f.reshape(d, design.K, *f.shape[1:]) for f in pair_fits(design, G_all.reshape(d * design.K, -1), H_row)]
    for i in np.flatnonzero(np.max(np.abs(G_all), axis=(1, 2)) <= visibility_floor(design.bX)):
        check_visible(design, int(i), G_all[i])  # the first row that shows no head raises
    rows, n_redrawn = fit_rows(oracle, design, P, rng, G_all, fits_all, H_row, plan["spare_rows"])
    perms, link_err = link_rows(oracle, design, P, rows)
    Gam = np.array([row.gamma[perm] for row, perm in zip(rows, perms)])  # (d, H): delta_i^T v_h
    Rw = np.array([row.R[perm] for row, perm in zip(rows, perms)])  # (d, H, d): delta_i^T W_h
    model = heads_from_rows(P, Rw, Gam)  # P orthonormal unless a row was redrawn
    extra = {
        "resolved_fraction": float(np.min([row.fraction for row in rows])),
        "max_row_residual": float(np.max([row.residual for row in rows])),
        "max_link_error": max(link_err, default=0.0),
        "n_redrawn_rows": n_redrawn,
        "n_shared_start_rows": sum(row.strategy == "shared amplitudes" for row in rows),
    }
    return rational_result(oracle, count, model, design.n + design.m, d, opts, plan, extra=extra)
