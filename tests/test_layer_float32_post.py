"""A post-LN block served in float32: the norms from the row space at float32's precision (this book's own).

The float32 route learns a post-LN block given H (d_out >= H + 3, heads not "readout") through
``companion.layer._directions``, whatever its eps: the gap's norms would lose ``u / gap``. Its thresholds
(``gap_rounding``, ``one_token_tol``) are tested just inside and just outside.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from scipy.special import erf

from companion.errors import OracleInconsistentError, PrecisionError
from companion.layer import (
    AttentionLayer,
    FLOAT32_HEADS_TOL,
    FLOAT32_POLISH_MAX_UNKNOWNS,
    FLOAT32_FREE_POLISH_MAX_UNKNOWNS,
    FLOAT32_VERIFY_UNITS,
    learn_attention_layer,
    random_attention_layer,
)
from companion.layer._directions import (
    DIRECTIONS_RANK_UNITS,
    FLOAT32_POST_VERIFY,
    POLISH_QUERY_FACTOR,
    ROW_SPACE,
    POLISH_TOP_RANGE,
    one_token_tol,
    polish_plan,
    polish_top_plan,
)
from companion.layer._fit import HEAD_OWN_GAP, HEAD_RANK_GAP, polish_row_queries
from companion.layer._norm import GAP_ROUNDING, GAP_ROUNDING_UNITS, PostLN, estimate_post_ln, gap_rounding, probe_lines
from companion.oracles import VectorQueryOracle, unit_roundoff

U32 = 2.0**-24
U64 = 2.0**-53


def _rounded32(f):
    return lambda X: np.asarray(f(X)).astype(np.float32).astype(np.float64)


def _fresh(d, n=200, seed=99):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(1, 9, size=n)]


def _error_u(a, b, X):
    """Largest relative distance over the queries ``X``, in float32's u."""
    ya, yb = a(X), b(X)
    return float(np.max(np.linalg.norm(ya - yb, axis=1) / np.linalg.norm(yb, axis=1))) / U32


def test_thresholds_scale_with_the_answers_precision():
    assert unit_roundoff("float32") == U32 and unit_roundoff("float64") == U64
    assert gap_rounding(U64) == GAP_ROUNDING == 1e-9  # float64: unchanged
    assert gap_rounding(U32) == GAP_ROUNDING_UNITS * U32 == 2**16 * U32
    assert one_token_tol(U64) == 1e-9 and one_token_tol(U32) == 256 * U32


@pytest.mark.parametrize(
    "d, H, eps, seed, bound, polished",
    [(16, 3, 1e-12, 0, 4, True), (8, 2, 1e-3, 2, 4, True), (32, 8, 1e-12, 0, 2, True)],
    ids=["d16-H3-bert-eps", "d8-H2-keras-eps", "d32-H8-bert-eps"],
)
def test_a_post_ln_block_rounded_to_float32_is_learned_from_the_row_space(d, H, eps, seed, bound, polished):
    """Measured (2026-12-05): fresh errors against the exact block 0.8 u and 0.9 u (their answers' own rounding
    0.7 u); ``bound`` is about twice each, rounded up (the verification allows 60 u, on FLOAT32_POST_VERIFY
    queries). H = 8 at d = 32 (17,696 unknowns, polished matrix-free) was refused at the joint stage, a row misfit
    by 0.06 to 0.6, until its rows were restarted (``_joint._restarted``); now 0.90 u (about 4 CPU s). With the
    polish's second stage at the top token scales (POLISH_TOP_RANGE, 2026-12-06; 1,770 more queries at d = 32): 0.24
    u; the others, polished densely, 1.0 u and 1.8 u. With the second stage on its own queries alone (2026-12-07):
    0.22 u."""
    block = random_attention_layer(d, H, residual=True, layernorm="post", eps=eps, seed=seed)
    oracle = VectorQueryOracle(_rounded32(block), d=d, d_out=d)
    rec = learn_attention_layer(oracle, H=H)
    diag = rec.diagnostics
    assert diag["heads_learner"] == ROW_SPACE and rec.n_heads == H and rec.model.layernorm == "post"
    assert diag["skip"] == "multiple of identity"
    assert diag["verify_tolerance"] == FLOAT32_VERIFY_UNITS * U32
    assert diag["verify_max_error"] <= FLOAT32_VERIFY_UNITS * U32
    assert diag["n_verify_queries"] == FLOAT32_POST_VERIFY == 1024
    # a quarter of the short verification queries at the joint stage's token scale (VERIFY_SCALED_SHARE)
    assert diag["verify_token_scale"] == diag["joint_token_scale"] > 1
    assert diag["verify_scaled_max_error"] <= diag["verify_max_error"]
    assert diag["one_token_misfit"] <= one_token_tol(U32)
    assert diag["polished"] is polished and diag["polish_top_queries"] == polish_top_plan(d, d, H)
    assert diag["n_polish_queries"] == polish_plan(d, d, H) + polish_top_plan(d, d, H)  # the second stage's at d = 32
    if polished:
        assert diag["polish_residual_after"] < diag["polish_residual_before"]
    # eps and gamma's scale from the gaps (post_ln_eps): measured (2026-12-06) eps_rtol 33, 1.1e-4 and 222; gamma's
    # scale moved by 1.5e-8, -1.7e-8 and -9.7e-10; eps 1.0e-5 off at eps = 1e-3 (the median rule: 4.2e-5). With the
    # second stage and the fit's noise in eps_rtol (2026-12-06): eps_rtol 34, 1.2e-4 and 114; gamma's scale moved by
    # 1.5e-8, -1.7e-8 and -9.8e-10; eps 1.0e-5 off at eps = 1e-3; verified at 3.84 u, 3.23 u and 0.76 u. With Theta's
    # head blocks factored at d = 32 (_fit.map_ranks, 2026-12-07): eps_rtol 105, gamma's scale moved by -1.0e-9,
    # verified at 0.77 u (the whole Theta's route in the same process: 114, -9.8e-10, 0.76 u)
    assert diag["eps_rtol"] > 0 and abs(diag["gamma_scale"] - 1) < 1e-7
    eps_err = abs(rec.model.canonical().eps / block.canonical().eps - 1)
    if eps == 1e-3:  # determined, and within the precision it states
        assert diag["eps_rtol"] < 1e-3 and eps_err <= diag["eps_rtol"]
    assert _error_u(rec.model, block, _fresh(d)) <= bound
    # canonical: the skip found c P to float32's precision is scaled to I (it kept a unit norm before, the outputs'
    # maps 0.97 off the true ones at d = 32; measured now 3.3e-8)
    truth = rec.model.canonical(), block.canonical()
    assert np.array_equal(rec.model.skip, np.eye(d)) and np.array_equal(truth[0].skip, np.eye(d))
    assert np.linalg.norm(rec.model.Ms - truth[1].Ms) <= 1e-6 * np.linalg.norm(truth[1].Ms)
    if eps == 1e-12:  # the gap is below u: eps is not determined, and says so
        assert diag["eps_rtol"] > 10 and eps_err > 1


def test_the_float32_polish_plan_and_its_cap():
    """Unknowns ``H d (d + 1) + ((H + 1) d + 1) d_out``: 2,384 at d = 16, H = 4 (POLISH_QUERY_FACTOR = 3 times over
    d_out - 2 = 14: 511 queries); 4,876 at d = 23 (a dense polish, inside FLOAT32_POLISH_MAX_UNKNOWNS = 5000), 5,304 at
    d = 24 (matrix-free, 724 queries); MiniLM's 3,691,392 at d = 384, H = 12 (matrix-free, queries of lengths 2 to
    FREE_POLISH_MAX_LEN = 32, whose score differences' floor, 18,480, is below the output maps' 28,990; lengths 2 to
    8 would need 73,920); 4,005,200 at d = 400 (above FLOAT32_FREE_POLISH_MAX_UNKNOWNS = 4,000,000: none)."""
    from companion.layer._directions import FREE_POLISH_MAX_LEN

    assert POLISH_QUERY_FACTOR == 3 and FLOAT32_POLISH_MAX_UNKNOWNS == 5000 and FREE_POLISH_MAX_LEN == 32
    # the matrix-free polish's second stage (POLISH_TOP_RANGE = 4): as many queries again; none on the dense polish
    assert POLISH_TOP_RANGE == 4 and polish_top_plan(16, 16, 4) == polish_top_plan(23, 23, 4) == 0
    assert polish_top_plan(24, 24, 4) == 724 and polish_top_plan(384, 384, 12) == 28_990
    assert polish_top_plan(400, 400, 12) == 0
    assert FLOAT32_FREE_POLISH_MAX_UNKNOWNS == 4_000_000
    assert polish_plan(16, 16, 4) == 511
    assert polish_plan(20, 20, 1) == polish_row_queries(20) == 210  # the score differences' floor (not 207)
    assert polish_plan(23, 23, 4) == -(-3 * 4876 // 21) and polish_plan(24, 24, 4) == -(-3 * 5304 // 22) == 724
    assert polish_row_queries(384, 32) == 18_480 and polish_row_queries(384) == 73_920
    assert polish_plan(384, 384, 12) == -(-3 * 3_691_392 // 382) == 28_990
    assert polish_plan(399, 399, 12) > 0 and polish_plan(400, 400, 12) == 0
    # d = 60, H = 1, d_out = 200 (27,860 unknowns): the matrix-free floor binds, 2 * 60 * 61 * 2 / 32 = 458 queries
    # of lengths 2 to 32 against the output maps' 3 * 27,860 / 198 = 423
    assert polish_plan(60, 200, 1) == polish_row_queries(60, 32) == 458


def test_float32_post_ln_needs_h_and_room_for_the_row_space():
    post = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-3, seed=2)
    oracle = lambda: VectorQueryOracle(_rounded32(post), d=8, d_out=8)  # noqa: E731
    with pytest.raises(PrecisionError, match="float32 numbers.*neither H nor H_bound is given"):
        learn_attention_layer(oracle())
    with pytest.raises(PrecisionError, match="has a post-LN .*row space's norms need H, d_out >= H \\+ 3"):
        learn_attention_layer(oracle(), H_bound=2)
    with pytest.raises(PrecisionError, match="has a post-LN .*heads not 'readout'"):
        learn_attention_layer(oracle(), H=2, heads="readout")
    narrow = random_attention_layer(8, 2, d_out=4, layernorm="post", eps=1e-3, seed=0)  # d_out = 4 < H + 3
    with pytest.raises(PrecisionError, match="has a post-LN .*row space's norms need H, d_out >= H \\+ 3"):
        learn_attention_layer(VectorQueryOracle(_rounded32(narrow), d=8, d_out=4), H=2)
    pre = random_attention_layer(8, 2, residual=True, layernorm="pre", eps=1e-3, seed=0)
    with pytest.raises(PrecisionError, match="float32 numbers.*has a pre-LN \\(found from its answers\\)\\. "):
        learn_attention_layer(VectorQueryOracle(_rounded32(pre), d=8, d_out=8), H=2)


def _ln(y, gamma, beta, eps):
    c = y - y.mean(axis=1, keepdims=True)
    return gamma * c / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps) + beta


