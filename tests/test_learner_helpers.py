"""The shared learner helpers of issue 34: QueryCount, resolve_heads, OracleView (companion._learner)."""

import numpy as np
import pytest

from companion._learner import OracleView, QueryCount, resolve_heads
from companion.attention import SingleHead
from companion.errors import BudgetExceededError, InvalidInputError
from companion.exact import TokenPart
from companion.oracles import ValueQueryOracle


def _oracle(budget=None):
    return ValueQueryOracle(SingleHead(np.eye(3), np.arange(3.0)), budget=budget)


def test_query_count_stages_add_up_and_reenter():
    oracle = _oracle()
    oracle(np.ones((2, 1, 3)))  # before the count: not counted
    count = QueryCount(oracle)
    with count.stage("a"):
        oracle(np.ones((3, 1, 3)))
    with count.stage("b"):
        oracle(np.ones((1, 3)))
    with count.stage("a"):  # re-entered: added
        oracle(np.ones((4, 2, 3)))
    oracle(np.ones((5, 1, 3)))  # outside every stage: in the total only
    assert (count["a"], count["b"], count["never"], count.total) == (7, 1, 0, 13)
    assert count.start == 2


def test_query_count_keeps_the_count_of_a_stage_that_raises():
    oracle = _oracle()
    count = QueryCount(oracle)
    with pytest.raises(RuntimeError):
        with count.stage("a"):
            oracle(np.ones((2, 1, 3)))
            raise RuntimeError("stage failed")
    assert count["a"] == 2


@pytest.mark.parametrize(
    ("H", "H_bound", "exactly_one", "default", "expected"),
    [
        (3, None, True, None, (3, None, 3)),
        (None, 5, True, None, (None, 5, 5)),
        (None, None, False, 8, (None, None, 8)),
        (2, None, False, 8, (2, None, 2)),
        (None, 1, False, 8, (None, 1, 1)),  # the smallest bound, just inside
    ],
)
def test_resolve_heads_accepts(H, H_bound, exactly_one, default, expected):
    assert resolve_heads(H, H_bound, exactly_one=exactly_one, default=default) == expected


@pytest.mark.parametrize(
    ("H", "H_bound", "exactly_one", "match"),
    [
        (None, None, True, "exactly one of H"),
        (2, 3, True, "exactly one of H"),
        (2, 3, False, "at most one of H"),
        (0, None, True, "H"),  # just outside the minimum
        (None, 0, False, "H_bound"),
        (2.5, None, True, "H"),
    ],
)
def test_resolve_heads_refuses(H, H_bound, exactly_one, match):
    with pytest.raises(InvalidInputError, match=match):
        resolve_heads(H, H_bound, exactly_one=exactly_one)


def test_oracle_view_delegates_counter_budget_and_precision():
    oracle = ValueQueryOracle(SingleHead(np.eye(3), np.arange(3.0)), budget=10, precision=2.0**-24)
    part = TokenPart(oracle)
    assert isinstance(part, OracleView)
    assert (part.d, part.budget, part.precision, part.tau) == (2, 10, 2.0**-24, 0.0)
    assert part(np.array([[1.0, 0.0]])) == 2.0  # the appended 1 reads v[2]
    assert (part.n_queries, part.remaining) == (1, 9)
    with pytest.raises(BudgetExceededError):
        part.require(10)


def test_oracle_view_refuses_what_is_not_an_oracle():
    with pytest.raises(TypeError, match="wraps a value-query oracle"):
        TokenPart(lambda X: 0.0)
    with pytest.raises(InvalidInputError, match="oracle.d - 1"):
        TokenPart(ValueQueryOracle(SingleHead(np.eye(1), np.ones(1))))
