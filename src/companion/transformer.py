"""Learning a one-layer Transformer from value queries (§4.1): FFN extraction plus Theorem 4.1.

``TF(X) = w_o^T ReLU(alpha(X, W)^T X A)`` (:class:`~companion.attention.OneLayerTransformer`). Two
facts split the problem in two:

1. On one-token queries ``[x^T]`` the softmax weight is 1, so ``VQ([x^T]) = w_o^T ReLU(A^T x)``: a
   bias-free ReLU network, extracted by :func:`companion.ffn.learn_ffn`.
2. The scores ``x_i^T W x_N`` are unchanged by ``X -> -X``, and ``ReLU(z) - ReLU(-z) = z``, so the
   antisymmetrised oracle ``VQ(X) - VQ(-X) = alpha(X, W)^T X (A w_o)`` is a single head with value
   vector ``A w_o`` (:class:`~companion.oracles.AntisymmetrisedOracle`); Theorem 4.1
   (:func:`companion.exact.learn_single_head`) recovers ``W`` from it if ``A w_o != 0``.

The two halves share ``2d`` queries: the head learner's ``d`` length-1 antisymmetrised queries
``VQ([e_j^T]) - VQ([-e_j^T])`` are the FFN learner's linear-part queries ``[+-e_j^T]``, so their
answers are kept and reused (:class:`ReusedAnswers`), and the attention costs ``2 d**2`` queries.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from ._validation import (
    SequenceModel,
    as_float_array,
    check_choice,
    check_int,
    check_real,
    frozen,
)
from .attention import MultiHead, OneLayerTransformer, attention_weights
from .errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError, PrecisionError
from .exact import check_exact_oracle, learn_single_head
from .ffn import FeedForward, ReLUNetwork, align_networks, bits_of_precision, learn_ffn, learn_relu_network
from ._learner import (
    COARSE_FACTOR,
    DEFAULT_VERIFY,
    FLOAT64_U,
    build,
    check_verify,
    names_rounding,
    refuse_stated_rounding,
    reserve,
    verification_defaults,
    verify_outputs,
)
from .oracles import AntisymmetrisedOracle
from .recovery import Recovery

__all__ = [
    "learn_one_layer",
    "TransformerRecovery",
    "random_one_layer",
    "output_precision",
    "evaluate",
    "ReusedAnswers",
    "MultiHeadTransformer",
    "MultiHeadTransformerRecovery",
    "random_multi_head_transformer",
    "region_anchors",
    "learn_multi_head_transformer",
    "ServedMultiHeadTransformer",
    "evaluate_multi_head",
    "BiasedOneLayerTransformer",
    "random_biased_one_layer",
    "BiasedTransformerRecovery",
    "learn_one_layer_biased",
]

_TINY = np.finfo(float).tiny
_COARSE_FACTOR = COARSE_FACTOR  # the canonical-form learners' factor too (companion._learner.names_rounding)


class ReusedAnswers:
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
        self.oracle = oracle
        self.d = int(oracle.d)
        self.tau = float(getattr(oracle, "tau", 0.0))
        self.n_reused = 0
        self._known = {}  # (j, sign) -> answer to [sign * e_j^T]

    @property
    def n_queries(self) -> int:
        return int(self.oracle.n_queries)

    @property
    def remaining(self):
        return getattr(self.oracle, "remaining", np.inf)

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
#: exact to float64 rounding: a refusal at float32 or coarser answers names the rounding.
_one_layer_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its FFN step locates kinks and its head step "
        "inverts softmax weights, both from answers exact to float64 rounding, so this refusal is "
        "the answers' rounding, not a target outside the one-layer class. Ask a float64 server. "
        f"(The step said: {err})"
    ),
    one_token=True,
)


#: ``A w_o`` is taken as 0 when ``||A w_o||_inf`` is below this times the largest answer to the
#: queries ``[+-e_j^T]`` (``learn_one_layer``'s default ``zero_tol``; the multi-head learner's rule).
ZERO_TOL = 1e-10


def _no_linear_part(ffn, d, zero_tol) -> bool:
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


def _checks_clause(ffn, checked, ffn_options) -> str:
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
        coarser rounding, stated or measured after the refusal with 24 queries.)
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

    ffn = learn_ffn(oracle, signs=signs, milp_time_limit=milp_time_limit, seed=seed, **ffn_options)
    n_ffn = oracle.n_queries - start
    b = ffn.v
    if _no_linear_part(ffn, d, zero_tol):
        raise NotIdentifiableError(
            "A w_o = 0: the antisymmetrised oracle VQ(X) - VQ(-X) = alpha(X, W)^T X A w_o is "
            "identically 0, so these queries reveal nothing about W (§4.1 needs A* w_o* != 0). "
            "The FFN part was extracted; W is not identifiable this way."
        )
    anti = AntisymmetrisedOracle(oracle)
    try:
        head = learn_single_head(anti, verify=0)  # the whole model is verified below
    except NotIdentifiableError as exc:
        raise NotIdentifiableError(
            f"the antisymmetrised oracle read A w_o = 0, so W is not identifiable from it (§4.1). ({exc})"
        ) from None
    n_att = oracle.n_queries - start - n_ffn
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
    clause = _checks_clause(ffn, checked, ffn_options)
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
    from .oracles import measure_one_token_precision, stated_precision

    u = stated_precision(oracle)
    if u is None:
        u = measure_one_token_precision(oracle, n=FFN_BLAME_QUERIES // 2, seed=seed)["u"]
    if u > _COARSE_FACTOR * FLOAT64_U:
        return  # rounded answers: the rounding diagnosis (names_rounding) speaks instead
    d = ffn.A.shape[0]
    X = np.random.default_rng(seed).standard_normal((FFN_BLAME_QUERIES, d)) / np.sqrt(d)
    y = np.asarray(oracle(X[:, None, :]), dtype=np.float64)
    y_hat = np.maximum(X @ ffn.A, 0.0) @ ffn.w_o
    rel = float(np.max(np.abs(y_hat - y))) / max(float(np.max(np.abs(y))), _TINY)
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
    ``-log2(max |TF_hat - TF| / max |TF|)`` (Carlini et al.'s measure), ``inf`` on exact agreement.
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


# --------------------------------------------------------------------------------------------
# Several heads: TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)
# --------------------------------------------------------------------------------------------


def _pooled(X, Ws):
    """``alpha(X, W_h)^T X`` for every head: shape (H, B, d) for a batch ``X`` of shape (B, N, d)."""
    return np.stack([np.einsum("bn,bnd->bd", attention_weights(X, W), X) for W in Ws])


@dataclass(frozen=True, eq=False)
class MultiHeadTransformer(SequenceModel):
    """A one-layer Transformer with ``H`` heads and a bias-free ReLU FFN, in merged form.

    ``TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)``: head ``h`` pools the tokens with its
    softmax weights, and its value-output-FFN matrix ``B_h`` maps the pooled token to the FFN's
    ``m`` pre-activations. No bias, residual or LayerNorm (the setting of §4.1 with several heads).

    Parameters
    ----------
    Ws : array-like of shape (H, d, d)
        Merged query-key matrices ``K_h^T Q_h``.
    Bs : array-like of shape (H, d, m)
        Merged matrices ``V_h^T O_h^T W_1^T`` (``O_h`` the head's block of the output projection).
    w_o : array-like of shape (m,)
        Output weights of the FFN.

    Attributes
    ----------
    d, m, n_heads : int
        Input dimension, FFN width, number of heads.
    attention : MultiHead
        ``MultiHead(Ws, Bs @ w_o)``: the sum of heads the antisymmetrised oracle
        ``VQ(X) - VQ(-X)`` sees.
    network : FeedForward
        ``FeedForward(sum_h B_h, w_o)``: what one-token queries see.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf.

    Examples
    --------
    >>> import numpy as np
    >>> tf = MultiHeadTransformer(np.zeros((2, 1, 1)), np.ones((2, 1, 1)), np.array([1.0]))
    >>> tf(np.array([[1.0], [3.0]]))                # both heads pool the mean, 2; ReLU(2 + 2)
    4.0
    """

    Ws: np.ndarray
    Bs: np.ndarray
    w_o: np.ndarray

    def __post_init__(self):
        Ws = as_float_array(self.Ws, "Ws", ndim=3)
        H, d, d2 = Ws.shape
        if d != d2 or H == 0 or d == 0:
            raise InvalidInputError(f"Ws must have shape (H, d, d) with H, d >= 1; got Ws.shape={Ws.shape}.")
        Bs = as_float_array(self.Bs, "Bs", ndim=3, shape=(H, d, None))
        w_o = as_float_array(self.w_o, "w_o", ndim=1, shape=(Bs.shape[2],))
        for name, a in (("Ws", Ws), ("Bs", Bs), ("w_o", w_o)):
            object.__setattr__(self, name, frozen(a))

    @property
    def d(self) -> int:
        return self.Ws.shape[1]

    @property
    def m(self) -> int:
        return self.Bs.shape[2]

    @property
    def n_heads(self) -> int:
        return self.Ws.shape[0]

    @property
    def attention(self) -> MultiHead:
        return MultiHead(self.Ws, self.Bs @ self.w_o)

    @property
    def network(self) -> FeedForward:
        return FeedForward(self.Bs.sum(axis=0), self.w_o)

    def _batch(self, X: np.ndarray) -> np.ndarray:
        z = np.einsum("hbd,hdm->bm", _pooled(X, self.Ws), self.Bs)
        return np.maximum(z, 0.0) @ self.w_o

    def __repr__(self):
        return f"MultiHeadTransformer(n_heads={self.n_heads}, d={self.d}, m={self.m})"


def random_multi_head_transformer(d, n_heads, m, *, seed) -> MultiHeadTransformer:
    """A random multi-head Transformer: the heads of :func:`~companion.multihead.random_multi_head`.

    ``Ws`` are those heads' query-key matrices (entries of variance about 1), ``Bs`` have entries
    ``N(0, 1/d)`` and ``w_o`` entries ``N(0, 1/m)``.

    Parameters
    ----------
    d, n_heads, m : int
        Input dimension, number of heads and FFN width, ``>= 1``.
    seed : int
        Seed of ``numpy.random.default_rng`` (the heads use ``seed`` too).

    Examples
    --------
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> tf.Ws.shape, tf.Bs.shape, tf.w_o.shape
    ((2, 6, 6), (2, 6, 4), (4,))
    """
    from .multihead import random_multi_head

    d = check_int(d, "d", minimum=1)
    H = check_int(n_heads, "n_heads", minimum=1)
    m = check_int(m, "m", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    heads = random_multi_head(d, H, seed=seed)
    rng = np.random.default_rng([seed, 1])
    Bs = rng.standard_normal((H, d, m)) / np.sqrt(d)
    return MultiHeadTransformer(heads.Ws, Bs, rng.standard_normal(m) / np.sqrt(m))


@dataclass(frozen=True, eq=False, repr=False)
class MultiHeadTransformerRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a :class:`MultiHeadTransformer`.

    Adds ``Ws`` (H, d, d), ``Bs`` (H, d, k) and ``w_o`` (k,); ``W`` is ``sum_h W_h`` and ``v`` the
    length-1 network's linear part ``sum_h B_h w_o``.
    """

    Ws: np.ndarray = None  # type: ignore[assignment]
    Bs: np.ndarray = None  # type: ignore[assignment]
    w_o: np.ndarray = None  # type: ignore[assignment]

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    @property
    def model(self) -> MultiHeadTransformer:
        """The recovered Transformer as a model."""
        return MultiHeadTransformer(self.Ws, self.Bs, self.w_o)


def region_anchors(A, *, n_candidates=None, seed=0):
    """Directions whose activation patterns span ``R^k``, each with the largest margin found.

    The FFN's neurons ``a_j`` (unit columns of ``A``) cut ``R^d`` into cones; the pattern of a
    direction ``s`` is the indicator ``1[a_j^T s > 0]``. This draws ``n_candidates`` random unit
    directions (no query) and keeps, in order of decreasing margin ``min_j |a_j^T s|``, each one
    whose pattern is not in the span of those kept, until ``k`` are kept.

    Parameters
    ----------
    A : array-like of shape (d, k)
        Unit-norm neuron directions.
    n_candidates : int, default=None
        Random directions drawn; ``None`` means ``max(4096, 64 k)``.
    seed : int, default=0
        Seed of the draw.

    Returns
    -------
    S : ndarray of shape (k, d)
        The kept directions (unit norm).
    M : ndarray of shape (k, k)
        Their patterns as rows (0 or 1), invertible.
    margins : ndarray of shape (k,)
        ``min_j |a_j^T s|`` of each.

    Raises
    ------
    NotIdentifiableError
        If the drawn directions show fewer than ``k`` independent patterns (at ``d = 1`` there are
        only two, ``s`` and ``-s``): the neurons' parts of the heads cannot be told apart this way.

    Examples
    --------
    >>> S, M, margins = region_anchors(np.eye(3))
    >>> M.shape, round(float(abs(np.linalg.det(M))), 6) > 0
    ((3, 3), True)
    """
    A = as_float_array(A, "A", ndim=2)
    d, k = A.shape
    n = max(4096, 64 * k) if n_candidates is None else check_int(n_candidates, "n_candidates", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    cand = rng.standard_normal((n, d))
    cand /= np.linalg.norm(cand, axis=1)[:, None]
    proj = cand @ A
    margin = np.min(np.abs(proj), axis=1, initial=np.inf)
    patterns = (proj > 0).astype(float)
    kept, basis = [], np.zeros((0, k))  # basis: orthonormal rows spanning the kept patterns
    for i in np.argsort(-margin, kind="stable"):
        if len(kept) == k:
            break
        r = patterns[i] - basis.T @ (basis @ patterns[i])
        norm = float(np.linalg.norm(r))
        if norm > 1e-6:
            kept.append(i)
            basis = np.vstack([basis, r / norm])
    if len(kept) < k:
        raise NotIdentifiableError(
            f"the k={k} neurons' hyperplanes show only {len(kept)} linearly independent activation "
            f"patterns among n_candidates={n} directions in d={d} (need k): the neurons' parts of the "
            "heads' value matrices are not separable by activation regions; more directions may help "
            "if the regions are thin."
        )
    kept = np.asarray(kept)
    return cand[kept], patterns[kept], margin[kept]


#: Put a refusal down to the answers' rounding when they are float32 or coarser.
_names_precision = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its FFN step locates kinks and its "
        "head step fits logistic sums, both from answers exact to float64 rounding, so this "
        f"refusal is the answers' rounding, not the model. (The step said: {err})"
    )
)


