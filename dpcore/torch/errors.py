"""Errors specific to DP training."""

from __future__ import annotations

from dpcore.errors import DPCoreError


class IncompatibleModelError(DPCoreError, TypeError):
    """The model has a layer that mixes examples (e.g. BatchNorm) or that an engine cannot clip.

    The message names the module path and what to use instead.
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
