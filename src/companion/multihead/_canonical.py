"""The robust canonical route: general heads in canonical form from long repeated-token queries (private).

This book's construction; :func:`companion.multihead.learn_canonical`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import expit

from .._learner import QueryCount
from .._validation import check_int, check_real
from ..errors import NotIdentifiableError, OracleInconsistentError
from ..exact import check_exact_oracle
from ..numerics.rational import count_pairs, fit_free, fit_row, fit_shifts
from ._common import EPS, fits_name_rounding, heads_result, redraw_direction, verify_heads, visibility_floor
from ._route import heads_from_rows

# --------------------------------------------------------------------------------------------
# General heads: the canonical form from value queries (this book's construction)
# --------------------------------------------------------------------------------------------


#: Answers within this fraction of ``max(1, max |v|)`` of ``x^T v`` show no head to
#: :func:`learn_canonical` (its rows ask longer queries than the counts route's: a looser floor).
CANONICAL_INVISIBLE = 1e-12


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


@fits_name_rounding
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
    This book's construction (not in [1]_; [2]_'s algorithm, known from its abstract only, is not
    public). A query of ``n`` copies of ``u = x + delta`` followed by ``m`` copies of ``x`` gives every head the weight
    ``sigma(log(n/m) + l_h)`` on the copies, ``l_h = delta^T W_h x``, so

        VQ - x^T v = sum_h c_h sigma(log(n/m) + l_h),   c_h = delta^T v_h

    (the private module ``companion.numerics.rational``). For each row direction ``delta_i`` (an orthonormal basis) and
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
    d = check_exact_oracle(oracle, "learn_canonical")
    opts = check_options(
        H, scale=scale, max_len=max_len, n_points=n_points, oversample=oversample,
        max_tokens_factor=max_tokens_factor, row_retries=row_retries, tol=tol, verify=verify,
        verify_rtol=verify_rtol, seed=seed,
    )  # fmt: skip
    n, m, n_x, n_link = _design_counts(d, opts)
    if hasattr(oracle, "require"):
        oracle.require(_planned(d, opts), learner="learn_canonical")
    count = QueryCount(oracle)
    rng = np.random.default_rng(opts.seed)
    design, P, Xs = make_design(oracle, rng, d, opts, n, m, n_x, n_link)
    rows, Xs, n_redrawn = learn_rows(oracle, design, rng, P, Xs, opts.row_retries)
    i0, perms, link_err = link_rows(oracle, design, P, rows)
    Rw = np.array([rows[i].R[perms[i]] for i in range(d)])  # (d, H, d): delta_i^T W_h
    Cv = np.array([rows[i].c[perms[i]] for i in range(d)])  # (d, H): delta_i^T v_h
    model = heads_from_rows(P, Rw, Cv)  # rows delta_i, redrawn ones included
    diagnostics = {
        "n_heads": model.n_heads,
        "max_len": int(np.max(n + m)),
        "n_points": int(n.size),
        "n_learn_queries": int(count.total),
        "kim_count": int(4 * model.n_heads * d * d - 2 * model.n_heads + 1),
        "resolved_fraction": float(np.min([row.fraction for row in rows])),
        "max_sensitivity": float(np.max([row.sensitivity for row in rows])),
        "reference_row": i0,
        "n_tokens": int(Xs.shape[0]),
        "n_redrawn_rows": n_redrawn,
        "max_link_error": max(link_err, default=0.0),
    }
    return canonical_result(oracle, count, model, diagnostics, opts)


def canonical_plan(d: int, H=None, *, verify: int = 64) -> int:
    """The queries :func:`learn_canonical` reserves at dimension ``d`` with its default options.

    ``d`` length-1 queries, ``ceil(oversample d)`` tokens' pairs for each of the ``d`` rows and
    the links' pairs for ``d - 1`` rows, at ``n_points`` counts each (``H_plan`` = ``H``, or 8
    when ``H`` is None), and ``verify`` fresh ones. A lower bound where rows are redrawn or draw
    more tokens (up to ``max_tokens_factor d``, its parameters).

    Examples
    --------
    >>> canonical_plan(4, 2, verify=0)
    496
    """
    defaults = {k: v.default for k, v in inspect.signature(learn_canonical).parameters.items() if k != "oracle"}
    defaults.update(H=H, verify=verify)
    return _planned(check_int(d, "d", minimum=1), check_options(**defaults))


def _design_counts(d: int, opts) -> tuple:
    """``(n, m, n_x, n_link)``: the counts ``(n, m)`` of each pair, the query tokens per row and the link
    tokens, for checked options."""
    n, m = count_pairs(opts.n_points, opts.max_len)
    n_x, n_link = int(np.ceil(opts.oversample * d)), max(3, int(np.ceil(2 * opts.H_plan**2 / opts.n_points)))
    return n, m, n_x, n_link


def _planned(d: int, opts) -> int:
    """:func:`canonical_plan`'s count for checked options."""
    n, _, n_x, n_link = _design_counts(d, opts)
    return d + d * n_x * n.size + (d - 1) * n_link * n.size + opts.verify


