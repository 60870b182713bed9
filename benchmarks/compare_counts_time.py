"""The counts route's time against the oracle's, before and after a change, in one process.

Run: .venv/bin/python benchmarks/compare_counts_time.py [--ref 60d8216] [--repeats 5] [--cases 32,2 64,4]

The learner of git revision ``--ref`` (its ``src/companion`` extracted with ``git archive`` into a
temporary folder and imported as ``companion_before``) and the working tree's learner run
interleaved on the same targets (``random_multi_head(d, H, seed=0)``, verification off), then the
oracle's replay of the same queries batched by length (bench_multihead.oracle_seconds), and at its
best block size (bench_multihead.oracle_best_seconds). Each time is the least of ``--repeats`` runs,
in wall and in CPU seconds of this process; printed as learner / oracle. A table for the report of a change, not a target (bench_multihead.py has those).

Every case is first run once by each learner, untimed: the first case a process times otherwise
runs about a third slower for both learners, however many repeats (measured 2026-12-01: (32, 2)
after 23 ms, then 17 ms CPU in the same process; before 29, then 23 ms).
"""

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench_multihead import RecordingOracle, oracle_best_seconds, oracle_seconds

from companion.multihead import learn_canonical_rational, random_multi_head
from companion.oracles import ValueQueryOracle


def import_revision(ref, folder):
    """``src/companion`` of git revision ``ref`` as the package ``companion_before`` (relative imports only)."""
    root = Path(__file__).resolve().parent.parent
    data = subprocess.run(["git", "-C", str(root), "archive", ref, "src/companion"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    (Path(folder) / "src" / "companion").rename(Path(folder) / "companion_before")
    sys.path.insert(0, str(folder))
    import companion_before.multihead
    import companion_before.oracles

    return companion_before.multihead, companion_before.oracles


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref", default="60d8216", help="git revision of the 'before' learner")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=["32,2", "32,4", "64,2", "64,4", "32,7", "64,7"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        old, old_oracles = import_revision(args.ref, folder)
        cases = [(int(a), int(b)) for a, b in (c.split(",") for c in args.cases)]
        for d, H in cases:  # the untimed warm-up (see above)
            old.learn_canonical_rational(old_oracles.ValueQueryOracle(old.random_multi_head(d, H, seed=0)), H=H, verify=0)
            learn_canonical_rational(ValueQueryOracle(random_multi_head(d, H, seed=0)), H=H, verify=0)
        print("d  H | wall: before  after  oracle  before/o  after/o | CPU: before  after  oracle  before/o  after/o"
              " | oracle at its best block (wall, CPU): before/o  after/o  before/o  after/o")
        for d, H in cases:
            target, target_old = random_multi_head(d, H, seed=0), old.random_multi_head(d, H, seed=0)
            best = {k: float("inf") for k in ("wb", "wa", "cb", "ca")}
            for _ in range(args.repeats):
                for tag, run in (("b", lambda: old.learn_canonical_rational(old_oracles.ValueQueryOracle(target_old), H=H, verify=0)),
                                 ("a", lambda: learn_canonical_rational(ValueQueryOracle(target), H=H, verify=0))):
                    t0, c0 = time.perf_counter(), time.process_time()
                    run()
                    best["w" + tag] = min(best["w" + tag], time.perf_counter() - t0)
                    best["c" + tag] = min(best["c" + tag], time.process_time() - c0)
            rec = RecordingOracle(ValueQueryOracle(target))
            learn_canonical_rational(rec, H=H, verify=0)
            wo = oracle_seconds(target, rec.queries, args.repeats)
            co = oracle_seconds(target, rec.queries, args.repeats, clock=time.process_time)
            wb = oracle_best_seconds(target, rec.queries, args.repeats)
            cb = oracle_best_seconds(target, rec.queries, args.repeats, clock=time.process_time)
            print(f"{d:2d} {H:2d} | {best['wb']:12.3f} {best['wa']:6.3f} {wo:7.4f} {best['wb'] / wo:9.2f} {best['wa'] / wo:8.2f} | "
                  f"{best['cb']:11.3f} {best['ca']:6.3f} {co:7.4f} {best['cb'] / co:9.2f} {best['ca'] / co:8.2f} | "
                  f"{best['wb'] / wb:8.2f} {best['wa'] / wb:8.2f} {best['cb'] / cb:9.2f} {best['ca'] / cb:8.2f}", flush=True)


if __name__ == "__main__":
    main()
