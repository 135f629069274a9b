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

__all__ = ["DEFAULT_ACCOUNTANT", "calibrate_noise"]

#: The accountant behind every epsilon the library prints or calibrates with unless another is
#: asked for: the PLD accountant's certified upper bound (tighter than RDP, never below the truth).
DEFAULT_ACCOUNTANT = "pld"

#: The largest noise multiplier tried; a target missed even there is reported as unreachable.
MAX_NOISE_MULTIPLIER = 1e6
# Below this sigma the search stops going down (the answer still meets the target).
_MIN_NOISE_MULTIPLIER = 1e-4
#: Range of ``tolerance``. Below 1e-12 the bracket's ratio 1 + tolerance approaches the spacing
#: of floats (1 + 2.2e-16 == 1), where the geometric midpoint stops moving and bisection never
#: ends; at 1 or more the first bracket (a factor 2) already qualifies.
MIN_TOLERANCE, MAX_TOLERANCE = 1e-12, 1.0
#: Most bisection steps: from a factor 2 down to 1 + 1e-12 takes 46 (the bracket's log halves
#: each step); the doubling and halving before it stop at 1e6 and 1e-4 by construction.
MAX_BISECTIONS = 100


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
    accountant: str = DEFAULT_ACCOUNTANT,
    accountant_options: Mapping[str, Any] | None = None,
    tolerance: float = 0.01,
) -> float:
    """Smallest sigma (within ``tolerance``) such that DP-SGD(q, sigma, T) is (eps, delta)-DP.

    Args:
        target_epsilon: epsilon > 0 to meet.
        target_delta: delta in (0, 1).
        sampling_probability: Poisson rate q in [0, 1].
        steps: T >= 0.
        accountant: name of a registered accountant (``pld``, the default: its certified upper
            bound, as everywhere in the library; ``rdp``, ``moments``, ``basic``,
            ``advanced``, ``gdp_clt``).
        accountant_options: keyword arguments for the accountant's constructor.
        tolerance: relative width of the final bracket, in [1e-12, 1] (default 1%).

    Returns:
        sigma, which always meets the target under the accountant and is at most
        (1 + tolerance) times the smallest sigma that does. When nothing private runs
        (q = 0 or T = 0) every sigma works, including no noise: 0.0 is returned. If even
        sigma = 1e-4 meets the target (an enormous epsilon), the search stops there.

    Raises:
        InvalidParameterError: on bad input (naming the parameter), when even
            sigma = 1e6 misses the target (naming ``target_epsilon``), or when the search
            does not settle within :data:`MAX_BISECTIONS` steps (naming ``tolerance``; it
            cannot happen for tolerance >= 1e-12, so no input makes the search hang).

    Example:
        >>> sigma = calibrate_noise(target_epsilon=2.0, target_delta=1e-5,
        ...                         sampling_probability=0.01, steps=1000)
        >>> 0.95 < sigma < 0.97
        True
    """
    epsilon = check_positive("target_epsilon", target_epsilon)
    delta = check_delta("target_delta", target_delta)
    q = check_probability("sampling_probability", sampling_probability)
    count = check_count("steps", steps)
    tolerance = check_positive("tolerance", tolerance)
    if not MIN_TOLERANCE <= tolerance <= MAX_TOLERANCE:
        raise InvalidParameterError(
            "tolerance", f"in [{MIN_TOLERANCE:g}, {MAX_TOLERANCE:g}]", tolerance
        )
    if not isinstance(accountant, str):
        raise InvalidParameterError("accountant", "to be an accountant name (a str)", accountant)
    cls = accountant_class(accountant)
    if accountant_options is not None and not (
        isinstance(accountant_options, Mapping)
        and all(isinstance(key, str) for key in accountant_options)
    ):
        raise InvalidParameterError(
            "accountant_options",
            "a mapping of keyword names to values, or None",
            accountant_options,
        )
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
    for _ in range(MAX_BISECTIONS):
        if high / low <= 1 + tolerance:
            break
        middle = math.sqrt(low * high)
        if meets(middle):
            high = middle
        else:
            low = middle
    if high / low > 1 + tolerance:  # pragma: no cover - 46 steps suffice from tolerance >= 1e-12
        raise InvalidParameterError(
            "tolerance",
            f"reachable within {MAX_BISECTIONS} bisection steps of the {accountant} accountant "
            f"(the bracket stopped at [{low!r}, {high!r}])",
            tolerance,
        )
    if not meets(high):  # pragma: no cover - accountants are deterministic; a defect otherwise
        raise ArithmeticError(f"calibrate_noise: sigma = {high!r} no longer meets the target.")
    return high
