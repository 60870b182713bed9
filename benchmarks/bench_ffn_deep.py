"""Benchmark of ``learn_relu_network``: ReLU networks with biases, depth 1 to 3 (issue 37).

Run: .venv/bin/python benchmarks/bench_ffn_deep.py

For each (d, widths) three random networks (``random_relu_network``, seeds 0, 1, 2) are learned
with the widths given. Columns: queries (learning, then with the 256 verification points), bits
of precision (``-log2`` of the worst-case relative error on 2000 fresh ``N(0, I_d)`` inputs, the
field's measure), wall-clock seconds of the learner, and seconds of the oracle alone on the same
number of queries. A refusal is printed with its error class.

Targets (issue 37): depth 1 and 2 (d >= 10, widths >= 8) recovered to 2^-35, verified, at the
sizes in TARGETED. Depth 3 is not targeted: with the widths given the record recovers 20 of 20 draws,
with them detected 16 (4 refused; see the research note benchmarks/ffn_deep.md). Its draws, ``d = 10``, widths (8, 8, 8), seeds
``0 .. --depth3-seeds - 1`` (default 10; a draw costs 1-55 CPU seconds, session 40's record), each recovered
(queries, bits, widths: seeds 13 and 18 come back (8, 7, 8), a dead layer-2 neuron left out) or refused
(the error); every recovered draw must reach 2^-35 (a target). With
``--record PATH`` they are also written there atomically, with the commit: chapter 03 cites
``data/results/ffn_deep.json``, made by ``--depth3-seeds 20 --detect --record data/results/ffn_deep.json``
(about 13 minutes on one thread, session 40).
With ``--detect`` each depth-3 draw is learned again with ``widths=None`` (the record's ``rows_detected``;
seeds 1, 7, 8 and 18 are refused after 83-102 CPU seconds each).

Run: .venv/bin/python benchmarks/bench_ffn_deep.py [--depth3-seeds 20] [--detect] [--record PATH]
"""

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _targets import Targets, write_atomic
from companion.errors import CompanionError
from companion.ffn import bits_of_precision, learn_relu_network, random_relu_network
from companion.oracles import ValueQueryOracle

SIZES = [(10, (8,)), (16, (12,)), (10, (8, 8)), (16, (12, 10))]  # depth 3: depth3_record
SEEDS = (0, 1, 2)
# d = 16, widths (12, 10), seed 0: a layer-2 neuron is active on none of 200,000 inputs at scales
# 1, 3 and 10; refused until session 40, now returned with widths (12, 9) at 42.3 bits (its dead
# neuron left out, verified). Targeted since.
TARGETED = {(10, (8,)), (16, (12,)), (10, (8, 8)), (16, (12, 10))}


RECORD = Path(__file__).resolve().parents[1] / "data" / "results" / "ffn_deep.json"
RECORD_ARG = "data/results/ffn_deep.json"
DEPTH3 = (10, (8, 8, 8))


def _depth3_row(seed: int, widths) -> dict:
    """One draw learned with ``widths`` (None: detected): recovered (learning queries, bits on 2000
    fresh inputs, widths) or refused (why)."""
    d = DEPTH3[0]
    net = random_relu_network(d, DEPTH3[1], seed=seed)
    t0 = time.process_time()
    try:
        rec = learn_relu_network(ValueQueryOracle(net), widths=widths)
    except CompanionError as exc:
        return {"seed": seed, "outcome": type(exc).__name__, "reason": str(exc)[:200],
                "cpu_seconds": round(time.process_time() - t0, 1)}
    X = np.random.default_rng(100 + seed).standard_normal((2000, d))
    return {"seed": seed, "outcome": "recovered", "queries": int(rec.n_learning_queries),
            "bits": round(float(min(bits_of_precision(rec.network.forward(X), net.forward(X)), 53.0)), 1),
            "widths": list(rec.network.widths), "cpu_seconds": round(time.process_time() - t0, 1),
            "targeted_search": rec.diagnostics["targeted_search"]}


