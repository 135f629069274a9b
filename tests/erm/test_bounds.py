"""The excess-risk bounds hold on average on a small synthetic instance."""

from __future__ import annotations

import numpy as np

from dpcore.erm.bounds import objective_perturbation_excess_risk, output_perturbation_excess_risk
from dpcore.erm.losses import LogisticLoss
from dpcore.erm.objective import minimise, regularised_risk
from dpcore.erm.objective_perturbation import objective_perturbation
from dpcore.erm.output_perturbation import output_perturbation
from tests.erm.test_objective import make_data


def test_measured_excess_risk_is_below_the_bounds() -> None:
    x, y = make_data(n=100, d=3, seed=3)
    loss, lam, eps = LogisticLoss(), 0.05, 2.0
    optimum = minimise(x, y, loss=loss, regularisation=lam)
    floor = regularised_risk(optimum, features=x, labels=y, loss=loss, regularisation=lam)
    rng = np.random.default_rng(4)
    options = {"loss": loss, "regularisation": lam, "epsilon": eps, "rng": rng}

    def excess(weights: np.ndarray) -> float:
        return (
            regularised_risk(weights, features=x, labels=y, loss=loss, regularisation=lam) - floor
        )

    output = np.mean([excess(output_perturbation(x, y, **options).weights) for _ in range(200)])
    objective = np.mean(
        [excess(objective_perturbation(x, y, **options).weights) for _ in range(200)]
    )
    common = {"n": 100, "dimension": 3, "regularisation": lam, "epsilon": eps, "smoothness": 0.25}
    # The bounds are on expectations; the means of 200 draws are compared with them directly.
    assert 0 < output <= output_perturbation_excess_risk(**common)
    assert (
        0
        < objective
        <= objective_perturbation_excess_risk(**common, optimum_norm=float(np.linalg.norm(optimum)))
    )
