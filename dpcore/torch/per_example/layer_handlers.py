"""Per-layer rules for exact per-example gradient norms and clipped sums, without per-example
backward.

For a layer with output ``s = module(a)`` inside a model whose examples are independent, the
gradient of ``sum_i loss_i`` with respect to ``s`` has, in row i, the gradient of ``loss_i`` alone
(the "backprop" ``b_i``). Each parameter's per-example gradient is a cheap function of example i's
activations and backprops, e.g. ``G_i = sum_t b_{i,t} a_{i,t}^T`` for a Linear layer over a
sequence (Goodfellow 2015, Efficient per-example gradient computations). A handler gives, per
trainable parameter, the squared norms ``||G_i||^2`` and ``sum_i c_i G_i`` for clip factors ``c``:

- outer-product layers (Linear, Conv via unfolding; the recurrent weight of
  :class:`~dpcore.torch.layers.IdentityInputLSTM` in
  :mod:`~dpcore.torch.per_example.sequence_handlers`): the *ghost norm*
  ``||G_i||^2 = sum_{t,s} (a_t . a_s)(b_t . b_s)`` from two ``T x T`` Gram matrices, or ``G_i``
  materialised, whichever costs less (Li, Tramèr, Liang, Hashimoto 2022, ghost clipping, "mixed
  ghost clipping" of Bu, Mao, Zha, Karypis 2022); the clipped sum is ``sum_{i,t} c_i b_{i,t}
  a_{i,t}^T``, one GEMM like the non-private weight gradient (Bu, Mao, Zha, Karypis 2023,
  book-keeping (BK) DP);
- Embedding (in :mod:`~dpcore.torch.per_example.sequence_handlers`):
  ``||G_i||^2 = sum_{t,s} [x_t = x_s] (b_t . b_s)``, or the rows of ``G_i`` summed by index; the
  clipped sum is an ``index_add`` of ``c_i b_{i,t}``;
- normalisation layers (LayerNorm, GroupNorm, RMSNorm): the per-example gradients are as small as
  the parameters, so they are materialised from the normalised input.

Rows of dropped examples (``keep`` False, non-finite) are zeroed before weighting, so that
``0 * nan`` cannot poison the sum.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.errors import IncompatibleModelError

__all__ = [
    "ConvHandler",
    "LayerCall",
    "LayerHandler",
    "LinearHandler",
    "NormStrategy",
    "NormalizationHandler",
    "ParameterTerm",
    "broadcast_rows",
    "check_batch_first",
    "concatenate",
    "materialized_term",
    "outer_product_term",
    "unfold_conv_input",
    "zero_dropped_rows",
]

NormStrategy = Literal["auto", "ghost", "materialize"]
"""``"ghost"``: Gram-matrix norms; ``"materialize"``: per-example gradients; ``"auto"``: cheaper."""

WeightedSum = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """One forward call of a supported module.

    Attributes:
        saved: what the handler keeps from the forward (detached activations, indices, ...).
        target: the tensor whose gradient (the backprop) the handler needs.
    """

    saved: tuple[Any, ...]
    target: torch.Tensor


@dataclasses.dataclass(frozen=True)
class ParameterTerm:
    """One parameter's per-example squared gradient norms and its clipped-sum rule.

    Attributes:
        name: the parameter's name within its module, e.g. ``"weight"``.
        squared_norms: ``(batch,)`` ``||G_i||^2``.
        weighted_sum: ``(factors, keep) -> sum_i c_i G_i`` in the parameter's shape; ``keep`` is
            ``None`` when every example is kept, else a ``(batch,)`` bool mask of kept rows.
        rows: ``() -> (batch, *shape)``, the ``G_i`` materialised (needed when a parameter also
            gets gradient elsewhere, so that norms are taken of the sum).
    """

    name: str
    squared_norms: torch.Tensor
    weighted_sum: WeightedSum
    rows: Callable[[], torch.Tensor]


def broadcast_rows(vector: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(batch,)`` reshaped to broadcast over the rows of ``like``."""
    return vector.view(-1, *([1] * (like.dim() - 1)))


