"""Benchmark of learning real all-MiniLM-L6-v2 heads: queries, relative errors and seconds.

Run:  .venv/bin/python benchmarks/bench_pretrained.py [--all]

By default one head per layer (head 0 of layers 0 to 5); ``--all`` runs all 72 heads. For each head:

* ``homogeneous``: :func:`companion.pretrained.learn_homogeneous_head` on the exact BERT head in
  homogeneous coordinates (d = 385, queries restricted to tokens ending in 1), oracle over the
  :class:`~companion.pretrained.FactorScoredHead` target (scores through the rank-33 factors);
* ``bert oracle``: the same learner, oracle over :class:`~companion.pretrained.BertAttentionTarget`
  (BERT's own computation from the raw weight layout, never the merged ``W~``, ``v~``), as
  chapter 07 runs it;
* baseline ``dense oracle``: the same learner with the same head evaluated densely as a plain
  ``SingleHead(W~, v~)`` (O(d^2) per query), run in the same process, for layer 0 only;
* ``bias-free``: :func:`companion.exact.learn_single_head` on ``load_head(..., bias=False)``
  (d = 384, the plain §3 regressor, d + d^2 queries).

Seconds are CPU seconds of this process (``time.process_time``: the machine is shared, so wall time
varies with load). The ratio column is seconds / seconds of the homogeneous learner on the same head. Targets
(issue 3): relative error of W~ <= 1e-10 on every head; (d + 1)^2 = 148,225 queries per head.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from companion import pretrained
from companion.attention import SingleHead
from companion.exact import learn_single_head
from companion.oracles import ValueQueryOracle

TARGET_ERROR = 1e-10


def _run(kind, layer, head):
    if kind == "bias-free":
        target = pretrained.load_head(layer, head, bias=False)
        oracle = ValueQueryOracle(target)
        t0 = time.process_time()
        rec = learn_single_head(oracle)
        seconds = time.process_time() - t0
        err = rec.relative_errors(target)
    else:
        target = pretrained.load_head(layer, head)
        if kind == "dense oracle":
            target_oracle = SingleHead(target.W, target.v)
        elif kind == "bert oracle":
            target_oracle = pretrained.BertAttentionTarget(layer, head)
        else:
            target_oracle = target
        oracle = ValueQueryOracle(target_oracle)
        t0 = time.process_time()
        rec = pretrained.learn_homogeneous_head(oracle)
        seconds = time.process_time() - t0
        err = pretrained.homogeneous_errors(rec, target)
    return {"kind": kind, "layer": layer, "head": head, "d": target.d, "queries": rec.n_learning_queries,
            "err_W": err["W"], "err_v": err["v"], "seconds": seconds}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="all 72 heads (default: head 0 of each layer)")
    args = parser.parse_args(argv)
    pairs = [(L, h) for L in range(6) for h in (range(12) if args.all else (0,))]
    rows = []
    for layer, head in pairs:
        base = _run("homogeneous", layer, head)
        rows.append(base | {"ratio": 1.0})
        kinds = ["bert oracle", "bias-free"] + (["dense oracle"] if layer == 0 and head == 0 else [])
        for kind in kinds:
            r = _run(kind, layer, head)
            rows.append(r | {"ratio": r["seconds"] / base["seconds"]})
    header = ("learner", "layer", "head", "d", "queries", "rel. err W", "rel. err v", "seconds", "ratio")
    print(" | ".join(f"{h:>12}" for h in header))
    print(" | ".join("-" * 12 for _ in header))
    for r in rows:
        print(" | ".join([f"{r['kind']:>12}", f"{r['layer']:>12d}", f"{r['head']:>12d}", f"{r['d']:>12d}",
                          f"{r['queries']:>12,d}", f"{r['err_W']:>12.2e}", f"{r['err_v']:>12.2e}",
                          f"{r['seconds']:>12.2f}", f"{r['ratio']:>11.2f}x"]))
    homog = [r for r in rows if r["kind"] != "bias-free"]
    ok_err = all(r["err_W"] <= TARGET_ERROR for r in rows)
    ok_q = all(r["queries"] == 385**2 for r in homog)
    total = sum(r["seconds"] for r in rows if r["kind"] == "homogeneous")
    print(f"\nrel. error of W <= {TARGET_ERROR:g} on every head: {'PASS' if ok_err else 'FAIL'}; "
          f"homogeneous queries == 385^2: {'PASS' if ok_q else 'FAIL'}; "
          f"homogeneous learner: {total:.1f} s for {len(pairs)} heads "
          f"({total / len(pairs):.2f} s per head)")
    return 0 if ok_err and ok_q else 1


if __name__ == "__main__":
    raise SystemExit(main())
