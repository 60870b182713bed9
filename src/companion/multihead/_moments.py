"""The counts route's moment start (private; this book's own, :mod:`companion.multihead._star`).

:func:`companion.multihead.learn_canonical_rational` with ``start="moments"``: one centre row solved
from the heads' span and Jennrich's algorithm on Taylor moments, then a star of rows around it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._learner import QueryCount, reserve
from ..errors import NotIdentifiableError, OracleInconsistentError
from ..numerics.rational import fit_row_joint, fit_rows_joint, ratio_design
from . import _star
from ._common import visibility_floor
from ._route import ask_pairs, heads_from_rows, moment_plan, rational_result, route_tokens

#: Singular values of the stacked gradients (relative to the largest) above which a direction is a
#: head's, when only ``H_bound`` is known (measured d = 64, H = 12: the H-th at 9e-5 to 8e-4, the
#: (H + 1)-st at 2e-10 to 2e-9).
RANK_TOL = 1e-7


@dataclass(frozen=True)
class MomentDesign:
    """What the moment start asks and fits with: the ratios ``n``, ``m`` (S,), the rows' tokens
    ``X`` (K, d) and their ``x x^T`` ``XX`` (K, d * d), the length-1 answers ``v`` (d,), and the
    options it reads (``H_plan``, ``known``, ``scale``, ``tol``) and the ``plan``."""

    d: int
    H_plan: int
    known: bool
    scale: float
    tol: float
    plan: dict
    n: np.ndarray
    m: np.ndarray
    X: np.ndarray
    XX: np.ndarray
    v: np.ndarray

    @property
    def s(self) -> np.ndarray:
        return np.log(self.n / self.m)

    def ask(self, oracle, delta, T) -> np.ndarray:
        """The pairs ``VQ - t^T v`` at ``u = t + delta`` for the tokens ``T`` (k, d): shape (k, S)."""
        return ask_pairs(oracle, T + delta, T, self.n, self.m) - (T @ self.v)[:, None]


@dataclass(frozen=True)
class Centre:
    """One centre row: its direction ``delta``, amplitudes ``gamma`` (H,) and rows ``R`` (H, d)
    (None where it failed), its pairs ``G0`` (K, S) and ``info`` (what the diagnostics report)."""

    delta: np.ndarray
    gamma: np.ndarray | None
    R: np.ndarray | None
    G0: np.ndarray
    info: dict

    @property
    def ratio(self) -> float:
        """The smallest ``|gamma_h| / max |gamma|`` (0 where the centre failed)."""
        return self.info["amplitude_ratio"]


def _unit(q):
    return q / np.linalg.norm(q)


def make_design(oracle, rng, d, opts, plan) -> MomentDesign:
    """``d`` length-1 queries for ``x^T v``, then the rows' tokens from ``rng``."""
    n, m = ratio_design(opts.H_plan)
    v = np.asarray(oracle(np.eye(d)[:, None, :]), dtype=np.float64)  # d length-1 queries: x^T v
    X = route_tokens(rng, plan["K"], d, opts.scale, opts.spread)
    XX = np.einsum("ka,kb->kab", X, X).reshape(X.shape[0], d * d)
    return MomentDesign(d, opts.H_plan, opts.known, opts.scale, opts.tol, plan, n, m, X, XX, v)


