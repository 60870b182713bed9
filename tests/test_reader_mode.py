"""A reader's run and the book's build (issue 32, items 2, 3 and 5): the library and the command.

``COMPANION_STRICT=1`` (the book's build) stops a chapter at a claim or bound that does not hold;
unset or ``0`` (a reader's run) marks the sentence, records ``"holds": false`` and goes on. NaN and
infinities are stored as null with what they were. ``companion run`` refuses a finished run's folder
unless ``--overwrite``, ends with the claims that did not hold (exit 0, 1 with ``--strict``);
``companion cite CHAPTER`` lists the names; a misspelled parameter gets "did you mean".
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from companion.book import _render, cli, results
from companion.errors import ClaimError, InvalidInputError, ParameterError


@pytest.fixture
def reader(monkeypatch, results_tmp):
    """A reader's run: COMPANION_STRICT unset (conftest sets 1 for the suite)."""
    monkeypatch.delenv("COMPANION_STRICT", raising=False)
    return results_tmp


@pytest.fixture
def glued(monkeypatch):
    import myst_nb

    calls = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.__setitem__(name, value))
    return calls


# -- strictness ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "word, strict",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("", False),
    ],
)
def test_strict_reads_the_environment(monkeypatch, word, strict):
    monkeypatch.setenv("COMPANION_STRICT", word)
    assert results.strict() is strict


def test_strict_is_off_when_unset_and_refuses_another_word(monkeypatch):
    monkeypatch.delenv("COMPANION_STRICT", raising=False)
    assert results.strict() is False
    monkeypatch.setenv("COMPANION_STRICT", "maybe")
    with pytest.raises(InvalidInputError, match=r"COMPANION_STRICT='maybe' must be 1 \(the book's build"):
        results.strict()


def test_the_suite_itself_is_strict():
    """The root conftest.py makes make test (nbval, the re-executions) the book's build."""
    import os

    assert os.environ["COMPANION_STRICT"] == "1" and results.strict()


# -- a false claim ----------------------------------------------------------------------------------


def test_a_false_claim_in_a_readers_run_is_marked_recorded_and_goes_on(reader, glued, capsys):
    results.record_parameters("05_robustness", seed=1, glue=False)
    results.claim("noisy_dense_better", False, text="better", value=0.8)
    results.claim("count_ok", True, text="4,160", value=4160)
    results.publish("after", 7)  # the chapter went on
    values = results.load("05_robustness")["values"]
    assert values["noisy_dense_better"] == {
        "value": 0.8,
        "text": "better (does not hold for this run)",
        "kind": "claim",
        "holds": False,
    }
    assert values["count_ok"]["holds"] is True and values["count_ok"]["text"] == "4,160"
    assert glued["noisy_dense_better"] == "better (does not hold for this run)" and glued["after"] == "7"
    err = capsys.readouterr().err
    assert "companion: noisy_dense_better does not hold for this run (a reader's run goes on): claim " in err
    assert results.not_holding(reader / "05_robustness.json") == [
        {"name": "noisy_dense_better", "kind": "claim", "text": "better (does not hold for this run)", "measured": None}
    ]


def test_a_false_claim_in_the_books_build_stops_the_chapter(results_tmp, monkeypatch):
    monkeypatch.setenv("COMPANION_STRICT", "1")
    results.record_parameters("05_robustness", seed=1, glue=False)
    with pytest.raises(ClaimError, match=r"claim 'noisy_dense_better' of chapter 05_robustness is false"):
        results.claim("noisy_dense_better", np.bool_(False), text="better", glue=False)
    assert "noisy_dense_better" not in results.load("05_robustness")["values"]


# -- a bound that does not hold ---------------------------------------------------------------------


