"""Drive Canales-Martinez et al. 2024's public sign recovery (``Crypto-TII/deti``) on one network.

Run in the peers' TensorFlow venv, never the project's: ``benchmarks/ffn_peers.py`` calls it
through a subprocess. It does what their ``soe.py`` ``__main__`` does, layer by layer, with the
network given as a ``[weights, biases]`` file (the format of Carlini et al.'s ``models/``):

* the Keras model is built by their ``blackbox.getReconstructedModel`` (float64, as their code sets);
* the signatures are their white-box ``whitebox.getSignatures`` (the true weights with each neuron's
  sign scrambled: deti recovers signs only, and its README and paper take the signatures as given);
* the signs come from their ``soe.findSign_soe`` with the black box ``model.predict``, wrapped to
  count the points it is asked (their code does not count queries);
* a layer their code declares "not contractive enough" (it calls ``exit(-1)``) is recorded so.

Usage: python _peer_deti_driver.py DETI_PARENT NETWORK_NPY OUT_JSON
"""

import json
import os
import sys
import time


def main():
    parent, npy, out = sys.argv[1:4]
    sys.path.insert(0, parent)
    import numpy as np

    from deti import blackbox, soe, whitebox  # soe sets Keras to float64 on import

    A, B = np.load(npy, allow_pickle=True)
    A = [np.asarray(a, dtype=np.float64) for a in A]
    B = [np.asarray(b, dtype=np.float64) for b in B]
    d = A[0].shape[0]
    model = blackbox.getReconstructedModel(A[:-1], B[:-1], A[-1], B[-1], inputShape=(d,))
    n_queries = [0]

    def func(x):
        x = np.asarray(x)
        n_queries[0] += x.shape[0]
        return model.predict(x, verbose=0)[:, 0]

    layers = []
    for layer_id in range(1, len(A)):
        weights, biases = whitebox.getSignatures(model, layer_id)
        n_queries[0] = 0
        np.random.seed(layer_id)
        t0 = time.perf_counter()
        try:
            signs = soe.findSign_soe(func, (d,), weights, biases)
        except SystemExit:
            layers.append({"layer": layer_id, "status": "refused", "reason": "not contractive enough (their exit(-1))",
                           "n_queries": n_queries[0], "seconds": time.perf_counter() - t0})
            continue
        real = whitebox.getRealSigns(model, layer_id)
        layers.append({"layer": layer_id, "status": "ok", "n_queries": n_queries[0],
                       "seconds": time.perf_counter() - t0, "n_neurons": int(len(real)),
                       "n_correct": int(np.sum(np.asarray(signs) == real))})
    with open(out + ".tmp", "w") as fh:
        json.dump({"layers": layers}, fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
