"""publish(): glue text and an atomic results JSON with provenance."""

import json
import os

import numpy as np
import pytest

from companion.book import results
from companion.errors import ClaimError, InvalidInputError


def test_record_and_publish_write_provenance(results_tmp):
    results.record_parameters("99_demo", seed=3, d=4, sizes=[1, 2], glue=False)
    results.publish("n", np.int64(20), glue=False)
    results.publish("err", np.float64(1.25e-15), fmt="{:.1e}", glue=False)
    data = json.loads((results_tmp / "99_demo.json").read_text())
    assert data["chapter"] == "99_demo" and data["seed"] == 3
    assert data["parameters"] == {"d": 4, "sizes": [1, 2]}
    assert data["values"]["n"] == {"value": 20, "text": "20", "kind": "exact"}
    assert data["values"]["err"] == {"value": 1.25e-15, "text": "1.2e-15", "kind": "exact"}
    assert type(data["values"]["n"]["value"]) is int
    assert len(data["library_hash"]) == 16 and data["library_hash"] == results.library_hash()
    assert {"python", "numpy", "companion"} <= set(data["versions"])
    assert data["created"].endswith("+00:00")
    assert [p.name for p in results_tmp.iterdir()] == ["99_demo.json"]   # no temporary left over


def test_record_parameters_discards_old_values(results_tmp):
    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("old", 1, glue=False)
    results.record_parameters("99_demo", seed=1, glue=False)
    assert results.load("99_demo")["values"] == {}


@pytest.mark.parametrize("strict", ["1", "0"])
def test_a_key_published_twice_in_a_run_with_another_value_is_refused_in_the_build(results_tmp, monkeypatch,
                                                                                   strict, capsys):
    """Two cells sharing a glue key (chapter 09's tag w, session 68: four values of one paragraph silently took
    another's): the book's build refuses the second value and writes nothing of it; a reader's run warns and keeps
    the later one. The same entry again, a claim's included, is no collision; nor is a key of an earlier run."""
    monkeypatch.setenv("COMPANION_STRICT", strict)
    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("n", 20, glue=False)
    results.publish("n", 20, glue=False)  # the same entry: allowed
    results.claim("c", True, text="yes", glue=False)
    results.claim("c", True, text="yes", glue=False)
    if strict == "1":
        with pytest.raises(InvalidInputError, match=r"glue key 'n' was published earlier in this run of 99_demo "
                                                    r"as '20' and now as '21'.*nothing of this call was written"):
            results.publish("n", 21, glue=False)
        assert results.load("99_demo")["values"]["n"]["value"] == 20
        with pytest.raises(InvalidInputError, match=r"glue key 'c'"):
            results.claim("c", True, text="no", glue=False)
    else:
        results.publish("n", 21, glue=False)
        assert results.load("99_demo")["values"]["n"]["value"] == 21
        assert "glue key 'n' was published earlier" in capsys.readouterr().err
    results.record_parameters("99_demo", seed=0, glue=False)  # a new run: its keys are its own
    results.publish("n", 22, glue=False)
    assert results.load("99_demo")["values"]["n"]["value"] == 22


def test_default_formats():
    assert results._format(1234567, None) == "1,234,567"
    assert results._format(0.000123456, None) == "0.000123"
    assert results._format(True, None) == "True"
    assert results._format(3.0, lambda x: f"<{x}>") == "<3.0>"


@pytest.mark.parametrize("name, value, message", [
    ("bad name", 1, r"name='bad name' must be a non-empty string"),
    ("", 1, r"name='' must be"),
    ("ok", object(), r"cannot publish a value of type object"),
])
def test_publish_rejects_bad_input(results_tmp, name, value, message):
    results.record_parameters("99_demo", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match=message):
        results.publish(name, value, glue=False)


def test_publish_needs_a_chapter(results_tmp, monkeypatch):
    monkeypatch.setitem(results._state, "chapter", None)
    with pytest.raises(InvalidInputError, match=r"does not know the chapter"):
        results.publish("x", 1, glue=False)


