"""Attention models of the paper in merged form: one head, several heads (§3).

A single softmax head with merged query-key matrix ``W`` (d, d) and value vector ``v`` (d,) maps a
sequence ``X`` of ``N`` tokens (rows ``x_1 ... x_N``; the last token is the query) to the real number

.. math:: f_{W,v}(X) = \\alpha(X, W)^\\top X v, \\qquad
          \\alpha(X, W) = \\operatorname{softmax}(x_1^\\top W x_N, \\dots, x_N^\\top W x_N).

The native parameters ``Q, K, V`` (r, d) and ``w_o`` (r,) enter only through ``W = K^T Q`` and
``v = V^T w_o``; only the merged pair is identifiable from queries.

Every model here is callable on one sequence ``(N, d)`` (returns a ``float``), a batch ``(B, N, d)`` of
equal-length sequences (returns ``(B,)``) or a list of sequences of different lengths (returns ``(B,)``),
in float64, vectorised over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import softmax

from ._validation import SequenceModel, as_float_array, check_int, check_real, frozen
from .errors import InvalidInputError

__all__ = [
    "softmax",
    "attention_weights",
    "SingleHead",
    "FactoredHead",
    "MultiHead",
    "random_single_head",
    "OneLayerTransformer",
]


def _check_W_v(W, v):
    W = as_float_array(W, "W", ndim=2)
    if W.shape[0] != W.shape[1]:
        raise InvalidInputError(f"W must be square (d, d); got W.shape={W.shape}.")
    d = W.shape[0]
    if d == 0:
        raise InvalidInputError("W is empty (d=0); the input dimension d must be >= 1.")
    v = as_float_array(v, "v", ndim=1, shape=(d,))
    return W, v


def _check_native(Q, K, V, w_o, *, nonempty=False):
    """Native factors as float arrays: ``Q``, ``K``, ``V`` of shape (r, d) and ``w_o`` of shape (r,).

    With ``nonempty``, ``r = 0`` or ``d = 0`` is refused (checked on ``Q``, before the others).
    """
    Q = as_float_array(Q, "Q", ndim=2)
    r, d = Q.shape
    if nonempty and (r == 0 or d == 0):
        raise InvalidInputError(f"Q must have shape (r, d) with r, d >= 1; got Q.shape={Q.shape}.")
    K = as_float_array(K, "K", ndim=2, shape=(r, d))
    V = as_float_array(V, "V", ndim=2, shape=(r, d))
    w_o = as_float_array(w_o, "w_o", ndim=1, shape=(r,))
    return Q, K, V, w_o


_DEDUP_MIN_BATCH = 64
_FUSED_RUNS = 16  # at most this many runs of one query token: a product per run


def _runs(rows: np.ndarray):
    """Start indices of the runs of equal consecutive rows of ``rows`` (B, d), or None if more than B/2.

    One comparison pass over the rows, no sort: learners send the probes that share a query token
    (all probes of a column of ``W`` end in the same ``c e_j``) one after another.
    """
    change = np.flatnonzero(np.any(rows[1:] != rows[:-1], axis=1)) + 1
    if change.size + 1 > rows.shape[0] // 2:
        return None
    return np.concatenate([[0], change, [rows.shape[0]]])


def attention_weights(X, W) -> np.ndarray:
    """Softmax attention weights of the last token over all tokens.

    Parameters
    ----------
    X : ndarray of shape (B, N, d)
        A batch of equal-length sequences (already validated, float64).
    W : ndarray of shape (d, d)
        Merged query-key matrix.

    Returns
    -------
    ndarray of shape (B, N)
        ``softmax(x_i^T W x_N)`` over ``i``, computed with :func:`scipy.special.softmax`, which
        subtracts the largest score first and so never overflows.
    """
    return softmax(_scores(X, W), axis=-1)


def _scores(X, W) -> np.ndarray:
    """The scores ``x_i^T W x_N``, shape (B, N), computing ``W x_N`` once per distinct query token."""
    last = X[:, -1, :]
    if X.shape[0] >= _DEDUP_MIN_BATCH:
        # Batches from learners share their query tokens (all probes of a column of W end in the
        # same e_j): compute W x_N once per distinct last token, a d-fold saving for Theorem 4.1.
        runs = _runs(last)
        if runs is not None:
            Wq = np.repeat(last[runs[:-1]] @ W.T, np.diff(runs), axis=0)
        else:
            rows = np.ascontiguousarray(last)
            keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            if first.shape[0] <= X.shape[0] // 2:
                Wq = (rows[first] @ W.T)[inverse.reshape(-1)]
            else:
                Wq = last @ W.T
    else:
        Wq = last @ W.T  # (B, d): W x_N for every sequence
    return np.einsum("bnd,bd->bn", X, Wq)  # (B, N): x_i^T W x_N


@dataclass(frozen=True, eq=False)
class SingleHead(SequenceModel):
    """One softmax attention head in merged form, the regressor :math:`f_{W,v}` of §3.

    Parameters
    ----------
    W : array-like of shape (d, d)
        Merged query-key matrix ``K^T Q``.
    v : array-like of shape (d,)
        Merged value vector ``V^T w_o``.
    native : tuple of (Q, K, V, w_o), optional
        The native parameters the head was built from, kept for checks; see :meth:`from_native`.

    Attributes
    ----------
    d : int
        Input dimension.
    rank : int
        Numerical rank of ``W`` (``numpy.linalg.matrix_rank``).

    Raises
    ------
    InvalidInputError
        If ``W`` is not square, ``v`` does not have length ``d``, or either holds NaN or inf.

    Notes
    -----
    Section 3 of Bhattamishra et al. 2026 [1]_. No ``1/sqrt(d)`` scaling, mask, positional
    encoding, LayerNorm or residual: any of these can be folded into ``W`` and ``v`` or the input.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> head = SingleHead(W=np.zeros((2, 2)), v=np.array([1.0, 3.0]))
    >>> head(np.array([[1.0, 0.0], [0.0, 1.0]]))   # equal scores: the mean of x_i^T v
    2.0
    """

    W: np.ndarray
    v: np.ndarray
    native: tuple | None = field(default=None, repr=False)

    #: ``_batch`` only reads its input: an oracle may hand it a validated batch without a copy.
    _reads_only = True

    def __post_init__(self):
        W, v = _check_W_v(self.W, self.v)
        object.__setattr__(self, "W", frozen(W))
        object.__setattr__(self, "v", frozen(v))

    @property
    def d(self) -> int:
        return self.W.shape[0]

    @property
    def rank(self) -> int:
        return int(np.linalg.matrix_rank(self.W))

    @classmethod
    def from_native(cls, Q, K, V, w_o) -> "SingleHead":
        """Build the head from native parameters: ``W = K^T Q``, ``v = V^T w_o``.

        Parameters
        ----------
        Q, K, V : array-like of shape (r, d)
            Query, key and value projections (head dimension ``r``).
        w_o : array-like of shape (r,)
            Output vector.

        Raises
        ------
        InvalidInputError
            If the shapes disagree or an entry is NaN or inf.
        """
        Q, K, V, w_o = _check_native(Q, K, V, w_o)
        return cls(K.T @ Q, V.T @ w_o, native=(Q, K, V, w_o))

    def _batch(self, X: np.ndarray) -> np.ndarray:
        B, N, d = X.shape
        runs = _runs(X[:, -1, :]) if B >= _DEDUP_MIN_BATCH else None
        if runs is not None and runs.size - 1 <= _FUSED_RUNS:
            # Few distinct query tokens: one pass over each run gives scores and values together.
            out = np.empty(B)
            for s, e in zip(runs[:-1].tolist(), runs[1:].tolist()):
                P = X[s:e].reshape(-1, d) @ np.column_stack([self.W @ X[s, -1], self.v])
                P = P.reshape(e - s, N, 2)
                out[s:e] = np.sum(softmax(P[:, :, 0], axis=-1) * P[:, :, 1], axis=-1)
            return out
        return np.sum(attention_weights(X, self.W) * (X @ self.v), axis=-1)

    def __repr__(self):
        return (
            f"SingleHead(d={self.d}, rank={self.rank}, ||W||_F={np.linalg.norm(self.W):.4g}, "
            f"||v||_2={np.linalg.norm(self.v):.4g})"
        )


@dataclass(frozen=True, eq=False)
class FactoredHead(SequenceModel):
    """One softmax attention head in native form ``(Q, K, V, w_o)``, evaluated without forming ``W``.

    The same function as ``SingleHead(K^T Q, V^T w_o)``, but a batch is scored as
    ``(K x_i)^T (Q x_N)``: ``O(N r d)`` work and ``O(r d)`` memory per head instead of ``O(d^2)``,
    which is what makes a head of a 7B-class model (``d = 4096``, ``r = 128``) a practical target.

    Parameters
    ----------
    Q, K, V : array-like of shape (r, d)
        Query, key and value projections (head dimension ``r``).
    w_o : array-like of shape (r,)
        Output vector.

    Attributes
    ----------
    d : int
        Input dimension.
    r : int
        Head dimension, an upper bound on the rank of ``W``.
    v : ndarray of shape (d,)
        Merged value vector ``V^T w_o``, computed once.
    W : ndarray of shape (d, d)
        Merged query-key matrix ``K^T Q``, **formed on every access** (``d**2`` floats): for checks
        only; the head itself never builds it.
    rank : int
        Rank of ``W``, from the ``r x r`` triangular factors of ``K^T`` and ``Q^T`` (no ``d x d``
        matrix).
    native : tuple of (Q, K, V, w_o)
        The parameters, read-only.

    Raises
    ------
    InvalidInputError
        If the shapes disagree, ``d`` or ``r`` is 0, or an entry is NaN or inf.

    Notes
    -----
    Section 3 of Bhattamishra et al. 2026 [1]_: only ``(W, v)`` is identifiable from queries, so a
    learner recovers ``K^T Q``, never the factors. Answers agree with the dense
    :class:`SingleHead` to rounding.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> Q, K, V = rng.standard_normal((3, 2, 5))
    >>> head = FactoredHead(Q, K, V, np.array([1.0, -1.0]))
    >>> X = rng.standard_normal((4, 3, 5))
    >>> bool(np.allclose(head(X), head.to_single_head()(X), rtol=1e-13)), head.r, head.rank
    (True, 2, 2)
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    w_o: np.ndarray

    _reads_only = True

    def __post_init__(self):
        Q, K, V, w_o = _check_native(self.Q, self.K, self.V, self.w_o, nonempty=True)
        for name, a in (("Q", Q), ("K", K), ("V", V), ("w_o", w_o)):
            object.__setattr__(self, name, frozen(a))
        v = frozen(V.T @ w_o)
        object.__setattr__(self, "v", v)
        # [K^T, v]: keys and values of every token in one product; Q^T for the query tokens.
        object.__setattr__(self, "_KV", np.column_stack([K.T, v]))
        object.__setattr__(self, "_Qt", np.ascontiguousarray(Q.T))

    @property
    def d(self) -> int:
        return self.Q.shape[1]

    @property
    def r(self) -> int:
        return self.Q.shape[0]

    @property
    def native(self) -> tuple:
        return (self.Q, self.K, self.V, self.w_o)

    @property
    def W(self) -> np.ndarray:
        return self.K.T @ self.Q

    @property
    def rank(self) -> int:
        rk = np.linalg.qr(self.K.T, mode="r")  # mode="r" returns the array R only
        rq = np.linalg.qr(self.Q.T, mode="r")
        return int(np.linalg.matrix_rank(rk @ rq.T))  # type: ignore[attr-defined]

    def to_single_head(self) -> SingleHead:
        """The same head in merged form, :class:`SingleHead` (forms the ``d x d`` matrix ``W``)."""
        return SingleHead(self.W, self.v, native=self.native)  # type: ignore[attr-defined]

    def _batch(self, X: np.ndarray) -> np.ndarray:  # v, _KV, _Qt are set in __post_init__
        return factored_batch(X, self._KV, self._Qt)  # type: ignore[attr-defined]

    def __repr__(self):
        return f"FactoredHead(d={self.d}, r={self.r}, ||v||_2={np.linalg.norm(self.v):.4g})"


