"""Gaussian objective perturbation (KST 2012): calibration, the released noise's law, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpcore.erm.losses import LogisticLoss
from dpcore.erm.objective import gradient
from dpcore.erm.objective_perturbation_gaussian import (
    gaussian_objective_noise,
    objective_perturbation_gaussian,
)
from dpcore.errors import InvalidParameterError
from tests.erm.test_objective import make_data

FALSE_REJECTION = 1e-5


def test_noise_scale_is_kst_line_5() -> None:
    """sigma^2 = zeta^2 (8 log(2/delta) + 4 eps) / eps^2 (KST 2012, Alg. 1, line 5)."""
    sigma = gaussian_objective_noise(epsilon=0.5, delta=1e-6, lipschitz=2.0)
    assert sigma**2 == pytest.approx(4.0 * (8 * math.log(2e6) + 2.0) / 0.25, rel=1e-12)


def test_released_model_hides_gaussian_noise_of_the_stated_scale() -> None:
    """b = -n grad(J_mu)(w): each coordinate ~ N(0, sigma^2); KS test at 1e-5 per coordinate
    (Bonferroni over 3) and the extra regularisation is 2c/(eps n) (KST Thm 2's Delta / n)."""
    x, y = make_data(n=30, d=3)
    loss, lam, epsilon = LogisticLoss(), 0.05, 2.0
    rng = np.random.default_rng(3)
    models = [
        objective_perturbation_gaussian(
            x, y, loss=loss, regularisation=lam, epsilon=epsilon, delta=1e-5, rng=rng
        )
        for _ in range(400)
    ]
    extra = models[0].extra_regularisation
    assert extra == pytest.approx(2 * 0.25 / (epsilon * 30))
    noise = np.array(
        [
            -30 * gradient(m.weights, features=x, labels=y, loss=loss, regularisation=lam + extra)
            for m in models
        ]
    )
    sigma = models[0].noise_scale
    for column in noise.T:
        assert stats.kstest(column / sigma, "norm").pvalue > FALSE_REJECTION / 3


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"regularisation": 0.0}, "regularisation"),
    ],
)
def test_bad_input(kwargs: dict[str, float], parameter: str) -> None:
    x, y = make_data(n=10, d=2)
    options = {"regularisation": 0.1, "epsilon": 1.0, "delta": 1e-5} | kwargs
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        objective_perturbation_gaussian(
            x, y, loss=LogisticLoss(), rng=np.random.default_rng(0), **options
        )


def test_rows_outside_the_unit_ball_are_rejected() -> None:
    x, y = make_data(n=10, d=2)
    x[4] *= 3.0
    with pytest.raises(InvalidParameterError, match="4"):
        objective_perturbation_gaussian(
            x,
            y,
            loss=LogisticLoss(),
            regularisation=0.1,
            epsilon=1.0,
            delta=1e-5,
            rng=np.random.default_rng(0),
        )
