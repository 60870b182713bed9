"""Heads as a served model computes them: weights and arithmetic in float32, float16 or bfloat16.

A deployed model answers in the precision it is served in, not in exact float64. This module
holds what the learners need to know about that precision (this book's, not the paper's):

* :data:`FORMATS` and :func:`unit_roundoff` (defined in :mod:`companion.oracles`, which states
  an oracle's precision with them): the relative rounding ``u`` of each format
  (half an ulp of 1: ``2**-53``, ``2**-24``, ``2**-11``, ``2**-8``);
* :func:`round_to`: round float64 values to a format (returned as float64);
* :class:`ServedHead`: a single head whose weights are stored in a format and whose every
  operation (token projections, scores, softmax, weighted sum) is rounded to it, as a framework
  does with float32 weights, or with float16 / bfloat16 operations that accumulate in float32
  and round each result (the usual kernels on CPUs and accelerators);
* :func:`nearest_format`: the format whose ``u`` is nearest (in ratio) to a measured rounding,
  for messages such as "answers carry rounding of about 3e-8 (float32?)".

How a learner measures the precision of an oracle from its answers alone is
:func:`companion.oracles.measure_precision`; how thresholds follow it is
:mod:`companion._learner` (:func:`~companion._learner.rounding_tolerance`).
"""

from __future__ import annotations

import numpy as np

from ._validation import check_choice
from .attention import SingleHead
from .errors import InvalidInputError
from .oracles import FORMATS, nearest_format, round_to, unit_roundoff

__all__ = ["FORMATS", "unit_roundoff", "round_to", "nearest_format", "ServedHead"]

class ServedHead:
    """A single head served in ``fmt``: stored weights and every operation rounded to it.

    Parameters
    ----------
    head : SingleHead
        The head to serve; with ``head.native = (Q, K, V, w_o)`` it is served through its factors
        (scores ``(K x_i)^T (Q x_N)``, values ``x_i^T (V^T w_o)``), as a framework computes it,
        else through ``W`` and ``v``.
    fmt : {"float32", "float16", "bfloat16"}, default="float32"
        The served format.

    Attributes
    ----------
    d : int
        Input dimension.
    fmt : str
        The format.
    precision : float
        Its unit roundoff (:func:`unit_roundoff`), what the oracle can state.
    W : ndarray of shape (d, d)
        The merged matrix of the *stored* weights, in float64 (the head the answers come from; its
        distance to ``head.W`` is the weights' rounding, not the learner's error).
    v : ndarray of shape (d,)
        The merged value vector of the stored weights.

    Notes
    -----
    float32: ``numpy`` float32 arithmetic throughout. float16 and bfloat16: each operation in
    float32 (matrix products accumulate in float32), its result rounded to the format; the input
    tokens are rounded to the format first, and the answer is returned in float64.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.attention import random_single_head
    >>> head = ServedHead(random_single_head(16, seed=0), "float32")
    >>> X = np.random.default_rng(1).standard_normal((3, 16)) / 4
    >>> exact = SingleHead(head.W, head.v)(X)
    >>> bool(0 < abs(head(X) - exact) < 1e3 * head.precision * abs(exact))
    True
    """

    def __init__(self, head, fmt="float32"):
        if not isinstance(head, SingleHead):
            raise InvalidInputError(f"head must be a SingleHead; got {type(head).__name__}.")
        self.fmt = check_choice(fmt, "fmt", ("float32", "float16", "bfloat16"))
        self.precision = unit_roundoff(self.fmt)
        self.d = int(head.d)
        r = self._round
        if head.native is not None:
            Q, K, V, w_o = (np.asarray(a, dtype=np.float64) for a in head.native)
            v = V.T @ w_o
            self._Qt, self._Kt, self._v = r(Q.T), r(K.T), r(v)
            self.W = self._Kt.astype(np.float64) @ self._Qt.astype(np.float64).T
        else:
            self._Qt, self._Kt, self._v = None, r(head.W), r(head.v)
            self.W = self._Kt.astype(np.float64)
        self.v = self._v.astype(np.float64)

    def _round(self, x):
        """Round to the format; the working dtype is float32 (float16 / bfloat16 values in it)."""
        if self.fmt == "float32":
            return np.asarray(x, dtype=np.float32)
        return round_to(np.asarray(x, dtype=np.float32), self.fmt).astype(np.float32)

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        single = X.ndim == 2
        X = X[None] if single else X
        r = self._round
        x = r(X)
        if self._Qt is None:
            q = r(x[:, -1, :] @ self._Kt.T)                    # W x_N, (B, d)
            scores = r(np.einsum("bnd,bd->bn", x, q))
        else:
            q = r(x[:, -1, :] @ self._Qt)                      # Q x_N, (B, k)
            k = r(x @ self._Kt)                                # K x_i, (B, N, k)
            scores = r(np.einsum("bnk,bk->bn", k, q))
        values = r(x @ self._v)                                # x_i^T v, (B, N)
        e = r(np.exp(r(scores - scores.max(axis=1, keepdims=True))))
        alpha = r(e / r(e.sum(axis=1, keepdims=True)))
        y = r(np.sum(alpha * values, axis=1)).astype(np.float64)
        return y[0] if single else y

    def __repr__(self):
        return f"ServedHead(d={self.d}, fmt={self.fmt!r})"
