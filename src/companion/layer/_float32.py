"""The float32 route's constants (this book's): answers served in float32, ``u = 2**-24``.

Each is a measured or chosen value, with its measurement beside it; :func:`joint_options` gives the joint heads'
stage its float32 settings. Private: :mod:`companion.layer` re-exports the constants.
"""

from __future__ import annotations

from ._norm import ROUNDING_UNITS

__all__ = [
    "FLOAT32_HEADS_TOL",
    "FLOAT32_FLOOR_UNITS",
    "FLOAT32_VERIFY_UNITS",
    "FLOAT32_SKIP_UNITS",
    "FLOAT32_RANK_UNITS",
    "FLOAT32_LINK_TOKENS",
    "FLOAT32_POLISH_MAX_UNKNOWNS",
    "FLOAT32_FREE_POLISH_MAX_UNKNOWNS",
    "joint_options",
]

#: The float32 route (this book's): answers served in float32 (every answer on its grid, or a stated precision
#: u = 2**-24) are learned when the block has no LayerNorm and its heads are given (H or H_bound). Its heads' fits
#: accept this relative misfit of the readout (learn_canonical_rational's tol): a chosen value, not derived.
#: Measured (2026-12-04): with it the heads' learner resolves H = 2 at d = 6 and 8 (Keras in float32, float64
#: layers rounded to float32), the heads it returns (a parameter error, not the misfit) off by up to about 2e-3,
#: which the polish refines (to 7e-8 relative on chapter 09's default block); the verification certifies.
FLOAT32_HEADS_TOL = 1e-3

#: The float32 floor (this book's, measured 2026-12-04), in units of u = 2**-24: the largest relative distance,
#: over 200 fresh queries, between a layer served in float32 and the same weights computed in float64. Keras 3
#: MultiHeadAttention(use_bias=True) in float32, H = 2, 4, 8, d = 6 to 16, seeds 0 and 1: 2.8 u to 5.6 u (median
#: 1.2 u to 1.8 u); a float64 layer whose answers are rounded to float32: 0.72 u to 0.82 u. 6 is above them all.
FLOAT32_FLOOR_UNITS = 6

#: The float32 route's verification tolerance: 10 times the float32 floor, ``10 * FLOAT32_FLOOR_UNITS * u`` =
#: 3.6e-6 relative (the issue's target, "within 10x of float32's floor"). Measured (2026-12-04, 200 fresh
#: queries; H = 2 at d = 6 and 8, seeds 0 to 2, each learned within 3 learner seeds): blocks learned on float32
#: answers predict their served answers to 1.8 u to 7.4 u (float64 layers rounded to float32, rounding 0.68 u to
#: 0.82 u) and 6.5 u to 14.3 u (Keras 3 in float32, floors 3.2 u to 5.6 u); targets outside the
#: class, given their true heads and fitted at float32 (a sliding-window mask, a second layer), misfit fresh
#: queries by 1.2e7 u or more: the tolerance, 60 u, separates them by five orders of magnitude.
FLOAT32_VERIFY_UNITS = 10 * FLOAT32_FLOOR_UNITS

#: In the float32 route a fitted skip within this many u (times max(1, its scale)) of 0 or of the identity is named
#: none or the identity (SKIP_RTOL's role at float64). Measured (2026-12-04, the 13 float32 blocks learned: Keras
#: H = 2 at d = 6 and 8, seeds 0 to 2; float64 layers rounded to float32, d = 6 and 8): the fitted skip lies 1.6 u to
#: 12.8 u from 0 or I; ROUNDING_UNITS (256) keeps a factor 20 above that.
FLOAT32_SKIP_UNITS = ROUNDING_UNITS

#: The float32 route's joint heads' stage counts a row space's singular values above this many u (relative to the
#: largest) in its rank. Measured (2026-12-04, Keras 3 MultiHeadAttention in float32, key_dim 2, every row of the
#: joint stage): the (H + 1)-th singular value, rounding, is 4.8 u to 14.5 u (H = 4 at d = 8, seeds 0 to 2, at d = 16,
#: seed 0; H = 8 at d = 16, seeds 0 to 2); the H-th, a head, is 132 u at its smallest (H = 8, d = 8, seed 1, row 6:
#: heads whose shifts along that row nearly agree; another draw of the rows at d = 8, seeds 0 to 2: 597 u and more).
#: 64 keeps a factor 4.4 above the rounding and 2 below that head (ROUNDING_UNITS, 256, cut it).
FLOAT32_RANK_UNITS = 64

