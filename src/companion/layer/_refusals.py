"""The layer learner's refusals that state no verdict, where an in-class block can end too, and the one that names an
option the answers contradict (this book's wording)."""

from __future__ import annotations

from ..errors import OracleInconsistentError
from ._directions import DIRECTIONS_MEASURED, DIRECTIONS_MEASURED_FLOAT32
from ._float32 import FLOAT32_HEADS_TOL
from ._norm import chained_cause

__all__ = [
    "FLOAT32_UNRESOLVED",
    "FLOAT32_WHY",
    "POST_HEADS_PRECISION",
    "POST_NO_H",
    "PRE_JOINT_WHY",
    "directions_unresolved",
    "float32_readout_unresolved",
    "float32_unresolved",
    "joint_unresolved",
    "layernorm_excluded",
    "option_conflict",
]


#: The headline of a refusal after the heads' stage of the float32 route: the heads fitted at float32
#: (FLOAT32_HEADS_TOL) can be off enough that an in-class block misfits there too, so it states neither verdict.
FLOAT32_UNRESOLVED = (
    "could not learn this block from its float32 answers: the heads fitted at float32's precision may be off "
    "(an in-class block ends here too, at some learner seeds), or the target is not an attention layer"
)


FLOAT32_WHY = "assumes answers exact to float64 rounding"


def float32_unresolved(exc: Exception, stage: str, seed: int) -> OracleInconsistentError:
    """A float32 route's failure after its heads' stage: an in-class block ends there too, so no verdict."""
    return OracleInconsistentError(
        f"{FLOAT32_UNRESOLVED} (a mask, a second layer). The {stage} failed. {chained_cause(exc, FLOAT32_WHY)} "
        "Measured once (2026-12-04, one machine): chapter "
        "09's default residual block (d = 6, H = 2, random_attention_layer seed 0), in the class, served in "
        "float32, fails the least squares' gate at learner seed 0 (relative residual 0.15) and is learned at "
        "seed 1; the same block with a sliding-window mask over its last 3 tokens fails a stage at each of learner "
        "seeds 0 to 7 (since 2026-12-06 the order check, layer._determinism, then names the mask; this refusal "
        f"passed it). One stage's refusal cannot tell the two apart: try seed={seed + 1}."
    )


def float32_readout_unresolved(why: str, H, joint_from: int, chained: str) -> OracleInconsistentError:
    """The float32 route's heads' learner on a readout refused: no verdict; with ``H`` given, ``heads='joint'``."""
    joint = (
        "; with H given, heads='joint' runs the joint stage at any H (measured 2026-12-06: a new user's three float32 "
        "blocks, d = 8, H = 2, refused here at learner seed 0, were learned with it at 3.4 u to 5.5 u)"
        if H is not None
        else ""
    )
    return OracleInconsistentError(
        f"{why}: the float32 route's heads' learner on a readout (tol={FLOAT32_HEADS_TOL:g}) refused; measured once "
        "(2026-12-04), it resolves H = 2 at d = 6 and 8, not H = 4 or 8 at d = 8 (Keras 3 MultiHeadAttention in "
        f"float32; from H = {joint_from} with H given the joint stage runs instead{joint}), and it ends here on a "
        f"sliding-window mask or a second layer too. Nothing was returned. {chained}"
    )


def layernorm_excluded(layernorm: str, post: bool, plane: float, bent: float, at: str) -> OracleInconsistentError:
    """One-token answers with a post-LN's (``post``) or a pre-LN's signature that ``layernorm`` excludes: the option
    is named, with no verdict (a new user read "not an attention layer ... a mask would do this" there)."""
    sig = (
        f"lie on an affine hyperplane (deviation {plane:.1e}), a post-LN's signature"
        if post
        else "are affine along the all-ones direction only, the signature of a pre-LN (x_N + o(LN(X)), as GPT-2)"
    )
    return OracleInconsistentError(
        f"layernorm={layernorm!r}, but the one-token answers are not affine in the token (second differences "
        f"{bent:.1e} of their size {at}) and {sig}: if the block has that LayerNorm, pass layernorm='auto' "
        f"(or {'post' if post else 'pre'!r}); a nonlinearity after the block can show it too. Nothing was returned."
    )


