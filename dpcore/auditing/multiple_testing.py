"""Family-wise error control for several audit tests: Holm's step-down procedure.

An audit that runs k tests (one per mechanism, per threshold, per seed, ...) and reports every
test that rejected must pay for the k chances of a false alarm. Holm (1979), "A simple
sequentially rejective multiple test procedure", Scand. J. Statist. 6(2), 65-70, controls the
family-wise error rate (the probability of rejecting at least one true null hypothesis) at the
chosen level under *any* dependence between the tests, and rejects every hypothesis Bonferroni
rejects, and often more.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from dpcore.errors import InvalidParameterError

__all__ = ["holm", "holm_adjusted"]


def _check_level(level: object) -> float:
    if isinstance(level, bool) or not isinstance(level, numbers.Real):
        raise InvalidParameterError("level", "to be a number in (0, 1)", level)
    result = float(level)
    if not 0 < result < 1:  # also refuses NaN
        raise InvalidParameterError("level", "in (0, 1)", level)
    return result


def _check_p_values(p_values: object) -> np.ndarray:
    """The p-values as a 1-D float array in [0, 1]; anything else raises."""
    if isinstance(p_values, (str, bytes)):
        raise InvalidParameterError("p_values", "to be a sequence of numbers in [0, 1]", p_values)
    try:
        values = np.asarray(p_values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidParameterError(
            "p_values", "to be a sequence of numbers in [0, 1]", p_values
        ) from None
    if values.ndim != 1:
        raise InvalidParameterError("p_values", "to be one-dimensional", p_values)
    if np.any(np.isnan(values)):
        raise InvalidParameterError("p_values", "to contain no NaN", p_values)
    if np.any(values < 0) or np.any(values > 1):
        raise InvalidParameterError("p_values", "in [0, 1]", p_values)
    return values


def holm_adjusted(p_values: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    """Holm-adjusted p-values, in the order given (Holm 1979; Wright 1992, Biometrics 48).

    With p_(1) <= ... <= p_(k) the sorted p-values, the adjusted value of the j-th smallest is
    max over i <= j of min(1, (k - i + 1) p_(i)). Hypothesis j is rejected by Holm's procedure
    at level alpha exactly when its adjusted p-value is <= alpha, so one adjusted list serves
    every level. Ties get equal adjusted values.

    Args:
        p_values: k p-values in [0, 1] (k >= 0); any dependence between the tests is allowed.

    Returns:
        The k adjusted p-values, each in [0, 1] and >= its raw p-value.

    Raises:
        InvalidParameterError: ``p_values`` is not one-dimensional, contains NaN or a value
            outside [0, 1], or is not numeric.

    >>> holm_adjusted([0.01, 0.04, 0.03])
    (0.03, 0.06, 0.06)
    """
    values = _check_p_values(p_values)
    k = values.size
    if k == 0:
        return ()
    order = np.argsort(values, kind="stable")
    multipliers = np.arange(k, 0, -1, dtype=float)  # k - i + 1 for i = 1..k
    stepped = np.maximum.accumulate(np.minimum(1.0, multipliers * values[order]))
    adjusted = np.empty(k)
    adjusted[order] = stepped
    return tuple(float(a) for a in adjusted)


def holm(p_values: Sequence[float] | np.ndarray, *, level: float) -> tuple[bool, ...]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise error ``level``.

    Holm 1979 (Sec. 3): sort the p-values p_(1) <= ... <= p_(k); find the first j with
    p_(j) > level / (k - j + 1); reject the hypotheses of p_(1), ..., p_(j-1) and keep the rest
    (reject all when there is no such j). The probability that any true null hypothesis is
    rejected is <= ``level`` whatever the dependence between the tests (Holm's Thm). The answer
    equals ``[a <= level for a in holm_adjusted(p_values)]``.

    Args:
        p_values: k p-values in [0, 1], each valid for its own null hypothesis.
        level: the family-wise error rate, in (0, 1).

    Returns:
        k booleans in the order given: True where the hypothesis is rejected.

    Raises:
        InvalidParameterError: ``level`` is not in (0, 1), or ``p_values`` is not a
            one-dimensional sequence of numbers in [0, 1] (NaN included).

    >>> holm([0.01, 0.04, 0.03], level=0.05)
    (True, False, False)
    """
    level = _check_level(level)
    values = _check_p_values(p_values)
    k = values.size
    rejected = np.zeros(k, dtype=bool)
    order = np.argsort(values, kind="stable")
    for step, index in enumerate(order):
        if values[index] > level / (k - step):
            break
        rejected[index] = True
    return tuple(bool(r) for r in rejected)
