"""The companion command: listing, parameter checks, citation."""

import json
from pathlib import Path

import pytest

from companion.book import cli, results
from companion.errors import ParameterError


def test_list_prints_every_chapter_with_defaults(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for stem in cli.chapters():
        assert stem in out
    assert "d_values = [4, 8, 16, 32, 64] (list)" in out
    assert "; must be non-empty and each in [2, inf)" in out


def test_chapters_are_found_in_order():
    stems = list(cli.chapters())
    assert stems[:2] == ["01_definitions", "02_exact_learning"]
    assert stems == sorted(stems)


def test_check_parameters_converts_and_rejects():
    assert cli.check_parameters("02", {"entry_scale": 3, "d_values": [2, 3]}) == {
        "entry_scale": 3.0, "d_values": [2, 3]}
    with pytest.raises(ParameterError, match=r"has no parameter 'dd' \(did you mean d\?\); its parameters are: seed \(int, default 0\)"):
        cli.check_parameters("02_exact_learning", {"dd": 3})
    with pytest.raises(ParameterError, match=r"parameter seed=1\.5 must be an int, in \[0, inf\) \(default 0\)"):
        cli.check_parameters("02_exact_learning", {"seed": 1.5})
    with pytest.raises(ParameterError, match=r"d_values=\[16\.5, 64\] must be a list of int, non-empty and each in"):
        cli.check_parameters("02_exact_learning", {"d_values": [16.5, 64]})
    with pytest.raises(ParameterError, match=r"seed=True must be an int"):
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
    assert line.startswith("2.5e-15 (exact) [02_exact_learning: sweep_worst_W; parameters d=5, seed=7;")
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
    with pytest.raises(ParameterError, match=r"^01_demo: papermill cannot read the line of d in the parameters cell"):
        cli.chapter_parameters("01_demo")


@pytest.mark.slow
def test_a_failing_chapter_gives_one_clear_line_and_keeps_the_results_file(capfd, tmp_path):
    (tmp_path / "02_exact_learning.json").write_text("{}")
    code = cli.main(["run", "02", "-p", "d", "3", "-p", "d_values", "[2, 3]", "-p", "entry_scale", "1e308",
                     "-o", str(tmp_path), "--no-progress", "--overwrite"])
    err = capfd.readouterr().err          # the chapter's own process and kernel included
    assert code == 2
    assert "the chapter stopped at cell" in err and "Traceback" not in err
    assert (tmp_path / "02_exact_learning.json").read_text() == "{}"      # nothing half-way
    assert "the incomplete run (" in err and f"{tmp_path / '02_exact_learning.incomplete.ipynb'}, with the full traceback" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["02_exact_learning.incomplete.ipynb", "02_exact_learning.json"]


@pytest.mark.slow
def test_a_chapter_over_the_time_limit_is_stopped_in_one_line(capfd, tmp_path):
    code = cli.main(["run", "04", "-o", str(tmp_path), "--no-progress", "--timeout", "1"])
    err = capfd.readouterr().err          # the chapter's own process and kernel included
    assert code == 2 and "time limit" in err and "--timeout" in err and "Traceback" not in err
    assert "nothing written to 04_low_rank.ipynb or 04_low_rank.json" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["04_low_rank.incomplete.ipynb"]


def test_cite_shows_a_published_tolerance(results_tmp, capsys):
    results.record_parameters("03_one_layer_transformer", seed=0, glue=False)
    results.publish("small_bits", 49.5, fmt="{:.1f}", atol=3.0, glue=False)
    results.publish("err", 3e-16, fmt="{:.0e}", rtol=0.5, atol=1e-12, glue=False)
    assert cli.cite("03", "small_bits").startswith(
        "49.5 (measured, reproducible to rtol 0, atol 3 across machines) [03_one_layer_transformer: small_bits;")
    assert cli.cite("03", "err").startswith("3e-16 (measured, reproducible to rtol 0.5, atol 1e-12 across machines)")


def test_cite_never_calls_a_bound_exact(results_tmp):
    results.record_parameters("02_exact_learning", seed=0, glue=False)
    results.publish("small_error_W", 1e-12, fmt="{:.0e}", kind="bound", measured=1.1e-15, rtol=1.0,
                    atol=1e-15, glue=False)
    results.publish("tight", 1e-10, fmt="{:.0e}", kind="bound", measured=0.0, glue=False)
    line = cli.cite("02", "small_error_W")
    assert line.startswith("1e-12 (bound; measured 1.1e-15, reproducible to rtol 1, atol 1e-15 across machines) "
                           "[02_exact_learning: small_error_W;")
    assert "(exact)" not in line
    assert cli.cite("02", "tight").startswith("1e-10 (bound; measured 0, exact on every machine)")
    results.publish("bits", 40, kind="bound", measured=47.25, lower=True, atol=3.0, glue=False)
    assert cli.cite("02", "bits").startswith("40 (lower bound; measured 47.2, reproducible to rtol 0, atol 3 across")


def test_cite_a_claim_and_an_old_results_file(results_tmp):
    results.record_parameters("04_low_rank", seed=0, glue=False)
    results.claim("count_is_floor", True, text="4,100", value=4100, glue=False)
    assert cli.cite("04", "count_is_floor").startswith("4,100 (claim, checked when the chapter ran) [04_low_rank:")
    path = results_tmp / "04_low_rank.json"                  # written before values had a kind
    data = json.loads(path.read_text())
    data["values"] = {"a": {"value": 1, "text": "1"}, "b": {"value": 2.0, "text": "2", "tolerance": {"rtol": 0.1}}}
    path.write_text(json.dumps(data))
    assert cli.cite("04", "a").startswith("1 (exact) [")
    assert cli.cite("04", "b").startswith("2 (measured, reproducible to rtol 0.1, atol 0 across machines) [")


def test_cite_reads_the_committed_numbers_by_default(monkeypatch):
    monkeypatch.delenv("COMPANION_RESULTS_DIR", raising=False)
    data = json.loads((results.book_results_dir() / "02_exact_learning.json").read_text())
    name = sorted(data["values"])[0]
    assert cli.cite("02", name).startswith(data["values"][name]["text"])


# Part 4 of issue 11: each bad parameter gets a one-line refusal naming it, before anything runs.
@pytest.mark.parametrize("argv, message", [
    (["run", "02", "-p", "d_values", "[]"],
     "companion: error: chapter 02_exact_learning: parameter d_values=[] must be non-empty and each in "
     "[2, inf) (a list of int; default [4, 8, 16, 32, 64])"),
    (["run", "04", "-p", "rank", "9"],
     "companion: error: chapter 04_low_rank: parameter rank=9 must be in [1, d] with d=8 (an int; default 2)"),
    (["run", "05", "-p", "taus", "[1e-3, -1e-2]"],
     "companion: error: chapter 05_robustness: parameter taus=[0.001, -0.01] must be non-empty and each in "
     "(0, inf) (a list of float; default [1e-07, 1e-06, 1e-05, 0.0001, 0.001, 0.01])"),
    (["run", "05", "-p", "mu", "0.5"],
     "companion: error: chapter 05_robustness: parameter mu=0.5 must be in (0, 1/sqrt(d)] with d=6 (a float; default 0.1)"),
    (["run", "02", "-p", "seed", "-1"],
     "companion: error: chapter 02_exact_learning: parameter seed=-1 must be in [0, inf) (an int; default 0)"),
])
def test_bad_parameters_are_refused_in_one_line_before_running(argv, message, capsys, tmp_path):
    assert cli.main([*argv, "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given", [{"taus": "[1e-3, 1e-2]"}, {"taus": "[1e-07, 1e-06, 1e-05, 0.0001, 0.001, 0.01]"}])
def test_exponent_floats_in_a_list_are_floats(given):
    value = cli._parse_value(given["taus"])
    out = cli.check_parameters("05", {"taus": value})["taus"]
    assert all(type(x) is float for x in out) and out[0] in (1e-3, 1e-7)


def test_the_default_as_list_prints_it_is_accepted(capsys):
    cli.main(["list"])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("taus = "))
    text = line.split(" = ", 1)[1].split(" (list)")[0]
    assert cli.check_parameters("05", {"taus": cli._parse_value(text)})["taus"] == [1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2]


def test_parameter_file_has_the_same_checks_and_float_handling(tmp_path, monkeypatch):
    good = tmp_path / "good.yaml"
    good.write_text("taus: [1e-3, 1e-2]\ntau_margin: 1e-4\nn_instances: 2\n")
    seen = {}
    monkeypatch.setattr(cli, "run_chapter", lambda ch, params, out, **kw: seen.update(
        params=cli.check_parameters(ch, params), timeout=kw["timeout"]) or tmp_path / "x.ipynb")
    assert cli.main(["run", "05", "-f", str(good), "-p", "n_instances", "3", "--timeout", "30"]) == 0
    assert seen == {"params": {"taus": [1e-3, 1e-2], "tau_margin": 1e-4, "n_instances": 3}, "timeout": 30.0}
    bad = tmp_path / "bad.yaml"
    bad.write_text("taus: []\n")
    assert cli.main(["run", "05", "-f", str(bad)]) == 2
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ParameterError, match=r"must map parameter names to values"):
        cli._read_parameter_file(tmp_path / "list.yaml")


