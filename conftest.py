"""pytest set-up for every path of the suite (tests/, the doctests of src/companion, book/chapters).

* Results go to a temporary folder, never into the committed data/results.
* The book's build is strict: ``COMPANION_STRICT=1`` (:func:`companion.book.results.strict`), so that a
  claim or bound that does not hold stops the chapter in nbval and in every re-execution the suite
  starts (they inherit the variable), exactly as in ``make book``. The reader's runs of
  ``tests/test_reader_runs.py`` set it to 0 for their own processes.
* Hypothesis draws the same examples on every machine and run (``derandomize``, no example
  database): a property test that passes here passes in CI, and one that fails, fails for
  everyone, with the example printed.
* nbval compares every chapter's outputs by the reproducibility contract
  (:mod:`companion.book.nbcompare`): exact for exact values, a stated tolerance for imprecise ones
  (rounding level, a published value's ``rtol``/``atol``, or the cell's
  ``metadata["companion"]["tolerance"]``), never by masking a number. This holds for
  ``make test`` and for nbval run alone: ``pytest --nbval --nbval-current-env book/chapters``.
"""

import concurrent.futures
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
_CREATED = []

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the doctests and chapters run without the test extra
    pass
else:
    _hypothesis_settings.register_profile("companion", derandomize=True, database=None, print_blob=True)
    _hypothesis_settings.load_profile("companion")


#: When this pytest session started (time.monotonic), for the time summary.
_STARTED: list[float] = []


#: The suite's own variables, set in pytest_configure: every kernel nbval starts reads them, and the
#: nbval comparison reads COMPANION_RESULTS_DIR.
SUITE_VARIABLES = ("COMPANION_RESULTS_DIR", "COMPANION_STRICT")


@pytest.fixture(autouse=True)
def _suite_variables_kept():
    """A test or doctest that changes the suite's own variables gets them back afterwards (a doctest
    that deleted COMPANION_RESULTS_DIR failed every nbval cell after it)."""
    kept = {name: os.environ.get(name) for name in SUITE_VARIABLES}
    yield
    for name, value in kept.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_configure(config):
    _STARTED.append(time.monotonic())
    # Set before any kernel starts, so that notebooks run by nbval and papermill inherit it.
    if "COMPANION_RESULTS_DIR" not in os.environ:
        _CREATED.append(tempfile.mkdtemp(prefix="companion-results-"))
        os.environ["COMPANION_RESULTS_DIR"] = _CREATED[-1]
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["COMPANION_STRICT"] = "1"  # the book's build: a false claim fails, as in make book
    if config.pluginmanager.hasplugin("nbval"):
        _compare_by_contract()


def pytest_collection_modifyitems(session, config, items):
    """The tests that wait for a background job (they request the ``background`` fixture) last: their
    jobs then had the whole serial suite to overlap with (see the background pool below)."""
    last = [i for i in items if "background" in getattr(i, "fixturenames", ())]
    if last:
        items[:] = [i for i in items if "background" not in getattr(i, "fixturenames", ())] + last


def pytest_collection_finish(session):
    """Submit the background jobs of the selected tests now (each test module's ``background_jobs``)."""
    if session.config.option.collectonly or _POOL:
        return
    by_module: dict = {}
    for item in session.items:
        if "background" in getattr(item, "fixturenames", ()) and hasattr(item.module, "background_jobs"):
            by_module.setdefault(item.module, []).append(item)
    pool = Background(os.cpu_count() or 2)
    _POOL.append(pool)
    for module, items in by_module.items():
        for job in module.background_jobs(items):
            pool.submit(**job)
    pool.start()


#: Parts of the suite, for the time summary at the end: (label, test-id prefix), first match wins.
TIME_PARTS = (
    ("nbval: every chapter re-executed and compared", "book/chapters/"),
    ("re-executions under other kernels and perturbed answers (waiting)", "tests/test_reproducibility.py"),
    ("reader's runs (daily rotation; waiting for the background pool)", "tests/test_reader_runs.py"),
    ("chapters on test parameters (waiting), papermill, make book after an edit", "tests/test_chapters.py"),
    ("the book built (HTML, LaTeX) and its pages", "tests/test_book.py"),
    ("browser (headless Chromium)", "tests/test_browser.py"),
    ("companion run, --html, interrupted runs, pip install -e", "tests/test_rerun.py"),
    ("diagnoses sweep", "tests/test_diagnoses.py"),
    ("doctests of the library", "src/companion/"),
)


