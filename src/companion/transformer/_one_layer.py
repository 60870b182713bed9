"""The §4.1 learner of a one-layer Transformer: FFN extraction, then Theorem 4.1 on the
antisymmetrised oracle (private; re-exported by :mod:`companion.transformer`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from .._learner import (
    QueryCount,
    OracleView,
    COARSE_FACTOR,
    DEFAULT_VERIFY,
    FLOAT64_U,
    build,
    check_verify,
    names_rounding,
    reserve,
    verification_defaults,
    verify_outputs,
)
from .._validation import (
    as_sequences,
    check_int,
    check_real,
)
from ..attention import OneLayerTransformer
from ..errors import NotIdentifiableError, OracleInconsistentError, PrecisionError
from ..exact import check_exact_oracle, learn_single_head
from ..ffn import align_networks, bits_of_precision, learn_ffn
from ..oracles import AntisymmetrisedOracle
from ..recovery import Recovery

TINY = np.finfo(float).tiny


class ReusedAnswers(OracleView):
    """Pass-through oracle that answers the one-token queries ``[+-e_j^T]`` once and then from memory.

    The FFN learner asks ``[e_j^T]`` and ``[-e_j^T]`` for the linear part ``A w_o``; the head
    learner, through :class:`~companion.oracles.AntisymmetrisedOracle`, asks the same ``2d``
    sequences to read its value vector. The oracle is deterministic, so the second time the kept
    answers are returned and nothing is counted. Every other query goes to ``oracle`` unchanged.

    Parameters
    ----------
    oracle : ValueQueryOracle
        The underlying oracle; ``d``, ``tau``, ``n_queries`` and ``remaining`` are its own.

    Attributes
    ----------
    n_reused : int
        Answers returned from memory (queries not asked again).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> base = ValueQueryOracle(random_one_layer(3, 2, seed=0))
    >>> oracle = ReusedAnswers(base)
    >>> E = np.eye(3)[:, None, :]
    >>> first, again = oracle(np.concatenate([E, -E])), oracle(np.concatenate([E, -E]))
    >>> bool(np.array_equal(first, again)), base.n_queries, oracle.n_reused
    (True, 6, 6)
    """

    def __init__(self, oracle):
        super().__init__(oracle)  # d, tau, n_queries, remaining, precision: the oracle's own
        self.n_reused = 0
        self._known = {}  # (j, sign) -> answer to [sign * e_j^T]

    def require(self, n, *, learner="the learner"):
        """Pass the budget check on, less the answers that may be reused."""
        if hasattr(self.oracle, "require"):
            self.oracle.require(max(0, n - len(self._known)), learner=learner)

    def _keys(self, X):
        """``(j, sign)`` for every row of a one-token batch that is ``+-e_j``, else None."""
        flat = X[:, 0, :]
        nz = np.count_nonzero(flat, axis=1)
        j = np.argmax(np.abs(flat), axis=1)
        val = flat[np.arange(len(flat)), j]
        return [(int(jj), float(vv)) if n == 1 and abs(vv) == 1.0 else None for n, jj, vv in zip(nz, j, val)]

    def __call__(self, X):
        if not (isinstance(X, np.ndarray) and X.ndim == 3 and X.shape[1] == 1 and X.shape[2] == self.d):
            return self.oracle(X)
        keys = self._keys(X)
        ask = [i for i, k in enumerate(keys) if k is None or k not in self._known]
        y = np.empty(len(keys))
        if ask:
            y[ask] = np.asarray(self.oracle(X[ask]), dtype=np.float64)
            for i in ask:
                if keys[i] is not None:
                    self._known[keys[i]] = float(y[i])
        asked = set(ask)
        for i, k in enumerate(keys):
            if i not in asked:
                y[i] = self._known[k]
        self.n_reused += len(keys) - len(ask)
        return y


class ScaledAntisymmetrised(OracleView):
    """The antisymmetrised oracle at a query scale ``c``: ``(VQ(cX) - VQ(-cX)) / c``.

    Two underlying queries per sequence, ``cX`` and ``-cX``. For a one-layer Transformer
    ``TF(X) = w_o^T ReLU(alpha(X, W)^T X A + b_1) + b_2`` the scores of ``cX`` are those of ``X``
    under ``c^2 W``, and ``b_2`` cancels. When no pre-activation changes sign between ``cX`` and
    ``-cX`` (``c |(alpha^T X A)_j| < |b_{1,j}|`` for every unit ``j``, true for ``c`` small enough),
    ``ReLU(c z + b) - ReLU(-c z + b)`` is ``2 c z`` for ``b > 0`` and ``0`` for ``b < 0``, so the view
    answers the single head ``f_{c^2 W, 2 A D w_o}`` with ``D = diag(b_1 > 0)``, to which
    :func:`~companion.exact.learn_single_head` applies (its ``W`` divided by ``c^2`` is ``W``).
    Without biases (``b_1 = 0``, any ``c > 0``) ``ReLU(z) - ReLU(-z) = z`` and the view is the head
    ``f_{c^2 W, A w_o}``: :class:`~companion.oracles.AntisymmetrisedOracle` rescaled. This book's
    reduction for biased FFNs (chapter 3), not the paper's.

    Parameters
    ----------
    oracle : ValueQueryOracle
        The underlying oracle; it counts (and budgets) two queries per sequence.
    c : float
        The query scale, ``c > 0``.

    Attributes
    ----------
    d : int
        Input dimension (the oracle's).
    c : float
        The query scale.
    n_queries : int
        The underlying oracle's counter (two per sequence answered here).
    tau : float
        Tolerance of the answers: ``2 * oracle.tau / c``.
    remaining : int or float
        Sequences this view can still answer (half the underlying budget left).

    Raises
    ------
    TypeError
        If ``oracle`` is not a value-query oracle (callable, with ``d`` and ``n_queries``).
    InvalidInputError
        If ``c`` is not a finite number ``> 0``.
    BudgetExceededError
        When the underlying budget cannot answer ``2 B`` queries for a batch of ``B``.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import OneLayerTransformer, SingleHead
    >>> from companion.oracles import ValueQueryOracle
    >>> tf = OneLayerTransformer(np.eye(2), np.array([[1.0, -2.0], [0.5, 1.0]]), np.array([1.0, 1.0]))
    >>> view = ScaledAntisymmetrised(ValueQueryOracle(tf), 0.5)
    >>> X = np.array([[1.0, 2.0], [-1.0, 0.5]])
    >>> bool(np.isclose(view(X), SingleHead(0.25 * tf.W, tf.A @ tf.w_o)(X))), view.n_queries
    (True, 2)
    """

    def __init__(self, oracle, c):
        super().__init__(oracle)
        self.c = check_real(c, "c", minimum=0.0, strict=True)

    @property
    def tau(self) -> float:
        return 2.0 * float(getattr(self.oracle, "tau", 0.0)) / self.c

    @property
    def remaining(self):
        left = getattr(self.oracle, "remaining", np.inf)
        return left if left == np.inf else left // 2  # inf // 2 would be nan

    def require(self, n, *, learner="the learner"):
        """Raise :class:`~companion.errors.BudgetExceededError` now if ``2 n`` underlying queries do not fit."""
        if hasattr(self.oracle, "require"):
            self.oracle.require(2 * n, learner=learner)

    def __call__(self, X):
        """Answer ``(VQ(cX) - VQ(-cX)) / c`` for ``(N, d)`` (float), ``(B, N, d)`` or a list (``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        c = self.c
        both = (
            np.concatenate([c * seqs, -c * seqs])
            if isinstance(seqs, np.ndarray)
            else ([c * x for x in seqs] + [-c * x for x in seqs])
        )
        y = np.asarray(self.oracle(both), dtype=np.float64)
        out = (y[: len(seqs)] - y[len(seqs) :]) / c
        return float(out[0]) if single else out


@dataclass(frozen=True, eq=False, repr=False)
class TransformerRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a one-layer Transformer.

    Adds ``A`` of shape (d, k) (unit-norm columns, canonical order) and ``w_o`` of shape (k,);
    ``W`` (d, d) is the attention matrix and ``v = A w_o`` the antisymmetrised head's value vector.
    """

    A: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    w_o: np.ndarray = None  # type: ignore[assignment]

    @property
    def model(self) -> OneLayerTransformer:
        """The recovered Transformer as a model."""
        return OneLayerTransformer(self.W, self.A, self.w_o)


def random_one_layer(d, m, *, rank=None, seed) -> OneLayerTransformer:
    """A random one-layer Transformer from Gaussian native parameters.

    ``Q, K`` of shape (r, d) with ``K`` scaled by ``1/sqrt(r)`` (so ``W = K^T Q`` has entries of
    variance 1, as in :func:`~companion.attention.random_single_head`), ``V`` (d, d) with entries
    ``N(0, 1/d)``, ``W1`` (m, d) with entries ``N(0, 1/d)`` and ``w2`` (m,) with entries ``N(0, 1/m)``.

    Parameters
    ----------
    d, m : int
        Input dimension and FFN width, ``>= 1``.
    rank : int, default=None
        ``r``, the rank of ``W``; ``None`` means ``d``.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    OneLayerTransformer
        Built by :meth:`companion.attention.OneLayerTransformer.from_native`.

    Examples
    --------
    >>> tf = random_one_layer(4, 6, seed=0)
    >>> tf.d, tf.m, tf.native[3].shape
    (4, 6, (6, 4))
    """
    d = check_int(d, "d", minimum=1)
    m = check_int(m, "m", minimum=1)
    r = d if rank is None else check_int(rank, "rank", minimum=1, maximum=d)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    Q = rng.standard_normal((r, d))
    K = rng.standard_normal((r, d)) / np.sqrt(r)
    V = rng.standard_normal((d, d)) / np.sqrt(d)
    W1 = rng.standard_normal((m, d)) / np.sqrt(d)
    w2 = rng.standard_normal(m) / np.sqrt(m)
    return OneLayerTransformer.from_native(Q, K, V, W1, w2)


#: The one-layer learner's FFN step locates kinks and its head step reads logits, both from answers
#: exact to float64 rounding: a refusal at float32 or coarser answers names the rounding, which alone
#: makes it refuse (whether the target is also outside the class it cannot tell).
_one_layer_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its FFN step locates kinks and its head step "
        "inverts softmax weights, both from answers exact to float64 rounding, so the rounding alone "
        "makes it refuse, and this refusal cannot tell whether the target is also outside the "
        f"one-layer class. Ask a float64 server. (The step said: {err})"
    ),
    one_token=True,
)


#: ``A w_o`` is taken as 0 when ``||A w_o||_inf`` is below this times the largest answer to the
#: queries ``[+-e_j^T]`` (``learn_one_layer``'s default ``zero_tol``; the multi-head learner's rule).
ZERO_TOL = 1e-10


def no_linear_part(ffn, d, zero_tol) -> bool:
    """Whether the extracted FFN's linear part ``A w_o`` is 0 relative to its answers to ``[+-e_j^T]``.

    The size of those answers comes from the extracted network (no new query); an FFN with no
    neuron has none.
    """
    ref = (
        float(np.max(np.abs(ffn.network.forward(np.concatenate([np.eye(d), -np.eye(d)]))), initial=0.0))
        if ffn.A.size
        else 0.0
    )
    return not np.any(np.abs(ffn.v) > zero_tol * max(ref, np.finfo(float).tiny))


def checks_clause(ffn, checked, ffn_options) -> str:
    """The message clause that names both checks behind ``n_verify_queries``: the FFN's one-token
    checks (relative, at ``learn_ffn``'s ``verify_rtol``) and the whole model's (``checked``, as
    :func:`verify_outputs` returned it, before the FFN's count is added)."""
    parts = []
    n_ffn = int(ffn.diagnostics.get("n_verify_queries", 0))
    if n_ffn:
        rtol = verification_defaults(["learn_ffn"])["learn_ffn"][1]  # learn_one_layer keeps it
        parts.append(
            f"the FFN on {n_ffn} one-token queries (largest relative disagreement "
            f"{ffn.diagnostics['verify_max_error']:.1e}, tolerance {rtol:.1e})"
        )
    n_model = int(checked.get("n_verify_queries", 0))
    if n_model and "verify_max_error" in checked:
        parts.append(
            f"the whole model on {n_model} fresh queries (largest disagreement "
            f"{checked['verify_max_error']:.1e}, tolerance {checked['verify_tolerance']:.1e})"
        )
    return "; verified " + " and ".join(parts) if parts else ""


@_one_layer_rounding
def learn_one_layer(
    oracle,
    *,
    signs="auto",
    milp_time_limit=10.0,
    zero_tol=ZERO_TOL,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
    **ffn_options,
):
    """Recover ``(W, A, w_o)`` of a one-layer Transformer from exact value queries (§4.1).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for ``TF(X) = w_o^T ReLU(alpha(X, W)^T X A)`` with ``d = oracle.d``. It must
        answer sequences of length 1 and 2.
    signs : {"auto", "lstsq", "milp"}, default="auto"
        How the FFN's neuron signs are resolved (:func:`companion.ffn.resolve_signs`).
    milp_time_limit : float, default=10.0
        Seconds for the sign program when the width exceeds ``d``; see :func:`~companion.ffn.learn_ffn`.
    zero_tol : float, default=1e-10
        ``A w_o`` is taken as 0 (not identifiable) if ``||A w_o||_inf`` is below ``zero_tol`` times
        the largest answer to the queries ``[+-e_j^T]``.
    verify : int, default=32
        Fresh random queries (lengths 1 to 8, never used for learning) on which the recovered
        Transformer is compared with the oracle; 0 opts out. This is on top of the FFN learner's
        own 64 one-token checks (``ffn_verify``). The learner assumes that the oracle is exactly
        ``w_o^T ReLU(alpha(X, W)^T X A)``: one softmax head, no bias, residual or LayerNorm, and
        an FFN whose neurons :func:`~companion.ffn.learn_ffn` can separate; the check refuses a
        target outside that class instead of returning a wrong model.
    verify_rtol : float, default=1e-6
        Largest accepted disagreement, relative to ``sum_k |w_k| max_i |x_i^T a_k|``.
    seed : int, default=0
        Seed of the FFN learner's random planes and checks, and of the verification queries.
    **ffn_options
        Passed to :func:`~companion.ffn.learn_ffn` (``refine``, ``max_planes``, ...); its
        ``verify`` is passed as ``ffn_verify``.

    Returns
    -------
    TransformerRecovery
        ``W`` (d, d); ``A`` (d, k), ``w_o`` (k,) in canonical form (unit-norm columns, sorted;
        ``k = m`` for a generic target); ``v = A w_o``. ``n_queries`` is read from the oracle and
        equals ``diagnostics["n_queries_ffn"] + diagnostics["n_queries_attention"] + verify``: the
        FFN part including its own 64 checks; the attention part ``2 d**2`` plus re-measurements,
        because the head's ``d`` length-1 antisymmetrised queries are the FFN learner's ``2d``
        queries ``[+-e_j^T]``, answered again from memory (``diagnostics["n_reused"]``, ``2d``;
        see :class:`ReusedAnswers`); and the whole-model check. ``diagnostics["n_verify_queries"]``
        counts the FFN's checks and the whole model's (``n_learning_queries`` leaves them out), and
        ``diagnostics["verify_max_error"]`` is the whole model's largest disagreement,
        ``diagnostics["verify_tolerance"]`` its tolerance. The message names each of the two
        checks with its own count, largest disagreement and tolerance (the FFN's is the relative
        tolerance of :func:`~companion.ffn.learn_ffn`).
        ``diagnostics`` also holds the FFN learner's diagnostics (``ffn``), the attention
        learner's (``attention``), and ``v_mismatch``: the largest difference between the head's
        value vector (the measured ``VQ([e_j^T]) - VQ([-e_j^T])``) and the linear part ``A w_o``
        of the extracted network.

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    NotIdentifiableError
        If ``A w_o = 0``: the antisymmetrised oracle is identically 0 and reveals nothing about
        ``W`` (the paper's condition ``A* w_o* != 0``).
    OracleInconsistentError
        If the one-token answers are not a bias-free ReLU network (see
        :func:`~companion.ffn.learn_ffn`), or the antisymmetrised answers not a softmax head.
        (:class:`~companion.errors.PrecisionError` instead when the answers carry float32 or
        coarser rounding, stated or measured after the refusal with 16 one-token queries.)
    PrecisionError
        If the FFN learner found two neurons' kinks closer than float64 resolves on every plane
        (from :func:`~companion.ffn.learn_ffn`); or if, with ``ffn_verify=0``, the whole-model
        check fails and the unchecked FFN part also disagrees with the oracle on
        ``FFN_BLAME_QUERIES`` (16) fresh one-token queries, and the answers are float64 (16 more
    queries, :func:`~companion.oracles.measure_one_token_precision`): the FFN extraction (most likely kinks
        closer than :func:`~companion.ffn.find_kinks` separates) is the cause, not the target,
        and the message says to pass ``ffn_verify``. These queries count as verification.

    See Also
    --------
    learn_one_layer_biased : this book's own reduction for an FFN with biases (OPT-style).

    Notes
    -----
    Section 4.1 of Bhattamishra et al. 2026 [1]_ reduces the Transformer to an FFN learner, which
    the paper assumes, plus Theorem 4.1 on ``VQ(X) - VQ(-X)``, for ``Q_FFN(d, m) + 2 (d + d**2)``
    queries; reusing the ``2d`` answers the two steps share makes it ``Q_FFN(d, m) + 2 d**2``. The
    FFN learner here is :func:`~companion.ffn.learn_ffn` (critical points, Carlini et
    al. 2020 [2]_). The learner never reads the target's parameters.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] N. Carlini, M. Jagielski, I. Mironov, "Cryptanalytic extraction of neural network
       models", CRYPTO 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> tf = random_one_layer(4, 3, seed=2)
    >>> rec = learn_one_layer(ValueQueryOracle(tf))
    >>> rec.diagnostics["n_queries_attention"], bool(np.allclose(rec.W, tf.W, atol=1e-10))
    (32, True)
    >>> rec.diagnostics["n_verify_queries"]             # 64 one-token FFN checks + 32 on the model
    96
    """
    d = check_exact_oracle(oracle, "learn_one_layer")
    zero_tol = check_real(zero_tol, "zero_tol", minimum=0.0)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if "ffn_verify" in ffn_options:
        ffn_options["verify"] = ffn_options.pop("ffn_verify")
    start = reserve(oracle, 0, "learn_one_layer")
    oracle = ReusedAnswers(oracle)
    count = QueryCount(oracle)
    with count.stage("ffn"):
        ffn = learn_ffn(oracle, signs=signs, milp_time_limit=milp_time_limit, seed=seed, **ffn_options)
    n_ffn = count["ffn"]
    b = ffn.v
    if no_linear_part(ffn, d, zero_tol):
        raise NotIdentifiableError(
            "A w_o = 0: the antisymmetrised oracle VQ(X) - VQ(-X) = alpha(X, W)^T X A w_o is "
            "identically 0, so these queries reveal nothing about W (§4.1 needs A* w_o* != 0). "
            "The FFN part was extracted; W is not identifiable this way."
        )
    anti = AntisymmetrisedOracle(oracle)
    try:
        with count.stage("attention"):
            head = learn_single_head(anti, verify=0)  # the whole model is verified below
    except NotIdentifiableError as exc:
        raise NotIdentifiableError(
            f"the antisymmetrised oracle read A w_o = 0, so W is not identifiable from it (§4.1). ({exc})"
        ) from None
    n_att = count["attention"]
    diagnostics = {
        "n_queries_ffn": n_ffn,
        "n_queries_attention": n_att,
        "n_reused": oracle.n_reused,
        "v_mismatch": float(np.max(np.abs(head.v - b))),
        "ffn": dict(ffn.diagnostics),
        "attention": dict(head.diagnostics),
    }
    message = (
        f"FFN: {ffn.message}; attention: W from the antisymmetrised oracle with {n_att} "
        f"queries (2 d^2 = {2 * d * d}; its {d} length-1 queries reuse the FFN's "
        f"{oracle.n_reused} answers to [+-e_j])"
    )
    model = OneLayerTransformer(head.W, ffn.A, ffn.w_o)
    A, w = ffn.A, np.abs(ffn.w_o)
    try:
        checked = verify_outputs(
            oracle,
            model,
            lambda x: float(w @ np.max(np.abs(x @ A), axis=0)),
            verify,
            rtol=verify_rtol,
            seed=seed + 1,
            what="a one-layer Transformer w_o^T ReLU(alpha(X, W)^T X A) (no bias, residual or LayerNorm)",
        )
    except OracleInconsistentError as err:
        if ffn.diagnostics["n_verify_queries"] == 0:
            _blame_unchecked_ffn(oracle, ffn, err, seed=seed + 3, refine=ffn_options.get("refine", True))
        raise
    clause = checks_clause(ffn, checked, ffn_options)
    checked["n_verify_queries"] += int(ffn.diagnostics["n_verify_queries"])
    return build(
        TransformerRecovery,
        oracle,
        start,
        verification=checked,
        verified=clause,
        message=message,
        diagnostics=diagnostics,
        W=head.W,
        v=b,
        A=ffn.A,
        w_o=ffn.w_o,
    )


#: One-token queries :func:`learn_one_layer` spends, after its check failed, on an FFN part that was
#: extracted unchecked (``ffn_verify=0``), to tell a wrong extraction from a target outside the class.
FFN_BLAME_QUERIES = 16


def _blame_unchecked_ffn(oracle, ffn, err, *, seed, refine=True):
    """Raise if the unchecked FFN part, not the target, explains a failed whole-model check.

    On one-token queries ``[x^T]`` a one-layer Transformer *is* its FFN, ``w_o^T ReLU(A^T x)``, so
    if the extracted network disagrees with the oracle there, the FFN extraction went wrong: with
    ``ffn_verify=0`` the first plane's network is returned unchecked, and a plane along whose
    lines two neurons' kinks lie closer than :func:`~companion.ffn.find_kinks` separates (below
    about ``64 delta / c``; see its Notes) gives a wrong network. That is not evidence against the
    one-layer form (with ``refine=False`` the hyperplanes' coarser location is the other cause the
    message names). Returns (the original error stands) if the FFN part agrees to within the FFN
    learner's ``verify_rtol`` default, or if the budget has no room for the queries.
    """
    if not ffn.A.size or getattr(oracle, "remaining", np.inf) < 2 * FFN_BLAME_QUERIES:
        return
    from ..oracles import measure_one_token_precision, stated_precision

    u = stated_precision(oracle)
    if u is None:
        u = measure_one_token_precision(oracle, n=FFN_BLAME_QUERIES // 2, seed=seed)["u"]
    if u > COARSE_FACTOR * FLOAT64_U:
        return  # rounded answers: the rounding diagnosis (names_rounding) speaks instead
    d = ffn.A.shape[0]
    X = np.random.default_rng(seed).standard_normal((FFN_BLAME_QUERIES, d)) / np.sqrt(d)
    y = np.asarray(oracle(X[:, None, :]), dtype=np.float64)
    y_hat = np.maximum(X @ ffn.A, 0.0) @ ffn.w_o
    rel = float(np.max(np.abs(y_hat - y))) / max(float(np.max(np.abs(y))), TINY)
    rtol = inspect.signature(learn_ffn).parameters["verify_rtol"].default
    if rel <= rtol:
        return
    raise PrecisionError(
        f"verification failed (by up to {getattr(err, 'max_error', float('nan')):.3g}), and the "
        f"cause is the FFN step, not the target: the FFN part was extracted from one random plane "
        f"unchecked (ffn_verify=0) and disagrees with the oracle's one-token answers [x^T] by up "
        f"to {rel:.3g} relative on {FFN_BLAME_QUERIES} fresh ones (where a one-layer Transformer "
        f"is its FFN exactly). Most likely two neurons' kinks along that plane's lines lie closer "
        "than the kink search separates (companion.ffn.find_kinks merges pairs below about 64 "
        "delta/c; the default refine=True re-measures each hyperplane and refuses most such "
        "planes)"
        + ("" if refine else ", or, with refine=False, hyperplanes located too coarsely")
        + "; only the FFN's own check draws another plane. Pass ffn_verify=64 (the default; with "
        "max_planes > 1)"
        + ("" if refine else " and refine=True")
        + ". The answers were not shown to come from a model outside the one-layer class."
    ) from err


def output_precision(model_hat, model, *, n=1000, max_len=8, seed=0):
    """Worst output disagreement of two Transformers on fresh random inputs, in bits.

    Inputs have random lengths 1 to ``max_len`` and tokens ``N(0, I_d / d)``. Returns
    ``-log2(max |TF_hat - TF| / max |TF|)`` (this book's measure, relative to the largest output; Carlini
    et al. report the absolute one), ``inf`` on exact agreement.
    """
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    lengths = rng.integers(1, max_len + 1, size=check_int(n, "n", minimum=1))
    X = [rng.standard_normal((int(k), model.d)) / np.sqrt(model.d) for k in lengths]
    return bits_of_precision(model_hat(X), model(X))


def evaluate(rec, target, *, n=1000, seed=0) -> dict:
    """Errors of a :class:`TransformerRecovery` against its target (evaluation only).

    Returns
    -------
    dict
        ``W_error`` (relative Frobenius), ``direction_error``, ``weight_error``, ``linear_error``
        and ``matched`` after canonical alignment (:func:`~companion.ffn.align_networks`), and
        ``bits`` (:func:`output_precision` on ``n`` fresh inputs).
    """
    err = align_networks(rec.A, rec.w_o, target.A, target.w_o)
    return {
        "W_error": float(np.linalg.norm(rec.W - target.W) / np.linalg.norm(target.W)),
        "direction_error": err["direction_error"],
        "weight_error": err["weight_error"],
        "linear_error": err["linear_error"],
        "matched": err["matched"],
        "bits": output_precision(rec.model, target, n=n, seed=seed),
    }