#: The float32 route's joint stage links its rows through this many tokens each (LINK_TOKENS, 2, at float64): the
#: links' least squares carry float32's rounding, and more tokens determine them better. Measured (2026-12-04,
#: Keras 3 in float32, H = 8, key_dim 2, d = 16, seed 0): with 2 tokens the largest link misfit was 3.7e-2, above
#: the check's sqrt(FLOAT32_HEADS_TOL) = 3.2e-2; with 8, 1.5e-4 (seed 1: 1.8e-4; d = 8 to 12: 7.5e-5 to 3.9e-3;
#: H = 4 at d = 8: 1.2e-5 to 4.9e-5). The plan reserves these tokens for every joint run (whether the answers are
#: float32's is known only from them).
FLOAT32_LINK_TOKENS = 8

#: The float32 route's dense polishes take up to this many unknowns, the output maps' counted (at float64
#: POLISH_MAX_UNKNOWNS, 2500, counts the heads' rows only); above it the polish runs matrix-free (up to
#: FLOAT32_FREE_POLISH_MAX_UNKNOWNS): behind a post-LN on fresh queries' directions, without LayerNorm on the answers
#: themselves (``_fit.polish_free``, the same operator; until 2026-12-05 such a block was left unpolished). Measured
#: (2026-12-04, Keras 3 in float32, H = 8, key_dim 2, seed 0, with the polish that formed the output maps' Jacobian
#: too): at d = 12 (2,556 unknowns) unpolished the verification failed at 309 u, polished the layer predicts 200 fresh
#: queries to 8.1 u (floor 3.0 u); at d = 16 (4,496 unknowns), 6.6 u (floor 2.8 u), peak RSS 1.7 GB. That Jacobian's
#: memory grew as the unknowns squared (2 * 5000**2 * 8 bytes = 400 MB at the cap); the polish now eliminates the output
#: maps and holds ``B d_out H d (d + 1)`` floats (:data:`POLISH_MAX_UNKNOWNS`). Behind a post-LN at d = 24, H = 4
#: (5,304 unknowns, 724 queries) the dense polish took 20 CPU s and a peak RSS of 1.6 GB, the matrix-free one 0.1 s and
#: 0.11 GB, to 1.21 u and 1.16 u on 1,000 fresh queries (measured 2026-12-05). Below the cap the two agree (d = 8,
#: H = 2; d = 16, H = 3; d = 22, H = 4: dense 2.55 u, 1.40 u, 1.41 u, matrix-free 2.57 u, 1.56 u, 1.38 u; at d = 22
#: dense 13 CPU s and 1.17 GB, matrix-free 0.08 s and 0.11 GB); the dense polish is kept there, its results unchanged.
#: Without LayerNorm (measured 2026-12-05, one BLAS thread, random_attention_layer blocks with H = 8 rounded to float32,
#: with and without the residual, seeds 0 to 2, learner seed 0, 500 fresh queries against the exact block): at d = 32
#: (17,696 unknowns) and d = 64 (70,208) unpolished all 12 were refused by their verification at 65 u to 103 u (heads
#: about 1e-6 off); polished matrix-free (842 and 1,674 queries of lengths 2 to 32; LSMR 34 to 59 iterations a
#: Gauss-Newton step, three steps) all 12 verified at 1.00 u to 1.54 u, 1.48 u to 1.92 u from the exact block, in 1.9 to
#: 6.4 CPU s for the whole run (1.2 s to 3.2 s refused before), peak RSS unchanged (0.16 GB, 0.29 GB). Keras 3
#: MultiHeadAttention in float32 (its jax backend), H = 8, key_dim 2, d = 32, seed 0: refused before, now verified at
#: 9.2 u and 12.7 u from its served answers on 200 fresh queries (floor 2.5 u; 45 CPU s, 2.0 GB with Keras); a
#: sliding-window mask over the last 3 or 6 tokens of the d = 32 block, given its true heads and so polished, misfits
#: 500 fresh queries by 3.7e7 u or more.
FLOAT32_POLISH_MAX_UNKNOWNS = 5000

