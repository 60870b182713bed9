"""Benchmark of the Theorem 4.1 learner: queries, relative errors and seconds against d.

Run:  .venv/bin/python benchmarks/bench_exact.py [d ...]

Targets (issue 2): relative error <= 1e-12 at every d, n_learning_queries == d + d^2 (the default
verification is counted apart), and d = 384 (d + d^2 = 147,840 queries) within 5 s. The exit code is 1
if a target fails.
The baseline, run in the same process, is the oracle answering the same queries one sequence at a
time in a Python loop (timed on a sample of queries and extrapolated), which is what a non-vectorised
oracle costs; the ratio column is baseline seconds / learner seconds.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from companion.attention import random_single_head
from companion.exact import column_queries, learn_single_head, probe_matrix
from companion.oracles import ValueQueryOracle

from _targets import Targets     # benchmarks/_targets.py: printed targets decide the exit code

TARGET_ERROR = 1e-12
TARGET_SECONDS_384 = 5.0


def per_query_loop_seconds(target, n_sample=2000):
    """Seconds for d + d^2 queries answered one at a time, extrapolated from ``n_sample`` of them."""
    d = target.d
    U = probe_matrix(target.v, "basis")
    X = column_queries(U, 0, 1.0)
    X = np.concatenate([X] * int(np.ceil(n_sample / d)))[:n_sample]
    oracle = ValueQueryOracle(target)
    t0 = time.perf_counter()
    for x in X:
        oracle(x)
    return (time.perf_counter() - t0) / n_sample * (d + d * d)


class _Rows(list):
    """The table's rows, with the exit code its targets decided."""

    exit_code = 0


def main(d_values=(64, 128, 256, 384), seed=0):
    rows = _Rows()
    for d in d_values:
        target = random_single_head(d, seed=seed + d)
        oracle = ValueQueryOracle(target)
        t0 = time.perf_counter()
        rec = learn_single_head(oracle)
        seconds = time.perf_counter() - t0
        err = rec.relative_errors(target)
        loop = per_query_loop_seconds(target)
        rows.append((d, rec.n_learning_queries, d + d * d, err["W"], err["v"], seconds, loop, loop / seconds,
                     rec.diagnostics["n_verify_queries"]))
    header = ("d", "learning q.", "d + d^2", "rel. err W", "rel. err v", "seconds", "loop s (est.)", "speed-up")
    print(" | ".join(f"{h:>13}" for h in header))
    print(" | ".join("-" * 13 for _ in header))
    for d, q, dd, ew, ev, s, loop, ratio, _ in rows:
        print(" | ".join([f"{d:>13d}", f"{q:>13,d}", f"{dd:>13,d}", f"{ew:>13.2e}", f"{ev:>13.2e}",
                          f"{s:>13.3f}", f"{loop:>13.2f}", f"{ratio:>12.0f}x"]))
    print(f"\n(verification queries, counted apart: {', '.join(str(r[8]) for r in rows)})")
    targets = Targets()
    targets.check(f"error <= {TARGET_ERROR:g} at every d", all(r[3] <= TARGET_ERROR and r[4] <= TARGET_ERROR
                                                              for r in rows))
    targets.check("n_learning_queries == d + d^2 at every d", all(r[1] == r[2] for r in rows))
    big = [r for r in rows if r[0] == 384]
    if big:
        targets.check(f"d = 384 in {big[0][5]:.2f} s (target {TARGET_SECONDS_384:g} s)",
                      big[0][5] <= TARGET_SECONDS_384)
    rows.exit_code = targets.exit_code()
    return rows


if __name__ == "__main__":
    sys.exit(main(tuple(int(a) for a in sys.argv[1:]) or (64, 128, 256, 384)).exit_code)
