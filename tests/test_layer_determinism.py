"""The layer learner names a non-deterministic oracle (dropout left on) before any stage's refusal stands."""

from __future__ import annotations

import numpy as np
import pytest

from companion.errors import CompanionError, OracleInconsistentError
from companion.layer import learn_attention_layer, random_attention_layer, try_seeds
from companion.layer._determinism import (
    DETERMINISM_LEN,
    DETERMINISM_QUERIES,
    DETERMINISM_UNITS,
    REPLAY_BYTES,
    KeptQueries,
    nondeterminism,
    replay_differs,
)
from companion.oracles import VectorQueryOracle, unit_roundoff

BLOCK = random_attention_layer(6, 2, residual=True, seed=0)


class Dropout:
    """The block with inverted dropout on its input tokens, a fresh mask at every call (training mode)."""

    d = d_out = 6

    def __init__(self, p, seed=5):
        self.p, self.rng = p, np.random.default_rng(seed)

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        return BLOCK(X * ((self.rng.random(X.shape) > self.p) / (1.0 - self.p)))


class FixedKeyDropout:
    """Dropout with the same mask at every call, drawn per batch position (Flax with a fixed dropout key)."""

    d = d_out = 6

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        return BLOCK(X * ((np.random.default_rng(0).random(X.shape) > 0.1) / 0.9))


class BatchStatistics:
    """The block's answers normalised by the batch's own mean and spread (a BatchNorm in training mode)."""

    d = d_out = 6

    def __call__(self, X):
        Y = BLOCK(np.asarray(X, dtype=float))
        return (Y - Y.mean(axis=0)) / (Y.std(axis=0) + 1e-3) if Y.shape[0] > 1 else Y


class Drifting:
    """The block, its answers scaled by ``1 + step * k`` at its ``k``-th call: deterministic within a call."""

    d = d_out = 6

    def __init__(self, step):
        self.step, self.calls = step, 0

    def __call__(self, X):
        self.calls += 1
        return BLOCK(np.asarray(X, dtype=float)) * (1.0 + self.step * self.calls)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_dropout_layer_is_refused_for_its_non_determinism_at_every_seed(seed):
    """An adversarial tester's dropout target got a different verdict at each seed (2026-12-05); now one cause."""
    oracle = VectorQueryOracle(Dropout(0.1), d=6, d_out=6)
    with pytest.raises(
        OracleInconsistentError, match=r"not deterministic: asked again the \d+ queries it kept"
    ) as info:
        learn_attention_layer(oracle, H=2, seed=seed)
    assert info.value.nondeterministic is True
    assert isinstance(info.value.__cause__, CompanionError)  # the stage's own refusal, chained
    assert "model.eval()" in str(info.value) and "training=False" in str(info.value)


def test_a_mask_drawn_per_batch_position_is_seen_by_the_reversed_second_call():
    """An adversarial tester's fixed-key dropout repeated exactly when the same batch was asked twice."""
    with pytest.raises(OracleInconsistentError, match="not deterministic") as info:
        learn_attention_layer(VectorQueryOracle(FixedKeyDropout(), d=6, d_out=6), H=2)
    assert "in reverse order" in str(info.value)


def test_answers_computed_from_the_batch_statistics_are_seen_by_the_split_second_call():
    """Normalising by the batch's statistics gives the same answers to the same batch in any order (the check missed it
    before, 2026-12-05); the second time the queries come in two calls of 8, in batches of other queries."""
    assert nondeterminism(VectorQueryOracle(BatchStatistics(), d=6, d_out=6), seed=0) is not None
    with pytest.raises(OracleInconsistentError, match="in reverse order, in two calls of 8") as info:
        learn_attention_layer(VectorQueryOracle(BatchStatistics(), d=6, d_out=6), H=2)
    assert "running statistics" in str(info.value)


def test_the_check_constants():
    assert (DETERMINISM_QUERIES, DETERMINISM_LEN, DETERMINISM_UNITS) == (16, 8, 256)