def test_a_parameter_given_twice_with_two_values_is_refused(monkeypatch, capsys):
    """A user's finding: ``-p seed 1 -p seed 2`` ran with seed 2, silently."""
    seen = []
    monkeypatch.setattr(cli, "run_chapter", lambda ch, params, out, **kw: seen.append(params) or Path("x.ipynb"))
    assert cli.main(["run", "02", "-p", "seed", "1", "-p", "seed", "2"]) == 2
    assert "-p seed is given twice ('1' and '2'); give each parameter once" in capsys.readouterr().err
    assert seen == []
    assert cli.main(["run", "02", "-p", "seed", "1", "-p", "seed", "1"]) == 0 and seen == [{"seed": 1}]


def test_run_has_the_books_time_limit_by_default():
    assert cli.book_timeout() == 600


def test_chapter_parameters_report_the_constraint():
    info = cli.chapter_parameters("04")["rank"]
    assert info == {"default": 2, "type": "int", "help": "rank of its W", "spec": "in [1, d]"}


def test_cite_takes_the_folder_of_a_run_and_says_which_command_writes_a_missing_file(
    results_tmp, monkeypatch
):
    results.record_parameters("02_exact_learning", seed=4, glue=False)
    results.publish("x", 3, glue=False)
    # --results runs/ (the folder companion run -o wrote) reads runs/<chapter>.json
    line = cli.cite("02", "x", results_file=results_tmp)
    assert line.startswith("3 (exact) [02_exact_learning: x; parameters seed=4;")
    # a run's folder without this chapter: the command that writes it, not "make book" (which
    # writes _build/results)
    with pytest.raises(ParameterError, match=r"no results for 01_definitions at .*01_definitions\.json; run the "
                       r"chapter first: companion run 01_definitions -o \S+ writes \S+01_definitions\.json\.$"):
        cli.cite("01", "x", results_file=results_tmp)
    # the committed folder without it: make execute is what writes data/results
    committed = results_tmp / "data" / "results"
    committed.mkdir(parents=True)
    monkeypatch.delenv("COMPANION_RESULTS_DIR")
    monkeypatch.setattr(results, "book_results_dir", lambda: committed)
    with pytest.raises(ParameterError, match=r"run the chapter first: make execute NB=book/chapters/01_definitions"
                       r"\.ipynb writes the committed numbers\.$"):
        cli.cite("01", "x")


