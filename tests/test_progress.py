"""The query progress bar (companion._progress): shown when wanted, silent otherwise, shared by every learner."""

from __future__ import annotations

import pytest

from companion import _progress, exact, lowrank
from companion.attention import random_single_head
from companion.oracles import ValueQueryOracle


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.setattr(_progress, "DELAY", 0.0)
    monkeypatch.setattr(_progress, "MININTERVAL", 0.0)
    monkeypatch.delenv("COMPANION_PROGRESS", raising=False)


def test_a_forced_bar_counts_the_queries_against_the_plan(no_delay, capsys):
    oracle = ValueQueryOracle(random_single_head(4, seed=0), progress=True)
    rec = exact.learn_single_head(oracle)
    err = capsys.readouterr().err
    assert "learn_single_head" in err
    assert f"{rec.n_queries}/{4 + 16 + 32}" in err            # asked against planned: d + d^2 + verify
    assert not _progress._BARS                              # closed when the learner returned


def test_the_bar_of_another_learner_comes_from_the_same_place(no_delay, capsys):
    oracle = ValueQueryOracle(random_single_head(12, rank=1, seed=0), progress=True)
    rec = lowrank.learn_low_rank(oracle, 1, method="sketch")
    assert f"{rec.n_queries}/{rec.n_queries - rec.diagnostics['n_requeries']}" in capsys.readouterr().err


@pytest.mark.parametrize("setting, env", [(False, "1"), (None, None), (None, "0")])
def test_silent_when_not_wanted(no_delay, capsys, monkeypatch, setting, env):
    """progress=False wins over the environment; by default a non-terminal stderr (pytest's, a
    Jupyter kernel's: the chapters) gets nothing."""
    if env is not None:
        monkeypatch.setenv("COMPANION_PROGRESS", env)
    exact.learn_single_head(ValueQueryOracle(random_single_head(4, seed=0), progress=setting))
    assert capsys.readouterr().err == ""


def test_the_environment_turns_it_on(no_delay, capsys, monkeypatch):
    monkeypatch.setenv("COMPANION_PROGRESS", "1")
    exact.learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)))
    assert "learn_single_head" in capsys.readouterr().err


def test_a_failed_run_leaves_its_bar_until_the_next_run(no_delay, capsys):
    from companion.attention import MultiHead
    from companion.errors import OracleInconsistentError

    a, b = random_single_head(4, seed=1), random_single_head(4, seed=2)
    two = ValueQueryOracle(MultiHead([a.W, b.W], [a.v, b.v]), progress=True)
    with pytest.raises(OracleInconsistentError):
        exact.learn_single_head(two)
    assert two in _progress._BARS
    exact.learn_single_head(ValueQueryOracle(a, progress=True))
    assert not _progress._BARS                              # closed by the next run's start
