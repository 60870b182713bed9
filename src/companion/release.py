"""Deprecated: moved to :mod:`companion.book.release`; this path warns and forwards.

Import ``companion.book.release`` instead (the book's machinery lives apart from the science since
session 34). Every attribute read here warns once per call site with a ``DeprecationWarning`` and
returns the one of :mod:`companion.book.release`.
"""

from ._moved import forward

__getattr__ = forward(__name__, "companion.book.release")
