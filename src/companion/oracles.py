"""Value-query oracles (§3, §6): the only way a learner sees a target.

A learner never reads the target's parameters; it sends query sequences to an oracle, which answers
with the target's output and counts every sequence as one query (``n_queries``). An optional
``budget`` is checked *before* a batch is answered, so a refused batch costs nothing, and an optional
query log keeps a copy of every query and answer.

* :class:`ValueQueryOracle` answers exactly: VQ(X) = f*(X).
* :class:`ApproxValueQueryOracle` answers within a tolerance ``tau`` and, as the paper requires, is
  deterministic: the same ``X`` always gets the same answer, so repeating a query gains nothing.

Both accept one sequence ``(N, d)`` (answer: ``float``), a batch ``(B, N, d)`` or a list of
sequences of different lengths (answer: ``ndarray of shape (B,)``), and evaluate in float64.

**Perturbation test mode** (the reproducibility tests; off by default). With the environment
variable ``COMPANION_PERTURB_ULPS=k`` (an integer, ``0 <= k <= 1000``) every oracle of this module,
and every subclass (membership, the chapters' timed oracles), multiplies the target's float64 output
``f*(X)`` by ``1 + k * eps * s(X)`` before any noise or rounding of its own, where ``eps =
numpy.finfo(float).eps`` (2**-52) and ``s(X) = +1 or -1`` is a deterministic function of the query,
chosen by ``COMPANION_PERTURB_PATTERN`` (:data:`PERTURB_PATTERNS`; default ``"hash"``):

* ``"hash"``: the sign of a SplitMix64 hash of the query's bytes (the same hash as
  ``noise="uniform"``, with its own seed :data:`PERTURB_SEED`): neighbouring queries move in
  independent-looking directions;
* ``"parity"``: the parity of the bits of the xor of the query's 64-bit words and its length, a
  linear function over GF(2) of the bytes, unrelated to the hash's mixing;
* ``"smooth"``: the sign of ``sin(1000 * sum_j w_j x_j)`` over the query's entries ``x_j``
  (fixed weights ``w_j`` in ``[1, 2)``): nearby queries move in the *same* direction, the
  correlated error of a kernel whose rounding depends smoothly on its input.

The same query always gets the same perturbed answer: the arithmetic of another machine, whose
BLAS rounds the target's computation differently, reproduced on any machine.
``tests/test_reproducibility.py`` re-executes every chapter in this mode, the patterns rotated across
the chapters, and holds its outputs to the reproducibility contract
(:mod:`companion.nbcompare`): an output it moves beyond its stated precision is printed with more
digits than it has. Unset, empty or ``0`` means off. A value that is not such an integer raises
:class:`~companion.errors.InvalidInputError` at the first answer. ``make execute`` and ``companion
build`` refuse to run while it is set, so committed outputs and published numbers are never made
with perturbed answers (:func:`perturbation_ulps` tells which).
"""

from __future__ import annotations

import os

import numpy as np

from . import _progress
from ._validation import apply_by_length, as_float_array, as_sequences, check_choice, check_int, check_real
from .errors import MESSAGES, BudgetExceededError, InvalidInputError, OracleInconsistentError, nonfinite_answer_error
from ._learner import OracleView, QueryCount
from ._precision import (
    ANSWER_KINDS,
    FORMATS,
    as_precision,
    check_answers,
    measure_one_token_precision,
    measure_precision,
    nearest_format,
    round_bfloat16,
    round_to,
    show_answer,
    significant_bits,
    stated_precision,
    unit_roundoff,
)

# The measurement's constants, read (and pinned by the tests) as companion.oracles.X.
from ._precision import (  # noqa: F401
    FAMILY_DEGREE,
    FAMILY_POINTS,
    FAMILY_SPAN,
    JITTER_RATIO,
    NOISE_FLOOR,
    OUTSIDE_FACTOR,
    OUTSIDE_FLOAT64,
    TINY_STEP,
)

__all__ = [
    "ValueQueryOracle",
    "VectorQueryOracle",
    "VectorReadout",
    "VectorView",
    "ApproxValueQueryOracle",
    "AntisymmetrisedOracle",
    "NOISE_MODELS",
    "PERTURB_ENV",
    "PERTURB_PATTERN_ENV",
    "PERTURB_PATTERNS",
    "PERTURB_SEED",
    "perturbation_pattern",
    "perturbation_ulps",
    "perturb",
    "measure_precision",
    "measure_one_token_precision",
    "stated_precision",
    "as_precision",
    "FORMATS",
    "unit_roundoff",
    "round_to",
    "nearest_format",
    "significant_bits",
    "check_answers",
    "ANSWER_KINDS",
]

#: The environment variable of the perturbation test mode (module docstring).
PERTURB_ENV = "COMPANION_PERTURB_ULPS"
#: The environment variable choosing the perturbation's sign pattern (module docstring).
PERTURB_PATTERN_ENV = "COMPANION_PERTURB_PATTERN"
#: The sign patterns of the perturbation test mode, independent functions of the query.
PERTURB_PATTERNS = ("hash", "parity", "smooth")
#: Seed of the hash that gives each query's perturbation sign (distinct from the noise seeds used).
PERTURB_SEED = 0x5EED_0F_B175
_PERTURB_MAX = 1000