@pytest.mark.parametrize("served", ["float64", "float32"])
@pytest.mark.parametrize("factor, named", [(0.9, False), (1.1, True)])
def test_answers_that_move_between_calls_just_inside_and_outside_the_threshold(served, factor, named):
    """Answers scaled by 1 + k * step at call k: the check's three calls (16 queries, then 8 and 8) differ by up to
    2 step (relative), named above 256 times their precision only (float64's, or float32's for answers on its grid).
    The check asks 2 * 16 queries."""
    u = float(unit_roundoff(served))
    drift = Drifting(factor * DETERMINISM_UNITS * u / 2)
    if served == "float32":  # the drifting answers rounded to float32: on its grid
        oracle = VectorQueryOracle(lambda X: drift(X).astype(np.float32), d=6, d_out=6)
    else:
        oracle = VectorQueryOracle(drift, d=6, d_out=6)
    found = nondeterminism(oracle, seed=0)
    assert (found is not None) is named
    assert oracle.n_queries == 2 * DETERMINISM_QUERIES
    if named:
        assert f"at their precision u = {u:.1e}" in str(found)


@pytest.mark.parametrize("factor, hinted", [(0.9, True), (1.1, False)])
def test_float64_answers_moving_by_float32_rounding_are_pointed_to_the_stated_precision(factor, hinted):
    """A new user's block computed in float32, its LayerNorm in float64 (answers off float32's grid), was refused as
    non-deterministic with advice on dropout: moves up to 256 float32 units now also name precision='float32'
    (just inside), larger ones do not (just outside)."""
    u32 = float(unit_roundoff("float32"))
    found = nondeterminism(VectorQueryOracle(Drifting(factor * DETERMINISM_UNITS * u32 / 2), d=6, d_out=6), seed=0)
    assert found is not None and ("precision='float32'" in str(found)) is hinted
    assert "Serve the layer in inference mode" in str(found) or "Otherwise, serve the layer" in str(found)
    stated = VectorQueryOracle(Drifting(0.9 * DETERMINISM_UNITS * u32 / 2), d=6, d_out=6, precision="float32")
    assert nondeterminism(stated, seed=0) is None


def test_a_deterministic_oracle_passes_and_a_short_budget_skips_the_check():
    assert nondeterminism(VectorQueryOracle(BLOCK), seed=3) is None
    short = VectorQueryOracle(Dropout(0.5), d=6, d_out=6, budget=2 * DETERMINISM_QUERIES - 1)
    assert DETERMINISM_LEN * DETERMINISM_QUERIES * 6 == 768  # tokens' entries a call: dropout at 1e-3 seen w.p. 0.78
    assert nondeterminism(short, seed=0) is None and short.n_queries == 0


def test_a_refusal_before_any_query_asks_no_check():
    oracle = VectorQueryOracle(Dropout(0.1), d=6, d_out=6, budget=10)
    with pytest.raises(CompanionError) as info:
        learn_attention_layer(oracle, H=2)
    assert oracle.n_queries == 0 and "not deterministic" not in str(info.value)


@pytest.mark.parametrize(
    "make, cause",
    [(lambda: Dropout(0.1), "not deterministic"), (lambda: Windowed(3), "changes when the tokens before it are put in")],
    ids=["dropout", "window-3"],
)
def test_try_seeds_raises_a_verdict_no_seed_changes_at_once(make, cause):
    """Another seed cannot help a non-deterministic oracle or a target that sees positions (the order check):
    try_seeds raises it at the first seed."""
    oracle = VectorQueryOracle(make(), d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match=cause):
        try_seeds(oracle, range(4), H=2)
    single = VectorQueryOracle(make(), d=6, d_out=6)
    with pytest.raises(OracleInconsistentError):
        learn_attention_layer(single, H=2, seed=0)
    assert oracle.n_queries == single.n_queries  # one seed's queries: the same draws, the same stop


class OutputDropout:
    """A d = 8 block with inverted dropout at rate ``p`` on its output entries, a fresh mask at every call."""

    d = d_out = 8
    block = random_attention_layer(8, 2, residual=True, seed=0)

    def __init__(self, p, seed):
        self.p, self.rng = p, np.random.default_rng(seed)

    def __call__(self, X):
        Y = self.block(X)
        return Y * (self.rng.random(Y.shape) >= self.p) / (1 - self.p)


