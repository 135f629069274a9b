"""Basic composition: hand-computed sums, amplification by sampling, the even delta split.

Oracles: closed forms written out by hand below, and for Gaussian steps the per-step epsilon
solved independently with mpmath from the analytic-Gaussian curve (Balle & Wang 2018, Thm 8).
"""

from __future__ import annotations

import math

import mpmath
import pytest

from dpcore.accountants.basic import BasicCompositionAccountant, amplify
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


def mp_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Independent oracle: solve Phi(1/(2s) - e s) - e^e Phi(-1/(2s) - e s) = delta in mpmath."""
    s = mpmath.mpf(sigma)
    target = mpmath.mpf(delta)

    def curve(eps: mpmath.mpf) -> mpmath.mpf:
        return mpmath.ncdf(1 / (2 * s) - eps * s) - mpmath.exp(eps) * mpmath.ncdf(
            -1 / (2 * s) - eps * s
        )

    with mpmath.workdps(40):
        low, high = mpmath.mpf(0), mpmath.mpf(60)  # delta(eps) decreases: bisect 200 times
        for _ in range(200):
            middle = (low + high) / 2
            low, high = (middle, high) if curve(middle) > target else (low, middle)
        return float(high)


def test_sums_epsilons_and_deltas() -> None:
    # Dwork & Roth 2014, Thm 3.16: 10 x (0.5, 1e-7) and 2 x Laplace(b = 4) (each 0.25-DP).
    accountant = (
        BasicCompositionAccountant()
        .compose(EpsilonDeltaEvent(0.5, 1e-7), 10)
        .compose(LaplaceEvent(4.0), 2)
    )
    assert accountant.get_epsilon(1e-5) == pytest.approx(5.5, rel=1e-15)
    assert accountant.get_epsilon(1e-6) == pytest.approx(5.5, rel=1e-15)  # exactly the sum
    assert math.isinf(accountant.get_epsilon(1e-7))  # the steps alone already spend 1e-6
    assert accountant.get_delta(5.5) == pytest.approx(1e-6, rel=1e-12)
    assert accountant.get_delta(5.4) == 1.0  # no smaller epsilon is certified


def test_amplification_hand_values() -> None:
    # Balle, Barthe, Gaboardi 2018, Thm 8: (log(1 + q (e^eps - 1)), q delta).
    assert amplify(epsilon=1.0, delta=1e-6, sampling_probability=0.1) == pytest.approx(
        (math.log(1 + 0.1 * (math.e - 1)), 1e-7), rel=1e-14
    )
    assert amplify(epsilon=2.0, delta=0.0, sampling_probability=1.0) == (2.0, 0.0)
    assert amplify(epsilon=2.0, delta=1e-3, sampling_probability=0.0) == (0.0, 0.0)
    assert amplify(epsilon=math.inf, delta=0.0, sampling_probability=0.5) == (math.inf, 0.0)
    # e^1000 overflows a float: log(0.5 + 0.5 e^1000) = 1000 + log(0.5) to double precision.
    epsilon, _ = amplify(epsilon=1000.0, delta=0.0, sampling_probability=0.5)
    assert epsilon == pytest.approx(1000 + math.log(0.5), rel=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"epsilon": math.nan}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"sampling_probability": 1.5}, "sampling_probability"),
    ],
)
def test_amplify_rejects_bad_input(kwargs: dict[str, float], parameter: str) -> None:
    arguments = {"epsilon": 1.0, "delta": 0.0, "sampling_probability": 0.5, **kwargs}
    with pytest.raises(InvalidParameterError, match=parameter):
        amplify(**arguments)


def test_sampled_laplace_and_epsilon_delta_steps() -> None:
    accountant = (
        BasicCompositionAccountant()
        .compose(PoissonSampledEvent(0.2, LaplaceEvent(2.0)), 5)  # each 0.5-DP before sampling
        .compose(PoissonSampledEvent(0.1, EpsilonDeltaEvent(1.0, 1e-6)), 3)
    )
    expected = 5 * math.log(1 + 0.2 * (math.exp(0.5) - 1)) + 3 * math.log(1 + 0.1 * (math.e - 1))
    assert accountant.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-14)
    assert accountant.get_delta(expected * (1 + 1e-12)) == pytest.approx(3e-7, rel=1e-12)
    assert math.isinf(accountant.get_epsilon(2e-7))  # the sampled steps spend 3 x 1e-7


def test_gaussian_steps_split_delta_evenly() -> None:
    # T = 100 steps at q = 0.01, sigma = 2, delta = 1e-5: each step gets 1e-7 after sampling,
    # so its Gaussian runs at delta_g = 1e-7 / 0.01 = 1e-5; then amplify and add up.
    accountant = BasicCompositionAccountant().compose(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=2.0, steps=100)
    )
    inner = mp_gaussian_epsilon(2.0, 1e-5)
    expected = 100 * math.log1p(0.01 * math.expm1(inner))
    assert accountant.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-7)


def test_fixed_deltas_are_paid_before_the_gaussian_split() -> None:
    # (0.1, 4e-6) leaves 6e-6 for two plain Gaussian steps (sigma = 5): 3e-6 each.
    accountant = (
        BasicCompositionAccountant()
        .compose(EpsilonDeltaEvent(0.1, 4e-6))
        .compose(GaussianEvent(5.0), 2)
    )
    expected = 0.1 + 2 * mp_gaussian_epsilon(5.0, 3e-6)
    assert accountant.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-7)
    assert math.isinf(accountant.get_epsilon(4e-6))  # nothing left for the Gaussian steps


def test_heterogeneous_gaussian_groups_share_per_step() -> None:
    # 30 steps in all: each spends 1e-6 / 30 after sampling, whatever its group.
    event = ComposedEvent(
        [
            dpsgd_event(sampling_probability=0.1, noise_multiplier=3.0, steps=20),
            dpsgd_event(sampling_probability=0.5, noise_multiplier=6.0, steps=10),
        ]
    )
    share = 1e-6 / 30
    expected = 20 * math.log1p(0.1 * math.expm1(mp_gaussian_epsilon(3.0, share / 0.1)))
    expected += 10 * math.log1p(0.5 * math.expm1(mp_gaussian_epsilon(6.0, share / 0.5)))
    accountant = BasicCompositionAccountant().compose(event)
    assert accountant.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize(
    ("q", "sigma", "steps"), [(0.01, 1.0, 1000), (1.0, 20.0, 5), (0.3, 2.0, 50)]
)
def test_delta_of_epsilon_certifies_and_is_tight(q: float, sigma: float, steps: int) -> None:
    accountant = BasicCompositionAccountant().compose(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    )
    target = accountant.get_epsilon(1e-6)
    delta = accountant.get_delta(target)
    assert accountant.get_epsilon(delta) <= target  # the returned delta certifies epsilon
    assert delta <= 1e-6 * (1 + 1e-5)
    assert accountant.get_epsilon(delta * 0.999) > target  # and is not much larger than needed


def test_boundaries() -> None:
    assert math.isinf(BasicCompositionAccountant().compose(GaussianEvent(0.0)).get_epsilon(0.1))
    assert math.isinf(BasicCompositionAccountant().compose(LaplaceEvent(0.0)).get_epsilon(0.1))
    nothing = BasicCompositionAccountant().compose(
        dpsgd_event(sampling_probability=0.0, noise_multiplier=1.0, steps=10)
    )
    assert nothing.get_epsilon(1e-5) == 0.0
    assert nothing.get_delta(0.0) == 0.0
    assert BasicCompositionAccountant().compose(EpsilonDeltaEvent(0.0)).get_epsilon(1e-9) == 0.0


def test_unsupported_event_is_named() -> None:
    event = SampledWithoutReplacementEvent(10, 100, GaussianEvent(1.0))
    with pytest.raises(UnsupportedEventError, match="SampledWithoutReplacementEvent"):
        BasicCompositionAccountant().compose(event)


def test_get_delta_never_reports_pure_dp_for_gaussian_steps() -> None:
    """A Gaussian step is never pure DP: a huge epsilon gets a tiny positive delta, not 0."""
    gaussian = BasicCompositionAccountant().compose(GaussianEvent(1.0), 1)
    assert gaussian.get_delta(50.0) == pytest.approx(1e-300)
    pure = BasicCompositionAccountant().compose(EpsilonDeltaEvent(0.5, 0.0), 10)
    assert pure.get_delta(5.0) == 0.0