def perturbation_pattern() -> str:
    """The sign pattern of the perturbation test mode, read from ``$COMPANION_PERTURB_PATTERN``.

    Returns
    -------
    str
        One of :data:`PERTURB_PATTERNS`; ``"hash"`` when the variable is unset or empty.

    Raises
    ------
    InvalidInputError
        If the variable names no pattern of :data:`PERTURB_PATTERNS`.

    Examples
    --------
    >>> import os
    >>> os.environ.pop(PERTURB_PATTERN_ENV, None) and None
    >>> perturbation_pattern()
    'hash'
    """
    raw = os.environ.get(PERTURB_PATTERN_ENV, "").strip()
    if not raw:
        return "hash"
    if raw not in PERTURB_PATTERNS:
        raise InvalidInputError(
            f"{PERTURB_PATTERN_ENV}={raw!r} must be one of {', '.join(PERTURB_PATTERNS)} "
            f"(the sign patterns of companion.oracles' perturbation test mode); unset it for 'hash'."
        )
    return raw


def perturbation_ulps() -> int:
    """The ``k`` of the perturbation test mode, read from ``$COMPANION_PERTURB_ULPS`` (0: off).

    Returns
    -------
    int
        ``k`` in ``[0, 1000]``; 0 when the variable is unset or empty.

    Raises
    ------
    InvalidInputError
        If the variable is set to anything but an integer in ``[0, 1000]``.

    Examples
    --------
    >>> import os
    >>> os.environ.pop(PERTURB_ENV, None) and None
    >>> perturbation_ulps()
    0
    """
    raw = os.environ.get(PERTURB_ENV, "").strip()
    if not raw:
        return 0
    try:
        k = int(raw)
    except ValueError:
        k = -1
    if not 0 <= k <= _PERTURB_MAX:
        raise InvalidInputError(
            f"{PERTURB_ENV}={raw!r} must be an integer number of float64 ulps in [0, {_PERTURB_MAX}] "
            f"(the perturbation test mode of companion.oracles); unset it for exact answers."
        )
    return k


