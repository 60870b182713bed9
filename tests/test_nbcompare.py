"""The reproducibility contract's comparison (companion.book.nbcompare), and that nbval uses it."""

import json
import types
from pathlib import Path

import pytest

from companion.book import nbcompare
from companion.book.nbcompare import compare_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("ref, test", [
    ("error 3.1e-16", "error 0.0e+00"),                  # rounding level
    ("error 3.1e-16", "error 9.9e-10"),                  # just inside 1e-9
    ("[2.286880e+00, 6.004158e-01]", "[2.28688 , 0.600416]"),   # one number, two precisions
    ("  d  err\n0 8  1.2e-15", "  d    err\n0 8  0.0e+00"),      # a table re-aligned
    ("took 3.2 s at 0x7f3a in /tmp/x/y", "took 12.75 s at 0x1b2c in /home/u/z"),
])
def test_matches_within_the_contract(ref, test):
    assert compare_text(ref, test) == []


@pytest.mark.parametrize("ref, test, message", [
    ("error 1.0e-15", "error 1.0e-03", "1.0e-15 became 1.0e-03"),     # masked before: <TINY> hid it
    ("error 3.1e-16", "error 1.1e-09", "3.1e-16 became 1.1e-09"),     # just outside 1e-9
    ("4,160 queries", "4,161 queries", "4,160 became 4,161"),          # counts are exact
    ("rank 2", "rank 3", "2 became 3"),
    ("47.0 bits", "47.1 bits", "47.0 became 47.1"),                    # floats exact without a rule
    ("5", "5.4", "5 became 5.4"),
    ("signs: lstsq", "signs: milp", "text differs"),
    ("1 2 3", "1 2", "the output has 2 numbers where 3 are committed"),
])
def test_differences_outside_the_contract_fail(ref, test, message):
    diffs = compare_text(ref, test)
    assert diffs and message in diffs[0]


def test_a_tolerance_is_checked_just_inside_and_just_outside():
    rule = [{"atol": 3.0}]
    assert compare_text("49.5", "46.5", rules=rule) == []      # 3.0 + the two half-units 0.05 each
    assert compare_text("49.5", "46.6", rules=rule) == []
    assert compare_text("49.5", "46.3", rules=rule) != []
    rel = [{"rtol": 0.2, "integers": True}]
    assert compare_text("93", "74", rules=rel) != [] and compare_text("93", "75", rules=rel) == []   # 0.2 * 93 = 18.6
    assert compare_text("93", "76", rules=[{"rtol": 0.2}]) != []   # integers only with "integers"


def test_selectors_pick_the_numbers_a_rule_covers():
    match = [{"atol": 3.0, "match": r"[\d.]+ bits"}]
    assert compare_text("4 286 46.9 bits", "4 286 45.0 bits", rules=match) == []
    assert compare_text("4 286 46.9 bits", "4 287 46.9 bits", rules=match) != []   # the count stays exact
    assert compare_text("1.5 s-ish 46.9 x", "1.5 s-ish 45.0 x", rules=match) != []
    html = ("<table><thead><tr><th></th><th>FFN / (m d)</th><th>bits</th></tr></thead>"
            "<tbody><tr><th>0</th><td>8.22</td><td>50.2</td></tr></tbody></table>")
    column = [{"atol": 3.0, "column": "bits"}]
    assert compare_text(html, html.replace("50.2", "48.0"), rules=column) == []
    assert compare_text(html, html.replace("8.22", "8.23"), rules=column) != []
    glue = [{"atol": 3.0, "glue": ["small_bits"]}]
    assert compare_text("'49.5'", "'47.8'", rules=glue, glue="small_bits") == []
    assert compare_text("'49.5'", "'47.8'", rules=glue, glue="other") != []


def _display(text, name=None):
    meta = {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}} if name else {}
    key = "application/papermill.record/text/plain" if name else "text/plain"
    return {"output_type": "display_data", "data": {key: text}, "metadata": meta}