def test_failed_write_keeps_the_previous_file(results_tmp, monkeypatch):
    results.record_parameters("99_demo", seed=0, glue=False)
    results.publish("a", 1, glue=False)
    before = (results_tmp / "99_demo.json").read_text()
    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        results.publish("b", 2, glue=False)                # the write fails: nothing replaced
    assert (results_tmp / "99_demo.json").read_text() == before
    assert [p.name for p in results_tmp.iterdir()] == ["99_demo.json"]


def test_library_hash_changes_with_the_source(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(results, "LIBRARY_DIR", tmp_path)
    h1 = results.library_hash()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert results.library_hash() != h1


def test_glue_is_called_with_text(results_tmp, monkeypatch):
    calls = []
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: calls.append((name, value, display)))
    results.record_parameters("99_demo", seed=5, d=4)
    results.publish("x", np.float64(0.5))
    assert calls == [("seed", "5", False), ("d", "4", False), ("x", "0.5", False)]
    assert all(type(v) is str for _, v, _ in calls)


def test_results_dir_default_is_runs_never_the_committed_numbers(monkeypatch):
    monkeypatch.delenv("COMPANION_RESULTS_DIR", raising=False)
    root = results.repo_root()
    assert root is not None and (root / "_toc.yml").is_file()
    assert results.results_dir() == root / "runs"
    assert results.book_results_dir() == root / "data" / "results"


def test_relative_results_dir_is_taken_from_pwd_not_the_kernel_cwd(tmp_path, monkeypatch):
    shell, kernel = tmp_path / "shell", tmp_path / "kernel"
    shell.mkdir(), kernel.mkdir()
    monkeypatch.setenv("COMPANION_RESULTS_DIR", "runs")
    monkeypatch.setenv("PWD", str(shell))          # the folder the command was typed in
    monkeypatch.chdir(kernel)                      # papermill --cwd moved the kernel here
    assert results.results_dir() == shell / "runs"
    monkeypatch.delenv("PWD")
    assert results.results_dir() == kernel / "runs"
    monkeypatch.setenv("COMPANION_RESULTS_DIR", str(tmp_path / "abs"))
    assert results.results_dir() == tmp_path / "abs"