@pytest.mark.parametrize("which", ["masked-3", "masked-8", "more-heads", "two-layers", "gelu-before-ln", "gelu-after"])
def test_targets_outside_the_class_behind_a_float32_post_ln_are_refused(which):
    """Measured (2026-12-05, learner seeds 0 and 1): each refused, none returned. A verdict ("not an attention
    layer") only where the answers miss a LayerNorm's outputs by far more than rounding (mean squares 1.19 and
    1.64, against 1 + 1.5e-5); elsewhere the route's no-verdict refusal."""
    d = 16
    base = random_attention_layer(d, 3, residual=True, layernorm="post", eps=1e-12, seed=0)
    bare = base.with_(layernorm=None, gamma=None, beta=None, eps=None)
    gelu = lambda y: 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))  # noqa: E731
    second = random_attention_layer(d, 2, residual=True, layernorm="post", eps=1e-12, seed=5)
    target, cause = {
        "masked-3": (lambda X: base(X[:, -3:]), "could not learn this post-LN block .*a mask"),
        "masked-8": (lambda X: base(X[:, -8:]), "could not learn this post-LN block .*a mask"),
        "more-heads": (
            random_attention_layer(d, 4, residual=True, layernorm="post", eps=1e-12, seed=0),
            "could not learn this post-LN block .*fewer or more heads than H",
        ),
        "two-layers": (
            lambda X: second(np.stack([base(X[:, : i + 1]) for i in range(X.shape[1])], axis=1)),
            "not an attention layer.*mean square above 1",
        ),
        "gelu-before-ln": (
            lambda X: _ln(gelu(bare(X)), base.gamma, base.beta, 1e-12),
            "not an attention layer.*mean square above 1",
        ),
        "gelu-after": (lambda X: gelu(base(X)), "miss an attention layer's signatures"),
    }[which]
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(VectorQueryOracle(_rounded32(target), d=d, d_out=d), H=3)
    if which in ("masked-3", "masked-8", "two-layers"):  # they see positions: the order check's verdict (2026-12-06),
        assert str(info.value).startswith("not an attention layer: its answer at the last token changes")
        assert re.search(cause, str(info.value.__cause__))  # the route's refusal, chained
    else:
        assert re.search(cause, str(info.value))


@pytest.mark.parametrize("layernorm", [None, "post"])
def test_a_gelu_served_in_float32_with_its_precision_stated_gets_the_verdict(layernorm):
    """A new user's finding: a GELU after a block, served in float32, with precision='float32' stated, was told
    that "an oracle that states its precision= has it judged". Stated, the precision rules a coarse computation
    out (its rounding explains 1.5e-5; the GELU misses the signatures by 1.1e-2 and 1.2e-2 here): "not an
    attention layer at the oracle's stated precision", naming a misstated precision as the other cause. Unstated,
    the answers on float32's grid may come from a coarser computation: still no verdict."""
    gelu = lambda y: 0.5 * y * (1.0 + erf(y / np.sqrt(2.0)))  # noqa: E731
    block = random_attention_layer(8, 2, residual=True, layernorm=layernorm, eps=1e-3, seed=0)
    target = _rounded32(lambda X: gelu(block(X)))
    stated = VectorQueryOracle(target, d=8, d_out=8, precision="float32")
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(stated, H=2)
    text = str(info.value)
    assert text.startswith("not an attention layer at the oracle's stated precision: the one-token answers miss")
    times = float(re.search(r"explains \(1\.5e-05\), ([\d,]+) times that", text).group(1).replace(",", ""))
    # 106 to the refusal, then 32 for the determinism check and 32 for the order check (2026-12-06)
    assert 500 < times < 1000 and "answers coarser than the oracle states" in text and stated.n_queries == 170
    with pytest.raises(OracleInconsistentError, match="either a target outside the class, or answers with only"):
        learn_attention_layer(VectorQueryOracle(target, d=8, d_out=8), H=2)


@pytest.mark.parametrize("factor, raises", [(0.5, False), (2.0, True)], ids=["inside", "outside"])
@pytest.mark.parametrize("u", [U64, U32], ids=["float64", "float32"])
def test_gap_rounding_just_inside_and_outside(u, factor, raises):
    """An answer whose normalised vector has mean square ``1 + factor * gap_rounding(u)``."""
    d = 8
    block = random_attention_layer(d, 2, residual=True, layernorm="post", eps=1e-3, seed=2)
    rng = np.random.default_rng(0)
    Yp = block(probe_lines(d, rng))
    z = (Yp[0] - block.beta) / block.gamma
    z *= np.sqrt(d * (1.0 + factor * gap_rounding(u))) / np.linalg.norm(z)
    Y_all = np.concatenate([Yp, (block.beta + block.gamma * z)[None]])
    if raises:
        with pytest.raises(OracleInconsistentError, match="mean square above 1"):
            estimate_post_ln(Yp, Y_all, u)
    else:
        norm = estimate_post_ln(Yp, Y_all, u)
        assert np.allclose(norm.gamma, block.gamma, rtol=1e-9) and np.allclose(norm.beta, block.beta, atol=1e-9)


@pytest.mark.parametrize("factor, raises", [(0.5, False), (2.0, True)], ids=["inside", "outside"])
def test_one_token_tol_just_inside_and_outside_at_float32(monkeypatch, factor, raises):
    """The one-token map's collinearity misfit set to ``factor * one_token_tol(u)`` on a float32 block."""
    import companion.layer._directions as directions

    real = directions.one_token_map

    def forced(*args, **kw):
        A, c, _, X, Y = real(*args, **kw)
        return A, c, factor * one_token_tol(U32), X, Y

    monkeypatch.setattr(directions, "one_token_map", forced)
    block = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-3, seed=2)
    oracle = VectorQueryOracle(_rounded32(block), d=8, d_out=8)
    if raises:
        with pytest.raises(OracleInconsistentError, match="could not learn this post-LN block") as info:
            learn_attention_layer(oracle, H=2)
        assert "not those of an affine map" in str(info.value.__cause__)
    else:
        assert learn_attention_layer(oracle, H=2).diagnostics["one_token_misfit"] == factor * one_token_tol(U32)


os.environ.setdefault("KERAS_BACKEND", "numpy")


class KerasPostLN32:
    """Keras 3 ``MultiHeadAttention(use_bias=True)``, the residual and ``LayerNormalization``: float32 throughout."""

    def __init__(self, keras, d, heads, key_dim, eps, seed):
        keras.utils.set_random_seed(seed)
        self.mha = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim, use_bias=True)
        x = np.zeros((1, 2, d), np.float32)
        self.mha(x, x)
        rng = np.random.default_rng(seed)
        self.mha.set_weights([w + 0.5 * rng.standard_normal(w.shape) for w in self.mha.get_weights()])
        self.ln = keras.layers.LayerNormalization(epsilon=eps)
        self.ln(np.zeros((1, d), np.float32))
        g, b = self.ln.get_weights()
        self.ln.set_weights([g + 0.1 * rng.standard_normal(g.shape), b + 0.1 * rng.standard_normal(b.shape)])
        self.d = self.d_out = d

    def __call__(self, X):
        X = np.asarray(X, np.float32)
        o = np.asarray(self.mha(query=X, value=X, key=X))[:, -1, :]
        return np.asarray(self.ln(o + X[:, -1, :]), np.float64)


@pytest.mark.parametrize(
    "d, H, key_dim, eps, seed, fresh_u",
    [(8, 2, 4, 1e-3, 0, 5.5), (16, 4, 4, 1e-3, 0, 6.2), (12, 3, 4, 1e-5, 0, 4.5), (24, 4, 6, 1e-12, 0, 4.9)],
    ids=["d8-H2", "d16-H4", "d12-H3", "d24-H4-matrix-free"],
)
def test_keras_post_ln_in_float32(d, H, key_dim, eps, seed, fresh_u):
    """Keras computes in float32 (a floor of a few u, not the rounding's 0.6 u). Measured (2026-12-05): polished,
    each block predicts 200 fresh served answers to ``fresh_u`` u (before the polish the verification refused the
    first two at 68 u and 135 u); at d = 24, H = 4 (5,304 unknowns, above the dense polish's 5,000) the verification
    refused it at 153 u unpolished, then it was refused by rule; polished matrix-free (2026-12-05), verified at 11.2 u,
    6.9 u on 200 fresh ones (``fresh_u`` then 9.8 u, 6.7 u, 5.2 u and 6.9 u). Re-measured (2026-12-06, at 5353587):
    ``fresh_u`` as given, verified at 15.2 u, 20.6 u, 13.7 u and 10.9 u; which of the changes between moved them
    (the first three are polished densely) is not told apart. With Theta's head blocks factored at d = 24
    (``_fit.map_ranks``, 2026-12-07): verified at 10.85 u, 4.64 u on the 200 fresh ones (the whole Theta's route in
    the same process: 10.91 u, 4.86 u); with ``P_h^T x_n`` kept per batch in the polish's products (ea893fc, the
    same arithmetic reordered in float32): 10.77 u, 4.62 u. Never a result the verification did not pass, never a
    verdict on these in-class blocks."""
    keras = pytest.importorskip("keras")
    target = KerasPostLN32(keras, d, H, key_dim, eps, seed)
    oracle = VectorQueryOracle(target, d=d, d_out=d)
    rec = learn_attention_layer(oracle, H=H)
    assert rec.diagnostics["polished"] and rec.diagnostics["verify_max_error"] <= FLOAT32_VERIFY_UNITS * U32
    assert _error_u(rec.model, VectorQueryOracle(target, d=d, d_out=d), _fresh(d)) <= 2 * fresh_u


