"""The ``companion`` command: list, run and build the chapters; cite one published number.

::

    companion list                                   # every chapter, its parameters and defaults
    companion run 02_exact_learning -p d_values "[16, 64]" -p seed 3 -o runs/
    companion cite 02_exact_learning sweep_worst_W   # a citation line with provenance
    companion build                                  # the HTML book (jupyter-book build)

``run`` executes a chapter through papermill, after checking every ``-p NAME VALUE`` against the
chapter's ``parameters`` cell: an unknown name or a value of the wrong type is an error here (plain
papermill only warns), with the list of valid parameters. Values are read as YAML
(``3``, ``0.5``, ``1e-3``, ``true``, ``"[4, 8]"``), strings stay strings.
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

__all__ = ["main", "chapters", "chapter_parameters", "check_parameters", "run_chapter", "cite"]


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


def chapter_parameters(chapter: str) -> dict:
    """The parameters of a chapter's ``parameters`` cell: name -> {"default", "type", "help"}.

    Uses :func:`papermill.inspect_notebook`; the default is evaluated with
    :func:`ast.literal_eval` and its type is the parameter's type.
    """
    import re

    import nbformat
    import papermill

    path = _resolve(chapter)
    inspected = papermill.inspect_notebook(str(path))
    cell = next((c for c in nbformat.read(path, as_version=4).cells
                 if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    assigned = re.findall(r"^(\w+)\s*=", cell.source, re.M) if cell is not None else []
    dropped = [name for name in assigned if name not in inspected]
    if dropped:
        raise ParameterError(
            f"papermill cannot read the line of {', '.join(dropped)} in the parameters cell of "
            f"{path.stem} (it drops lines whose comment holds '=', '<' or '>'); fix the comment."
        )
    out = {}
    for name, info in inspected.items():
        try:
            default = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError):
            default = info["default"]
        out[name] = {"default": default, "type": type(default).__name__, "help": info.get("help", "")}
    return out


def _parse_value(text: str):
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


def _conforms(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        if not isinstance(value, list):
            return False
        kinds = {type(x) for x in default}
        return len(kinds) != 1 or all(_conforms(x, default[0]) for x in value)
    if default is None:
        return True
    return isinstance(value, type(default))


def check_parameters(chapter: str, given: dict) -> dict:
    """Check names and types of ``given`` against the chapter's parameters; return converted values.

    Raises
    ------
    ParameterError
        For an unknown name (listing the valid ones) or a value whose type differs from the
        default's (an int where a float is expected is accepted and converted).
    """
    known = chapter_parameters(chapter)
    listing = ", ".join(f"{k} ({v['type']}, default {v['default']!r})" for k, v in known.items())
    out = {}
    for name, value in given.items():
        if name not in known:
            raise ParameterError(
                f"chapter {_resolve(chapter).stem} has no parameter {name!r}; its parameters are: "
                f"{listing}."
            )
        default = known[name]["default"]
        if not _conforms(value, default):
            expected = known[name]["type"]
            if isinstance(default, (list, tuple)) and isinstance(value, list) and default:
                expected = f"a list of {type(default[0]).__name__}"
            raise ParameterError(
                f"parameter {name}={value!r} does not fit: the chapter expects {expected} "
                f"(default {default!r})."
            )
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        out[name] = value
    return out


def run_chapter(chapter: str, parameters: dict, output_dir, *, progress_bar=True) -> Path:
    """Execute a chapter with checked parameters through papermill.

    The executed notebook goes to ``output_dir/<chapter>.ipynb`` and its results JSON to
    ``output_dir/<chapter>.json``. Returns the notebook's path.
    """
    import papermill

    path = _resolve(chapter)
    params = check_parameters(path.stem, parameters)
    out_dir = Path(output_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    out_nb = out_dir / path.name
    old = os.environ.get("COMPANION_RESULTS_DIR")
    os.environ["COMPANION_RESULTS_DIR"] = str(out_dir)
    try:
        papermill.execute_notebook(str(path), str(out_nb), parameters=params, cwd=str(path.parent),
                                   progress_bar=progress_bar, kernel_name="python3")
    finally:
        if old is None:
            os.environ.pop("COMPANION_RESULTS_DIR", None)
        else:
            os.environ["COMPANION_RESULTS_DIR"] = old
    return out_nb


def cite(chapter: str, name: str, *, results_file=None) -> str:
    """A one-line citation of one published number, with its provenance.

    Raises
    ------
    ParameterError
        If the chapter has no results file yet or did not publish ``name``.
    """
    from .results import results_dir

    stem = _resolve(chapter).stem
    path = Path(results_file) if results_file else results_dir() / f"{stem}.json"
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
    return (f"{entry['text']} [{stem}: {name}; parameters {params}; companion {version}, "
            f"library {data['library_hash']}, commit {commit}, {data['created']}] -- Executable "
            "companion to Bhattamishra, Shah, Hahn & Kanade, \"Provably Learning Attention with "
            "Queries\", ICML 2026.")


def _cmd_list(args):
    for stem in chapters():
        print(stem)
        for name, info in chapter_parameters(stem).items():
            note = f"  # {info['help']}" if info["help"] else ""
            print(f"    {name} = {info['default']!r} ({info['type']}){note}")
    return 0


def _cmd_run(args):
    import papermill

    given = {}
    for name, text in args.parameter or []:
        given[name] = _parse_value(text)
    try:
        out = run_chapter(args.chapter, given, args.output_dir, progress_bar=not args.no_progress)
    except papermill.PapermillExecutionError as exc:
        where = Path(args.output_dir).resolve() / _resolve(args.chapter).name
        raise ParameterError(
            f"the chapter stopped at cell {exc.exec_count} with {exc.ename}: {exc.evalue}\n"
            f"  (parameters {given}; the executed notebook with the full traceback: {where})"
        ) from None
    print(f"executed notebook: {out}")
    print(f"results: {out.with_suffix('.json')}")
    return 0


def _cmd_cite(args):
    print(cite(args.chapter, args.name, results_file=args.results))
    return 0


def _cmd_build(args):
    from .results import clear_stale_cache

    root = _root()
    build_dir = root / "_build"
    if args.force:
        import shutil

        shutil.rmtree(build_dir / ".jupyter_cache", ignore_errors=True)
        print("forced: every chapter will be executed")
    elif clear_stale_cache(build_dir):
        print("the library changed since the last build: every chapter will be re-executed")
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(root), "-n", "-W", "--keep-going"]
    if args.all:
        cmd.append("--all")
    # Chapters executed for the HTML publish into _build/results: the committed data/results stay
    # as `make execute` wrote them, next to the committed notebook outputs they describe.
    env = dict(os.environ)
    env.setdefault("COMPANION_RESULTS_DIR", str(build_dir / "results"))
    code = subprocess.call(cmd, env=env)
    if code == 0:
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
    run.add_argument("-o", "--output-dir", default="runs", help="folder for the notebook and results (default: runs)")
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
