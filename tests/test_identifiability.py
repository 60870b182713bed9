"""Identifiability of (W, v) for v != 0 (chapter 01): the d + d^2 answers of Theorem 4.1 have a
Jacobian of full rank with respect to the d^2 + d parameters; for v = 0 only v is seen."""

import numpy as np
import pytest

from companion.attention import SingleHead, random_single_head
from companion.errors import NotIdentifiableError
from companion.exact import learn_single_head
from companion.oracles import ValueQueryOracle


def jacobian_rank(head):
    d = head.d
    logged = ValueQueryOracle(head, record=True)
    try:
        learn_single_head(logged, verify=0)
    except NotIdentifiableError:
        pass
    queries = [x for x, _ in logged.log]
    if len(queries) == d:           # v = 0: the learner stopped after the length-1 queries
        rng = np.random.default_rng(0)
        queries += [rng.standard_normal((2, d)) for _ in range(d * d)]

    def answers(theta):
        return SingleHead(theta[: d * d].reshape(d, d), theta[d * d:])(queries)

    theta0, h = np.concatenate([head.W.ravel(), head.v]), 1e-6
    J = np.stack([(answers(theta0 + h * e) - answers(theta0 - h * e)) / (2 * h)
                  for e in np.eye(theta0.size)], axis=1)
    s = np.linalg.svd(J, compute_uv=False)
    return int(np.sum(s > 1e-8 * s[0])), len(queries)


@pytest.mark.parametrize("d,rank", [(3, None), (6, 3)])
def test_full_rank_for_nonzero_v(d, rank):
    head = random_single_head(d, rank=rank, seed=d)
    r, n = jacobian_rank(head)
    assert n == d + d * d and r == d + d * d


def test_zero_v_leaves_W_invisible():
    head = SingleHead(np.random.default_rng(1).standard_normal((4, 4)), np.zeros(4))
    r, _ = jacobian_rank(head)
    assert r == 4        # at v = 0 the answers move with v only: df/dW = 0