def test_polish_directions_recovers_a_block_from_its_answers_directions_alone():
    """The stage alone (``layer._fit.polish_directions``): from the true heads and output maps moved by 1e-4, on
    exact directions of ``P u`` (float64), the polish returns to the truth up to its scale, which directions do
    not fix: the fitted ``P u`` is parallel to the true one on fresh queries to 1e-10."""
    from companion.layer._fit import features, fit_outputs, group_by_length, polish_directions
    from companion.layer._model import centre

    d, H = 8, 2
    bare = random_attention_layer(d, H, residual=True, seed=4).canonical()
    rng = np.random.default_rng(1)
    Xs = [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(2, 9, size=300)]
    batches, answers = group_by_length(Xs, bare(Xs))
    Ws = bare.Ws
    Theta = fit_outputs(Ws, batches, answers)[0]
    P = centre(d)
    dirs = [Y @ P for Y in answers]
    W0 = Ws + 1e-4 * rng.standard_normal(Ws.shape) * (np.arange(d + 1) < d)[None, :, None]
    T0 = Theta * (1 + 1e-4 * rng.standard_normal(Theta.shape))
    W1, T1, before, after = polish_directions(W0, T0, batches, dirs)
    assert before > 1e-6 and after < 1e-12
    Xf, _ = group_by_length(_fresh(d, 50), np.zeros((50, d)))
    for X in Xf:
        true, fit = features(Ws, X) @ Theta @ P, features(W1, X) @ T1 @ P
        cos = np.einsum("bo,bo->b", true, fit) / np.linalg.norm(true, axis=1) / np.linalg.norm(fit, axis=1)
        assert np.max(1 - cos) < 1e-10


def test_the_row_space_rank_at_float32_counts_above_directions_rank_units(monkeypatch):
    """The joint stage behind a float32 post-LN is given ``rank_tol = DIRECTIONS_RANK_UNITS u`` (16,384 u)."""
    import companion.layer._directions as directions

    seen = {}
    real = directions.learn_heads_joint

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    monkeypatch.setattr(directions, "learn_heads_joint", spy)
    block = random_attention_layer(8, 2, residual=True, layernorm="post", eps=1e-3, seed=2)
    learn_attention_layer(VectorQueryOracle(_rounded32(block), d=8, d_out=8), H=2)
    assert DIRECTIONS_RANK_UNITS == 16384 and seen["rank_tol"] == 16384 * U32
    assert seen["tol"] == FLOAT32_HEADS_TOL and seen["link_tokens"] == 8


@pytest.mark.parametrize("units, learned", [(40, False), (160, True)], ids=["below-rounding", "above-rounding"])
def test_directions_rank_units_just_inside_and_outside_the_rounding(monkeypatch, units, learned):
    """Row 0 of this block (d = 6, H = 1, eps 0.1, seed 1, rounded to float32) has its second singular value, the
    scaled answers' rounding, at 4.7e-6 of the largest (79 u, measured; the third at 2.4e-6): counted in the rank
    below it (refused, rank 2 or 3), not above."""
    import companion.layer._directions as directions

    monkeypatch.setattr(directions, "DIRECTIONS_RANK_UNITS", units)
    block = random_attention_layer(6, 1, residual=True, layernorm="post", eps=0.1, seed=1)
    oracle = VectorQueryOracle(_rounded32(block), d=6, d_out=6)
    if learned:
        assert learn_attention_layer(oracle, H=1, seed=1).n_heads == 1
        return
    with pytest.raises(OracleInconsistentError, match="could not learn this post-LN block") as info:
        learn_attention_layer(oracle, H=1, seed=1)
    assert re.search("span a row space of rank [23], not H = 1", str(info.value.__cause__))


@pytest.mark.parametrize("units, scale", [(2_500_000, 2.0), (3_700_000, 4.0)], ids=["head-above", "head-below"])
def test_the_first_row_doubles_its_token_scale_while_its_rank_is_below_h(monkeypatch, units, scale):
    """Row 0 of this block (d = 8, H = 2, eps 0.1, seed 0, rounded to float32) has its second singular value, a
    head, at 3.55e6 u of the largest at token scale 2 (measured; the other rows' at 2.78e6 u and above): a
    threshold above it doubles the first row's scale (``_joint._token_scale``), where the heads stand out more, and
    the block is learned at scale 4 (before this rule the row was refused at rank 1); one below every row's keeps
    scale 2. 3.7e6 u is just above that head (MiniLM's block served in float32 had its row 0's 12th head at
    14,319 u at scale 2, below ``DIRECTIONS_RANK_UNITS``)."""
    import companion.layer._directions as directions

    monkeypatch.setattr(directions, "DIRECTIONS_RANK_UNITS", units)
    block = random_attention_layer(8, 2, residual=True, layernorm="post", eps=0.1, seed=0)
    oracle = VectorQueryOracle(_rounded32(block), d=8, d_out=8)
    rec = learn_attention_layer(oracle, H=2, seed=0)
    assert rec.n_heads == 2 and rec.diagnostics["joint_token_scale"] == scale
    assert oracle.n_queries == {2.0: 2546, 4.0: 2678}[scale]  # one more first row of 2 H (d + 1 + 24) queries
    assert _error_u(rec.model, block, np.random.default_rng(5).standard_normal((100, 3, 8)) / np.sqrt(8)) < 40


def test_above_the_polish_cap_a_float32_post_ln_is_refused_for_every_seed():
    """Unpolished, the route's heads keep float32's errors (an outside tester's d = 24, H = 5 block, 6,480 unknowns,
    was returned verified at 44.8 u and missed 2 % of fresh queries by more than 60 u, up to 122 u; it is polished
    matrix-free now): above FLOAT32_FREE_POLISH_MAX_UNKNOWNS the block is refused from its first answers."""
    from companion.layer import try_seeds
    from companion.layer._directions import float32_post_reach

    float32_post_reach(4, 24, 24)  # 5,304 unknowns: polished matrix-free
    float32_post_reach(12, 399, 399)  # 3,985,212
    with pytest.raises(PrecisionError, match="this block has 4,005,200 \\(d = 400, H = 12, d_out = 400\\)"):
        float32_post_reach(12, 400, 400)
    block = random_attention_layer(400, 12, residual=True, layernorm="post", eps=1e-8, seed=497)
    oracle = VectorQueryOracle(_rounded32(block), d=400, d_out=400)
    cap = "FLOAT32_FREE_POLISH_MAX_UNKNOWNS = 4,000,000 unknowns; this block has"
    with pytest.raises(PrecisionError, match=cap) as info:
        try_seeds(oracle, range(4), H=12)
    # raised at the first seed, from its first answers (four seeds would ask 4 times as many)
    assert info.value.any_seed and oracle.n_queries < 8000


def test_try_seeds_refuses_seeds_that_are_not_an_iterable():
    from companion.errors import InvalidInputError
    from companion.layer import try_seeds

    block = random_attention_layer(6, 1, residual=True, seed=0)
    with pytest.raises(InvalidInputError, match="seeds must be an iterable of int"):
        try_seeds(VectorQueryOracle(block), None, H=1)


@pytest.mark.parametrize("served", ["float64", "float32"])
def test_answers_spanning_less_than_the_post_ln_hyperplane_get_no_verdict(served):
    """An outside tester's in-class block: no residual, H d_h = 8 value dimensions for d_out = 12 outputs, so the
    answers span fewer than d_out - 1 dimensions and gamma is not read off a hyperplane. It got the verdict "not an
    attention layer" (mean square above 1: -0.27 at float64, -0.55 at float32); now a refusal with no verdict."""
    block = random_attention_layer(8, 2, d_out=12, layernorm="post", eps=1e-5, seed=0)
    target = block if served == "float64" else _rounded32(block)
    with pytest.raises(OracleInconsistentError, match="span fewer than d_out - 1 = 11 affine dimensions") as info:
        learn_attention_layer(VectorQueryOracle(target, d=8, d_out=12), H=2)
    assert "not told apart here" in str(info.value) and "not an attention layer" not in str(info.value)
    wide = random_attention_layer(8, 2, d_out=9, layernorm="post", eps=1e-5, seed=0)  # H d_h = 8 >= d_out - 1
    assert learn_attention_layer(VectorQueryOracle(wide), H=2).n_heads == 2


def test_a_float32_gamma_read_off_small_outputs_is_not_called_outside_the_class():
    """An outside tester's in-class block (d = 7, H = 1, d_out = 4, eps 1e-5, seed 325) rounded to float32: gamma
    is read 3.4e-5 off, and the gap of its answers comes out at -3.2e-4, which gap_rounding's former 256 u called
    "not an attention layer". Within GAP_ROUNDING_UNITS u it is learned or refused with no verdict."""
    block = random_attention_layer(7, 1, d_out=4, layernorm="post", eps=1e-5, seed=325)
    try:
        rec = learn_attention_layer(VectorQueryOracle(_rounded32(block), d=7, d_out=4), H=1)
    except OracleInconsistentError as exc:
        assert str(exc).startswith("could not learn this post-LN block") and "try seed=1" in str(exc)
        return
    assert rec.diagnostics["verify_max_error"] <= FLOAT32_VERIFY_UNITS * U32


