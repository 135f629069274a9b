"""Holm's step-down procedure: hand-computed cases, FWER under the global null, edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.auditing.multiple_testing import holm, holm_adjusted
from dpcore.errors import InvalidParameterError


def test_hand_computed_example() -> None:
    # Sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, then 0.03 > 0.05/2 stops: two rejections.
    # Adjusted: 4*0.005 = 0.02, 3*0.01 = 0.03, max(0.03, 2*0.03) = 0.06, max(0.06, 1*0.04).
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p, level=0.05) == (True, False, False, True)
    assert holm_adjusted(p) == pytest.approx((0.03, 0.06, 0.06, 0.02))


def test_holm_rejects_where_bonferroni_does_not() -> None:
    # 0.01 <= 0.05/3, 0.02 <= 0.05/2, 0.03 <= 0.05: all three, Bonferroni (0.0167) only one.
    assert holm([0.03, 0.01, 0.02], level=0.05) == (True, True, True)
    assert holm([0.03, 0.01, 0.0251], level=0.05) == (False, True, False)


def test_rejection_is_adjusted_p_at_most_level() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = rng.uniform(0, 0.2, size=int(rng.integers(1, 12))) ** 2
        level = float(rng.uniform(0.001, 0.2))
        adjusted = holm_adjusted(p)
        assert holm(p, level=level) == tuple(a <= level for a in adjusted)
        assert all(a >= raw for a, raw in zip(adjusted, p, strict=True))


def test_family_wise_error_under_the_global_null() -> None:
    # k = 10 independent uniform p-values, all nulls true, 20000 seeded repetitions. Holm's
    # first step is Bonferroni's, so the exact FWER is 1 - (1 - 0.05/10)^10 = 0.04889; the
    # Monte Carlo standard error is 0.0015, the tolerance 0.006 (4 standard errors).
    level, k, reps = 0.05, 10, 20_000
    rng = np.random.default_rng(20240601)
    p = rng.uniform(size=(reps, k))
    false_alarms = sum(any(holm(row, level=level)) for row in p)
    fwer = false_alarms / reps
    exact = 1 - (1 - level / k) ** k
    assert fwer <= level + 0.006
    assert abs(fwer - exact) <= 0.006


def test_family_wise_error_with_some_false_nulls() -> None:
    # 5 true nulls (uniform) and 5 false ones (p ~ 1e-6): rejecting the false ones first frees
    # no budget for the true ones beyond level / 5 each, so P[any true null rejected]
    # = 1 - (1 - 0.05/5)^5 = 0.049 <= level (standard error 0.002, tolerance 0.008).
    level, reps = 0.05, 10_000
    rng = np.random.default_rng(7)
    errors = 0
    for _ in range(reps):
        p = np.concatenate([rng.uniform(size=5), np.full(5, 1e-6)])
        errors += any(holm(p, level=level)[:5])
    assert errors / reps <= level + 0.008


def test_monotone_in_level() -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(0, 0.1, size=20)
    previous = holm(p, level=0.001)
    for level in np.linspace(0.002, 0.5, 40):
        current = holm(p, level=float(level))
        assert all(c or not q for c, q in zip(current, previous, strict=True))  # superset
        previous = current
    assert any(previous) and not all(holm(p, level=0.001))


def test_edge_cases() -> None:
    assert holm([], level=0.05) == ()
    assert holm_adjusted([]) == ()
    assert holm([0.05], level=0.05) == (True,)
    assert holm([0.0500001], level=0.05) == (False,)
    assert holm([0.0, 1.0], level=0.01) == (True, False)
    assert holm_adjusted([0.0, 1.0]) == (0.0, 1.0)
    # Ties: 0.02 <= 0.04/2 and 0.02 <= 0.04 -> both; 0.03 > 0.05/2 -> neither.
    assert holm([0.02, 0.02], level=0.04) == (True, True)
    assert holm([0.03, 0.03], level=0.05) == (False, False)
    assert holm_adjusted([0.03, 0.03]) == (0.06, 0.06)
    assert holm(np.array([0.001, 0.9]), level=0.05) == (True, False)


@pytest.mark.parametrize(
    ("p_values", "level", "parameter"),
    [
        ([0.01, float("nan")], 0.05, "p_values"),
        ([0.01, 1.5], 0.05, "p_values"),
        ([-0.1], 0.05, "p_values"),
        ([[0.01, 0.02]], 0.05, "p_values"),
        (["a"], 0.05, "p_values"),
        ("0.01", 0.05, "p_values"),
        ([0.01], 0.0, "level"),
        ([0.01], 1.0, "level"),
        ([0.01], float("nan"), "level"),
        ([0.01], True, "level"),
        ([0.01], "0.05", "level"),
    ],
)
def test_bad_inputs(p_values: object, level: object, parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        holm(p_values, level=level)  # type: ignore[arg-type]
    if parameter == "p_values":
        with pytest.raises(InvalidParameterError, match="Expected p_values"):
            holm_adjusted(p_values)  # type: ignore[arg-type]
