"""The precision of an oracle's answers: floating-point formats, and measuring ``u`` from the answers (private).

Re-exported by :mod:`companion.oracles` (``FORMATS``, :func:`unit_roundoff`, :func:`round_to`,
:func:`nearest_format`, :func:`as_precision`, :func:`stated_precision`, :func:`significant_bits`,
:func:`measure_precision`, :func:`measure_one_token_precision`, :func:`check_answers`,
``ANSWER_KINDS``); it knows oracles only as callables with ``d`` and ``n_queries``.
"""

from __future__ import annotations


import numpy as np

from ._validation import check_choice, check_int, check_real
from .errors import OracleInconsistentError, nonfinite_answer_error


#: Floating-point formats of a served model, with the number of stored fraction bits.
FORMATS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}


def unit_roundoff(fmt) -> float:
    """The relative rounding ``u = 2**-(p + 1)`` of a format with ``p`` fraction bits.

    Rounding to nearest moves a value ``x`` in the normal range by at most ``u |x|`` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2002, Thm 2.2): half an ulp of 1.

    Examples
    --------
    >>> unit_roundoff("float32") == 2.0**-24, unit_roundoff("bfloat16") == 2.0**-8
    (True, True)
    >>> unit_roundoff("float64") == float(np.finfo(np.float64).eps) / 2
    True
    """
    check_choice(fmt, "fmt", tuple(FORMATS))
    return 2.0 ** -(FORMATS[fmt] + 1)


def round_to(x, fmt) -> np.ndarray:
    """``x`` rounded to nearest (ties to even) in ``fmt``, returned as float64.

    bfloat16 is rounded through float32 (``round_bfloat16``), as a model
    that computes in float32 and stores bfloat16 does.
    """
    check_choice(fmt, "fmt", tuple(FORMATS))
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        if fmt == "float64":
            return x.copy()
        if fmt == "bfloat16":
            return round_bfloat16(x)
        return x.astype(np.dtype(fmt)).astype(np.float64)


def nearest_format(u) -> str:
    """The format of ``companion.oracles.FORMATS`` whose unit roundoff is nearest to ``u`` in ratio.

    Examples
    --------
    >>> nearest_format(3e-8), nearest_format(2e-3), nearest_format(0.0)
    ('float32', 'bfloat16', 'float64')
    """
    if not u > 0:
        return "float64"
    return min(FORMATS, key=lambda f: abs(np.log(u / unit_roundoff(f))))


def as_precision(precision) -> float:
    """A stated precision (a name of ``companion.oracles.FORMATS``, or a relative rounding in (0, 1/2]) as ``u``.

    Raises
    ------
    InvalidInputError
        For an unknown format or a number outside (0, 1/2].
    """
    if isinstance(precision, str):
        return unit_roundoff(check_choice(precision, "precision", tuple(FORMATS)))
    return check_real(precision, "precision", minimum=0.0, strict=True, maximum=0.5)


def stated_precision(oracle):
    """The relative rounding ``u`` an oracle states (``oracle.precision``), or None if it states none.

    An :class:`AntisymmetrisedOracle` states its underlying oracle's.
    """
    inner = getattr(oracle, "oracle", None)
    u = getattr(oracle, "precision", None)
    if u is None and inner is not None:
        u = getattr(inner, "precision", None)
    return None if u is None else float(u)


def significant_bits(y) -> int:
    """The most significant bits any nonzero finite entry of ``y`` needs (53 for a full float64).

    An answer computed in float64 at a random point needs all 53 bits of its significand (the
    chance that its last ``k`` bits are 0 is ``2**-k``); one rounded to float32 needs at most 24,
    to bfloat16 at most 8. So ``2**-significant_bits(y)`` bounds the relative rounding of a server
    that returns its format's values, read off answers already asked (no query). Zeros, NaN and
    infinities are skipped; 0 if nothing is left.

    Parameters
    ----------
    y : array_like of float
        Answers, any shape.

    Returns
    -------
    int
        In ``0 .. 53``.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal(8)
    >>> significant_bits(x), significant_bits(x.astype(np.float32)), significant_bits([0.5, 3.0])
    (53, 24, 2)
    """
    y = np.asarray(y, dtype=np.float64)
    y = y[(y != 0) & np.isfinite(y)]
    if y.size == 0:
        return 0
    m = (y.view(np.uint64) & np.uint64(2**52 - 1)) | np.uint64(2**52)  # mantissa, hidden bit set
    tz = np.zeros(m.shape, dtype=np.int64)
    for k in range(53):  # trailing zero bits
        tz += ((m >> np.uint64(k)) & np.uint64(1) == 0) & (tz == k)
    return int(53 - tz.min())