def test_a_float32_target_near_the_signatures_is_told_the_float32_routes_need():
    """An outside tester's query-dependent scale, served in float32: its PrecisionError said the learner "needs
    answers exact to float64 rounding" and blamed a computation not served on a format's grid, though every answer
    was a float32 number."""
    base = random_attention_layer(12, 2, residual=True, layernorm="post", eps=1e-5, seed=0)
    target = lambda X: base(X) * (1 + 0.01 * np.tanh(X[:, -1, :1]))  # noqa: E731
    with pytest.raises(PrecisionError, match="^its float32 route needs answers within float32's rounding") as info:
        learn_attention_layer(VectorQueryOracle(_rounded32(target), d=12, d_out=12), H=2)
    assert "float64" not in str(info.value) and "query-dependent scale" in str(info.value)


def test_the_matrix_free_polish_products_are_the_dense_jacobians():
    """``_PolishOperator``'s products ``J v``, ``J^T y`` and its heads' column norms against the dense Jacobian
    of ``_direction_residual`` (the Kaufman approximation both use), off the truth so that nothing vanishes; and on
    the answers (no LayerNorm) against ``residual_and_jacobian``'s."""
    from companion.layer._fit import FREE_POLISH_PRODUCTS, _direction_residual, _PolishOperator, fit_outputs
    from companion.layer._fit import group_by_length
    from companion.layer._fit import residual_and_jacobian
    from companion.layer._model import centre

    d, H = 6, 2
    bare = random_attention_layer(d, H, residual=True, seed=4).canonical()
    rng = np.random.default_rng(1)
    Xs = [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(2, 9, size=60)]
    batches, answers = group_by_length(Xs, bare(Xs))
    Ws = bare.Ws + 1e-2 * rng.standard_normal(bare.Ws.shape)
    Theta = fit_outputs(bare.Ws, batches, answers)[0] + 1e-2
    dirs = [Y @ centre(d) for Y in answers]
    dirs = [w / np.linalg.norm(w, axis=1, keepdims=True) for w in dirs]
    r, J = _direction_residual(Ws, Theta, batches, np.concatenate(dirs), True)
    op = _PolishOperator(Ws, Theta, batches, dirs)
    nW, p = H * d * (d + 1), Theta.shape[0]
    x, y = rng.standard_normal(J.shape[1]), rng.standard_normal(J.shape[0])
    assert np.max(np.abs(op.residual() - r)) < 1e-14
    assert np.max(np.abs(op.matvec(x[:nW].reshape(H, d, d + 1), x[nW:].reshape(p, d)) - J @ x)) < 1e-13
    gW, gT = op.rmatvec(y)
    assert np.max(np.abs(np.concatenate([gW.ravel(), gT.ravel()]) - J.T @ y)) < 1e-13
    assert np.max(np.abs(op.column_norms().ravel() - np.linalg.norm(J[:, :nW], axis=0))) < 1e-13
    # products in float32 (FREE_POLISH_PRODUCTS, the polishes' own): the residual float64's to the bit, the products
    # and column norms to float32's rounding (relative 1e-9 to 1e-5: rounded, not wrong), the Gram matrix float64's
    assert FREE_POLISH_PRODUCTS is np.float32
    op32 = _PolishOperator(Ws, Theta, batches, dirs, products=[X.astype(np.float32) for X in batches])
    assert np.array_equal(op32.residual(), op.residual())
    rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))  # noqa: E731
    Jx = op32.matvec(x[:nW].reshape(H, d, d + 1), x[nW:].reshape(p, d))
    assert Jx.dtype == np.float64 and 1e-9 < rel(Jx, J @ x) < 1e-5
    gW, gT = op32.rmatvec(y)
    assert gW.dtype == gT.dtype == np.float64 and 1e-9 < rel(np.concatenate([gW.ravel(), gT.ravel()]), J.T @ y) < 1e-5
    assert 1e-9 < rel(op32.column_norms().ravel(), np.linalg.norm(J[:, :nW], axis=0)) < 1e-5
    assert rel(op32.gram(), op.gram()) < 1e-6 and op32.gram().dtype == np.float64
    # the same operator on the answers themselves (no LayerNorm): residual Phi Theta - Y, J = [J_W, Phi (x) I]
    r, JW, Phi = residual_and_jacobian(Ws, Theta, batches, answers, True)
    J = np.concatenate([JW, np.einsum("bq,oc->boqc", Phi, np.eye(d)).reshape(-1, d, p * d)], axis=2).reshape(
        -1, nW + p * d
    )
    op = _PolishOperator(Ws, Theta, batches, Ys=answers)
    assert np.max(np.abs(op.residual() + r.ravel())) < 1e-14
    assert np.max(np.abs(op.matvec(x[:nW].reshape(H, d, d + 1), x[nW:].reshape(p, d)) - J @ x)) < 1e-13
    gW, gT = op.rmatvec(y)
    assert np.max(np.abs(np.concatenate([gW.ravel(), gT.ravel()]) - J.T @ y)) < 1e-13
    assert np.max(np.abs(op.column_norms().ravel() - np.linalg.norm(J[:, :nW], axis=0))) < 1e-13


def test_a_block_above_the_dense_polish_is_polished_matrix_free():
    """An outside tester's block (d = 24, H = 5, eps 1e-8, seed 497; 6,480 unknowns, above the dense polish's
    FLOAT32_POLISH_MAX_UNKNOWNS = 5,000) was refused by rule before the matrix-free polish (unpolished it had been
    returned verified at 44.8 u while missing 2 % of fresh queries by more than 60 u, up to 122 u). Measured
    (2026-12-05, learner seed 0): polished by LSMR (43, 23 and 9 iterations in three Gauss-Newton steps), its residual
    from 1.4e-6 to 2.2e-8, verified at 1.10 u on 1,024 queries, 1.08 u from the exact block on 1,000 fresh ones;
    the bounds are about three times. With a quarter of the short verification queries at the joint stage's token
    scale 2 (VERIFY_SCALED_SHARE) and the polish's scales log-uniform from 1 to 2, verified at 1.73 u, on those:
    bound 5 u (3.19 u when the polish asked every token at scale 2). With each polish query weighted by its token
    scale (FREE_POLISH_SCALE_POWER, 2026-12-06): LSMR 35, 39 and 12, residual 2.5e-6 to 2.2e-8, verified at 1.67 u,
    0.73 u from the exact block. With the heads' rows factored at their rank 4 (``_fit.head_ranks``, 2026-12-06): LSMR
    30 and 5, residual 2.5e-6 to 2.4e-8, verified at 1.04 u, 0.53 u from the exact block; with the LayerNorm's gamma,
    beta polished too: LSMR 39 and 10, to 2.2e-8, verified at 1.01 u, 0.50 u; its beta alone, gamma held
    (POLISH_LN_GAMMA): LSMR 39 and 8, to 2.2e-8, verified at 1.03 u, 0.52 u; with the second stage at the top token
    scales (POLISH_TOP_RANGE: 884 more queries) LSMR 11 and 6 more, to 2.3e-8 on both stages' queries, verified at
    0.76 u, 0.33 u from the exact block. With Theta's head blocks factored too (``_fit.map_ranks``, 2026-12-07): LSMR
    39 and 8, then 12 and 6, to 2.4e-8, verified at 0.76 u, 0.31 u from the exact block on 200 fresh queries (0.37 u
    on 1,000); the whole Theta's route in the same process: the same iterations, 2.3e-8, 0.76 u, 0.33 u (0.37 u).
    With the second stage on its own queries alone (2026-12-07): LSMR 39 and 8, then 16 and 6, verified at 0.80 u,
    0.32 u from the exact block (0.38 u on 1,000)."""
    block = random_attention_layer(24, 5, residual=True, layernorm="post", eps=1e-8, seed=497)
    oracle = VectorQueryOracle(_rounded32(block), d=24, d_out=24)
    rec = learn_attention_layer(oracle, H=5)
    diag = rec.diagnostics
    assert diag["polished"] and diag["n_polish_queries"] == 2 * polish_plan(24, 24, 5) == 2 * 884
    assert diag["polish_top_queries"] == polish_top_plan(24, 24, 5) == 884 and len(diag["polish_top_lsmr_iterations"])
    assert len(diag["polish_lsmr_iterations"]) >= 1 and diag["polish_rank"] == diag["polish_map_rank"] == [4] * 5
    assert diag["polish_residual_after"] < 3e-2 * diag["polish_residual_before"]
    assert diag["verify_max_error"] == diag["verify_scaled_max_error"] <= 5 * U32
    assert _error_u(rec.model, block, _fresh(24)) <= 3


@pytest.mark.parametrize("steps, bound", [(1, 3), (2, 3)])
def test_the_matrix_free_polish_takes_at_most_free_polish_steps(monkeypatch, steps, bound):
    """FREE_POLISH_STEPS = 8 Gauss-Newton steps at most (MiniLM served in float32 took all 8, 2026-12-06). The
    d = 24, H = 5 block above takes 3 by itself (measured 2026-12-06: LSMR 38, 48 and 15 iterations, verified at
    1.7 u); capped at 1 or 2 it stops there, verified at 15.3 u and 1.9 u (the bounds about twice). With the polish's
    queries weighted (FREE_POLISH_SCALE_POWER, 2026-12-06): 35, 39 and 12 iterations, 1.67 u; capped, 13.9 u and
    1.65 u. With the heads' rows factored at their rank 4 (``_fit.head_ranks``, 2026-12-06) it takes 2 (30 and 5
    iterations, 1.04 u); capped at 1, 1.04 u (the bounds about three times). With gamma, beta polished too: 39 and 10
    iterations, 1.01 u; capped at 1, 1.02 u. With beta alone, gamma held (POLISH_LN_GAMMA): 39 and 8, 1.03 u; capped
    at 1, 1.02 u. With the second stage and Theta's head blocks factored (``_fit.map_ranks``, 2026-12-07): 39 and 8,
    0.76 u; capped at 1, 0.76 u. With the second stage on its own queries alone (2026-12-07): 39 and 8, then 16 and
    6, 0.80 u; capped at 1, 0.79 u."""
    from companion.layer import FREE_POLISH_STEPS
    from companion.layer import _fit

    assert FREE_POLISH_STEPS == 8
    monkeypatch.setattr(_fit, "FREE_POLISH_STEPS", steps)
    block = random_attention_layer(24, 5, residual=True, layernorm="post", eps=1e-8, seed=497)
    rec = learn_attention_layer(VectorQueryOracle(_rounded32(block), d=24, d_out=24), H=5)
    diag = rec.diagnostics
    assert len(diag["polish_lsmr_iterations"]) == steps
    assert diag["polish_residual_after"] < diag["polish_residual_before"]
    assert diag["verify_max_error"] <= bound * U32


