"""The default path (no precision stated) within 10x of its floor on framework float32 layers (issue 33).

Run: OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_default_path.py [--d 64 128 384]

A user does not know to state the precision. For a Keras 3 ``MultiHeadAttention`` layer in float32
(numpy backend, one head, no biases, key_dim = d / 4, read out in float64: full-width answers of a
float32 computation), Theorem 4.1's learner and the sketch (``rank=None``) are called with their
defaults, and their relative error of ``W`` is compared with the floor they report
(``diagnostics["floor_W"]``, the error one rounding ``u`` of every answer causes). Target: at most 10x
(before issue 33: 34x and 35x at d = 128). The learners measure ``u`` first when it costs at most 2 %
of their queries (the sketch with ``rank=None`` always), so the probe scale, the saturation band and
the rank cut follow it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "numpy")

sys.path.insert(0, os.path.dirname(__file__))
from _targets import Targets  # noqa: E402
from diagnoses_sweep import KerasLayer  # noqa: E402

from companion import exact, lowrank  # noqa: E402
from companion.oracles import ValueQueryOracle  # noqa: E402

#: The largest ratio of error to reported floor on the default path.
MAX_RATIO = 10.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 384])
    args = ap.parse_args(argv)
    targets = Targets()
    print("| learner | d | rank | error W | floor_W | ratio | u measured | rank detected | queries | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        layer = KerasLayer(d, "float32", "float64", key_dim=d // 4)
        for name, learn in (
            ("learn_single_head", lambda o: exact.learn_single_head(o)),
            ("learn_low_rank[sketch]", lambda o: lowrank.learn_low_rank(o, None, method="sketch")),
        ):
            t0 = time.perf_counter()
            rec = learn(ValueQueryOracle(layer, d=d))
            sec = time.perf_counter() - t0
            err = float(np.linalg.norm(rec.W - layer.W) / np.linalg.norm(layer.W))
            floor = float(rec.diagnostics["floor_W"])
            ratio = err / floor
            print(
                f"| {name} | {d} | {d // 4} | {err:.2e} | {floor:.2e} | {ratio:.1f} | "
                f"{rec.diagnostics['precision']:.1e} | {rec.diagnostics.get('rank_detected', '-')} | "
                f"{rec.n_queries} | {sec:.1f} |",
                flush=True,
            )
            targets.check(f"{name} d={d}: error within {MAX_RATIO:g}x of its floor", ratio <= MAX_RATIO)
            if "rank_detected" in rec.diagnostics:
                targets.check(f"{name} d={d}: rank {d // 4} detected", rec.diagnostics["rank_detected"] == d // 4)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
