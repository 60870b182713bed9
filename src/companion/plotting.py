"""Deprecated: moved to :mod:`companion.book.plotting`; this path warns and forwards.

Import ``companion.book.plotting`` instead (the book's machinery lives apart from the science since
session 34). Every attribute read here warns once per call site with a ``DeprecationWarning`` and
returns the one of :mod:`companion.book.plotting`.
"""

from ._moved import forward

__getattr__ = forward(__name__, "companion.book.plotting")
