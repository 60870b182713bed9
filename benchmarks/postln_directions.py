"""Research lead (issue 35, this book's own): the norms a post-LN with BERT's eps hides, read back from directions.

Superseded in the learner (session 41) by ``companion.layer._directions``, which asks no extra query: a pair
query's ``P u`` less the one-token map lies in its row's row space, the same for every token of the row, so the
row's own answers give each norm. This script's shifted families (below) remain a second construction, tested.

Why. Behind a post-LN with eps = 1e-12 (BERT, MiniLM) an answer fixes the direction of ``P u(X)``
(``P`` centres, ``u = x_N + o(X)`` the block before its LayerNorm) to float64's precision, but its
norm only to about ``2**-53 / gap`` with ``gap = eps / (var(u) + eps)``: about 1e-6 at MiniLM's
size, so ``learn_attention_layer`` refuses (``layer._norm.MIN_GAP``; chapter 09). This script measures
a way to recover the norms, up to one scale for all queries, from directions alone. Not wired into
the learner (see "What is left" below).

The construction (this book's own; ``w(X) = (y - beta) / gamma`` is the direction read off an answer):

1. One token. ``u(x) = x + M x~ + b_O`` is affine in ``x``, so ``P u(x) = A x + c``. On the points
   ``x0``, ``x0 + t e_k`` and ``x0 + 2 t e_k`` the three values ``s w`` are collinear in the affine
   sense (``s_2 w_2 - 2 s_1 w_1 + s_0 w_0 = 0``), which gives ``s_1 / s_0`` and ``s_2 / s_0`` by least
   squares in ``d_out`` equations: ``A`` and ``c`` up to the one scale ``s_0``, from ``2 d + 1`` queries.
2. Shifted families. Adding one vector ``r`` to every token of ``X`` keeps the differences
   ``x_i - x_N``, so ``P u(X + r) - P u_1(x_N + r)`` (``u_1`` the one-token map of step 1) lies in
   ``U_X = P span{M_h (x_i - x_N)}``, of dimension at most ``H (N_d - 1)``, ``N_d`` the number of
   DISTINCT tokens of ``X`` (a repeated token adds no difference ``x_i - x_N``), whatever ``r`` does
   to the attention weights. For ``k = H (N_d - 1) + 1`` shifts the vectors
   ``v_j = s_j w_j - P u_1(x_N + r_j)`` are linearly dependent: a null vector ``(g, c)`` of
   ``[w_1 .. w_k, -P u_1(..)_1 .. -P u_1(..)_k]`` (``d_out`` by ``2 k``) gives ``s_j = g_j / c_j``.
   Every null vector does when the null space is one-dimensional: the columns span at most
   ``k + H (N_d - 1)`` dimensions of the centred space, which has ``d_out - 1``, so it needs
   ``d_out - 1 >= k + H (N_d - 1)``, that is ``d_out >= 2 H (N_d - 1) + 2`` (measured just inside and
   just outside: ``d_out = 18`` and ``17`` at ``H = 2``, ``N = N_d = 5`` below; for pair queries,
   ``N_d = 2`` in ``2 H + 1`` positions, ``d_out = 6`` and ``5`` at ``H = 2``, 8 and 7 at ``H = 3``,
   tests/test_postln_directions.py).

Measured here on ``random_attention_layer(d, H, residual=True, layernorm="post", eps=1e-12)``, with
the true ``gamma`` and ``beta`` (steps 1 and 2 of ``layer._norm.estimate_post_ln`` do not need the
gap; only its ``kappa`` does, and a wrong ``kappa`` scales every direction alike, which the scales
absorb): the relative error of each ``s_j / s_0`` against the block's own ``P u``, worst and median
over 20 queries of ``N`` random (distinct) tokens (2026-12-04, seed 0; at seeds 1 and 2 the row
``d_out = 18`` gave 5.2e-11 and 1.0e-11 worst, ``17`` gave 9.1 and 1.6):

    d_out  H  N   k  d_out >= 2H(N-1)+2  worst rel. error of s_j/s_0 (median)
       64  2  2   3                True  7.2e-14 (1.7e-15)
       64  2  5   9                True  1.6e-13 (6.9e-15)
       64  4  5  17                True  2.4e-13 (2.1e-14)
       32  2  8  15                True  3.9e-12 (8.6e-14)
       18  2  5   9                True  4.2e-13 (1.1e-13)
       17  2  5   9               False  3.9e+01 (5.4e-01)
        8  2  5   9               False  1.6e+02 (1.0e+01)

So where the condition holds the norms come back to 1e-11 or better (the heads' stage failed at a
norm error of 5e-9, ``layer._norm.LOW_GAP``), against about 8e-7 from the gap at MiniLM's size.

What is left (why this is a lead, not a stage): each of the learner's queries needs ``H (N_d - 1)``
more, and only where ``d_out >= 2 H (N_d - 1) + 2``. The condition counts distinct tokens, not
positions (session 40, bench_layer.py's docstring): the heads' stages ask pair queries (two distinct
tokens in ``2 H + 1`` positions; the joint stage's rows have 25 positions at ``H = 12``), which need only
``k = H + 1`` shifts and ``d_out >= 2 H + 2`` (measured: 6.5e-14 vs 6.9 at ``d_out = 6`` vs 5, ``H = 2``;
1.7e-12 vs 0.47 at 8 vs 7, ``H = 3``); the learner's random least-squares queries (2 to 8 distinct
tokens) are the ones the condition binds (``d_out >= 30`` at ``H = 2``). MiniLM's ``d_out = 384`` at
``H = 12`` allows up to 16 distinct tokens (pairs need 26), so every query the learner asks meets it
there, at up to ``H (N_d - 1) = 84`` more queries each (``H = 12`` for a pair). At MiniLM's size the query
count, not the norm, is then the obstacle (chapter 09: the heads' plan alone is millions of queries).
The identity skip then fixes the one scale (chapter 09, "What the outputs determine"), and eps follows
from the answers' gap.

Run: ``.venv/bin/python benchmarks/postln_directions.py`` (seconds).
"""

