"""publish(): glue text and an atomic results JSON with provenance."""

import json
import os

import numpy as np
import pytest

from companion import results
from companion.errors import InvalidInputError


def test_record_and_publish_write_provenance(results_tmp):
    results.record_parameters("99_demo", seed=3, d=4, sizes=[1, 2], glue=False)
    results.publish("n", np.int64(20), glue=False)
    results.publish("err", np.float64(1.25e-15), fmt="{:.1e}", glue=False)
    data = json.loads((results_tmp / "99_demo.json").read_text())
    assert data["chapter"] == "99_demo" and data["seed"] == 3
    assert data["parameters"] == {"d": 4, "sizes": [1, 2]}
    assert data["values"]["n"] == {"value": 20, "text": "20"}
    assert data["values"]["err"] == {"value": 1.25e-15, "text": "1.2e-15"}
    assert type(data["values"]["n"]["value"]) is int
    assert len(data["library_hash"]) == 16 and data["library_hash"] == results.library_hash()
    assert {"python", "numpy", "companion"} <= set(data["versions"])
    assert data["created"].endswith("+00:00")
    assert [p.name for p in results_tmp.iterdir()] == ["99_demo.json"]   # no temporary left over


def test_record_parameters_discards_old_values(results_tmp):
    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("old", 1, glue=False)
    results.record_parameters("99_demo", seed=1, glue=False)
    assert results.load("99_demo")["values"] == {}


def test_default_formats():
    assert results._format(1234567, None) == "1,234,567"
    assert results._format(0.000123456, None) == "0.000123"
    assert results._format(True, None) == "True"
    assert results._format(3.0, lambda x: f"<{x}>") == "<3.0>"


@pytest.mark.parametrize("name, value, message", [
    ("bad name", 1, r"name='bad name' must be a non-empty string"),
    ("", 1, r"name='' must be"),
    ("ok", object(), r"cannot publish a value of type object"),
])
def test_publish_rejects_bad_input(results_tmp, name, value, message):
    results.record_parameters("99_demo", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match=message):
        results.publish(name, value, glue=False)


def test_publish_needs_a_chapter(results_tmp, monkeypatch):
    monkeypatch.setitem(results._state, "chapter", None)
    with pytest.raises(InvalidInputError, match=r"does not know the chapter"):
        results.publish("x", 1, glue=False)


def test_failed_write_keeps_the_previous_file(results_tmp, monkeypatch):
    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("a", 1, glue=False)
    before = (results_tmp / "99_demo.json").read_text()
    with pytest.raises(ValueError):
        results.publish("b", float("nan"), glue=False)     # JSON refuses NaN: nothing replaced
    assert (results_tmp / "99_demo.json").read_text() == before
    assert [p.name for p in results_tmp.iterdir()] == ["99_demo.json"]


def test_library_hash_changes_with_the_source(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(results, "LIBRARY_DIR", tmp_path)
    h1 = results.library_hash()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert results.library_hash() != h1


def test_glue_is_called_with_text(results_tmp, monkeypatch):
    calls = []
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.append((name, value, display)))
    results.record_parameters("99_demo", seed=5, d=4)
    results.publish("x", np.float64(0.5))
    assert calls == [("seed", "5", False), ("d", "4", False), ("x", "0.5", False)]
    assert all(type(v) is str for _, v, _ in calls)


def test_results_dir_default_is_the_repository(monkeypatch):
    monkeypatch.delenv("COMPANION_RESULTS_DIR", raising=False)
    root = results.repo_root()
    assert root is not None and (root / "_toc.yml").is_file()
    assert results.results_dir() == root / "data" / "results"


def test_stale_cache_is_cleared_when_the_library_changes(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(results, "LIBRARY_DIR", lib)
    build = tmp_path / "_build"
    (build / ".jupyter_cache").mkdir(parents=True)
    assert results.clear_stale_cache(build) is True            # first build: no stamp yet
    assert not (build / ".jupyter_cache").exists()
    (build / ".jupyter_cache").mkdir()
    assert results.clear_stale_cache(build) is False           # unchanged library: cache kept
    assert (build / ".jupyter_cache").exists()
    (lib / "m.py").write_text("x = 2\n")                       # an edit to the library
    assert results.clear_stale_cache(build) is True
    assert not (build / ".jupyter_cache").exists()
    assert (build / ".library-hash").read_text().strip() == results.library_hash()


def test_results_file_is_world_readable(results_tmp):
    old = os.umask(0o022)
    try:
        results.record_parameters("99_demo", seed=0, glue=False)
    finally:
        os.umask(old)
    assert (results_tmp / "99_demo.json").stat().st_mode & 0o777 == 0o644


def test_publish_records_tolerance_only_when_given(results_tmp):
    results.record_parameters("tol", seed=0, glue=False)
    results.publish("exact", 20, glue=False)
    results.publish("bits", 47.25, glue=False, atol=1.0)
    results.publish("err", 3e-16, glue=False, rtol=0.5, atol=1e-12)
    values = results.load("tol")["values"]
    assert "tolerance" not in values["exact"]
    assert values["bits"]["tolerance"] == {"rtol": 0.0, "atol": 1.0}
    assert values["err"]["tolerance"] == {"rtol": 0.5, "atol": 1e-12}


@pytest.mark.parametrize("kwargs", [{"rtol": -1e-9}, {"atol": float("nan")}, {"atol": float("inf")},
                                    {"rtol": True}])
def test_publish_refuses_bad_tolerance(results_tmp, kwargs):
    results.record_parameters("tol", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="must be a finite real number"):
        results.publish("x", 1.0, glue=False, **kwargs)
    assert "x" not in results.load("tol")["values"]


def test_publish_refuses_tolerance_on_non_number(results_tmp):
    results.record_parameters("tol", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="real numbers only"):
        results.publish("s", "text", glue=False, rtol=0.1)
