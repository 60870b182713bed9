"""Where float64 stops the counts route (learn_canonical_rational), and why: a table per number of heads.

Run: .venv/bin/python benchmarks/why_H_stops.py [--d 64] [--H 6 7 8 9 10 12] [--rows 2] [--no-basin] [--lengths]

This book's own analysis (issue 21, item 3). For rows 0 .. rows-1 of the learner's own design (seed 0:
its directions delta_i, its K tokens, its 2H ratios n/m with n + m <= 2H + 1) on the target
random_multi_head(d, H, seed=0), with the true heads of each row:

  K / d          tokens per row that the count 4Hd^2 - 2H + 1 pays for (rational_plan);
  noise          the s.d. of the float64 answers' error (minus x^T v, as the learner forms them) against
                 the same in extended precision (_information.extended_counts_answers), relative to the
                 row's largest answer;
  Loewner cond   median over the row's pairs of sigma_1 / sigma_H of the interpolation's Loewner matrix,
                 the linear-algebra problem of every start that labels heads pair by pair;
  pair CRB       Cramer-Rao s.d. of a shift (log r units; _information.pair_bound, the pair's worst
                 head) from one pair's 2H answers, amplitudes and shifts unknown: the median over pairs,
                 and the fraction of pairs at most 1e-2 (what a start needs: the joint fit's basin is
                 1-3 % of R_h, see basin; a head's start row needs more than d / K of them);
  pair CRB 4x S  the same with 8H samples in the same window (four times the queries per pair);
  pair CRB L151  the same with 2H samples over |log r| <= 5 (queries of length 151 instead of 2H + 1);
  all n/m        the same with every ratio n/m with n + m <= 2H + 1 (the most a pair can be asked within
                 the length bound), and S needed / 2H: the fewest samples (2H, 4H, ..., all) at which the
                 median is at most 1e-2, over 2H (inf: not even all);
  fixed-gamma    the same with the amplitudes known (shared by the row's pairs);
  row CRB        the joint fit of the row over all K tokens: the largest over heads of the bound on
                 ||R_h_hat - R_h|| / ||R_h||;
  resolved / d   the fewest tokens per head at which the route's own pair fit resolved that head
                 (counts_start_coverage, over `rows` rows), and
  start err      the error of the per-pair start built from them with the true labels (the best that
                 start can do);
  shared err     the error of _rowstart.shared_amplitude_start given the TRUE amplitudes (the route
                 itself must first find them from the pairs: at H = 12 it cannot);
  basin          the largest perturbation of the true (gamma, R) (1 %, 3 %, 10 %, relative per head, 2
                 draws each) from which the row's batched joint fit (300 steps) reached rounding level
                 in every draw.

Measured 2026-12-01 19:20 UTC (d = 64, 2 rows, 142 s on the shared 2-core machine, load about 4;
--lengths adds the second table):
  (K / d: 1.88 at H = 6 down to 1.83 at H = 12; noise: 7e-16 to 1.3e-15 at every H;
  S needed / 2H: 1, 1, 2, 2, inf, inf)
   H  Loewner  pair CRB  pairs<=1e-2  4x S    L151    all n/m  fixed-g  row CRB  resolved/d  start err  shared   basin
   6  2.3e+09  0.00015   0.70         6.1e-6  6.6e-6  5.8e-6   3.1e-10  1.6e-11  1.5         0.00073    1.5e-07  0-.1
   7  4.4e+10  0.0029    0.57         3.5e-5  6.1e-5  3.1e-5   3.5e-10  5.5e-12  1.3         0.00081    1.5e-08  0.01
   8  7.5e+12  0.17      0.38         0.0020  0.0013  0.0017   6.5e-09  4.9e-11  1.1         0.00076    0.13     0-.03
   9  4.0e+12  0.55      0.34         0.0020  0.0017  0.0016   5.5e-10  9.0e-13  0.83        0.39       refused  0.03
  10  1.9e+14  6.1       0.081        0.081   0.41    0.070    5.2e-09  1.3e-12  0.55        0.70       refused  0.03
  12  2.0e+15  42        0.0043       1.0     6.7     0.65     8.5e-08  6.6e-12  0.17        0.90       refused  .01-.03
  (basin 0 in one row at H = 6 and 8: row 0 has a head of amplitude 1e-3, whose R_h the batched fit does not
  finish from 1 %; the learner's serial fit with its MINPACK fallback does.)
  Median pair CRB at d = 64, H = 12 (row 0) with longer queries and more samples per pair:
     longest query   S = 24   S = 96   S = 400
                25       33      1.4      0.98
               100       11     0.32      0.12
               200       12     0.18     0.079
              1000       34     0.13     0.087

What it says:
* Float64 holds the information: at every H up to 12 a row's answers fix its heads to about 1e-11 relative
  (row CRB), a thousand times below the 1e-8 target. The answers' rounding is measured, about 1e-15 of the
  row's largest answer (5 ulps: the answers are x^T v + G, of size 25-35, and x^T v is subtracted).
* What float64 stops is every start that labels heads pair by pair: one pair's 2H answers fix its shifts to
  0.17 (H = 8), 6 (H = 10) and 42 (H = 12) in log r, against the 1e-2 a start needs (the joint fit's basin is
  1-3 % of R_h). From H = 10 no per-pair start is possible within the length bound at any number of queries:
  with every ratio n/m with n + m <= 2H + 1 (S = 139 at H = 10, 199 at H = 12) the median bound is 0.07 and
  0.65; at H = 12 even queries of length 1000 with 400 samples per pair leave it at 0.09. The Loewner
  matrix of the interpolation reaches condition 2e15 at H = 12: its null vector is rounding.
* With the amplitudes known a pair's shifts are well determined (fixed-gamma, 1e-7 at H = 12), but the
  amplitudes themselves come only from pairs that resolve all heads (pairs at most 1e-2: 0.4 % at
  H = 12; the route's labelling finds 1 of 117 in row 0, bench_multihead), and the
  fixed-amplitude pair fit is not convex: _rowstart's refit, given the TRUE amplitudes, refuses from H = 9
  (fewer than d tokens per head reach rounding level), and 200 random starts per pair of that fit reached
  the global minimum at 1 of 119 pairs at H = 8 (measured once, 2026-12-01, not in this script).
* So H = 12 at d = 64 needs a start that pools a row's tokens without labelling pairs first, inside a 1-3 %
  basin. Not found this round (also tried: a data homotopy from a random model to the answers, which ends
  at misfit 0.2 already at H = 6). An algebraic pooled start (a Jennrich-type simultaneous
  diagonalisation of sum_h gamma_h phi''(R_h^T x) R_h R_h^T, i.e. Hessians in x) needs tokens at finite-
  difference positions: d + 1 = 65 pairs per base point for one gradient per ratio, and one base point's
  2H ratios weigh the heads by the same ill-conditioned sigma'(s_t + l_h) as one pair, so of order H base
  points, about H (d + 1) = 780 pairs per row for the span of the R_h alone, where the count pays for
  K = 117 per row (1.83 d): the count 4Hd^2 - 2H + 1 leaves data / unknowns = 3.7 per row.
"""

