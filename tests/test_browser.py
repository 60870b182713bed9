"""The built book as a reader sees it: every page rendered by headless Chromium.

Fails on a rendered traceback or error/stderr output, an empty or unresolved glued value, a missing
figure, or a broken internal link (file or anchor). Screenshots go to ``screenshots/`` (not
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
         "--hide-scrollbars", "--virtual-time-budget=3000"]

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
    for span in main.select("span.pasted-text"):
        assert span.get_text().strip(), "an empty glued value"
    if doc.startswith("book/chapters/"):   # (the API page quotes the role in a docstring)
        assert "{glue" not in text, "an unresolved glue role"
    for img in main.find_all("img"):
        src = unquote(urlparse(img.get("src", "")).path)
        assert src and (page.parent / src).resolve().is_file(), f"missing image {src!r}"
        assert (page.parent / src).stat().st_size > 1000, f"empty image {src!r}"
    if doc.startswith("book/chapters/"):
        nb = json.loads((ROOT / f"{doc}.ipynb").read_text())
        names = [c["metadata"]["mystnb"]["figure"]["name"] for c in nb["cells"]
                 if "figure" in c.get("metadata", {}).get("mystnb", {})]
        for name in names:
            fig = main.find(id=name)
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