@_names_precision
def learn_multi_head_transformer(
    oracle,
    H=None,
    *,
    H_bound=None,
    route="rational",
    margin=100.0,
    signs="auto",
    milp_time_limit=10.0,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
    **ffn_options,
):
    """Recover a one-layer Transformer with several heads and a bias-free ReLU FFN from value queries.

    The target is ``TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)``
    (:class:`MultiHeadTransformer`). This book's own construction (see Notes): the FFN learner on
    one-token queries, a canonical-form learner on the antisymmetrised oracle, then ``H d k``
    queries inside ``k`` activation regions of the FFN, where the model is linear in the ``B_h``.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d``.
    H : int, default=None
        Number of heads of the canonical form (distinct ``W_h`` with ``B_h w_o != 0``), if known.
    H_bound : int, default=None
        A known bound on it instead (route ``"rational"`` only). Exactly one of ``H``, ``H_bound``.
    route : {"rational", "robust"}, default="rational"
        The heads' learner on ``VQ(X) - VQ(-X)``:
        :func:`~companion.multihead.learn_canonical_rational` (the follow-up's count) or
        :func:`~companion.multihead.learn_canonical` (more queries, longer; use it where the
        rational route refuses).
    margin : float, default=100.0
        ``kappa``: region queries are ``R s + Delta`` with ``R = sqrt(kappa / mu)`` (``mu`` the
        direction's smallest ``|a_j^T s|``) and tokens of ``Delta`` of norm about ``1 / R``, so a
        pre-activation moves by about ``1 / kappa`` of its distance to its kink
        (``1 <= kappa <= 1e6``). Larger is safer and loses ``log10 kappa`` digits.
    signs, milp_time_limit
        Passed to :func:`~companion.ffn.learn_ffn`.
    verify : int, default=32
        Fresh random queries (lengths 1 to 8) on which the recovered Transformer is checked, on
        top of the FFN learner's 64 one-token checks; 0 opts out.
    verify_rtol : float, default=1e-6
        Largest accepted disagreement, relative to ``sum_k |w_k| max_i sum_h |x_i^T B_h e_k|``.
    seed : int, default=0
        Seed of the FFN learner, the heads' learner, the regions and the verification.
    **ffn_options
        Passed to :func:`~companion.ffn.learn_ffn` (``refine``, ``max_planes``; ``ffn_verify``
        as its ``verify``).

    Returns
    -------
    MultiHeadTransformerRecovery
        ``Ws`` (H, d, d) of the canonical heads, ``Bs`` (H, d, k) and ``w_o`` (k,) with the FFN
        learner's neurons: ``sum_h B_h`` has the unit-norm columns of
        :func:`~companion.ffn.canonical_form`. ``n_learning_queries`` is
        ``diagnostics["n_queries_ffn"]`` (which includes the FFN learner's own checks,
        ``diagnostics["ffn"]["n_verify_queries"]``, subtracted here)
        ``+ diagnostics["n_queries_heads"] + diagnostics["n_queries_regions"]``; the last is
        ``H d k``. ``n_verify_queries`` counts both the FFN's checks and ``verify``. ``diagnostics`` also holds
        ``n_reused`` (one-token answers the heads' learner got from the FFN's), ``n_heads``,
        ``n_neurons`` (``k``), ``max_len`` (longest query), ``region_margins`` (``mu`` per
        region), ``region_condition`` (largest condition number of a region's ``H d`` x ``H d``
        system), ``value_mismatch`` (largest ``|sum_k B_h e_k w_k - v_h|`` against the heads'
        learner's ``v_h``), ``sum_mismatch`` (largest ``|sum_h B_h - A|`` against the FFN's
        ``A``), ``pattern_slack`` (the smallest ratio of a neuron's distance to its kink to its
        move, over the region queries, by the recovered model; must exceed 1), the two
        learners' diagnostics (``ffn``, ``heads``), ``n_verify_queries``, ``verify_max_error``
        and ``verify_tolerance``.

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option, or ``H`` too large for ``d`` on the rational route.
    BudgetExceededError
        Before the first query if the budget cannot hold the heads' plan (twice
        :func:`~companion.multihead.rational_plan`'s count, a bound the run may not reach, or
        ``2 (d + d^2)`` on the robust route) plus ``H d`` region queries and ``verify``; after the
        FFN step (``k`` known) if it cannot hold the plan less the ``2 d`` reused answers, the
        ``H d k`` region queries and ``verify``.
    NotIdentifiableError
        If ``A w_o = 0`` (the antisymmetrised oracle is 0: ``||A w_o||_inf`` below ``ZERO_TOL``
        times the largest answer to ``[+-e_j^T]``, as :func:`learn_one_layer`'s ``zero_tol``),
        or the neurons show fewer than ``k``
        independent activation patterns (:func:`region_anchors`).
    PrecisionError
        Before the first query if the oracle states a precision of float32 or coarser; or if a
        step refuses and the answers, measured with 24 more queries, are that coarse: the
        rounding is the cause.
    OracleInconsistentError
        If a step refuses (one-token answers not a bias-free ReLU network, antisymmetrised answers
        not ``H`` heads, e.g. more than ``H`` or ``H_bound`` of them), a region query crossed a
        kink (raise ``margin``), or the verification fails (e.g. a head with ``B_h w_o = 0``,
        which the antisymmetrised oracle cannot see; two neurons whose directions
        ``sum_h B_h e_j`` are parallel, which the FFN step merges; a residual connection or
        LayerNorm). A verification failure within what the heads' step's own inconsistency
        (``max_link_error`` of the rational route) can cause through the region solves
        (``region_condition``) is put down to that step's float64 conditioning instead, with
        advice to use ``route="robust"``.

    Notes
    -----
    This book's own construction; the follow-up [2]_ states (abstract only) that its method
    extends to this model without a separate FFN learner, and how is not public. Here:

    1. One-token queries: ``VQ([x^T]) = w_o^T ReLU(A^T x)`` with ``A = sum_h B_h``, a bias-free
       ReLU network; :func:`~companion.ffn.learn_ffn` returns its neurons ``a_j`` (unit norm) and
       ``w_j``. This is the only use of the FFN learner: it tells which activation region a query
       is in, and that region's linear part.
    2. Scores are unchanged by ``X -> -X`` and ``ReLU(z) - ReLU(-z) = z``, so
       ``VQ(X) - VQ(-X) = sum_h alpha(X, W_h)^T X (B_h w_o)``: a sum of heads with value vectors
       ``v_h = B_h w_o``. A canonical-form learner returns the distinct ``W_h``.
    3. Within an activation region with pattern ``S`` (``a_j^T x > 0`` exactly for ``j`` in
       ``S``), ``TF = sum_h p_h(X)^T u_h^S`` with ``p_h(X) = alpha(X, W_h)^T X`` (known, ``W_h``
       known) and ``u_h^S = sum_{j in S} w_j B_h e_j``. A query ``X = R s + Delta`` (every token
       near ``R s``) keeps every pre-activation on the side of ``R s``, and since the weights sum
       to 1, ``TF(X) - w_S^T A_S^T R s = sum_h (alpha(X, W_h)^T Delta)^T u_h^S``: ``H d`` queries
       give ``u^S`` by one linear solve. ``k`` directions whose patterns ``M`` (k x k) are
       independent give ``C_h = [w_j B_h e_j]_j`` from ``U = C M^T``; ``B_h e_j = C_h e_j / w_j``.
       Queries are ``N = H + 1`` tokens long, so that the ``H`` weight vectors
       ``alpha(X, W_h)`` in ``R^N`` can be linearly independent (a choice of this book; the
       ``H d`` x ``H d`` system's conditioning is reported, ``region_condition``). "Keeps every
       pre-activation on the side of ``R s``" is not automatic: a pre-activation's distance to
       its kink is at least ``R mu`` and its move is about ``||B_h e_j|| / R``, so
       ``R = sqrt(kappa / mu)`` keeps it for value matrices of moderate norm, and the
       recovered model is checked afterwards (``pattern_slack``).

    What is identified: the distinct ``W_h`` (step 2 merges equal ones, summing their ``B_h``)
    exactly, and, when the neurons' directions ``sum_h B_h e_j`` are pairwise non-parallel
    (the FFN step would merge parallel ones, whose per-head parts differ), each neuron's
    ``(B_1 e_j, ..., B_H e_j, w_j)`` up to the FFN's symmetries:
    permutation of neurons and ``(B_h e_j, w_j) -> (c B_h e_j, w_j / c)``, ``c > 0`` (fixed here by
    ``||sum_h B_h e_j|| = 1``). A head with ``B_h w_o = 0`` but ``B_h != 0`` is invisible to
    step 2, and the verification refuses such a target. Queries:
    ``Q_FFN + 2 Q_heads - 2 d + H d k`` (the heads' ``d`` one-token antisymmetrised queries
    reuse the FFN's ``2 d`` answers ``[+-e_j^T]``, :class:`ReusedAnswers`), with
    ``Q_heads <= 4 H d^2 - 2 H + 1`` on the rational route, whose longest query is
    ``2 H + 1`` (``H_bound`` in place of ``H`` with a bound; the robust route's are longer).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, "Provably Learning Multi-Head Attention with Queries", arXiv 2608.03294,
       2026 (abstract).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> rec = learn_multi_head_transformer(ValueQueryOracle(tf), H=2)
    >>> rec.n_heads, rec.diagnostics["n_queries_regions"], rec.diagnostics["max_len"]
    (2, 48, 5)
    >>> X = np.random.default_rng(1).standard_normal((20, 4, 6)) / 3
    >>> bool(np.max(np.abs(rec.model(X) - tf(X))) < 1e-8 * np.max(np.abs(tf(X))))
    True
    """
    from .multihead import learn_canonical, learn_canonical_rational, rational_plan

    d = check_exact_oracle(oracle, "learn_multi_head_transformer")
    if (H is None) == (H_bound is None):
        raise InvalidInputError(
            "give exactly one of H (the number of heads) and H_bound (a bound on it); got "
            f"H={H!r}, H_bound={H_bound!r}."
        )
    refuse_stated_rounding(
        oracle,
        "the FFN step locates kinks and the head step fits logistic sums from answers exact to float64 rounding",
    )
    route = check_choice(route, "route", ("rational", "robust"))
    if route == "robust" and H is None:
        raise InvalidInputError("route='robust' needs H (learn_canonical takes no bound); got H=None.")
    H_plan = check_int(H if H is not None else H_bound, "H" if H is not None else "H_bound", minimum=1)
    margin = check_real(margin, "margin", minimum=1.0, maximum=1e6)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if "ffn_verify" in ffn_options:
        ffn_options["verify"] = ffn_options.pop("ffn_verify")
    plan = 2 * rational_plan(d, H_plan)["n_queries"] if route == "rational" else 2 * (d + d * d)
    start = reserve(oracle, plan + H_plan * d + verify, "learn_multi_head_transformer")
    base, oracle = oracle, ReusedAnswers(oracle)

    # 1. The FFN from one-token queries.
    ffn = learn_ffn(oracle, signs=signs, milp_time_limit=milp_time_limit, seed=seed, **ffn_options)
    n_ffn = oracle.n_queries - start
    A, w = ffn.A, ffn.w_o
    k = A.shape[1]
    if _no_linear_part(ffn, d, ZERO_TOL):
        raise NotIdentifiableError(
            "A w_o = 0: the antisymmetrised oracle VQ(X) - VQ(-X) = sum_h alpha(X, W_h)^T X B_h w_o "
            "is identically 0, so it reveals no head (the FFN part was extracted)."
        )
    reserve(base, plan - 2 * d + H_plan * d * k + verify, "learn_multi_head_transformer")

    # 2. The heads from the antisymmetrised oracle.
    anti = AntisymmetrisedOracle(oracle)
    try:
        if route == "rational":
            heads = learn_canonical_rational(anti, H=H, H_bound=H_bound, verify=0, seed=seed)
        else:
            heads = learn_canonical(anti, H=H, verify=0, seed=seed)
    except OracleInconsistentError as err:
        given = f"H={H}" if H is not None else f"H_bound={H_bound}"
        other = (
            " The counts route also refuses where float64 cannot separate the heads (its "
            "conditioning grows with H): try route='robust'."
            if route == "rational"
            else ""
        )
        raise OracleInconsistentError(
            f"the heads' step on VQ(X) - VQ(-X) refused with {given}: a target with more distinct "
            f"heads (W_h with B_h w_o != 0) than that is refused this way too.{other} "
            f"(It said: {err})"
        ) from err
    n_heads_q = oracle.n_queries - start - n_ffn
    Ws = heads.Ws
    Hh = Ws.shape[0]

    # 3. H d queries in each of k activation regions, linear in the u_h^S.
    S, M, mus = region_anchors(A, seed=seed + 2)
    rng = np.random.default_rng([seed, 3])
    N = Hh + 1
    U = np.empty((Hh * d, k))
    cond, regions = 0.0, []
    for p in range(k):
        R = np.sqrt(margin / mus[p])
        D = rng.standard_normal((Hh * d, N, d)) / (np.sqrt(d) * R)
        X = R * S[p] + D
        on = M[p] > 0
        y = np.asarray(oracle(X), dtype=np.float64) - R * (S[p] @ A[:, on]) @ w[on]
        # sum_h alpha(X, W_h)^T Delta: the weights of X (Delta's would differ) pool Delta
        Phi = np.concatenate([np.einsum("bn,bnd->bd", attention_weights(X, W), D) for W in Ws], axis=1)
        cond = max(cond, float(np.linalg.cond(Phi)))
        U[:, p] = np.linalg.solve(Phi, y)
        regions.append((R, X))
    n_regions = oracle.n_queries - start - n_ffn - n_heads_q
    C = np.linalg.solve(M, U.T).T.reshape(Hh, d, k)  # U = C M^T
    Bs = C / w
    # Every region query must sit on its region's side of every kink, by the recovered model.
    slack = np.inf
    for p, (R, X) in enumerate(regions):
        z0 = R * (S[p] @ A)
        move = np.einsum("hbd,hdm->bm", _pooled(X, Ws), Bs) - z0
        slack = min(slack, float(np.min(np.abs(z0) / np.maximum(np.max(np.abs(move), axis=0), _TINY))))
    if not slack > 1.0:
        raise OracleInconsistentError(
            f"a region query crossed a kink by the recovered model (pattern_slack={slack:.3g} <= 1): "
            f"either the value matrices are larger than margin={margin:g} allows for (raise margin), or "
            "the region fits missed a head, as one with B_h w_o = 0 (invisible to VQ(X) - VQ(-X)) is "
            "missed, or the oracle is not a multi-head Transformer with a bias-free ReLU FFN."
        )
    diagnostics = {
        "n_queries_ffn": n_ffn,
        "n_queries_heads": n_heads_q,
        "n_queries_regions": n_regions,
        "n_reused": oracle.n_reused,
        "n_heads": Hh,
        "n_neurons": k,
        "max_len": int(max(N, heads.diagnostics.get("max_len", 2))),
        "region_margins": mus,
        "region_condition": cond,
        "value_mismatch": float(np.max(np.abs(np.einsum("hdk,k->hd", Bs, w) - heads.vs))),
        "sum_mismatch": float(np.max(np.abs(Bs.sum(axis=0) - A))),
        "pattern_slack": slack,
        "ffn": dict(ffn.diagnostics),
        "heads": dict(heads.diagnostics),
    }
    model = MultiHeadTransformer(Ws, Bs, w)
    absw = np.abs(w)
    try:
        checked = verify_outputs(
            oracle,
            model,
            lambda x: float(absw @ np.max(np.sum(np.abs(x @ Bs), axis=0), axis=0)),
            verify,
            rtol=verify_rtol,
            seed=seed + 1,
            what=(
                "a one-layer Transformer w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h) with every head "
                "visible (B_h w_o != 0), no two neurons' directions sum_h B_h e_j parallel (the FFN "
                "step merges them), and no bias, residual or LayerNorm"
            ),
        )
    except OracleInconsistentError as err:
        # The heads' own inconsistency, carried through the region solves (condition number
        # region_condition), bounds what the heads' step alone can cost, to first order.
        link = float(heads.diagnostics.get("max_link_error", 0.0))
        found = getattr(err, "max_error", np.inf)
        if found <= link * cond:
            raise OracleInconsistentError(
                f"verification failed by {found:.3g} (verify_rtol={verify_rtol:g}), within what the "
                f"heads' step's own inconsistency (max_link_error={link:.2g}) can cause through the "
                f"region solves (region_condition={cond:.2g}, product {link * cond:.2g}): float64 "
                f"conditioning of the {route} route at H={Hh}, not the model, is the likelier cause; "
                "use route='robust', or a larger verify_rtol."
            ) from err
        raise
    clause = _checks_clause(ffn, checked, ffn_options)
    checked["n_verify_queries"] += int(ffn.diagnostics["n_verify_queries"])
    message = (
        f"FFN: {k} neurons from {n_ffn} one-token queries; heads: {Hh} from the antisymmetrised oracle "
        f"({route} route, {n_heads_q} queries, {oracle.n_reused} answers reused); value matrices: "
        f"{n_regions} queries in {k} activation regions (H d k = {Hh * d * k})"
    )
    return build(
        MultiHeadTransformerRecovery,
        oracle,
        start,
        verification=checked,
        verified=clause,
        message=message,
        diagnostics=diagnostics,
        W=Ws.sum(axis=0),
        v=ffn.v,
        Ws=Ws,
        Bs=Bs,
        w_o=w,
    )


