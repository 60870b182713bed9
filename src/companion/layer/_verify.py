"""The layer learner's verification queries: short ones as every learner's, and long ones (this book's rule)."""

from __future__ import annotations

import numpy as np

from .._learner import VERIFY_MAX_LEN, random_queries
from .._validation import check_real
from ..errors import InvalidInputError, OracleInconsistentError
from ..oracles import unit_roundoff
from ._float32 import FLOAT32_FLOOR_UNITS, FLOAT32_VERIFY_UNITS
from ._norm import rounding_level

__all__ = [
    "VERIFY_LONG_LEN",
    "VERIFY_LONG_SHARE",
    "long_lengths",
    "verify_queries",
    "check_verify_rtol",
    "verify_layer",
    "VERIFY_NEAR",
    "VERIFY_SCALED_SHARE",
]

#: Longest of the layer's verification queries: a quarter of them (``VERIFY_LONG_SHARE``) have lengths from
#: ``VERIFY_MAX_LEN + 1`` to this, spaced geometrically and always including it, the rest lengths 1 to
#: ``VERIFY_MAX_LEN`` as every learner's. With ``H`` given the learner asks no sequence longer than 8 tokens, and an
#: adversarial tester's targets that differ from an attention layer only on longer sequences (a sliding window of 8 or
#: 9 tokens, or scores scaled by ``log N``) were returned, verified on lengths 1 to 8, off by 0.3 to 3.4 at N = 20 to
#: 32; with lengths drawn from 9 to 64 a window of 43 to 63 tokens still passed at the default seed (a second tester,
#: 2026-12-05). A target that differs from an attention layer only on sequences longer than this (a window of 256
#: tokens or more, as Mistral's 4,096) is not seen. Measured (2026-12-05, d = 8, H = 2, three blocks each without
#: LayerNorm, behind a post-LN and a pre-LN in float64, and without LayerNorm served in float32; 400 queries each): the
#: learned blocks' largest error on the long queries was at most that on the short ones. (This book's rule.)
VERIFY_LONG_LEN = 256

#: The share of the verification queries that are long (at least one).
VERIFY_LONG_SHARE = 0.25


#: A verification failure of float64 answers by less than this (relative) states no verdict: an in-class block can
#: end there too. Measured (2026-12-05, an adversarial tester's case): a d = 8 residual block whose two heads are
#: 1e-6 apart, learned with H_bound = 3, failed its check at 3.1e-7 and was called "not an attention layer"; the
#: targets outside the class measured miss by far more (sliding windows 0.3 to 3.4 at N = 20 to 32; a mask over the
#: last 3 tokens at d = 6 refused at the heads' stage). (This book's threshold.)
VERIFY_NEAR = 1e-4


#: Where the learner told its heads apart at a token scale ``s > 1`` (the joint stage's ``joint_token_scale``, passed
#: by the float32 post-LN route), this share of the short verification queries have tokens ``N(0, s^2 I_d / d)``.
#: The score differences grow as ``s^2``: a block whose heads carry float32's error is seen there and not on
#: ``N(0, I_d / d)`` tokens. Measured (2026-12-05, MiniLM layer 0 served in float32, this learner at 5fc9973): a
#: block verified at 46 u on ``N(0, I_d / d)`` tokens, its heads 2.0e-3 off, was 16,000 u off ``transformers``'
#: outputs on the reference's ``N(0, I_d)`` tokens (norm about 20; the joint stage's scale was 16). (This book's rule.)
VERIFY_SCALED_SHARE = 0.25


def long_lengths(k: int) -> np.ndarray:
    """``k`` lengths from ``VERIFY_MAX_LEN + 1`` to ``VERIFY_LONG_LEN``, spaced geometrically, the last the longest."""
    if k == 1:
        return np.array([VERIFY_LONG_LEN])
    return np.unique(np.round(np.geomspace(VERIFY_MAX_LEN + 1, VERIFY_LONG_LEN, k)).astype(int))


def _n_long(n: int) -> int:
    """How many of ``n`` verification queries are long (the last ones)."""
    return max(1, int(round(VERIFY_LONG_SHARE * n)))