def head_span(oracle, design, rng, delta) -> tuple:
    """Step 1 of :mod:`._star` at one centre: the heads' span from central differences of the pairs
    in ``x``. Returns ``(U, sv, H)``: a basis (d, H) of the span, the singular values, the heads."""
    d, H_plan = design.d, design.H_plan
    eta = _star.ETA * design.scale
    E = eta * np.eye(d)
    blocks = []
    for _ in range(_star.N_BASE):
        x0 = _unit(rng.standard_normal(d)) * design.scale
        G = design.ask(oracle, delta, np.vstack([x0 + E, x0 - E]))
        blocks.append(((G[:d] - G[d:]) / (2 * eta)).T)
    D = np.vstack(blocks)
    sv = _star.head_subspace(D, d)[1]
    if float(np.max(np.abs(D))) <= visibility_floor(design.v):
        raise NotIdentifiableError(
            "every answer's gradient in x vanishes along the centre's direction: no head's softmax "
            "is visible (the values cancel); the canonical form has no heads here."
        )
    H = H_plan if design.known else int(np.sum(sv > RANK_TOL))
    if H > H_plan:
        raise OracleInconsistentError(
            f"the heads' span along the centre has dimension {H} (singular values above "
            f"{RANK_TOL:g} of the largest), more than H_bound={H_plan}: pass a larger H_bound."
        )
    return _star.head_subspace(D, H)[0], sv, H


def solve_centre(oracle, design, rng, delta) -> Centre:
    """Steps 1 and 2 of :mod:`._star` at one centre (the span, Jennrich's algorithm on the Taylor
    moments), then the joint fit of its own row."""
    s, X, tol, plan = design.s, design.X, design.tol, design.plan
    U, sv, H = head_span(oracle, design, rng, delta)
    Z = rng.standard_normal((plan["n_moment_tokens"], H)) * (_star.MOMENT_SCALE * design.scale / np.sqrt(H))
    degree = min(_star.TAYLOR_DEGREE, s.size - 3)
    P, taylor = _star.power_sums(s, design.ask(oracle, delta, Z @ U.T), float(delta @ design.v), degree)
    C, gam, gap = _star.jennrich(_star.symmetric_fit(Z, P[:, 1], 2), _star.symmetric_fit(Z, P[:, 2], 3), rng)
    G0 = design.ask(oracle, delta, X)
    info = {
        "subspace_sv": sv[: H + 1].tolist(),
        "taylor_misfit": float(np.max(taylor)),
        "jennrich_gap": gap,
        "amplitude_ratio": 0.0,
        "H": H,
        "centre_residual": np.inf,
    }
    if gap <= 0.0:
        return Centre(delta, None, None, G0, info)
    gb, Rb, rb, sb = fit_rows_joint(s, G0[None], X, gam[None], (C @ U.T)[None], XX=design.XX)
    g0, R0, r0 = gb[0], Rb[0], float(rb[0] / sb[0])
    if r0 > tol:
        g0, R0, fit = fit_row_joint(s, G0, X, g0, R0, XX=design.XX, iters=30)
        r0 = fit["residual"] / fit["scale"]
    info["centre_residual"] = r0
    if r0 > tol:
        return Centre(delta, None, None, G0, info)
    info["amplitude_ratio"] = float(np.min(np.abs(g0)) / np.max(np.abs(g0)))
    return Centre(delta, g0, R0, G0, info)


def choose_centre(oracle, design, rng) -> tuple:
    """Centres tried until one solves with no head weaker than ``WEAK_CENTRE`` (at most
    ``plan["n_centres"]``); the best solved one, and how many were tried."""
    found = []
    for _ in range(design.plan["n_centres"]):
        centre = solve_centre(oracle, design, rng, _unit(rng.standard_normal(design.d)))
        found.append(centre)
        if centre.gamma is not None and centre.ratio >= _star.WEAK_CENTRE:
            break
    best = max(found, key=lambda c: (c.gamma is not None, c.ratio))  # the first of equals
    if best.gamma is None:
        info = best.info
        raise OracleInconsistentError(
            f"the moment start failed at all {len(found)} centres (Jennrich eigenvalue gap "
            f"{info['jennrich_gap']:.2g}, Taylor misfit {info['taylor_misfit']:.2g} relative, centre's joint "
            f"fit {info['centre_residual']:.2g} relative, tol={design.tol:g}): a Taylor misfit above 1e-10 means "
            "the moment tokens' shifts are too large for the series (lower scale), or the oracle is not a "
            "sum of softmax heads (a residual or bias term adds what no head's series has); otherwise use "
            "learn_canonical."
        )
    return best, len(found)


