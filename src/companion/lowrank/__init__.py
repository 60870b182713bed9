"""Low-rank heads from rank-one projections (Theorems 5.1, 5.2) and at the degrees-of-freedom count (§5).

A head whose merged matrix ``W`` has rank ``r`` (the head dimension) has only ``r (2d - r)`` degrees
of freedom, far fewer than the ``d**2`` entries Theorem 4.1 reads one by one. Every learner here
rests on one measurement, the rank-one projection (ROP) of Cai & Zhang (2015) realised by a
two-token value query: for ``X = c [(a + b)^T; b^T]`` the two-token identity gives

.. math:: y = c\\,(b^\\top v + \\sigma(c^2\\, a^\\top W b)\\, a^\\top v), \\qquad
          a^\\top W b = \\sigma^{-1}\\big((y / c - b^\\top v) / a^\\top v\\big) / c^2,

so one query yields one bilinear measurement ``<a b^T, W>`` whenever ``a^T v != 0``. The scale
``c`` (the logit scales by ``c**2``, the answer by ``c``) keeps the sigmoid unsaturated.

Three ways to turn measurements into ``W``, one entry point :func:`learn_low_rank`:

* ``method="nuclear"``: Gaussian ROP and nuclear-norm minimisation through cvxpy, the program of
  Theorems 5.1 / 5.2 (the reference; small ``d`` only).
* ``method="rgn"``: the same Gaussian ROP measurements, solved by Riemannian Gauss-Newton on the
  rank-``r`` matrices from a spectral start (Luo, Huang, Li & Zhang 2024); scales to ``d`` in the
  hundreds.
* ``method="sketch"``: structured measurements of a randomly rotated ``W`` (a cross of ``k`` rows
  and ``k`` columns) and the stabilised generalised Nystrom formula (Nakatsukasa 2020); exact with
  ``k (2d - k) + d`` queries, ``k = r + 1``, against the floor ``r (2d - r) + d``. With
  ``rank=None`` the cross grows one row and column at a time until the rank shows.
* ``method="auto"`` (the default, this book's): ``"nuclear"`` where its program fits in
  ``NUCLEAR_MAX_BYTES``, else the sketch; the result's message states the choice.

Layer: one of the paper's sections (§5), above the shared numerics it uses with
:mod:`companion.robust`: the Gaussian design and :func:`rop_queries` live in
``companion.numerics.rop`` (re-exported here), the Gauss-Newton solver in
``companion.numerics.rgn``. :func:`measure_bilinear` (exact oracles, re-measuring saturated
queries) and the sketch are this module's own.

The package, one module per method (each private; this ``__init__`` re-exports the public names, so
``companion.lowrank.X`` is the import path):

* ``_measure``: degrees of freedom, program sizes and ``NUCLEAR_MAX_BYTES``, :func:`measure_bilinear`;
* ``_nuclear``: the convex program (cvxpy, SCS);
* ``sketch_cross``: the cross and the stabilised Nystrom formula;
* ``_learn``: :func:`learn_low_rank`, its method table and its named stages, and ``bias=True``;
* ``_trials``: :func:`recovery_trial`, :func:`phase_transition`, :func:`scaling_point` and the
  statistical dimension.
"""

from __future__ import annotations

from .._streaming import CHUNK_BYTES
from ..numerics.rop import rop_queries
from ._learn import LowRankRecovery, learn_low_rank
from ._measure import (
    DEFAULT_OVERSAMPLING,
    METHODS,
    NUCLEAR_MAX_BYTES,
    degrees_of_freedom,
    measure_bilinear,
    nuclear_program_size,
)
from ._trials import (
    DESIGNS,
    nuclear_statistical_dimension,
    phase_transition,
    recovery_trial,
    scaling_point,
    transition_point,
)

# Public names outside __all__ that robust and the tests read here.
from ._measure import NUCLEAR_BYTES_PER_ENTRY, check_nuclear_size  # noqa: F401

__all__ = [
    "learn_low_rank",
    "LowRankRecovery",
    "degrees_of_freedom",
    "rop_queries",
    "measure_bilinear",
    "CHUNK_BYTES",
    "METHODS",
    "DEFAULT_OVERSAMPLING",
    "NUCLEAR_MAX_BYTES",
    "nuclear_program_size",
    "recovery_trial",
    "phase_transition",
    "transition_point",
    "nuclear_statistical_dimension",
    "DESIGNS",
    "scaling_point",
]

# The public names report the package as their module, whatever private file defines them: saved
# results name "companion.<package>:<Class>" as before the split, the API page (autodoc of this
# package) documents them, and tools that look for a module's own learners find them here.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