def depth3_record(n_seeds: int, detect: bool = False) -> dict:
    """Every draw of ``random_relu_network(10, (8, 8, 8), seed=s)``, ``s < n_seeds``, learned with the
    widths given (``rows``) and, with ``detect``, with ``widths=None`` (``rows_detected``)."""
    d, widths = DEPTH3
    rows, rows_detected = [], []
    for seed in range(n_seeds):
        rows.append(_depth3_row(seed, widths))
        print(f"depth 3, seed {seed}: {rows[-1]['outcome']}", flush=True)
        if detect:
            rows_detected.append(_depth3_row(seed, None))
            print(f"depth 3, seed {seed}, widths detected: {rows_detected[-1]['outcome']}", flush=True)
    commit = subprocess.run(["git", "-C", str(RECORD.parents[2]), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    flag = " --detect" if detect else ""
    out = {"network": f"random_relu_network({d}, {widths}, seed=s)", "widths": list(widths),
           "seeds": n_seeds, "rows": rows,
           "measured": datetime.date.today().isoformat(), "commit": commit,
           "command": f"benchmarks/bench_ffn_deep.py --depth3-seeds {n_seeds}{flag} --record {RECORD_ARG}"}
    if detect:
        out["rows_detected"] = rows_detected
    return out


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--depth3-seeds", type=int, default=10, help="depth-3 draws (default 10)")
    args.add_argument("--detect", action="store_true", help="depth 3 also with widths=None (rows_detected)")
    args.add_argument("--record", default=None, help=f"write the depth-3 record there (chapter 03 reads {RECORD.name})")
    args = args.parse_args(argv)
    targets = Targets()
    header = f"{'d':>3} {'widths':>10} {'seed':>4} {'queries':>8} {'+verify':>8} {'bits':>6} {'sec':>6} {'oracle s':>8}"
    print(header)
    print("-" * len(header))
    for d, widths in SIZES:
        worst = np.inf
        for seed in SEEDS:
            net = random_relu_network(d, widths, seed=seed)
            oracle = ValueQueryOracle(net)
            t0 = time.perf_counter()
            try:
                rec = learn_relu_network(oracle, widths=widths)
            except CompanionError as exc:
                print(f"{d:>3} {str(widths):>10} {seed:>4}  refused: {type(exc).__name__}: {str(exc)[:90]}")
                worst = -np.inf
                continue
            sec = time.perf_counter() - t0
            X = np.random.default_rng(100 + seed).standard_normal((2000, d))
            bits = min(bits_of_precision(rec.network.forward(X), net.forward(X)), 53.0)
            worst = min(worst, bits)
            Xq = np.random.default_rng(1).standard_normal((rec.n_queries, 1, d))
            t1 = time.perf_counter()
            oracle(Xq)
            osec = time.perf_counter() - t1
            print(
                f"{d:>3} {str(widths):>10} {seed:>4} {rec.n_learning_queries:>8} {rec.n_queries:>8} "
                f"{bits:>6.1f} {sec:>6.2f} {osec:>8.3f}",
                flush=True,
            )
        if (d, widths) in TARGETED:
            targets.check(f"d={d}, widths={widths}: every seed recovered to >= 35 bits, verified", worst >= 35)
    record = depth3_record(args.depth3_seeds, args.detect)
    ok = [r for r in record["rows"] if r["outcome"] == "recovered"]
    print(f"depth 3: {len(ok)} of {record['seeds']} draws recovered")
    targets.check("depth 3: every recovered draw at >= 35 bits", all(r["bits"] >= 35 for r in ok))
    if args.detect:
        ok = [r for r in record["rows_detected"] if r["outcome"] == "recovered"]
        print(f"depth 3, widths detected: {len(ok)} of {record['seeds']} draws recovered")
        targets.check("depth 3, widths detected: every recovered draw at >= 35 bits", all(r["bits"] >= 35 for r in ok))
    if args.record:
        write_atomic(Path(args.record), record)
    return targets.exit_code()


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
