"""Every chapter re-run with non-default parameters, the book built with warnings as errors, and
``make book`` after a library edit.

nbval (``make test`` passes ``--nbval book/chapters``) re-executes every chapter on its defaults and
compares the outputs with the committed ones (tests/conftest.py, by the reproducibility contract);
tests/test_reproducibility.py does it again under other BLAS kernels; this file covers the rest.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from companion.book import cli
from companion.oracles import PERTURB_ENV, PERTURB_PATTERN_ENV

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_kernelspec_is_python3(path):
    """``make book`` (Jupyter Book) fails on another kernel; nbval's --nbval-current-env would hide it."""
    spec = json.loads(path.read_text())["metadata"].get("kernelspec", {})
    assert spec.get("name") == "python3", f"{path.stem}: kernelspec {spec.get('name')!r}, must be 'python3'"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_parameter_declares_its_constraint(path):
    """Each parameter line ends in '; must be SPEC' (companion.book.parameters); defaults and test parameters pass."""
    declared = cli.chapter_parameters(path.stem)
    missing = [name for name, info in declared.items() if not info["spec"]]
    assert not missing, f"{path.stem}: no '; must be ...' constraint for {', '.join(missing)} (see README, Developing)"
    cli.check_parameters(path.stem, {k: v["default"] for k, v in declared.items()})
    cli.check_parameters(path.stem, json.loads(path.read_text())["metadata"]["companion"]["test_parameters"])


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_cell_after_the_parameters_checks_and_records_every_parameter(path):
    """Plain papermill runs are checked by results.record_parameters in the next cell: it reads
    every declared name from the parameters cell and its value from the chapter's globals(), so no
    list names the parameters again (issue 34)."""
    cells = json.loads(path.read_text())["cells"]
    k = next(i for i, c in enumerate(cells) if "parameters" in c["metadata"].get("tags", []))
    source = "".join(cells[k + 1]["source"])
    assert f'results.record_parameters("{path.stem}", globals())' in source


