"""companion.ffn is a package; its public names stay what the module exported (pinned)."""

import companion.ffn as ffn


def test_public_names_unchanged_by_the_split():
    assert ffn.__all__ == [
        "FeedForward",
        "random_feedforward",
        "canonical_form",
        "align_networks",
        "find_kinks",
        "resolve_signs",
        "bits_of_precision",
        "learn_ffn",
        "FFNRecovery",
        "ReLUNetwork",
        "ReLUNetworkRecovery",
        "random_relu_network",
        "learn_relu_network",
    ]
    for name in ffn.__all__:
        assert getattr(ffn, name).__module__.startswith("companion.ffn")
