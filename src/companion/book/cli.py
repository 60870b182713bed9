"""The ``companion`` command: list, run and build the chapters; cite one published number.

::

    companion list                                   # every chapter, its parameters and defaults
    companion run 02_exact_learning -p d_values "[16, 64]" -p seed 3 -o runs/
    companion run 05_robustness -f params.yaml --timeout 1200
    companion run 02 -p seed 3 --html                # also a page of the run, its numbers in the text
    companion run 02 -p seed 4 --overwrite --strict  # replace the run in runs/; exit 1 if a claim fails
    companion cite 02_exact_learning sweep_worst_W   # a citation line with provenance
    companion cite 02_exact_learning                 # every name it published, one a line
    companion compare runs/02_exact_learning.ipynb   # a run's outputs against the committed ones
    companion build                                  # the HTML book (jupyter-book build)
    companion build -o DIR                           # into DIR/_build (a read-only checkout)

``run`` executes a chapter through papermill, after checking every ``-p NAME VALUE`` (and every
entry of a ``-f params.yaml`` file) against the chapter's ``parameters`` cell: an unknown name, a
value of the wrong type or one outside the constraint declared next to the parameter
(:mod:`companion.book.parameters`) is refused in one line before anything runs (plain papermill only
warns). Values are read as YAML (``3``, ``0.5``, ``1e-3``, ``true``, ``"[4, 8]"``); a float
parameter also takes ``1e-3`` inside a list, which YAML 1.1 reads as a string; only ``true`` and
``false`` are booleans. Each cell has the book's time limit (600 s) unless ``--timeout`` says
otherwise. The notebook and its results file are put in place together, only when every cell ran
(:func:`run_chapter`); a run that fails, times out or is stopped (SIGINT, SIGTERM) says in one line
what it kept. A folder that holds a finished run of the chapter is refused unless ``--overwrite``
is given. ``run`` and ``build`` need the ``[book]`` extra and say so in one line without it.

``run`` is a reader's run: a claim or bound of the chapter that does not hold for the run's
parameters is marked in the text and recorded with ``"holds": false``, and the chapter goes on
(:mod:`companion.book.results`; unless ``COMPANION_STRICT=1`` is set, as the book's build sets it).
``run`` ends with a list of those; it exits 0, or 1 with ``--strict``. ``build`` is strict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import ParameterError
from ._render import book_root as _root
from ._render import render_run
from ._render import require_extra as _require

__all__ = [
    "main",
    "chapters",
    "chapter_parameters",
    "check_parameters",
    "book_timeout",
    "run_chapter",
    "cite",
    "RunIncomplete",
    "cached_without_figures",
    "render_run",
    "compare_run",
]


def chapters() -> dict[str, Path]:
    """Every chapter notebook, by file stem, in order."""
    folder = _root() / "book" / "chapters"
    return {p.stem: p for p in sorted(folder.glob("[0-9][0-9]_*.ipynb"))}


def _resolve(chapter: str) -> Path:
    found = chapters()
    if chapter in found:
        return found[chapter]
    matches = [p for stem, p in found.items() if stem.startswith(chapter)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ParameterError(
            f"chapter {chapter!r} is ambiguous: it starts {', '.join(p.stem for p in matches)}; give more of the name."
        )
    raise ParameterError(
        f"unknown chapter {chapter!r}; choose one of: {', '.join(found)} (a unique prefix such as '02' also works)."
    )


def _parameters_cell(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return next((c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)


def chapter_parameters(chapter: str) -> dict:
    """The parameters of a chapter's ``parameters`` cell: name -> {"default", "type", "help", "spec"}.

    Read as papermill reads them (:func:`companion.book.parameters.declared`); the default is evaluated
    with :func:`ast.literal_eval` and gives the parameter's type; ``spec`` is the constraint after
    ``; must be`` in the comment (None if there is none).

    Raises
    ------
    ParameterError
        If papermill would drop a line of the cell or a constraint cannot be read.
    """
    from . import parameters

    path = _resolve(chapter)
    cell = _parameters_cell(path)
    try:
        decl = parameters.declared(cell.source if cell is not None else "")
    except ParameterError as exc:
        raise ParameterError(f"{path.stem}: {exc}") from None
    return {
        name: {
            "default": info["default"],
            "type": type(info["default"]).__name__,
            "help": info["help"],
            "spec": info["spec_text"],
        }
        for name, info in decl.items()
    }


def _yaml_loader():
    """PyYAML's safe loader with the booleans of YAML 1.2: only ``true``/``false`` (any case).

    YAML 1.1 also reads ``yes``, ``no``, ``on``, ``off``, ``y`` and ``n`` as booleans, so that
    ``-p minilm_noisy yes`` would switch a five-minute section on; here they stay strings, which
    a bool parameter refuses.
    """
    import re as _re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", _re.compile(r"^(?:[Tt]rue|TRUE|[Ff]alse|FALSE)$"), list("tTfF")
    )
    return Loader


def _yaml_load(text: str):
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def _parse_value(text: str):
    """A ``-p`` value read as YAML; strings that read as numbers become numbers (``1e-3``); only
    ``true``/``false`` are booleans."""
    import yaml

    try:
        value = _yaml_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            return value
    return value


def check_parameters(chapter: str, given: dict) -> dict:
    """Check ``given`` against the chapter's declared parameters; return the converted values.

    Names, types (an int where a float is expected is converted; ``'1e-3'`` read as a string by
    YAML becomes a float) and the constraints declared next to each parameter are checked
    (:mod:`companion.book.parameters`).

    Raises
    ------
    ParameterError
        One line: an unknown name (listing the valid ones), or the parameter, what it must be and
        its default.
    """
    from . import parameters

    path = _resolve(chapter)
    cell = _parameters_cell(path)
    decl = parameters.declared(cell.source if cell is not None else "")
    return parameters.check(decl, given, where=f"chapter {path.stem} ")


def book_timeout() -> int:
    """The book's execution time limit per cell, ``execute.timeout`` of ``_config.yml`` (600 s)."""
    import yaml

    try:
        config = yaml.safe_load((_root() / "_config.yml").read_text(encoding="utf-8"))
        return int(config["execute"]["timeout"])
    except (OSError, KeyError, TypeError, ValueError):
        return 600


