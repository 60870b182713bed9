"""Detection: is the oracle one head? (private; :func:`companion.multihead.detect_multi_head`).

Part of :mod:`companion.multihead` (§7); the public names are re-exported there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._learner import (
    QueryCount,
    AnswerPrecision,
    verify_head,
)
from .._validation import check_int, check_real
from ..errors import OracleInconsistentError
from ..exact import check_exact_oracle, learn_single_head
from ..recovery import Recovery
from ._common import as_model, verify_heads

# --------------------------------------------------------------------------------------------
# Detection: is the oracle one head?
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    """Outcome of :func:`detect_multi_head`.

    Attributes
    ----------
    single_head : bool
        True if a single head explains the oracle on the verification queries.
    max_error : float
        Largest relative disagreement between the oracle and the recovered head on the verification
        queries; ``inf`` when Theorem 4.1's inversion already failed (an attention weight outside
        (0, 1)).
    n_queries : int
        Queries spent, read from the oracle.
    recovery : Recovery or None
        What the single-head learner returned (``None`` if it raised).
    message : str
    """

    single_head: bool
    max_error: float
    n_queries: int
    recovery: Recovery | None
    message: str


def detect_multi_head(oracle, *, verify=64, rtol=1e-6, seed=0, precision=None) -> Detection:
    """Run the single-head learner, then test its answer on ``verify`` fresh random queries.

    Parameters
    ----------
    oracle : ValueQueryOracle
        An exact oracle of dimension ``d``; its budget must allow ``d + d**2 + verify`` queries plus
        any re-measurements of the single-head learner.
    verify : int, default=64
        Number of verification queries (random lengths 1 to 8), ``>= 1``.
    rtol : float, default=1e-6
        Largest relative disagreement that still counts as "one head".
    seed : int, default=0
        Seed of the verification queries.
    precision : None, "measure", str or float, default=None
        The relative rounding ``u`` of the answers, as in
        :func:`companion.exact.learn_single_head` (stated by the oracle if None, else measured
        when the float64 check fails). "One head" then means a disagreement within the larger of
        ``rtol`` and the rounding tolerance ``size(X) u``
        (:func:`companion._learner.head_check_size`), so a float32-served single head is not
        called multi-head, while a multi-head layer, whose disagreement does not shrink with
        ``u``, still is.

    Returns
    -------
    Detection

    Raises
    ------
    TypeError
        If the oracle is approximate.
    InvalidInputError
        If ``verify < 1`` or ``rtol <= 0``.
    NotIdentifiableError
        If the length-1 queries return 0 (then ``sum_h v^(h) = 0`` and the learner cannot start).
    PrecisionError
        If the answers are too coarse (float16, bfloat16) for the check to tell one head from
        several (:func:`companion._learner.verify_outputs`).

    Notes
    -----
    On a multi-head oracle the length-1 queries still return ``sum_h v^(h)`` exactly, but the
    two-token answers are sums of several sigmoids, so Theorem 4.1's inversion [1]_ returns a
    matrix that fits only the queries it used. Fresh queries of other lengths expose it
    (:func:`companion.exact.verify_single_head`); on a single-head oracle the disagreement stays at
    rounding level.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> detect_multi_head(ValueQueryOracle(random_multi_head(4, 2, seed=0))).single_head
    False
    >>> from companion.attention import random_single_head
    >>> detect_multi_head(ValueQueryOracle(random_single_head(4, seed=0))).single_head
    True
    """
    d = check_exact_oracle(oracle, "detect_multi_head")
    verify = check_int(verify, "verify", minimum=1)
    rtol = check_real(rtol, "rtol", minimum=0.0, strict=True)
    seed = check_int(seed, "seed", minimum=0)
    if hasattr(oracle, "require"):
        oracle.require(d + d * d + verify, learner="detect_multi_head")
    count = QueryCount(oracle)
    if precision is None:  # the check's tolerance follows u: measure it first when cheap (as the learner does)
        first = AnswerPrecision(oracle, None, seed=seed + 2)
        if first.measure_first(d + d * d + verify) and first.kind == "rounding":
            precision = first.u
    try:
        rec = learn_single_head(oracle, verify=0, precision=precision)
    except OracleInconsistentError as exc:
        return Detection(
            False,
            float("inf"),
            count.total,
            None,
            f"not a single head: Theorem 4.1's inversion failed ({exc})",
        )
    from .._learner import head_check_size

    prec = AnswerPrecision(oracle, precision if precision != "measure" else rec.diagnostics["precision"], seed=seed + 2)
    scale = float(np.sqrt(np.median(rec.diagnostics["scales"])))
    size = head_check_size(rec.W, rec.v, rec.diagnostics["kappa_W"], 1.0)
    try:
        info = verify_head(
            oracle,
            rec.W,
            rec.v,
            verify,
            rtol=rtol,
            seed=seed,
            scale=scale,
            precision=prec,
            size=size,
            what="a single attention head",
        )
        single, err, tol = True, info["verify_max_error"], info["verify_tolerance"]
        msg = (
            f"consistent with a single head: largest relative disagreement {err:.3g} on "
            f"{verify} fresh queries (tolerance {tol:.3g}; {prec.describe()})"
        )
    except OracleInconsistentError as exc:
        single, err = False, getattr(exc, "max_error", float("inf"))
        why = str(exc).replace("nothing was returned. Pass verify=0 to get the unverified estimate anyway.", "")
        msg = f"not a single head: {why.rstrip()} The single-head fit that failed the check is in .recovery."
    return Detection(single, float(err), count.total, rec, msg)


def verify_model(
    oracle, model, n, *, rtol=1e-6, seed=0, what="a sum of heads in mutually orthogonal subspaces"
) -> float:
    """Largest relative disagreement between ``oracle`` and ``model`` on ``n`` random queries.

    Queries have random lengths 1 to 8 and tokens ``N(0, I_d / d)``; the disagreement is
    ``|VQ(X) - model(X)| / max(1e-12, max_i sum_h |x_i^T v^(h)|)``.

    Parameters
    ----------
    oracle : ValueQueryOracle
        The oracle; ``n`` of its queries are spent.
    model : MultiHead or SingleHead
        The model to compare with it.
    n : int
        Number of queries, ``>= 1``.
    rtol : float, default=1e-6
        Largest disagreement accepted.
    seed : int, default=0
        Seed of the random queries.
    what : str
        What the oracle is assumed to be, for the error message.

    Returns
    -------
    float
        The largest disagreement.

    Raises
    ------
    OracleInconsistentError
        If it exceeds ``rtol``.

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(4, 2, seed=0)
    >>> verify_model(ValueQueryOracle(target), target, 10)
    0.0
    """
    model = as_model(model)
    n = check_int(n, "n", minimum=1)
    return verify_heads(oracle, model, n, rtol=rtol, seed=seed, what=what)["verify_max_error"]
