"""The sweep runner the learners share: a function over a parameter grid, through joblib.

A sweep evaluates a function on every point of a parameter grid and collects one row (a dict) per
point. :func:`run_sweep` runs the points through :class:`joblib.Parallel`, so the same call scales
from one process to all local cores (``n_jobs=-1``) to a ``dask.distributed`` cluster (joblib's
``"dask"`` backend) and shows a progress bar (tqdm). Rows come back in grid order whatever the
backend, so a sweep's result depends only on its grid and seeds.

Saving the rows with their provenance (``name=``) is the book's part: :mod:`companion.book.sweeps`
registers the writer when it is imported (it saves to ``<results dir>/sweeps/<name>.json``). This
module imports nothing from :mod:`companion.book`, so that the science does not depend on the
book's machinery (``tests/test_architecture.py``).

On a cluster::

    from dask.distributed import Client
    client = Client("tcp://scheduler:8786")          # or Client(LocalCluster(n_workers=8))
    rows = run_sweep(point, grid, backend="dask")     # joblib sends the points to the workers

The function must be importable by the workers (defined in a module, not in a notebook cell, for
process-based backends): the library's sweep points, e.g. :func:`companion.exact.sweep_point`, are.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping

from ._validation import check_choice, check_int
from .errors import InvalidInputError

__all__ = ["grid_points", "run_sweep", "register_saver", "BACKENDS"]

#: joblib backends accepted by :func:`run_sweep`.
BACKENDS = ("sequential", "loky", "threading", "dask")


def grid_points(grid) -> list[dict]:
    """The points of a grid, in a fixed order.

    Parameters
    ----------
    grid : mapping of str to sequence, or sequence of mappings
        ``{"d": [4, 8], "seed": [0, 1]}`` gives the Cartesian product (last key varying fastest);
        a list of dicts is taken as the points themselves.

    Returns
    -------
    list of dict

    Raises
    ------
    InvalidInputError
        If a grid value is not a non-empty sequence, or a point is not a mapping.

    Examples
    --------
    >>> grid_points({"d": [4, 8], "seed": [0, 1]})
    [{'d': 4, 'seed': 0}, {'d': 4, 'seed': 1}, {'d': 8, 'seed': 0}, {'d': 8, 'seed': 1}]
    """
    if isinstance(grid, Mapping):
        for key, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise InvalidInputError(f"grid[{key!r}]={values!r} must be a sequence of values.")
        keys = list(grid)
        lists = [list(grid[k]) for k in keys]
        if any(len(v) == 0 for v in lists):
            raise InvalidInputError(f"every grid entry needs at least one value; got {grid!r}.")
        return [dict(zip(keys, combo)) for combo in itertools.product(*lists)]
    points = list(grid)
    if not all(isinstance(p, Mapping) for p in points):
        raise InvalidInputError("grid must be a mapping of lists or a list of mappings (dicts).")
    return [dict(p) for p in points]


def run_sweep(
    fn: Callable[..., Mapping], grid, *, n_jobs=1, backend="loky", progress=True, name=None, chapter=None
) -> list[dict]:
    """Evaluate ``fn(**point)`` on every grid point; return one row per point, in grid order.

    Parameters
    ----------
    fn : callable
        Called as ``fn(**point)``; returns a mapping of results (numbers, strings, lists). For
        process-based backends it must be importable (a module-level function).
    grid : mapping of str to sequence, or sequence of mappings
        See :func:`grid_points`.
    n_jobs : int, default=1
        Parallel workers (``-1``: all cores; ignored by ``"sequential"``). With ``"dask"``, joblib
        uses the workers of the active ``dask.distributed.Client``.
    backend : {"sequential", "loky", "threading", "dask"}, default="loky"
        The joblib backend. ``"dask"`` needs a running ``dask.distributed.Client``.
    progress : bool, default=True
        Show a tqdm progress bar (to stderr).
    name : str, default=None
        If given, hand the rows to the registered writer: :mod:`companion.book.sweeps` saves them
        with provenance to ``<results dir>/sweeps/<name>.json`` (atomic).
    chapter : str, default=None
        The chapter the sweep belongs to, recorded in the saved file.

    Returns
    -------
    list of dict
        ``{**point, **fn(**point)}`` for every point, in the order of :func:`grid_points`.

    Raises
    ------
    InvalidInputError
        For a bad grid, an unknown backend, or ``fn`` returning something that is not a mapping;
        for ``name`` given while no writer is registered (import :mod:`companion.book.sweeps`).

    Examples
    --------
    >>> rows = run_sweep(dict, {"a": [1, 2]}, backend="sequential", progress=False)
    >>> rows
    [{'a': 1}, {'a': 2}]
    """
    import joblib
    from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets in notebooks

    check_choice(backend, "backend", BACKENDS)
    n_jobs = check_int(n_jobs, "n_jobs")
    if n_jobs == 0:
        raise InvalidInputError("n_jobs=0 is not allowed; use a positive count or -1 for all cores.")
    points = grid_points(grid)
    if backend == "sequential":
        calls = (fn(**p) for p in points)
        outputs = list(tqdm(calls, total=len(points), disable=not progress, desc=name or "sweep"))
    else:
        context = joblib.parallel_backend("dask") if backend == "dask" else joblib.parallel_backend(backend)
        with context:
            parallel = joblib.Parallel(n_jobs=n_jobs, return_as="generator")
            gen = parallel(joblib.delayed(fn)(**p) for p in points)
            outputs = list(tqdm(gen, total=len(points), disable=not progress, desc=name or "sweep"))
    rows = []
    for point, out in zip(points, outputs):
        if not isinstance(out, Mapping):
            raise InvalidInputError(
                f"the sweep function returned {type(out).__name__} for {point}; it must return a dict."
            )
        rows.append({**point, **out})
    if name is not None:
        _save(name, grid, rows, chapter, backend, n_jobs)
    return rows


#: The writer of named sweeps, ``saver(name, grid, rows, chapter, backend, n_jobs)``; set by
#: :mod:`companion.book.sweeps` when it is imported.
_SAVER: list[Callable] = []


def register_saver(saver: Callable) -> None:
    """Set the writer that :func:`run_sweep` calls for a named sweep (the book's, by default).

    Parameters
    ----------
    saver : callable
        Called as ``saver(name, grid, rows, chapter, backend, n_jobs)``; it replaces any earlier one.

    Examples
    --------
    >>> import companion.book.sweeps  # registers the book's writer
    >>> _SAVER[0].__module__
    'companion.book.sweeps'
    """
    _SAVER[:] = [saver]


def _save(name, grid, rows, chapter, backend, n_jobs):
    if not _SAVER:
        raise InvalidInputError(
            f"run_sweep(name={name!r}) saves the rows with the book's writer, which is not loaded; "
            "import companion.book.sweeps first, or leave out name= and keep the returned rows."
        )
    _SAVER[0](name, grid, rows, chapter, backend, n_jobs)
