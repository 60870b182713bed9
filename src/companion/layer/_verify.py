"""The layer learner's verification queries: short ones as every learner's, and long ones (this book's rule)."""

from __future__ import annotations

import numpy as np

from .._learner import VERIFY_MAX_LEN, random_queries

__all__ = ["VERIFY_LONG_LEN", "VERIFY_LONG_SHARE", "verify_queries"]

#: Longest of the layer's verification queries: a quarter of them (:data:`VERIFY_LONG_SHARE`) have lengths drawn
#: from ``VERIFY_MAX_LEN + 1`` to this, the rest from 1 to ``VERIFY_MAX_LEN`` as every learner's. With ``H`` given the
#: learner asks no sequence longer than 8 tokens, and an adversarial tester's targets that differ from an attention
#: layer only on longer sequences (a sliding window of 8 or 9 tokens, as Mistral's and Gemma's local layers have, or
#: scores scaled by ``log N``) were returned, verified on lengths 1 to 8, off by 0.3 to 3.4 at N = 20 to 32
#: (2026-12-05). Measured on in-class blocks, float64 and float32 (this module's tests): the long queries' errors are
#: those of the short ones. (This book's rule.)
VERIFY_LONG_LEN = 64

#: The share of the verification queries drawn long (at least one when ``verify >= 2``).
VERIFY_LONG_SHARE = 0.25


def verify_queries(d: int, n: int, seed: int) -> list:
    """The layer learner's ``n`` verification queries: :func:`~companion._learner.random_queries` of lengths 1 to
    ``VERIFY_MAX_LEN``, then ``round(VERIFY_LONG_SHARE n)`` (at least one when ``n >= 2``) of lengths
    ``VERIFY_MAX_LEN + 1`` to :data:`VERIFY_LONG_LEN`, tokens ``N(0, I_d / d)``."""
    n_long = 0 if n < 2 else max(1, int(round(VERIFY_LONG_SHARE * n)))
    short = random_queries(d, n - n_long, seed=seed)
    rng = np.random.default_rng([seed, 1])
    lengths = rng.integers(VERIFY_MAX_LEN + 1, VERIFY_LONG_LEN + 1, size=n_long)
    return short + [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in lengths]
