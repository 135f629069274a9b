"""Exact per-example gradients for any module with ``torch.func`` (vmap over grad).

Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) run their recurrence step by step from
elementary ops (:func:`~dpcore.torch.recurrent.decomposed_recurrence`), which vmap batches:
PyTorch's own recurrent kernels have no batching rule (GRU and RNN fail, the native LSTM fails
in float64, cuDNN's on CUDA). Materialises a ``(batch, *shape)`` gradient per
parameter, so memory grows with ``batch x parameters``; ``chunk_size`` trades speed for memory.
It takes every differentiable module vmap can run whose examples are independent; what vmap
cannot run (data-dependent control flow, operations without a batching rule, scripted modules,
the native recurrence in float64) the loop engine (:mod:`dpcore.torch.per_example.loop`) takes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.func import grad, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from dpcore.errors import DPCoreError
from dpcore.torch.batches import Batch, batch_size, call_model, flat_rows, model_arguments
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.per_example.base import (
    ClippedBatch,
    LossFunction,
    NonFinitePolicy,
    PerExampleEngine,
    clip_factors,
    per_example_losses,
)
from dpcore.torch.per_example.stateless import functional_call_restoring
from dpcore.torch.per_example.trial import compare_with_loop, eval_mode, states_kept
from dpcore.torch.recurrent import decomposed_recurrence
from dpcore.validation import check_count

__all__ = ["VmapEngine", "per_example_gradients", "vmap_refusal"]


def _as_lot_of_one(leaf: Any) -> Any:
    return leaf.unsqueeze(0) if isinstance(leaf, torch.Tensor) else leaf


def _tensor_rows(outputs: Any, layout: list[Any]) -> list[torch.Tensor]:
    """One example's tensor outputs, detached: each tensor's only row (a 0-d one as it is).

    vmap returns tensors only, so the outputs' structure and which leaves are tensors are kept
    in ``layout`` (``[spec, is_tensor]``) for :func:`_rebuilt`: the non-tensor leaves (a Hugging
    Face causal LM's cache object, a count, ``None``) come back as ``None``. A 0-d output (a
    scalar auxiliary loss) is one example's value here, so it comes back one per example.
    """
    leaves, spec = tree_flatten(outputs)
    layout[:] = [spec, [isinstance(leaf, torch.Tensor) for leaf in leaves]]
    return [
        leaf.detach() if leaf.dim() == 0 else leaf.detach()[0]
        for leaf in leaves
        if isinstance(leaf, torch.Tensor)
    ]


def _rebuilt(rows: list[torch.Tensor], layout: list[Any]) -> Any:
    """The outputs' structure of :func:`_tensor_rows` with the lot's tensors, ``None`` elsewhere."""
    spec, is_tensor = layout
    found = iter(rows)
    return tree_unflatten([next(found) if tensor else None for tensor in is_tensor], spec)


def vmap_refusal(error: Exception) -> IncompatibleModelError:
    """The typed refusal for a model that ``torch.func.vmap`` cannot run.

    Args:
        error: what vmap raised (data-dependent control flow such as an attention-mask check,
            ``.item()``, an operation without a batching rule, an output that is not a tensor,
            a module ``torch.func.functional_call`` cannot run, such as a scripted one).
    """
    lines = str(error).strip().splitlines() or [type(error).__name__]
    reason = lines[0] if len(lines[0]) <= 300 else lines[0][:297] + "..."
    refusal = IncompatibleModelError(
        f"VmapEngine cannot run this model under torch.func.vmap ({reason}); vmap needs every "
        "operation of one example's forward to run batched, without data-dependent Python "
        "control flow or .item(). Use the fast engine (engine='fast'), with the layers it "
        "handles, or the JL engine."
    )
    refusal.vmap_failed = True  # type: ignore[attr-defined]
    return refusal


def per_example_gradients(
    model: nn.Module,
    inputs: Batch,
    targets: Batch,
    loss_fn: LossFunction,
    *,
    chunk_size: int | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, Any]:
    """Per-example gradients of the trainable parameters, by ``vmap(grad(loss of one example))``.

    Returns:
        ``(gradients, losses, outputs)``: gradients maps each trainable parameter's name to a
        ``(batch, *shape)`` tensor; losses is ``(batch,)``; outputs are the model outputs, their
        non-tensor leaves (cache objects) replaced by ``None``.

    Raises:
        IncompatibleModelError: vmap cannot run the model (:func:`vmap_refusal`).
    """
    trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def loss_of_one(
        params: dict[str, torch.Tensor], x: Batch, y: Batch
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, Any]]:
        args, kwargs = model_arguments(tree_map(_as_lot_of_one, x))
        out = functional_call_restoring(model, (params, frozen, buffers), args, kwargs)
        loss = per_example_losses(loss_fn, out, tree_map(_as_lot_of_one, y), 1)
        return loss.sum(), (loss.detach()[0], _tensor_rows(out, layout))

    layout: list[Any] = []

    batched: Any = vmap(
        grad(loss_of_one, has_aux=True),
        in_dims=(None, 0, 0),
        randomness="different",
        chunk_size=chunk_size,
    )
    with warnings.catch_warnings():
        # PyTorch warns when an op (e.g. CPU flash attention) has no batching rule and vmap
        # falls back to a loop: slower, still exact. Not the user's problem to fix.
        warnings.filterwarnings("ignore", message="There is a performance drop because")
        try:
            with decomposed_recurrence(model):
                gradients, (losses, rows) = batched(trainable, inputs, targets)
        except DPCoreError:
            raise  # the project's own refusals (a loss of the wrong shape) keep their type
        except RuntimeError as error:
            raise vmap_refusal(error) from error
        except Exception as error:  # vmap's or functional_call's, unless the model's own
            if _plain_forward_fails(model, inputs, targets, loss_fn):
                raise
            raise vmap_refusal(error) from error
    return gradients, losses, _rebuilt(rows, layout)


def _plain_forward_fails(
    model: nn.Module, inputs: Batch, targets: Batch, loss_fn: LossFunction
) -> bool:
    """Whether the model's forward and per-example losses fail on the lot without vmap."""
    try:
        with torch.no_grad():
            outputs = call_model(model, inputs)
            per_example_losses(loss_fn, outputs, targets, batch_size(inputs))
    except Exception:
        return True
    return False


