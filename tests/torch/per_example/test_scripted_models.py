"""A TorchScript model (``torch.jit.script``): no engine can follow it, and the refusal is typed.

The fast path's hooks and data flow do not see inside a scripted module, and
``torch.func.functional_call`` refuses jitted modules; ``engine="auto"`` must then raise one
:class:`NoExactEngineError` (the vmap engine's own state restoring once raised a raw
``AttributeError`` on the scripted module's parameter container, hiding the reason).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import IncompatibleModelError, NoExactEngineError

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


def _scripted() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    with warnings.catch_warnings():  # deprecated in torch 2.13, still in use
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(model)  # type: ignore[no-any-return]


def _lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=generator), torch.tensor([0, 1, 2, 0, 1, 2])


def test_auto_refuses_a_scripted_model_with_one_typed_error() -> None:
    engine = make_engine(_scripted(), engine="auto", max_grad_norm=1.0)
    with pytest.raises(NoExactEngineError, match="Jitted") as caught:
        engine.prepare(*_lot(), CROSS_ENTROPY)
    assert set(caught.value.reasons) == {"fast", "vmap"}


def test_vmap_refuses_a_scripted_model_and_leaves_it_usable() -> None:
    model = _scripted()
    before = [p.detach().clone() for p in model.parameters()]
    engine = make_engine(model, engine="vmap", max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match=r"Jitted"):
        engine.prepare(*_lot(), CROSS_ENTROPY)
    inputs, _ = _lot()
    assert model(inputs).shape == (6, 3)
    for parameter, saved in zip(model.parameters(), before, strict=True):
        assert torch.equal(parameter.detach(), saved)


class _PointerChecked(nn.Module):
    """A custom-kernel wrapper: reads the input's data pointer (alignment) and raises a
    ``ValueError`` when it has none, as under vmap, where tensors have no storage."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.temperature = nn.Parameter(torch.tensor(1.5))  # no fast-path rule for division

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        try:
            inputs.data_ptr()
        except RuntimeError as error:
            raise ValueError("the kernel needs a tensor with storage") from error
        return self.linear(inputs) / self.temperature  # type: ignore[no-any-return]


def test_an_error_other_than_runtime_error_under_vmap_is_a_typed_refusal() -> None:
    torch.manual_seed(0)
    engine = make_engine(_PointerChecked(), engine="auto", max_grad_norm=1.0)
    with pytest.raises(NoExactEngineError, match="the kernel needs a tensor with storage"):
        engine.prepare(*_lot(), CROSS_ENTROPY)
