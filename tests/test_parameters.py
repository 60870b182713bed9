"""The constraint grammar of a chapter's parameters cell (companion.book.parameters)."""

import pytest

from companion.book import parameters
from companion.errors import ParameterError

CELL = """seed = 0                 # seed; must be in [0, inf)
d = 8                    # dimension; must be in [2, 64]
mu = 0.1                 # margin; must be in (0, 1/sqrt(d)]
cases = [[8, 1]]         # (d, r) pairs; must be non-empty and each in [2, 20] x [1, 20]
probes = "basis"         # probes; must be one of basis, gaussian
taus = [1e-3]            # tolerances; must be non-empty and each in (0, 1)
heads = [[3, 5]]         # (layer, head), [] skips; must be each in [0, 5] x [0, 11]
note = 1                 # no constraint
"""


@pytest.fixture(scope="module")
def decl():
    return parameters.declared(CELL)


def test_declared_reads_help_default_and_constraint(decl):
    assert decl["mu"]["default"] == 0.1 and decl["mu"]["help"] == "margin"
    assert decl["mu"]["spec_text"] == "in (0, 1/sqrt(d)]"
    assert decl["note"]["spec"] == [] and decl["note"]["help"] == "no constraint"


@pytest.mark.parametrize("name, inside, outside", [
    ("d", 64, 65), ("d", 2, 1),                               # closed ends
    ("mu", 1 / 8 ** 0.5, 1 / 8 ** 0.5 + 1e-12), ("mu", 1e-300, 0.0),   # open end at 0, bound from d
    ("taus", [0.999], [1.0]), ("taus", [1e-9], []),
    ("cases", [[20, 20]], [[21, 1]]), ("cases", [[2, 1]], [[2]]),
    ("probes", "gaussian", "Gaussian"),
    ("heads", [], [[6, 0]]),
])
def test_each_constraint_just_inside_and_just_outside(decl, name, inside, outside):
    parameters.check(decl, {name: inside})
    with pytest.raises(ParameterError, match=rf"^parameter {name}="):
        parameters.check(decl, {name: outside})


def test_bounds_use_the_given_value_of_another_parameter(decl):
    parameters.check(decl, {"d": 4, "mu": 0.5})
    with pytest.raises(ParameterError, match=r"mu=0\.5 must be in \(0, 1/sqrt\(d\)\] with d=8 \(a float; default 0\.1\)"):
        parameters.check(decl, {"mu": 0.5})


def test_types_follow_the_default(decl):
    assert parameters.check(decl, {"mu": "1e-3", "taus": ["1e-3", 2e-3], "d": 4}) == {
        "mu": 1e-3, "taus": [1e-3, 2e-3], "d": 4}
    for bad in ({"d": 4.0}, {"d": True}, {"taus": "[1e-3]"}, {"cases": [[8.5, 1]]}):
        with pytest.raises(ParameterError, match=r"must be (an int|a list of float|a list of list of int)"):
            parameters.check(decl, bad)


@pytest.mark.parametrize("spec", ["in 3 to 5", "in [3, 5", "between 3 and 5", "in [3, dd]"])
def test_an_unreadable_constraint_is_an_error(spec):
    with pytest.raises(ParameterError, match=r"cannot read|not a parameter"):
        parameters.check(parameters.declared(f"seed = 0  # seed; must be {spec}\n"), {"seed": 4})


def test_a_help_text_continues_on_the_comment_lines_below_its_parameter():
    """Chapter code lines are at most 88 characters, so a long help text (and its constraint) goes on
    on comment-only lines; a blank line or the next assignment ends it; papermill reads the first line."""
    from papermill.translators import PythonTranslator

    cell = ("# a heading comment belongs to no parameter\n"
            "d_values = [4, 8]  # dimensions of the sweep (hundreds work: see the\n"
            "#   benchmark); must be non-empty and each in [2, 64]\n"
            "rank = 2  # rank of W;\n"
            "#   must be in [1, min(d_values)]\n"
            "\n"
            "# a note after a blank line: not part of rank's help\n"
            "cases = [\n"
            "    [8, 1],\n"
            "]  # (d, r) pairs\n"
            "#   ; must be each in [2, 20] x [1, 20]\n"
            "seed = 0  # seed; must be in [0, inf)\n")
    decl = parameters.declared(cell)
    assert decl["d_values"]["help"] == "dimensions of the sweep (hundreds work: see the benchmark)"
    assert decl["d_values"]["spec_text"] == "non-empty and each in [2, 64]"
    assert decl["rank"]["help"] == "rank of W" and decl["rank"]["spec_text"] == "in [1, min(d_values)]"
    assert decl["cases"]["spec_text"] == "each in [2, 20] x [1, 20]" and decl["cases"]["default"] == [[8, 1]]
    assert decl["seed"]["help"] == "seed" and decl["seed"]["spec_text"] == "in [0, inf)"
    parameters.check(decl, {"rank": 4, "d_values": [4, 64]})
    with pytest.raises(ParameterError, match=r"^parameter rank=5 must be in \[1, min\(d_values\)\]"):
        parameters.check(decl, {"rank": 5, "d_values": [4, 64]})
    with pytest.raises(ParameterError, match=r"^parameter d_values=\[65\]"):
        parameters.check(decl, {"d_values": [65]})
    first = {p.name: p.help for p in PythonTranslator.inspect({"source": cell})}
    assert first["d_values"] == "dimensions of the sweep (hundreds work: see the"