@dataclass(frozen=True)
class CanonicalOptions:
    """The checked options of :func:`learn_canonical` (``H_plan``: ``H``, or 8 to plan with)."""

    H: int | None
    H_plan: int
    scale: float
    max_len: int
    n_points: int
    oversample: float
    max_tokens_factor: float
    row_retries: int
    tol: float
    verify: int
    verify_rtol: float
    seed: int


def check_options(H, **kw) -> CanonicalOptions:
    """The options of :func:`learn_canonical`, checked in the order of its signature."""
    H = None if H is None else check_int(H, "H", minimum=1)
    scale = check_real(kw["scale"], "scale", minimum=0.0, strict=True, maximum=100.0)
    max_len = check_int(kw["max_len"], "max_len", minimum=5)
    H_plan = 8 if H is None else H
    n_points = kw["n_points"]
    n_points = 4 * H_plan + 4 if n_points is None else check_int(n_points, "n_points", minimum=3)
    oversample = check_real(kw["oversample"], "oversample", minimum=1.0)
    max_tokens_factor = check_real(kw["max_tokens_factor"], "max_tokens_factor", minimum=oversample)
    row_retries = check_int(kw["row_retries"], "row_retries", minimum=0)
    tol = check_real(kw["tol"], "tol", minimum=0.0, strict=True, maximum=1e-2)
    verify = check_int(kw["verify"], "verify", minimum=0)
    verify_rtol = check_real(kw["verify_rtol"], "verify_rtol", minimum=0.0, strict=True)
    seed = check_int(kw["seed"], "seed", minimum=0)
    return CanonicalOptions(
        H, H_plan, scale, max_len, n_points, oversample, max_tokens_factor, row_retries, tol, verify, verify_rtol, seed
    )


@dataclass(frozen=True)
class CanonicalDesign:
    """What :func:`learn_canonical` asks and fits with: the copies ``n``, ``m`` (S,) with
    ``s = log(n / m)``, the link tokens ``X_link`` (n_link, d), the length-1 answers ``v`` (d,),
    the most tokens a row may ask (``max_tokens``) and the options it reads."""

    d: int
    H: int | None
    scale: float
    tol: float
    n: np.ndarray
    m: np.ndarray
    X_link: np.ndarray
    v: np.ndarray
    max_tokens: int

    @property
    def s(self) -> np.ndarray:
        return np.log(self.n / self.m)


@dataclass(frozen=True)
class CanonicalRow:
    """One row's fit: amplitudes ``c`` (H,) = ``delta_i^T v_h``, ``R`` (H, d) = ``delta_i^T W_h``,
    the ``fraction`` of its tokens that resolved every head and the fit's rounding ``sensitivity``."""

    c: np.ndarray
    R: np.ndarray
    fraction: float
    sensitivity: float


def _scaled_tokens(rng, k, d, scale):
    X = rng.standard_normal((k, d))
    X *= scale / np.linalg.norm(X, axis=1, keepdims=True)
    return X


