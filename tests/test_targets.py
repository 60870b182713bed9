"""companion.targets: adapters for a user's own model, checked against each framework's convention.

Keras is a test dependency and is run for real (numpy backend). PyTorch and Flax are not installed:
their adapters are checked on small stand-ins written from the frameworks' documented conventions
(torch.nn.MultiheadAttention: ``in_proj_weight`` (3E, E) = [W_q; W_k; W_v] acting as ``W x``,
``in_proj_bias``, heads as contiguous blocks of E/H rows, scores divided by sqrt(E/H),
``out_proj``, ``batch_first``; flax.linen.MultiHeadDotProductAttention: DenseGeneral kernels
(d, heads, head_dim) named query/key/value, ``out`` kernel (heads, head_dim, d_out), query divided
by sqrt(head_dim)). Each stand-in computes attention its own way (loops over heads), not through
the adapter's merged form, so that agreement checks the merge.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.special import softmax

from companion import exact, targets
from companion.attention import MultiHead
from companion.errors import InvalidInputError, OracleInconsistentError

os.environ.setdefault("KERAS_BACKEND", "numpy")


def _batch(d, seed=0, B=5, N=4):
    return np.random.default_rng(seed).standard_normal((B, N, d))


# ----------------------------------------------------------------------------- stand-ins

class _Tensor:
    """The few torch.Tensor methods the adapter uses: new_tensor, detach, cpu, numpy, dtype."""

    def __init__(self, a):
        self.a = np.asarray(a)
        self.dtype = f"torch.{self.a.dtype.name}"

    def new_tensor(self, data):
        return _Tensor(np.array(data, dtype=self.a.dtype))

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.a


class _Linear:
    def __init__(self, weight, bias):
        self.weight, self.bias = _Tensor(weight), None if bias is None else _Tensor(bias)


class TorchMHA:
    """torch.nn.MultiheadAttention's forward for q, k, v in its documented layout (float32)."""

    def __init__(self, E, H, *, bias=True, batch_first=False, seed=0):
        rng = np.random.default_rng(seed)
        self.embed_dim, self.num_heads, self.batch_first = E, H, batch_first
        self.in_proj_weight = _Tensor((rng.standard_normal((3 * E, E)) / np.sqrt(E)).astype(np.float32))
        self.in_proj_bias = _Tensor((0.3 * rng.standard_normal(3 * E)).astype(np.float32)) if bias else None
        self.out_proj = _Linear((rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32),
                                (0.3 * rng.standard_normal(E)).astype(np.float32) if bias else None)
        self.bias_k = self.bias_v = None

    def __call__(self, query, key, value, need_weights=True):
        q, k, v = (t.a for t in (query, key, value))
        if not self.batch_first:                            # (L, B, E) -> (B, L, E)
            q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
        E, H = self.embed_dim, self.num_heads
        hd = E // H
        Wi = self.in_proj_weight.a
        bi = np.zeros(3 * E, np.float32) if self.in_proj_bias is None else self.in_proj_bias.a
        Q, K, V = q @ Wi[:E].T + bi[:E], k @ Wi[E:2 * E].T + bi[E:2 * E], v @ Wi[2 * E:].T + bi[2 * E:]
        heads = []
        for h in range(H):
            s = slice(h * hd, (h + 1) * hd)
            A = softmax(Q[..., s] @ K[..., s].transpose(0, 2, 1) / np.sqrt(hd), axis=-1)
            heads.append(A @ V[..., s])
        out = np.concatenate(heads, axis=-1) @ self.out_proj.weight.a.T
        if self.out_proj.bias is not None:
            out = out + self.out_proj.bias.a
        out = out.astype(np.float32)
        if not self.batch_first:
            out = out.transpose(1, 0, 2)
        return _Tensor(out), None


def flax_params(d, H, head_dim, *, bias=True, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)

    def dense(shape_k, shape_b):
        p = {"kernel": (rng.standard_normal(shape_k) / np.sqrt(shape_k[0])).astype(dtype)}
        if bias:
            p["bias"] = (0.3 * rng.standard_normal(shape_b)).astype(dtype)
        return p

    return {"query": dense((d, H, head_dim), (H, head_dim)), "key": dense((d, H, head_dim), (H, head_dim)),
            "value": dense((d, H, head_dim), (H, head_dim)), "out": dense((H, head_dim, d), (d,))}


