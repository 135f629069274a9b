"""Every input to the tradeoff API gives a valid answer or a typed error naming the parameter.

Valid answers: curves in [0, 1], delta in [0, 1], epsilon >= 0 (possibly inf), never NaN, and
never below the exact value where an upper bound is promised.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
    TradeoffFunction,
    compose,
    from_epsilon_delta_curve,
    from_samples,
    inverse,
    poisson_subsample,
    self_compose,
    symmetrise,
    to_epsilon_delta_curve,
)

EDGES = [
    0.0,
    -0.0,
    5e-324,
    1e-300,
    1e-10,
    0.5,
    math.nextafter(1.0, 0.0),
    1.0,
    math.nextafter(1.0, 2.0),
    30.0,
    709.0,
    710.0,
    800.0,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
    -1.0,
    10**18,
]
REALS = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True))
PROBABILITIES = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-300, 0.5, math.nextafter(1.0, 0.0), 1.0]),
    st.floats(min_value=0.0, max_value=1.0),
    REALS,
)
JUNK = st.sampled_from([None, "1", [1.0], True, object()])


def call(function: Callable[[], Any]) -> Any:
    """The result, or None when ``function`` raised an error naming a parameter."""
    try:
        return function()
    except InvalidParameterError as error:
        assert error.parameter  # a typed error that names what to fix
        return None


def check_curve(f: TradeoffFunction) -> None:
    grid = np.array([0.0, 5e-324, 1e-300, 1e-10, 0.25, 0.5, math.nextafter(1.0, 0.0), 1.0])
    beta = f(grid)
    assert np.all(np.isfinite(beta)) and np.all(beta >= 0) and np.all(beta <= 1)
    assert np.all(np.diff(beta) <= 1e-12)


def check_delta(value: float) -> None:
    assert isinstance(value, float) and 0.0 <= value <= 1.0


def check_epsilon(value: float) -> None:
    assert isinstance(value, float) and value >= 0.0  # NaN fails both


def mp_gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP in 400-digit arithmetic (enough for subnormal mu)."""
    with mpmath.workdps(400):
        m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
        return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


# --- the properties -----------------------------------------------------------------------


def gaussian_property(mu: Any, alpha: Any, epsilon: Any, delta: Any) -> None:
    g = call(lambda: GaussianTradeoff(mu))
    if g is None:
        return
    value = call(lambda: g(alpha))
    if value is not None:
        assert 0.0 <= value <= 1.0
    slope = call(lambda: g.slope(alpha))
    if slope is not None:
        assert not np.any(np.isnan(slope)) and np.all(slope <= 0)
    d = call(lambda: g.delta(epsilon))
    if d is not None:
        check_delta(d)
    e = call(lambda: g.epsilon(delta))
    if e is not None:
        check_epsilon(e)
        assert math.isinf(e) or g.delta(e) <= delta  # inf: no epsilon reaches delta


def epsilon_delta_property(eps: Any, dlt: Any, alpha: Any, eps2: Any, delta2: Any) -> None:
    f = call(lambda: EpsilonDeltaTradeoff(eps, dlt))
    if f is None:
        return
    check_curve(f)
    value = call(lambda: f(alpha))
    if value is not None:
        assert 0.0 <= value <= 1.0
    d = call(lambda: f.delta(eps2))
    if d is not None:
        check_delta(d)
        assert d >= f.delta_  # delta(eps') >= delta for every eps'
    e = call(lambda: f.epsilon(delta2))
    if e is not None:
        check_epsilon(e)
        assert math.isinf(e) or f.delta(e) <= delta2  # inf: no epsilon reaches delta2


def envelope_property(epsilons: list[Any], deltas: list[Any], epsilon: Any) -> None:
    f = call(lambda: from_epsilon_delta_curve(epsilons, deltas))
    if f is None:
        return
    check_curve(f)
    d = call(lambda: f.delta(epsilon))
    if d is not None:
        check_delta(d)
    curve = call(lambda: to_epsilon_delta_curve(f, [epsilon]))
    if curve is not None:
        assert np.all((curve >= 0) & (curve <= 1))