class ServedMultiHeadTransformer(SequenceModel):
    """A :class:`MultiHeadTransformer` served in float32: weights, tokens and every operation.

    Its oracle states ``precision = unit_roundoff("float32")`` when built with
    ``ValueQueryOracle(served, precision=served.precision)``.

    Examples
    --------
    >>> import numpy as np
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> X = np.random.default_rng(1).standard_normal((5, 3, 6))
    >>> gap = np.max(np.abs(ServedMultiHeadTransformer(tf)(X) - tf(X))) / np.max(np.abs(tf(X)))
    >>> bool(1e-9 < gap < 1e-5)
    True
    """

    fmt = "float32"

    def __init__(self, model):
        if not isinstance(model, MultiHeadTransformer):
            raise InvalidInputError(f"model must be a MultiHeadTransformer; got {type(model).__name__}.")
        from .oracles import unit_roundoff

        self.model, self.d = model, model.d
        self.precision = unit_roundoff("float32")
        self._Ws, self._Bs = model.Ws.astype(np.float32), model.Bs.astype(np.float32)
        self._w = model.w_o.astype(np.float32)

    def _batch(self, X: np.ndarray) -> np.ndarray:
        X = X.astype(np.float32)
        z = np.zeros((X.shape[0], self._w.size), dtype=np.float32)
        for W, B in zip(self._Ws, self._Bs):
            s = np.einsum("bnd,bd->bn", X, X[:, -1] @ W.T)
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            z += np.einsum("bn,bnd->bd", a, X) @ B
        return (np.maximum(z, np.float32(0)) @ self._w).astype(np.float64)


