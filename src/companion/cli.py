"""Deprecated: moved to :mod:`companion.book.cli`; this path warns and forwards.

Import ``companion.book.cli`` instead (the book's machinery lives apart from the science since
session 34). Every attribute read here warns once per call site with a ``DeprecationWarning`` and
returns the one of :mod:`companion.book.cli`.
"""

from ._moved import forward

__getattr__ = forward(__name__, "companion.book.cli")
