"""Making models differentiable in forward mode (``torch.func.jvp`` under ``vmap``).

The JL engine (:mod:`dpcore.torch.per_example.jl`) needs Jacobian-vector products of the
per-example losses. Several fused kernels have no forward-mode rule: attention's (flash
``scaled_dot_product_attention`` on CPU, ``nn.MultiheadAttention``'s inference fast path);
oneDNN's RNN on CPU, cuDNN's RNN on CUDA ("Cannot access data pointer of Tensor that doesn't
have storage" under vmap) and, with cuDNN off, CUDA's ``_thnn_fused_lstm_cell`` ("Trying to use
forward AD with _thnn_fused_lstm_cell"). :func:`forward_mode_friendly` works around each:

- attention runs on the math kernel, and the MHA fast path is off;
- on CPU it turns oneDNN off (the native CPU LSTM is built from differentiable ops);
- on CUDA it runs every ``nn.LSTM`` through :func:`decomposed_lstm_forward`, the same recurrence
  written with ``linear``, ``sigmoid`` and ``tanh`` (same parameters, same gate order), and
  refuses other recurrent layers, which have no such fallback.

Convolutions keep their fast kernels: those have forward-mode rules.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.layers import native_rnn_kernel
from dpcore.torch.switches import switched

__all__ = ["decomposed_lstm_forward", "forward_mode_friendly"]


def decomposed_lstm_forward(
    module: nn.LSTM, input: Any, hx: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``module(input, hx)`` computed step by step from elementary ops.

    The recurrence of ``nn.LSTM`` (PyTorch documentation; gates i, f, g, o in that order):
    ``i, f, g, o = split(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``,
    ``c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g)``, ``h_t = sigmoid(o) tanh(c_t)``; the
    reverse direction of a bidirectional layer runs the same over reversed time, and layer
    ``k + 1`` reads layer k's outputs (with dropout between layers when training).

    Supports batched and unbatched input, ``batch_first``, several layers, both directions, with
    or without bias. Raises :class:`IncompatibleModelError` for packed sequences and
    ``proj_size > 0``.
    """
    if isinstance(input, nn.utils.rnn.PackedSequence):
        raise IncompatibleModelError(
            "the decomposed LSTM (forward-mode fallback on CUDA) does not take PackedSequence "
            "input; pad the sequences instead"
        )
    if module.proj_size:
        raise IncompatibleModelError(
            f"the decomposed LSTM (forward-mode fallback on CUDA) needs proj_size = 0, got "
            f"{module.proj_size}"
        )
    unbatched = input.dim() == 2
    if unbatched:
        steps_first = input.unsqueeze(1)
    else:
        steps_first = input.transpose(0, 1) if module.batch_first else input
    directions = 2 if module.bidirectional else 1
    batch = steps_first.shape[1]
    if hx is None:
        shape = (module.num_layers * directions, batch, module.hidden_size)
        h0 = c0 = steps_first.new_zeros(shape)
    else:
        h0, c0 = (state.unsqueeze(1) for state in hx) if unbatched else hx
    layer_input, h_last, c_last = steps_first, [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"l{layer}" + ("_reverse" if direction else "")
            bias = None
            if module.bias:
                bias = getattr(module, f"bias_ih_{suffix}") + getattr(module, f"bias_hh_{suffix}")
            recurrent = getattr(module, f"weight_hh_{suffix}")
            projected = functional.linear(layer_input, getattr(module, f"weight_ih_{suffix}"), bias)
            index = layer * directions + direction
            h, c = h0[index], c0[index]
            length = projected.shape[0]
            hidden: list[torch.Tensor] = [h] * length
            for t in reversed(range(length)) if direction else range(length):
                i, f, g, o = (projected[t] + functional.linear(h, recurrent)).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                hidden[t] = h
            outputs.append(torch.stack(hidden))
            h_last.append(h)
            c_last.append(c)
        layer_input = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        if module.dropout and module.training and layer < module.num_layers - 1:
            layer_input = functional.dropout(layer_input, p=module.dropout, training=True)
    h_n, c_n = torch.stack(h_last), torch.stack(c_last)
    if unbatched:
        return layer_input.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
    output = layer_input.transpose(0, 1) if module.batch_first else layer_input
    return output, (h_n, c_n)


#: the scaled-dot-product-attention backends that have a switch in this torch
_SDPA_BACKENDS = tuple(
    name
    for name in ("cudnn", "flash", "mem_efficient", "math", "overrideable")
    if hasattr(torch._C, f"_get_{name}_sdp_enabled") and hasattr(torch._C, f"_set_sdp_use_{name}")
)


@contextlib.contextmanager
def _attention_in_elementary_ops() -> Iterator[None]:
    """Attention without fused kernels while open: neither ``nn.MultiheadAttention``'s inference
    fast path nor the flash/memory-efficient ``scaled_dot_product_attention`` kernels have a
    forward-mode rule; the math kernel is made of differentiable ops.
    """
    mha = torch.backends.mha
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            switched("mha.fastpath", mha.get_fastpath_enabled, mha.set_fastpath_enabled, False)
        )
        for backend in _SDPA_BACKENDS:  # what sdpa_kernel(SDPBackend.MATH) sets
            stack.enter_context(
                switched(
                    f"sdp.{backend}",
                    getattr(torch._C, f"_get_{backend}_sdp_enabled"),
                    getattr(torch._C, f"_set_sdp_use_{backend}"),
                    backend == "math",
                )
            )
        yield


