"""The ``companion`` command: list, run and build the chapters; cite one published number.

::

    companion list                                   # every chapter, its parameters and defaults
    companion run 02_exact_learning -p d_values "[16, 64]" -p seed 3 -o runs/
    companion run 05_robustness -f params.yaml --timeout 1200
    companion cite 02_exact_learning sweep_worst_W   # a citation line with provenance
    companion build                                  # the HTML book (jupyter-book build)

``run`` executes a chapter through papermill, after checking every ``-p NAME VALUE`` (and every
entry of a ``-f params.yaml`` file) against the chapter's ``parameters`` cell: an unknown name, a
value of the wrong type or one outside the constraint declared next to the parameter
(:mod:`companion.parameters`) is refused in one line before anything runs (plain papermill only
warns). Values are read as YAML (``3``, ``0.5``, ``1e-3``, ``true``, ``"[4, 8]"``); a float
parameter also takes ``1e-3`` inside a list, which YAML 1.1 reads as a string. Each cell has the
book's time limit (600 s) unless ``--timeout`` says otherwise, and the chapter's results file is
written only when every cell ran.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from .errors import ParameterError

__all__ = ["main", "chapters", "chapter_parameters", "check_parameters", "book_timeout", "run_chapter", "cite"]


def _root() -> Path:
    from .results import repo_root

    root = repo_root()
    if root is None:
        raise ParameterError(
            "cannot find the book (a folder with _toc.yml and book/chapters) at or above the "
            "current folder; run companion from inside the repository."
        )
    return root


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
            f"chapter {chapter!r} is ambiguous: it starts {', '.join(p.stem for p in matches)}; "
            "give more of the name."
        )
    raise ParameterError(
        f"unknown chapter {chapter!r}; choose one of: {', '.join(found)} (a unique prefix such as "
        "'02' also works)."
    )


def _parameters_cell(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return next((c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])), None)


def chapter_parameters(chapter: str) -> dict:
    """The parameters of a chapter's ``parameters`` cell: name -> {"default", "type", "help", "spec"}.

    Read as papermill reads them (:func:`companion.parameters.declared`); the default is evaluated
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
    return {name: {"default": info["default"], "type": type(info["default"]).__name__,
                   "help": info["help"], "spec": info["spec_text"]} for name, info in decl.items()}


def _parse_value(text: str):
    """A ``-p`` value read as YAML; strings that read as numbers become numbers (``1e-3``)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)        # YAML 1.1 reads "1e-3" as a string
        except ValueError:
            return value
    return value


def check_parameters(chapter: str, given: dict) -> dict:
    """Check ``given`` against the chapter's declared parameters; return the converted values.

    Names, types (an int where a float is expected is converted; ``'1e-3'`` read as a string by
    YAML becomes a float) and the constraints declared next to each parameter are checked
    (:mod:`companion.parameters`).

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