def _scaled_polish(power, monkeypatch, d=32, H=4, seed=0, max_len=32, rank=None, beta_off=0.0, ln=False):
    """The matrix-free directions' polish on a proxy of MiniLM's (this book's): a post-LN residual block whose heads
    are 0.03 times a random block's (scores barely spread at token scale 1), answers rounded to float32, queries of
    lengths 2 to 32 at token scales log-uniform from 1 to 16, the heads' rows started 3% off and ``Theta`` 1e-3 off;
    the queries' weights ``t^-power``, the heads factored at ``rank`` (None: not factored); the directions from a
    ``beta`` ``beta_off`` off (relative), polished with the rest where ``ln``. Returns the heads' median relative
    error, the unweighted residual (on the true ``beta``'s directions) over its value at the truth, and the LSMR
    iterations (and with ``beta_off``, the polished ``beta``'s relative error; with ``ln`` too, ``gamma``'s)."""
    from companion.layer import _fit
    from companion.layer._fit import _PolishOperator, group_by_length, polish_directions_free

    monkeypatch.setattr(_fit, "FREE_POLISH_SCALE_POWER", power)
    block = random_attention_layer(d, H, residual=True, layernorm="post", eps=1e-3, seed=seed).canonical()
    block = block.with_(Ws=block.Ws * 0.03).canonical()
    rng = np.random.default_rng(seed + 100)
    n = polish_plan(d, d, H)
    lengths, scales = rng.integers(2, max_len + 1, size=n), np.exp(rng.uniform(0.0, np.log(16.0), size=n))
    Xs = [rng.standard_normal((int(m), d)) * (t / np.sqrt(d)) for m, t in zip(lengths, scales)]
    batches, answers = group_by_length(Xs, np.array([_rounded32(block)(X[None])[0] for X in Xs]))
    dirs = [(Y - block.beta) / block.gamma for Y in answers]
    E = rng.standard_normal(d)
    norm = PostLN(gamma=block.gamma, beta=block.beta + beta_off * np.linalg.norm(block.beta) * E / np.linalg.norm(E))
    truth = np.concatenate([block.Ms[h][:, :d].T for h in range(H)] + [block.skip.T, block.b_O[None, :]])
    Ws = block.Ws.copy()
    for h in range(H):
        E = rng.standard_normal((d, d + 1))
        Ws[h, :d] += 0.03 * np.linalg.norm(block.Ws[h, :d]) * E / np.linalg.norm(E)
    Theta = truth + 1e-3 * np.linalg.norm(truth) * rng.standard_normal(truth.shape) / np.sqrt(truth.size)
    t = group_by_length(Xs, scales)[1]
    if ln:
        Ws, Theta, _, _, info = polish_directions_free(Ws, Theta, batches, answers, scales=t, rank=rank, norm=norm)
    else:
        seen = [(Y - norm.beta) / norm.gamma for Y in answers]
        Ws, Theta, _, _, info = polish_directions_free(Ws, Theta, batches, seen, scales=t, rank=rank)
    assert info["rank"] == (None if rank is None else [rank] * H)
    What = [w / np.linalg.norm(w, axis=1, keepdims=True) for w in dirs]
    res = lambda W, T: np.linalg.norm(_PolishOperator(W, T, batches, What=What).residual())  # noqa: E731
    heads = np.median([np.linalg.norm(Ws[h, :d] - block.Ws[h, :d]) / np.linalg.norm(block.Ws[h, :d]) for h in range(H)])
    out = float(heads), float(res(Ws, Theta) / res(block.Ws, truth)), sum(info["lsmr_iterations"])
    if not beta_off:
        return out
    beta = info["beta"] if ln else norm.beta
    out = (*out, float(np.linalg.norm(beta - block.beta) / np.linalg.norm(block.beta)))
    return (*out, float(np.linalg.norm(info["gamma"] - block.gamma) / np.linalg.norm(block.gamma))) if ln else out


def test_the_free_polish_weights_each_query_by_its_token_scale(monkeypatch):
    """FREE_POLISH_SCALE_POWER = 1: each query's residual weighted by 1 / t. Measured (2026-12-06, the proxy of
    _scaled_polish, d = 32, H = 4, seed 0): the heads 9.8e-8 off, the residual 1.11 times its value at the truth, in
    237 LSMR iterations; unweighted (power 0) 1.9e-6 off, 5.7 times, 553 iterations (all 8 steps); power 2, 3.0e-7 off,
    5.0 times. The bounds lie between."""
    from companion.layer import FREE_POLISH_SCALE_POWER

    assert FREE_POLISH_SCALE_POWER == 1
    heads, res, its = _scaled_polish(1, monkeypatch)
    assert heads < 2e-7 and res < 1.5 and its < 400
    heads, res, its = _scaled_polish(0, monkeypatch)
    assert heads > 1e-6 and res > 3 and its > 400
    heads, res, _ = _scaled_polish(2, monkeypatch)
    assert heads > 2e-7 and res > 3


def test_the_polish_operator_weighs_each_query_row():
    """``weights`` multiply each query's residual and its row of the Jacobian: against the unweighted operator's,
    row by row, to rounding; and they are refused on the answers (no directions to weigh)."""
    from companion.layer._fit import _PolishOperator, group_by_length

    d, H = 6, 2
    block = random_attention_layer(d, H, residual=True, layernorm="post", seed=4).canonical()
    rng = np.random.default_rng(1)
    Xs = [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(2, 9, size=60)]
    batches, answers = group_by_length(Xs, block(Xs))
    dirs = [(Y - block.beta) / block.gamma for Y in answers]
    dirs = [w / np.linalg.norm(w, axis=1, keepdims=True) for w in dirs]
    Ws = block.Ws + 1e-2 * rng.standard_normal(block.Ws.shape)
    Theta = rng.standard_normal((H * d + d + 1, d))
    weights = [rng.uniform(0.1, 2.0, size=X.shape[0]) for X in batches]
    op, opw = _PolishOperator(Ws, Theta, batches, dirs), _PolishOperator(Ws, Theta, batches, dirs, weights=weights)
    w_rows = np.concatenate([np.repeat(w, d) for w in weights])
    assert np.allclose(opw.residual(), w_rows * op.residual(), rtol=1e-13, atol=0)
    dW, dT = rng.standard_normal((H, d, d + 1)), rng.standard_normal(Theta.shape)
    assert np.allclose(opw.matvec(dW, dT), w_rows * op.matvec(dW, dT), rtol=1e-12, atol=1e-15)
    y = rng.standard_normal(w_rows.size)
    for a, b in zip(opw.rmatvec(y), op.rmatvec(w_rows * y)):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="directions' residual only"):
        _PolishOperator(Ws, Theta, batches, Ys=answers, weights=weights)


def test_heads_of_a_common_rank_are_polished_factored(monkeypatch):
    """``polish_directions_free(..., rank=r)`` takes each head's rows as ``A_h B_h^T`` of rank ``r``. Measured
    (2026-12-06, _scaled_polish's proxy, d = 32, H = 4, heads of rank 8, seed 0): on queries of 2 to 6 tokens (about
    3 score differences each) the heads 5.3e-8 off in 136 LSMR iterations, factored, against 1.9e-7 in 406; on 2 to
    32 tokens 3.6e-8 in 125 against 9.8e-8 in 237. Both reach the truth's residual (1.11 and 1.13 times it, 6
    tokens). The bounds lie between."""
    heads, res, its = _scaled_polish(1, monkeypatch, max_len=6, rank=8)
    assert heads < 1e-7 and res < 1.2 and its < 200
    heads, res, its = _scaled_polish(1, monkeypatch, max_len=6)
    assert heads > 1.2e-7 and res < 1.2 and its > 300


