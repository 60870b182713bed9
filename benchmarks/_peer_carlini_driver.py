"""Drive Carlini, Jagielski & Mironov 2020's public code on one network (run in the peers' venv).

Not part of the library, and never run in the project's venv: ``benchmarks/ffn_peers.py`` calls it
through a subprocess with the scratch venv's Python, in a checkout of
``google-research/cryptanalytic-model-extraction`` (the repairs it needed are listed in
``benchmarks/ffn_peers.md``). It imports their ``extract.py`` and runs its ``run_full_attack``
exactly as their ``__main__`` does, with two differences, both of measurement:

* the pool has one worker (their ``mp.Pool(cpu_count() // 4)`` is ``Pool(0)`` on 2 cores, an error);
* queries are counted as ``len(SAVED_QUERIES)`` (their ``run`` logs every query there) when the
  final least-squares layer starts: that step re-asks already-asked points, and then evaluates
  2 x 100,000 points for its printed loss, which is not a query of the attack.

Usage: python _peer_carlini_driver.py CHECKOUT SEED ARCH OUT_JSON
(the network must be at CHECKOUT/models/SEED_ARCH.npy as ``[weights, biases]``).
"""

import json
import os
import pickle
import sys
import time


def main():
    checkout, seed, arch, out = sys.argv[1:5]
    os.chdir(checkout)
    sys.path.insert(0, checkout)
    sys.argv = [os.path.join(checkout, "extract.py"), arch, seed]
    import multiprocessing as mp

    import extract  # their module: reads sys.argv and models/SEED_ARCH.npy on import
    from src import utils

    counted = {}
    solve_final_layer = extract.solve_final_layer

    def counting_final_layer(known_T, inputs, outputs):
        counted["n_queries"] = len(utils.SAVED_QUERIES)
        counted["seconds"] = time.perf_counter() - t0
        return solve_final_layer(known_T, inputs, outputs)

    extract.solve_final_layer = counting_final_layer
    extract.pool.append(mp.Pool(1))
    t0 = time.perf_counter()
    extract.run_full_attack()
    with open(f"/tmp/extracted-{arch}.p", "rb") as fh:
        At, Bt = pickle.load(fh)
    import numpy as np

    record = {
        "n_queries": counted["n_queries"],
        "seconds": counted["seconds"],
        "weights": [np.asarray(a, dtype=np.float64).tolist() for a in At],
        "biases": [np.atleast_1d(np.asarray(b, dtype=np.float64)).tolist() for b in Bt],
    }
    with open(out + ".tmp", "w") as fh:
        json.dump(record, fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
