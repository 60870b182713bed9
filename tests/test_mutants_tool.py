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
        assert m.module in mutants.TESTS


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
