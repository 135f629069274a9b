"""Layers whose per-example gradient norms are cheap, for the exact fast clipping path.

:class:`DPLSTM` is a drop-in for a one-layer, batch-first ``nn.LSTM``. It computes the same
function (Hochreiter & Schmidhuber 1997, with a forget gate, as ``nn.LSTM``), but splits each
direction into two modules:

- ``input_projection``: an ``nn.Linear(input_size, 4 * hidden_size)`` applied to the whole
  sequence at once, ``z_t = W_ih x_t + b_ih + b_hh`` (the two biases of ``nn.LSTM`` are merged);
- ``recurrent``: an :class:`IdentityInputLSTM`, an ``nn.LSTM(4 * hidden_size, hidden_size)``
  without bias whose input weight is a *frozen identity*, so its gates are ``z_t + W_hh h_{t-1}``.

The gradient with respect to the recurrent module's input is then exactly the gradient with
respect to the gate pre-activations, ``delta_t = dL/dz_t``, which one ``autograd.grad`` call yields
alongside every other layer's output gradient; the per-example gradient of ``W_hh`` is
``sum_t delta_t h_{t-1}^T`` (a sum of outer products, like a Linear layer over a sequence), so its
norm and the clipped sum need no per-example backward (Li, Tramèr, Liang, Hashimoto 2022, ghost
clipping; Bu, Mao, Zha, Karypis 2023, book-keeping). See
:mod:`dpcore.torch.per_example.layer_handlers`.
"""

from __future__ import annotations

import contextlib
import math
import typing
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.switches import switched
from dpcore.validation import check_count

__all__ = ["DPLSTM", "IdentityInputLSTM"]

LSTMState = tuple[torch.Tensor, torch.Tensor]


@contextlib.contextmanager
def native_rnn_kernel() -> Iterator[None]:
    """Run RNNs with ATen's native CPU kernel instead of oneDNN's fused one.

    oneDNN's fused LSTM backward always computes the input-weight gradient (a 4H x 4H GEMM per
    time step here, for a frozen identity); the native kernel skips it. Measured 1.4x faster on
    :class:`IdentityInputLSTM` (float32, one thread, batch 256, 150 steps, H = 64). The native
    kernel also has forward-mode derivatives (:mod:`dpcore.torch.forward_mode`). Toggled through
    the private switch because the public ``flags()`` context also resets TF32 settings (and warns).
    """
    with switched("mkldnn", torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled, False):
        yield


class IdentityInputLSTM(nn.LSTM):
    """A one-layer, batch-first LSTM whose input is the gate pre-activations ``z_t``.

    ``gates_t = z_t + W_hh h_{t-1}`` with ``z_t`` of size ``4 * hidden_size`` (order i, f, g, o as
    in ``nn.LSTM``); ``weight_ih_l0`` is the identity and is frozen (``requires_grad=False``), and
    there is no bias. Used inside :class:`DPLSTM`; the fast clipping engine reads ``dL/dz_t`` off
    its input.
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        hidden_size = check_count("hidden_size", hidden_size, minimum=1)
        super().__init__(
            4 * hidden_size,
            hidden_size,
            num_layers=1,
            bias=False,
            batch_first=True,
            device=device,
            dtype=dtype,
        )

    def reset_parameters(self) -> None:
        """``W_hh ~ U(-1/sqrt(H), 1/sqrt(H))`` as in ``nn.LSTM``; ``W_ih`` the frozen identity."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            nn.init.uniform_(self.get_parameter("weight_hh_l0"), -bound, bound)
            self.get_parameter("weight_ih_l0").copy_(torch.eye(4 * self.hidden_size))
        self.get_parameter("weight_ih_l0").requires_grad_(False)

    def forward(self, input: Any, hx: Any = None) -> Any:
        with native_rnn_kernel():
            return super().forward(input, hx)


