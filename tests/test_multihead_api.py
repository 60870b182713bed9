"""The public API of ``companion.multihead``, pinned before the module became a package (issue 34).

``companion.multihead`` was one 3,013-line module; it is now a package whose ``__init__`` re-exports
the same names. These tests fix today's ``__all__`` (the exact sorted list) and check that every
name in it imports from ``companion.multihead`` and is the object its submodule defines, so that the
move cannot change what users import.
"""

from __future__ import annotations

import importlib

import pytest

import companion.multihead as mh

#: ``sorted(companion.multihead.__all__)`` on main before the split (commit 71fb1a4).
PINNED = [
    "Detection",
    "MOMENT_FROM",
    "MultiHeadRecovery",
    "add_cancelling_heads",
    "canonical_form",
    "count_pairs",
    "counts_conditioning",
    "counts_information",
    "counts_length_bounds",
    "counts_start_coverage",
    "detect_multi_head",
    "equivalent",
    "fit_logistic_sum",
    "follow_up_count",
    "learn_canonical",
    "learn_canonical_rational",
    "learn_orthogonal_heads",
    "match_heads",
    "moment_plan",
    "multiscale_pair_starts",
    "permute_heads",
    "probe_hessian",
    "proposition_7_1",
    "random_multi_head",
    "rational_plan",
    "split_head",
    "verify_model",
]

#: Names made public since, each with its reason.
ADDED = {
    # chapter 06 named companion._star.WEAK_CENTRE; chapters may not name a private module (issue 34)
    "WEAK_CENTRE": "the moment start's second-centre threshold",
    # learn_canonical's reservation, which the layer learner's plan without H counts too (one count, two users)
    "canonical_plan": "the robust route's planned queries",
}

PUBLIC = sorted(PINNED + list(ADDED))


def test_all_is_the_pinned_list_without_duplicates():
    assert PINNED == sorted(PINNED) and len(PINNED) == 27
    assert sorted(mh.__all__) == PUBLIC
    assert len(set(mh.__all__)) == len(mh.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_imports_from_companion_multihead(name):
    module = importlib.import_module("companion.multihead")
    obj = getattr(module, name)
    assert obj is not None
    # ``from companion.multihead import name`` works and gives the same object
    namespace: dict = {}
    exec(f"from companion.multihead import {name}", namespace)
    assert namespace[name] is obj


def test_star_import_gives_exactly_the_public_names():
    namespace: dict = {}
    exec("from companion.multihead import *", namespace)
    assert sorted(k for k in namespace if not k.startswith("__")) == PUBLIC


def test_public_functions_and_classes_keep_companion_multihead_as_their_module():
    """Saved results name their class as ``module:qualname`` (companion._saved), and the book's
    constants scan (companion.prose) reads the learners whose ``__module__`` is the module's."""
    for name in PUBLIC:
        obj = getattr(mh, name)
        if callable(obj):
            assert obj.__module__ == "companion.multihead", name
