"""learn_relu_network: ReLU networks with biases and several hidden layers (companion.ffn)."""

import numpy as np
import pytest

from companion.errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from companion.ffn import ReLUNetwork, learn_relu_network, random_feedforward, random_relu_network
from companion.oracles import ValueQueryOracle


def test_forward_is_the_stated_network():
    net = ReLUNetwork([np.array([[1.0, -1.0]]), np.array([2.0, 1.0])], [np.array([-1.0, 0.0]), 0.5])
    x = np.array([[3.0], [-2.0], [0.5]])
    expected = 2.0 * np.maximum(x[:, 0] - 1.0, 0) + np.maximum(-x[:, 0], 0) + 0.5
    np.testing.assert_array_equal(net.forward(x), expected)
    assert net.widths == (2,) and net.d == 1 and net.n_parameters == 2 + 2 + 2 + 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_depth_one_biased_recovered_to_35_bits(seed):
    net = random_relu_network(10, (8,), seed=seed)
    rec = learn_relu_network(ValueQueryOracle(net), widths=(8,))
    assert rec.network.widths == (8,)
    assert rec.diagnostics["verify_bits"] >= 35
    # fresh inputs, far from the learner's points
    X = np.random.default_rng(99).standard_normal((500, 10)) * 2.0
    y = net.forward(X)
    assert np.max(np.abs(rec.network.forward(X) - y)) / np.max(np.abs(y)) < 2.0**-35


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_depth_two_biased_recovered_to_35_bits(seed):
    net = random_relu_network(10, (8, 8), seed=seed)
    rec = learn_relu_network(ValueQueryOracle(net), widths=(8, 8))
    assert rec.network.widths == (8, 8)
    assert rec.diagnostics["verify_bits"] >= 35
    X = np.random.default_rng(7).standard_normal((500, 10))
    y = net.forward(X)
    assert np.max(np.abs(rec.network.forward(X) - y)) / np.max(np.abs(y)) < 2.0**-35


def test_depth_one_width_detected():
    net = random_relu_network(10, (8,), seed=1)
    rec = learn_relu_network(ValueQueryOracle(net))
    assert rec.network.widths == (8,) and rec.diagnostics["verify_bits"] >= 35


def test_depth_three_refused_not_wrong():
    # Seed 1: a neuron or a weight of layer 3 is not seen and the verification fails: the learner
    # refuses; it never returns an unverified network.
    net = random_relu_network(10, (8, 8, 8), seed=1)
    with pytest.raises((NotIdentifiableError, OracleInconsistentError)):
        learn_relu_network(ValueQueryOracle(net), widths=(8, 8, 8))


def test_growing_widths_refused_before_any_query():
    oracle = ValueQueryOracle(random_relu_network(4, (6,), seed=0))
    with pytest.raises(InvalidInputError, match="grow"):
        learn_relu_network(oracle, widths=(6,))
    assert oracle.n_queries == 0


def test_wider_than_input_refused():
    with pytest.raises((OracleInconsistentError, NotIdentifiableError)):
        learn_relu_network(ValueQueryOracle(random_feedforward(10, 12, seed=0)), widths=(8,))


def test_depth_three_biased_recovered_to_35_bits():
    # random_relu_network(10, (8, 8, 8), seed=0): three neurons of layer 3 are dead on the inputs
    # (never active): the recovered network leaves them out and computes the same function.
    net = random_relu_network(10, (8, 8, 8), seed=0)
    rec = learn_relu_network(ValueQueryOracle(net), widths=(8, 8, 8))
    assert rec.network.widths == (8, 8, 5)
    assert rec.diagnostics["verify_bits"] >= 35
    X = np.random.default_rng(5).standard_normal((2000, 10))
    y = net.forward(X)
    assert np.max(np.abs(rec.network.forward(X) - y)) / np.max(np.abs(y)) < 2.0**-35
