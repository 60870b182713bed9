"""Pinned rules of ``companion.recovery``: ``n_learning_queries``, ``relative_errors`` (Frobenius and
2-norm, absolute for a zero reference) and the repr's summaries, each recomputed from the docstring.
"""

import numpy as np
import pytest

from companion.attention import SingleHead
from companion.errors import InvalidInputError
from companion.recovery import Recovery


def test_n_learning_queries_subtracts_the_verification_queries():
    assert Recovery(np.eye(2), np.ones(2), 50, diagnostics={"n_verify_queries": 17}).n_learning_queries == 33
    assert Recovery(np.eye(2), np.ones(2), 50).n_learning_queries == 50


def test_relative_errors_are_frobenius_and_two_norm_ratios():
    rng = np.random.default_rng(0)
    W, v = rng.standard_normal((3, 3)), rng.standard_normal(3)
    dW, dv = rng.standard_normal((3, 3)), rng.standard_normal(3)
    rec = Recovery(W + dW, v + dv, 1)
    err = rec.relative_errors(SingleHead(W, v))
    assert err["W"] == pytest.approx(np.sqrt(np.sum(dW**2)) / np.sqrt(np.sum(W**2)), rel=1e-12)
    assert err["v"] == pytest.approx(np.sqrt(np.sum(dv**2)) / np.sqrt(np.sum(v**2)), rel=1e-12)
    assert type(err["W"]) is float


def test_relative_errors_against_a_zero_reference_are_absolute():
    rec = Recovery(np.full((2, 2), 0.5), np.array([3.0, 4.0]), 1)
    err = rec.relative_errors(SingleHead(np.zeros((2, 2)), np.array([3.0, 4.0])))
    assert err == {"W": 1.0, "v": 0.0}


def test_relative_errors_refuse_other_shapes():
    with pytest.raises(InvalidInputError, match="shape"):
        Recovery(np.eye(2), np.ones(2), 1).relative_errors(SingleHead(np.eye(3), np.ones(3)))


def test_diagnostics_are_read_only_and_n_queries_an_int():
    rec = Recovery(np.eye(2), np.ones(2), np.int64(7), diagnostics={"a": 1})
    assert type(rec.n_queries) is int and rec.d == 2
    with pytest.raises(TypeError):
        rec.diagnostics["a"] = 2


def test_repr_lists_fields_sorted_and_arrays_above_six_entries_by_shape():
    rec = Recovery(np.eye(3), np.array([1.0, 2.0]), 4, message="m", diagnostics={"z": 0.123456789, "a": 2})
    text = repr(rec)
    lines = text.splitlines()[1:-1]
    assert [ln.split(":")[0].strip() for ln in lines] == ["W", "diagnostics", "message", "n_queries", "v"]
    assert "<ndarray of shape (3, 3)>" in text  # 9 entries > 6
    assert "[1., 2.]" in text  # 2 entries: printed
    assert "{a: 2, z: 0.123457}" in text  # floats to 6 significant digits, keys sorted
