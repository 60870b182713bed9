"""The record ``benchmarks/ffn_peers.py`` writes (``data/results/ffn_peers.json``), as chapter 03 reads it.

Issue 34's review: chapter 03 told our driver's repair of Carlini et al.'s code from the repairs of their
files by the prefix "(driver" of its ``file`` text. Each repair now says who made it in ``"by"``.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "data" / "results" / "ffn_peers.json"
CHAPTER = ROOT / "book" / "chapters" / "03_one_layer_transformer.ipynb"


def test_each_repair_says_who_made_it_in_the_script_and_the_record(benchmarks):
    import ffn_peers

    assert [r["by"] for r in ffn_peers.REPAIRS] == ["peer-file"] * 4 + ["driver"]
    (driver,) = [r for r in ffn_peers.REPAIRS if r["by"] == "driver"]
    assert "mp.Pool(1)" in (benchmarks / "_peer_carlini_driver.py").read_text()  # made there, not in their file
    assert "mp.Pool(1)" in driver["change"]
    raw = RECORD.read_text()
    record = json.loads(raw)
    assert json.dumps(record, indent=1, sort_keys=True) + "\n" == raw  # as write_atomic writes it
    assert record["peers"]["carlini2020"]["repairs"] == ffn_peers.REPAIRS
    assert record["peers"]["deti2024"]["repairs"] == []


def test_chapter_03_counts_the_repairs_by_the_field():
    """The chapter's own line, run on the record: 4 repairs of their files, 1 of our driver."""
    nb = nbformat.read(CHAPTER, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == "bac5429a"]
    (line,) = [x for x in cell.source.splitlines() if x.startswith("driver_repairs = ")]
    assert 'r["by"] == "driver"' in line and "startswith" not in cell.source
    carlini_run = json.loads(RECORD.read_text())["peers"]["carlini2020"]
    namespace = {"carlini_run": carlini_run}
    exec(line, namespace)  # the committed chapter's line, on the committed record
    assert len(namespace["driver_repairs"]) == 1
    assert len(carlini_run["repairs"]) - len(namespace["driver_repairs"]) == 4  # peers_n_repairs
