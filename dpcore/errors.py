"""Typed errors raised by dpcore.

Every error raised on user input names the parameter, the constraint it violates and the value
received, so that a failing call can be fixed from its message alone.
"""

from __future__ import annotations


class DPCoreError(Exception):
    """Base class of every error dpcore raises on purpose."""


class InvalidParameterError(DPCoreError, ValueError):
    """A parameter is outside the range where the mathematics is defined.

    Example:
        >>> raise InvalidParameterError("noise_multiplier", "> 0", -1.0)
        Traceback (most recent call last):
        ...
        dpcore.errors.InvalidParameterError: Expected noise_multiplier > 0, got -1.0.
    """

    def __init__(self, parameter: str, constraint: str, value: object) -> None:
        self.parameter = parameter
        self.constraint = constraint
        self.value = value
        super().__init__(f"Expected {parameter} {constraint}, got {value!r}.")


class UnsupportedEventError(DPCoreError, TypeError):
    """An accountant was asked to compose an event it cannot analyse.

    The message names the event and the accountant, so nothing is skipped silently.
    """

    def __init__(self, accountant: str, event: object, reason: str = "") -> None:
        self.accountant = accountant
        self.event = event
        detail = f": {reason}" if reason else ""
        super().__init__(f"{accountant} does not support the event {event!r}{detail}.")


class StateError(DPCoreError, ValueError):
    """Saved accountant state is malformed or belongs to another accountant."""


class ResourceLimitError(InvalidParameterError):
    """A computation the parameters ask for would exceed the memory (or time) it may use.

    Raised *before* anything is allocated, naming the parameter that drives the size.

    Example:
        >>> raise ResourceLimitError("steps", "below 2**27 points", 10**9)
        Traceback (most recent call last):
        ...
        dpcore.errors.ResourceLimitError: Expected steps below 2**27 points, got 1000000000.
    """


class IncompatibleModelError(DPCoreError, TypeError):
    """The model has a layer that mixes examples (e.g. BatchNorm) or that an engine cannot clip.

    The message names the layer (module path) and what to use instead. Raised by the torch
    and TensorFlow trainers alike.
    """


class ExamplesInteractError(IncompatibleModelError):
    """One example's loss depends on other examples of the lot: no engine can clip such a model."""


class NonFiniteGradientError(DPCoreError, FloatingPointError):
    """A per-example gradient (or its norm) is NaN or infinite.

    Clipping cannot bound a NaN: ``min(1, C / nan)`` is NaN and poisons the whole sum. The
    engines raise this by default; ``nonfinite="zero"`` drops such examples instead, which is
    privacy-safe (a dropped example contributes 0, within the sensitivity C).
    """


class EngineFallbackWarning(UserWarning):
    """``engine="auto"`` could not use the fast path for a model and trains it with ``vmap``.

    The message names the parameter that forced the choice; the result is exact either way,
    only slower.
    """
