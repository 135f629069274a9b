"""Handlers for sequence layers: ``nn.Embedding`` and the recurrent weight of ``DPLSTM``.

See :mod:`dpcore.torch.per_example.layer_handlers` for the interface and the shared terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.layers import IdentityInputLSTM
from dpcore.torch.per_example.layer_handlers import (
    LayerCall,
    LayerHandler,
    NormStrategy,
    OuterFactors,
    ParameterTerm,
    broadcast_rows,
    check_batch_first,
    concatenate,
    outer_product_term,
    zero_dropped_rows,
)

__all__ = ["EmbeddingHandler", "IdentityInputLSTMHandler"]


class EmbeddingHandler(LayerHandler):
    """``F.embedding`` of ``nn.Embedding`` (and subclasses), dense, without ``max_norm`` or
    ``scale_grad_by_freq``; honours ``padding_idx``."""

    operations = frozenset({functional.embedding})

    def check(self, module: nn.Module, path: str, trainable: set[str]) -> None:
        assert isinstance(module, nn.Embedding)
        if module.sparse or module.max_norm is not None or module.scale_grad_by_freq:
            raise IncompatibleModelError(
                f"Module {path!r} is an nn.Embedding with sparse=True, max_norm or "
                "scale_grad_by_freq (which scales by counts over the whole lot, mixing examples); "
                "the fast path supports none of them. Use VmapEngine or a plain nn.Embedding."
            )

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        return LayerCall((args[0],), output)

    def terms(
        self,
        module: nn.Module,
        calls: Sequence[tuple[LayerCall, torch.Tensor]],
        *,
        path: str,
        batch_size: int,
        trainable: set[str],
        strategy: NormStrategy,
    ) -> list[ParameterTerm]:
        assert isinstance(module, nn.Embedding)
        vocabulary, width = module.num_embeddings, module.embedding_dim
        indices = concatenate(
            [
                check_batch_first(c.saved[0], batch_size, path, "indices").reshape(batch_size, -1)
                for c, _ in calls
            ],
            dim=1,
        )
        backprops = concatenate([b.reshape(batch_size, -1, width) for _, b in calls], dim=1)
        if module.padding_idx is not None:  # the padding row receives no gradient
            backprops = torch.where(
                (indices == module.padding_idx).unsqueeze(-1),
                torch.zeros((), dtype=backprops.dtype),
                backprops,
            )
        steps = indices.shape[1]
        # G_i = sum_t e_{x_t} b_t^T: one-hot "backprops" at the indices, the b's as activations
        outer = OuterFactors(backprops, None, indices, vocabulary)
        if strategy == "ghost" or (strategy == "auto" and steps < 4):
            same = indices.unsqueeze(2) == indices.unsqueeze(1)
            squared = ((backprops @ backprops.transpose(1, 2)) * same).sum((1, 2))

            def weighted_sum(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
                scaled = zero_dropped_rows(backprops, keep) * broadcast_rows(
                    factors.to(backprops.dtype), backprops
                )
                total = backprops.new_zeros(vocabulary, width)
                return total.index_add_(0, indices.flatten(), scaled.reshape(-1, width))

            def dense_rows() -> torch.Tensor:
                owners = torch.arange(batch_size, device=indices.device).unsqueeze(1)
                dense = backprops.new_zeros(batch_size, vocabulary, width)
                return dense.index_put_(
                    (owners.expand_as(indices), indices), backprops, accumulate=True
                )

            return [ParameterTerm("weight", squared, weighted_sum, dense_rows, outer)]
        # Materialise the non-zero rows of each G_i: one row per distinct (example, index) pair.
        owner = torch.arange(batch_size, device=indices.device).unsqueeze(1)
        keys, slot = torch.unique(owner * vocabulary + indices, return_inverse=True)
        rows = backprops.new_zeros(keys.shape[0], width)
        rows.index_add_(0, slot.flatten(), backprops.reshape(-1, width))
        row_owner, row_index = keys // vocabulary, keys % vocabulary
        squared = backprops.new_zeros(batch_size).index_add_(0, row_owner, rows.square().sum(1))

        def sum_rows(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
            weights = factors.to(rows.dtype)[row_owner].unsqueeze(1)
            kept = rows if keep is None else zero_dropped_rows(rows, keep[row_owner])
            return rows.new_zeros(vocabulary, width).index_add_(0, row_index, kept * weights)

        def materialised_rows() -> torch.Tensor:
            dense = rows.new_zeros(batch_size, vocabulary, width)
            return dense.index_put_((row_owner, row_index), rows)

        return [ParameterTerm("weight", squared, sum_rows, materialised_rows, outer)]


class IdentityInputLSTMHandler(LayerHandler):
    """The recurrent weight of :class:`~dpcore.torch.layers.IdentityInputLSTM`.

    Its input is the gate pre-activations ``z_t``, so its input gradient is ``delta_t = dL/dz_t``
    and ``G_i = sum_t delta_{i,t} h_{i,t-1}^T`` with ``h_{i,t-1}`` the output shifted by one step
    (``h_{-1}`` the initial state, zero by default): an outer-product term with ``d_in = H``,
    ``d_out = 4H``.
    """

    target_is_input = True

    def check(self, module: nn.Module, path: str, trainable: set[str]) -> None:
        if "weight_ih_l0" in trainable:
            raise IncompatibleModelError(
                f"Module {path!r} is an IdentityInputLSTM whose identity input weight "
                "weight_ih_l0 was made trainable; keep it frozen (requires_grad=False)."
            )

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        gates = args[0] if args else kwargs["input"]
        state = args[1] if len(args) > 1 else kwargs.get("hx")
        if not isinstance(gates, torch.Tensor):
            raise IncompatibleModelError(
                "IdentityInputLSTM received a packed sequence; the fast path needs a padded "
                "(batch, time, features) tensor."
            )
        initial = None if state is None else state[0].detach()
        return LayerCall((initial, output[0].detach()), gates)

    def terms(
        self,
        module: nn.Module,
        calls: Sequence[tuple[LayerCall, torch.Tensor]],
        *,
        path: str,
        batch_size: int,
        trainable: set[str],
        strategy: NormStrategy,
    ) -> list[ParameterTerm]:
        assert isinstance(module, IdentityInputLSTM)
        previous, deltas = [], []
        for call, backprop in calls:
            initial, hidden = call.saved
            hidden = check_batch_first(hidden, batch_size, path, "an input")
            first = (
                hidden.new_zeros(batch_size, 1, module.hidden_size)
                if initial is None
                else initial.reshape(batch_size, 1, module.hidden_size)
            )
            previous.append(torch.cat([first, hidden[:, :-1]], dim=1).unsqueeze(1))
            deltas.append(backprop.unsqueeze(1))
        if "weight_hh_l0" not in trainable:
            return []
        a, b = concatenate(previous, dim=2), concatenate(deltas, dim=2)
        shape = module.get_parameter("weight_hh_l0").shape
        return [outer_product_term("weight_hh_l0", a, b, shape=shape, strategy=strategy)]
