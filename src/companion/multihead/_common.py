"""What the multi-head learners share (private): the result type, its build and check, thresholds.

Part of :mod:`companion.multihead`; the public names are re-exported there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._learner import (
    COARSE_FACTOR,  # noqa: F401  (tests check both canonical routes use the one factor)
    build,
    names_rounding,
    verify_outputs,
)
from ..attention import MultiHead, SingleHead
from ..errors import InvalidInputError
from ..recovery import Recovery

#: Attention weights outside [BAND, 1 - BAND] are re-measured at a smaller scale. Tighter than
#: Theorem 4.1's SATURATION: a probe is only approximately inside its head's subspace, and
#: sigma^-1 amplifies that leakage by 1 / (alpha (1 - alpha)).
BAND = 0.05
EPS = np.finfo(float).eps


def as_model(model, name="model") -> MultiHead:
    if isinstance(model, MultiHead):
        return model
    if isinstance(model, SingleHead):
        return MultiHead(model.W[None], model.v[None])
    raise InvalidInputError(
        f"{name} must be a MultiHead or SingleHead; got {type(model).__name__}. "
        "Build one with companion.attention.MultiHead(Ws, vs)."
    )


# --------------------------------------------------------------------------------------------
# The result type of the multi-head learners, its build and its check
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class MultiHeadRecovery(Recovery):
    """A :class:`~companion.recovery.Recovery` for a multi-head target.

    Attributes
    ----------
    Ws : ndarray of shape (H, d, d)
        The recovered heads' query-key matrices.
    vs : ndarray of shape (H, d)
        Their value vectors.
    W, v
        ``sum_h W^(h)`` and ``sum_h v^(h)`` (the latter is what length-1 queries return).
    n_queries, message, diagnostics
        As for :class:`~companion.recovery.Recovery`.
    """

    Ws: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    vs: np.ndarray = None  # type: ignore[assignment]

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    @property
    def model(self) -> MultiHead:
        """The recovered model as a :class:`~companion.attention.MultiHead`."""
        return MultiHead(self.Ws, self.vs)


def heads_result(oracle, start, Ws, vs, **fields) -> MultiHeadRecovery:
    """A multi-head learner's result: heads ``Ws`` (H, d, d), ``vs`` (H, d) and their sums ``W``, ``v``.

    ``fields`` (``verification``, ``message``, ``diagnostics``) go to :func:`companion._learner.build`,
    which reads ``n_queries`` from the oracle's counter since ``start``.
    """
    return build(MultiHeadRecovery, oracle, start, W=Ws.sum(axis=0), v=vs.sum(axis=0), Ws=Ws, vs=vs, **fields)


def verify_heads(oracle, model, n, *, rtol, seed, what):
    """:func:`~companion._learner.verify_outputs` for a sum of heads, relative to
    ``max_i sum_h |x_i^T v^(h)|``; returns its verification record (for ``build``)."""
    vs = model.vs
    return verify_outputs(
        oracle,
        model,
        lambda x: max(1e-12, float(np.max(np.abs(x @ vs.T).sum(axis=1)))),
        n,
        rtol=rtol,
        seed=seed,
        what=what,
    )


#: Both canonical-form routes fit sums of logistic terms to float64 rounding: a refusal at float32 or
#: coarser answers names the rounding (companion._learner.names_rounding). Rounding at that level makes
#: them refuse heads of their class too, so the refusal cannot tell a wrong H or a target outside the
#: class from the rounding, and does not claim to (an adversarial tester's finding: three heads given
#: H = 2, at float32, were said to be 'not a wrong H').
fits_name_rounding = names_rounding(
    lambda learner, prec, err: (
        f"{learner} could not resolve the heads, and {prec.describe()}: its fits of logistic sums "
        "need answers exact to float64 rounding, and rounding at this level makes it refuse sums of "
        "heads of its class too, so this refusal cannot tell the rounding from a wrong H or a target "
        "outside the class. At this precision use detect_multi_head(oracle, precision=...) to tell one "
        "head from several; no canonical-form learner here works from answers this coarse. "
        f"(The fit said: {err})"
    )
)


#: Answers within this fraction of the value scale ``max(1, max |x^T v|)`` of zero show no head's
#: softmax: the values cancel (e.g. ``v`` and ``-v`` on equal ``W``). Float64 rounding of a sum of
#: ``O(1)`` terms is about 1e-16 relative, so 1e-13 leaves a thousandfold margin.
INVISIBLE = 1e-13


def visibility_floor(values, *, rel=INVISIBLE) -> float:
    """The largest ``|answer - x^T v|`` that shows no head: ``rel * max(1, max |values|)``.

    ``values`` are the value readings the answers are compared with (``x^T v`` or ``v`` itself).

    Examples
    --------
    >>> visibility_floor([0.5, -4.0])
    4e-13
    >>> visibility_floor([1e-3])
    1e-13
    """
    return rel * max(1.0, float(np.max(np.abs(np.asarray(values, dtype=np.float64)), initial=0.0)))


def redraw_direction(rng, P, i) -> None:
    """A new unit direction ``P[i]`` (in place), drawn until ``cond(P) < 10 d`` (100 tries at most).

    Along the old direction a head's amplitude ``delta_i^T v_h`` may vanish, leaving it unresolved in
    that row; the routes of both canonical-form learners then try another.
    """
    d = P.shape[0]
    for _ in range(100):
        q = rng.standard_normal(d)
        Pn = P.copy()
        Pn[i] = q / np.linalg.norm(q)
        if np.linalg.cond(Pn) < 10 * d:
            break
    P[i] = Pn[i]
