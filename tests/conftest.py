"""Shared test set-up: results go to a temporary folder, never into the committed data/results."""

import os
import tempfile

import pytest


def pytest_configure(config):
    # Set before any kernel starts, so that notebooks run by nbval and papermill inherit it.
    os.environ.setdefault("COMPANION_RESULTS_DIR", tempfile.mkdtemp(prefix="companion-results-"))
    os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def results_tmp(tmp_path, monkeypatch):
    """A fresh results folder for one test."""
    monkeypatch.setenv("COMPANION_RESULTS_DIR", str(tmp_path))
    return tmp_path
