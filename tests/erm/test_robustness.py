"""Every input to the private ERM API gives a valid release or a typed error naming the parameter.

Valid: finite weights, noise scales > 0 and finite, risk bounds >= 0 (inf allowed: an upper bound
beyond the float range), Gaussian noise that meets its (epsilon, delta) target.
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

from dpcore.erm import (
    HuberLoss,
    LogisticLoss,
    SolverError,
    objective_perturbation,
    objective_perturbation_gaussian,
    objective_perturbation_plan,
    output_perturbation,
    scale_rows,
)
from dpcore.erm.bounds import objective_perturbation_excess_risk, output_perturbation_excess_risk
from dpcore.erm.median import naive_median_release, smooth_median_release
from dpcore.erm.noise import analytic_gaussian_sigma, sample_norm_laplace
from dpcore.erm.objective_perturbation_gaussian import gaussian_objective_noise
from dpcore.erm.output_perturbation import minimiser_sensitivity
from dpcore.errors import InvalidParameterError

EDGES = [
    0.0,
    -0.0,
    5e-324,
    1e-300,
    1e-10,
    0.5,
    1.0,
    710.0,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
    -1.0,
    10**18,
]
REALS = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True))
DELTAS = st.one_of(
    st.sampled_from([5e-324, 1e-300, 1e-10, 0.5, math.nextafter(1.0, 0.0), 1.0, 0.0]),
    st.floats(min_value=0.0, max_value=1.0),
)
COUNTS = st.one_of(st.sampled_from([1, 2, 10**18, 0, -1, 2.0, True]), st.integers(1, 10**6))
FEATURES = st.sampled_from(
    [
        np.array([[0.6, 0.8], [-0.6, -0.8], [1.0, 0.0]]),
        np.array([[5e-324, 0.0], [0.0, -1e-300], [1.0, 0.0]]),
        np.array([[1e300, 1e300], [0.0, 1.0], [1.0, 0.0]]),
        np.zeros((0, 2)),
        np.zeros(3),
        np.array([["a", "b"], ["c", "d"], ["e", "f"]]),
        [[0.1, 0.2], [0.3], [0.4, 0.5]],
        np.full((3, 2), np.nan),
    ]
)
LABELS = st.sampled_from(
    [np.array([1.0, -1.0, 1.0]), np.array([1, 0, 1]), np.ones(2), ["x", "y", "z"], None]
)
LOSSES = st.sampled_from([LogisticLoss(), HuberLoss(h=0.5), HuberLoss(h=1e300), "logistic"])


def call(function: Callable[[], Any]) -> Any:
    """The result, or None when ``function`` raised a typed error (naming a parameter)."""
    try:
        return function()
    except InvalidParameterError as error:
        assert error.parameter
        return None
    except SolverError:  # a typed error: the solver did not certify its tolerance
        return None


def check_model(model: Any) -> None:
    if model is None:
        return
    assert np.all(np.isfinite(model.weights))
    assert 0 < model.noise_scale < math.inf
    assert model.noise_epsilon > 0 and model.extra_regularisation >= 0


def mp_gdp_delta(mu: float, epsilon: float) -> float:
    with mpmath.workdps(400):
        m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
        return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


def calibration_property(sensitivity: Any, epsilon: Any, delta: Any, smoothness: Any) -> None:
    sigma = call(
        lambda: analytic_gaussian_sigma(sensitivity=sensitivity, epsilon=epsilon, delta=delta)
    )
    if sigma is not None:
        assert 0 < sigma < math.inf
    noise = call(
        lambda: gaussian_objective_noise(epsilon=epsilon, delta=delta, lipschitz=sensitivity)
    )
    if noise is not None:
        assert 0 < noise < math.inf
    plan = call(
        lambda: objective_perturbation_plan(
            epsilon=epsilon, n=3, regularisation=sensitivity, smoothness=smoothness
        )
    )
    if plan is not None:
        assert 0 < plan.noise_epsilon <= plan.epsilon
        assert 0 < plan.noise_scale < math.inf and 0 <= plan.extra_regularisation < math.inf


def bounds_property(n: Any, dimension: Any, lam: Any, epsilon: Any, delta: Any) -> None:
    for d in (None, delta):
        risk = call(
            lambda d=d: output_perturbation_excess_risk(
                n=n,
                dimension=dimension,
                regularisation=lam,
                epsilon=epsilon,
                smoothness=0.25,
                delta=d,
            )
        )
        if risk is not None:
            assert risk >= 0  # NaN fails
    risk = call(
        lambda: objective_perturbation_excess_risk(
            n=n,
            dimension=dimension,
            regularisation=lam,
            epsilon=epsilon,
            smoothness=0.25,
            optimum_norm=1.0,
        )
    )
    if risk is not None:
        assert risk >= 0
    sensitivity = call(lambda: minimiser_sensitivity(n=n, regularisation=lam))
    if sensitivity is not None:
        assert sensitivity > 0


def noise_property(dimension: Any, scale: Any, size: Any) -> None:
    draws = call(
        lambda: sample_norm_laplace(dimension, scale=scale, rng=np.random.default_rng(0), size=size)
    )
    if draws is not None:
        assert np.all(np.isfinite(draws))


def release_property(
    features: Any, labels: Any, loss: Any, lam: Any, epsilon: Any, delta: Any
) -> None:
    rng = np.random.default_rng(0)
    lam = lam if (isinstance(lam, float) and lam >= 1e-3) or not isinstance(lam, float) else 1e-3
    check_model(
        call(
            lambda: output_perturbation(
                features, labels, loss=loss, regularisation=lam, epsilon=epsilon, rng=rng
            )
        )
    )
    check_model(
        call(
            lambda: output_perturbation(
                features,
                labels,
                loss=loss,
                regularisation=lam,
                epsilon=epsilon,
                delta=delta,
                rng=rng,
            )
        )
    )
    check_model(
        call(
            lambda: objective_perturbation(
                features, labels, loss=loss, regularisation=lam, epsilon=epsilon, rng=rng
            )
        )
    )
    check_model(
        call(
            lambda: objective_perturbation_gaussian(
                features,
                labels,
                loss=loss,
                regularisation=lam,
                epsilon=epsilon,
                delta=delta,
                rng=rng,
            )
        )
    )


def median_property(data: Any, epsilon: Any, width: Any, size: Any) -> None:
    rng = np.random.default_rng(0)
    out = call(lambda: naive_median_release(data, epsilon=epsilon, rng=rng, size=size))
    if out is not None:
        assert np.all(np.isfinite(out))
    out = call(
        lambda: smooth_median_release(
            data, epsilon=epsilon, regularisation=1.0, huber_width=width, rng=rng, size=size
        )
    )
    if out is not None:
        assert np.all(np.isfinite(out))


DATA = st.one_of(
    st.lists(st.floats(-10, 10), min_size=0, max_size=5),
    st.sampled_from([[math.nan], [1e300], "abc", [[1.0], [2.0]], np.zeros((2, 2))]),
)
SIZES = st.one_of(st.integers(1, 3), st.sampled_from([0, 10**18, 2.0]))


def run_all(examples: int, releases: int) -> None:
    budget = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    budget(given(REALS, REALS, DELTAS, REALS)(calibration_property))()
    budget(given(COUNTS, COUNTS, REALS, REALS, DELTAS)(bounds_property))()
    budget(given(COUNTS, REALS, st.one_of(st.none(), COUNTS))(noise_property))()
    budget(given(DATA, REALS, REALS, SIZES)(median_property))()
    few = settings(max_examples=releases, deadline=None, suppress_health_check=list(HealthCheck))
    few(given(FEATURES, LABELS, LOSSES, REALS, REALS, DELTAS)(release_property))()


def test_robustness_of_the_erm_api() -> None:
    run_all(40, 8)


@pytest.mark.slow
def test_robustness_wide_search() -> None:
    run_all(2000, 200)


# --- regressions --------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "delta"), [(1e-300, 1e-300), (1e-5, 1e-10), (1e-10, 1e-20)])
def test_analytic_gaussian_sigma_meets_delta_at_tiny_mu(epsilon: float, delta: float) -> None:
    # (1e-300, 1e-300) gave sigma = 2.4e17: exact delta 1.7e-18, not 1e-300. gdp_delta loses
    # its precision for mu < 1e-4 and was clamped at 1e-300.
    sigma = analytic_gaussian_sigma(sensitivity=1.0, epsilon=epsilon, delta=delta)
    assert mp_gdp_delta(1.0 / sigma, epsilon) <= delta


@pytest.mark.parametrize(("epsilon", "delta"), [(5e-324, 5e-324), (1.0, 5e-324)])
def test_analytic_gaussian_sigma_does_not_hang_at_delta_5e_324(
    epsilon: float, delta: float
) -> None:
    # The bracket search looped forever: the clamp at 1e-300 never fell below delta.
    sigma = call(lambda: analytic_gaussian_sigma(sensitivity=1.0, epsilon=epsilon, delta=delta))
    assert sigma is None or mp_gdp_delta(1.0 / sigma, epsilon) <= delta


def test_analytic_gaussian_sigma_never_rounds_to_zero_noise() -> None:
    # sigma underflowed to 0 for epsilon = regularisation = 1e300 (then math.log(0) in bounds).
    assert analytic_gaussian_sigma(sensitivity=1e-300, epsilon=1e300, delta=0.5) > 0
    risk = output_perturbation_excess_risk(
        n=1, dimension=1, regularisation=1e300, epsilon=1e300, smoothness=0.0, delta=0.5
    )
    assert risk >= 0


def test_plan_at_epsilon_5e_324_is_a_typed_error() -> None:
    # expm1(epsilon / 4) underflowed to 0: ZeroDivisionError; or noise_scale = inf.
    with pytest.raises(InvalidParameterError, match="epsilon large enough"):
        objective_perturbation_plan(epsilon=5e-324, n=1, regularisation=5e-324, smoothness=0.25)
    with pytest.raises(InvalidParameterError, match="epsilon large enough"):
        objective_perturbation_plan(epsilon=5e-324, n=1, regularisation=1.0, smoothness=0.0)


def test_plan_with_smoothness_1e300_has_no_overflow() -> None:
    # ratio**2 overflowed (OverflowError); log1p(2r + r^2) is now 2 log1p(r).
    plan = objective_perturbation_plan(epsilon=0.5, n=1, regularisation=0.5, smoothness=1e300)
    assert plan.noise_epsilon == 0.25 and math.isfinite(plan.extra_regularisation)
    # expm1(2.5e17) overflowed (OverflowError); Delta = c / (n (e^{eps/4} - 1)) - lambda < 0.
    plan = objective_perturbation_plan(epsilon=10**18, n=1, regularisation=5e-324, smoothness=0.25)
    assert plan.extra_regularisation == 0.0 and plan.noise_epsilon == 5e17


def test_gaussian_objective_noise_never_rounds_to_zero() -> None:
    # zeta sqrt(...) / epsilon underflowed to 0 for lipschitz 5e-324 and epsilon 1e18.
    assert gaussian_objective_noise(epsilon=10**18, delta=5e-324, lipschitz=5e-324) > 0


def test_output_risk_at_subnormal_regularisation_is_inf_not_nan() -> None:
    # 0.5 * (c + lambda) underflowed to 0 and met an infinite second moment: 0 * inf = NaN.
    risk = output_perturbation_excess_risk(
        n=1, dimension=3, regularisation=5e-324, epsilon=5e-324, smoothness=0.0
    )
    assert risk == math.inf


def test_huber_loss_with_tiny_or_huge_width() -> None:
    # h = 5e-324 gave smoothness inf (rejected later as "smoothness"); h = 1e300 overflowed.
    with pytest.raises(InvalidParameterError, match="Expected h large enough"):
        HuberLoss(h=5e-324)
    assert np.all(np.isfinite(HuberLoss(h=1e300).value(np.array([0.0, 1.0]))))


def test_scale_rows_of_1e300_keeps_the_direction() -> None:
    # The norm overflowed to inf, so the row became 0 instead of its unit direction.
    assert scale_rows(np.array([[1e300, 1e300]]))[0] == pytest.approx([2**-0.5, 2**-0.5])


def test_bad_types_name_the_parameter() -> None:
    x, y = np.array([[0.6, 0.8], [1.0, 0.0]]), np.array([1.0, -1.0])
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="Expected rng"):
        output_perturbation(x, y, loss=LogisticLoss(), regularisation=1.0, epsilon=1.0, rng=0)
    with pytest.raises(InvalidParameterError, match="Expected loss"):
        objective_perturbation(x, y, loss="logistic", regularisation=1.0, epsilon=1.0, rng=rng)
    with pytest.raises(InvalidParameterError, match="Expected features"):
        output_perturbation(
            [["a", "b"]], [1.0], loss=LogisticLoss(), regularisation=1.0, epsilon=1.0, rng=rng
        )


def test_huge_allocations_are_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="small enough"):
        sample_norm_laplace(10**18, scale=1.0, rng=rng)
    with pytest.raises(InvalidParameterError, match="small enough"):
        naive_median_release([0.0, 1.0], epsilon=1.0, rng=rng, size=10**18)
