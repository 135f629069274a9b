"""Errors specific to DP training (defined in :mod:`dpcore.errors`, shared with dpcore.tf)."""

from __future__ import annotations

from dpcore.errors import (
    EngineFallbackWarning,
    ExamplesInteractError,
    IncompatibleModelError,
    InvalidParameterError,
    NonFiniteGradientError,
)

__all__ = [
    "EngineFallbackWarning",
    "ExamplesInteractError",
    "IncompatibleModelError",
    "LoopUsageError",
    "NonFiniteGradientError",
]


class LoopUsageError(InvalidParameterError, TypeError):
    """A training-loop habit of Opacus or plain torch that dpcore spells differently.

    E.g. ``for x, y in loader`` over micro-batches, or ``optimizer.step()`` without one; the
    message gives the dpcore form in one line. Raised before anything changes.
    """