#: Relative size of the tiny step of :func:`measure_precision` (``2**-44`` of each token entry): below the
#: input spacing of every served format (float32's is ``2**-24``), far above float64's (``2**-53``).
TINY_STEP = 2.0**-44
#: A tiny step that moves the answer by more than this (relative to the answers' scale) is not smooth:
#: noise. A smooth float64 target moves by about ``TINY_STEP`` times its logits' size; the perturbation
#: test mode by a few ulps; noise of 1e-9 by about 1e-9.
NOISE_FLOOR = 2.0**-34
#: A float64 computation (inputs not quantized) whose invariance spread exceeds this breaks attention's
#: invariances: outside the class. Float64 arithmetic and the perturbation test mode stay below 1e-13.
OUTSIDE_FLOAT64 = 1e-11
#: A quantized computation whose invariance spread is this many times its rounding (granularity or
#: jitter) breaks the invariances by more than rounding explains: outside the class.
OUTSIDE_FACTOR = 64.0
#: The spread and granularity stand for ``u`` unless the family's jitter exceeds them this many times.
JITTER_RATIO = 16.0
#: Points and polynomial degree of the one-parameter family of :func:`measure_precision`.
FAMILY_POINTS, FAMILY_DEGREE, FAMILY_SPAN = 16, 6, 2.0**-7

#: The names :func:`measure_precision` gives to what its answers carry.
ANSWER_KINDS = ("float64", "rounding", "outside", "noise", "random noise")


