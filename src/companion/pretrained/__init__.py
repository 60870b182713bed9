"""Real targets: the 72 attention heads of the pretrained all-MiniLM-L6-v2 sentence encoder.

all-MiniLM-L6-v2 (Reimers & Gurevych 2019 sentence-transformers, distilled from MiniLM, Wang et al.
2020) is a BERT encoder with 6 layers of 12 heads, width ``d = 384`` and head dimension 32. Its
weights are stored, as float32 per-head slices, in the committed file ``data/minilm_l6_heads.npz``
(``python -m companion.pretrained fetch`` regenerates it; ``data/README.md`` records the source).
Nothing here touches the network except :func:`fetch`.

From a BERT head to the paper's regressor
-----------------------------------------
Head ``h`` of a layer has query, key and value maps ``x -> Q x + b_Q`` (``Q, K, V`` of shape
(32, 384), biases of shape (32,)) and its 32 columns ``O`` (384, 32) of the output projection, whose
bias is ``b_O`` (384,). With a scalar readout ``c`` (a unit vector in :math:`\\mathbb{R}^{384}`) the head's output at
the last (query) token ``x_N`` is

.. math::
   g(X) = c^\\top\\Big(O \\sum_i \\alpha_i (V x_i + b_V) + b_O\\Big),\\qquad
   \\alpha = \\operatorname{softmax}_i\\big((Q x_N + b_Q)^\\top (K x_i + b_K) / \\sqrt{32}\\big).

Append a constant 1 to every token, ``x~ = (x, 1)`` in :math:`\\mathbb{R}^{385}`. The score expands into four terms;
``x_i^T K^T Q x_N`` and ``x_i^T K^T b_Q`` depend on ``x_i``, while ``b_K^T Q x_N`` and
``b_K^T b_Q`` are the same for every token and cancel in the softmax. Since the weights sum to 1,
``c^T O b_V + c^T b_O`` is a constant output shift. Hence ``g(X) = f_{W~, v~}(X~)`` exactly, with

.. math::
   \\tilde W = \\frac{1}{\\sqrt{32}}\\begin{pmatrix} K^\\top Q & K^\\top b_Q \\\\ 0 & 0 \\end{pmatrix},
   \\qquad
   \\tilde v = \\begin{pmatrix} V^\\top O^\\top c \\\\ b_V^\\top O^\\top c + c^\\top b_O \\end{pmatrix}.

Only the first 384 rows of ``W~`` are identifiable from queries whose tokens end in 1: the last row
multiplies the last coordinate of ``x_i``, which is 1 for every token, so any last row adds the same
number to every score and leaves ``f`` unchanged. The zero last row is the canonical choice
(:func:`load_head`, :func:`learn_homogeneous_head`); ``W~`` keeps rank 32 = rank(K^T [Q, b_Q]).

BERT's own computation, and a reference for it
----------------------------------------------
:func:`bert_attention_vector` and :func:`bert_attention_output` compute the layer the way BERT does,
from the raw weight layout, without forming ``W~`` or ``v~``; :class:`BertAttentionTarget` wraps them
as a value-query target on homogeneous tokens, so that a learner can query BERT's computation rather
than its own model class. ``data/bert_reference_layer0.npz`` (:func:`load_reference`) holds the
output of Hugging Face ``transformers``' ``BertModel`` on fixed inputs, made once by
``data/bert_reference.py`` in a scratch environment; the tests compare against it.

The package's private modules: ``_weights`` (the committed weights, loading, the heads in the
paper's form), ``_bert`` (BERT's own computation and its reference), ``_learn``
(:func:`learn_homogeneous_head`, :func:`homogeneous_errors`, :func:`layer_counts_probe`) and
``_fetch`` (:func:`fetch`, the command line; ``python -m companion.pretrained fetch``).
"""

from __future__ import annotations

from ._bert import (
    REFERENCE_FILE,
    BertAttentionTarget,
    bert_attention_output,
    bert_attention_vector,
    load_reference,
)
from ._fetch import fetch, main
from ._learn import homogeneous_errors, layer_counts_probe, learn_homogeneous_head
from ._weights import (
    CONTENT_SHA256,
    D_HEAD,
    D_MODEL,
    DATA_FILE,
    N_HEADS,
    N_LAYERS,
    PACKAGE,
    PACKAGE_VERSION,
    SAFETENSORS_SHA256,
    BertHead,
    FactorScoredHead,
    content_sha256,
    default_readout,
    homogeneous,
    load_bert_head,
    load_head,
    load_weights,
)

__all__ = [
    "N_LAYERS",
    "N_HEADS",
    "D_MODEL",
    "D_HEAD",
    "DATA_FILE",
    "PACKAGE",
    "PACKAGE_VERSION",
    "SAFETENSORS_SHA256",
    "CONTENT_SHA256",
    "BertHead",
    "FactorScoredHead",
    "load_weights",
    "load_bert_head",
    "default_readout",
    "load_head",
    "homogeneous",
    "bert_attention_vector",
    "bert_attention_output",
    "BertAttentionTarget",
    "REFERENCE_FILE",
    "load_reference",
    "learn_homogeneous_head",
    "homogeneous_errors",
    "layer_counts_probe",
    "content_sha256",
    "fetch",
    "main",
]

# The public objects keep ``companion.pretrained`` as their home (saved results, the docs).
for _name in __all__:
    _obj = globals()[_name]
    if callable(_obj):  # functions and classes; not the constants
        _obj.__module__ = __name__
del _name, _obj

#: Deprecated names of this module: ``{old: (new name, object)}``, served by ``__getattr__``.
_DEPRECATED = {"FactoredHead": ("FactorScoredHead", FactorScoredHead)}


def __getattr__(name):
    """``pretrained.FactoredHead`` (deprecated): :class:`FactorScoredHead`, with a warning.

    The old name collided with :class:`companion.attention.FactoredHead`, a different class.
    """
    if name in _DEPRECATED:
        import warnings

        new, obj = _DEPRECATED[name]
        warnings.warn(
            f"companion.pretrained.{name} is deprecated; use companion.pretrained.{new} "
            f"(companion.attention.{name} is a different class: a head stored as "
            "factors only).",
            DeprecationWarning,
            stacklevel=2,
        )
        return obj
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
