"""Membership inference with input canaries: finds an overfit model, stays below a DP claim."""

from __future__ import annotations

from audits.membership import MembershipConfig, audit_one

CHEAP = MembershipConfig(
    dataset="generated",
    base_size=200,
    canaries=400,
    guesses_each_side=40,
    shadows=4,
    nonprivate_epochs=300,
    dp_steps=100,
)


def test_overfit_non_private_model_gives_a_positive_bound() -> None:
    """Label noise + 300 full-batch epochs memorise the members: both attacks see it (seed 0)."""
    row = audit_one(CHEAP, None)
    for attack in row["attacks"].values():
        assert attack["auc"] > 0.6
        assert attack["epsilon_lower"] > 0.5


def test_dp_model_bound_stays_below_the_accountant() -> None:
    """At a claimed eps = 1 the black-box one-run bound is far below the PLD epsilon."""
    row = audit_one(CHEAP, 1.0)
    assert row["epsilon_upper"]["pld"] is not None
    assert row["epsilon_lower"] <= row["epsilon_upper"]["pld"]
    assert row["attacks"]["loss_threshold"]["tpr_at_fpr_1e-3"] is None  # unresolved, not faked
