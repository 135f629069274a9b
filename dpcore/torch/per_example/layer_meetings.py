"""Exact per-example terms of ``F.linear`` and ``F.conv1d``/``F.conv2d`` calls whose weight or
bias is batch-independent: parameters used functionally, and weights computed from parameters.

A call ``h = F.linear(x, w, b)`` (or a convolution) on example data ``x`` (batch-first) outside a
handled layer's own operation meets the examples through ``w`` and ``b``: a parameter used
functionally, the slices of ``nn.MultiheadAttention``'s packed ``in_proj_weight`` and its
``out_proj`` (see :mod:`~dpcore.torch.per_example.attention`), or a weight computed from
parameters before use: a merged ``W + B @ A`` (LoRA), a standardised ``(W - mean) / std``
(normalizer-free nets' convolutions), ``torch.nn.utils.parametrizations.weight_norm``. A handled
layer whose call computes its weight so is traced operation by operation (the engine's
``_Layer.traced``), and its call lands here. With ``g = d(sum_i loss_i) / dh`` (row i is
example i's alone), example i's gradient with respect to ``w`` is the layer's
``G_i = sum_t g_{i,t} a_{i,t}^T`` (``a`` the input, or a convolution's unfolded patches, per
group) and with respect to ``b`` it is ``sum_t g_{i,t}``:

- a parameter used as it is gets the layer's own term: ghost norms or materialised ``G_i``,
  whichever is cheaper, and the book-keeping clipped sum
  (:func:`~dpcore.torch.per_example.layer_handlers.outer_product_term`);
- a computed weight has its ``G_i`` materialised, ``(n, *w.shape)``, and pulled back through
  the computation to the parameters it is computed from, by one batched vector-Jacobian product
  (:func:`~dpcore.torch.per_example.independent.pull_back`): exact, example by example, since
  that computation involves no example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dpcore.torch.per_example.dataflow import (
    CONVOLUTION,
    LINEAR,
    BatchDataflow,
    Meeting,
    OperationCall,
)
from dpcore.torch.per_example.independent import pull_back
from dpcore.torch.per_example.layer_handlers import (
    ConvGeometry,
    NormStrategy,
    ParameterTerm,
    materialized_term,
    outer_product_term,
    unfold_patches,
)

__all__ = ["layer_terms"]


def _activations_and_gradients(
    meeting: Meeting, backprop: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n, groups, T, d_in)`` inputs and ``(n, groups, T, d_out)`` output gradients."""
    inputs = meeting.args[0].detach()
    size = backprop.shape[0]
    if meeting.func in LINEAR:
        d_in, d_out = inputs.shape[-1], backprop.shape[-1]
        return inputs.reshape(size, 1, -1, d_in), backprop.reshape(size, 1, -1, d_out)
    weight = meeting.args[1]
    call = OperationCall(meeting.func, meeting.args, meeting.kwargs, meeting.output)
    geometry = ConvGeometry.of_call(call, tuple(weight.shape[2:]))
    groups = int(call.argument(6, "groups", 1))
    patches = unfold_patches(inputs, geometry)  # (n, L, C_in * prod(kernel))
    positions = patches.shape[1]
    activations = patches.view(size, positions, groups, -1).transpose(1, 2)
    gradients = backprop.reshape(size, groups, weight.shape[0] // groups, positions)
    return activations, gradients.transpose(-1, -2)


def layer_terms(
    meetings: Sequence[Meeting],
    backprops: Mapping[int, torch.Tensor],
    dataflow: BatchDataflow,
    parameters: Mapping[str, nn.Parameter],
    *,
    strategy: NormStrategy,
) -> dict[str, list[ParameterTerm]]:
    """Per-parameter terms of the ``F.linear`` and convolution meetings among ``meetings``.

    Args:
        meetings: supported meetings (see
            :func:`~dpcore.torch.per_example.independent.refuse_unsupported`); others are skipped.
        backprops: ``id(meeting.output) -> d(sum_i loss_i)/d output``.
        dataflow: the forward's :class:`~dpcore.torch.per_example.dataflow.BatchDataflow`.
        parameters: trainable parameters by name.
        strategy: the norm strategy for weights that are parameters as they are.

    Returns:
        for each parameter reached, its terms (one per call; the engine sums several).
    """
    found: dict[str, list[ParameterTerm]] = {}
    by_id = {id(p): name for name, p in parameters.items()}
    for meeting in meetings:
        if meeting.func not in LINEAR and meeting.func not in CONVOLUTION:
            continue
        backprop = backprops[id(meeting.output)]
        size = backprop.shape[0]
        activations, gradients = _activations_and_gradients(meeting, backprop)
        for position, operand in meeting.operands:
            name = by_id.get(id(operand))
            if position == 1 and name is not None:  # the parameter itself: the layer's term
                term = outer_product_term(
                    name, activations, gradients, shape=operand.shape, strategy=strategy
                )
                found.setdefault(name, []).append(term)
                continue
            if position == 1:
                rows = (gradients.transpose(-1, -2) @ activations).reshape(size, *operand.shape)
            else:
                rows = gradients.sum(2).reshape(size, *operand.shape)
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
