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

Measured reach of :func:`learn_attention_layer` (this book's measurements; the constants' own documentation holds
the measurements behind each threshold):

Without LayerNorm (seed ``d + H`` of :func:`random_attention_layer`, 2026-12-03, one BLAS thread): learning queries
313, 627, 927 at ``d = 8``, ``H = 1, 2, 3`` (``4Hd^2 - 2H + 1``: 255, 509, 763), 2,215 and 3,297 at ``d = 16``,
``H = 2, 3``, against information floors of 18 to 100 queries; fresh-query relative errors 6e-16 to 3.4e-15, in 0.1
to 3.4 s (plus 20 probes since). Above ``POLISH_MAX_UNKNOWNS`` no polish is made: at ``d = 32``, ``H = 4`` (4,224
heads' rows' entries) the check refuses it at 6.8e-8 (measured when the cap was 2000 on all unknowns, which also
left ``d = 24``, ``H = 3`` unpolished: verified at 9.3e-9).

A pre-LN (step 6 of the learner's Notes; seeds 0 to 2, d 5 to 10, H 1 or 2, eps 1e-5 and 1e-12, with and without
residual): 48 of 48 recovered, fresh-query errors below 1e-14; (2026-12-04, residual, seeds 0 to 2, learner seed 0)
d = 8, 16, 24 and 32, H = 1 and 2, eps 1e-5, 1e-3 and 0.1: 72 of 72, fresh errors on 200 queries 5.2e-15 to 4.1e-13.

The float32 route (step 7; 2026-12-04): Keras ``MultiHeadAttention(use_bias=True)`` in float32 with ``H = 2`` at
``d = 6`` and 8 is learned (within 3 learner seeds), predicting its served answers to 6.5 u to 14.3 u (floors 3.2 u
to 5.6 u; float64 layers rounded to float32: 1.8 u to 7.4 u, see ``FLOAT32_VERIFY_UNITS``); ``H = 4`` and 8 were
refused by the readout route's heads' learner. The joint route (step 8: its rank counted above
``FLOAT32_RANK_UNITS`` u, its fits at ``FLOAT32_HEADS_TOL``, its rows linked through ``FLOAT32_LINK_TOKENS`` tokens,
polished densely up to ``FLOAT32_POLISH_MAX_UNKNOWNS`` unknowns and matrix-free above, since 2026-12-05: random
blocks with ``H = 8`` at ``d = 32`` and 64 rounded to float32, refused unpolished at 65 u to 103 u, now verified at
1.0 u to 1.5 u; measured 2026-12-04, key_dim 2, learner seed 0, on 200 fresh queries) learns ``H = 4`` at ``d = 8``
(seeds 0 to 2: 10.6 u, 12.4 u, 7.7 u, floors 4.2 u, 5.6 u, 4.1 u) and ``H = 8`` at ``d = 8`` (seeds 0 to 2: 7.3 u,
15.4 u, 12.7 u, floors 3.3 u, 4.5 u, 5.7 u; 13 to 14 CPU s), ``d = 10`` and 12 (seed 0: 7.6 u and 8.1 u, floors 4.6
u and 3.0 u) and ``d = 16`` (seeds 0 and 1: 6.6 u and 8.5 u, floors 2.8 u and 3.3 u; 50 CPU s, 13,047 queries, peak
RSS 1.7 GB with Keras, the polish's Jacobian). At ``H = 8`` no token's Loewner pencil resolves the 8 poles under
float32's rounding: the rows start from the columns of ``C^{-1}`` fitted over all their tokens
(:func:`companion.layer._joint._start_C_columns`). ``d = 16``, ``H = 4`` (key_dim 4, 2,384 unknowns) is polished
now: 8.5 u, 13.1 u, 11.9 u at seeds 0 to 2 (floors 3.3 u, 3.9 u, 4.8 u; it was 43 u to 90 u unpolished). Targets
outside the class, with their true heads given, misfit by 1.2e7 u or more; a mask over the last 3 tokens, a second
layer and a GELU after a Keras ``H = 8`` block (float32, ``d = 8``) are refused.

The joint heads' stage (step 8; 2026-12-04, ``random_attention_layer`` seeds 0 and 1, residual, one BLAS thread):
learned at ``d = 8``, 16 and 32 for every ``H`` from 3 to 8 (36 of 36), fresh errors 7.4e-16 to 5.1e-13. The readout
route refused ``H = 6`` to 8 at ``d = 8``, ``H = 7, 8`` at ``d = 16`` and ``H = 3`` to 8 at ``d = 32`` (the last
with "not an attention layer", a false verdict; hence ``JOINT_FROM`` = 3). At ``d = 64``, ``H = 8`` (bench_layer's
row): learned from 93,789 queries (fresh error 8.2e-14; its time against the oracle's own is
benchmarks/bench_layer.py's), where the readout route refused after 130,317.
"""

from ._fit import FREE_POLISH_SCALE_POWER, FREE_POLISH_STEPS, LSTSQ_GATE, POLISH_LN_GAMMA, POLISH_MAX_UNKNOWNS
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
from ._directions import POLISH_TOP_RANGE, polish_top_plan as float32_polish_top_plan
from ._directions import GapFit, post_ln_eps
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
    "FREE_POLISH_STEPS",
    "FREE_POLISH_SCALE_POWER",
    "POLISH_LN_GAMMA",
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
    "float32_polish_top_plan",
    "POLISH_TOP_RANGE",
    "post_ln_eps",
    "GapFit",
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
