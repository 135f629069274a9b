"""Making models differentiable in forward mode (``torch.func.jvp`` under ``vmap``).

The JL engine (:mod:`dpcore.torch.per_example.jl`) needs Jacobian-vector products of the
per-example losses. Several fused kernels have no forward-mode rule: attention's (flash
``scaled_dot_product_attention`` on CPU, ``nn.MultiheadAttention``'s inference fast path);
oneDNN's RNN on CPU, cuDNN's RNN on CUDA ("Cannot access data pointer of Tensor that doesn't
have storage" under vmap) and, with cuDNN off, CUDA's ``_thnn_fused_lstm_cell`` ("Trying to use
forward AD with _thnn_fused_lstm_cell"). :func:`forward_mode_friendly` works around each:

- attention runs on the math kernel, and the MHA fast path is off;
- on CPU it turns oneDNN off (the native CPU LSTM is built from differentiable ops);
- on CUDA it runs every ``nn.LSTM`` through
  :func:`~dpcore.torch.recurrent.decomposed_lstm_forward`, the same recurrence written with
  ``linear``, ``sigmoid`` and ``tanh`` (same parameters, same gate order), and refuses other
  recurrent layers.

Convolutions keep their fast kernels: those have forward-mode rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.layers import native_rnn_kernel
from dpcore.torch.recurrent import decomposed_lstm_forward, decomposed_recurrence
from dpcore.torch.switches import switched

__all__ = ["decomposed_lstm_forward", "forward_mode_friendly"]


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
        with decomposed_recurrence(model, (nn.LSTM,)):
            yield
        return
    if device.type != "cpu":
        yield
        return
    with native_rnn_kernel():
        yield