def test_stale_cache_is_cleared_when_the_library_changes(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(results, "LIBRARY_DIR", lib)
    build = tmp_path / "_build"
    (build / ".jupyter_cache").mkdir(parents=True)
    assert results.clear_stale_cache(build) is True            # first build: no stamp yet
    assert not (build / ".jupyter_cache").exists()
    (build / ".jupyter_cache").mkdir()
    assert results.clear_stale_cache(build) is True            # that build did not finish: still stale
    results.mark_built(build)                                  # a finished build
    (build / ".jupyter_cache").mkdir()
    assert results.clear_stale_cache(build) is False           # unchanged library: cache kept
    assert (build / ".jupyter_cache").exists()
    (lib / "m.py").write_text("x = 2\n")                       # an edit to the library
    assert results.clear_stale_cache(build) is True
    assert not (build / ".jupyter_cache").exists()
    results.mark_built(build)
    assert (build / ".library-hash").read_text().strip() == results.library_hash()


def test_results_file_is_world_readable(results_tmp):
    old = os.umask(0o022)
    try:
        results.record_parameters("99_demo", seed=0, glue=False)
    finally:
        os.umask(old)
    assert (results_tmp / "99_demo.json").stat().st_mode & 0o777 == 0o644


def test_publish_records_tolerance_only_when_given(results_tmp):
    results.record_parameters("tol", seed=0, glue=False)
    results.publish("exact", 20, glue=False)
    results.publish("bits", 47.25, glue=False, atol=1.0)
    results.publish("err", 3e-16, glue=False, rtol=0.5, atol=1e-12)
    values = results.load("tol")["values"]
    assert "tolerance" not in values["exact"]
    assert values["bits"]["tolerance"] == {"rtol": 0.0, "atol": 1.0}
    assert values["err"]["tolerance"] == {"rtol": 0.5, "atol": 1e-12}


@pytest.mark.parametrize("kwargs", [{"rtol": -1e-9}, {"atol": float("nan")}, {"atol": float("inf")},
                                    {"rtol": True}])
def test_publish_refuses_bad_tolerance(results_tmp, kwargs):
    results.record_parameters("tol", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="must be a finite real number"):
        results.publish("x", 1.0, glue=False, **kwargs)
    assert "x" not in results.load("tol")["values"]


def test_publish_kind_defaults_from_the_tolerance(results_tmp):
    results.record_parameters("kinds", seed=0, glue=False)
    results.publish("count", 20, glue=False)
    results.publish("err", 3e-16, glue=False, rtol=0.5, atol=1e-12)
    values = results.load("kinds")["values"]
    assert (values["count"]["kind"], values["err"]["kind"]) == ("exact", "measured")


def test_publish_a_bound_with_the_value_it_bounds(results_tmp):
    results.record_parameters("kinds", seed=0, glue=False)
    results.publish("small_error_W", 1e-12, fmt="{:.0e}", kind="bound", measured=np.float64(1.1e-15),
                    rtol=0.5, atol=1e-15, glue=False)
    entry = results.load("kinds")["values"]["small_error_W"]
    assert entry["kind"] == "bound" and entry["text"] == "1e-12" and entry["value"] == 1e-12
    assert entry["measured"] == {"value": 1.1e-15, "text": "1.1e-15",
                                 "tolerance": {"rtol": 0.5, "atol": 1e-15}}
    assert "tolerance" not in entry           # the bound itself is a constant


def test_a_bound_just_inside_holds_and_just_outside_stops_the_chapter(results_tmp):
    results.record_parameters("kinds", seed=0, glue=False)
    results.publish("at", 1e-12, kind="bound", measured=1e-12, glue=False)              # |m| == bound
    results.publish("neg", 1e-12, kind="bound", measured=-0.99e-12, glue=False)
    with pytest.raises(ClaimError, match=r"the bound 'over' = 1e-12 is false: the measured value 1\.01e-12"):
        results.publish("over", 1e-12, kind="bound", measured=1.01e-12, glue=False)
    assert "over" not in results.load("kinds")["values"]
    results.publish("bits", 40, kind="bound", measured=40.0, lower=True, glue=False)      # at least 40 bits
    assert results.load("kinds")["values"]["bits"]["bound"] == "lower"
    with pytest.raises(ClaimError, match=r"the lower bound 'bits_low' = 40 is false: the measured value 39\.9 is below it"):
        results.publish("bits_low", 40, kind="bound", measured=39.9, lower=True, glue=False)
    with pytest.raises(InvalidInputError, match="lower=True is for kind='bound' only"):
        results.publish("bits_x", 40, lower=True, glue=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "bound"}, "no measured="),
    ({"kind": "bound", "measured": True}, "must be a real number"),
    ({"kind": "bound", "measured": "1e-15"}, "must be a real number"),
    ({"kind": "exact", "measured": 1e-15}, "measured= is for kind='bound' only"),
    ({"measured": 1e-15}, "measured= is for kind='bound' only"),
    ({"kind": "measured"}, "kind='measured' but no rtol/atol"),
    ({"kind": "exact", "rtol": 0.1}, "kind='exact' but rtol=0.1"),
    ({"kind": "upper"}, "kind='upper' of 'x' must be one of 'exact', 'measured', 'bound'"),
])
def test_publish_refuses_an_inconsistent_kind(results_tmp, kwargs, match):
    results.record_parameters("kinds", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match=match):
        results.publish("x", 1e-12, glue=False, **kwargs)
    assert "x" not in results.load("kinds")["values"]


def test_a_bound_must_be_a_number(results_tmp):
    results.record_parameters("kinds", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="a bound must be a real number"):
        results.publish("x", "small", kind="bound", measured=1.0, glue=False)


def test_a_true_claim_is_recorded_with_its_text(results_tmp):
    results.record_parameters("claims", seed=0, glue=False)
    n, d = 20, 4
    results.claim("count_is_formula", np.int64(n) == d + d * d, text=f"{n:,}", value=n, glue=False)
    results.claim("all_succeed", np.array([True, True]).all(), text="10 of 10", glue=False)
    values = results.load("claims")["values"]
    assert values["count_is_formula"] == {"value": 20, "text": "20", "kind": "claim", "holds": True}
    assert values["all_succeed"] == {"value": "10 of 10", "text": "10 of 10", "kind": "claim", "holds": True}


