"""A progress bar of the queries a learner asks against the queries it planned (tqdm).

Shared by every learner without a line of their own: :func:`companion._learner.reserve`, which each
learner calls with its planned count before its first query, starts a bar for the oracle, the
oracle's ``__call__`` advances it (:func:`advance`), and :func:`companion._learner.build` closes it.
The bar is shown only

* when it is wanted: the oracle's ``progress`` (``ValueQueryOracle(..., progress=False)``
  silences it, ``True`` forces it), else the environment variable ``COMPANION_PROGRESS``
  (``0`` or ``1``), else when standard error is a terminal (so never in a chapter's outputs, a
  Jupyter kernel's or pytest's captured streams);
* and for runs that last: tqdm's ``delay`` (:data:`DELAY`, 2 seconds) keeps it hidden until then.
"""

from __future__ import annotations

import os
import sys
import weakref

__all__ = ["DELAY", "wanted", "start", "advance", "finish"]

#: Seconds a run must last before its bar appears (tqdm's ``delay``).
DELAY = 2.0
#: Seconds between two redraws of a bar (tqdm's ``mininterval``).
MININTERVAL = 0.1

_BARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _root(oracle):
    """The oracle that counts: wrappers (``AntisymmetrisedOracle``, ``TokenPart``) hold it as ``.oracle``."""
    seen = 0
    while hasattr(oracle, "oracle") and seen < 16:
        oracle, seen = oracle.oracle, seen + 1
    return oracle


def wanted(setting=None) -> bool:
    """Whether to show a bar: ``setting`` if a bool, else ``COMPANION_PROGRESS``, else a terminal."""
    if setting is not None:
        return bool(setting)
    env = os.environ.get("COMPANION_PROGRESS", "").strip()
    if env in ("0", "1"):
        return env == "1"
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def start(oracle, total: int, learner: str) -> None:
    """Open a bar of ``total`` planned queries for ``oracle`` if one is wanted.

    Bars left open (a learner that raised, or the outer learner of a nested one) are closed first:
    one bar at a time.
    """
    root = _root(oracle)
    for bar in list(_BARS.values()):
        bar.close()
    _BARS.clear()
    try:
        if not wanted(getattr(root, "progress", None)):
            return
    except TypeError:  # an oracle that is not weak-referenceable or has odd attributes: no bar
        return
    from tqdm.auto import tqdm

    try:
        _BARS[root] = tqdm(
            total=int(total),
            desc=learner,
            unit="query",
            delay=DELAY,
            mininterval=MININTERVAL,
            leave=False,
            file=sys.stderr,
        )
    except TypeError:
        pass


def advance(oracle, n: int) -> None:
    """Count ``n`` answered queries on the oracle's bar, if it has one."""
    bar = _BARS.get(oracle) if _BARS else None
    if bar is not None:
        bar.update(n)


def finish(oracle) -> None:
    """Close the oracle's bar, if it has one."""
    try:
        bar = _BARS.pop(_root(oracle), None)
    except TypeError:
        return
    if bar is not None:
        bar.close()