import argparse
import sys
import time

import numpy as np
import pandas as pd

from companion._information import extended_counts_answers, loewner_condition, pair_bound, row_bound
from companion._rational import count_pairs, fit_rows_joint, ratio_design
from companion._rowstart import shared_amplitude_start
from companion.multihead import _ask_pairs, counts_start_coverage, random_multi_head, rational_plan
from companion.oracles import ValueQueryOracle

START_ACCURACY = 1e-2      # a shift's accuracy a start needs (log r units; the basin is ~3 % of R_h)
RHOS = (0.01, 0.03, 0.1)


def learner_design(d, H, seed=0, scale=3.0, spread=1.5):
    """The directions, tokens and ratios of learn_canonical_rational(seed=seed) (its defaults)."""
    K = rational_plan(d, H)["K"]
    n, m = ratio_design(H)
    rng = np.random.default_rng(seed)
    P, Rq = np.linalg.qr(rng.standard_normal((d, d)))
    P = (P * np.sign(np.diag(Rq))).T
    T = rng.standard_normal((K, d))
    norms = scale * np.exp(rng.uniform(-np.log(spread), np.log(spread), K))
    return P, T * (norms / np.linalg.norm(T, axis=1))[:, None], n, m


def basin(s, G, X, gam, R, rng, draws=2):
    """Largest rho in RHOS from which every draw of the joint fit converged (0.0 if none)."""
    g0, R0 = [], []
    for rho in RHOS:
        for _ in range(draws):
            g0.append(gam * (1 + rho * rng.standard_normal(gam.size)))
            E = rng.standard_normal(R.shape)
            R0.append(R + E * (rho * np.linalg.norm(R, axis=1) / np.linalg.norm(E, axis=1))[:, None])
    _, Rb, res, sc = fit_rows_joint(s, np.repeat(G[None], len(g0), 0), X, np.array(g0), np.array(R0),
                                    iters=300)
    err = np.max(np.linalg.norm(Rb - R, axis=2) / np.linalg.norm(R, axis=1), axis=1)
    ok = ((res <= 1e-9 * sc) & (err <= 1e-6)).reshape(len(RHOS), draws).all(axis=1)
    best = 0.0
    for rho, good in zip(RHOS, ok):
        if not good:
            break
        best = rho
    return best


