"""``learn_relu_network`` side by side with Carlini, Jagielski & Mironov 2020's public code (issue 37).

Run: .venv/bin/python benchmarks/ffn_peers.py [--peers-venv /tmp/peers/venv]
     [--checkout /tmp/peers/cme] [--cap 900] [--only NAME ...] [--methods METHOD ...]

One row again, the peers' rows and record kept: ``--only carlini-80-40-20-1 --methods ours`` (the
row records its date, cap and commit; neither peer's venv is needed, but a ``carlini-*`` network
is read from the checkout's ``models/``, which their ``train_models.py`` writes: that needs jax).

The peers' code runs in a scratch virtual environment outside the project (never the project's
venv), through ``benchmarks/_peer_carlini_driver.py``, in a checkout of
``google-research/cryptanalytic-model-extraction`` with the repairs listed in
``benchmarks/ffn_peers.md``. Our learner runs in this venv, in a subprocess too, so that both
sides have the same wall-time cap. For every network both sides see the same weights:

* ``carlini-*``: made by their ``train_models.py`` (their architectures, their random start and
  100 Adam steps on 20 points), read into a :class:`~companion.ffn.ReLUNetwork`;
* ``ours-*``: ``companion.ffn.random_relu_network`` draws, written in their format
  (``models/SEED_ARCH.npy``, ``[weights, biases]`` with ``weights[i]`` of shape (in, out)).

Per network and method: queries (ours: learning, and with the verification points), worst-case
bits of precision (``-log2(max |f_hat - f| / max |f|)`` on 10,000 fresh ``N(0, I_d)`` inputs, the
same for both), seconds of the extraction alone, and what is recovered. A run that fails or passes
the cap is a row that says so. Writes ``data/results/ffn_peers.json`` atomically.
"""

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _targets import write_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "results" / "ffn_peers.json"
DRIVER = Path(__file__).resolve().parent / "_peer_carlini_driver.py"
DETI_DRIVER = Path(__file__).resolve().parent / "_peer_deti_driver.py"
CARLINI_REPO = "google-research/cryptanalytic-model-extraction"
DETI_REPO = "Crypto-TII/deti"
METHODS = ("carlini2020", "deti2024", "ours")
RECOVERS = {
    "carlini2020": "whole model (signatures, signs, readout)",
    "deti2024": "signs of each hidden layer only, given the signatures (white box, as its code and paper do)",
    "ours": "whole model (signatures, signs, readout)",
}
N_FRESH = 10_000

# name, who made it, architecture d-m_1-...-1, seed (theirs: train_models.py's seed; ours: the draw's)
NETWORKS = [
    ("carlini-20-10-1", "carlini", "20-10-1", 42),
    ("carlini-10-10-10-1", "carlini", "10-10-10-1", 42),
    ("carlini-40-20-10-10-1", "carlini", "40-20-10-10-1", 42),
    ("carlini-80-40-20-1", "carlini", "80-40-20-1", 42),
    ("ours-10-8-1", "ours", "10-8-1", 0),
    ("ours-10-8-8-1", "ours", "10-8-8-1", 1),
    ("ours-10-8-8-8-1", "ours", "10-8-8-8-1", 0),
]

# Each repair of their code, with its reason (the diff is in benchmarks/ffn_peers.md), and who made it:
# "by": "peer-file" for a change to their files, "driver" for one in our driver of their code
# (benchmarks/_peer_carlini_driver.py), which chapter 03 counts apart.
REPAIRS = [
    {
        "by": "peer-file",
        "file": "src/global_vars.py, check_solution_svd.py",
        "change": "`from jax.config import config` -> `import jax; config = jax.config`",
        "reason": "the module jax.config was removed (jax 0.4.25); the attribute is the same object",
    },
    {
        "by": "peer-file",
        "file": "src/refine_precision.py, train_models.py",
        "change": "`jax.experimental.optimizers` -> `jax.example_libraries.optimizers`",
        "reason": "moved in jax 0.2.25 and removed from jax.experimental in 0.3.16; same Adam",
    },
    {
        "by": "peer-file",
        "file": "train_models.py",
        "change": "save `[weights, biases]` as a (2, k+1) object array",
        "reason": "numpy >= 1.24 refuses to make a ragged array from the nested list it saved",
    },
    {
        "by": "peer-file",
        "file": "src/layer_recovery.py (graph_solve)",
        "change": "the partial solution's examples as an explicit object array",
        "reason": "numpy >= 1.24 refuses np.array() of ragged lists (ValueError), which numpy < 1.24 "
                  "turned into this object array itself; raised on 10-10-10-1 when a neuron is still missing",
    },
    {
        "by": "driver",
        "file": "(driver, not their file) extract.py's __main__",
        "change": "mp.Pool(1) instead of mp.Pool(cpu_count() // 4)",
        "reason": "cpu_count() // 4 is 0 on this 2-core machine, and Pool(0) raises ValueError",
    },
]


