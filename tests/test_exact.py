"""Theorem 4.1: exact recovery with d + d^2 value queries."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.attention import MultiHead, SingleHead, random_single_head
from companion.errors import (BudgetExceededError, InvalidInputError, NotIdentifiableError,
                              OracleInconsistentError)
from companion.exact import (invert_two_token, learn_single_head, probe_matrix, read_value_vector,
                             sweep)
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle


def rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


@pytest.mark.parametrize("probes", ["basis", "gaussian"])
@pytest.mark.parametrize("d", [1, 2, 7, 30])
def test_exact_recovery_and_query_count(d, probes):
    target = random_single_head(d, seed=d)
    oracle = ValueQueryOracle(target)
    rec = learn_single_head(oracle, probes=probes, seed=1)
    assert rec.n_queries == oracle.n_queries == d + d * d + 32        # 32: default verification
    assert rec.n_learning_queries == d + d * d and rec.diagnostics["n_verify_queries"] == 32
    assert rec.diagnostics["verify_max_error"] < 1e-12
    assert rel(rec.W, target.W) < 1e-12
    np.testing.assert_array_equal(rec.v, target.v)
    assert rec.diagnostics["n_requeries"] == 0


def test_known_two_by_two_head():
    W = np.array([[0.5, -1.0], [2.0, 0.25]])
    v = np.array([1.0, -2.0])
    rec = learn_single_head(ValueQueryOracle(SingleHead(W, v)))
    np.testing.assert_allclose(rec.W, W, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(rec.v, v)
    assert rec.n_learning_queries == 6


def test_large_entries_recovered_to_full_precision():
    # entries of RMS 50 (max above 100): c = 1 queries saturate, rescaled ones do not
    target = random_single_head(12, W_norm=50.0 * 12, seed=3)
    assert np.max(np.abs(target.W)) > 100
    oracle = ValueQueryOracle(target)
    rec = learn_single_head(oracle)
    assert rel(rec.W, target.W) < 1e-13
    n_re = rec.diagnostics["n_requeries"]
    assert n_re > 0 and rec.n_queries == oracle.n_queries == 12 + 144 + n_re + 32
    with pytest.raises(OracleInconsistentError, match=r'outside \(0, 1\).*use scale="auto"'):
        learn_single_head(ValueQueryOracle(target), scale=1.0)


def test_value_vector_with_zero_entries_uses_e_l_plus_e_p():
    target = random_single_head(6, seed=5)
    v = target.v.copy()
    v[[0, 4]] = 0.0
    head = SingleHead(target.W, v)
    U = probe_matrix(v, "basis")
    p = int(np.argmax(np.abs(v)))
    for l in (0, 4):
        expected = np.eye(6)[l] + np.eye(6)[p]
        np.testing.assert_array_equal(U[l], expected)
    assert np.all(np.abs(U @ v) >= 0.5 * np.abs(v[p]))
    rec = learn_single_head(ValueQueryOracle(head))
    assert rel(rec.W, head.W) < 1e-13 and rec.n_learning_queries == 42


def test_v_zero_is_not_identifiable():
    oracle = ValueQueryOracle(SingleHead(np.eye(3), np.zeros(3)))
    with pytest.raises(NotIdentifiableError, match=r"v is 0, so f is identically 0"):
        learn_single_head(oracle)
    assert oracle.n_queries == 3            # only the length-1 read-out was spent


def test_budget_checked_before_the_first_query():
    oracle = ValueQueryOracle(random_single_head(4, seed=0), budget=51)
    with pytest.raises(BudgetExceededError, match=r"needs 52 queries.*at least 52"):
        learn_single_head(oracle)                  # d + d^2 = 20, plus 32 verification queries
    assert oracle.n_queries == 0
    assert learn_single_head(ValueQueryOracle(random_single_head(4, seed=0), budget=52)).n_queries == 52
    with pytest.raises(BudgetExceededError, match=r"needs 20 queries.*at least 20"):
        learn_single_head(ValueQueryOracle(random_single_head(4, seed=0), budget=19), verify=0)
    rec = learn_single_head(ValueQueryOracle(random_single_head(4, seed=0), budget=20), verify=0)
    assert rec.n_queries == rec.n_learning_queries == 20 and rec.diagnostics["n_verify_queries"] == 0
    assert "verify_max_error" not in rec.diagnostics and "verified" not in rec.message


def test_approximate_oracle_is_refused():
    oracle = ApproxValueQueryOracle(random_single_head(3, seed=0), 1e-3)
    with pytest.raises(TypeError, match=r"needs an exact value-query oracle.*learn_robust"):
        learn_single_head(oracle)
    with pytest.raises(TypeError, match=r"needs a value-query oracle"):
        learn_single_head(random_single_head(3, seed=0))


@pytest.mark.parametrize("kwargs, message", [
    ({"probes": "random"}, r"probes='random' is not one of"),
    ({"scale": "big"}, r"scale='big' is not one of"),
    ({"scale": 0.0}, r"scale=0\.0 must be > 0"),
    ({"verify": -1}, r"verify=-1 must be >= 0"),
])
def test_bad_options(kwargs, message):
    oracle = ValueQueryOracle(random_single_head(3, seed=0))
    with pytest.raises(InvalidInputError, match=message):
        learn_single_head(oracle, **kwargs)
    assert oracle.n_queries == 0


def test_verification_passes_on_a_head_and_flags_two_heads():
    target = random_single_head(5, seed=7)
    rec = learn_single_head(ValueQueryOracle(target), verify=100)
    assert rec.diagnostics["verify_max_error"] < 1e-12
    assert rec.n_queries == 30 + 100
    other = random_single_head(5, seed=8)
    two = MultiHead(np.stack([target.W, other.W]), np.stack([target.v, other.v]))
    with pytest.raises(OracleInconsistentError, match=r"not a single attention head"):
        learn_single_head(ValueQueryOracle(two), verify=100)


def test_step_functions_agree_with_the_two_token_identity():
    target = random_single_head(4, seed=9)
    oracle = ValueQueryOracle(target)
    v = read_value_vector(oracle)
    np.testing.assert_array_equal(v, target.v)
    U = np.random.default_rng(0).standard_normal((4, 4))
    j, c = 2, 0.7
    X = np.zeros((4, 2, 4))
    X[:, 0] = U + np.eye(4)[j]
    X[:, 1] = np.eye(4)[j]
    y = oracle(c * X)
    t, alpha = invert_two_token(y, v[j], U @ v, c)
    np.testing.assert_allclose(t, c**2 * U @ target.W[:, j], rtol=1e-11, atol=1e-12)
    assert np.all((alpha > 0) & (alpha < 1))


def test_sweep_rows():
    rows = sweep([2, 5], seed=0, probes="gaussian")
    assert [r["n_queries"] for r in rows] == [6, 30]
    assert all(r["rel_error_W"] < 1e-12 and r["rel_error_v"] == 0.0 for r in rows)


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 8), seed=st.integers(0, 10_000), log_w=st.floats(-4, 2.5),
       log_v=st.floats(-6, 3), zeros=st.integers(0, 7), probes=st.sampled_from(["basis", "gaussian"]))
def test_property_exact_for_any_head(d, seed, log_w, log_v, zeros, probes):
    """Random heads with tiny to large norms and zero entries in v are recovered to rounding."""
    base = random_single_head(d, W_norm=10.0**log_w * d, v_norm=10.0**log_v, seed=seed)
    v = base.v.copy()
    v[np.random.default_rng(seed).permutation(d)[: min(zeros, d - 1)]] = 0.0
    head = SingleHead(base.W, v)
    oracle = ValueQueryOracle(head)
    rec = learn_single_head(oracle, probes=probes, seed=seed)
    assert rec.n_queries == d + d * d + rec.diagnostics["n_requeries"] + 32
    np.testing.assert_array_equal(rec.v, head.v)
    assert np.linalg.norm(rec.W - head.W) <= 1e-9 * max(1.0, np.linalg.norm(head.W))


def test_remeasure_saturated_shrinks_the_scale_and_gives_up_on_a_non_softmax_oracle():
    from companion.exact import remeasure_saturated

    true_logit = np.array([0.5, 20.0, 400.0])                # measured at scale c: logit c^2 L
    c = np.ones(3)

    def measure(idx, cs):
        t = cs**2 * true_logit[idx]
        from scipy.special import expit
        return t, expit(t)

    t, alpha = measure(np.arange(3), c)
    n = remeasure_saturated(measure, t, alpha, c)
    assert n >= 2 and np.all((alpha >= 1e-3) & (alpha <= 1 - 1e-3))
    np.testing.assert_allclose(t / c**2, true_logit, rtol=1e-12)
    assert c[0] == 1.0                                       # an unsaturated probe keeps c = 1
    def stuck(idx, cs):
        return np.full(idx.size, np.inf), np.ones(idx.size)

    with pytest.raises(OracleInconsistentError, match=r"1 attention weights stayed saturated after 40"):
        remeasure_saturated(stuck, np.array([np.inf]), np.array([1.0]), np.ones(1))


# --- streaming: bounded chunks, the same queries -------------------------------------------------

@pytest.mark.parametrize("probes", ["basis", "gaussian"])
def test_chunked_queries_equal_unchunked_bit_for_bit(monkeypatch, probes, shape_log):
    from companion import _streaming

    target = random_single_head(7, W_norm=60.0, seed=3)      # large W: re-measurements happen too
    runs = {}
    for chunk in (16 * 7, 2**30):                              # one query per chunk; everything at once
        monkeypatch.setattr(_streaming, "CHUNK_BYTES", chunk)
        oracle = shape_log(target, record=True)
        rec = learn_single_head(oracle, probes=probes, verify=0)
        runs[chunk] = (rec, oracle)
    (a, oa), (b, ob) = runs[16 * 7], runs[2**30]
    assert a.n_queries == b.n_queries and a.diagnostics["n_requeries"] > 0
    # the same queries (re-measurements come per batch, so in another order) with the same answers
    assert sorted(x.tobytes() + np.float64(y).tobytes() for x, y in oa.log) == \
        sorted(x.tobytes() + np.float64(y).tobytes() for x, y in ob.log)
    np.testing.assert_allclose(a.W, b.W, rtol=1e-13, atol=1e-13)
    assert max(oa.batches) == 7 and max(ob.batches) == 7 * 7   # one column per batch vs all columns


def test_query_batches_and_memory_stay_bounded(monkeypatch, shape_log):
    import tracemalloc

    from companion import _streaming

    d = 128
    monkeypatch.setattr(_streaming, "CHUNK_BYTES", 64 * 2**10)   # 32 length-2 queries per chunk
    target = random_single_head(d, seed=0)
    oracle = shape_log(target)
    tracemalloc.start()
    rec = learn_single_head(oracle, verify=0, precision="float64")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rec.relative_errors(target)["W"] < 1e-12
    # the value vector in chunks of 64 length-1 queries, then one column (d queries) per batch
    assert oracle.batches[:2] == [64, 64] and max(oracle.batches) == d
    # a handful of d x d arrays (probes, logits, scales, LU, W, the column buffer), never the
    # d^2 x 2 x d array of all queries (2 d^3 floats = 32 MiB here)
    assert peak < 16 * 8 * d * d < 2 * d**3 * 8 / 8


@pytest.mark.parametrize("scale", [1e-12, 1e-20, 1e-100, 1e300])
def test_verification_is_as_strict_for_a_head_with_tiny_values(scale):
    """A fresh user's finding (2026-12-02): scaling v by 1e-12 loosened the check from 1e-6 to
    2.8e-2 of the output, and from 1e-15 it refused an exact W as unverifiable (PrecisionError,
    "disagreements up to 13.5 of the output"); at 1e300, ||v|| overflowed and it refused the same
    way ("up to inf of the output"). f's relative error does not depend on v's scale."""
    from companion.lowrank import learn_low_rank

    h = random_single_head(8, seed=0)
    for learn in (learn_single_head, lambda o: learn_low_rank(o, 8, method="sketch")):
        base = learn(ValueQueryOracle(h)).diagnostics
        res = learn(ValueQueryOracle(SingleHead(h.W, scale * h.v)))
        assert res.diagnostics["verify_tolerance"] == base["verify_tolerance"] == 1e-6
        assert res.diagnostics["verify_max_error"] < 1e-14
        assert np.linalg.norm(res.W - h.W) <= 1e-14 * np.linalg.norm(h.W)
        assert np.allclose(res.v, scale * h.v, rtol=1e-13, atol=0)


# ----------------------------------------------------------------------------- biases (issue 36)

def _biased(d=4, seed=0, offset=None):
    """A head with biases: a bias-free head on homogeneous tokens (x, 1), asked the token part x."""
    from companion.attention import SingleHead

    rng = np.random.default_rng(seed)
    W, v = rng.standard_normal((d + 1, d + 1)), rng.standard_normal(d + 1)
    if offset is not None:
        v[-1] = offset
    head = SingleHead(W, v)
    return head, (lambda X: head([np.c_[x, np.ones(len(x))] for x in X]))


def test_bias_true_learns_a_head_with_biases_from_d_plus_1_squared_queries():
    head, model = _biased(5, seed=1)
    rec = learn_single_head(ValueQueryOracle(model, d=5), bias=True)
    assert rec.W.shape == (6, 6) and rec.v.shape == (6,)
    assert rec.n_learning_queries == 36 + rec.diagnostics["n_requeries"]
    np.testing.assert_allclose(rec.W[:5], head.W[:5], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(rec.W[5], np.zeros(6))          # not identifiable: returned as 0
    np.testing.assert_allclose(rec.v, head.v, rtol=0, atol=1e-12)
    assert rec.diagnostics["identifiable"] == "W[:d, :], v"


def test_bias_true_follows_a_stated_float32_precision():
    from companion.oracles import round_to

    head, model = _biased(4, seed=2)
    oracle = ValueQueryOracle(lambda X: round_to(model(X), "float32"), d=4, precision="float32")
    rec = learn_single_head(oracle, bias=True)
    assert rec.diagnostics["precision_format"] == "float32"
    assert rec.diagnostics["n_scale_queries"] == 0                  # no relative-rounding scale step here
    assert rec.diagnostics["verify_tolerance"] > 1e-6               # the tolerance follows u, not rtol
    assert np.linalg.norm(rec.W[:4] - head.W[:4]) / np.linalg.norm(head.W[:4]) < 1e-3


@pytest.mark.parametrize("offset", [0.1, 1e-3])
def test_a_bias_free_run_on_a_biased_layer_suggests_bias_true(offset):
    """Fails before the fix: the message named saturation or verification, never biases."""
    _, model = _biased(4, seed=3, offset=offset)
    with pytest.raises(OracleInconsistentError, match=r"single zero token is .*Pass bias=True"):
        learn_single_head(ValueQueryOracle(model, d=4))


def test_no_bias_advice_when_the_zero_token_answers_zero():
    """Two bias-free heads fail the verification too, but answer 0 at a zero token: no bias advice."""
    from companion.attention import MultiHead

    a, b = random_single_head(4, seed=1), random_single_head(4, seed=2)
    two = MultiHead(np.stack([a.W, b.W]), np.stack([a.v, b.v]))
    with pytest.raises(OracleInconsistentError) as info:
        learn_single_head(ValueQueryOracle(two))
    assert "bias" not in str(info.value)


def test_bias_must_be_a_bool():
    with pytest.raises(InvalidInputError, match="bias must be True or False"):
        learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)), bias="yes")


def test_biased_block_is_the_per_column_pairs_bit_for_bit():
    """_biased_block (one array for a block of columns, the biased learner's queries) is what it
    asked one column at a time before: the same queries, in the same order, to the last bit."""
    from companion.exact import _biased_block, _biased_pairs

    rng = np.random.default_rng(0)
    U = rng.standard_normal((5, 5))
    for cols in ([5, 0, 1, 2], [3, 4], [5]):
        for c in (0.7, rng.random(5)):
            block = _biased_block(U, cols, c, 5)
            each = np.concatenate([_biased_pairs(U, j, c, 5) for j in cols])
            assert block.shape == each.shape and block.tobytes() == each.tobytes()


def test_float32_answers_name_the_probe_scale_queries_apart_from_saturated_re_measurements():
    """A fresh reader of chapter 08 (session 37): with float32 answers the message said "16
    re-measurements of saturated probes" where nothing saturated; the 16 were the first column
    asked again to choose the probes' scale for relative rounding (``_relative_scale``)."""
    from companion.oracles import round_to

    d = 6
    head = random_single_head(d, seed=3)
    oracle = ValueQueryOracle(lambda X: round_to(head(X), "float32"), d=d, precision="float32")
    rec = learn_single_head(oracle)
    assert rec.diagnostics["max_abs_logit"] < 6.0                   # no probe near saturation
    assert rec.diagnostics["n_scale_queries"] == d == rec.diagnostics["n_requeries"]
    assert f"and {d} queries that chose the probes' scale" in rec.message
    assert "saturated" not in rec.message
    exact_answers = learn_single_head(ValueQueryOracle(head))       # float64: no scale queries
    assert exact_answers.diagnostics["n_scale_queries"] == 0 and "scale" not in exact_answers.message


def test_bias_true_on_a_constant_names_the_constant_not_zero():
    """An adversarial tester's finding: bias=True on f = 0.7 said 'f is identically 0'."""
    with pytest.raises(NotIdentifiableError, match=r"v~\[:d\], is 0, so f is the constant v0 = 0\.7 on every query"):
        learn_single_head(ValueQueryOracle(lambda X: np.full(len(X), 0.7), d=3), bias=True)
