"""Every chapter re-executed under perturbed answers and under other BLAS kernels, held to the contract.

nbval checks the committed outputs with this machine's arithmetic. Here every chapter is executed
again, in background processes started as soon as the suite is collected (so that they share the
machine with the serial rest of ``make test``), and its outputs are compared with the committed
ones by the same rule as nbval's (:mod:`companion.book.nbcompare`):

1. **Perturbed answers** (machine-independent): every chapter once with
   ``COMPANION_PERTURB_ULPS=4`` (:data:`PERTURB_ULPS`), the oracles' test mode that multiplies each
   answer by ``1 + 4 eps s(X)`` with a sign ``s(X)`` that is a function of the query
   (:mod:`companion.oracles`). That is the arithmetic of a machine we do not have, the same on every
   machine: an output it moves beyond its stated tolerance is printed with more digits than it has.
   The sign pattern (``COMPANION_PERTURB_PATTERN``: a hash of the query's bytes, the parity of its
   bits, or a smooth function of its entries; :data:`~companion.oracles.PERTURB_PATTERNS`) rotates
   across the chapters: chapter ``i`` runs under pattern ``(i + r) mod 3``, ``r`` =
   ``$COMPANION_PERTURB_ROTATION`` (default 0), so three consecutive rotations run every chapter
   under every pattern, and one run costs what a single pattern did (one execution per chapter).
2. **Every OpenBLAS kernel type the CPU runs** (:data:`KERNELS`: Haswell, Sandybridge, SkylakeX,
   Nehalem, Prescott, each kept when /proc/cpuinfo has its flags), with 1 and 2 BLAS threads: up to
   ten configurations, less the one nbval already runs (the environment's ``OPENBLAS_CORETYPE``, or
   the native kernel, with its thread count). Running every chapter under all of them would be
   about 90 executions, some 30 minutes of CPU on top of the rest of the suite; instead each
   chapter runs under one of them, in a rotation (:func:`schedule`): chapter ``i`` takes
   configuration ``(i + r) mod n`` of the ``n``, ordered with the thread counts alternating,
   ``r`` = ``$COMPANION_KERNEL_ROTATION`` (default 0). With nine chapters and at most nine
   configurations every configuration runs in every ``make test``, and ``n`` consecutive
   rotations run every chapter under every configuration, as the perturbation's patterns rotate.
   (Until session 38 each chapter ran under two configurations, one per thread count: twice the
   CPU, about 210 of the suite's 1,560 CPU seconds, for a second kernel per chapter that the
   rotation reaches on other runs.) A kernel-specific defect is found by the configuration that
   meets it; the perturbation finds the kind, wherever the suite runs.

Each execution is one ``companion run`` process (papermill, its kernel on IPC sockets of its own), a
job of the background pool of ``conftest.py``, with the suite's other independent chapter runs
(tests/test_chapters.py, tests/test_reader_runs.py): submitted as soon as the suite is collected, the
slowest first, scheduled so that no core runs two BLAS threads: OpenBLAS threads that share a core
spin and wait for each other, and a multi-head test ran 3.5x slower with 2 BLAS threads than with 1
beside two busy processes (21 s against 74 s, measured 2026-12-02). While the serial rest of the
suite runs (``make test`` gives it one BLAS thread), the 1-thread runs (the perturbation's, with one
thread too, and the kernels') take the other cores; the 2-thread runs wait until the serial suite is
done (``conftest.py`` puts the tests that wait for a job last) and the 1-thread runs have started,
then take two idle cores each. At the end (``conftest.py``) a report is printed: per chapter, how many numbers
were compared exactly, how many to a stated tolerance and how many at rounding level, and the
largest relative move under the perturbation and under the kernels. With
``COMPANION_REPRO_REPORT=path.json`` it is also written there (``make repro-report`` writes the
committed ``data/results/reproducibility.json``, which the book's reproducibility page shows).
Kernel runs are skipped, with the reason, off x86-64 or without OpenBLAS; the perturbation runs
everywhere.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from companion.book import nbcompare
from companion.oracles import PERTURB_ENV, PERTURB_PATTERN_ENV, PERTURB_PATTERNS

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
#: OpenBLAS kernel types, with the CPU flags (/proc/cpuinfo names) each needs.
KERNELS = {"Haswell": {"avx2", "fma"}, "Sandybridge": {"avx"}, "SkylakeX": {"avx512f", "avx512bw", "avx512vl"},
           "Nehalem": {"sse4_2"}, "Prescott": {"pni"}}
#: Names OpenBLAS reports (``openblas_get_corename``, via threadpoolctl) for a kernel type: on x86-64
#: its dynamic core table aliases the Katmai entry to the Prescott kernel and names it first.
REPORTED = {"Prescott": {"Prescott", "Katmai"}}
THREADS = (1, 2)
#: Ulps of the perturbation run (a few units, as a second machine's rounding moves a result).
PERTURB_ULPS = 4
#: Shift of the rotation of the perturbation's sign patterns across the chapters (module docstring).
PERTURB_ROTATION = int(os.environ.get("COMPANION_PERTURB_ROTATION", "0") or 0)
#: Shift of the rotation of the kernel configurations across the chapters (module docstring).
KERNEL_ROTATION = int(os.environ.get("COMPANION_KERNEL_ROTATION", "0") or 0)


def perturb_config(i: int, rotation: int = PERTURB_ROTATION) -> tuple:
    """The perturbation run of chapter ``i``: 4 ulps with pattern ``(i + rotation) mod 3``."""
    return ("perturb", PERTURB_ULPS, PERTURB_PATTERNS[(i + rotation) % len(PERTURB_PATTERNS)])


pytestmark = pytest.mark.slow


def _blas(env) -> dict:
    """numpy's BLAS (architecture, threads) in a fresh process with ``env``."""
    code = ("import json, numpy, threadpoolctl; numpy.ones(4) @ numpy.ones(4); "
            "print(json.dumps([i for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    infos = json.loads(out.stdout) if out.returncode == 0 else []
    return infos[0] if infos else {}


def _cpu() -> tuple[set, str, str]:
    """(flags, vendor, model name) of the first CPU in /proc/cpuinfo."""
    info = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return set(info.get("flags", "").split()), info.get("vendor_id", "?"), info.get("model name", "?")


def _kernel_configs():
    """(configurations, nbval's own, the native BLAS info), or (None, reason, None)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"OpenBLAS kernel types are x86-64 names; this machine is {platform.machine()}", None
    native = _blas({k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"})
    if native.get("internal_api") != "openblas":
        return None, f"numpy does not use OpenBLAS here ({native.get('internal_api')})", None
    try:
        flags = _cpu()[0]
    except OSError:
        return None, "cannot read the CPU flags from /proc/cpuinfo", None
    here = _blas(dict(os.environ))
    own = (here.get("architecture"), here.get("num_threads"))
    kernels = [k for k, need in KERNELS.items() if need <= flags]
    configs = [(k, t) for t in THREADS for k in kernels if not (_reported(k) & {own[0]} and t == own[1])]
    return configs, own, native


def _reported(kernel) -> set:
    return REPORTED.get(kernel, {kernel})


def _interleaved(configs) -> list:
    """``configs`` with the thread counts alternating: the ``k``-th of each thread count, in turn."""
    groups = [[c for c in configs or [] if c[1] == t] for t in THREADS]
    return [g[k] for k in range(max(map(len, groups), default=0)) for g in groups if k < len(g)]


def schedule(chapters, configs, rotation: int = KERNEL_ROTATION) -> dict:
    """``{chapter stem: [configuration, ...]}``: the perturbation for every chapter, and one kernel.

    Chapter ``i`` takes configuration ``(i + rotation) mod n`` of the ``n`` configurations, ordered
    with the thread counts alternating (:func:`_interleaved`): every configuration runs when there
    are at least as many chapters, and ``n`` consecutive rotations run every chapter under every one.
    """
    order = _interleaved(configs)
    return {path.stem: [perturb_config(i)] + ([order[(i + rotation) % len(order)]] if order else [])
            for i, path in enumerate(chapters)}


CONFIGS, NBVAL_CONFIG, NATIVE = _kernel_configs()
SCHEDULE = schedule(CHAPTERS, CONFIGS)
RUNS = [(path, config) for path in CHAPTERS for config in SCHEDULE[path.stem]]


def _config_id(config) -> str:
    return f"perturb{config[1]}ulps-{config[2]}" if config[0] == "perturb" else f"{config[0]}-{config[1]}thread"


def _execute(path: Path, config, run, out_dir: Path) -> Path:
    env = dict(run.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0")  # the pool's snapshot (conftest.py)
    env.pop("COMPANION_RESULTS_DIR", None)  # companion run publishes next to the notebook, in out_dir
    env.pop(PERTURB_ENV, None)
    env.pop(PERTURB_PATTERN_ENV, None)
    if config[0] == "perturb":
        env.update({PERTURB_ENV: str(config[1]), PERTURB_PATTERN_ENV: config[2], "OPENBLAS_NUM_THREADS": "1"})
    else:
        kernel, threads = config
        env.update(OPENBLAS_CORETYPE=kernel, OPENBLAS_NUM_THREADS=str(threads))
        # An idle OpenBLAS thread spins 2**28 cycles (OpenBLAS's blas_server.c, default THREAD_TIMEOUT
        # 28) before it sleeps: beside the serial suite, the 2-thread runs burnt up to half their CPU
        # time spinning. 2**4 cycles changes when threads sleep, never how the work is split, so the
        # arithmetic, and what this test compares, is the same (ch06, 2 threads, loaded machine:
        # 41-45 CPU s before, 27-29 after)
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
        blas = _blas(env)
        assert blas.get("architecture") in _reported(kernel) and blas.get("num_threads") == threads, \
            f"OpenBLAS did not take {kernel} with {threads} threads: {blas}"
    # as a reader re-runs it (`companion run`): its kernel talks over IPC sockets in a private folder,
    # so that the concurrent runs and nbval cannot race for the same TCP ports (a kernel that lost
    # that race died before replying to kernel_info, and failed a CI run)
    companion = Path(sys.executable).with_name("companion")
    began = time.monotonic()
    proc = run([str(companion), "run", path.stem, "-o", str(out_dir), "--no-progress", "--timeout", "600"],
               env=env, capture_output=True, text=True, timeout=900)
    SECONDS[(path.stem, _config_id(config))] = time.monotonic() - began
    assert proc.returncode == 0, f"{path.stem} failed under {_config_id(config)}:\n{proc.stderr[-3000:]}"
    return out_dir / path.name


def _threads(config) -> int:
    """BLAS threads of a run (the perturbation's runs take one)."""
    return 1 if config[0] == "perturb" else config[1]


#: (chapter stem, configuration id) -> nbcompare.summarize(...) of every compared run.
REPORT: dict = {}
#: (chapter stem, configuration id) -> wall seconds of its ``companion run``.
SECONDS: dict = {}


def background_jobs(items):
    """The re-executions of the selected tests, for the background pool (conftest.py, when collection
    ends): one job per run, with its BLAS threads (the pool runs no two BLAS threads on a core)."""
    for item in items:
        if getattr(item, "originalname", "") != "test_chapter_reproduces":
            continue
        path, config = item.callspec.params["path"], item.callspec.params["config"]
        if config[0] != "perturb" and CONFIGS is None:
            continue
        kind = "re-executions, perturbed answers" if config[0] == "perturb" else "re-executions, other kernels"
        # A 2-thread run occupies one core of the pool: with OPENBLAS_THREAD_TIMEOUT=4 (_execute) its
        # idle second thread sleeps instead of spinning, and the chapters' matrices keep it idle most of
        # the time (the 9 runs took 206 CPU s in 204 s of wall time on an empty machine, after the
        # serial suite); on one core of its own it runs beside the serial suite instead
        yield {"key": ("reproduces", path.stem, config), "chapter": path.stem, "threads": _threads(config),
               "cores": 1, "kind": kind,
               "fn": lambda run, out, path=path, config=config: _execute(path, config, run, out)}


def compare(path: Path, out: Path):
    """(differences, summary) of a re-executed chapter ``out`` against the committed ``path``."""
    glue = nbcompare.glue_tolerances(ROOT / "data" / "results" / f"{path.stem}.json", out.parent / f"{path.stem}.json")
    stats: dict = {}
    diffs = nbcompare.compare_notebooks(nbformat.read(path, as_version=4), nbformat.read(out, as_version=4),
                                        glue=glue, stats=stats)
    return diffs, nbcompare.summarize(stats)


def platform_info() -> dict:
    """What the runs ran on, read from this machine and the packages imported."""
    from importlib import metadata

    try:
        _, vendor, model = _cpu()
    except OSError:
        vendor = model = "?"
    versions = {name: metadata.version(name) for name in ("numpy", "scipy", "scs", "cvxpy")}
    return {"cpu_vendor": vendor, "cpu_model": model, "machine": platform.machine(),
            "python": platform.python_version(), "versions": versions,
            "openblas": (NATIVE or {}).get("version"), "native_kernel": (NATIVE or {}).get("architecture"),
            "nbval_kernel": list(NBVAL_CONFIG) if CONFIGS is not None else None,
            "kernel_configs": [list(c) for c in CONFIGS or []], "perturb_ulps": PERTURB_ULPS,
            "perturb_patterns": {p.stem: perturb_config(i)[2] for i, p in enumerate(CHAPTERS)},
            "os_cpu_count": os.cpu_count()}


def report() -> dict | None:
    """The per-chapter report of the runs compared in this session (None if none was)."""
    if not REPORT:
        return None
    chapters = {}
    for (stem, cid), summary in sorted(REPORT.items()):
        row = chapters.setdefault(stem, {"exact": 0, "tolerance": 0, "rounding": 0, "perturb_max_move": None,
                                         "perturb_max_move_cell": None, "perturb_max_move_texts": None,
                                         "kernel_max_move": None, "kernel_max_move_cell": None,
                                         "kernel_max_move_texts": None, "runs": [], "seconds": {}})
        row["runs"].append(cid)
        if (stem, cid) in SECONDS:
            row["seconds"][cid] = round(SECONDS[(stem, cid)], 1)
        which = "perturb" if cid.startswith("perturb") else "kernel"
        if which == "perturb":      # the counts: one run's classification (every run compares the same numbers)
            row.update({k: summary[k] for k in ("exact", "tolerance", "rounding")})
        if row[f"{which}_max_move"] is None or summary["max_move"] > row[f"{which}_max_move"]:
            for key in ("max_move", "max_move_cell", "max_move_texts"):
                row[f"{which}_{key}"] = summary[key]
    return {"platform": platform_info(), "chapters": chapters}


def format_report(rep: dict) -> str:
    """The report as a plain-text table."""
    p = rep["platform"]
    lines = [f"reproducibility report: {p['cpu_vendor']} {p['cpu_model']}, OpenBLAS {p['openblas']} "
             f"(native {p['native_kernel']}, nbval under {p['nbval_kernel']}), perturbation {p['perturb_ulps']} ulps",
             f"kernel configurations: {', '.join(f'{k}/{t}' for k, t in p['kernel_configs']) or 'none'}",
             "perturbation sign patterns (COMPANION_PERTURB_PATTERN): "
             + ", ".join(f"{stem[:2]} {pat}" for stem, pat in p.get("perturb_patterns", {}).items()),
             f"{'chapter':28s} {'exact':>6s} {'tol.':>6s} {'round.':>6s} {'max move (perturb)':>19s} "
             f"{'max move (kernels)':>19s}"]

    def move(r, which):
        return nbcompare.format_move(r[f"{which}_max_move"], r[f"{which}_max_move_cell"],
                                     r.get(f"{which}_max_move_texts"), cell_label="c")

    for stem, r in rep["chapters"].items():
        lines.append(f"{stem:28s} {r['exact']:6d} {r['tolerance']:6d} {r['rounding']:6d} "
                     f"{move(r, 'perturb'):>19s} {move(r, 'kernel'):>19s}")
    seconds = {(stem, cid): t for stem, r in rep["chapters"].items() for cid, t in r.get("seconds", {}).items()}
    if seconds:
        (stem, cid), longest = max(seconds.items(), key=lambda item: item[1])
        lines.append(f"re-executions: {len(seconds)} runs, {sum(seconds.values()):.0f} s of wall time in all, "
                     f"the longest {stem} under {cid} ({longest:.0f} s)")
    return "\n".join(lines)


def write_report(rep: dict, path) -> None:
    """Write the report as JSON, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


@pytest.mark.parametrize("path, config", RUNS, ids=[f"{p.stem}-{_config_id(c)}" for p, c in RUNS])
def test_chapter_reproduces(path, config, background):
    if config[0] != "perturb" and CONFIGS is None:
        pytest.skip(NBVAL_CONFIG)
    out = background[("reproduces", path.stem, config)].result()
    diffs, summary = compare(path, out)
    REPORT[(path.stem, _config_id(config))] = summary
    what = (f"with the oracles' answers perturbed by {config[1]} ulps, pattern {config[2]} ({PERTURB_ENV}, "
            f"{PERTURB_PATTERN_ENV})" if config[0] == "perturb"
            else f"under OpenBLAS {config[0]} with {config[1]} thread(s) "
                 f"(native: {(NATIVE or {}).get('architecture')})")
    assert not diffs, (f"{path.stem} {what} differs from the committed outputs beyond the contract:\n"
                       + "\n".join(f"  code cell {i}: {d}" for i, ds in diffs.items() for d in ds))


@pytest.mark.parametrize("n_kernels", [1, 2, 4, 5])
@pytest.mark.parametrize("rotation", [0, 1, 8])
def test_schedule_covers_every_configuration(n_kernels, rotation):
    """The rotation: the perturbation and one kernel configuration per chapter; with nine chapters
    every configuration runs (up to nine: five kernels at two thread counts, less nbval's own), both
    thread counts among them, and n consecutive rotations run every chapter under every one."""
    kernels = list(KERNELS)[:n_kernels]
    configs = [(k, t) for t in THREADS for k in kernels if (k, t) != ("Haswell", 2)]
    plan = schedule(CHAPTERS, configs, rotation)
    assert list(plan) == [p.stem for p in CHAPTERS]
    assert [runs[0] for runs in plan.values()] == [perturb_config(i) for i in range(len(CHAPTERS))]
    assert all(len(runs) == 2 for runs in plan.values())                # one kernel run per chapter
    run = [runs[1] for runs in plan.values()]
    assert len(CHAPTERS) >= len(configs) and set(run) == set(configs)   # every configuration
    assert len({t for _, t in run}) == len({t for _, t in configs})    # both thread counts
    n = len(configs)
    every = {(stem, schedule(CHAPTERS, configs, rotation + k)[stem][1]) for stem in plan for k in range(n)}
    assert every == {(stem, c) for stem in plan for c in configs}
    # consecutive chapters alternate thread counts while both remain
    order = _interleaved(configs)
    if n_kernels >= 2:
        assert order[:2] == [configs[0], next(c for c in configs if c[1] == 2)]
    assert sorted(order) == sorted(configs)


def test_schedule_of_the_default_rotation_is_pinned():
    """Rotation 0 on five kernels less nbval's SkylakeX/1 (this CI's machine): which chapter meets
    which configuration, so that a change of the order is a visible change of the test."""
    configs = [(k, t) for t in THREADS for k in KERNELS if (k, t) != ("SkylakeX", 1)]
    plan = schedule(CHAPTERS, configs, 0)
    assert [runs[1] for runs in plan.values()] == [
        ("Haswell", 1), ("Haswell", 2), ("Sandybridge", 1), ("Sandybridge", 2), ("Nehalem", 1),
        ("SkylakeX", 2), ("Prescott", 1), ("Nehalem", 2), ("Prescott", 2)]
    assert schedule(CHAPTERS, [], 0) == {p.stem: [perturb_config(i)] for i, p in enumerate(CHAPTERS)}


def test_this_machine_runs_every_kernel_and_both_thread_counts():
    if CONFIGS is None:
        pytest.skip(NBVAL_CONFIG)
    run = {c for p, c in RUNS if c[0] != "perturb"}
    assert run == set(CONFIGS)
    assert {k for k, _ in run} == {k for k, _ in CONFIGS}           # every kernel type the CPU runs
    assert {t for _, t in run} == set(THREADS)


@pytest.mark.parametrize("rotation", [0, 1, 2, 5])
def test_perturbation_patterns_rotate_across_the_chapters(rotation):
    """One perturbation run per chapter; with at least 3 chapters every pattern runs in every rotation, and
    three consecutive rotations run every chapter under every pattern."""
    plan = [perturb_config(i, rotation) for i in range(len(CHAPTERS))]
    assert all(c[:2] == ("perturb", PERTURB_ULPS) for c in plan)
    assert {c[2] for c in plan} == set(PERTURB_PATTERNS)
    assert plan[0][2] == PERTURB_PATTERNS[rotation % 3]
    three = {(i, perturb_config(i, rotation + k)[2]) for i in range(len(CHAPTERS)) for k in range(3)}
    assert len(three) == 3 * len(CHAPTERS)
