"""Extreme but valid inputs: every accountant answers (no crash, NaN or hang), never a false 0."""

from __future__ import annotations

import math
import warnings

import pytest

from dpcore.accountants import ACCOUNTANT_NAMES, accountant_class
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning, RdpAccountant
from dpcore.events import dpsgd_event

EXTREMES = [
    (1.0, 0.02, 3),  # tiny noise: losses in the thousands
    (0.5, 0.05, 100),
    (1e-9, 1.0, 10**9),  # the record is almost never sampled, over very many steps
    (0.001, 100.0, 10),  # huge noise
]


@pytest.mark.parametrize(("q", "sigma", "steps"), EXTREMES)
@pytest.mark.parametrize("name", [name for name in ACCOUNTANT_NAMES if name != "pld"])
def test_extreme_inputs_get_an_answer(name: str, q: float, sigma: float, steps: int) -> None:
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        epsilon = accountant_class(name)().compose(event).get_epsilon(1e-5)
    assert not math.isnan(epsilon) and epsilon >= 0


@pytest.mark.parametrize(("q", "sigma", "steps"), EXTREMES)
def test_pld_bracket_stays_ordered_and_lower_finite(q: float, sigma: float, steps: int) -> None:
    # Losses beyond ~700 cannot be represented (e^-700 underflows): for tiny noise the certified
    # upper end is then infinite, never a wrong finite number, and the lower end stays finite.
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    interval = PldAccountant().compose(event).get_epsilon_interval(1e-5)
    assert interval.lower <= interval.upper
    assert math.isfinite(interval.lower)


def test_tiny_sampling_rate_is_not_rounded_to_perfect_privacy() -> None:
    # q = 1e-9: per-step RDP is ~1e-18, which naive summation of the binomial terms rounds to
    # 0 (and so to epsilon = 0); the log1p form keeps it.
    event = dpsgd_event(sampling_probability=1e-9, noise_multiplier=1.0, steps=10**9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        epsilon = RdpAccountant().compose(event).get_epsilon(1e-5)
    assert epsilon > 0
    assert epsilon >= PldAccountant().compose(event).get_epsilon(1e-5)
