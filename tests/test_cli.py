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
    with pytest.raises(ParameterError, match=r"seed=1\.5 has type float, but the chapter expects int"):
        cli.check_parameters("02_exact_learning", {"seed": 1.5})
    with pytest.raises(ParameterError, match=r"d_values=\[1, 'a'\] has type list"):
        cli.check_parameters("02_exact_learning", {"d_values": [1, "a"]})
    with pytest.raises(ParameterError, match=r"seed=True has type bool"):
        cli.check_parameters("02_exact_learning", {"seed": True})
    with pytest.raises(ParameterError, match=r"unknown chapter 'xx'"):
        cli.check_parameters("xx", {})


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
