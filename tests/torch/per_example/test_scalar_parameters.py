"""Scalar (0-d) trainable parameters: a learned temperature, a ReZero gain, a weight's gain.

Their per-example gradients are ``(batch,)``, one number per example; every engine that accepts
such a model must give the loop's norms and clipped sums (a ``(batch,)`` row block once made the
engines' own bookkeeping fail with a raw ``IndexError``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from tests.torch.reference import assert_matches_loop

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
TOLERANCE = 1e-10


class _Temperature(nn.Module):
    """Logits divided by a learned temperature (CLIP's logit scale): no fast-path rule."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)
        self.temperature = nn.Parameter(torch.tensor(2.0, dtype=torch.float64))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs) / self.temperature


class _ReZero(nn.Module):
    """``x + alpha * f(x)`` with a scalar ``alpha``: meets the examples through ``*``."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4, dtype=torch.float64)
        self.alpha = nn.Parameter(torch.tensor(0.3, dtype=torch.float64))
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(inputs + self.alpha * torch.tanh(self.inner(inputs)))


class _GainedWeight(nn.Module):
    """``F.linear(x, w * g)`` with a scalar gain ``g``: a weight computed from parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.3 * torch.randn(3, 4, dtype=torch.float64))
        self.gain = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, self.weight * self.gain)


def _lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, 4, generator=generator, dtype=torch.float64)
    return inputs, torch.randint(0, 3, (size,), generator=generator)


@pytest.mark.parametrize(
    ("model_type", "engine", "chosen"),
    [
        (_Temperature, "auto", "vmap"),
        (_Temperature, "vmap", "vmap"),
        (_ReZero, "auto", "fast"),
        (_ReZero, "vmap", "vmap"),
        (_GainedWeight, "auto", "fast"),
        (_GainedWeight, "vmap", "vmap"),
    ],
)
def test_scalar_parameters_are_clipped_exactly(
    model_type: type[nn.Module], engine: str, chosen: str
) -> None:
    torch.manual_seed(0)
    model = model_type()
    built = make_engine(model, engine=engine, max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto's fallback warning
        built.prepare(*_lot(6, 1), CROSS_ENTROPY)
    assert built.name == chosen
    # assert_close also checks each (batch,)-shaped row block's shape
    assert_matches_loop(built, model, *_lot(7, 2), CROSS_ENTROPY, TOLERANCE)