def factored_batch(X: np.ndarray, KV: np.ndarray, Qt: np.ndarray) -> np.ndarray:
    """A head's answers to a batch ``X`` of shape (B, N, d) from its factors, never forming ``W``.

    ``KV = [K^T, v]`` of shape (d, r + 1) and ``Qt = Q^T`` of shape (d, r): scores
    ``(K x_i)^T (Q x_N)``, ``O(B N r d)`` work. Shared by :class:`FactoredHead` and the real heads
    of :mod:`companion.pretrained`.
    """
    B, N, d = X.shape
    P = (X.reshape(B * N, d) @ KV).reshape(B, N, -1)  # K x_i and x_i^T v, one product
    scores = np.einsum("bnr,br->bn", P[:, :, :-1], X[:, -1, :] @ Qt)
    return np.sum(softmax(scores, axis=-1) * P[:, :, -1], axis=-1)


@dataclass(frozen=True, eq=False)
class MultiHead(SequenceModel):
    """A sum of ``H`` single heads, f^H(X) = sum_h alpha(X, W^(h))^T X v^(h) (§3, §7).

    Parameters
    ----------
    Ws : array-like of shape (H, d, d)
        Merged query-key matrices, one per head.
    vs : array-like of shape (H, d)
        Merged value vectors, one per head.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf.

    Notes
    -----
    Proposition 7.1 of [1]_: the parameters of a multi-head model are not identifiable from its
    function, so a learner can at best recover a canonical form.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    """

    Ws: np.ndarray
    vs: np.ndarray

    def __post_init__(self):
        Ws = as_float_array(self.Ws, "Ws", ndim=3)
        H, d, d2 = Ws.shape
        if d != d2 or H == 0 or d == 0:
            raise InvalidInputError(f"Ws must have shape (H, d, d) with H, d >= 1; got Ws.shape={Ws.shape}.")
        vs = as_float_array(self.vs, "vs", ndim=2, shape=(H, d))
        object.__setattr__(self, "Ws", frozen(Ws))
        object.__setattr__(self, "vs", frozen(vs))

    @property
    def d(self) -> int:
        return self.Ws.shape[1]

    @property
    def n_heads(self) -> int:
        return self.Ws.shape[0]

    @property
    def heads(self) -> list[SingleHead]:
        """The heads as :class:`SingleHead` objects."""
        return [SingleHead(W, v) for W, v in zip(self.Ws, self.vs)]

    @classmethod
    def from_native(cls, Qs, Ks, Vs, w_o) -> "MultiHead":
        """Build from native parameters (§3): ``W^(h) = K^(h)T Q^(h)``, ``v^(h) = V^(h)T w_o^(h)``.

        Parameters
        ----------
        Qs, Ks, Vs : array-like of shape (H, d_h, d)
            Per-head query, key and value projections.
        w_o : array-like of shape (H * d_h,)
            The output vector, split into ``H`` blocks ``w_o^(h)`` of length ``d_h``.

        Raises
        ------
        InvalidInputError
            If the shapes disagree or an entry is NaN or inf.

        Examples
        --------
        >>> import numpy as np
        >>> m = MultiHead.from_native(np.ones((2, 1, 2)), np.ones((2, 1, 2)), np.ones((2, 1, 2)),
        ...                           np.array([1.0, -1.0]))
        >>> m.n_heads, float(np.abs(m.vs.sum(axis=0)).max())
        (2, 0.0)
        """
        Qs = as_float_array(Qs, "Qs", ndim=3)
        H, dh, d = Qs.shape
        Ks = as_float_array(Ks, "Ks", ndim=3, shape=(H, dh, d))
        Vs = as_float_array(Vs, "Vs", ndim=3, shape=(H, dh, d))
        w_o = as_float_array(w_o, "w_o", ndim=1, shape=(H * dh,)).reshape(H, dh)
        return cls(np.einsum("hrd,hre->hde", Ks, Qs), np.einsum("hrd,hr->hd", Vs, w_o))

    def _batch(self, X: np.ndarray) -> np.ndarray:
        return sum(np.sum(attention_weights(X, W) * (X @ v), axis=-1) for W, v in zip(self.Ws, self.vs))

    def __repr__(self):
        return f"MultiHead(n_heads={self.n_heads}, d={self.d})"


