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

from dataclasses import dataclass

import numpy as np

from ._validation import check_int, check_real
from .attention import OneLayerTransformer
from .errors import NotIdentifiableError
from .exact import check_exact_oracle, learn_single_head
from .ffn import align_networks, bits_of_precision, learn_ffn
from ._learner import DEFAULT_VERIFY, build, check_verify, reserve, verify_outputs
from .oracles import AntisymmetrisedOracle
from .recovery import Recovery

__all__ = [
    "learn_one_layer",
    "TransformerRecovery",
    "random_one_layer",
    "output_precision",
    "evaluate",
    "ReusedAnswers",
]


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


def learn_one_layer(
    oracle,
    *,
    signs="auto",
    milp_time_limit=10.0,
    zero_tol=1e-10,
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
        ``diagnostics["verify_tolerance"]`` its tolerance.
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
    # Size of the answers to [+-e_j^T], from the extracted network (no new query).
    ref = (
        float(np.max(np.abs(ffn.network.forward(np.concatenate([np.eye(d), -np.eye(d)]))), initial=0.0))
        if ffn.A.size
        else 0.0
    )
    if not np.any(np.abs(b) > zero_tol * max(ref, np.finfo(float).tiny)):
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
    checked = verify_outputs(
        oracle,
        model,
        lambda x: float(w @ np.max(np.abs(x @ A), axis=0)),
        verify,
        rtol=verify_rtol,
        seed=seed + 1,
        what="a one-layer Transformer w_o^T ReLU(alpha(X, W)^T X A) (no bias, residual or LayerNorm)",
    )
    checked["n_verify_queries"] += int(ffn.diagnostics["n_verify_queries"])
    return build(
        TransformerRecovery,
        oracle,
        start,
        verification=checked,
        message=message,
        diagnostics=diagnostics,
        W=head.W,
        v=b,
        A=ffn.A,
        w_o=ffn.w_o,
    )


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