@pytest.mark.parametrize("seed, before", [(2, "not an attention layer"), (4, "the heads' learner could not resolve")])
def test_rare_dropout_is_named_from_the_learners_own_queries_asked_again(seed, before):
    """Output dropout at 1e-4 (2026-12-05, dropout seeds 0 to 19): 4 of 20 runs were refused, each with a stage's own
    cause, which the 32 queries of the check did not correct; the learner's kept queries, asked again, name it."""
    oracle = VectorQueryOracle(OutputDropout(1e-4, seed))
    with pytest.raises(
        OracleInconsistentError, match=r"^the oracle is not deterministic: asked again the (\d+)"
    ) as info:
        learn_attention_layer(oracle, H=2)
    assert str(info.value.__cause__).startswith(before)  # the stage's refusal, chained
    kept = int(str(info.value).split("asked again the ")[1].split()[0])
    assert kept > 500 and oracle._observer is None  # the queries this small block was asked; the observer removed


def test_the_kept_queries_stop_at_their_byte_limit_just_inside_and_outside():
    assert REPLAY_BYTES == 16 * 2**20
    X = np.zeros((4, 3, 2))  # 192 bytes
    kept = KeptQueries(limit=2 * X.nbytes)
    kept(X, np.ones((4, 5)))
    kept([X[0], X[1, :2]], np.ones((2, 5)))  # a list of sequences: 48 + 32 bytes, within the limit
    kept(X, np.ones((4, 5)))  # 192 more: beyond it, not kept
    assert kept.count == 6 and kept.bytes == X.nbytes + 80 and len(kept.batches) == 2
    X[:] = 1.0  # the kept queries are copies
    assert not np.any(kept.batches[0][0])


def test_a_deterministic_oracle_passes_the_replay_and_a_short_budget_skips_it():
    oracle = VectorQueryOracle(BLOCK)
    kept = KeptQueries()
    oracle._observer = kept
    oracle(np.random.default_rng(0).standard_normal((5, 3, 6)))
    oracle._observer = None
    assert kept.count == 5 and replay_differs(oracle, kept) is None and oracle.n_queries == 10
    noisy = VectorQueryOracle(Dropout(0.5), d=6, d_out=6, budget=9)
    noisy._observer = kept
    noisy(np.ones((4, 3, 6)))
    noisy._observer = None
    assert kept.count == 9 and replay_differs(noisy, kept) is None and noisy.n_queries == 4  # 5 left, 9 kept


def test_a_learned_block_leaves_no_observer_behind():
    oracle = VectorQueryOracle(BLOCK)
    learn_attention_layer(oracle, H=2)
    assert oracle._observer is None


# The order check: a deterministic target that sees positions (order_dependence; this book's).

from companion.layer._determinism import ORDER_QUERIES, order_dependence, order_lengths  # noqa: E402

U32 = float(unit_roundoff("float32"))


class FirstBeforeLast:
    """The block, its answers scaled by ``1 + c`` where the first token's first coordinate exceeds that of the token
    before the last: reversing the tokens before the last swaps those two, so each answer changes by ``c`` or
    ``c / (1 + c)`` relative, ``c`` at the largest (a target that sees positions, by a chosen amount)."""

    d = d_out = 6

    def __init__(self, c):
        self.c = c

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        return BLOCK(X) * (1.0 + self.c * (X[:, 0, 0] > X[:, -2, 0]))[:, None]


class Positional:
    """The block on its tokens plus fixed positional encodings (``0.3 N(0, 1)`` entries, 256 positions)."""

    d = d_out = 6
    P = 0.3 * np.random.default_rng(5).standard_normal((256, 6))

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        return BLOCK(X + self.P[: X.shape[1]])


class Windowed:
    """The block seeing only the last ``w`` tokens (a sliding-window mask)."""

    d = d_out = 6

    def __init__(self, w):
        self.w = w

    def __call__(self, X):
        return BLOCK(np.asarray(X, dtype=float)[:, -self.w :])


class CausalTwoLayers:
    """A second block over the first one's outputs at every position, each seeing the tokens up to it (causal)."""

    d = d_out = 6
    second = random_attention_layer(6, 2, seed=3)

    def __call__(self, X):
        X = np.asarray(X, dtype=float)
        return self.second(np.stack([BLOCK(X[:, : i + 1]) for i in range(X.shape[1])], axis=1))


