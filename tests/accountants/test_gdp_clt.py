"""The CLT accountant: Bu et al. 2019's printed values, an mpmath oracle, its label and limits."""

from __future__ import annotations

import math

import mpmath
import pytest

from dpcore.accountants.base import Approximate
from dpcore.accountants.gdp_clt import GdpCltAccountant, clt_mu_squared
from dpcore.accountants.pld import PldAccountant
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    dpsgd_event,
)

MNIST_Q = 256 / 60_000


def _mnist(noise_multiplier: float, epochs: int) -> GdpCltAccountant:
    # Bu et al. use T = epochs * n / lot (non-integer); the nearest integer moves mu by < 1e-4.
    steps = round(epochs * 60_000 / 256)
    return GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=MNIST_Q, noise_multiplier=noise_multiplier, steps=steps)
    )


def test_golden_bu2019_mnist_15_epochs() -> None:
    # Bu, Dong, Long, Su 2019 (arXiv 1911.11607), MNIST, sigma = 1.3, lot 256 of 60,000,
    # 15 epochs, delta = 1e-5: mu = 0.23 and epsilon = 0.83 in the paper; the authors' code
    # (github.com/woodyx218/Deep-Learning-with-GDP-Tensorflow) prints them to more digits:
    # gdp_accountant.py "satisfies 0.227-GDP", README "compute_epsP(15,1.3,60000,256,1e-5)=0.8345".
    accountant = _mnist(1.3, 15)
    assert accountant.mu == pytest.approx(0.227, abs=5e-4)
    assert accountant.get_epsilon(1e-5) == pytest.approx(0.8345, abs=5e-4)


@pytest.mark.parametrize(
    ("sigma", "epochs", "mu", "epsilon", "tolerance"),
    [
        # Bu et al. 2020 (HDSR; author manuscript PMC7695347), Fig. 4 caption: CLT with
        # sigma~ = 1.06 gives (1.34, 1e-5)-DP at epoch 20, mu_CLT = 0.35 ...
        (1.06, 20, 0.35, 1.34, 0.005),
        # ... and with sigma~ = 0.638, (8.68, 1e-5)-DP at epoch 70, mu_CLT = 1.78. We get 8.697:
        # the caption rounds sigma~ to 3 digits and d(eps)/d(sigma) ~ -30 here, hence 0.03.
        (0.638, 70, 1.78, 8.68, 0.03),
    ],
)
def test_golden_bu2020_figure_4(
    sigma: float, epochs: int, mu: float, epsilon: float, tolerance: float
) -> None:
    accountant = _mnist(sigma, epochs)
    assert accountant.mu == pytest.approx(mu, abs=0.005)
    assert accountant.get_epsilon(1e-5) == pytest.approx(epsilon, abs=tolerance)


@pytest.mark.parametrize(("mu", "epsilon"), [(0.227, 0.5), (0.5, 1.0), (1.0, 3.0), (3.0, 8.0)])
def test_delta_of_epsilon_matches_mpmath(mu: float, epsilon: float) -> None:
    # Dong, Roth, Su 2019, Cor. 2.13: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),
    # evaluated in 50-digit arithmetic as the oracle.
    with mpmath.workdps(50):
        m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
        expected = float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))
    accountant = GdpCltAccountant().compose(GaussianEvent(1 / mu))  # exactly mu-GDP
    assert accountant.mu == pytest.approx(mu, rel=1e-15)
    assert accountant.get_delta(epsilon) == pytest.approx(expected, rel=1e-9)
    # And the inverse: epsilon(delta) lands back on epsilon, certifying delta.
    back = accountant.get_epsilon(expected)
    assert back == pytest.approx(epsilon, rel=1e-9)
    assert accountant.get_delta(back) <= expected * (1 + 1e-12)


