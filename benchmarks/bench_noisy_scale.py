"""Benchmark: noisy low rank and RGN at a real head's size, against the oracle's own time (issue 22).

Run:  .venv/bin/python benchmarks/bench_noisy_scale.py [--rows noisy:96:8,rgn:256:8] [--timeout 300]

Each row runs in its own subprocess with one BLAS thread and reports:

* method (``noisy``: ``robust.learn_low_rank_noisy(method="rgn")`` on an approximate oracle,
  tau = 1e-6; ``rgn``: ``lowrank.learn_low_rank(method="rgn")`` on an exact oracle), d, r, m;
* learner s: wall time of the learner; cpu s: its CPU time (user + system of the process, one
  BLAS thread), which is what the learner costs whatever else runs on the machine;
* oracle s / oracle cpu: the part of each spent inside the oracle's calls (the oracle is timed by
  a wrapper around it, on both clocks), so ratio = learner / oracle compares the two in the same
  process: "ratio" on wall time, "cpu ratio" on CPU time;
* peak RSS of the subprocess (MB), the relative error of W, and the 1-minute load average of the
  machine (``os.getloadavg``) when the row ended.

Targets (issue 22, and issue 34 for ``rgn``): ``noisy`` at d = 384, r = 32 within 60 s and 2 GB;
``rgn`` at d = 1024, r = 32 within 10 times the oracle's own time, a guard over its measured floor of
about 9 times (the table below), which stands as the documented limit of RGN on Gaussian rank-one
projections; for exact answers the sketch is the scalable route (1.85 times the oracle's own time at
this size, ``bench_scale.py``; the docstring of ``learn_low_rank`` says so). The seconds and the ratio are judged on CPU time, so a busy
machine (2 shared cores) does not decide them: at a load of 8 a row's wall time was 3 times its
CPU time. A row that does not finish within ``--timeout`` seconds (wall) is printed as such: a
target that is not met is reported, never hidden. The verdicts go through
``benchmarks/_targets.py``, so a missed target (or a target row not run) makes the exit code 1.

Measured (2026-12-01, AMD EPYC, 2 cores shared with other sessions; ``load`` is the 1-minute load
average; before = main at b65a1cf, after = the fused normal operator, the forcing cap 0.5, float32
fits while the residual exceeds 1e-3 and the float32 design of ``companion.numerics.rgn``;
ratio = cpu s / oracle cpu, the targets' measure):

=====================  ======  ==========  =====  =======  =========  =====
row                    cpu s   oracle cpu  ratio  peak MB  rel err W  load
=====================  ======  ==========  =====  =======  =========  =====
rgn 256:8 before       0.6     0.07        9.0    142      6.5e-14    6.1
rgn 256:8 after        0.6     0.07        9.1    115      8.0e-14    9.4
rgn 256:8 after        0.4     0.06        7.2    115      8.0e-14    2.3
rgn 1024:32 before     82.4    6.67        12.4   3392     1.4e-13    7.0
rgn 1024:32 after      67.6    6.64        10.2   1373     1.4e-13    7.2
rgn 1024:32 before     79.6    6.24        12.8   3392     1.4e-13    2.3
rgn 1024:32 after      61.9    6.48        9.6    1373     1.4e-13    3.0
noisy 384:32 before    22.9    1.42        16.1   919      1.3e-01    7.7
noisy 384:32 after     23.4    1.79        13.1   918      1.3e-01    5.9
noisy 384:32 after     21.1    1.67        12.6   918      1.3e-01    3.5
=====================  ======  ==========  =====  =======  =========  =====

Re-measured 2026-12-04 (main at 5c08edd, the same row in a script of the same child, load 2 to 4 from
three other engineers' work): 78.8 CPU s against the oracle's 6.98, ratio 11.3, relative error of W
1.4e-13; 8 Gauss-Newton iterations, 98 conjugate-gradient iterations (1, 2, 6, 9, 17, 27, 28, 8).
Under cProfile in the same conditions (112.6 s in all): the tangent normal operator 66 %, the
oracle 12 %, drawing the design 9 %, the residual fits 5 %, the spectral start 4 %, the adjoints
3 %. So the 10x guard holds on a quiet machine (9.6 above) and fails under load: the float32
products of the conjugate gradients slow down more than the oracle's float64 ones when another
process shares the cache. The last iteration (8 inner iterations, 1.58e-13 to 1.14e-13) only finds
that the residual has reached the measurements' rounding (about 1.1e-13 at d = 1024, above
``tol`` = 1e-13; at d = 512 the same iteration still gains 3x, 2.5e-13 to 8.4e-14): a stop that knew
the rounding level in advance would save it, about 5 % of the run, not enough to change the verdict.

Re-measured 2026-12-05 in ``make bench`` (main at 28a5ef2, AMD EPYC, one BLAS thread): 70.2 CPU s against the
oracle's 6.43, ratio 10.9, at a load of 1.2 to 1.9 (other work of the same session); the row alone again on a quiet
machine (load 1.0): 69.3 CPU s against 6.28, ratio 11.0, relative error of W 1.4e-13. So on this host the guard
fails on a quiet machine too: the sentence above ("holds on a quiet machine") held on the earlier one only. The
guard was not widened; the row stays a failed target until RGN itself gets faster (the last iteration's 5 % is not
enough).

Session 44 (2026-12-05, AMD EPYC, one BLAS thread): at cb97ea6, load 1.1, 70.9 CPU s against the oracle's 6.30,
ratio 11.3; at aee4472, load 0.8, 71.5 against 6.36, ratio 11.2, the run saved to
``data/results/bench_noisy_scale.json``, which chapter 04 cites. Tried, not adopted:
the adjoint of ``_tangent_step`` in row chunks as the normal operator is (0.29 s per call either way: its two
products run at the same speed whole or chunked); drawing the float32 design directly in float32
(``rng.standard_normal(dtype=np.float32)``, 2.6 to 2.7 CPU s against 4.0 to 5.0 for the float64 draws rounded),
which would change every RGN design and save under 3 % of the row, not the 10 % the guard needs. Under cProfile
the tangent normal operator was 50 of 73 s (98 applications), the oracle 6.4, the design 5.0, the residual fits
3.9, the spectral start 3.5, the adjoints 2.3.

Session 45 (2026-12-05, a fresh machine, AMD EPYC, one BLAS thread, main at bdf2013, load 0.6): 52.6 CPU s against
the oracle's 4.82, ratio 10.9, relative error of W 1.4e-13 (this host is faster, the ratio the same). Under cProfile
(52.9 s): the tangent normal operator 35.4 s (98 applications, 0.36 s each: 4 m d r = 16.9 G float32 multiply-adds
at 47 GMAC/s, this core's AVX2 peak), the oracle 4.8, the design 4.5, the residual fits 3.3, the spectral start
2.6, the adjoints 1.5. Residuals per Gauss-Newton iteration 1.30, 0.41, 0.17, 4.3e-2, 3.0e-3, 1.5e-5, 1.5e-9,
1.54e-13, 1.08e-13. What is left to cut, estimated and not adopted: the last iteration (8 inner iterations, 2.9 s,
and its residual fit, 0.3 s) stops only because it finds the measurements' rounding, which nothing here knows in
advance, and a stop at 1.54e-13 would trade the accuracy it still buys (a fittable part of about 1.1e-13) for 6 %;
the float32 draws above save about 2 s; with both, about 47 s, 9.8 times the oracle, within the noise of the
guard. The floor of the inner iterations alone (87 at 0.36 s, against the oracle's 4.8 s) is 6.5 oracle-times; a
robust pass of the 10x guard on this host needs fewer inner iterations than the Marchenko-Pastur bound allows at
``m = 2 n``, or a faster product than the core's peak: the row stays a failed target here. These runs used the
Haswell kernel this machine sets (``OPENBLAS_CORETYPE``); with both variables unset, as the machine's notes advise for
benchmarks, OpenBLAS takes its SkylakeX (AVX-512) kernel and the row took 41.2 CPU s against the oracle's 3.14: 13.1
times, worse, the oracle's float64 products gaining more than the float32 ones (same session).

Session 49 (2026-12-05, AMD EPYC, one BLAS thread, main at 1ffbc31, load 0.8): 50.8 CPU s against the oracle's 4.63,
ratio 11.0. Under cProfile (53.0 s): the tangent normal operator 35.1 s (98 applications, 0.358 s each), the design
4.66, the oracle 4.9, the residual fits 3.18, the spectral start 2.54, the adjoints 1.53. A microbenchmark of the
normal operator's four float32 products on this host: 0.33 to 0.35 s whatever the row chunk (256 to 4,096 rows), the
products alone 0.329 to 0.375 s, i.e. 50 GMAC/s against 59 for a square float32 product: the skinny products are at 85 %
of the square ones, and the operator's Python overhead is under 5 %. Tried together in a scratch clone, not adopted:
native float32 draws of the design and a stop at ``tol = 2.27e-13`` (64 sqrt(d) u, above the measurements' rounding
floor, measured at 24 to 43 sqrt(d) u for d = 128 to 1024, two heads each, and 131 sqrt(d) u for one d = 64 head):
9.24 and 9.89 times in two runs, 9.08 with the stop alone, while the oracle's own time moved from 4.6 to 5.4 s
between runs of the same queries; the stop also returns W to 1.5e-13 to 2.8e-13 instead of 1.4e-13. A pass that
depends on the run is no guard, so the row stays a failed target on this host, with neither change landed.

The rgn 1024:32 row missed the former target of 3x, and cannot meet it with this solver: its conjugate-gradient
iterations alone (at least 87 at ``m = 2 n``, each 1/14 of the oracle) cost 6.3 oracle-times, and
the design, the spectral start and the oracle 2.2 more (the accounting is in the docstring of
``companion.numerics.rgn``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _targets import Targets, save_rows  # benchmarks/_targets.py: printed targets decide the exit code

#: (method, d, r) -> (largest learner seconds, largest peak MB, largest ratio to the oracle).
#: rgn at 1024:32: 10x, a guard over the measured floor of about 9x (issue 34 item 5; it was 3x).
TARGETS = {("noisy", 384, 32): (60.0, 2048.0, None), ("rgn", 1024, 32): (None, None, 10.0)}

DEFAULT_ROWS = "noisy:96:8,noisy:192:16,noisy:384:32,rgn:256:8,rgn:1024:32"

_CHILD = r"""
import json, os, resource, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
from companion import lowrank, robust
from companion.attention import random_single_head
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle

method, d, r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


class Timed:
    def __init__(self, oracle):
        self.oracle, self.seconds, self.cpu = oracle, 0.0, 0.0

    def __getattr__(self, name):
        return getattr(self.oracle, name)

    def __call__(self, X):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return self.oracle(X)
        finally:
            self.seconds += time.perf_counter() - t0
            self.cpu += time.process_time() - c0


with threadpool_limits(1):
    if method == "noisy":
        target = robust.random_margin_head(d, W_max=4.0, mu=0.5 / np.sqrt(d), rank=r, seed=0)
        oracle = Timed(ApproxValueQueryOracle(target, 1e-6))
        t0, c0 = time.perf_counter(), time.process_time()
        rec = robust.learn_low_rank_noisy(oracle, r, W_max=4.0)
    else:
        target = random_single_head(d, rank=r, seed=0)
        oracle = Timed(ValueQueryOracle(target))
        t0, c0 = time.perf_counter(), time.process_time()
        rec = lowrank.learn_low_rank(oracle, r, method="rgn")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
err = rec.relative_errors(target)["W"]
print(json.dumps({"method": method, "d": d, "r": r, "m": int(rec.diagnostics["n_measurements"]),
                  "learner_s": seconds, "cpu_s": cpu, "oracle_s": oracle.seconds, "oracle_cpu_s": oracle.cpu,
                  "rel_error_W": err, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "load": os.getloadavg()[0]}))