def test_a_bound_just_outside_in_a_readers_run_is_marked_with_its_measured_value(reader, glued):
    results.record_parameters("06_multi_head", seed=1, glue=False)
    results.publish("mh_sweep_worst_W", 1e-07, fmt="{:.0e}", kind="bound", measured=2.25e-07, rtol=0.5)
    results.publish("at", 1e-07, fmt="{:.0e}", kind="bound", measured=1e-07)  # just inside
    results.publish("over", 1e-07, fmt="{:.0e}", kind="bound", measured=1.0000001e-07)  # just outside
    results.publish("bits", 40, kind="bound", measured=39.9, lower=True)
    results.publish("shown_up", 1.2e-14, fmt=results.round_up, kind="bound", measured=1.34e-14)
    values = results.load("06_multi_head")["values"]
    entry = values["mh_sweep_worst_W"]
    assert entry["text"] == "1e-07 (does not hold for this run: measured 2.25e-07 against 1e-07)"
    assert entry["holds"] is False and entry["value"] == 1e-07 and entry["bound"] == "upper"
    assert entry["measured"] == {"value": 2.25e-07, "text": "2.25e-07", "tolerance": {"rtol": 0.5, "atol": 0.0}}
    assert glued["mh_sweep_worst_W"] == entry["text"]
    assert values["at"]["holds"] is True and values["at"]["text"] == "1e-07" and glued["at"] == "1e-07"
    assert values["over"]["holds"] is False  # shown to the digits that tell it from the bound
    assert values["over"]["text"] == "1e-07 (does not hold for this run: measured 1.0000001e-07 against 1e-07)"
    assert values["bits"]["text"] == "40 (does not hold for this run: measured 39.9, below 40)"
    # a bound shown rounded up (2e-14) is checked, and named in the mark, as it is (1.2e-14)
    assert values["shown_up"]["text"] == "2e-14 (does not hold for this run: measured 1.34e-14 against 1.2e-14)"
    assert [(e["name"], e["measured"]) for e in results.not_holding(results.load("06_multi_head"))] == [
        ("bits", "39.9"),
        ("mh_sweep_worst_W", "2.25e-07"),
        ("over", "1e-07"),
        ("shown_up", "1.34e-14"),
    ]


def test_a_bound_that_does_not_hold_stops_the_books_build(results_tmp, monkeypatch):
    monkeypatch.setenv("COMPANION_STRICT", "1")
    results.record_parameters("06_multi_head", seed=1, glue=False)
    results.publish("at", 1e-07, kind="bound", measured=1e-07, glue=False)
    assert results.load("06_multi_head")["values"]["at"]["holds"] is True
    with pytest.raises(
        ClaimError, match=r"the bound 'mh_sweep_worst_W' = 1e-07 is false: the measured value 2\.25e-07"
    ):
        results.publish("mh_sweep_worst_W", 1e-07, kind="bound", measured=2.25e-07, glue=False)
    with pytest.raises(ClaimError, match=r"the bound 'nan_bound' = 1e-07 is false: the measured value nan"):
        results.publish("nan_bound", 1e-07, kind="bound", measured=float("nan"), glue=False)
    assert set(results.load("06_multi_head")["values"]) == {"at"}


# -- NaN and infinities -------------------------------------------------------------------------------


def test_nan_and_inf_are_stored_as_null_with_what_they_were(reader, glued):
    """Chapter 04, seed 1: 'rho all exact' was NaN and the results writer raised
    'Out of range float values are not JSON compliant: nan'."""
    results.record_parameters("04_low_rank", seed=1, glue=False)
    results.publish("rho_all_exact", float("nan"), note="no trial of the case (20, 2) recovered every instance")
    results.publish("rows", [1.5, np.inf, -np.inf])
    results.publish("err", np.float64("inf"), rtol=0.1)
    results.publish("table", {"a": np.float64("nan"), "b": 2.0})
    results.claim("all_recovered", False, text="0 of 5", value=float("nan"))
    raw = (reader / "04_low_rank.json").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    values = json.loads(raw)["values"]
    assert values["rho_all_exact"] == {
        "value": None,
        "text": "nan",
        "kind": "exact",
        "nonfinite": {"value": "nan"},
        "note": "no trial of the case (20, 2) recovered every instance",
    }
    assert values["rows"]["value"] == [1.5, None, None]
    assert values["rows"]["nonfinite"] == {"value[1]": "inf", "value[2]": "-inf"}
    assert values["err"] == {
        "value": None,
        "text": "inf",
        "kind": "measured",
        "nonfinite": {"value": "inf"},
        "tolerance": {"rtol": 0.1, "atol": 0.0},
    }
    assert values["table"]["value"] == {"a": None, "b": 2.0} and values["table"]["nonfinite"] == {"value[a]": "nan"}
    assert values["all_recovered"]["value"] is None and values["all_recovered"]["holds"] is False
    assert glued["rho_all_exact"] == "nan"
    results.publish("finite", 1.0)
    assert "nonfinite" not in results.load("04_low_rank")["values"]["finite"]


