"""Adapters: your own model as a target, with the merged ground truth to check a learner against.

A learner talks to an oracle (:class:`~companion.oracles.ValueQueryOracle`), which asks its target
float64 batches ``(B, N, d)`` and wants one number per sequence. A framework's attention layer
takes its own dtype and tensors, returns a vector per token, and scales its scores. Each adapter
here closes that gap once (this book's code, beyond the paper):

* :func:`from_callable`: a plain Python function of one sequence ``(N, d)``;
* :func:`from_keras`: a Keras 3 ``MultiHeadAttention`` layer;
* :func:`from_flax`: a JAX/Flax-style ``apply(variables, inputs_q, inputs_kv)`` with Flax linen's
  ``MultiHeadDotProductAttention`` parameters;
* :func:`from_torch`: a PyTorch ``nn.MultiheadAttention``-style module (duck-typed: torch is not
  imported).

Each returns a :class:`FrameworkTarget`: callable on ``(B, N, d)`` (the readout of the layer's
output at the last token, the query; keys and values are the whole sequence), with ``vector``
(the layer's output vector at the last token, ``(B, d_out)``), ``precision`` (the format of the
layer's dtype, which :meth:`FrameworkTarget.oracle` states to the learners) and ``truth`` (the
merged parameters read off the layer's weights, :class:`MergedHeads`, for checking only).

The merged form (§3 of the paper; scores ``x_i^T W x_N``, values ``x_i^T v``): for head ``h`` with
query and key kernels ``K_q``, ``K_k`` of shape ``(d, k)`` (``q = x K_q + b_q``) and the
framework's score scale ``s`` (``1 / sqrt(k)`` in all three frameworks),
``W_h = s K_k K_q^T``; with value kernel ``K_v`` ``(d, k_v)``, output kernel ``K_o`` ``(k_v, d_out)``
of that head and readout ``r``, ``v_h = K_v K_o r``. Biases add ``x_i^T w_h`` to the scores with
``w_h = s K_k b_q`` (the other bias terms are the same for every token ``i`` and cancel in the
softmax) and a constant ``v0 = sum_h b_v,h^T K_o,h r + b_o^T r`` to every answer: the head of
``learn_single_head(oracle, bias=True)``, ``W~ = [[W, w], [0, 0]]``, ``v~ = (v, v0)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ._validation import check_int
from .attention import MultiHead, SingleHead
from .errors import InvalidInputError
from .oracles import ValueQueryOracle, unit_roundoff

__all__ = ["FrameworkTarget", "MergedHeads", "from_callable", "from_keras", "from_flax", "from_torch"]

#: The answer formats an adapter states, by the name of the layer's dtype.
_FORMATS = {"float64": None, "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def _format(dtype_name: str) -> str:
    name = str(dtype_name).rsplit(".", 1)[-1]
    if name not in _FORMATS:
        raise InvalidInputError(f"the layer computes in {dtype_name!r}; the adapters know {sorted(_FORMATS)}.")
    return name


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


@dataclass(frozen=True)
class MergedHeads:
    """The merged parameters of a layer, read off its weights (for checking learners, never seen by them).

    Attributes
    ----------
    W : ndarray of shape (H, d, d)
        ``W_h`` with the framework's score scaling.
    v : ndarray of shape (H, d)
        ``v_h`` for the adapter's readout.
    w : ndarray of shape (H, d)
        The score bias ``x_i^T w_h`` (0 without biases).
    v0 : ndarray of shape (H,)
        Each head's constant offset (value bias through the output kernel; the output bias is
        added to head 0): ``v0.sum()`` is added to every answer.
    """

    W: np.ndarray
    v: np.ndarray
    w: np.ndarray
    v0: np.ndarray

    @property
    def has_bias(self) -> bool:
        """Whether a bias changes the function (a score bias ``w`` or an offset ``v0`` not 0)."""
        return bool(np.any(self.w) or np.any(self.v0))

    def head(self, h=0, *, homogeneous=None) -> SingleHead:
        """Head ``h``: ``SingleHead(W_h, v_h)``, or with biases the homogeneous head in ``d + 1``
        dimensions (``W~ = [[W, w], [0, 0]]``, ``v~ = (v, v0)``), what ``bias=True`` recovers.
        ``homogeneous`` (bool): that form or not, whatever the biases (default: with biases only;
        a layer whose biases are all 0, such as a fresh Keras layer, has ``w = 0``, ``v0 = 0``)."""
        h = check_int(h, "h", minimum=0, maximum=self.W.shape[0] - 1)
        if not (self.has_bias if homogeneous is None else homogeneous):
            return SingleHead(self.W[h], self.v[h])
        d = self.W.shape[1]
        Wt = np.zeros((d + 1, d + 1))
        Wt[:d, :d], Wt[:d, d] = self.W[h], self.w[h]
        return SingleHead(Wt, np.append(self.v[h], self.v0[h] if self.W.shape[0] > 1 else self.v0.sum()))

    def multi_head(self) -> MultiHead:
        """Every head, bias-free: ``MultiHead(W, v)``.

        Raises
        ------
        InvalidInputError
            If the layer has biases (its heads are then heads on homogeneous tokens: :meth:`head`).
        """
        if self.has_bias:
            raise InvalidInputError("the layer has biases; take its heads on homogeneous tokens with head(h).")
        return MultiHead(self.W, self.v)

    def errors(self, rec, h=0) -> dict:
        """Relative errors ``{"W": ..., "v": ...}`` of a single-head recovery against head ``h``.

        With biases only the identifiable part is compared: the first ``d`` rows of ``W~`` and all
        of ``v~`` (the last row of ``W~`` never enters the function). A recovery in ``d + 1``
        dimensions (``bias=True``) of a layer whose biases are all 0 is compared with its
        homogeneous head, ``w = 0`` and ``v0 = 0``.

        Raises
        ------
        InvalidInputError
            If ``rec.W`` is neither ``(d, d)`` nor ``(d + 1, d + 1)``, or is ``(d, d)`` for a layer
            with biases (learn with ``bias=True``).
        """
        d = self.W.shape[1]
        homogeneous = np.shape(rec.W) == (d + 1, d + 1)
        ref = self.head(h, homogeneous=homogeneous or None)
        W, Wr = _f64(rec.W), _f64(ref.W)
        if W.shape != Wr.shape:
            raise InvalidInputError(
                f"the recovered W has shape {W.shape}, head {h} {Wr.shape}"
                + ("; the layer has biases: learn with bias=True" if self.has_bias else "")
                + "."
            )
        rows = slice(None, d) if homogeneous else slice(None)
        eW = float(np.linalg.norm(W[rows] - Wr[rows]) / np.linalg.norm(Wr[rows]))
        ev = float(np.linalg.norm(_f64(rec.v) - _f64(ref.v)) / np.linalg.norm(_f64(ref.v)))
        return {"W": eW, "v": ev}


def _merge(Kq, bq, Kk, bk, Kv, bv, Ko, bo, r, scale) -> MergedHeads:
    """Merged heads from kernels in the einsum layout of Keras and Flax.

    ``Kq``, ``Kk`` (d, H, k); ``Kv`` (d, H, k_v); ``Ko`` (H, k_v, d_out); biases (H, k), (H, k_v),
    (d_out,) or None; ``r`` (d_out,); ``scale`` the score scale.
    """
    Kq, Kk, Kv, Ko, r = _f64(Kq), _f64(Kk), _f64(Kv), _f64(Ko), _f64(r)
    H = Kq.shape[1]
    W = scale * np.einsum("dhk,ehk->hde", Kk, Kq)
    out = np.einsum("hkc,c->hk", Ko, r)  # K_o,h r: (H, k_v)
    v = np.einsum("dhk,hk->hd", Kv, out)
    w = np.zeros(v.shape) if bq is None else scale * np.einsum("dhk,hk->hd", Kk, _f64(bq))
    v0 = np.zeros(H) if bv is None else np.einsum("hk,hk->h", _f64(bv), out)
    if bo is not None:
        v0[0] += float(_f64(bo) @ r)
    return MergedHeads(W=W, v=v, w=w, v0=v0)


class FrameworkTarget:
    """A model wrapped for an oracle: float64 batches in, one float64 per sequence out.

    Built by :func:`from_callable`, :func:`from_keras`, :func:`from_flax` or :func:`from_torch`.

    Attributes
    ----------
    d : int
        Token dimension.
    d_out : int
        Dimension of the layer's output vector (1 for a scalar model).
    readout : ndarray of shape (d_out,) or None
        The fixed vector ``r`` the answer is read with, ``r^T y``.
    dtype : str
        The layer's compute dtype (``"float32"``, ...); queries are cast to it.
    precision : str or None
        The answers' format, stated to the learners by :meth:`oracle` (None for float64).
    truth : MergedHeads or None
        The merged parameters from the layer's weights (None for a plain callable).
    """

    def __init__(self, vector: Callable[[np.ndarray], Any], d, d_out, *, readout, dtype, truth=None, name=""):
        self.d = check_int(d, "d", minimum=1)
        self.d_out = check_int(d_out, "d_out", minimum=1)
        self.dtype = _format(dtype)
        self.precision = _FORMATS[self.dtype]
        self.readout = None if readout is None else _f64(readout).reshape(-1)
        if self.readout is not None and self.readout.shape != (self.d_out,):
            raise InvalidInputError(f"readout must have shape ({self.d_out},); got {self.readout.shape}.")
        self.truth = truth
        self.name = name
        self._vector = vector

    def _cast(self, X):
        if self.dtype == "bfloat16":
            import ml_dtypes

            return np.asarray(X, dtype=np.float32).astype(ml_dtypes.bfloat16)
        return np.asarray(X, dtype=self.dtype)

    def vector(self, X) -> np.ndarray:
        """The layer's output vector at the last token: ``(B, N, d)`` -> ``(B, d_out)`` in float64."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[-1] != self.d:
            raise InvalidInputError(f"X must have shape (B, N, d={self.d}); got {X.shape}.")
        Y = np.asarray(self._vector(self._cast(X)), dtype=np.float64).reshape(X.shape[0], -1)
        if Y.shape[1] != self.d_out:
            raise InvalidInputError(f"the model returned {Y.shape[1]} outputs per sequence, expected {self.d_out}.")
        return Y

    def __call__(self, X) -> np.ndarray:
        """The answers ``r^T y(X)`` (``(B,)``); the output itself for a scalar model."""
        Y = self.vector(X)
        return Y[:, 0] if self.readout is None else Y @ self.readout

    def oracle(self, *, budget=None, record=False, progress=None) -> ValueQueryOracle:
        """A :class:`~companion.oracles.ValueQueryOracle` on this target, stating its precision (``progress`` as
        :class:`~companion.oracles.ValueQueryOracle` takes it: ``False`` silences the progress bar)."""
        return ValueQueryOracle(
            self, d=self.d, budget=budget, record=record, precision=self.precision, progress=progress
        )

    def __repr__(self):
        return f"FrameworkTarget({self.name}, d={self.d}, d_out={self.d_out}, dtype={self.dtype})"