def samples_property(p: Any, q: Any) -> None:
    f = call(lambda: from_samples(p, q))
    if f is not None:
        check_curve(f)


def polygon_property(alpha: list[Any], beta: list[Any], hull: bool) -> None:
    f = call(lambda: PiecewiseLinearTradeoff(alpha, beta, hull=hull))
    if f is not None:
        check_curve(f)


def operations_property(mu: Any, q: Any, count: Any, spacing: Any) -> None:
    g = GaussianTradeoff(min(abs(mu), 50.0)) if not math.isnan(mu) else IdentityTradeoff()
    sub = call(lambda: poisson_subsample(g, q))
    if sub is not None:
        check_curve(sub)
    for operation in (inverse, symmetrise):
        check_curve(operation(g))
    composed = call(lambda: self_compose(EpsilonDeltaTradeoff(1.0, 0.0), count, grid_spacing=0.1))
    if composed is not None:
        check_curve(composed)
    pair = call(lambda: compose(IdentityTradeoff(), g, grid_spacing=spacing))
    if pair is not None:
        check_curve(pair)


SAMPLES = st.one_of(
    st.lists(REALS, max_size=6),
    st.sampled_from([[], np.array([]), np.zeros((0, 3)), "abc", None, [[1.0], [2.0, 3.0]]]),
)
VERTICES = st.one_of(
    st.lists(PROBABILITIES, min_size=0, max_size=5),
    st.sampled_from([[], [[0.0, 1.0]], "01", None, np.zeros((2, 2))]),
)
COUNTS = st.one_of(st.integers(-2, 3), st.sampled_from([10**18, 2**63, 1.0, True, None]))
SPACINGS = st.one_of(st.sampled_from([5e-324, 1e-300, 1e-6, 0.0, -1.0, math.nan, 1e300]), REALS)


def run_all(examples: int) -> None:
    budget = settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    budget(given(REALS, PROBABILITIES, REALS, PROBABILITIES)(gaussian_property))()
    budget(
        given(REALS, PROBABILITIES, PROBABILITIES, REALS, PROBABILITIES)(epsilon_delta_property)
    )()
    budget(
        given(st.lists(REALS, max_size=4), st.lists(PROBABILITIES, max_size=4), REALS)(
            envelope_property
        )
    )()
    budget(given(SAMPLES, SAMPLES)(samples_property))()
    budget(given(VERTICES, VERTICES, st.booleans())(polygon_property))()


def run_operations(examples: int) -> None:
    budget = settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    budget(given(REALS, PROBABILITIES, COUNTS, SPACINGS)(operations_property))()


def test_robustness_of_constructors_and_conversions() -> None:
    run_all(40)


def test_robustness_of_operations() -> None:
    run_operations(6)


@pytest.mark.slow
def test_robustness_wide_search() -> None:
    run_all(2000)
    run_operations(200)


# --- regressions: the inputs these properties found ---------------------------------------


@pytest.mark.parametrize("epsilon", [710.0, 1e300, 10**18])
def test_epsilon_delta_tradeoff_at_huge_epsilon_has_no_overflow(epsilon: float) -> None:
    # math.exp(epsilon) overflowed: OverflowError from f(alpha), points() and delta().
    f = EpsilonDeltaTradeoff(epsilon, 0.01)
    assert f(0.0) == 0.99 and f(0.5) < 1e-300
    assert f.delta(0.0) == pytest.approx(1.0) and f.delta(math.inf) == 0.01
    assert f.delta(epsilon) == pytest.approx(0.01, abs=1e-12)
    assert f.epsilon(0.5) > 100


def test_epsilon_delta_tradeoff_delta_is_the_closed_form() -> None:
    # delta(eps') = max(d, 1 - (1 - d)(1 + e^eps')/(1 + e^eps), 1 - e^eps' (1 - d)).
    f = EpsilonDeltaTradeoff(2.0, 0.1)
    for eps2 in [0.0, 0.5, 2.0, 5.0]:
        expected = max(0.1, 1 - 0.9 * (1 + math.exp(eps2)) / (1 + math.exp(2.0)))
        assert f.delta(eps2) == pytest.approx(expected, rel=1e-12)


