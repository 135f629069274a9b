"""Noise calibration never overshoots the target and lands within 1% of the optimum."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import pytest

from dpcore.accountants import accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event


def _epsilon(
    name: str,
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    options: Mapping[str, Any] | None = None,
) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
        return float(accountant_class(name)(**(options or {})).compose(event).get_epsilon(delta))


CASES = [
    *[(name, 1.0, 0.01, 1000) for name in ("rdp", "basic", "advanced", "gdp_clt", "pld")],
    *[(name, 4.0, 0.05, 300) for name in ("rdp", "basic", "advanced", "gdp_clt", "moments")],
    ("rdp", 8.0, 1.0, 1),  # one full-batch Gaussian step
]


@pytest.mark.parametrize(("name", "target", "q", "steps"), CASES)
def test_meets_target_within_one_percent(name: str, target: float, q: float, steps: int) -> None:
    sigma = calibrate_noise(
        target_epsilon=target,
        target_delta=1e-5,
        sampling_probability=q,
        steps=steps,
        accountant=name,
    )
    assert _epsilon(name, sigma, q, steps, 1e-5) <= target  # never overshoots
    assert _epsilon(name, sigma * (1 - 0.01), q, steps, 1e-5) > target  # within 1%


def test_looser_tolerance_and_accountant_options() -> None:
    options = {"orders": [1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]}
    sigma = calibrate_noise(
        target_epsilon=2.0,
        target_delta=1e-6,
        sampling_probability=0.02,
        steps=500,
        accountant="rdp",
        accountant_options=options,
        tolerance=0.1,
    )
    assert _epsilon("rdp", sigma, 0.02, 500, 1e-6, options) <= 2.0
    assert _epsilon("rdp", sigma / 1.1, 0.02, 500, 1e-6, options) > 2.0


def test_tighter_accountants_need_less_noise() -> None:
    def sigma(name: str) -> float:
        return calibrate_noise(
            target_epsilon=2.0,
            target_delta=1e-5,
            sampling_probability=0.01,
            steps=2000,
            accountant=name,
        )

    assert sigma("rdp") < sigma("advanced") < sigma("basic")


def test_nothing_private_needs_no_noise() -> None:
    # q = 0 (no record is ever used) or T = 0 (nothing runs): any sigma works, 0.0 included.
    for q, steps in [(0.0, 10), (0.1, 0)]:
        assert (
            calibrate_noise(
                target_epsilon=1.0, target_delta=1e-5, sampling_probability=q, steps=steps
            )
            == 0.0
        )


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"target_epsilon": -1.0}, "target_epsilon"),
        ({"target_epsilon": math.nan}, "target_epsilon"),
        ({"target_epsilon": math.inf}, "target_epsilon"),
        ({"target_delta": 1.0}, "target_delta"),
        ({"target_delta": 0.0}, "target_delta"),
        ({"sampling_probability": 1.5}, "sampling_probability"),
        ({"sampling_probability": math.nan}, "sampling_probability"),
        ({"steps": 2.5}, "steps"),
        ({"steps": -1}, "steps"),
        ({"accountant": "oracle"}, "accountant"),
        ({"accountant_options": {"no_such_option": 1}}, "accountant_options"),
        ({"tolerance": 0.0}, "tolerance"),
        # Unreachable: even sigma = 1e6 leaves epsilon ~ 4e-4 > 1e-9 under basic composition.
        (
            {"target_epsilon": 1e-9, "accountant": "basic", "sampling_probability": 1.0},
            "target_epsilon",
        ),
    ],
)
def test_bad_inputs(kwargs: dict[str, object], parameter: str) -> None:
    arguments: dict[str, object] = {
        "target_epsilon": 1.0,
        "target_delta": 1e-5,
        "sampling_probability": 0.01,
        "steps": 100,
    }
    arguments.update(kwargs)
    with pytest.raises(InvalidParameterError, match=parameter):
        calibrate_noise(**arguments)  # type: ignore[arg-type]


def test_unreachable_message_names_the_target() -> None:
    with pytest.raises(InvalidParameterError, match=r"noise_multiplier <= 1e\+06.*basic") as info:
        calibrate_noise(
            target_epsilon=1e-9,
            target_delta=1e-5,
            sampling_probability=1.0,
            steps=100,
            accountant="basic",
        )
    assert info.value.parameter == "target_epsilon" and info.value.value == 1e-9


def _finishes(arguments: dict[str, object], seconds: float = 20.0) -> BaseException | float:
    """Run calibrate_noise in a thread: its result or error, or fail if it has not returned."""
    outcome: list[BaseException | float] = []

    def target() -> None:
        try:
            outcome.append(calibrate_noise(**arguments))  # type: ignore[arg-type]
        except BaseException as error:  # handed back to the test
            outcome.append(error)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"calibrate_noise({arguments}) did not return within {seconds} s"
    return outcome[0]


@pytest.mark.parametrize("tolerance", [2.2e-16, 1e-16, 5e-324, 1e-13, 1.5, math.inf, math.nan])
def test_tolerance_below_float_resolution_is_refused_not_a_hang(tolerance: float) -> None:
    # tolerance < 2.2e-16 made 1 + tolerance == 1, and the bisection never ended.
    outcome = _finishes(
        {
            "target_epsilon": 1.0,
            "target_delta": 1e-5,
            "sampling_probability": 0.01,
            "steps": 100,
            "tolerance": tolerance,
        }
    )
    assert isinstance(outcome, InvalidParameterError), outcome
    assert outcome.parameter == "tolerance"
    if math.isfinite(tolerance) and tolerance > 0:
        assert "in [1e-12, 1]" in str(outcome)


def test_finest_tolerance_terminates_and_meets_the_target() -> None:
    arguments: dict[str, object] = {
        "target_epsilon": 1.0,
        "target_delta": 1e-5,
        "sampling_probability": 0.01,
        "steps": 100,
        "accountant": "rdp",
    }
    sigma = _finishes({**arguments, "tolerance": 1e-12})
    assert isinstance(sigma, float)
    assert _epsilon("rdp", sigma, 0.01, 100, 1e-5) <= 1.0
    assert _epsilon("rdp", sigma * (1 - 1e-9), 0.01, 100, 1e-5) > 1.0 - 1e-9
    coarse = calibrate_noise(**arguments, tolerance=1.0)  # type: ignore[arg-type]
    assert sigma <= coarse <= 2 * sigma


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"accountant": ["rdp"]}, "accountant"),
        ({"accountant": None}, "accountant"),
        ({"accountant_options": [("orders", [2, 3])]}, "accountant_options"),
        ({"accountant_options": {1: 2}}, "accountant_options"),
        ({"target_delta": math.nan}, "target_delta"),
        ({"steps": math.inf}, "steps"),
        ({"sampling_probability": -math.inf}, "sampling_probability"),
        ({"tolerance": -0.01}, "tolerance"),
    ],
)
def test_every_argument_is_validated_by_name(kwargs: dict[str, object], parameter: str) -> None:
    arguments: dict[str, object] = {
        "target_epsilon": 1.0,
        "target_delta": 1e-5,
        "sampling_probability": 0.01,
        "steps": 100,
        **kwargs,
    }
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        calibrate_noise(**arguments)  # type: ignore[arg-type]


def test_default_accountant_is_the_certified_pld_bound() -> None:
    arguments = {
        "target_epsilon": 2.0,
        "target_delta": 1e-5,
        "sampling_probability": 0.01,
        "steps": 1000,
    }
    sigma = calibrate_noise(**arguments)  # type: ignore[arg-type]
    assert sigma == calibrate_noise(**arguments, accountant="pld")  # type: ignore[arg-type]
    assert sigma < calibrate_noise(**arguments, accountant="rdp")  # type: ignore[arg-type]
