"""Lots whose inputs are a tensor, a tuple/list of tensors or a dict of tensors (batch-first).

A model takes its inputs as the user's own code would call it: ``model(x)`` for a tensor,
``model(*x)`` for a tuple or list, ``model(**x)`` for a dict. Targets may be any such structure
too; the loss function receives them as they are. Every tensor of a lot has the lot's examples
along its first dimension.

Example:
    >>> import torch
    >>> lot = {"tokens": torch.zeros(4, 7, dtype=torch.long), "mask": torch.ones(4, 7)}
    >>> batch_size(lot), batch_size(take(lot, torch.tensor([0, 2])))
    (4, 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from dpcore.errors import InvalidParameterError

__all__ = [
    "Batch",
    "batch_size",
    "call_model",
    "detached",
    "flat_rows",
    "model_arguments",
    "take",
    "tensors",
]

Batch = Any
"""A tensor, or a tuple, list or dict (possibly nested) of batch-first tensors."""


def tensors(batch: Batch) -> list[torch.Tensor]:
    """The tensors of ``batch``, in a fixed order."""
    return [leaf for leaf in tree_leaves(batch) if isinstance(leaf, torch.Tensor)]


def batch_size(batch: Batch, name: str = "inputs") -> int:
    """The number of examples: the first dimension, shared by every tensor of ``batch``.

    Raises:
        InvalidParameterError: ``batch`` holds no tensor, a 0-d tensor, or tensors of different
            first dimensions.
    """
    found = tensors(batch)
    if not found or any(t.dim() == 0 for t in found):
        raise InvalidParameterError(
            name, "a batch-first tensor, or a tuple/list/dict of batch-first tensors", batch
        )
    sizes = {int(t.shape[0]) for t in found}
    if len(sizes) != 1:
        raise InvalidParameterError(
            name, "tensors that all have the lot's examples along dimension 0", sorted(sizes)
        )
    return sizes.pop()


def take(batch: Batch, index: torch.Tensor | slice) -> Batch:
    """The examples ``index`` of every tensor of ``batch`` (other leaves unchanged)."""

    def pick(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        if isinstance(index, torch.Tensor):
            return leaf[index.to(leaf.device)]
        return leaf[index]

    return tree_map(pick, batch)


def detached(batch: Batch) -> Batch:
    """``batch`` with every tensor detached."""
    return tree_map(lambda leaf: leaf.detach() if isinstance(leaf, torch.Tensor) else leaf, batch)


def flat_rows(rows: torch.Tensor) -> torch.Tensor:
    """Per-example values ``(batch, ...)`` as ``(batch, n)``: one row per example.

    A scalar (0-d) parameter's per-example gradients ``(batch,)`` become ``(batch, 1)``; an empty
    lot gives ``(0, n)``. (``rows.flatten(1)`` fails on ``(batch,)``.)
    """
    return rows.reshape(rows.shape[0], math.prod(rows.shape[1:]))


def call_model(model: nn.Module, inputs: Batch) -> Any:
    """``model(x)``, ``model(*x)`` or ``model(**x)`` for a tensor, a tuple/list or a dict."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def model_arguments(inputs: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of :func:`call_model`'s call (for ``torch.func.functional_call``)."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}