#: The float32 route's matrix-free polish takes up to this many unknowns (``polish_unknowns``: ``H d (d + 1)`` and the
#: output maps'; named FLOAT32_POST_POLISH_MAX_UNKNOWNS until 2026-12-05). Behind a post-LN it polishes on fresh
#: queries' directions, matrix-free above FLOAT32_POLISH_MAX_UNKNOWNS
#: (``_fit.polish_directions_free``: LSMR on closed-form Jacobian products, queries of lengths 2 to
#: ``FREE_POLISH_MAX_LEN``), and refuses by rule above it: unpolished the heads keep float32's errors. Without LayerNorm
#: the matrix-free polish of the answers (``_fit.polish_free``) takes the same cap; above it the block is left
#: unpolished, for the verification to judge (the plan's queries are reserved before the answers show float32). Measured
#: (2026-12-05, one BLAS thread, residual post-LN random_attention_layer blocks rounded to float32, learner seed 0,
#: 1,000 fresh queries against the exact block): d = 24, H = 4; d = 24, H = 5 (eps 1e-8, seed 497); d = 32, H = 4 (seeds
#: 0 and 1); d = 48, H = 12 (58,224 unknowns, 3,798 queries): 20.1 u to 53.6 u unpolished (one refused by its
#: verification), 0.91 u to 1.35 u polished (verified at 0.93 u to 1.69 u on 1,024 queries), with 37 to 48 LSMR
#: iterations in the first Gauss-Newton step and 7 to 20 in the next one or two; at d = 48, H = 12 the polish took
#: 3.2 CPU s (the whole run 42 s; peak RSS 0.43 GB). With lengths 2 to 8 the same blocks polished to 1.08 u to 1.72 u.
#: Its cost is about 65 products of ``O(B (H d (d + 1) + p d_out))`` flops, ``B`` its queries, and its memory ``B p``
#: floats (the features) and ``B N H d`` (the attention weights). Timed on random data of MiniLM's shape
#: (d = d_out = 384, H = 12, 3,691,392 unknowns, its plan's 28,990 queries of lengths 2 to 32): 110 s to set up (the
#: heads' column norms 88 s), 15.8 s an LSMR iteration, peak RSS 4.1 GB, so about 1,150 CPU s in all, against the
#: oracle's own 1,376 s for the rest of the learner's run (the run at 6372251, in git's history of
#: data/results/minilm_block_float32.json). That estimate was low: MiniLM's whole run at ffec805 (2026-12-06, two
#: BLAS threads, the products in float32 since, ``_fit.FREE_POLISH_PRODUCTS``) polished for 4,000 CPU s, its 8
#: Gauss-Newton steps (``FREE_POLISH_STEPS``, all of them) taking 454 LSMR iterations at about 7.7 CPU s, 87 s for the
#: preconditioner, peak RSS 5.8 GB (data/results/minilm_block_float32_rows.json), and its block was refused by the
#: verification. The polish's second stage (``POLISH_TOP_RANGE``, since 2026-12-06) asks as many queries again and
#: holds both stages' features: MiniLM's polish from that run's inputs took 3,015 CPU s on one BLAS thread and 11.0 GiB
#: RSS during its second stage (data/results/minilm_polish_diagnosis.json, top_stage_rerun). With the heads' rows and
#: Theta's head blocks factored (``_fit.map_ranks``; 2026-12-07, MiniLM's whole run at 9c4371f, one BLAS thread,
#: data/results/minilm_block_float32_9c4371f.json) the polish took 1,648 CPU s in its two stages (LSMR 338 and 41
#: iterations), against 3,136 at fb51a4a (279 and 51), peak RSS 12.1 GiB. The cap lies above
#: MiniLM's block; past it the memory grows as ``B p``, about ``d^4`` floats.
FLOAT32_FREE_POLISH_MAX_UNKNOWNS = 4_000_000


def joint_options(u: float) -> dict:
    """The joint heads' stage's settings at the answers' precision ``u`` (float32's): its fits' tolerance
    ``FLOAT32_HEADS_TOL``, its rank above ``FLOAT32_RANK_UNITS u``, ``FLOAT32_LINK_TOKENS`` per link."""
    return {"tol": FLOAT32_HEADS_TOL, "rank_tol": FLOAT32_RANK_UNITS * u, "link_tokens": FLOAT32_LINK_TOKENS}