def _default_readout(d_out, seed):
    return np.random.default_rng(seed).standard_normal(d_out) / np.sqrt(d_out)


def from_callable(fn, d, *, dtype="float64", readout=None, batched=False) -> FrameworkTarget:
    """Wrap a plain function of one sequence.

    Parameters
    ----------
    fn : callable
        ``fn(x)`` for one sequence ``x`` of shape ``(N, d)`` (in ``dtype``), returning a number, or
        a vector of shape ``(d_out,)`` read with ``readout``. With ``batched``, ``fn(X)`` takes the
        whole batch ``(B, N, d)`` and returns ``(B,)`` or ``(B, d_out)``.
    d : int
        Token dimension.
    dtype : {"float64", "float32", "float16", "bfloat16"}, default="float64"
        What ``fn`` computes in; queries are cast to it and the oracle states it.
    readout : array-like of shape (d_out,), default=None
        Required when ``fn`` returns vectors.
    batched : bool, default=False

    Returns
    -------
    FrameworkTarget
        With ``truth`` None (a function has no weights to read).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> from companion.exact import learn_single_head
    >>> head = random_single_head(3, seed=0)
    >>> target = from_callable(lambda x: head(x), 3)
    >>> rec = learn_single_head(target.oracle())
    >>> bool(np.allclose(rec.W, head.W))
    True
    """
    if not callable(fn):
        raise InvalidInputError(f"fn must be callable on one sequence (N, d); got {type(fn).__name__}.")
    d = check_int(d, "d", minimum=1)
    if batched:

        def vector(X):
            return np.asarray(fn(X), dtype=np.float64).reshape(len(X), -1)
    else:

        def vector(X):
            return np.stack([np.asarray(fn(x), dtype=np.float64).reshape(-1) for x in X])

    probe = vector(np.zeros((1, 1, d), dtype=_format(dtype) if dtype != "bfloat16" else np.float32))
    d_out = probe.shape[1]
    if d_out > 1 and readout is None:
        raise InvalidInputError(f"fn returns vectors of {d_out} entries; pass readout=(d_out,) to read one number.")
    return FrameworkTarget(vector, d, d_out, readout=readout, dtype=dtype, name=getattr(fn, "__name__", "fn"))


