"""Randomized response, the exponential mechanism and mixtures of Gaussians in basic, advanced
and RDP accounting.

Oracles: the likelihood ratio of randomized response written out from its output probabilities;
the Rényi divergence of two discrete distributions summed term by term in mpmath (Mironov 2017,
Def. 3); for k = 2 the tight pure-DP-to-RDP formula of randomized response (Steinke,
"Sharp RDP & zCDP from Pure DP", differentialprivacy.org 2024, Thm 4); Gaussian mixtures by
mpmath quadrature of the defining integral in both directions.
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accountants.advanced import AdvancedCompositionAccountant
from dpcore.accountants.basic import (
    BasicCompositionAccountant,
    amplify,
    randomized_response_epsilon,
)
from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.moments import MomentsAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning, RdpAccountant
from dpcore.accountants.rdp_math import (
    exponential_mechanism_rdp,
    mixture_of_gaussians_rdp,
    pure_dp_rdp,
    randomized_response_rdp,
    subsampled_gaussian_rdp,
)
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
    dpsgd_event,
)

PROPERTY = settings(max_examples=15, deadline=None)
SMALL_GRID = [1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0]


def _rr_probabilities(p: float, k: int) -> tuple[float, float]:
    """(P[report the true value], P[report one given other value]) of k-ary RR."""
    return 1 - p + p / k, p / k


def _quiet_epsilon(accountant: RdpAccountant, delta: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        return accountant.get_epsilon(delta)


# ----------------------------------------------------------------- randomized response


@pytest.mark.parametrize(("p", "k"), [(0.5, 2), (0.1, 2), (0.3, 5), (0.9, 100), (1e-6, 3)])
def test_randomized_response_epsilon_is_the_likelihood_ratio(p: float, k: int) -> None:
    high, low = _rr_probabilities(p, k)
    expected = math.log(high / low)
    assert randomized_response_epsilon(noise_parameter=p, num_buckets=k) == pytest.approx(
        expected, rel=1e-12
    )


def test_randomized_response_epsilon_boundaries() -> None:
    assert math.isinf(randomized_response_epsilon(noise_parameter=0.0, num_buckets=2))
    assert randomized_response_epsilon(noise_parameter=1.0, num_buckets=7) == 0.0
    # p = 1e-320 (subnormal): k (1 - p) / p overflows; the epsilon is inf, not an error.
    assert math.isinf(randomized_response_epsilon(noise_parameter=1e-320, num_buckets=2))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"noise_parameter": 1.5}, "noise_parameter"), ({"num_buckets": 1}, "num_buckets")],
)
def test_randomized_response_epsilon_rejects(kwargs: dict[str, float], parameter: str) -> None:
    arguments = {"noise_parameter": 0.5, "num_buckets": 2, **kwargs}
    with pytest.raises(InvalidParameterError, match=parameter):
        randomized_response_epsilon(**arguments)  # type: ignore[arg-type]


def _rr_renyi_oracle(p: float, k: int, order: float) -> float:
    """D_a(P || Q) for the output distributions of two different inputs, summed in mpmath."""
    with mpmath.workdps(50):
        pp, kk, a = mpmath.mpf(p), mpmath.mpf(k), mpmath.mpf(order)
        high, low = 1 - pp + pp / kk, pp / kk
        total = high**a * low ** (1 - a) + low**a * high ** (1 - a) + (kk - 2) * low
        return float(mpmath.log(total) / (a - 1))


@pytest.mark.parametrize(("p", "k"), [(0.5, 2), (0.2, 4), (0.95, 10), (0.999999, 3)])
@pytest.mark.parametrize("order", [1.01, 1.5, 2.0, 7.5, 64.0, 1024.0])
def test_randomized_response_rdp_matches_mpmath(p: float, k: int, order: float) -> None:
    ours = randomized_response_rdp(noise_parameter=p, num_buckets=k, orders=np.array([order]))[0]
    assert ours == pytest.approx(_rr_renyi_oracle(p, k, order), rel=1e-10)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_binary_randomized_response_is_the_tight_pure_dp_curve(p: float) -> None:
    # Steinke 2024, Thm 4: the tight RDP of eps-DP, attained by binary randomized response:
    # (1/(a-1)) log(e^{a eps} / (e^eps + 1) + e^eps e^{-a eps} / (e^eps + 1)).
    epsilon = randomized_response_epsilon(noise_parameter=p, num_buckets=2)
    orders = np.array([1.5, 3.0, 20.0])
    expected = [
        math.log(
            math.exp(a * epsilon) / (math.exp(epsilon) + 1)
            + math.exp(epsilon - a * epsilon) / (math.exp(epsilon) + 1)
        )
        / (a - 1)
        for a in orders
    ]
    ours = randomized_response_rdp(noise_parameter=p, num_buckets=2, orders=orders)
    assert ours == pytest.approx(expected, rel=1e-12)
    # ... which is at most the generic bound min(eps, a eps^2 / 2) the accountant had before.
    assert np.all(ours <= pure_dp_rdp(epsilon=epsilon, orders=orders) * (1 + 1e-12))


def test_randomized_response_rdp_boundaries() -> None:
    orders = np.array([2.0, math.inf])
    assert np.all(
        np.isinf(randomized_response_rdp(noise_parameter=0.0, num_buckets=2, orders=orders))
    )
    assert np.all(randomized_response_rdp(noise_parameter=1.0, num_buckets=2, orders=orders) == 0)
    at_infinity = randomized_response_rdp(noise_parameter=0.5, num_buckets=2, orders=orders)[1]
    assert at_infinity == pytest.approx(math.log(3), rel=1e-15)  # D_inf = log(high / low)
    # Close to p = 1 the excess over 1 is computed without cancellation (never rounded to 0).
    tiny = randomized_response_rdp(noise_parameter=1 - 1e-12, num_buckets=2, orders=orders)[0]
    assert tiny == pytest.approx(_rr_renyi_oracle(1 - 1e-12, 2, 2.0), rel=1e-6)
    assert tiny > 0


def test_basic_and_advanced_compose_randomized_response_exactly() -> None:
    event = RandomizedResponseEvent(0.5, 2)  # log 3 each
    for cls in (BasicCompositionAccountant, AdvancedCompositionAccountant):
        accountant = cls().compose(event, 4)
        # Basic composition (Dwork & Roth 2014, Thm 3.16) of four pure log(3) steps; advanced
        # composition is never above it.
        assert accountant.get_epsilon(1e-5) <= 4 * math.log(3) * (1 + 1e-15)
    basic = BasicCompositionAccountant().compose(event, 4)
    assert basic.get_epsilon(1e-5) == pytest.approx(4 * math.log(3), rel=1e-15)


def test_poisson_sampled_randomized_response_is_amplified() -> None:
    epsilon = math.log(3)
    expected, _ = amplify(epsilon=epsilon, delta=0.0, sampling_probability=0.1)
    # Balle, Barthe, Gaboardi 2018, Thm 8: log(1 + q (e^eps - 1)) = log(1 + 0.1 * 2).
    assert expected == pytest.approx(math.log(1.2), rel=1e-14)
    event = PoissonSampledEvent(0.1, RandomizedResponseEvent(0.5, 2))
    assert BasicCompositionAccountant().compose(event, 3).get_epsilon(1e-6) == pytest.approx(
        3 * math.log(1.2), rel=1e-14
    )


def test_rdp_composes_randomized_response_curves() -> None:
    accountant = RdpAccountant().compose(RandomizedResponseEvent(0.4, 3), 50)
    expected = 50 * randomized_response_rdp(
        noise_parameter=0.4, num_buckets=3, orders=accountant.orders
    )
    assert accountant.rdp == pytest.approx(expected, rel=1e-14)
    pure = 50 * randomized_response_epsilon(noise_parameter=0.4, num_buckets=3)
    value = _quiet_epsilon(accountant, 1e-5)
    assert 0 < value < pure  # 50 steps: the RDP conversion beats the pure-DP sum


# ----------------------------------------------------------------- exponential mechanism


def test_exponential_mechanism_rdp_is_the_bounded_range_bound() -> None:
    # Cesar & Rogers 2021 (Lemmas 3.2, 3.4): eps-BR => (eps^2 / 8)-zCDP, RDP a eps^2 / 8; with
    # the pure-DP bound eps: min(eps, a eps^2 / 8). Hand values for eps = 1: a / 8 up to a = 8.
    orders = np.array([1.5, 4.0, 8.0, 16.0, math.inf])
    assert exponential_mechanism_rdp(epsilon=1.0, orders=orders) == pytest.approx(
        [1.5 / 8, 0.5, 1.0, 1.0, 1.0], rel=1e-15
    )
    assert np.all(exponential_mechanism_rdp(epsilon=0.0, orders=orders) == 0)
    generic = pure_dp_rdp(epsilon=0.3, orders=orders[:-1])
    sharper = exponential_mechanism_rdp(epsilon=0.3, orders=orders[:-1])
    assert np.all(sharper <= generic) and np.any(sharper < generic)


def test_exponential_mechanism_in_the_accountants() -> None:
    event = ExponentialMechanismEvent(0.2)
    basic = BasicCompositionAccountant().compose(event, 10)
    assert basic.get_epsilon(1e-6) == pytest.approx(2.0, rel=1e-15)  # Dwork & Roth, Thm 3.10
    rdp = RdpAccountant().compose(event, 1000)
    expected = 1000 * exponential_mechanism_rdp(epsilon=0.2, orders=rdp.orders)
    assert rdp.rdp == pytest.approx(expected, rel=1e-14)
    # 1000 steps of (0.2^2 / 8)-zCDP = 5-zCDP: epsilon <= rho + 2 sqrt(rho log(1/delta)) (Bun &
    # Steinke 2016, Prop. 1.3) bounds the RDP conversion (which is tighter).
    rho = 1000 * 0.2**2 / 8
    assert _quiet_epsilon(rdp, 1e-6) <= rho + 2 * math.sqrt(rho * math.log(1e6))


# ----------------------------------------------------------------- mixture of Gaussians


def _mixture_oracle(
    sigma: float, shifts: tuple[float, ...], weights: tuple[float, ...], order: float
):  # type: ignore[no-untyped-def]
    """(D_a(mix || N0), D_a(N0 || mix)) by mpmath quadrature of the definition."""
    with mpmath.workdps(30):
        s = mpmath.mpf(sigma)

        def mix(x):  # type: ignore[no-untyped-def]
            return sum(w * mpmath.npdf(x, c, s) for c, w in zip(shifts, weights, strict=True))

        def zero(x):  # type: ignore[no-untyped-def]
            return mpmath.npdf(x, 0, s)

        cuts = [-mpmath.inf, -60 * s, -20 * s, -5 * s, 0, 2 * s, 5 * s, 20 * s, 60 * s, mpmath.inf]
        a = mpmath.mpf(order)
        forward = mpmath.quad(lambda x: mix(x) ** a * zero(x) ** (1 - a), cuts)
        reverse = mpmath.quad(lambda x: zero(x) ** a * mix(x) ** (1 - a), cuts)
        return float(mpmath.log(forward) / (a - 1)), float(mpmath.log(reverse) / (a - 1))


MIXTURES = [
    (2.0, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01)),
    (1.0, (0.0, 0.5, 1.5), (0.9, 0.05, 0.05)),
    (1.5, (0.5, 1.0), (0.3, 0.7)),
]


@pytest.mark.parametrize(("sigma", "shifts", "weights"), MIXTURES)
@pytest.mark.parametrize("order", [2.0, 3.0, 6.0])
def test_mixture_integer_orders_match_quadrature(
    sigma: float, shifts: tuple[float, ...], weights: tuple[float, ...], order: float
) -> None:
    ours = mixture_of_gaussians_rdp(
        noise_multiplier=sigma,
        sensitivities=shifts,
        probabilities=weights,
        orders=np.array([order]),
    )[0]
    forward, reverse = _mixture_oracle(sigma, shifts, weights, order)
    assert ours >= max(forward, reverse) * (1 - 1e-9)  # an upper bound in both directions
    # The forward direction is exact (multinomial expansion); the reverse is bounded, and in
    # these cases that bound stays within 15% of the exact divergence of the larger direction.
    assert ours <= max(forward, reverse) * 1.15


@pytest.mark.parametrize(("sigma", "shifts", "weights"), MIXTURES)
@pytest.mark.parametrize("order", [1.25, 2.5, 4.75])
def test_mixture_fractional_orders_are_upper_bounds(
    sigma: float, shifts: tuple[float, ...], weights: tuple[float, ...], order: float
) -> None:
    ours = mixture_of_gaussians_rdp(
        noise_multiplier=sigma,
        sensitivities=shifts,
        probabilities=weights,
        orders=np.array([order]),
    )[0]
    assert ours >= max(_mixture_oracle(sigma, shifts, weights, order)) * (1 - 1e-9)


def test_two_point_mixture_is_the_sampled_gaussian() -> None:
    orders = np.array([1.5, 2.0, 5.0, 64.0])
    mixture = mixture_of_gaussians_rdp(
        noise_multiplier=1.3, sensitivities=(0.0, 1.0), probabilities=(0.98, 0.02), orders=orders
    )
    sampled = subsampled_gaussian_rdp(
        sampling_probability=0.02, noise_multiplier=1.3, orders=orders
    )
    assert np.array_equal(mixture, sampled)
    # A shift of 2 with noise 2.6 is the same pair as a shift of 1 with noise 1.3.
    scaled = mixture_of_gaussians_rdp(
        noise_multiplier=2.6, sensitivities=(0.0, 2.0), probabilities=(0.98, 0.02), orders=orders
    )
    assert np.array_equal(scaled, sampled)
    accountant = RdpAccountant().compose(
        MixtureOfGaussiansEvent(1.3, (0.0, 1.0), (0.98, 0.02)), 500
    )
    dpsgd = RdpAccountant().compose(
        dpsgd_event(sampling_probability=0.02, noise_multiplier=1.3, steps=500)
    )
    assert _quiet_epsilon(accountant, 1e-5) == _quiet_epsilon(dpsgd, 1e-5)


def test_mixture_boundaries() -> None:
    orders = np.array([2.0, 3.5, math.inf])
    # All mass on shift 0: the two distributions are equal.
    assert np.all(
        mixture_of_gaussians_rdp(
            noise_multiplier=1.0, sensitivities=(0.0, 2.0), probabilities=(1.0, 0.0), orders=orders
        )
        == 0
    )
    # No noise: inf; order inf of a real shift: inf.
    assert np.all(
        np.isinf(
            mixture_of_gaussians_rdp(
                noise_multiplier=0.0,
                sensitivities=(0.0, 1.0, 2.0),
                probabilities=(0.5, 0.25, 0.25),
                orders=orders,
            )
        )
    )
    finite = mixture_of_gaussians_rdp(
        noise_multiplier=1.0,
        sensitivities=(0.0, 1.0, 2.0),
        probabilities=(0.5, 0.25, 0.25),
        orders=orders,
    )
    assert np.all(np.isfinite(finite[:2])) and math.isinf(finite[2])
    # A single component is the Gaussian: a c^2 / (2 s^2) (Mironov 2017, Prop. 7).
    single = mixture_of_gaussians_rdp(
        noise_multiplier=2.0, sensitivities=(3.0,), probabilities=(1.0,), orders=orders[:2]
    )
    assert single == pytest.approx(orders[:2] * 9 / 8, rel=1e-15)


def test_mixture_in_the_rdp_accountant_and_refusals() -> None:
    event = MixtureOfGaussiansEvent(2.0, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01))
    accountant = RdpAccountant().compose(event, 10)
    expected = 10 * mixture_of_gaussians_rdp(
        noise_multiplier=2.0,
        sensitivities=(0.0, 1.0, 2.0),
        probabilities=(0.81, 0.18, 0.01),
        orders=accountant.orders,
    )
    assert accountant.rdp == pytest.approx(expected, rel=1e-14)
    assert 0 < _quiet_epsilon(accountant, 1e-5) < math.inf
    with pytest.raises(UnsupportedEventError, match="add_or_remove_one"):
        RdpAccountant(neighboring_relation="replace_one").compose(event)
    for cls in (BasicCompositionAccountant, MomentsAccountant, GdpCltAccountant):
        with pytest.raises(UnsupportedEventError, match="MixtureOfGaussiansEvent"):
            cls().compose(event)


def test_new_events_unsupported_where_there_is_no_rule() -> None:
    for event in (RandomizedResponseEvent(0.5, 2), ExponentialMechanismEvent(1.0)):
        for cls in (MomentsAccountant, GdpCltAccountant):
            with pytest.raises(UnsupportedEventError, match=type(event).__name__):
                cls().compose(event)
        with pytest.raises(UnsupportedEventError):  # no Poisson-sampled rule in RDP
            RdpAccountant().compose(PoissonSampledEvent(0.1, event))


def test_new_events_survive_save_and_load() -> None:
    event = ComposedEvent(
        [
            RandomizedResponseEvent(0.3, 4),
            ExponentialMechanismEvent(0.5),
            MixtureOfGaussiansEvent(2.0, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01)),
        ]
    )
    accountant = RdpAccountant().compose(event, 3)
    restored = RdpAccountant.from_json(accountant.to_json())
    assert restored.to_json() == accountant.to_json()
    assert np.array_equal(restored.rdp, accountant.rdp)
    basic = BasicCompositionAccountant().compose(ComposedEvent(list(event.events[:2])), 2)
    assert BasicCompositionAccountant.from_json(basic.to_json()).get_epsilon(
        0.0
    ) == basic.get_epsilon(0.0)


# ----------------------------------------------------------------- monotonicity


rates = st.floats(min_value=0.01, max_value=0.99)
buckets = st.integers(min_value=2, max_value=50)


@PROPERTY
@given(p=rates, other=rates, k=buckets)
def test_randomized_response_epsilon_decreases_in_noise(p: float, other: float, k: int) -> None:
    low, high = sorted((p, other))
    event_low, event_high = RandomizedResponseEvent(low, k), RandomizedResponseEvent(high, k)
    basic = [
        BasicCompositionAccountant().compose(e, 3).get_epsilon(1e-5)
        for e in (event_low, event_high)
    ]
    assert basic[0] >= basic[1]
    rdp = [
        _quiet_epsilon(RdpAccountant(orders=SMALL_GRID).compose(e, 3), 1e-5)
        for e in (event_low, event_high)
    ]
    assert rdp[0] >= rdp[1] * (1 - 1e-12)


@PROPERTY
@given(p=rates, k=buckets, extra=st.integers(min_value=1, max_value=50))
def test_randomized_response_epsilon_increases_in_buckets(p: float, k: int, extra: int) -> None:
    # epsilon = log(1 + k (1 - p) / p) grows with k for a fixed p.
    small, large = RandomizedResponseEvent(p, k), RandomizedResponseEvent(p, k + extra)
    basic = [BasicCompositionAccountant().compose(e, 3).get_epsilon(1e-5) for e in (small, large)]
    assert basic[0] <= basic[1]
    rdp = [
        _quiet_epsilon(RdpAccountant(orders=SMALL_GRID).compose(e, 3), 1e-5) for e in (small, large)
    ]
    assert rdp[0] <= rdp[1] * (1 + 1e-12)


@PROPERTY
@given(a=st.floats(min_value=0.0, max_value=5.0), b=st.floats(min_value=0.0, max_value=5.0))
def test_exponential_mechanism_epsilon_increases(a: float, b: float) -> None:
    low, high = sorted((a, b))
    events = (ExponentialMechanismEvent(low), ExponentialMechanismEvent(high))
    basic = [BasicCompositionAccountant().compose(e, 4).get_epsilon(1e-5) for e in events]
    assert basic[0] <= basic[1]
    rdp = [_quiet_epsilon(RdpAccountant(orders=SMALL_GRID).compose(e, 4), 1e-5) for e in events]
    assert rdp[0] <= rdp[1] * (1 + 1e-12)


def _mixture_epsilon(sigma: float, shifts: tuple[float, ...], weights: tuple[float, ...]) -> float:
    event = MixtureOfGaussiansEvent(sigma, shifts, weights)
    return _quiet_epsilon(RdpAccountant(orders=SMALL_GRID).compose(event, 20), 1e-5)


mixture_weights = st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=3, max_size=3)
mixture_shifts = st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=3, max_size=3)


@settings(max_examples=8, deadline=None)
@given(
    raw=mixture_weights,
    shifts=mixture_shifts,
    index=st.integers(min_value=0, max_value=2),
    bump=st.floats(min_value=0.01, max_value=1.0),
    sigma=st.floats(min_value=0.8, max_value=3.0),
)
def test_mixture_epsilon_increases_in_each_sensitivity(
    raw: list[float], shifts: list[float], index: int, bump: float, sigma: float
) -> None:
    weights = tuple(w / math.fsum(raw) for w in raw)
    larger = list(shifts)
    larger[index] += bump
    assert _mixture_epsilon(sigma, tuple(shifts), weights) <= _mixture_epsilon(
        sigma, tuple(larger), weights
    ) * (1 + 1e-9)


@settings(max_examples=8, deadline=None)
@given(
    raw=mixture_weights,
    shifts=mixture_shifts,
    fraction=st.floats(min_value=0.05, max_value=1.0),
    sigma=st.floats(min_value=0.8, max_value=3.0),
)
def test_mixture_epsilon_increases_with_mass_on_larger_sensitivities(
    raw: list[float], shifts: list[float], fraction: float, sigma: float
) -> None:
    weights = [w / math.fsum(raw) for w in raw]
    order = np.argsort(shifts)
    small, large = int(order[0]), int(order[-1])
    moved = list(weights)
    moved[small] -= fraction * weights[small]
    moved[large] += fraction * weights[small]
    assert _mixture_epsilon(sigma, tuple(shifts), tuple(weights)) <= _mixture_epsilon(
        sigma, tuple(shifts), tuple(moved)
    ) * (1 + 1e-9)


@settings(max_examples=8, deadline=None)
@given(
    raw=mixture_weights,
    shifts=mixture_shifts,
    sigma=st.floats(min_value=0.8, max_value=3.0),
    factor=st.floats(min_value=1.01, max_value=3.0),
)
def test_mixture_epsilon_decreases_in_noise(
    raw: list[float], shifts: list[float], sigma: float, factor: float
) -> None:
    weights = tuple(w / math.fsum(raw) for w in raw)
    assert _mixture_epsilon(sigma * factor, tuple(shifts), weights) <= _mixture_epsilon(
        sigma, tuple(shifts), weights
    ) * (1 + 1e-9)


def test_gaussian_event_reference_is_unchanged() -> None:
    """The handlers added here leave the Gaussian's numbers alone (1000 steps, sigma = 10)."""
    accountant = RdpAccountant().compose(GaussianEvent(10.0), 1000)
    expected = 1000 * np.asarray(accountant.orders) / 200  # a / (2 sigma^2), Mironov 2017, Prop. 7
    assert accountant.rdp == pytest.approx(expected, rel=1e-14)
