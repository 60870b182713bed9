"""benchmarks/mutants.py: the generated tenfold mutants apply, and a TOML file of mutants is read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "benchmarks" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_mutant_applies_and_changes_one_constant(mutants):
    generated = mutants.generated_mutants()
    assert len(generated) == 2 * len(mutants.inventory()) and len({m.id for m in generated}) == len(generated)
    texts = {}
    for m in generated:
        text = texts.setdefault(m.module, (ROOT / "src" / "companion" / f"{m.module}.py").read_text())
        out = mutants.apply_mutant(text, m)
        assert out is not None and out != text, m.id
        compile(m.new, m.id, "eval")                        # the replacement is an expression
        assert mutants.tests_for(m.module)          # a module, one file of a split package, or a sibling


def test_tenfold_renders_literals_and_expressions(mutants):
    assert mutants._tenfold("1e-6", 1e-6, True) == "1e-5"
    assert mutants._tenfold("1e-6", 1e-6, False) == "1e-7"
    assert mutants._tenfold("0.05", 0.05, True) == "0.5"
    assert mutants._tenfold("40", 40, False) == "4"
    assert mutants._tenfold("1 / 64", None, True) == "(1 / 64) * 10"


def test_a_toml_file_of_mutants(mutants, tmp_path):
    path = tmp_path / "held_out.toml"
    path.write_text(
        '[[mutant]]\nid = "x-ffn"\nmodule = "ffn/bias_free"\nwhat = "merge tolerance 1e-6 -> 1e-5"\n'
        "old = '_merge_neurons(U, c, quality)'\nnew = '_merge_neurons(U, c, quality, tol=1e-5)'\n"
    )
    (m,) = mutants.load_file(path)
    assert (m.id, m.module, m.line) == ("x-ffn", "ffn/bias_free", None)
    text = (ROOT / "src" / "companion" / "ffn" / "bias_free.py").read_text()
    assert "tol=1e-5" in mutants.apply_mutant(text, m)
    path.write_text('[[mutant]]\nid = "x"\nmodule = "nowhere"\nwhat = "w"\nold = "a"\nnew = "b"\n')
    with pytest.raises(SystemExit, match="module='nowhere'"):
        mutants.load_file(path)


def test_a_mutant_of_a_module_split_into_a_package_is_found_in_its_files(mutants):
    # issue 34: lowrank.py became lowrank/; a held-out mutant written against lowrank.py still applies
    files = mutants.module_sources("lowrank")
    assert [f.name for f in files][:2] == ["__init__.py", "_learn.py"] and len(files) >= 5
    assert [f.name for f in mutants.module_sources("oracles")] == ["oracles.py", "_precision.py"]
    assert mutants.tests_for("lowrank/_learn") == mutants.TESTS["lowrank"]
    assert mutants.tests_for("_precision") == mutants.TESTS["oracles"]
    assert "src/companion/lowrank" in mutants.TESTS["lowrank"]            # its doctests, as a folder
    assert "src/companion/_precision.py" in mutants.TESTS["oracles"]
