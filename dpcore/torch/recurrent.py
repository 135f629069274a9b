"""Recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) computed step by step from elementary ops.

PyTorch's recurrent kernels (native, oneDNN, cuDNN) have no batching rule for ``torch.func.vmap``
(GRU and RNN fail; the native LSTM's in-place state updates fail in float64; cuDNN's kernels
fail on CUDA) and no forward-mode rule on CUDA. :func:`decomposed_forward` computes the same
recurrence as the module, with the same parameters, from ``linear``, ``sigmoid``, ``tanh`` and
``relu``, which vmap batches and forward mode differentiates, and whose products with the weights
are batch-first ``F.linear`` calls (the input projection of all steps at once, then the recurrent
weight once a step), which the fast path's data flow attributes to examples;
:func:`decomposed_recurrence` routes a model's recurrent layers through it while open. Equal
to the modules' own forward to float rounding (tested in float64 against each layer kind,
batch-first or not, both directions, several layers, with and without bias).

The recurrences (PyTorch documentation; the weights hold the gates in this order):

- ``nn.LSTM`` (i, f, g, o): ``i, f, g, o = split(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``,
  ``c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g)``, ``h_t = sigmoid(o) tanh(c_t)``;
- ``nn.GRU`` (r, z, n): ``r = sigmoid(W_ir x_t + b_ir + W_hr h + b_hr)``, ``z`` likewise,
  ``n = tanh(W_in x_t + b_in + r (W_hn h + b_hn))``, ``h_t = (1 - z) n + z h_{t-1}``;
- ``nn.RNN``: ``h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)`` (or ``relu``).

The reverse direction of a bidirectional layer runs the same over reversed time, and layer k + 1
reads layer k's outputs, with dropout between layers when training.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.errors import IncompatibleModelError

__all__ = [
    "decomposed_forward",
    "decomposed_layers",
    "decomposed_lstm_forward",
    "decomposed_recurrence",
]

State = tuple[torch.Tensor, ...]
Step = Callable[[torch.Tensor, State, torch.Tensor, torch.Tensor | None], State]


def _lstm_step(
    projected: torch.Tensor, state: State, recurrent: torch.Tensor, bias: torch.Tensor | None
) -> State:
    h, c = state
    i, f, g, o = (projected + functional.linear(h, recurrent, bias)).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _gru_step(
    projected: torch.Tensor, state: State, recurrent: torch.Tensor, bias: torch.Tensor | None
) -> State:
    (h,) = state
    x_r, x_z, x_n = projected.chunk(3, dim=-1)
    h_r, h_z, h_n = functional.linear(h, recurrent, bias).chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return ((1 - z) * n + z * h,)


def _rnn_step(nonlinearity: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    def step(
        projected: torch.Tensor, state: State, recurrent: torch.Tensor, bias: torch.Tensor | None
    ) -> State:
        (h,) = state
        return (nonlinearity(projected + functional.linear(h, recurrent, bias)),)

    return step


def _check(module: nn.RNNBase, input: Any) -> None:
    name = type(module).__name__
    if not isinstance(module, nn.LSTM | nn.GRU | nn.RNN):
        raise IncompatibleModelError(
            f"the decomposed recurrence covers nn.LSTM, nn.GRU and nn.RNN, not {name}"
        )
    if isinstance(input, nn.utils.rnn.PackedSequence):
        raise IncompatibleModelError(
            f"the decomposed {name} does not take PackedSequence input; pad the sequences "
            "instead (or train on the loop engine)"
        )
    if getattr(module, "proj_size", 0):
        raise IncompatibleModelError(
            f"the decomposed {name} needs proj_size = 0, got {module.proj_size}"
        )


def decomposed_forward(module: nn.RNNBase, input: Any, hx: Any = None) -> tuple[torch.Tensor, Any]:
    """``module(input, hx)`` for an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN``, step by step.

    Supports batched and unbatched input, ``batch_first``, several layers, both directions, with
    or without bias, and the initial state ``hx`` (``(h_0, c_0)`` for an LSTM).

    Raises:
        IncompatibleModelError: another recurrent layer kind, packed sequences, or an LSTM with
            ``proj_size > 0``.
    """
    _check(module, input)
    lstm = isinstance(module, nn.LSTM)
    step: Step
    if lstm:
        step = _lstm_step
    elif isinstance(module, nn.GRU):
        step = _gru_step
    else:
        step = _rnn_step(torch.tanh if module.nonlinearity == "tanh" else torch.relu)
    unbatched = input.dim() == 2
    if unbatched:
        examples_first = input.unsqueeze(0)
    else:
        examples_first = input if module.batch_first else input.transpose(0, 1)
    directions = 2 if module.bidirectional else 1
    shape = (module.num_layers * directions, examples_first.shape[0], module.hidden_size)
    if hx is None:
        # zeros that carry the examples (a sum over no elements, exact whatever the input), so
        # that the first step's product with the recurrent weight is an example's, as the others
        no_elements = examples_first[:, :1, :0].sum(-1, keepdim=True).transpose(0, 1)
        zeros = examples_first.new_zeros(shape) + no_elements
        initial: State = (zeros,) * (2 if lstm else 1)
    else:
        given = hx if lstm else (hx,)
        initial = tuple(state.unsqueeze(1) for state in given) if unbatched else tuple(given)
    # Examples first throughout (batch, time, features): every product with a weight is then
    # batch-first, whatever the module's layout.
    layer_input, last = examples_first, []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"l{layer}" + ("_reverse" if direction else "")
            bias_ih = getattr(module, f"bias_ih_{suffix}") if module.bias else None
            bias_hh = getattr(module, f"bias_hh_{suffix}") if module.bias else None
            recurrent = getattr(module, f"weight_hh_{suffix}")
            projected = functional.linear(
                layer_input, getattr(module, f"weight_ih_{suffix}"), bias_ih
            )
            index = layer * directions + direction
            state = tuple(part[index] for part in initial)
            length = projected.shape[1]
            hidden: list[torch.Tensor] = [state[0]] * length
            for t in reversed(range(length)) if direction else range(length):
                state = step(projected[:, t], state, recurrent, bias_hh)
                hidden[t] = state[0]
            outputs.append(torch.stack(hidden, dim=1))
            last.append(state)
        layer_input = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        if module.dropout and module.training and layer < module.num_layers - 1:
            # drawn on the time-first layout, as the modules' kernels draw it (same masks)
            time_first = layer_input.transpose(0, 1).contiguous()
            dropped = functional.dropout(time_first, p=module.dropout, training=True)
            layer_input = dropped.transpose(0, 1)
    final = tuple(torch.stack([state[k] for state in last]) for k in range(len(initial)))
    if unbatched:
        layer_input = layer_input.squeeze(0)
        final = tuple(part.squeeze(1) for part in final)
    elif not module.batch_first:
        layer_input = layer_input.transpose(0, 1)
    return layer_input, (final if lstm else final[0])


def decomposed_lstm_forward(
    module: nn.LSTM, input: Any, hx: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`decomposed_forward` of an ``nn.LSTM``: ``(output, (h_n, c_n))``."""
    output, state = decomposed_forward(module, input, hx)
    return output, state


@contextlib.contextmanager
def decomposed_recurrence(
    model: nn.Module, kinds: tuple[type[nn.RNNBase], ...] = (nn.LSTM, nn.GRU, nn.RNN)
) -> Iterator[None]:
    """While open, every recurrent layer of ``model`` of ``kinds`` runs
    :func:`decomposed_forward` (an instance ``forward``, removed on exit; an instance forward
    the model had is restored)."""
    with decomposed_layers([module for module in model.modules() if isinstance(module, kinds)]):
        yield


@contextlib.contextmanager
def decomposed_layers(layers: Sequence[nn.RNNBase]) -> Iterator[None]:
    """While open, each of ``layers`` runs :func:`decomposed_forward` (as
    :func:`decomposed_recurrence`, for a chosen list of layers)."""
    own = [module.__dict__.get("forward") for module in layers]
    for module in layers:
        module.forward = types.MethodType(decomposed_forward, module)
    try:
        yield
    finally:
        for module, previous in zip(layers, own, strict=True):
            del module.forward
            if previous is not None:
                module.forward = previous