class _LSTMDirection(nn.Module):
    """One direction of :class:`DPLSTM`: ``input_projection`` then ``recurrent``."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        bias: bool,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        self.input_projection = nn.Linear(
            input_size, 4 * hidden_size, bias=bias, device=device, dtype=dtype
        )
        self.recurrent = IdentityInputLSTM(hidden_size, device=device, dtype=dtype)
        bound = 1.0 / math.sqrt(hidden_size)  # nn.LSTM's initialisation, not nn.Linear's
        with torch.no_grad():
            nn.init.uniform_(self.input_projection.weight, -bound, bound)
            if self.input_projection.bias is not None:
                nn.init.uniform_(self.input_projection.bias, -bound, bound)

    def forward(
        self, sequence: torch.Tensor, state: LSTMState | None
    ) -> tuple[torch.Tensor, LSTMState]:
        output, (h_n, c_n) = self.recurrent(self.input_projection(sequence), state)
        return output, (h_n, c_n)


class DPLSTM(nn.Module):
    """A one-layer, batch-first LSTM with the function of ``nn.LSTM`` and cheap per-example norms.

    Same output as ``nn.LSTM(input_size, hidden_size, batch_first=True,
    bidirectional=bidirectional)``: ``(output, (h_n, c_n))`` with ``output`` of shape
    ``(batch, time, D * hidden_size)`` and ``h_n, c_n`` of shape ``(D, batch, hidden_size)``,
    ``D = 2`` if bidirectional else 1. The reverse direction runs on the time-reversed sequence.

    Args:
        input_size: features per time step.
        hidden_size: H, the size of the hidden state.
        bidirectional: add a reverse direction.
        bias: give ``input_projection`` a bias (``nn.LSTM``'s ``b_ih + b_hh``).
        batch_first: must be True (inputs are ``(batch, time, features)``).
        num_layers: must be 1 (stack DPLSTMs for more).

    Raises:
        InvalidParameterError: a size is not a positive integer, ``batch_first`` is False or
            ``num_layers`` is not 1.

    Example:
        >>> import torch
        >>> lstm = DPLSTM(3, 5, bidirectional=True)
        >>> output, (h_n, c_n) = lstm(torch.randn(2, 7, 3))
        >>> tuple(output.shape), tuple(h_n.shape)
        ((2, 7, 10), (2, 2, 5))
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        bidirectional: bool = False,
        bias: bool = True,
        batch_first: bool = True,
        num_layers: int = 1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.input_size = check_count("input_size", input_size, minimum=1)
        self.hidden_size = check_count("hidden_size", hidden_size, minimum=1)
        if batch_first is not True:
            raise InvalidParameterError(
                "batch_first", "to be True (DPLSTM takes (batch, time, features))", batch_first
            )
        if num_layers != 1:
            raise InvalidParameterError(
                "num_layers", "to be 1 (stack several DPLSTM modules instead)", num_layers
            )
        self.bidirectional = bool(bidirectional)
        self.directions = nn.ModuleList(
            _LSTMDirection(input_size, hidden_size, bias=bias, device=device, dtype=dtype)
            for _ in range(2 if self.bidirectional else 1)
        )

    @property
    def _direction_list(self) -> list[_LSTMDirection]:
        return [typing.cast(_LSTMDirection, d) for d in self.directions]

    @property
    def num_directions(self) -> int:
        """D: 2 if bidirectional, else 1."""
        return len(self.directions)

    def forward(
        self, input: torch.Tensor, hx: LSTMState | None = None
    ) -> tuple[torch.Tensor, LSTMState]:
        """Run the LSTM on ``input`` of shape ``(batch, time, input_size)``.

        Args:
            input: the sequence batch.
            hx: optional initial ``(h_0, c_0)``, each of shape ``(D, batch, hidden_size)``
                (zeros if omitted).
        """
        if input.dim() != 3 or input.shape[-1] != self.input_size:
            raise InvalidParameterError(
                "input", f"of shape (batch, time, {self.input_size})", tuple(input.shape)
            )
        if hx is not None:
            expected = (self.num_directions, input.shape[0], self.hidden_size)
            for name, state in zip(("h_0", "c_0"), hx, strict=True):
                if tuple(state.shape) != expected:
                    raise InvalidParameterError(name, f"of shape {expected}", tuple(state.shape))
        outputs, finals_h, finals_c = [], [], []
        for index, direction in enumerate(self.directions):
            sequence = input if index == 0 else input.flip(1)
            initial = None if hx is None else (hx[0][index : index + 1], hx[1][index : index + 1])
            output, (h_n, c_n) = direction(sequence, initial)
            outputs.append(output if index == 0 else output.flip(1))
            finals_h.append(h_n)
            finals_c.append(c_n)
        return torch.cat(outputs, dim=-1), (torch.cat(finals_h), torch.cat(finals_c))

    @torch.no_grad()
    def load_lstm_weights(self, lstm: nn.LSTM) -> None:
        """Copy the weights of a matching one-layer ``nn.LSTM``, so both compute the same function.

        ``W_ih -> input_projection.weight``, ``b_ih + b_hh -> input_projection.bias``,
        ``W_hh -> recurrent.weight_hh_l0``, per direction.

        Raises:
            InvalidParameterError: ``lstm`` does not have the same sizes, directions and bias.
        """
        matches = (
            isinstance(lstm, nn.LSTM)
            and lstm.num_layers == 1
            and lstm.proj_size == 0
            and lstm.input_size == self.input_size
            and lstm.hidden_size == self.hidden_size
            and lstm.bidirectional == self.bidirectional
            and lstm.bias == (self._direction_list[0].input_projection.bias is not None)
        )
        if not matches:
            raise InvalidParameterError(
                "lstm", "a one-layer nn.LSTM with the same sizes, directions and bias", lstm
            )
        for index, direction in enumerate(self._direction_list):
            suffix = "_l0" + ("_reverse" if index == 1 else "")
            direction.input_projection.weight.copy_(getattr(lstm, "weight_ih" + suffix))
            direction.recurrent.get_parameter("weight_hh_l0").copy_(
                getattr(lstm, "weight_hh" + suffix)
            )
            if direction.input_projection.bias is not None:
                direction.input_projection.bias.copy_(
                    getattr(lstm, "bias_ih" + suffix) + getattr(lstm, "bias_hh" + suffix)
                )
