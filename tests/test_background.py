"""The background pool of conftest.py: no core runs two jobs, the longest jobs start first,
multi-thread jobs wait for the serial suite, a job's error reaches its test, CPU time is measured."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pool_module(request):
    """The repository's conftest.py (it holds the pool), as pytest loaded it."""
    module = request.config.pluginmanager.get_plugin(str(ROOT / "conftest.py"))
    assert module is not None and hasattr(module, "Background")
    return module


def _jobs(pool, spec, log, lock):
    """Submit jobs of ``(name, threads, scale)``; each records (start, name) and the threads in use."""
    state = {"busy": 0, "max": 0}

    def job(name, threads):
        def fn(run, out):
            with lock:
                state["busy"] += threads
                state["max"] = max(state["max"], state["busy"])
                log.append((name, threads, pool.serial))
            time.sleep(0.05)
            with lock:
                state["busy"] -= threads
            return name
        return fn

    for name, threads, scale in spec:
        pool.submit(name, job(name, threads), chapter="01_definitions", threads=threads, kind="t", scale=scale)
    return state


def test_one_thread_jobs_run_beside_the_serial_suite_longest_first_and_two_thread_jobs_after_it(pool_module):
    pool = pool_module.Background(2)
    log, lock = [], threading.Lock()
    state = _jobs(pool, [("a", 1, 1.0), ("b", 2, 9.0), ("c", 1, 3.0), ("d", 1, 2.0), ("e", 2, 5.0)], log, lock)
    pool.start()
    try:
        for _ in range(200):                    # the three 1-thread jobs, one at a time, on the idle core
            if len(log) == 3 and all(f.done() for k, f in pool.futures.items() if k in "acd"):
                break
            time.sleep(0.01)
        time.sleep(0.1)
        assert [name for name, _, _ in log] == ["c", "d", "a"] and state["max"] == 1
        assert not pool.futures["b"].running() and not pool.futures["b"].done()    # waits for the suite
        pool.serial_done()
        assert pool.futures["b"].result(timeout=10) == "b" and pool.futures["e"].result(timeout=10) == "e"
    finally:
        pool.stop()
    assert [name for name, _, _ in log] == ["c", "d", "a", "b", "e"]
    assert [serial for _, _, serial in log] == [True, True, True, False, False]
    assert state["max"] == 2                    # never more BLAS threads than cores
    assert [r["key"] for r in pool.records] == ["c", "d", "a", "b", "e"]


def test_after_the_serial_suite_two_one_thread_jobs_share_the_machine(pool_module):
    pool = pool_module.Background(2)
    log, lock = [], threading.Lock()
    state = _jobs(pool, [(n, 1, 1.0) for n in "abcd"], log, lock)
    pool.serial_done()
    pool.start()
    try:
        assert [pool.futures[n].result(timeout=10) for n in "abcd"] == list("abcd")
    finally:
        pool.stop()
    assert state["max"] == 2


def test_on_one_core_the_pool_still_runs_one_job_at_a_time(pool_module):
    pool = pool_module.Background(1)
    log, lock = [], threading.Lock()
    state = _jobs(pool, [("a", 1, 1.0), ("b", 2, 2.0)], log, lock)
    pool.start()
    try:
        assert pool.futures["a"].result(timeout=10) == "a"
        pool.serial_done()
        assert pool.futures["b"].result(timeout=10) == "b"       # alone, with more threads than cores
    finally:
        pool.stop()
    assert state["max"] == 2 and log[1] == ("b", 2, False)


def test_a_jobs_error_reaches_its_test_and_stop_cancels_what_has_not_started(pool_module):
    pool = pool_module.Background(2)

    def fails(run, out):
        raise RuntimeError("the chapter stopped")

    pool.submit("bad", fails, chapter="01_definitions", kind="t")
    pool.submit("later", lambda run, out: 1, chapter="01_definitions", threads=2, kind="t")
    pool.start()
    with pytest.raises(RuntimeError, match="the chapter stopped"):
        pool.futures["bad"].result(timeout=10)
    pool.stop()                                 # the 2-thread job never started: the suite did not end
    assert pool.futures["later"].cancelled()
    with pytest.raises(ValueError, match="two background jobs"):
        pool.submit("bad", fails, chapter="01_definitions")


