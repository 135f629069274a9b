"""Validators for privacy parameters.

Each returns the value (converted to the canonical Python type) or raises
:class:`~dpcore.errors.InvalidParameterError` naming the parameter, the constraint and the value.
``bool`` is rejected wherever a number is expected: ``True`` is not a noise multiplier.
"""

from __future__ import annotations

import math
import numbers

from dpcore.errors import InvalidParameterError, ResourceLimitError


def _real(name: str, value: object, constraint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(name, f"to be a real number {constraint}", value)
    result = float(value)
    if math.isnan(result):
        raise InvalidParameterError(name, constraint, value)
    return result


def check_positive(name: str, value: object, *, allow_infinity: bool = False) -> float:
    """A real number > 0 (finite unless ``allow_infinity``)."""
    result = _real(name, value, "> 0")
    if result <= 0 or (math.isinf(result) and not allow_infinity):
        bound = "> 0" if allow_infinity else "> 0 and finite"
        raise InvalidParameterError(name, bound, value)
    return result


def check_non_negative(name: str, value: object, *, allow_infinity: bool = False) -> float:
    """A real number >= 0 (finite unless ``allow_infinity``)."""
    result = _real(name, value, ">= 0")
    if result < 0 or (math.isinf(result) and not allow_infinity):
        bound = ">= 0" if allow_infinity else ">= 0 and finite"
        raise InvalidParameterError(name, bound, value)
    return result


def check_probability(name: str, value: object) -> float:
    """A probability in the closed interval [0, 1]."""
    result = _real(name, value, "in [0, 1]")
    if not 0.0 <= result <= 1.0:
        raise InvalidParameterError(name, "in [0, 1]", value)
    return result


def check_delta(name: str, value: object) -> float:
    """A failure probability delta in the open interval (0, 1)."""
    result = _real(name, value, "in (0, 1)")
    if not 0.0 < result < 1.0:
        raise InvalidParameterError(name, "in (0, 1)", value)
    return result


def check_delta_closed(name: str, value: object) -> float:
    """A delta of an (epsilon, delta) event, allowed in [0, 1)."""
    result = _real(name, value, "in [0, 1)")
    if not 0.0 <= result < 1.0:
        raise InvalidParameterError(name, "in [0, 1)", value)
    return result


def check_count(name: str, value: object, *, minimum: int = 0) -> int:
    """An integer >= ``minimum``; integral floats such as ``3.0`` are refused too."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(name, f"to be an integer >= {minimum}", value)
    result = int(value)
    if result < minimum:
        raise InvalidParameterError(name, f">= {minimum}", value)
    return result


#: Seeds are integers in [0, SEED_LIMIT): torch's generators take a signed 64-bit seed.
SEED_LIMIT = 2**63


def check_seed(name: str, value: object) -> int:
    """A seed for a torch generator: an integer in [0, 2**63) (the samplers' rule too)."""
    result = check_count(name, value)
    if result >= SEED_LIMIT:
        raise InvalidParameterError(name, "< 2**63", value)
    return result


def check_epsilon(name: str, value: object) -> float:
    """A privacy parameter epsilon >= 0 (finite)."""
    return check_non_negative(name, value)


#: Largest array a single call may allocate, in bytes (checked before allocating).
MEMORY_LIMIT_BYTES = 2 * 1024**3


def _bytes_text(size: float) -> str:
    for unit, scale in (("EiB", 1024**6), ("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if math.isfinite(size) else "unbounded memory"
    return f"{size / 1024**2:.3g} MiB"


def check_allocation(
    name: str, value: object, *, elements: float, item_bytes: int = 8, larger: bool = False
) -> None:
    """Refuse, before allocating, an array of ``elements`` items that ``value`` would need.

    ``elements`` may be a float (even inf) computed from the parameters; anything above
    :data:`MEMORY_LIMIT_BYTES` raises :class:`~dpcore.errors.ResourceLimitError` naming ``name``
    (``larger=True`` for parameters such as a grid spacing whose *growth* shrinks the array).

    >>> check_allocation("count", 10**18, elements=10**18)
    Traceback (most recent call last):
    ...
    dpcore.errors.ResourceLimitError: Expected count small enough for 2 GiB (needs 6.94 EiB)...
    """
    needed = float(elements) * item_bytes
    if not needed <= MEMORY_LIMIT_BYTES:
        limit = _bytes_text(MEMORY_LIMIT_BYTES)
        way = "large" if larger else "small"
        raise ResourceLimitError(
            name, f"{way} enough for {limit} (needs {_bytes_text(needed)})", value
        )
