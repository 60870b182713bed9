"""`make bench` (benchmarks/run_all.py) reports each benchmark's cost, and bench_multihead prints the
largest H per d of both routes (issue 21, done-when)."""


def test_run_all_times_the_whole_process_tree_and_fails_when_a_benchmark_fails(benchmarks, tmp_path, capsys):
    import run_all

    # a benchmark whose work is done by a subprocess it waits for: its CPU seconds count
    (tmp_path / "bench_busy.py").write_text(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.3: pass'], check=True)\n")
    (tmp_path / "bench_fails.py").write_text("import sys\nsys.exit(1)\n")
    assert run_all.main(["bench_busy"], tmp_path) == 0
    out = capsys.readouterr().out
    busy = next(line for line in out.splitlines() if line.startswith("bench_busy "))
    wall, cpu, rc = busy.split()[1:4]
    assert float(cpu) >= 0.3 and float(wall) >= float(cpu) - 0.05 and rc == "0"
    assert run_all.main([], tmp_path) == 1
    out = capsys.readouterr().out
    assert "FAILED: bench_fails.py (exit 1)" in out and "== " + tmp_path.name + "/bench_busy.py" in out
    assert run_all.main(["bench_nonesuch"], tmp_path) == 2
    assert "no benchmark named bench_nonesuch" in capsys.readouterr().err


def test_run_all_states_the_total_against_the_twenty_minute_bound(benchmarks):
    import run_all

    def rows(cpu):
        return [{"bench": "bench_a", "wall s": 2 * cpu, "CPU s": cpu, "exit": 0, "load start": 1.0,
                 "load end": 2.0}]

    assert run_all.BOUND_SECONDS == 1200
    assert "(within it on CPU, over it on wall time)" in run_all.table(rows(1200.0))
    assert "(OVER it on CPU, over it on wall time)" in run_all.table(rows(1200.01))
    assert "(within it on CPU, within it on wall time)" in run_all.table(rows(600.0))


def test_bench_multihead_largest_H_table_labels_both_routes(benchmarks):
    import bench_multihead as bench

    table, robust = bench.largest_H_table({8: 6, 16: 7, 32: 7, 64: 8})
    by_d = {row["d"]: row for row in table.to_dict("records")}
    # the counts route at the top of its search (H = min(12, d)) is a lower bound; below it is not
    assert by_d[64]["counts route H"] == "8" and by_d[32]["counts route H"] == "7"
    assert by_d[8]["counts route H"] == "6" and by_d[8]["counts source"] == "measured (seed 0, every H = 1 .. 8)"
    assert bench.COUNTS_H_STOP == 12 and by_d[16]["counts source"] == "measured (seed 0, every H = 1 .. 12)"
    # the H below the largest that were not recovered (the pair start's refusals) are shown beside it
    table, _ = bench.largest_H_table({32: 12, 64: 11}, failed={32: [8], 64: []})
    by_d = {row["d"]: row for row in table.to_dict("records")}
    assert by_d[32]["counts route H"] == ">= 12 (not 8)" and by_d[64]["counts route H"] == "11"
    table, robust = bench.largest_H_table({8: 6, 16: 7, 32: 7, 64: 8})
    by_d = {row["d"]: row for row in table.to_dict("records")}
    # the robust route: the docstring's record, with its date, d = 16 included
    assert [by_d[d]["robust route H"] for d in (8, 16, 32, 64)] == [">= 8", "9", "10", ">= 8"]
    assert by_d[16]["robust source"] == bench.ROBUST_SOURCE and "43ae669 (d = 16" in bench.ROBUST_SOURCE
    assert robust["16"] == {"H": 9, "lower_bound": False, "source": by_d[16]["robust source"],
                            "provenance": bench.ROBUST_PROVENANCE[16]}
    # each recorded value names the commit that wrote it, that commit's library hash, the date and the search
    for d, record in bench.ROBUST_PROVENANCE.items():
        assert set(record) == {"measured", "commit", "library_hash", "committed", "parameters"}, d
        assert len(record["commit"]) == 40 and len(record["library_hash"]) == 16
        assert record["commit"][:7] in bench.ROBUST_SOURCE and record["library_hash"] in bench.ROBUST_SOURCE
        assert record["parameters"]["tol"] == bench.CANON_TOL
    # measured by --search-H: labelled so, and a d the record does not hold is said to be missing
    table, robust = bench.largest_H_table({16: 7, 128: 3}, {16: (11, False)})
    by_d = {row["d"]: row for row in table.to_dict("records")}
    assert by_d[16]["robust route H"] == "11" and by_d[16]["robust source"] == "measured"
    assert by_d[128]["robust route H"] == "not recorded" and robust == {
        "16": {"H": 11, "lower_bound": False, "source": "measured"}}


def test_canonical_sweep_marks_a_search_that_never_failed_as_a_lower_bound(benchmarks, monkeypatch, capsys):
    # before: save() wrote every measured robust value with lower_bound False, d = 8's H = 8 (the
    # generator's cap H <= d) included
    from types import SimpleNamespace

    import bench_multihead as bench
    from companion.errors import OracleInconsistentError

    def fake_learn_canonical(oracle, H):    # recovers exactly up to H = 3, then refuses
        if H > 3:
            raise OracleInconsistentError(f"H={H}: refused")
        return SimpleNamespace(n_queries=1, diagnostics={"max_len": 1},
                               model=bench.canonical_form(oracle.target))

    monkeypatch.setattr(bench, "learn_canonical", fake_learn_canonical)
    assert bench.canonical_sweep([2, 3, 4], seeds=1) == {2: (2, True), 3: (3, True), 4: (3, False)}
    out = capsys.readouterr().out
    assert "d = 3: largest H recovered to relative error <= 1e-08 on all 1 seeds: >= 3" in out
    assert "d = 4: largest H recovered to relative error <= 1e-08 on all 1 seeds: 3" in out


def test_bench_scale_exact_row_runs(benchmarks, capsys):
    # before: learn_single_head's default verification passed a list of sequences of several
    # lengths to the timing oracle, which raised ValueError, and the row was dropped
    import json

    import bench_scale

    bench_scale.child("exact", 8, None, 1)
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["queries"] == 8 + 8 * 8 == row["floor"] and row["error_W"] <= 1e-12


def test_bench_scale_fails_on_a_failed_row_or_a_missed_ratio(benchmarks, monkeypatch, capsys):
    # before: a row that failed was skipped and a missed target printed MISSED, with exit code 0
    import json
    import subprocess

    import bench_scale

    monkeypatch.setattr(bench_scale, "rows_for", lambda sizes: [("exact d=1024", "exact", 1024, None)])

    def fake(returncode, ratio=1.0):
        row = {"learner": "exact", "d": 1024, "queries": 1, "queries_per_floor": 1.0, "error_W": 0.0,
               "learner_s": 1.0, "oracle_in_run_s": 1.0, "ratio": ratio, "oracle_alone_s": 1.0,
               "ratio_alone": 1.0, "peak_rss_mb": 1.0, "rss_growth_mb": 0.0, "d2_floats_mb": 8.0}
        out = subprocess.CompletedProcess([], returncode, json.dumps(row), "Traceback: ValueError")
        monkeypatch.setattr(bench_scale.subprocess, "run", lambda *a, **k: out)

    fake(1)
    assert bench_scale.main(["--no-save"]) == 1 and "exact d=1024 ran: FAIL" in capsys.readouterr().out
    fake(0, ratio=bench_scale.TARGET_RATIO)
    assert bench_scale.main(["--no-save"]) == 0
    fake(0, ratio=bench_scale.TARGET_RATIO + 0.01)
    assert bench_scale.main(["--no-save"]) == 1
    assert "target ratio <= 1.5 (exact d=1024; 1.51 in run" in capsys.readouterr().out


def test_counts_search_goes_past_a_failure_and_reports_the_refused_H_below_the_largest(benchmarks, monkeypatch):
    # before: the search stopped at the first failure, so the moment start (H >= 9) was never reached
    # at a d where the pair start refuses H = 8
    import bench_multihead as bench

    tried = []

    def fake_row(d, H, seed=0, repeats=5, timed=True):
        assert not timed   # the search needs only the outcome
        tried.append((d, H))
        return {"d": d, "H": H, "outcome": "raised: refused" if (d, H) in {(4, 2), (4, 4), (3, 1)} else "ok"}

    monkeypatch.setattr(bench, "rational_row", fake_row)
    monkeypatch.setattr(bench, "RATIONAL_CASES", [])
    monkeypatch.setattr(bench, "COVERAGE_H", (1,))
    monkeypatch.setattr(bench, "counts_start_coverage", lambda d, H: {"H": H, "fewest resolved / d": 1.0})
    monkeypatch.setattr(bench, "counts_conditioning", lambda d, H, n_draws: {"pair": 1.0})
    rows, largest, why, failed, seeds = bench.rational_tables([3, 4], H_stop=4)
    assert tried == [(3, 1), (3, 2), (3, 3), (4, 1), (4, 2), (4, 3), (4, 4)]   # every H <= min(H_stop, d)
    assert largest == {3: 3, 4: 3} and failed == {3: [1], 4: [2]}   # H = 4 at d = 4 is above the largest
    assert seeds == []   # the seeds of d = 64, H = 12 only with d = 64


def test_rational_row_untimed_for_the_search_has_the_outcome_and_no_seconds(benchmarks):
    import bench_multihead as bench

    row = bench.rational_row(8, 2, timed=False)
    assert row["outcome"] == "ok" and row["error"] <= bench.CANON_TOL and row["start"] == "pairs"
    assert row["queries"] <= row["4Hd^2-2H+1"] == 4 * 2 * 64 - 2 * 2 + 1 and row["longest"] <= 5
    assert not {"learner s", "oracle s", "ratio"} & set(row)
