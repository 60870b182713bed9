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
- **One search bar.** sphinx-book-theme 1.x draws a second header across the top of every page that
  holds only the search button (pydata-sphinx-theme's ``navbar_persistent``); the book keeps the
  sidebar's search field and the ``Ctrl+K`` shortcut.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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


def setup(app):
    app.set_html_assets_policy("always")
    app.add_css_file(CSS)
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _builder_inited)
    app.connect("env-get-updated", _html_numbering_in_latex, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
