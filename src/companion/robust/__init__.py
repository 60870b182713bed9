"""Learning one attention head from approximate value queries (§6: Lemma 6.1, Theorem 6.2) and beyond.

A served model does not answer exactly: it rounds. The approximate oracle AVQ(X; tau) of §6 returns
any value within ``tau`` of f*(X), deterministically, so repeating a query gains nothing. Under the
assumptions of §6 — ``||W*||_F <= W_max`` (known, ``W_max >= 2``), ``||v*||_2 <= 1``, tokens of norm at
most 1 and a margin ``min_i |v*_i| >= mu > 0`` — the paper's learner reads ``v`` off length-1 queries
and each entry ``W_ij`` off one length-2 query whose logit is at most 1/2 in magnitude:

* :func:`learn_robust` — Theorem 6.2 exactly as stated (``a = 1/2``, ``b = 1/W_max``, clip, sigma^-1,
  divide by ``ab``), ``d + d**2`` queries.
* :func:`clipped_logit`, :func:`lemma_6_1_bound` — Lemma 6.1, the Lipschitz step behind it.
* :func:`sufficient_tolerance`, :func:`guaranteed_error` — the theorem's tolerance for given
  accuracies, and its inverse: the accuracy guaranteed at a given tolerance.
* :func:`random_margin_head` — random targets that satisfy the assumptions of §6.

Beyond the paper:

* :func:`entry_error_bound`, :func:`best_scale` — the theorem's per-entry error bound as a function of
  the probe scale ``b``, and the ``b`` that minimises it (the paper fixes ``b = 1/W_max``).
* :func:`learn_robust_lstsq` — margin-free probes ``e_i + s_i e_p`` at the best scale, repeated at
  ``R`` distinct scales and combined by weighted least squares: about ``R (d + d**2)`` queries
  (:func:`n_queries_lstsq`).
* :func:`learn_low_rank_noisy` — a rank-``r`` head from ``d + m`` approximate queries: Gaussian
  rank-one projections (§5) at scales that keep Lemma 6.1's window (:func:`rop_scales`), a bound on
  each measurement's error (:func:`rop_error_bound`), and a noise-aware solver (nuclear norm with
  the bounds as constraints, or weighted rank-``r`` Gauss-Newton). The paper leaves this case open.

Layer: one of the paper's sections (§6), above the shared numerics it uses with
:mod:`companion.lowrank`: :func:`rop_scales` and :func:`rop_error_bound` live in
``companion.numerics.rop`` (re-exported here), the weighted Gauss-Newton solver in
``companion.numerics.rgn``.

The package (private modules; this ``__init__`` re-exports the public names, so
``companion.robust.X`` is the import path):

* ``_theorem``: Lemma 6.1, Theorem 6.2's algorithm and :func:`learn_robust` (the constant 80 is the proof's);
* ``_lstsq``: the best probe scale and :func:`learn_robust_lstsq`;
* ``_noisy``: :func:`learn_low_rank_noisy`, its solver table and its certificates.
"""

from __future__ import annotations

from ..attention import SingleHead  # noqa: F401  (read as robust.SingleHead by chapter 05, as before the split)
from ..numerics.rop import rop_error_bound, rop_scales
from ._lstsq import best_scale, entry_error_bound, learn_robust_lstsq, lstsq_error_bound, n_queries_lstsq
from ._noisy import NOISY_METHODS, learn_low_rank_noisy
from ._theorem import (
    LIPSCHITZ_6_1,
    TAU_CLIP,
    clipped_logit,
    guaranteed_error,
    learn_robust,
    lemma_6_1_bound,
    random_margin_head,
    robust_queries,
    sufficient_tolerance,
)

# Public names of robust.py outside __all__, read as companion.robust.X as before the split (the
# learner reads them in its private module: a test that changes one patches that module).
from ._noisy import (  # noqa: F401
    AMBIGUITY_DIRECTIONS,
    AMBIGUITY_SLACK,
    AMBIGUITY_SVD_MAX,
    EXACT_RESIDUAL,
    FIT_SLACK,
    NOISY_OVERSAMPLING,
    OWN_VIOLATION_MARGIN,
    SKIP_SECOND_START_FIT,
    START_RUN_INNER_RTOL,
    START_RUN_RTOL,
    UNDETERMINED_RATIO,
    VIOLATION_SLACK,
)
from ._theorem import THEOREM_6_2_CONSTANT, margin_rounding  # noqa: F401

__all__ = [
    "TAU_CLIP",
    "LIPSCHITZ_6_1",
    "clipped_logit",
    "lemma_6_1_bound",
    "sufficient_tolerance",
    "guaranteed_error",
    "random_margin_head",
    "robust_queries",
    "learn_robust",
    "entry_error_bound",
    "best_scale",
    "learn_robust_lstsq",
    "lstsq_error_bound",
    "n_queries_lstsq",
    "NOISY_METHODS",
    "rop_scales",
    "rop_error_bound",
    "learn_low_rank_noisy",
]

# The public names report the package as their module, whatever private file defines them: saved
# results name "companion.<package>:<Class>" as before the split, the API page (autodoc of this
# package) documents them, and tools that look for a module's own learners find them here.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