def zero_dropped_rows(rows: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Zero the rows of dropped examples (``torch.where``, so NaN rows become exact zeros)."""
    if keep is None:
        return rows
    return torch.where(broadcast_rows(keep, rows), rows, torch.zeros((), dtype=rows.dtype))


def materialized_term(name: str, per_example: torch.Tensor, shape: torch.Size) -> ParameterTerm:
    """A term from materialised per-example gradients ``(batch, ...)``."""

    def weighted_sum(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        rows = zero_dropped_rows(per_example, keep)
        total: torch.Tensor = torch.tensordot(factors.to(rows.dtype), rows, dims=1)
        return total.reshape(shape)

    squared = torch.linalg.vector_norm(per_example.flatten(1), dim=1).square()  # no temporary
    return ParameterTerm(
        name, squared, weighted_sum, lambda: per_example.reshape(per_example.shape[0], *shape)
    )


def outer_product_term(
    name: str,
    activations: torch.Tensor,
    backprops: torch.Tensor,
    *,
    shape: torch.Size,
    strategy: NormStrategy,
) -> ParameterTerm:
    """The term of ``G_i = sum_t b_{i,t} a_{i,t}^T`` per group (Linear, Conv, recurrent weight).

    Args:
        name: the parameter's name in its module.
        activations: ``(batch, groups, T, d_in)``.
        backprops: ``(batch, groups, T, d_out)``.
        shape: the parameter's shape (``groups * d_out * d_in`` elements).
        strategy: ``"ghost"`` (Gram matrices, cost ~ T^2 (d_in + d_out)), ``"materialize"``
            (``G_i``, cost ~ T d_in d_out) or ``"auto"`` (the cheaper; Li et al. 2022).
    """
    steps, d_in, d_out = activations.shape[2], activations.shape[3], backprops.shape[3]
    cheaper_to_materialize = steps > 1 and steps * (d_in + d_out) > d_in * d_out
    if strategy == "materialize" or (strategy == "auto" and cheaper_to_materialize):
        per_example = backprops.transpose(-1, -2) @ activations  # (batch, groups, d_out, d_in)
        return materialized_term(name, per_example, shape)
    if steps == 1:  # ||b a^T||^2 = |a|^2 |b|^2
        squared = (activations.square().sum(-1) * backprops.square().sum(-1)).sum((1, 2))
    else:
        gram_a = activations @ activations.transpose(-1, -2)
        gram_b = backprops @ backprops.transpose(-1, -2)
        squared = (gram_a * gram_b).sum((1, 2, 3))

    def weighted_sum(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        scaled = zero_dropped_rows(backprops, keep) * broadcast_rows(
            factors.to(backprops.dtype), backprops
        )
        return torch.einsum("bgto,bgti->goi", scaled, zero_dropped_rows(activations, keep)).reshape(
            shape
        )

    def rows() -> torch.Tensor:
        per_example = backprops.transpose(-1, -2) @ activations
        return per_example.reshape(per_example.shape[0], *shape)

    return ParameterTerm(name, squared, weighted_sum, rows)


def check_batch_first(tensor: torch.Tensor, batch_size: int, path: str, what: str) -> torch.Tensor:
    """Check that ``tensor``'s first dimension is the batch."""
    if tensor.dim() < 1 or tensor.shape[0] != batch_size:
        raise IncompatibleModelError(
            f"Module {path!r} received {what} of shape {tuple(tensor.shape)}, whose first "
            f"dimension is not the batch size {batch_size}; the fast path needs batch-first "
            "layers. Use VmapEngine (exact, any module) instead."
        )
    return tensor


def _sum_except_batch(tensor: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    return tensor.sum(tuple(dims)) if dims else tensor


class LayerHandler(abc.ABC):
    """Captures one module type's forward calls and turns them into :class:`ParameterTerm`.

    A module called several times in one forward (shared weights) contributes the sum of its
    calls' gradients; handlers stack the calls along the time axis (or add materialised rows).
    """

    #: Whether the handler's target is the module's *input* (which must then require grad).
    target_is_input: bool = False

    def check(self, module: nn.Module, path: str, trainable: set[str]) -> None:  # noqa: B027
        """Raise :class:`IncompatibleModelError` if this module's configuration is unsupported."""

    @abc.abstractmethod
    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        """Save what the forward call needs (detached) and name the target tensor."""

    @abc.abstractmethod
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
        """Terms of the trainable parameters from ``(call, backprop)`` pairs (at least one)."""


class LinearHandler(LayerHandler):
    """``nn.Linear`` on ``(batch, d)`` or ``(batch, ..., d)``: the middle dims are time steps."""

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        return LayerCall((args[0].detach(),), output)

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
        assert isinstance(module, nn.Linear)
        activations, backprops = [], []
        for call, backprop in calls:
            inputs = check_batch_first(call.saved[0], batch_size, path, "an input")
            activations.append(inputs.reshape(batch_size, 1, -1, module.in_features))
            backprops.append(backprop.reshape(batch_size, 1, -1, module.out_features))
        a, b = concatenate(activations, dim=2), concatenate(backprops, dim=2)
        terms = []
        if "weight" in trainable:
            terms.append(
                outer_product_term("weight", a, b, shape=module.weight.shape, strategy=strategy)
            )
        if "bias" in trainable and module.bias is not None:
            terms.append(materialized_term("bias", b.sum((1, 2)), module.bias.shape))
        return terms


def unfold_conv_input(module: nn.Conv1d | nn.Conv2d, inputs: torch.Tensor) -> torch.Tensor:
    """The patches a convolution multiplies by its weight: ``(batch, L, C_in * prod(kernel))``.

    Padding as the module does it (any ``padding_mode``, ``'same'`` included); a Conv1d is
    unfolded as a 2-D convolution of height 1.
    """
    pads = list(module._reversed_padding_repeated_twice)
    if any(pads):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        inputs = functional.pad(inputs, pads, mode=mode)
    if isinstance(module, nn.Conv1d):
        inputs = inputs.unsqueeze(2)
        kernel, dilation, stride = (
            (1, module.kernel_size[0]),
            (1, module.dilation[0]),
            (1, module.stride[0]),
        )
    else:
        kernel, dilation, stride = module.kernel_size, module.dilation, module.stride  # type: ignore[assignment]
    # Strided windows (B, C, H_out, W_out, k_h, k_w), a view; one copy to the GEMM layout. Faster
    # on CPU than functional.unfold (im2col), measured 2x on an MNIST convolution.
    windows = inputs.unfold(2, dilation[0] * (kernel[0] - 1) + 1, stride[0])
    windows = windows.unfold(3, dilation[1] * (kernel[1] - 1) + 1, stride[1])
    windows = windows[..., :: dilation[0], :: dilation[1]]
    batch, channels, rows, columns = windows.shape[:4]
    patches = windows.permute(0, 2, 3, 1, 4, 5)  # kernel columns stay contiguous in the copy
    return patches.reshape(batch, rows * columns, channels * kernel[0] * kernel[1])


def concatenate(tensors: Sequence[torch.Tensor], *, dim: int) -> torch.Tensor:
    """``torch.cat``, without a copy for a single tensor (a module called once)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors), dim=dim)


class ConvHandler(LayerHandler):
    """``nn.Conv1d`` / ``nn.Conv2d`` (any stride, padding, dilation, groups, padding mode).

    Unfolded, a convolution is a Linear layer per group over the ``L`` output positions.
    """

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        return LayerCall((args[0].detach(),), output)

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
        assert isinstance(module, nn.Conv1d | nn.Conv2d)
        groups = module.groups
        batched_dims = 3 if isinstance(module, nn.Conv1d) else 4
        activations, backprops = [], []
        for call, backprop in calls:
            inputs = check_batch_first(call.saved[0], batch_size, path, "an input")
            if inputs.dim() != batched_dims:
                raise IncompatibleModelError(
                    f"Module {path!r} received an unbatched input of shape "
                    f"{tuple(inputs.shape)}; the fast path needs a batch dimension."
                )
            patches = unfold_conv_input(module, inputs)
            positions = patches.shape[1]
            activations.append(patches.view(batch_size, positions, groups, -1).transpose(1, 2))
            backprops.append(
                backprop.reshape(batch_size, groups, module.out_channels // groups, positions)
            )
        a = concatenate(activations, dim=2)  # (batch, groups, L, d_in)
        b = concatenate(backprops, dim=3).transpose(-1, -2)  # (batch, groups, L, d_out)
        terms = []
        if "weight" in trainable:
            terms.append(
                outer_product_term("weight", a, b, shape=module.weight.shape, strategy=strategy)
            )
        if "bias" in trainable and module.bias is not None:
            bias_rows = b.sum(2).reshape(batch_size, -1)
            terms.append(materialized_term("bias", bias_rows, module.bias.shape))
        return terms


class NormalizationHandler(LayerHandler):
    """``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.RMSNorm``: their affine parameters, materialised.

    With ``x_hat`` the normalised input (recomputed without affine), the per-example gradients are
    ``sum b * x_hat`` (weight) and ``sum b`` (bias) over the positions that share a parameter.
    """

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        return LayerCall((args[0].detach(),), output)

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
        weight_rows: torch.Tensor | int = 0
        bias_rows: torch.Tensor | int = 0
        for call, backprop in calls:
            inputs = check_batch_first(call.saved[0], batch_size, path, "an input")
            if isinstance(module, nn.GroupNorm):
                normalized = functional.group_norm(inputs, module.num_groups, eps=module.eps)
                shared = range(2, inputs.dim())
            else:
                assert isinstance(module, nn.LayerNorm | nn.RMSNorm)
                shape = tuple(module.normalized_shape)
                if inputs.dim() <= len(shape):
                    raise IncompatibleModelError(
                        f"Module {path!r} received an unbatched input of shape "
                        f"{tuple(inputs.shape)}; the fast path needs a batch dimension."
                    )
                if isinstance(module, nn.LayerNorm):
                    normalized = functional.layer_norm(inputs, shape, eps=module.eps)
                else:
                    normalized = functional.rms_norm(inputs, shape, eps=module.eps)
                shared = range(1, inputs.dim() - len(shape))
            if "weight" in trainable:
                weight_rows = weight_rows + _sum_except_batch(backprop * normalized, shared)
            if "bias" in trainable:
                bias_rows = bias_rows + _sum_except_batch(backprop, shared)
        terms = []
        for name, rows in (("weight", weight_rows), ("bias", bias_rows)):
            if isinstance(rows, torch.Tensor):
                parameter = getattr(module, name)
                terms.append(materialized_term(name, rows.reshape(batch_size, -1), parameter.shape))
        return terms