def flax_apply(variables, inputs_q, inputs_kv):
    """flax.linen.MultiHeadDotProductAttention's computation: DenseGeneral projections, query / sqrt(depth)."""
    p = variables["params"]

    def proj(x, name):
        y = np.einsum("bnd,dhk->bnhk", x, p[name]["kernel"])
        return y + p[name]["bias"] if "bias" in p[name] else y

    q, k, v = proj(inputs_q, "query"), proj(inputs_kv, "key"), proj(inputs_kv, "value")
    q = q / np.sqrt(q.shape[-1])
    w = softmax(np.einsum("bqhk,bnhk->bhqn", q, k), axis=-1)
    y = np.einsum("bhqn,bnhk->bqhk", w, v)
    out = np.einsum("bqhk,hkc->bqc", y, p["out"]["kernel"])
    return out + p["out"]["bias"] if "bias" in p["out"] else out


def _answers_from_truth(truth, X):
    """What the merged parameters predict: every head on homogeneous tokens (or plain), summed."""
    H = truth.W.shape[0]
    if not truth.has_bias:
        return MultiHead(truth.W, truth.v)(X)
    Xh = np.concatenate([X, np.ones(X.shape[:-1] + (1,))], axis=-1)
    return sum(truth.head(h)(Xh) for h in range(H)) if H > 1 else truth.head(0)(Xh)


# ----------------------------------------------------------------------------- the merged truth

@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("H", [1, 2])
def test_torch_adapter_answers_and_truth_agree(H, batch_first, bias):
    target = targets.from_torch(TorchMHA(8, H, bias=bias, batch_first=batch_first, seed=H))
    X = _batch(8, seed=1)
    y = target(X)
    assert y.shape == (5,) and target.precision == "float32" and target.truth.has_bias == bias
    np.testing.assert_allclose(y, _answers_from_truth(target.truth, X), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("H", [1, 3])
def test_flax_adapter_answers_and_truth_agree(H, bias):
    target = targets.from_flax(flax_apply, flax_params(6, H, 4, bias=bias, seed=H))
    X = _batch(6, seed=2)
    assert target.precision == "float32"
    np.testing.assert_allclose(target(X), _answers_from_truth(target.truth, X), rtol=2e-5, atol=2e-6)


def test_flax_adapter_in_float64_states_no_precision():
    target = targets.from_flax(flax_apply, flax_params(5, 1, 3, bias=False, dtype=np.float64))
    assert target.precision is None and target.oracle().precision is None
    rec = exact.learn_single_head(target.oracle())
    err = target.truth.errors(rec)
    assert err["W"] < 1e-10 and err["v"] < 1e-12


keras = pytest.importorskip("keras")


def keras_layer(d, heads, key_dim, *, bias, seed=0, dtype="float32"):
    keras.utils.set_random_seed(seed)
    layer = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=key_dim, use_bias=bias, dtype=dtype)
    x = np.zeros((1, 2, d), dtype)
    layer(x[:, -1:], x)
    if bias:                                             # Keras initialises biases to 0: make them count
        rng = np.random.default_rng(seed + 1)
        for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
            dense.bias.assign((0.3 * rng.standard_normal(dense.bias.shape)).astype(dtype))
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("H", [1, 2])
def test_keras_adapter_answers_and_truth_agree(H, bias):
    target = targets.from_keras(keras_layer(8, H, 4, bias=bias, seed=H))
    X = _batch(8, seed=3)
    np.testing.assert_allclose(target(X), _answers_from_truth(target.truth, X), rtol=2e-5, atol=2e-6)
    assert target.vector(X).shape == (5, 8)