@contextlib.contextmanager
def forward_mode_friendly(
    model: nn.Module, device: torch.device, *, decompose_lstm: bool | None = None
) -> Iterator[None]:
    """While open, ``model`` can be differentiated in forward mode under vmap on ``device``.

    Attention runs on the math kernel (:func:`_attention_in_elementary_ops`).
    See :func:`_recurrent_forward_mode` for recurrent layers.
    """
    with (
        _attention_in_elementary_ops(),
        _recurrent_forward_mode(model, device, decompose_lstm=decompose_lstm),
    ):
        yield


@contextlib.contextmanager
def _recurrent_forward_mode(
    model: nn.Module, device: torch.device, *, decompose_lstm: bool | None = None
) -> Iterator[None]:
    """Recurrent layers made differentiable in forward mode under vmap on ``device``.

    ``decompose_lstm`` (default: on CUDA only) routes every ``nn.LSTM`` through
    :func:`decomposed_lstm_forward`; otherwise on CPU oneDNN is turned off. Everything is
    restored on exit.

    Raises:
        IncompatibleModelError: a recurrent layer other than ``nn.LSTM`` on CUDA, or an
            ``nn.LSTM`` in training mode with inter-layer dropout there (on CPU the native,
            oneDNN and decomposed recurrences draw the same masks from torch's generator).
    """
    recurrent = [module for module in model.modules() if isinstance(module, nn.RNNBase)]
    decompose = device.type == "cuda" if decompose_lstm is None else decompose_lstm
    if not recurrent:
        yield
        return
    if decompose:
        other = sorted({type(m).__name__ for m in recurrent if not isinstance(m, nn.LSTM)})
        if other:
            raise IncompatibleModelError(
                f"forward-mode products through {', '.join(other)} are not available on "
                f"{device.type} (PyTorch's fused kernels have no forward-mode rule and dpcore "
                "decomposes only nn.LSTM); use nn.LSTM or run the JL engine on CPU"
            )
        lstms = [module for module in recurrent if isinstance(module, nn.LSTM)]
        dropping = [m for m in lstms if m.training and m.dropout > 0 and m.num_layers > 1]
        if device.type == "cuda" and dropping:
            raise IncompatibleModelError(
                "nn.LSTM with dropout between its layers, training, on CUDA: cuDNN draws those "
                "masks from its own state, so the decomposed recurrence could not replay them and "
                "the clipped gradient would not be the one whose norm was estimated; use "
                "dropout=0 (nn.Dropout between single-layer LSTMs is replayed exactly) or the CPU"
            )
        own = [module.__dict__.get("forward") for module in lstms]  # instance overrides, if any
        for module in lstms:
            module.forward = types.MethodType(decomposed_lstm_forward, module)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for module, previous in zip(lstms, own, strict=True):
                del module.forward
                if previous is not None:
                    module.forward = previous  # type: ignore[method-assign]
        return
    if device.type != "cpu":
        yield
        return
    with native_rnn_kernel():
        yield
