"""Noise calibration: the smallest noise multiplier meeting a target (epsilon, delta).

Bisection on log(sigma) with the named accountant as the oracle: sigma is acceptable when
``dpsgd_event(q, sigma, T)`` composed into a fresh accountant gives ``get_epsilon(delta) <=
target_epsilon``. The upper end of the bracket is always acceptable and is what is returned, so
the answer never overshoots the budget; the bracket is narrowed until high / low <= 1 +
``tolerance``, so the answer is within ``tolerance`` (relative) of the smallest acceptable sigma
(the accountants' epsilon is non-increasing in sigma). For the PLD accountant ``get_epsilon`` is
its certified upper bound; for ``gdp_clt`` the answer inherits the CLT's approximation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from dpcore.accountants.base import PrivacyAccountant, accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.validation import check_count, check_delta, check_positive, check_probability

__all__ = ["calibrate_noise"]

#: The largest noise multiplier tried; a target missed even there is reported as unreachable.
MAX_NOISE_MULTIPLIER = 1e6
# Below this sigma the search stops going down (the answer still meets the target).
_MIN_NOISE_MULTIPLIER = 1e-4


def _make_accountant(
    cls: type[PrivacyAccountant], options: Mapping[str, Any], name: str
) -> PrivacyAccountant:
    try:
        return cls(**options)
    except TypeError as error:
        raise InvalidParameterError(
            "accountant_options", f"valid keyword arguments for the {name} accountant", options
        ) from error


def calibrate_noise(
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    steps: int,
    accountant: str = "rdp",
    accountant_options: Mapping[str, Any] | None = None,
    tolerance: float = 0.01,
) -> float:
    """Smallest sigma (within ``tolerance``) such that DP-SGD(q, sigma, T) is (eps, delta)-DP.

    Args:
        target_epsilon: epsilon > 0 to meet.
        target_delta: delta in (0, 1).
        sampling_probability: Poisson rate q in [0, 1].
        steps: T >= 0.
        accountant: name of a registered accountant (``rdp``, ``pld``, ``moments``,
            ``basic``, ``advanced``, ``gdp_clt``).
        accountant_options: keyword arguments for the accountant's constructor.
        tolerance: relative width of the final bracket (default 1%).

    Returns:
        sigma, which always meets the target under the accountant and is at most
        (1 + tolerance) times the smallest sigma that does. When nothing private runs
        (q = 0 or T = 0) every sigma works, including no noise: 0.0 is returned. If even
        sigma = 1e-4 meets the target (an enormous epsilon), the search stops there.

    Raises:
        InvalidParameterError: on bad input (naming the parameter), or when even
            sigma = 1e6 misses the target (naming ``target_epsilon``).

    Example:
        >>> sigma = calibrate_noise(target_epsilon=2.0, target_delta=1e-5,
        ...                         sampling_probability=0.01, steps=1000)
        >>> 1.0 < sigma < 1.1
        True
    """
    epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_delta("target_delta", target_delta)
    q = check_probability("sampling_probability", sampling_probability)
    count = check_count("steps", steps)
    tolerance = check_positive("tolerance", tolerance)
    cls = accountant_class(accountant)
    options = dict(accountant_options or {})
    _make_accountant(cls, options, accountant)  # bad options fail now, not mid-search
    if q == 0 or count == 0:
        return 0.0

    def meets(sigma: float) -> bool:
        event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=count)
        with warnings.catch_warnings():
            # At the grid's edge the RDP answer is still a valid (if looser) upper bound.
            warnings.simplefilter("ignore", OrderGridEdgeWarning)
            spent = _make_accountant(cls, options, accountant).compose(event).get_epsilon(delta)
        return bool(spent <= epsilon)

    # Bracket: `high` meets the target, `low` does not (or is below the search floor).
    high = 1.0
    while not meets(high):
        if high >= MAX_NOISE_MULTIPLIER:
            raise InvalidParameterError(
                "target_epsilon",
                f"reachable with noise_multiplier <= {MAX_NOISE_MULTIPLIER:g} under the "
                f"{accountant} accountant (delta = {delta:g}, q = {q:g}, steps = {count})",
                target_epsilon,
            )
        high = min(2 * high, MAX_NOISE_MULTIPLIER)
    low = high / 2
    while meets(low):
        high, low = low, low / 2
        if low < _MIN_NOISE_MULTIPLIER:
            return high
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        if meets(middle):
            high = middle
        else:
            low = middle
    if not meets(high):  # pragma: no cover - accountants are deterministic; a defect otherwise
        raise ArithmeticError(f"calibrate_noise: sigma = {high!r} no longer meets the target.")
    return high