from __future__ import annotations

import numpy as np

from companion.layer import random_attention_layer


def directions(block, X):
    """``(y - beta) / gamma`` of the block's answers: ``(B, d_out)``."""
    return (block(X) - block.beta) / block.gamma


def one_token_map(block, x0, t=0.5):
    """``(A, c)`` with ``P u(x) = s0 (A x + c)`` for one token ``x``, from ``2 d + 1`` directions."""
    d = x0.size
    E = np.eye(d)
    X = np.concatenate([x0[None], x0 + t * E, x0 + 2 * t * E])[:, None, :]
    w = directions(block, X)
    w0, w1, w2 = w[0], w[1 : d + 1], w[d + 1 :]
    A = np.empty((w.shape[1], d))
    for k in range(d):
        s2, s1 = np.linalg.lstsq(np.stack([w2[k], -2 * w1[k]], 1), -w0, rcond=None)[0]
        A[:, k] = (s1 * w1[k] - w0) / t
    return A, w0 - A @ x0, X


def family_scales(block, X, A, c, rng, k):
    """``s_j`` (in units of ``s0``) of ``k`` shifts ``X + r_j`` of one query ``X`` of shape ``(N, d)``."""
    d = X.shape[1]
    R = rng.standard_normal((k, d)) / np.sqrt(d)
    Xs = X[None] + R[:, None, :]
    w = directions(block, Xs)
    y1 = Xs[:, -1] @ A.T + c
    null = np.linalg.svd(np.concatenate([w.T, -y1.T], 1))[2][-1]
    return null[:k] / null[k:], Xs, w


def main(cases=((64, 2, 2), (64, 2, 5), (64, 4, 5), (32, 2, 8), (18, 2, 5), (17, 2, 5), (8, 2, 5)), trials=20, seed=0):
    print(" d_out  H  N   k  d_out >= 2H(N-1)+2  worst rel. error of s_j/s_0 (median)")
    for d, H, N in cases:
        block = random_attention_layer(d, H, residual=True, layernorm="post", eps=1e-12, seed=seed)
        bare = block.with_(layernorm=None, gamma=None, beta=None, eps=None)
        P = np.eye(d) - 1.0 / d
        rng = np.random.default_rng(seed + 1)
        x0 = rng.standard_normal(d) / np.sqrt(d)
        A, c, X1 = one_token_map(block, x0)
        w0 = directions(block, X1[:1])[0]
        s0 = (bare(X1[:1]) @ P)[0] @ w0 / (w0 @ w0)
        k = H * (N - 1) + 1
        errs = []
        for _ in range(trials):
            X = rng.standard_normal((N, d)) / np.sqrt(d)
            s, Xs, w = family_scales(block, X, A, c, rng, k)
            true = np.einsum("jd,jd->j", bare(Xs) @ P, w) / np.einsum("jd,jd->j", w, w) / s0
            errs.append(float(np.max(np.abs(s / true - 1))))
        ok = d >= 2 * H * (N - 1) + 2
        print(f"{d:6d} {H:2d} {N:2d} {k:3d}  {str(ok):>18}  {max(errs):.1e} ({np.median(errs):.1e})")


if __name__ == "__main__":
    main()