def perturb(y: np.ndarray, X: np.ndarray, k: int, pattern: str | None = None) -> np.ndarray:
    """Answers ``y`` of a batch ``X`` ``(B, N, d)`` multiplied by ``1 + k * eps * s(X)`` (test mode).

    Parameters
    ----------
    y : ndarray of shape (B,)
        The target's answers.
    X : ndarray of shape (B, N, d)
        The queries; ``s(X) = +1 or -1`` is a function of each query given by ``pattern``.
    k : int
        Ulps of float64 (``eps = 2**-52``); 0 returns ``y`` unchanged.
    pattern : str, default=None
        One of :data:`PERTURB_PATTERNS` (module docstring); ``None``: :func:`perturbation_pattern`.

    Returns
    -------
    ndarray of shape (B,)

    Raises
    ------
    InvalidInputError
        If ``pattern`` is not one of :data:`PERTURB_PATTERNS`.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.ones((2, 1, 3)); X[1] *= 2
    >>> rel = perturb(np.ones(2), X, 4) - 1.0
    >>> bool(np.all(np.abs(rel) == 4 * np.finfo(float).eps))
    True
    >>> [float((perturb(np.ones(1), X[:1], 1, p)[0] - 1.0) / np.finfo(float).eps) for p in PERTURB_PATTERNS]
    [1.0, -1.0, 1.0]
    """
    if not k:
        return y
    if pattern is None:
        pattern = perturbation_pattern()
    check_choice(pattern, "pattern", PERTURB_PATTERNS)
    sign = {"hash": _sign_hash, "parity": _sign_parity, "smooth": _sign_smooth}[pattern]
    # 16384 words (128 KiB) at a time: the test mode adds little memory to what a chapter measures
    rows = max(1, 16384 // max(1, X.shape[1] * X.shape[2]))
    s = np.concatenate([sign(X[i : i + rows]) for i in range(0, X.shape[0], rows)])
    return y * (1.0 + k * np.finfo(np.float64).eps * s)


def _sign_hash(X: np.ndarray) -> np.ndarray:
    """``"hash"``: -1 or +1 by the sign of a SplitMix64 hash of each query's bytes."""
    return np.where(_hash_uniform(X, PERTURB_SEED) < 0.0, -1.0, 1.0)


def _sign_parity(X: np.ndarray) -> np.ndarray:
    """``"parity"``: -1 or +1 by the parity of the bits of the xor of each query's words and length."""
    words = np.ascontiguousarray(X + 0.0).view(np.uint64).reshape(X.shape[0], -1)
    acc = np.bitwise_xor.reduce(words, axis=1) ^ np.uint64(X.shape[1])
    for shift in (32, 16, 8, 4, 2, 1):  # fold the 64 bits onto the lowest: its bit is their parity
        acc = acc ^ (acc >> np.uint64(shift))
    return np.where(acc & np.uint64(1), -1.0, 1.0)


def _sign_smooth(X: np.ndarray) -> np.ndarray:
    """``"smooth"``: the sign of ``sin(1000 sum_j w_j x_j)``, ``w_j = 1 + frac(j * golden ratio)``."""
    flat = X.reshape(X.shape[0], -1)
    w = 1.0 + np.modf(np.arange(1, flat.shape[1] + 1) * 0.6180339887498949)[0]
    return np.where(np.sin(1000.0 * (flat @ w)) < 0.0, -1.0, 1.0)


#: Noise models of :class:`ApproxValueQueryOracle`.
NOISE_MODELS = ("uniform", "worst", "round", "float16", "bfloat16")

#: Default tolerance of the floating-point noise models: the largest rounding error while |f*| <= 1.
#: float16 is rounded directly from float64 (half an ulp of [1/2, 1)); bfloat16 from float32, as a
#: served model casts its float32 output, so a float32 rounding error of 2**-25 can add to it.
FORMAT_TAU = {"float16": 2.0**-12, "bfloat16": 2.0**-9 + 2.0**-25}


class ValueQueryOracle:
    """Exact value-query oracle VQ(X) = f*(X) for a target model (§3).

    Parameters
    ----------
    target : callable
        The model behind the oracle, e.g. :class:`~companion.attention.SingleHead`. It must accept a
        float64 batch of shape ``(B, N, d)`` and return an array of shape ``(B,)``, and expose its input
        dimension as ``target.d`` (or pass ``d``).
    d : int, default=None
        Input dimension, if ``target`` has no attribute ``d`` (if it has one, ``d`` must equal it).
    budget : int, default=None
        Largest number of queries the oracle will answer; ``None`` means unlimited.
    record : bool, default=False
        Keep a copy of every query and its answer in ``log``.
    precision : str or float, default=None
        The precision the answers are computed in, as the oracle states it: a format of
        ``companion.oracles.FORMATS`` (``"float32"``, ``"bfloat16"``, ...) or its relative
        rounding ``u`` as a float in ``(0, 1)``. ``None``: not stated (an exact float64 oracle, or
        a black box whose learner measures it with :func:`measure_precision` when a check needs it).
    progress : bool, default=None
        A tqdm bar of the queries a learner asks against those it planned: ``False`` never shows
        it, ``True`` always; ``None`` shows it when standard error is a terminal (or
        ``COMPANION_PROGRESS=1``) and the run lasts over two seconds (:mod:`companion._progress`),
        so never in a chapter's outputs.

    Attributes
    ----------
    d : int
        Input dimension of the queries.
    n_queries : int
        Number of sequences answered so far (each sequence of a batch counts once).
    budget : int or None
        The budget given.
    remaining : int or float
        Queries left before the budget (``inf`` if unlimited).
    log : list of (ndarray of shape (N, d), float)
        Every query and its answer, in order, when ``record=True``; else empty.
    tau : float
        The tolerance of the answers: 0 for this exact oracle.
    precision : float or None
        The stated relative rounding ``u`` of the answers (``precision`` as a float), or None.

    Raises
    ------
    InvalidInputError
        At construction, for a ``d`` that disagrees with ``target.d``, or a ``record`` or
        ``progress`` that is not a bool; when called with a query of the wrong shape, with NaN or
        inf, or an empty sequence.
    BudgetExceededError
        When a call would take ``n_queries`` past ``budget``; nothing is answered or counted.
    OracleInconsistentError
        When the target returns NaN or inf, complex numbers, None, or not one number per query (a
        value-query oracle answers with finite reals).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import SingleHead
    >>> oracle = ValueQueryOracle(SingleHead(np.eye(2), np.array([1.0, -1.0])), budget=3)
    >>> oracle(np.array([[1.0, 0.0]])), oracle.n_queries, oracle.remaining
    (1.0, 1, 2)
    """

    #: Called with every batch asked and its answers while a learner keeps its queries (``layer._determinism``).
    _observer = None

    tau = 0.0

    def __init__(self, target, *, d=None, budget=None, record=False, precision=None, progress=None):
        if not callable(target):
            raise InvalidInputError(f"target must be callable on a batch (B, N, d); got {type(target).__name__}.")
        if d is None:
            d = getattr(target, "d", None)
            if d is None:
                raise InvalidInputError("the target has no attribute d; pass the input dimension as d=...")
        self.target = target
        self.d = check_int(d, "d", minimum=1)
        own_d = getattr(target, "d", None)
        if isinstance(own_d, (int, np.integer)) and int(own_d) != self.d:
            raise InvalidInputError(
                f"d={self.d} disagrees with the target's own d={int(own_d)}; omit d, or pass d={own_d}."
            )
        self.budget = None if budget is None else check_int(budget, "budget", minimum=0)
        if not isinstance(record, (bool, np.bool_)):
            raise InvalidInputError(f"record must be True or False; got {record!r}.")
        self.record = bool(record)
        self.n_queries = 0
        self.log: list[tuple[np.ndarray, float]] = []
        self.precision = None if precision is None else as_precision(precision)
        if progress is not None and not isinstance(progress, (bool, np.bool_)):
            raise InvalidInputError(f"progress must be None, True or False; got {progress!r}.")
        self.progress = None if progress is None else bool(progress)

    @property
    def remaining(self):
        return np.inf if self.budget is None else self.budget - self.n_queries

    @property
    def _spent(self) -> int:
        """The queries counted against ``budget`` (a view's: its vector oracle's)."""
        return self.n_queries

    def require(self, n, *, learner="the learner"):
        """Raise :class:`~companion.errors.BudgetExceededError` now if fewer than ``n`` queries remain.

        Learners call this before their first query, so a too-small budget costs nothing. The error's
        ``needed`` attribute is ``n``.
        """
        if n > self.remaining:
            err = BudgetExceededError(
                MESSAGES["budget_upfront"].format(
                    learner=learner,
                    needed=n,
                    remaining=self.remaining,
                    budget=self.budget,
                    total=self.n_queries + n,
                )
            )
            err.needed = int(n)  # the plan's count, for a caller that reports it
            raise err

    def _answer(self, X: np.ndarray) -> np.ndarray:
        """Answers for a validated batch ``(B, N, d)``; subclasses add their noise here."""
        return self._evaluate(X)

    def _call_target(self, X: np.ndarray):
        """The target's output on a validated batch, as it returned it (shared by the scalar and vector oracles)."""
        if getattr(type(self.target), "_reads_only", False):
            # The library's models (SingleHead, FactoredHead, FactorScoredHead, AttentionLayer) only read their
            # input: hand them the batch validated above, without a second check and a copy (two passes over it).
            return self.target._batch(X)
        try:
            return self.target(X.copy())
        except (ValueError, TypeError, IndexError) as exc:
            if isinstance(exc, InvalidInputError):  # the target's own clear refusal stands
                raise
            raise OracleInconsistentError(
                f"the target raised {type(exc).__name__} ({str(exc)[:200]}) on a batch of shape {X.shape}: "
                f"the oracle sends tokens of dimension d={self.d}; check that d matches the model's input "
                "dimension and that the model accepts a float64 batch (B, N, d)."
            ) from exc

    def _evaluate(self, X: np.ndarray) -> np.ndarray:
        out = self._call_target(X)
        if out is None:  # numpy would read None as NaN, and the message would blame a non-finite answer
            raise OracleInconsistentError(
                f"the target returned None for a batch of {X.shape[0]} queries; a value-query target returns one "
                f"real number per query, an array of shape ({X.shape[0]},): does it return its result?"
            )
        if np.asarray(out).dtype.kind == "c":  # numpy would drop the imaginary part with only a warning
            raise OracleInconsistentError(
                f"the target returned complex answers for a batch of {X.shape[0]} queries; a value-query target "
                f"returns one real number per query, an array of shape ({X.shape[0]},) of floats."
            )
        try:
            raw = np.asarray(out, dtype=np.float64)
        except (TypeError, ValueError):
            raise OracleInconsistentError(
                f"the target returned {show_answer(out)} for a batch of {X.shape[0]} queries; a value-query "
                f"target returns one real number per query, an array of shape ({X.shape[0]},) of floats."
            ) from None
        y = raw.reshape(-1)
        if y.shape != (X.shape[0],):
            raise OracleInconsistentError(
                f"the target returned {y.shape[0]} answers (an array of shape {raw.shape}) for a batch of "
                f"{X.shape[0]} queries: a value-query target returns one number per query, shape ({X.shape[0]},). "
                "A model with vector outputs: read one number off it with companion.targets.from_callable(..., "
                "readout=c), or ask it through companion.oracles.VectorQueryOracle."
            )
        if not np.all(np.isfinite(y)):
            i = int(np.flatnonzero(~np.isfinite(y))[0])
            raise nonfinite_answer_error(y[i], i, y.shape[0])
        k = perturbation_ulps()
        return perturb(y, self._as_received(X), k) if k else y  # rounding the batch only in the test mode

    def _as_received(self, X: np.ndarray) -> np.ndarray:
        """The queries as the target receives them, for the perturbation test mode's sign pattern: a
        served target (``fmt`` or ``dtype`` a served format) rounds its inputs, so another machine's
        arithmetic is a function of the rounded query; two queries it rounds alike get the same sign
        (else a tiny step of the input, which such a target cannot see, would move its answer)."""
        fmt = getattr(self.target, "fmt", None) or getattr(self.target, "dtype", None)
        return round_to(X, fmt) if isinstance(fmt, str) and fmt in ("float32", "float16", "bfloat16") else X

    def __call__(self, X):
        """Answer one sequence ``(N, d)`` (float), a batch ``(B, N, d)`` or a list (``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        n = len(seqs)
        if n > self.remaining:
            raise BudgetExceededError(
                MESSAGES["budget"].format(needed=n, remaining=self.remaining, budget=self.budget, used=self._spent)
            )
        y = apply_by_length(seqs, self._answer)
        self.n_queries += n
        _progress.advance(self, n)
        if self._observer is not None:  # a learner keeping its queries to ask them again (layer._determinism)
            self._observer(seqs, y)
        if self.record:
            self.log.extend((np.array(x), self._one(a)) for x, a in zip(seqs, y))
        return self._one(y[0]) if single else y

    @staticmethod
    def _one(a):
        """One query's answer as returned for a single sequence: a float here, ``(d_out,)`` for a vector oracle."""
        return float(a)

    def __repr__(self):
        budget = "" if self.budget is None else f", budget={self.budget}"
        return f"{type(self).__name__}(d={self.d}, n_queries={self.n_queries}{budget})"


class VectorQueryOracle(ValueQueryOracle):
    """Vector-valued query oracle: a layer's whole output vector at the last token, ``o*(X)``.

    The access model of a hidden-state API over a layer's input: the learner chooses real-valued
    token vectors (not token ids) and reads the ``d_out`` numbers the layer outputs at the last
    position. Counting, budget, stated precision, recording and input validation are those of
    :class:`ValueQueryOracle` (the same code path: this class only changes what one answer is).
    :meth:`readout` gives a scalar :class:`ValueQueryOracle` view ``c^T o*(X)`` on which every
    scalar learner runs unchanged, its queries counted (and budgeted) here. This book's own
    construction (not in the paper, whose oracles are scalar).

    Parameters
    ----------
    target : callable
        The model behind the oracle, e.g. :class:`~companion.layer.AttentionLayer`. It must accept a
        float64 batch of shape ``(B, N, d)`` and return an array of shape ``(B, d_out)``, and expose
        ``d`` and ``d_out`` as attributes (or pass them).
    d : int, default=None
        Input dimension, if ``target`` has no attribute ``d``.
    d_out : int, default=None
        Output dimension, if ``target`` has no attribute ``d_out``.
    budget, record, precision, progress
        As for :class:`ValueQueryOracle`.

    Attributes
    ----------
    d, d_out : int
        Input and output dimensions.
    n_queries, budget, remaining, tau, precision
        As for :class:`ValueQueryOracle`; every sequence counts once, whatever ``d_out``.
    log : list of (ndarray of shape (N, d), ndarray of shape (d_out,))
        Every query and its answer when ``record=True``.

    Raises
    ------
    InvalidInputError
        On construction without ``d`` or ``d_out``; when called, as :class:`ValueQueryOracle`.
    BudgetExceededError
        When a call would take ``n_queries`` past ``budget``; nothing is answered or counted.
    OracleInconsistentError
        When the target returns something that is not a finite real array of shape ``(B, d_out)``;
        the message names what came back and what was expected.

    Examples
    --------
    >>> import numpy as np
    >>> target = lambda X: np.stack([X[:, -1, 0], X[:, :, 1].mean(axis=1)], axis=1)
    >>> oracle = VectorQueryOracle(target, d=2, d_out=2, budget=3)
    >>> oracle(np.array([[1.0, 2.0], [3.0, 4.0]])).tolist(), oracle.n_queries
    ([3.0, 3.0], 1)
    >>> view = oracle.readout([1.0, -1.0])
    >>> view(np.array([[1.0, 2.0], [3.0, 4.0]])), oracle.n_queries, view.remaining
    (0.0, 2, 1)
    """

    def __init__(self, target, d=None, d_out=None, budget=None, record=False, precision=None, progress=None):
        super().__init__(target, d=d, budget=budget, record=record, precision=precision, progress=progress)
        if d_out is None:
            d_out = getattr(target, "d_out", None)
            if d_out is None:
                raise InvalidInputError("the target has no attribute d_out; pass the output dimension as d_out=...")
        self.d_out = check_int(d_out, "d_out", minimum=1)

    @staticmethod
    def _one(a):
        return np.array(a, dtype=np.float64)

    def _evaluate(self, X: np.ndarray) -> np.ndarray:
        B, want = X.shape[0], (X.shape[0], self.d_out)
        raw = self._call_target(X)
        try:
            if np.asarray(raw).dtype.kind == "c":
                raise OracleInconsistentError(
                    f"the target returned complex answers for a batch of {B} queries; expected reals of shape {want}."
                )
            y = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise OracleInconsistentError(
                f"the target returned {type(raw).__name__} ({exc}) for a batch of {B} queries; a vector-query "
                f"target returns real numbers, an array of shape {want}."
            ) from None
        if y.shape != want:
            hint = (
                " This target answers one number per query; if it reads a model with vector outputs, give "
                "VectorQueryOracle its `.vector` (e.g. VectorQueryOracle(from_keras(layer).vector))."
                if y.shape == (B,) and callable(getattr(self.target, "vector", None))
                else ""
            )
            raise OracleInconsistentError(
                f"the target returned an array of shape {y.shape} for a batch of {B} queries: a vector-query "
                f"target returns d_out={self.d_out} numbers per query, an array of shape {want}.{hint}"
            )
        if not np.all(np.isfinite(y)):
            i, j = (int(k) for k in np.argwhere(~np.isfinite(y))[0])
            raise nonfinite_answer_error(y[i, j], i, B, f" (Output entry {j}.)")
        k = perturbation_ulps()
        return y * perturb(np.ones(B), self._as_received(X), k)[:, None] if k else y

    def readout(self, c) -> ValueQueryOracle:
        """A scalar view ``X -> c^T o*(X)`` whose queries this oracle counts and budgets.

        Parameters
        ----------
        c : array-like of shape (d_out,)
            The readout vector (finite).

        Returns
        -------
        ValueQueryOracle
            Exact scalar oracle of dimension ``d`` (its ``precision`` is this oracle's). Its own
            ``n_queries`` counts the queries asked through it; each is one query of this oracle,
            and its ``remaining`` is this oracle's, so a learner's budget check is this oracle's.

        Raises
        ------
        InvalidInputError
            If ``c`` is not a finite vector of shape ``(d_out,)``.
        """
        c = as_float_array(c, "c", ndim=1, shape=(self.d_out,))
        c.flags.writeable = False
        return _Readout(self, c)

    def __repr__(self):
        budget = "" if self.budget is None else f", budget={self.budget}"
        return f"{type(self).__name__}(d={self.d}, d_out={self.d_out}, n_queries={self.n_queries}{budget})"


class _SpendsVectorBudget:
    """``remaining``, ``budget`` and ``require`` of ``self.vector``, a :class:`VectorQueryOracle` whose budget a view's
    queries spend (:class:`VectorReadout`, :class:`VectorView`)."""

    vector: VectorQueryOracle

    @property
    def remaining(self):
        return self.vector.remaining

    @property
    def _spent(self) -> int:
        return self.vector._spent

    @property
    def budget(self):
        """The vector oracle's budget, which this view's queries spend (its messages name it)."""
        return self.vector.budget

    @budget.setter
    def budget(self, value):  # ValueQueryOracle.__init__ sets None: the view has no budget of its own
        if value is not None:
            raise InvalidInputError("a view's queries spend its VectorQueryOracle's budget; set the budget there.")

    def require(self, n, *, learner="the learner"):
        """The vector oracle's check: a readout's queries spend that oracle's budget (and count there)."""
        self.vector.require(n, learner=learner)


class VectorReadout(_SpendsVectorBudget, ValueQueryOracle):
    """A scalar oracle that reads a :class:`VectorQueryOracle`, ``self.vector``, and spends its budget.

    Its ``remaining``, ``budget`` and ``require`` are the vector oracle's, so a learner run on the view
    is budgeted, and its messages name the budget, as on the vector oracle. The base of
    :meth:`VectorQueryOracle.readout`'s view and of ``companion.layer``'s lifted readout; a subclass sets
    ``self.vector`` after ``ValueQueryOracle.__init__`` (whose ``budget=None`` it accepts).

    Raises
    ------
    InvalidInputError
        If a budget other than None is set on the view: set it on the vector oracle.
    """


class VectorView(_SpendsVectorBudget, VectorQueryOracle):
    """A vector oracle that asks a :class:`VectorQueryOracle`, ``self.vector``, and spends its budget (as
    :class:`VectorReadout` does): the base of ``companion.layer``'s views of a layer (its tokens scaled, its
    answers seen before a LayerNorm). A subclass sets ``self.vector`` after ``VectorQueryOracle.__init__``.

    Raises
    ------
    InvalidInputError
        If a budget other than None is set on the view: set it on the vector oracle.
    """

    def _evaluate(self, X: np.ndarray) -> np.ndarray:
        return self.target(X)  # the vector oracle has checked (and, in the test mode, perturbed) its answers


class _Readout(VectorReadout):
    """The scalar view of :meth:`VectorQueryOracle.readout`: answers ``c^T o*(X)``."""

    def __init__(self, vector, c):
        super().__init__(lambda X: vector(X) @ c, d=vector.d, precision=vector.precision)
        self.vector, self.c = vector, c

    def _evaluate(self, X: np.ndarray) -> np.ndarray:
        # the vector oracle has checked (and, in the test mode, perturbed) its answers already
        return np.asarray(self.target(X), dtype=np.float64)


def _hash_uniform(X: np.ndarray, seed: int) -> np.ndarray:
    """A deterministic pseudo-random number in [-1, 1) for every sequence of a batch ``(B, N, d)``.

    Each 64-bit word of a sequence (with -0.0 mapped to 0.0) is xored with its position and mixed
    with SplitMix64 (Steele, Lea & Flood 2014); the mixed words are summed modulo 2**64 and mixed
    again with the seed and the length, all vectorised in NumPy. The same sequence and seed always
    give the same number; different sequences give independent-looking numbers.
    """
    B = X.shape[0]
    words = np.ascontiguousarray(X + 0.0).view(np.uint64).reshape(B, -1)
    with np.errstate(over="ignore"):
        idx = np.arange(1, words.shape[1] + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h = _splitmix(words ^ idx)
        seed_mix = _splitmix(np.uint64(seed) ^ np.uint64(X.shape[1] * 0xD1B54A32D192ED03 % 2**64))
        acc = _splitmix(h.sum(axis=1, dtype=np.uint64) ^ seed_mix)
    return (acc >> np.uint64(11)).astype(np.float64) / float(2**53) * 2.0 - 1.0


def _splitmix(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _within(y: np.ndarray, noisy: np.ndarray, tau: float) -> np.ndarray:
    """Step ``noisy`` towards ``y`` by single ulps until ``|noisy - y| <= tau`` holds in float64.

    ``y + tau`` rounds to a float that may lie half an ulp of ``y`` beyond the tolerance; the
    contract |answer - f*| <= tau must hold for the floats the learner sees.
    """
    bad = np.abs(noisy - y) > tau
    while np.any(bad):
        noisy[bad] = np.nextafter(noisy[bad], y[bad])
        bad = np.abs(noisy - y) > tau
    return noisy


def round_significant(y: np.ndarray, digits: int) -> np.ndarray:
    """Round every entry of ``y`` to ``digits`` significant decimal digits (0 stays 0)."""
    y = np.asarray(y, dtype=np.float64)
    out = np.zeros_like(y)
    nz = y != 0
    exponent = np.floor(np.log10(np.abs(y[nz])))
    scale = 10.0 ** (digits - 1 - exponent)
    out[nz] = np.round(y[nz] * scale) / scale
    return out


def round_tau(digits: int) -> float:
    """Largest error of rounding a number of size at most 1 to ``digits`` significant digits.

    ``0.5 * 10**(-digits)``: a number in ``[10**-(e+1), 10**-e)`` (``e >= 0``) keeps ``digits``
    digits after its leading one, so it moves by at most half a unit in decimal place
    ``digits + e``; ``e = 0`` is the worst. ``2**-50`` (a few ulps of 1) is added for the float64
    rounding of the rounded value. It is the default ``tau`` of ``noise="round"``.

    Examples
    --------
    >>> round_tau(3) - 5e-4 < 1e-15
    True
    """
    digits = check_int(digits, "digits", minimum=1, maximum=17)
    return 0.5 * 10.0 ** (-digits) + 2.0**-50


class ApproxValueQueryOracle(ValueQueryOracle):
    """Approximate value-query oracle AVQ(X; tau) of §6, deterministic in ``X``.

    Every answer lies in ``[f*(X) - tau, f*(X) + tau]``, and the same ``X`` always gets the same
    answer (the paper's model: repeating a query gains nothing).

    Parameters
    ----------
    target : callable
        The model behind the oracle, as for :class:`ValueQueryOracle`.
    tau : float
        Tolerance, ``tau >= 0``. With ``noise="round"`` it may be ``None``: then
        ``tau = 0.5 * 10**(-digits) + 2**-50``, the rounding error bound while ``|f*| <= 1`` (§6's
        setting): ``k`` significant digits of a number in ``[0.1, 1)`` are its first ``k`` decimals,
        and ``|f*| = 1`` is kept exactly; ``2**-50`` covers the float64 rounding of the result. For
        larger ``|f*|`` pass ``tau`` (``0.5 * 10**(1 - digits)`` while ``|f*| < 10``).
        With ``"float16"`` or ``"bfloat16"`` it may be ``None``: then ``tau = FORMAT_TAU[noise]``,
        2**-12 for float16 and 2**-9 + 2**-25 for bfloat16 (the bound while ``|f*| <= 1``).
    noise : {"uniform", "worst", "round", "float16", "bfloat16"}, default="uniform"
        How the answer is perturbed:

        * ``"uniform"``: ``f* + tau * u(X)`` with ``u(X)`` uniform in [-1, 1), a hash of ``X`` and
          ``seed``.
        * ``"worst"``: ``f* + tau * s(X)`` with a sign ``s`` chosen to hurt the Theorem 4.1 / 6.2
          estimators (a heuristic adversary, not the worst case over all answers within ``tau``):
          a length-1 answer is pulled towards 0 (``s = -sign(f*)``), which shrinks
          the read-off ``|v_i|`` used as a denominator; a longer answer is pushed away from the query
          token's own value ``x_N^T v`` by the same sign as ``f* - x_N^T v``, which inflates the
          apparent attention on the other tokens. Needs a target with attribute ``v``.
        * ``"round"``: ``f*`` rounded to ``digits`` significant decimal digits, as a served model
          prints its output.
        * ``"float16"``: ``f*`` rounded to IEEE half precision (``numpy.float16``, nearest even).
        * ``"bfloat16"``: ``f*`` rounded to bfloat16 through float32 (``round_bfloat16``), as a
          model served in bfloat16 returns it.
        * ``"none"``: the target's own answers, unchanged: for a target whose answers already
          carry their error (a :class:`~companion.served.ServedHead`), ``tau`` being its stated
          bound. The oracle cannot check that bound.
    seed : int, default=0
        Seed of the hash behind ``"uniform"``.
    digits : int, default=None
        Significant digits for ``noise="round"`` (required there, ``>= 1``).
    d, budget, record
        As for :class:`ValueQueryOracle`.

    Raises
    ------
    InvalidInputError
        On construction, for ``tau < 0``, an unknown ``noise``, missing ``digits`` for rounding or a
        ``"worst"`` target without ``v``; when called, as :class:`ValueQueryOracle`.
    OracleInconsistentError
        When rounding would move an answer by more than ``tau`` (``|f*|`` above the assumed scale):
        the oracle would break its own contract, so it refuses.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import SingleHead
    >>> head = SingleHead(np.eye(2), np.array([0.5, -0.25]))
    >>> oracle = ApproxValueQueryOracle(head, 1e-3, seed=1)
    >>> X = np.array([[1.0, 0.0]])
    >>> oracle(X) == oracle(X), abs(oracle(X) - 0.5) <= 1e-3
    (True, True)
    """

    def __init__(self, target, tau, *, noise="uniform", seed=0, digits=None, d=None, budget=None, record=False):
        super().__init__(target, d=d, budget=budget, record=record)
        # "none": the target's own answers (a served model), not a perturbation model
        self.noise = check_choice(noise, "noise", NOISE_MODELS + ("none",))
        self.seed = check_int(seed, "seed", minimum=0, maximum=2**64 - 1)  # mixed as a uint64 (_hash_uniform)
        self.digits = None
        if noise == "round":
            if digits is None:
                raise InvalidInputError('noise="round" needs digits=k, the significant digits kept.')
            self.digits = check_int(digits, "digits", minimum=1, maximum=17)
            if tau is None:
                tau = round_tau(self.digits)
        elif digits is not None:
            raise InvalidInputError(f'digits={digits!r} is only used with noise="round"; got noise={noise!r}.')
        if tau is None and noise in FORMAT_TAU:
            tau = FORMAT_TAU[noise]
        if tau is None:
            raise InvalidInputError(f"tau must be given for noise={noise!r}.")
        self.tau = check_real(tau, "tau", minimum=0.0)
        if noise == "worst" and getattr(target, "v", None) is None:
            raise InvalidInputError('noise="worst" needs a target with a value vector attribute v (a SingleHead).')

    def _answer(self, X: np.ndarray) -> np.ndarray:
        y = self._evaluate(X)
        if self.noise == "none":
            return y
        if self.noise == "uniform":
            return _within(y, y + self.tau * _hash_uniform(X, self.seed), self.tau)
        if self.noise == "worst":
            if X.shape[1] == 1:
                s = -np.sign(y)
            else:
                s = np.sign(y - X[:, -1, :] @ np.asarray(self.target.v))
            s[s == 0] = 1.0
            return _within(y, y + self.tau * s, self.tau)
        if self.noise in FORMAT_TAU:
            with np.errstate(over="ignore"):
                rounded = y.astype(np.float16).astype(np.float64) if self.noise == "float16" else round_bfloat16(y)
            err = np.abs(rounded - y)
            if np.any(~(err <= self.tau)):
                i = int(np.argmax(np.where(np.isfinite(err), err, np.inf)))
                raise OracleInconsistentError(
                    f"rounding f*={y[i]!r} to {self.noise} moves it by {err[i]:.3g} > tau="
                    f"{self.tau:.3g}; the oracle would break its tolerance. Pass a larger tau."
                )
            return rounded
        rounded = round_significant(y, self.digits)
        err = np.abs(rounded - y)
        if np.any(err > self.tau):
            i = int(np.argmax(err))
            raise OracleInconsistentError(
                f"rounding f*={y[i]!r} to {self.digits} significant digits moves it by {err[i]:.3g} "
                f"> tau={self.tau:.3g}; the oracle would break its tolerance. Pass a larger tau "
                "or more digits."
            )
        return rounded

    def __repr__(self):
        extra = f", digits={self.digits}" if self.digits else ""
        return (
            f"{type(self).__name__}(d={self.d}, tau={self.tau:g}, noise={self.noise!r}{extra}, "
            f"n_queries={self.n_queries})"
        )


class AntisymmetrisedOracle(OracleView):
    """The antisymmetrised oracle of §4.1: ṼQ(X) = VQ(X) - VQ(-X), two underlying queries per sequence.

    For a one-layer Transformer TF(X) = w_o^T ReLU(alpha(X, W)^T X A) the scores
    ``x_i^T W x_N`` are unchanged by ``X -> -X`` and ``ReLU(z) - ReLU(-z) = z``, so
    ``ṼQ(X) = alpha(X, W)^T X (A w_o)``: a single-head oracle for ``(W, A w_o)``, to which
    :func:`~companion.exact.learn_single_head` applies.

    Parameters
    ----------
    oracle : ValueQueryOracle
        The underlying oracle; it counts (and budgets) two queries, ``X`` and ``-X``, per sequence.

    Attributes
    ----------
    d : int
        Input dimension.
    n_queries : int
        Underlying queries spent through this wrapper (twice the sequences answered).
    tau : float
        Tolerance of the answers: ``2 * oracle.tau``.
    remaining : int or float
        Sequences this wrapper can still answer (half the underlying budget left).

    Raises
    ------
    BudgetExceededError
        When the underlying budget cannot answer ``2 B`` queries for a batch of ``B``.

    Notes
    -----
    Section 4.1 of Bhattamishra et al. 2026 [1]_; the cost of Theorem 4.1 through this oracle is
    ``2 (d + d**2)`` underlying queries.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import OneLayerTransformer
    >>> tf = OneLayerTransformer(np.eye(2), np.array([[1.0, -2.0], [0.5, 1.0]]), np.array([1.0, 1.0]))
    >>> anti = AntisymmetrisedOracle(ValueQueryOracle(tf))
    >>> X = np.array([[1.0, 2.0], [-1.0, 0.5]])
    >>> bool(np.isclose(anti(X), tf.head(X))), anti.n_queries
    (True, 2)
    """

    def __init__(self, oracle):
        if not callable(oracle) or not hasattr(oracle, "d") or not hasattr(oracle, "n_queries"):
            raise InvalidInputError(
                f"oracle must be a value-query oracle (callable, with d and n_queries); got "
                f"{type(oracle).__name__}. Wrap the model in ValueQueryOracle first."
            )
        super().__init__(oracle)  # d, precision, budget: the oracle's
        self._spent = QueryCount(oracle)

    @property
    def n_queries(self) -> int:
        return self._spent.total

    @property
    def tau(self) -> float:
        return 2.0 * float(getattr(self.oracle, "tau", 0.0))

    @property
    def remaining(self):
        left = getattr(self.oracle, "remaining", np.inf)
        return left if left == np.inf else left // 2  # inf // 2 would be nan

    def require(self, n, *, learner="the learner"):
        """Raise :class:`~companion.errors.BudgetExceededError` now if ``2 n`` underlying queries do not fit."""
        if hasattr(self.oracle, "require"):
            self.oracle.require(2 * n, learner=learner)

    def __call__(self, X):
        """Answer ``VQ(X) - VQ(-X)`` for ``(N, d)`` (float), ``(B, N, d)`` or a list (``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        if isinstance(seqs, np.ndarray):
            y = np.asarray(self.oracle(np.concatenate([seqs, -seqs])), dtype=np.float64)
            out = y[: len(seqs)] - y[len(seqs) :]
        else:
            y = np.asarray(self.oracle(list(seqs) + [-x for x in seqs]), dtype=np.float64)
            out = y[: len(seqs)] - y[len(seqs) :]
        return float(out[0]) if single else out

    def __repr__(self):
        return f"AntisymmetrisedOracle(d={self.d}, n_queries={self.n_queries}, oracle={self.oracle!r})"


# The answers' precision lives in the private sibling _precision; its public names report this module
# (the API page documents them here, as before the split).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "") == "companion._precision":
        _obj.__module__ = __name__
del _name, _obj
