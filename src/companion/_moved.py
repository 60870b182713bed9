"""Module-level ``__getattr__`` for a module that moved: warn, then forward (as SciPy and QuantEcon do)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable


def forward(old: str, new: str) -> Callable[[str], Any]:
    """``__getattr__`` for the module ``old``, which moved to ``new``.

    Parameters
    ----------
    old : str
        The deprecated module's name (``companion.results``).
    new : str
        Where it lives now (``companion.book.results``), imported on the first attribute read.

    Returns
    -------
    callable
        Assign it to the old module's ``__getattr__``: every attribute read warns with a
        ``DeprecationWarning`` naming ``new`` and returns ``new``'s attribute. The old module
        defines no ``__dir__`` listing ``new``'s names: tools that read every listed name (pytest's
        doctest collection) would warn for each.

    Examples
    --------
    >>> import warnings
    >>> getattr_ = forward("old.json", "json")
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     dumps = getattr_("dumps")
    >>> dumps([1]), str(caught[0].message)
    ('[1]', 'old.json is deprecated: use json.dumps (import json)')
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module = importlib.import_module(new)
        value = getattr(module, name)  # AttributeError, as for any module, if it does not exist
        warnings.warn(f"{old} is deprecated: use {new}.{name} (import {new})", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
