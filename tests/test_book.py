"""The book as readers get it (issue 23): folded answers, one numbering, no raw TeX, no stale
cross-references, one search bar, glue only through ``results``, a deploy and a release.

The fast tests read the sources; the slow ones read the HTML built once per session
(``book_html`` in ``tests/conftest.py``: the committed outputs, no execution, ``-n -W``).
"""

import json
import re
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