def from_keras(layer, *, readout=None, seed=0) -> FrameworkTarget:
    """Wrap a built Keras 3 ``keras.layers.MultiHeadAttention`` as a scalar target.

    The layer is called as ``layer(query=X[:, -1:], value=X, key=X)``: the last token attends to
    the whole sequence (self-attention read at the query ``x_N``). Keras scales the query by
    ``1 / sqrt(key_dim)``; its kernels are ``(d, heads, key_dim)``.

    Keras needs a backend before it is imported: the book's ``[book]`` extra installs ``keras`` and
    ``jax``, not TensorFlow (Keras's default), so set ``KERAS_BACKEND`` to ``"numpy"`` or ``"jax"``
    first (chapter 08 and the README do).

    Parameters
    ----------
    layer : keras.layers.MultiHeadAttention
        Built (called once), with the default attention axes and no mask.
    readout : array-like of shape (d_out,), default=None
        ``r``; default a fixed random vector, ``N(0, I / d_out)`` from ``seed``.
    seed : int, default=0

    Returns
    -------
    FrameworkTarget
        ``truth`` from the layer's kernels and biases; ``precision`` from ``layer.compute_dtype``.

    Raises
    ------
    InvalidInputError
        If the layer is not built.
    """
    if not getattr(layer, "built", False):
        raise InvalidInputError("build the layer first (call it once on a batch), so that it has weights.")
    qd, kd, vd, od = (getattr(layer, n) for n in ("query_dense", "key_dense", "value_dense", "output_dense"))

    def arr(dense, name):
        var = getattr(dense, name, None)
        return None if var is None else np.asarray(var.numpy() if hasattr(var, "numpy") else var)

    Kq = arr(qd, "kernel")
    d, key_dim = Kq.shape[0], Kq.shape[-1]
    Ko = arr(od, "kernel")
    d_out = Ko.shape[-1]
    r = _default_readout(d_out, seed) if readout is None else _f64(readout)
    truth = _merge(
        Kq,
        arr(qd, "bias"),
        arr(kd, "kernel"),
        arr(kd, "bias"),
        arr(vd, "kernel"),
        arr(vd, "bias"),
        Ko,
        arr(od, "bias"),
        r,
        1.0 / np.sqrt(key_dim),
    )

    def vector(X):
        return np.asarray(layer(query=X[:, -1:, :], value=X, key=X))[:, 0, :]

    name = f"keras {type(layer).__name__}"
    target = FrameworkTarget(vector, d, d_out, readout=r, dtype=str(layer.compute_dtype), truth=truth, name=name)
    # a layer can return a coarser format than it computes in (Keras 3.15's MultiHeadAttention with dtype="float64"
    # returns float32 on the numpy and jax backends): the answers carry the coarser one's rounding, which is stated
    returned = np.asarray(vector(target._cast(np.zeros((1, 2, d))))).dtype.name
    if returned in _FORMATS and unit_roundoff(returned) > unit_roundoff(target.dtype):
        target = FrameworkTarget(vector, d, d_out, readout=r, dtype=returned, truth=truth, name=name)
    return target


