"""Learning a one-layer Transformer from value queries (§4.1): FFN extraction plus Theorem 4.1.

``TF(X) = w_o^T ReLU(alpha(X, W)^T X A)`` (:class:`~companion.attention.OneLayerTransformer`). Two
facts split the problem in two:

1. On one-token queries ``[x^T]`` the softmax weight is 1, so ``VQ([x^T]) = w_o^T ReLU(A^T x)``: a
   bias-free ReLU network, extracted by :func:`companion.ffn.learn_ffn`.
2. The scores ``x_i^T W x_N`` are unchanged by ``X -> -X``, and ``ReLU(z) - ReLU(-z) = z``, so the
   antisymmetrised oracle ``VQ(X) - VQ(-X) = alpha(X, W)^T X (A w_o)`` is a single head with value
   vector ``A w_o`` (:class:`~companion.oracles.AntisymmetrisedOracle`); Theorem 4.1
   (:func:`companion.exact.learn_single_head`) recovers ``W`` from it if ``A w_o != 0``.

The two halves share ``2d`` queries: the head learner's ``d`` length-1 antisymmetrised queries
``VQ([e_j^T]) - VQ([-e_j^T])`` are the FFN learner's linear-part queries ``[+-e_j^T]``, so their
answers are kept and reused (:class:`ReusedAnswers`), and the attention costs ``2 d**2`` queries.

The package (private modules; this ``__init__`` re-exports the public names, so
``companion.transformer.X`` is the import path):

* ``_one_layer``: :func:`learn_one_layer` (§4.1), :class:`ReusedAnswers`, ``ZERO_TOL``, and
  :class:`ScaledAntisymmetrised`, the antisymmetrised view at a query scale;
* ``_multi_head``: several heads, :func:`learn_multi_head_transformer` and its named stages;
* ``_biased``: a biased ReLU FFN, :func:`learn_one_layer_biased` (this book's reduction).
"""

from __future__ import annotations

from .._learner import COARSE_FACTOR
from ..attention import OneLayerTransformer  # noqa: F401  (importable here, as before the split)
from ._biased import (
    BiasedOneLayerTransformer,
    BiasedTransformerRecovery,
    learn_one_layer_biased,
    random_biased_one_layer,
)
from ._multi_head import (
    MultiHeadTransformer,
    MultiHeadTransformerRecovery,
    ServedMultiHeadTransformer,
    evaluate_multi_head,
    learn_multi_head_transformer,
    random_multi_head_transformer,
    region_anchors,
)
from ._one_layer import (
    ReusedAnswers,
    ScaledAntisymmetrised,
    TransformerRecovery,
    evaluate,
    learn_one_layer,
    output_precision,
    random_one_layer,
)

# Public names outside __all__: DESIGN.md's ZERO_TOL, and the blame budget the tests pin.
from ._one_layer import FFN_BLAME_QUERIES, ZERO_TOL  # noqa: F401
from ._biased import BIASED_MARGIN, FAR_CANDIDATES, FAR_TRIES, LOGIT_SCALE, MAX_SCALE, SATURATED  # noqa: F401

_COARSE_FACTOR = COARSE_FACTOR  # the canonical-form learners' factor too (companion._learner.names_rounding)

__all__ = [
    "learn_one_layer",
    "TransformerRecovery",
    "random_one_layer",
    "output_precision",
    "evaluate",
    "ReusedAnswers",
    "ScaledAntisymmetrised",
    "MultiHeadTransformer",
    "MultiHeadTransformerRecovery",
    "random_multi_head_transformer",
    "region_anchors",
    "learn_multi_head_transformer",
    "ServedMultiHeadTransformer",
    "evaluate_multi_head",
    "BiasedOneLayerTransformer",
    "random_biased_one_layer",
    "BiasedTransformerRecovery",
    "learn_one_layer_biased",
]

# The public names report the package as their module, whatever private file defines them: saved
# results name "companion.<package>:<Class>" as before the split, the API page (autodoc of this
# package) documents them, and tools that look for a module's own learners find them here.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj
