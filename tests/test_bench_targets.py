"""A target a benchmark prints decides its exit code (issue 19, item 26)."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    yield
    for name in ("_targets", "bench_exact", "bench_lowrank"):
        sys.modules.pop(name, None)


def test_a_failed_target_fails_the_benchmark(benchmarks, capsys):
    from _targets import Targets

    t = Targets()
    t.check("a", True)
    assert t.exit_code() == 0
    t.check("b", False)
    assert t.exit_code() == 1
    out = capsys.readouterr().out
    assert "a: PASS" in out and "b: FAIL" in out and "1 of 2 targets FAILED: b" in out


def test_bench_exact_counts_learning_queries_and_exits_on_a_missed_target(benchmarks, monkeypatch, capsys):
    import bench_exact

    rows = bench_exact.main((8,))
    out = capsys.readouterr().out
    assert rows.exit_code == 0 and "n_learning_queries == d + d^2 at every d: PASS" in out
    assert rows[0][1] == 8 + 64 and rows[0][8] == 32        # learning queries; verification apart
    monkeypatch.setattr(bench_exact, "TARGET_ERROR", 0.0)
    assert bench_exact.main((8,)).exit_code == 1


def test_bench_lowrank_labels_come_from_the_library(benchmarks):
    import bench_lowrank
    from companion.lowrank import DEFAULT_OVERSAMPLING

    labels = list(bench_lowrank.learners(20, 2, 0))
    assert f"nuclear ({DEFAULT_OVERSAMPLING['nuclear']:g}x)" in labels
    assert f"rgn ({DEFAULT_OVERSAMPLING['rgn']:g}x)" in labels
    assert "nuclear (3x)" not in labels
