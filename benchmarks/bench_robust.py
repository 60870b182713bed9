"""Benchmark of companion.robust: queries, errors and seconds of the Theorem 6.2 learner (the
baseline) and the least-squares learner, on random heads satisfying §6's assumptions.

Run: .venv/bin/python benchmarks/bench_robust.py
Prints one table; "err ratio" and "time ratio" compare each row with the Theorem 6.2 learner on the
same head, oracle and dimension, run in the same process.
"""

import time

import numpy as np
import pandas as pd

from companion.oracles import ApproxValueQueryOracle
from companion.robust import learn_robust, learn_robust_lstsq, random_margin_head

W_MAX, TAU = 4.0, 1e-5


def run(d, learner, noise):
    mu = 0.5 / np.sqrt(d)
    head = random_margin_head(d, W_max=W_MAX, mu=mu, seed=d)
    oracle = ApproxValueQueryOracle(head, TAU, noise=noise, seed=1)
    t = time.perf_counter()
    rec = learner(oracle, mu)
    sec = time.perf_counter() - t
    return rec.n_queries, float(np.linalg.norm(rec.W - head.W)), sec


def main():
    learners = {
        "Theorem 6.2": lambda o, mu: learn_robust(o, W_max=W_MAX, mu=mu),
        "lstsq R=1": lambda o, mu: learn_robust_lstsq(o, W_max=W_MAX, repeats=1),
        "lstsq R=4": lambda o, mu: learn_robust_lstsq(o, W_max=W_MAX, repeats=4),
    }
    rows = []
    for d in (8, 32, 128):
        for noise in ("uniform", "worst"):
            base = None
            for name, learner in learners.items():
                q, err, sec = run(d, learner, noise)
                base = base or (err, sec)
                rows.append({"d": d, "noise": noise, "learner": name, "queries": q,
                             "||W-W*||_F": f"{err:.2e}", "seconds": f"{sec:.3f}",
                             "err ratio": f"{err / base[0]:.3f}", "time ratio": f"{sec / base[1]:.2f}"})
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
