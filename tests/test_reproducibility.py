"""Every chapter re-executed under other OpenBLAS kernels and thread counts, held to the contract.

nbval checks the committed outputs on this machine's own BLAS kernel. Here every chapter is
executed again, in background processes started as soon as the suite is collected (so that they
share the machine with the serial rest of ``make test``), under two other OpenBLAS kernel types (chosen from those this
CPU can run: Haswell, Sandybridge, SkylakeX, Nehalem, never the native one) and with 1 and with 2
BLAS threads, and its outputs are compared with the committed ones by the same rule as nbval's
(:mod:`companion.nbcompare`). Skipped, with the reason, off x86-64 or without OpenBLAS.
"""

import concurrent.futures
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from companion import nbcompare

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
#: OpenBLAS kernel types in order of preference, with the CPU flags each needs.
KERNELS = {"Haswell": {"avx2", "fma"}, "Sandybridge": {"avx"}, "SkylakeX": {"avx512f", "avx512bw", "avx512vl"},
           "Nehalem": {"sse4_2"}}
THREADS = (1, 2)

pytestmark = pytest.mark.slow


def _blas(env) -> dict:
    """numpy's BLAS (architecture, threads) in a fresh process with ``env``."""
    code = ("import json, numpy, threadpoolctl; numpy.ones(4) @ numpy.ones(4); "
            "print(json.dumps([i for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    infos = json.loads(out.stdout) if out.returncode == 0 else []
    return infos[0] if infos else {}


def _configs():
    """[(kernel, threads)]: two kernel types other than the native one, with 1 and 2 threads."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"OpenBLAS kernel types are x86-64 names; this machine is {platform.machine()}"
    native = _blas({k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"})
    if native.get("internal_api") != "openblas":
        return None, f"numpy does not use OpenBLAS here ({native.get('internal_api')})"
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return None, "cannot read the CPU flags from /proc/cpuinfo"
    others = [k for k, need in KERNELS.items() if need <= flags and k.lower() != native["architecture"].lower()]
    if len(others) < 2:
        return None, f"this CPU runs fewer than two OpenBLAS kernel types besides {native['architecture']}"
    return [(others[0], THREADS[0]), (others[1], THREADS[1])], native["architecture"]


CONFIGS, NATIVE = _configs()


def _execute(path: Path, kernel: str, threads: int, out_dir: Path) -> Path:
    env = dict(os.environ, OPENBLAS_CORETYPE=kernel, OPENBLAS_NUM_THREADS=str(threads),
               COMPANION_RESULTS_DIR=str(out_dir), MPLBACKEND="Agg", PYTHONHASHSEED="0")
    blas = _blas(env)
    assert (blas.get("architecture"), blas.get("num_threads")) == (kernel, threads), \
        f"OpenBLAS did not take {kernel} with {threads} threads: {blas}"
    out = out_dir / path.name
    papermill = Path(sys.executable).with_name("papermill")
    proc = subprocess.run([str(papermill), "--no-progress-bar", "-k", "python3", "--execution-timeout", "600",
                           "--cwd", str(path.parent), str(path), str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{path.stem} failed under {kernel}/{threads}:\n{proc.stderr[-3000:]}"
    return out


_JOBS: dict = {}
_POOL: list = []


def start(items) -> None:
    """Submit the re-executions of the selected tests at once (called by conftest.py when collection ends).

    They run in the background while the rest of the suite runs (one process per two cores), so
    that the serial parts of ``make test`` (nbval, the books) and these runs share the machine.
    """
    if CONFIGS is None or _POOL:
        return
    import tempfile

    selected = {(item.callspec.params["path"], item.callspec.params["config"]) for item in items}
    base = Path(tempfile.mkdtemp(prefix="companion-blas-"))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2))
    _POOL.append((pool, base))
    # the slowest chapters first, so that the pool stays busy to the end
    for path in sorted(CHAPTERS, key=lambda p: -p.stat().st_size):
        for kernel, threads in CONFIGS:
            if (path, (kernel, threads)) in selected:
                out_dir = base / f"{kernel}-{threads}" / path.stem
                out_dir.mkdir(parents=True)
                _JOBS[(path.stem, kernel, threads)] = pool.submit(_execute, path, kernel, threads, out_dir)


def stop() -> None:
    """Cancel what has not started, wait for the rest, delete the outputs (conftest.py, at the end)."""
    import shutil

    for pool, base in _POOL:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(base, ignore_errors=True)
    _POOL.clear()


@pytest.fixture(scope="session")
def reexecuted():
    if CONFIGS is None:
        pytest.skip(NATIVE)
    return _JOBS


@pytest.mark.parametrize("config", CONFIGS or [("none", 0)], ids=[f"{k}-{t}thread" for k, t in CONFIGS or [("none", 0)]])
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_reproduces_under_other_blas(path, config, reexecuted):
    kernel, threads = config
    out = reexecuted[(path.stem, kernel, threads)].result()
    glue = nbcompare.glue_tolerances(ROOT / "data" / "results" / f"{path.stem}.json") \
        | nbcompare.glue_tolerances(out.parent / f"{path.stem}.json")
    diffs = nbcompare.compare_notebooks(nbformat.read(path, as_version=4), nbformat.read(out, as_version=4),
                                        glue=glue)
    assert not diffs, (f"{path.stem} under OpenBLAS {kernel} with {threads} thread(s) (native: {NATIVE}) "
                       "differs from the committed outputs beyond the contract:\n"
                       + "\n".join(f"  code cell {i}: {d}" for i, ds in diffs.items() for d in ds))