def measure_precision(oracle, *, n=8, length=8, seed=0) -> dict:
    """Measure what an oracle's answers carry (rounding, noise, or a target outside attention).

    Four measurements, reconciled into one account (``kind``) before any threshold follows them:

    * **invariance spread** ``u_spread`` (``3 n`` queries). Attention has exact invariances that a
      floating-point evaluation does not keep bit for bit: permuting the tokens before the last,
      and repeating every token (``x_1, x_1, ..., x_N, x_N``), leave ``f(X) = sum_i alpha_i x_i^T v``
      unchanged. The median over ``n`` random ``X`` (``length`` tokens ``N(0, I_d / d)``) of the
      spread (max - min) of the three answers, over the root-mean-square answer.
    * **granularity** ``u_granularity = 2**-bits``: an answer with ``p`` significant bits has
      rounding ``2**-p`` (:func:`significant_bits`; no query).
    * **repeat and tiny step** (``n // 2`` queries each): the first queries asked again, and moved
      by ``TINY_STEP`` (``2**-44``) of each entry, each as a batch of the same shape as the first
      ``n // 2`` (asked alone). A repeated query whose answer moves by more than ``NOISE_FLOOR`` is
      *random noise*. A served format rounds its inputs, so the tiny step leaves its answers bit-identical
      (*quantized*); a float64 computation moves smoothly, by about ``TINY_STEP``; a move above
      ``NOISE_FLOOR`` (``2**-34``) is *deterministic noise* (a hash of the query).
    * **one-parameter family** (only for quantized answers, ``FAMILY_POINTS`` = 16 queries): the
      answers along ``X (1 + t s Delta)``, ``t`` in [-1, 1], ``s = 2**-7``, whose inputs cross many
      steps of any short format; the residual of a degree-6 polynomial fit is the rounding's jitter
      ``u_jitter``, read out through any readout (a float64 readout of a bfloat16 layer hides both
      the spread and the granularity, not the jitter).

    The account (``kind``):

    * ``"random noise"`` or ``"noise"``: ``u`` is the noise's relative size (repeats, or tiny steps);
    * ``"outside"``: the invariances are broken by more than the rounding explains (a float64
      computation with ``u_spread > OUTSIDE_FLOAT64``, or a quantized one with ``u_spread`` above
      ``OUTSIDE_FACTOR`` times its rounding): the target is not attention (positional encodings,
      a length-dependent term), and ``u`` is the rounding alone, not the spread;
    * ``"rounding"``: quantized answers; ``u`` the larger of spread and granularity, or the jitter
      where it is ``JITTER_RATIO`` (16) times both (their rounding hidden from them);
    * ``"float64"``: a smooth float64 computation; ``u`` its granularity (``2**-53``), not the spread
      of its sums (4.6e-16 on a MiniLM head made the sketch take its coarse path).

    ``u`` is the rounding unit of the answers, not the error of every answer: thresholds multiply
    it by a size factor (:func:`companion._learner.rounding_tolerance`), like
    ``numpy.linalg.matrix_rank``'s ``eps * max(M, N)``. This book's construction.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Any value-query oracle; ``3 n + 2 (n // 2)`` of its queries are spent, and 16 more for
        quantized answers (counted; all ``3 n + 2 (n // 2) + 16`` budgeted before the first).
    n : int, default=8
        Random sequences, ``>= 2``.
    length : int, default=8
        Their length, ``>= 3`` (two tokens before the last, so that a permutation changes them).
    seed : int, default=0
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    dict
        ``u`` (the measured relative size of what the answers carry), ``kind`` (one of
        ``ANSWER_KINDS``), ``u_spread``, ``u_granularity``, ``u_jitter`` (0 if not measured),
        ``u_step`` (the median tiny-step move), ``u_repeat`` (the largest repeat difference),
        ``quantized``, ``bits`` (the largest significant bits seen), ``format``
        (:func:`nearest_format` of ``u``, or of the granularity for rounded answers of at most 24
        bits: they name their format) and ``n_queries``.

    Raises
    ------
    BudgetExceededError
        If fewer queries remain than the measurement needs (before the first).

    Examples
    --------
    >>> from companion.attention import random_single_head
    >>> from companion.served import ServedHead
    >>> from companion.oracles import ValueQueryOracle
    >>> m = measure_precision(ValueQueryOracle(ServedHead(random_single_head(16, seed=0))))
    >>> m["format"], m["kind"], m["n_queries"], bool(1e-8 < m["u"] < 1e-6)
    ('float32', 'rounding', 48, True)
    >>> m = measure_precision(ValueQueryOracle(random_single_head(16, seed=0)))
    >>> m["format"], m["kind"], m["n_queries"]
    ('float64', 'float64', 32)
    """
    n = check_int(n, "n", minimum=2)
    length = check_int(length, "length", minimum=3)
    seed = check_int(seed, "seed", minimum=0)
    d = int(oracle.d)
    k = n // 2
    if hasattr(oracle, "require"):
        # the family's queries too: a measurement refused for its budget is refused before the first query
        oracle.require(3 * n + 2 * k + FAMILY_POINTS, learner="measure_precision")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, length, d)) / np.sqrt(d)
    P = X.copy()
    P[:, :-1] = X[:, -2::-1]  # reversed before the last token
    R = np.repeat(X, 2, axis=1)  # every token twice; x_N stays last
    T = X[:k] * (1.0 + TINY_STEP * rng.choice([-1.0, 1.0], size=(k, length, d)))
    # X[:k] is asked as a batch of its own, and so are its repeat and its tiny step: batches of the
    # same shape take the same arithmetic path (a BLAS blocks a batch of 4 and one of 8 differently,
    # and a MiniLM head's repeats in another batch differed by 8.6e-16: not noise)
    y_first = _answers(oracle, X[:k], d)
    Y = np.stack(
        [np.concatenate([y_first, _answers(oracle, X[k:], d)]), _answers(oracle, P, d), _answers(oracle, R, d)]
    )
    y_step = _answers(oracle, T, d)
    y_again = _answers(oracle, X[:k], d)
    rms = float(np.sqrt(np.mean(Y**2)))
    scale = rms if rms > 0 else 1.0
    u_spread = float(np.median(Y.max(axis=0) - Y.min(axis=0)) / scale)
    u_repeat = float(np.max(np.abs(y_again - y_first)) / scale)
    steps = np.abs(y_step - y_first) / scale
    u_step = float(np.median(steps))
    quantized = bool(np.mean(steps == 0.0) >= 0.5)
    bits = significant_bits(np.concatenate([Y.ravel(), y_step, y_again]))
    u_gran = 2.0**-bits if bits else 0.0
    u_jitter = 0.0
    spent = 3 * n + 2 * k
    if u_repeat > NOISE_FLOOR:  # below it, a nondeterministic float64 sum is not noise worth the name
        kind, u = "random noise", max(u_repeat, u_step, u_gran)
    elif not quantized and u_step > NOISE_FLOOR:
        kind, u = "noise", max(u_step, u_gran)
    elif quantized:
        u_jitter = _family_jitter(oracle, X[0], rng, scale)
        spent += FAMILY_POINTS
        u_round = max(u_gran, u_jitter)
        # The jitter is the whole forward error of an answer (many roundings), not the unit u that
        # thresholds multiply by their size factors: it stands in for u only where the spread and the
        # granularity miss the rounding by far (a bfloat16 layer read out in float64: both ~0).
        seen = max(u_spread, u_gran)
        if u_spread > OUTSIDE_FACTOR * u_round:
            kind, u = "outside", u_gran if u_gran * JITTER_RATIO >= u_jitter else u_jitter
        else:
            kind, u = "rounding", seen if seen * JITTER_RATIO >= u_jitter else u_jitter
    elif u_spread > OUTSIDE_FLOAT64:
        kind, u = "outside", u_gran
    else:  # float64 arithmetic: its spread (a few ulps of a sum) is not a coarser unit
        kind, u = "float64", u_gran
    return {
        "u": u,
        "kind": kind,
        "u_spread": u_spread,
        "u_granularity": u_gran,
        "u_jitter": u_jitter,
        "u_step": u_step,
        "u_repeat": u_repeat,
        "quantized": quantized,
        "bits": bits,
        # answers in a short format have at most its bits: float16's 11 name it, whatever the spread says
        "format": nearest_format(u_gran) if kind == "rounding" and 0 < bits <= 24 else nearest_format(u),
        "n_queries": spent,
    }