def arch_sizes(arch):
    return [int(s) for s in arch.split("-")]


def peer_versions(python):
    code = (
        "import sys, json, numpy, scipy, jax, jaxlib; print(json.dumps({'python': sys.version.split()[0], "
        "'numpy': numpy.__version__, 'scipy': scipy.__version__, 'jax': jax.__version__, "
        "'jaxlib': jaxlib.__version__}))"
    )
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def deti_versions(python):
    code = (
        "import sys, json, numpy, tensorflow, keras; print(json.dumps({'python': sys.version.split()[0], "
        "'numpy': numpy.__version__, 'tensorflow': tensorflow.__version__, 'keras': keras.__version__}))"
    )
    env = dict(_env(), TF_CPP_MIN_LOG_LEVEL="3")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                                     env=env).stdout.strip().splitlines()[-1])


def git_head(checkout):
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def git_diff(checkout):
    return subprocess.run(["git", "-C", str(checkout), "diff", "--", "*.py"], capture_output=True, text=True).stdout


def load_network(path):
    """Their ``[weights, biases]`` file as a ReLUNetwork (weights (in, out), the last (m_k, 1))."""
    from companion.ffn import ReLUNetwork

    A, B = np.load(path, allow_pickle=True)
    return ReLUNetwork([np.asarray(a, dtype=np.float64) for a in A], [np.asarray(b, dtype=np.float64) for b in B])


def save_network(net, path):
    saved = np.empty((2, len(net.weights)), dtype=object)
    for j, (W, b) in enumerate(zip(net.weights, net.biases)):
        saved[0, j], saved[1, j] = np.array(W), np.array(b)
    np.save(path, saved)


def make_network(name, source, arch, seed, args):
    """The network, in their folder ``models/`` and as a ReLUNetwork."""
    from companion.ffn import random_relu_network

    sizes = arch_sizes(arch)
    path = Path(args.checkout) / "models" / f"{seed}_{arch}.npy"
    if source == "carlini":
        if not path.exists():
            subprocess.run(
                [args.peers_venv + "/bin/python", "train_models.py", arch, str(seed)],
                cwd=args.checkout, check=True, capture_output=True, env=_env(),
            )
        return load_network(path)
    net = random_relu_network(sizes[0], sizes[1:-1], seed=seed)
    save_network(net, path)
    return net


def _env():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTEROP_THREADS="1",
               TF_NUM_INTRAOP_THREADS="1")
    env.pop("PYTHONPATH", None)
    return env


def _children_cpu():
    """CPU seconds of the waited-for subprocesses so far (user + system, their pool workers too)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _cpu_cap(seconds):
    """``preexec_fn`` limiting a subprocess to ``seconds`` of CPU (SIGXCPU past it): on a shared
    machine a wall-time cap measures the other work as much as the run."""

    def limit():
        resource.setrlimit(resource.RLIMIT_CPU, (int(seconds), int(seconds) + 5))

    return limit


def _run_capped(cmd, args, **kw):
    """``subprocess.run`` with the CPU cap, and a wall cap of 6 times it (a hung run)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=6 * args.cap, env=_env(),
                          preexec_fn=_cpu_cap(args.cap), **kw)


