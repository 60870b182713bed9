"""Fixtures shared by the tests (the set-up for every path is in the repository's conftest.py)."""

from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def benchmarks(monkeypatch):
    """``benchmarks/`` importable for one test; the modules imported from it are dropped after."""
    import sys

    folder = ROOT / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if Path(getattr(sys.modules[name], "__file__", None) or "").parent == folder:
            del sys.modules[name]


@pytest.fixture
def results_tmp(tmp_path, monkeypatch):
    """A fresh results folder for one test."""
    monkeypatch.setenv("COMPANION_RESULTS_DIR", str(tmp_path))
    return tmp_path


def _build_book(tmp_path_factory, builder="html"):
    """Build the book with ``builder`` from the committed outputs (no chapter executed), strictly.

    Returns the build folder (``_build`` holds ``html`` or ``latex``); fails with the build log if
    Sphinx warns (``-n -W``).
    """
    import subprocess
    import sys

    import yaml

    # one folder for every builder: the second build reuses the first one's Sphinx environment (the
    # pages read once, _build/.doctrees), as `make html latexpdf` does
    out = tmp_path_factory.getbasetemp() / "book"
    out.mkdir(exist_ok=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    # The chapters render their committed outputs (excluded from execution); the reproducibility page,
    # a MyST notebook gluing data/results/reproducibility.json, has none and is executed.
    config["execute"]["execute_notebooks"] = "force"
    config["execute"]["exclude_patterns"] = [p.name for p in (ROOT / "book" / "chapters").glob("*.ipynb")]
    # paths in the configuration are relative to its file, which moves to the build folder
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in config["sphinx"]["local_extensions"].items()}
    cfg = out / "_config.yml"
    cfg.write_text(yaml.safe_dump(config))
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(ROOT), "-n", "-W", "--keep-going", "--config", str(cfg),
                           "--path-output", str(out), "--builder", builder],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"book build ({builder}) failed:\n" + proc.stdout[-4000:] + proc.stderr[-4000:])
    return out / "_build"


@pytest.fixture(scope="session")
def book_html(tmp_path_factory):
    """Build the book once per session from the committed outputs (no execution), strictly.

    Returns the ``_build/html`` folder; fails with the build log if Sphinx warns (``-n -W``).
    """
    return _build_book(tmp_path_factory, "html") / "html"


@pytest.fixture(scope="session")
def book_latex(tmp_path_factory):
    """The LaTeX source of the PDF (``make pdf`` compiles it), built once per session like ``book_html``.

    Returns the ``_build/latex`` folder (``companion.tex``).
    """
    return _build_book(tmp_path_factory, "latex") / "latex"


@pytest.fixture
def shape_log():
    """A :class:`~companion.oracles.ValueQueryOracle` subclass that records, in ``.batches``, the
    batch size of every call: a learner's query chunks (and so its memory) show in them."""
    from companion.oracles import ValueQueryOracle

    class ShapeLog(ValueQueryOracle):
        def __init__(self, target, **kw):
            super().__init__(target, **kw)
            self.batches = []

        def __call__(self, X):
            self.batches.append(np.shape(X)[0])
            return super().__call__(X)

    return ShapeLog
