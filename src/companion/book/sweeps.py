"""Named sweeps saved with their provenance: the book's side of :func:`companion._sweep.run_sweep`.

The runner itself (a function over a parameter grid, through joblib locally or on a
``dask.distributed`` cluster) lives below the learners, which use it, in ``companion._sweep``;
this module re-exports it and registers the writer it calls for a named sweep: the rows, the grid
and the provenance of :func:`companion.book.results.provenance`, written atomically to
``<results dir>/sweeps/<name>.json``.

On a cluster::

    from dask.distributed import Client
    client = Client("tcp://scheduler:8786")          # or Client(LocalCluster(n_workers=8))
    rows = run_sweep(point, grid, backend="dask")     # joblib sends the points to the workers

The function must be importable by the workers (defined in a module, not in a notebook cell, for
process-based backends): the library's sweep points, e.g. :func:`companion.exact.sweep_point`, are.
"""

from __future__ import annotations

from .._sweep import BACKENDS, grid_points, register_saver, run_sweep

__all__ = ["grid_points", "run_sweep", "save_rows", "BACKENDS"]


def save_rows(name, grid, rows, chapter=None, backend="sequential", n_jobs=1):
    """Write a sweep's rows with their provenance to ``<results dir>/sweeps/<name>.json``.

    Parameters
    ----------
    name : str
        The sweep's name (the file's stem).
    grid : mapping of str to sequence, or sequence of mappings
        The grid the rows came from (see :func:`grid_points`), stored as its points.
    rows : list of dict
        One row per point; a non-finite number is stored as null with where it was.
    chapter : str, default=None
        The chapter the sweep belongs to, recorded in the file.
    backend : str, default="sequential"
    n_jobs : int, default=1
        How the rows were computed, recorded in the file.

    Returns
    -------
    pathlib.Path
        The file written.

    Examples
    --------
    >>> import json, os, tempfile
    >>> previous = os.environ.get("COMPANION_RESULTS_DIR")
    >>> os.environ["COMPANION_RESULTS_DIR"] = tempfile.mkdtemp()
    >>> path = save_rows("demo", {"d": [2]}, [{"d": 2, "n": 6}])
    >>> json.loads(path.read_text())["rows"]
    [{'d': 2, 'n': 6}]
    >>> if previous is None: del os.environ["COMPANION_RESULTS_DIR"]
    ... else: os.environ["COMPANION_RESULTS_DIR"] = previous
    """
    from . import results

    data = results.provenance(name, {"grid": grid_points(grid)}, None, chapter=chapter)
    data.update(kind="sweep", name=name, backend=backend, n_jobs=n_jobs, rows=rows)
    # a trial that found no estimate (NaN, inf) is an outcome, stored as null with where it was
    return results.write_json(results.results_dir() / "sweeps" / f"{name}.json", data, nonfinite="null")


register_saver(save_rows)