def from_flax(apply, params, *, readout=None, seed=0) -> FrameworkTarget:
    """Wrap a JAX/Flax-style attention function as a scalar target.

    Parameters
    ----------
    apply : callable
        ``apply(variables, inputs_q, inputs_kv)`` returning ``(B, 1, d_out)`` for
        ``inputs_q`` of shape ``(B, 1, d)`` and ``inputs_kv`` ``(B, N, d)``, as Flax linen's
        ``MultiHeadDotProductAttention(...).apply`` is called; ``variables = {"params": params}``.
        It receives NumPy arrays (JAX functions accept them) and may return a JAX array.
    params : mapping
        Flax linen's names: ``params["query"|"key"|"value"]["kernel"]`` of shape ``(d, heads,
        head_dim)`` and ``["bias"]`` ``(heads, head_dim)`` if used; ``params["out"]["kernel"]``
        ``(heads, head_dim, d_out)`` and ``["bias"]``. Flax divides the query by
        ``sqrt(head_dim)``.
    readout : array-like of shape (d_out,), default=None
    seed : int, default=0

    Returns
    -------
    FrameworkTarget
        ``precision`` from the query kernel's dtype.
    """
    try:
        Kq = np.asarray(params["query"]["kernel"])
        parts = [params[n] for n in ("query", "key", "value", "out")]
    except (KeyError, TypeError):
        raise InvalidInputError(
            "params must hold Flax linen's 'query', 'key', 'value' and 'out' entries, each with a 'kernel'."
        ) from None
    d, head_dim = Kq.shape[0], Kq.shape[-1]
    Ko = np.asarray(parts[3]["kernel"])
    d_out = Ko.shape[-1]
    r = _default_readout(d_out, seed) if readout is None else _f64(readout)

    def get(p, name):
        return None if p.get(name) is None else np.asarray(p[name])

    truth = _merge(
        Kq,
        get(parts[0], "bias"),
        get(parts[1], "kernel"),
        get(parts[1], "bias"),
        get(parts[2], "kernel"),
        get(parts[2], "bias"),
        Ko,
        get(parts[3], "bias"),
        r,
        1.0 / np.sqrt(head_dim),
    )
    variables = {"params": params}

    def vector(X):
        return np.asarray(apply(variables, X[:, -1:, :], X))[:, 0, :]

    return FrameworkTarget(vector, d, d_out, readout=r, dtype=Kq.dtype.name, truth=truth, name="flax")