#: Why an in-class post-LN block can fail after its heads' stage above LOW_GAP (this book's, measured): the
#: heads' learner reads a lifted readout of the LayerNorm's inverted answers (LiftedReadout), whose tokens with a
#: small homogeneous coordinate are large: they raise the LayerNorm's input variance (lower the gap) and the
#: readout cancels most of each answer, so the inversion's rounding reaches the heads, more as d (and the queries)
#: grow.
POST_HEADS_PRECISION = (
    "Behind a post-LN the heads' learner reads a lifted readout of the LayerNorm's inverted answers: its tokens with "
    "a small homogeneous coordinate are large, which lowers the gap and cancels most of each answer, so the "
    "inversion's rounding reaches the heads. Measured (2026-12-04, random_attention_layer residual post-LN blocks, "
    "H = 2, eps 1e-2 and 0.1, seeds 0 to 2, learner seed 0): the heads' stage returns heads off by 2e-7 to 4e-6 "
    "from the exact pre-LN answers, and through the LayerNorm by 7e-4 at d = 16, 1e-2 at d = 24 and up to 0.37 at "
    "d = 32; none of the 6 blocks at d = 16 fails, 6 of the 12 at d = 24 and 32 end here (smallest gaps 1.1e-6 to "
    "1.5e-5; a seventh, at 8.6e-7, is refused for its gap), and learner seed 1 recovers 5 of those 6."
)


#: Appended to a post-LN refusal where ``H`` was not given (a new user's blocks were refused at every seed, the advice
#: "try seed" or a larger eps; measured 2026-12-06, learner seed 0).
POST_NO_H = (
    " H was not given: behind a post-LN the routes that resolve such blocks (the joint heads' stage, the row space's "
    "norms) need it; give H, the number of heads. Measured (2026-12-06): random_attention_layer(8, 2, residual=True, "
    "layernorm='post', seed=1) at eps 1e-3, 1e-5 and 0.1 was refused without H and learned with H=2 (with H_bound=3, "
    "2 of the 3)."
)


PRE_JOINT_WHY = "does not account for a joint heads' stage that did not converge"


def joint_unresolved(
    *,
    norm: str,
    seen: str,
    other: str,
    failed: str,
    chained: str,
    stage: str,
    measured: str,
    seed: int,
    when: str = "2026-12-04",
    learned: str = "learned every in-class block tried",
) -> OracleInconsistentError:
    """The joint heads' stage behind a LayerNorm failed: the causes listed, no verdict, the measured reach."""
    return OracleInconsistentError(
        f"could not learn this {norm} block (its answers {seen} are not a sum of H heads: fewer or more heads than "
        f"H, a mask, a second layer; or {other}{failed} {chained} Measured ({when}), behind a {norm} {stage} "
        f"{learned} (random_attention_layer: {measured}): try seed={seed + 1}. Nothing was returned."
    )


def option_conflict(residual: bool, err: float) -> OracleInconsistentError:
    """The fitted skip is what the other value of ``residual`` names, to the skip's tolerance: the option is wrong,
    not the target. Every route passes this refusal on as it is (its ``option_conflict``)."""
    found, what, target, other = (
        ("0", "||S||_F", "adds no x_N", "False") if residual else ("the identity", "||S - I||_F", "adds x_N", "True")
    )
    exc = OracleInconsistentError(
        f"residual={residual}, but the fitted skip matrix is {found} ({what} = {err:.1e}): the target {target}. "
        f"Pass residual='auto' (the default) or {other}. Nothing was returned."
    )
    exc.option_conflict = True  # type: ignore[attr-defined]
    return exc


def directions_unresolved(exc: Exception, gap: float, seed: int, float32: bool = False, after: str = ""):
    """The row space's route behind a post-LN failed: the causes listed, no verdict, the measured reach (an
    :class:`OracleInconsistentError`); ``after``: the failure of the norms from the gap that sent the learner here."""
    at32 = {"when": "2026-12-05", "learned": "on float32 answers learned"} if float32 else {}
    why = (
        f"{after} on the norms from the gap, so they came from the row space instead"
        if after
        else (f"the smallest 1 - |z|^2/d_out seen was {gap:.1e}, so the norms came from the row space")
    )
    return joint_unresolved(
        norm="post-LN",
        seen="scaled by their row space",
        other="the row space's scaling failed" + (", or the heads fitted at float32's precision are off" * float32),
        failed=f"): {why}.",
        chained=chained_cause(exc, "does not account for the norms taken from the row space"),
        stage="the joint stage on the norms from the row space",
        measured=DIRECTIONS_MEASURED_FLOAT32 if float32 else DIRECTIONS_MEASURED,
        seed=seed,
        **at32,
    )
