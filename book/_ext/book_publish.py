"""The book as readers get it (issue 23): one numbering in HTML and PDF, maths wherever a title
appears, code that wraps when printed, one search bar.

A Sphinx extension (listed in ``_config.yml`` under ``sphinx.local_extensions``):

- **One numbering.** For a book with parts, sphinx-jupyterbook-latex sets
  ``numfig_secnum_depth = 2`` in the LaTeX build, so that LaTeX's own figure and equation counters
  restart at each chapter (``numfigreset``). sphinx-proof and sphinx-exercise, however, take their
  numbers from ``env.toc_fignumbers``, which Sphinx computes with the same depth: the PDF then says
  "Exercise 2.10.1" (chapter, section, exercise) where the HTML says "Exercise 2.1". After Sphinx has
  numbered everything (``env-get-updated``), the LaTeX build recomputes ``toc_fignumbers`` with the
  HTML's depth (``numfig_secnum_depth`` of the configuration, 1 by default), leaving LaTeX's counters
  as they were: figures and equations are (chapter.n) in both, and so are theorems and exercises.
- **Maths wherever a title appears.** Sphinx loads MathJax only on pages whose body has maths, but
  a chapter title with maths also appears in the sidebar of every page (the Bibliography, Search,
  Index and Proof-index pages included) and there showed as raw TeX. The HTML assets policy
  ``always`` loads the book's MathJax (``offline_mathjax``) on every page.
- **Print.** ``companion.css`` wraps long code lines and outputs when a page is printed, instead of
  cutting them at the margin behind a useless scrollbar.
- **Execution status.** The directive ``{execution-status}`` (``book/status.md``) is a table with
  one row per chapter: when it was last executed, how long it ran, the hash of the library that
  ran it (and whether that is the library of this build) and whether every cell passed, as
  QuantEcon's status page, with MyST-NB's execution data where this build executed the chapter and
  the notebook's own cell timings where it rendered committed outputs.
- **One search bar.** sphinx-book-theme 1.x draws a second header across the top of every page that
  holds only the search button (pydata-sphinx-theme's ``navbar_persistent``); the book keeps the
  sidebar's search field and the ``Ctrl+K`` shortcut.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

CSS = "companion.css"
HTML_NUMFIG_DEPTH = 1      # Sphinx's default; the HTML build's numfig_secnum_depth


def _html_numbering_in_latex(app, env):
    """``env-get-updated`` (after Sphinx's own): theorem and exercise numbers as in the HTML."""
    if app.builder.format != "latex":
        return []
    from sphinx.environment.collectors.toctree import TocTreeCollector

    latex_depth = env.config.numfig_secnum_depth
    env.config.numfig_secnum_depth = app.companion_html_numfig_depth
    try:
        return TocTreeCollector().assign_figure_numbers(env)
    finally:
        env.config.numfig_secnum_depth = latex_depth


def _config_inited(app, config):
    # remembered before sphinx-jupyterbook-latex changes it for the LaTeX builder (builder-inited)
    app.companion_html_numfig_depth = config.numfig_secnum_depth
    # one search bar: no persistent search button in a header of its own
    options = dict(config.html_theme_options or {})
    options.setdefault("navbar_persistent", [])
    config.html_theme_options = options


def _builder_inited(app):
    if app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(Path(__file__).with_name(CSS), target / CSS)


class execution_status(nodes.General, nodes.Element):
    """Placeholder for the execution status table, filled in once every chapter has been read."""


class ExecutionStatus(SphinxDirective):
    has_content = False

    def run(self):
        return [execution_status()]


def _timings(path: Path):
    """(start, end) of the last execution of a notebook from nbclient's cell timings, or Nones."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    stamps = [c.metadata.get("execution", {}) for c in nb.cells if c.cell_type == "code"]
    start = [t["iopub.execute_input"] for t in stamps if "iopub.execute_input" in t]
    end = [t["shell.execute_reply"] for t in stamps if "shell.execute_reply" in t]
    errors = any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))

    def parse(text):
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return (parse(min(start)) if start else None, parse(max(end)) if end else None, not errors)


def status_rows(app):
    """One dict per chapter: chapter, executed (UTC), method, runtime (s), library hash, current, passed."""
    from companion.book import results

    folder = Path(os.environ["COMPANION_RESULTS_DIR"]) if os.environ.get("COMPANION_RESULTS_DIR") else None
    current = results.library_hash()
    try:
        from myst_nb.sphinx_ import NbMetadataCollector

        exec_data = {d: v.get("exec_data") for d, v in NbMetadataCollector.get_doc_data(app.env).items()}
    except Exception:                                    # pragma: no cover - other myst-nb versions
        exec_data = {}
    rows = []
    for path in sorted((Path(app.srcdir) / "book" / "chapters").glob("[0-9][0-9]_*.ipynb")):
        docname = f"book/chapters/{path.stem}"
        data = exec_data.get(docname)
        start, end, passed = _timings(path)
        if data:                                         # executed (or taken from the cache) by this build
            when = datetime.fromtimestamp(data["mtime"], tz=timezone.utc) if data.get("mtime") else end
            method, runtime, passed = data["method"], data.get("runtime"), bool(data["succeeded"])
        else:                                            # the committed outputs, as rendered
            when, method = end, "committed outputs"
            runtime = (end - start).total_seconds() if start and end else None
        file = next((f / f"{path.stem}.json" for f in (folder, results.book_results_dir())
                     if f is not None and (f / f"{path.stem}.json").is_file()), None)
        lib = json.loads(file.read_text(encoding="utf-8")).get("library_hash") if file else None
        rows.append({"docname": docname, "executed": when, "method": method, "runtime": runtime,
                     "library_hash": lib, "current": lib == current, "passed": passed and file is not None})
    return rows


class ExecutionStatusTable(SphinxPostTransform):
    default_priority = 8               # before the references are resolved (the chapter links)

    def run(self, **kwargs):
        from sphinx.addnodes import pending_xref

        for node in list(self.document.findall(execution_status)):
            heads = ["Chapter", "Last execution (UTC)", "Method", "Run time (s)", "Library hash", "Passed"]
            table = nodes.table(classes=["colwidths-auto", "execution-status"])
            group = nodes.tgroup(cols=len(heads))
            table += group
            group += [nodes.colspec(colwidth=1) for _ in heads]
            head, body = nodes.thead(), nodes.tbody()
            group += [head, body]
            head += nodes.row("", *[nodes.entry("", nodes.paragraph(text=h)) for h in heads])
            for r in status_rows(self.app):
                link = pending_xref("", refdoc=self.env.docname, reftype="doc", refdomain="std",
                                    refexplicit=False, reftarget="/" + r["docname"])
                link += nodes.inline(text=r["docname"].rsplit("/", 1)[1])
                lib = (r["library_hash"] or "none") + ("" if r["current"] else " (not this build's)")
                cells = [nodes.paragraph("", "", link),
                         nodes.paragraph(text=r["executed"].strftime("%Y-%m-%d %H:%M") if r["executed"] else "-"),
                         nodes.paragraph(text=str(r["method"])),
                         nodes.paragraph(text="-" if r["runtime"] is None else f"{r['runtime']:.1f}"),
                         nodes.paragraph(text=lib),
                         nodes.paragraph(text="yes" if r["passed"] else "no")]
                body += nodes.row("", *[nodes.entry("", c) for c in cells])
            node.replace_self(table)


def setup(app):
    app.add_node(execution_status)
    app.add_directive("execution-status", ExecutionStatus)
    app.add_post_transform(ExecutionStatusTable)
    app.set_html_assets_policy("always")
    app.add_css_file(CSS)
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _builder_inited)
    app.connect("env-get-updated", _html_numbering_in_latex, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
