"""Input checks and the solver."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.erm.losses import HuberLoss, LogisticLoss
from dpcore.erm.objective import check_dataset, gradient, minimise, scale_rows
from dpcore.errors import InvalidParameterError


def make_data(n: int = 40, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = scale_rows(rng.normal(size=(n, d)))
    y = np.where(x @ np.arange(1.0, d + 1) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return x, y


def test_rows_outside_the_unit_ball_are_rejected_by_index() -> None:
    x, y = make_data()
    x[7] *= 1.5
    with pytest.raises(InvalidParameterError, match=r"Expected \|\|features\[7\]\|\| <= 1"):
        check_dataset(x, y)
    check_dataset(scale_rows(x), y)  # scaling fixes it


@pytest.mark.parametrize(
    ("features", "labels", "match"),
    [
        (np.zeros((3, 2)), np.array([1.0, 0.0, 1.0]), "labels to be -1 or \\+1"),
        (np.zeros((3, 2)), np.ones(2), "labels to have shape \\(3,\\)"),
        (np.zeros(3), np.ones(3), "features to be a non-empty 2-D array"),
        (np.full((2, 2), np.nan), np.ones(2), "features to be finite"),
    ],
)
def test_bad_data(features: np.ndarray, labels: np.ndarray, match: str) -> None:
    with pytest.raises(InvalidParameterError, match=match):
        check_dataset(features, labels)


@pytest.mark.parametrize("loss", [LogisticLoss(), HuberLoss(h=0.5)], ids=lambda loss: loss.name)
def test_minimiser_is_stationary(loss: LogisticLoss | HuberLoss) -> None:
    x, y = make_data()
    w = minimise(x, y, loss=loss, regularisation=1e-3)
    g = gradient(w, features=x, labels=y, loss=loss, regularisation=1e-3)
    assert np.linalg.norm(g) <= 1e-9


def test_solver_requires_strong_convexity() -> None:
    x, y = make_data()
    with pytest.raises(InvalidParameterError, match="Expected regularisation > 0"):
        minimise(x, y, loss=LogisticLoss(), regularisation=0.0)