def evaluate_multi_head(rec, target, *, n=1000, seed=0) -> dict:
    """Errors of a :class:`MultiHeadTransformerRecovery` against its target (evaluation only).

    Heads are matched by :func:`~companion.multihead.match_heads` on ``(W_h, B_h w_o)``, neurons by
    the direction of ``sum_h B_h e_j``; each target neuron is rescaled to the recovered one's
    normalisation (``||sum_h B_h e_j|| = 1``) before comparing.

    Returns
    -------
    dict
        ``n_heads``, ``n_neurons`` (recovered), ``W_error`` (largest relative Frobenius error of a
        matched ``W_h``), ``B_error`` (largest ``|B_hat_h e_j - B_h e_j / c_j|``), ``w_error``
        (largest relative error of ``w_j c_j``), ``output_gap`` (largest ``|TF_hat - TF| / max |TF|``
        on ``n`` random queries of lengths 1 to 8, tokens ``N(0, I_d / d)``, drawn with ``seed``)
        and ``matched`` (every head and neuron matched).
    """
    from scipy.optimize import linear_sum_assignment

    from .multihead import match_heads

    heads = match_heads(target.attention, rec.model.attention)
    A_t = target.Bs.sum(axis=0)
    c = np.linalg.norm(A_t, axis=0)
    A_hat = rec.Bs.sum(axis=0)
    cost = -np.abs((A_t / c).T @ A_hat)
    rows, cols = linear_sum_assignment(cost)
    pairs = heads["pairs"]
    B_err = max(float(np.max(np.abs(rec.Bs[e][:, cols] - target.Bs[r][:, rows] / c[rows]))) for r, e in pairs)
    w_t = target.w_o[rows] * c[rows]
    W_err = max(float(np.linalg.norm(rec.Ws[e] - target.Ws[r]) / np.linalg.norm(target.Ws[r])) for r, e in pairs)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    lengths = rng.integers(1, 9, size=check_int(n, "n", minimum=1))
    X = [rng.standard_normal((int(n), target.d)) / np.sqrt(target.d) for n in lengths]
    y = target(X)
    return {
        "n_heads": rec.n_heads,
        "n_neurons": int(rec.w_o.size),
        "W_error": W_err,
        "B_error": B_err,
        "w_error": float(np.max(np.abs(rec.w_o[cols] - w_t) / np.abs(w_t))),
        "output_gap": float(np.max(np.abs(rec.model(X) - y)) / np.max(np.abs(y))),
        "matched": bool(len(pairs) == target.n_heads == rec.n_heads and rows.size == target.m == rec.w_o.size),
    }


