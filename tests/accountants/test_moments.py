"""Moments accountant: quadrature against mpmath and the binomial closed form; Abadi's golden."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpcore.accountants.moments import MomentsAccountant
from dpcore.accountants.moments_math import log_moments
from dpcore.accountants.rdp_math import subsampled_gaussian_rdp
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event


def _mpmath_log_moment(q: float, sigma: float, lam: int) -> float:
    """alpha(lambda) = log max(E1, E2) by mpmath quadrature (Abadi et al. 2016, §3.2)."""
    mpmath.mp.dps = 40
    mu0 = lambda z: mpmath.npdf(z, 0, sigma)  # noqa: E731
    mu = lambda z: (1 - q) * mu0(z) + q * mpmath.npdf(z, 1, sigma)  # noqa: E731
    points = [-mpmath.inf, -5 * sigma, 0, 1, lam + 1, lam + 1 + 10 * sigma, mpmath.inf]
    e1 = mpmath.quad(lambda z: mu0(z) * (mu0(z) / mu(z)) ** lam, points)
    e2 = mpmath.quad(lambda z: mu(z) * (mu(z) / mu0(z)) ** lam, points)
    return float(mpmath.log(max(e1, e2)))


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 4.0), (0.05, 1.0), (0.2, 0.8)])
@pytest.mark.parametrize("lam", [1, 4, 16, 32])
def test_log_moments_match_mpmath(q: float, sigma: float, lam: int) -> None:
    ours = log_moments(sampling_probability=q, noise_multiplier=sigma, max_lambda=32)[lam - 1]
    assert ours == pytest.approx(_mpmath_log_moment(q, sigma, lam), rel=1e-8)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.001, 0.7), (0.1, 0.6), (1.0, 2.0)])
def test_log_moments_match_the_binomial_closed_form(q: float, sigma: float) -> None:
    # alpha(lambda) = lambda * RDP(lambda + 1) (Mironov 2017, Sec. 3.3), and for integer orders
    # the RDP of the sampled Gaussian is the exact binomial sum (Mironov, Talwar, Zhang 2019).
    ours = np.array(log_moments(sampling_probability=q, noise_multiplier=sigma, max_lambda=32))
    orders = np.arange(2, 34, dtype=float)
    closed = subsampled_gaussian_rdp(
        sampling_probability=q, noise_multiplier=sigma, orders=orders
    ) * (orders - 1)
    assert np.allclose(ours, closed, rtol=1e-9)


def test_golden_abadi_2016() -> None:
    # Abadi et al. 2016, §3.1: q = 0.01, sigma = 4, delta = 1e-5, T = 10,000 (E = 100):
    # "we have epsilon ~ 1.26 using the moments accountant". Printed to two decimals.
    accountant = MomentsAccountant().compose(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=10_000)
    )
    assert accountant.get_epsilon(1e-5) == pytest.approx(1.26, abs=0.005)


def test_epsilon_and_delta_are_consistent_tail_bounds() -> None:
    accountant = MomentsAccountant().compose(
        dpsgd_event(sampling_probability=0.02, noise_multiplier=1.2, steps=500)
    )
    epsilon = accountant.get_epsilon(1e-6)
    lambdas = np.arange(1, 33)
    expected = min((accountant.log_moments + math.log(1e6)) / lambdas)
    assert epsilon == pytest.approx(expected)
    assert accountant.get_delta(epsilon) <= 1e-6 * (1 + 1e-9)


def test_fewer_lambdas_never_help() -> None:
    event = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=1000)
    assert MomentsAccountant(max_lambda=8).compose(event).get_epsilon(
        1e-5
    ) >= MomentsAccountant().compose(event).get_epsilon(1e-5)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_max_lambda(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="max_lambda"):
        MomentsAccountant(max_lambda=bad)  # type: ignore[arg-type]
