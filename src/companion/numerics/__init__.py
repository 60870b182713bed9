"""Shared numerics below the learners: what several of the paper's sections compute alike.

The package has three layers, and imports go down only:

1. ``companion.numerics`` (this subpackage): measurements and solvers that know nothing of
   oracles, heads or learners; they import nothing from ``companion`` above them.

   * :mod:`companion.numerics.rop` -- rank-one projections (ROP, Cai & Zhang 2015): the Gaussian
     design and its redraw of small ``a^T v``, the two-token queries that realise ``<a b^T, W>``,
     their scales under §6's assumptions and the error bound of one noisy measurement. Used by §5
     (``lowrank``), §6 and beyond (``robust``: Theorem 6.2's queries too) and the noisy
     verification of ``_learner``; Theorem 4.1's column queries and Gaussian probes (``exact``)
     and the isolation queries of ``multihead.learn_orthogonal_heads`` are the same queries with
     ``b = e_j``.
   * :mod:`companion.numerics.rgn` -- Riemannian Gauss-Newton on the rank-``r`` matrices for ROP
     measurements, plain and weighted. Used by ``lowrank`` (``method="rgn"``) and ``robust``
     (``learn_low_rank_noisy``).
   * ``companion.numerics.rational`` (private names, not on the API page) -- fits of
     ``g(s) = sum_h c_h sigma(s + l_h)``, the rational function of the copies' ratio that a
     multi-head answer is (this book's construction; it was ``companion._rational`` before issue 34).
     Used by the canonical-form learners of ``multihead`` and the layer probe of ``pretrained``.
   * :mod:`companion.numerics.rounding` -- rounding-error bounds of float64 computations (Higham
     2002): ``unit_roundoff``, ``gamma`` and the bounds the chapters check their gaps against.

2. The skeleton and the foundations: ``errors``, ``_validation``, ``_streaming``, ``recovery``,
   ``_learner`` (check, reserve, verify, build), ``attention`` and ``oracles``.
3. The paper's sections, a module or package each: ``exact`` (§4), ``ffn`` and ``transformer``
   (§4.1), ``lowrank`` (§5), ``robust`` (§6), ``multihead`` (§7); ``layer``, ``pretrained`` and
   ``membership`` go beyond the paper. The book's tools (``results``, ``plotting``, ``cli``, ...)
   sit apart, in ``companion.book``, which nothing here imports.

A module may use a private (``_``-prefixed) name of another module only if that module lies in a
subpackage strictly below its own (``companion.lowrank`` may import
``companion.numerics.rgn._retract``; ``companion.robust`` may not import from
``companion.lowrank`` a private name). ``tests/test_architecture.py`` checks this rule and that the
import graph has no cycle. Users import the public names where they always have:
``companion.lowrank.rop_queries``, ``companion.robust.rop_scales`` and
``companion.robust.rop_error_bound`` re-export the functions of :mod:`companion.numerics.rop`.
"""