class VmapEngine(PerExampleEngine):
    """Exact clipping from materialised per-example gradients (``torch.func``).

    Args:
        model: any ``nn.Module`` whose examples are independent.
        max_grad_norm: the clipping norm C > 0.
        nonfinite: ``"raise"`` (default) or ``"zero"`` for NaN/inf per-example gradients.
        chunk_size: examples per vmap chunk (``None``: the whole lot at once).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(3, 2)
        >>> engine = VmapEngine(model, max_grad_norm=1.0)
        >>> lot = engine.clipped_sum(
        ...     torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]),
        ...     torch.nn.CrossEntropyLoss(reduction="none"))
        >>> bool((lot.norms * lot.clip_factors <= 1.0 + 1e-6).all())
        True
    """

    name = "vmap"

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        nonfinite: NonFinitePolicy = "raise",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
        self.chunk_size = (
            None if chunk_size is None else check_count("chunk_size", chunk_size, minimum=1)
        )

    def _check_trial(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Per-example gradients equal the loop's (vmap runs each example as a lot of one).

        In eval mode, so that dropout draws nothing in either. A model that vmap cannot run in
        eval mode although it trains in training mode (a Hugging Face Mamba or RWKV writes its
        eval-mode cache in place) is tried in its own mode instead, buffers and random states
        restored afterwards: a model that draws random numbers there differs from the loop
        (vmap draws each example's own) and is refused, one that draws none is compared
        exactly.
        """
        try:
            with eval_mode(self.model):  # the loop too: dropout would draw differently in each
                self._compare(inputs, targets, loss_fn)
        except IncompatibleModelError as error:
            training = any(module.training for module in self.model.modules())
            if not (training and getattr(error, "vmap_failed", False)):
                raise
            with states_kept(self.model, inputs):
                self._compare(inputs, targets, loss_fn)

    def _compare(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        gradients, _, _ = per_example_gradients(
            self.model, inputs, targets, loss_fn, chunk_size=self.chunk_size
        )
        compare_with_loop(
            self,
            inputs,
            targets,
            loss_fn,
            {name: flat_rows(rows).square().sum(1) for name, rows in gradients.items()},
            lambda factors: {
                name: torch.tensordot(factors.to(rows.dtype), rows, dims=1)
                for name, rows in gradients.items()
            },
        )

    def _clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        gradients, losses, outputs = per_example_gradients(
            self.model, inputs, targets, loss_fn, chunk_size=self.chunk_size
        )
        flat = [flat_rows(gradients[name]) for name, _ in self.named_parameters]
        norms = torch.sqrt(sum(g.square().sum(dim=1) for g in flat))  # type: ignore[arg-type]
        factors = clip_factors(norms, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)
        keep = factors > 0  # rows dropped as non-finite must not turn the sum into NaN (0 * nan)
        summed = []
        for name, parameter in self.named_parameters:
            rows = gradients[name]
            rows = torch.where(keep.view(-1, *([1] * (rows.dim() - 1))), rows, 0.0)
            summed.append(torch.tensordot(factors.to(rows.dtype), rows, dims=1).to(parameter.dtype))
        return ClippedBatch(summed, norms.detach(), factors, losses, outputs)
