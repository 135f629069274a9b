"""Exact per-example gradients of parameters used batch-independently (positions, CLS tokens).

A tensor ``u`` computed from parameters only (a position table ``pos(torch.arange(T))``, a CLS
token ``cls.expand(n, -1, -1)``, a prompt, a table through a Linear) reaches the loss through the
operations where it meets the batched data (:class:`~dpcore.torch.per_example.dataflow.Meeting`).
For such an operation ``h = op(x, u)`` the fast path obtains ``g = d(sum_i loss_i) / dh`` in the
same single backward as the layers' backprops; since examples are independent, row i of ``g`` is
``d loss_i / dh_i``, and example i's gradient with respect to ``u`` is the operation's
vector-Jacobian product of ``g`` restricted to row i:

- ``h = a + s * alpha * u`` (broadcast): ``s * alpha * g_i`` summed over the dimensions along
  which ``u`` was broadcast;
- ``h = x * u``: the same with ``g_i * x_i``;
- ``h = torch.where(c, u, x)`` (boolean ``c``): the same with ``g_i`` where ``c_i`` chose ``u``;
- ``h = torch.cat([..., u, ...], dim)``: the slice of ``g_i`` that ``u`` filled.

When ``u`` has the lot's size in its first dimension only because it was expanded to it
(``cls.expand(n, -1, -1)``), example i's gradient lies in row i alone ("diagonal") and is summed
back over the expansion. What remains is pulled back to the parameters through ``u``'s own graph,
which involves no example: one batched backward (``torch.autograd.grad(...,
is_grads_batched=True)``) of the ``(n, *u.shape)`` per-example gradients, or the parameter itself.
The results are materialised per example (``(n, *parameter.shape)``): exact, and small for the
tables these parameters are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.per_example.dataflow import (
    ADDITIVE,
    CONCATENATE,
    CONVOLUTION,
    LINEAR,
    WHERE,
    BatchDataflow,
    Lookup,
    Meeting,
)

__all__ = ["independent_rows", "pull_back", "refuse_unsupported"]


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Per-example gradients with respect to ``tensor``.

    ``diagonal`` False: ``rows`` is ``(n, *tensor.shape)``. ``diagonal`` True: ``tensor.shape[0]
    == n`` and example i's gradient is zero except in ``tensor[i]``, which gets ``rows[i]``
    (``rows`` is ``(n, *tensor.shape[1:])``).
    """

    tensor: torch.Tensor
    rows: torch.Tensor
    diagonal: bool


def refuse_unsupported(meetings: Sequence[Meeting], batch_size: int) -> None:
    """Raise for a meeting the fast path cannot differentiate per example.

    Raises:
        IncompatibleModelError: naming the parameters and the operation (``parameters`` attribute
            set to their names).
    """
    for meeting in meetings:
        problem = None
        if not meeting.supported:
            problem = (
                f"meet the lot's examples in {meeting.name}, which the fast path has no "
                "per-example rule for (it has rules for +, -, *, torch.cat, torch.where, "
                "F.linear and "
                "convolutions, and handlers for Linear, Conv1d, Conv2d, Embedding, LayerNorm, "
                "GroupNorm, RMSNorm and DPLSTM)"
            )
        elif meeting.batch_dim:
            problem = (
                f"meet the lot's examples in {meeting.name}, whose result has the examples "
                f"along dimension {meeting.batch_dim}, not first"
            )
        elif meeting.output.dim() < 1 or meeting.output.shape[0] != batch_size:
            problem = (
                f"meet the lot's examples in {meeting.name}, whose result of shape "
                f"{tuple(meeting.output.shape)} is not batch-first (lot of {batch_size})"
            )
        elif meeting.output._version != meeting.version:
            problem = (
                f"meet the lot's examples in {meeting.name}, whose result is then modified in place"
            )
        if problem is not None:
            names = sorted(meeting.parameters)
            error = IncompatibleModelError(
                f"Parameter(s) {names} {problem}. Use VmapEngine (exact, any module) instead."
            )
            error.parameters = names  # type: ignore[attr-defined]
            raise error