def make_design(oracle, rng, d, opts, n, m, n_x, n_link) -> tuple:
    """The directions ``P`` (d, d; rows orthonormal, redrawn in place later), the first ``n_x``
    tokens and the link tokens (norm ``scale``), then ``d`` length-1 queries for ``v``."""
    P, R = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(R))).T  # rows delta_i, orthonormal
    Xs = _scaled_tokens(rng, n_x, d, opts.scale)
    X_link = _scaled_tokens(rng, n_link, d, opts.scale)
    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)
    max_tokens = int(np.ceil(opts.max_tokens_factor * d))
    return CanonicalDesign(d, opts.H, opts.scale, opts.tol, n, m, X_link, v, max_tokens), P, Xs


def _wrong_H_hint(design) -> str:
    return f"H={design.H} may be wrong (try H=None to detect it), or " if design.H is not None else ""


def ask_row_terms(oracle, design, rng, delta, Xs, H_row) -> tuple:
    """Row ``delta``'s answers at every token and their terms (:func:`_row_terms`), asking more
    tokens (shared by the later rows) while fewer than ``d + 2`` resolve every head, up to
    ``max_tokens``. Returns ``(G, c, L, Xs)``."""
    d, s, n, m, v, tol = design.d, design.s, design.n, design.m, design.v, design.tol
    G = _ask_rows(oracle, delta, Xs, n, m, v)
    fits = None
    while True:
        c, L, fits = _row_terms(s, G, H_row, tol, d + 2, fits)
        n_ok = 0 if L is None else int(np.all(np.isfinite(L), axis=1).sum())
        if n_ok >= d + 2 or Xs.shape[0] >= design.max_tokens:
            break
        # Too few tokens resolved all heads: ask more tokens (shared by the later rows).
        if Xs.shape[0] == G.shape[0]:
            Xs = np.vstack([Xs, _scaled_tokens(rng, int(np.ceil(d / 2)), d, design.scale)])
        G = np.vstack([G, _ask_rows(oracle, delta, Xs[G.shape[0] :], n, m, v)])
    if G.shape[0] < Xs.shape[0]:
        G = np.vstack([G, _ask_rows(oracle, delta, Xs[G.shape[0] :], n, m, v)])
        c, L, fits = _row_terms(s, G, H_row, tol, d + 2, fits)
    return G, c, L, Xs


def learn_row(oracle, design, rng, P, Xs, i, H_row) -> tuple:
    """Row direction ``P[i]``: its terms, the tokens whose shifts agree, the joint fit and its
    check. Returns the :class:`CanonicalRow` and the tokens ``Xs`` (extended if more were asked)."""
    G, c, L, Xs = ask_row_terms(oracle, design, rng, P[i], Xs, H_row)
    n_x, d, tol = Xs.shape[0], design.d, design.tol
    if c is None and np.all(np.abs(G) <= visibility_floor(design.v, rel=CANONICAL_INVISIBLE)):
        raise NotIdentifiableError(
            f"row {i}: the answers are x^T v for every query token, with no head's softmax "
            "visible: the heads' values cancel (e.g. v and -v on equal W), so the canonical form "
            "has no heads and no W is identifiable from these queries."
        )
    if c is None:
        raise OracleInconsistentError(
            f"row {i}: no well-conditioned fit of the logistic sum among {n_x} query tokens "
            f"(tolerance {tol:g}); " + _wrong_H_hint(design)
            + "raise max_len or scale, or give H; the oracle may also not be a sum of heads."
        )  # fmt: skip
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
            f"consistently (need {d} with well-conditioned tokens); " + _wrong_H_hint(design)
            + "raise max_tokens_factor, max_len or scale."
        )  # fmt: skip
    c, R, info = fit_row(design.s, G, Xs, c, R0)
    if info["residual"] > 1e3 * EPS * info["scale"] * np.sqrt(G.size) or info["sensitivity"] > tol:
        raise OracleInconsistentError(
            f"row {i}: the joint fit of {c.size} heads over {n_x} tokens has misfit "
            f"{info['residual'] / info['scale']:.2g} and rounding sensitivity "
            f"{info['sensitivity']:.2g} (tolerance {tol:g}); raise max_len or scale."
        )
    return CanonicalRow(c, R, float(ok.mean()), info["sensitivity"]), Xs


