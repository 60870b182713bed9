"""The README's Python snippets run as written, and the values their comments state are the ones
they compute (a new user's first lines; issue: the count comment said 4192 where the learner asks 4224)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_has_the_library_and_your_own_model_snippets():
    blocks = _python_blocks()  # the third is a parameters cell's example, not a program
    assert len(blocks) == 3 and blocks[2].startswith("d = 5 ")
    assert "learn_single_head(oracle)" in blocks[0] and "targets.from_keras(layer)" in blocks[1]


def test_library_snippet_runs_and_its_commented_counts_are_the_learner_s(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = _python_blocks()[0]
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    rec, target = ns["rec"], ns["target"]
    stated = re.search(r"rec\.n_learning_queries, rec\.n_queries\s+# \((\d+), (\d+)\)", block)
    assert stated is not None
    assert (rec.n_learning_queries, rec.n_queries) == (int(stated[1]), int(stated[2])) == (4160, 4224)
    assert rec.diagnostics["n_precision_queries"] == 32 and rec.diagnostics["n_verify_queries"] == 64
    err = rec.relative_errors(target)
    assert err["W"] < 1e-14 and err["v"] == 0.0  # the comment's {'W': ~1e-15, 'v': 0.0}


def test_your_own_model_snippet_runs_as_written_on_a_fresh_keras_layer(tmp_path, monkeypatch):
    import os

    os.environ.setdefault("KERAS_BACKEND", "numpy")  # as the snippet does, before keras
    pytest.importorskip("keras")
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(_python_blocks()[1], "README.md", "exec"), ns)
    assert ns["rec"].W.shape == (17, 17)  # d = 16, bias=True: homogeneous tokens
    err = ns["target"].truth.errors(ns["rec"])
    assert err["W"] < 1e-4 and err["v"] < 1e-5  # float32 answers
    assert (tmp_path / "head.safetensors").is_file()