"""


def run_row(method: str, d: int, r: int, timeout: float) -> dict:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, method, str(d), str(r)], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"method": method, "d": d, "r": r, "status": f"timeout ({timeout:g} s)"}
    if proc.returncode != 0:
        return {"method": method, "d": d, "r": r,
                "status": "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:90]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["status"] = "ok"
    row["wall_s"] = time.perf_counter() - start
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="method:d:r,... (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per row")
    parser.add_argument("--no-save", action="store_true", help="do not write data/results/bench_noisy_scale.json")
    args = parser.parse_args(argv)
    rows = {}
    print(f"{'method':>6} {'d':>5} {'r':>3} {'m':>8} {'learner s':>10} {'cpu s':>7} {'oracle s':>9} {'oracle cpu':>10} "
          f"{'ratio':>6} {'cpu ratio':>9} {'peak MB':>8} {'rel err W':>10} {'load':>5}  status")
    for spec in args.rows.split(","):
        method, d, r = spec.split(":")
        row = run_row(method, int(d), int(r), args.timeout)
        rows[(method, int(d), int(r))] = row
        if row["status"] == "ok":
            ratio = row["learner_s"] / max(row["oracle_s"], 1e-9)
            cpu_ratio = row["cpu_s"] / max(row["oracle_cpu_s"], 1e-9)
            print(f"{method:>6} {row['d']:>5} {row['r']:>3} {row['m']:>8} {row['learner_s']:>10.1f} "
                  f"{row['cpu_s']:>7.1f} {row['oracle_s']:>9.2f} {row['oracle_cpu_s']:>10.2f} {ratio:>6.1f} "
                  f"{cpu_ratio:>9.1f} {row['peak_mb']:>8.0f} {row['rel_error_W']:>10.1e} {row['load']:>5.1f}  ok",
                  flush=True)
        else:
            print(f"{method:>6} {d:>5} {r:>3} {'':>8} {'':>10} {'':>7} {'':>9} {'':>10} {'':>6} {'':>9} {'':>8} "
                  f"{'':>10} {'':>5}  {row['status']}", flush=True)
    if not args.no_save:
        path = save(rows, {"rows": args.rows, "timeout": args.timeout, "threads": 1})
        print(f"rows saved to {path}")
    return verdicts(rows).exit_code()


def save(rows, params):
    """Merge the rows that ran into data/results/bench_noisy_scale.json (atomic write, with
    provenance per row and for the file), keyed ``method:d:r``; a row that did not finish is not
    saved, so the file keeps that row's last finished run. Chapter 04 reads its ``rgn:1024:32``
    row."""
    done = {
        f"{method}:{d}:{r}": row
        | {
            "cpu_ratio": row["cpu_s"] / row["oracle_cpu_s"],
            "target_cpu_ratio": TARGETS.get((method, d, r), (None, None, None))[2],
        }
        for (method, d, r), row in rows.items()
        if row["status"] == "ok"
    }
    return save_rows("bench_noisy_scale", params, done)


def verdicts(rows) -> Targets:
    """One verdict per target of :data:`TARGETS` (a target whose row was not run, or did not finish,
    fails)."""
    targets = Targets()
    for (method, d, r), (seconds, mb, ratio) in TARGETS.items():
        row = rows.get((method, d, r), {"status": "not run"})
        ok = row["status"] == "ok"
        if seconds is not None:
            targets.check(f"{method} d={d} r={r} within {seconds:g} CPU s", ok and row["cpu_s"] <= seconds)
        if mb is not None:
            targets.check(f"{method} d={d} r={r} within {mb:g} MB", ok and row["peak_mb"] <= mb)
        if ratio is not None:
            targets.check(f"{method} d={d} r={r} within {ratio:g}x the oracle's CPU time",
                          ok and row["cpu_s"] <= ratio * row["oracle_cpu_s"])
    return targets


if __name__ == "__main__":
    sys.exit(main())