def test_an_exception_without_a_message_is_named_by_the_line_that_raised_it(tmp_path, monkeypatch, capsys):
    """A bare ``assert`` in a cell (chapter 02 with -p mq_W_max 0.5 met one) used to end the line
    with "AssertionError: " and nothing; the line names the statement that raised it."""
    import nbformat

    def fake_run(cmd, env):  # what companion.book._execute leaves when a cell's bare assert fails
        spec = json.loads(open(cmd[-1], encoding="utf-8").read())
        nb = nbformat.read(spec["input"], as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        code[0].execution_count = 1
        code[0].outputs = [nbformat.v4.new_output(
            "error", ename="AssertionError", evalue="",
            traceback=["\x1b[0;31mAssertionError\x1b[0m   Traceback (most recent call last)",
                       "Cell \x1b[0;32mIn[1], line 2\x1b[0m\n      1 x = 1\n\x1b[0;32m----> 2\x1b[0m \x1b[38;5;28;01massert\x1b[39;00m "
                       "x \x1b[38;5;241m>\x1b[39m \x1b[38;5;241m2\x1b[39m\n",
                       "\x1b[0;31mAssertionError\x1b[0m: "])]
        nbformat.write(nb, spec["output"])
        open(spec["status"], "w").write(json.dumps({"ok": False, "ename": "AssertionError", "evalue": "", "exec_count": 1}))
        return None

    monkeypatch.setattr(cli, "_supervise", fake_run)
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the chapter stopped at cell 1 with AssertionError: (no message) raised by `assert x > 2`\n" in err
    assert (tmp_path / "01_definitions.incomplete.ipynb").is_file()


def test_a_finished_run_removes_the_page_and_incomplete_notebook_of_the_run_it_replaces(tmp_path, monkeypatch):
    """``companion run 01 --html`` then ``companion run 01 -p seed 1`` left the first run's page,
    with seed 0's numbers, beside the second run's notebook and results."""
    import shutil
    from pathlib import Path

    def fake_run(cmd, env):  # a run that finished: its notebook and results in the staging folder
        spec = json.loads(open(cmd[-1], encoding="utf-8").read())
        shutil.copy(spec["input"], spec["output"])
        (Path(spec["output"]).with_suffix(".json")).write_text('{"new": 1}')
        open(spec["status"], "w").write('{"ok": true}')
        return None

    (tmp_path / "01_definitions_html").mkdir()
    (tmp_path / "01_definitions_html" / "01_definitions.html").write_text("seed 0")
    (tmp_path / "01_definitions.incomplete.ipynb").write_text("{}")
    (tmp_path / "02_exact_learning_html").mkdir()            # another chapter's page stays
    monkeypatch.setattr(cli, "_supervise", fake_run)
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_definitions.ipynb", "01_definitions.json", "02_exact_learning_html"]
    assert (tmp_path / "01_definitions.json").read_text() == '{"new": 1}'


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_no_limit_or_no_number_is_refused_before_running(text, tmp_path, capsys):
    """--timeout 0 and -1 ran with no limit at all (nbclient reads them so); nan failed inside
    papermill with a TraitError after the run had started."""
    assert cli.main(["run", "01", "-o", str(tmp_path / "r"), "--no-progress", "--timeout", text]) == 2
    err = capsys.readouterr().err
    assert f"--timeout {float(text)} must be a number of seconds in (0, inf)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_fractional_timeout_is_rounded_up_to_whole_seconds(tmp_path, monkeypatch):
    """--timeout 1.5 failed with papermill's TraitError (nbclient's timeout is an int); just
    above 0 is the smallest limit, 1 s."""
    seen = []

    def fake_run(cmd, env):
        seen.append(json.loads(open(cmd[-1], encoding="utf-8").read())["timeout"])
        return "SIGINT"

    monkeypatch.setattr(cli, "_supervise", fake_run)
    for text in ("1.5", "0.001", "2"):
        assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress", "--timeout", text]) == 130
    assert seen == [2, 1, 2] and all(type(t) is int for t in seen)


def test_cite_without_a_name_lists_what_the_chapter_published(results_tmp, capsys):
    """``companion cite 02`` was argparse's "the following arguments are required: name", then an
    error (exit 2) listing the names; the README presents it as the list: one name a line, exit 0."""
    results.record_parameters("02_exact_learning", seed=0, glue=False)
    results.publish("b_value", 1, glue=False)
    results.publish("a_value", 2, glue=False)
    assert cli.main(["cite", "02"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1:] == ["  a_value  2 (exact)", "  b_value  1 (exact)"]


def test_compare_takes_the_committed_chapters_tolerances_too(tmp_path, capsys):
    """A run without its results JSON beside it (copied elsewhere) was compared with no tolerance at
    all, so a glued value published with rtol=0.1 that moved within it was a difference; make test
    takes the committed chapter's tolerances and the run's together, and so does compare now."""
    import shutil

    run = tmp_path / "01_definitions.ipynb"
    shutil.copy(cli.chapters()["01_definitions"], run)
    nb = json.loads(run.read_text())
    hits = 0
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if (out.get("metadata") or {}).get("scrapbook", {}).get("name") == "ident_min_sv":
                key = "application/papermill.record/text/plain"
                assert out["data"][key] == "'5e-03'"                         # published with rtol=0.1
                out["data"][key] = "'5.9e-03'"      # beyond the printed digits, within rtol=0.1
                hits += 1
    assert hits == 1
    run.write_text(json.dumps(nb))
    assert not run.with_suffix(".json").exists()
    assert cli.main(["compare", str(run)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    for cell in nb["cells"]:                       # 5e-03 -> 8e-03: outside rtol=0.1 and the printed digit
        for out in cell.get("outputs", []):
            if (out.get("metadata") or {}).get("scrapbook", {}).get("name") == "ident_min_sv":
                out["data"]["application/papermill.record/text/plain"] = "'8e-03'"
    run.write_text(json.dumps(nb))
    assert cli.main(["compare", str(run)]) == 1


def test_compare_a_run_with_the_committed_chapter(tmp_path, capsys):
    """A re-run is compared with the committed notebook by the contract nbval uses: the same
    outputs exit 0; a moved number exits 1 and is named with its code cell; other parameters are
    said first."""
    import shutil

    from companion.book import results as res

    run = tmp_path / "01_definitions.ipynb"
    shutil.copy(cli.chapters()["01_definitions"], run)
    assert cli.main(["compare", str(run)]) == 0
    assert capsys.readouterr().out == (f"{run}: the same outputs as the committed 01_definitions, "
                                       "by the reproducibility contract\n")
    nb = json.loads(run.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    data = code[2]["outputs"][0]["data"]
    assert "".join(data["text/plain"]) == "SingleHead(d=6, rank=3, ||W||_F=5.574, ||v||_2=4.299)"
    data["text/plain"] = "".join(data["text/plain"]).replace("5.574", "5.575")      # one last digit moved
    run.write_text(json.dumps(nb))
    committed = json.loads((res.book_results_dir() / "01_definitions.json").read_text())
    committed["parameters"]["n_checks"] = 50
    run.with_suffix(".json").write_text(json.dumps(committed))
    assert cli.main(["compare", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "the run's parameters differ from the committed ones, so its numbers may: n_checks=50 (committed: 2000)",
        f"{run}: 1 difference(s) from the committed 01_definitions:",
        "  code cell 2: text/plain: 5.574 became 5.575 (exact unless a tolerance applies)",
    ]
    other = tmp_path / "mine.ipynb"
    shutil.copy(run, other)
    assert cli.main(["compare", str(other)]) == 2                          # not named after a chapter
    assert "unknown chapter 'mine'" in capsys.readouterr().err
    assert cli.main(["compare", str(other), "--chapter", "01"]) == 1


# --- an adversarial tester's findings (session 44): valid JSON of the wrong structure -----------------


def test_cite_refuses_a_results_file_of_the_wrong_structure_with_a_parameter_error(tmp_path):
    import json as _json

    from companion.book import cli
    from companion.errors import ParameterError

    good = _json.loads((results.repo_root() / "data" / "results" / "01_definitions.json").read_text(encoding="utf-8"))
    name = sorted(good["values"])[0]
    cases = {
        "no_parameters": ({k: v for k, v in good.items() if k != "parameters"}, "KeyError: 'parameters'"),
        "values_list": ({**good, "values": [1]}, "'values' is not a mapping"),
        "entry_int": ({**good, "values": {name: 5}}, "AttributeError|TypeError"),
    }
    for label, (data, match) in cases.items():
        path = tmp_path / f"{label}.json"
        path.write_text(_json.dumps(data), encoding="utf-8")
        with pytest.raises(ParameterError, match=rf"is not a results file written by .*({match})"):
            cli.cite("01_definitions", name, results_file=path)
    intact = tmp_path / "intact.json"
    intact.write_text(_json.dumps(good), encoding="utf-8")
    with pytest.raises(ParameterError, match="published no value 'no_such_name'"):
        cli.cite("01_definitions", "no_such_name", results_file=intact)  # its own refusal is not re-wrapped


def test_compare_refuses_json_that_is_not_a_notebook(tmp_path):
    from companion.book import cli
    from companion.errors import ParameterError

    path = tmp_path / "01_definitions.ipynb"
    path.write_text("{}", encoding="utf-8")
    with pytest.raises(ParameterError, match="is not a Jupyter notebook"):
        cli.compare_run(path)


def test_compare_of_a_missing_file_says_the_file_is_missing(tmp_path):
    from companion.book import cli
    from companion.errors import ParameterError

    with pytest.raises(ParameterError, match="no notebook at .*nonexist.ipynb"):
        cli.compare_run(tmp_path / "nonexist.ipynb")