def run_chapter(chapter: str, parameters: dict, output_dir, *, progress_bar=True, timeout=None) -> Path:
    """Execute a chapter with checked parameters through papermill.

    The executed notebook goes to ``output_dir/<chapter>.ipynb`` and its results JSON to
    ``output_dir/<chapter>.json``. The chapter publishes into a staging folder first; its results
    file replaces ``output_dir/<chapter>.json`` only when every cell ran, so a chapter that fails
    (or runs out of time) leaves the previous results file as it was. Returns the notebook's path.

    Parameters
    ----------
    timeout : float, default=None
        Time limit in seconds for each cell; by default the book's (:func:`companion.cli.book_timeout`, 600 s).
    """
    import shutil
    import tempfile

    import papermill

    path = _resolve(chapter)
    params = check_parameters(path.stem, parameters)
    out_dir = Path(output_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    out_nb = out_dir / path.name
    staging = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", dir=out_dir))
    old = os.environ.get("COMPANION_RESULTS_DIR")
    os.environ["COMPANION_RESULTS_DIR"] = str(staging)
    try:
        papermill.execute_notebook(str(path), str(out_nb), parameters=params, cwd=str(path.parent),
                                   progress_bar=progress_bar, kernel_name="python3",
                                   execution_timeout=timeout if timeout is not None else book_timeout())
        for item in staging.iterdir():           # every cell ran: publish the results file
            target = out_dir / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                os.replace(item, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if old is None:
            os.environ.pop("COMPANION_RESULTS_DIR", None)
        else:
            os.environ["COMPANION_RESULTS_DIR"] = old
    return out_nb


def cite(chapter: str, name: str, *, results_file=None) -> str:
    """A one-line citation of one published number, with its precision and provenance.

    By default the number is read from ``$COMPANION_RESULTS_DIR`` if set, else from the book's
    committed ``data/results`` (:func:`companion.results.book_results_dir`). A number published
    with ``rtol``/``atol`` is cited with that precision.

    Raises
    ------
    ParameterError
        If the chapter has no results file yet or did not publish ``name``.
    """
    from .results import book_results_dir

    stem = _resolve(chapter).stem
    folder = os.environ.get("COMPANION_RESULTS_DIR")
    path = Path(results_file) if results_file else (Path(folder) if folder else book_results_dir()) / f"{stem}.json"
    if not path.is_file():
        raise ParameterError(f"no results for {stem} at {path}; run the chapter first (make book).")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        values, chapter_of_file = data["values"], data["chapter"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise ParameterError(f"{path} is not a results file written by companion.results.publish.") from None
    if chapter_of_file != stem:
        raise ParameterError(f"{path} holds the results of {chapter_of_file}, not of {stem}.")
    if name not in values:
        raise ParameterError(
            f"{stem} published no value {name!r}; it published: {', '.join(sorted(data['values']))}."
        )
    entry = data["values"][name]
    params = ", ".join(f"{k}={v!r}" for k, v in sorted({"seed": data.get("seed"),
                                                          **data["parameters"]}.items()))
    version = data.get("versions", {}).get("companion", "?")
    commit = (data.get("commit") or "unknown")[:12]
    tol = entry.get("tolerance")
    precision = (f" (reproducible to rtol {tol.get('rtol', 0.0):g}, atol {tol.get('atol', 0.0):g} "
                 "across machines)" if tol else " (exact)")
    return (f"{entry['text']}{precision} [{stem}: {name}; parameters {params}; companion {version}, "
            f"library {data['library_hash']}, commit {commit}, {data['created']}] -- Executable "
            "companion to Bhattamishra, Shah, Hahn & Kanade, \"Provably Learning Attention with "
            "Queries\", ICML 2026.")


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
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParameterError(f"cannot read the parameter file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ParameterError(f"the parameter file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ParameterError(f"the parameter file {path} must map parameter names to values (YAML), "
                             f"e.g. 'seed: 3'; it holds a {type(data).__name__}.")
    return data


def _cmd_run(args):
    import papermill

    given = {}
    for path in args.parameter_file or []:
        given.update(_read_parameter_file(path))
    for name, text in args.parameter or []:
        given[name] = _parse_value(text)
    where = Path(args.output_dir).resolve() / _resolve(args.chapter).name
    try:
        out = run_chapter(args.chapter, given, args.output_dir, progress_bar=not args.no_progress,
                          timeout=args.timeout)
    except papermill.PapermillExecutionError as exc:
        if exc.ename in ("CellTimeoutError", "TimeoutError") or "timed out" in str(exc.evalue).lower():
            raise ParameterError(f"the chapter exceeded the time limit at cell {exc.exec_count}: raise it "
                                 f"with --timeout (now {args.timeout or book_timeout()} s); notebook: {where}") from None
        raise ParameterError(
            f"the chapter stopped at cell {exc.exec_count} with {exc.ename}: {exc.evalue}\n"
            f"  (parameters {given}; the executed notebook with the full traceback: {where})"
        ) from None
    except Exception as exc:          # nbclient's CellTimeoutError, DeadKernelError
        if type(exc).__name__ in ("CellTimeoutError", "DeadKernelError", "TimeoutError"):
            raise ParameterError(
                f"the chapter did not finish within the time limit of {args.timeout or book_timeout()} s "
                f"per cell ({type(exc).__name__}); raise it with --timeout SECONDS; notebook: {where}") from None
        raise
    print(f"executed notebook: {out}")
    print(f"results: {out.with_suffix('.json')}")
    return 0


def _cmd_cite(args):
    print(cite(args.chapter, args.name, results_file=args.results))
    return 0


def _cmd_build(args):
    from .results import clear_stale_cache, mark_built

    from .oracles import PERTURB_ENV, perturbation_ulps

    if perturbation_ulps():
        raise ParameterError(f"{PERTURB_ENV}={os.environ[PERTURB_ENV]} is set (the oracles' perturbation "
                             "test mode): the book is built from exact answers only; unset it.")
    root = _root()
    build_dir = root / "_build"
    if args.force:
        import shutil

        shutil.rmtree(build_dir / ".jupyter_cache", ignore_errors=True)
        print("forced: every chapter will be executed")
        fresh = True
    else:
        fresh = clear_stale_cache(build_dir)
        if fresh:
            print("the library changed since the last build: every chapter will be re-executed")
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-n", "-W", "--keep-going"]
    if args.all or fresh:
        # Sphinx re-reads (and myst-nb re-executes) only the pages whose source changed; a cleared
        # execution cache is not a source change, so every page is read afresh.
        cmd.append("--all")
    # Chapters executed for the HTML publish into _build/results: the committed data/results stay
    # as `make execute` wrote them, next to the committed notebook outputs they describe.
    env = dict(os.environ)
    env.setdefault("COMPANION_RESULTS_DIR", str(build_dir / "results"))
    code = subprocess.call(cmd, env=env)
    if code == 0:
        mark_built(build_dir)          # only a finished build makes the library hash current
        print(f"book: {build_dir / 'html' / 'index.html'}")
    return code


def main(argv=None) -> int:
    """Entry point of the ``companion`` command."""
    parser = argparse.ArgumentParser(prog="companion", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list chapters with their parameters and defaults").set_defaults(func=_cmd_list)
    run = sub.add_parser("run", help="execute a chapter with new parameters (papermill)")
    run.add_argument("chapter", help="chapter stem or unique prefix, e.g. 02_exact_learning or 02")
    run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                     help="set a parameter; VALUE is read as YAML (3, 0.5, 1e-3, true, '[4, 8]')")
    run.add_argument("-f", "--parameters-file", dest="parameter_file", action="append", metavar="FILE",
                     help="YAML file of parameters (name: value), as papermill's -f; -p values override it")
    run.add_argument("-o", "--output-dir", default="runs", help="folder for the notebook and results (default: runs)")
    run.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                     help="time limit per cell (default: the book's execute.timeout, 600 s)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.set_defaults(func=_cmd_run)
    cite_p = sub.add_parser("cite", help="print a citation line for one published number")
    cite_p.add_argument("chapter")
    cite_p.add_argument("name")
    cite_p.add_argument("--results", help="results JSON to read (default: the results folder)")
    cite_p.set_defaults(func=_cmd_cite)
    build = sub.add_parser("build", help="build the HTML book (jupyter-book build -n -W --keep-going)")
    build.add_argument("--all", action="store_true", help="rewrite every HTML page")
    build.add_argument("--force", action="store_true", help="re-execute every chapter (release build)")
    build.set_defaults(func=_cmd_build)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ParameterError as exc:
        print(f"companion: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