class RunIncomplete(ParameterError):
    """A ``companion run`` that did not finish: the earlier pair is untouched (``.kept`` says what is kept).

    ``signal`` is the name of the signal that stopped it (``"SIGINT"``, ``"SIGTERM"``), else None.
    """

    def __init__(self, message, *, kept=None, signal=None):
        super().__init__(message)
        self.kept = kept
        self.signal = signal


def _writable_folder(folder, alternative: str) -> Path:
    """``folder``, created if needed, after checking that a file can be written in it.

    Raises
    ------
    ParameterError
        One line naming the folder, the reason (read-only file system, permission) and ``alternative``.
    """
    import tempfile

    folder = Path(folder).resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ParameterError(f"cannot write into {folder} ({exc.strerror or exc}); {alternative}") from None
    return folder


class _Lock:
    """An exclusive lock on ``folder/.<stem>.lock`` (``fcntl.flock``), so that two runs of one chapter
    into one folder cannot replace each other's results; removed when the run ends."""

    def __init__(self, folder: Path, stem: str):
        self.path = folder / f".{stem}.lock"
        self.stem = stem
        self.file = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover (Windows: no lock)
            return self
        while True:
            f = open(self.path, "a+", encoding="utf-8")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                pid = f.read().strip() or "?"
                f.close()
                raise ParameterError(
                    f"another companion run of {self.stem} (pid {pid}) is writing into {self.path.parent}; "
                    "wait for it to finish, or give this run another folder with -o DIR."
                ) from None
            try:  # the file we locked may have been removed by a run that just ended
                same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self.file = f
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.path.unlink(missing_ok=True)
            self.file.close()
        return False


def _supervise(cmd, env) -> str | None:
    """Run ``cmd`` in its own session; on SIGINT/SIGTERM stop it. Returns the signal's name, or None."""
    import signal

    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    got = []

    def stop(signum, frame):
        got.append(signal.Signals(signum).name)
        if proc.poll() is None:
            proc.terminate()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                proc.wait()
                break
            except InterruptedError:  # pragma: no cover
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return got[0] if got else None


def _cells_done(nb_path: Path) -> tuple[int, int] | None:
    """(code cells executed, code cells) of a partly executed notebook, or None if it is unreadable."""
    try:
        cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return None
    code = [
        c
        for c in cells
        if c.get("cell_type") == "code" and "injected-parameters" not in c.get("metadata", {}).get("tags", [])
    ]
    done = sum(
        1
        for c in code
        if c.get("execution_count") is not None
        and c.get("metadata", {}).get("papermill", {}).get("status") != "running"
    )
    return done, len(code)


def _failing_line(nb_path: Path) -> str | None:
    """The source line a partly executed notebook's error points at (IPython's ``---->`` line), or None.

    An exception without a message (a bare ``assert``) says nothing by its name alone; the line
    that raised it does.
    """
    import re

    try:
        cells = json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return None
    for cell in cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error":
                continue
            lines = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", []))).splitlines()
            marked = [m.group(1).strip() for m in map(re.compile(r"^-+>\s*\d+\s(.*)$").match, lines) if m]
            if marked:
                return marked[-1]
    return None


