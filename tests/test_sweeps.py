"""The sweep runner: grid order, backends (sequential, loky, dask LocalCluster), saved provenance."""

import json

import pytest

from companion.errors import InvalidInputError
from companion.exact import sweep, sweep_point
from companion.book.sweeps import grid_points, run_sweep


def square(x, offset=0):
    return {"y": x * x + offset}


def test_grid_points_order_and_errors():
    assert grid_points({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert grid_points([{"a": 3}]) == [{"a": 3}]
    with pytest.raises(InvalidInputError, match=r"grid\['a'\]=3 must be a sequence"):
        grid_points({"a": 3})
    with pytest.raises(InvalidInputError, match=r"at least one value"):
        grid_points({"a": []})


@pytest.mark.parametrize("backend, n_jobs", [("sequential", 1), ("loky", 2), ("threading", 2)])
def test_backends_agree_and_keep_grid_order(backend, n_jobs):
    rows = run_sweep(square, {"x": [3, 1, 2], "offset": [0, 10]}, backend=backend, n_jobs=n_jobs,
                     progress=False)
    assert [(r["x"], r["offset"], r["y"]) for r in rows] == [
        (3, 0, 9), (3, 10, 19), (1, 0, 1), (1, 10, 11), (2, 0, 4), (2, 10, 14)]


def test_bad_arguments():
    with pytest.raises(InvalidInputError, match=r"backend='mpi' is not one of"):
        run_sweep(square, {"x": [1]}, backend="mpi")
    with pytest.raises(InvalidInputError, match=r"n_jobs=0"):
        run_sweep(square, {"x": [1]}, n_jobs=0)
    with pytest.raises(InvalidInputError, match=r"returned int .* must return a dict"):
        run_sweep(lambda x: x, {"x": [1]}, backend="sequential", progress=False)


def test_saved_sweep_has_rows_and_provenance(results_tmp):
    rows = sweep([2, 4], seed=1, name="exact_small")
    data = json.loads((results_tmp / "sweeps" / "exact_small.json").read_text())
    assert data["kind"] == "sweep" and data["name"] == "exact_small"
    assert [r["n_queries"] for r in data["rows"]] == [6, 20] == [r["n_queries"] for r in rows]
    assert data["parameters"]["grid"][0] == {"d": 2, "seed": 1, "probes": "basis", "entry_scale": None,
                                             "scale": "auto"}
    assert len(data["library_hash"]) == 16 and "versions" in data


@pytest.mark.slow
def test_dask_local_cluster_with_two_workers():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster):
        rows = run_sweep(sweep_point, {"d": [3, 5, 8], "seed": [0]}, backend="dask", n_jobs=-1,
                         progress=False)
    assert [r["n_queries"] for r in rows] == [12, 30, 72]
    assert max(r["rel_error_W"] for r in rows) < 1e-12


def test_a_named_sweep_without_the_books_writer_is_refused(monkeypatch):
    from companion import _sweep

    monkeypatch.setattr(_sweep, "_SAVER", [])
    assert _sweep.run_sweep(square, {"x": [2]}, backend="sequential", progress=False) == [
        {"x": 2, "y": 4}]
    with pytest.raises(InvalidInputError, match=r"import companion.book.sweeps first"):
        _sweep.run_sweep(square, {"x": [2]}, backend="sequential", progress=False, name="s")


@pytest.mark.parametrize("old", ["cli", "results", "nbcompare", "prose", "parameters", "plotting",
                                 "release", "sweeps"])
def test_the_old_paths_warn_and_forward(old):
    import importlib

    shim = importlib.import_module(f"companion.{old}")
    new = importlib.import_module(f"companion.book.{old}")
    name = new.__all__[0]
    with pytest.warns(DeprecationWarning, match=rf"use companion\.book\.{old}\.{name} "):
        assert getattr(shim, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        shim.no_such_name
