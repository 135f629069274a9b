"""``engine="auto"`` ends in an exact engine or in one typed error giving each engine's reason."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import (
    EngineFallbackWarning,
    IncompatibleModelError,
    NoExactEngineError,
)

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


class _BranchingOnData(nn.Module):
    """A parameter reached through ``x @ W`` (no fast-path rule) behind a branch on the data
    (which vmap cannot run)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixing = nn.Parameter(torch.randn(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if bool((inputs > 0).any()):
            inputs = inputs @ self.mixing
        return self.head(inputs)


def test_a_model_no_engine_takes_gets_one_typed_error_with_each_reason() -> None:
    torch.manual_seed(0)
    engine = make_engine(_BranchingOnData(), engine="auto", max_grad_norm=1.0)
    with pytest.raises(NoExactEngineError) as refused:
        engine.prepare(torch.randn(6, 4), torch.randint(0, 2, (6,)), CROSS_ENTROPY)
    error = refused.value
    assert isinstance(error, IncompatibleModelError)
    assert set(error.reasons) == {"fast", "vmap"}
    assert "'mixing'" in error.reasons["fast"]
    assert "torch.func.vmap" in error.reasons["vmap"]
    assert error.parameters == ["mixing"]
    message = str(error)
    assert all(f"- {name}: {reason}" in message for name, reason in error.reasons.items())
    copy = pickle.loads(pickle.dumps(error))  # travels from a worker process intact
    assert (type(copy), copy.reasons, copy.parameters, str(copy)) == (
        NoExactEngineError,
        error.reasons,
        error.parameters,
        message,
    )
    assert not engine.prepared


def test_a_layer_configuration_the_fast_path_refuses_falls_back_to_vmap() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(7, 3, scale_grad_by_freq=True), nn.Flatten(), nn.Linear(6, 2)
    )
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="scale_grad_by_freq"):
        engine.prepare(torch.randint(0, 7, (5, 2)), torch.randint(0, 2, (5,)), CROSS_ENTROPY)
    assert engine.name == "vmap"