def _seconds(timeout) -> int:
    """A time limit per cell in whole seconds, rounded up (nbclient takes an int and reads 0 or a
    negative number as no limit at all).

    Raises
    ------
    ParameterError
        If ``timeout`` is not a finite number above 0.
    """
    import math

    try:
        value = float(timeout)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ParameterError(
            f"--timeout {timeout} must be a number of seconds in (0, inf) (the time limit per cell; "
            f"default the book's {book_timeout()} s); give a large one, e.g. --timeout 3600, for a long run."
        )
    return math.ceil(value)


def run_chapter(
    chapter: str, parameters: dict, output_dir, *, progress_bar=True, timeout=None, overwrite=False
) -> Path:
    """Execute a chapter with checked parameters through papermill; publish its notebook and results together.

    The executed notebook goes to ``output_dir/<chapter>.ipynb`` and its results JSON, named after
    it, to ``output_dir/<chapter>.json``. The chapter runs into the staging folder
    ``output_dir/<chapter>.running/`` (its results too); the pair replaces the earlier one only
    when every cell ran. A run that stops (a cell's error, the time limit, SIGINT or SIGTERM)
    leaves the earlier pair as it was, keeps its partly executed notebook as
    ``output_dir/<chapter>.incomplete.ipynb`` (with the traceback) and discards its partial results.
    A folder that already holds a finished run of the chapter (its notebook or results file) is
    refused before anything runs, unless ``overwrite``. A run that finishes removes what described
    the run it replaces: an earlier ``<chapter>.incomplete.ipynb`` and the page ``<chapter>_html/``
    (``--html`` renders it afresh). Returns the notebook's path.

    Claims and bounds that do not hold for the run do not stop it (a reader's run, unless
    ``COMPANION_STRICT=1`` is set in the environment): :func:`companion.book.results.not_holding` of
    the results file lists them.

    Parameters
    ----------
    chapter : str
        Chapter stem or unique prefix.
    parameters : dict
        Parameter name -> value, checked first (:func:`check_parameters`).
    output_dir : path-like
        Folder of the run (created if needed).
    progress_bar : bool, default=True
        Papermill's progress bar, on stderr.
    timeout : float, default=None
        Time limit in seconds for each cell, in (0, inf), rounded up to whole seconds; by default
        the book's (:func:`companion.book.cli.book_timeout`, 600 s).
    overwrite : bool, default=False
        Replace a finished run of the chapter in ``output_dir`` (``companion run --overwrite``).

    Raises
    ------
    ParameterError
        Before anything runs: a bad parameter or ``timeout``, a folder that cannot be written (read-only
        checkout: give another with ``-o``), another run of this chapter into the same folder, a
        finished run of it there without ``overwrite``, or
        an installation without a Jupyter kernel.
    RunIncomplete
        The run did not finish; the message says why and what was kept.
    """
    import shutil
    import tempfile

    path = _resolve(chapter)
    params = check_parameters(path.stem, parameters)
    _require(("ipykernel", "myst_nb"), "book", "companion run (a Jupyter kernel and myst-nb's glue)")
    limit = _seconds(timeout) if timeout is not None else book_timeout()
    out_dir = _writable_folder(output_dir, "give a writable folder for the run with -o DIR")
    out_nb = out_dir / path.name
    out_json = out_nb.with_suffix(".json")
    incomplete = out_dir / f"{path.stem}.incomplete.ipynb"
    with _Lock(out_dir, path.stem):
        if not overwrite and (out_nb.exists() or out_json.exists()):
            there = " and ".join(p.name for p in (out_nb, out_json) if p.exists())
            raise ParameterError(
                f"{out_dir} already holds a finished run of {path.stem} ({there}); give --overwrite "
                "to replace it, or another folder for this run with -o DIR."
            )
        staging = out_dir / f"{path.stem}.running"
        shutil.rmtree(staging, ignore_errors=True)  # a run killed with SIGKILL left it
        staging.mkdir()
        private = Path(tempfile.mkdtemp(prefix="companion-run-"))
        try:
            spec = {
                "input": str(path),
                "output": str(staging / path.name),
                "parameters": params,
                "cwd": str(path.parent),
                "progress_bar": bool(progress_bar),
                "timeout": limit,
                "status": str(private / "status.json"),
                "runtime": str(private),
            }
            (private / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            env = dict(
                os.environ, COMPANION_RESULTS_DIR=str(staging), JUPYTER_RUNTIME_DIR=str(private), PYTHONUNBUFFERED="1"
            )
            stopped = _supervise([sys.executable, "-m", "companion.book._execute", str(private / "spec.json")], env)
            try:
                status = json.loads((private / "status.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                status = {"ok": False, "ename": None}
            done = staging / path.name
            if status.get("ok") and stopped is None and done.is_file():
                made = staging / out_json.name
                if made.is_file():
                    os.replace(made, out_json)
                else:  # a chapter that publishes nothing: no stale JSON beside it
                    out_json.unlink(missing_ok=True)
                os.replace(done, out_nb)
                # what described the replaced run would now sit beside the new pair with other numbers
                incomplete.unlink(missing_ok=True)
                shutil.rmtree(out_dir / f"{path.stem}_html", ignore_errors=True)
                return out_nb
            if out_nb.exists() or out_json.exists():
                kept_line = f"{out_nb.name} and {out_json.name} in {out_dir} are the earlier run's, unchanged"
            else:
                kept_line = f"nothing written to {out_nb.name} or {out_json.name} in {out_dir}"
            counts = _cells_done(done) if done.is_file() else None
            line = _failing_line(done) if done.is_file() else None
            if counts is not None:
                os.replace(done, incomplete)
                kept_line += f"; the incomplete run ({counts[0]} of {counts[1]} code cells): {incomplete}"
                kept = incomplete
            else:
                kept_line += "; nothing of this run was kept"
                kept = None
            if stopped is not None:
                raise RunIncomplete(f"stopped by {stopped}; {kept_line}.", kept=kept, signal=stopped)
            if status.get("timeout"):
                at = f" at cell {status['exec_count']}" if status.get("exec_count") else ""
                raise RunIncomplete(
                    f"the chapter exceeded the time limit of {limit:g} s per cell{at}: raise it "
                    f"with --timeout SECONDS; {kept_line}.",
                    kept=kept,
                )
            if status.get("ename") is None:
                raise RunIncomplete(f"the chapter's process ended without a result; {kept_line}.", kept=kept)
            at = f" at cell {status['exec_count']}" if status.get("exec_count") else ""
            what = status.get("evalue") or (f"(no message) raised by `{line}`" if line else "(no message)")
            raise RunIncomplete(
                f"the chapter stopped{at} with {status['ename']}: {what}\n"
                f"  (parameters {parameters}; {kept_line}, with the full traceback.)",
                kept=kept,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(private, ignore_errors=True)


def cite(chapter: str, name: str | None, *, results_file=None) -> str:
    """A one-line citation of one published number, with its precision and provenance; or the list of names.

    By default the number is read from ``$COMPANION_RESULTS_DIR`` if set, else from the book's
    committed ``data/results`` (:func:`companion.book.results.book_results_dir`); ``results_file`` is a
    results JSON or the folder of a run (``runs/``: its ``<chapter>.json``). The line says what the
    number is: ``(exact)``, ``(measured, reproducible to rtol ..., atol ... across machines)``,
    ``(bound; measured 1.1e-15, ...)`` with the measured value a bound bounds, or ``(claim, checked
    when the chapter ran)``.

    Raises
    ------
    ParameterError
        If the chapter has no results file yet (the message says which command writes it), or did
        not publish ``name`` (the message lists the names it published).

    Notes
    -----
    With ``name`` None the return value lists every published name, one a line, with its text and
    what it is (``companion cite CHAPTER``).
    """
    from .results import book_results_dir

    stem = _resolve(chapter).stem
    folder = os.environ.get("COMPANION_RESULTS_DIR")
    path = Path(results_file) if results_file else (Path(folder) if folder else book_results_dir()) / f"{stem}.json"
    if path.is_dir():  # --results runs/: the folder of a run, as companion run -o names it
        path = path / f"{stem}.json"
    if not path.is_file():
        if path.parent.resolve() == book_results_dir().resolve():
            how = f"make execute NB=book/chapters/{stem}.ipynb writes the committed numbers"
        else:
            how = f"companion run {stem} -o {path.parent} writes {path.parent / (stem + '.json')}"
        raise ParameterError(f"no results for {stem} at {path}; run the chapter first: {how}.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        chapter_of_file = data["chapter"]
        if "values" not in data:
            raise KeyError("values")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise ParameterError(f"{path} is not a results file written by companion.book.results.publish.") from None
    if chapter_of_file != stem:
        raise ParameterError(f"{path} holds the results of {chapter_of_file}, not of {stem}.")
    try:
        return _cite_line(data, stem, name, path)
    except ParameterError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # valid JSON, not a results file's structure
        raise ParameterError(
            f"{path} is not a results file written by companion.book.results.publish "
            f"({type(exc).__name__}: {exc}); rerun the chapter to write it again."
        ) from None


def _cite_line(data, stem, name, path) -> str:
    """:func:`cite`'s line (or list) from a results file's ``data``."""
    values = data["values"]
    if not isinstance(values, dict):
        raise TypeError("'values' is not a mapping of names to entries")
    if name is None:  # companion cite 01: what can be cited, one line each
        width = max((len(k) for k in values), default=0)
        lines = [f"  {k:<{width}}  {values[k].get('text')} ({_what_it_is(values[k])})" for k in sorted(values)]
        return "\n".join(
            [f"{stem} published {len(values)} values ({path}); cite one with companion cite {stem} NAME:", *lines]
        )
    if name not in values:
        raise ParameterError(f"{stem} published no value {name!r}; it published: {', '.join(sorted(data['values']))}.")
    entry = data["values"][name]
    params = ", ".join(f"{k}={v!r}" for k, v in sorted({"seed": data.get("seed"), **data["parameters"]}.items()))
    version = data.get("versions", {}).get("companion", "?")
    version += _release_note(version)
    commit = (data.get("commit") or "unknown")[:12]
    precision = f" ({_what_it_is(entry)})"
    return (
        f"{entry['text']}{precision} [{stem}: {name}; parameters {params}; companion {version}, "
        f"library {data['library_hash']}, commit {commit}, {data['created']}] -- Executable "
        'companion to Bhattamishra, Shah, Hahn & Kanade, "Provably Learning Attention with '
        'Queries", ICML 2026.'
    )


def _release_note(version: str) -> str:
    """ ", release 0.1.0, doi:..." when ``version`` is the release of CITATION.cff, else what it is not."""
    from .release import release_info

    rel = release_info()
    if not rel:
        return ""
    doi = f", doi:{rel['doi']}" if rel.get("doi") else ""
    if rel["version"] == version:
        return f" (release {version}{doi})"
    return f" (not a release; the last release is {rel['version']}{doi})"


def _precision(tol) -> str:
    return f"reproducible to rtol {tol.get('rtol', 0.0):g}, atol {tol.get('atol', 0.0):g} across machines"


def _what_it_is(entry) -> str:
    """What a published value is, in words: exact, measured (with its precision), a bound (with the
    measured value it bounds) or a claim checked when the chapter ran. A results file written
    before values had a ``"kind"`` is read by its tolerance (measured if it has one, else exact)."""
    tol = entry.get("tolerance")
    kind = entry.get("kind") or ("measured" if tol else "exact")
    if entry.get("holds") is False:  # a reader's run: the chapter went on and marked it
        measured = (entry.get("measured") or {}).get("text")
        return f"{kind} that does NOT hold for this run" + (f"; measured {measured}" if measured else "")
    if kind == "bound":
        measured = entry.get("measured") or {}
        mtol = measured.get("tolerance")
        return f"{'lower ' if entry.get('bound') == 'lower' else ''}bound; measured {measured.get('text', '?')}" + (
            f", {_precision(mtol)}" if mtol else ", exact on every machine"
        )
    if kind == "claim":
        return "claim, checked when the chapter ran" + (f"; {_precision(tol)}" if tol else "")
    if kind == "measured" and tol:
        return f"measured, {_precision(tol)}"
    return "exact"


def _cmd_list(args):
    for stem in chapters():
        print(stem)
        for name, info in chapter_parameters(stem).items():
            note = f"  # {info['help']}" if info["help"] else ""
            must = f"; must be {info['spec']}" if info["spec"] else ""
            print(f"    {name} = {info['default']!r} ({info['type']}){note}{must}")
    return 0


def _read_parameter_file(path) -> dict:
    import yaml

    try:
        data = _yaml_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParameterError(f"cannot read the parameter file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ParameterError(f"the parameter file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ParameterError(
            f"the parameter file {path} must map parameter names to values (YAML), "
            f"e.g. 'seed: 3'; it holds a {type(data).__name__}."
        )
    return data


def _stale_cache_message(build_dir) -> str | None:
    """Clear a stale execution cache (:func:`clear_stale_cache`) and say why, or None if it is current:
    a fresh clone has no earlier build, which is not a changed library (a new user's finding)."""
    from .results import clear_stale_cache

    had_build = (Path(build_dir) / ".library-hash").is_file()
    if not clear_stale_cache(build_dir):
        return None
    if had_build:
        return "the library changed since the last build: every chapter will be re-executed"
    return "no earlier build here: every chapter will be executed"


def _cmd_run(args):
    given = {}
    for path in args.parameter_file or []:
        given.update(_read_parameter_file(path))
    typed = {}
    for name, text in args.parameter or []:
        if name in typed and typed[name] != text:
            raise ParameterError(
                f"-p {name} is given twice ({typed[name]!r} and {text!r}); give each parameter once "
                f"(-p values override a -f file's)."
            )
        typed[name] = text
        given[name] = _parse_value(text)
    try:
        stem = _resolve(args.chapter).stem
        # what --overwrite replaces: the run, and the incomplete run and page run_chapter removes
        suffixes = (".ipynb", ".json", ".incomplete.ipynb", "_html")
        existed = [p for p in (Path(args.output_dir) / f"{stem}{x}" for x in suffixes) if p.exists()]
        out = run_chapter(
            args.chapter,
            given,
            args.output_dir,
            progress_bar=not args.no_progress,
            timeout=args.timeout,
            overwrite=args.overwrite,
        )
    except RunIncomplete as exc:
        if exc.signal is not None:
            print(f"companion: {exc}", file=sys.stderr)
            return 130 if exc.signal == "SIGINT" else 143
        raise
    if existed:
        print(f"replaced the earlier run: {', '.join(str(p) for p in existed)}")
    print(f"executed notebook: {out}")
    print(f"results: {out.with_suffix('.json')}")
    if args.html:
        print(f"page: {render_run(out)}")
    false = _not_holding_summary(out.with_suffix(".json"))
    if false is None:
        return 0
    print(false)
    return 1 if args.strict else 0


def _not_holding_summary(results_json: Path) -> str | None:
    """The closing summary of ``companion run``: the claims and bounds that did not hold, or None."""
    from .results import not_holding

    try:
        false = not_holding(results_json)
    except (OSError, ValueError, AttributeError):
        return None
    if not false:
        return None
    lines = [f"{len(false)} claim(s) and bound(s) of the chapter do not hold for this run (marked in the text):"]
    for e in false:
        lines.append(f"  {e['name']} ({e['kind']}): {e['text']}")
    return "\n".join(lines)


def _cmd_cite(args):
    print(cite(args.chapter, args.name, results_file=args.results))
    return 0


def _chapter_of(notebook: Path, chapter) -> Path:
    """The committed notebook of ``chapter``, by default of the run's file name (``.incomplete`` too)."""
    return _resolve(chapter or notebook.name.removesuffix(".ipynb").removesuffix(".incomplete"))


def compare_run(notebook, *, chapter=None) -> tuple[list[str], list[str]]:
    """Compare a run's executed notebook with the committed chapter, by the reproducibility contract.

    The outputs of every code cell are compared as ``make test`` compares them
    (:func:`companion.book.nbcompare.compare_notebooks`: numbers exactly unless a tolerance applies,
    rounding level, figures present), with the tolerances the committed chapter published
    (``data/results/<chapter>.json``) and those the run published (its results JSON beside it,
    ``<notebook>.json``), the run's taking precedence.

    Parameters
    ----------
    notebook : path-like
        The run's notebook, e.g. ``runs/02_exact_learning.ipynb``.
    chapter : str, default=None
        Chapter stem or unique prefix; by default the notebook's file name.

    Returns
    -------
    notes, differences : list of str
        ``notes``: the parameters in which the run differs from the committed one (its numbers are
        then expected to differ). ``differences``: one line per difference, ``code cell i: ...``
        (0-based among code cells); empty if the run matches.

    Raises
    ------
    ParameterError
        If the notebook cannot be read, or its chapter is unknown.
    """
    import nbformat

    from . import nbcompare
    from .results import book_results_dir

    notebook = Path(notebook)
    if not notebook.is_file():  # before the chapter is looked up: the file is what is missing
        raise ParameterError(f"no notebook at {notebook}: give the path of a run's .ipynb (companion run -o ...).")
    committed = _chapter_of(notebook, chapter)
    try:
        test = nbformat.read(notebook, as_version=4)
    except (OSError, ValueError) as exc:
        raise ParameterError(f"cannot read the notebook {notebook}: {getattr(exc, 'strerror', None) or exc}") from None
    except Exception as exc:  # valid JSON that is no notebook: nbformat's conversion or schema errors
        raise ParameterError(
            f"{notebook} is not a Jupyter notebook ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})."
        ) from None
    run_json = notebook.with_suffix(".json")
    notes = []
    try:
        mine = json.loads(run_json.read_text(encoding="utf-8"))
        book = json.loads((book_results_dir() / f"{committed.stem}.json").read_text(encoding="utf-8"))
        ours = {"seed": mine.get("seed"), **mine.get("parameters", {})}
        theirs = {"seed": book.get("seed"), **book.get("parameters", {})}
        notes = [f"{k}={ours.get(k)!r} (committed: {theirs.get(k)!r})" for k in theirs if ours.get(k) != theirs[k]]
    except (OSError, ValueError, AttributeError):
        pass
    # The tolerances the committed chapter and the run published, as make test takes them.
    glue = nbcompare.glue_tolerances(book_results_dir() / f"{committed.stem}.json", run_json)
    found = nbcompare.compare_notebooks(nbformat.read(committed, as_version=4), test, glue=glue)
    return notes, [f"code cell {i}: {d}" for i, diffs in sorted(found.items()) for d in diffs]


def _cmd_compare(args):
    notes, diffs = compare_run(args.notebook, chapter=args.chapter)
    stem = _chapter_of(Path(args.notebook), args.chapter).stem
    if notes:
        print(f"the run's parameters differ from the committed ones, so its numbers may: {', '.join(notes)}")
    if not diffs:
        print(f"{args.notebook}: the same outputs as the committed {stem}, by the reproducibility contract")
        return 0
    print(f"{args.notebook}: {len(diffs)} difference(s) from the committed {stem}:")
    for line in diffs:
        print(f"  {line}")
    return 1


def cached_without_figures(cache_dir, notebooks) -> dict[str, list[str]]:
    """Chapters whose cached execution lacks figures that the committed notebook has.

    Jupyter Book's execution cache (jupyter-cache) keys on a notebook's code alone, so an
    execution that lost its figures (e.g. under ``MPLBACKEND=Agg`` with a library that did not
    display them) would be served again by every later build. Each committed notebook is matched
    to its cached execution and their figure outputs compared cell by cell
    (:func:`companion.book.nbcompare.compare_figures`).

    Parameters
    ----------
    cache_dir : path-like
        The cache folder, ``_build/.jupyter_cache``; nothing is found if it does not exist.
    notebooks : mapping of str to path-like
        Chapter stem -> committed notebook (:func:`chapters`).

    Returns
    -------
    dict
        Stem -> one line per code cell whose figures differ, for the chapters that lack figures.
    """
    import nbformat
    from jupyter_cache import get_cache

    from . import nbcompare

    if not Path(cache_dir).is_dir():
        return {}
    cache = get_cache(str(cache_dir))
    found = {}
    for stem, path in notebooks.items():
        committed = nbformat.read(path, as_version=4)
        try:
            record = cache.match_cache_notebook(committed)
        except KeyError:
            continue
        cached = cache.get_cache_bundle(record.pk).nb
        ref = [c for c in committed.cells if c.cell_type == "code"]
        test = [c for c in cached.cells if c.cell_type == "code"]
        lines = [
            f"code cell {i}: {d}"
            for i, (rc, tc) in enumerate(zip(ref, test))
            for d in nbcompare.compare_figures(rc.get("outputs", []), tc.get("outputs", []))
            if "missing" in d
        ]
        if lines:
            found[stem] = lines
    return found


def _drop_cached(cache_dir, stems, notebooks) -> None:
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_dir))
    for stem in stems:
        try:
            cache.remove_cache(cache.match_cache_notebook(nbformat.read(notebooks[stem], as_version=4)).pk)
        except KeyError:
            pass


def _cmd_build(args):
    from .results import mark_built

    from ..oracles import PERTURB_ENV, perturbation_ulps

    if perturbation_ulps():
        raise ParameterError(
            f"{PERTURB_ENV}={os.environ[PERTURB_ENV]} is set (the oracles' perturbation "
            "test mode): the book is built from exact answers only; unset it."
        )
    root = _root()
    _require(("jupyter_book",), "book", "companion build (the HTML book)")
    base = Path(args.output_dir).resolve() if args.output_dir else root
    build_dir = _writable_folder(
        base / "_build",
        "build the book elsewhere with companion build -o DIR (make book BUILD=DIR), which writes DIR/_build",
    )
    cache_dir = build_dir / ".jupyter_cache"
    if args.force:
        import shutil

        shutil.rmtree(cache_dir, ignore_errors=True)
        print("forced: every chapter will be executed")
    else:
        stale = _stale_cache_message(build_dir)
        if stale:
            print(stale)
    notebooks = chapters()
    lacking = cached_without_figures(cache_dir, notebooks)
    if lacking:
        _drop_cached(cache_dir, lacking, notebooks)
        print(
            f"the cached executions of {', '.join(lacking)} lack figures the committed notebooks have: "
            "executing them again"
        )
    jb = Path(sys.executable).with_name("jupyter-book")
    # Always --all (a fresh Sphinx environment): Sphinx re-reads only the pages whose source changed
    # and rewrites only those, so a number that moved elsewhere stays stale (an equation inserted in
    # chapter 01 renumbers chapter 02's references to it), and a cleared execution cache is no source
    # change at all. With the execution cache in place, reading every page costs seconds.
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-n", "-W", "--keep-going", "--all"]
    if args.output_dir:
        cmd += ["--path-output", str(base)]
    # Chapters executed for the HTML publish into _build/results: the committed data/results stay
    # as `make execute` wrote them, next to the committed notebook outputs they describe.
    env = dict(os.environ)
    env.setdefault("COMPANION_RESULTS_DIR", str(build_dir / "results"))
    # The book's build is strict: a claim or bound that does not hold stops its chapter, and the
    # build fails (a reader's run, companion run, marks it and goes on; companion.book.results.strict).
    env["COMPANION_STRICT"] = "1"
    code = subprocess.call(cmd, env=env)
    if code == 0:
        lacking = cached_without_figures(cache_dir, notebooks)
        if lacking:  # the build executed them and they still have no figures: refuse it
            stem, lines = next(iter(lacking.items()))
            raise ParameterError(
                f"the book's execution of {', '.join(lacking)} lacks figures the committed notebooks have "
                f"({stem}, {lines[0]}); the build is refused (check MPLBACKEND={os.environ.get('MPLBACKEND')!r} "
                "and that the chapter displays its figures through companion.book.plotting)."
            )
        mark_built(build_dir)  # only a finished build makes the library hash current
        print(f"book: {build_dir / 'html' / 'index.html'}")
    return code


def main(argv=None) -> int:
    """Entry point of the ``companion`` command."""
    parser = argparse.ArgumentParser(prog="companion", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list chapters with their parameters and defaults").set_defaults(func=_cmd_list)
    run = sub.add_parser("run", help="execute a chapter with new parameters (papermill)")
    run.add_argument("chapter", help="chapter stem or unique prefix, e.g. 02_exact_learning or 02")
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        metavar=("NAME", "VALUE"),
        help="set a parameter; VALUE is read as YAML (3, 0.5, 1e-3, true, '[4, 8]')",
    )
    run.add_argument(
        "-f",
        "--parameters-file",
        dest="parameter_file",
        action="append",
        metavar="FILE",
        help="YAML file of parameters (name: value), as papermill's -f; -p values override it",
    )
    run.add_argument("-o", "--output-dir", default="runs", help="folder for the notebook and results (default: runs)")
    run.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time limit per cell (default: the book's execute.timeout, 600 s)",
    )
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--overwrite", action="store_true", help="replace a finished run of the chapter in the output folder"
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a claim or bound of the chapter does not hold for this run (the run still completes)",
    )
    run.add_argument(
        "--html",
        action="store_true",
        help="also render the run as a page in the book's theme, its numbers filled in (DIR/<chapter>_html/)",
    )
    run.set_defaults(func=_cmd_run)
    cite_p = sub.add_parser("cite", help="print a citation line for one published number")
    cite_p.add_argument("chapter")
    cite_p.add_argument("name", nargs="?", help="the published value; without it, every name it published, one a line")
    cite_p.add_argument(
        "--results",
        help="results JSON to read, or the folder of a run (default: $COMPANION_RESULTS_DIR, else data/results)",
    )
    cite_p.set_defaults(func=_cmd_cite)
    cmp_p = sub.add_parser(
        "compare", help="compare a run's notebook with the committed chapter (exit 1 if they differ)"
    )
    cmp_p.add_argument("notebook", help="the run's executed notebook, e.g. runs/02_exact_learning.ipynb")
    cmp_p.add_argument("--chapter", help="its chapter, if the file is not named after it")
    cmp_p.set_defaults(func=_cmd_compare)
    build = sub.add_parser("build", help="build the HTML book (jupyter-book build -n -W --keep-going)")
    build.add_argument("--all", action="store_true", help="(the default; kept for old scripts) read every page afresh")
    build.add_argument("--force", action="store_true", help="re-execute every chapter (release build)")
    build.add_argument(
        "-o",
        "--output-dir",
        default=None,
        metavar="DIR",
        help="build into DIR/_build instead of the repository's _build (a read-only checkout)",
    )
    build.set_defaults(func=_cmd_build)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ParameterError as exc:
        print(f"companion: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of our output has gone (``companion list | head -3``): stop quietly, as
        # Python's documentation advises (the interpreter's final flush would raise again)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
