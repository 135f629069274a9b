"""``torch.func.functional_call`` that leaves the model as it found it.

PyTorch 2.13's ``functional_call`` does not restore a model in which one module is reachable by
two paths (``self.block = nn.Sequential(self.shared, ...)``): afterwards the module's parameter
slots hold the plain tensors that were passed in, so the optimizer's parameters are no longer the
model's and the next forward silently uses detached copies. :func:`functional_call_restoring`
puts every parameter and buffer object back after the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.func import functional_call

__all__ = ["functional_call_restoring", "restoring_state"]


@contextlib.contextmanager
def restoring_state(model: nn.Module) -> Iterator[None]:
    """Put back every module's own parameter and buffer objects on exit."""
    saved: list[tuple[dict[str, Any], str, Any]] = [
        (slots, name, value)
        for module in model.modules()
        for slots in (module._parameters, module._buffers)
        for name, value in list(slots.items())
    ]
    try:
        yield
    finally:
        for slots, name, value in saved:  # slots: a dict, or a scripted module's wrapper
            if name not in slots or slots[name] is not value:
                slots[name] = value


def functional_call_restoring(
    model: nn.Module, tensors: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Any:
    """``functional_call(model, tensors, args, kwargs)``; the model's state restored after."""
    with restoring_state(model):
        return functional_call(model, tensors, args, kwargs)
