"""Publish the numbers a chapter cites: glue for the text, JSON with provenance for citers.

A chapter calls :func:`record_parameters` once, right after its ``parameters`` cell,
:func:`publish` once for every number its prose cites, and :func:`claim` once for every verdict
its prose states ("every trial succeeds", "exactly d + d² queries"). Each call

* glues the *formatted* value (a Python ``str``) under ``name`` with ``myst_nb.glue``, so that
  ``{glue:text}`name``` in the chapter renders exactly the published text; and
* rewrites ``<results dir>/<chapter>.json`` atomically (a temporary file in the same folder, then
  :func:`os.replace`), holding every published value with the chapter's parameters, seed, a hash of
  the library source, the git commit, package versions and the time.

Where the results file goes (:func:`results_path`), so that no run silently replaces another's:

1. ``$COMPANION_RESULTS_DIR/<chapter>.json`` if the variable is set (``companion run`` sets it to
   its staging folder and then moves the file next to the executed notebook, ``make book``,
   ``make execute`` and the tests set it; a relative folder is taken from where the command was
   typed, ``$PWD``, even when papermill runs the kernel elsewhere with ``--cwd``);
2. else next to the executed notebook, named after it, when the kernel knows that notebook:
   papermill's ``--inject-output-path`` (``papermill --inject-output-path IN.ipynb elsewhere/x.ipynb``
   writes ``elsewhere/x.json``);
3. else a new file ``runs/<chapter>-<UTC date and time>.json`` of the repository that holds the
   chapter, one per run.

Only ``make execute`` writes into the committed ``data/results``, which it names explicitly: a
reader's run never overwrites the book's numbers.

A chapter that fails writes nothing half-way: if a cell raises after :func:`record_parameters`
(an error, or the interrupt of a time limit), the results file is put back as it was before the run,
and later :func:`publish` calls of that run only glue.

Each published value says what it is (``"kind"`` in the JSON, quoted by ``companion cite``):
``"exact"`` (the same on every machine), ``"measured"`` (reproducible to its ``rtol``/``atol``) or
``"bound"`` (a constant the chapter states as an upper bound, stored with the ``"measured"`` value
it bounds). A claim is stored with ``"kind": "claim"``: it was checked when the chapter ran.

**The book's build and a reader's run.** A claim or bound that does not hold is handled by the
environment variable ``COMPANION_STRICT`` (:data:`STRICT_ENV`, read by :func:`strict`):

* ``COMPANION_STRICT=1`` (strict): :class:`~companion.errors.ClaimError` stops the chapter, its
  results file is put back, and the book does not build with a false sentence. The book's own
  build sets it: ``companion build`` (``make book``), ``make execute``, and ``make test`` (the root
  ``conftest.py``, so nbval and the chapters' re-executions inherit it).
* unset or ``0`` (a reader's run: ``companion run``, plain papermill, Jupyter): the chapter goes
  on. The glued text carries a visible mark, e.g. ``1e-07 (does not hold for this run: measured
  2.25e-07 against 1e-07)``, a line on the cell's stderr says so, and the results file records the
  entry with ``"holds": false`` (and, for a bound, the measured value). :func:`not_holding` lists
  such entries; ``companion run`` prints them at the end.

**Values JSON has no number for.** NaN and infinities are legitimate outcomes (no trial of a case
succeeded, an estimate overflowed). They are glued as formatted (``nan``, ``inf``) and stored as
``null``, with ``"nonfinite": {"value": "nan"}`` saying which value was what (``"value[2]"``,
``"value[a]"`` inside a list or dict; ``"measured"`` for a bound's measured value), and the
chapter's own ``note=`` saying why, if it gave one.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import numbers
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np

from .._atomic import write_atomic
from .._validation import check_int
from ..errors import ClaimError, InvalidInputError

__all__ = [
    "publish",
    "publish_below",
    "round_up",
    "claim",
    "KINDS",
    "STRICT_ENV",
    "strict",
    "not_holding",
    "record_parameters",
    "results_dir",
    "results_path",
    "book_results_dir",
    "mark_built",
    "library_hash",
    "load",
    "repo_root",
    "clear_stale_cache",
    "LIBRARY_DIR",
    "provenance",
    "write_json",
]

#: The library's source folder, hashed into every results file.
LIBRARY_DIR = Path(__file__).resolve().parents[1]  # src/companion, the whole library

_PACKAGES = ("numpy", "scipy", "cvxpy", "matplotlib", "papermill", "jupyter-book", "myst-nb")

#: The environment variable that makes a false claim or bound stop the chapter (see the module's docstring).
STRICT_ENV = "COMPANION_STRICT"

_STRICT_WORDS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("0", "false", "no", "off"), False)


def strict() -> bool:
    """Whether a claim or bound that does not hold stops the chapter: ``$COMPANION_STRICT``.

    ``1`` (also ``true``, ``yes``, ``on``) is the book's build: :class:`~companion.errors.ClaimError`.
    Unset, empty or ``0`` (``false``, ``no``, ``off``) is a reader's run: the chapter goes on and
    marks the sentence.

    Returns
    -------
    bool

    Raises
    ------
    InvalidInputError
        If the variable holds another word.

    Examples
    --------
    >>> import os
    >>> previous = os.environ.get("COMPANION_STRICT")
    >>> os.environ["COMPANION_STRICT"] = "0"
    >>> strict()
    False
    >>> os.environ["COMPANION_STRICT"] = "1"
    >>> strict()
    True
    >>> if previous is None: del os.environ["COMPANION_STRICT"]
    ... else: os.environ["COMPANION_STRICT"] = previous
    """
    word = os.environ.get(STRICT_ENV, "").strip().lower()
    if not word:
        return False
    if word not in _STRICT_WORDS:
        raise InvalidInputError(
            f"{STRICT_ENV}={os.environ[STRICT_ENV]!r} must be 1 (the book's build: a false claim stops "
            "the chapter) or 0 (a reader's run: it is marked and the chapter goes on)."
        )
    return _STRICT_WORDS[word]


def _stop_or_warn(error: type[Exception], stop: str, warn: str) -> None:
    """Stop the chapter with ``error(stop)`` (strict: the book's build) or say ``warn`` on stderr (a reader's run)."""
    import sys

    if strict():
        raise error(stop)
    print(f"companion: {warn}", file=sys.stderr)


def _does_not_hold(name: str, message: str) -> None:
    """Stop the chapter (strict) or say on stderr that ``name`` does not hold (a reader's run)."""
    _stop_or_warn(ClaimError, message, f"{name} does not hold for this run (a reader's run goes on): {message}")


def _nulls(x, where: str, found: dict):
    """``x`` (plain values) with every NaN and infinity replaced by None, each recorded in ``found``
    under its place (``value[2]``, ``value[a]``) as ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if isinstance(x, float) and not np.isfinite(x):
        found[where] = "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")
        return None
    if isinstance(x, list):
        return [_nulls(v, f"{where}[{i}]", found) for i, v in enumerate(x)]
    if isinstance(x, dict):
        return {k: _nulls(v, f"{where}[{k}]", found) for k, v in x.items()}
    return x


def _finite(entry: dict, note) -> dict:
    """``entry`` with NaN and infinities of ``value`` (and of a bound's ``measured`` value) stored
    as None, recorded under ``"nonfinite"``; with ``note``, the chapter's reason, if given."""
    found: dict = {}
    out = dict(entry, value=_nulls(entry["value"], "value", found))
    if isinstance(entry.get("measured"), dict):
        out["measured"] = dict(entry["measured"], value=_nulls(entry["measured"]["value"], "measured", found))
    if found:
        out["nonfinite"] = found
    if note is not None:
        if not isinstance(note, str) or not note.strip():
            raise InvalidInputError(f"note={note!r} must be a non-empty sentence saying what happened.")
        out["note"] = note
    return out


def not_holding(results) -> list[dict]:
    """The claims and bounds of a results file that did not hold for its run (a reader's run).

    Parameters
    ----------
    results : dict or path-like
        A results file (its path) or its content, as :func:`load` returns it.

    Returns
    -------
    list of dict
        One ``{"name", "kind", "text", "measured"}`` per entry recorded with ``"holds": false``,
        in the file's order; ``measured`` is the measured value's text for a bound, else None.

    Examples
    --------
    >>> data = {"values": {"a": {"kind": "claim", "holds": True, "text": "yes"},
    ...                    "b": {"kind": "bound", "holds": False, "text": "1e-07 (does not hold ...)",
    ...                          "measured": {"value": 2.25e-07, "text": "2.25e-07"}}}}
    >>> [(e["name"], e["measured"]) for e in not_holding(data)]
    [('b', '2.25e-07')]
    """
    data = results if isinstance(results, dict) else json.loads(Path(results).read_text(encoding="utf-8"))
    return [
        {
            "name": name,
            "kind": entry.get("kind"),
            "text": entry.get("text"),
            "measured": (entry.get("measured") or {}).get("text") if entry.get("kind") == "bound" else None,
        }
        for name, entry in data.get("values", {}).items()
        if isinstance(entry, dict) and entry.get("holds") is False
    ]


_state: dict = {"chapter": None, "parameters": {}, "seed": None, "failed": False, "before": None, "path": None}


def repo_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: the cwd, then the library) with ``_toc.yml``."""
    candidates = [Path.cwd() if start is None else Path(start), LIBRARY_DIR]
    for base in candidates:
        for folder in [base.resolve(), *base.resolve().parents]:
            if (folder / "_toc.yml").is_file() and (folder / "book").is_dir():
                return folder
    return None


def results_dir() -> Path:
    """Folder the results JSON files are written to: ``$COMPANION_RESULTS_DIR`` or ``<repo>/runs``.

    A relative ``$COMPANION_RESULTS_DIR`` is resolved against ``$PWD``, the folder the command
    was typed in (papermill's ``--cwd`` moves the kernel, not the shell's ``$PWD``).
    """
    env = os.environ.get("COMPANION_RESULTS_DIR")
    if env:
        path = Path(env).expanduser()
        if not path.is_absolute():
            pwd = os.environ.get("PWD")
            base = Path(pwd) if pwd and Path(pwd).is_absolute() and Path(pwd).is_dir() else Path.cwd()
            path = base / path
        return path
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "runs"


def _executed_notebook() -> Path | None:
    """The notebook this kernel's run writes, if the kernel knows it: papermill's ``--inject-output-path``
    (``PAPERMILL_OUTPUT_PATH`` in the kernel's namespace; relative to ``$PWD``, as typed)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return None
    out = shell.user_ns.get("PAPERMILL_OUTPUT_PATH") if shell is not None else None
    if not isinstance(out, str) or not out.endswith(".ipynb") or "://" in out:
        return None
    path = Path(out).expanduser()
    if not path.is_absolute():
        pwd = os.environ.get("PWD")
        path = (Path(pwd) if pwd and Path(pwd).is_absolute() else Path.cwd()) / path
    return path


def results_path(chapter: str) -> Path:
    """The results file a run of ``chapter`` starting now publishes into.

    ``$COMPANION_RESULTS_DIR/<chapter>.json`` if the variable is set; else, when the kernel knows
    the executed notebook (papermill's ``--inject-output-path``), that notebook's path with the
    suffix ``.json``; else a new file ``<repo>/runs/<chapter>-<UTC time>.json``, never an
    existing one. :func:`record_parameters` fixes it for the rest of the run.

    Parameters
    ----------
    chapter : str
        The chapter's file stem, e.g. ``"02_exact_learning"``.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    InvalidInputError
        If ``chapter`` is not a plain file stem.

    Examples
    --------
    >>> import os, tempfile
    >>> previous = os.environ.get("COMPANION_RESULTS_DIR")
    >>> os.environ["COMPANION_RESULTS_DIR"] = folder = tempfile.mkdtemp()
    >>> results_path("02_exact_learning") == Path(folder) / "02_exact_learning.json"
    True
    >>> del os.environ["COMPANION_RESULTS_DIR"]
    >>> a = results_path("02_exact_learning")
    >>> a.parent.name, a.name.startswith("02_exact_learning-") and a.suffix == ".json" and not a.exists()
    ('runs', True)
    >>> if previous is not None: os.environ["COMPANION_RESULTS_DIR"] = previous
    """
    chapter = _check_name(chapter, "chapter")
    if os.environ.get("COMPANION_RESULTS_DIR"):
        return results_dir() / f"{chapter}.json"
    notebook = _executed_notebook()
    if notebook is not None:
        return notebook.with_suffix(".json")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir() / f"{chapter}-{stamp}.json"
    k = 1
    while path.exists():
        k += 1
        path = results_dir() / f"{chapter}-{stamp}-{k}.json"
    return path


def book_results_dir() -> Path:
    """The committed ``<repo>/data/results``: the numbers of the committed chapters (``make execute``)."""
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "data" / "results"


def library_hash() -> str:
    """SHA-256 (first 16 hex digits) of every ``*.py`` file of the library, by relative path."""
    h = hashlib.sha256()
    for path in sorted(LIBRARY_DIR.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(LIBRARY_DIR).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _code_cells(text: str) -> list[str]:
    """The code cells' sources of a notebook's JSON text (outputs and prose left out)."""
    cells = json.loads(text).get("cells", [])
    return ["".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code"]


def _chapter_code_changed(root: Path, chapter: str | None) -> bool:
    """Whether ``book/chapters/<chapter>.ipynb``'s code differs from the commit's (outputs aside).

    A re-execution rewrites only outputs, so a chapter executed twice is not marked; an edit to a
    code cell, or a chapter not in the commit, is.
    """
    path = root / "book" / "chapters" / f"{chapter}.ipynb"
    if chapter is None or not path.is_file():
        return False
    committed = subprocess.run(
        ["git", "-C", str(root), "show", f"HEAD:book/chapters/{chapter}.ipynb"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if committed.returncode != 0:
        return True
    try:
        return _code_cells(committed.stdout) != _code_cells(path.read_text())
    except (ValueError, AttributeError):
        return True


def _git_commit(chapter: str | None = None) -> str | None:
    """``HEAD``'s hash, with ``-dirty`` when ``src`` or the chapter's code differs from it."""
    root = repo_root()
    if root is None:
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out + ("-dirty" if dirty or _chapter_code_changed(root, chapter) else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("companion", *_PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise InvalidInputError(f"{what}={name!r} must be a non-empty string of letters, digits, '_' or '-'.")
    return name


def _plain(value):
    """Convert NumPy scalars and arrays to plain Python values for JSON; reject the rest."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    raise InvalidInputError(
        f"cannot publish a value of type {type(value).__name__}; publish a number, a string, or a list or dict of them."
    )


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _path(chapter: str) -> Path:
    """The results file of ``chapter``: the one :func:`record_parameters` chose for this run, else
    ``results_dir()/<chapter>.json``."""
    if chapter == _state["chapter"] and _state["path"] is not None:
        return _state["path"]
    return results_dir() / f"{chapter}.json"


def record_parameters(chapter: str, namespace=None, /, *, seed=None, glue=True, **parameters) -> None:
    """Start a chapter's results file, recording its parameters; earlier values are discarded.

    A chapter calls ``results.record_parameters("05_robustness", globals())``: the names declared
    in its ``parameters`` cell are read from that cell, and their values from ``namespace`` (after
    papermill's injected values, if any), so that no list names every parameter again. Keywords
    (``seed=0, d=8, ...``) give the values directly instead.

    The file is chosen once here, by :func:`results_path` (``$COMPANION_RESULTS_DIR``, next to the
    executed notebook, or a new file in ``runs/``), and every later :func:`publish` of the chapter
    in this kernel writes into it.

    Every parameter (and ``seed``) is also glued under its own name, formatted as by
    :func:`publish`, so that the prose can cite the parameters a run used, e.g. ``{glue:text}`d```.

    Parameters
    ----------
    chapter : str
        The chapter's file stem, e.g. ``"02_exact_learning"``.
    namespace : mapping, default=None
        The chapter's variables (``globals()``): every parameter declared in its ``parameters``
        cell, ``seed`` included, is read from it. Not with ``seed`` or other keywords.
    seed : int, default=None
        The chapter's random seed (required without ``namespace``).
    glue : bool, default=True
        Glue the parameters with ``myst_nb.glue`` (turn off outside notebooks).
    **parameters
        The chapter's other parameters (JSON-serialisable).

    Raises
    ------
    InvalidInputError
        If the chapter name is not a plain file stem or a parameter is not serialisable; if
        ``namespace`` is given with keyword values, or neither it nor ``seed`` is given.
    ParameterError
        If ``namespace`` is given but the chapter's ``parameters`` cell is not found, or lacks a
        declared name. If a value breaks the constraint declared next to it in the chapter's ``parameters`` cell
        (:mod:`companion.book.parameters`), or the call misses a declared parameter; raised before
        anything is written. This is the check of plain papermill runs.

    Notes
    -----
    The declarations are read from the ``parameters`` cell this kernel executed (IPython's input
    history: papermill, nbval, Jupyter Book and a reader's Jupyter all keep it), else from
    ``book/chapters/<chapter>.ipynb`` of the repository; a chapter found in neither, or a call
    outside IPython, is not checked.
    """
    chapter = _check_name(chapter, "chapter")
    _state.update(path=None, failed=False)  # a refused call has no run to undo
    if namespace is not None:
        if seed is not None or parameters:
            raise InvalidInputError(
                "record_parameters(chapter, globals()) reads every parameter from the namespace; "
                "leave out the keywords, or pass them all as keywords without the namespace."
            )
        seed, parameters = _from_namespace(chapter, namespace)
    elif seed is None:
        raise InvalidInputError("record_parameters needs the chapter's namespace (globals()) or seed=...")
    _check_declared(chapter, {"seed": seed, **parameters})
    seed = check_int(seed, "seed", minimum=0)
    params = _plain(dict(parameters))
    path = results_path(chapter)
    before = path.read_bytes() if path.is_file() else None
    _state.update(chapter=chapter, parameters=params, seed=seed, failed=False, before=before, path=path)
    _watch_for_failure()
    _write_atomic(path, _header(chapter, params, seed) | {"values": {}})
    if glue:
        from myst_nb import glue as _glue

        for name, value in {"seed": seed, **parameters}.items():
            _glue(_check_name(name, "parameter name"), _format(value, None), display=False)


def _from_namespace(chapter: str, namespace) -> tuple:
    """``(seed, {name: value})`` of the parameters declared for ``chapter``, read from ``namespace``."""
    from ..errors import ParameterError

    decl = _declarations(chapter, outside_ipython=True)
    if decl is None:
        raise ParameterError(
            f"record_parameters({chapter!r}, globals()) cannot find the chapter's parameters cell (run "
            "it in the chapter's notebook, or from the repository); pass the parameters as keywords."
        )
    missing = [n for n in decl if n not in namespace]
    if missing:
        raise ParameterError(
            f"record_parameters({chapter!r}, globals()): {', '.join(missing)}, declared in the "
            "chapter's parameters cell, is not defined; run the parameters cell first."
        )
    values = {n: namespace[n] for n in decl}
    return values.pop("seed", None), values


def _declarations(chapter: str, *, outside_ipython: bool = False) -> dict | None:
    """The chapter's declared parameters: from the executed ``parameters`` cell (the latest input
    with a ``seed = ...`` line and a ``; must be`` constraint), else from its notebook file.
    Outside IPython (a script or a test), None unless ``outside_ipython``: then the file's."""
    from . import parameters

    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None and not outside_ipython:  # a script or a test: nothing declared to check against
        return None
    history = shell.history_manager.input_hist_raw if shell is not None else []
    for source in reversed(history):
        if "must be" in source and re.search(r"^seed\s*=", source, re.M):
            return parameters.declared(source)
    root = repo_root()
    nb_path = root / "book" / "chapters" / f"{chapter}.ipynb" if root is not None else None
    if nb_path is not None and nb_path.is_file():
        import nbformat

        cells = nbformat.read(nb_path, as_version=4).cells
        cell = next((c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)
        if cell is not None:
            return parameters.declared(cell.source)
    return None


def _check_declared(chapter: str, values: dict) -> None:
    from . import parameters
    from ..errors import ParameterError

    decl = _declarations(chapter)
    if decl is None:
        return
    missing = [n for n in decl if n not in values]
    if missing:
        raise ParameterError(
            f"record_parameters({chapter!r}, ...) misses {', '.join(missing)}, declared in the chapter's "
            "parameters cell: pass every parameter, so that it is checked and recorded."
        )
    parameters.check(decl, values, where=f"chapter {chapter} ")


def _watch_for_failure() -> None:
    """In IPython, put the results file back as it was if a later cell of this run raises."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return
    if shell is None or getattr(shell, "_companion_watch", False):
        return

    def after_cell(result):
        if _state["failed"] or _state["path"] is None or result.success:
            return
        _state["failed"] = True
        path = _state["path"]
        if _state["before"] is None:
            path.unlink(missing_ok=True)
        else:
            write_atomic(path, _state["before"])

    shell.events.register("post_run_cell", after_cell)
    shell._companion_watch = True


def _header(chapter, params, seed) -> dict:
    return {
        "chapter": chapter,
        "parameters": params,
        "seed": seed,
        "library_hash": library_hash(),
        "commit": _git_commit(chapter),
        "versions": _versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def round_up(x, digits: int = 1) -> str:
    """``x`` to ``digits`` significant digits, rounded up, for a sentence that says "up to" or "within".

    A measured error that moves with the seed is shown as this run's value rounded up, so that
    "the error is within {glue}" stays true for the run that printed it.

    Parameters
    ----------
    x : float
        A non-negative measured value.
    digits : int, default 1
        Significant digits shown (at least 1). As a ``fmt=`` of :func:`publish`, pass
        ``functools.partial(round_up, digits=2)`` for two.

    Returns
    -------
    str
        ``"{:.<digits - 1>e}"`` of the smallest ``digits``-digit value at or above ``x`` (a hair of
        relative slack, 1e-12, keeps an exact ``3e-10`` at ``3e-10``); ``"0"`` for 0;
        ``"nan"``/``"inf"`` as they are.

    Raises
    ------
    InvalidInputError
        If ``x`` is negative, or ``digits`` is not an integer of at least 1.

    Examples
    --------
    >>> round_up(2.3e-10), round_up(3e-10), round_up(9.01e-7), round_up(0.0), round_up(float("nan"))
    ('3e-10', '3e-10', '1e-06', '0', 'nan')
    >>> round_up(6.24e-3, digits=2), round_up(6.2e-3, digits=2), round_up(9.96e-3, digits=2)
    ('6.3e-03', '6.2e-03', '1.0e-02')
    """
    if isinstance(digits, bool) or not isinstance(digits, numbers.Integral) or digits < 1:
        raise InvalidInputError(f"round_up(digits={digits!r}): digits must be an integer of at least 1.")
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    if x < 0:
        raise InvalidInputError(f"round_up(x={x!r}): x must be non-negative (a measured error or size).")
    if x == 0:
        return "0"
    e = 10.0 ** (np.floor(np.log10(x)) - (int(digits) - 1))
    return f"{np.ceil(x / e * (1 - 1e-12)) * e:.{int(digits) - 1}e}"


def _format(value, fmt) -> str:
    if fmt is None:
        if isinstance(value, (bool, np.bool_)):
            return str(bool(value))
        if isinstance(value, numbers.Integral):
            return f"{int(value):,}"
        if isinstance(value, numbers.Real):
            return f"{float(value):.3g}"
        return str(value)
    if callable(fmt):
        return str(fmt(value))
    return fmt.format(_plain(value))


#: The kinds of published value: see :func:`publish`.
KINDS = ("exact", "measured", "bound")


def publish(
    name,
    value,
    *,
    fmt=None,
    chapter=None,
    glue=True,
    rtol=None,
    atol=None,
    kind=None,
    measured=None,
    lower=False,
    note=None,
) -> None:
    """Glue one cited number into the chapter and record it, with provenance, in the results JSON.

    Parameters
    ----------
    name : str
        Glue key, used in the prose as ``{glue:text}`name```; letters, digits, ``_`` and ``-``.
    value : int, float, str, bool, or a list/dict of them
        The value (NumPy scalars are converted to Python numbers first).
    fmt : str or callable, default=None
        Format of the glued text, e.g. ``"{:.2e}"`` or ``"{:,d}"``. By default integers get
        thousands separators and floats 3 significant digits.
    chapter : str, default=None
        Chapter stem; defaults to the one given to :func:`record_parameters`.
    glue : bool, default=True
        Glue the text with ``myst_nb.glue`` (turn off outside notebooks).
    rtol, atol : float, default=None
        The precision the value really has across machines (BLAS kernels, thread counts, CPUs):
        a re-run may give any ``x`` with ``|x - value| <= atol + rtol * |value|``. Leave both
        unset for a value that is exact on every machine (counts, ranks, parameters, choices);
        set them for rounding-level errors, bits of precision and solver iterates. They are stored
        with the value as ``"tolerance": {"rtol": ..., "atol": ...}``. For ``kind="bound"`` they
        are the precision of ``measured`` (the bound itself is a constant).
    kind : {"exact", "measured", "bound"}, default=None
        What the value is, stored as ``"kind"`` and quoted by ``companion cite``: ``"exact"``, the
        same on every machine; ``"measured"``, reproducible to ``rtol``/``atol`` (which it needs);
        ``"bound"``, a constant stated as an upper bound on a measured quantity, e.g. "the error
        is below 1e-12". By default ``"measured"`` if ``rtol`` or ``atol`` is given, else ``"exact"``.
    measured : float, default=None
        For ``kind="bound"`` only, and required there: the measured value the bound bounds, stored
        as ``"measured": {"value": ..., "text": ...}`` (with its tolerance). It must satisfy the
        bound, ``|measured| <= value`` (``measured >= value`` for a lower bound); a NaN never
        does. The entry records ``"holds": true`` or ``false``. When it does not hold: in the
        book's build (``COMPANION_STRICT=1``, :func:`strict`) :class:`~companion.errors.ClaimError`
        stops the chapter; in a reader's run the chapter goes on and the glued text is marked,
        ``"1e-07 (does not hold for this run: measured 2.25e-07 against 1e-07)"``.
    lower : bool, default=False
        For ``kind="bound"``: the value is a lower bound ("at least 40 bits"), stored as
        ``"bound": "lower"``; by default an upper bound, ``"bound": "upper"``.
    note : str, default=None
        A sentence saying what happened, stored as ``"note"``: why a value is NaN or infinite
        (stored as ``null`` with ``"nonfinite"``, see the module's docstring), e.g. "no trial of
        this case recovered the target".

    Raises
    ------
    InvalidInputError
        If no chapter is known, the name is not a plain key, the value is not serialisable, a
        tolerance is negative, NaN, or given for a value that is not a real number, ``kind`` is not
        one of :data:`KINDS`, ``"measured"`` comes without a tolerance or ``"exact"`` with one, or
        ``measured`` is missing for a bound (or given for another kind, or not a real number), or
        ``note`` is not a non-empty string; or, in the book's build (``COMPANION_STRICT=1``), if
        ``name`` was published earlier in this run of the chapter with another entry (two cells
        sharing a key: the prose would cite the later value for both; a reader's run warns on
        stderr and keeps the later one). Republishing the same entry is allowed.
    ClaimError
        If ``kind="bound"``, the measured value breaks the bound (the sentence stating it would be
        false) and the run is the book's build (``COMPANION_STRICT=1``).

    Examples
    --------
    >>> import os, tempfile
    >>> previous = os.environ.get("COMPANION_RESULTS_DIR")
    >>> os.environ["COMPANION_RESULTS_DIR"] = tempfile.mkdtemp()
    >>> record_parameters("demo", seed=0, d=4, glue=False)
    >>> publish("n", 20, glue=False)
    >>> load("demo")["values"]["n"]
    {'kind': 'exact', 'text': '20', 'value': 20}
    >>> publish("err_bound", 1e-12, kind="bound", measured=1.1e-15, rtol=0.5, glue=False)
    >>> entry = load("demo")["values"]["err_bound"]
    >>> entry["kind"], entry["text"], entry["measured"]["text"], entry["measured"]["value"] <= entry["value"]
    ('bound', '1e-12', '1.1e-15', True)
    >>> if previous is None: del os.environ["COMPANION_RESULTS_DIR"]
    ... else: os.environ["COMPANION_RESULTS_DIR"] = previous
    """
    name = _check_name(name, "name")
    chapter = _chapter(chapter, "publish")
    plain = _plain(value)
    text = _format(value, fmt)
    kind, measured_entry = _kind(name, plain, kind, measured, rtol, atol, lower)
    tolerance = _tolerance(plain if measured_entry is None else measured_entry["value"], rtol, atol)
    holds = None
    if measured_entry is not None:
        if tolerance:
            measured_entry["tolerance"] = tolerance
        tolerance = None  # the bound itself is a constant, exact on every machine
        holds = measured_entry.pop("holds")
        if not holds:
            # The check is against the bound itself: a text rounded up (fmt=round_up) would show
            # "measured 1.34e-14 against 2e-14" for a bound of 1.2e-14; the mark says 1.2e-14.
            shown = _apart(measured_entry["value"], plain)
            bound = text if _is_number_text(text, plain) else _apart(plain, measured_entry["value"])
            against = f", below {bound}" if lower else f" against {bound}"
            text = f"{text} (does not hold for this run: measured {shown}{against})"
    entry = {"value": plain, "text": text, "kind": kind}
    entry |= {"tolerance": tolerance} if tolerance else {}
    entry |= {"measured": measured_entry, "bound": "lower" if lower else "upper"} if measured_entry is not None else {}
    entry |= {"holds": holds} if holds is not None else {}
    _record(name, text, _finite(entry, note), chapter, glue)


def publish_below(name, value, bound, *, chapter=None, glue=True) -> None:
    """Publish a rounding-level number as the bound "below <bound>", with the value it bounds.

    The prose shows ``below 1e-14``; the results JSON records the bound and the measured value,
    and the call refuses a value that breaks the bound (as ``publish(..., kind="bound")``).

    Parameters
    ----------
    name : str
        Glue key, as for :func:`publish`.
    value : float
        The measured number (an error at rounding level), at most ``bound``.
    bound : float
        The bound the prose states, shown with one significant digit.
    chapter : str, default=None
    glue : bool, default=True
        As for :func:`publish`.

    Raises
    ------
    ClaimError
        If ``value`` exceeds ``bound`` (a ``DoesNotHold`` warning instead in a reader's run).

    Examples
    --------
    >>> import os, tempfile
    >>> previous = os.environ.get("COMPANION_RESULTS_DIR")
    >>> os.environ["COMPANION_RESULTS_DIR"] = tempfile.mkdtemp()
    >>> publish_below("gap", 3e-16, 1e-14, chapter="99_demo", glue=False)
    >>> load("99_demo")["values"]["gap"]["text"]
    'below 1e-14'
    >>> if previous is None: del os.environ["COMPANION_RESULTS_DIR"]
    ... else: os.environ["COMPANION_RESULTS_DIR"] = previous
    """
    publish(name, bound, fmt="below {:.0e}", chapter=chapter, glue=glue, kind="bound", measured=value, atol=bound)


def _kind(name, plain, kind, measured, rtol, atol, lower=False):
    """The published value's kind and, for a bound, its checked ``measured`` entry."""
    has_tol = rtol is not None or atol is not None
    if kind is None:
        kind = "measured" if has_tol else "exact"
    if kind not in KINDS:
        raise InvalidInputError(f"kind={kind!r} of {name!r} must be one of {', '.join(map(repr, KINDS))}.")
    if kind != "bound":
        if lower:
            raise InvalidInputError(f"lower=True is for kind='bound' only; {name!r} has kind={kind!r}.")
        if measured is not None:
            raise InvalidInputError(
                f"measured= is for kind='bound' only; {name!r} has kind={kind!r}. Publish the measured "
                "value under its own name, or publish this one as a bound."
            )
        if kind == "measured" and not has_tol:
            raise InvalidInputError(
                f"{name!r} has kind='measured' but no rtol/atol: give the precision it has across "
                "machines, or publish it as kind='exact' if it is the same on every machine."
            )
        if kind == "exact" and has_tol:
            raise InvalidInputError(
                f"{name!r} has kind='exact' but rtol={rtol!r}, atol={atol!r}: an exact value has no "
                "tolerance; use kind='measured'."
            )
        return kind, None
    if isinstance(plain, bool) or not isinstance(plain, (int, float)):
        raise InvalidInputError(f"a bound must be a real number; {name!r} is {plain!r}.")
    if measured is None:
        raise InvalidInputError(
            f"{name!r} has kind='bound' but no measured=: pass the measured value the bound bounds, "
            "so that a citer can quote both."
        )
    if isinstance(measured, (bool, np.bool_)) or not isinstance(measured, numbers.Real):
        raise InvalidInputError(f"measured={measured!r} of the bound {name!r} must be a real number.")
    measured = float(measured)
    holds = bool(measured >= plain) if lower else bool(abs(measured) <= plain)  # NaN: never
    if not holds:
        _does_not_hold(
            name,
            f"the {'lower ' if lower else ''}bound {name!r} = {plain:g} is false: the measured value "
            f"{_apart(measured, plain)} {'is below it' if lower else 'exceeds it in magnitude'}. The sentence that "
            "states it would be false; fix the bound or the run (a reader's run, without "
            f"{STRICT_ENV}=1, goes on and marks it).",
        )
    return kind, {"value": measured, "text": _format(measured, None), "holds": holds}


def _is_number_text(text: str, value) -> bool:
    """True if ``text`` reads back as exactly ``value`` (the bound is shown as it is checked)."""
    try:
        return float(text.replace(",", "")) == float(value)
    except (TypeError, ValueError):
        return False


def _apart(measured: float, bound: float) -> str:
    """``measured`` to 3 significant digits, or to as many more as show it apart from ``bound``
    (1.0000001e-07 against 1e-07, not 1e-07 against 1e-07)."""
    for digits in range(3, 18):
        if f"{measured:.{digits}g}" != f"{bound:.{digits}g}":
            return f"{measured:.{digits}g}"
    return f"{measured!r}"


def _record(name, text, entry, chapter, glue) -> None:
    """Write ``entry`` under ``name`` into the chapter's results file (unless the run failed) and glue."""
    path = _path(chapter)
    if _state["failed"] and chapter == _state["chapter"]:
        if glue:  # an earlier cell of this run failed: its results file stays as it was
            from myst_nb import glue as _glue

            _glue(name, text, display=False)
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        same = chapter == _state["chapter"]
        data = _header(chapter, _state["parameters"] if same else {}, _state["seed"] if same else None) | {"values": {}}
    earlier = data["values"].get(name)
    if earlier is not None and earlier != entry and chapter == _state["chapter"] and _state["path"] is not None:
        # two cells of one run publishing one key: the prose cites the last value for both (a collision)
        message = (
            f"glue key {name!r} was published earlier in this run of {chapter} as {earlier.get('text')!r} and now "
            f"as {text!r}: the prose would cite the later value wherever it names the key; give one of the two "
            "another name"
        )
        _stop_or_warn(
            InvalidInputError,
            message + " (nothing of this call was written).",
            message + " (a reader's run goes on with the later value).",
        )
    data["values"][name] = entry
    _write_atomic(path, data)
    if glue:
        from myst_nb import glue as _glue

        _glue(name, text, display=False)


def claim(name, holds, *, text, chapter=None, value=None, glue=True, rtol=None, atol=None) -> None:
    """Check one verdict the prose states; glue the text it shows, or stop the chapter.

    A sentence such as "every trial succeeds" or "the learner asked exactly d + d² queries" is a
    check that runs when the chapter executes. When ``holds`` is true, ``text`` (the value the
    sentence shows, e.g. ``"4,160"`` or ``"10 of 10"``) is glued under ``name``, to be shown in
    prose with ``{glue:text}`name```, and recorded in the results JSON as
    ``{"kind": "claim", "holds": true, "text": ..., "value": ...}`` with the provenance of
    :func:`publish`. When it is false, in the book's build (``COMPANION_STRICT=1``, :func:`strict`:
    ``make book``, ``make execute``, ``make test``) :class:`~companion.errors.ClaimError` stops the
    chapter: its results file is put back as it was, and the book does not build. In a reader's
    run (the variable unset or ``0``) the chapter goes on: the glued text becomes
    ``"<text> (does not hold for this run)"``, a line on stderr says so, and the JSON records
    ``"holds": false``.

    Parameters
    ----------
    name : str
        Glue key; letters, digits, ``_`` and ``-``.
    holds : bool or ``numpy.bool_``
        The checked condition, e.g. ``rec.n_learning_queries == d + d * d``. Anything else (an
        array, a number, None) is refused: a claim is one truth value, not a truthy object.
    text : str
        What the sentence shows, e.g. ``f"{rec.n_learning_queries:,}"``.
    chapter : str, default=None
        Chapter stem; defaults to the one given to :func:`record_parameters`.
    value : int, float, str, bool, or a list/dict of them, default=None
        The number behind ``text``, stored for citers; by default ``text`` itself.
    glue : bool, default=True
        Glue the text with ``myst_nb.glue`` (turn off outside notebooks).
    rtol, atol : float, default=None
        The precision of ``value`` across machines, if it is a measured number (as for :func:`publish`).

    Raises
    ------
    ClaimError
        If ``holds`` is false in the book's build (``COMPANION_STRICT=1``); the message names the
        claim, the chapter and the text.
    InvalidInputError
        If ``holds`` is not a Python or NumPy bool, ``text`` is not a string, no chapter is known,
        or the name is not a plain key.

    Examples
    --------
    >>> import os, tempfile
    >>> previous = os.environ.get("COMPANION_RESULTS_DIR")
    >>> os.environ["COMPANION_RESULTS_DIR"] = tempfile.mkdtemp()
    >>> record_parameters("demo", seed=0, d=4, glue=False)
    >>> n, d = 20, 4
    >>> claim("count_is_formula", n == d + d * d, text=f"{n:,}", value=n, glue=False)
    >>> load("demo")["values"]["count_is_formula"]
    {'holds': True, 'kind': 'claim', 'text': '20', 'value': 20}
    >>> strict_before = os.environ.get("COMPANION_STRICT")
    >>> os.environ["COMPANION_STRICT"] = "1"                       # the book's build
    >>> try:
    ...     claim("count_is_formula", n == d * d, text=f"{n:,}", glue=False)
    ... except ClaimError as exc:
    ...     print(str(exc)[:54])
    claim 'count_is_formula' of chapter demo is false: the
    >>> os.environ["COMPANION_STRICT"] = "0"                       # a reader's run
    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()):
    ...     claim("count_is_formula", n == d * d, text=f"{n:,}", value=n, glue=False)
    >>> load("demo")["values"]["count_is_formula"]
    {'holds': False, 'kind': 'claim', 'text': '20 (does not hold for this run)', 'value': 20}
    >>> if strict_before is None: del os.environ["COMPANION_STRICT"]
    ... else: os.environ["COMPANION_STRICT"] = strict_before
    >>> if previous is None: del os.environ["COMPANION_RESULTS_DIR"]
    ... else: os.environ["COMPANION_RESULTS_DIR"] = previous
    """
    name = _check_name(name, "name")
    if not isinstance(holds, (bool, np.bool_)):
        raise InvalidInputError(
            f"claim {name!r}: holds={holds!r} (type {type(holds).__name__}) must be a Python or NumPy "
            "bool; reduce an array with .all() or .any(), compare a number explicitly."
        )
    if not isinstance(text, str):
        raise InvalidInputError(f"claim {name!r}: text={text!r} must be the string the sentence shows.")
    chapter = _chapter(chapter, "claim")
    plain = _plain(text if value is None else value)
    tolerance = _tolerance(plain, rtol, atol)
    if not bool(holds):
        _does_not_hold(
            name,
            f"claim {name!r} of chapter {chapter} is false: the sentence that shows {text!r} "
            f"(glue {name!r}) does not hold for this run. Its parameters or the library changed what "
            "the sentence states: fix the sentence, or the run (a reader's run, without "
            f"{STRICT_ENV}=1, goes on and marks it).",
        )
        text = f"{text} (does not hold for this run)"
    entry = {"value": plain, "text": text, "kind": "claim", "holds": bool(holds)}
    entry |= {"tolerance": tolerance} if tolerance else {}
    _record(name, text, _finite(entry, None), chapter, glue)


def _chapter(chapter, what) -> str:
    chapter = chapter if chapter is not None else _state["chapter"]
    if chapter is None:
        raise InvalidInputError(
            f"{what}() does not know the chapter: call record_parameters(chapter, seed=..., ...) "
            "first, or pass chapter=..."
        )
    return _check_name(chapter, "chapter")


def _tolerance(plain, rtol, atol) -> dict | None:
    """``{"rtol": r, "atol": a}`` from :func:`publish`'s arguments, or None for an exact value."""
    if rtol is None and atol is None:
        return None
    if isinstance(plain, bool) or not isinstance(plain, (int, float)):
        raise InvalidInputError(
            f"rtol/atol apply to real numbers only; got a value of type {type(plain).__name__}. "
            "Publish non-numbers without a tolerance."
        )
    out = {}
    for key, tol in (("rtol", rtol), ("atol", atol)):
        tol = 0.0 if tol is None else tol
        if (
            isinstance(tol, bool)
            or not isinstance(tol, numbers.Real)
            or not (float(tol) >= 0.0)
            or not np.isfinite(float(tol))
        ):
            raise InvalidInputError(f"{key}={tol!r} must be a finite real number >= 0.")
        out[key] = float(tol)
    return out


def load(chapter: str) -> dict:
    """Read ``<results dir>/<chapter>.json``.

    Raises
    ------
    FileNotFoundError
        If the chapter has not published anything there yet (run it first).
    """
    return json.loads(_path(_check_name(chapter, "chapter")).read_text(encoding="utf-8"))


def clear_stale_cache(build_dir) -> bool:
    """Delete Jupyter Book's execution cache if the library changed since the last build.

    jupyter-cache decides whether to re-execute a notebook from the notebook's code cells only, so an
    edit to ``src/companion`` would leave every chapter's outputs stale. The hash of the library
    (:func:`library_hash`) of the last finished build is kept in ``<build_dir>/.library-hash``
    (:func:`mark_built`); when it differs, the cache folder ``<build_dir>/.jupyter_cache`` is
    removed, and the build must read every page afresh (``jupyter-book build --all``: Sphinx
    re-reads only pages whose source changed), so that every chapter is re-executed.

    Parameters
    ----------
    build_dir : path-like
        Jupyter Book's build folder, ``_build`` by default.

    Returns
    -------
    bool
        True if a cache was removed (or none existed for a new hash), False if it is current.
    """
    import shutil

    build = Path(build_dir)
    build.mkdir(parents=True, exist_ok=True)
    stamp = build / ".library-hash"
    current = library_hash()
    previous = stamp.read_text().strip() if stamp.is_file() else None
    if previous == current:
        return False
    shutil.rmtree(build / ".jupyter_cache", ignore_errors=True)
    return True


def mark_built(build_dir) -> None:
    """Record the library hash of a finished build in ``<build_dir>/.library-hash``."""
    build = Path(build_dir)
    build.mkdir(parents=True, exist_ok=True)
    (build / ".library-hash").write_text(library_hash() + "\n")


def provenance(name, parameters, seed, *, chapter=None) -> dict:
    """The provenance header of a results file written outside :func:`publish` (sweeps, benchmarks).

    Parameters
    ----------
    name : str
        Name of the file's content (letters, digits, ``_``, ``-``), e.g. ``"bench_scale"``.
    parameters : dict
        The parameters that made it; NumPy values are converted to plain Python values.
    seed : int or None
        The seed, if any.
    chapter : str, default=None
        The chapter it belongs to; default ``name``.

    Returns
    -------
    dict
        ``chapter``, ``parameters``, ``seed``, ``library_hash``, ``commit`` (``-dirty`` when
        ``src`` or the chapter's code cells have uncommitted changes; None outside a git checkout),
        ``versions`` of the key
        packages and ``created`` (UTC, ISO 8601): the same header as a chapter's results file.

    Raises
    ------
    InvalidInputError
        If ``name`` (or ``chapter``) is not a non-empty string of letters, digits, ``_`` or ``-``,
        or a parameter is not a number, a string, or a list or dict of them.

    Examples
    --------
    >>> header = provenance("bench_demo", {"d": 4}, 0)
    >>> header["chapter"], header["parameters"], header["library_hash"] == library_hash()
    ('bench_demo', {'d': 4}, True)
    """
    name = _check_name(name, "name")
    chapter = name if chapter is None else _check_name(chapter, "chapter")
    return _header(chapter, _plain(dict(parameters)), seed)


def write_json(path, data, *, nonfinite="refuse") -> Path:
    """Write ``data`` to ``path`` as indented JSON with sorted keys, atomically.

    The file is written next to ``path`` and renamed over it, so a reader never sees half a file
    and a failure leaves the old file as it was. NumPy scalars and arrays are converted to plain
    values (as :func:`publish` converts them); NaN and infinity are refused, or stored as null.

    Parameters
    ----------
    path : str or Path
        The file; its folder is created if missing.
    data : dict
        Numbers, strings, None, and lists or dicts of them.
    nonfinite : {"refuse", "null"}, default="refuse"
        ``"null"``: store each NaN or infinity as ``null`` and say where in a top-level
        ``"nonfinite"`` (``{"rows[3][error]": "nan"}``), as :func:`publish` does (a sweep whose
        trial found no estimate); ``"refuse"``: raise ``ValueError``.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    InvalidInputError
        If a value is of another type, or ``nonfinite`` is neither ``"refuse"`` nor ``"null"``.
    ValueError
        If a value is NaN or infinite (JSON has no such number) and ``nonfinite="refuse"``.

    Examples
    --------
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "sweep.json"
    >>> _ = write_json(path, {"rows": [{"error": float("nan")}, {"error": 1e-15}]}, nonfinite="null")
    >>> json.loads(path.read_text())
    {'nonfinite': {'rows[0][error]': 'nan'}, 'rows': [{'error': None}, {'error': 1e-15}]}
    """
    if nonfinite not in ("refuse", "null"):
        raise InvalidInputError(f"nonfinite={nonfinite!r} must be 'refuse' or 'null'.")
    path = Path(path)
    plain = _plain(data)
    if nonfinite == "null":
        found: dict = {}
        plain = {k: _nulls(v, k, found) for k, v in plain.items()}
        plain |= {"nonfinite": found} if found else {}
    _write_atomic(path, plain)
    return path