def time_by_part(reports) -> list[tuple[str, float, int]]:
    """``(part, seconds, tests)`` of the test reports, the parts of :data:`TIME_PARTS` and one line
    per other test file, slowest first; seconds add setup, call and teardown."""
    seconds: dict[str, float] = {}
    tests: dict[str, set] = {}
    for rep in reports:
        path = rep.nodeid.split("::")[0]
        part = next((label for label, prefix in TIME_PARTS if path.startswith(prefix)), path)
        seconds[part] = seconds.get(part, 0.0) + getattr(rep, "duration", 0.0)
        tests.setdefault(part, set()).add(rep.nodeid)
    return sorted(((p, t, len(tests[p])) for p, t in seconds.items()), key=lambda row: -row[1])


def _write_time_summary(terminalreporter) -> None:
    # every phase's report (a session fixture's setup, e.g. the book's build, is a passed setup: key "")
    reports = [r for group in terminalreporter.stats.values() for r in group
               if hasattr(r, "nodeid") and hasattr(r, "duration") and hasattr(r, "when")]
    rows = time_by_part(reports)
    if not rows:
        return
    wall = time.monotonic() - _STARTED[0] if _STARTED else float("nan")
    terminalreporter.write_sep("=", "where the time went (test durations by part; --durations lists tests)")
    for part, seconds, n in rows[:12]:
        terminalreporter.write_line(f"{seconds:8.0f} s  {n:4d} tests  {part}")
    rest = rows[12:]
    if rest:
        terminalreporter.write_line(f"{sum(r[1] for r in rest):8.0f} s  {sum(r[2] for r in rest):4d} tests  "
                                    f"{len(rest)} other files")
    terminalreporter.write_line(f"{sum(r[1] for r in rows):8.0f} s  in the tests, {wall:.0f} s of wall time for "
                                "the whole pytest session (background re-executions overlap the tests)")
    for line in background_summary(_POOL[0] if _POOL else None, wall):
        terminalreporter.write_line(line)


def background_summary(pool, wall: float) -> list[str]:
    """Lines on the background jobs (wall and CPU seconds by kind, when the serial suite ended) and on
    the CPU time of the whole session (this process and the subprocesses it waited for), from which
    the serial suite's CPU time follows: what a quiet machine would take, whatever else ran beside."""
    import resource

    if pool is None or not pool.records:
        return []
    lines = ["background jobs (wall s / CPU s; they run beside the serial suite, then on every core):"]
    kinds: dict = {}
    for r in pool.records:
        k = kinds.setdefault((r["kind"], r["threads"]), [0, 0.0, 0.0])
        k[0] += 1
        k[1] += r["wall"]
        k[2] += r["cpu"]
    for (kind, threads), (n, w, cpu) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{w:8.0f} s {cpu:6.0f} s CPU  {n:3d} jobs  {kind} ({threads} BLAS thread{'s' * (threads > 1)})")
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    # this process and the children it waited for, less what the background jobs' processes reported
    serial = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime - sum(r["reaped"] for r in pool.records)
    ended = f"{pool.serial_ended:.0f}" if pool.serial_ended is not None else "never"
    lines.append(f"serial suite ended at {ended} s, the last background job at "
                 f"{max(r['ended'] for r in pool.records):.0f} s of {wall:.0f} s; CPU: background jobs "
                 f"{sum(r['cpu'] for r in pool.records):.0f} s, the serial suite at least {serial:.0f} s "
                 "(this process and the subprocesses it waited for)")
    return lines


def pytest_terminal_summary(terminalreporter):
    """Print the reproducibility report of the re-executions compared (and write it if asked), the
    reader's runs of tests/test_reader_runs.py (seeds and draws that ran, claims that did not hold),
    and where the time went (:func:`time_by_part`)."""
    import sys

    _write_time_summary(terminalreporter)

    readers = next((m for m in list(sys.modules.values())
                    if (getattr(m, "__file__", None) or "").endswith("test_reader_runs.py")), None)
    text = readers.summary() if readers else None
    if text:
        terminalreporter.write_sep("=", "reader's runs (tests/test_reader_runs.py)")
        terminalreporter.write_line(text)
    module = next((m for m in list(sys.modules.values())
                   if (getattr(m, "__file__", None) or "").endswith("test_reproducibility.py")), None)
    rep = module.report() if module else None
    if rep is None:
        return
    terminalreporter.write_sep("=", "reproducibility report (tests/test_reproducibility.py)")
    terminalreporter.write_line(module.format_report(rep))
    target = os.environ.get("COMPANION_REPRO_REPORT")
    if target and terminalreporter.stats.get("failed"):
        terminalreporter.write_line(f"not written to {target}: some runs failed")
    elif target:
        module.write_report(rep, target)
        terminalreporter.write_line(f"written to {target}")


def pytest_unconfigure(config):
    import shutil

    for pool in _POOL:
        pool.stop()

    for folder in _CREATED:
        shutil.rmtree(folder, ignore_errors=True)


