"""learn_attention_layer's class signatures judged at the answers' precision, not at a fixed constant.

The fresh-clone run of 2026-12-03 refused chapter 09's float32 MiniLM block under the perturbation test
mode (4 ulps, smooth pattern) as "not an attention layer": its answers were no longer exactly float32
numbers, and the post-LN's hyperplane, seen at float32's precision (singular value ratio 9.4e-8),
failed a fixed 1e-9. These tests hold the rule that replaced it (companion.layer._norm): a served
format is found on its grid to within GRID_ULPS, and a deviation is rounding up to ROUNDING_UNITS u.
(jax, a test dependency, brings ml_dtypes' bfloat16.)
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

from companion.errors import OracleInconsistentError, PrecisionError
from companion.layer import learn_attention_layer, random_attention_layer
from companion.layer._norm import (
    GRID_ULPS,
    PRECISION_BAND,
    PROBE_POINTS,
    ROUNDING_UNITS,
    answer_format,
    line_deviations,
    plane_deviation,
    rounding_level,
)
from companion.oracles import PERTURB_PATTERNS, VectorQueryOracle, perturb, unit_roundoff

EPS = np.finfo(np.float64).eps
U64 = unit_roundoff("float64")


class Perturbed:
    """A layer whose answers are multiplied by ``1 + k eps s(X)`` (``s`` of :func:`companion.oracles.perturb`)."""

    def __init__(self, target, k, pattern, cast=None):
        self.target, self.k, self.pattern, self.cast = target, k, pattern, cast
        self.d, self.d_out = target.d, target.d_out

    def __call__(self, X):
        y = self.target(X)
        if self.cast is not None:
            y = y.astype(self.cast).astype(np.float64)
        return y * perturb(np.ones(len(X)), X, self.k, self.pattern)[:, None]


def affine_lines(d_out=6, seed=0):
    """Answers of an affine map on the 4 probe lines, shape (4 * PROBE_POINTS, d_out)."""
    rng = np.random.default_rng(seed)
    A, a = rng.standard_normal((d_out, 3)), rng.standard_normal(d_out)
    t = np.arange(PROBE_POINTS) - (PROBE_POINTS - 1) / 2
    x = rng.standard_normal((4, 3))[:, None, :] + t[None, :, None] * rng.standard_normal((4, 3))[:, None, :]
    return x.reshape(-1, 3) @ A.T + a


@pytest.mark.parametrize("factor, straight", [(0.9, True), (1.1, False)])
def test_a_line_is_straight_up_to_the_rounding_level_just_inside_and_outside(factor, straight):
    Y = affine_lines()
    size = np.linalg.norm(Y, axis=1).max()
    bump = np.zeros(Y.shape[1])
    bump[0] = factor * rounding_level(U64) * size / 2  # at the middle point: second differences 2|bump|
    Y[2] += bump
    dev = line_deviations(Y)
    assert dev[0] == pytest.approx(factor * ROUNDING_UNITS * U64, rel=1e-3)
    assert bool(dev[0] <= rounding_level(U64)) is straight
    assert np.all(dev[1:] <= 8 * U64)  # the other lines: rounding only


@pytest.mark.parametrize("factor, flat", [(0.9, True), (1.1, False)])
def test_a_hyperplane_holds_up_to_the_rounding_level_just_inside_and_outside(factor, flat):
    rng = np.random.default_rng(1)
    Y = rng.standard_normal((60, 5)) @ np.diag([3.0, 2.0, 1.5, 1.0, 0.0]) + 0.5
    Y[:, 4] = 0.25  # exactly on the hyperplane y_4 = 0.25
    n = np.zeros(5)
    n[4] = 1.0
    w = rng.standard_normal(60)
    w -= w.mean()
    w /= np.linalg.norm(w)  # a centred unit column: sigma_min becomes its size
    Y = Y + np.outer(w, n) * factor * rounding_level(U64) * np.linalg.norm(Y)
    assert plane_deviation(Y) == pytest.approx(factor * rounding_level(U64), rel=1e-3)
    assert bool(plane_deviation(Y) <= rounding_level(U64)) is flat


@pytest.mark.parametrize("name, bits", [("bfloat16", 8), ("float16", 11), ("float32", 24)])
@pytest.mark.parametrize("ulps, found", [(GRID_ULPS - 1, True), (GRID_ULPS + 1, False)])
def test_a_served_format_is_found_on_its_grid_just_inside_and_outside_the_slack(name, bits, ulps, found):
    y = np.random.default_rng(2).standard_normal((40, 6))
    m, e = np.frexp(y)
    on_grid = np.ldexp(np.round(np.ldexp(m, bits)), e - bits)
    moved = on_grid * (1.0 + ulps * EPS)
    assert answer_format(on_grid) == (name, 2.0**-bits)
    assert (answer_format(moved) == (name, 2.0**-bits)) is found
    if not found and name != "float32":
        assert answer_format(moved) != (name, 2.0**-bits)


def test_float64_answers_are_on_no_coarser_grid():
    assert answer_format(np.random.default_rng(3).standard_normal((20, 6))) is None
    assert answer_format(np.zeros((4, 6))) is None  # nothing to read a format from


@pytest.mark.parametrize("pattern", PERTURB_PATTERNS)
@pytest.mark.parametrize("kind", ["none", "post", "pre"])
def test_chapter_09s_default_blocks_are_learned_under_a_4_ulp_perturbation(pattern, kind):
    """Chapter 09's defaults (seed 0, d = 6, H = 2, eps = 1e-3), answers moved by 4 ulps, learned within the learner
    seeds the chapter tries (layer.try_seeds): on OpenBLAS's Sandybridge kernel the post-LN block under the smooth
    pattern was refused at learner seed 0, with no verdict, and learned at seed 1 (2026-12-05)."""
    from companion.layer import try_seeds

    if kind == "none":
        block = random_attention_layer(6, 2, residual=True, seed=0)
    else:
        block = random_attention_layer(6, 2, layernorm=kind, residual=True, eps=1e-3, seed=0)
    run = try_seeds(VectorQueryOracle(Perturbed(block, 4, pattern)), range(4), H=2, require=True)
    rec = run.recovery
    assert len(run.refused) <= 1
    assert rec.n_heads == 2 and rec.layernorm == (None if kind == "none" else kind)
    assert rec.diagnostics["verify_max_error"] <= 1e-10


@pytest.mark.parametrize("pattern", PERTURB_PATTERNS)
def test_a_float32_post_ln_under_the_perturbation_is_read_as_float32_not_as_outside_the_class(pattern):
    """The misdiagnosis: answers served in float32, then moved by 4 float64 ulps, are no longer float32
    numbers, and their post-LN hyperplane holds only to float32's precision. Before the fix: 'not an
    attention layer ... no LayerNorm signature ... GELU' (hyperplane ratio about 1e-8 against 1e-9). Since
    2026-12-05 the float32 route learns such a block from the row space (measured: 39.8 u at each pattern)."""
    block = random_attention_layer(6, 2, layernorm="post", residual=True, eps=1e-3, seed=0)
    oracle = VectorQueryOracle(Perturbed(block, 4, pattern, cast=np.float32))
    rec = learn_attention_layer(oracle, H=2)
    assert rec.diagnostics["verify_tolerance"] == 60 * 2.0**-24  # read as float32 answers
    assert rec.diagnostics["heads_learner"] == "joint, norms from the row space"
    assert rec.diagnostics["verify_max_error"] <= rec.diagnostics["verify_tolerance"]


def test_bfloat16_answers_are_refused_naming_bfloat16():
    import ml_dtypes

    block = random_attention_layer(6, 2, residual=True, seed=0)
    oracle = VectorQueryOracle(lambda X: block(X).astype(ml_dtypes.bfloat16).astype(np.float64), d=6, d_out=6)
    with pytest.raises(PrecisionError, match="answers so far are bfloat16 numbers"):
        learn_attention_layer(oracle, H=2)


@pytest.mark.parametrize("layernorm", [None, "post"])
def test_a_float32_computation_off_its_grid_is_refused_for_its_measured_precision(layernorm):
    """Answers computed in float32, then moved off its grid by a float64 step (1 + 1e-9): no format is
    named, the signatures hold only to about 1e-7, and the refusal states that measured precision."""
    kw = {"layernorm": "post", "eps": 1e-3} if layernorm else {}
    block = random_attention_layer(6, 2, residual=True, seed=0, **kw)
    oracle = VectorQueryOracle(lambda X: block(X).astype(np.float32).astype(np.float64) * (1 + 1e-9), d=6, d_out=6)
    with pytest.raises(PrecisionError, match=r"the answers carry about \de-0[789] of precision"):
        learn_attention_layer(oracle, H=2)


def test_a_gelu_after_the_block_stays_outside_the_class_not_a_precision():
    block = random_attention_layer(6, 2, residual=True, seed=2)
    target = VectorQueryOracle(lambda X: (lambda y: 0.5 * y * (1.0 + erf(y / np.sqrt(2.0))))(block(X)), d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match="not an attention layer.*no LayerNorm signature"):
        learn_attention_layer(target, H=2)
    assert PRECISION_BAND < 1e-2  # a GELU misses the signatures by 1e-2 or more (measured, _norm)


def test_a_constant_target_is_no_served_format():
    """An adversarial tester's constant targets (np.ones; an in-class layer without heads, b_O = arange(6)) were called
    "served in bfloat16": few distinct answers lie on every grid. GRID_MIN_DISTINCT = 8: seven distinct dyadic
    answers name no format, eight do (just inside and outside); the targets are now refused as affine."""
    from companion.errors import NotIdentifiableError
    from companion.layer._norm import GRID_MIN_DISTINCT, SIMPLE_BITS, answer_format

    assert (GRID_MIN_DISTINCT, SIMPLE_BITS) == (8, 4)
    eight = (16 * np.arange(1.0, 9.0) + 1) / 64  # 17/64 .. 129/64: on bfloat16's grid, not all within 4 bits
    seven = eight[:7]
    assert answer_format(np.tile(seven, (5, 1))) is None
    assert answer_format(np.tile(eight, (5, 1)))[0] == "bfloat16"
    # answers of at most 4 significant bits (a second tester's 8 to 12 distinct integers) name no format; 5 bits do
    assert answer_format(np.arange(1.0, 16.0)) is None and answer_format(np.arange(17.0, 32.0, 2.0))[0] == "bfloat16"
    for f in (lambda X: np.ones((len(X), 6)), lambda X: np.tile(np.arange(6.0), (len(X), 1))):
        with pytest.raises(NotIdentifiableError, match="affine in the last token"):
            learn_attention_layer(VectorQueryOracle(f, d=6, d_out=6), H=2)


def test_answers_near_the_signatures_are_refused_with_both_causes(monkeypatch):
    """An adversarial tester's in-class layer computed in float16 (off its grid: divided by 3) was called "not an
    attention layer ... (e.g. GELU)", and an exact soft-capping 30 tanh(o / 30) "not exact" with no other cause. Between
    PRECISION_BAND and OUTSIDE_BAND (5e-2: a GELU missed by 1e-2 or more, bfloat16 arithmetic by up to 1.3e-2) the
    refusal names both causes, no verdict; at or above it the verdict stands (the threshold moved to just below and above this target's deviation); below
    PRECISION_BAND the PrecisionError names the soft-capping too."""
    import re

    import companion.layer._learn as learn_module
    from companion.layer._norm import OUTSIDE_BAND

    assert OUTSIDE_BAND == 5e-2
    layer = random_attention_layer(6, 2, residual=True, seed=0)
    f16 = VectorQueryOracle(lambda X: layer(X).astype(np.float16).astype(float) / 3, d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match="could not learn this target") as info:
        learn_attention_layer(f16, H=2)
    message = str(info.value)
    assert "either a target outside the class, or answers with only about that precision" in message
    nearest = float(re.search(r"signatures \(affine lines, or a LayerNorm's\) by a relative (\S+) ", message).group(1))
    assert PRECISION_BAND < nearest < OUTSIDE_BAND
    monkeypatch.setattr(learn_module, "OUTSIDE_BAND", 0.9 * nearest)  # the threshold just below: the verdict
    with pytest.raises(OracleInconsistentError, match="^not an attention layer"):
        learn_attention_layer(VectorQueryOracle(f16.target, d=6, d_out=6), H=2)
    monkeypatch.setattr(learn_module, "OUTSIDE_BAND", 1.1 * nearest)
    with pytest.raises(OracleInconsistentError, match="could not learn this target"):
        learn_attention_layer(VectorQueryOracle(f16.target, d=6, d_out=6), H=2)
    capped = VectorQueryOracle(lambda X: 30 * np.tanh(layer(X) / 30), d=6, d_out=6)
    with pytest.raises(PrecisionError, match="query-dependent scale\\): this check does not tell the two apart"):
        learn_attention_layer(capped, H=2)
