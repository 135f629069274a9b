"""The one-run audit: a real dpcore run agrees with the ideal game; planted bugs do not."""

from __future__ import annotations

from audits import one_run
from audits.one_run import OneRunConfig

CHEAP = OneRunConfig(canaries=1000, steps=150, noise_multiplier=1.0, simulations=200)


def test_real_run_agrees_with_ideal_game_and_bugs_do_not() -> None:
    # Fixed seed; a correct run falls outside the central 95% band with probability about 5%.
    correct = one_run.audit(CHEAP)
    assert correct["agrees"]
    assert correct["epsilon_lower"] <= correct["epsilon_upper"]["pld"]
    assert not one_run.audit(CHEAP, noise_scale=0.5)["agrees"]
    assert not one_run.audit(CHEAP, clip=False)["agrees"]