# -- the background pool ---------------------------------------------------------------------------
# Chapter runs that are subprocesses of their own (`companion run`) and independent of the rest of
# the suite run in threads of this process, started when collection ends, so that they use the cores
# the serial suite leaves idle. A test module takes part by defining ``background_jobs(items)`` for
# its tests that request the ``background`` fixture (conftest.py moves those tests to the end: they
# wait for their job and assert on its result). Each job is a dict: ``key``, ``fn`` (called as
# ``fn(run, out)``: ``run`` is :func:`run_measured`, ``out`` a fresh folder deleted at the end; a job's
# subprocess environment starts from ``run.environ``, the pool's snapshot, never from ``os.environ``),
# ``chapter`` (the chapter it runs, for its expected time), ``threads`` (its BLAS threads) and ``kind``
# (a label for the time summary).
#
# Scheduling: no core runs two BLAS threads (OpenBLAS threads sharing a core spin and wait for each
# other: a multi-head test ran 3.5x slower with 2 BLAS threads beside two busy processes, measured
# 2026-12-02). While the serial suite runs (it has one core), 1-thread jobs take the other
# ``os.cpu_count() - 1`` cores; once it is done (the first waiting test), every core is the pool's:
# a job starts when its threads fit on the idle cores, 1-thread jobs first (the longest first, so the
# last to start are short), then the multi-thread jobs on an empty machine.


def run_measured(cmd, *, timeout, capture_output=True, text=True, **kw) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with the output captured as text, also measuring CPU time.

    Returns the completed process with ``cpu``: user + system seconds of the process and its
    descendants (the chapter's kernel), the larger of what ``os.wait4`` reports (the process and the
    children it waited for) and the sum of each descendant's own time read from ``/proc`` every
    :data:`_SAMPLE` seconds (a kernel is not always waited for; the last interval of each is missed).
    Raises :class:`subprocess.TimeoutExpired` after killing the process, as :func:`subprocess.run` does.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, **kw)
        deadline, seen = time.monotonic() + timeout, {}
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise subprocess.TimeoutExpired(cmd, timeout)
            _sample_tree(proc.pid, seen)
            time.sleep(_SAMPLE)
        proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(cmd, proc.returncode, out.read().decode("utf-8", "replace"),
                                           err.read().decode("utf-8", "replace"))
    done.reaped = usage.ru_utime + usage.ru_stime
    done.cpu = max(done.reaped, sum(seen.values()))
    return done


#: Seconds between two readings of a background job's processes in /proc.
_SAMPLE = 1.0


def _sample_tree(root: int, seen: dict) -> None:
    """Note in ``seen`` (pid -> seconds) the user + system time of ``root`` and of its descendants."""
    parent, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    for pid in tree & cpu.keys():
        seen[pid] = max(seen.get(pid, 0.0), cpu[pid])


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def chapter_seconds(stem: str) -> float:
    """Expected seconds of one run of chapter ``stem``: the mean of its re-executions in the committed
    data/results/reproducibility.json, else its notebook's size at 20 kB a second."""
    try:
        seconds = json.loads((ROOT / "data" / "results" / "reproducibility.json").read_text())[
            "chapters"][stem]["seconds"]
        return sum(seconds.values()) / len(seconds)
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        path = ROOT / "book" / "chapters" / f"{stem}.ipynb"
        return path.stat().st_size / 20e3 if path.is_file() else 0.0


class Background:
    """The pool of background jobs (see above): :meth:`submit`, then :meth:`start`; :meth:`serial_done`
    when the serial suite ends; :meth:`stop` at the end."""

    def __init__(self, cores: int):
        self.cores = max(1, cores)
        #: The environment every job starts from (``run.environ``, a copy a job), taken when the pool is made,
        #: at collection's end, before any test runs. A job built from ``os.environ`` at its start took whatever
        #: a serial test had monkeypatched at that moment (the CI run of 2026-12-07: chapter 02 on its test
        #: parameters got answers perturbed by 4 ulps from a test's ``COMPANION_PERTURB_ULPS``).
        self.environ = dict(os.environ)
        self.cond = threading.Condition()
        self.queue: list = []
        self.busy = 0
        self.serial = True
        self.closed = False
        self.futures: dict = {}
        #: One record per finished job: kind, key, threads, began and ended (seconds since the session
        #: started), wall and CPU seconds of its subprocesses.
        self.records: list[dict] = []
        self.serial_ended: float | None = None
        self.base = Path(tempfile.mkdtemp(prefix="companion-background-"))
        self.workers: list = []

    def submit(self, key, fn, *, chapter: str, threads: int = 1, kind: str = "", scale: float = 1.0,
               cores: int | None = None):
        """``threads``: the job's BLAS threads (shown in the summary); ``cores``: how many cores it
        occupies for the pool's scheduling (default ``threads``)."""
        if key in self.futures:
            raise ValueError(f"two background jobs with the key {key!r}")
        future = concurrent.futures.Future()
        self.futures[key] = future
        self.queue.append({"key": key, "fn": fn, "threads": threads, "kind": kind, "future": future,
                           "cores": threads if cores is None else cores, "weight": scale * chapter_seconds(chapter)})
        return future

    def start(self) -> None:
        self.queue.sort(key=lambda job: -job["weight"])     # stable: equal weights keep their order
        for _ in range(min(self.cores, len(self.queue))):
            worker = threading.Thread(target=self._work, daemon=True)
            worker.start()
            self.workers.append(worker)

    def serial_done(self) -> None:
        with self.cond:
            if self.serial:
                self.serial = False
                self.serial_ended = _clock()
                self.cond.notify_all()

    def _pick(self):
        """The next job that fits on the idle cores (called with the lock held), or None."""
        idle = self.cores - self.busy - (1 if self.serial else 0)
        ones = [job for job in self.queue if job["cores"] == 1]
        if ones and (idle >= 1 or (self.busy == 0 and self.serial)):   # one core: the pool runs one job
            return ones[0]
        if not self.serial and (not ones or self.busy == 0):
            many = [job for job in self.queue if job["cores"] > 1]
            if many and (self.busy == 0 or self.busy + many[0]["threads"] <= self.cores):
                return many[0]
        return None

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.closed and self.queue and (job := self._pick()) is None:
                    self.cond.wait()
                if self.closed or not self.queue:
                    return
                self.queue.remove(job)
                self.busy += job["cores"]
            try:
                self._run(job)
            finally:
                with self.cond:
                    self.busy -= job["cores"]
                    self.cond.notify_all()

    def _run(self, job) -> None:
        if not job["future"].set_running_or_notify_cancel():
            return
        out = Path(tempfile.mkdtemp(dir=self.base))
        record = {"kind": job["kind"], "key": job["key"], "threads": job["threads"], "began": _clock(),
                  "cpu": 0.0, "reaped": 0.0}

        def run(cmd, **kw):
            done = run_measured(cmd, **kw)
            record["cpu"] += done.cpu
            record["reaped"] += done.reaped
            return done

        run.environ = dict(self.environ)  # type: ignore[attr-defined]
        try:
            result = job["fn"](run, out)
        except BaseException as exc:   # the waiting test re-raises it
            job["future"].set_exception(exc)
        else:
            job["future"].set_result(result)
        finally:
            record["ended"] = _clock()
            record["wall"] = record["ended"] - record["began"]
            self.records.append(record)

    def stop(self) -> None:
        """Cancel the jobs not started, wait for the running ones, delete their folders."""
        import shutil

        with self.cond:
            self.closed = True
            for job in self.queue:
                job["future"].cancel()
            self.queue.clear()
            self.cond.notify_all()
        for worker in self.workers:
            worker.join()
        shutil.rmtree(self.base, ignore_errors=True)


def _clock() -> float:
    return time.monotonic() - (_STARTED[0] if _STARTED else 0.0)


_POOL: list[Background] = []


@pytest.fixture(scope="session")
def background():
    """``{key: Future}`` of the background jobs; requesting it means the serial suite is done (the
    tests that request it run last), so the pool may take every core."""
    if not _POOL:
        pytest.skip("no background pool (collect-only)")
    _POOL[0].serial_done()
    return _POOL[0].futures


def _glue_tolerances(stem: str) -> dict:
    """Tolerances of the chapter's published values: the run's own results JSON over the committed one."""
    from companion.book import nbcompare

    committed = nbcompare.glue_tolerances(ROOT / "data" / "results" / f"{stem}.json")
    fresh = nbcompare.glue_tolerances(Path(os.environ["COMPANION_RESULTS_DIR"]) / f"{stem}.json")
    return committed | fresh


def _compare_by_contract():
    """Replace nbval's string comparison of a cell's outputs by :func:`companion.book.nbcompare.compare_outputs`."""
    from nbval.plugin import IPyNbCell

    from companion.book import nbcompare

    def compare_outputs(self, test, ref, skip_compare=None):
        stem = Path(str(self.parent.fspath)).stem
        diffs = nbcompare.compare_outputs(ref, test, rules=nbcompare.cell_rules(self.cell),
                                          glue=_glue_tolerances(stem))
        self.comparison_traceback = [
            "outputs differ beyond the reproducibility contract (companion.book.nbcompare):", *diffs]
        return not diffs

    IPyNbCell.compare_outputs = compare_outputs


