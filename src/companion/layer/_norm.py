"""A post-LN read off one-token answers, and the oracle seen before its LayerNorm (this book's own).

Also the refusals' messages: the gap's (:func:`gap_message`, :func:`inferred_gap_message`) and the sentence
every no-verdict refusal of the layer's learner chains its failed stage by (:func:`chained_cause`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..errors import CompanionError, OracleInconsistentError, PrecisionError
from ..oracles import VectorQueryOracle, VectorView, unit_roundoff

__all__ = [
    "coarse_message",
    "float32_message",
    "MIN_GAP",
    "LOW_GAP",
    "GAP_ROUNDING",
    "gap_rounding",
    "centred_singular_values",
    "any_seed",
    "GAP_ROUNDING_UNITS",
    "PROBE_POINTS",
    "PostLN",
    "Denormalised",
    "Scaled",
    "ROUNDING_UNITS",
    "GRID_ULPS",
    "GRID_MIN_DISTINCT",
    "SIMPLE_BITS",
    "PRECISION_BAND",
    "OUTSIDE_BAND",
    "probe_lines",
    "line_deviations",
    "plane_deviation",
    "rounding_level",
    "near_signature_message",
    "answer_format",
    "estimate_post_ln",
    "gap_message",
    "chained_cause",
    "inferred_gap_message",
    "non_finite_first",
    "non_finite_cause",
    "joint_advice",
    "SMALL_OUTPUTS",
    "LARGE_OUTPUTS",
    "UnitScaled",
    "output_scale",
    "HEADS_VISIBLE",
    "heads_share",
    "one_token_affine",
    "faint_heads_message",
]

#: Points per probe line (the token ``x0 + t e`` at ``t = -2 .. 2``).
PROBE_POINTS = 5

#: A deviation from an affine line or hyperplane (:func:`line_deviations`, :func:`plane_deviation`) at most this
#: many units of the answers' precision ``u`` is rounding (:func:`rounding_level`). Measured (2026-12-03, 192
#: blocks: d 4 to 12, H 1 or 2, seeds 0 to 5; with and without post-LN and pre-LN; exact answers and the
#: perturbation test mode at 4 ulps, each pattern): affine lines deviate by at most 37 u, a post-LN's answers
#: lie on their hyperplane to 1.8 u; the lines a LayerNorm or a GELU bends deviate by at least 1.6e14 u (a post-LN's
#: all-ones line), and a GELU's answers leave any hyperplane by at least 9.5e13 u. 256 keeps a factor 7 above 37 u.
ROUNDING_UNITS = 256

#: Float64 ulps of slack within which an answer counts as on a coarser format's grid (:func:`answer_format`).
GRID_ULPS = 64

#: Fewest distinct nonzero answers from which :func:`answer_format` names a format: small integers and dyadic
#: numbers lie on every grid, and an adversarial tester's constant targets (``np.ones``; an in-class layer without
#: heads, ``b_O = arange(6)``) were called "served in bfloat16" (2026-12-05). A layer served in a coarse format
#: answers its first probes with hundreds of distinct values. (This book's threshold.)
GRID_MIN_DISTINCT = 8

#: Answers that all fit this many significant bits (integers below 16, dyadic numbers like 2.75) lie on every
#: format's grid and name none (:func:`answer_format`): a second tester's targets with 8 to 12 distinct integer
#: answers were still "served in bfloat16" after GRID_MIN_DISTINCT (2026-12-05). A layer served in bfloat16 (8 bits)
#: fits 4 bits in all of n answers with probability about 16**-n. (This book's threshold.)
SIMPLE_BITS = 4

#: A target whose one-token answers miss every in-class signature (affine lines; a post-LN's hyperplane; a
#: pre-LN's straight all-ones line) by at most this relative deviation is refused for its precision: its
#: answers fit an attention layer to about that, as a float32 computation would, and the learner needs float64's.
#: Measured (as ROUNDING_UNITS): a GELU after the block misses every signature by at least 1.0e-2 (relative).
PRECISION_BAND = 1e-4

#: Below this relative deviation (and above PRECISION_BAND) a target that misses every in-class signature is refused
#: with no verdict, naming both causes: a nonlinearity after the block (a GELU misses them by at least 1.0e-2,
#: measured as PRECISION_BAND) or answers of about that precision, which an adversarial tester's in-class layers
#: computed in float16 or bfloat16 (off their grid, 1e-3 to 1e-2) and answers with relative noise 1e-4 gave, and
#: were called "not an attention layer"; a second tester found bfloat16 arithmetic up to 1.3e-2 (5 of 480 blocks,
#: 2026-12-05), above the GELU's least: the two overlap, so the verdict waits for 5e-2, four times the largest
#: bfloat16 deviation measured. At or above it the verdict stands. (This book's threshold.)
OUTSIDE_BAND = 5e-2

#: Smallest ``1 - |z|^2 / d_out`` (``z`` the normalised vector) at which the answers still carry the norm of
#: ``P u``: ``eps / (var(u) + eps)``. The norm comes back with a relative error of order ``2**-53 / gap``
#: (measured on MiniLM's block, 2026-12-04: 0.59 times it at the median of its 385 basis answers, from 6e-4 to
#: 2.7 times it), so below it that error is of order 1e-6, a hundred times the 1e-8 the verification asks
#: (this book's threshold). Its role is an early stop, before the heads' stage, where the norm is hopeless; it
#: does not certify the norm above it: LOW_GAP (after a failed stage) and the verification do. It is not raised
#: to LOW_GAP: that would stop earlier, with no measured outcome changed, but LOW_GAP's basis is one block only,
#: and a failed stage below LOW_GAP already names the gap.
MIN_GAP = 1e-10

#: A stage that fails behind a post-LN after answers with a gap below this is refused for the precision the
#: LayerNorm's inversion lost (PrecisionError), not as a target outside the class. The answers' norm error,
#: ``2**-53 / gap``, is relative to the whole answer, but the heads' stage reads the part of its readout that
#: its scaled tokens (HEADS_SCALE) move, far smaller: a norm error of 5e-9 failed a heads' fit at a misfit of
#: 5.9e-4. Measured (2026-12-04, this book's): one d = 8, H = 2 residual post-LN block (random_attention_layer
#: seed 0) at eps 1e-2, 1e-3, 1e-5, 1e-6, 1e-7, learner seeds 0 to 3 (the same queries at each eps): every
#: run whose smallest gap was 2.4e-7 or less failed (heads' fit, least squares or verification; 11 runs), every
#: run at 2.1e-6 or more was learned but one (a faint head at eps 1e-3, gap 6.7e-6, learned at eps 1e-2). 1e-6
#: lies between the two.
LOW_GAP = 1e-6


#: A gap ``1 - |z|^2 / d_out`` below ``-GAP_ROUNDING`` is no rounding of a LayerNorm's (whose gap is at least 0):
#: the answers are not a post-LN's (:func:`estimate_post_ln`). The gap is computed to about ``d_out`` ulps of 1;
#: measured (2026-12-04): two residual post-LN blocks in sequence (d = 12, H = 2, eps 1e-12) give -0.16. On answers
#: of a coarser precision ``u`` (float32's) the bound is ``GAP_ROUNDING_UNITS u`` where that is larger
#: (:func:`gap_rounding`): there the gap carries the rounding of ``gamma`` read off float32 answers, not only of the
#: answers. Measured (2026-12-05, this book's): -0.55 u to -1.4 u (24 residual post-LN blocks rounded to float32,
#: d = 8 to 48, H = 1 to 12, eps 1e-12), at most -36 u (432 blocks without residual, d_out = 4 to 6), -16.6 u
#: (MiniLM's block computed in float32, 45,086 answers), and -5,300 u (an outside tester's in-class block, d = 7,
#: H = 1, d_out = 4, eps 1e-5: gamma read 3.4e-5 off; at 256 u it got the verdict "not an attention layer").
GAP_ROUNDING = 1e-9

#: :func:`gap_rounding`'s factor of ``u`` (this book's): 2**16 u = 3.9e-3 at float32, 12 times the in-class -5,300 u
#: above and 41 times below the outside-class -0.16 (a second layer; GELU before the LayerNorm: -0.64).
GAP_ROUNDING_UNITS = 2**16


def gap_rounding(u: float) -> float:
    """The most negative gap that rounding explains at the answers' precision ``u``: ``GAP_ROUNDING``, or
    ``GAP_ROUNDING_UNITS u`` where that is larger (float32's ``u``: 3.9e-3)."""
    return max(GAP_ROUNDING, GAP_ROUNDING_UNITS * float(u))


def probe_lines(d, rng) -> np.ndarray:
    """One-token probes on 4 lines ``x0 + t e``, ``t = -2 .. 2``: 3 random directions and the all-ones one.

    Returns an array of shape ``(4 * PROBE_POINTS, 1, d)``, line by line.
    """
    t = np.arange(PROBE_POINTS) - (PROBE_POINTS - 1) / 2
    x0 = 0.5 * rng.standard_normal((4, d)) / np.sqrt(d)
    e = 0.5 * rng.standard_normal((4, d)) / np.sqrt(d)
    e[3] = 0.5 / np.sqrt(d)
    return (x0[:, None, :] + t[None, :, None] * e[:, None, :]).reshape(-1, 1, d)


def line_deviations(Y: np.ndarray) -> np.ndarray:
    """Per probe line, ``max_k ||y_k - 2 y_(k+1) + y_(k+2)||`` over the answers' size ``max_i ||y_i||``.

    ``Y`` holds the answers to :func:`probe_lines`, shape ``(4 * PROBE_POINTS, d_out)``. On an affine map
    it is rounding: at most ``4 u`` for answers correct to a relative ``u`` (the second difference adds
    four of them), whatever the line's spread; :func:`rounding_level` gives the threshold.
    """
    L = Y.reshape(4, PROBE_POINTS, -1)
    second = np.linalg.norm(L[:, :-2] - 2 * L[:, 1:-1] + L[:, 2:], axis=2).max(axis=1)
    size = float(np.linalg.norm(Y, axis=1).max())
    return second / max(size, np.finfo(float).tiny)


def centred_singular_values(Y: np.ndarray) -> np.ndarray:
    """The singular values of the centred answers ``(n, d_out)`` over ``||Y||_F``, largest first."""
    s = np.linalg.svd(Y - Y.mean(axis=0), compute_uv=False)
    return s / max(float(np.linalg.norm(Y)), np.finfo(float).tiny)


def plane_deviation(Y: np.ndarray, s: np.ndarray | None = None) -> float:
    """``sigma_min`` of the centred answers ``(n, d_out)`` over ``||Y||_F``: rounding on an affine hyperplane.

    Answers ``Y + E`` correct to a relative ``u`` have ``||E||_2 <= ||E||_F <= u ||Y||_F``, so by Weyl's
    inequality answers on a hyperplane give at most about ``u`` (centring adds at most as much again).
    ``nan`` with ``n <= d_out`` or ``d_out < 2``. ``s``: :func:`centred_singular_values` of ``Y``, if computed.
    """
    if Y.shape[0] <= Y.shape[1] or Y.shape[1] < 2:
        return float("nan")
    return float((centred_singular_values(Y) if s is None else s)[-1])


def near_signature_message(nearest, bent, plane, u, level, *, precision: bool, stated: bool = False) -> str:
    """The refusal of one-token answers that miss every in-class signature by ``nearest`` (relative), above what
    rounding at ``u`` explains (``level``): below PRECISION_BAND (``precision=True``, the PrecisionError's text)
    or below OUTSIDE_BAND (the no-verdict OracleInconsistentError's). Neither tells a coarse precision from a
    target outside the class that bends the answers by that little; both say so. ``stated``: the oracle states
    its precision, which then rules the coarse precision out (a new user's GELU served in float32 was told to
    state it): above PRECISION_BAND the text is a verdict, on the condition that the answers are as precise as
    stated."""
    fit = (
        f"the one-token answers miss an attention layer's signatures (affine lines, or a LayerNorm's) by a relative "
        f"{nearest:.1e} (lines {np.max(bent):.1e}, all-ones line {bent[3]:.1e}, hyperplane {plane:.1e}), above what "
        f"rounding at u = {u:.1e} explains ({level:.1e})"
    )
    if precision:
        if u > unit_roundoff("float64"):  # float32 answers (an outside tester's were told float64 was needed)
            need = "its float32 route needs answers within float32's rounding"
            source = "as a less precise computation would"
        else:
            need = "learn_attention_layer needs answers exact to float64 rounding"
            source = "as a computation in float32 would (not served on a format's grid, so the format is not named)"
        return (
            f"{need}: {fit} and below PRECISION_BAND = {PRECISION_BAND:.0e} (a GELU after the block misses them by "
            f"1e-2 or more, measured). Either the answers carry about {nearest:.0e} of precision, {source}, or the "
            "target bends them by that little (a smooth nonlinearity after the block, e.g. a soft-capping tanh, or a "
            "query-dependent scale): this check does not tell the two apart. Nothing was returned."
        )
    if stated:
        return (
            f"not an attention layer at the oracle's stated precision: {fit}, {nearest / level:,.0f} times that: a "
            "nonlinearity after the block (a GELU misses them by 1e-2 or more, measured), or answers coarser than "
            "the oracle states (bfloat16 arithmetic served as float32 missed them by up to 1.3e-2, measured). "
            "Nothing was returned."
        )
    return (
        f"learn_attention_layer could not learn this target: {fit} and below OUTSIDE_BAND = {OUTSIDE_BAND:.0e} (a GELU "
        "after the block missed them by 1e-2 or more, bfloat16 arithmetic by up to 1.3e-2, measured): either a target "
        "outside the class, or answers with only about "
        "that precision (float16 or bfloat16 arithmetic, noise), which this check does not tell apart; an oracle that "
        "states its precision= has it judged. Nothing was returned."
    )


def rounding_level(u: float) -> float:
    """The largest :func:`line_deviations` or :func:`plane_deviation` that rounding explains at precision ``u``.

    ``ROUNDING_UNITS * u``: a deviation at or below it is rounding (the answers are affine on the line, or on
    a hyperplane), above it the answers are not.

    Examples
    --------
    >>> from companion.oracles import unit_roundoff
    >>> f"{rounding_level(unit_roundoff('float64')):.1e}"
    '2.8e-14'
    """
    return ROUNDING_UNITS * float(u)


def _on_grid(Y: np.ndarray, bits: int) -> bool:
    m, e = np.frexp(Y)
    r = np.ldexp(np.round(np.ldexp(m, bits)), e - bits)
    return bool(np.all(np.abs(Y - r) <= GRID_ULPS * np.finfo(float).eps * np.abs(Y)))


def answer_format(Y: np.ndarray) -> tuple[str, float] | None:
    """The coarsest floating-point format whose grid holds every nonzero answer, to within ``GRID_ULPS``.

    Returns ``(name, unit roundoff)`` for ``"bfloat16"`` (8 significant bits), ``"float16"`` (11) or
    ``"float32"`` (24), or ``None`` when the answers are float64's (no format holds them). ``GRID_ULPS``
    float64 ulps of slack let a served format be found through the perturbation test mode
    (:mod:`companion.oracles`, 4 ulps) or a float64 operation after the rounding; a float64 answer is
    that close to float32's grid with probability ``2 GRID_ULPS 2**-53 / 2**-24``, about ``2.4e-7``, so
    a few dozen answers settle it.

    Examples
    --------
    >>> y = np.random.default_rng(0).standard_normal((20, 6))
    >>> answer_format(y) is None, answer_format(y.astype(np.float32).astype(float))
    (True, ('float32', 5.960464477539063e-08))
    >>> answer_format(y.astype(np.float32).astype(float) * (1 + 4 * np.finfo(float).eps))[0]
    'float32'
    """
    Y = np.asarray(Y, dtype=np.float64)
    Y = Y[np.isfinite(Y) & (Y != 0.0)]
    if np.unique(Y).size < GRID_MIN_DISTINCT or _on_grid(Y, SIMPLE_BITS):  # on every grid: small integers, dyadics
        return None
    for name, bits in (("bfloat16", 8), ("float16", 11), ("float32", 24)):
        if _on_grid(Y, bits):
            return name, 2.0**-bits
    return None


@dataclass(frozen=True)
class PostLN:
    """``y = gamma * z + beta`` with ``z = P u / sqrt(|P u|^2 / d_out + eps)``, read off the answers.

    ``denormalise`` returns ``P u / sqrt(eps)`` (the scale in which ``eps = 1``): ``z / sqrt(1 - |z|^2 / d_out)``.
    """

    gamma: np.ndarray
    beta: np.ndarray
    smallest_gap: list = field(default_factory=lambda: [1.0])  # the smallest 1 - |z|^2 / d_out seen

    def gaps(self, Y: np.ndarray) -> np.ndarray:
        z = (Y - self.beta) / self.gamma
        return 1.0 - (z * z).mean(axis=1)

    def denormalise(self, Y: np.ndarray) -> np.ndarray:
        z = (Y - self.beta) / self.gamma
        gap = 1.0 - (z * z).mean(axis=1)
        if gap.size:
            self.smallest_gap[0] = min(self.smallest_gap[0], float(np.min(gap)))
        if not np.all(gap >= MIN_GAP):
            raise PrecisionError(gap_message(float(np.min(gap))))
        return z / np.sqrt(gap)[:, None]


def gap_message(gap: float, limit: float = MIN_GAP) -> str:
    return (
        f"the post-LN's eps is too small against the variance of x_N + o(X) on these queries: "
        f"1 - |z|^2/d_out = eps / (var + eps) = {gap:.1e} (below {limit:.0e}), so the answers fix the direction of the "
        f"centred block output but its norm only to about {2.0**-53 / max(gap, 1e-300):.1e} (relative). "
        "learn_attention_layer needs that norm (MiniLM's block, eps = 1e-12, gives about 1e-10); nothing was returned."
    )


def chained_cause(exc: Exception, why: str) -> str:
    """The sentence a no-verdict refusal gives in place of quoting the failed stage's message.

    The stage's message is chained (``__cause__``), not quoted: its verdict ("not an attention layer", "the
    answers' rounding") was written for another setting and may not hold here (a reader found both quoted
    inside refusals that disclaim them). ``why`` completes "whose verdict ...", e.g. "assumes exact norms".
    """
    return (
        f"The stage raised {type(exc).__name__}; its own message, whose verdict {why} and so does not apply here, "
        "is this error's __cause__."
    )


def inferred_gap_message(gap: float, cause: Exception, stage: str = "a later stage", *, seed: int) -> str:
    """A stage failed while the smallest gap seen was below LOW_GAP: precision inferred, not measured; both causes."""
    return (
        f"the {stage} failed while the smallest 1 - |z|^2/d_out = eps / (var + eps) seen was {gap:.1e}, "
        f"below LOW_GAP = {LOW_GAP:.0e} (this book's threshold, measured: every measured run below 2.4e-7 failed): "
        f"at that gap the answers carry the norm of the centred block output to about "
        f"{2.0**-53 / max(gap, 1e-300):.1e} of their size, and the heads' stage reads a far smaller part of them, "
        "so the post-LN's eps can be the cause (inferred from the gap, not measured): a larger eps, or smaller "
        "tokens, keeps the gap larger. A target outside the class (a mask, a second layer) ends here too: a sliding "
        "window over the last 3 tokens behind a post-LN with eps = 1e-3 (d = 8, H = 2, H not given) did, at gap "
        "3.0e-9 (an adversarial tester's, measured 2026-12-05); no verdict is stated. The gap depends on the "
        "queries, drawn from the seed: another seed may keep "
        "it larger (measured once, with exact answers on one machine: PyTorch's eps = 1e-5 at d = 8, H = 2, "
        f"smallest gap 2.1e-8 at learner seed 0, refused; 2.4e-6 at seed 2, learned): try seed={seed + 1}. "
        f"Nothing was returned. {chained_cause(cause, 'assumes exact norms')}"
    )


class Denormalised(VectorView):
    """The vector oracle seen before its post-LN: answers ``P u(X) / sqrt(eps)``, counted by the oracle."""

    def __init__(self, vector, norm: PostLN):
        super().__init__(
            lambda X: norm.denormalise(vector(X)), d=vector.d, d_out=vector.d_out, precision=vector.precision
        )
        self.vector = vector


#: Answers whose largest magnitude over the probes and the least squares' queries is below this (and above 0) are
#: learned divided by ``c``, the power of 2 nearest it (:class:`UnitScaled`), the model scaled back. The counts
#: route's visibility floors are absolute (``1e-13 * max(1, ...)``): an adversarial tester's in-class blocks with
#: their outputs scaled by 1e-7 to 1e-10 were refused as "not an attention layer" (the output maps' least squares
#: at a relative residual of 0.28 and 0.42; measured 2026-12-05, d = 6, H = 2 and H unknown), while 1e-6 and
#: 1e-4 were learned to 1.2e-15. A power of 2 keeps each answer exact and on its format's grid.
SMALL_OUTPUTS = 1e-4

#: Answers whose largest magnitude is above this are learned divided by ``c`` as well. Measured 2026-12-05 (H = 2,
#: learner seed 0), before: ``random_attention_layer(8, 2, layernorm="post", seed=2)`` was learned with its outputs
#: times 1e3 and refused times 3e3 (its verification 0.25 off, named "not an attention layer"); of the residual
#: post-LN blocks seeds 0 to 3 (``eps=1e-2``; 0, 2 and 3 learn at unit size), times 1e4 only seed 2 was learned, times
#: 1e6 and 1e9 none. Divided by ``c`` every one of them learns as at unit size.
LARGE_OUTPUTS = 1e2


def output_scale(Y: np.ndarray) -> float:
    """1.0, or the power of 2 nearest ``max |Y|`` where that is below :data:`SMALL_OUTPUTS` and above 0, or above
    :data:`LARGE_OUTPUTS`."""
    top = float(np.max(np.abs(Y))) if Y.size else 0.0
    return float(2.0 ** np.round(np.log2(top))) if 0.0 < top < SMALL_OUTPUTS or top > LARGE_OUTPUTS else 1.0


class UnitScaled(VectorView):
    """A vector oracle whose answers are divided by ``c`` (a power of 2), counted by the oracle."""

    def __init__(self, vector, c):
        super().__init__(lambda X: vector(X) / c, d=vector.d, d_out=vector.d_out, precision=vector.precision)
        self.vector, self.c = vector, c


class Scaled(VectorView):
    """A vector oracle asked at its tokens times ``rho``, counted by the oracle."""

    def __init__(self, vector, rho):
        super().__init__(lambda X: vector(rho * X), d=vector.d, d_out=vector.d_out, precision=vector.precision)
        self.vector = vector


def estimate_post_ln(Y_lines: np.ndarray, Y_all: np.ndarray, u: float = float(np.finfo(float).eps / 2)) -> PostLN:
    """``gamma`` and ``beta`` of a post-LN from one-token answers on probe lines (this book's own).

    1. The answers lie on the hyperplane ``sum_i (y_i - beta_i) / gamma_i = 0``: its normal ``n`` is
       ``1 / gamma`` up to a factor ``kappa``.
    2. On a line ``x0 + t e`` the block is affine, ``P u = p + t q``, so the answers lie on an affine
       2-plane through ``beta``: ``beta`` is where the lines' planes meet.
    3. With ``zeta = (y - beta) n`` and ``z = kappa zeta``, ``P u / sqrt(eps) = z m`` with
       ``m = (1 - kappa^2 |zeta|^2 / d_out)^(-1/2)`` is affine in ``t``: the second differences of
       ``zeta_k m_k`` vanish, which gives the ``m_k`` of a line up to a factor ``mu``; then
       ``1 / (mu^2 m_k^2) + kappa^2 |zeta_k|^2 / d_out = 1`` is linear in ``(1 / mu^2, kappa^2)``.

    The sign of ``gamma`` is a symmetry (:func:`post_ln_symmetry`); it is chosen with ``sum(gamma) > 0``.
    ``u`` is the answers' precision (float64's unit roundoff by default).

    Raises
    ------
    OracleInconsistentError
        If the answers do not fit (a ``kappa^2 <= 0``, a line's ``m_k`` of mixed signs, a gap below
        ``-gap_rounding(u)``).

    Whether the gap carries the norms (``MIN_GAP``) is the caller's to judge: the learner takes them from the
    row space where it does not (:mod:`companion.layer._directions`), and refuses otherwise.
    """
    d_out = Y_all.shape[1]
    _, _, Vt = np.linalg.svd(Y_all - Y_all.mean(axis=0), full_matrices=False)
    n = Vt[-1]
    lines = Y_lines.reshape(4, PROBE_POINTS, d_out)
    lhs, rhs = np.zeros((d_out, d_out)), np.zeros(d_out)
    for L in lines:
        c = L.mean(axis=0)
        D = np.linalg.svd(L - c, full_matrices=False)[2][:2]
        Pi = np.eye(d_out) - D.T @ D
        lhs += Pi
        rhs += Pi @ c
    beta = np.linalg.solve(lhs, rhs)
    rows, ms, norms = [], [], []
    for li, L in enumerate(lines):
        zeta = (L - beta) * n
        R = np.zeros((PROBE_POINTS - 2, d_out, PROBE_POINTS))
        for k in range(PROBE_POINTS - 2):
            R[k, :, k], R[k, :, k + 1], R[k, :, k + 2] = zeta[k], -2 * zeta[k + 1], zeta[k + 2]
        m = np.linalg.svd(R.reshape(-1, PROBE_POINTS))[2][-1]
        if not (np.all(m > 0) or np.all(m < 0)):
            raise OracleInconsistentError(f"probe line {li}: the post-LN's scale factors change sign ({m})")
        for k in range(PROBE_POINTS):
            row = np.zeros(5)
            row[li], row[4] = 1.0 / m[k] ** 2, (zeta[k] @ zeta[k]) / d_out
            rows.append(row)
        ms.append(m)
        norms.append(zeta)
    sol = np.linalg.lstsq(np.array(rows), np.ones(len(rows)), rcond=None)[0]
    kappa2 = sol[4]
    if not kappa2 > 0:  # a gamma_i near 0 ends here too: the learner states no verdict (flat_outputs)
        err = OracleInconsistentError(f"the post-LN fit gives kappa^2 = {kappa2:.3g} <= 0")
        err.flat_outputs = True  # type: ignore[attr-defined]
        raise err
    gamma = 1.0 / (np.sqrt(kappa2) * n)
    if np.sum(gamma) < 0:
        gamma = -gamma
    norm = PostLN(gamma, beta)
    gap = float(np.min(norm.gaps(Y_all)))
    if gap < -gap_rounding(u):
        raise OracleInconsistentError(
            f"read as a post-LN's, an answer's normalised vector has a mean square above 1 (1 - |z|^2/d_out = "
            f"{gap:.2g}, beyond rounding, {gap_rounding(u):.2g}), which no LayerNorm outputs"
        )
    return norm


def non_finite_cause(exc: BaseException | None) -> BaseException | None:
    """The oracle's non-finite answer refusal in ``exc``'s chain (``__cause__``, else ``__context__``), or None."""
    while exc is not None and not getattr(exc, "non_finite", False):
        exc = exc.__cause__ or exc.__context__
    return exc


def non_finite_first(learner):
    """Raise a stage's non-finite answer (``companion.errors.nonfinite_answer_error``) as it is: an adversarial tester's
    NaN answers were reported as the heads' stage failing ("could not resolve the heads ... or not an attention
    layer"), the real cause last."""

    @functools.wraps(learner)
    def run(*args, **kwargs):
        try:
            return learner(*args, **kwargs)
        except CompanionError as exc:
            cause = non_finite_cause(exc)
            if cause is None or cause is exc:
                raise
        # raised after the handler, not in it: there Python would set its __context__ to the error whose chain
        # leads back to it, a cycle that a loop over __cause__ and __context__ never leaves (a new user's hung)
        raise cause

    return run


def joint_advice(H, heads: str, inner) -> str:
    """The readout route's refusal's advice where the joint stage could run instead: ``H`` given, ``d_out >= H``,
    no pre-LN (``inner`` the exact oracle or the post-LN's :class:`Denormalised` view). An adversarial tester's
    in-class blocks refused there (W scaled by 5 and 10) were learned by ``heads="joint"`` (2026-12-05)."""
    if H is None or heads not in ("auto", "readout") or int(inner.d_out) < H:
        return ""
    if type(inner) not in (VectorQueryOracle, Denormalised):  # a pre-LN's normalised view: no joint stage
        return ""
    return "; heads='joint' (every output at once) may resolve them"


def coarse_message(why: str) -> str:
    """A refusal of answers coarser than float32's: what the routes reach, measured."""
    return (
        f"learn_attention_layer needs answers exact to float64 rounding, or served in float32 (its float32 route), "
        f"and {why}: the route stops at precisions coarser than float32's (float16, bfloat16). Measured at "
        "bfloat16's alone (2026-12-04; float16 not measured): forced through the float32 route's stages at "
        "bfloat16's u = 2^-8, the heads' learner refused a d = 6, H = 2 residual block at tol 1e-3 and at 1e-2 (its "
        "largest), learner seeds 0 to 2. Nothing was returned."
    )


def any_seed(err: Exception) -> Exception:
    """``err`` marked as no seed's luck (``err.any_seed = True``): a refusal after the first answers that every
    learner seed would meet (the answers' precision, a size beyond a route's reach); ``try_seeds`` raises it at once."""
    err.any_seed = True  # type: ignore[attr-defined]
    return err


def float32_message(why: str) -> str:
    """A refusal of the float32 route: what it does not reach, measured."""
    return (
        f"the answers are float32's (u = {unit_roundoff('float32'):.1e}), and {why}. The float32 route (this book's) "
        "learns blocks without a LayerNorm whose heads are given (H or H_bound), and post-LN blocks given H with "
        "d_out >= H + 3, their norms from the row space (heads not 'readout'): measured (2026-12-04), behind a post-LN "
        "the readout route's heads' stage resolved none of 12 float32 blocks (d = 6, H = 2, learner seeds 0 to 2); "
        "behind a pre-LN no route was tried; and learn_canonical (H unknown) refuses H = 2, 4, 8 at d = 8. Nothing "
        "was returned."
    )


#: Below this share of the answers (:func:`heads_share`) a refusal of the heads' stage on float64 answers is named a
#: precision limit (this book's threshold, measured 2026-12-05: ``random_attention_layer(6, 2, seed=1)``, its heads'
#: maps scaled down under its O(1) output bias (share 2.7 times the scale) and the same block with a residual (1.4
#: times); learner seeds 0 and 1): scaled by 1e-3, and by 1e-4 with the bias (share 2.7e-4), learned at both seeds;
#: by 1e-4 with the residual (1.4e-4) and 1e-5 with the bias (2.7e-5), at one; by 1e-5 with the residual (1.4e-5) and
#: below, at neither (adversarial testers' heads at 1e-6 to 1e-13 of the answers got "heads unresolved" or
#: "affine").
HEADS_VISIBLE = 1e-4


def one_token_affine(Y1: np.ndarray):
    """The one-token answers as a function of the token, ``x -> a + x A^T``, affine in it: ``a``, ``A`` read off
    ``Y1``, the answers at the token ``0`` and at ``e_1 .. e_d`` (shape ``(d + 1, d_out)``)."""
    return lambda X: Y1[0] + X @ (Y1[1:] - Y1[0])


def heads_share(Y1: np.ndarray, Xfit: list, Yfit: np.ndarray) -> float:
    """How much of the answers the heads make: the largest ``||o(X) - o([x_N])||`` over the least squares' queries
    ``Xfit`` (answers ``Yfit``), ``o([x])`` the one-token map read off ``Y1`` (:func:`one_token_affine`), relative to
    the largest answer. A sum of heads mixes the tokens; the rest of the block is affine in ``x_N``."""
    xN = np.array([x[-1] for x in Xfit])
    top = max(float(np.max(np.linalg.norm(Yfit, axis=1))), np.finfo(float).tiny)
    return float(np.max(np.linalg.norm(Yfit - one_token_affine(Y1)(xN), axis=1))) / top


def faint_heads_message(share: float) -> str:
    """The heads' stage refused answers of which the heads make only ``share``: float64 keeps few of their digits."""
    digits = max(0.0, float(np.log10(share / 2.0**-53)))
    return (
        f"the heads' stage failed, and the heads make at most {share:.1e} of the answers (the rest of the block is "
        f"affine in the last token), below HEADS_VISIBLE = {HEADS_VISIBLE:g}: float64 answers carry about "
        f"{digits:.0f} digits of the heads, which is the likely cause (measured, this book's threshold; not a verdict "
        "on the target). Larger heads against the output bias and skip, or the bias and skip removed from the "
        "answers, give the heads' stage more digits. Nothing was returned."
    )