def samples_needed(H, gam, L, sigma):
    """The fewest samples per pair (2H, 4H, 8H, ..., up to every ratio n/m with n + m <= 2H + 1,
    spread evenly in log r by count_pairs) at which the median pair CRB is at most START_ACCURACY;
    inf if none."""
    sizes = [2 * H * 2**j for j in range(8)]
    n_all = count_pairs(10**4, 2 * H + 1)[0].size
    for S in sorted({min(S, n_all) for S in sizes}):
        n, m = count_pairs(S, 2 * H + 1)
        if np.median(pair_bound(np.log(n / m), gam, L, sigma).max(axis=1)) <= START_ACCURACY:
            return n.size
    return np.inf


def row_table(d, H, rows=2, with_basin=True, seed=0):
    target = random_multi_head(d, H, seed=seed)
    oracle = ValueQueryOracle(target)
    P, X, n, m = learner_design(d, H, seed)
    r, s = n / m, np.log(n / m)
    K = X.shape[0]
    v = np.asarray(oracle(np.eye(d)[:, None, :]))
    rng = np.random.default_rng(1)
    out = {k: [] for k in ("noise", "loewner", "pair", "pair_ok", "pair4", "pairL", "fixed", "row", "shared",
                           "basin", "S needed", "pair_all")}
    for i in range(rows):
        gam = target.vs @ P[i]
        R = np.einsum("e,hef->hf", P[i], target.Ws)
        L = X @ R.T
        G = _ask_pairs(oracle, X + P[i], X, n, m) - (X @ v)[:, None]
        exact = extended_counts_answers(target, X + P[i], X, n, m)
        gmax = float(np.max(np.abs(G)))
        sigma = float(np.std((G - exact).astype(float)))
        out["noise"].append(sigma / gmax)
        out["loewner"].append(np.median(loewner_condition(r, G, H)))
        Gm = np.repeat(gam[None], K, axis=0)
        pb = pair_bound(s, Gm, L, sigma).max(axis=1)
        out["pair"].append(np.median(pb))
        out["pair_ok"].append(np.mean(pb <= START_ACCURACY))
        out["pair4"].append(np.median(pair_bound(np.linspace(s[0], s[-1], 8 * H), Gm, L, sigma).max(axis=1)))
        out["pairL"].append(np.median(pair_bound(np.linspace(-5, 5, 2 * H), Gm, L, sigma).max(axis=1)))
        out["S needed"].append(samples_needed(H, Gm, L, sigma))
        n_all, m_all = count_pairs(10**4, 2 * H + 1)
        out["pair_all"].append(np.median(pair_bound(np.log(n_all / m_all), Gm, L, sigma).max(axis=1)))
        out["fixed"].append(np.median(pair_bound(s, Gm, L, sigma, fixed_gamma=True).max(axis=1)))
        out["row"].append(np.max(row_bound(s, X, gam, R, sigma)))
        shared = shared_amplitude_start(s, G, X, gam, float(np.max(np.abs(s))))
        out["shared"].append(np.inf if shared is None else
                             float(np.max(np.linalg.norm(shared[1] - R, axis=1) / np.linalg.norm(R, axis=1))))
        if with_basin:
            out["basin"].append(basin(s, G, X, gam, R, rng))
    cov = counts_start_coverage(d, H, n_rows=rows, seed=seed)
    row = {
        "d": d, "H": H, "K / d": K / d,
        "noise": max(out["noise"]),
        "Loewner cond": float(np.median(out["loewner"])),
        "pair CRB": float(np.median(out["pair"])),
        f"pairs <= {START_ACCURACY:g}": float(np.mean(out["pair_ok"])),
        "pair CRB 4x S": float(np.median(out["pair4"])),
        "pair CRB L151": float(np.median(out["pairL"])),
        "pair CRB all n/m": float(np.median(out["pair_all"])),
        "fixed-gamma": float(np.median(out["fixed"])),
        "row CRB": float(max(out["row"])),
        "resolved / d": cov["fewest resolved / d"],
        "start err": cov["start error"],
        "shared err": float(max(out["shared"])),
    }
    row["S needed / 2H"] = float(max(out["S needed"])) / (2 * H)
    if with_basin:
        row["basin min"], row["basin max"] = float(min(out["basin"])), float(max(out["basin"]))
    return row


