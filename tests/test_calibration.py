"""Noise calibration never overshoots the target and lands within 1% of the optimum."""

from __future__ import annotations

import math
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
