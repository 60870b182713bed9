"""Serve MathJax 3 with the book, so that its maths renders with no network (issue 11, part 3).

A Sphinx extension (listed in ``_config.yml`` under ``sphinx.local_extensions``). At every HTML
build it copies the MathJax 3 components the book needs from the installed ``django-static-mathjax``
package (MathJax 3.2.2, a dependency of the ``[book]`` extra in ``pyproject.toml``) into the build's
``_static/mathjax/`` and points Sphinx's ``mathjax_path`` there instead of the CDN. The
``mathjax3_config`` of ``_config.yml`` (the macros) applies unchanged.
"""

import shutil
from pathlib import Path

#: What the CHTML output of ``tex-mml-chtml.js`` loads at run time (fonts, TeX extensions, menu).
PARTS = ["tex-mml-chtml.js", "output/chtml", "output/chtml.js", "input", "ui", "a11y", "adaptors"]
SCRIPT = "mathjax/tex-mml-chtml.js"


def mathjax_dir() -> Path:
    """The ``es5`` folder of the installed MathJax 3 (``pip install django-static-mathjax``)."""
    try:
        import mathjax
    except ImportError:
        raise RuntimeError("MathJax 3 is not installed: pip install 'django-static-mathjax>=3.2.2.1,<4' "
                           "(in the [book] extra of pyproject.toml; make book installs it)") from None
    folder = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (folder / "tex-mml-chtml.js").is_file():
        raise RuntimeError(f"{folder} holds no MathJax 3 (tex-mml-chtml.js); reinstall django-static-mathjax")
    return folder


def _config_inited(app, config):
    config.mathjax_path = SCRIPT          # relative: served from the build's _static folder


def _builder_inited(app):
    if app.builder.format != "html":
        return
    source = mathjax_dir()
    target = Path(app.outdir) / "_static" / "mathjax"
    for part in PARTS:
        src, dst = source / part, target / part
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