def _tail(text, n=3):
    """The error a failed run ended on (the last line naming an exception), else its last lines."""
    lines = [s.strip() for s in text.strip().splitlines() if s.strip()]
    errors = [s for s in lines if s.split(":")[0].endswith(("Error", "Exception", "Failure"))]
    return errors[-1][:400] if errors else " | ".join(lines[-n:])[-400:]


def _timed(run):
    """``run()``'s result with ``cpu_seconds``: the subprocess's CPU time, the fair clock on a shared machine."""

    def wrapped(*a):
        cpu0 = _children_cpu()
        res = run(*a)
        res["cpu_seconds"] = _children_cpu() - cpu0
        return res

    return wrapped


def _capped_outcome(cmd, args, out: Path, log: Path | None = None):
    """Run ``cmd`` under the cap (:func:`_run_capped`): ``(failure, wall)``, ``failure`` the row of a
    run that timed out or failed (``None`` when it wrote ``out``), ``wall`` its wall seconds. The
    one place every method's run is judged, ours and the peers' alike; ``log`` keeps its output."""
    t0 = time.perf_counter()
    try:
        proc = _run_capped(cmd, args)
    except subprocess.TimeoutExpired as exc:
        if log is not None:
            text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else str(exc.stdout or "")
            log.write_text(text)
        return {"status": "timeout", "reason": f"not finished within 6 x the cap of {args.cap} s (wall)",
                "wall_seconds": 6 * args.cap}, 6 * args.cap
    wall = time.perf_counter() - t0
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not out.exists():
        return {"status": "timeout", "reason": f"not finished within the cap of {args.cap} CPU seconds",
                "wall_seconds": wall}, wall
    if proc.returncode != 0 or not out.exists():
        return {"status": "failed", "reason": _tail(proc.stderr or proc.stdout), "wall_seconds": wall}, wall
    return None, wall


@_timed
def run_carlini(name, arch, seed, args):
    out = Path(args.runs) / f"carlini-on-{name}.json"
    log = Path(args.runs) / f"carlini-on-{name}.log"
    cmd = [args.peers_venv + "/bin/python", str(DRIVER), args.checkout, str(seed), arch, str(out)]
    out.unlink(missing_ok=True)
    failure, wall = _capped_outcome(cmd, args, out, log)
    if failure:
        return failure
    rec = json.loads(out.read_text())
    return {"status": "ok", "n_queries": rec["n_queries"], "seconds": rec["seconds"], "wall_seconds": wall,
            "weights": rec["weights"], "biases": rec["biases"]}


@_timed
def run_deti(name, arch, seed, args):
    out = Path(args.runs) / f"deti-on-{name}.json"
    log = Path(args.runs) / f"deti-on-{name}.log"
    npy = Path(args.checkout) / "models" / f"{seed}_{arch}.npy"
    cmd = [args.deti_venv + "/bin/python", str(DETI_DRIVER), args.deti_parent, str(npy), str(out)]
    out.unlink(missing_ok=True)
    failure, wall = _capped_outcome(cmd, args, out, log)
    if failure:
        return failure
    layers = json.loads(out.read_text())["layers"]
    done = [x for x in layers if x["status"] == "ok"]
    refused = [x for x in layers if x["status"] != "ok"]
    return {
        "status": "ok" if not refused else ("partial" if done else "refused"),
        "reason": "; ".join(f"layer {x['layer']}: {x['reason']}" for x in refused),
        "n_queries": sum(x["n_queries"] for x in layers),
        "seconds": sum(x["seconds"] for x in layers),
        "wall_seconds": wall,
        "signs_correct": f"{sum(x['n_correct'] for x in done)}/{sum(x['n_neurons'] for x in done)}",
        "layers": layers,
    }


@_timed
def run_ours(name, args):
    out = Path(args.runs) / f"ours-on-{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--ours", name, "--out", str(out), "--checkout", args.checkout]
    failure, wall = _capped_outcome(cmd, args, out)
    if failure:
        return failure
    rec = json.loads(out.read_text())
    rec["wall_seconds"] = wall
    return rec