def test_the_order_check_constants_and_lengths():
    assert ORDER_QUERIES == 16
    assert order_lengths().tolist() == [3, 4, 4, 5, 6, 7, 7, 8, 9, 15, 23, 38, 61, 98, 159, 256]


@pytest.mark.parametrize("served", ["float64", "float32"])
@pytest.mark.parametrize("factor, named", [(0.9, False), (1.1, True)])
def test_answers_that_change_with_the_order_just_inside_and_outside_the_threshold(served, factor, named):
    """Named above 256 times float32's unit roundoff for float32 answers and for float64 ones (a float32 computation
    widened to float64 changes with its order of summation up to that much), not below; 2 * 16 queries asked."""
    target = FirstBeforeLast(factor * DETERMINISM_UNITS * U32)
    served_target = target if served == "float64" else (lambda X: target(X).astype(np.float32))
    oracle = VectorQueryOracle(served_target, d=6, d_out=6)
    found = order_dependence(oracle, seed=0)
    assert (found is not None) is named and oracle.n_queries == 2 * ORDER_QUERIES
    if named:
        assert str(found).startswith("not an attention layer: its answer at the last token changes")
        assert f"256 u = {DETERMINISM_UNITS * U32:.1e}" in str(found) and found.any_seed is True


def test_float64_answers_changing_by_float32_rounding_are_no_verdict_but_larger_ones_are():
    """Between 256 float64 units and 256 float32 units a change is no verdict (a float32 computation changes that
    much with its order); 1e-3 relative is."""
    assert order_dependence(VectorQueryOracle(FirstBeforeLast(1e3 * DETERMINISM_UNITS * 2.0**-53)), seed=0) is None
    assert order_dependence(VectorQueryOracle(FirstBeforeLast(1e-3)), seed=0) is not None


def test_blocks_of_the_class_pass_the_order_check_and_a_short_budget_skips_it():
    """Reversing the tokens before the last changes an in-class block's answer by rounding only (measured 2026-12-06:
    float64 blocks 3.1 u to 13.5 u of float64's, under the check's 256 u of float32's for float64 answers; MiniLM's
    block served in float32 7.8 u of float32's, under 256 u). With fewer than 32 queries left it asks none."""
    from companion.layer import MiniLMBlock

    for kw in ({}, {"layernorm": "post", "eps": 1e-12}, {"layernorm": "pre", "eps": 1e-5}):
        block = random_attention_layer(8, 2, residual=True, seed=1, **kw)
        assert order_dependence(VectorQueryOracle(block), seed=0) is None
    served = VectorQueryOracle(MiniLMBlock("float32"))
    assert order_dependence(served, seed=0) is None and served.n_queries == 2 * ORDER_QUERIES
    short = VectorQueryOracle(Positional(), d=6, d_out=6, budget=2 * ORDER_QUERIES - 1)
    assert order_dependence(short, seed=0) is None and short.n_queries == 0


@pytest.mark.parametrize(
    "target, shortest",
    [(Positional(), 3), (Windowed(3), 4), (Windowed(8), 9), (Windowed(200), 256), (CausalTwoLayers(), 3)],
    ids=["positional", "window-3", "window-8", "window-200", "causal-two-layers"],
)
def test_a_target_that_sees_positions_is_refused_with_that_cause(target, shortest):
    """Before (2026-12-05): a block with positional encodings behind a post-LN was refused by the row-space route
    without a verdict; a window of 3 and a causal second layer by the heads' learner naming both causes; windows of
    8 to 255 by the verification's long queries, as length-dependent. The order check names the cause, and the
    shortest reversed query that changed bounds a window: a window of w tokens is seen from w + 1."""
    oracle = VectorQueryOracle(target, d=6, d_out=6)
    with pytest.raises(OracleInconsistentError, match="^not an attention layer: its answer at the last token") as info:
        learn_attention_layer(oracle, H=2)
    assert f"the shortest that changed has {shortest})" in str(info.value) and info.value.order_shortest == shortest
    assert f"by up to {info.value.order_change:.1e} relative" in str(info.value) and info.value.order_change > 1e-3
    assert "positional encodings" in str(info.value) and "sliding window" in str(info.value)
    assert isinstance(info.value.__cause__, CompanionError)  # the stage's own refusal, chained