def _n_scaled(n: int, scale: float) -> int:
    """How many of ``n`` verification queries' short ones are at the token scale ``scale`` (none at 1)."""
    return 0 if scale == 1.0 else max(1, int(round(VERIFY_SCALED_SHARE * (n - _n_long(n)))))


def verify_queries(d: int, n: int, seed: int, scale: float = 1.0) -> list:
    """The layer learner's ``n`` verification queries: ``companion._learner.random_queries`` of lengths 1 to
    ``VERIFY_MAX_LEN``, then ``max(1, round(VERIFY_LONG_SHARE n))`` of the lengths ``long_lengths`` gives (one of
    ``VERIFY_LONG_LEN`` tokens among them), tokens ``N(0, I_d / d)``; with ``scale`` other than 1 the last
    ``VERIFY_SCALED_SHARE`` of the short ones (at least one) have their tokens times ``scale``."""
    if n < 1:
        return []
    n_long = _n_long(n)
    short = random_queries(d, n - n_long, seed=seed)
    k = _n_scaled(n, scale)
    short = short[: len(short) - k] + [X * scale for X in short[len(short) - k :]]
    rng = np.random.default_rng([seed, 1])
    lengths = long_lengths(n_long)
    lengths = np.concatenate([lengths, rng.integers(VERIFY_MAX_LEN + 1, VERIFY_LONG_LEN + 1, n_long - lengths.size)])
    return short + [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in lengths]


def check_verify_rtol(rtol) -> float:
    """``verify_rtol`` at least float64's unit roundoff (an adversarial tester's 1e-20 refused a correct layer at
    2.4e-15 as "not an attention layer"): no float64 answer meets a smaller one."""
    rtol, u = check_real(rtol, "verify_rtol", minimum=0.0, strict=True), unit_roundoff("float64")
    if rtol < u:
        raise InvalidInputError(f"verify_rtol={rtol!r} is below float64's unit roundoff {u:.4g}: no answer meets it.")
    return rtol


def _floor_note(rtol: float, u: float) -> str:
    """On float32 answers at the default tolerance, what it is measured against (empty at any other ``rtol``)."""
    if rtol != FLOAT32_VERIFY_UNITS * u:
        return ""
    return (
        f" The tolerance, FLOAT32_VERIFY_UNITS = {FLOAT32_VERIFY_UNITS} u, is ten times FLOAT32_FLOOR_UNITS = "
        f"{FLOAT32_FLOOR_UNITS} u, the largest float32 rounding measured on Keras layers: a block served with more "
        "rounding of its own is held to less than ten times it (measured: MiniLM's block served in float32 is 8.1 u "
        "to 11.2 u from its float64 emulation on these queries' shares, data/results/minilm_polish_diagnosis.json). "
        "A larger verify_rtol accepts the block at that tolerance, and certifies only that."
    )


def _scaled_failure(msg: str) -> OracleInconsistentError:
    """The verification's failure on its scaled share alone, marked ``scaled = True`` (the route passes it on as is)."""
    exc = OracleInconsistentError(msg)
    exc.scaled = True  # type: ignore[attr-defined]
    return exc


