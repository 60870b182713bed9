"""Shared test set-up: results go to a temporary folder, never into the committed data/results."""

import os
import tempfile

import pytest


_CREATED = []


def pytest_configure(config):
    # Set before any kernel starts, so that notebooks run by nbval and papermill inherit it.
    if "COMPANION_RESULTS_DIR" not in os.environ:
        _CREATED.append(tempfile.mkdtemp(prefix="companion-results-"))
        os.environ["COMPANION_RESULTS_DIR"] = _CREATED[-1]
    os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_unconfigure(config):
    import shutil

    for folder in _CREATED:
        shutil.rmtree(folder, ignore_errors=True)


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
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config))
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(root), "-n", "-W", "--keep-going", "--config", str(cfg),
                           "--path-output", str(out)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail("book build failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
    return out / "_build" / "html"