def test_the_factored_heads_step_is_the_product_rule_and_its_adjoint():
    """``_Factored``: the step ``dA B^T + A dB^T`` and its adjoint agree (``<dW(x), g> = <x, grad(g)>``); a move keeps
    the product ``(A + dA)(B + dB)^T`` to rounding, balanced again; the start is the rows' best rank-``r`` fit; a
    head of a lower rank keeps its factors' further columns zero."""
    from companion.layer._fit import _Factored

    rng = np.random.default_rng(3)
    H, d, r = 3, 7, 2
    W = rng.standard_normal((H, d, r)) @ rng.standard_normal((H, r, d + 1)) + 1e-3 * rng.standard_normal((H, d, d + 1))
    f = _Factored(W, r)
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    assert np.allclose(f.W(), (U[:, :, :r] * s[:, None, :r]) @ Vt[:, :r], rtol=0, atol=1e-13)
    x, g = rng.standard_normal(f.A.size + f.B.size), rng.standard_normal((H, d, d + 1))
    assert np.sum(f.dW(x) * g) == pytest.approx(float(x @ f.grad(g)), rel=1e-13)
    dA, dB = x[: f.A.size].reshape(f.A.shape), x[f.A.size :].reshape(f.B.shape)
    moved = f.moved(x)
    want = (f.A + dA) @ (f.B + dB).transpose(0, 2, 1)
    assert np.allclose(moved.W(), want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert np.allclose(moved.A.transpose(0, 2, 1) @ moved.A, moved.B.transpose(0, 2, 1) @ moved.B, atol=1e-12)
    per_head = _Factored(W, [1, 2, 2])  # head 0 at rank 1: its second columns zero, in the step and after it
    assert np.linalg.matrix_rank(per_head.W()[0]) == 1 and np.all(per_head.A[0, :, 1] == 0)
    assert np.sum(per_head.dW(x) * g) == pytest.approx(float(x @ per_head.grad(g)), rel=1e-13)
    assert np.all(per_head.grad(g)[: f.A.size].reshape(f.A.shape)[0, :, 1] == 0)
    after = per_head.moved(x)
    assert np.all(after.A[0, :, 1] == 0) and np.all(after.B[0, :, 1] == 0)


def _operator_data(rng, d, d_out, ln):
    """40 random queries of 2 to 6 tokens grouped by length, random answers, and the operator's data on them:
    the LayerNorm's answers with a random ``(gamma, beta)`` where ``ln``, else the answers' unit directions."""
    from companion.layer._fit import group_by_length

    Xs = [rng.standard_normal((int(k), d)) / np.sqrt(d) for k in rng.integers(2, 7, size=40)]
    batches, answers = group_by_length(Xs, rng.standard_normal((40, d_out)))
    if ln:
        return batches, answers, {"ln": (answers, 1.0 + 0.1 * rng.standard_normal(d_out), 0.1 * rng.standard_normal(d_out))}
    return batches, answers, {"What": [y / np.linalg.norm(y, axis=1, keepdims=True) for y in answers]}


@pytest.mark.parametrize("ln", [False, True])
def test_the_operator_on_factored_heads_gives_the_rows_products_without_forming_them(ln):
    """``_PolishOperator(..., factors=(A, B))``: ``matvec`` of the factors' step ``(dA, dB)`` is the rows' product at
    ``dW = dA B^T + A dB^T``, and ``rmatvec``'s ``(gA, gB)`` are the rows' gradient through ``_Factored.grad``
    (float64 products: to 1e-13 relative; float32's, as the polishes take them: to float32's rounding), a head of a
    lower rank included; the residual, Theta's and the LayerNorm's blocks are the rows route's to 1e-13 (the
    scores formed as ``A_h (B_h^T x~_N)``: the same numbers but for the order of the sums). ``_polish_free``'s
    products take this route on factored heads (measured 2026-12-07 in one process, one BLAS thread, at MiniLM's
    size, d = 384, H = 12, rank 32, 8,000 random queries of lengths 2 to 32: an LSMR iteration's two products from
    2.29 to 1.60 CPU s and 2.38 to 1.82 in two runs on a shared machine, 0.70 and 0.77 times the rows')."""
    from companion.layer._fit import _Factored, _PolishOperator

    rng = np.random.default_rng(5)
    H, d, r, d_out = 3, 9, 3, 7
    f = _Factored(rng.standard_normal((H, d, r)) @ rng.standard_normal((H, r, d + 1)) / d, [1, 3, 3])
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = f.W()
    Theta = rng.standard_normal(((H + 1) * d + 1, d_out)) / d
    batches, answers, data = _operator_data(rng, d, d_out, ln)
    x, dT = rng.standard_normal(f.A.size + f.B.size), rng.standard_normal(Theta.shape)
    dln = rng.standard_normal((2, d_out)) if ln else None
    rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))  # noqa: E731
    for products, tol in ((None, 1e-13), ([X.astype(np.float32) for X in batches], 1e-5)):
        rows = _PolishOperator(Ws, Theta, batches, products=products, **data)
        fac = _PolishOperator(Ws, Theta, batches, products=products, factors=f.factors(), **data)
        assert rel(fac.residual(), rows.residual()) < 1e-13
        assert rel(fac.matvec(f.tangent(x), dT, dln), rows.matvec(f.dW(x), dT, dln)) < tol
        y = rng.standard_normal(rows.residual().size)
        g_rows, g_fac = rows.rmatvec(y), fac.rmatvec(y)
        assert rel(f.adjoint(g_fac[0]), f.grad(g_rows[0])) < tol
        assert all(rel(a, b) < max(tol, 1e-13) for a, b in zip(g_fac[1:], g_rows[1:]))
        assert np.all(f.adjoint(g_fac[0])[: f.A.size].reshape(f.A.shape)[0, :, 1:] == 0)  # head 0: rank 1
    if ln:
        return
    # and the polish: the same steps as through the rows (dW formed, as before 2026-12-07), to float32's rounding
    from companion.layer import _fit

    zero = [np.zeros((X.shape[0], d_out)) for X in batches]
    u = _PolishOperator(Ws, Theta, batches, Ys=zero).residual()  # the exact block's answers, Phi Theta
    answers = np.split(u.reshape(-1, d_out), np.cumsum([X.shape[0] for X in batches])[:-1])
    start = (Ws + 1e-3 * rng.standard_normal(Ws.shape), Theta + 1e-3)
    for products, tol in ((np.float64, 1e-7), (np.float32, 1e-4)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_fit, "FREE_POLISH_PRODUCTS", products)
            got = _fit.polish_free(*start, batches, answers, iters=2, rank=[1, 3, 3])
            mp.setattr(_fit._Factored, "tangent", _fit._Factored.dW)
            mp.setattr(_fit._Factored, "adjoint", _fit._Factored.grad)
            mp.setattr(_fit._Factored, "factors", lambda self: None)
            want = _fit.polish_free(*start, batches, answers, iters=2, rank=[1, 3, 3])
        assert got[4]["lsmr_iterations"] == want[4]["lsmr_iterations"] and got[3] < 0.1 * got[2]
        # LSMR (stopped at 1e-3) carries the products' rounding into its iterates a million times over (measured:
        # the heads 1.4e-9 apart with float64's products, 5.8e-6 with float32's)
        assert rel(got[0], want[0]) < tol and got[3] == pytest.approx(want[3], rel=100 * tol)


def test_maps_take_each_heads_best_fit_and_their_step_and_adjoint_agree():
    """``_Maps``: ``Theta()`` is each head block's best fit of its rank (its SVD truncated), the skip's and bias's rows
    as given; ``tangent`` and ``adjoint`` are adjoint (``<tangent(y), g> = <y, adjoint(g)>``), a head of rank 1 has its
    second and third columns zero in the step, its gradient and after a move; the whiteners make their Gram matrices
    the identity (``T^T G T = I``)."""
    from companion.layer._fit import _Maps, _PolishOperator, _whitener, group_by_length

    rng = np.random.default_rng(6)
    H, d, d_out = 3, 9, 7
    Theta = rng.standard_normal(((H + 1) * d + 1, d_out)) / d
    m = _Maps(Theta, H, [1, 3, 3])
    blocks = Theta[: H * d].reshape(H, d, d_out)
    for h, r in enumerate([1, 3, 3]):
        U, s, Vt = np.linalg.svd(blocks[h])
        best = (U[:, :r] * s[:r]) @ Vt[:r]
        assert np.allclose(m.Theta()[h * d : (h + 1) * d], best, rtol=0, atol=1e-14)
    assert np.array_equal(m.Theta()[H * d :], Theta[H * d :])
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = rng.standard_normal((H, d, d + 1))
    Xs = [rng.standard_normal((int(k), d)) / np.sqrt(d) for k in rng.integers(2, 7, size=40)]
    batches, answers = group_by_length(Xs, rng.standard_normal((40, d_out)))
    op = _PolishOperator(Ws, m.Theta(), batches, Ys=answers, maps=m.maps())
    m.prepare(op)
    Gx, Gs = op.gram_blocks()
    eye = np.eye(d)
    assert np.allclose(m.Tx.transpose(0, 2, 1) @ Gx @ m.Tx, eye, atol=1e-9)
    assert np.allclose(m.Ts.T @ Gs @ m.Ts, np.eye(d + 1), atol=1e-9)
    T = _whitener(Gx[0])
    assert np.allclose(T.T @ Gx[0] @ T, eye, atol=1e-9)
    y = rng.standard_normal(m.size)
    g = (rng.standard_normal(m.P.shape), rng.standard_normal(m.Q.shape), rng.standard_normal(m.Sb.shape))
    step = m.tangent(y)
    assert sum(float(np.sum(a * b)) for a, b in zip(step, g)) == pytest.approx(float(y @ m.adjoint(g)), rel=1e-12)
    assert np.all(step[0][0, :, 1:] == 0) and np.all(step[1][0, :, 1:] == 0)
    assert np.all(m.adjoint(g)[: m.P.size].reshape(m.P.shape)[0, :, 1:] == 0)
    after = m.moved(step)
    assert np.all(after.P[0, :, 1:] == 0) and np.all(after.Q[0, :, 1:] == 0)
    assert np.linalg.matrix_rank(after.Theta()[:d]) == 1
    # a move is the factors' sum, balanced: the same blocks, P^T P = Q^T Q diagonal
    want = (m.P + step[0]) @ (m.Q + step[1]).transpose(0, 2, 1)
    assert np.allclose(after.P @ after.Q.transpose(0, 2, 1), want, rtol=0, atol=1e-13)
    PtP, QtQ = after.P.transpose(0, 2, 1) @ after.P, after.Q.transpose(0, 2, 1) @ after.Q
    assert np.allclose(PtP, QtQ, atol=1e-13) and np.allclose(PtP - PtP * np.eye(3), 0, atol=1e-13)