def test_compare_outputs_uses_published_tolerances_and_skips_images():
    ref = [_display("'49.5'", "small_bits"), {"output_type": "stream", "name": "stdout", "text": "n 20\n"},
           {"output_type": "display_data", "data": {"image/png": "AAAA"}, "metadata": {}}]
    test = [_display("'47.0'", "small_bits"), {"output_type": "stream", "name": "stdout", "text": "n 20\n"},
            {"output_type": "display_data", "data": {"image/png": "BBBB"}, "metadata": {}}]
    assert nbcompare.compare_outputs(ref, test, glue={"small_bits": {"rtol": 0.0, "atol": 3.0}}) == []
    diffs = nbcompare.compare_outputs(ref, test)
    assert diffs == ["application/papermill.record/text/plain (glue small_bits): 49.5 became 47.0 "
                     "(exact unless a tolerance applies)"]
    assert nbcompare.compare_outputs(ref, test[:1]) != []          # a missing output fails


def test_glue_tolerances_come_from_the_results_file(results_tmp):
    from companion.book import results

    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("bits", 49.5, atol=3.0, glue=False)
    results.publish("n", 20, glue=False)
    assert nbcompare.glue_tolerances(results_tmp / "99_demo.json") == {
        "bits": {"rtol": 0.0, "atol": 3.0, "integers": True}}
    assert nbcompare.glue_tolerances(results_tmp / "missing.json") == {}
    # Several files: the later one's tolerance wins for a name both publish; a missing one adds nothing.
    first = results_tmp / "99_demo.json"
    second = results_tmp / "other.json"
    second.write_text(json.dumps({"values": {"bits": {"value": 1.0, "tolerance": {"rtol": 0.5, "atol": 0.0}},
                                             "amp": {"value": 2.0, "tolerance": {"rtol": 0.1, "atol": 0.0}}}}))
    assert nbcompare.glue_tolerances(first, results_tmp / "missing.json", second) == {
        "bits": {"rtol": 0.5, "atol": 0.0, "integers": True}, "amp": {"rtol": 0.1, "atol": 0.0, "integers": True}}
    assert nbcompare.glue_tolerances(second, first)["bits"] == {"rtol": 0.0, "atol": 3.0, "integers": True}


def test_a_published_tolerance_covers_an_integer_formatted_glue():
    # publish("amp", 13.54, fmt="{:.0f}", rtol=0.5) glues "14"; a re-run's "15" is within it
    glue = {"amp": {"rtol": 0.5, "atol": 0.0, "integers": True}}
    ref = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": "amp"}},
            "data": {"application/papermill.record/text/plain": "'14'"}}]
    near = [{**ref[0], "data": {"application/papermill.record/text/plain": "'15'"}}]
    far = [{**ref[0], "data": {"application/papermill.record/text/plain": "'22'"}}]
    assert nbcompare.compare_outputs(ref, near, glue=glue) == []
    assert nbcompare.compare_outputs(ref, far, glue=glue) != []
    assert nbcompare.compare_outputs(ref, near) != []          # without the tolerance: exact


def test_nbval_compares_by_the_contract():
    """The repository's conftest.py installs nbcompare in nbval (make test and nbval alone)."""
    nbval = pytest.importorskip("nbval.plugin")
    cell = types.SimpleNamespace(
        cell=nbformat_cell({"companion": {"tolerance": {"atol": 3.0, "match": r"[\d.]+ bits"}}}),
        parent=types.SimpleNamespace(fspath="book/chapters/03_one_layer_transformer.ipynb"))
    ref = [{"output_type": "stream", "name": "stdout", "text": "3 46.9 bits 1.0e-15\n"}]
    ok = [{"output_type": "stream", "name": "stdout", "text": "3 45.0 bits 0.0e+00\n"}]
    bad = [{"output_type": "stream", "name": "stdout", "text": "3 46.9 bits 1.0e-03\n"}]
    assert nbval.IPyNbCell.compare_outputs(cell, ok, ref) is True
    assert nbval.IPyNbCell.compare_outputs(cell, bad, ref) is False
    assert "1.0e-15 became 1.0e-03" in "\n".join(cell.comparison_traceback)