def test_a_nan_measured_value_never_satisfies_a_bound(reader):
    results.record_parameters("04_low_rank", seed=1, glue=False)
    results.publish("err_bound", 1e-10, kind="bound", measured=float("nan"), glue=False)
    results.publish("bits_bound", 40, kind="bound", measured=np.inf, lower=True, glue=False)  # inf >= 40 holds
    values = results.load("04_low_rank")["values"]
    assert values["err_bound"]["holds"] is False and values["err_bound"]["measured"]["value"] is None
    assert values["err_bound"]["nonfinite"] == {"measured": "nan"}
    assert values["err_bound"]["text"] == "1e-10 (does not hold for this run: measured nan against 1e-10)"
    assert values["bits_bound"]["holds"] is True and values["bits_bound"]["nonfinite"] == {"measured": "inf"}


def test_a_note_must_be_a_sentence(reader):
    results.record_parameters("04_low_rank", seed=1, glue=False)
    with pytest.raises(InvalidInputError, match="note=' ' must be a non-empty sentence"):
        results.publish("x", 1.0, note=" ", glue=False)


# -- companion run: the summary, --strict, --overwrite ---------------------------------------------


def _fake_run(values):
    """A _supervise that 'runs' a chapter: copies it and writes a results file with ``values``."""

    def run(cmd, env):
        spec = json.loads(Path(cmd[-1]).read_text(encoding="utf-8"))
        shutil.copy(spec["input"], spec["output"])
        Path(spec["output"]).with_suffix(".json").write_text(json.dumps({"values": values}))
        Path(spec["status"]).write_text('{"ok": true}')
        return None

    return run


FALSE_BOUND = {
    "kind": "bound",
    "holds": False,
    "value": 1e-07,
    "text": "1e-07 (does not hold for this run: measured 2.25e-07 against 1e-07)",
    "measured": {"value": 2.25e-07, "text": "2.25e-07"},
}


