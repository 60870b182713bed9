"""The targets a benchmark prints decide its exit code (issue 19, item 26).

Each benchmark calls :meth:`Targets.check` once per target it prints, and exits with
:meth:`Targets.exit_code`, so that ``make bench`` fails when a printed target fails.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


class Targets:
    """Collect PASS/FAIL verdicts; ``exit_code()`` is 1 if any failed."""

    def __init__(self):
        self.verdicts: list[tuple[str, bool]] = []

    def check(self, label: str, ok) -> bool:
        ok = bool(ok)
        print(f"{label}: {'PASS' if ok else 'FAIL'}")
        self.verdicts.append((label, ok))
        return ok

    def exit_code(self) -> int:
        failed = [label for label, ok in self.verdicts if not ok]
        if failed:
            print(f"\n{len(failed)} of {len(self.verdicts)} targets FAILED: " + "; ".join(failed))
        return 1 if failed else 0


def write_atomic(path: Path, obj) -> None:
    """Write ``obj`` to ``path`` as JSON (indent 1, sorted keys), atomically.

    A temporary file in the same folder is renamed over ``path``, so a reader never sees
    half a record and an interrupted run leaves the old record whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_rows(name: str, params: dict, rows: dict, seed=0) -> Path:
    """Merge ``rows`` (key -> row dict) into ``data/results/<name>.json`` with provenance, atomically.

    The file's header is :func:`companion.book.results.provenance` of ``name``, ``params`` and
    ``seed``; each row also gets the run's ``created``, ``commit`` and ``library_hash``. Rows of
    earlier runs under other keys are kept. Returns the path (``bench_scale.py``,
    ``bench_noisy_scale.py``).
    """
    from companion.book import results

    root = results.repo_root(Path(__file__).resolve().parent)
    path = (root if root is not None else Path.cwd()) / "data" / "results" / f"{name}.json"
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        old = {"rows": {}}
    header = results.provenance(name, params, seed)
    stamp = {key: header[key] for key in ("created", "commit", "library_hash")}
    merged = dict(old.get("rows", {})) | {key: row | stamp for key, row in rows.items()}
    results.write_json(path, header | {"rows": merged})
    return path
