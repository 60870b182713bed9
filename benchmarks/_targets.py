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