@pytest.mark.parametrize("ln", [False, True])
def test_the_operator_on_factored_maps_gives_thetas_products_without_forming_them(ln):
    """``_PolishOperator(..., maps=(P, Q))``: ``matvec`` of Theta's factors' step ``(dP, dQ, dSb)`` is the whole
    Theta's product at ``dM_h = dP_h Q_h^T + P_h dQ_h^T`` (``dSb`` the skip's and bias's rows), and ``rmatvec``'s
    ``(gP, gQ, gSb)`` are ``(gM_h Q_h, gM_h^T P_h, gSb)`` of the whole Theta's gradient (float64 products: to 1e-13
    relative; float32's: to float32's rounding), with the heads factored or not, a map of rank 1 included; the heads'
    gradient as the whole route's (the same to rounding: ``(x_n - xbar_h)^T M_h z`` is formed from ``P_h^T x_n``, kept
    per batch, and ``Q_h^T z``), the residual and the LayerNorm's block to 1e-13 (u formed as
    ``sum_h (xbar_h P_h) Q_h^T``: the sums reordered); the heads' columns' norms as the whole route's, on
    the directions and on the answers themselves (``Z Z^T = Yp K Yp^T``, no ``(B, N, d_out)`` product formed)."""
    from companion.layer._fit import _Factored, _Maps, _PolishOperator

    rng = np.random.default_rng(7)
    H, d, d_out = 3, 9, 7
    m = _Maps(rng.standard_normal(((H + 1) * d + 1, d_out)) / d, H, [1, 3, 3])
    Theta = m.Theta()
    f = _Factored(rng.standard_normal((H, d, d + 1)) / d, [2, 3, 3])
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = f.W()
    batches, answers, data = _operator_data(rng, d, d_out, ln)
    step = (rng.standard_normal(m.P.shape), rng.standard_normal(m.Q.shape), rng.standard_normal(m.Sb.shape))
    dM = step[0] @ m.Q.transpose(0, 2, 1) + m.P @ step[1].transpose(0, 2, 1)
    dT = np.concatenate([dM.reshape(H * d, d_out), step[2]])
    x = rng.standard_normal(f.A.size + f.B.size)
    dln = rng.standard_normal((2, d_out)) if ln else None
    rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))  # noqa: E731
    for products, tol in ((None, 1e-13), ([X.astype(np.float32) for X in batches], 1e-5)):
        for factors, dW in ((None, f.dW(x)), (f.factors(), f.tangent(x))):
            whole = _PolishOperator(Ws, Theta, batches, products=products, factors=factors, **data)
            mapped = _PolishOperator(Ws, Theta, batches, products=products, factors=factors, maps=m.maps(), **data)
            assert rel(mapped.residual(), whole.residual()) < 1e-13  # u as sum_h (xbar_h P_h) Q_h^T: sums reordered
            assert rel(mapped.matvec(dW, step, dln), whole.matvec(dW, dT, dln)) < tol
            y = rng.standard_normal(whole.residual().size)
            g_whole, g_mapped = whole.rmatvec(y), mapped.rmatvec(y)
            gM = g_whole[1][: H * d].reshape(H, d, d_out)
            assert rel(g_mapped[1][0], gM @ m.Q) < tol and rel(g_mapped[1][1], gM.transpose(0, 2, 1) @ m.P) < tol
            assert rel(g_mapped[1][2], g_whole[1][H * d :]) < tol
            heads = [g_whole[0]] if factors is None else g_whole[0]
            assert all(rel(a, b) < tol for a, b in zip([g_mapped[0]] if factors is None else g_mapped[0], heads))
            if ln:
                assert rel(g_mapped[2], g_whole[2]) < 1e-13
            assert rel(mapped.column_norms(), whole.column_norms()) < tol
            on_answers = {"Ys": answers}
            cn = [_PolishOperator(Ws, Theta, batches, products=products, maps=M, **on_answers) for M in (m.maps(), None)]
            assert rel(cn[0].column_norms(), cn[1].column_norms()) < tol


@pytest.mark.parametrize("norm", [False, True])
def test_the_polish_on_factored_maps_reaches_the_block_as_the_whole_theta_does(norm):
    """``polish_free`` and ``polish_directions_free`` (weighted, the LayerNorm's ``beta`` an unknown) with
    ``map_rank``: from a start 1e-3 off a block of heads of ranks 1, 3, 3 and maps of the same ranks, four steps lower
    the residual as far as the whole Theta's route does (within a factor 10; both by more than 1,000 times); the
    head blocks returned have the maps' ranks; ``info["map_rank"]`` names them."""
    from companion.layer._fit import _Factored, _Maps, _PolishOperator, group_by_length, polish_directions_free, polish_free

    rng = np.random.default_rng(8)
    H, d, d_out = 3, 12, 12
    ranks = [1, 3, 3]
    Theta = _Maps(rng.standard_normal(((H + 1) * d + 1, d_out)) / np.sqrt(d), H, ranks).Theta()
    Ws = np.zeros((H, d + 1, d + 1))
    Ws[:, :d, :] = _Factored(3 * rng.standard_normal((H, d, d + 1)) / d, ranks).W()
    Xs = [rng.standard_normal((int(k), d)) / np.sqrt(d) for k in rng.integers(2, 9, size=400)]
    batches, _ = group_by_length(Xs, np.zeros((400, d_out)))
    zero = [np.zeros((X.shape[0], d_out)) for X in batches]
    u = _PolishOperator(Ws, Theta, batches, Ys=zero).residual()  # the exact block's answers, Phi Theta
    answers = np.split(u.reshape(-1, d_out), np.cumsum([X.shape[0] for X in batches])[:-1])
    start = (Ws + 1e-3 * rng.standard_normal(Ws.shape) * (np.arange(d + 1) < d)[:, None], Theta + 1e-3)
    if norm:
        gamma, beta = 1.0 + 0.1 * rng.standard_normal(d_out), 0.1 * rng.standard_normal(d_out)
        ys = [gamma * (a - a.mean(1, keepdims=True)) / a.std(1, keepdims=True) + beta for a in answers]
        ln = PostLN(gamma=gamma, beta=beta + 1e-4)
        scales = [np.ones(X.shape[0]) for X in batches]
        run = lambda **k: polish_directions_free(*start, batches, ys, iters=4, scales=scales, norm=ln, **k)  # noqa: E731
    else:
        run = lambda **k: polish_free(*start, batches, answers, iters=4, **k)  # noqa: E731
    got, want = run(rank=ranks, map_rank=ranks), run(rank=ranks)
    assert got[4]["map_rank"] == ranks and want[4]["map_rank"] is None
    assert got[2] == want[2] and want[3] < 1e-3 * want[2] and got[3] < 1e-3 * got[2] and got[3] < 10 * want[3]
    blocks = got[1][: H * d].reshape(H, d, d_out)
    assert [np.linalg.matrix_rank(b, tol=1e-12 * np.abs(b).max()) for b in blocks] == ranks


@pytest.mark.parametrize("gap, want", [(HEAD_RANK_GAP * 1.05, [2, 4, 4]), (HEAD_RANK_GAP / 1.05, None)])
def test_map_ranks_reads_the_head_blocks_by_head_ranks_rule(gap, want):
    """``map_ranks``: :func:`head_ranks`'s rule on Theta's head blocks ``M_h`` (``(d, d_out)``, here 16 by 20, so up
    to ``min(d, d_out) // 4 = 4``), not on the skip's and bias's rows below them (full rank here): blocks of ranks 2, 4,
    4 whose gaps' geometric mean is HEAD_RANK_GAP times 1.05 are named (just inside), at 1 / 1.05 not (just outside);
    a block of rank 5 leaves every map unfactored."""
    from companion.layer._fit import map_ranks

    d, d_out = 16, 20
    rng = np.random.default_rng(9)

    def block(s):
        U, V = np.linalg.qr(rng.standard_normal((d, d)))[0], np.linalg.qr(rng.standard_normal((d_out, d)))[0]
        return (U * s) @ V.T

    # the three heads' largest gaps: g2 (head 0), gap and gap, with g2 = gap so that their mean is gap
    s2 = np.concatenate([[1.0, 0.9], 0.9 / gap * 0.95 ** np.arange(d - 2)])
    s4 = np.concatenate([[1.0, 0.9, 0.8, 0.7], 0.7 / gap * 0.95 ** np.arange(d - 4)])
    s5 = np.concatenate([[1.0, 0.9, 0.8, 0.7, 0.6], 1e-6 * 0.9 ** np.arange(d - 5)])
    tail = rng.standard_normal((d + 1, d_out))
    assert map_ranks(np.concatenate([block(s2), block(s4), block(s4), tail]), 3) == want
    assert map_ranks(np.concatenate([block(s4), block(s4), block(s5), tail]), 3) is None


@pytest.mark.parametrize("gap, want", [(HEAD_RANK_GAP * 1.05, [4, 4, 4]), (HEAD_RANK_GAP / 1.05, None)])
def test_head_rank_names_a_rank_at_its_gap_only(gap, want):
    """HEAD_RANK_GAP just inside and outside: heads of d = 16 whose singular values fall by ``gap`` after the fourth
    and by about 1.1 elsewhere (each head's own gap above HEAD_OWN_GAP either way); above ``d // 4`` no rank is looked
    for, whatever the gap."""
    from companion.layer._fit import head_ranks

    d = 16
    s4 = np.concatenate([[1.0, 0.9, 0.8, 0.7], 0.7 / gap * 0.9 ** np.arange(d - 4)])
    s5 = np.concatenate([[1.0, 0.9, 0.8, 0.7, 0.6], 1e-6 * 0.9 ** np.arange(d - 5)])
    s2 = np.concatenate([[1.0, 0.9], 1e-3 * 0.9 ** np.arange(d - 2)])
    assert head_ranks(_heads([s4, s4, s4], d)) == want
    assert head_ranks(_heads([s5, s5, s5], d)) is None  # rank 5 > d // 4
    # a rank-2 head's gap (900) lifts the heads' mean: each head at its own rank
    assert head_ranks(_heads([s2, s4, s4], d)) == [2, 4, 4]


def _heads(spectra, d, seed=0):
    """Heads' rows ``(H, d + 1, d + 1)`` of the given singular values (one row of ``spectra`` a head), random bases."""
    rng = np.random.default_rng(seed)
    Ws = np.zeros((len(spectra), d + 1, d + 1))
    for h, s in enumerate(spectra):
        U, V = np.linalg.qr(rng.standard_normal((d, d)))[0], np.linalg.qr(rng.standard_normal((d + 1, d)))[0]
        Ws[h, :d] = (U * s) @ V.T
    return Ws


