"""Multi-head attention (§7): non-identifiability, canonical form, detection and a structured learner.

A multi-head model ``f^H(X) = sum_h alpha(X, W^(h))^T X v^(h)`` is a sum of single heads
(:class:`~companion.attention.MultiHead`). Its parameters are not identifiable from its function
(Proposition 7.1): heads with the same ``W`` can trade value vector mass, heads can be permuted, and
heads whose value vectors cancel add nothing. This module holds

* constructions of distinct parameter sets with the same function: :func:`proposition_7_1`,
  :func:`permute_heads`, :func:`split_head`, :func:`add_cancelling_heads`;
* the canonical form (merge heads with equal ``W`` by summing their ``v``, drop heads with ``v = 0``,
  sort), :func:`canonical_form`, with :func:`match_heads` and :func:`equivalent` to compare models;
* :func:`detect_multi_head`: the single-head learner of Theorem 4.1 followed by fresh verification
  queries, which flag an oracle that is not one head;
* random targets: :func:`random_multi_head` (general or with heads in orthogonal subspaces);
* the learners, each returning a :class:`MultiHeadRecovery` and verifying it by default:

  - :func:`learn_orthogonal_heads`: heads living in mutually orthogonal subspaces (the structural
    assumption named in §7), every head recovered up to permutation without knowing ``H`` or the
    subspaces;
  - :func:`learn_canonical`: general multi-head targets, recovered in canonical form (this book's
    construction, with ``H`` given or bounded);
  - :func:`learn_canonical_rational`: the same canonical form through the counts route, at the
    follow-up's query count (this book's derivation of its abstract; :func:`rational_plan` and
    :func:`follow_up_count` give its counts).

  A single head is :func:`companion.exact.learn_single_head`'s; :func:`detect_multi_head` says
  which of the two an oracle needs.

* ``WEAK_CENTRE``: the moment start's smallest amplitude ratio at a centre before it draws a
  second one (chapter 06 cites it);
* research-only diagnostics of the counts route (no learner calls them): :func:`counts_conditioning`,
  :func:`counts_start_coverage`, :func:`counts_information`, :func:`counts_length_bounds`,
  :func:`multiscale_pair_starts`, :func:`probe_hessian`, :func:`count_pairs`, :func:`fit_logistic_sum`.

The package's private modules, one per topic (import the public names from here):

========================  ==================================================================
``_identifiability``      Proposition 7.1's constructions, the canonical form, random targets
``_detection``            :func:`detect_multi_head`, :func:`verify_model`
``_orthogonal``           :func:`learn_orthogonal_heads`
``_canonical``            the robust canonical route, :func:`learn_canonical` (its plan, :func:`canonical_plan`)
``_counts``               the counts route, :func:`learn_canonical_rational`
``_route``                its counts and plans (:func:`rational_plan`, :func:`moment_plan`), tokens, result
``_pairstart``            its pair start; ``_rowstart``: the shared-amplitude start behind it
``_moments``, ``_star``   its moment start (this book's own)
``_diagnostics``          the research-only diagnostics; ``_information``, ``_multiscale`` behind them
``_common``               the result type :class:`MultiHeadRecovery`, its build and check
========================  ==================================================================

Layer: one of the paper's sections (§7), above §4 (``exact``: the single-head learner and its
inversion), the skeleton (``_learner``) and the shared numerics (its isolation queries are
:func:`companion.numerics.rop.rop_queries`; the fits of logistic sums are
``companion.numerics.rational``).
"""

from __future__ import annotations

from ._canonical import canonical_plan, learn_canonical
from ._common import MultiHeadRecovery
from ._counts import learn_canonical_rational
from ._detection import Detection, detect_multi_head, verify_model
from ._diagnostics import (
    count_pairs,
    counts_conditioning,
    counts_information,
    counts_length_bounds,
    counts_start_coverage,
    fit_logistic_sum,
    multiscale_pair_starts,
    probe_hessian,
)
from ._identifiability import (
    add_cancelling_heads,
    canonical_form,
    equivalent,
    match_heads,
    permute_heads,
    proposition_7_1,
    random_multi_head,
    split_head,
)
from ._orthogonal import learn_orthogonal_heads
from ._route import MOMENT_FROM, follow_up_count, moment_plan, rational_plan
from ._star import WEAK_CENTRE

__all__ = [
    # Proposition 7.1: constructions, the canonical form, comparison, random targets
    "proposition_7_1",
    "permute_heads",
    "split_head",
    "add_cancelling_heads",
    "canonical_form",
    "match_heads",
    "equivalent",
    "random_multi_head",
    # detection
    "Detection",
    "detect_multi_head",
    "verify_model",
    # the learners and their result
    "MultiHeadRecovery",
    "learn_orthogonal_heads",
    "learn_canonical",
    "learn_canonical_rational",
    # the counts route's counts and plans
    "follow_up_count",
    "rational_plan",
    "moment_plan",
    "canonical_plan",
    "MOMENT_FROM",
    "WEAK_CENTRE",
    # research-only diagnostics of the counts route
    "counts_conditioning",
    "counts_start_coverage",
    "counts_information",
    "counts_length_bounds",
    "multiscale_pair_starts",
    "probe_hessian",
    "count_pairs",
    "fit_logistic_sum",
]

# The public objects keep ``companion.multihead`` as their home: saved results name their class by
# it (companion._saved), the book's constants scan (companion.prose) and the docs read it.
for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj):  # functions and classes; not the constants
        _obj.__module__ = __name__
del _name, _obj
