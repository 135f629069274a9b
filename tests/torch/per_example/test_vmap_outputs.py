"""The vmap engine with models whose outputs are more than logits.

A model may return, beside its logits, a 0-d auxiliary value (a mixture-of-experts balance loss,
a mean over the lot), a count, or ``None``. The loss function reads what it needs; the engine
must train the model exactly and return the outputs it can (tensors per example, ``None`` for
the rest). A 0-d output once made the engine fail with a raw ``IndexError``, and a non-tensor
output made vmap refuse a model it can train.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
TOLERANCE = 1e-10


class _WithAuxiliary(nn.Module):
    """Logits over a learned temperature (no fast-path rule), a 0-d auxiliary loss, a count."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)
        self.temperature = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

    def forward(self, inputs: torch.Tensor) -> dict[str, Any]:
        logits = self.linear(inputs) / self.temperature
        return {"logits": logits, "balance": logits.square().mean(), "experts": 3, "cache": None}


def _loss(outputs: dict[str, Any], targets: torch.Tensor) -> torch.Tensor:
    return CROSS_ENTROPY(outputs["logits"], targets)


@pytest.mark.parametrize("engine", ["auto", "vmap"])
def test_scalar_and_non_tensor_outputs_train_exactly(engine: str) -> None:
    torch.manual_seed(0)
    model = _WithAuxiliary()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 3, (7,), generator=generator)
    built = make_engine(model, engine=engine, max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto's fallback warning
        built.prepare(inputs, targets, _loss)
    assert built.name == "vmap"
    lot = built.clipped_sum(inputs, targets, _loss)
    gradients = loop_gradients(model, inputs, targets, _loss)
    torch.testing.assert_close(lot.norms, loop_norms(gradients), atol=TOLERANCE, rtol=0)
    for found, wanted in zip(lot.summed, loop_clipped_sum(gradients, 1.0), strict=True):
        torch.testing.assert_close(found, wanted, atol=TOLERANCE, rtol=0)
    alone = torch.stack([model(inputs[i : i + 1])["balance"] for i in range(7)]).detach()
    torch.testing.assert_close(lot.outputs["balance"], alone)
    assert lot.outputs["logits"].shape == (7, 3)
    assert lot.outputs["experts"] is None
    assert lot.outputs["cache"] is None