def test_keras_and_torch_adapters_merge_the_same_weights_alike():
    """One set of weights in both layouts: Keras x K (d, H, k) and torch W x (E, E) give one truth."""
    layer = keras_layer(6, 2, 3, bias=True, seed=4)
    m = TorchMHA(6, 2, bias=True, batch_first=True)

    def k(dense):
        return np.asarray(dense.kernel.numpy()).reshape(6, 6)

    m.in_proj_weight = _Tensor(np.concatenate([k(layer.query_dense).T, k(layer.key_dense).T,
                                               k(layer.value_dense).T]))
    m.in_proj_bias = _Tensor(np.concatenate([np.asarray(d.bias.numpy()).reshape(6) for d in
                                             (layer.query_dense, layer.key_dense, layer.value_dense)]))
    m.out_proj = _Linear(np.asarray(layer.output_dense.kernel.numpy()).reshape(6, 6).T,
                         np.asarray(layer.output_dense.bias.numpy()))
    a, b = targets.from_keras(layer), targets.from_torch(m)
    for name in ("W", "v", "w", "v0"):
        np.testing.assert_allclose(getattr(a.truth, name), getattr(b.truth, name), rtol=1e-12, atol=1e-14)
    X = _batch(6, seed=5)
    np.testing.assert_allclose(a(X), b(X), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- learning through them

@pytest.mark.parametrize("bias", [False, True])
def test_keras_layer_learned_in_three_lines(bias):
    """The issue's 'Done when': a Keras layer with and without biases, checked against its weights."""
    target = targets.from_keras(keras_layer(12, 1, 6, bias=bias, seed=7))
    rec = exact.learn_single_head(target.oracle(), bias=bias)
    err = target.truth.errors(rec)
    assert rec.diagnostics["precision_format"] == "float32"
    assert err["W"] < 1e-4 and err["v"] < 1e-5


def test_fresh_keras_layer_zero_biases_learned_with_bias_true_is_compared_in_homogeneous_form():
    """A fresh Keras layer has use_bias=True and every bias 0 (its initialiser): the README's
    snippet learns it with bias=True, a (d + 1)-dimensional head, which errors() compares with the
    homogeneous head w = 0, v0 = 0 (it raised a shape mismatch before: the truth had no bias)."""
    keras.utils.set_random_seed(3)
    layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=4)
    x = np.zeros((1, 2, 8), "float32")
    layer(x[:, -1:], x)
    target = targets.from_keras(layer)
    assert not target.truth.has_bias
    rec = exact.learn_single_head(target.oracle(), bias=True)
    assert rec.W.shape == (9, 9)
    err = target.truth.errors(rec)
    assert err["W"] < 1e-4 and err["v"] < 1e-5
    assert target.truth.head(0, homogeneous=True).W.shape == (9, 9)
    np.testing.assert_array_equal(target.truth.head(0, homogeneous=True).W[:8, 8], 0.0)
    with pytest.raises(InvalidInputError, match=r"recovered W has shape \(3, 3\)"):
        target.truth.errors(type("R", (), {"W": np.eye(3), "v": np.ones(3)})())


def test_keras_layer_with_biases_learned_without_says_bias_true():
    target = targets.from_keras(keras_layer(8, 1, 4, bias=True, seed=8))
    with pytest.raises(OracleInconsistentError, match="Pass bias=True"):
        exact.learn_single_head(target.oracle())


def test_torch_layer_with_biases_learned_through_the_adapter():
    target = targets.from_torch(TorchMHA(6, 1, bias=True, batch_first=False, seed=9))
    rec = exact.learn_single_head(target.oracle(), bias=True)
    err = target.truth.errors(rec)
    assert err["W"] < 1e-4 and err["v"] < 1e-5


# ----------------------------------------------------------------------------- plain callables, bad input

def test_callable_on_one_sequence_with_a_vector_output_and_readout():
    from companion.attention import random_single_head

    heads = [random_single_head(4, seed=s) for s in (1, 2)]

    def model(x):                                   # one sequence in, a 2-vector out
        assert x.ndim == 2
        return np.array([heads[0](x), heads[1](x)])

    target = targets.from_callable(model, 4, readout=[1.0, 0.0])
    assert target.d_out == 2 and target.truth is None
    rec = exact.learn_single_head(target.oracle())
    np.testing.assert_allclose(rec.W, heads[0].W, atol=1e-9)
    with pytest.raises(InvalidInputError, match="pass readout"):
        targets.from_callable(model, 4)


