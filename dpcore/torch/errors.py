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
    "NoExactEngineError",
    "NonFiniteGradientError",
]


class LoopUsageError(InvalidParameterError, TypeError):
    """A training-loop habit of Opacus or plain torch that dpcore spells differently.

    E.g. ``for x, y in loader`` over micro-batches, or ``optimizer.step()`` without one; the
    message gives the dpcore form in one line. Raised before anything changes.
    """


class NoExactEngineError(IncompatibleModelError):
    """``engine="auto"`` found no exact engine for the model: each one refused it.

    The message lists every engine's reason, one a line.

    Attributes:
        reasons: by engine name (``"fast"``, ``"vmap"``, ``"loop"``), the message of its refusal.
        parameters: the parameters the fast path named (empty if it named none).
    """

    def __init__(self, reasons: dict[str, str], parameters: list[str] | None = None) -> None:
        self.reasons = dict(reasons)
        self.parameters = list(parameters or [])
        lines = "\n".join(f"- {name}: {reason}" for name, reason in self.reasons.items())
        super().__init__(f"No exact engine can train this model; each engine's reason:\n{lines}")

    def __reduce__(self) -> tuple[type[NoExactEngineError], tuple[dict[str, str], list[str]]]:
        return type(self), (self.reasons, self.parameters)