def verify_layer(
    oracle, layer, n: int, seed: int, rtol: float, u: float, float32: bool, refusal, default=None, scale: float = 1.0
) -> dict:
    """The learned ``layer`` against ``oracle`` on :func:`verify_queries` (``n``, seed ``seed + 1``, ``scale``: the
    token scale of ``VERIFY_SCALED_SHARE`` of the short ones, a failure on them alone named): the relative error
    of each output vector at most ``rtol``, else ``refusal(cause)`` (the learner's verdict), or an InvalidInputError
    naming ``verify_rtol`` where the largest disagreement of float64 answers is within their rounding
    (:func:`~companion.layer._norm.rounding_level` of ``u``), or, for a ``verify_rtol`` below the route's ``default``
    tolerance, within that default (a second tester's post-LN and float32 blocks, refused as the block's "try
    seed=1"): the tolerance asks more than the answers, or the route, carry. A failure on the long queries alone, the
    short ones within ``rtol``, is ``refusal``'s verdict (a length-dependent target: measured, the learned in-class
    blocks miss long queries by no more than short ones, ``VERIFY_LONG_LEN``); any other below ``VERIFY_NEAR`` on
    float64 answers states no verdict."""
    if not n:
        return {"n_verify_queries": 0}
    Xv = verify_queries(oracle.d, n, seed + 1, scale)
    yv, yh = oracle(Xv), layer(Xv)
    err = np.linalg.norm(yv - yh, axis=1) / np.maximum(np.linalg.norm(yv, axis=1), np.finfo(float).tiny)
    k = int(np.argmax(err))
    n_short = n - _n_long(n)  # verify_queries: the short queries first (the scaled ones last), then the long ones
    n_plain = n_short - _n_scaled(n, scale)
    plain, scaled = float(np.max(err[:n_plain], initial=0.0)), float(np.max(err[n_plain:n_short], initial=0.0))
    if not err[k] <= rtol:
        at = f", {err[k] / u:.3g} u of float32" if float32 else ""
        if not float32 and err[k] <= rounding_level(u):  # float64 answers: a verify_rtol below their rounding
            raise InvalidInputError(
                f"on {n} fresh queries the recovered layer disagrees with the oracle by up to {err[k]:.3g} (relative), "
                f"within what the answers' rounding explains ({rounding_level(u):.1e}), and above verify_rtol="
                f"{rtol:.3g}: the tolerance asks more than the answers carry; raise it. Nothing was returned."
            )
        if default is not None and rtol < default and err[k] <= default:  # the caller's check, stricter than ours
            raise InvalidInputError(
                f"on {n} fresh queries the recovered layer disagrees with the oracle by up to {err[k]:.3g} (relative"
                f"{at}), within this route's default tolerance {default:.1e} and above verify_rtol={rtol:.3g}: the "
                "tolerance asks more than this route reaches (behind a LayerNorm, or on float32 answers); raise it. "
                "Nothing was returned."
            )
        cause = f"on {n} fresh queries the recovered layer disagrees with the oracle by up to {err[k]:.3g} (relative"
        if n_plain and plain <= rtol < scaled:  # seen only where the scores' differences are s^2 times larger
            raise _scaled_failure(
                f"{cause}{at}; tolerance {rtol:.3g}) on its {n_short - n_plain} queries whose tokens are {scale:g} "
                f"times larger (N(0, s^2 I / d), s = {scale:g}, the token scale at which the heads were told apart), "
                f"while on N(0, I / d) tokens it agrees to {plain:.2g}: either the heads were resolved only as far as "
                "the small tokens' answers carry them (their score errors grow as s^2; measured on MiniLM served in "
                "float32: VERIFY_SCALED_SHARE) or the target departs from an attention layer on larger tokens only (a "
                f"cap on the scores); not told apart here.{_floor_note(rtol, u) if float32 else ''} Nothing was "
                "returned."
            )
        short, long = float(np.max(err[:n_short], initial=0.0)), float(np.max(err[n_short:]))
        if n_short and short <= rtol < long:  # in-class blocks miss long queries by no more than short ones
            raise refusal(
                f"{cause}{at}; tolerance {rtol:.3g}) on its {n - n_short} long queries (more than {VERIFY_MAX_LEN} "
                f"tokens), while its {n_short} short ones agree to {short:.2g}: answers that depend on the "
                "sequence's length as no attention layer's do (a sliding window, a temperature that grows with N)."
            )
        if not float32 and err[k] < VERIFY_NEAR:  # small: no verdict
            raise OracleInconsistentError(
                f"could not verify the layer learned: {cause}; tolerance {rtol:.3g}), below VERIFY_NEAR = "
                f"{VERIFY_NEAR:g}: an in-class block the learner resolved only that far (two heads nearly equal, "
                "measured: 1e-6 apart with H_bound, 3.1e-7) or a target just outside the class; not told apart here. "
                "Nothing was returned."
            )
        raise refusal(f"{cause}{at}; tolerance {rtol:.3g}).")
    out = {"n_verify_queries": n, "verify_max_error": float(err[k]), "verify_tolerance": rtol}
    if scale != 1.0:  # the scaled share's own largest error, and its scale
        out.update(verify_token_scale=scale, verify_scaled_max_error=scaled)
    return out