def ours_child(name, out, checkout):
    """In a subprocess: learn one network with ``learn_relu_network`` (widths given)."""
    from companion.errors import CompanionError
    from companion.ffn import learn_relu_network
    from companion.oracles import ValueQueryOracle

    _, source, arch, seed = next(n for n in NETWORKS if n[0] == name)
    net = load_network(Path(checkout) / "models" / f"{seed}_{arch}.npy")
    oracle = ValueQueryOracle(net)
    t0 = time.perf_counter()
    try:
        rec = learn_relu_network(oracle, widths=net.widths)
    except CompanionError as exc:
        record = {"status": "refused", "reason": f"{type(exc).__name__}: {exc}", "n_queries": oracle.n_queries,
                  "seconds": time.perf_counter() - t0}
    else:
        record = {"status": "ok", "n_queries": rec.n_queries, "n_learning_queries": rec.n_learning_queries,
                  "seconds": time.perf_counter() - t0,
                  "weights": [W.tolist() for W in rec.weights], "biases": [b.tolist() for b in rec.biases]}
    Path(out).write_text(json.dumps(record))


def fresh_bits(target, rec, seed):
    """Worst-case bits on N_FRESH fresh ``N(0, I_d)`` inputs (the same inputs for every method)."""
    from companion.ffn import ReLUNetwork, bits_of_precision

    X = np.random.default_rng(10_000 + seed).standard_normal((N_FRESH, target.d))
    got = ReLUNetwork(rec["weights"], rec["biases"])
    if got.d != target.d:
        return None
    return min(bits_of_precision(got.forward(X), target.forward(X)), 53.0)