OLD_PATHS = re.compile(r"from companion import [^\n]*\b(cli|results|nbcompare|prose|parameters|plotting|release|sweeps)\b"
                       r"|\bcompanion\.(cli|results|nbcompare|prose|parameters|plotting|release|sweeps)\b")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapters_use_the_books_new_paths(path):
    """``companion.results`` and the other old paths warn (DeprecationWarning): a chapter that used
    them would show the warning in its committed outputs."""
    old = [f"cell {k}: {m.group(0)}" for k, c in enumerate(json.loads(path.read_text())["cells"])
           if c["cell_type"] == "code" for m in OLD_PATHS.finditer("".join(c["source"]))]
    assert old == [], f"{path.stem} uses the old paths: {old}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_the_parameters_cell_hides_its_input_behind_a_named_toggle(path):
    """myst-nb's ``hide-input`` tag shows the cell's input behind a toggle labelled by
    ``mystnb.code_prompt_show``; papermill and ``companion run`` still find the ``parameters`` tag."""
    nb = json.loads(path.read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert "hide-input" in cell["metadata"]["tags"]
    assert cell["metadata"]["mystnb"]["code_prompt_show"] == "Show the parameters"
    assert cli.chapter_parameters(path.stem)["seed"]["default"] == 0


#: What a reader sees of code before a chapter's first section of content (issue 34: 15 lines).
OPENING_CODE_LINES = 15
HIDDEN = {"hide-input", "remove-input", "remove-cell"}


def visible_code_before_content(cells) -> int:
    """Non-blank code lines a reader sees between a chapter's opening (the first markdown cell:
    title, statement, overview) and the next markdown cell. A cell whose input is hidden
    (``hide-input``, ``remove-input``, ``remove-cell``) shows a toggle, not its code: it counts 0."""
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown")
    n = 0
    for c in cells[first + 1:]:
        if c["cell_type"] == "markdown":
            break
        if c["cell_type"] == "code" and not HIDDEN & set(c["metadata"].get("tags", [])):
            n += sum(1 for line in "".join(c["source"]).splitlines() if line.strip())
    return n


def test_opening_code_counts_what_a_reader_sees():
    md = {"cell_type": "markdown", "metadata": {}, "source": "# T"}
    hidden = {"cell_type": "code", "metadata": {"tags": ["parameters", "hide-input"]},
              "source": "seed = 0\n" * 30}
    shown = {"cell_type": "code", "metadata": {}, "source": "import numpy as np\n\nx = 1\n"}
    later = {"cell_type": "code", "metadata": {}, "source": "y = 2\n" * 40}
    assert visible_code_before_content([md, hidden, shown, md, later]) == 2
    assert visible_code_before_content([md, dict(hidden, metadata={}), shown, md]) == 32


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_a_chapter_opens_within_15_lines_of_code(path):
    n = visible_code_before_content(json.loads(path.read_text())["cells"])
    assert n <= OPENING_CODE_LINES, (
        f"{path.stem}: a reader sees {n} lines of code before the first section; at most "
        f"{OPENING_CODE_LINES} (hide setup with the hide-input tag, or move it to the library)")


CODE_WIDTH = 88   # book/chapters/ruff.toml's line-length: a code cell this wide fits the page


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_code_line_is_wider_than_the_page(path):
    """Code cells do not scroll sideways on screen (issue 23, item 5): every line at most 88
    characters, what ``ruff format`` cannot shorten (comments, strings) included."""
    long = [f"cell {k} line {n}: {len(line)} characters: {line.strip()[:60]!r}"
            for k, cell in enumerate(json.loads(path.read_text())["cells"]) if cell["cell_type"] == "code"
            for n, line in enumerate("".join(cell["source"]).splitlines(), 1) if len(line) > CODE_WIDTH]
    assert not long, f"{path.stem}: {len(long)} code lines over {CODE_WIDTH}:\n" + "\n".join(long[:10])


def _run_with_test_parameters(path: Path, run, out: Path):
    """``companion run`` of the chapter on its test parameters into ``out`` (a background job, in the
    suite's environment: strict, one BLAS thread); the finished process."""
    params = json.loads(path.read_text())["metadata"]["companion"]["test_parameters"]
    (out / "params.json").write_text(json.dumps(params))       # a JSON file is a YAML file of parameters
    env = dict(run.environ, OPENBLAS_NUM_THREADS="1")            # the pool's snapshot (conftest.py), not os.environ
    env.pop("COMPANION_RESULTS_DIR", None)                       # the results go next to the run's notebook
    companion = Path(os.sys.executable).with_name("companion")
    return run([str(companion), "run", path.stem, "-f", str(out / "params.json"), "-o", str(out / "run"),
                "--no-progress"], env=env, capture_output=True, text=True, timeout=3600)


def background_jobs(items):
    """The runs on test parameters, for the background pool of conftest.py (they overlap the serial suite)."""
    for item in items:
        if getattr(item, "originalname", "") == "test_chapter_runs_with_non_default_parameters":
            path = item.callspec.params["path"]
            yield {"key": ("test parameters", path.stem), "chapter": path.stem, "kind": "chapters on test parameters",
                   "fn": lambda run, out, path=path: (_run_with_test_parameters(path, run, out), out / "run")}


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_with_non_default_parameters(path, background):
    nb = json.loads(path.read_text())
    params = nb["metadata"]["companion"]["test_parameters"]
    defaults = cli.chapter_parameters(path.stem)
    assert any(params[k] != defaults[k]["default"] for k in params), "test parameters equal the defaults"
    proc, run_dir = background[("test parameters", path.stem)].result()
    assert proc.returncode == 0, f"{path.stem} on {params} stopped:\n{proc.stderr[-3000:]}"
    out = run_dir / f"{path.stem}.ipynb"
    executed = json.loads(out.read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    data = json.loads((run_dir / f"{path.stem}.json").read_text())
    recorded = {"seed": data["seed"], **data["parameters"]}
    for k, v in params.items():
        assert recorded[k] == v, f"parameter {k} was not used: recorded {recorded[k]!r}"
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    cited = set(re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", markdown))
    assert cited <= set(data["values"]) | set(recorded), f"not published: {sorted(cited - set(data['values']) - set(recorded))}"


@pytest.mark.slow
def test_plain_papermill_refuses_a_bad_parameter_in_the_first_cell_and_writes_nothing(tmp_path):
    """The check in the cell after the parameters: one line naming the parameter; no results file."""
    papermill = Path(os.sys.executable).with_name("papermill")
    env = {k: v for k, v in os.environ.items() if k != "COMPANION_RESULTS_DIR"}
    env.update(COMPANION_RESULTS_DIR="runs", PWD=str(tmp_path))      # relative, as typed in a shell
    proc = subprocess.run([str(papermill), "--no-progress-bar", "-k", "python3", "--cwd", str(ROOT / "book" / "chapters"),
                           str(ROOT / "book" / "chapters" / "02_exact_learning.ipynb"), "out.ipynb", "-y", "d_values: []"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert ("ParameterError: chapter 02_exact_learning: parameter d_values=[] must be non-empty and each in "
            "[2, inf) (a list of int; default [4, 8, 16, 32, 64])") in proc.stderr + proc.stdout
    assert not (tmp_path / "runs").exists() and not (ROOT / "book" / "chapters" / "runs").exists()


@pytest.mark.slow
def test_plain_papermill_writes_a_relative_results_dir_where_it_was_typed(tmp_path):
    """COMPANION_RESULTS_DIR=runs with --cwd book/chapters: the JSON lands in ./runs, not book/chapters/runs."""
    papermill = Path(os.sys.executable).with_name("papermill")
    env = {k: v for k, v in os.environ.items() if k != "COMPANION_RESULTS_DIR"}
    env.update(COMPANION_RESULTS_DIR="runs", PWD=str(tmp_path))
    (tmp_path / "runs").mkdir()
    proc = subprocess.run([str(papermill), "--no-progress-bar", "-k", "python3", "--cwd", str(ROOT / "book" / "chapters"),
                           str(ROOT / "book" / "chapters" / "01_definitions.ipynb"), "runs/01_definitions.ipynb",
                           "-p", "n_checks", "50"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "runs" / "01_definitions.json").read_text())["parameters"]["n_checks"] == 50
    assert not (ROOT / "book" / "chapters" / "runs").exists()


@pytest.mark.slow
def test_make_book_after_a_library_edit_shows_the_new_value(tmp_path):
    """Issue 11, part 2: in a scratch clone, `make book`, edit the streaming chunk size, `make book` again.
    And issue 23, item 3, in the same two builds: the edit also inserts a labelled equation at the top
    of chapter 01, and chapter 02's links to eq-two-token show the equation's new number.

    The scratch clone holds the working tree's tracked files (mtimes kept) and this .venv (linked;
    PYTHONPATH puts the scratch's library first, for the command and the kernels). To keep the test
    short, its _config.yml executes chapter 04 only (execute.exclude_patterns; the other chapters
    render their committed outputs), on its test parameters (injected by papermill's
    ``parameterize_notebook``, as ``companion run -f`` does): the command is the README's `make book`
    (which is `companion build`). The two checks share one scratch clone and its two builds (they
    were two tests with two clones and four builds).
    """
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    stamp = ROOT / ".venv" / ".installed"
    if not stamp.is_file() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip("the .venv is older than pyproject.toml: run make venv first")
    scratch = tmp_path / "clone"
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = ROOT / name
        if src.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / name)
    (scratch / ".venv").symlink_to(ROOT / ".venv")
    config = yaml.safe_load((scratch / "_config.yml").read_text())
    config["execute"]["exclude_patterns"] = [p.name for p in CHAPTERS if not p.stem.startswith("04")]
    (scratch / "_config.yml").write_text(yaml.safe_dump(config))
    chapter = scratch / "book" / "chapters" / "04_low_rank.ipynb"
    nb = load_notebook_node(str(chapter))
    test_parameters = nb.metadata["companion"]["test_parameters"]
    nbformat.write(parameterize_notebook(nb, test_parameters), chapter)
    env = {k: v for k, v in os.environ.items() if k != "COMPANION_RESULTS_DIR"}
    env["PYTHONPATH"] = str(scratch / "src")

    def make_book():
        proc = subprocess.run(["make", "book"], cwd=scratch, env=env, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        page = (scratch / "_build" / "html" / "book" / "chapters" / "04_low_rank.html").read_text()
        shown = re.search(r'chunks of at most <span class="pasted-text">(\d+)</span> MiB', page)
        data = json.loads((scratch / "_build" / "results" / "04_low_rank.json").read_text())
        return int(shown.group(1)), data, _equation_numbers(scratch / "_build" / "html", "eq-two-token")

    # The edit changes a number the chapter shows and no claim it checks (a claim that an edit breaks
    # stops the build, which is the claims' point, not this test's).
    shown, first, (number, links) = make_book()
    assert shown == first["values"]["scale_chunk_mib"]["value"] == 4
    assert first["parameters"]["n_trials"] == test_parameters["n_trials"] != 10   # the test parameters ran
    assert len(links) >= 3 and set(links) == {number}
    streaming = scratch / "src" / "companion" / "_streaming.py"
    source = streaming.read_text()
    assert source.count("CHUNK_BYTES = 4 * 2**20") == 1
    streaming.write_text(source.replace("CHUNK_BYTES = 4 * 2**20", "CHUNK_BYTES = 8 * 2**20"))
    first_chapter = scratch / "book" / "chapters" / "01_definitions.ipynb"
    nb = nbformat.read(first_chapter, as_version=nbformat.NO_CONVERT)
    cell = nbformat.v4.new_markdown_cell("```{math}\n:label: eq-inserted-first\na = b\n```")
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        cell.pop("id", None)          # cell ids only where nbformat 4.5 allows them
    nb.cells.insert(1, cell)
    nbformat.write(nb, first_chapter)
    shown, data, (after, links) = make_book()
    assert shown == data["values"]["scale_chunk_mib"]["value"] == 8, "make book kept the old value after a library edit"
    assert data["library_hash"] != first["library_hash"]
    major, minor = number.split(".")
    assert after == f"{major}.{int(minor) + 1}"
    assert set(links) == {after}, f"chapter 02 still links eq-two-token as {sorted(set(links))}, now ({after})"


def _equation_numbers(html_dir: Path, label: str):
    """(the number chapter 01 shows for equation ``label``, the texts of chapter 02's links to it)."""
    chapters = html_dir / "book" / "chapters"
    own = re.search(rf'id="equation-{label}">\s*<span class="eqno">\(([\d.]+)\)',
                    (chapters / "01_definitions.html").read_text())
    links = re.findall(rf'href="01_definitions.html#equation-{label}">\(([\d.]+)\)</a>',
                       (chapters / "02_exact_learning.html").read_text())
    return own.group(1), links


@pytest.mark.slow
def test_unknown_parameter_is_refused_before_execution(tmp_path):
    code = cli.main(["run", CHAPTERS[0].stem, "-p", "no_such_parameter", "1", "-o", str(tmp_path)])
    assert code == 2 and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_book_builds_with_warnings_as_errors(book_html):
    """The HTML builds from the committed outputs (no execution) with -n -W --keep-going."""
    html = book_html
    assert (html / "index.html").is_file()
    for path in CHAPTERS:
        page = (html / "book" / "chapters" / f"{path.stem}.html").read_text()
        assert "Traceback (most recent call last)" not in page, f"{path.stem} renders a traceback"
        source = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        if "{glue" in source:
            assert 'class="pasted-text"' in page, f"{path.stem}: glued values not rendered"
            assert not re.search(r'<span class="pasted-text">\s*</span>', page), f"{path.stem}: an empty glued value"


PRIVATE = re.compile(r"\bcompanion(?:\.[a-z]\w*)*\._[A-Za-z]\w*")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_chapter_names_a_private_module(path):
    """Prose and code send readers to public names only (issue 34): no ``companion._star``,
    ``companion._learner.best_relative_scale``, ... (code is also checked by test_architecture)."""
    assert PRIVATE.findall("companion._star.X companion.numerics._y companion.book.results") == [
        "companion._star", "companion.numerics._y"]
    found = [f"cell {k}: {m}" for k, c in enumerate(json.loads(path.read_text())["cells"])
             for m in PRIVATE.findall("".join(c["source"]))]
    assert found == [], f"{path.stem} names private modules: {found}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_backtick_fence_has_a_backtick_in_its_argument(path):
    """CommonMark ends a backtick fence's info string at a backtick, so ````{admonition} ... {cite:t}`x` ``
    renders as a raw paragraph (chapter 06's three "this book's own" boxes did, found by a reader at
    seed 4): such a directive is opened with colons (colon_fence) instead."""
    bad = [line[:80] for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "markdown"
           for line in "".join(cell["source"]).splitlines()
           if (m := re.match(r"^(`{3,})\{", line)) and "`" in line[len(m.group(1)):]]
    assert not bad, f"{path.stem}: backtick fences with a backtick in the argument: {bad}"


def test_a_run_on_test_parameters_never_takes_a_serial_tests_perturbed_answers(monkeypatch, tmp_path):
    """The background job is built while the serial suite runs: with a test's COMPANION_PERTURB_* set at that
    moment, the chapter's run still gets the pool's snapshot of the environment, so exact answers (the CI run of
    2026-12-07 did not: chapter 02 on its test parameters stopped on a bound, 5.18e-11 against 1e-11: the value
    answers perturbed by 4 ulps give; exact answers give 4.17e-12)."""
    snapshot = {k: v for k, v in os.environ.items() if not k.startswith("COMPANION_PERTURB")}
    monkeypatch.setenv(PERTURB_ENV, "8")
    monkeypatch.setenv(PERTURB_PATTERN_ENV, "parity")
    seen = {}

    def fake_run(cmd, *, env, **kw):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0)

    fake_run.environ = snapshot
    _run_with_test_parameters(CHAPTERS[0], fake_run, tmp_path)
    assert PERTURB_ENV not in seen and PERTURB_PATTERN_ENV not in seen and seen["OPENBLAS_NUM_THREADS"] == "1"
