"""The claims of chapter 06 find the errors they were written against (issue 19, items 1 and 5).

Each test runs a chapter's own cells (read from the committed notebook, on small parameters) twice:
as committed, where the claim holds, and with the fix of the item reverted in a scratch copy of
the cell's source, where ``results.claim`` must stop the chapter with ``ClaimError``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest

from companion import multihead, oracles, verification_defaults
from companion.book import plotting, results
from companion.errors import ClaimError

CHAPTER = Path(__file__).resolve().parents[1] / "book" / "chapters" / "06_multi_head.ipynb"


def _cell(cell_id: str) -> str:
    nb = nbformat.read(CHAPTER, as_version=4)
    (cell,) = [c for c in nb.cells if c.get("id") == cell_id]
    return cell.source


def _revert(source: str, fixed: str, reverted: str) -> str:
    assert source.count(fixed) == 1, f"the fix {fixed!r} is no longer in the cell; update this test"
    return source.replace(fixed, reverted)


@pytest.fixture
def namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPANION_RESULTS_DIR", str(tmp_path))
    # the cells glue their values; outside a notebook that would start an IPython shell, which later
    # tests would take for a chapter's kernel (results.record_parameters checks declarations there)
    monkeypatch.setattr("myst_nb.glue", lambda *args, **kwargs: None)
    results.record_parameters("06_multi_head_claims_test", seed=0, glue=False)
    return {"np": np, "multihead": multihead, "oracles": oracles, "plotting": plotting, "results": results,
            "seed": 0}


def _run(sources, ns):
    for src in sources:
        exec(compile(src, "<chapter 06 cell>", "exec"), ns)


def test_sweep_counts_learning_queries_apart_item_1(namespace):
    """Item 1: the sweep's 'exactly 2(d + d^2) plus re-asked probes' fails if verification is counted."""
    sweep_cell, claim_cell = _cell("103862e8"), _cell("ef5c155a")
    (n_check, _), = verification_defaults(["learn_orthogonal_heads"]).values()
    ns = dict(namespace, H_values=[2], d_values=[4, 6], n_check=n_check)
    _run([sweep_cell, claim_cell], ns)                                   # as committed: holds
    assert results.load("06_multi_head_claims_test")["values"]["mh_sweep_count"]["holds"] is True

    reverted = _revert(sweep_cell, '"learning queries": r.n_learning_queries', '"learning queries": r.n_queries')
    with pytest.raises(ClaimError, match="mh_sweep_count"):
        _run([reverted, claim_cell], dict(namespace, H_values=[2], d_values=[4, 6], n_check=n_check))


def test_canonical_ratio_covers_every_H_item_5(namespace):
    """Item 5: 'between lo and hi times 4Hd^2 - 2H + 1' fails if hi leaves out H = 1."""
    sweep_cell, claim_cell = _cell("87eef260"), _cell("862b78b7")
    params = dict(H_canon=[1, 2], d_canon=8)
    ns = dict(namespace, **params)
    _run([sweep_cell, claim_cell], ns)                                   # as committed: holds
    ratios = [r["queries"] / r["4Hd^2 - 2H + 1"] for r in ns["canon_rows"]]
    assert ratios[0] > ratios[1], "H = 1 must have the largest ratio for this test to mean anything"

    reverted = _revert(claim_cell, "max(ratio(r) for r in canon_rows)", "max(ratio(r) for r in canon_rows[1:])")
    with pytest.raises(ClaimError, match="mh_canon_ratio_max"):
        _run([sweep_cell, reverted], dict(namespace, **params))