def length_table(d, H, lengths=(25, 50, 100, 200, 400, 1000), samples=(24, 96, 400), seed=0):
    """Median pair CRB of row 0 when the queries may be longer (every ratio n/m with n + m <= L,
    S of them spread evenly in log r by count_pairs): what a per-pair start would need."""
    target = random_multi_head(d, H, seed=seed)
    P, X, n, m = learner_design(d, H, seed)
    gam, R = target.vs @ P[0], np.einsum("e,hef->hf", P[0], target.Ws)
    v = np.asarray(ValueQueryOracle(target)(np.eye(d)[:, None, :]))
    G = _ask_pairs(ValueQueryOracle(target), X + P[0], X, n, m) - (X @ v)[:, None]
    sigma = float(np.std((G - extended_counts_answers(target, X + P[0], X, n, m)).astype(float)))
    Gm, L = np.repeat(gam[None], X.shape[0], 0), X @ R.T
    rows = []
    for Lmax in lengths:
        row = {"longest query": Lmax}
        for S in samples:
            ns, ms = count_pairs(S, Lmax)
            row[f"S = {S}"] = float(np.median(pair_bound(np.log(ns / ms), Gm, L, sigma).max(axis=1)))
        rows.append(row)
    return pd.DataFrame(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64])
    parser.add_argument("--H", type=int, nargs="+", default=[6, 7, 8, 9, 10, 12])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--lengths", action="store_true",
                        help="also the pair CRB at the largest H with longer queries and more samples")
    parser.add_argument("--no-basin", action="store_true", help="skip the joint fit's basin (the slow column)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    table = []
    for d in args.d:
        for H in args.H:
            table.append(row_table(d, H, rows=args.rows, with_basin=not args.no_basin))
            print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in table[-1].items()}, flush=True)
    df = pd.DataFrame(table)
    with pd.option_context("display.width", 250, "display.float_format", "{:.2g}".format):
        print(f"\nWhy H stops on the counts route ({args.rows} rows of the learner's design, seed 0; "
              f"{time.perf_counter() - t0:.0f} s):")
        print(df.to_string(index=False))
    for _, row in df.iterrows():
        # a head's start row needs it resolved at more than d of the row's K tokens
        frac, need = row[f"pairs <= {START_ACCURACY:g}"], 1 / row["K / d"]
        print(f"d = {row['d']:.0f}, H = {row['H']:.0f}: a row's answers fix its heads to {row['row CRB']:.1g} "
              f"relative; one pair's shifts to {row['pair CRB']:.2g} (median), {frac:.1%} of pairs to "
              f"{START_ACCURACY:g} ({'above' if frac > need else 'below'} the d / K = {need:.0%} "
              "a per-pair start needs)")
    if args.lengths:
        d, H = max(args.d), max(args.H)
        with pd.option_context("display.width", 250, "display.float_format", "{:.2g}".format):
            print(f"\nMedian pair CRB at d = {d}, H = {H} (row 0) with queries up to a length and S samples "
                  f"per pair (the design: length {2 * H + 1}, S = {2 * H}; a start needs <= {START_ACCURACY:g}):")
            print(length_table(d, H).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