# --------------------------------------------------------------------------------------------
# One-layer Transformers with a biased ReLU FFN (OPT-style): this book's own reduction


@dataclass(frozen=True, eq=False)
class BiasedOneLayerTransformer(SequenceModel):
    """A one-layer Transformer whose ReLU FFN has biases in both layers (OPT-style), merged form.

    ``TF(X) = w_o^T ReLU(A^T h(X) + b1) + b2`` with ``h(X) = alpha(X, W)^T X`` (shape (d,)), the
    softmax weights of the last token ``alpha(X, W) = softmax(x_i^T W x_N)``.

    Parameters
    ----------
    W : array-like of shape (d, d)
        Merged query-key matrix ``K^T Q``.
    A : array-like of shape (d, m)
        Merged value-FFN matrix ``V^T W_1^T``: column ``i`` is hidden neuron ``i``'s direction.
    b1 : array-like of shape (m,)
        First FFN layer's bias.
    w_o : array-like of shape (m,)
        Second FFN layer's weights.
    b2 : float
        Second FFN layer's bias.

    Attributes
    ----------
    d, m : int
        Input dimension and FFN width.
    network : ReLUNetwork
        The FFN ``x -> w_o^T ReLU(A^T x + b1) + b2``: the block's answer to one-token queries.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf.

    Notes
    -----
    §4.1 of [1]_ takes a bias-free FFN; this model adds the biases of OPT's FFN (Zhang et al.
    2022 [2]_), keeping §4.1's single head, no residual connection and no LayerNorm.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] S. Zhang et al., "OPT: Open Pre-trained Transformer Language Models", arXiv:2205.01068, 2022.

    Examples
    --------
    >>> import numpy as np
    >>> tf = BiasedOneLayerTransformer(np.zeros((2, 2)), np.eye(2), [0.5, -1.0], [1.0, -1.0], 0.25)
    >>> tf(np.array([[4.0, 0.0], [0.0, 2.0]]))   # h = (2, 1): ReLU(2.5) - ReLU(0) + 0.25
    2.75
    """

    W: np.ndarray
    A: np.ndarray
    b1: np.ndarray
    w_o: np.ndarray
    b2: float = 0.0

    def __post_init__(self):
        W = as_float_array(self.W, "W", ndim=2)
        if W.shape[0] != W.shape[1] or W.shape[0] == 0:
            raise InvalidInputError(f"W must be square (d, d) with d >= 1; got W.shape={W.shape}.")
        d = W.shape[0]
        A = as_float_array(self.A, "A", ndim=2, shape=(d, None))
        if A.shape[1] == 0:
            raise InvalidInputError("A must have at least one column (one hidden neuron).")
        b1 = as_float_array(self.b1, "b1", ndim=1, shape=(A.shape[1],))
        w_o = as_float_array(self.w_o, "w_o", ndim=1, shape=(A.shape[1],))
        b2 = float(as_float_array(np.atleast_1d(np.asarray(self.b2, dtype=np.float64)), "b2", ndim=1, shape=(1,))[0])
        for name, a in (("W", W), ("A", A), ("b1", b1), ("w_o", w_o)):
            object.__setattr__(self, name, frozen(a))
        object.__setattr__(self, "b2", b2)

    @property
    def d(self) -> int:
        return self.W.shape[0]

    @property
    def m(self) -> int:
        return self.A.shape[1]

    @property
    def network(self) -> ReLUNetwork:
        return ReLUNetwork([self.A, self.w_o], [self.b1, self.b2])

    def _batch(self, X: np.ndarray) -> np.ndarray:
        h = np.einsum("bn,bnd->bd", attention_weights(X, self.W), X)
        return np.maximum(h @ self.A + self.b1, 0.0) @ self.w_o + self.b2

    def __repr__(self):
        return f"BiasedOneLayerTransformer(d={self.d}, m={self.m})"


