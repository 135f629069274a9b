"""Output perturbation: the sensitivity bound holds empirically; the released noise has its law."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.erm.losses import HuberLoss, LogisticLoss, MarginLoss
from dpcore.erm.objective import minimise, scale_rows
from dpcore.erm.output_perturbation import minimiser_sensitivity, output_perturbation
from dpcore.errors import InvalidParameterError
from tests.erm.test_noise import check_norm_laplace_law
from tests.erm.test_objective import make_data


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 25),
    d=st.integers(1, 4),
    regularisation=st.floats(1e-2, 1.0),
    seed=st.integers(0, 2**16),
    huber=st.booleans(),
)
def test_sensitivity_bound_holds_on_neighbouring_datasets(
    n: int, d: int, regularisation: float, seed: int, huber: bool
) -> None:
    rng = np.random.default_rng(seed)
    loss: MarginLoss = HuberLoss(h=0.3) if huber else LogisticLoss()
    x = scale_rows(rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0))
    y = rng.choice([-1.0, 1.0], size=n)
    x2, y2 = x.copy(), y.copy()
    # The neighbour replaces one row by a worst-looking one: a unit vector with the other label.
    x2[0] = rng.normal(size=d)
    x2[0] /= np.linalg.norm(x2[0])
    y2[0] = -y[0]
    w = minimise(x, y, loss=loss, regularisation=regularisation)
    w2 = minimise(x2, y2, loss=loss, regularisation=regularisation)
    bound = minimiser_sensitivity(n=n, regularisation=regularisation)
    # Solver error is <= 1e-9 / lambda per minimiser.
    assert np.linalg.norm(w - w2) <= bound + 2e-9 / regularisation


def test_released_noise_has_the_norm_laplace_law() -> None:
    x, y = make_data(n=30, d=3)
    loss, lam, eps = LogisticLoss(), 0.05, 2.0
    optimum = minimise(x, y, loss=loss, regularisation=lam)
    rng = np.random.default_rng(5)
    draws = np.array(
        [
            output_perturbation(x, y, loss=loss, regularisation=lam, epsilon=eps, rng=rng).weights
            for _ in range(500)
        ]
    )
    check_norm_laplace_law(draws - optimum, scale=2 / (30 * lam * eps))


def test_gaussian_variant_has_the_calibrated_law() -> None:
    from scipy import stats

    x, y = make_data(n=30, d=2)
    loss, lam = LogisticLoss(), 0.1
    optimum = minimise(x, y, loss=loss, regularisation=lam)
    rng = np.random.default_rng(6)
    models = [
        output_perturbation(x, y, loss=loss, regularisation=lam, epsilon=1.0, delta=1e-5, rng=rng)
        for _ in range(250)
    ]
    sigma = models[0].noise_scale
    noise = np.array([m.weights for m in models]) - optimum
    assert stats.kstest(noise.ravel() / sigma, stats.norm.cdf).pvalue > 1e-5
    assert models[0].delta == 1e-5 and models[0].mechanism == "output_perturbation_gaussian"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"regularisation": 0.0}, "Expected regularisation > 0"),
        ({"epsilon": 0.0}, "Expected epsilon > 0"),
        ({"epsilon": -1.0}, "Expected epsilon > 0"),
        ({"delta": 0.0}, r"Expected delta in \(0, 1\)"),
        ({"delta": 1.5}, r"Expected delta in \(0, 1\)"),
    ],
)
def test_bad_parameters(options: dict[str, float], match: str) -> None:
    x, y = make_data()
    arguments: dict[str, float] = {"regularisation": 0.1, "epsilon": 1.0, **options}
    with pytest.raises(InvalidParameterError, match=match):
        output_perturbation(x, y, loss=LogisticLoss(), rng=np.random.default_rng(0), **arguments)
