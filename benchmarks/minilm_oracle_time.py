"""The oracle's own CPU time for the queries of MiniLM's whole-block run (benchmarks/minilm_block.py), estimated.

Run: .venv/bin/python benchmarks/minilm_oracle_time.py [--record data/results/minilm_block.json]

The learner's batches (about 300 GB) cannot be kept for a replay, and the recorded run did not time its oracle
calls (``bench_layer.py``'s MiniLM row now does, in the run). This times the target on batches of the run's own
shapes, built as the learner builds them (``companion.layer._joint._pair_queries``): ``ROWS`` of the joint stage's
``d`` row batches (``d + 25`` tokens times ``2 H`` ratios, 25 positions) and ``LINKS`` of its ``d - 1`` link batches
(8 tokens), the least of 3 timings of each, scaled to the run's counts; the stages of one-token and short queries
(about 5,800 queries) are timed whole. With ``--record`` the estimate is added to the record (atomically) as
``oracle_s_estimate``, with the ratio ``cpu_s / oracle_s_estimate``. This book's own measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from _targets import write_atomic

ROWS, LINKS = 3, 6


def _least(f, k=3):
    best = np.inf
    for _ in range(k):
        c0 = time.process_time()
        f()
        best = min(best, time.process_time() - c0)
    return best


def estimate(d=384, H=12, seed=0) -> dict:
    from companion.layer import minilm_block
    from companion.layer._joint import EXTRA_TOKENS, _pair_queries

    block, rng = minilm_block(), np.random.default_rng(seed)
    n_tok = d + 1 + EXTRA_TOKENS
    X = rng.standard_normal((n_tok, d)) * 2 / np.sqrt(d)
    XL = rng.standard_normal((8, d)) * 2 / np.sqrt(d)
    buf = np.empty((n_tok * 2 * H, 2 * H + 1, d))
    row = np.mean([_least(lambda: block(_pair_queries(np.eye(d)[i], X, H, buf))) for i in range(ROWS)])
    link = np.mean([_least(lambda: block(_pair_queries(np.eye(d)[i], XL, H))) for i in range(LINKS)])
    short = [rng.standard_normal((int(n), d)) / np.sqrt(d) for n in rng.integers(1, 9, size=5800)]
    rest = _least(lambda: block(short), k=1)
    total = d * row + (d - 1) * link + rest
    return {"oracle_s_estimate": float(total), "row_s": float(row), "link_s": float(link), "short_s": float(rest)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--record", default=None)
    args = p.parse_args(argv)
    est = estimate()
    print(est, flush=True)
    if args.record:
        record = json.loads(Path(args.record).read_text())
        record.update(est, ratio_estimate=record["cpu_s"] / est["oracle_s_estimate"])
        write_atomic(Path(args.record), record)
        print({k: record[k] for k in ("cpu_s", "oracle_s_estimate", "ratio_estimate")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