def test_bad_inputs_are_refused_with_advice():
    with pytest.raises(InvalidInputError, match="callable"):
        targets.from_callable(3, 4)
    with pytest.raises(InvalidInputError, match="adapters know"):
        targets.from_callable(lambda x: 0.0, 2, dtype="int8")
    m = TorchMHA(4, 1)
    m.in_proj_weight = None
    with pytest.raises(InvalidInputError, match="in_proj_weight"):
        targets.from_torch(m)
    with pytest.raises(InvalidInputError, match="query"):
        targets.from_flax(flax_apply, {"q": {}})
    t = targets.from_torch(TorchMHA(4, 1, bias=False))
    with pytest.raises(InvalidInputError, match=r"recovered W has shape \(4, 4\), head 0 \(5, 5\); the layer has biases: learn with bias=True"):
        targets.from_torch(TorchMHA(4, 1, bias=True)).truth.errors(exact.learn_single_head(t.oracle()))
    with pytest.raises(InvalidInputError, match=r"\(B, N, d=4\)"):
        t.vector(np.zeros((2, 4)))


# ----------------------------------------------------------------------------- a chapter 08 reader's findings (2026-12-05)

class _BF16Tensor(_Tensor):
    """A torch bfloat16 tensor's behaviour: its ``.numpy()`` raises (NumPy has no bfloat16), ``.float()`` converts."""

    def __init__(self, a):
        super().__init__(np.asarray(a, dtype=np.float32))
        self.dtype = "torch.bfloat16"

    def numpy(self):
        raise TypeError("Got unsupported ScalarType BFloat16")

    def float(self):
        return _Tensor(self.a)


def test_a_torch_bfloat16_tensor_is_read_through_float32():
    """A bfloat16 nn.MultiheadAttention crashed in from_torch (TypeError in .numpy()); it now refuses as the chapter
    says (a PrecisionError at bfloat16's rounding, measured with torch 2.13 in a scratch environment)."""
    out = targets._to_numpy(_BF16Tensor([1.5, -2.0]))
    assert out.dtype == np.float32 and out.tolist() == [1.5, -2.0]


def test_a_framework_oracle_passes_progress_and_keeps_its_precision():
    target = targets.from_callable(lambda x: float(x.sum()), 3, dtype="float32")
    oracle = target.oracle(progress=False)
    assert oracle.progress is False and oracle.precision == target.oracle().precision == 2.0**-24


def test_a_keras_float64_layer_returning_float32_states_float32():
    """Keras 3.15's MultiHeadAttention with dtype="float64" returns float32 arrays on the numpy backend: the adapter
    stated float64, and the learners measured the answers' rounding (or refused) instead of being told."""
    keras = pytest.importorskip("keras")
    layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2, dtype="float64")
    layer(query=np.zeros((1, 1, 6)), value=np.zeros((1, 2, 6)), key=np.zeros((1, 2, 6)))
    returned = np.asarray(layer(query=np.zeros((1, 1, 6)), value=np.zeros((1, 2, 6)), key=np.zeros((1, 2, 6)))).dtype
    target = targets.from_keras(layer)
    assert target.dtype == returned.name  # float32 on this Keras; float64 where a Keras returns float64
    assert layer.compute_dtype == "float64"


def test_a_bfloat16_keras_layer_saturating_is_named_a_precision_limit_not_a_verdict():
    """Keras MultiHeadAttention computing in bfloat16 (d = 16, key_dim = 2): learn_low_rank's weights stayed saturated
    and it said "the oracle does not behave like a softmax head"; the stated rounding explains it (a PrecisionError)."""
    keras = pytest.importorskip("keras")
    from companion import lowrank
    from companion.errors import PrecisionError

    keras.utils.set_random_seed(0)
    layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2, use_bias=False, dtype="bfloat16")
    x = np.zeros((1, 2, 16), np.float32)
    layer(x[:, -1:], x)
    with pytest.raises(PrecisionError, match=r"stayed saturated .* stated to carry rounding u=0.0039 \(bfloat16\)"):
        lowrank.learn_low_rank(targets.from_keras(layer).oracle(), 2)


def test_a_float64_target_whose_weights_stay_saturated_keeps_its_verdict():
    """Just outside the renaming: a hard-max head (not a softmax) answering in float64 keeps the verdict."""
    from companion import lowrank
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle

    head = random_single_head(6, rank=2, seed=0)

    def hardmax(X):
        X = np.asarray(X, dtype=float)
        s = np.einsum("bnd,de,be->bn", X, head.W, X[:, -1, :])
        return np.einsum("bnd,d->bn", X, head.v)[np.arange(len(X)), np.argmax(s, axis=1)]

    with pytest.raises(OracleInconsistentError, match="does not behave like a softmax head"):
        lowrank.learn_low_rank(ValueQueryOracle(hardmax, d=6), 2)