def _concatenated(meeting: Meeting) -> tuple[list[torch.Tensor], int]:
    listed = list(meeting.args[0]) if meeting.args else list(meeting.kwargs["tensors"])
    dim = meeting.kwargs.get("dim", meeting.args[1] if len(meeting.args) > 1 else 0)
    return listed, int(dim) % meeting.output.dim()


def _additive_scale(meeting: Meeting, position: int) -> float:
    alpha = float(meeting.kwargs.get("alpha", 1.0))
    if meeting.func is torch.Tensor.__rsub__:  # other - alpha * self
        return -alpha if position == 0 else 1.0
    return ADDITIVE[meeting.func] * alpha if position == 1 else 1.0


def _reduce_to(local: torch.Tensor, operand: torch.Tensor, batch_size: int) -> _Rows:
    """Sum ``local`` (the output's shape) over the dims along which ``operand`` was broadcast."""
    aligned = (1,) * (local.dim() - operand.dim()) + tuple(operand.shape)
    dims = [k for k in range(1, local.dim()) if aligned[k] == 1 and local.shape[k] != 1]
    reduced = local.sum(dims, keepdim=True) if dims else local
    if aligned[0] == 1:
        return _Rows(operand, reduced.reshape(batch_size, *operand.shape), diagonal=False)
    return _Rows(operand, reduced.reshape(batch_size, *operand.shape[1:]), diagonal=True)


def _operand_rows(
    meeting: Meeting, position: int, operand: torch.Tensor, backprop: torch.Tensor
) -> _Rows:
    batch_size = backprop.shape[0]
    if meeting.func in CONCATENATE:
        listed, dim = _concatenated(meeting)
        if dim == 0:
            raise IncompatibleModelError(
                f"Parameter(s) {sorted(meeting.parameters)} are concatenated along the batch "
                "dimension; the fast path cannot attribute those rows to examples. Use VmapEngine."
            )
        offset = sum(int(t.shape[dim]) for t in listed[:position])
        return _Rows(operand, backprop.narrow(dim, offset, operand.shape[dim]), diagonal=True)
    if meeting.func in ADDITIVE:
        scale = _additive_scale(meeting, position)
        local = backprop if scale == 1.0 else backprop * scale
    elif meeting.func in WHERE:  # the gradient reaches the operand where it was chosen
        condition = meeting.args[0 if meeting.func is torch.where else 1]
        local = backprop * (~condition if position == 2 else condition)
    else:
        local = backprop * meeting.args[1 - position]
    return _reduce_to(local, operand, batch_size)


def _collapse(rows: _Rows, source: torch.Tensor) -> _Rows:
    """Diagonal rows of an expansion of ``source``, summed back over the expanded dims."""
    expanded = rows.tensor
    aligned = (1,) * (expanded.dim() - source.dim()) + tuple(source.shape)
    dims = [k for k in range(1, expanded.dim()) if aligned[k] == 1 and expanded.shape[k] != 1]
    reduced = rows.rows.sum(dims, keepdim=True) if dims else rows.rows
    batch_size = rows.rows.shape[0]
    if aligned[0] == 1:
        return _Rows(source, reduced.reshape(batch_size, *source.shape), diagonal=False)
    return _Rows(source, reduced.reshape(batch_size, *source.shape[1:]), diagonal=True)


def _dense(rows: _Rows) -> torch.Tensor:
    if not rows.diagonal:
        return rows.rows
    batch_size = rows.rows.shape[0]
    dense = rows.rows.new_zeros(batch_size, *rows.tensor.shape)
    index = torch.arange(batch_size, device=dense.device)
    dense[index, index] = rows.rows
    return dense


def _lookup_rows(lookup: Lookup, rows: _Rows) -> torch.Tensor:
    """``(n, vocabulary, width)`` per-example gradients of an embedding table looked up at
    constant indices: ``sum_t onehot(indices_t) g_{i,t}`` over the lookup's positions t, with
    ``g_i`` example i's gradient with respect to the lookup's output (its own row of it where
    the rows are diagonal) and the padding row left at zero: ``torch.nn.functional.embedding``'s
    backward, one example at a time."""
    assert lookup.indices is not None
    size, width = rows.rows.shape[0], lookup.weight.shape[1]
    values = rows.rows.reshape(size, -1, width)
    if rows.diagonal:  # example i's own lookup: indices[i]
        indices = lookup.indices.reshape(size, -1)
    else:  # one lookup every example shares
        indices = lookup.indices.reshape(1, -1).expand(size, -1)
    if lookup.padding_idx is not None:
        values = torch.where(
            (indices == lookup.padding_idx).unsqueeze(-1),
            torch.zeros((), dtype=values.dtype),
            values,
        )
    owners = torch.arange(size, device=indices.device).unsqueeze(1).expand_as(indices)
    dense = values.new_zeros(size, *lookup.weight.shape)
    return dense.index_put_((owners, indices), values, accumulate=True)


