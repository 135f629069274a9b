"""Shared checks for the tradeoff-function tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dpcore.tradeoff import TradeoffFunction

#: Evaluation grid for validity checks.
GRID = np.linspace(0.0, 1.0, 801)


def check_tradeoff_function(f: TradeoffFunction) -> None:
    """Convex, non-increasing, within [0, 1 - alpha] (Dong, Roth, Su 2019, Prop. 2.2)."""
    beta = f(GRID)
    assert np.all(beta >= 0)
    assert np.all(beta <= 1 - GRID + 1e-12)
    assert np.all(np.diff(beta) <= 1e-12)
    assert np.all(np.diff(beta, 2) >= -1e-9)


@pytest.fixture(scope="session")
def assert_tradeoff_function() -> Callable[[TradeoffFunction], None]:
    """The validity check, for tests in this folder."""
    return check_tradeoff_function
