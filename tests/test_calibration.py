"""Noise calibration never overshoots the target and lands within 1% of the optimum."""

from __future__ import annotations

import math
import warnings

import pytest

from dpcore.accountants import accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event


def _epsilon(name: str, sigma: float, q: float, steps: int, delta: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
        return float(accountant_class(name)().compose(event).get_epsilon(delta))


@pytest.mark.parametrize("name", ["rdp", "pld", "moments", "gdp_clt", "advanced"])
@pytest.mark.parametrize(("target", "q", "steps"), [(1.0, 0.01, 1000), (4.0, 0.05, 300)])
def test_meets_target_within_one_percent(name: str, target: float, q: float, steps: int) -> None:
    sigma = calibrate_noise(
        target_epsilon=target,
        target_delta=1e-5,
        sampling_probability=q,
        steps=steps,
        accountant=name,
    )
    assert _epsilon(name, sigma, q, steps, 1e-5) <= target
    assert _epsilon(name, sigma / 1.01, q, steps, 1e-5) > target


def test_nothing_private_needs_no_noise() -> None:
    assert (
        calibrate_noise(target_epsilon=1.0, target_delta=1e-5, sampling_probability=0.0, steps=10)
        == 0.0
    )
    assert (
        calibrate_noise(target_epsilon=1.0, target_delta=1e-5, sampling_probability=0.1, steps=0)
        == 0.0
    )


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"target_epsilon": math.nan}, "target_epsilon"),
        ({"target_delta": 1.0}, "target_delta"),
        ({"sampling_probability": 1.5}, "sampling_probability"),
        ({"steps": 2.5}, "steps"),
        ({"steps": -1}, "steps"),
        ({"accountant": "oracle"}, "accountant"),
        ({"tolerance": 0.0}, "tolerance"),
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