def fit_star(oracle, design, rng, centre) -> tuple:
    """The star: rows ``delta_0 + eps q_i`` (``q_i`` an orthonormal basis of ``delta_0``'s complement),
    tracked from the centre's solution (:func:`._star.track_rows`); a row that misfits gets a new
    offset while spare rows remain. Returns ``(P, gamma, R, rel, n_tracked, n_redrawn)``."""
    d, s, X, XX, tol = design.d, design.s, design.X, design.XX, design.tol
    delta0, g0, R0, G0 = centre.delta, centre.gamma, centre.R, centre.G0
    Q = np.linalg.qr(np.column_stack([delta0, rng.standard_normal((d, d - 1))]))[0][:, 1:].T
    Q *= np.sign(Q @ rng.standard_normal(d))[:, None]
    P = np.vstack([delta0, delta0[None] + _star.STAR_EPS * Q])
    G = np.stack([design.ask(oracle, P[i], X) for i in range(1, d)]) if d > 1 else np.empty((0, X.shape[0], s.size))
    spare, redrawn = design.plan["spare_rows"], 0
    gam, R, rel, tracked = _star.track_rows(s, G, X, g0, R0, G0, tol=tol, XX=XX, max_serial=spare)
    for i in np.flatnonzero(rel > tol):
        while rel[i] > tol and spare:
            # A new offset for this row: along the old one a head may be nearly invisible.
            spare -= 1
            redrawn += 1
            q = rng.standard_normal(d)
            P[i + 1] = delta0 + _star.STAR_EPS * _unit(q - (q @ delta0) * delta0)
            G[i] = design.ask(oracle, P[i + 1], X)
            gi, Ri, ri, _ = _star.track_rows(s, G[i : i + 1], X, g0, R0, G0, tol=tol, XX=XX)
            gam[i], R[i], rel[i] = gi[0], Ri[0], ri[0]
    if np.any(rel > tol):
        bad = np.flatnonzero(rel > tol)
        raise OracleInconsistentError(
            f"{bad.size} of the star's {d - 1} rows (first: {int(bad[0]) + 1}) misfit by up to "
            f"{float(np.max(rel)):.2g} relative after continuation from the centre (tol={tol:g}); the "
            f"centre's smallest amplitude is {centre.ratio:.2g} of its largest (a head nearly invisible there is "
            f"nearly invisible in every row of the star): use learn_canonical, or another seed."
        )
    return P, gam, R, rel, tracked, redrawn


def learn_moments(oracle, d, opts):
    """:func:`~companion.multihead.learn_canonical_rational` with ``start="moments"``: plan and
    reserve, the design, the centre, the star, the result."""
    plan = moment_plan(d, opts.H_plan)
    reserve(oracle, plan["n_queries"] + opts.verify, "learn_canonical_rational")
    count = QueryCount(oracle)
    rng = np.random.default_rng(opts.seed)
    design = make_design(oracle, rng, d, opts, plan)
    centre, n_tried = choose_centre(oracle, design, rng)
    P, gam, R, rel, tracked, redrawn = fit_star(oracle, design, rng, centre)
    model = heads_from_rows(P, np.vstack([centre.R[None], R]), np.vstack([centre.gamma[None], gam]))
    info = centre.info
    extra = {
        "start": "moments",
        "n_centres_tried": n_tried,
        "centre_amplitude_ratio": centre.ratio,
        "subspace_sv": info["subspace_sv"],
        "taylor_misfit": info["taylor_misfit"],
        "jennrich_gap": info["jennrich_gap"],
        "n_tracked_rows": tracked,
        "n_redrawn_rows": redrawn,
        "max_row_residual": float(max(info["centre_residual"], float(np.max(rel, initial=0.0)))),
    }
    return rational_result(
        oracle, count, model, design.n + design.m, d, opts, plan, extra=extra, label="; moment start"
    )
