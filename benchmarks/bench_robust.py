"""Benchmark of companion.robust: queries, errors and seconds of the Theorem 6.2 learner (the
baseline) and the least-squares learner, on random heads satisfying §6's assumptions.

Run: .venv/bin/python benchmarks/bench_robust.py [--minilm]
Prints one table; "err ratio" and "time ratio" compare each row with the Theorem 6.2 learner on the
same head, oracle and dimension, run in the same process.

With --minilm it instead runs noisy low-rank recovery (learn_low_rank_noisy, rank 32) on MiniLM
head L3H5 served in float16 and bfloat16 (chapter 5's settings: W_max = 13, m = 3 r(2d - r),
seed 0; the same computation as chapter 5 with minilm_noisy = True; each weighted Gauss-Newton
step is a conjugate-gradient solve over 70,656 measurements and 24,576 unknowns: measured 171 s
for the float16 oracle on one loaded core (issue 22), so expect minutes)
and saves the rows, with the commit and library hash, to benchmarks/results/minilm_noisy_lowrank.json.
"""

import json
import sys
import time
from pathlib import Path

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


MINILM_HEADS = [(3, 5)]
MINILM_RANK, MINILM_W_MAX, MINILM_MULTIPLE, MINILM_SEED = 32, 13.0, 3, 0
MINILM_OUT = Path(__file__).resolve().parent / "results" / "minilm_noisy_lowrank.json"


def minilm():
    """Noisy low-rank recovery of real MiniLM heads behind 16-bit oracles (chapter 5, minilm_noisy)."""
    from companion import pretrained
    from companion.book import results
    from companion.errors import PrecisionError
    from companion.robust import learn_low_rank_noisy

    rows = []
    for layer, hd in MINILM_HEADS:
        head = pretrained.load_head(layer, hd, bias=False)
        m = MINILM_MULTIPLE * MINILM_RANK * (2 * head.d - MINILM_RANK)
        for fmt in ("float16", "bfloat16"):
            oracle = ApproxValueQueryOracle(head, None, noise=fmt)
            t = time.perf_counter()
            row = {"head": f"L{layer}H{hd}", "format": fmt}
            try:
                rec = learn_low_rank_noisy(oracle, MINILM_RANK, W_max=MINILM_W_MAX, n_measurements=m,
                                           seed=MINILM_SEED)
            except PrecisionError as exc:  # the answers do not determine W: no W returned
                row["refused"] = str(exc)
            else:
                err = rec.relative_errors(head)
                row.update({"rel. error W": float(err["W"]), "rel. error v": float(err["v"])})
            sec = time.perf_counter() - t
            rows.append(dict(row, queries=int(oracle.n_queries), seconds=round(sec, 1)))
            print(rows[-1], flush=True)
    MINILM_OUT.parent.mkdir(exist_ok=True)
    MINILM_OUT.write_text(json.dumps({
        "what": "learn_low_rank_noisy on MiniLM heads (bias=False) behind float16/bfloat16 oracles",
        "settings": {"heads": MINILM_HEADS, "rank": MINILM_RANK, "W_max": MINILM_W_MAX,
                     "m_multiple_of_dof": MINILM_MULTIPLE, "seed": MINILM_SEED},
        "commit": results.provenance("minilm_noisy_lowrank", {}, MINILM_SEED)["commit"],
        "library_hash": results.library_hash(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}, indent=1) + "\n")
    print(f"saved {MINILM_OUT}")


if __name__ == "__main__":
    minilm() if "--minilm" in sys.argv else main()
