"""The targets a benchmark prints decide its exit code (issue 19, item 26).

Each benchmark calls :meth:`Targets.check` once per target it prints, and exits with
:meth:`Targets.exit_code`, so that ``make bench`` fails when a printed target fails.
"""

from __future__ import annotations


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
