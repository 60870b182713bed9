"""The companion command: listing, parameter checks, citation."""

import json

import pytest

from companion import cli, results
from companion.errors import ParameterError


def test_list_prints_every_chapter_with_defaults(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for stem in cli.chapters():
        assert stem in out
    assert "d_values = [4, 8, 16, 32, 64] (list)" in out


def test_chapters_are_found_in_order():
    stems = list(cli.chapters())
    assert stems[:2] == ["01_definitions", "02_exact_learning"]
    assert stems == sorted(stems)


def test_check_parameters_converts_and_rejects():
    assert cli.check_parameters("02", {"entry_scale": 3, "d_values": [2, 3]}) == {
        "entry_scale": 3.0, "d_values": [2, 3]}
    with pytest.raises(ParameterError, match=r"has no parameter 'dd'; its parameters are: seed \(int, default 0\)"):
        cli.check_parameters("02_exact_learning", {"dd": 3})
    with pytest.raises(ParameterError, match=r"seed=1\.5 does not fit: the chapter expects int"):
        cli.check_parameters("02_exact_learning", {"seed": 1.5})
    with pytest.raises(ParameterError, match=r"d_values=\[16\.5, 64\] does not fit: the chapter expects a list of int"):
        cli.check_parameters("02_exact_learning", {"d_values": [16.5, 64]})
    with pytest.raises(ParameterError, match=r"seed=True does not fit"):
        cli.check_parameters("02_exact_learning", {"seed": True})
    with pytest.raises(ParameterError, match=r"unknown chapter 'xx'"):
        cli.check_parameters("xx", {})
    with pytest.raises(ParameterError, match=r"chapter '0' is ambiguous: it starts 01_definitions, 02_exact_learning"):
        cli.check_parameters("0", {})


@pytest.mark.parametrize("text, value", [("3", 3), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True),
                                         ("[4, 8]", [4, 8]), ("basis", "basis")])
def test_values_are_read_as_yaml(text, value):
    assert cli._parse_value(text) == value


def test_run_rejects_unknown_parameter_with_exit_code_2(capsys, tmp_path):
    code = cli.main(["run", "02", "-p", "nope", "1", "-o", str(tmp_path)])
    assert code == 2
    assert "has no parameter 'nope'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []          # nothing executed, nothing written


def test_cite_one_number(results_tmp, capsys):
    results.record_parameters("02_exact_learning", seed=7, d=5, glue=False)
    results.publish("sweep_worst_W", 2.5e-15, fmt="{:.1e}", glue=False)
    assert cli.main(["cite", "02", "sweep_worst_W"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("2.5e-15 [02_exact_learning: sweep_worst_W; parameters d=5, seed=7;")
    assert results.library_hash() in line and "ICML 2026" in line
    with pytest.raises(ParameterError, match=r"published no value 'nope'; it published: sweep_worst_W"):
        cli.cite("02", "nope")


def test_cite_checks_the_results_file(results_tmp, tmp_path):
    results.record_parameters("02_exact_learning", seed=0, glue=False)
    results.publish("x", 1, glue=False)
    with pytest.raises(ParameterError, match=r"holds the results of 02_exact_learning, not of 01_definitions"):
        cli.cite("01", "x", results_file=results_tmp / "02_exact_learning.json")
    bad = tmp_path / "nb.ipynb"
    bad.write_text('{"cells": []}')
    with pytest.raises(ParameterError, match=r"is not a results file"):
        cli.cite("02", "x", results_file=bad)


def test_papermill_dropping_a_parameter_line_is_an_error(tmp_path, monkeypatch):
    import nbformat

    book = tmp_path / "book" / "chapters"
    book.mkdir(parents=True)
    (tmp_path / "_toc.yml").write_text("format: jb-book\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "seed = 0  # seed\nd = 4  # needs d >= 3\n", metadata={"tags": ["parameters"]})])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, book / "01_demo.ipynb")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError, match=r"cannot read the line of d in the parameters cell of 01_demo"):
        cli.chapter_parameters("01_demo")


def test_a_failing_chapter_gives_one_clear_line(capsys, tmp_path):
    code = cli.main(["run", "02", "-p", "seed", "-1", "-o", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the chapter stopped at cell" in err and "seed=-1 must be >= 0" in err
    assert "Traceback" not in err
