"""A loss over the whole lot (a contrastive loss whose targets index the other examples) fails
on one example alone; every engine refuses it with one typed error instead of the loss's raw
``IndexError`` from inside the trial. A model that fails on the whole lot too keeps its error."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import ExamplesInteractError


class _Embedder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 5, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.normalize(self.linear(inputs), dim=-1)  # type: ignore[no-any-return]


def _contrastive(embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each example's cross-entropy over its similarities to the lot's examples."""
    return functional.cross_entropy(embeddings @ embeddings.T, targets, reduction="none")


def _lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=generator, dtype=torch.float64), torch.arange(6)


@pytest.mark.parametrize("engine", ["auto", "fast", "vmap", "loop", "jl"])
def test_a_loss_over_the_lot_is_refused_by_every_engine(engine: str) -> None:
    torch.manual_seed(0)
    options = {"jl_dimension": 2} if engine == "jl" else {}
    built = make_engine(_Embedder(), engine=engine, max_grad_norm=1.0, **options)  # type: ignore[arg-type]
    with pytest.raises(ExamplesInteractError, match="alone"):
        built.prepare(*_lot(), _contrastive)


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        raise ValueError("the model's own error")


def test_a_model_failing_on_the_whole_lot_keeps_its_own_error() -> None:
    engine = make_engine(_Broken(), engine="auto", max_grad_norm=1.0)
    inputs, _ = _lot()
    with pytest.raises(ValueError, match="the model's own error"):
        engine.prepare(
            inputs, torch.zeros(6, dtype=torch.long), nn.CrossEntropyLoss(reduction="none")
        )
