"""The exact Gaussian privacy profile against an mpmath evaluation and the hockey-stick integral."""

from __future__ import annotations

import math

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gaussian_delta, gaussian_epsilon, gdp_delta, gdp_epsilon


def _oracle_delta(mu: float, epsilon: float) -> float:
    """Hockey-stick integral of N(mu, 1) against N(0, 1), by mpmath quadrature (definition)."""
    mpmath.mp.dps = 40
    crossing = epsilon / mu + mu / 2  # where the densities' ratio equals e^epsilon
    integrand = lambda x: mpmath.npdf(x, mu, 1) - mpmath.e**epsilon * mpmath.npdf(x, 0, 1)  # noqa: E731
    return float(mpmath.quad(integrand, [crossing, mpmath.inf]))


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0, 4.0])
def test_gdp_delta_matches_the_hockey_stick_integral(mu: float, epsilon: float) -> None:
    assert gdp_delta(mu=mu, epsilon=epsilon) == pytest.approx(
        _oracle_delta(mu, epsilon), rel=1e-9, abs=1e-300
    )


@settings(max_examples=50, deadline=None)
@given(mu=st.floats(min_value=0.05, max_value=8.0), delta=st.floats(min_value=1e-12, max_value=0.5))
def test_epsilon_certifies_delta_and_is_tight(mu: float, delta: float) -> None:
    epsilon = gdp_epsilon(mu=mu, delta=delta)
    assert epsilon >= 0
    assert gdp_delta(mu=mu, epsilon=epsilon) <= delta
    if epsilon > 0:
        assert gdp_delta(mu=mu, epsilon=epsilon * (1 - 1e-6) - 1e-9) > delta


def test_golden_bu2019_mnist_clt_epsilon() -> None:
    # Bu, Dong, Long, Su 2019 (arXiv 1911.11607), MNIST with sigma = 1.3, lot 256 of 60,000,
    # 15 epochs: mu = q sqrt(T (e^{1/sigma^2} - 1)) = 0.227, epsilon = 0.83 at delta = 1e-5.
    q, steps = 256 / 60_000, 15 * 60_000 / 256
    mu = q * math.sqrt(steps * math.expm1(1 / 1.3**2))
    assert mu == pytest.approx(0.23, abs=0.005)
    assert gdp_epsilon(mu=mu, delta=1e-5) == pytest.approx(0.83, abs=0.01)


def test_boundaries() -> None:
    assert gdp_delta(mu=0.0, epsilon=0.0) == 0.0
    assert gdp_delta(mu=math.inf, epsilon=5.0) == 1.0
    assert gdp_epsilon(mu=0.0, delta=1e-5) == 0.0
    assert math.isinf(gdp_epsilon(mu=math.inf, delta=1e-5))
    assert gaussian_epsilon(
        noise_multiplier=1.0, delta=gaussian_delta(noise_multiplier=1.0, epsilon=2.0)
    ) == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: gdp_delta(mu=-1.0, epsilon=1.0), "mu"),
        (lambda: gdp_delta(mu=1.0, epsilon=-1.0), "epsilon"),
        (lambda: gdp_delta(mu=math.nan, epsilon=1.0), "mu"),
        (lambda: gdp_epsilon(mu=1.0, delta=0.0), "delta"),
        (lambda: gdp_epsilon(mu=1.0, delta=1.0), "delta"),
        (lambda: gaussian_delta(noise_multiplier=0.0, epsilon=1.0), "noise_multiplier"),
        (lambda: gaussian_epsilon(noise_multiplier=-2.0, delta=1e-5), "noise_multiplier"),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter} "):
        call()
