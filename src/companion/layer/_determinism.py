"""The layer learner's check before it refuses: does the oracle answer the same queries the same way? (this book's)

Every learner here assumes a deterministic oracle. A layer served with dropout left on (training mode), or an
oracle that adds fresh noise to each answer, breaks that assumption at every stage, and the stage that first
notices names a cause of its own: an adversarial tester's dropout target got a different verdict at each seed
(2026-12-05: "not an attention layer", a precision band, the heads unresolved). So before a refusal stands,
:func:`deterministic_first` asks ``DETERMINISM_QUERIES`` queries twice: in one call, then in two calls of half of
them, each in the reverse order (a mask drawn per batch position, as dropout under a fixed key, differs then, and so
do answers computed from the batch's statistics, as a BatchNorm in training mode computes them), and where the
answers differ by more than their rounding explains (``DETERMINISM_UNITS`` times their precision: float32's on
float32's grid, else float64's or the one the oracle states), raises that cause instead, the stage's refusal chained
to it. The check costs ``2 * DETERMINISM_QUERIES`` queries, on a refusal only (a learned result is verified on
fresh queries, which a non-deterministic oracle does not pass), and is skipped where the budget has fewer left.
Dropout that rare (a rate of 1e-4 over the check's tokens) can go unseen.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import (
    CompanionError,
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
    PrecisionError,
    SolverError,
)
from ..oracles import unit_roundoff
from ._norm import ROUNDING_UNITS, answer_format

__all__ = ["DETERMINISM_QUERIES", "DETERMINISM_LEN", "DETERMINISM_UNITS", "nondeterminism", "deterministic_first"]

#: Queries the check asks twice (tokens ``N(0, I_d / d)``, drawn from the learner's seed apart from its own stream).
DETERMINISM_QUERIES = 16

#: Their length: two calls of 16 queries of 8 tokens see a dropout rate of 1e-3 at d = 6 with probability 0.78
#: (an adversarial tester's 8 queries of 4 tokens saw it 15 times in 50).
DETERMINISM_LEN = 8

#: Largest relative difference ``||y_1 - y_2|| / ||y_1||`` between two answers to one query that the check
#: attributes to rounding, in units of the answers' precision (``ROUNDING_UNITS``, 256): 1.5e-5 on float32's grid
#: (a float32 computation whose reduction order changes between calls), 2.8e-14 for float64 answers (an adversarial
#: tester's per-call noise of 1e-6 to 1e-10 went unnamed at a float32 threshold). Dropout moves answers by tens of
#: percent.
DETERMINISM_UNITS = ROUNDING_UNITS

#: The refusals the check runs before: a non-deterministic oracle can end in any of them.
_REFUSALS = (OracleInconsistentError, PrecisionError, NotIdentifiableError, SolverError, InvalidInputError)


def nondeterminism(oracle, seed: int) -> OracleInconsistentError | None:
    """Ask ``DETERMINISM_QUERIES`` queries twice; the refusal naming a non-deterministic oracle, or None.

    Parameters
    ----------
    oracle : VectorQueryOracle
        The oracle (its budget spent by ``2 * DETERMINISM_QUERIES`` queries, in three calls).
    seed : int
        The learner's seed; the queries are drawn from ``numpy.random.default_rng([seed, 1])``.

    Returns
    -------
    OracleInconsistentError or None
        The refusal (its ``nondeterministic`` attribute True), or None when the answers agree to
        ``DETERMINISM_UNITS`` times their precision (relative), when the budget has fewer than
        ``2 * DETERMINISM_QUERIES`` queries left, or when asking raised a CompanionError (the check adds no refusal
        of its own).
    """
    remaining = oracle.remaining
    if remaining is not None and remaining < 2 * DETERMINISM_QUERIES:
        return None
    d = int(oracle.d)
    X = np.random.default_rng([seed, 1]).standard_normal((DETERMINISM_QUERIES, DETERMINISM_LEN, d)) / np.sqrt(d)
    half = DETERMINISM_QUERIES // 2
    try:
        first = np.asarray(oracle(X.copy()), dtype=float).reshape(DETERMINISM_QUERIES, -1)
        # the second time in two calls of half the queries, each reversed: every query at another batch position,
        # and in a batch of other queries (answers computed from the batch's statistics differ then)
        second = np.concatenate(
            [
                np.asarray(oracle(X[lo:hi][::-1].copy()), dtype=float).reshape(hi - lo, -1)[::-1]
                for lo, hi in ((0, half), (half, DETERMINISM_QUERIES))
            ]
        )
    except CompanionError:  # a budget, a non-finite answer: the stage's refusal stands as it is
        return None
    fmt = answer_format(first)
    u = max(float(oracle.precision or 0.0), float(unit_roundoff("float64")), fmt[1] if fmt is not None else 0.0)
    rtol = DETERMINISM_UNITS * u
    scale = np.maximum(np.linalg.norm(first, axis=1), np.finfo(float).tiny)
    worst = float(np.max(np.linalg.norm(first - second, axis=1) / scale))
    if not worst > rtol:
        return None
    err = OracleInconsistentError(
        f"the oracle is not deterministic: asked the same {DETERMINISM_QUERIES} queries twice (the second time in "
        f"reverse order, in two calls of {half}), its answers differ by up to {worst:.1e} relative, more than their "
        f"rounding explains ({DETERMINISM_UNITS} u = {rtol:.1e} at their precision u = {u:.1e}). "
        "learn_attention_layer assumes the same query always gets the same answer, whatever else the batch holds: "
        "serve the layer in inference mode (dropout off and normalisation by running statistics: model.eval() in "
        "PyTorch, training=False in Keras) and without sampled noise. The stage that stopped on it is chained "
        "below. Nothing was returned."
    )
    err.nondeterministic = True  # type: ignore[attr-defined]  # try_seeds raises it at once: no seed's luck
    return err


def deterministic_first(learner):
    """Run :func:`nondeterminism` before a refusal of ``learner(oracle, ..., seed=...)`` stands: raise its refusal
    (the stage's chained) where the answers to repeated queries differ, else the stage's own. Refusals raised before
    the first query (arguments, budget) and non-finite answers are raised as they are."""

    @functools.wraps(learner)
    def run(oracle, *args, **kwargs):
        asked = getattr(oracle, "n_queries", None)
        try:
            return learner(oracle, *args, **kwargs)
        except _REFUSALS as exc:
            if asked is None or oracle.n_queries == asked or getattr(exc, "non_finite", False):
                raise
            found = nondeterminism(oracle, int(kwargs.get("seed", 0)))
            if found is None:
                raise
            raise found from exc

    return run
