"""Objective perturbation: CMS Alg. 2's epsilon split, the released noise's law, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.erm.losses import HuberLoss, LogisticLoss
from dpcore.erm.objective import gradient, minimise
from dpcore.erm.objective_perturbation import objective_perturbation, objective_perturbation_plan
from dpcore.errors import InvalidParameterError
from tests.erm.test_noise import check_norm_laplace_law
from tests.erm.test_objective import make_data


def test_plan_without_extra_regularisation() -> None:
    plan = objective_perturbation_plan(epsilon=2.0, n=500, regularisation=0.01, smoothness=0.25)
    ratio = 0.25 / (500 * 0.01)
    assert plan.noise_epsilon == pytest.approx(2.0 - math.log(1 + 2 * ratio + ratio**2))
    assert plan.extra_regularisation == 0.0
    assert plan.noise_scale == pytest.approx(2 / plan.noise_epsilon)


def test_plan_with_extra_regularisation() -> None:
    plan = objective_perturbation_plan(epsilon=0.5, n=10, regularisation=1e-3, smoothness=1.0)
    assert plan.noise_epsilon == 0.25
    assert plan.extra_regularisation == pytest.approx(1.0 / (10 * math.expm1(0.125)) - 1e-3)
    # The total regularisation then makes the Jacobian term fit in epsilon/2: CMS Thm 9's proof.
    mu = 1e-3 + plan.extra_regularisation
    assert 2 * math.log1p(1.0 / (10 * mu)) <= 0.5 + 1e-12


def test_released_model_solves_the_perturbed_objective_with_the_right_noise_law() -> None:
    # b = -n * grad(J + (Delta/2)||w||^2)(w_released): recover the noise and test its law.
    x, y = make_data(n=25, d=3)
    loss, lam = HuberLoss(h=0.5), 0.02
    rng = np.random.default_rng(11)
    models = [
        objective_perturbation(x, y, loss=loss, regularisation=lam, epsilon=1.0, rng=rng)
        for _ in range(500)
    ]
    mu = lam + models[0].extra_regularisation
    noise = np.array(
        [
            -25 * gradient(m.weights, features=x, labels=y, loss=loss, regularisation=mu)
            for m in models
        ]
    )
    check_norm_laplace_law(noise, scale=models[0].noise_scale)


def test_no_noise_limit_is_the_non_private_optimum() -> None:
    x, y = make_data(n=200, d=2)
    model = objective_perturbation(
        x, y, loss=LogisticLoss(), regularisation=0.1, epsilon=1e6, rng=np.random.default_rng(0)
    )
    optimum = minimise(x, y, loss=LogisticLoss(), regularisation=0.1)
    assert np.linalg.norm(model.weights - optimum) < 1e-3


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"regularisation": 0.0}, "Expected regularisation > 0"),
        ({"regularisation": -0.1}, "Expected regularisation > 0"),
        ({"epsilon": 0.0}, "Expected epsilon > 0"),
    ],
)
def test_bad_parameters(options: dict[str, float], match: str) -> None:
    x, y = make_data()
    arguments: dict[str, float] = {"regularisation": 0.1, "epsilon": 1.0, **options}
    with pytest.raises(InvalidParameterError, match=match):
        objective_perturbation(x, y, loss=LogisticLoss(), rng=np.random.default_rng(0), **arguments)


def test_rows_outside_the_unit_ball_are_rejected() -> None:
    x, y = make_data()
    x[3] = [1.0, 1.0, 0.0]
    with pytest.raises(InvalidParameterError, match=r"features\[3\]"):
        objective_perturbation(
            x, y, loss=LogisticLoss(), regularisation=0.1, epsilon=1.0, rng=np.random.default_rng(0)
        )