def _answers(oracle, X, d) -> np.ndarray:
    """The oracle's answers to a batch, checked: one finite real per query (else a clear error)."""
    return check_answers(oracle(X), len(X), d=d)


def _family_jitter(oracle, x, rng, scale) -> float:
    """The rounding jitter of answers along ``x (1 + t s Delta)``: the residual of a polynomial fit.

    The residual's root mean square (corrected for the fitted coefficients) times ``sqrt(3)`` (a
    rounding error uniform in ``[-u, u]`` has that ratio of bound to deviation), over the answers'
    ``scale`` (the root-mean-square of the invariance answers: one answer near 0 would inflate a scale
    of its own). The smooth part of a target leaves about ``s**7 / 7!``, far below any short format's
    rounding.
    """
    t = np.linspace(-1.0, 1.0, FAMILY_POINTS)
    delta = rng.standard_normal(x.shape)
    F = x[None] * (1.0 + FAMILY_SPAN * t[:, None, None] * delta[None])
    y = _answers(oracle, F, x.shape[1])
    V = np.polynomial.legendre.legvander(t, FAMILY_DEGREE)
    resid = y - V @ np.linalg.lstsq(V, y, rcond=None)[0]
    dof = FAMILY_POINTS - FAMILY_DEGREE - 1
    return float(np.sqrt(3.0 * np.sum(resid**2) / dof) / scale)


def check_answers(y, n, *, d=None) -> np.ndarray:
    """An oracle's answers to ``n`` queries as a float64 array ``(n,)``, or a clear error naming what came back.

    Raises
    ------
    OracleInconsistentError
        If the answers are not ``n`` finite real numbers (strings, a vector per query, NaN).

    Examples
    --------
    >>> check_answers([0.5, 1.0], 2)
    array([0.5, 1. ])
    >>> try:
    ...     check_answers(np.ones((2, 3)), 2, d=3)
    ... except OracleInconsistentError as exc:
    ...     print(str(exc)[:58])
    the oracle returned an array of shape (2, 3) for 2 queries
    """
    try:
        a = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise OracleInconsistentError(
            f"the oracle returned {show_answer(y)} for {n} queries; a value-query oracle returns one real number per "
            "query (a float, or an array of shape (n,) of floats)."
        ) from None
    if a.size != n:
        raise OracleInconsistentError(
            f"the oracle returned an array of shape {a.shape} for {n} queries"
            + (f" of dimension d={d}" if d is not None else "")
            + f"; a value-query oracle returns one real number per query, shape ({n},). A vector per query "
            "(a layer's output) needs a readout: wrap it in VectorQueryOracle or dot it with a vector first."
        )
    a = a.reshape(n)
    if not np.all(np.isfinite(a)):
        i = int(np.flatnonzero(~np.isfinite(a))[0])
        raise nonfinite_answer_error(a[i], i, n)
    return a


