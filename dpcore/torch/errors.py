"""Errors specific to DP training (defined in :mod:`dpcore.errors`, shared with dpcore.tf)."""

from __future__ import annotations

from dpcore.errors import (
    EngineFallbackWarning,
    ExamplesInteractError,
    IncompatibleModelError,
    NonFiniteGradientError,
)

__all__ = [
    "EngineFallbackWarning",
    "ExamplesInteractError",
    "IncompatibleModelError",
    "NonFiniteGradientError",
]
