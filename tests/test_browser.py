"""The built book as a reader sees it: every page rendered by headless Chromium with no network.

Chromium runs with the network off (every host name fails to resolve and every request goes to a
dead proxy), as for a book read offline or behind a firewall. Fails on a rendered traceback or
error/stderr output, an empty or unresolved glued value, a missing figure, a broken internal link
(file or anchor), or, on a page with maths, maths that MathJax did not render (no ``mjx-container``
output, or a raw TeX delimiter left visible) or a MathJax loaded from anywhere but the book. Each
page costs one Chromium launch, shared by both tests (:func:`_probe`). With ``COMPANION_SCREENSHOTS=1``
each page is also shot into ``screenshots/`` (not committed) for a human to look at; off by default, as
no test reads them and the shots were a third of this file's launches. Skipped, with the reason, where
Chromium is not installed (``make test`` installs Debian's ``chromium`` package when it can).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=5000",
         # no network: the book must bring everything it shows, MathJax included
         "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"]
RAW_TEX = ("\\(", "\\)", "\\[", "\\]", "$$")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed "
                                 "(apt-get install chromium; make test does it when it can)")]


def _pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return files


_IDS: dict = {}


def _ids(page: Path) -> set:
    """Element ids of a built page, parsed once per session (the API page alone has ~600 anchors)."""
    if page not in _IDS:
        from bs4 import BeautifulSoup

        soup = BeautifulSoup(page.read_text(), "html.parser")
        _IDS[page] = {tag["id"] for tag in soup.find_all(id=True)}
    return _IDS[page]


def _render(page: Path, profile: Path, shot: Path) -> str:
    """The DOM of ``page`` once Chromium has run its scripts (MathJax included): the DOM of the page's
    measuring copy (:func:`_probe`), so each page costs one Chromium launch for both tests."""
    dom, _ = _probe(page, profile)
    if os.environ.get("COMPANION_SCREENSHOTS", "") not in ("", "0"):
        shot.parent.mkdir(exist_ok=True)
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}",
                        f"--window-size={WIDTH},1600", page.as_uri()], capture_output=True, text=True, timeout=120)
    return dom


@pytest.mark.parametrize("doc", _pages())
def test_page_renders_cleanly_in_chromium(doc, book_html, tmp_path):
    from bs4 import BeautifulSoup

    page = book_html / f"{doc}.html"
    assert page.is_file(), f"{doc}.html was not built"
    shot = ROOT / "screenshots" / f"{Path(doc).name}.png"
    soup = BeautifulSoup(_render(page, tmp_path / "profile", shot), "html.parser")
    main = soup.find("main") or soup
    text = main.get_text(" ")
    assert "Traceback (most recent call last)" not in text, "a traceback is rendered"
    bad = main.select("div.output.error, div.output.stderr, div.cell_output .stderr, .traceback")
    assert not bad, f"error or stderr output rendered: {bad[0].get_text()[:300]!r}"
    _check_maths(page, soup, main)
    for span in main.select("span.pasted-text"):
        assert span.get_text().strip(), "an empty glued value"
    if doc.startswith("book/chapters/"):   # (the API page quotes the role in a docstring)
        assert "{glue" not in text, "an unresolved glue role"
    from docutils.nodes import make_id

    for img in main.find_all("img"):
        src = unquote(urlparse(img.get("src", "")).path)
        assert src and (page.parent / src).resolve().is_file(), f"missing image {src!r}"
        assert (page.parent / src).stat().st_size > 1000, f"empty image {src!r}"
    if doc.startswith("book/chapters/"):
        nb = json.loads((ROOT / f"{doc}.ipynb").read_text())
        names = [c["metadata"]["mystnb"]["figure"]["name"] for c in nb["cells"]
                 if "figure" in c.get("metadata", {}).get("mystnb", {})]
        for name in names:
            fig = main.find(id=make_id(name))          # Sphinx lower-cases ids (fig-mh-largest-H)
            assert fig is not None and fig.find("img") is not None, f"figure {name!r} has no image"
    for a in main.find_all("a", href=True):
        href = a["href"]
        parsed = urlparse(href)
        if parsed.scheme or href.startswith(("mailto:", "javascript:")):
            continue
        target = page if not parsed.path else (page.parent / unquote(parsed.path)).resolve()
        assert target.is_file(), f"broken link {href!r}"
        if parsed.fragment and target.suffix == ".html":
            assert parsed.fragment in _ids(target), f"broken anchor {href!r}"


# Measured in the page once MathJax has typeset it: every code cell's input and output, and every
# displayed equation, whose content is wider than its box (it would scroll sideways).
_MEASURE = """<script>
window.addEventListener("load", function () {
  var measure = function () {
    var wide = function (el) { return el.scrollWidth > el.clientWidth + 1; };
    var out = [];
    document.querySelectorAll("main div.cell").forEach(function (cell, k) {
      var pre = cell.querySelector("div.cell_input pre");
      if (pre && wide(pre)) out.push("code cell " + k + " input: " + pre.scrollWidth + " px in "
        + pre.clientWidth + " px: " + pre.textContent.split("\\n")[0].slice(0, 60));
      cell.querySelectorAll("div.cell_output pre").forEach(function (o) {
        if (wide(o)) out.push("code cell " + k + " output: " + o.scrollWidth + " px in "
          + o.clientWidth + " px: " + o.textContent.slice(0, 60));
      });
    });
    document.querySelectorAll("main div.math").forEach(function (m) {
      var box = m.querySelector("mjx-container") || m;    // MathJax's box scrolls (overflow-x: auto)
      var eqno = m.querySelector(".eqno");
      if (wide(box)) out.push("equation " + (eqno ? eqno.textContent.replace("#", "").trim()
        : "unnumbered") + ": " + box.scrollWidth + " px in " + box.clientWidth + " px");
    });
    document.body.setAttribute("data-too-wide", JSON.stringify(out));
  };
  (window.MathJax && MathJax.startup ? MathJax.startup.promise : Promise.resolve()).then(measure);
});
</script>"""
WIDTH = 1280   # the browser window of the screenshots: a desktop, where the theme shows its default widths


_PROBED: dict = {}


def _probe(page: Path, profile: Path) -> tuple[str, list]:
    """``(dom, too_wide)`` of ``page`` in a ``WIDTH``-pixel window, from one Chromium launch per page
    and session: a copy of the page (its links resolved against the built folder by a ``<base>``)
    measures itself with ``_MEASURE`` once MathJax has typeset it; ``dom`` is the DOM Chromium dumps
    (the built page's, plus that script and the ``data-too-wide`` attribute it sets on ``<body>``),
    ``too_wide`` what scrolls sideways."""
    from bs4 import BeautifulSoup

    if page not in _PROBED:
        html = page.read_text()
        html = html.replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1)
        html = html.replace("</body>", _MEASURE + "</body>", 1)
        profile.mkdir(parents=True, exist_ok=True)  # the copy lives with the browser profile and goes with it
        probe = profile / f"measure-{page.name}"
        probe.write_text(html)
        dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},1600",
                              "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0, dom.stderr[-2000:]
        body = BeautifulSoup(dom.stdout, "html.parser").find("body")
        assert body is not None and body.has_attr("data-too-wide"), "the page's measurement did not run"
        _PROBED[page] = (dom.stdout, json.loads(body["data-too-wide"]))
    return _PROBED[page]


def _too_wide(page: Path, profile: Path) -> list:
    """What scrolls sideways on ``page`` in a ``WIDTH``-pixel window (:func:`_probe`)."""
    return _probe(page, profile)[1]


@pytest.mark.parametrize("doc", [d for d in _pages() if d.startswith("book/chapters/")])
def test_no_code_cell_or_equation_scrolls_sideways(doc, book_html, tmp_path):
    """Issue 23, item 5: on screen, in a WIDTH-pixel window, no code cell's input or output is wider
    than its box (code lines are at most 88 characters and book/_ext/companion.css fits 88 columns;
    outputs wrap), and no displayed equation is (a long one is broken over aligned or gathered rows,
    keeping its label and number)."""
    wide = _too_wide(book_html / f"{doc}.html", tmp_path / "profile")
    cells = [w for w in wide if w.startswith("code cell")]
    assert not cells, f"{doc}: {len(cells)} code cells scroll sideways:\n" + "\n".join(cells[:12])
    equations = [w for w in wide if w.startswith("equation")]
    assert not equations, f"{doc}: {len(equations)} equations scroll sideways:\n" + "\n".join(equations)


def _check_maths(page: Path, soup, main) -> None:
    """Every maths element of the page was typeset by the book's own MathJax; no raw TeX is visible."""
    from bs4 import BeautifulSoup

    built = BeautifulSoup(page.read_text(), "html.parser")
    n_math = len((built.find("main") or built).select(".math"))
    scripts = [s.get("src", "") for s in soup.find_all("script") if "mathjax" in s.get("src", "").lower()]
    assert not [s for s in scripts if urlparse(s).scheme], f"MathJax loaded from the network: {scripts}"
    if n_math == 0:
        return
    assert any("_static/mathjax/tex-mml-chtml.js" in s for s in scripts), f"no local MathJax: {scripts}"
    maths = main.select(".math")
    assert len(maths) == n_math
    unrendered = [m for m in maths if m.find("mjx-container") is None]
    assert not unrendered, f"{len(unrendered)} of {n_math} maths not rendered, e.g. {unrendered[0].get_text()[:80]!r}"
    for m in maths:
        for c in m.find_all("mjx-assistive-mml"):
            c.decompose()                  # MathML for screen readers, hidden
        text = m.get_text(" ")
        assert not any(d in text for d in RAW_TEX), f"raw TeX visible: {text[:80]!r}"
