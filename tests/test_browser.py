"""The built book as a reader sees it: every page rendered by headless Chromium with no network.

Chromium runs with the network off (every host name fails to resolve and every request goes to a
dead proxy), as for a book read offline or behind a firewall. Fails on a rendered traceback or
error/stderr output, an empty or unresolved glued value, a missing figure, a broken internal link
(file or anchor), or, on a page with maths, maths that MathJax did not render (no ``mjx-container``
output, or a raw TeX delimiter left visible) or a MathJax loaded from anywhere but the book. Screenshots go to ``screenshots/`` (not
committed). Skipped, with the reason, where Chromium is not installed (``make test`` installs
Debian's ``chromium`` package when it can).
"""

import json
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
    url = page.as_uri()
    base = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1280,1600", url],
                   capture_output=True, text=True, timeout=120)
    return dom.stdout


@pytest.mark.parametrize("doc", _pages())
def test_page_renders_cleanly_in_chromium(doc, book_html, tmp_path):
    from bs4 import BeautifulSoup

    page = book_html / f"{doc}.html"
    assert page.is_file(), f"{doc}.html was not built"
    shots = ROOT / "screenshots"
    shots.mkdir(exist_ok=True)
    soup = BeautifulSoup(_render(page, tmp_path / "profile", shots / f"{Path(doc).name}.png"), "html.parser")
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
