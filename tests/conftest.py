"""Shared test set-up.

* Results go to a temporary folder, never into the committed data/results.
* nbval compares every chapter's outputs by the reproducibility contract
  (:mod:`companion.nbcompare`): exact for exact values, a stated tolerance for imprecise ones
  (rounding level, a published value's ``rtol``/``atol``, or the cell's
  ``metadata["companion"]["tolerance"]``), never by masking a number.
"""

import json
import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CREATED = []


def pytest_configure(config):
    # Set before any kernel starts, so that notebooks run by nbval and papermill inherit it.
    if "COMPANION_RESULTS_DIR" not in os.environ:
        _CREATED.append(tempfile.mkdtemp(prefix="companion-results-"))
        os.environ["COMPANION_RESULTS_DIR"] = _CREATED[-1]
    os.environ.setdefault("MPLBACKEND", "Agg")
    if config.pluginmanager.hasplugin("nbval"):
        _compare_by_contract()


def pytest_unconfigure(config):
    import shutil

    for folder in _CREATED:
        shutil.rmtree(folder, ignore_errors=True)


def _glue_tolerances(stem: str) -> dict:
    """Tolerances of the chapter's published values: the run's own results JSON over the committed one."""
    from companion import nbcompare

    committed = nbcompare.glue_tolerances(ROOT / "data" / "results" / f"{stem}.json")
    fresh = nbcompare.glue_tolerances(Path(os.environ["COMPANION_RESULTS_DIR"]) / f"{stem}.json")
    return committed | fresh


def _compare_by_contract():
    """Replace nbval's string comparison of a cell's outputs by :func:`companion.nbcompare.compare_outputs`."""
    from nbval.plugin import IPyNbCell

    from companion import nbcompare

    def compare_outputs(self, test, ref, skip_compare=None):
        stem = Path(str(self.parent.fspath)).stem
        diffs = nbcompare.compare_outputs(ref, test, rules=nbcompare.cell_rules(self.cell),
                                          glue=_glue_tolerances(stem))
        self.comparison_traceback = [
            "outputs differ beyond the reproducibility contract (companion.nbcompare):", *diffs]
        return not diffs

    IPyNbCell.compare_outputs = compare_outputs


@pytest.fixture
def results_tmp(tmp_path, monkeypatch):
    """A fresh results folder for one test."""
    monkeypatch.setenv("COMPANION_RESULTS_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def book_html(tmp_path_factory):
    """Build the book once per session from the committed outputs (no execution), strictly.

    Returns the ``_build/html`` folder; fails with the build log if Sphinx warns (``-n -W``).
    """
    import subprocess
    import sys

    import yaml

    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    # paths in the configuration are relative to its file, which moves to the build folder
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in config["sphinx"]["local_extensions"].items()}
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config))
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(ROOT), "-n", "-W", "--keep-going", "--config", str(cfg),
                           "--path-output", str(out)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail("book build failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
    return out / "_build" / "html"