def _to_numpy(t) -> np.ndarray:
    """A torch-like tensor (``detach().cpu().numpy()``) or an array, as a NumPy array."""
    if hasattr(t, "detach"):
        t = t.detach()
    if hasattr(t, "cpu"):
        t = t.cpu()
    if str(getattr(t, "dtype", "")) == "torch.bfloat16":  # NumPy has no bfloat16: torch's .numpy() refuses it
        t = t.float()  # exact: every bfloat16 is a float32
    if hasattr(t, "numpy"):
        t = t.numpy()
    return np.asarray(t)


def from_torch(module, *, readout=None, seed=0) -> FrameworkTarget:
    """Wrap a PyTorch ``nn.MultiheadAttention``-style module as a scalar target (torch not imported).

    The module is called as ``module(q, k, v, need_weights=False)`` with ``q`` the last token and
    ``k = v`` the sequence, in the layout ``batch_first`` says (``(B, N, E)``, else ``(N, B, E)``),
    as tensors made by ``module.in_proj_weight.new_tensor`` (same dtype and device); the first
    returned tensor is read with ``detach().cpu().numpy()``. PyTorch's conventions:
    ``in_proj_weight`` ``(3E, E)`` stacks ``W_q``, ``W_k``, ``W_v`` (``q = W_q x + b_q``),
    ``in_proj_bias`` ``(3E,)`` or None, head ``h`` takes rows ``h E/H .. (h+1) E/H``, scores are
    divided by ``sqrt(E / H)``, and ``out_proj`` (``weight`` ``(E, E)``, ``bias``) maps the
    concatenated heads.

    Parameters
    ----------
    module : nn.MultiheadAttention-like
        With ``embed_dim``, ``num_heads``, ``batch_first``, ``in_proj_weight``, ``in_proj_bias``,
        ``out_proj``; in eval mode (no dropout).
    readout : array-like of shape (E,), default=None
    seed : int, default=0

    Raises
    ------
    InvalidInputError
        If ``in_proj_weight`` is None (separate ``q_proj_weight`` etc., for ``kdim``/``vdim``
        different from ``embed_dim``) or ``bias_k``/``bias_v`` are set (``add_bias_kv``): both
        are outside what this adapter merges.
    """
    Win = getattr(module, "in_proj_weight", None)
    if Win is None:
        raise InvalidInputError(
            "the module has no in_proj_weight (kdim or vdim differ from embed_dim): not supported by from_torch."
        )
    if getattr(module, "bias_k", None) is not None or getattr(module, "bias_v", None) is not None:
        raise InvalidInputError("add_bias_kv=True appends a key and a value to every sequence: not a softmax head.")
    E, H = int(module.embed_dim), int(module.num_heads)
    hd = E // H
    A = _to_numpy(Win)
    b_in = getattr(module, "in_proj_bias", None)
    b = None if b_in is None else _to_numpy(b_in)
    Wo = _to_numpy(module.out_proj.weight)
    bo = None if getattr(module.out_proj, "bias", None) is None else _to_numpy(module.out_proj.bias)

    def kern(Wx):  # (E_out, E) acting as W x -> (E, H, hd) acting as x K
        return Wx.T.reshape(E, H, hd)

    def bias(i):
        return None if b is None else b[i * E : (i + 1) * E].reshape(H, hd)

    r = _default_readout(E, seed) if readout is None else _f64(readout)
    truth = _merge(
        kern(A[:E]),
        bias(0),
        kern(A[E : 2 * E]),
        bias(1),
        kern(A[2 * E :]),
        bias(2),
        Wo.T.reshape(H, hd, E),
        bo,
        r,
        1.0 / np.sqrt(hd),
    )
    batch_first = bool(getattr(module, "batch_first", False))

    def vector(X):
        q, kv = X[:, -1:, :], X
        if not batch_first:
            q, kv = q.transpose(1, 0, 2), kv.transpose(1, 0, 2)
        if q.dtype.kind == "V" or q.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch cannot read:
            q, kv = q.astype(np.float32), kv.astype(np.float32)  # exact; new_tensor casts back to the module's dtype
        q, kv = Win.new_tensor(np.ascontiguousarray(q)), Win.new_tensor(np.ascontiguousarray(kv))
        out = _to_numpy(module(q, kv, kv, need_weights=False)[0])
        return out[:, 0, :] if batch_first else out[0]

    dtype = str(getattr(Win, "dtype", A.dtype))
    return FrameworkTarget(vector, E, E, readout=r, dtype=dtype, truth=truth, name="torch MultiheadAttention")
