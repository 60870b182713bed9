"""The float32 post-LN route's verification at the joint stage's token scale (``VERIFY_SCALED_SHARE``, this book's).

MiniLM layer 0 served in float32 came back verified at 46 u on ``N(0, I / d)`` tokens, its heads 2.0e-3 off, and
16,000 u off ``transformers``' outputs on the reference's ``N(0, I)`` tokens (norm about 20): its score differences at
small tokens were too small to show the heads' error. A quarter of the short verification queries now have tokens at
the scale at which the joint stage told the heads apart, where the score errors are ``s^2`` times larger.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from companion.errors import OracleInconsistentError
from companion.layer import (
    VERIFY_SCALED_SHARE,
    AttentionLayer,
    learn_attention_layer,
    random_attention_layer,
    verify_queries,
)
from companion.layer._verify import _n_long, verify_layer
from companion.oracles import VectorQueryOracle

U32 = 2.0**-24


def test_the_scaled_share_is_the_last_quarter_of_the_short_queries():
    assert VERIFY_SCALED_SHARE == 0.25
    plain, scaled = verify_queries(6, 32, seed=3), verify_queries(6, 32, seed=3, scale=16.0)
    n_short = 32 - _n_long(32)  # 24 short, 8 long
    assert n_short == 24 and len(scaled) == len(plain) == 32
    for i, (a, b) in enumerate(zip(plain, scaled)):  # the last 6 short ones times 16, the rest as they were
        assert np.array_equal(b, a * 16.0 if 18 <= i < 24 else a)
    # at least one, whatever n; none at scale 1
    assert sum(not np.array_equal(a, b) for a, b in zip(verify_queries(6, 2, 0), verify_queries(6, 2, 0, 4.0))) == 1
    assert all(np.array_equal(a, b) for a, b in zip(verify_queries(6, 9, 0), verify_queries(6, 9, 0, 1.0)))


def _perturbed(layer, a):
    """``layer``'s answers off by ``a |x_N|^4`` relative: about ``a`` on ``N(0, I / d)`` tokens, ``s^4`` times more on
    tokens ``s`` times larger."""

    def f(Xs):
        Y = layer(Xs)
        r = np.array([np.sum(np.asarray(X)[-1] ** 2) ** 2 for X in Xs])
        return Y * (1.0 + a * r)[:, None]

    return f


@pytest.mark.parametrize("scale", [4.0, 16.0])
def test_a_layer_off_on_larger_tokens_only_is_refused_naming_both_causes(scale):
    """The same layer passes with the share at scale 1 and fails at ``scale``; the threshold just inside and outside."""
    block = random_attention_layer(6, 2, residual=True, layernorm="post", seed=0)
    oracle = VectorQueryOracle(block)
    rtol = 60 * U32
    refusal = OracleInconsistentError
    off = _perturbed(block, 1e-7)  # |x|^4 about 1 on N(0, I / d) tokens: 1e-7 relative there, scale^4 times more
    assert verify_layer(oracle, off, 32, 0, rtol, U32, True, refusal)["verify_max_error"] <= rtol
    with pytest.raises(OracleInconsistentError, match="times larger") as info:
        verify_layer(oracle, off, 32, 0, rtol, U32, True, refusal, scale=scale)
    assert info.value.scaled and "a cap on the scores" in str(info.value) and f"s = {scale:g}" in str(info.value)
    # at the default float32 tolerance the message says what it is measured against; at any other, nothing
    assert "ten times FLOAT32_FLOOR_UNITS = 6 u" in str(info.value) and "8.1 u to 11.2 u" in str(info.value)
    with pytest.raises(OracleInconsistentError, match="times larger") as other:
        verify_layer(oracle, off, 32, 0, rtol * 0.999, U32, True, refusal, scale=scale)
    assert "FLOAT32_FLOOR_UNITS" not in str(other.value)
    # the scaled share's own error, reported, and within the tolerance just inside
    got = verify_layer(oracle, block, 32, 0, rtol, U32, True, refusal, scale=scale)
    assert got["verify_token_scale"] == scale and got["verify_scaled_max_error"] <= got["verify_max_error"] < 1e-12
    Xv = verify_queries(6, 32, 1, scale)[18:24]
    worst = float(np.max(np.linalg.norm(off(Xv) - block(Xv), axis=1) / np.linalg.norm(block(Xv), axis=1)))
    assert verify_layer(oracle, off, 32, 0, worst * 1.001, U32, True, refusal, scale=scale)["verify_max_error"] == (
        pytest.approx(worst, rel=1e-9)
    )
    with pytest.raises(OracleInconsistentError, match="times larger"):
        verify_layer(oracle, off, 32, 0, worst * 0.999, U32, True, refusal, scale=scale)


def _soft_capped(block, cap):
    """``block`` with every score ``s`` replaced by ``cap tanh(s / cap)`` (Gemma 2's logit soft-capping), answers
    rounded to float32: nearly the block on small tokens, not an attention layer on larger ones."""

    def f(X):
        X = np.asarray(X, float)
        Xt = np.concatenate([X, np.ones(X.shape[:-1] + (1,))], -1)
        s = cap * np.tanh(np.einsum("bnk,hkl,bl->bhn", Xt, block.Ws, Xt[:, -1]) / cap)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        u = np.einsum("bhn,bnk,hok->bo", a, Xt, block.Ms) + block.b_O + X[:, -1] @ block.skip.T
        u -= u.mean(-1, keepdims=True)
        y = u / np.sqrt((u**2).mean(-1, keepdims=True) + block.eps) * block.gamma + block.beta
        return y.astype(np.float32).astype(float)

    return f


def test_scores_soft_capped_far_out_are_refused_on_the_scaled_share():
    """Measured (2026-12-05, d = 32, H = 8, seed 0, float32 answers): with the scores capped at 3,000 the learned block
    agreed with the target to 1.7e-6 on ``N(0, I / d)`` tokens, inside the 3.58e-6 tolerance, and missed it by 4.9e-6
    on the tokens twice as large: refused, both causes named (polished on ``N(0, I / d)`` tokens, before the scaled
    share, it was returned: 3.3e-6 there). Capped at 1e9 the block is learned (1.4 u); at 1,000 the joint stage
    refuses. With the polish's queries weighted by their token scale (FREE_POLISH_SCALE_POWER, 2026-12-06): 1.5e-6
    and 4.76e-6, refused the same way; capped at 1e9, 1.43 u. With the heads' rows factored at their rank 4
    (``_fit.head_ranks``, 2026-12-06) the polish fits the cap at 3,000 closer: verified at 3.16e-6 (53 u) on the scaled
    share and returned, the target itself 15 u and 78 u from the uncapped block at scales 1 and 2 (300 queries of 8
    tokens), the returned block 18 u and 75 u from the target: at the edge of what 60 u tells apart. Capped at 2,000
    (33 u and 175 u from the block): 2.4e-6 on ``N(0, I / d)`` tokens and 7.1e-6 (119 u) at scale 2, refused, both
    causes named; at 1,500 the joint stage refuses. With the LayerNorm's gamma, beta polished too (2026-12-06): 7.04e-6
    at scale 2 (2.4e-6 on ``N(0, I / d)`` tokens), refused; capped at 3,000, verified at 3.13e-6 and returned. With
    beta alone, gamma held (POLISH_LN_GAMMA): the same at 2,000 and 3,000; capped at 1e9, 0.78 u. With the polish's
    second stage at the top token scales (POLISH_TOP_RANGE, 2026-12-06): capped at 2,000, 2.0e-6 on ``N(0, I / d)``
    tokens and 6.67e-6 (112 u) at scale 2, refused; at 3,000 verified at 49.7 u and returned; at 1e9, 0.76 u. With
    Theta's head blocks factored too (``_fit.map_ranks``, 2026-12-07): capped at 2,000, 1.9e-6 and 6.56e-6 (110 u),
    refused; at 3,000 verified at 48.8 u and returned; at 1e9, 0.77 u. With the second stage on its own queries alone
    (2026-12-07): capped at 2,000, 1.8e-6 and 6.66e-6 (112 u), refused; at 3,000 verified at 49.6 u and returned; at
    1e9, 0.79 u. With the joint stage's column fits as matrix products (2026-12-07, its rounding moved): 1.9e-6 and
    6.66e-6, refused; at 3,000, 49.6 u, returned; at 1e9, 0.78 u. The message's two numbers are read back and checked
    within 3% of 1.85e-6 (a printed 1.8e-06 or 1.9e-06, the same measurement) and 2% of 6.66e-6."""
    block = random_attention_layer(32, 8, residual=True, layernorm="post", eps=1e-12, seed=0)
    with pytest.raises(OracleInconsistentError, match="2 times larger.*a cap on the scores") as info:
        learn_attention_layer(VectorQueryOracle(_soft_capped(block, 2000.0), d=32, d_out=32), H=8)
    agree = float(re.search(r"agrees to ([0-9.e+-]+)", str(info.value)).group(1))
    worst = float(re.search(r"up to ([0-9.e+-]+)", str(info.value)).group(1))
    assert info.value.scaled and abs(agree / 1.85e-6 - 1) <= 0.03 and abs(worst / 6.66e-6 - 1) <= 0.02
    rec = learn_attention_layer(VectorQueryOracle(_soft_capped(block, 1e9), d=32, d_out=32), H=8)
    assert rec.diagnostics["verify_max_error"] <= 3 * U32 and rec.diagnostics["verify_token_scale"] == 2


def _faint(d, H, factor, seed):
    """A post-LN block whose heads' matrices are ``factor`` times a random block's: scores that barely spread on
    ``N(0, I / d)`` tokens, as MiniLM's (0.05 there against 3.6 on ``N(0, I)`` tokens, chapter 09)."""
    b = random_attention_layer(d, H, residual=True, layernorm="post", eps=1e-12, seed=seed)
    return AttentionLayer(b.Ws * factor, b.Ms, b.b_O, b.skip, layernorm="post", gamma=b.gamma, beta=b.beta, eps=b.eps)


def _off_u(model, block, d, scale, seed=5):
    X = np.random.default_rng(seed).standard_normal((100, 8, d)) * (scale / np.sqrt(d))
    return float(np.max(np.linalg.norm(model(X) - block(X), axis=1) / np.linalg.norm(block(X), axis=1))) / U32


def test_faint_heads_are_polished_at_the_token_scale_and_an_unscaled_polish_is_refused(monkeypatch):
    """Measured (2026-12-05, d = 64, H = 8, the heads 0.03 times a random block's, seed 1, float32 answers): the joint
    stage took token scale 8; polished on ``N(0, I / d)`` tokens the block was off by 91.5 u on the verification's
    scaled share (refused); polished on scales log-uniform from 1 to 8 it is verified at 4.4 u and within 0.3 u, 0.6 u,
    1.7 u and 5.1 u of the exact block at token scales 1, 2, 4 and 8 (14 u at 16, beyond what was verified). At 0.05
    times (scale 4) the unscaled polish's block was 27 u off at scale 4 and 200 u at 16, the scaled one's 3.2 u and
    24 u. With the heads' rows factored at their rank 8 (``_fit.head_ranks``, 2026-12-06): verified at 2.08 u, within
    0.33 u, 0.47 u, 0.91 u, 1.99 u and 3.2 u at scales 1 to 16; polished on ``N(0, I / d)`` tokens, factored, it is
    verified (30.1 u) but 31.6 u off at scale 8 and 55.6 u at 16; unscaled and unfactored, refused at 97 u. With the
    LayerNorm's gamma, beta polished too (2026-12-06): verified at 1.68 u, within 0.40 u, 0.51 u, 0.79 u, 1.56 u and
    2.84 u at scales 1 to 16; unscaled, 30.0 u, and 31.9 u off at scale 8; unscaled and unfactored, refused at
    91.7 u. With beta alone, gamma held (POLISH_LN_GAMMA): verified at 1.64 u, within 0.30 u, 0.39 u, 0.63 u, 1.55 u
    and 2.82 u; unscaled, 29.9 u, and 31.8 u off at scale 8; unscaled and unfactored, refused at 92.1 u. With the
    second stage at the top token scales and gamma's scale from the gaps (POLISH_TOP_RANGE, post_ln_eps,
    2026-12-06): verified at 0.90 u, within 0.21 u, 0.29 u, 0.39 u, 0.62 u and 1.28 u at scales 1 to 16; unscaled
    (scale 1: no second stage), 29.9 u, and 31.8 u off at scale 8 (57.6 u at 16); unscaled and unfactored, refused
    at 92.1 u. With Theta's head blocks factored too (``_fit.map_ranks``, 2026-12-07): verified at 0.70 u, within
    0.22 u, 0.30 u, 0.35 u, 0.49 u and 1.21 u at scales 1 to 16; unscaled, 36.4 u, and 39.5 u off at scale 8 (59.2 u
    at 16); unscaled and the heads' rows unfactored (the maps factored), refused at 95.2 u. With ``P_h^T x_n`` kept
    per batch in the polish's products (ea893fc): 0.71 u; 0.22 u, 0.30 u, 0.35 u, 0.50 u and 1.21 u; 36.4 u, 39.5 u
    (59.1 u); refused at 95.6 u. The bounds are now about three times these, the ratio about a quarter of the
    measured 80."""
    import companion.layer._directions as directions
    import companion.layer._learn as learn

    block = _faint(64, 8, 0.03, seed=1)

    def oracle():
        return VectorQueryOracle(lambda X: block(X).astype(np.float32).astype(float), d=64, d_out=64)

    rec = learn_attention_layer(oracle(), H=8)
    diag = rec.diagnostics
    assert diag["joint_token_scale"] == diag["verify_token_scale"] == 8 and diag["polish_rank"] == [8] * 8
    assert diag["polish_map_rank"] == [8] * 8
    assert diag["verify_max_error"] <= 2 * U32
    scaled_off = [_off_u(rec.model, block, 64, s) for s in (1, 2, 4, 8)]
    assert max(scaled_off) <= 1.5
    unscaled = directions.polish_post_directions
    monkeypatch.setattr(learn, "polish_post_directions", lambda *a: unscaled(*a[:6], 1.0))
    rec = learn_attention_layer(oracle(), H=8)  # factored, verified, yet far worse at the scale it was verified to
    assert _off_u(rec.model, block, 64, 8) >= 20 * scaled_off[-1]
    monkeypatch.setattr(directions, "head_ranks", lambda Ws: None)
    with pytest.raises(OracleInconsistentError, match="8 times larger") as info:
        learn_attention_layer(oracle(), H=8)
    assert info.value.scaled
