"""Heads as a served model computes them: weights and arithmetic in float32, float16 or bfloat16.

A deployed model answers in the precision it is served in, not in exact float64. This module
holds what the learners need to know about that precision (this book's, not the paper's):

* ``companion.oracles.FORMATS`` and :func:`unit_roundoff` (defined in :mod:`companion.oracles`, which states
  an oracle's precision with them): the relative rounding ``u`` of each format
  (half an ulp of 1: ``2**-53``, ``2**-24``, ``2**-11``, ``2**-8``);
* :func:`round_to`: round float64 values to a format (returned as float64);
* :class:`ServedHead`: a single head whose weights are stored in a format and whose every
  operation (token projections, scores, softmax, weighted sum) is rounded to it, as a framework
  does with float32 weights, or with float16 / bfloat16 operations that accumulate in float32
  and round each result (the usual kernels on CPUs and accelerators);
* :func:`nearest_format`: the format whose ``u`` is nearest (in ratio) to a measured rounding,
  for messages such as "answers carry rounding of about 3e-8 (measured; nearest format float32)".

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

__all__ = [
    "FORMATS",
    "unit_roundoff",
    "round_to",
    "nearest_format",
    "ServedHead",
    "ServedSum",
    "SERVED_LEARNERS",
    "served_accuracy",
]


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
            q = r(x[:, -1, :] @ self._Kt.T)  # W x_N, (B, d)
            scores = r(np.einsum("bnd,bd->bn", x, q))
        else:
            q = r(x[:, -1, :] @ self._Qt)  # Q x_N, (B, k)
            k = r(x @ self._Kt)  # K x_i, (B, N, k)
            scores = r(np.einsum("bnk,bk->bn", k, q))
        values = r(x @ self._v)  # x_i^T v, (B, N)
        e = r(np.exp(r(scores - scores.max(axis=1, keepdims=True))))
        alpha = r(e / r(e.sum(axis=1, keepdims=True)))
        y = r(np.sum(alpha * values, axis=1)).astype(np.float64)
        return y[0] if single else y

    def __repr__(self):
        return f"ServedHead(d={self.d}, fmt={self.fmt!r})"


class ServedSum:
    """Several served heads answered as the sum of their answers: a multi-head target served in one format.

    Each head computes in its own format (see :class:`ServedHead`); the answers are added in float64.
    ``fmt`` is the heads' common format, so that an oracle's perturbation test mode sees the queries
    as the heads receive them.

    Parameters
    ----------
    heads : sequence of ServedHead
        At least one, all of one ``d`` and one ``fmt``.

    Raises
    ------
    InvalidInputError
        If ``heads`` is empty or its heads differ in ``d`` or ``fmt``.

    Examples
    --------
    >>> from companion.attention import random_single_head
    >>> heads = [ServedHead(random_single_head(4, seed=k)) for k in range(2)]
    >>> both = ServedSum(heads)
    >>> X = np.ones((3, 4))
    >>> both.fmt, both.d, bool(both(X) == heads[0](X) + heads[1](X))
    ('float32', 4, True)
    """

    def __init__(self, heads):
        heads = list(heads)
        if not heads or not all(isinstance(h, ServedHead) for h in heads):
            raise InvalidInputError(f"ServedSum takes one or more ServedHead; got {heads!r}.")
        if len({h.d for h in heads}) != 1 or len({h.fmt for h in heads}) != 1:
            raise InvalidInputError(
                f"the heads of a ServedSum share d and fmt; got d={[h.d for h in heads]}, fmt={[h.fmt for h in heads]}."
            )
        self.heads, self.d, self.fmt = heads, heads[0].d, heads[0].fmt
        self.precision = unit_roundoff(self.fmt)

    def __call__(self, X):
        return sum(h(X) for h in self.heads)

    def __repr__(self):
        return f"ServedSum({len(self.heads)} heads, d={self.d}, fmt={self.fmt!r})"


#: The learners :func:`served_accuracy` runs: the exact ones (with the floor of their diagnostics)
#: and chapter 05's approximate-oracle learners (with the oracle's ``tau``).
SERVED_LEARNERS = ("single_head", "sketch", "robust", "robust_lstsq", "low_rank_noisy")


def served_accuracy(learner, fmt, d, *, seed=0):
    """What ``learner`` reaches on a random head served in ``fmt`` at dimension ``d``: one table row.

    Exact learners (``"single_head"``: :func:`~companion.exact.learn_single_head` on a full-rank
    ``random_single_head(d)``; ``"sketch"``: :func:`~companion.lowrank.learn_low_rank` with
    ``method="sketch"`` and ``r = max(1, d // 12)``, MiniLM's ratio of head to model dimension)
    are told the format (``precision=fmt``) and report their floor ``floor_W``. Approximate
    learners (``"robust"``: Theorem 6.2's :func:`~companion.robust.learn_robust`; ``"robust_lstsq"``;
    ``"low_rank_noisy"`` with ``r = max(1, d // 12)``) get a §6 head
    (:func:`~companion.robust.random_margin_head`, ``W_max = 4``, ``mu = 1 / (2 sqrt(d))``, of rank
    ``r`` for ``"low_rank_noisy"``) behind
    ``ApproxValueQueryOracle(noise="none")`` with ``tau = rounding_size(8) u``, the rounding of a
    two-token answer with ``|f| <= 1`` (:func:`companion._learner.rounding_size`). Every learner
    runs unverified (``verify=0``), as chapter 05's sweeps do, so that the number is what it reaches.

    Returns
    -------
    dict
        ``learner``, ``fmt``, ``d``, ``u``, ``error_W`` (relative Frobenius error against the
        stored weights' ``W``), ``floor_W`` (exact learners; NaN otherwise), ``ratio``
        (``error_W / floor_W``), ``tau`` (approximate learners; NaN otherwise), ``n_queries`` and
        ``outcome`` (``"ok"`` or the exception's class and first words when the learner refuses).

    Examples
    --------
    >>> row = served_accuracy("single_head", "float32", 8)
    >>> row["outcome"], bool(row["error_W"] <= 10 * row["floor_W"])
    ('ok', True)
    """
    from ._learner import TWO_TOKEN_ROUNDINGS, rounding_size
    from ._validation import check_int
    from .attention import random_single_head
    from .errors import CompanionError
    from .exact import learn_single_head
    from .lowrank import learn_low_rank
    from .oracles import ApproxValueQueryOracle, ValueQueryOracle
    from .robust import learn_low_rank_noisy, learn_robust, learn_robust_lstsq, random_margin_head

    check_choice(learner, "learner", SERVED_LEARNERS)
    d = check_int(d, "d", minimum=2)
    u = unit_roundoff(check_choice(fmt, "fmt", ("float32", "float16", "bfloat16")))
    r = max(1, d // 12)
    row = {
        "learner": learner,
        "fmt": fmt,
        "d": d,
        "u": u,
        "error_W": float("nan"),
        "floor_W": float("nan"),
        "ratio": float("nan"),
        "tau": float("nan"),
        "n_queries": 0,
        "outcome": "ok",
    }
    W_max, mu = 4.0, 0.5 / np.sqrt(d)
    if learner in ("single_head", "sketch"):
        target = ServedHead(random_single_head(d, rank=None if learner == "single_head" else r, seed=seed + d), fmt)
        oracle = ValueQueryOracle(target, precision=fmt)
    else:
        target = ServedHead(
            random_margin_head(d, W_max=W_max, mu=mu, seed=seed + d, rank=r if learner == "low_rank_noisy" else None),
            fmt,
        )
        row["tau"] = rounding_size(TWO_TOKEN_ROUNDINGS) * u
        oracle = ApproxValueQueryOracle(target, row["tau"], noise="none")
    try:
        if learner == "single_head":
            rec = learn_single_head(oracle, verify=0, seed=seed)
        elif learner == "sketch":
            rec = learn_low_rank(oracle, r, method="sketch", verify=0, seed=seed)
        elif learner == "robust":
            rec = learn_robust(oracle, W_max=W_max, mu=mu, verify=0, seed=seed)
        elif learner == "robust_lstsq":
            rec = learn_robust_lstsq(oracle, W_max=W_max, verify=0, seed=seed)
        else:
            rec = learn_low_rank_noisy(oracle, r, W_max=W_max, verify=0, seed=seed)
    except CompanionError as exc:
        row["outcome"] = f"{type(exc).__name__}: {' '.join(str(exc).split()[:8])}"
        row["n_queries"] = int(oracle.n_queries)
        return row
    row["error_W"] = float(np.linalg.norm(rec.W - target.W) / np.linalg.norm(target.W))
    row["n_queries"] = int(rec.n_queries)
    if "floor_W" in rec.diagnostics:
        row["floor_W"] = float(rec.diagnostics["floor_W"])
        row["ratio"] = row["error_W"] / row["floor_W"] if row["floor_W"] > 0 else float("inf")
    return row