def random_single_head(d, *, rank=None, W_norm=None, v_norm=None, factored=False, seed):
    """Draw a random head with ``W = Q_f K_f^T / sqrt(r)`` of rank ``r`` and Gaussian ``v``.

    Parameters
    ----------
    d : int
        Input dimension, ``d >= 1``.
    rank : int, default=None
        Rank ``r`` of ``W``, ``1 <= r <= d``; ``None`` means ``r = d`` (full rank almost surely).
    W_norm : float, default=None
        If given, ``W`` is rescaled to this Frobenius norm (``>= 0``). By default its entries have
        variance 1, so ``||W||_F`` is about ``d``.
    v_norm : float, default=None
        If given, ``v`` is rescaled to this Euclidean norm (``> 0``). By default ``v ~ N(0, I_d)``.
    factored : bool, default=False
        Return a :class:`FactoredHead` built from the same draws (the same function as the
        default's ``SingleHead``, to rounding), never forming a ``d x d`` matrix: ``O(r d)`` memory
        and time, for heads as large as ``d = 4096``.
    seed : int
        Seed of ``numpy.random.default_rng``; the only source of randomness.

    Returns
    -------
    SingleHead or FactoredHead
        Built by :meth:`SingleHead.from_native` (or, with ``factored=True``, as
        :class:`FactoredHead`) from Gaussian factors ``Q, K, V`` of shape ``(r, d)`` and ``w_o``
        of shape ``(r,)``, which stay available as ``head.native``.

    Raises
    ------
    InvalidInputError
        If ``d`` or ``rank`` is not an integer in range, or a norm is negative or not finite.

    Examples
    --------
    >>> head = random_single_head(5, rank=2, seed=0)
    >>> head.d, head.rank
    (5, 2)
    >>> big = random_single_head(4096, rank=128, factored=True, seed=0)   # 4096 x 4096 never built
    >>> big.r, big.Q.shape
    (128, (128, 4096))
    """
    d = check_int(d, "d", minimum=1)
    r = d if rank is None else check_int(rank, "rank", minimum=1, maximum=d)
    seed = check_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((r, d))
    K = rng.standard_normal((r, d)) / np.sqrt(r)
    V = rng.standard_normal((r, d))
    w_o = rng.standard_normal(r) / np.sqrt(r)
    if not isinstance(factored, (bool, np.bool_)):
        raise InvalidInputError(f"factored must be True or False; got {factored!r}.")
    if W_norm is not None:
        W_norm = check_real(W_norm, "W_norm", minimum=0.0)
        # ||K^T Q||_F^2 = tr((K K^T)(Q Q^T)): r x r Gram matrices, no d x d product when factored
        norm = np.sqrt(max(float(np.sum((K @ K.T) * (Q @ Q.T))), 0.0)) if factored else np.linalg.norm(K.T @ Q)
        K = K * (W_norm / norm)
    if v_norm is not None:
        v_norm = check_real(v_norm, "v_norm", minimum=0.0, strict=True)
        w_o = w_o * (v_norm / np.linalg.norm(V.T @ w_o))
    if factored:
        return FactoredHead(Q, K, V, w_o)
    return SingleHead.from_native(Q, K, V, w_o)


