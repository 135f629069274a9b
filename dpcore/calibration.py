"""Noise calibration: the smallest noise multiplier meeting a target (epsilon, delta).

Bisection on log(sigma) with the named accountant as the oracle. The upper end of the bracket
always meets the target, and it is what is returned, so the answer never overshoots the
privacy budget; the bracket is narrowed until it is within ``tolerance`` (relative) of the
smallest such sigma. For the PLD accountant its certified upper bound is used.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from dpcore.accountants.base import accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.validation import check_count, check_delta, check_positive, check_probability

__all__ = ["calibrate_noise"]

_MAX_SIGMA = 1e6
_MIN_SIGMA = 1e-4


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
        accountant: name of the accountant (``rdp``, ``pld``, ``moments``, ...).
        accountant_options: keyword arguments for the accountant's constructor.
        tolerance: relative width of the final bracket (default 1%).

    Returns:
        sigma; 0.0 when nothing private runs (q = 0 or T = 0), where any sigma works.

    Raises:
        InvalidParameterError: on bad input, or if even sigma = 1e6 misses the target.

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
    if q == 0 or count == 0:
        return 0.0

    def meets(sigma: float) -> bool:
        event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=count)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderGridEdgeWarning)
            return bool(cls(**options).compose(event).get_epsilon(delta) <= epsilon)

    high = 1.0
    while not meets(high):
        high *= 2
        if high > _MAX_SIGMA:
            raise InvalidParameterError(
                "target_epsilon",
                f"reachable with noise_multiplier <= {_MAX_SIGMA:g} under {accountant}",
                target_epsilon,
            )
    low = high / 2
    while meets(low):
        high, low = low, low / 2
        if low < _MIN_SIGMA:
            return high
    while high / low > 1 + tolerance:
        middle = math.sqrt(low * high)
        if meets(middle):
            high = middle
        else:
            low = middle
    return high
