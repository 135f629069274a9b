"""Models whose examples interact only in training mode are refused by every engine.

The trial lots compare each example with itself alone in eval mode; a module can mix the lot's
rows only under ``if self.training`` (a hand-written batch statistic, timm's ``EvoNorm2dB0``).
Such a model trains with the mixing, so per-example clipping would not bound one example's
influence: ``prepare`` refuses it with an :class:`ExamplesInteractError`. Dropout, whose masks are
random but per row, must not be mistaken for an interaction; the check leaves the model's buffers
and torch's random state as they were.
"""

from __future__ import annotations

import random

import numpy
import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import ExamplesInteractError

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
ENGINES = ["auto", "fast", "vmap", "loop", "jl"]


class _TrainingCentering(nn.Module):
    """Subtracts the lot's mean of the hidden layer while training (eval: no centering)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 5, dtype=torch.float64)
        self.second = nn.Linear(5, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.first(inputs)
        if self.training:
            hidden = hidden - hidden.mean(0, keepdim=True)
        return self.second(torch.tanh(hidden))


class _TrainingBatchVariance(nn.Module):
    """EvoNorm-B0-like: divides by the lot's variance while training and keeps a running one."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 5, dtype=torch.float64)
        self.second = nn.Linear(5, 3, dtype=torch.float64)
        self.register_buffer("running_var", torch.ones(5, dtype=torch.float64))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.first(inputs)
        if self.training:
            variance = hidden.var(0, unbiased=False)
            with torch.no_grad():
                self.running_var.mul_(0.9).add_(0.1 * variance)
        else:
            variance = self.running_var
        return self.second(torch.tanh(hidden / (variance + 1e-5).sqrt()))


class _Dropout(nn.Module):
    """Dropout between two Linears: random in training mode, but each row on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 5, dtype=torch.float64)
        self.dropout = nn.Dropout(0.5)
        self.second = nn.Linear(5, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.second(self.dropout(torch.tanh(self.first(inputs))))


class _LayerDrop(nn.Module):
    """Skips whole residual branches at random while training, drawing from Python's ``random``
    and NumPy's global generator (transformers' LayerDrop, wav2vec2's SpecAugment masks)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4, dtype=torch.float64)
        self.second = nn.Linear(4, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs
        if not self.training or random.random() < 0.5:
            hidden = hidden + torch.tanh(self.first(hidden))
        if not self.training or numpy.random.rand() < 0.5:
            hidden = hidden + torch.tanh(self.second(hidden))
        return self.head(hidden)


def _lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    return inputs, torch.tensor([0, 1, 2, 0, 1, 2])


def _engine(model: nn.Module, engine: str) -> object:
    options = {"jl_dimension": 2} if engine == "jl" else {}
    return make_engine(model, engine=engine, max_grad_norm=1.0, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("model_type", [_TrainingCentering, _TrainingBatchVariance])
def test_examples_interacting_only_while_training_are_refused(
    engine: str, model_type: type[nn.Module]
) -> None:
    torch.manual_seed(0)
    model = model_type().train()
    built = _engine(model, engine)
    with pytest.raises(ExamplesInteractError, match="training mode"):
        built.prepare(*_lot(), CROSS_ENTROPY)  # type: ignore[attr-defined]


def test_the_same_model_in_eval_mode_is_accepted() -> None:
    torch.manual_seed(0)
    model = _TrainingCentering().eval()
    built = make_engine(model, engine="auto", max_grad_norm=1.0)
    built.prepare(*_lot(), CROSS_ENTROPY)
    assert built.name == "fast"


def test_the_check_restores_buffers_and_the_random_state() -> None:
    torch.manual_seed(0)
    model = _TrainingBatchVariance().train()
    before = model.running_var.clone()
    state = torch.get_rng_state()
    with pytest.raises(ExamplesInteractError):
        make_engine(model, engine="fast", max_grad_norm=1.0).prepare(*_lot(), CROSS_ENTROPY)
    torch.testing.assert_close(model.running_var, before, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("engine", ["auto", "fast", "vmap", "loop"])
@pytest.mark.parametrize("model_type", [_Dropout, _LayerDrop])
def test_random_draws_in_training_mode_are_not_an_interaction(
    engine: str, model_type: type[nn.Module]
) -> None:
    for seed in range(4):  # layer drop: the two runs skip alike whatever the draws
        torch.manual_seed(seed)
        random.seed(seed)
        numpy.random.seed(seed)
        model = model_type().train()
        states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
        built = make_engine(model, engine=engine, max_grad_norm=1.0)
        built.prepare(*_lot(), CROSS_ENTROPY)
        assert built.prepared
        assert torch.equal(torch.get_rng_state(), states[0])
        assert random.getstate() == states[1]
        assert (numpy.random.get_state()[1] == states[2]).all()
        assert model.training


class _ExpandedBuffer(nn.Module):
    """Keeps an expanded (overlapping) view as a buffer, like transformers' position ids."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)
        self.register_buffer("offsets", torch.zeros(1, dtype=torch.float64).expand(3))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs) + self.offsets


def test_an_expanded_buffer_is_left_as_it_is() -> None:
    torch.manual_seed(0)
    model = _ExpandedBuffer().train()
    built = make_engine(model, engine="auto", max_grad_norm=1.0)
    built.prepare(*_lot(), CROSS_ENTROPY)
    assert built.name == "fast"
    assert model.offsets.stride() == (0,)
