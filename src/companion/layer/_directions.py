"""Behind a post-LN whose ``eps`` hides the norms (BERT's 1e-12): the norms from the row space (this book's own).

A post-LN's answer ``y = gamma * z + beta`` gives ``z = P u / sqrt(|P u|^2 / d_out + eps)``: the direction of
``P u`` (``u = x_N + o(X)``, ``P`` the centring) to float64's precision, but its norm only through the gap
``1 - |z|^2 / d_out = eps / (var(u) + eps)``, to about ``2**-53 / gap`` (``layer._norm.gap_message``). At
BERT's ``eps = 1e-12`` that is 1e-6 or worse, and the heads' stage needs better. The norms come back from
directions alone, up to one scale ``s0`` for every query, where the queries have structure:

1. **One token.** ``P u(x) = A x + c`` is affine. On ``x0``, ``x0 + t e_k``, ``x0 + 2 t e_k`` the three
   values ``s w`` (``w`` the directions) are affinely collinear, ``s_2 w_2 - 2 s_1 w_1 + s_0 w_0 = 0``:
   two ratios ``s_1 / s_0``, ``s_2 / s_0`` by least squares in ``d_out`` equations, so ``A`` and ``c`` in
   units of ``s_0`` from ``2 d + 1`` queries (:func:`one_token_map`).
2. **Pair queries** (the joint heads' stage, :mod:`companion.layer._joint`): for a row ``delta`` and a token
   ``x`` the ``2 H`` answers are ``P u = c_x + sum_h phi(r, p_h) P Gamma_h`` with ``c_x = A x + c`` known and
   ``R = span(P Gamma_h)`` the row space, the same for every token of the row. So each token's directions
   span ``V_x = span(c_x, R)`` (dimension ``H + 1``), ``R`` is the common part of the ``V_x`` (the ``H``
   leading eigenvectors of the sum of their projections), and with ``Q`` the projection off ``R`` each
   scale solves ``s Q w = Q c_x``: ``s = <Q w, Q c_x> / |Q w|^2`` (:class:`RowScaled`). No query is added.
   It needs ``c_x`` outside ``R`` and the ``V_x`` to meet in ``R`` only: ``d_out >= H + 3``.

On answers served in float32 the learner takes this route behind any post-LN (given ``H``), whatever the gap,
with its thresholds at float32's ``u`` (:func:`one_token_tol`; the joint stage's
:func:`~companion.layer._float32.joint_options`), and then polishes the heads and output maps on fresh queries'
directions (:func:`polish_post_directions`: dense up to ``FLOAT32_POLISH_MAX_UNKNOWNS``, matrix-free above, up
to ``FLOAT32_FREE_POLISH_MAX_UNKNOWNS``), which a float32 route cannot skip: unpolished, a Keras block in float32
(d = 16, H = 4) missed its verification queries by 135 u; polished, it predicts 200 fresh served answers to 6.7 u.

The one scale ``s0`` is then fixed as for any post-LN: by the identity skip (``canonical``), and ``eps``
follows from the gaps (:func:`post_ln_eps`), to about ``u / gap`` relative (``u`` the answers' precision,
``2**-53`` at float64), which moves the predictions by about that error times the gap, at the answers' rounding
(``eps`` enters them as ``eps / var``); on float32 answers, where ``gamma`` and ``beta`` carry errors, ``eps`` is
often not determined, and ``eps_rtol`` says so. Unlike ``layer._norm.Denormalised`` (the norm from the gap) the
precision of the norms here does not depend on ``eps``. Random queries have no such structure: at float64 the route
asks no least squares and no polish on them; ``M_h`` comes from the joint stage's amplitude vectors and the skip and
bias from the one-token map (the float32 polish fits random queries' directions only, never their norms).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..errors import OracleInconsistentError, PrecisionError
from ..oracles import VectorView, unit_roundoff
from ._fit import (
    FIT_MAX_LEN,
    features,
    group_by_length,
    head_ranks,
    map_ranks,
    polish_directions,
    polish_directions_free,
    polish_row_queries,
)
from ._float32 import FLOAT32_POLISH_MAX_UNKNOWNS, FLOAT32_FREE_POLISH_MAX_UNKNOWNS, joint_options
from ._joint import joint_plan, learn_heads_joint, scale_plan
from ._model import centre
from ._norm import ROUNDING_UNITS, any_seed

__all__ = [
    "DIRECTIONS_FROM_GAP",
    "ROW_TOKENS",
    "ONE_TOKEN_TOL",
    "one_token_tol",
    "DIRECTIONS_MEASURED_FLOAT32",
    "one_token_map",
    "RowScaled",
    "post_ln_eps",
    "GapFit",
    "directions_plan",
    "directions_apply",
    "DIRECTIONS_MEASURED",
    "ROW_SPACE",
    "NO_DIRECTIONS",
    "learn_post_directions",
    "POLISH_QUERY_FACTOR",
    "FREE_POLISH_MAX_LEN",
    "polish_max_len",
    "DIRECTIONS_RANK_UNITS",
    "ABSORBED_OFF",
    "polish_plan",
    "polish_top_plan",
    "POLISH_TOP_RANGE",
    "polish_unknowns",
    "polish_post_directions",
    "FLOAT32_POST_VERIFY",
    "float32_post_reach",
]

#: Behind a post-LN (float64 answers, H given) the learner takes the norms from the row space (this module)
#: when the smallest gap ``1 - |z|^2 / d_out`` of its first answers is below this: ``layer._norm.LOW_GAP``, the
#: gap below which a stage on the norms from the gap was measured to fail.
DIRECTIONS_FROM_GAP = 1e-6

#: The one-token map's collinearity misfit (:func:`one_token_map`) above which the answers are not an affine map
#: seen through a LayerNorm: a gross check (the joint stage's fits and the verification certify the result).
#: Measured: 4.5e-15 on a d = 16, H = 2 residual block at eps 1e-12. On answers of a coarser precision ``u``
#: (float32's) the check is ``ROUNDING_UNITS u`` where that is larger (:func:`one_token_tol`): measured (2026-12-05),
#: 1.7 u to 4.8 u on 24 residual post-LN blocks rounded to float32 (d = 8 to 48, H = 1 to 12, eps 1e-12 to 1e-3).
ONE_TOKEN_TOL = 1e-9


def one_token_tol(u: float) -> float:
    """The one-token map's collinearity check at the answers' precision ``u``: ``ONE_TOKEN_TOL``, or
    ``ROUNDING_UNITS u`` where that is larger (float32's ``u``: 1.5e-5)."""
    return max(ONE_TOKEN_TOL, ROUNDING_UNITS * float(u))


#: What this route that takes a post-LN's norms from the row space learned (this book's, measured; for a refusal).
DIRECTIONS_MEASURED = (
    "120 residual post-LN blocks at eps 1e-12 and 1e-8, d 8 to 32, H 1 to 4, seeds 0 to 2, fresh errors up to "
    "2.4e-12; one at d = 32, H = 8 and one at d = 48, H = 12"
)

#: The same on float32 answers (this book's, measured 2026-12-05, H = 8 after the restarts of ``_joint._restarted``;
#: learner seed 0 or the block's; ``u = 2**-24``).
DIRECTIONS_MEASURED_FLOAT32 = (
    "18 of 18 residual post-LN blocks rounded to float32 (d = 8 to 32, H = 1 to 4, eps 1e-12 to 1e-2, seeds 0 to "
    "2), predicting the exact block to 0.8 u to 1.9 u where polished; 83 of 84 at d = 5 to 11, H = 1 and 2, eps "
    "1e-3, 0.1 and 1, seeds 0 and 1 (learner seed = block seed), to 25.9 u on 200 fresh queries (re-measured "
    "2026-12-06; the other, d = 5, H = 2, eps 1e-3, seed 0, was refused by the verification at 157 u and learned at "
    "learner seeds 1 to 3); Keras 3 MultiHeadAttention with "
    "LayerNormalization computed in float32, 3 of 3 below the polish's cap (5.2 u to 9.8 u against its served "
    "answers). Above the dense polish's 5,000 unknowns, polished matrix-free: 5 of 5 at d = 24 to 48, H = 4 to 12 "
    "(to 1.1 u to 1.7 u; unpolished 20 u to 54 u, one refused); 6 of 6 at H = 8, d = 32 and 64, eps 1e-12, seeds 0 "
    "to 2, to 0.74 u to 0.90 u on 200 fresh queries (none before the joint stage's restarts: a row's joint fit "
    "misfit by 0.06 to 0.6)"
)

#: Why a post-LN whose eps hides the norms was not learned from its directions instead (MIN_GAP's refusal).
NO_DIRECTIONS = (
    "Given H (and d_out >= H + 3, heads not 'readout') the learner takes the norms from the pair queries' row "
    "space instead (companion.layer._directions, this book's own)."
)

#: The learner's name for this route (``diagnostics["heads_learner"]``).
ROW_SPACE = "joint, norms from the row space"

#: Tokens of a row whose directions start its row space (two meet in it; more average the rounding).
ROW_TOKENS = 8

#: Tokens of a row whose answers refine its row space, and the largest number of Gauss-Newton steps
#: (``RowScaled._refine``). The start alone left rows of H = 8 heads (d = 32) at rank 17, their (H + 1)-th singular
#: value 3.7e-9 of the largest (each token's 2 H directions span its H + 1 dimensions ill-conditioned, so its
#: subspace is off), and H = 12 (d = 48) at 3.4e-7; two steps take it to rounding (measured, d = 48, H = 12: 3.9e-6,
#: 6.8e-10, 4.9e-15 relative error of the scaled answers after 0, 1, 2 steps on a link's 8 tokens).
ROW_FIT_TOKENS = 8
ROW_ITERATIONS = 30

#: A token whose one-token answer ``c_x`` lies this close to the row space (``|Q c_x| / |c_x|`` below it, ``Q`` the
#: projection off it) leaves its queries' scales undetermined: ``RowScaled`` refits the row space without it, and
#: refuses if that does not help (this book's threshold). Measured (2026-12-06, MiniLM served in float32, two BLAS
#: threads, the run at b84b139): the refinement of row 153's link batch (8 tokens) converged to a row space that took
#: in token 6's ``c_x`` (1.0e-7 of it left off), whose 24 scales came out 0.0016 to 0.0097 against 10.4 to 11.8 for
#: the others, with the batch's misfit at 2.5e-5; the link then failed (coefficients 151 off a permutation). The
#: other batches of that run measured (rows 0 and 153, their first rows' batches, the links): 0.39 and above.
ABSORBED_OFF = 1e-2

#: On float32 answers the joint stage counts the scaled answers' singular values above this many u (relative to the
#: largest) in a row's rank, not ``FLOAT32_RANK_UNITS`` (64, measured on answers seen directly): the row scaling carries
#: the directions' rounding into the norms. Measured (2026-12-05, the (H + 1)-th singular value of a row, rounding): 79
#: u to 170 u on blocks rounded to float32 (d = 6, H = 1 and 2, eps 1e-3 and 0.1, seed 1: refused at 64 u); 1,630 u on
#: row 0 of MiniLM's block computed in float32, so it was set to 4,096 first. Raised to 16,384 (2026-12-06) after
#: MiniLM's whole run at 4,096 was refused at row 216, whose (H + 1)-th was 3.2e-4 of the largest (about 5,400 u) on two
#: BLAS threads (data/results/minilm_block_float32_9a28bce.json; 3,446 u on one, the largest of 381 rows logged, median
#: 1,558 u: data/results/minilm_block_float32_rows_9a28bce.json): the rounding there is systematic and grows with the
#: token scale, a head's singular value faster (``_joint._token_scale``, which doubles the scale while a first row's
#: rank is below H). The heads, the H-th, re-measured on 2026-12-06 (one BLAS thread, learner seed = block seed):
#: 111,137 u and above on 107 random blocks rounded to float32 (d = 5 to 64, H = 1 to 12, eps 1e-12 to 1, their (H +
#: 1)-th at 176 u or below), 267,825 u and above on the 4 Keras blocks of the tests (computed in float32, rounding 36 u
#: or below), 70,274 u on MiniLM's rows at its scale 16 (14,319 u on row 0 at scale 2). 16,384 lies about 3 times above
#: the largest rounding seen and 4.3 times below the faintest head at the scale its stage ran at; a fainter head ends in
#: a refusal (a rank below H), and one the count misses is the verification's to catch. MiniLM's whole run at 16,384 on
#: two BLAS threads (data/results/minilm_block_float32_161c582.json, its rows in its _rows_161c582.json)
#: counted every row's rank as 12, its (H + 1)-th at most 5,336 u and its H-th at least 70,253 u, and stopped at the
#: links.
DIRECTIONS_RANK_UNITS = 16384

#: The float32 polish (:func:`polish_post_directions`) asks this many times its unknowns over ``d_out - 2`` queries
#: (each gives ``d_out - 2`` numbers past its centring and its scale), at least ``polish_row_queries(d)`` (this book's
#: own). Measured (2026-12-05, Keras 3 MultiHeadAttention(use_bias=True) with the residual and LayerNormalization
#: in float32, d = 16, H = 4, key_dim 4, eps 1e-3, seed 0): a prototype with 600 queries (2.5 times) took 200 fresh
#: served answers from 360 u to 11.9 u and its own residual from 76 u to 1.5 u (rms); the learner's 511 (3 times), to
#: 6.7 u.
POLISH_QUERY_FACTOR = 3

#: The matrix-free polishes (above ``FLOAT32_POLISH_MAX_UNKNOWNS``: here, and without LayerNorm in
#: ``layer._learn._outputs`` since 2026-12-05) ask queries of lengths 2 to this, not 2 to 8 (this book's choice): each
#: LSMR product costs about the same per query whatever its length (``B (H d (d + 1) + p d_out)`` flops; the tokens
#: enter through ``B N H d`` only), and a query of ``n`` tokens carries ``n - 1`` score differences, so longer queries
#: meet ``polish_row_queries``' floor with fewer of them: at MiniLM's size (d = 384, H = 12) the floor falls from 73,920
#: queries to 18,480, below the output maps' 28,990, which then bind.
FREE_POLISH_MAX_LEN = 32

#: The matrix-free polish's second stage (this book's own): where the joint stage's token scale ``s`` is above 1, it
#: asks ``float32_polish_top_plan``'s further queries (as many as the first stage's, lengths 2 to 32) at token scales
#: log-uniform from ``s / POLISH_TOP_RANGE`` (at least 1) to ``s``, and polishes again from the first stage's end on
#: those queries alone: where the heads' score errors move the answers ``t^2`` times more, and where the
#: verification's scaled share asks. Measured on both stages' queries, as the stage ran until 2026-12-07 (2026-12-06,
#: MiniLM's block served in float32, the gamma-held polish's end point continued so: its 28,990 queries and 28,990
#: more at scales 4 to 16, two Gauss-Newton steps of 36 and 16 LSMR iterations, 915 CPU s on one BLAS thread;
#: data/results/minilm_polish_diagnosis.json): heads from 3.3e-6 to 7.1e-7 off (median), beta from 2.2e-6 to
#: 9.3e-7; with eps and gamma's scale from the gaps (:func:`post_ln_eps`) the learner's verification replayed 9.9 u,
#: 14.8 u (its scale-16 share, 75.9 u before) and 11.1 u (the emulation's own: 9.3 u, 8.1 u, 11.2 u), and fresh
#: queries at token scales 1 to 16 within 1.8 times the emulation's own distance (at most 14.5 u, at scale 16). On
#: its own queries alone (the same file's ``top_only_variant`` against ``top_stage_rerun``, both from the ffec805
#: run's polish inputs, products on the whole Theta then): 73 LSMR iterations against 52, in 533 CPU s against 703,
#: the verification replayed 10.0 u, 11.3 u and 11.8 u against 9.8 u, 14.6 u and 11.1 u, fresh queries at scales 1
#: to 16 within 1.9 times the emulation's own distance against 2.2 (14.9 u against 17.8 u at scale 16); ``eps`` and
#: gamma's scale are then fitted from the top queries' gaps.
POLISH_TOP_RANGE = 4

#: Tokens per link (the joint stage's pairs at delta_0 + delta_i): its default, 2, leaves a link's two tokens'
#: row space ill-determined. Measured (2026-12-04, d = 48, H = 12 residual post-LN block at eps 1e-12, seed 0):
#: with 2 the rows could not be linked (misfit 8.9). 8 is the float32 route's, which every joint plan reserves.
LINK_TOKENS = 8


def directions(norm, Y: np.ndarray) -> np.ndarray:
    """``(y - beta) / gamma``: the directions of ``P u`` (shape ``(B, d_out)``)."""
    return (Y - norm.beta) / norm.gamma


def one_token_map(oracle, norm, rng, t: float = 1.0):
    """``(A, c, misfit, X, Y)``: ``P u(x) = s0 (A x + c)`` for one token ``x``, from ``2 d + 1`` queries (step 1).

    ``A`` has shape ``(d_out, d)``, ``c`` ``(d_out,)``; ``s0`` is the scale of the query at ``x0`` (random,
    ``N(0, I / d)``). ``misfit`` is the largest ``|s_2 w_2 - 2 s_1 w_1 + w_0| / |w_0|``: rounding on an affine
    map, and the second difference the probe lines measure elsewhere. ``X`` (``(2 d + 1, 1, d)``) and ``Y``
    (``(2 d + 1, d_out)``) are the queries and their answers.
    """
    d = int(oracle.d)
    x0 = rng.standard_normal(d) / np.sqrt(d)
    E = t * np.eye(d)
    X = np.concatenate([x0[None], x0 + E, x0 + 2 * E])[:, None, :]
    Y = oracle(X)
    w = directions(norm, Y)
    w0, w1, w2 = w[0], w[1 : d + 1], w[d + 1 :]
    # per k, (s2, s1) from s2 w2 - 2 s1 w1 = -w0: 2 x 2 normal equations, batched over k
    B = np.stack([w2, -2.0 * w1], axis=2)  # (d, d_out, 2)
    s = np.linalg.solve(np.swapaxes(B, 1, 2) @ B, (np.swapaxes(B, 1, 2) @ -w0)[..., None])[..., 0]  # (d, 2)
    misfit = float(np.max(np.linalg.norm(B @ s[..., None] + w0[:, None], axis=1)) / np.linalg.norm(w0))
    A = ((s[:, 1:] * w1 - w0) / t).T  # (d_out, d)
    return A, w0 - A @ x0, misfit, X, Y


def directions_apply(H, heads: str, d_out: int, gap: float) -> bool:
    """Whether behind a post-LN the learner takes the norms from the row space: a gap below
    ``DIRECTIONS_FROM_GAP``, ``H`` given, ``d_out >= H + 3`` and ``heads`` not ``"readout"``."""
    return gap < DIRECTIONS_FROM_GAP and H is not None and d_out >= H + 3 and heads != "readout"


def directions_plan(d: int, H: int) -> int:
    """The queries of this route beyond the first answers: the one-token map's ``2 d + 1`` and the joint stage's,
    its token scale's doublings reserved (:func:`companion.layer._joint.scale_plan`)."""
    return 2 * d + 1 + joint_plan(d, H, LINK_TOKENS) + scale_plan(d, H)


def directions_route_plan(d: int, d_out: int, H: int, verify: int, float32: bool) -> int:
    """The row space's route's queries after the first answers: ``directions_plan``'s, on float32 answers the
    polish's (``float32_polish_plan`` and ``polish_top_plan``), and its verification's (at least
    ``FLOAT32_POST_VERIFY`` on float32's).

    ``learn_attention_layer``'s up-front plan adds it where a post-LN may take this route (this book's own count).

    Examples
    --------
    >>> directions_route_plan(8, 8, 2, 32, False)  # 2 d + 1, the joint stage's 1,280 and 528 doublings, 32
    1857
    """
    n_polish = polish_plan(d, d_out, H) + polish_top_plan(d, d_out, H) if float32 else 0
    return directions_plan(d, H) + n_polish + (max(verify, FLOAT32_POST_VERIFY) if float32 and verify else verify)


#: Fresh queries of the verification behind a float32 post-LN (at least; 0 stays 0): the LayerNorm divides by
#: ``sqrt(var(P u) + eps)``, so the few queries with a small variance carry the heads' float32 errors amplified.
#: Measured (2026-12-05, an outside tester's in-class blocks rounded to float32, polished): verified on 32 queries at
#: 8 u to 16 u, they missed 0.5 % to 1.4 % of 1,000 fresh ones by more than the 60 u allowed (up to 178 u), a tail
#: that 32 queries miss with probability 0.64 to 0.85 and 1,024 with 6e-3 to 5e-7. The check is a sample, not a
#: bound: a query's error grows about as ``1 / |P u|`` (the heads' absolute float32 errors over the norm the
#: LayerNorm divides by), and queries with ``var(P u)`` a hundred times below the median are rare. Measured: an
#: in-class block with d_out = 4 (d = 7, H = 1, no residual, eps 1e-5, seed 325, learner seed 1) is verified at 42 u
#: on its 1,024 queries and misses 12 of 3,000 fresh ones (lengths 1 to 40) by more than 60 u, up to 475 u, each at
#: a ``var(P u)`` below 2.4e-3 (median 0.15).
FLOAT32_POST_VERIFY = 1024


def float32_post_reach(H: int, d: int, d_out: int) -> None:
    """Raise :class:`~companion.errors.PrecisionError` (marked ``any_seed``) where a float32 post-LN block is above
    the polish's cap, ``FLOAT32_FREE_POLISH_MAX_UNKNOWNS`` (:func:`polish_plan` is 0): unpolished, the route's heads
    keep float32's errors."""
    if polish_plan(d, d_out, H):
        return
    n = polish_unknowns(d, d_out, H)
    msg = (
        "the answers are float32's and the block has a post-LN: the float32 route learns it from the row space's "
        "norms and then polishes its heads and output maps on fresh queries' directions (dense up to "
        f"FLOAT32_POLISH_MAX_UNKNOWNS = {FLOAT32_POLISH_MAX_UNKNOWNS:,} unknowns, matrix-free above), up to "
        f"FLOAT32_FREE_POLISH_MAX_UNKNOWNS = {FLOAT32_FREE_POLISH_MAX_UNKNOWNS:,} unknowns; this block has {n:,} "
        f"(d = {d}, H = {H}, d_out = {d_out}). Unpolished, the heads keep float32's errors: measured (2026-12-05), "
        "blocks rounded to float32 (d = 22 to 48) unpolished predicted fresh queries to 4 u to 122 u (u = 2**-24; the "
        "verification allows 60 u), and a Keras block computed in float32 (d = 24, H = 4) missed its verification by "
        "153 u; polished, 0.8 u to 1.9 u. At MiniLM's size (3,691,392 unknowns) the polish took 4,000 CPU s and "
        "5.8 GB (2026-12-06), and with its second stage (POLISH_TOP_RANGE: twice the queries) 3,000 CPU s on one "
        "BLAS thread and 11.0 GiB; its memory grows about as d**4. Serve the block in float64, or learn it from "
        "float32 answers at most the cap's size. Nothing was asked beyond the first "
        "answers (and the determinism check's, companion.layer._determinism); nothing was returned."
    )
    raise any_seed(PrecisionError(msg))


def polish_unknowns(d: int, d_out: int, H: int) -> int:
    """The float32 polish's unknowns: the heads' rows ``H d (d + 1)`` and ``Theta``'s ``((H + 1) d + 1) d_out``."""
    return H * d * (d + 1) + ((H + 1) * d + 1) * d_out


def polish_plan(d: int, d_out: int, H: int) -> int:
    """The float32 polish's queries (0 where its unknowns, ``polish_unknowns``, exceed
    ``FLOAT32_FREE_POLISH_MAX_UNKNOWNS``)."""
    n = polish_unknowns(d, d_out, H)
    if n > FLOAT32_FREE_POLISH_MAX_UNKNOWNS:
        return 0
    rows = polish_row_queries(d, polish_max_len(n))
    return max(rows, -(-POLISH_QUERY_FACTOR * n // max(1, d_out - 2)))


def polish_top_plan(d: int, d_out: int, H: int) -> int:
    """The matrix-free polish's second stage's queries (``POLISH_TOP_RANGE``): as many as ``polish_plan``'s on
    the matrix-free polish (above ``FLOAT32_POLISH_MAX_UNKNOWNS``), 0 on the dense one or none; asked only where the
    joint stage's token scale is above 1."""
    return polish_plan(d, d_out, H) if polish_unknowns(d, d_out, H) > FLOAT32_POLISH_MAX_UNKNOWNS else 0


def polish_max_len(n: int) -> int:
    """The float32 polish queries' longest length at ``n`` unknowns: ``FIT_MAX_LEN`` (8) on the dense polish,
    ``FREE_POLISH_MAX_LEN`` on the matrix-free one (above ``FLOAT32_POLISH_MAX_UNKNOWNS``)."""
    return FREE_POLISH_MAX_LEN if n > FLOAT32_POLISH_MAX_UNKNOWNS else FIT_MAX_LEN


def _polish_queries(rng, n: int, d: int, max_len: int, lo: float, hi: float):
    """``(Xs, t)``: ``n`` polish queries of lengths 2 to ``max_len``, query ``k``'s tokens ``N(0, t_k^2 I / d)``, ``t``
    (shape ``(n,)``) log-uniform from ``lo`` to ``hi`` (both stages of :func:`polish_post_directions`)."""
    lengths = rng.integers(2, max_len + 1, size=n)
    t = np.exp(rng.uniform(np.log(lo), np.log(hi), size=n))
    return [rng.standard_normal((int(m), d)) * (s / np.sqrt(d)) for m, s in zip(lengths, t)], t


def polish_post_directions(oracle, norm, Ws, Theta, rng, u: float, scale: float = 1.0):
    """``(Ws, Theta, norm, eps, info)`` refined on float32 answers: :func:`~companion.layer._fit.polish_directions`
    (up to ``FLOAT32_POLISH_MAX_UNKNOWNS``; above, :func:`~companion.layer._fit.polish_directions_free`) on
    :func:`polish_plan`'s queries (lengths 2 to 8, or to ``FREE_POLISH_MAX_LEN`` above ``FLOAT32_POLISH_MAX_UNKNOWNS``;
    each query's tokens ``N(0, t^2 I / d)``, ``t`` log-uniform from 1 to ``scale``, the joint stage's token scale:
    the range the verification checks, where the heads' errors move the answers up to ``scale^2`` times more; this
    book's choice, measured 2026-12-05 on d = 64, H = 8 blocks whose heads are 0.05, 0.03 and 0.015 times a random
    block's, their scores barely spread on ``N(0, I / d)`` tokens as MiniLM's, token scales 4, 8 and 16: polished at
    ``t = 1`` they were 27 u and 200 u off the exact block at token scales 4 and 16, or refused on the verification's
    scaled share (the last two); all at ``t = scale``, within 4.5 u, 3.7 u and 40 u at scales 1 to 16 (the last, 40 u,
    at scale 1); log-uniform, within 24 u, 14 u and 9.8 u (at scale 16; at most 3.2 u, 2.0 u, 9.8 u up to ``scale``)),
    then ``eps`` again from their gaps
    (:func:`post_ln_eps`: the polish moves ``Theta``'s scale, and ``eps`` is in its units). Where the plan is 0
    nothing is asked and ``eps`` is None. The matrix-free polish weights each query's residual by
    ``t^-FREE_POLISH_SCALE_POWER`` (``_fit``; the dense one solves each step exactly and is not weighted), takes
    the heads' rows factored at their ranks where :func:`~companion.layer._fit.head_ranks` finds them (``Theta``'s
    head blocks where :func:`~companion.layer._fit.map_ranks` finds theirs), and polishes
    the LayerNorm's ``beta`` with them, its ``gamma`` held (``_fit.POLISH_LN_GAMMA``; ``norm`` returned with the
    polished ``beta``; the dense polish returns ``norm``'s ``beta`` as given); where ``scale`` is above 1 it then
    polishes again on :func:`polish_top_plan`'s further queries at the top token scales alone
    (:data:`POLISH_TOP_RANGE`), and fits ``eps`` from their gaps.
    ``info``:
    ``polished``, ``n_polish_queries`` (both stages'), the polish's relative rms residual before and after (weighted
    as the polish weights it; after: the last stage's, on its queries), ``polish_top_queries`` and
    ``polish_top_lsmr_iterations`` (the second stage's, :data:`POLISH_TOP_RANGE`; 0 and None where it did not run),
    ``polish_lsmr_iterations`` (the first stage's, per Gauss-Newton step; None on the dense polish), ``polish_rank``
    (the factored heads' ranks, one a head; None unfactored or dense), ``polish_map_rank`` (the factored output
    maps' ranks, the same way), ``polish_beta_moved`` (``|dbeta| / |beta|``,
    the first stage's; None dense), and from its queries' gaps (:func:`post_ln_eps`) ``median_gap``, ``eps_rtol``
    and ``gamma_scale`` (the returned ``norm``'s ``gamma`` is divided by it, on either polish)."""
    d, d_out, H = int(oracle.d), int(oracle.d_out), Ws.shape[0]
    n = polish_plan(d, d_out, H)
    if n == 0:
        return Ws, Theta, norm, None, {"polished": False, "n_polish_queries": 0}
    unknowns = polish_unknowns(d, d_out, H)
    Xs, scales = _polish_queries(rng, n, d, polish_max_len(unknowns), 1.0, scale)
    Y = oracle(Xs)
    batches, answers = group_by_length(Xs, Y)
    n_top, top_its = 0, None
    free = dict.fromkeys(("polish_lsmr_iterations", "polish_rank", "polish_map_rank", "polish_beta_moved"))  # dense
    if unknowns > FLOAT32_POLISH_MAX_UNKNOWNS:  # matrix-free: the dense Jacobian would hold B d_out times the unknowns
        # each query weighted by its scale
        t_batches = group_by_length(Xs, scales)[1]
        rank = head_ranks(Ws)  # heads of known ranks: factored, r_h (2 d + 1) unknowns a head
        Ws, Theta, before, after, steps = polish_directions_free(
            Ws, Theta, batches, answers, scales=t_batches, rank=rank, norm=norm, map_rank=map_ranks(Theta, H)
        )
        free = {
            "polish_lsmr_iterations": steps["lsmr_iterations"],
            "polish_rank": steps["rank"],
            "polish_map_rank": steps["map_rank"],
            "polish_beta_moved": float(
                np.linalg.norm(steps["beta"] - norm.beta) / max(np.linalg.norm(norm.beta), np.finfo(float).tiny)
            ),
        }
        norm = replace(norm, gamma=steps["gamma"], beta=steps["beta"])  # beta polished (gamma held: POLISH_LN_GAMMA)
        if scale > 1.0:  # the second stage (POLISH_TOP_RANGE): more queries at the top token scales, both stages'
            n_top = polish_top_plan(d, d_out, H)
            lo = max(1.0, scale / POLISH_TOP_RANGE)
            X2, top = _polish_queries(rng, n_top, d, polish_max_len(unknowns), lo, scale)
            Xs, scales, Y = X2, top, oracle(X2)  # its own queries alone (POLISH_TOP_RANGE)
            batches, answers = group_by_length(Xs, Y)
            t_batches = group_by_length(Xs, scales)[1]
            ranks = {"rank": head_ranks(Ws), "map_rank": map_ranks(Theta, H)}
            Ws, Theta, _, after, steps = polish_directions_free(
                Ws, Theta, batches, answers, scales=t_batches, norm=norm, **ranks
            )
            top_its = steps["lsmr_iterations"]
            norm = replace(norm, gamma=steps["gamma"], beta=steps["beta"])
    else:
        Ws, Theta, before, after = polish_directions(Ws, Theta, batches, [directions(norm, Y) for Y in answers])
    Pu = np.concatenate([(features(Ws, X) @ Theta) @ centre(d_out) for X in batches])
    fit = post_ln_eps(norm, np.concatenate(answers), Pu, u)
    norm = replace(norm, gamma=norm.gamma / fit.gamma_scale)  # gamma's overall scale, from the gaps
    info = {"polished": True, "n_polish_queries": n + n_top, "polish_residual_before": before}
    info.update(free, polish_residual_after=after, polish_top_queries=n_top, polish_top_lsmr_iterations=top_its)
    info.update(median_gap=fit.median_gap, eps_rtol=fit.eps_rtol, gamma_scale=fit.gamma_scale)
    return Ws, Theta, norm, fit.eps, info


def _token_groups(T):
    """``np.unique(T, axis=0, return_inverse=True)`` for the rows ``T`` (``(B, d)``), ``which`` flat: grouped by their
    first entries where those tell the distinct rows apart (then the same order, as ``np.unique`` sorts rows
    lexicographically), else by ``np.unique`` itself. Measured (2026-12-07, one BLAS thread, a MiniLM row's 9,816
    pair queries' last tokens): 0.37 s against 0.017 s, the same tokens and groups."""
    _, first, which = np.unique(T[:, 0], return_index=True, return_inverse=True)
    tokens = T[first]
    if np.array_equal(tokens[which], T):
        return tokens, which
    tokens, which = np.unique(T, axis=0, return_inverse=True)
    return tokens, np.ravel(which)


class RowScaled(VectorView):
    """The vector oracle seen before its post-LN, on one row's pair queries: answers ``P u(X) / s0`` (step 2).

    Every batch must be pair queries of one row (``n`` copies of ``x + delta`` then ``m`` of ``x``, one
    ``delta``), at least ``2 H`` per token, as :func:`companion.layer._joint.learn_heads_joint` asks them;
    anything else raises :class:`~companion.errors.OracleInconsistentError` (this oracle answers nothing it
    cannot scale). ``misfits`` collects each batch's largest ``|Q (s w - c_x)| / |c_x|``.
    """

    def __init__(self, vector, norm, A, c, H: int, u: float = float(unit_roundoff("float64"))):
        super().__init__(self._scaled, d=vector.d, d_out=vector.d_out, precision=vector.precision)
        self.vector, self.norm, self.A, self.c, self.H, self.u = vector, norm, A, c, int(H), float(u)
        self.misfits: list[float] = []

    def _scaled(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        if X.ndim != 3:
            raise OracleInconsistentError("the row-space scaling answers one row's pair queries only")
        delta = X[:, 0] - X[:, -1]
        # a pair query's tokens are its first (x + delta) and its last (x): their largest entry is the batch's, read
        # without a pass over all of it (a MiniLM row's batch is 750 MB)
        if not np.allclose(delta, delta[0], rtol=0.0, atol=1e-12 * max(1.0, np.abs(X[:, [0, -1]]).max())):
            raise OracleInconsistentError("the row-space scaling answers one row's pair queries only")
        w = directions(self.norm, self.vector(X))
        tokens, which = _token_groups(X[:, -1])
        counts = np.bincount(which)
        if np.any(counts < 2 * self.H):
            raise OracleInconsistentError(f"the row-space scaling needs {2 * self.H} pair queries per token")
        cx = tokens @ self.A.T + self.c  # (K, d_out)
        R0 = self._row_space(w, which, len(tokens))
        R = self._refine(w, cx, which, R0)
        off = self._off(cx, R)
        if np.any(off < ABSORBED_OFF):  # a token's c_x taken into R: its scales undetermined; refit without it
            R = self._refine(w, cx, which, R0, np.flatnonzero(off >= ABSORBED_OFF)[:ROW_FIT_TOKENS])
            off = self._off(cx, R)
            if np.any(off < ABSORBED_OFF):
                k = int(np.argmin(off))
                raise OracleInconsistentError(
                    f"the row-space scaling took token {k}'s one-token answer into the row space ({off[k]:.1e} of "
                    f"it left off the row space, ABSORBED_OFF = {ABSORBED_OFF:g}) when refitted without it: its "
                    "queries' scales are undetermined"
                )
        out = self._scales(w, cx[which], R)[:, None] * w
        g = cx[which] - out  # lies in R up to the misfit
        left = self._off_row_space(g, R)
        self.misfits.append(float(np.max(np.linalg.norm(left, axis=1) / np.linalg.norm(cx[which], axis=1))))
        return out

    @staticmethod
    def _off_row_space(X, R):
        """``Q X``: the rows of ``X`` projected off the row space ``R`` (orthonormal columns)."""
        return X - (X @ R) @ R.T

    @staticmethod
    def _off(cx, R):
        """Per token the share of ``c_x`` off the row space ``R``: ``|Q c_x| / |c_x|``."""
        return np.linalg.norm(RowScaled._off_row_space(cx, R), axis=1) / np.linalg.norm(cx, axis=1)

    @staticmethod
    def _scales(w, c, R):
        """``s = <Q w, Q c> / |Q w|^2`` per query, ``Q`` the projection off ``R``."""
        Qw, Qc = RowScaled._off_row_space(w, R), RowScaled._off_row_space(c, R)
        return np.einsum("bo,bo->b", Qw, Qc) / np.einsum("bo,bo->b", Qw, Qw)

    def _refine(self, w, cx, which, R, fit_tokens=None):
        """The row space refined by Gauss-Newton on ``ROW_FIT_TOKENS`` tokens' queries, jointly in their scales
        and ``R``, in the span of their directions and ``c_x`` (dimension ``k`` = tokens + H).

        The residual of query ``j`` is ``N^T (s_j w_j - c_j)`` (``N`` the complement of ``R`` in that span); a
        step moves ``s`` and tilts ``N`` to ``N + B D`` (``B`` a basis of ``R``, ``D`` of shape ``(H, k - H)``).
        Alternating least squares (the scales given ``R``, then ``R`` from the scaled answers) converges
        linearly, slowly where a token's ``H + 1`` dimensions are ill-conditioned: measured (d = 48, H = 12), 8
        tokens needed a thousand alternations to reach rounding."""
        H = self.H
        fit_tokens = np.arange(min(ROW_FIT_TOKENS, len(cx))) if fit_tokens is None else np.asarray(fit_tokens)
        sub = np.isin(which, fit_tokens)
        ws, cs = w[sub], cx[which[sub]]
        K = len(fit_tokens)
        k = min(K + H, int(w.shape[1]) - 1)  # the centred answers span at most d_out - 1 dimensions
        U = np.linalg.svd(np.concatenate([ws, cx[fit_tokens]]), full_matrices=False)[2][:k].T  # (d_out, k)
        ws, cs = ws @ U, cs @ U
        Q = np.linalg.qr(U.T @ R, mode="complete")[0]
        B, N = Q[:, :H], Q[:, H:]
        s, m = self._scales(ws, cs, B), k - H
        for _ in range(ROW_ITERATIONS):
            ds, dD = self._refine_step(ws, cs, s, B, N)
            s = s + ds
            N = np.linalg.qr(N + B @ dD)[0]
            Q = np.linalg.qr(N, mode="complete")[0]
            B = Q[:, m:]
            if np.max(np.abs(ds) / np.abs(s)) <= 8 * self.u:  # a step below the answers' precision
                break
        return U @ B

    @staticmethod
    def _refine_step(ws, cs, s, B, N):
        """:meth:`_refine`'s Gauss-Newton step ``(ds, dD)`` (shapes ``(n,)``, ``(H, m)``) at scales ``s`` and the
        complement ``N`` (``(k, m)``) of ``B`` (``(k, H)``), for the directions ``ws`` and ``c_x`` ``cs`` (``(n, k)``).

        Query ``j``'s residual ``r_j = N^T (s_j w_j - c_j)`` moves by ``ds_j a_j + dD^T B^T g_j`` (``a_j = N^T w_j``,
        ``g_j = s_j w_j - c_j``): ``ds_j`` is eliminated (its least squares given ``dD``) and ``dD`` solved from the
        projections ``I - a_j a_j^T / |a_j|^2`` of the rest, ``(n m, H m)``: the least squares of the whole Jacobian
        ``(n m, n + H m)`` where it has full column rank, which took 0.13 CPU s of a MiniLM row's own 1 s (measured
        2026-12-08, one BLAS thread; 0.033 s now)."""
        n, m, H = len(s), N.shape[1], B.shape[1]
        g = s[:, None] * ws - cs
        r, a, gB = g @ N, ws @ N, g @ B  # (n, m), (n, m), (n, H)
        a2 = np.einsum("jm,jm->j", a, a)
        # a direction in the row space to rounding (its scale's column zero): no scale step, as the whole
        # Jacobian's minimum-norm least squares takes it
        flat = a2 <= 1e-24 * np.einsum("jk,jk->j", ws, ws)
        a[flat], a2[flat] = 0.0, 1.0
        Pj = np.eye(m)[None] - a[:, :, None] * a[:, None, :] / a2[:, None, None]  # (n, m, m)
        Jd = (gB[:, None, :, None] * Pj[:, :, None, :]).reshape(n * m, H * m)
        dD = np.linalg.lstsq(Jd, -np.einsum("jik,jk->ji", Pj, r).ravel(), rcond=None)[0].reshape(H, m)
        return -np.einsum("jm,jm->j", a, r + gB @ dD) / a2, dD

    def _row_space(self, w, which, K):
        """``R`` (``(d_out, H)``, orthonormal): the ``H`` leading eigenvectors of the sum of the ``V_x``'s
        projections over up to ``ROW_TOKENS`` tokens."""
        H = self.H
        S = np.zeros((w.shape[1], w.shape[1]))
        for k in range(min(K, ROW_TOKENS)):
            Vt = np.linalg.svd(w[which == k], full_matrices=False)[2][: H + 1]
            S += Vt.T @ Vt
        vals, vecs = np.linalg.eigh(S)
        return vecs[:, -H:]


class GapFit(NamedTuple):
    """:func:`post_ln_eps`'s fit: ``eps`` (in the units of ``P u``, at least 0), the answers' ``median_gap``,
    ``gamma_scale`` (``s``: the ``gamma`` the gaps were read with over the block's, in overall scale) and
    ``eps_rtol`` (``eps``'s relative precision, a rule of thumb; above 1, or ``inf``, ``eps`` is not determined)."""

    eps: float
    median_gap: float
    gamma_scale: float
    eps_rtol: float


def post_ln_eps(norm, Y: np.ndarray, Pu: np.ndarray, u: float = float(unit_roundoff("float64"))) -> GapFit:
    """A post-LN's ``eps`` and ``gamma``'s overall scale from the answers' gaps (this book's own).

    With ``z = (y - beta) / gamma'`` read with ``gamma' = s gamma`` (``s`` the one scale the directions cannot
    see), ``|z|^2 / d_out = var / (s^2 (var + eps))``, ``var = |P u|^2 / d_out``: so ``1 / (1 - gap) = A + B / var``
    exactly, ``A = s^2``, ``B = s^2 eps``. Fitted over the answers by least squares: ``eps = B / A``,
    ``gamma_scale = sqrt(A)`` (divide ``gamma'`` by it). Where the variances do not spread (the fit's rank below 2)
    or ``A <= 0``: ``A = 1`` and ``eps`` the median of ``var gap / (1 - gap)``. ``eps_rtol`` is ``(u + |A - 1|) /
    (eps / median var)``: the gap's precision, the answers' ``u`` and the offset the fit found (``gamma``'s and
    ``beta``'s errors move every gap, and may move it with ``var`` as much), over ``eps``'s part of the gap at the
    median answer; plus, where fitted, ``B / A``'s relative standard error from the fit's residual (the delta
    method): large where the variances barely spread, as ``A`` and ``B`` then trade off within the noise (a rule
    of thumb, not a behaviour: ``eps`` and ``gamma_scale`` are the fit's either way; on float32 answers spread by
    1e-4, 200 draws, ``eps`` was further off than the offset's part alone in 78, than the sum in none: the
    tests). Measured (2026-12-06, MiniLM's block served in float32, the gamma-held polish's end point, its 28,990
    queries; data/results/minilm_polish_diagnosis.json; before the noise term): ``A - 1`` = 2.3e-7 (gamma's scale
    9.4e-8 off, the block's own), ``eps_rtol`` 13 (the median rule's ``u / gap``: 0.22, while ``eps``, 1.1e-8
    reassembled, was 1e4 times the block's 1e-12).

    Parameters
    ----------
    norm : PostLN
        The ``gamma``, ``beta`` the gaps are read with (``norm.gaps``).
    Y, Pu : ndarray, shape (B, d_out)
        The answers and their ``P u`` (the learned block's, in its units).
    u : float
        The answers' precision (unit roundoff).
    """
    gap = norm.gaps(Y)
    var = np.mean(Pu * Pu, axis=1)
    M = np.stack([np.ones_like(var), 1.0 / var], axis=1)
    b = 1.0 / (1.0 - gap)
    (A, B), _, rank, _ = np.linalg.lstsq(M, b, rcond=None)
    noise = 0.0  # eps's standard error from the fit's residual (the delta method), relative
    if rank < 2 or not A > 0:  # no spread to tell s from eps: s = 1, eps = B (the median rule)
        A, B = 1.0, float(np.median(var * gap / (1.0 - gap)))
    elif len(b) > 2 and B != 0:
        r = b - M @ np.array([A, B])
        cov = float(r @ r) / (len(b) - 2) * np.linalg.pinv(M.T @ M)
        J = np.array([-B / A**2, 1.0 / A])  # d(B / A) / d(A, B)
        noise = float(np.sqrt(max(J @ cov @ J, 0.0))) / abs(float(B / A))
    eps = max(float(B / A), 0.0)
    part = eps / float(np.median(var))
    rtol = (u + abs(float(A) - 1.0)) / part + noise if part > 0 else float("inf")
    return GapFit(eps, float(np.median(gap)), float(np.sqrt(A)), rtol)


def learn_post_directions(oracle, norm, H: int, rng, u: float = float(unit_roundoff("float64"))):
    """``(Ws, Theta, eps, info)`` of a post-LN block from directions alone (steps 1 and 2), in units of ``s0``.

    ``Ws`` are the heads (the joint stage's), ``Theta = [M_1 .. M_H, S, b_O]`` (shape ``((H + 1) d + 1,
    d_out)``, centred: ``M_h[:, :d]`` from the rows' amplitude vectors, ``S = A - sum_h P M_h[:, :d]`` and
    ``b_O = c`` from the one-token map; the heads' value biases are in ``b_O``, as their weights sum to 1),
    ``eps`` the LayerNorm's in the same units (:func:`post_ln_eps`). ``info``: the one-token misfit, the rows'
    largest scaling misfit, the median gap, the joint stage's misfits, and ``eps_rtol`` (:func:`post_ln_eps`): ``eps``'s
    relative precision as a rule of thumb (above 1, or ``inf`` where the median gap is at rounding, ``eps`` is not
    determined; it moves the predictions by about the gap). ``u`` is the answers' precision: above float64's
    (float32's), the joint stage takes the float32 route's settings (:func:`companion.layer._float32.joint_options`).

    Raises
    ------
    OracleInconsistentError
        The one-token map misfits (:func:`one_token_tol`), or the joint stage refuses (on the scaled answers).
    """
    d, d_out = int(oracle.d), int(oracle.d_out)
    A, c, misfit, X1, Y1 = one_token_map(oracle, norm, rng)
    if not misfit <= one_token_tol(u):
        raise OracleInconsistentError(
            f"the one-token answers' directions are not those of an affine map (collinearity misfit {misfit:.1e}, "
            f"above {one_token_tol(u):.1e} at the answers' precision u = {u:.1e}: one_token_tol)"
        )
    inner = RowScaled(oracle, norm, A, c, H, u)
    f32: dict = {"link_tokens": LINK_TOKENS}
    if u > unit_roundoff("float64"):  # float32: the joint stage's settings, its rank above the scaled answers' noise
        f32 = {**joint_options(u), "rank_tol": DIRECTIONS_RANK_UNITS * u}
    Ws, info = learn_heads_joint(inner, lambda X: c + X @ A.T, H, rng, **f32)
    Mt = info.pop("amplitudes")
    S = A - centre(d_out) @ Mt.sum(axis=0)
    Theta = np.concatenate([Mt.transpose(0, 2, 1).reshape(H * d, d_out), S.T, c[None]])
    Pu = X1[:, 0] @ A.T + c
    fit = post_ln_eps(norm, Y1, Pu, u)
    eps = fit.eps
    info.update(one_token_misfit=misfit, row_scaling_misfit=max(inner.misfits), median_gap=fit.median_gap)
    info["eps_rtol"] = fit.eps_rtol  # eps's relative precision, a rule of thumb (post_ln_eps)
    return Ws, Theta, eps, info
