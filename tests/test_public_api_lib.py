"""The public names of the §4-§6 modules, pinned before they were split into packages (issue 34).

``companion.lowrank`` and ``companion.robust`` became packages, and ``companion.transformer`` and
``companion.oracles`` were cut into private sibling modules; their ``__init__`` (or the module itself)
re-exports the same names. This test fixes each module's ``__all__`` as it was on main before the move
(sorted, exact), and checks that every name imports from the old path, so that the move is shown not
to change the API. A name added later is added here with the change that adds it.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "lowrank": [
        "CHUNK_BYTES", "DEFAULT_OVERSAMPLING", "DESIGNS", "LowRankRecovery", "METHODS", "NUCLEAR_MAX_BYTES",
        "degrees_of_freedom", "learn_low_rank", "measure_bilinear", "nuclear_program_size",
        "nuclear_statistical_dimension", "phase_transition", "recovery_trial", "rop_queries", "scaling_point",
        "transition_point",
    ],
    "robust": [
        "LIPSCHITZ_6_1", "NOISY_METHODS", "TAU_CLIP", "best_scale", "clipped_logit", "entry_error_bound",
        "guaranteed_error", "learn_low_rank_noisy", "learn_robust", "learn_robust_lstsq", "lemma_6_1_bound",
        "lstsq_error_bound", "n_queries_lstsq", "random_margin_head", "robust_queries", "rop_error_bound",
        "rop_scales", "sufficient_tolerance",
    ],
    "transformer": [
        "BiasedOneLayerTransformer", "BiasedTransformerRecovery", "MultiHeadTransformer",
        "MultiHeadTransformerRecovery", "ReusedAnswers",
        "ScaledAntisymmetrised",  # added by issue 34 (chapter 03's inline view, moved here)
        "ServedMultiHeadTransformer", "TransformerRecovery",
        "evaluate", "evaluate_multi_head", "learn_multi_head_transformer", "learn_one_layer",
        "learn_one_layer_biased", "output_precision", "random_biased_one_layer", "random_multi_head_transformer",
        "random_one_layer", "region_anchors",
    ],
    "oracles": [
        "ANSWER_KINDS", "AntisymmetrisedOracle", "ApproxValueQueryOracle", "FORMATS", "NOISE_MODELS",
        "PERTURB_ENV", "PERTURB_PATTERNS", "PERTURB_PATTERN_ENV", "PERTURB_SEED", "ValueQueryOracle",
        "VectorQueryOracle", "VectorReadout", "VectorView", "as_precision", "check_answers", "measure_one_token_precision",
        "measure_precision",
        "nearest_format", "perturb", "perturbation_pattern", "perturbation_ulps", "round_to", "significant_bits",
        "stated_precision", "unit_roundoff",
    ],
    "exact": [
        "GAUSSIAN_PROBE_FLOOR", "SATURATION", "TokenPart", "check_exact_oracle", "column_queries",
        "invert_two_token", "learn_single_head", "probe_matrix", "read_value_vector", "remeasure_saturated",
        "sweep", "sweep_point", "verify_single_head",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_all_is_the_pinned_list(module):
    names = importlib.import_module(f"companion.{module}").__all__
    assert len(names) == len(set(names)), f"companion.{module}.__all__ repeats a name"
    assert sorted(names) == PUBLIC[module]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_imports_from_the_old_path(module):
    mod = importlib.import_module(f"companion.{module}")
    for name in PUBLIC[module]:
        ns: dict = {}
        exec(f"from companion.{module} import {name}", ns)
        assert ns[name] is getattr(mod, name)


def test_the_pinned_lists_are_sorted():
    assert all(names == sorted(names) for names in PUBLIC.values())
