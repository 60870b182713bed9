"""Benchmark of the structured multi-head learner (heads in mutually orthogonal subspaces).

Run: .venv/bin/python benchmarks/bench_multihead.py

For each (d, H) and a few seeds: queries, worst relative head errors after matching heads, and
seconds of learn_orthogonal_heads, against the baseline learn_single_head on a single head of the
same d in the same process (Theorem 4.1, d + d^2 queries). Speed target: every row under 1 s.
"""

import time

import numpy as np
import pandas as pd

from companion.attention import random_single_head
from companion.exact import learn_single_head
from companion.multihead import learn_orthogonal_heads, match_heads, random_multi_head
from companion.oracles import ValueQueryOracle

CASES = [(8, 2), (16, 2), (16, 4), (32, 4), (32, 8), (64, 8)]
SEEDS = range(3)
TARGET_SECONDS = 1.0


def main():
    rows = []
    for d, H in CASES:
        for seed in SEEDS:
            target = random_multi_head(d, H, orthogonal=True, seed=seed)
            oracle = ValueQueryOracle(target)
            t0 = time.perf_counter()
            rec = learn_orthogonal_heads(oracle)
            t_multi = time.perf_counter() - t0
            m = match_heads(target, rec.model)
            base = ValueQueryOracle(random_single_head(d, seed=seed))
            t0 = time.perf_counter()
            learn_single_head(base)
            t_single = time.perf_counter() - t0
            rows.append({
                "d": d, "H": H, "seed": seed, "heads found": rec.n_heads,
                "queries": rec.n_queries, "2d^2+2d": 2 * d * d + 2 * d,
                "queries / (d+d^2)": rec.n_queries / base.n_queries,
                "max W err": m["max_W_error"], "max v err": m["max_v_error"],
                "seconds": t_multi, "seconds / single": t_multi / max(t_single, 1e-9),
            })
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(df.to_string(index=False))
    slow = df[df["seconds"] > TARGET_SECONDS]
    print(f"\nrows over the {TARGET_SECONDS:g} s target: {len(slow)}; "
          f"worst W error {df['max W err'].max():.2e}; worst v error {df['max v err'].max():.2e}")


if __name__ == "__main__":
    main()
