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

Rare dropout (a rate of 1e-4) hits few of those queries, but it hit the learner's own, or the stage would not have
failed there. So the learner also keeps its own queries and their answers as it asks them (the first
``REPLAY_BYTES``: every query of a small block, the first stages' of a large one) and, before a refusal stands,
asks them again (:func:`replay_differs`): a dropped entry among them shows as an answer that changed. Measured
2026-12-05 (``random_attention_layer(8, 2, residual=True, seed=0)``, H = 2, output dropout at 1e-4, 20 dropout
seeds): 4 runs were refused, 2 as "not an attention layer" and 2 with the heads unresolved, none named
non-deterministic by the 32 queries alone; with the replay all 4 are (the other 16 are learned: their dropped
entries, if any, did not break a stage).

A deterministic oracle can still answer from outside the class in a way no stage names: positional encodings added
to the tokens, a mask by position (a sliding window), causal layers stacked. Every block of the class answers the
same at the last token whatever the order of the tokens before it (its heads' softmax runs over all of them, with no
positions). So before a refusal stands, and after the two checks above have not named the oracle (found it
deterministic, or were skipped for the budget), :func:`order_dependence` asks ``ORDER_QUERIES`` queries (lengths
from 3 to ``VERIFY_LONG_LEN``), then each with its earlier tokens in reverse order, and where an answer changes by
more than ``DETERMINISM_UNITS`` times its precision (on float64 answers, float32's: a float32 computation widened to
float64 changes that much with its order of summation), refuses with that verdict, the stage's refusal chained (this
book's check; a window of ``w`` tokens is seen by every query longer than ``w``).
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
from ._norm import ROUNDING_UNITS, answer_format, non_finite_cause
from ._verify import long_lengths

__all__ = [
    "DETERMINISM_QUERIES",
    "DETERMINISM_LEN",
    "DETERMINISM_UNITS",
    "REPLAY_BYTES",
    "KeptQueries",
    "replay_differs",
    "nondeterminism",
    "ORDER_QUERIES",
    "order_lengths",
    "order_dependence",
    "deterministic_first",
]

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

#: Bytes of queries (with their answers) the learner keeps as it asks them, to ask them again before a refusal stands
#: (:class:`KeptQueries`): 16 MiB hold every query of a block at d = 8 (about 700, 0.3 MiB) and the first stages' of
#: MiniLM's (about 200 of its 25-token queries).
REPLAY_BYTES = 16 * 2**20


class KeptQueries:
    """The first :data:`REPLAY_BYTES` of the queries an oracle answers, with copies of their answers.

    Set as the oracle's observer (:class:`~companion.oracles.ValueQueryOracle` calls it with every batch it answers)
    while a learner runs; :func:`replay_differs` asks them again."""

    def __init__(self, limit: int = REPLAY_BYTES):
        self.batches: list = []  # (queries as asked: a (B, N, d) array or a list of (N, d) ones, answers)
        self.limit, self.bytes, self.count = limit, 0, 0

    def __call__(self, seqs, y) -> None:
        if self.bytes >= self.limit:  # full: nothing more is kept (no per-call sum on the oracle's path)
            return
        size = seqs.nbytes if isinstance(seqs, np.ndarray) else sum(x.nbytes for x in seqs)
        if self.bytes + size > self.limit:
            return
        kept = seqs.copy() if isinstance(seqs, np.ndarray) else [np.array(x) for x in seqs]
        self.batches.append((kept, np.array(y, dtype=float)))
        self.bytes += size
        self.count += len(kept)


def _change(first, second, oracle) -> tuple[float, float, np.ndarray]:
    """The answers' precision ``u`` (the oracle's stated one, float32's on float32's grid, at least float64's), the
    rounding's bound ``DETERMINISM_UNITS * u`` and each query's relative change ``||y_1 - y_2|| / ||y_1||``."""
    first = np.asarray(first, dtype=float).reshape(len(first), -1)
    second = np.asarray(second, dtype=float).reshape(len(second), -1)
    fmt = answer_format(first)
    u = max(float(oracle.precision or 0.0), float(unit_roundoff("float64")), fmt[1] if fmt is not None else 0.0)
    scale = np.maximum(np.linalg.norm(first, axis=1), np.finfo(float).tiny)
    return u, DETERMINISM_UNITS * u, np.linalg.norm(first - second, axis=1) / scale


def _differs(first, second, oracle, asked: str) -> OracleInconsistentError | None:
    """The refusal naming a non-deterministic oracle where answers to the same queries differ beyond their rounding."""
    u, rtol, change = _change(first, second, oracle)
    worst = float(np.max(change))
    if not worst > rtol:
        return None
    u32 = float(unit_roundoff("float32"))
    # a float32 computation whose reduction order follows the batch, its answers then widened off float32's grid (a
    # new user's float32 block with a float64 LayerNorm was told to turn dropout off): the precision not stated
    f32 = (
        "Differences this small are also what float32 arithmetic gives when its order of summation changes with the "
        "batch: if the layer computes in float32, say so, VectorQueryOracle(..., precision='float32'), and they are "
        "judged at float32's rounding. Otherwise, "
        if u < u32 and worst <= DETERMINISM_UNITS * u32
        else ""
    )
    err = OracleInconsistentError(
        f"the oracle is not deterministic: {asked}, its answers differ by up to {worst:.1e} relative, more than their "
        f"rounding explains ({DETERMINISM_UNITS} u = {rtol:.1e} at their precision u = {u:.1e}). "
        "learn_attention_layer assumes the same query always gets the same answer, whatever else the batch holds. "
        f"{f32 + 'serve' if f32 else 'Serve'} the layer in inference mode (dropout off and normalisation by running "
        "statistics: model.eval() in PyTorch, training=False in Keras) and without sampled noise. The stage that "
        "stopped on it is chained below. Nothing was returned."
    )
    err.nondeterministic = True  # type: ignore[attr-defined]  # try_seeds raises it at once: no seed's luck
    return err


def replay_differs(oracle, kept: KeptQueries) -> OracleInconsistentError | None:
    """Ask the kept queries again, in their batches; the refusal naming a non-deterministic oracle, or None.

    None also when the budget has fewer than ``kept.count`` queries left, when nothing was kept, or when asking
    raised a CompanionError (the check adds no refusal of its own)."""
    remaining = oracle.remaining
    if not kept.count or (remaining is not None and remaining < kept.count):
        return None
    try:
        again = [np.asarray(oracle(X), dtype=float).reshape(len(X), -1) for X, _ in kept.batches]
    except CompanionError:
        return None
    first = np.concatenate([y.reshape(len(y), -1) for _, y in kept.batches])
    asked = f"asked again the {kept.count} queries it kept of those the learner asked"
    return _differs(first, np.concatenate(again), oracle, asked)


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
    asked = (
        f"asked the same {DETERMINISM_QUERIES} queries twice (the second time in reverse order, in two calls of {half})"
    )
    return _differs(first, second, oracle, asked)


#: Queries the order check asks twice, the second time with the tokens before the last in reverse order: half of
#: them of 3 to ``DETERMINISM_LEN`` tokens, half from ``VERIFY_MAX_LEN + 1`` to ``VERIFY_LONG_LEN`` (256) tokens,
#: spaced geometrically (:func:`order_lengths`).
ORDER_QUERIES = 16


def order_lengths() -> np.ndarray:
    """The order check's ``ORDER_QUERIES`` query lengths, shortest first (every length at least 3: reversing the
    tokens before the last moves at least two of them)."""
    short = np.linspace(3, DETERMINISM_LEN, ORDER_QUERIES // 2).round().astype(int)
    return np.concatenate([short, long_lengths(ORDER_QUERIES - len(short))])  # the verification's long lengths


def order_dependence(oracle, seed: int) -> OracleInconsistentError | None:
    """Ask ``ORDER_QUERIES`` queries, then each with its tokens before the last reversed; the refusal naming a target
    that sees positions where an answer changes, or None (this book's check).

    An attention layer of the class answers ``sum_h alpha(X, W~_h)^T X~ M_h^T + b_O + S x_N`` (or a LayerNorm of it,
    or of its tokens): the same for every order of ``x_1, ..., x_{N-1}``, exactly, and to the rounding of a changed
    order of summation in floating point.

    Parameters
    ----------
    oracle : VectorQueryOracle
        The oracle (its budget spent by ``2 * ORDER_QUERIES`` queries, in two calls). Call it on a deterministic
        oracle only (:func:`nondeterminism` first): noise would read as order.
    seed : int
        The learner's seed; the tokens are drawn ``N(0, I_d / d)`` from ``numpy.random.default_rng([seed, 2])``.

    Returns
    -------
    OracleInconsistentError or None
        The refusal, "not an attention layer", naming the largest relative change and the shortest query length that
        changed (its attributes ``order_change`` and ``order_shortest``; ``any_seed`` True: no learner seed helps), or
        None when every answer agrees to
        ``DETERMINISM_UNITS`` times its precision (as :func:`nondeterminism` judges; on float64 answers, a change
        within ``DETERMINISM_UNITS`` times float32's is no verdict either: a float32 computation widened to float64
        changes that much with the order), when the budget has fewer than ``2 * ORDER_QUERIES`` queries left, or
        when asking raised a CompanionError.
    """
    remaining = oracle.remaining
    if remaining is not None and remaining < 2 * ORDER_QUERIES:
        return None
    d = int(oracle.d)
    rng = np.random.default_rng([seed, 2])
    lengths = order_lengths()
    X = [rng.standard_normal((int(n), d)) / np.sqrt(d) for n in lengths]
    reordered = [np.concatenate([x[-2::-1], x[-1:]]) for x in X]
    try:
        first = np.asarray(oracle(X), dtype=float).reshape(len(X), -1)
        second = np.asarray(oracle(reordered), dtype=float).reshape(len(X), -1)
    except CompanionError:  # a budget, a non-finite answer: the stage's refusal stands as it is
        return None
    u, _, change = _change(first, second, oracle)
    u32 = float(unit_roundoff("float32"))
    at = f"their precision u = {u:.1e}"
    if u < u32:  # float64 answers: a float32 computation widened to float64 changes with its order of summation
        u, at = u32, f"float32's u = {u32:.1e}: a float32 computation widened to float64 changes that much"
    bound = DETERMINISM_UNITS * u
    moved = change > bound
    if not moved.any():
        return None
    worst, shortest = float(np.max(change)), int(lengths[np.argmax(moved)])
    err = OracleInconsistentError(
        f"not an attention layer: its answer at the last token changes when the tokens before it are put in reverse "
        f"order, by up to {worst:.1e} relative ({int(moved.sum())} of {len(X)} queries of 3 to "
        f"{int(lengths[-1])} tokens; the shortest that changed has {shortest}), more than "
        f"rounding explains ({DETERMINISM_UNITS} u = {bound:.1e} at {at}). A block of the class (heads with a "
        "softmax over all the tokens, an output projection, a skip, a LayerNorm) answers the same, to rounding, for "
        "any order of the tokens before the last: this target sees positions (positional encodings added to the "
        "tokens, a mask by position such as a sliding window, or causal layers stacked). The stage that stopped on "
        "it is chained below. Nothing was returned."
    )
    err.any_seed = True  # type: ignore[attr-defined]  # try_seeds raises it at once: no seed's luck
    err.order_change, err.order_shortest = worst, shortest  # type: ignore[attr-defined]
    return err


def deterministic_first(learner):
    """Run :func:`replay_differs` on the queries ``learner(oracle, ..., seed=...)`` asked (kept as it asks them), then
    :func:`nondeterminism`, then :func:`order_dependence`, before a refusal of it stands: raise the first refusal they
    give (the stage's chained) where the answers to repeated queries differ or change with the order of the tokens,
    else the stage's own. Refusals raised before the first query
    (arguments, budget) and non-finite answers are raised as they are."""

    @functools.wraps(learner)
    def run(oracle, *args, **kwargs):
        asked = getattr(oracle, "n_queries", None)
        kept = KeptQueries()
        observed = hasattr(oracle, "_observer") and "_observer" not in vars(oracle)  # no learner keeps them yet
        if observed:
            oracle._observer = kept
        try:
            return learner(oracle, *args, **kwargs)
        except _REFUSALS as exc:
            if asked is None or oracle.n_queries == asked or non_finite_cause(exc) is not None:  # anywhere in its chain
                raise
            if observed:
                del oracle._observer  # the checks' own queries are not kept
                observed = False
            seed = int(kwargs.get("seed", 0))
            found = replay_differs(oracle, kept) or nondeterminism(oracle, seed) or order_dependence(oracle, seed)
            if found is None:
                raise
            raise found from exc
        finally:
            if observed:
                del oracle._observer  # the oracle as it was given

    return run
