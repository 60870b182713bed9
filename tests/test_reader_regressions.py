"""Bugs the reader matrix found (issue 32): a legitimate outcome that stopped a chapter, as a test."""

from companion import lowrank


def test_a_phase_transition_trial_below_the_degrees_of_freedom_is_a_failure_not_a_crash():
    # rgn_ratios with 0.47 (a reader's draw) stopped chapter 04: m = 36 < r(2d - r) = 76 raised
    # NotIdentifiableError out of recovery_trial; the trial fails, with nothing recovered
    below = lowrank.recovery_trial(20, 2, 0.47, method="rgn", seed=1)
    assert below == {"m": 36, "n_queries": 0, "rel_error_W": None, "exact": False}
    at = lowrank.recovery_trial(20, 2, 1.0, method="rgn", seed=1)  # at the count: it asks
    assert at["m"] == 76 and at["n_queries"] > 0  # the queries (refused: none asked)