def show_answer(y) -> str:
    text = repr(y)
    return f"{type(y).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def measure_one_token_precision(oracle, *, n=8, seed=0) -> dict:
    """Measure the relative rounding of a one-token oracle's answers (an FFN) from ``2 n`` queries.

    :func:`measure_precision` permutes and repeats the tokens of long sequences, which an oracle of
    a feed-forward network (one token) does not answer, and whose invariances a target outside
    attention (a bias, a length-dependent term) breaks by more than rounding. Here ``u`` is the
    answers' granularity only: ``2**-p`` for the most significant bits ``p`` any answer to
    ``[x^T]`` or ``[(3 x)^T]`` (``n`` random ``x ~ N(0, I_d / d)``) has, as in
    :func:`measure_precision` (a float32 answer has at most 24). It sees every server that returns
    its format's values (float32, float16, bfloat16 tensors), not one that computes in float32
    and returns wider values. ``u_spread``, the median ``|f(3 x) / 3 - f(x)|`` over the
    root-mean-square answer, is reported but not used: a bias-free ReLU network is positively
    homogeneous, so it is rounding there, but a target slightly outside the class (``y + 1e-3
    tanh(y)``) has a spread of its own that no test on the spread tells from rounding.

    Returns
    -------
    dict
        ``u`` (the granularity), ``u_spread``, ``bits``, ``format`` (:func:`nearest_format` of
        ``u``) and ``n_queries`` (``2 n``).

    Raises
    ------
    BudgetExceededError
        If fewer than ``2 n`` queries remain (before the first).

    Examples
    --------
    >>> from companion.ffn import FeedForward
    >>> from companion.oracles import ValueQueryOracle
    >>> net = FeedForward(np.eye(3), np.array([1.0, -2.0, 0.5]))
    >>> measure_one_token_precision(ValueQueryOracle(net))["format"]
    'float64'
    >>> f32 = lambda X: np.float32(net(X)).astype(np.float64)
    >>> m = measure_one_token_precision(ValueQueryOracle(f32, d=3))
    >>> m["format"], m["bits"] <= 24
    ('float32', True)
    """
    n = check_int(n, "n", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    d = int(oracle.d)
    if hasattr(oracle, "require"):
        oracle.require(2 * n, learner="measure_one_token_precision")
    x = np.random.default_rng(seed).standard_normal((n, d)) / np.sqrt(d)
    y = np.asarray(oracle(np.concatenate([x, 3.0 * x])[:, None, :]), dtype=np.float64)
    y1, y3 = y[:n], y[n:] / 3.0
    rms = float(np.sqrt(np.mean(y1**2)))
    u_spread = float(np.median(np.abs(y3 - y1)) / rms) if rms > 0 else 0.0
    bits = significant_bits(y)
    u = 2.0**-bits if bits else 0.0
    return {"u": u, "u_spread": u_spread, "bits": bits, "format": nearest_format(u), "n_queries": 2 * n}


def round_bfloat16(y: np.ndarray) -> np.ndarray:
    """Round ``y`` to bfloat16 (8 exponent bits, 7 fraction bits), returned as float64.

    The value is cast to float32, then the low 16 bits of its bit pattern are rounded away, to
    nearest with ties to even, by integer arithmetic on the ``uint32`` view (what a served model
    does when it casts its float32 output to bfloat16). Finite values past the bfloat16 range
    become inf.
    """
    with np.errstate(over="ignore"):
        bits = np.asarray(y, dtype=np.float64).astype(np.float32).view(np.uint32)
    bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (bits & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
