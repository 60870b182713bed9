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
  pair CRB scaled  the same for the multi-scale variant (this book's, not built): the pair's 2H queries
                 split over token scales c = 0.5, 1, 2, 4 (n copies of c x + delta, then m copies of
                 c x: shifts c delta^T W_h x, amplitudes unchanged; the same count and length), and
                 scaled <= 1e-2: its fraction of pairs at most 1e-2;
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

Measured 2026-12-01 19:30 UTC (d = 64, 2 rows, 284 s on the shared 2-core machine under load; --lengths
adds the second table):
  (K / d: 1.88 at H = 6 down to 1.83 at H = 12; noise: 7e-16 to 1.3e-15 at every H;
  S needed / 2H: 1, 1, 2, 2, inf, inf)
   H  Loewner  pair CRB  pairs<=1e-2  4x S    L151    all n/m  scaled   <=1e-2  fixed-g  row CRB  resolved/d  start err
   6  2.3e+09  0.00015   0.70         6.1e-6  6.6e-6  5.8e-6   5.1e-8   0.95    3.1e-10  1.6e-11  1.5         0.00073
   7  4.4e+10  0.0029    0.57         3.5e-5  6.1e-5  3.1e-5   1.2e-10  0.99    3.5e-10  5.5e-12  1.3         0.00081
   8  7.5e+12  0.17      0.38         0.0020  0.0013  0.0017   2.7e-6   0.86    6.5e-09  4.9e-11  1.1         0.00076
   9  4.0e+12  0.55      0.34         0.0020  0.0017  0.0016   3.8e-9   0.99    5.5e-10  9.0e-13  0.83        0.39
  10  1.9e+14  6.1       0.081        0.081   0.41    0.070    1.8e-4   0.72    5.2e-09  1.3e-12  0.55        0.70
  12  2.0e+15  42        0.0043       1.0     6.7     0.65     0.0051   0.55    8.5e-08  6.6e-12  0.17        0.90
  shared err (true amplitudes given): 1.5e-7, 1.5e-8, 0.13, refused, refused, refused;
  basin (min-max over the 2 rows): 0-0.1, 0.01, 0-0.03, 0.03, 0.03, 0.01-0.03
  (basin 0 in one row at H = 6 and 8: row 0 has a head of amplitude 1e-3, whose R_h the batched fit does not
  finish from 1 %; the learner's serial fit with its MINPACK fallback does.)
  At d = 32 (--d 32 --H 7 8 10 12, 22 s) the same picture: row CRB 6.6e-12, 4.6e-12, 3.9e-12, 1.4e-11;
  pair CRB 0.039, 0.025, 2.0, 53 (pairs <= 1e-2: 0.59, 0.47, 0.12, 0); pair CRB scaled 1.4e-10, 7.2e-7,
  5.9e-5, 2.8e-3 (0.54 of pairs at H = 12); start err 0.0011, 0.001, 0.9, 0.98; basin 0.01-0.03.
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
* The design, not float64, sets the per-pair limit: splitting each pair's 2H queries over token scales
  c = 0.5, 1, 2, 4 (n copies of c x + delta then m copies of c x; the same count and length; this book's
  variant, not built) brings the median pair bound at H = 12 from 42 to 5e-3 (55 % of pairs at most
  1e-2, where a start needs more than d / K = 55 %) and at H = 10 from 6 to 2e-4 (72 %): a smaller
  scale brings the heads into the window of log r, a larger one sharpens each term. What it does not
  give is a solver: its samples are no longer one rational function of r, so the Loewner interpolation
  does not apply, and Levenberg-Marquardt from 10 random starts per pair, amplitudes given, reached the
  global minimum at 0 of 39 pairs at H = 12, with either design (measured once, 2026-12-01).
  Prototyped since (benchmarks/multiscale_pairs.py, companion.multihead._multiscale; d = 64, rows 0 and 1, all
  117 pairs): the column above takes sigma from the c = 1 answers, and the answers round more at a
  larger c (c x^T v is subtracted after rounding); with each scale's own rounding a perfect per-pair
  solver gives 53 % / 56 % of pairs within 1e-2 at H = 12 and 84 % / 66 % at H = 10, and every head
  within 1e-2 at 1.44-1.47 d tokens at H = 12 (more than the d a head's start row needs). No solver built
  finds them (variable projection from 64 random starts, grid matching pursuit with coordinate
  descent: 0 or 1 of 117 pairs), a local fit finishes only from about 1e-3 (from the true terms 1e-2
  off, 300 Levenberg-Marquardt steps bring back 0-7.6 % of the pairs), and 2H samples for 2H unknowns
  need not have one solution (two exact term sets at H = 2): not wired into the route.
* So H = 12 at d = 64 needs a start that pools a row's tokens without labelling pairs first, inside a 1-3 %
  basin, or a per-pair global solver for the multi-scale samples (an algebraic one: with c = 0.5, 1, 2, 4
  the poles at one token are q_h, q_h^2, q_h^4, q_h^8 for q_h = exp(-l_h / 2)). Not found this round
  (also tried: a data homotopy from a random model to the answers, which ends at misfit 0.2 already at
  H = 6, 4 random models, 40 steps). An algebraic pooled start (a Jennrich-type simultaneous
  diagonalisation of sum_h gamma_h phi''(R_h^T x) R_h R_h^T, i.e. Hessians in x) needs tokens at finite-
  difference positions: d + 1 = 65 pairs per base point for one gradient per ratio, and one base point's
  2H ratios weigh the heads by the same ill-conditioned sigma'(s_t + l_h) as one pair, so of order H base
  points, about H (d + 1) = 780 pairs per row for the span of the R_h alone, where the count pays for
  K = 117 per row (1.83 d): the count 4Hd^2 - 2H + 1 leaves data / unknowns = 3.7 per row.
"""

import argparse
import sys
import time

import pandas as pd

from companion.multihead import counts_information, counts_length_bounds

START_ACCURACY = 1e-2   # companion.multihead._information.START_ACCURACY, as the table's column names it



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
            table.append(counts_information(d, H, n_rows=args.rows, basin=not args.no_basin))
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
            print(pd.DataFrame(counts_length_bounds(d, H)).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