def nbformat_cell(metadata):
    import nbformat

    return nbformat.v4.new_code_cell("", metadata=metadata)


def test_stats_count_how_each_number_was_compared_and_how_far_it_moved():
    from companion.book import nbcompare

    def nb(text, tolerance=None):
        meta = {"companion": {"tolerance": tolerance}} if tolerance else {}
        return {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": meta,
                           "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}]}

    rule = {"atol": 5.0, "match": r"[\d.]+ bits"}
    stats = {}
    diffs = nbcompare.compare_notebooks(nb("20 queries, 47.0 bits, error 3e-16, ratio 2.00", rule),
                                        nb("20 queries, 44.0 bits, error 1e-15, ratio 2.01"), stats=stats)
    assert diffs == {0: ["stdout: 2.00 became 2.01 (exact unless a tolerance applies)"]}
    s = nbcompare.summarize(stats)
    assert (s["exact"], s["tolerance"], s["rounding"]) == (2, 1, 1)
    assert s["max_move"] == pytest.approx(3.0 / 47.0) and s["max_move_cell"] == 0
    assert s["max_move_texts"] == ["47.0", "44.0"]
    # a number that was 0 and is not: an infinite move, with the two printed texts that say what it
    # was (chapter 07's count of matching terms, 0 -> 2 under another kernel); identical outputs:
    # no move, still counted
    stats = {}
    nbcompare.compare_notebooks(nb("0.0 and 5"), nb("0.1 and 5"), stats=stats)
    s = nbcompare.summarize(stats)
    assert s["max_move"] == float("inf") and s["max_move_texts"] == ["0.0", "0.1"]
    stats = {}
    assert nbcompare.compare_notebooks(nb("a 1.5"), nb("a 1.5"), stats=stats) == {}
    assert nbcompare.summarize(stats) == {"exact": 1, "tolerance": 0, "rounding": 0, "max_move": 0.0,
                                          "max_move_cell": None, "max_move_texts": None}


def _column_rules_and_headers(nb):
    """Per code cell with a column tolerance: (cell index, the columns its rules name, its tables' headers)."""
    for i, cell in enumerate(nb.cells):
        rules = cell.metadata.get("companion", {}).get("tolerance", [])
        named = set()
        for rule in rules if isinstance(rules, list) else [rules]:
            if "column" in rule:
                named |= {rule["column"]} if isinstance(rule["column"], str) else set(rule["column"])
        if not named:
            continue
        html = "".join(o.get("data", {}).get("text/html", "") for o in cell.get("outputs", []))
        html = "".join(html) if isinstance(html, list) else html
        headers = {h for _, _, h in nbcompare._table_columns(html)}
        yield i, named, headers


@pytest.mark.parametrize("path", sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_every_column_a_tolerance_names_is_a_column_of_its_cells_table(path):
    """A column tolerance that names no column of the cell's table covers nothing: renaming a table's column
    ("queries" to "learning queries", chapter 02, 2026-12-05) left the re-asked count of a large-norm head exact,
    and a 4-ulp perturbation of the answers (7,911 became 7,914) failed nbval."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    missing = [(i, sorted(named - headers)) for i, named, headers in _column_rules_and_headers(nb) if named - headers]
    assert not missing, f"{path.name}: (cell, columns named by a tolerance but absent from its table): {missing}"


def test_the_column_check_finds_a_renamed_column():
    import nbformat

    cell = nbformat.v4.new_code_cell("t")
    cell.metadata["companion"] = {"tolerance": [{"column": ["queries", "re-asked"], "rtol": 0.02}]}
    table = "<table><thead><tr><th></th><th>learning queries</th><th>re-asked</th></tr></thead>"
    table += "<tbody><tr><th>0</th><td>7,911</td><td>3</td></tr></tbody></table>"
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": table})]
    nb = nbformat.v4.new_notebook(cells=[cell])
    [(i, named, headers)] = list(_column_rules_and_headers(nb))
    assert named - headers == {"queries"} and "re-asked" in headers
