"""Exact clipping by autograd on one example at a time: the definition of exact, for any model.

Each example of the lot runs through the model alone (a lot of one) and ``torch.autograd.grad``
gives its gradient, which is clipped and added to the sum before the next example runs; no
per-example gradient is kept, so memory is one gradient and the sum. This is the contract the
other engines are checked against (:mod:`dpcore.torch.per_example.trial`), so it needs no
comparison of its own: it takes every differentiable model whose examples are independent,
including those the fast path cannot attribute and ``torch.func.vmap`` cannot run (packed
sequences, mixture-of-experts routing that indexes the lot, scripted modules, Python control
flow on the data). The price is one forward and backward pass
per example: ``engine="auto"`` uses it last, with an
:class:`~dpcore.torch.errors.EngineFallbackWarning` giving the other engines' reasons.

Its privacy needs nothing from the model's structure: example i's gradient is computed from
example i alone, so adding or removing one example changes the clipped sum by at most C. The
trial lots' checks still run (:meth:`~dpcore.torch.per_example.base.PerExampleEngine.prepare`):
a model whose examples interact trains a different function alone than in a lot, and is refused
by every engine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpcore.errors import DPCoreError
from dpcore.torch.batches import Batch, batch_size, call_model, take
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.per_example.base import (
    ClippedBatch,
    LossFunction,
    PerExampleEngine,
    clip_factors,
    per_example_losses,
)
from dpcore.torch.per_example.trial import states_kept

__all__ = ["LoopEngine"]


def _one_example(
    model: nn.Module,
    inputs: Batch,
    targets: Batch,
    loss_fn: LossFunction,
    i: int,
    parameters: list[nn.Parameter],
) -> tuple[list[torch.Tensor], torch.Tensor, Any]:
    """Example ``i``'s gradient (zeros for parameters it does not reach), loss and outputs."""
    one = slice(i, i + 1)
    with torch.enable_grad():
        outputs = call_model(model, take(inputs, one))
        loss = per_example_losses(loss_fn, outputs, take(targets, one), 1)[0]
        if not loss.requires_grad:  # no trainable parameter reaches this example's loss
            found: tuple[torch.Tensor | None, ...] = (None,) * len(parameters)
        else:
            found = torch.autograd.grad(loss, parameters, allow_unused=True)
    gradient = [
        torch.zeros_like(p) if g is None else g.detach()
        for p, g in zip(parameters, found, strict=True)
    ]
    return gradient, loss.detach(), outputs


def _refusal(error: Exception) -> IncompatibleModelError:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    reason = lines[0] if len(lines[0]) <= 300 else lines[0][:297] + "..."
    return IncompatibleModelError(
        f"LoopEngine cannot differentiate one example's loss of this model ({reason}); every "
        "operation on the way from the trainable parameters to the loss needs a derivative."
    )


def _joined_outputs(rows: list[Any]) -> Any:
    """The lot's outputs from each example's: tensor leaves joined along the first dimension
    (0-d leaves, one value per example, stacked), other leaves ``None``; ``None`` when the
    examples' outputs differ in structure."""
    flat = [tree_flatten(row) for row in rows]
    spec = flat[0][1]
    if any(other != spec for _, other in flat[1:]):
        return None
    joined: list[torch.Tensor | None] = []
    for k, leaf in enumerate(flat[0][0]):
        if not isinstance(leaf, torch.Tensor):
            joined.append(None)
            continue
        parts = [leaves[k].detach() for leaves, _ in flat]
        joined.append(torch.stack(parts) if leaf.dim() == 0 else torch.cat(parts))
    return tree_unflatten(joined, spec)


class LoopEngine(PerExampleEngine):
    """Exact clipping by autograd on each example alone (one pass per example).

    Args:
        model: any differentiable ``nn.Module`` whose examples are independent.
        max_grad_norm: the clipping norm C > 0.
        nonfinite: ``"raise"`` (default) or ``"zero"`` for NaN/inf per-example gradients.

    Example:
        >>> import torch
        >>> class Classifier(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.gru, self.out = torch.nn.GRU(3, 4, batch_first=True), torch.nn.Linear(4, 2)
        ...     def forward(self, x):
        ...         return self.out(self.gru(x)[0][:, -1])
        >>> engine = LoopEngine(Classifier(), max_grad_norm=1.0)
        >>> lot = engine.clipped_sum(
        ...     torch.randn(5, 7, 3), torch.tensor([0, 1, 0, 1, 1]),
        ...     torch.nn.CrossEntropyLoss(reduction="none"))
        >>> bool((lot.norms * lot.clip_factors <= 1.0 + 1e-6).all()), lot.outputs.shape
        (True, torch.Size([5, 2]))
    """

    name = "loop"

    def _check_trial(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Run the loop once on the trial lot, in the model's own mode (what training runs; a
        Hugging Face RWKV differentiates only in training mode, its eval-mode cache writes in
        place): an operation without a derivative is refused here, before training, with a
        typed error. Buffers and random states are restored afterwards."""
        parameters = self.parameters
        try:
            with states_kept(self.model, inputs):
                for i in range(batch_size(inputs)):
                    _one_example(self.model, inputs, targets, loss_fn, i, parameters)
        except DPCoreError:
            raise
        except RuntimeError as error:
            raise _refusal(error) from error

    def _clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        parameters = self.parameters
        summed = [torch.zeros_like(p) for p in parameters]
        norms, factors, losses, outputs = [], [], [], []
        for i in range(batch_size(inputs)):
            gradient, loss, output = _one_example(
                self.model, inputs, targets, loss_fn, i, parameters
            )
            norm = torch.sqrt(sum(g.square().sum() for g in gradient)).reshape(1)  # type: ignore[arg-type]
            factor = clip_factors(norm, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)
            if bool(factor[0] > 0):  # a dropped non-finite example must not make the sum NaN
                for total, g in zip(summed, gradient, strict=True):
                    total.add_(g, alpha=float(factor[0]))
            norms.append(norm[0])
            factors.append(factor[0])
            losses.append(loss)
            outputs.append(output)
        return ClippedBatch(
            summed,
            torch.stack(norms).detach(),
            torch.stack(factors),
            torch.stack(losses),
            _joined_outputs(outputs),
        )
