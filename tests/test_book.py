"""The book as readers get it (issue 23): folded answers, one numbering, no raw TeX, no stale
cross-references, one search bar, glue only through ``results``, a deploy and a release.

The fast tests read the sources; the slow ones read the HTML built once per session
(``book_html`` in ``tests/conftest.py``: the committed outputs, no execution, ``-n -W``).
"""

import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell):
    return "".join(cell["source"])


# -- 1. Exercise answers inside the folds ---------------------------------------------------------

def _solution_code_outside_the_fold(path):
    """Code cells that come after a solution (before the next exercise or heading) but outside a
    ``solution-start``/``solution-end`` gate: sphinx-exercise would show them after the folded box."""
    outside, gated, after_solution = [], False, False
    for k, cell in enumerate(_cells(path)):
        text = _source(cell)
        if cell["cell_type"] == "markdown":
            if "{exercise}" in text or re.search(r"^#", text, re.M):
                after_solution = False
            if re.search(r"\{solution\}", text):
                after_solution = True
            if "{solution-start}" in text:
                gated, after_solution = True, True
            if "{solution-end}" in text:
                assert gated, f"{path.stem}: cell {k} ends a solution that was not started"
                gated = False
        elif after_solution and not gated:
            outside.append(k)
    assert not gated, f"{path.stem}: a solution-start without solution-end"
    return outside


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_solution_code_cell_is_inside_its_fold(path):
    outside = _solution_code_outside_the_fold(path)
    assert not outside, (f"{path.stem}: code cells {outside} follow a solution outside its dropdown; "
                         "use the gated syntax (solution-start, the code cell, solution-end)")


def test_the_fold_check_finds_an_ungated_solution(tmp_path):
    """The check above on the old layout: a closed {solution} box followed by its code cell."""
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["```{exercise}\n:label: ex\nDo it.\n```\n\n",
                                             "```{solution} ex\n:class: dropdown\nLike this.\n```"]},
        {"cell_type": "code", "source": ["print(1)"]},
        {"cell_type": "markdown", "source": ["## Next"]},
        {"cell_type": "code", "source": ["print(2)"]}]}
    path = tmp_path / "99_x.ipynb"
    path.write_text(json.dumps(nb))
    assert _solution_code_outside_the_fold(path) == [1]


@pytest.mark.slow
def test_built_solutions_hold_their_prose_code_and_output(book_html):
    """In the HTML every folded solution holds its explanation and its code cell with the output."""
    from bs4 import BeautifulSoup

    for path in CHAPTERS:
        gated = sum(1 for c in _cells(path) if c["cell_type"] == "markdown" and "{solution-start}" in _source(c))
        soup = BeautifulSoup((book_html / "book" / "chapters" / f"{path.stem}.html").read_text(), "html.parser")
        solutions = soup.select("div.solution")
        assert len(solutions) >= gated
        for sol in solutions:
            assert "dropdown" in sol["class"], f"{path.stem}: a solution that is not folded"
            title = sol.select_one(".admonition-title").get_text(" ", strip=True)
            body = sol.get_text(" ", strip=True)[len(title):]
            assert len(body) > 40, f"{path.stem}: {title!r} lost its explanation"
        held = [s for s in solutions if s.select("div.cell")]
        assert len(held) == gated, f"{path.stem}: {gated} gated solutions, {len(held)} hold a code cell"


# -- 4. No raw TeX reaching the reader --------------------------------------------------------------

#: TeX as a reader must not see it: maths delimiters, a command, a braced sub/superscript, d^2
RAW_TEX = re.compile(r"\\[()\[\]]|\$\$|\\[A-Za-z]+|[_^]\{|\w\^\d")


