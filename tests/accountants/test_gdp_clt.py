"""The CLT accountant: Bu et al. 2019's printed values, its label, its known understatement."""

from __future__ import annotations

import math

import pytest

from dpcore.accountants.base import Approximate
from dpcore.accountants.gdp_clt import GdpCltAccountant, clt_mu_squared
from dpcore.accountants.pld import PldAccountant
from dpcore.events import GaussianEvent, dpsgd_event


def test_golden_bu2019_mnist() -> None:
    # Bu, Dong, Long, Su 2019 (arXiv 1911.11607), Sec. 5 (MNIST): sigma = 1.3, lot 256 of 60,000,
    # 15 epochs: mu = 0.23 and epsilon = 0.83 at delta = 1e-5 (values as printed).
    steps = math.ceil(15 * 60_000 / 256)
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=256 / 60_000, noise_multiplier=1.3, steps=steps)
    )
    assert accountant.mu == pytest.approx(0.23, abs=0.005)
    assert accountant.get_epsilon(1e-5) == pytest.approx(0.83, abs=0.01)


def test_answers_are_labelled_approximate() -> None:
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=100)
    )
    epsilon = accountant.get_epsilon(1e-5)
    assert isinstance(epsilon, Approximate) and "not a guarantee" in repr(epsilon)
    assert isinstance(accountant.get_delta(1.0), Approximate)
    assert accountant.state()["label"] == "approximate, not a guarantee"


def test_plain_gaussians_compose_exactly() -> None:
    # mu-GDP composes as sqrt(sum mu_i^2) (Dong, Roth, Su 2019, Cor. 3.3); exact, not a CLT.
    accountant = GdpCltAccountant().compose(GaussianEvent(2.0), 4)
    assert accountant.mu == pytest.approx(1.0)


def test_clt_understates_epsilon_for_short_runs() -> None:
    # Few steps with a large sampling rate: the CLT answer falls below the certified lower
    # bound of the tight accountant -- the reason it is labelled an approximation.
    event = dpsgd_event(sampling_probability=0.2, noise_multiplier=1.0, steps=20)
    clt = GdpCltAccountant().compose(event).get_epsilon(1e-5)
    tight = PldAccountant().compose(event).get_epsilon_interval(1e-5)
    assert clt < tight.lower


def test_overflow_gives_infinity_not_nan() -> None:
    assert math.isinf(clt_mu_squared(sampling_probability=0.1, noise_multiplier=0.01, steps=10))
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=0.1, noise_multiplier=0.01, steps=10)
    )
    assert math.isinf(accountant.get_epsilon(1e-5))