def markdown_table(record):
    """The record as a markdown table: one line per network and method."""

    def fmt(x, spec):
        return "" if x is None else format(x, spec)

    lines = [
        "| network | parameters | method | status | queries | bits | seconds | recovers / reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        net = record["networks"][r["network"]]
        what = r.get("signs_correct") and f"signs right: {r['signs_correct']}" or ""
        if r["status"] != "ok":
            what = (what + "; " if what else "") + r["reason"][:160].replace("|", "/")
        lines.append(
            f"| {r['network']} | {net['n_parameters']:,} | {r['method']} | {r['status']} | "
            f"{fmt(r['n_queries'], ',')} | {fmt(r['bits'], '.1f')} | {fmt(r['seconds'], '.1f')} | {what} |"
        )
    return "\n".join(lines)


def _our_commit():
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def _peers_record(args, old):
    """Each peer's repository, commit, versions and repairs: read from its venv and checkout when it ran
    in this run, else kept from the record (``--methods ours`` needs neither peer's venv)."""
    peers = dict(old.get("peers", {}))
    if "carlini2020" in args.methods or "carlini2020" not in peers:
        peers["carlini2020"] = {"repository": CARLINI_REPO, "commit": git_head(args.checkout),
                                "versions": peer_versions(args.peers_venv + "/bin/python"),
                                "repairs": REPAIRS, "diff": git_diff(args.checkout)}
    if "deti2024" in args.methods or "deti2024" not in peers:
        peers["deti2024"] = {"repository": DETI_REPO, "commit": git_head(Path(args.deti_parent) / "deti"),
                             "versions": deti_versions(args.deti_venv + "/bin/python"), "repairs": [],
                             "diff": git_diff(Path(args.deti_parent) / "deti")}
    return peers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers-venv", default="/tmp/peers/venv")
    p.add_argument("--checkout", default="/tmp/peers/cme")
    p.add_argument("--runs", default="/tmp/peers/runs")
    p.add_argument("--cap", type=int, default=900, help="CPU-time cap of each run, seconds (wall: 6 times it)")
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--deti-venv", default="/tmp/peers/venv-deti")
    p.add_argument("--deti-parent", default="/tmp/peers/deti-parent", help="folder holding the deti checkout")
    p.add_argument("--results", default=str(RESULTS), help="the record to update (default: data/results/ffn_peers.json)")
    p.add_argument("--merge", nargs="*", default=[], help="records of other runs whose rows and networks to take in")
    p.add_argument("--table", action="store_true", help="print the record's table (markdown) and exit")
    p.add_argument("--ours", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ours:
        ours_child(args.ours, args.out, args.checkout)
        return 0
    if args.table:
        print(markdown_table(json.loads(Path(args.results).read_text())))
        return 0
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    results = Path(args.results)
    old = json.loads(results.read_text()) if results.exists() else {}
    rows = {(r["network"], r["method"]): r for r in old.get("rows", [])}
    for other in args.merge:
        rec = json.loads(Path(other).read_text())
        rows.update({(r["network"], r["method"]): r for r in rec.get("rows", [])})
        old.setdefault("networks", {}).update(rec.get("networks", {}))
    for (name, method), row in rows.items():
        # A failed run's reason, read again from its log with the current rule.
        log = Path(args.runs) / f"{'carlini' if method == 'carlini2020' else 'deti'}-on-{name}.log"
        if row["status"] == "failed" and method != "ours" and log.exists():
            row["reason"] = _tail(log.read_text(errors="replace"))
    networks = {}
    for name, source, arch, seed in NETWORKS:
        if args.only and name not in args.only:
            continue
        target = make_network(name, source, arch, seed, args)
        networks[name] = {"made_by": source, "architecture": arch, "seed": seed,
                          "n_parameters": target.n_parameters, "depth": len(target.widths)}
        for method in args.methods:
            if method == "carlini2020":
                res = run_carlini(name, arch, seed, args)
            elif method == "deti2024":
                res = run_deti(name, arch, seed, args)
            else:
                res = run_ours(name, args)
            row = {"network": name, "method": method, "status": res["status"], "reason": res.get("reason", ""),
                   "n_queries": res.get("n_queries"), "n_learning_queries": res.get("n_learning_queries"),
                   "seconds": res.get("seconds"), "wall_seconds": res["wall_seconds"],
                   "cpu_seconds": res.get("cpu_seconds"),
                   "recovers": RECOVERS[method], "bits": None}
            if method == "deti2024":
                row["signs_correct"] = res.get("signs_correct")
                row["layers"] = res.get("layers")
            elif res["status"] == "ok":
                row["bits"] = fresh_bits(target, res, seed)
            if args.only or set(args.methods) != set(METHODS):
                # A partial rerun: the row says when, at which commit and under which cap it was made.
                row.update(measured=time.strftime("%Y-%m-%d", time.gmtime()), cap_seconds=args.cap)
                if method == "ours":
                    row["commit"] = _our_commit()
            rows[(name, method)] = row
            print(f"{name:>24} {method:>12} {row['status']:>8} {row['n_queries']!s:>8} "
                  f"{row['bits'] if row['bits'] is None else round(row['bits'], 1)!s:>6} "
                  f"{row['seconds'] if row['seconds'] is None else round(row['seconds'], 1)!s:>7} {row['reason'][:80]}",
                  flush=True)
    all_networks = {**old.get("networks", {}), **networks}
    partial = bool(args.only) or set(args.methods) != set(METHODS)
    record = {
        "what": "learn_relu_network and Carlini, Jagielski & Mironov 2020's code on the same networks "
                "(this book's own measurement, made on a 2-core machine)",
        "measured": old["measured"] if partial and "measured" in old else time.strftime("%Y-%m-%d", time.gmtime()),
        "bits": f"-log2(max |f_hat - f| / max |f|) on {N_FRESH} fresh N(0, I_d) inputs, capped at 53",
        "cap_seconds": old["cap_seconds"] if partial and "cap_seconds" in old else args.cap,
        "seconds": "seconds: the method's extraction, wall clock, as its code times it; cpu_seconds: the whole "
                   "subprocess's CPU time (imports included; the fair clock on this shared 2-core machine, where "
                   "other work ran beside these runs); cap_seconds is on CPU time (runs made before that rule "
                   "had it on wall time: their reason says so)",
        "peers": _peers_record(args, old),
        "ours": old["ours"] if partial and "ours" in old else {"python": platform.python_version(),
                                                              "numpy": np.__version__, "commit": _our_commit()},
        "networks": all_networks,
        "rows": [rows[k] for k in sorted(rows, key=lambda k: ([n[0] for n in NETWORKS].index(k[0]), k[1]))
                 if k[0] in all_networks],
    }
    write_atomic(results, record)
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