def test_heterogeneous_groups_add_mu_squared() -> None:
    # mu^2 = sum over groups of q^2 T (e^{1/sigma^2} - 1), plus T / sigma^2 for plain Gaussians
    # (Dong, Roth, Su 2019, Cor. 3.3); q = 1 is the plain Gaussian, exactly.
    event = ComposedEvent(
        [
            dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=1000),
            dpsgd_event(sampling_probability=0.02, noise_multiplier=2.0, steps=500),
            GaussianEvent(4.0),
            PoissonSampledEvent(1.0, GaussianEvent(2.0)),
        ]
    )
    expected = 1e-4 * 1000 * math.expm1(1.0) + 4e-4 * 500 * math.expm1(0.25) + 1 / 16 + 1 / 4
    assert GdpCltAccountant().compose(event).mu == pytest.approx(math.sqrt(expected), rel=1e-14)


def test_answers_are_labelled_approximate() -> None:
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=100)
    )
    epsilon = accountant.get_epsilon(1e-5)
    assert isinstance(epsilon, Approximate) and "not a guarantee" in repr(epsilon)
    assert isinstance(accountant.get_delta(1.0), Approximate)
    assert accountant.state()["label"] == "approximate, not a guarantee"
    assert "can understate" in (GdpCltAccountant.__doc__ or "")


def test_clt_understates_epsilon_for_short_runs() -> None:
    # Few steps with a large sampling rate: the CLT answer falls below the certified *lower*
    # bound of the tight PLD accountant -- why it is labelled an approximation.
    event = dpsgd_event(sampling_probability=0.2, noise_multiplier=1.0, steps=20)
    clt = GdpCltAccountant().compose(event).get_epsilon(1e-5)
    tight = PldAccountant().compose(event).get_epsilon_interval(1e-5)
    assert clt < tight.lower


@pytest.mark.parametrize("sigma", [0.0, 1e-200, 5e-324, 0.01, 0.03])
def test_tiny_noise_gives_infinity_not_nan_or_an_exception(sigma: float) -> None:
    # e^{1/sigma^2} overflows for sigma < ~0.0378: the sampled CLT mu is then infinite.
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=0.1, noise_multiplier=sigma, steps=10)
    )
    assert math.isinf(accountant.mu)
    assert math.isinf(accountant.get_epsilon(1e-5))
    assert accountant.get_delta(100.0) == 1.0


@pytest.mark.parametrize(("sigma", "mu"), [(0.0, math.inf), (5e-324, math.inf), (0.01, 100.0)])
def test_plain_gaussian_with_tiny_noise(sigma: float, mu: float) -> None:
    accountant = GdpCltAccountant().compose(GaussianEvent(sigma), 3)
    assert accountant.mu == pytest.approx(mu * math.sqrt(3))
    epsilon = accountant.get_epsilon(1e-5)
    assert not math.isnan(epsilon) and epsilon > 0
    assert math.isinf(epsilon) == math.isinf(mu)


def test_nothing_private_is_zero() -> None:
    accountant = GdpCltAccountant().compose(
        dpsgd_event(sampling_probability=0.0, noise_multiplier=0.0, steps=10)
    )
    assert accountant.mu == 0.0 and accountant.get_epsilon(1e-5) == 0.0
    assert clt_mu_squared(sampling_probability=0.5, noise_multiplier=1.0, steps=0) == 0.0


@pytest.mark.parametrize(
    "event",
    [
        LaplaceEvent(1.0),
        EpsilonDeltaEvent(1.0),
        PoissonSampledEvent(0.1, LaplaceEvent(1.0)),
        SampledWithoutReplacementEvent(10, 100, GaussianEvent(1.0)),
    ],
)
def test_other_events_are_refused(event: object) -> None:
    with pytest.raises(UnsupportedEventError, match=type(event).__name__):
        GdpCltAccountant().compose(event)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"sampling_probability": 1.5}, "sampling_probability"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"steps": 2.5}, "steps"),
        ({"steps": -1}, "steps"),
    ],
)
def test_mu_squared_rejects_bad_input(kwargs: dict[str, float], parameter: str) -> None:
    arguments = {"sampling_probability": 0.1, "noise_multiplier": 1.0, "steps": 10, **kwargs}
    with pytest.raises(InvalidParameterError, match=parameter):
        clt_mu_squared(**arguments)  # type: ignore[arg-type]