def random_biased_one_layer(d, m, *, bias_scale=0.5, seed) -> BiasedOneLayerTransformer:
    """A random biased one-layer Transformer from Gaussian native parameters.

    As :func:`random_one_layer` (``W = K^T Q`` with entries of variance 1, ``V`` and ``W1`` with
    entries ``N(0, 1/d)``, ``w2`` with entries ``N(0, 1/m)``), plus biases ``b1`` (m,) and ``b2``
    with entries ``N(0, bias_scale^2)``.

    Parameters
    ----------
    d, m : int
        Input dimension and FFN width, ``>= 1``.
    bias_scale : float, default=0.5
        Standard deviation of the biases.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    BiasedOneLayerTransformer

    Examples
    --------
    >>> tf = random_biased_one_layer(4, 3, seed=0)
    >>> tf.d, tf.m, tf.b1.shape
    (4, 3, (3,))
    """
    d = check_int(d, "d", minimum=1)
    m = check_int(m, "m", minimum=1)
    bias_scale = check_real(bias_scale, "bias_scale", minimum=0.0)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    Q = rng.standard_normal((d, d))
    K = rng.standard_normal((d, d)) / np.sqrt(d)
    V = rng.standard_normal((d, d)) / np.sqrt(d)
    W1 = rng.standard_normal((m, d)) / np.sqrt(d)
    w2 = rng.standard_normal(m) / np.sqrt(m)
    b1 = bias_scale * rng.standard_normal(m)
    b2 = bias_scale * float(rng.standard_normal())
    return BiasedOneLayerTransformer(K.T @ Q, V.T @ W1.T, b1, w2, b2)