def _titles_and_referenced_headings():
    """(where, heading) for every page title and every heading a ``{ref}`` points to."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    docs = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    texts = {}
    for doc in docs:
        nb, md = ROOT / f"{doc}.ipynb", ROOT / f"{doc}.md"
        texts[doc] = ("\n".join(_source(c) for c in _cells(nb) if c["cell_type"] == "markdown")
                      if nb.is_file() else md.read_text(encoding="utf-8"))
    referenced = {m for t in texts.values() for m in re.findall(r"\{ref\}`(?:[^`<]*<)?([^`>]+)>?`", t)}
    found = []
    for doc, text in texts.items():
        first = re.search(r"^# (.+)$", text, re.M)
        if first:
            found.append((f"{doc}: page title", first.group(1)))
        for label, heading in re.findall(r"^\(([^)]+)\)=\s*\n#+ (.+)$", text, re.M):
            if label in referenced:
                found.append((f"{doc}: heading of {{ref}}`{label}`", heading))
    return found


def test_titles_have_a_plain_text_form():
    """A page title is also the browser's title, the sidebar entry on pages without maths, the PDF
    bookmark, and with every referenced heading the text of each ``{ref}`` link: plain text there."""
    found = _titles_and_referenced_headings()
    assert len(found) > 8
    bad = [(where, h) for where, h in found if "$" in h or RAW_TEX.search(h)]
    assert not bad, f"maths in a title (write it in Unicode, e.g. d + d², ±1): {bad}"


def _raw_tex_in_page(page: Path):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    problems = []
    title = soup.title.get_text() if soup.title else ""
    if RAW_TEX.search(title):
        problems.append(f"<title> {title!r}")
    has_maths = bool(soup.select(".math"))
    scripts = [s.get("src", "") for s in soup.find_all("script")]
    if has_maths and not any("_static/mathjax/tex-mml-chtml.js" in s for s in scripts):
        problems.append("maths on a page that loads no MathJax")
    for tag in soup.select(".math, pre, code, script, style, div.highlight, div.cell_output, title"):
        tag.decompose()
    for m in RAW_TEX.finditer(soup.get_text(" ")):
        text = soup.get_text(" ")
        problems.append(repr(text[max(0, m.start() - 40):m.end() + 20]))
    return problems


@pytest.mark.slow
def test_no_raw_tex_on_any_built_page(book_html):
    """Every page, the Bibliography, Search, Index, Proof-index and Library reference included."""
    pages = sorted(book_html.rglob("*.html"))
    assert {"search.html", "genindex.html", "prf-prf.html"} <= {p.name for p in pages}
    bad = {str(p.relative_to(book_html)): found for p in pages if (found := _raw_tex_in_page(p))}
    assert not bad, f"raw TeX reaches the reader: {bad}"


# -- 2. One numbering in HTML and PDF -------------------------------------------------------------

NUMBERED = r"((?:Solution to )?[A-Z][a-z]+ \d+(?:\.\d+)*)"


def _html_numbers(html: Path):
    """{label: "Theorem 5.1"} of every theorem-like and exercise box, and {label: [link texts]}."""
    from bs4 import BeautifulSoup

    numbers, refs = {}, {}
    for page in sorted((html / "book" / "chapters").glob("*.html")):
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for box in soup.select("div.proof[id], div.exercise[id], div.solution[id]"):
            title = box.select_one(".admonition-title").get_text(" ", strip=True)
            m = re.match(NUMBERED, title)
            if m:
                numbers[box["id"]] = m.group(1)
        for a in soup.select("a.reference.internal[href*='#']"):
            if a.find_parent(class_="admonition-title"):
                continue               # "Solution to Exercise 2.1" links its exercise; the PDF does not
            label = a["href"].rsplit("#", 1)[1]
            m = re.fullmatch(NUMBERED, a.get_text(" ", strip=True))
            if m:
                refs.setdefault(label, []).append(m.group(1))
    return numbers, {k: v for k, v in refs.items() if k in numbers}


def _latex_numbers(tex: str):
    """The same from the LaTeX source of the PDF (sphinx-proof and sphinx-exercise write the
    numbers into it as text: the PDF prints what the .tex says)."""
    numbers = {}
    for m in re.finditer(r"\\begin\{sphinxadmonition\}\{note\}\{" + NUMBERED, tex):
        before = tex[max(0, m.start() - 600):m.start()]
        labels = re.findall(r"\\label\{(?:\\detokenize\{)?(?:[^{}]*:)?([^{}:]+)\}", before)
        if labels:                     # the box's own label is the last one before it
            numbers[labels[-1]] = m.group(1)
    refs = {}
    # \hyperref[\detokenize{doc:label}]{\sphinxcrossref{Theorem 2.1}}, and sphinx-exercise's
    # \hyperref[exercise:label]{Exercise 4.2}
    for label, text in re.findall(r"\\hyperref\[(?:\\detokenize\{)?[^{}\]]*:([^{}:\]]+)\}?\]\{(?:\\sphinxcrossref\{)?"
                                  + NUMBERED + r"\}", tex):
        refs.setdefault(label, []).append(text)
    return numbers, {k: v for k, v in refs.items() if k in numbers}


@pytest.mark.slow
def test_html_and_pdf_number_theorems_and_exercises_alike(book_html, book_latex):
    """Exercise 2.1 and Theorem 5.1 are so in both, as titles and as the text of every reference."""
    html_numbers, html_refs = _html_numbers(book_html)
    tex_numbers, tex_refs = _latex_numbers((book_latex / "companion.tex").read_text(encoding="utf-8"))
    assert len(html_numbers) >= 20 and any(v.startswith("Exercise") for v in html_numbers.values())
    assert sum(map(len, html_refs.values())) >= 10
    assert tex_numbers == html_numbers
    assert {k: sorted(v) for k, v in tex_refs.items()} == {k: sorted(v) for k, v in html_refs.items()}


def _html_equation_numbers(html: Path) -> dict:
    """{"06_multi_head:eq-mh-hessian": "6.4"} of every labelled displayed equation of the chapters."""
    numbers = {}
    for page in sorted((html / "book" / "chapters").glob("*.html")):
        for label, number in re.findall(r'id="equation-([^"]+)">\s*<span class="eqno">\(([\d.]+)\)',
                                        page.read_text(encoding="utf-8")):
            numbers[f"{page.stem}:{label}"] = number
    return numbers


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("xelatex") is None,
                    reason="xelatex is not installed (make pdf installs TeX Live when it can)")
def test_html_and_pdf_number_equations_alike(book_html, book_latex, tmp_path):
    """Every labelled equation has the same number in the PDF as in the HTML, those broken over
    aligned or gathered rows included (one number each). LaTeX, not the .tex, numbers the PDF's
    equations: one xelatex pass over companion.tex writes them into companion.aux."""
    import subprocess

    work = tmp_path / "latex"
    shutil.copytree(book_latex, work)
    proc = subprocess.run(["xelatex", "-no-pdf", "-interaction=nonstopmode", "-halt-on-error", "companion.tex"],
                          cwd=work, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    aux = (work / "companion.aux").read_text(encoding="utf-8", errors="replace")
    pdf = {f"{Path(doc).name}:{label}": number for doc, label, number in
           re.findall(r"\\newlabel\{equation:([^:{}]+):([^{}]+)\}\{\{([^{}]*)\}", aux)}
    html = _html_equation_numbers(book_html)
    assert len(html) >= 30, f"only {len(html)} numbered equations found in the HTML"
    differ = {k: (html.get(k), pdf.get(k)) for k in sorted(html.keys() | pdf.keys()) if html.get(k) != pdf.get(k)}
    assert not differ, f"equations numbered differently, label: (HTML, PDF): {differ}"


# -- 6. One search bar ----------------------------------------------------------------------------

@pytest.mark.slow
def test_one_search_field_per_page(book_html):
    """The sidebar's search field (and Ctrl+K); no header across the top that holds another one."""
    from bs4 import BeautifulSoup

    for page in [book_html / "book" / "intro.html", *sorted((book_html / "book" / "chapters").glob("*.html"))]:
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        fields = soup.select("button.search-button-field")
        assert len(fields) == 1, f"{page.name}: {len(fields)} search fields"
        assert fields[0].find_parent(class_="bd-sidebar-primary") is not None, f"{page.name}: not the sidebar's"
        header = soup.select_one("#pst-header")
        assert header is None or not header.get_text(strip=True), f"{page.name}: a header bar {header.get_text(' ', strip=True)!r}"


