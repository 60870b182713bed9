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

import os
import tempfile
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
    """The chapters' re-executions last (tests/test_reproducibility.py): their tests wait for the
    background runs, which then had the whole serial suite to overlap with."""
    last = [i for i in items if getattr(i, "originalname", "") == "test_chapter_reproduces"]
    if last:
        items[:] = [i for i in items if getattr(i, "originalname", "") != "test_chapter_reproduces"] + last


def pytest_collection_finish(session):
    """Start the re-executions under other BLAS kernels now, in the background (tests/test_reproducibility.py)."""
    items = [i for i in session.items if getattr(i, "originalname", "") == "test_chapter_reproduces"]
    if items and not session.config.option.collectonly:
        items[0].module.start(items)


#: Parts of the suite, for the time summary at the end: (label, test-id prefix), first match wins.
TIME_PARTS = (
    ("nbval: every chapter re-executed and compared", "book/chapters/"),
    ("re-executions under other kernels and perturbed answers (waiting)", "tests/test_reproducibility.py"),
    ("reader's runs (daily rotation)", "tests/test_reader_runs.py"),
    ("chapters on non-default parameters, papermill, make book after an edit", "tests/test_chapters.py"),
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
    import sys

    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) and module.__file__.endswith("test_reproducibility.py"):
            module.stop()

    for folder in _CREATED:
        shutil.rmtree(folder, ignore_errors=True)


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


