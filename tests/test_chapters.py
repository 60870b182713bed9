"""Every chapter re-run with non-default parameters, and the whole book built with warnings as errors.

nbval (``make test`` passes ``--nbval book/chapters``) re-executes every chapter on its defaults and
compares the outputs with the committed ones; this file covers what nbval does not.
"""

import json
import re
from pathlib import Path

import pytest
import yaml

from companion import cli

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_with_non_default_parameters(path, tmp_path):
    nb = json.loads(path.read_text())
    params = nb["metadata"]["companion"]["test_parameters"]
    defaults = cli.chapter_parameters(path.stem)
    assert any(params[k] != defaults[k]["default"] for k in params), "test parameters equal the defaults"
    out = cli.run_chapter(path.stem, params, tmp_path, progress_bar=False)
    executed = json.loads(out.read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    data = json.loads((tmp_path / f"{path.stem}.json").read_text())
    recorded = {"seed": data["seed"], **data["parameters"]}
    for k, v in params.items():
        assert recorded[k] == v, f"parameter {k} was not used: recorded {recorded[k]!r}"
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    cited = set(re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", markdown))
    assert cited <= set(data["values"]) | set(recorded), f"not published: {sorted(cited - set(data['values']) - set(recorded))}"


def test_unknown_parameter_is_refused_before_execution(tmp_path):
    code = cli.main(["run", CHAPTERS[0].stem, "-p", "no_such_parameter", "1", "-o", str(tmp_path)])
    assert code == 2 and not any(tmp_path.iterdir())


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
