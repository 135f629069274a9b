"""PrivacyBudget: the allowance matches the accountant, a changed setting is re-checked."""

from __future__ import annotations

import warnings

import pytest

from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.ledger import PrivacyLedger
from dpcore.torch.budget import BudgetExceededError, BudgetExceededWarning, PrivacyBudget

Q, DELTA = 0.1, 1e-5


def _ledger(steps: int, sigma: float) -> PrivacyLedger:
    ledger = PrivacyLedger(dataset_size=100)
    for _ in range(steps):
        ledger.record(sampling_probability=Q, noise_multiplier=sigma)
    return ledger


def test_allowance_is_the_last_step_within_the_plan_and_a_new_setting_is_rechecked() -> None:
    sigma = calibrate_noise(
        target_epsilon=3.0, target_delta=DELTA, sampling_probability=Q, steps=30
    )
    budget = PrivacyBudget(epsilon=3.0, delta=DELTA, policy="stop")
    ledger = _ledger(0, sigma)
    budget.check(ledger, sampling_probability=Q, noise_multiplier=sigma)
    assert budget._allowance is not None
    allowed = budget._allowance[2]
    assert allowed >= 30
    assert (
        _ledger(allowed, sigma).epsilon(delta=DELTA)
        <= 3.0
        < _ledger(allowed + 1, sigma).epsilon(delta=DELTA)
    )
    late = _ledger(allowed - 1, sigma)
    budget.check(late, sampling_probability=Q, noise_multiplier=sigma)  # the last allowed step
    with pytest.raises(BudgetExceededError, match=f"Step {allowed + 1} would take"):
        budget.check(_ledger(allowed, sigma), sampling_probability=Q, noise_multiplier=sigma)
    with pytest.raises(BudgetExceededError):  # less noise: re-evaluated, not the old allowance
        budget.check(late, sampling_probability=Q, noise_multiplier=sigma / 4)


def test_warn_policy_warns_once_and_bad_arguments_are_named() -> None:
    budget = PrivacyBudget(epsilon=0.1, delta=DELTA)
    ledger = _ledger(3, 1.0)
    with pytest.warns(BudgetExceededWarning, match="past the planned target_epsilon = 0.1"):
        budget.check(ledger, sampling_probability=Q, noise_multiplier=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        budget.check(ledger, sampling_probability=Q, noise_multiplier=1.0)  # quiet now
    for options, name in (
        ({"epsilon": -1.0, "delta": DELTA}, "target_epsilon"),
        ({"epsilon": 1.0, "delta": 2.0}, "target_delta"),
        ({"epsilon": 1.0, "delta": DELTA, "policy": "halt"}, "budget"),
    ):
        with pytest.raises(InvalidParameterError) as caught:
            PrivacyBudget(**options)  # type: ignore[arg-type]
        assert caught.value.parameter == name