@pytest.mark.parametrize("gap, want", [(HEAD_OWN_GAP * 1.05, [4, 4, 4]), (HEAD_OWN_GAP / 1.05, None)])
def test_head_rank_needs_every_head_to_show_its_own_gap(gap, want):
    """HEAD_OWN_GAP just inside and outside: two heads fall by 10 after their fourth singular value, the third by
    ``gap`` (the heads' mean gap about 5.8 either way, above HEAD_RANK_GAP); a head of rank 16 at d = 32 (above
    ``d // 4``, no gap up to it) beside heads of rank 4 leaves every head unfactored."""
    from companion.layer._fit import head_ranks

    d = 16
    head = lambda g: np.concatenate([[1.0, 0.9, 0.8, 0.7], 0.7 / g * 0.9 ** np.arange(d - 4)])  # noqa: E731
    assert head_ranks(_heads([head(10.0), head(10.0), head(gap)], d)) == want
    d = 32
    low = np.concatenate([[1.0, 0.9, 0.8, 0.7], 1e-4 * 0.9 ** np.arange(d - 4)])
    full = np.concatenate([0.95 ** np.arange(16), 1e-4 * 0.9 ** np.arange(d - 16)])
    assert head_ranks(_heads([low, low], d)) == [4, 4]
    assert head_ranks(_heads([low, low, full], d)) is None


@pytest.mark.parametrize(
    "head_dim, ranks, rank, bound", [(12, (4, 12, 12), [4, 12, 12], 2.5), (16, (4, 4, 16), None, 5.0)]
)
def test_heads_of_different_sizes_are_factored_each_at_its_rank_or_not_at_all(head_dim, ranks, rank, bound):
    """Heads of different ranks behind a post-LN, d = 48, served in float32 (a framework's heads share one size; these
    do not). Measured (2026-12-06, learner seed 0, 1,000 fresh queries): ranks 4, 12, 12, each factored at its own,
    verified at 1.30 u, 0.70 u from the exact block (LSMR 40, 9; all three factored at 12: 1.27 u, 0.70 u); ranks 4,
    4, 16 (above ``d // 4``) unfactored (LSMR 59, 18), verified at 2.62 u, 0.70 u. With the LayerNorm's beta polished
    with them, gamma held (POLISH_LN_GAMMA, 2026-12-06): 1.16 u and 0.57 u (LSMR 49, 14); 2.48 u and 0.64 u (62, 18).
    With the second stage at the top token scales and gamma's scale from the gaps (POLISH_TOP_RANGE, post_ln_eps,
    2026-12-06): 0.78 u and 0.53 u (LSMR 49, 14, then 16, 8); 1.24 u and 0.45 u (62, 18, then 24, 9). With Theta's
    head blocks factored where ``_fit.map_ranks`` finds their ranks (2026-12-07): ranks 4, 12, 12, maps at 12, 12, 12
    (the value maps were not truncated): 0.77 u and 0.52 u (LSMR 48, 14, then 15, 8); ranks 4, 4, 16: maps of rank 16,
    above ``d // 4``, unfactored, as before. With the second stage on its own queries alone (2026-12-07): 1.10 u and
    0.54 u (LSMR 48, 14, then 21, 9); 2.31 u and 0.57 u (62, 18, then 36, 13). The bounds are about twice."""
    base = random_attention_layer(48, 3, head_dim=head_dim, residual=True, layernorm="post", eps=1e-3, seed=0)
    Ws = base.Ws.copy()
    for h, r in enumerate(ranks):
        U, s, Vt = np.linalg.svd(Ws[h, :48], full_matrices=False)
        Ws[h, :48] = (U[:, :r] * s[:r]) @ Vt[:r]
    block = AttentionLayer(
        Ws, base.Ms, base.b_O, base.skip, layernorm="post", gamma=base.gamma, beta=base.beta, eps=1e-3
    )
    rec = learn_attention_layer(VectorQueryOracle(_rounded32(block), d=48, d_out=48), H=3)
    assert (None if rank is None else sorted(rec.diagnostics["polish_rank"])) == rank  # heads in the learner's order
    assert rec.diagnostics["polish_map_rank"] == (None if rank is None else [head_dim] * 3)  # the value maps' d_h
    assert rec.diagnostics["verify_max_error"] <= bound * U32
    assert _error_u(rec.model, block, _fresh(48)) <= 1.1


def test_the_polish_takes_the_layernorms_beta_in(monkeypatch):
    """The matrix-free polish with ``norm`` polishes the LayerNorm's ``beta`` with the heads, ``gamma`` held (this
    book's own). Measured (2026-12-06, _scaled_polish's proxy, d = 32, H = 4, heads factored at rank 8): the directions
    from a ``beta`` 3e-5 off (relative; MiniLM's row space left its ``beta`` 2.2e-5 off) leave the heads 1.7e-6 off,
    against 3.6e-8 from the true ``beta``; polished with ``beta``, 3.7e-8, ``beta`` 9.2e-8 off, the residual 1.14 times
    the truth's (203 LSMR iterations, against 103). The bounds lie between."""
    heads, _, _, beta = _scaled_polish(1, monkeypatch, rank=8, beta_off=3e-5)
    assert heads > 5e-7 and beta > 2e-5
    heads, res, its, beta, gamma = _scaled_polish(1, monkeypatch, rank=8, beta_off=3e-5, ln=True)
    assert heads < 1e-7 and beta < 1e-6 and res < 1.5 and its < 300 and gamma == 0.0


def test_the_polish_holds_the_layernorms_gamma(monkeypatch):
    """POLISH_LN_GAMMA = False. Measured (2026-12-06, the proxy above): ``gamma``, exact at the start, polished with
    ``beta`` drifts to 1.0e-7 off; the residual, on the true ``beta``'s directions, ends 5.1 times the truth's (held:
    1.14), in 492 LSMR iterations (held: 203); heads and ``beta`` as held (3.7e-8, 9.6e-8). On MiniLM's float32 block
    the row space's ``gamma``, 1.3e-7 off, drifted to 1.3e-5 (data/results/minilm_polish_diagnosis.json,
    ``layernorm_rerun``). The bounds lie between."""
    from companion.layer import _fit

    assert _fit.POLISH_LN_GAMMA is False
    monkeypatch.setattr(_fit, "POLISH_LN_GAMMA", True)
    heads, res, its, beta, gamma = _scaled_polish(1, monkeypatch, rank=8, beta_off=3e-5, ln=True)
    assert heads < 1e-7 and beta < 1e-6 and gamma > 5e-8 and res > 3 and its > 300


@pytest.mark.parametrize("ln_gamma", [True, False])
def test_the_polish_operator_on_the_layernorms_answers_is_its_residuals_derivative(ln_gamma):
    """``_PolishOperator(..., ln=(answers, gamma, beta))``: its products in ``(gamma, beta)`` against central
    differences of its residual (to 1e-8, relative; measured 3e-10), and its adjoint against its products (to
    rounding), with the queries weighted. With ``ln_gamma`` False, ``beta`` alone is an unknown: one row a block
    (``dln``, the adjoint's third block, the column norms), and its products are the full operator's with
    ``dgamma`` zero."""
    from companion.layer._fit import _PolishOperator, group_by_length

    d, H = 6, 2
    block = random_attention_layer(d, H, residual=True, layernorm="post", seed=4).canonical()
    rng = np.random.default_rng(1)
    Xs = [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(2, 9, size=60)]
    batches, answers = group_by_length(Xs, block(Xs))
    Ws, Theta = block.Ws + 1e-2 * rng.standard_normal(block.Ws.shape), rng.standard_normal((H * d + d + 1, d))
    g0, b0 = block.gamma + 0.01 * rng.standard_normal(d), block.beta + 0.01 * rng.standard_normal(d)
    weights = [rng.uniform(0.5, 2.0, size=X.shape[0]) for X in batches]

    def op(g, b, ln_gamma=ln_gamma):
        return _PolishOperator(Ws, Theta, batches, ln=(answers, g, b), weights=weights, ln_gamma=ln_gamma)

    rows = 2 if ln_gamma else 1
    dW, dT = rng.standard_normal((H, d, d + 1)), rng.standard_normal(Theta.shape)
    dL = rng.standard_normal((2, d)) if ln_gamma else np.stack([np.zeros(d), rng.standard_normal(d)])
    dln = dL[2 - rows :]  # (dgamma, dbeta), or dbeta alone
    y = rng.standard_normal(op(g0, b0).residual().size)
    gW, gT, gL = op(g0, b0).rmatvec(y)
    assert gL.shape == op(g0, b0).ln_column_norms().shape == (rows, d) and op(g0, b0).ln_rows == rows
    assert float(op(g0, b0).matvec(dW, dT, dln) @ y) == pytest.approx(
        float(np.sum(gW * dW) + np.sum(gT * dT) + np.sum(gL * dln)), rel=1e-12
    )
    h = 1e-6
    fd = (op(g0 + h * dL[0], b0 + h * dL[1]).residual() - op(g0 - h * dL[0], b0 - h * dL[1]).residual()) / (2 * h)
    got = op(g0, b0).matvec(0 * dW, 0 * dT, dln)
    assert np.linalg.norm(fd - got) <= 1e-8 * np.linalg.norm(fd)
    full = op(g0, b0, ln_gamma=True)  # beta's block is the full operator's second row
    assert np.allclose(got, full.matvec(0 * dW, 0 * dT, dL), rtol=1e-13, atol=0)
    assert np.allclose(gL[-1], full.rmatvec(y)[2][1], rtol=1e-13, atol=0)
    assert np.allclose(op(g0, b0).ln_column_norms()[-1], full.ln_column_norms()[1], rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="not both"):
        _PolishOperator(Ws, Theta, batches, What=answers, ln=(answers, g0, b0))