def test_gaussian_tradeoff_at_alpha_1e_20_is_not_rounded_to_one() -> None:
    # 1 - 1e-20 == 1 in floats, so Phi^{-1}(1 - alpha) was inf and G_40(1e-20) came out 1,
    # far above the exact 1.7e-99: a curve above the truth overstates privacy.
    value = GaussianTradeoff(40.0)(1e-20)
    assert value < 1e-90
    assert GaussianTradeoff(40.0)(5e-324) == pytest.approx(0.0626879131858, rel=1e-9)


def test_gaussian_slope_at_mu_0_and_alpha_0_is_not_nan() -> None:
    # mu z - mu^2/2 was 0 * inf = NaN at alpha = 0; mu = 1e300 overflowed mu**2.
    assert GaussianTradeoff(0.0).slope(np.array([0.0, 0.5])).tolist() == [-1.0, -1.0]
    slopes = GaussianTradeoff(1e300).slope(np.array([0.0, 0.5, 1.0]))
    assert slopes[0] == -math.inf and slopes[2] == 0.0 and not np.any(np.isnan(slopes))


@pytest.mark.parametrize("mu", [1e-17, 2.2250738585072014e-308, 1e-8])
def test_gaussian_delta_at_tiny_mu_is_not_below_the_exact_value(mu: float) -> None:
    # gdp_delta(mu=1e-17, epsilon=0) is 0, the exact value 4e-18: (0, 0) was claimed for a
    # mechanism that is not (0, 1e-18)-DP.
    for epsilon in [0.0, mu, 3 * mu]:
        exact = mp_gdp_delta(mu, epsilon)
        assert GaussianTradeoff(mu).delta(epsilon) >= exact
        assert GaussianTradeoff(mu).delta(epsilon) <= 2 * exact + 1e-320
    assert gdp_delta(mu=1e-17, epsilon=0.0) < mp_gdp_delta(1e-17, 0.0)  # the old answer


def test_gaussian_epsilon_at_tiny_mu_is_not_zero() -> None:
    # gdp_epsilon(mu=1e-17, delta=1e-18) is 0 (from the underflowed delta); the exact answer is
    # positive.
    epsilon = GaussianTradeoff(1e-17).epsilon(1e-18)
    assert epsilon > 0
    assert mp_gdp_delta(1e-17, epsilon) <= 1e-18


def test_gaussian_epsilon_at_mu_1e300_is_inf_not_a_solver_error() -> None:
    # brentq got a NaN at its upper end (mu^2 overflowed) and raised a bare ValueError.
    assert GaussianTradeoff(1e300).epsilon(0.5) == math.inf


@pytest.mark.parametrize("spacing", [5e-324, 1e-300, 1e-6])
def test_compose_with_a_tiny_grid_spacing_is_refused_before_allocating(spacing: float) -> None:
    # 5e-324: OverflowError in math.ceil; 1e-300: a NaN cast; 1e-6: 45 s and ~2.4 GiB.
    with pytest.raises(InvalidParameterError, match="grid_spacing large enough") as error:
        compose(GaussianTradeoff(1.0), GaussianTradeoff(1.0), grid_spacing=spacing)
    assert type(error.value).__name__ == "ResourceLimitError"


def test_self_compose_of_1e9_terms_is_refused_before_allocating() -> None:
    # Was a MemoryError (a 4.3 GiB FFT buffer).
    with pytest.raises(InvalidParameterError, match="Expected count small enough"):
        self_compose(GaussianTradeoff(1.0), 10**9)


def test_points_with_count_1e18_is_refused_before_allocating() -> None:
    # Was a MemoryError (888 PiB).
    with pytest.raises(InvalidParameterError, match="Expected count small enough"):
        GaussianTradeoff(1.0).points(10**18)


def test_inverse_of_g40_is_a_tradeoff_function() -> None:
    # Slopes over subnormal alpha steps overflowed: a RuntimeWarning (an error under -W error)
    # when validating, and np.interp gave inverse(G_40)(5e-324) = 0 < inverse(G_40)(1e-300).
    check_curve(inverse(GaussianTradeoff(40.0)))
    check_curve(symmetrise(GaussianTradeoff(40.0)))
