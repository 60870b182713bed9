"""Exception classes of the companion library, with their standard messages.

Every error the library raises on purpose is one of the classes below, so that a caller can catch
exactly the failure it can handle. Messages say what was wrong, the offending value, and what to do.
The message templates live next to their classes (``MESSAGES``), as ``scipy.optimize`` keeps its
``_status_message`` in one place; tests match them with ``pytest.raises(match=...)``.

- ``InvalidInputError``: an argument has the wrong shape, type or range, or holds NaN / inf.
- ``BudgetExceededError``: a query would take an oracle past its budget (raised before it).
- ``NotIdentifiableError``: the queries cannot determine the parameters (e.g. ``v* = 0``).
- ``OracleInconsistentError``: the oracle's answers contradict the model the learner assumes.
- ``SolverError``: a numerical solver (cvxpy, least squares) did not reach optimality.
- ``ParameterError``: a chapter was given an unknown or ill-typed parameter.
- ``ClaimError``: a sentence a chapter states (``results.claim``) is false for this run.
"""

from __future__ import annotations

__all__ = [
    "CompanionError",
    "InvalidInputError",
    "BudgetExceededError",
    "NotIdentifiableError",
    "OracleInconsistentError",
    "SolverError",
    "ParameterError",
    "ClaimError",
    "PrecisionError",
    "MESSAGES",
    "nonfinite_answer_error",
]

#: Standard message templates, formatted with ``str.format`` by the raising code.
MESSAGES = {
    "budget": (
        "query budget exceeded: {needed} more queries requested, but only {remaining} of the "
        "budget of {budget} remain ({used} used). Raise the budget or ask for fewer queries."
    ),
    "budget_upfront": (
        "{learner} needs {needed} queries, but the oracle has only {remaining} left of its budget "
        "of {budget}. Raise the budget to at least {total}."
    ),
    "v_zero": (
        "the recovered value vector v is 0, so f is identically 0 and no query can reveal W "
        "(Theorem 4.1, remark on v* = 0). Nothing about W is identifiable from this oracle."
    ),
    "v_zero_biased": (
        "the recovered token part of the value vector, v~[:d], is 0, so f is the constant v0 = {v0:.6g} "
        "on every query and no query can reveal W or the score bias w (Theorem 4.1's remark on v* = 0, "
        "on homogeneous tokens). Nothing about W is identifiable from this oracle."
    ),
    "not_single_head": (
        "the oracle is not a single attention head: on {n} fresh random queries the recovered "
        "head disagrees with the oracle by up to {err:.3g} (tolerance {tol:.3g}). "
        "The target may be a multi-head model, a Transformer, or a noisy oracle."
    ),
    "verify_failed": (
        "verification failed: on {n} fresh random queries the recovered model disagrees with the "
        "oracle by up to {err:.3g} (relative; tolerance {tol:.3g}), so the oracle is not {what}. "
        "The learner's assumptions do not hold for this target; nothing was returned. Pass "
        "verify=0 to get the unverified estimate anyway."
    ),
    "verify_failed_rounding": (
        "verification failed: on {n} fresh random queries the recovered model disagrees with the "
        "oracle by up to {err:.3g} (relative), beyond the tolerance {tol:.3g} = {size:.0f} x "
        "u={u:.2g} that rounding allows: {prec}. Errors at that level cannot explain it, so "
        "the oracle is not {what}; nothing was returned. Pass verify=0 to get the unverified "
        "estimate anyway."
    ),
    "verify_vacuous": (
        "cannot verify: {prec}, so a check on {n} fresh queries would have to accept "
        "disagreements up to {tol:.3g} of the output ({size:.3g} x u), above the ceiling of "
        "{ceiling:.0%} at which a check certifies anything, and would certify nothing. "
        "The estimate's attainable relative error is about {floor:.2g}; pass verify=0 to get it "
        "unverified, or use an approximate-oracle learner (companion.robust) with tau at the "
        "answers' rounding."
    ),
    "verify_noisy_failed": (
        "verification failed: {n} fresh queries certify ||{name} - {name}*|| >= {err:.3g}, more than "
        "the {allowed:.3g} allowed{why}, for every target within tau={tau:.3g} of the answers with "
        "||W*||_F <= W_max={W_max:g}. The oracle is not {what} (or errs by more than tau, or "
        "W_max is too small), or the learner failed on it. Pass verify=0 to get the estimate anyway."
    ),
    "needs_exact": (
        "{learner} needs an exact value-query oracle, got {cls} with tau={tau!r}; "
        "the approximate-oracle learners (companion.robust.learn_robust, learn_robust_lstsq, "
        "learn_low_rank_noisy) cover single heads only. Which is most accurate depends on the "
        "noise: at small noise an exact learner on the noisy model as a black box "
        "(ValueQueryOracle(model)) can beat them (the book's page 'Your own model' measures it)."
    ),
    "nonfinite_answer": (
        "the oracle's target returned a non-finite answer ({value!r}) for query {index} of a batch of {n}; "
        "a value-query oracle must return finite reals. Either the target has a bug, or the "
        "query's entries or the target's parameters overflow its arithmetic (float64, or the "
        "format it computes in): check the target on that query, or scale the query down."
    ),
}


class CompanionError(Exception):
    """Base class of every error raised on purpose by :mod:`companion`."""


class InvalidInputError(CompanionError, ValueError):
    """An argument has the wrong shape, type or range, or contains NaN or inf.

    Subclasses :class:`ValueError`, so code that catches ``ValueError`` keeps working.
    """


class BudgetExceededError(CompanionError, RuntimeError):
    """A query would exceed the oracle's budget. Raised *before* the query, so no answer is lost."""


class NotIdentifiableError(CompanionError):
    """The oracle's answers cannot determine the parameters (for example ``v* = 0``)."""


class OracleInconsistentError(CompanionError):
    """The oracle's answers contradict the model the learner assumes (e.g. not a single head)."""


class PrecisionError(CompanionError):
    """The answers' precision is too coarse for what was asked (a check would certify nothing)."""


class SolverError(CompanionError, RuntimeError):
    """A numerical solver did not reach an optimal solution; the message names solver and status."""


class ParameterError(CompanionError, ValueError):
    """A chapter was given an unknown parameter name or a value of the wrong type."""


class ClaimError(CompanionError, AssertionError):
    """A claim a chapter's prose states is false for this run (:func:`companion.book.results.claim`).

    Raised when the chapter executes, so that the chapter stops, its results file stays as it was,
    and the book does not build with a sentence its own output contradicts. The message names the
    claim, the chapter and the text the prose would have shown.
    """


def nonfinite_answer_error(value, index: int, n: int, extra: str = "") -> OracleInconsistentError:
    """The oracles' refusal of a non-finite answer (query ``index`` of a batch of ``n``), marked ``non_finite = True``
    so that a learner that chains a stage's error (``companion.layer``) raises it as it is, not as the stage's."""
    err = OracleInconsistentError(MESSAGES["nonfinite_answer"].format(value=float(value), index=index, n=n) + extra)
    err.non_finite = True  # type: ignore[attr-defined]
    return err
