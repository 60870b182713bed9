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


def pytest_configure(config):
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


def pytest_terminal_summary(terminalreporter):
    """Print the reproducibility report of the re-executions compared (and write it if asked), and
    the reader's runs of tests/test_reader_runs.py (seeds and draws that ran, claims that did not hold)."""
    import sys

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


