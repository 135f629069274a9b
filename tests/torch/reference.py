"""One-example-at-a-time reference for per-example gradients (plain autograd, no tricks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dpcore.torch.batches import Batch, batch_size, call_model, take


def loop_gradients(
    model: nn.Module, inputs: Batch, targets: Batch, loss_fn: Callable[[Any, Any], torch.Tensor]
) -> list[list[torch.Tensor]]:
    """For each example alone: the gradient of its loss w.r.t. every trainable parameter.

    ``inputs`` may be a tensor, or a tuple/list/dict of batch-first tensors (the model is called
    as :func:`dpcore.torch.batches.call_model` calls it).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(batch_size(inputs)):
        one = slice(i, i + 1)
        loss = loss_fn(call_model(model, take(inputs, one)), take(targets, one)).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out.append(
            [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
        )
    return out


def loop_norms(gradients: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in row)) for row in gradients])  # type: ignore[misc]


def loop_clipped_sum(
    gradients: list[list[torch.Tensor]], max_grad_norm: float
) -> list[torch.Tensor]:
    norms = loop_norms(gradients)
    factors = torch.clamp(max_grad_norm / norms, max=1.0)
    return [
        sum(float(c) * row[k] for c, row in zip(factors, gradients, strict=True))
        for k in range(len(gradients[0]))
    ]  # type: ignore[misc]


def assert_matches_loop(
    engine: Any,
    model: nn.Module,
    inputs: Batch,
    targets: Batch,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    tolerance: float,
) -> None:
    """The engine's per-example norms and clipped sum on one lot equal the loop's, clipping at
    the median norm (so that some examples are clipped and some are not)."""
    gradients = loop_gradients(model, inputs, targets, loss_fn)
    norms = loop_norms(gradients)
    engine.max_grad_norm = float(norms.median())
    lot = engine.clipped_sum(inputs, targets, loss_fn)
    torch.testing.assert_close(lot.norms, norms, atol=tolerance, rtol=0)
    expected = loop_clipped_sum(gradients, engine.max_grad_norm)
    for found, wanted in zip(lot.summed, expected, strict=True):
        torch.testing.assert_close(found, wanted, atol=tolerance, rtol=0)