@dataclass(frozen=True, eq=False)
class OneLayerTransformer(SequenceModel):
    """The one-layer Transformer of §4.1 in merged form, TF(X) = w_o^T ReLU(alpha(X, W)^T X A).

    Parameters
    ----------
    W : array-like of shape (d, d)
        Merged query-key matrix ``K^T Q``.
    A : array-like of shape (d, m)
        Merged value-FFN matrix ``V^T W_1^T``: column ``i`` is hidden neuron ``i``'s direction.
    w_o : array-like of shape (m,)
        Output weights of the FFN (``w_2``).
    native : tuple of (Q, K, V, W1, w2), optional
        The native parameters the model was built from; see :meth:`from_native`.

    Attributes
    ----------
    d, m : int
        Input dimension and FFN width.
    v : ndarray of shape (d,)
        ``A w_o``: the value vector of the single head seen by the antisymmetrised oracle
        ``VQ(X) - VQ(-X) = alpha(X, W)^T X A w_o``.
    head : SingleHead
        That head, ``SingleHead(W, A w_o)``.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf.

    Notes
    -----
    Section 4.1 of [1]_: one softmax head whose value output (a vector of size ``d``) feeds a
    bias-free ReLU FFN; no residual connection and no LayerNorm. The attention scores are
    unchanged by ``X -> -X`` and ``ReLU(z) - ReLU(-z) = z``, which is what makes ``W`` learnable.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> tf = OneLayerTransformer(np.zeros((2, 2)), np.eye(2), np.array([1.0, -1.0]))
    >>> tf(np.array([[4.0, 0.0], [0.0, 2.0]]))   # h = (2, 1): ReLU(2) - ReLU(1)
    1.0
    """

    W: np.ndarray
    A: np.ndarray
    w_o: np.ndarray
    native: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        W = as_float_array(self.W, "W", ndim=2)
        if W.shape[0] != W.shape[1] or W.shape[0] == 0:
            raise InvalidInputError(f"W must be square (d, d) with d >= 1; got W.shape={W.shape}.")
        d = W.shape[0]
        A = as_float_array(self.A, "A", ndim=2, shape=(d, None))
        w_o = as_float_array(self.w_o, "w_o", ndim=1, shape=(A.shape[1],))
        for name, a in (("W", W), ("A", A), ("w_o", w_o)):
            object.__setattr__(self, name, frozen(a))

    @property
    def d(self) -> int:
        return self.W.shape[0]

    @property
    def m(self) -> int:
        return self.A.shape[1]

    @property
    def v(self) -> np.ndarray:
        return self.A @ self.w_o

    @property
    def head(self) -> SingleHead:
        return SingleHead(self.W, self.v)

    @classmethod
    def from_native(cls, Q, K, V, W1, w2) -> "OneLayerTransformer":
        """Build from native parameters: ``W = K^T Q``, ``A = V^T W1^T``, ``w_o = w2``.

        Parameters
        ----------
        Q, K : array-like of shape (r, d)
            Query and key projections.
        V : array-like of shape (d_v, d)
            Value projection (the paper takes ``d_v = d``).
        W1 : array-like of shape (m, d_v)
            First FFN layer (no bias).
        w2 : array-like of shape (m,)
            Second FFN layer (no bias).

        Raises
        ------
        InvalidInputError
            If the shapes disagree or an entry is NaN or inf.
        """
        Q = as_float_array(Q, "Q", ndim=2)
        r, d = Q.shape
        K = as_float_array(K, "K", ndim=2, shape=(r, d))
        V = as_float_array(V, "V", ndim=2, shape=(None, d))
        W1 = as_float_array(W1, "W1", ndim=2, shape=(None, V.shape[0]))
        w2 = as_float_array(w2, "w2", ndim=1, shape=(W1.shape[0],))
        return cls(K.T @ Q, V.T @ W1.T, w2, native=(Q, K, V, W1, w2))

    def _batch(self, X: np.ndarray) -> np.ndarray:
        h = np.einsum("bn,bnd->bd", attention_weights(X, self.W), X)
        return np.maximum(h @ self.A, 0.0) @ self.w_o

    def __repr__(self):
        return f"OneLayerTransformer(d={self.d}, m={self.m})"
