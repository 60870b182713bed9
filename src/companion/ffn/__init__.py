"""ReLU network extraction from one-token value queries (§4.1 of the paper, and beyond).

* ``companion.ffn.bias_free``: the bias-free one-hidden-layer network ``w_o^T ReLU(A^T x)`` that a
  one-layer Transformer computes on length-1 queries, and :func:`learn_ffn`;
* ``companion.ffn.deep``: networks with biases and ``k >= 1`` hidden layers,
  :func:`learn_relu_network`;
* :mod:`companion.ffn._kinks`: critical points along a line (:func:`find_kinks`) and the field's
  bits of precision, shared by both.

The names below were those of the module ``companion.ffn`` before it became a package.
"""

from ._kinks import bits_of_precision, find_kinks
from .bias_free import (
    FeedForward,
    FFNRecovery,
    align_networks,
    canonical_form,
    learn_ffn,
    random_feedforward,
    resolve_signs,
)
from .deep import ReLUNetwork, ReLUNetworkRecovery, learn_relu_network, random_relu_network

__all__ = [
    "FeedForward",
    "random_feedforward",
    "canonical_form",
    "align_networks",
    "find_kinks",
    "resolve_signs",
    "bits_of_precision",
    "learn_ffn",
    "FFNRecovery",
    "ReLUNetwork",
    "ReLUNetworkRecovery",
    "random_relu_network",
    "learn_relu_network",
]