def test_run_lists_what_did_not_hold_and_exits_0_or_1_with_strict(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        cli,
        "_supervise",
        _fake_run({"ok": {"kind": "claim", "holds": True, "text": "yes"}, "mh_sweep_worst_W": FALSE_BOUND}),
    )
    assert cli.main(["run", "01", "-o", str(tmp_path / "a"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert (
        "1 claim(s) and bound(s) of the chapter do not hold for this run (marked in the text):\n"
        "  mh_sweep_worst_W (bound): 1e-07 (does not hold for this run: measured 2.25e-07 against 1e-07)\n"
    ) in out
    assert cli.main(["run", "01", "-o", str(tmp_path / "b"), "--no-progress", "--strict"]) == 1
    assert "mh_sweep_worst_W (bound)" in capsys.readouterr().out
    assert (tmp_path / "b" / "01_definitions.ipynb").is_file()  # --strict: the run still completes


def test_run_where_everything_holds_prints_no_summary_and_exits_0_with_strict(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_supervise", _fake_run({"ok": {"kind": "claim", "holds": True, "text": "yes"}}))
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress", "--strict"]) == 0
    assert "do not hold" not in capsys.readouterr().out


def test_a_second_run_into_a_finished_folder_is_refused_unless_overwrite(tmp_path, monkeypatch, capsys):
    """A second companion run into a folder holding a finished run silently replaced it."""
    calls = []
    fake = _fake_run({"n": {"kind": "exact", "text": "2"}})
    monkeypatch.setattr(cli, "_supervise", lambda cmd, env: calls.append(1) or fake(cmd, env))
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress", "-p", "seed", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "already holds a finished run of 01_definitions (01_definitions.ipynb and 01_definitions.json); "
        "give --overwrite to replace it, or another folder for this run with -o DIR."
    ) in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before and len(calls) == 1
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress", "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert f"replaced the earlier run: {tmp_path / '01_definitions.ipynb'}, {tmp_path / '01_definitions.json'}" in out
    assert len(calls) == 2
    # a new user's finding (session 40): the page --html wrote is removed too, and now named
    (tmp_path / "01_definitions_html").mkdir()
    assert cli.main(["run", "01", "-o", str(tmp_path), "--no-progress", "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / '01_definitions.json'}, {tmp_path / '01_definitions_html'}" in out
    assert not (tmp_path / "01_definitions_html").exists() and len(calls) == 3
    (tmp_path / "01_definitions.ipynb").unlink()  # the results file alone is a finished run too
    with pytest.raises(ParameterError, match=r"already holds a finished run of 01_definitions \(01_definitions.json\)"):
        cli.run_chapter("01", {}, tmp_path, progress_bar=False)


# -- companion cite with no name, did you mean ------------------------------------------------------


def test_cite_without_a_name_lists_every_name_with_a_line_and_exits_0(results_tmp, monkeypatch, capsys):
    monkeypatch.delenv("COMPANION_STRICT", raising=False)
    results.record_parameters("02_exact_learning", seed=0, glue=False)
    results.publish("sweep_worst_W", 2.5e-15, fmt="{:.1e}", rtol=1.0, glue=False)
    results.publish("n_queries", 4160, glue=False)
    results.claim("all_exact", True, text="10 of 10", glue=False)
    with _quiet():
        results.publish("w_bound", 1e-12, kind="bound", measured=2e-12, glue=False)
    assert cli.main(["cite", "02"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"02_exact_learning published 4 values ({results_tmp / '02_exact_learning.json'}); "
        "cite one with companion cite 02_exact_learning NAME:"
    )
    assert out[1:] == [
        "  all_exact      10 of 10 (claim, checked when the chapter ran)",
        "  n_queries      4,160 (exact)",
        "  sweep_worst_W  2.5e-15 (measured, reproducible to rtol 1, atol 0 across machines)",
        "  w_bound        1e-12 (does not hold for this run: measured 2e-12 against 1e-12) "
        "(bound that does NOT hold for this run; measured 2e-12)",
    ]


def _quiet():
    import contextlib
    import io

    return contextlib.redirect_stderr(io.StringIO())


@pytest.mark.parametrize(
    "typed, hint",
    [
        ("seeed", " (did you mean seed?)"),
        ("sed", " (did you mean seed?)"),
        ("d_value", " (did you mean d_values?)"),
        ("zzz", ""),
    ],
)
def test_a_misspelled_parameter_gets_did_you_mean(typed, hint):
    with pytest.raises(ParameterError) as info:
        cli.check_parameters("02_exact_learning", {typed: 3})
    assert f"chapter 02_exact_learning has no parameter {typed!r}{hint}; its parameters are: seed (int" in str(
        info.value
    )


def test_run_with_a_misspelled_parameter_says_did_you_mean_and_runs_nothing(tmp_path, capsys):
    assert cli.main(["run", "02", "-p", "seeed", "3", "-o", str(tmp_path)]) == 2
    assert "has no parameter 'seeed' (did you mean seed?)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- the intro's re-running block ---------------------------------------------------------------------


def test_the_intros_rerunning_block_fits_and_says_where_the_numbers_go():
    """It scrolled sideways behind comments at the end of 90-character lines, and said the numbers
    go to data/results/, which the README says only make execute writes."""
    import re

    intro = (Path(__file__).resolve().parents[1] / "book" / "intro.md").read_text(encoding="utf-8")
    section = intro.split("## Reading and re-running")[1].split("\n## ")[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()
    assert "companion run 02_exact_learning -p seed 3 -o runs/" in block
    assert all(len(line) <= 60 for line in block), [line for line in block if len(line) > 60]
    assert all("#" not in line for line in block if not line.startswith("#")), "a comment at a line's end"
    prose = " ".join(section.split())
    assert "into `runs/<chapter>.json`" in prose
    assert "`data/results/<chapter>.json`, which only `make execute` writes" in prose


# -- strictness reaches the kernel: a notebook in both modes ----------------------------------------


def _claim_notebook(path: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell('from companion import results\nresults.record_parameters("99_demo", seed=0)'),
        nbformat.v4.new_code_cell('results.publish("w_bound", 1e-07, fmt="{:.0e}", kind="bound", measured=2.25e-07)'),
        nbformat.v4.new_code_cell('print("the chapter went on")'),
    ]
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["1", "0"], ids=["book-build", "reader"])
def test_a_notebook_stops_in_the_books_build_and_goes_on_in_a_readers_run(tmp_path, mode):
    """The variable reaches the kernel (papermill, as nbval, jupyter execute and Jupyter Book start one)."""
    import os
    import subprocess
    import sys

    import nbformat

    nb = _claim_notebook(tmp_path / "demo.ipynb")
    env = dict(os.environ, COMPANION_STRICT=mode, COMPANION_RESULTS_DIR=str(tmp_path / "res"), MPLBACKEND="Agg")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("papermill")), str(nb), str(tmp_path / "out.ipynb"), "--no-progress-bar"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    texts = [
        "".join(o.get("text", "")) + "".join(o.get("traceback", [])) for c in out.cells for o in c.get("outputs", [])
    ]
    if mode == "1":
        assert proc.returncode != 0 and "ClaimError" in proc.stderr
        assert not any("the chapter went on" in t for t in texts)
        assert not (tmp_path / "res" / "99_demo.json").exists()  # put back as it was: no file before
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert any("the chapter went on" in t for t in texts)
        assert any("w_bound does not hold for this run (a reader's run goes on)" in t for t in texts)
        entry = json.loads((tmp_path / "res" / "99_demo.json").read_text())["values"]["w_bound"]
        assert entry["holds"] is False and entry["measured"]["value"] == 2.25e-07
        glued = [
            o
            for c in out.cells
            for o in c.get("outputs", [])
            if o.get("metadata", {}).get("scrapbook", {}).get("name") == "w_bound"
        ]
        assert glued and "1e-07 (does not hold for this run: measured 2.25e-07 against 1e-07)" in str(glued[0]["data"])


def test_the_books_build_and_make_execute_set_strict(tmp_path, monkeypatch):
    """companion build (make book) runs jupyter-book with COMPANION_STRICT=1 even if the caller set 0;
    make execute sets it on its own command line."""
    monkeypatch.setenv("COMPANION_STRICT", "0")
    seen = {}

    def call(cmd, env=None, **kw):
        seen.update(env or {})
        return 1  # a failed build: nothing else to do

    monkeypatch.setattr(cli.subprocess, "call", call)
    monkeypatch.setattr(cli, "_require", lambda *a, **k: None)
    monkeypatch.setattr(cli, "cached_without_figures", lambda *a, **k: {})
    assert cli.main(["build", "-o", str(tmp_path)]) == 1
    assert seen["COMPANION_STRICT"] == "1"
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    execute = makefile.split("\nexecute:")[1].split("\n\n")[0]
    assert "COMPANION_STRICT=1 COMPANION_RESULTS_DIR=$$stage ../../$(VENV)/bin/jupyter execute" in execute


def test_a_saved_sweep_with_a_trial_that_found_nothing_is_stored_not_refused(results_tmp):
    """A sweep row with a NaN error (no estimate) made run_sweep(..., name=...) raise ValueError."""
    from companion.book.sweeps import run_sweep

    def trial(d, seed):
        return {"error": float("nan") if d == 3 else 1e-15, "ok": d != 3}

    rows = run_sweep(trial, {"d": [2, 3], "seed": [0]}, progress=False, name="with_nan")
    assert np.isnan(rows[1]["error"])  # the rows returned keep the NaN
    data = json.loads((results_tmp / "sweeps" / "with_nan.json").read_text())
    assert [r["error"] for r in data["rows"]] == [1e-15, None]
    assert data["nonfinite"] == {"rows[1][error]": "nan"}


def test_write_json_still_refuses_nan_by_default_and_checks_its_option(tmp_path):
    with pytest.raises(ValueError):
        results.write_json(tmp_path / "x.json", {"x": float("nan")})
    with pytest.raises(InvalidInputError, match="nonfinite='drop' must be 'refuse' or 'null'"):
        results.write_json(tmp_path / "x.json", {"x": 1.0}, nonfinite="drop")
    results.write_json(tmp_path / "x.json", {"x": 1.0}, nonfinite="null")
    assert json.loads((tmp_path / "x.json").read_text()) == {"x": 1.0}  # nothing to say: no key


# -- --html: references to other chapters --------------------------------------------------------


def _page(tmp_path):
    html = tmp_path / "html"
    html.mkdir()
    (html / "02_exact_learning.html").write_text(
        '<p>Prerequisites: <a class="reference internal" href="01_definitions.html#ch-definitions">'
        '<span class="std std-ref">The model and its oracles</span></a>; identity '
        '<a class="reference internal" href="01_definitions.html#equation-eq-two-token">(1.1)</a>; '
        '<a class="reference internal" href="#own">own</a>; <a href="bibliography.html#x">[1]</a></p>'
    )
    for name in ("01_definitions", "reproducibility", "rerun_index", "bibliography"):
        (html / f"{name}.html").write_text("prose only")
    return html


def test_html_references_to_other_chapters_become_plain_titles_without_a_published_book(tmp_path):
    html = _page(tmp_path)
    others = {
        "01_definitions": "book/chapters/01_definitions.html",
        "reproducibility": "book/reproducibility.html",
        "rerun_index": "",
    }
    _render._unlink_other_pages(html, "02_exact_learning", others, None)
    page = (html / "02_exact_learning.html").read_text()
    assert (
        'Prerequisites: <span class="companion-xref"><span class="std std-ref">The model and its oracles</span>'
        '</span>; identity <span class="companion-xref">(1.1)</span>'
    ) in page
    assert 'href="#own"' in page and 'href="bibliography.html#x"' in page  # its own anchors, the references
    assert sorted(p.name for p in html.iterdir()) == ["02_exact_learning.html", "bibliography.html", "index.html"]
    assert "url=02_exact_learning.html" in (html / "index.html").read_text()


def test_html_references_link_to_the_published_book_when_it_is_named(tmp_path):
    html = _page(tmp_path)
    others = {"01_definitions": "book/chapters/01_definitions.html", "rerun_index": ""}
    _render._unlink_other_pages(html, "02_exact_learning", others, "https://example.org/companion/")
    page = (html / "02_exact_learning.html").read_text()
    assert (
        '<a class="reference external" href="https://example.org/companion/book/chapters/01_definitions.html'
        '#equation-eq-two-token">(1.1)</a>'
    ) in page


def test_the_flat_toc_keeps_the_books_parts_and_numbering():
    import yaml

    book = yaml.safe_load((Path(__file__).resolve().parents[1] / "_toc.yml").read_text())
    flat = _render._flat_toc(book, "02_exact_learning")
    assert flat["root"] == "rerun_index"
    assert [p.get("numbered") for p in flat["parts"]] == [p.get("numbered") for p in book["parts"]]
    assert flat["parts"][0]["chapters"][:2] == [{"file": "01_definitions"}, {"file": "02_exact_learning"}]


def test_a_fresh_build_folder_is_called_no_earlier_build_not_a_changed_library(tmp_path):
    """A new user's first `make book` said 'the library changed since the last build' (session 40)."""
    build = tmp_path / "_build"
    assert cli._stale_cache_message(build) == "no earlier build here: every chapter will be executed"
    results.mark_built(build)
    assert cli._stale_cache_message(build) is None  # the cache is current
    (build / ".library-hash").write_text("0" * 16 + "\n")  # a build of another library
    assert cli._stale_cache_message(build) == (
        "the library changed since the last build: every chapter will be re-executed"
    )
