"""``companion run --html``: an executed chapter rendered as a page in the book's theme.

Split from :mod:`companion.book.cli` (which re-exports :func:`render_run`); :func:`book_root` and
:func:`require_extra` are shared with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import ParameterError

__all__ = ["book_root", "require_extra", "render_run"]


def book_root() -> Path:
    """The repository's root (the folder with ``_toc.yml`` and ``book/chapters``), or a one-line error."""
    from .results import repo_root

    root = repo_root()
    if root is None:
        raise ParameterError(
            "cannot find the book (a folder with _toc.yml and book/chapters) at or above the "
            "current folder; run companion from inside the repository."
        )
    return root


def require_extra(modules, extra: str, what: str) -> None:
    """Refuse in one line, naming the extra to install, when a module ``what`` needs is missing."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ParameterError(
            f"{what} needs {' and '.join(missing)}, which this installation lacks: install "
            f"the [{extra}] extra, pip install -e '.[{extra}]' (or make venv)."
        )


def render_run(notebook, *, results_file=None, out_dir=None) -> Path:
    """Render an executed chapter as an HTML page in the book's theme, with the run's own numbers.

    A one-chapter Jupyter Book is built from the executed notebook (myst-nb, no execution: the
    run's outputs are used as they are), with the book's configuration, theme, MathJax served with
    the page (offline) and bibliography. Every ``{glue:text}`` role of the prose is filled from the
    run's glued outputs, the very values its results JSON records; a box at the top states the
    run's parameters and provenance, and names the claims and bounds that do not hold for the run.
    References to the book's other chapters (``{ref}``, ``{eq}``, ``{prf:ref}``) show the titles
    and numbers the book gives them: the other pages are built alongside from their prose only
    (:func:`_prose_only`), then left out. Such a reference links to the published book when
    ``_config.yml`` names it (``html.baseurl``), else it is plain text.

    Parameters
    ----------
    notebook : path-like
        The executed notebook, e.g. ``runs/02_exact_learning.ipynb``.
    results_file : path-like, default=None
        Its results JSON, for the provenance box; by default the notebook's path with ``.json``.
    out_dir : path-like, default=None
        The folder of the page; by default ``<notebook folder>/<stem>_html``, replaced if it exists.

    Returns
    -------
    pathlib.Path
        The page, ``<out_dir>/<stem>.html``.

    Raises
    ------
    ParameterError
        If Jupyter Book is not installed (the [book] extra), or the build fails (the message names its log).
    """
    import shutil
    import tempfile

    import nbformat
    import yaml

    from .results import not_holding

    require_extra(("jupyter_book",), "book", "companion run --html (Jupyter Book)")
    root = book_root()
    notebook = Path(notebook).resolve()
    stem = notebook.name.removesuffix(".ipynb")
    results_file = Path(results_file) if results_file else notebook.with_suffix(".json")
    out_dir = Path(out_dir).resolve() if out_dir else notebook.parent / f"{stem}_html"
    with tempfile.TemporaryDirectory(prefix="companion-html-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        nb = nbformat.read(notebook, as_version=4)
        try:
            data = json.loads(results_file.read_text(encoding="utf-8"))
            params = ", ".join(f"`{k} = {v!r}`" for k, v in {"seed": data.get("seed"), **data["parameters"]}.items())
            prov = (
                f"companion {data.get('versions', {}).get('companion', '?')}, library {data.get('library_hash')}, "
                f"commit {(data.get('commit') or 'unknown')[:12]}, {data.get('created')}"
            )
            note = f"Parameters of this run: {params}. Executed with {prov}; its numbers: `{results_file.name}`."
            false = not_holding(data)
            if false:
                names = ", ".join(f"`{e['name']}`" for e in false)
                note += (
                    f"\n\n{len(false)} of the chapter's claims and bounds do not hold for this run: "
                    f"{names}. The text marks each with *(does not hold for this run)*."
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            note = "This run's results file was not found next to it; the numbers shown are the notebook's."
        nb.cells.insert(
            0,
            nbformat.v4.new_markdown_cell(
                f"```{{admonition}} A re-run of this chapter, with its own numbers\n:class: note\n\n{note}\n```"
            ),
        )
        if nb.nbformat_minor < 5:  # cell ids came with nbformat 4.5
            nb.cells[0].pop("id", None)
        nbformat.write(nb, src / f"{stem}.ipynb")
        for name in ("references.bib", "bibliography.md"):
            shutil.copy2(root / "book" / name, src / name)
        book_toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
        others = _prose_only(root, book_toc, src, stem)
        config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
        config["title"] = f"{config.get('title', 'The companion')}: a re-run"
        config["execute"] = {**config.get("execute", {}), "execute_notebooks": "off"}
        config["exclude_patterns"] = []
        config["bibtex_bibfiles"] = ["references.bib"]
        config.pop("launch_buttons", None)
        config.setdefault("html", {}).update(use_repository_button=False, use_download_button=False)
        sphinx = config.setdefault("sphinx", {})
        sphinx["local_extensions"] = {k: str(root / v) for k, v in (sphinx.get("local_extensions") or {}).items()}
        (src / "_config.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        (src / "_toc.yml").write_text(yaml.safe_dump(_flat_toc(book_toc, stem)), encoding="utf-8")
        jb = Path(sys.executable).with_name("jupyter-book")
        log = Path(tmp) / "build.log"
        with open(log, "w", encoding="utf-8") as f:
            code = subprocess.call(
                [
                    str(jb) if jb.exists() else "jupyter-book",
                    "build",
                    str(src),
                    "--path-output",
                    str(Path(tmp) / "out"),
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        html = Path(tmp) / "out" / "_build" / "html"
        if code != 0 or not (html / f"{stem}.html").is_file():
            kept = out_dir.parent / f"{stem}_html.log"
            shutil.copy2(log, kept)
            raise ParameterError(
                f"rendering {notebook.name} as HTML failed (jupyter-book exit {code}); the log: {kept}"
            )
        baseurl = (config.get("html") or {}).get("baseurl") or None
        _unlink_other_pages(html, stem, others, baseurl)
        staging = out_dir.parent / f".{out_dir.name}.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(html, staging)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(staging, out_dir)
    return out_dir / f"{stem}.html"


_ROOT_PAGE = "rerun_index"


def _flat_toc(book_toc: dict, stem: str) -> dict:
    """The book's table of contents with every file by its stem (one flat folder), under a root page
    of the run: the parts, and so the numbers of chapters, equations and theorems, stay the book's."""
    parts = [
        {**part, "chapters": [{"file": Path(c["file"]).name} for c in part.get("chapters", [])]}
        for part in book_toc.get("parts", [])
    ]
    return {"format": "jb-book", "root": _ROOT_PAGE, "parts": parts}


def _prose_only(root: Path, book_toc: dict, src: Path, stem: str) -> dict[str, str]:
    """Write the book's other pages into ``src`` with their prose only; return stem -> published path.

    A chapter keeps its markdown cells (titles, labels, equations, theorems), its glued values
    replaced by an ellipsis (the run has no values for them); a back-matter page keeps its label
    and heading lines. Enough for Sphinx to give a reference into them the book's title or
    number, in seconds (no outputs, no Library reference).
    """
    import re

    import nbformat

    glue = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")
    others: dict[str, str] = {}
    for part in book_toc.get("parts", []):
        for entry in part.get("chapters", []):
            rel = Path(entry["file"])
            name = rel.name
            if name in (stem, "bibliography"):
                continue
            others[name] = rel.as_posix() + ".html"
            ipynb, md = root / rel.with_suffix(".ipynb"), root / rel.with_suffix(".md")
            if ipynb.is_file():
                nb = nbformat.read(ipynb, as_version=4)
                nb.cells = [c for c in nb.cells if c.cell_type == "markdown"]
                for c in nb.cells:
                    c.source = glue.sub("…", c.source)
                nbformat.write(nb, src / f"{name}.ipynb")
            elif md.is_file():
                lines = md.read_text(encoding="utf-8").splitlines()
                kept = [line for line in lines if re.match(r"^\([\w-]+\)=\s*$|^#+ ", line)]
                (src / f"{name}.md").write_text("\n\n".join(kept or [f"# {name}"]) + "\n", encoding="utf-8")
    (src / f"{_ROOT_PAGE}.md").write_text("# A re-run\n", encoding="utf-8")
    others[_ROOT_PAGE] = ""
    return others


def _unlink_other_pages(html: Path, stem: str, others: dict[str, str], baseurl) -> None:
    """In the run's page, turn links to the prose-only pages into links to the published book
    (``baseurl``) or plain text; remove those pages; point ``index.html`` at the run's page."""
    import re

    page = html / f"{stem}.html"
    text = page.read_text(encoding="utf-8")
    names = "|".join(re.escape(n) for n in others)
    link = re.compile(rf'<a\b([^>]*?)\bhref="({names})\.html(#[^"]*)?"([^>]*)>(.*?)</a>', re.S)

    def repl(m):
        published = others[m.group(2)]
        if baseurl and published:
            href = f"{baseurl.rstrip('/')}/{published}{m.group(3) or ''}"
            return f'<a class="reference external" href="{href}">{m.group(5)}</a>'
        return f'<span class="companion-xref">{m.group(5)}</span>'

    page.write_text(link.sub(repl, text), encoding="utf-8")
    for name in others:
        (html / f"{name}.html").unlink(missing_ok=True)
    (html / "index.html").write_text(
        f'<!DOCTYPE html><meta http-equiv="Refresh" content="0; url={stem}.html"><a href="{stem}.html">{stem}</a>\n',
        encoding="utf-8",
    )