def pull_back(
    tensor: torch.Tensor, rows: torch.Tensor, parameters: Sequence[nn.Parameter]
) -> list[torch.Tensor | None]:
    """``(n, *p.shape)`` per-example gradients of ``parameters`` through ``tensor``'s graph.

    Args:
        tensor: computed from ``parameters`` (and constants) only, its graph retained.
        rows: ``(n, *tensor.shape)``, example i's gradient with respect to ``tensor``.
        parameters: the parameters to pull back to.

    Returns:
        per parameter, its ``(n, *shape)`` rows, or ``None`` when ``tensor`` does not use it.
    """
    try:
        return list(
            torch.autograd.grad(
                tensor,
                list(parameters),
                grad_outputs=rows.to(tensor.dtype),
                is_grads_batched=True,
                retain_graph=True,
                allow_unused=True,
            )
        )
    except RuntimeError:  # an op without a batching rule: one small backward per example
        per_example = [
            torch.autograd.grad(
                tensor,
                list(parameters),
                grad_outputs=row.to(tensor.dtype),
                retain_graph=True,
                allow_unused=True,
            )
            for row in rows
        ]
        return [
            None if column[0] is None else torch.stack(list(column))
            for column in zip(*per_example, strict=True)
        ]


def independent_rows(
    meetings: Sequence[Meeting],
    backprops: Mapping[int, torch.Tensor],
    dataflow: BatchDataflow,
    parameters: Mapping[str, nn.Parameter],
) -> dict[str, torch.Tensor]:
    """Per-example gradients ``(n, *shape)`` of the parameters reached through ``meetings``.

    Args:
        meetings: supported meetings (see :func:`refuse_unsupported`); ``F.linear`` and
            convolution meetings are skipped (:mod:`~dpcore.torch.per_example.layer_meetings`
            takes them).
        backprops: ``id(meeting.output) -> d(sum_i loss_i)/d output``.
        dataflow: the forward's :class:`BatchDataflow` (for expansions and sources).
        parameters: trainable parameters by name.
    """
    found: dict[str, torch.Tensor] = {}
    by_id = {id(p): name for name, p in parameters.items()}
    for meeting in meetings:
        if meeting.func in LINEAR or meeting.func in CONVOLUTION:  # see layer_meetings
            continue
        backprop = backprops[id(meeting.output)]
        for position, operand in meeting.operands:
            rows = _operand_rows(meeting, position, operand, backprop)
            while rows.diagonal:
                source = dataflow.expanded_from(rows.tensor)
                if source is None:
                    break
                rows = _collapse(rows, source)
            lookup = dataflow.lookup(rows.tensor)
            if lookup is not None and lookup.indices is not None:
                # an embedding of constant indices (a position table, token types of a
                # batch-sized buffer): the table's per-example gradients by the lookup's own
                # rule, without a batched backward (and no B x B rows for a per-example lookup)
                names = [by_id[id(lookup.weight)]]
                gradients: list[torch.Tensor | None] = [_lookup_rows(lookup, rows)]
                for name, gradient in zip(names, gradients, strict=True):
                    if gradient is not None:
                        found[name] = found[name] + gradient if name in found else gradient
                continue
            dense = _dense(rows)
            if id(rows.tensor) in by_id:
                names = [by_id[id(rows.tensor)]]
                gradients = [dense]
            else:
                names = sorted(dataflow.sources(rows.tensor))
                gradients = pull_back(rows.tensor, dense, [parameters[n] for n in names])
            for name, gradient in zip(names, gradients, strict=True):
                if gradient is not None:
                    found[name] = found[name] + gradient if name in found else gradient
    return found
