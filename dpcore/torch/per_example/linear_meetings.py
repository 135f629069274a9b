"""Exact per-example terms of ``F.linear`` calls whose weight or bias is batch-independent.

A call ``h = F.linear(x, w, b)`` on example data ``x`` (batch-first, ``(n, ..., d_in)``) outside
a handled layer meets the examples through ``w`` and ``b``: a parameter used functionally, the
slices of ``nn.MultiheadAttention``'s packed ``in_proj_weight`` and its ``out_proj`` (see
:mod:`~dpcore.torch.per_example.attention`), or a weight computed from parameters before use (a
merged ``W + B @ A``, a standardised or normalised weight). With ``g = d(sum_i loss_i) / dh``
(row i is example i's alone), example i's gradient with respect to ``w`` is the Linear layer's
``G_i = sum_t g_{i,t} x_{i,t}^T`` and with respect to ``b`` it is ``sum_t g_{i,t}``:

- a parameter used as it is gets the Linear layer's term: ghost norms or materialised ``G_i``,
  whichever is cheaper, and the book-keeping clipped sum
  (:func:`~dpcore.torch.per_example.layer_handlers.outer_product_term`);
- a computed weight has its ``G_i`` materialised, ``(n, d_out, d_in)``, and pulled back through
  the computation to the parameters it is computed from, by one batched vector-Jacobian product
  (``torch.autograd.grad(..., is_grads_batched=True)``): exact, example by example, since that
  computation involves no example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dpcore.torch.per_example.dataflow import LINEAR, BatchDataflow, Meeting
from dpcore.torch.per_example.independent import pull_back
from dpcore.torch.per_example.layer_handlers import (
    NormStrategy,
    ParameterTerm,
    materialized_term,
    outer_product_term,
)

__all__ = ["linear_terms"]


def linear_terms(
    meetings: Sequence[Meeting],
    backprops: Mapping[int, torch.Tensor],
    dataflow: BatchDataflow,
    parameters: Mapping[str, nn.Parameter],
    *,
    strategy: NormStrategy,
) -> dict[str, list[ParameterTerm]]:
    """Per-parameter terms of the ``F.linear`` meetings among ``meetings``.

    Args:
        meetings: supported meetings (see
            :func:`~dpcore.torch.per_example.independent.refuse_unsupported`); others are skipped.
        backprops: ``id(meeting.output) -> d(sum_i loss_i)/d output``.
        dataflow: the forward's :class:`~dpcore.torch.per_example.dataflow.BatchDataflow`.
        parameters: trainable parameters by name.
        strategy: the norm strategy for parameters used as they are.

    Returns:
        for each parameter reached, its terms (one per call; the engine sums several).
    """
    found: dict[str, list[ParameterTerm]] = {}
    by_id = {id(p): name for name, p in parameters.items()}
    for meeting in meetings:
        if meeting.func not in LINEAR:
            continue
        inputs = meeting.args[0].detach()
        backprop = backprops[id(meeting.output)]
        size, d_in, d_out = backprop.shape[0], inputs.shape[-1], backprop.shape[-1]
        activations = inputs.reshape(size, 1, -1, d_in)
        gradients = backprop.reshape(size, 1, -1, d_out)
        for position, operand in meeting.operands:
            name = by_id.get(id(operand))
            if position == 1 and name is not None:  # the parameter itself: the Linear term
                term = outer_product_term(
                    name, activations, gradients, shape=operand.shape, strategy=strategy
                )
                found.setdefault(name, []).append(term)
                continue
            if position == 1:
                rows = (gradients.transpose(-1, -2) @ activations).reshape(size, *operand.shape)
            else:
                rows = gradients.sum((1, 2)).reshape(size, *operand.shape)
            if name is not None:
                found.setdefault(name, []).append(materialized_term(name, rows, operand.shape))
                continue
            names = sorted(dataflow.sources(operand))
            pulled = pull_back(operand, rows, [parameters[n] for n in names])
            for source, gradient in zip(names, pulled, strict=True):
                if gradient is not None:
                    shape = parameters[source].shape
                    found.setdefault(source, []).append(materialized_term(source, gradient, shape))
    return found