def test_a_false_claim_stops_with_its_name_text_and_chapter(results_tmp):
    results.record_parameters("04_low_rank", seed=0, glue=False)
    with pytest.raises(ClaimError, match=r"claim 'count_is_floor' of chapter 04_low_rank is false: "
                                         r"the sentence that shows '4,103'"):
        results.claim("count_is_floor", 4103 == 4100, text="4,103", glue=False)
    assert "count_is_floor" not in results.load("04_low_rank")["values"]


@pytest.mark.parametrize("holds", [1, 0, None, "yes", np.array([True]), np.array([True, False]), 1.0])
def test_a_claim_needs_one_bool(results_tmp, holds):
    results.record_parameters("claims", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="must be a Python or NumPy bool"):
        results.claim("c", holds, text="x", glue=False)


def test_a_claim_needs_a_chapter_and_a_string(results_tmp, monkeypatch):
    monkeypatch.setitem(results._state, "chapter", None)
    with pytest.raises(InvalidInputError, match=r"claim\(\) does not know the chapter"):
        results.claim("c", True, text="x", glue=False)
    with pytest.raises(InvalidInputError, match="must be the string the sentence shows"):
        results.claim("c", True, text=20, chapter="claims", glue=False)


def test_publish_refuses_tolerance_on_non_number(results_tmp):
    results.record_parameters("tol", seed=0, glue=False)
    with pytest.raises(InvalidInputError, match="real numbers only"):
        results.publish("s", "text", glue=False, rtol=0.1)


class _Shell:
    """A stand-in for IPython's shell: input history and the post_run_cell event."""

    def __init__(self, history):
        import types

        self.history_manager = types.SimpleNamespace(input_hist_raw=list(history))
        self.callbacks = []
        self.events = types.SimpleNamespace(register=lambda name, f: self.callbacks.append(f))

    def run_cell(self, success):
        import types

        for f in self.callbacks:
            f(types.SimpleNamespace(success=success))


PARAMS_CELL = "seed = 0  # seed; must be in [0, inf)\nd = 4  # dimension; must be in [2, 64]\n"


@pytest.fixture
def shell(monkeypatch):
    import IPython

    sh = _Shell(["", PARAMS_CELL, "# Parameters\nd = 5\n"])
    monkeypatch.setattr(IPython, "get_ipython", lambda: sh)
    return sh


def test_record_parameters_checks_the_declared_constraints_before_writing(results_tmp, shell):
    from companion.errors import ParameterError

    with pytest.raises(ParameterError, match=r"^chapter 99_demo: parameter d=1 must be in \[2, 64\] \(an int; default 4\)$"):
        results.record_parameters("99_demo", seed=0, d=1, glue=False)
    with pytest.raises(ParameterError, match=r"misses d, declared in the chapter's parameters cell"):
        results.record_parameters("99_demo", seed=0, glue=False)
    with pytest.raises(ParameterError, match=r"has no parameter 'extra'"):
        results.record_parameters("99_demo", seed=0, d=4, extra=1, glue=False)
    assert not any(results_tmp.iterdir())                   # nothing written
    results.record_parameters("99_demo", seed=0, d=2, glue=False)
    assert results.load("99_demo")["parameters"] == {"d": 2}


def test_a_failing_cell_puts_the_previous_results_file_back(results_tmp, shell):
    results.record_parameters("99_demo", seed=0, d=4, glue=False)
    results.publish("a", 1, glue=False)
    shell.run_cell(success=True)
    before = (results_tmp / "99_demo.json").read_text()
    results.record_parameters("99_demo", seed=1, d=5, glue=False)      # a second run ...
    results.publish("b", 2, glue=False)
    shell.run_cell(success=False)                                      # ... fails half-way
    assert (results_tmp / "99_demo.json").read_text() == before
    results.publish("c", 3, glue=False)                                # later cells only glue
    assert (results_tmp / "99_demo.json").read_text() == before
    assert [p.name for p in results_tmp.iterdir()] == ["99_demo.json"]