# -- 3. No stale cross-references after an incremental build: tests/test_chapters.py
# (test_make_book_after_a_library_edit_shows_the_new_value inserts an equation in the same two builds)


# -- 7. glue only through companion.book.results --------------------------------------------------------

def _direct_glue_calls(source: str):
    """Lines of Python ``source`` that call myst-nb's ``glue`` or import it (any alias)."""
    import ast

    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("myst_nb"):
            found += [node.lineno for a in node.names if a.name in ("glue", "*")]
        elif isinstance(node, ast.Import) and any(a.name.startswith("myst_nb") for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name == "glue":
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapters_glue_only_through_results(path):
    """A direct ``glue(name, np.float64(...))`` breaks the strict build with a format spec and shows
    ``np.float64(...)`` without one; ``results.publish``/``results.claim`` glue formatted text."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            assert not _direct_glue_calls(code), (f"{path.stem}, cell {k}: glue called directly; publish the "
                                                  "number with companion.book.results.publish(name, value, fmt=...)")


def test_the_glue_check_finds_direct_calls():
    assert _direct_glue_calls("from myst_nb import glue\nglue('x', 1)") == [1, 2]
    assert _direct_glue_calls("import myst_nb\nmyst_nb.glue('x', 1)") == [1, 2]
    assert _direct_glue_calls("from myst_nb import glue as g") == [1]
    assert _direct_glue_calls("results.publish('x', 1.0, fmt='{:.2f}')") == []


# -- Launch and repository buttons ----------------------------------------------------------------

_BUTTONS = [  # (button, URL pattern of sphinx-book-theme with the repository's path in `path`)
    ("Colab", r"https://colab\.research\.google\.com/github/(?P<repo>[^/]+/[^/]+)/blob/(?P<branch>[^/]+)/(?P<path>.+)"),
    ("Binder", r"https://mybinder\.org/v2/gh/(?P<repo>[^/]+/[^/]+)/(?P<branch>[^/?]+)\?urlpath=tree/(?P<path>.+)"),
    ("GitHub file", r"https://github\.com/(?P<repo>[^/]+/[^/]+)/(?:blob|edit)/(?P<branch>[^/]+)/(?P<path>.+)"),
    ("repository", r"https://github\.com/(?P<repo>[^/]+/[^/]+?)/?"),
]


def _button_target(url: str):
    for kind, pattern in _BUTTONS:
        m = re.fullmatch(pattern, url)
        if m:
            return kind, m.groupdict()
    return None, None


@pytest.mark.slow
def test_launch_and_repository_buttons_open_files_of_the_repository(book_html):
    """Each Binder, Colab and repository link of every page, read by the theme's URL pattern, names
    `repository.url` and `branch` of _config.yml and a file the repository tracks, with no /./."""
    import subprocess

    import yaml
    from bs4 import BeautifulSoup

    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    owner_name = repo["url"].removeprefix("https://github.com/").strip("/")
    tracked = set(subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                                 check=True).stdout.split())
    seen = {}
    for page in sorted(book_html.rglob("*.html")):
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for a in soup.select("div.article-header-buttons a[href], .header-article-items a[href]"):
            kind, parts = _button_target(a["href"])
            if kind is None:
                continue
            seen.setdefault(kind, 0)
            seen[kind] += 1
            assert parts["repo"] == owner_name, f"{page.name}: {a['href']} is not {repo['url']}"
            if "path" in parts:
                assert parts["branch"] == repo["branch"], a["href"]
                assert "/./" not in a["href"] and not parts["path"].startswith("."), f"{page.name}: {a['href']}"
                assert parts["path"] in tracked, f"{page.name}: {kind} opens {parts['path']!r}, not a tracked file"
    n_chapters = len(CHAPTERS)
    assert seen.get("Colab", 0) >= n_chapters and seen.get("Binder", 0) >= n_chapters, seen
    assert seen.get("repository", 0) > n_chapters, seen


def test_the_button_patterns_read_the_theme_urls():
    kind, parts = _button_target("https://mybinder.org/v2/gh/o/r/main?urlpath=tree/./book/chapters/a.ipynb")
    assert kind == "Binder" and parts["path"] == "./book/chapters/a.ipynb"
    kind, parts = _button_target("https://colab.research.google.com/github/o/r/blob/main/book/x.ipynb")
    assert kind == "Colab" and parts == {"repo": "o/r", "branch": "main", "path": "book/x.ipynb"}
    assert _button_target("https://github.com/o/r")[0] == "repository"


# -- Execution status page ------------------------------------------------------------------------

@pytest.mark.slow
def test_status_page_has_a_row_per_chapter_with_its_library_hash(book_html):
    """book/status.md: chapter, last execution, method, run time, library hash, passed; the hash is
    the one in the chapter's results file and is flagged when it is not this library's."""
    from bs4 import BeautifulSoup

    from companion.book import results

    soup = BeautifulSoup((book_html / "book" / "status.html").read_text(encoding="utf-8"), "html.parser")
    rows = [[c.get_text(" ", strip=True) for c in tr.select("td")] for tr in soup.select("table.execution-status tbody tr")]
    assert len(rows) == len(CHAPTERS)
    current = results.library_hash()
    for path, (chapter, when, method, runtime, lib, passed) in zip(CHAPTERS, rows):
        data = json.loads((ROOT / "data" / "results" / f"{path.stem}.json").read_text())
        assert lib.split()[0] == data["library_hash"]
        assert ("not this build's" in lib) == (data["library_hash"] != current)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", when) and when[:10] == data["created"][:10]
        assert method == "committed outputs" and float(runtime) > 0 and passed == "yes"


# -- The deploy ------------------------------------------------------------------------------------

def _readme_commands():
    """Every command line in the README's ``bash`` blocks (comments and continuations joined)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = set()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                commands.add(" ".join(line.split()))
    return commands


def test_deploy_workflow_builds_with_the_readme_commands_and_deploys_the_html():
    """.github/workflows/deploy.yml is valid YAML: on a push to main it runs the README's commands,
    uploads _build/html (where the README says the book is) and deploys it to GitHub Pages."""
    import yaml

    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    trigger = wf.get("on", wf.get(True))            # YAML 1.1 reads a bare `on` as true
    assert trigger["push"]["branches"] == ["main"]
    assert wf["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    build, deploy = wf["jobs"]["build"], wf["jobs"]["deploy"]
    runs = [" ".join(s["run"].split()) for s in build["steps"] if "run" in s]
    readme = _readme_commands()
    assert runs and set(runs) <= readme, f"not commands of the README: {sorted(set(runs) - readme)}"
    assert "make book" in runs
    uses = {s["uses"].split("@")[0]: s for s in build["steps"] if "uses" in s}
    assert uses["actions/upload-pages-artifact"]["with"]["path"] == "_build/html"
    assert "_build/html/index.html" in (ROOT / "README.md").read_text()
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]


def test_readme_commands_are_read_from_its_bash_blocks():
    assert {"make book", "make test"} <= _readme_commands()


@pytest.mark.slow
def test_readme_names_the_download_formats_a_chapter_page_offers(book_html):
    from bs4 import BeautifulSoup

    sentence = next(s for s in (ROOT / "README.md").read_text().split(". ") if "download button" in s)
    claimed = set(re.findall(r"`(\.\w+)`", sentence))
    for path in CHAPTERS:
        soup = BeautifulSoup((book_html / "book" / "chapters" / f"{path.stem}.html").read_text(), "html.parser")
        offered = {b.get_text(strip=True) for b in soup.select(".dropdown-download-buttons ul a, "
                                                                ".dropdown-download-buttons ul button")}
        assert offered == claimed, f"{path.stem}: the page offers {sorted(offered)}, the README says {sorted(claimed)}"


# -- 5. Lines and figures that fit -----------------------------------------------------------------

@pytest.mark.slow
def test_every_page_wraps_code_when_printed_and_keeps_table_cells_whole(book_html):
    """companion.css (book/_ext) is linked on every page: code and outputs wrap on paper, and an
    output table's cells do not break inside ("(8,\\n1)")."""
    css = (book_html / "_static" / "companion.css").read_text()
    printed = css[css.index("@media print"):]
    assert re.search(r"pre[^{]*\{[^}]*white-space:\s*pre-wrap", printed)
    assert re.search(r"table\.dataframe td[^{]*\{[^}]*white-space:\s*nowrap", css)
    for page in sorted(book_html.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        if "_static" not in page.relative_to(book_html).parts and "<body" in text:
            assert re.search(r'href="[./]*_static/companion\.css', text), f"{page.name} lacks companion.css"


def _figure_cells(path):
    return [c for c in _cells(path) if "figure" in c.get("metadata", {}).get("mystnb", {})]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_figure_has_alt_text_that_says_what_it_shows(path):
    """Without ``mystnb.image.alt`` a figure's alt text is its PNG file name, a hash."""
    for cell in _figure_cells(path):
        meta = cell["metadata"]["mystnb"]
        name, alt = meta["figure"]["name"], meta.get("image", {}).get("alt", "")
        assert len(alt) >= 80, f"{path.stem}: figure {name} has no alt text (mystnb.image.alt)"
        assert alt != meta["figure"]["caption"], f"{path.stem}: {name}'s alt text repeats its caption"
        assert re.search(r"\b(plots?|charts?|axis|axes)\b", alt) and "against" in alt, \
            f"{path.stem}: {name}'s alt text does not say what is drawn against what"


@pytest.mark.slow
def test_built_figures_carry_their_alt_text(book_html):
    from bs4 import BeautifulSoup
    from docutils.nodes import make_id

    for path in CHAPTERS:
        soup = BeautifulSoup((book_html / "book" / "chapters" / f"{path.stem}.html").read_text(), "html.parser")
        for cell in _figure_cells(path):
            meta = cell["metadata"]["mystnb"]
            img = soup.find(id=make_id(meta["figure"]["name"])).find("img")   # Sphinx lower-cases ids
            assert img["alt"] == meta["image"]["alt"], f"{path.stem}: {meta['figure']['name']} alt {img['alt'][:60]!r}"


def test_reproducibility_page_lists_every_saved_record_a_chapter_reads():
    """A chapter that reads another record of data/results/ (a benchmark's or a script's, not its
    own results file) does not re-run it: book/reproducibility.md must list it (an outside reader
    found three of six records missing from its 'two chapters')."""
    page = (ROOT / "book" / "reproducibility.md").read_text(encoding="utf-8")
    own = {p.stem for p in (ROOT / "book" / "chapters").glob("0*.ipynb")}
    read = {}
    for path in sorted((ROOT / "book" / "chapters").glob("0*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for name in re.findall(r'"(\w+)\.json"', code):
            if name not in own and (ROOT / "data" / "results" / f"{name}.json").is_file():
                read.setdefault(name, set()).add(path.stem)
    assert {"bench_scale", "bench_noisy_scale", "bench_multihead", "ffn_deep", "ffn_peers", "minilm_block"} <= set(read)
    missing = {n: sorted(c) for n, c in read.items() if f"data/results/{n}.json" not in page}
    assert not missing, f"records read by chapters, not listed on book/reproducibility.md: {missing}"


def test_intro_table_maps_every_chapter():
    """The intro's table 'Paper, chapters and library' names every chapter (it stopped at 07 when
    08 and 09 existed: an outside reader's finding)."""
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    table = intro.split("## Paper, chapters and library", 1)[1].split("\n## ", 1)[0]
    for path in sorted((ROOT / "book" / "chapters").glob("0*.ipynb")):
        first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        label = re.match(r"\((ch-[\w-]+)\)=", first)
        assert label is not None, path.name
        assert f"<{label[1]}>`" in table or f"{{ref}}`{label[1]}`" in table, f"{path.stem} ({label[1]}) not in the table"
