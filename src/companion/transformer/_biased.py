"""One-layer Transformers with a biased ReLU FFN (OPT-style): this book's own reduction
(private; re-exported by :mod:`companion.transformer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._learner import (
    QueryCount,
    DEFAULT_VERIFY,
    build,
    check_verify,
    refuse_stated_rounding,
    reserve,
    verify_outputs,
)
from .._validation import (
    SequenceModel,
    as_float_array,
    check_int,
    check_real,
    frozen,
)
from ..attention import attention_weights
from ..errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from ..exact import check_exact_oracle
from ..ffn import ReLUNetwork, learn_relu_network
from ..recovery import Recovery
from ._one_layer import (
    TINY,
    ZERO_TOL,
)

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
        ``m <= d``). Given, the FFN may come back narrower: a neuron no line met and whose absence
        fits every answer and the FFN's verification is taken as dead (off on the inputs asked;
        ``diagnostics["ffn"]["dropped"]`` says so).
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
        :func:`~companion.ffn.learn_relu_network`'s refusals (a neuron not met and live, widths that
        grow).
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
    count = QueryCount(oracle)
    with count.stage("ffn"):
        net_rec = _one_layer_ffn(oracle, m, seed, ffn_options)
    net = net_rec.network
    A, b1 = net.weights[0], net.biases[0]
    w_o, b2 = net.weights[1][:, 0], float(net.biases[1][0])
    active = b1 > 0
    g = A[:, active] @ w_o[active]
    with count.stage("attention"):  # both passes of the head's queries
        W0, r, R_far, around_0 = _first_pass(oracle, A, b1, w_o, g, margin=margin, zero_tol=zero_tol, seed=seed)
        W, R, S = _second_pass(oracle, A, b1, w_o, W0, R_far, around_0, margin=margin, seed=seed)
    diagnostics = {
        "n_queries_ffn": count["ffn"],
        "n_queries_attention": count["attention"],
        "first_pass": "around 0" if around_0 else "far",
        "radius": r,
        "scale": R,
        "min_step": float(np.min(np.abs(S))),
        "n_active": int(np.sum(active)),
        "ffn": dict(net_rec.diagnostics),
    }
    message = (
        f"FFN: {net_rec.message}; attention: W from {diagnostics['n_queries_attention']} queries "
        f"(two passes of 2 d^2 + d: {n_att}) on segments of scale r = {r:.2e} inside the region around 0 where "
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


def _one_layer_ffn(oracle, m, seed, ffn_options):
    """Stage of :func:`learn_one_layer_biased`: the FFN from the one-token answers
    (:func:`~companion.ffn.learn_relu_network`), refused unless it has one hidden layer."""
    net_rec = learn_relu_network(oracle, widths=None if m is None else (m,), seed=seed, **ffn_options)
    widths = net_rec.network.widths
    if len(widths) != 1:
        raise OracleInconsistentError(
            f"the one-token answers are a ReLU network with {len(widths)} hidden layers "
            f"(widths {widths}); a biased one-layer Transformer's FFN has one."
        )
    return net_rec


def _first_pass(oracle, A, b1, w_o, g, *, margin, zero_tol, seed):
    """Stage of :func:`learn_one_layer_biased`: a first reading ``W0`` of ``W``, around 0 when the
    region there has active neurons and a nonzero ``g``, else on tokens beyond every kink with steps
    shrunk until no softmax saturates; ``(W0, r, R_far, around_0)``."""
    d = A.shape[0]
    scale = np.hypot(np.linalg.norm(A, axis=0), np.abs(b1))
    rel_b = np.abs(b1) / scale
    kinks = float(np.max(np.abs(b1) / np.maximum(np.linalg.norm(A, axis=0), TINY)))
    active = b1 > 0
    around_0 = bool(
        np.min(rel_b) > zero_tol and np.any(active) and np.linalg.norm(g) > zero_tol * np.sum(np.abs(w_o[active]))
    )
    if around_0:
        # pass 1, around 0: x_k = r q_k, u_jk = r (q_k + q_j), so u_jk - x_k = r q_j
        Q = _unit_direction_basis(g)
        P = A.T @ Q  # (m, d): a_i^T q_k
        ends = np.abs(P[:, :, None] + P[:, None, :]).max(axis=(1, 2))  # max_{j,k} |a_i^T (q_k + q_j)|
        reach = np.maximum(np.abs(P).max(axis=1), ends)
        r = margin * float(np.min(np.abs(b1) / np.maximum(reach, TINY)))
        return _read_W(oracle, r * Q.T, [Q] * d, np.full((d, d), r)), r, MAX_SCALE * kinks, True
    # 0 is on a kink or in a flat region: pass 1 on tokens of norm R1 beyond the kinks
    R1 = max(2.0 * kinks, 1.0)
    r = R1
    for _ in range(FAR_TRIES):
        X, Qs, S = _far_tokens(A, b1, w_o, R1, margin, seed, cap=r)
        W0 = _read_W(oracle, X, Qs, S, strict=False)
        if W0 is not None:
            return W0, r, MAX_SCALE * R1, False
        r /= 16.0
    raise OracleInconsistentError(
        f"the two-token answers stayed saturated (t within {SATURATED} of 0 or 1) with steps "
        f"down to {r * 16.0:.1e}: not a softmax head feeding the extracted FFN."
    )


def _second_pass(oracle, A, b1, w_o, W0, R_far, around_0, *, margin, seed):
    """Stage of :func:`learn_one_layer_biased`: ``W`` read at the scale where the logits are O(1),
    from query tokens ``R o_k`` far from every kink (capped: beyond every kink the regions are
    cones, so a ``W`` read as 0 needs no larger tokens); ``(W, R, steps)``."""
    kinks = float(np.max(np.abs(b1) / np.maximum(np.linalg.norm(A, axis=0), TINY)))
    nW0 = max(float(np.linalg.norm(W0, 2)), TINY)
    R = min(float(np.sqrt(LOGIT_SCALE / nW0)), R_far)
    if not around_0:
        R = max(R, 2.0 * kinks)  # where neurons are active
    X, Qs, S = _far_tokens(A, b1, w_o, R, margin, seed, cap=min(R, LOGIT_SCALE / (nW0 * R)))
    return _read_W(oracle, X, Qs, S), R, S
