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

from dpcore.torch.batches import flat_rows
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.per_example.dataflow import OperationCall

__all__ = [
    "AddmmHandler",
    "ConvHandler",
    "LayerCall",
    "LayerHandler",
    "LinearHandler",
    "NormStrategy",
    "NormalizationHandler",
    "OuterFactors",
    "ParameterTerm",
    "broadcast_rows",
    "check_batch_first",
    "concatenate",
    "materialized_term",
    "outer_product_term",
    "unfold_conv_input",
    "unfold_patches",
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
        batch_dim: the dimension of ``target`` that indexes the examples (1 for a layer on
            sequence-first data); ``saved`` is batch-first, and the engine moves the backprop's
            batch dimension first before the handler sees it.
        rows_per_example: more than 1 when ``target``'s first dimension holds each example's
            rows one after another, this many per example (a layer called on the lot's tokens
            flattened to ``(batch * T, d)``, as OPT's feed-forward layers are); ``saved`` is then
            ``(batch, T, ...)``, and the engine unflattens the backprop the same way.
    """

    saved: tuple[Any, ...]
    target: torch.Tensor
    batch_dim: int = 0
    rows_per_example: int = 1


@dataclasses.dataclass(frozen=True)
class OuterFactors:
    """A per-example gradient kept as the factors of ``G_i = sum_t b_{i,t} a_{i,t}^T``, a
    ``(d_out, d_in)`` matrix in the parameter's own (row-major) layout.

    Two such gradients of one parameter (a weight used twice: GPT-2's token table, read by its
    embedding and by the tied output layer) have the inner product
    ``<G_i, G'_i> = sum_{t,s} (a_t . a'_s)(b_t . b'_s)``, so the norm of their sum needs no
    ``G_i`` (:mod:`dpcore.torch.per_example.combined_terms`).

    Attributes:
        activations: ``(batch, T, d_in)``, the ``a``'s.
        backprops: ``(batch, T, d_out)``, the ``b``'s; ``None`` when ``indices`` give them.
        indices: ``(batch, T)`` integers: ``b_t`` is the one-hot vector of ``indices[:, t]``
            (an embedding's lookups: row ``x_t`` of ``G_i`` gets ``a_t``); else ``None``.
        d_out: the length of each ``b``.
    """

    activations: torch.Tensor
    backprops: torch.Tensor | None
    indices: torch.Tensor | None
    d_out: int

    @property
    def steps(self) -> int:
        """``T``, the number of outer products summed."""
        return int(self.activations.shape[1])

    @property
    def d_in(self) -> int:
        """The length of each ``a``."""
        return int(self.activations.shape[2])


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
        factors: the ``G_i`` as outer-product factors where the rule has them (then a
            parameter used in several places gets the norm of its summed gradient from inner
            products instead of ``rows``), else ``None``.
    """

    name: str
    squared_norms: torch.Tensor
    weighted_sum: WeightedSum
    rows: Callable[[], torch.Tensor]
    factors: OuterFactors | None = None


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

    squared = torch.linalg.vector_norm(flat_rows(per_example), dim=1).square()  # no temporary
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
    outer = (
        OuterFactors(activations[:, 0], backprops[:, 0], None, int(d_out))
        if activations.shape[1] == 1
        else None
    )
    cheaper_to_materialize = steps > 1 and steps * (d_in + d_out) > d_in * d_out
    if strategy == "materialize" or (strategy == "auto" and cheaper_to_materialize):
        per_example = backprops.transpose(-1, -2) @ activations  # (batch, groups, d_out, d_in)
        return dataclasses.replace(materialized_term(name, per_example, shape), factors=outer)
    if steps == 1:  # ||b a^T||^2 = |a|^2 |b|^2
        squared = (activations.square().sum(-1) * backprops.square().sum(-1)).sum((1, 2))
    else:
        gram_a = activations @ activations.transpose(-1, -2)
        gram_b = backprops @ backprops.transpose(-1, -2)
        squared = (gram_a * gram_b).sum((1, 2, 3))

    def weighted_sum(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        # sum_{i,t} c_i b_{i,t} a_{i,t}^T: the clip factors scale the narrower side
        kept_b, kept_a = zero_dropped_rows(backprops, keep), zero_dropped_rows(activations, keep)
        if d_out <= d_in:
            kept_b = kept_b * broadcast_rows(factors.to(backprops.dtype), backprops)
        else:
            kept_a = kept_a * broadcast_rows(factors.to(activations.dtype), activations)
        return torch.einsum("bgto,bgti->goi", kept_b, kept_a).reshape(shape)

    def rows() -> torch.Tensor:
        per_example = backprops.transpose(-1, -2) @ activations
        return per_example.reshape(per_example.shape[0], *shape)

    return ParameterTerm(name, squared, weighted_sum, rows, outer)


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

    #: The torch functions through which a handled module uses its trainable parameters, read
    #: by :meth:`capture_operation` (whatever module class issues them: a subclass, a library's
    #: own layer). Empty: :meth:`capture` reads the module's own call (DPLSTM's handler).
    operations: frozenset[Any] = frozenset()

    def capture_operation(self, module: nn.Module, call: OperationCall, output: Any) -> LayerCall:
        """Save what one call of an :attr:`operations` function needs, and name the target.

        Args:
            module: the module whose call issued the operation (its configuration).
            call: the operation, which took every trainable parameter of ``module``.
            output: the module call's output.
        """
        return self.capture(module, call.args, call.kwargs, call.result)

    def batch_dim_movable(self, call: LayerCall) -> bool:
        """Whether the call's first saved tensor (its input) and its backprop may have their
        batch dimension moved first: a per-position operation over the last dimensions."""
        return False

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
    """``F.linear`` (``nn.Linear`` and its subclasses) on ``(batch, d)`` or ``(batch, ..., d)``:
    the middle dims are time steps."""

    operations = frozenset({functional.linear})

    def batch_dim_movable(self, call: LayerCall) -> bool:
        return True

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
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        d_out, d_in = weight.shape
        activations, backprops = [], []
        for call, backprop in calls:
            inputs = check_batch_first(call.saved[0], batch_size, path, "an input")
            activations.append(inputs.reshape(batch_size, 1, -1, d_in))
            backprops.append(backprop.reshape(batch_size, 1, -1, d_out))
        a, b = concatenate(activations, dim=2), concatenate(backprops, dim=2)
        return _affine_terms(module, a, b, trainable=trainable, strategy=strategy)


def _affine_terms(
    module: nn.Module,
    activations: torch.Tensor,
    backprops: torch.Tensor,
    *,
    trainable: set[str],
    strategy: NormStrategy,
    transposed: bool = False,
) -> list[ParameterTerm]:
    """Terms of ``s = a W^T + b`` (or ``a W + b`` when ``transposed``): ``(batch, 1, T, d)``."""
    terms = []
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if "weight" in trainable and isinstance(weight, torch.Tensor):
        # W of shape (in, out) has G_i = sum_t a_t b_t^T: the same term, the roles swapped.
        left, right = (backprops, activations) if transposed else (activations, backprops)
        terms.append(
            outer_product_term("weight", left, right, shape=weight.shape, strategy=strategy)
        )
    if "bias" in trainable and isinstance(bias, torch.Tensor):
        terms.append(materialized_term("bias", backprops.sum((1, 2)), bias.shape))
    return terms


class AddmmHandler(LayerHandler):
    """``torch.addmm(bias, x, weight)``: ``x @ W + b`` with a weight of shape ``(in, out)``.

    Transformers' ``Conv1D`` (GPT-2's attention and MLP projections) flattens its input
    ``(batch, ..., in)`` to rows, calls ``addmm`` and views the result back; the rows of one
    example are the time steps of a Linear layer (the trial lots check that the flattening kept
    the examples' rows together).
    """

    operations = frozenset({torch.addmm})

    def capture_operation(self, module: nn.Module, call: OperationCall, output: Any) -> LayerCall:
        rows = call.argument(1, "mat1")
        beta, alpha = call.kwargs.get("beta", 1), call.kwargs.get("alpha", 1)
        if call.argument(2, "mat2") is not getattr(module, "weight", None) or (beta, alpha) != (
            1,
            1,
        ):
            raise IncompatibleModelError(
                f"A {type(module).__name__} calls torch.addmm other than as "
                "addmm(bias, x, weight) (with beta = alpha = 1); the fast path has no rule for it."
            )
        view = isinstance(output, torch.Tensor) and output._base is call.result
        return LayerCall((rows.detach(),), output if view else call.result)

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        raise NotImplementedError("AddmmHandler reads the addmm call (capture_operation)")

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
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        d_in, d_out = weight.shape
        activations, backprops = [], []
        for call, backprop in calls:
            rows = call.saved[0]
            if rows.dim() != 2 or rows.shape[0] % batch_size:
                raise IncompatibleModelError(
                    f"Module {path!r} multiplied rows of shape {tuple(rows.shape)}, which do not "
                    f"split into the lot's {batch_size} examples; the fast path needs them "
                    "batch-first. Use VmapEngine (exact, any module) instead."
                )
            activations.append(rows.reshape(batch_size, 1, -1, d_in))
            backprops.append(backprop.reshape(batch_size, 1, -1, d_out))
        a, b = concatenate(activations, dim=2), concatenate(backprops, dim=2)
        return _affine_terms(module, a, b, trainable=trainable, strategy=strategy, transposed=True)


def unfold_conv_input(module: nn.Conv1d | nn.Conv2d, inputs: torch.Tensor) -> torch.Tensor:
    """The patches a convolution module multiplies by its weight: ``(batch, L, C_in * prod(k))``.

    Padding as the module does it (any ``padding_mode``, ``'same'`` included); a Conv1d is
    unfolded as a 2-D convolution of height 1.
    """
    pads = list(module._reversed_padding_repeated_twice)
    if any(pads):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        inputs = functional.pad(inputs, pads, mode=mode)
    spatial = 1 if isinstance(module, nn.Conv1d) else 2
    return unfold_patches(
        inputs,
        ConvGeometry(
            tuple(module.kernel_size), tuple(module.stride), (0,) * 2 * spatial, module.dilation
        ),
    )


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """A convolution's kernel, stride, zero padding and dilation, per spatial dimension.

    Attributes:
        kernel, stride, dilation: one entry per spatial dimension (1 or 2).
        padding: ``(left, right)`` pairs, last spatial dimension first (``F.pad``'s order).
    """

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @classmethod
    def of_call(cls, call: OperationCall, kernel: tuple[int, ...]) -> ConvGeometry:
        """The geometry of ``F.conv1d``/``F.conv2d(input, weight, bias, stride, padding,
        dilation, groups)`` as called (``padding`` an int, a tuple, ``'valid'`` or ``'same'``)."""
        spatial = len(kernel)

        def per_dimension(value: Any) -> tuple[int, ...]:
            if isinstance(value, int):
                return (value,) * spatial
            return tuple(int(v) for v in value)

        stride = per_dimension(call.argument(3, "stride", 1))
        dilation = per_dimension(call.argument(5, "dilation", 1))
        padding = call.argument(4, "padding", 0)
        if padding == "valid":
            pairs = [(0, 0)] * spatial
        elif padding == "same":  # as PyTorch pads: the odd element on the right
            totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
            pairs = [(total // 2, total - total // 2) for total in totals]
        else:
            pairs = [(p, p) for p in per_dimension(padding)]
        flat = tuple(side for pair in reversed(pairs) for side in pair)
        return cls(kernel, stride, flat, dilation)


def unfold_patches(inputs: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    """The patches ``(batch, L, C_in * prod(kernel))`` of a 1-D or 2-D convolution's input.

    The input is zero-padded by ``geometry.padding``; a 1-D convolution is unfolded as a 2-D
    one of height 1.
    """
    if any(geometry.padding):
        inputs = functional.pad(inputs, list(geometry.padding))
    kernel, dilation, stride = geometry.kernel, geometry.dilation, geometry.stride
    if len(kernel) == 1:
        inputs = inputs.unsqueeze(2)
        kernel, dilation, stride = (1, *kernel), (1, *dilation), (1, *stride)
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
    """``F.conv1d`` / ``F.conv2d`` (``nn.Conv1d``, ``nn.Conv2d`` and subclasses): any stride,
    padding, dilation, groups; a padding mode other than zeros is the module's ``F.pad`` before
    the call.

    Unfolded, a convolution is a Linear layer per group over the ``L`` output positions. The
    geometry is read from the call itself, so a subclass that pads its own way (``'same'`` for
    any input size) is handled too.
    """

    operations = frozenset({functional.conv1d, functional.conv2d})

    def capture_operation(self, module: nn.Module, call: OperationCall, output: Any) -> LayerCall:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or call.argument(1, "weight") is not weight:
            raise IncompatibleModelError(
                f"A {type(module).__name__} convolves with a tensor other than its weight "
                "parameter; the fast path has no rule for it."
            )
        geometry = ConvGeometry.of_call(call, tuple(weight.shape[2:]))
        groups = int(call.argument(6, "groups", 1))
        return LayerCall((call.argument(0, "input").detach(), geometry, groups), call.result)

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        raise NotImplementedError("ConvHandler reads the convolution call (capture_operation)")

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
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        out_channels = weight.shape[0]
        activations, backprops = [], []
        groups = 1
        for call, backprop in calls:
            inputs = check_batch_first(call.saved[0], batch_size, path, "an input")
            geometry, groups = call.saved[1], call.saved[2]
            if inputs.dim() != 2 + len(geometry.kernel):
                raise IncompatibleModelError(
                    f"Module {path!r} received an unbatched input of shape "
                    f"{tuple(inputs.shape)}; the fast path needs a batch dimension."
                )
            patches = unfold_patches(inputs, geometry)
            positions = patches.shape[1]
            activations.append(patches.view(batch_size, positions, groups, -1).transpose(1, 2))
            backprops.append(
                backprop.reshape(batch_size, groups, out_channels // groups, positions)
            )
        a = concatenate(activations, dim=2)  # (batch, groups, L, d_in)
        b = concatenate(backprops, dim=3).transpose(-1, -2)  # (batch, groups, L, d_out)
        terms = []
        if "weight" in trainable:
            terms.append(outer_product_term("weight", a, b, shape=weight.shape, strategy=strategy))
        bias = getattr(module, "bias", None)
        if "bias" in trainable and isinstance(bias, torch.Tensor):
            bias_rows = b.sum(2).reshape(batch_size, -1)
            terms.append(materialized_term("bias", bias_rows, bias.shape))
        return terms


class NormalizationHandler(LayerHandler):
    """``F.layer_norm``, ``F.group_norm``, ``F.rms_norm`` (``nn.LayerNorm``, ``nn.GroupNorm``,
    ``nn.RMSNorm`` and subclasses, e.g. a channels-first LayerNorm that permutes around the
    call): their affine parameters, materialised.

    With ``x_hat`` the normalised input of the call (recomputed without affine, with the call's
    shape or groups and eps), the per-example gradients are ``sum b * x_hat`` (weight) and
    ``sum b`` (bias) over the positions that share a parameter.
    """

    operations = frozenset({functional.layer_norm, functional.group_norm, functional.rms_norm})

    def batch_dim_movable(self, call: LayerCall) -> bool:
        return call.saved[1] is not functional.group_norm  # group_norm's dim 1 is channels

    def capture_operation(self, module: nn.Module, call: OperationCall, output: Any) -> LayerCall:
        inputs = call.argument(0, "input").detach()
        if call.func is functional.rms_norm:
            eps = call.argument(3, "eps")
        else:
            eps = call.argument(4, "eps", 1e-5)
        spec: int | tuple[int, ...]
        if call.func is functional.group_norm:
            spec = int(call.argument(1, "num_groups"))
        else:
            spec = tuple(call.argument(1, "normalized_shape"))
        return LayerCall((inputs, call.func, spec, eps), call.result)

    def capture(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> LayerCall:
        raise NotImplementedError("NormalizationHandler reads the call (capture_operation)")

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
            func, spec, eps = call.saved[1:]
            if func is functional.group_norm:
                normalized = functional.group_norm(inputs, spec, eps=eps)
                shared = range(2, inputs.dim())
            else:
                if inputs.dim() <= len(spec):
                    raise IncompatibleModelError(
                        f"Module {path!r} received an unbatched input of shape "
                        f"{tuple(inputs.shape)}; the fast path needs a batch dimension."
                    )
                normalized = func(inputs, spec, eps=eps)
                shared = range(1, inputs.dim() - len(spec))
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
