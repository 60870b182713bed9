"""A deployed attention layer, read through its output vector (this book's own construction).

The layers people deploy (Keras ``MultiHeadAttention``, BERT's ``BertAttention``) return a vector,
have ``H`` heads with query, key and value biases, an output projection with its own bias, and
inside a Transformer block a residual connection and a LayerNorm. With homogeneous tokens
``x~ = (x, 1)`` the biases fold into the heads, and the block's output at the last token is

    u(X) = sum_h alpha(X, W~_h)^T X~ M_h^T + b_O + S x_N,

``W~_h`` of shape ``(d + 1, d + 1)`` (scores ``x~_i^T W~_h x~_N``), ``M_h`` of shape
``(d_out, d + 1)`` (the value map followed by the head's block of the output projection), ``b_O``
of shape ``(d_out,)`` and a skip matrix ``S`` of shape ``(d_out, d)`` (the identity for a
residual block, absent without one), followed by ``LN(u)`` in a post-LN block (BERT, MiniLM).
:class:`AttentionLayer` computes it (also a pre-LN block, ``S x_N + o(LN(X))``, as GPT-2);
:func:`learn_attention_layer` recovers its canonical form from a
:class:`~companion.oracles.VectorQueryOracle`.

What the queries can determine (the canonical form, :meth:`AttentionLayer.canonical`): the last
row of ``W~_h`` adds to every score a term of the query token alone, which the softmax removes, so
it is set to 0; the last column of ``M_h`` adds a constant (the attention weights sum to 1), so it
is moved into ``b_O``; heads with equal ``W~`` are merged (their ``M`` summed) and heads with
``M_h = 0`` dropped, as for a sum of scalar heads (:func:`companion.multihead.canonical_form`).
A post-LN hides the all-ones direction of ``u`` and its scale and sign (:func:`post_ln_symmetry`):
a skip ``c I`` is seen only up to ``c``, which the learner fixes to 1 (``SKIP_NORMALISATION``);
a pre-LN's ``gamma`` and ``beta`` fold into the heads
(:func:`pre_ln_symmetry`). The learner reads either LayerNorm off one-token answers and learns the rest.

The package: ``_model`` (the layer, its symmetries), ``_norm`` (a post-LN read off one-token
answers), ``_preln`` (a pre-LN's eps, skip and normalised tokens), ``_fit`` (heads' reduction, least
squares, polish), ``_joint`` (the heads' stage on all outputs jointly), ``_directions`` (behind a
post-LN whose eps hides the norms, as BERT's 1e-12: the norms from the pair queries' row space),
``_learn`` (the learner), ``_seeds`` (:func:`try_seeds`, the learner over seeds as its refusals advise),
``_minilm`` (MiniLM layer 0's whole block, :func:`minilm_block`, :class:`MiniLMBlock`).
"""

from ._fit import LSTSQ_GATE, POLISH_MAX_UNKNOWNS
from ._joint import (
    JOINT_FROM,
    JOINT_SCALE_STEPS,
    JOINT_SEPARATION,
    LINK_RETRIES,
    LINK_SWAP_RATIO,
    joint_plan,
    joint_separation,
)
from ._joint import TOKEN_SCALE as JOINT_TOKEN_SCALE
from ._float32 import (
    FLOAT32_FLOOR_UNITS,
    FLOAT32_HEADS_TOL,
    FLOAT32_LINK_TOKENS,
    FLOAT32_POLISH_MAX_UNKNOWNS,
    FLOAT32_FREE_POLISH_MAX_UNKNOWNS,
    FLOAT32_RANK_UNITS,
    FLOAT32_SKIP_UNITS,
    FLOAT32_VERIFY_UNITS,
)
from ._learn import (
    FLOAT32_UNRESOLVED,
    HEADS_UNRESOLVED,
    LSTSQ_GATE_POST,
    POST_JOINT_FROM,
    PRE_JOINT_FROM,
    SKIP_NORMALISATION,
    LayerRecovery,
    learn_attention_layer,
)
from ._model import (
    AttentionLayer,
    identifiable_parameters,
    information_floor,
    layer_norm,
    post_ln_symmetry,
    pre_ln_symmetry,
    random_attention_layer,
)
from ._minilm import BLOCK_FILE, MiniLMBlock, load_block_reference, minilm_block
from ._directions import ABSORBED_OFF, DIRECTIONS_FROM_GAP, DIRECTIONS_RANK_UNITS, FLOAT32_POST_VERIFY
from ._directions import FREE_POLISH_MAX_LEN
from ._directions import directions_route_plan, polish_plan as float32_polish_plan
from ._norm import LOW_GAP, MIN_GAP, ROUNDING_UNITS
from ._seeds import SEED_REFUSALS, SeedOutcome, SeedRun, try_seeds
from ._verify import VERIFY_LONG_LEN, VERIFY_LONG_SHARE, VERIFY_SCALED_SHARE, verify_queries

__all__ = [
    "AttentionLayer",
    "LayerRecovery",
    "learn_attention_layer",
    "try_seeds",
    "SeedOutcome",
    "SeedRun",
    "SEED_REFUSALS",
    "random_attention_layer",
    "information_floor",
    "identifiable_parameters",
    "HEADS_UNRESOLVED",
    "SKIP_NORMALISATION",
    "FLOAT32_FLOOR_UNITS",
    "FLOAT32_HEADS_TOL",
    "FLOAT32_LINK_TOKENS",
    "FLOAT32_POLISH_MAX_UNKNOWNS",
    "FLOAT32_FREE_POLISH_MAX_UNKNOWNS",
    "FLOAT32_RANK_UNITS",
    "FLOAT32_VERIFY_UNITS",
    "FLOAT32_SKIP_UNITS",
    "FLOAT32_UNRESOLVED",
    "DIRECTIONS_RANK_UNITS",
    "ABSORBED_OFF",
    "FLOAT32_POST_VERIFY",
    "FREE_POLISH_MAX_LEN",
    "directions_route_plan",
    "float32_polish_plan",
    "LSTSQ_GATE_POST",
    "ROUNDING_UNITS",
    "layer_norm",
    "post_ln_symmetry",
    "pre_ln_symmetry",
    "LSTSQ_GATE",
    "JOINT_FROM",
    "JOINT_SEPARATION",
    "JOINT_SCALE_STEPS",
    "LINK_RETRIES",
    "LINK_SWAP_RATIO",
    "JOINT_TOKEN_SCALE",
    "joint_separation",
    "joint_plan",
    "POST_JOINT_FROM",
    "PRE_JOINT_FROM",
    "POLISH_MAX_UNKNOWNS",
    "MIN_GAP",
    "LOW_GAP",
    "DIRECTIONS_FROM_GAP",
    "minilm_block",
    "MiniLMBlock",
    "load_block_reference",
    "BLOCK_FILE",
    "VERIFY_LONG_LEN",
    "VERIFY_LONG_SHARE",
    "VERIFY_SCALED_SHARE",
    "verify_queries",
]