def test_a_job_starts_from_the_environment_of_the_pools_creation_not_from_a_serial_tests(pool_module, monkeypatch):
    """A job's ``run.environ`` is the environment when the pool was made (collection's end): a variable a serial
    test sets or deletes while the job starts does not reach it, and each job gets its own copy."""
    monkeypatch.setenv("COMPANION_POOL_PROBE", "collection")
    monkeypatch.delenv("COMPANION_PERTURB_ULPS", raising=False)
    pool = pool_module.Background(2)
    monkeypatch.setenv("COMPANION_POOL_PROBE", "a serial test's")  # after the snapshot, before the jobs run
    monkeypatch.setenv("COMPANION_PERTURB_ULPS", "4")

    def job(run, out):
        seen = dict(run.environ)
        run.environ["COMPANION_POOL_PROBE"] = "changed by a job"
        return seen

    pool.submit("one", job, chapter="01_definitions", kind="t")
    pool.submit("two", job, chapter="01_definitions", kind="t")
    pool.start()
    seen = [pool.futures[k].result(timeout=10) for k in ("one", "two")]
    pool.stop()
    assert [s["COMPANION_POOL_PROBE"] for s in seen] == ["collection", "collection"]
    assert all("COMPANION_PERTURB_ULPS" not in s for s in seen)
    assert os.environ["COMPANION_POOL_PROBE"] == "a serial test's"


def test_run_measured_returns_the_output_and_the_cpu_time_and_times_out(pool_module, tmp_path):
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done')"
    done = pool_module.run_measured([sys.executable, "-c", burn], timeout=60)
    assert done.returncode == 0 and done.stdout == "done\n" and done.stderr == ""
    assert 0.3 <= done.cpu < 5
    fails = pool_module.run_measured([sys.executable, "-c", "import sys; sys.exit('no')"], timeout=60)
    assert fails.returncode == 1 and fails.stderr == "no\n"
    # a grandchild its parent does not wait for (as a chapter's kernel may be): read from /proc
    flag = tmp_path / "burnt"
    child = burn.replace("0.3", "1.5").replace("print('done')", f"open({str(flag)!r}, 'w').close()")
    orphan = (f"import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n"
              f"while not os.path.exists({str(flag)!r}): time.sleep(0.1)\ntime.sleep(2.5)\nos._exit(0)")
    parent = pool_module.run_measured([sys.executable, "-c", orphan], timeout=120)
    assert parent.returncode == 0 and parent.reaped < 1.0 and parent.cpu >= 1.5
    with pytest.raises(subprocess.TimeoutExpired):
        pool_module.run_measured([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_chapter_seconds_reads_the_committed_report(pool_module):
    import json

    seconds = json.loads((ROOT / "data" / "results" / "reproducibility.json").read_text())["chapters"][
        "07_pretrained_heads"]["seconds"]
    assert pool_module.chapter_seconds("07_pretrained_heads") == pytest.approx(sum(seconds.values()) / len(seconds))
    assert pool_module.chapter_seconds("99_no_such_chapter") == 0.0


def test_a_two_thread_job_declared_on_one_core_runs_beside_the_serial_suite(pool_module):
    """``cores=1`` (the reproducibility suite's 2-thread runs, whose second thread sleeps when idle):
    scheduled as a 1-core job, longest first, while the serial suite runs; its threads are recorded."""
    pool = pool_module.Background(2)
    done = []
    pool.submit("two", lambda run, out: done.append("two") or "two", chapter="01_definitions", threads=2,
                kind="t", scale=5.0, cores=1)
    pool.submit("one", lambda run, out: done.append("one") or "one", chapter="01_definitions", threads=1,
                kind="t", scale=1.0)
    pool.start()
    try:
        assert pool.futures["two"].result(timeout=10) == "two" and pool.futures["one"].result(timeout=10) == "one"
        assert pool.serial and done == ["two", "one"]              # both ran before the suite ended
    finally:
        pool.stop()
    assert {r["key"]: r["threads"] for r in pool.records} == {"two": 2, "one": 1}
