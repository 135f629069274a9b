"""The losses' constants: |ell'| <= L, 0 <= ell'' <= c, and derivatives match finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.erm.losses import HuberLoss, LogisticLoss, MarginLoss
from dpcore.errors import InvalidParameterError

LOSSES = [LogisticLoss(), HuberLoss(h=0.5), HuberLoss(h=0.1)]
GRID = np.linspace(-30.0, 30.0, 20_001)


@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: loss.name)
def test_constants_hold_on_a_grid(loss: MarginLoss) -> None:
    assert np.all(np.abs(loss.derivative(GRID)) <= loss.lipschitz + 1e-12)
    second = loss.second_derivative(GRID)
    assert np.all(second >= 0) and np.all(second <= loss.smoothness + 1e-12)
    assert np.max(second) > 0.99 * loss.smoothness  # the constant is attained: it is tight


@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: loss.name)
def test_derivative_matches_finite_differences(loss: MarginLoss) -> None:
    step = 1e-6
    numeric = (loss.value(GRID + step) - loss.value(GRID - step)) / (2 * step)
    assert np.allclose(numeric, loss.derivative(GRID), atol=1e-5)


def test_huber_matches_cms_equation_7() -> None:
    loss = HuberLoss(h=0.5)
    z = np.array([2.0, 1.5, 1.0, 0.5, 0.0])
    assert np.allclose(loss.value(z), [0.0, 0.0, 0.125, 0.5, 1.0])
    assert loss.smoothness == 1.0


def test_huber_rejects_bad_width() -> None:
    with pytest.raises(InvalidParameterError, match="Expected h > 0"):
        HuberLoss(h=0.0)
