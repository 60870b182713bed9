"""The counts route's diagnostics (private; research-only).

These functions measure why the counts route stops (conditioning, start coverage, Cramer-Rao
bounds, multi-scale pair starts) and expose its one-dimensional fits; no learner calls them.
They back ``benchmarks/why_H_stops.py`` and ``benchmarks/multiscale_pairs.py``.
"""

from __future__ import annotations

import numpy as np

from .._validation import as_float_array, check_int, check_real
from ..exact import check_exact_oracle
from ._common import EPS
from ._identifiability import random_multi_head
from ._orthogonal import probe_hessian_queries
from ._pairstart import MATCH_TOL, fit_start_rows
from ._route import ask_pairs, rational_plan


def counts_conditioning(d, H, *, shift_std=3.0, n_draws=20, seed=0):
    """Rounding sensitivity of the counts route: one pair on its own against a joint row fit.

    Random amplitudes ``gamma ~ N(0, I_H)``, row vectors ``R_h ~ N(0, shift_std^2 I_d / d)`` and
    tokens of unit norm (shifts of standard deviation ``shift_std``), sampled at the ratios of
    ``companion.numerics.rational.ratio_design``. The sensitivity is ``eps * max|G| / sigma_min(J)``
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

    from ..numerics.rational import ratio_design

    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    shift_std = check_real(shift_std, "shift_std", minimum=0.0, strict=True)
    n_draws = check_int(n_draws, "n_draws", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    n, m = ratio_design(H)
    s = np.log(n / m)

    def sens(J, scale):
        sv = np.linalg.svd(J, compute_uv=False)
        return float(EPS * scale / sv[-1]) if sv[-1] > 0 else np.inf

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


def _resolved_heads(g, sh, gam, L):
    """Shape (K, H) bool: head ``h`` is resolved at token ``k`` where the fitted term of pair ``k``
    (amplitudes ``g``, shifts ``sh``, shape (K, H), NaN where the fit failed) nearest to the true
    amplitude ``gam[h]`` has it to MATCH_TOL (relative to the largest ``|gam|``) and the true shift
    ``L[k, h]`` to 1e-2 (absolute, in ``log r``)."""
    dist = np.abs(g[:, None, :] - gam[None, :, None])
    dist = np.where(np.isfinite(dist), dist, np.inf)
    j = np.argmin(dist, axis=2)
    hit = np.take_along_axis(dist, j[..., None], 2)[..., 0] <= MATCH_TOL * np.max(np.abs(gam))
    return hit & (np.abs(np.take_along_axis(np.nan_to_num(sh), j, 1) - L) <= 1e-2)


def counts_start_coverage(d, H, *, n_rows=4, scale=3.0, spread=1.5, seed=0) -> dict:
    """Why the counts route stops: tokens per head that a pair's own fit resolves, against ``d``.

    For ``n_rows`` row directions of :func:`learn_canonical_rational`'s design (its ``K`` tokens of
    median norm ``scale``, its ``2 H`` ratios) and the target ``random_multi_head(d, H, seed=seed)``,
    every pair is fitted on its own as the learner does (interpolation, then Levenberg-Marquardt),
    on exact answers, and head ``h`` counts as resolved at a token where a fitted term has ``h``'s
    true amplitude to ``MATCH_TOL`` (relative to the row's largest) and its shift to 1e-2. A head's
    start row is a least-squares fit over those tokens, so it needs more than ``d`` of them.

    The start error is that fit's (``fit_start_rows``, over the resolved tokens with their fitted
    shifts, labelled by the true amplitudes: the best this per-pair start can do), relative per head,
    ``||R0_h - R_h|| / ||R_h||``. Measured at ``d = 64`` (defaults, 4 rows; this book's own,
    2026-12-01): largest (median) over heads and rows 8e-4 (1e-4) at ``H = 8``, 0.70 (0.51) at
    ``H = 10`` and 0.97 (0.86) at ``H = 12``: below ``d`` resolved tokens the least squares is
    underdetermined and the start is the minimum-norm row. A row's joint fit
    (``companion.numerics.rational.fit_row_joint``) converged to rounding level from the true heads
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
    What was kept: the shared-amplitude start of :mod:`companion.multihead._rowstart` (every pair refitted
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

    from ..numerics.rational import interpolate_pairs, polish_pairs, ratio_design

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
        R0 = fit_start_rows(X, L_fit, float(np.max(np.abs(s))), hit)
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


def _counts_design_answers(d, H, n_rows, seed):
    """The target ``random_multi_head(d, H, seed=seed)``, :func:`learn_canonical_rational`'s design
    (``companion.multihead._information.learner_design``) and the float64 answers minus ``x^T v`` of its rows
    ``0 .. n_rows - 1``, each of shape (K, 2 H)."""
    from ..oracles import ValueQueryOracle
    from ._information import learner_design

    K = rational_plan(d, H)["K"]
    target = random_multi_head(d, H, seed=seed)
    P, X, n, m = learner_design(d, H, K, seed)
    oracle = ValueQueryOracle(target)
    bX = X @ np.asarray(oracle(np.eye(d)[:, None, :]))
    return target, P, X, n, m, [ask_pairs(oracle, X + P[i], X, n, m) - bX[:, None] for i in range(n_rows)]


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
        (the shared-amplitude start of ``companion.multihead._rowstart`` given the true amplitudes; ``inf``
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
    in ``log r`` (``companion.numerics.rational.count_pairs``): what a start that labels heads pair by pair
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


def multiscale_pair_starts(d, H, *, row=0, n_pairs=None, starts=64, seed=0) -> list:
    """Per-pair starts on the route's design against the multi-scale design: errors and bounds.

    This book's own measurement of a design variant not built into :func:`learn_canonical_rational`
    (``benchmarks/multiscale_pairs.py`` prints it; the prototype is ``companion.multihead._multiscale``). A
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
    return probe_hessian_queries(oracle, v, x0, step)


def count_pairs(n_points, max_len):
    """Counts ``(n, m)`` with ``n + m <= max_len`` spread evenly in ``log(n / m)`` (the robust route's).

    See ``companion.numerics.rational.count_pairs``.

    Examples
    --------
    >>> n, m = count_pairs(5, 5)
    >>> (n / m).round(3).tolist()
    [0.25, 0.5, 1.0, 2.0, 4.0]
    """
    from ..numerics.rational import count_pairs as _count_pairs

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
        ``residual``, ``sensitivity``, ``scale`` (``companion.numerics.rational.fit_free``).

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
    from ..numerics.rational import fit_free

    s = as_float_array(s, "s", ndim=1)
    g = as_float_array(g, "g", ndim=1, shape=s.shape)
    return fit_free(s, g)
