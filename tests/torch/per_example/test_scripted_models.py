"""A TorchScript model (``torch.jit.script``): the fast path and vmap cannot follow it, with typed
refusals, and ``engine="auto"`` trains it on the loop engine.

The fast path's hooks and data flow do not see inside a scripted module, and
``torch.func.functional_call`` refuses jitted modules (the vmap engine's own state restoring
once raised a raw ``AttributeError`` on the scripted module's parameter container, hiding the
reason); autograd on one example at a time runs it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from tests.torch.reference import assert_matches_loop

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


def test_auto_trains_a_scripted_model_on_the_loop_engine_exactly() -> None:
    model = _scripted().double()
    inputs, targets = _lot()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="Jitted"):
        engine.prepare(inputs.double(), targets, CROSS_ENTROPY)
    assert engine.name == "loop"
    assert_matches_loop(engine, model, inputs.double(), targets, CROSS_ENTROPY, 1e-12)


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
    engine = make_engine(_PointerChecked(), engine="vmap", max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match="the kernel needs a tensor with storage"):
        engine.prepare(*_lot(), CROSS_ENTROPY)
    auto = make_engine(_PointerChecked(), engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="the kernel needs a tensor with storage"):
        auto.prepare(*_lot(), CROSS_ENTROPY)
    assert auto.name == "loop"