def test_a_refused_call_does_not_undo_the_previous_run(results_tmp, shell):
    from companion.errors import ParameterError

    results.record_parameters("99_demo", seed=0, d=4, glue=False)
    results.publish("a", 1, glue=False)
    shell.run_cell(success=True)
    done = (results_tmp / "99_demo.json").read_text()
    with pytest.raises(ParameterError):
        results.record_parameters("99_demo", seed=0, d=99, glue=False)
    shell.run_cell(success=False)
    assert (results_tmp / "99_demo.json").read_text() == done


def test_a_failing_first_run_leaves_no_results_file(results_tmp, shell):
    results.record_parameters("99_demo", seed=0, d=4, glue=False)
    results.publish("a", 1, glue=False)
    shell.run_cell(success=False)
    assert not any(results_tmp.iterdir())


def test_write_json_is_atomic_plain_and_refuses_nan(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "bench.json"
    header = results.provenance("bench_demo", {"d": np.int64(4), "taus": np.array([0.5])}, 0)
    assert header["chapter"] == "bench_demo" and header["parameters"] == {"d": 4, "taus": [0.5]}
    assert results.write_json(path, header | {"rows": [np.float64(1.5)]}) == path
    data = json.loads(path.read_text())
    assert data["rows"] == [1.5] and data["library_hash"] == results.library_hash()
    with pytest.raises(ValueError):
        results.write_json(path, {"x": float("nan")})
    assert json.loads(path.read_text()) == data                 # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]   # no temporary left
    with pytest.raises(InvalidInputError, match="name='a b'"):
        results.provenance("a b", {}, None)
    with pytest.raises(InvalidInputError, match="chapter"):
        results.provenance("ok", {}, None, chapter="")



def test_record_parameters_reads_the_declared_names_from_the_namespace(results_tmp):
    from companion.book import cli

    declared = {n: p["default"] for n, p in cli.chapter_parameters("01_definitions").items()}
    namespace = declared | {"d": 7, "np": object()}         # the defaults, one changed
    results.record_parameters("01_definitions", namespace, glue=False)
    data = results.load("01_definitions")
    assert data["seed"] == declared["seed"] == 0
    assert sorted(data["parameters"]) == sorted(n for n in declared if n != "seed")
    assert data["parameters"]["d"] == 7 and "np" not in data["parameters"]


def test_record_parameters_with_a_namespace_refuses_what_it_cannot_read(results_tmp):
    from companion.book import cli
    from companion.errors import ParameterError

    namespace = {n: p["default"] for n, p in cli.chapter_parameters("01_definitions").items()}
    del namespace["tau"]
    with pytest.raises(ParameterError, match=r"tau, declared in the chapter's parameters cell, is not"):
        results.record_parameters("01_definitions", namespace, glue=False)
    with pytest.raises(ParameterError, match=r"cannot find the chapter's parameters cell"):
        results.record_parameters("99_no_such_chapter", {"seed": 0}, glue=False)
    with pytest.raises(InvalidInputError, match=r"leave out the keywords"):
        results.record_parameters("01_definitions", namespace, seed=0, glue=False)
    with pytest.raises(InvalidInputError, match=r"globals\(\)\) or seed="):
        results.record_parameters("01_definitions", glue=False)


@pytest.mark.parametrize(
    "x, digits, text",
    [
        (6.24e-3, 2, "6.3e-03"),  # chapter 05, seed 4: printed 6.2e-03 rounded down
        (6.2e-3, 2, "6.2e-03"),  # exact at two digits: stays
        (6.2000001e-3, 2, "6.3e-03"),  # just above: up
        (9.96e-3, 2, "1.0e-02"),  # carries into the next decade
        (2.3e-10, 1, "3e-10"),
        (1.5e-3, 3, "1.50e-03"),
    ],
)
def test_round_up_digits(x, digits, text):
    assert results.round_up(x, digits=digits) == text
    assert float(text) >= x


@pytest.mark.parametrize("digits", [0, -1, 1.5, True, "2"])
def test_round_up_refuses_bad_digits(digits):
    with pytest.raises(InvalidInputError, match="digits must be an integer of at least 1"):
        results.round_up(1e-3, digits=digits)