def learn_rows(oracle, design, rng, P, Xs, row_retries) -> tuple:
    """Every row, each with up to ``row_retries`` new directions where it refuses; then rows that see
    fewer heads than the most any row sees get new directions too (a head invisible along them).
    Returns the rows, the tokens and the number of rows redrawn."""
    d, n_redrawn = design.d, 0
    out: list = [None] * d
    for i in range(d):
        for attempt in range(row_retries + 1):
            try:
                out[i], Xs = learn_row(oracle, design, rng, P, Xs, i, design.H)
                break
            except OracleInconsistentError:
                if attempt == row_retries:
                    raise
                redraw_direction(rng, P, i)
                n_redrawn += 1
    H_found = max(row.c.size for row in out)
    for i in range(d):
        attempt = 0
        while out[i].c.size != H_found:  # a head invisible along this direction
            if attempt == row_retries:
                raise OracleInconsistentError(
                    f"row {i} sees {out[i].c.size} heads, other rows {H_found}, after "
                    f"{row_retries} new directions; change seed."
                )
            redraw_direction(rng, P, i)
            n_redrawn += 1
            attempt += 1
            try:
                out[i], Xs = learn_row(oracle, design, rng, P, Xs, i, H_found)
            except OracleInconsistentError:
                pass
    return out, Xs, n_redrawn


def link_rows(oracle, design, P, rows) -> tuple:
    """Every row linked to a reference row ``i0`` (the widest gaps between its amplitudes) through
    fits at ``delta_i0 + delta_i``. Returns ``(i0, perms, link_err)``."""
    d, s, X_link = design.d, design.s, design.X_link
    amps = [row.c for row in rows]
    H_found, n_link = amps[0].size, X_link.shape[0]
    gaps = [np.min(np.diff(np.sort(a))) if a.size > 1 else np.inf for a in amps]
    i0 = int(np.argmax(gaps))
    perms = [np.arange(H_found) if H_found == 1 or i == i0 else None for i in range(d)]
    link_err = []
    for i in (i for i in range(d) if perms[i] is None):
        G = _ask_rows(oracle, P[i0] + P[i], X_link, design.n, design.m, design.v)
        # Every candidate term (head h of row i0 with head g of row i) has known shifts at the link
        # tokens, so the link answers are linear in the H^2 candidate amplitudes beta_hg; the true
        # pairs have beta_hg = c_h(i0) + c_g(i), the others 0.
        shifts = (
            np.einsum("hd,kd->kh", rows[i0].R, X_link)[:, :, None]
            + np.einsum("gd,kd->kg", rows[i].R, X_link)[:, None, :]
        )  # (n_link, H, H)
        A = expit(s[None, :, None, None] + shifts[:, None]).reshape(n_link * s.size, -1)
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
    return i0, perms, link_err


def canonical_result(oracle, count, model, diagnostics, opts):
    """:func:`learn_canonical`'s result, verified on ``opts.verify`` fresh queries."""
    message = f"found {model.n_heads} heads from {count.total} queries of length <= {diagnostics['max_len']}"
    try:
        what = "a sum of attention heads"
        checked = verify_heads(oracle, model, opts.verify, rtol=opts.verify_rtol, seed=opts.seed + 1, what=what)
    except OracleInconsistentError as exc:
        raise OracleInconsistentError(
            f"learn_canonical: the recovered {model.n_heads}-head canonical form fails "
            f"verification ({str(exc).split(':')[0]}); the oracle is not a sum of attention "
            "heads, or its heads are too close to resolve (try a larger scale or max_len)."
        ) from exc
    return heads_result(
        oracle, count.start, model.Ws, model.vs, verification=checked, message=message, diagnostics=diagnostics
    )