@dataclass(frozen=True, eq=False, repr=False)
class BiasedTransformerRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a biased one-layer Transformer.

    Adds ``A`` (d, m), ``b1`` (m,), ``w_o`` (m,) and ``b2`` (a float): the FFN in
    :func:`~companion.ffn.learn_relu_network`'s canonical form (each neuron's ``(a_i, b_{1,i})`` of
    unit norm); ``W`` (d, d) is the attention matrix and ``v = A D w_o`` the FFN's gradient at 0,
    ``D = diag(b_{1,i} > 0)``.
    """

    A: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    b1: np.ndarray = None  # type: ignore[assignment]
    w_o: np.ndarray = None  # type: ignore[assignment]
    b2: float = 0.0

    @property
    def model(self) -> BiasedOneLayerTransformer:
        """The recovered Transformer as a model."""
        return BiasedOneLayerTransformer(self.W, self.A, self.b1, self.w_o, self.b2)


#: The segments the biased learner reads ``W`` on stay inside this fraction of the region around 0
#: where no neuron changes state (``learn_one_layer_biased``'s default ``margin``).
BIASED_MARGIN = 0.5


def _unit_direction_basis(g):
    """An orthonormal basis ``Q`` (columns) with ``q_j^T g = ||g|| / sqrt(d)`` for every ``j``.

    The Householder reflection that maps ``1 / sqrt(d)`` to ``g / ||g||`` (symmetric, so
    ``q_j^T g = (Q g)_j``).
    """
    d = g.shape[0]
    u = np.full(d, 1.0 / np.sqrt(d))
    w = u - g / np.linalg.norm(g)
    nw = np.linalg.norm(w)
    if nw < 1e-12:  # g is already along (1, ..., 1): the standard basis does
        return np.eye(d)
    w = w / nw
    return np.eye(d) - 2.0 * np.outer(w, w)


#: The biased learner's second pass puts its query tokens at norm ``sqrt(LOGIT_SCALE / ||W||_2)``
#: (``||W||_2`` from the first pass), where the logits it reads are at most about ``LOGIT_SCALE``.
LOGIT_SCALE = 2.0

#: The second pass's token norm is at most this times the largest distance ``|b_{1,i}| / ||a_i||``
#: of a kink from 0 (a ``W`` read as 0, or tiny, would otherwise send the tokens to overflow).
MAX_SCALE = 1e4

#: A first pass away from 0 shrinks its steps when a ``t`` is this close to 0 or 1 (saturated).
SATURATED = 1e-6

#: Tries of that first pass, each with steps ``1 / 16`` of the last.
FAR_TRIES = 8

#: Random candidate directions the second pass scores for each query token.
FAR_CANDIDATES = 64


def _steps(A, b1, x, D):
    """For each direction ``D[j]`` (rows), the largest ``s >= 0`` with no neuron changing state on
    ``[x, x + s D[j]]`` (inf if none does)."""
    z = x @ A + b1  # (m,)
    rate = D @ A  # (n, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = -z[None, :] / rate
    lam = np.where((lam > 0) & np.isfinite(lam), lam, np.inf)
    return lam.min(axis=1)


def _far_tokens(A, b1, w_o, R, margin, seed, cap=None):
    """Query tokens ``x_k`` (rows, norm ``R``, linearly independent), each with a basis ``Q_k`` along which its
    region's gradient has equal components, and signed steps ``S[j, k]`` that stay in its region.

    Each ``x_k`` is the best of ``4 FAR_CANDIDATES`` random directions, half orthogonal to the
    earlier tokens (scored by ``o min_j s_jk**2 ||g_k||``: ``min_j s_jk**2 ||g_k||`` the inverse of
    the logit's relative error, ``o >= 1/4`` the fraction of ``x_k`` outside the earlier tokens'
    span, which keeps ``X`` well conditioned). Steps
    are at most ``cap`` (default ``R``).
    """
    d = A.shape[0]
    cap = R if cap is None else cap
    rng = np.random.default_rng([seed, 37])
    X = np.zeros((d, d))
    Qs, S = [], np.zeros((d, d))
    for k in range(d):
        C = rng.standard_normal((2 * FAR_CANDIDATES, d))
        if k:  # half orthogonal to the earlier tokens, half free (a flat complement has no slope)
            C[:FAR_CANDIDATES] -= (C[:FAR_CANDIDATES] @ X[:k].T) @ np.linalg.pinv(X[:k].T)
        C *= R / np.linalg.norm(C, axis=1, keepdims=True)
        C = np.concatenate([C, -C])
        if k:
            Qx = np.linalg.qr(X[:k].T)[0]
            orth = np.linalg.norm(C - (C @ Qx) @ Qx.T, axis=1) / R
        else:
            orth = np.ones(len(C))
        best = None
        for c, o in zip(C, orth):
            if o < 0.25:
                continue
            act = c @ A + b1 > 0
            g = A[:, act] @ w_o[act]
            ng = float(np.linalg.norm(g))
            if ng == 0.0:
                continue
            Qk = _unit_direction_basis(g)
            up, down = _steps(A, b1, c, Qk.T), _steps(A, b1, c, -Qk.T)
            step = np.where(up >= down, np.minimum(up * margin, cap), -np.minimum(down * margin, cap))
            score = float(np.min(step**2)) * ng * o
            if best is None or score > best[0]:
                best = (score, c, Qk, step)
        if best is None:
            raise NotIdentifiableError(
                "the extracted FFN is flat (A D w_o = 0) on every candidate region at scale "
                f"{R:.2e}: the two-token answers there do not depend on W."
            )
        _, X[k], Qk, S[:, k] = best
        Qs.append(Qk)
    return X, Qs, S


def _read_W(oracle, X, Qs, S, strict=True):
    """``W`` from ``d + 2 d**2`` queries: ``[x_k]``, ``[u_jk]`` and ``[u_jk; x_k]``, ``u_jk = x_k + S[j, k] q_j^(k)``.

    On each segment no neuron changes state, so ``t = (TF([u; x]) - TF([x])) / (TF([u]) - TF([x]))``
    and ``logit(t) = (u - x)^T W x = S[j, k] (Q_k^T W x_k)_j``. With ``strict=False``, a ``t``
    within ``SATURATED`` of 0 or 1 (a saturated softmax) returns None instead.
    """
    d = X.shape[0]
    U = np.stack([X[k][None, :] + S[:, k][:, None] * Qs[k].T for k in range(d)], axis=1)  # U[j, k]
    f_x = np.asarray(oracle(X[:, None, :]), dtype=np.float64)
    f_u = np.asarray(oracle(U.reshape(d * d, 1, d)), dtype=np.float64).reshape(d, d)
    pairs = np.stack([U.reshape(d * d, d), np.tile(X, (d, 1))], axis=1)  # [u_jk; x_k]
    y = np.asarray(oracle(pairs), dtype=np.float64).reshape(d, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (y - f_x[None, :]) / (f_u - f_x[None, :])
    near = (t > -SATURATED) & (t < 1 + SATURATED)  # a saturated t may round just past 0 or 1
    if not strict and np.all(near) and not np.all((t > SATURATED) & (t < 1 - SATURATED)):
        return None
    if not np.all((t > 0) & (t < 1)):
        raise OracleInconsistentError(
            "a two-token answer TF([u; x]) is not strictly between TF([x]) and TF([u]), as it is for "
            "a softmax head feeding the extracted FFN on a segment where no neuron changes state: the "
            "target is not a biased one-layer Transformer (one head, no residual or LayerNorm)."
        )
    C = (np.log(t) - np.log1p(-t)) / S  # C[j, k] = (Q_k^T W x_k)_j
    WX = np.stack([Qs[k] @ C[:, k] for k in range(d)], axis=1)  # column k: W x_k
    return np.linalg.solve(X, WX.T).T  # W X^T = WX with X's rows the x_k


def learn_one_layer_biased(
    oracle,
    *,
    m=None,
    margin=BIASED_MARGIN,
    zero_tol=ZERO_TOL,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-8,
    seed=0,
    **ffn_options,
):
    """Recover ``(W, A, b1, w_o, b2)`` of a one-layer Transformer with a biased ReLU FFN (this book's own).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for ``TF(X) = w_o^T ReLU(A^T alpha(X, W)^T X + b1) + b2``
        (:class:`BiasedOneLayerTransformer`) with ``d = oracle.d``. It must answer sequences of
        length 1 and 2.
    m : int, optional
        The FFN width; None detects it (:func:`~companion.ffn.learn_relu_network`, which needs
        ``m <= d``).
    margin : float, default=0.5
        The segments ``W`` is read on stay inside this fraction (in ``(0, 1)``) of the region
        around 0 where no neuron of the extracted FFN changes state.
    zero_tol : float, default=1e-10
        A first-layer bias below ``zero_tol`` of its neuron's ``(a_i, b_{1,i})`` norm, or the FFN's
        gradient at 0, ``A D w_o``, below ``zero_tol`` times ``sum_{i active} |w_{o,i}|``, sends
        the first pass away from 0 (see Notes).
    verify : int, default=32
        Fresh random queries (lengths 1 to 8, never used for learning) on which the recovered
        block is compared with the oracle; 0 opts out. This is on top of the FFN learner's own
        one-token checks (``ffn_verify``, 256 by default).
    verify_rtol : float, default=1e-8
        Largest accepted disagreement, relative to
        ``sum_i |w_{o,i}| (max_n |x_n^T a_i| + |b_{1,i}|) + |b2|``.
    seed : int, default=0
        Seed of the FFN learner's lines and checks, and of the verification queries.
    **ffn_options
        Passed to :func:`~companion.ffn.learn_relu_network` (``n_lines``, ``span``, ...); its
        ``verify`` is passed as ``ffn_verify``.

    Returns
    -------
    BiasedTransformerRecovery
        ``W`` (d, d); ``A`` (d, m), ``b1`` (m,), ``w_o`` (m,), ``b2`` in the canonical form of
        :func:`~companion.ffn.learn_relu_network` (each neuron's ``(a_i, b_{1,i})`` of unit norm,
        the scale moved into ``w_o``); ``v = A D w_o``. ``n_queries`` is read from the oracle and
        equals ``diagnostics["n_queries_ffn"] + diagnostics["n_queries_attention"] + verify``:
        the FFN part including its own checks, the attention part ``2 (2 d**2 + d)`` (two
        passes; ``d + 2 d**2`` more for each retry of a first pass away from 0), and the whole
        block's check. ``diagnostics``:
        ``n_queries_ffn``, ``n_queries_attention``, ``first_pass`` ("around 0" or "far"),
        ``radius`` (the first pass's step scale ``r``), ``scale`` (the second pass's token norm ``R``), ``min_step``
        (its shortest segment), ``n_active`` (neurons active at 0), ``ffn`` (the FFN
        learner's diagnostics), ``n_verify_queries`` (the FFN's checks and the block's),
        ``verify_max_error`` and ``verify_tolerance`` (the block's check).

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option.
    PrecisionError
        Before any query, if the oracle states answers rounded to float32 or coarser. (Unstated
        float32 answers are refused by the FFN step as not piecewise linear, after its kink search
        spends its query limit.)
    BudgetExceededError
        If the oracle's budget cannot pay the attention step's ``2 (2 d**2 + d)`` queries and the
        check, before the first query.
    NotIdentifiableError
        If no candidate token of a pass lies in a region where the extracted FFN has a slope
        (``A D_x w_o != 0``): the two-token answers there do not depend on ``W``. Also
        :func:`~companion.ffn.learn_relu_network`'s refusals (a neuron not met, widths that grow).
    OracleInconsistentError
        If the one-token answers are not a ReLU network with one hidden layer, a two-token answer
        is not strictly between the two one-token answers it combines, the answers of a first
        pass away from 0 stay saturated for ``FAR_TRIES`` step sizes, or the recovered block
        disagrees with the oracle on the fresh queries.

    Notes
    -----
    **This book's own reduction.** §4.1 of [1]_ antisymmetrises, ``VQ(X) - VQ(-X)``, which
    needs ``ReLU(z) - ReLU(-z) = z`` and so a bias-free FFN. With biases, write
    ``f(x) = w_o^T ReLU(A^T x + b1) + b2`` for the FFN: on one-token queries ``TF([x^T]) = f(x)``
    (the softmax weight is 1), a ReLU network with biases, which
    :func:`~companion.ffn.learn_relu_network` extracts. On a two-token query ``[u^T; x^T]``
    (query token ``x`` last) the attention output is ``h = x + t (u - x)`` with
    ``t = sigmoid((u - x)^T W x)``, so ``TF = f(x + t (u - x))``. If no neuron changes state
    between ``x`` and ``u`` (both ends in one linear region of ``f``, which the extracted FFN
    tells), ``f`` is affine on the segment and

    ``t = (TF([u^T; x^T]) - TF([x^T])) / (TF([u^T]) - TF([x^T]))``,   ``logit(t) = (u - x)^T W x``,

    read from three answers of the oracle, not from the extracted FFN. If every ``b_{1,i} != 0``,
    0 lies inside the region ``|a_i^T x| < |b_{1,i}|`` of all neurons, where
    ``grad f = g = A D w_o``, ``D = diag(b_{1,i} > 0)``. Take the orthonormal basis ``q_j`` with
    ``q_j^T g = ||g|| / sqrt(d)`` (a Householder reflection, so no denominator is small), the
    query tokens ``x_k = r q_k`` and context tokens ``u_{jk} = r (q_k + q_j)``, with ``r`` the
    ``margin`` times the largest scale at which all ``d + d**2`` tokens stay in the region.
    Then ``logit(t_{jk}) = r**2 q_j^T W q_k``: ``W = Q M Q^T`` with ``M_{jk} = logit(t_{jk}) / r**2``,
    from ``d + 2 d**2`` queries (``d`` one-token ``[x_k]``, ``d**2`` one-token ``[u_{jk}]`` and
    ``d**2`` two-token). Its conditions, every ``b_{1,i} != 0`` and ``A D w_o != 0``, are the
    bias-case analogue of the paper's ``A* w_o* != 0``. When they fail (a kink through 0, every
    ``b_{1,i} < 0`` so that ``f`` is flat near 0, a bias-free FFN), the first pass is made as
    the second below, on tokens of norm ``max(2 max_i |b_{1,i}| / ||a_i||, 1)`` with steps of at
    most that norm, divided by 16 (up to ``FAR_TRIES`` times) while a ``t`` is within
    ``SATURATED`` of 0 or 1.

    That first pass is exact but for rounding, which it amplifies by about ``1 / r**3`` (the
    logits are ``r**2`` small, the slopes ``r`` small), and ``r`` is set by the smallest
    ``|b_{1,i}|``: 1e-8 relative error in ``W`` at ``r`` of 4e-3. So a second pass reads ``W``
    again with the same identity on segments far from every kink: query tokens ``x_k`` of norm
    ``R = sqrt(LOGIT_SCALE / ||W_0||_2)`` (``W_0`` the first pass's, so that the logits are
    ``O(1)``; at most ``MAX_SCALE`` times the farthest kink's distance from 0; and, after a first
    pass away from 0, at least twice it, with steps at most ``LOGIT_SCALE / (||W_0||_2 R)``),
    each the best of ``4 FAR_CANDIDATES`` random directions (half orthogonal to the earlier
    tokens, and none less than 1/4 outside their span) for the length
    of the segments ``[x_k, x_k + s_{jk} q_j^(k)]`` that stay in its linear region (found from the
    extracted FFN, ``margin`` of the way to the first kink, at most ``R``) and the slope
    ``||g_k||`` of that region (``q_j^(k)`` the equal-component basis of its gradient ``g_k``).
    Then ``logit(t_{jk}) = s_{jk} (Q_k^T W x_k)_j`` gives ``W x_k`` and ``W`` solves
    ``W X^T = [W x_1 ... W x_d]``. Another ``d + 2 d**2`` queries. Measured on random blocks: the
    first pass alone left 1e-12..2e-8 relative error in ``W`` (d = 6..12, m = 4..12, seeds 0-3);
    with the second, 20 draws each of (d, m) = (10, 8) and (16, 16) were all recovered, ``W`` to
    at most 3.3e-14 and 1.7e-13 (medians 1.6e-14, 6.1e-14). With the first pass away from 0, on
    10 draws of (10, 8) each: every bias negative, ``W`` to at most 1e-13; one bias 0, 1e-13;
    bias-free, 5e-14; every bias negative and ``30 W``, 3e-12.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> tf = random_biased_one_layer(10, 8, seed=0)
    >>> rec = learn_one_layer_biased(ValueQueryOracle(tf))
    >>> rec.diagnostics["n_queries_attention"]                  # 2 (2 d^2 + d)
    420
    >>> bool(np.linalg.norm(rec.W - tf.W) < 1e-12 * np.linalg.norm(tf.W))
    True
    """
    d = check_exact_oracle(oracle, "learn_one_layer_biased")
    m = None if m is None else check_int(m, "m", minimum=1, maximum=d)
    margin = check_real(margin, "margin", minimum=0.0, strict=True)
    if margin >= 1.0:
        raise InvalidInputError(f"margin must be in (0, 1); got {margin}.")
    zero_tol = check_real(zero_tol, "zero_tol", minimum=0.0)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    if "ffn_verify" in ffn_options:
        ffn_options["verify"] = ffn_options.pop("ffn_verify")
    refuse_stated_rounding(
        oracle,
        "learn_one_layer_biased locates the FFN's kinks and reads logits from differences of answers, "
        "both exact to float64 rounding",
        what="block",
    )
    n_att = 2 * (2 * d * d + d)
    start = reserve(oracle, n_att + verify, "learn_one_layer_biased")

    net_rec = learn_relu_network(oracle, widths=None if m is None else (m,), seed=seed, **ffn_options)
    n_ffn = oracle.n_queries - start
    net = net_rec.network
    if len(net.widths) != 1:
        raise OracleInconsistentError(
            f"the one-token answers are a ReLU network with {len(net.widths)} hidden layers "
            f"(widths {net.widths}); a biased one-layer Transformer's FFN has one."
        )
    A, b1 = net.weights[0], net.biases[0]
    w_o, b2 = net.weights[1][:, 0], float(net.biases[1][0])
    scale = np.hypot(np.linalg.norm(A, axis=0), np.abs(b1))
    rel_b = np.abs(b1) / scale
    kinks = float(np.max(np.abs(b1) / np.maximum(np.linalg.norm(A, axis=0), _TINY)))
    active = b1 > 0
    g = A[:, active] @ w_o[active]
    around_0 = bool(
        np.min(rel_b) > zero_tol and np.any(active) and np.linalg.norm(g) > zero_tol * np.sum(np.abs(w_o[active]))
    )
    if around_0:
        # pass 1, around 0: x_k = r q_k, u_jk = r (q_k + q_j), so u_jk - x_k = r q_j
        Q = _unit_direction_basis(g)
        P = A.T @ Q  # (m, d): a_i^T q_k
        ends = np.abs(P[:, :, None] + P[:, None, :]).max(axis=(1, 2))  # max_{j,k} |a_i^T (q_k + q_j)|
        reach = np.maximum(np.abs(P).max(axis=1), ends)
        r = margin * float(np.min(np.abs(b1) / np.maximum(reach, _TINY)))
        W0 = _read_W(oracle, r * Q.T, [Q] * d, np.full((d, d), r))
        R_far = MAX_SCALE * kinks
    else:
        # 0 is on a kink or in a flat region: pass 1 on tokens of norm R1 beyond the kinks, with
        # steps shrunk until no softmax saturates
        R1 = max(2.0 * kinks, 1.0)
        r, W0 = R1, None
        for _ in range(FAR_TRIES):
            X, Qs, S = _far_tokens(A, b1, w_o, R1, margin, seed, cap=r)
            W0 = _read_W(oracle, X, Qs, S, strict=False)
            if W0 is not None:
                break
            r /= 16.0
        if W0 is None:
            raise OracleInconsistentError(
                f"the two-token answers stayed saturated (t within {SATURATED} of 0 or 1) with steps "
                f"down to {r * 16.0:.1e}: not a softmax head feeding the extracted FFN."
            )
        R_far = MAX_SCALE * R1
    # pass 2, at the scale where the logits are O(1): query tokens R o_k far from every kink
    # (capped: beyond every kink the regions are cones, so a W read as 0 needs no larger tokens)
    nW0 = max(float(np.linalg.norm(W0, 2)), _TINY)
    R = min(float(np.sqrt(LOGIT_SCALE / nW0)), R_far)
    if not around_0:
        R = max(R, 2.0 * kinks)  # where neurons are active
    X, Qs, S = _far_tokens(A, b1, w_o, R, margin, seed, cap=min(R, LOGIT_SCALE / (nW0 * R)))
    W = _read_W(oracle, X, Qs, S)
    diagnostics = {
        "n_queries_ffn": n_ffn,
        "n_queries_attention": oracle.n_queries - start - n_ffn,
        "first_pass": "around 0" if around_0 else "far",
        "radius": r,
        "scale": R,
        "min_step": float(np.min(np.abs(S))),
        "n_active": int(np.sum(active)),
        "ffn": dict(net_rec.diagnostics),
    }
    message = (
        f"FFN: {net_rec.message}; attention: W from {diagnostics['n_queries_attention']} queries "
        f"(2 d^2 + d = {n_att}) on segments of scale r = {r:.2e} inside the region around 0 where "
        f"{int(np.sum(active))} of {len(b1)} neurons are active (this book's biased reduction)"
    )
    model = BiasedOneLayerTransformer(W, A, b1, w_o, b2)
    wa = np.abs(w_o)
    checked = verify_outputs(
        oracle,
        model,
        lambda x: float(wa @ (np.max(np.abs(x @ A), axis=0) + np.abs(b1)) + abs(b2)),
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a biased one-layer Transformer w_o^T ReLU(A^T alpha(X, W)^T X + b1) + b2 (no residual or LayerNorm)",
    )
    checked["n_verify_queries"] += int(net_rec.diagnostics.get("n_verify_queries", 0))
    return build(
        BiasedTransformerRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=W,
        v=g,
        A=A,
        b1=b1,
        w_o=w_o,
        b2=b2,
    )
