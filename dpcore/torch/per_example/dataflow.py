"""Which tensors of a forward pass depend on the examples, established from the computation.

Per-example clipping on the fast path reads each layer's activations and output gradients row by
row, so it must know, for every layer call, whether the call carries the lot's examples or is
*batch-independent* (a position table ``pos(torch.arange(T))``, a CLS token, a table through a
Linear). A shape cannot tell: a ``(T, d)`` position table looks like a lot of T examples when
the lot has T examples. :class:`BatchDataflow` instead follows the data: it is a
:class:`~torch.overrides.TorchFunctionMode` that sees every torch operation of the forward and
marks a result *batched* when any operand is batched (the lot's inputs and targets are the
roots), and *independent* when it is computed from trainable parameters and constants only. This
is the rule ``torch.func.vmap`` uses to decide which tensors carry the vmapped dimension.

Where an independent tensor ``u`` meets batched data in one operation (``x + pos``,
``torch.cat([cls, x], 1)``), the operation is recorded as a :class:`Meeting`: example i's
gradient with respect to ``u`` is that operation's output gradient restricted to example i and
pulled back through the operation (:mod:`dpcore.torch.per_example.independent`). ``F.linear(x,
w, b)``, ``F.conv1d`` and ``F.conv2d`` on example data with an independent weight or bias (a
parameter used functionally, a weight computed from parameters, a slice of
``nn.MultiheadAttention``'s packed projection) are meetings too, with the exact rules of a
Linear or convolution layer (:mod:`dpcore.torch.per_example.layer_meetings`).
``F.multi_head_attention_forward`` on example data is computed from the operations it is made
of (:mod:`dpcore.torch.per_example.attention`), so that its projections are such calls.
Meetings through other operations (``x @ W``) are recorded as unsupported, and the fast path
refuses the parameters involved by name.

Only data flow is followed here: whether batched rows really belong to one example each (no
``x - x.mean(0)``) is checked numerically against a one-example-at-a-time loop
(:mod:`dpcore.torch.per_example.trial`).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.nn import functional
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from dpcore.torch.per_example.attention import (
    decomposable,
    multi_head_attention,
    scaled_dot_product_attention,
)

__all__ = [
    "ADDITIVE",
    "CONCATENATE",
    "CONVOLUTION",
    "LINEAR",
    "MULTIPLICATIVE",
    "WHERE",
    "BatchDataflow",
    "Lookup",
    "Meeting",
    "OperationCall",
    "tensors_in",
]

T = torch.Tensor
ADDITIVE = {
    torch.add: 1.0,
    T.add: 1.0,
    T.__add__: 1.0,
    T.__radd__: 1.0,
    T.__iadd__: 1.0,
    T.add_: 1.0,
    torch.sub: -1.0,
    T.sub: -1.0,
    T.__sub__: -1.0,
    T.__isub__: -1.0,
    T.sub_: -1.0,
    T.__rsub__: -1.0,  # other - self: the sign applies to self (args[0])
}
"""Binary ``a ± b`` operations, with the sign of the second operand (``alpha`` multiplies it)."""
MULTIPLICATIVE = frozenset({torch.mul, T.mul, T.__mul__, T.__rmul__, T.__imul__, T.mul_})
CONCATENATE = frozenset({torch.cat, torch.concat, torch.concatenate})
WHERE = frozenset({torch.where, T.where})
"""``torch.where(condition, input, other)`` / ``input.where(condition, other)``, all positional,
with a boolean ``condition``: an independent ``input`` or ``other`` (a relative position bias
under a padding mask, transformers' SDPA path for T5) meets the examples where it is chosen."""
LINEAR = frozenset({functional.linear})
"""``F.linear(x, weight, bias)``: meets the examples in ``x`` (batched, at least 2-D) through an
independent 2-D ``weight`` and/or ``bias``, passed by position."""
CONVOLUTION = frozenset({functional.conv1d, functional.conv2d})
"""``F.conv1d/conv2d(x, weight, bias, ...)``: meets the examples in a batched ``x`` (with its
batch dimension) through an independent ``weight`` and/or ``bias``, passed by position."""
_EXPANSIONS = frozenset({T.expand, T.expand_as, torch.broadcast_to, T.broadcast_to})
_TRANSPOSES = frozenset({T.transpose, torch.transpose, T.swapaxes, torch.swapaxes})
_PERMUTES = frozenset({T.permute, torch.permute})
_LAST_DIM = frozenset({functional.linear})
_SAME_LAYOUT = frozenset(
    {
        *ADDITIVE,
        *MULTIPLICATIVE,
        torch.div,
        T.div,
        T.__truediv__,
        T.__neg__,
        functional.linear,
        functional.layer_norm,
        functional.rms_norm,
        functional.dropout,
        torch.where,
        T.where,
        functional.relu,
        functional.gelu,
        functional.silu,
        torch.relu,
        torch.tanh,
        T.relu,
        T.tanh,
        torch.sigmoid,
        T.sigmoid,
        T.contiguous,
        T.clone,
        T.to,
        T.float,
        T.double,
    }
)
"""Operations whose result has its operands' layout (elementwise, or per position over the last
dimensions, the last of which ``_LAST_DIM`` operations change), with the batched operands' rank:
the batch dimension carries over. Whether the examples stay independent is the trial lots'
check, not this one's."""
_SHAPE_ONLY_SECOND = frozenset({T.expand_as, T.view_as, T.reshape_as, T.type_as})
_RESHAPES = frozenset(
    {
        T.reshape,
        torch.reshape,
        T.view,
        T.view_as,
        T.reshape_as,
        T.flatten,
        torch.flatten,
        T.unflatten,
        torch.unflatten,
    }
)
"""Operations that keep the elements' row-major order and only regroup them into a new shape:
a batched tensor whose examples own consecutive runs of elements (batch dimension 0, or rows
flattened per example) keeps that property, and the result's first dimension says how."""
_CONSTANT_RESULTS = frozenset(
    {
        torch.zeros_like,
        torch.ones_like,
        torch.empty_like,
        torch.full_like,
        T.new_zeros,
        T.new_ones,
        T.new_empty,
        T.new_full,
        T.new_tensor,
        T.size,
        T.dim,
        T.numel,
        T.__len__,
    }
)


@dataclasses.dataclass(frozen=True)
class Meeting:
    """One operation in which batch-independent tensors meet batched data.

    Attributes:
        func: the torch function called.
        args, kwargs: its arguments, as called.
        output: its result (batched).
        operands: ``(position, tensor)`` of the independent operands that require grad;
            ``position`` indexes ``args`` (or, for a concatenation, the list of tensors).
        parameters: names of the trainable parameters those operands are computed from.
        supported: whether :mod:`~dpcore.torch.per_example.independent` has a rule for ``func``.
        version: the output's version counter when recorded (in-place changes afterwards are
            refused).
        batch_dim: the output's batch dimension where its layout was followed (see
            :meth:`BatchDataflow.batch_dim`), else ``None``; the rules need it first.
    """

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: torch.Tensor
    operands: tuple[tuple[int, torch.Tensor], ...]
    parameters: frozenset[str]
    supported: bool
    version: int
    batch_dim: int | None = None

    @property
    def name(self) -> str:
        return str(getattr(self.func, "__qualname__", None) or getattr(self.func, "__name__", "op"))


@dataclasses.dataclass(frozen=True)
class OperationCall:
    """One torch operation, inside a layer's batched call, that took a trainable parameter as an
    operand (``F.linear(x, weight, bias)``, ``torch.addmm(bias, x, weight)``, ...).

    Attributes:
        func: the torch function called.
        args, kwargs: its arguments, as called.
        result: what it returned.
        version: the result's version counter when it was returned (-1 if not a tensor), so
            that an in-place write to it later in the layer's call shows.
    """

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any
    version: int = -1

    @property
    def name(self) -> str:
        return str(getattr(self.func, "__qualname__", None) or getattr(self.func, "__name__", "op"))

    def argument(self, position: int, name: str, default: Any = None) -> Any:
        """The argument at ``position`` (or passed as ``name``), else ``default``."""
        if len(self.args) > position:
            return self.args[position]
        return self.kwargs.get(name, default)

    def operands(self) -> list[torch.Tensor]:
        """The tensors among its arguments."""
        return tensors_in((self.args, self.kwargs))


@dataclasses.dataclass(frozen=True)
class Lookup:
    """``F.embedding(indices, weight)`` with constant ``indices`` (see
    :meth:`BatchDataflow.lookup`); ``padding_idx`` non-negative or ``None``."""

    indices: torch.Tensor | None
    weight: torch.Tensor
    padding_idx: int | None


class _Registry:
    """Tensors by identity, without keeping them alive (ids of freed tensors are reused)."""

    def __init__(self) -> None:
        self._refs: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}

    def get(self, tensor: torch.Tensor) -> Any:
        entry = self._refs.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        return entry[1]

    def put(self, tensor: torch.Tensor, value: Any) -> None:
        self._refs[id(tensor)] = (weakref.ref(tensor), value)

    def drop(self, tensor: torch.Tensor) -> None:
        if self.get(tensor) is not None:
            del self._refs[id(tensor)]


_SCALARS = (int, float, bool, str, torch.dtype, torch.device, slice, type(None), type(...))
#: Results that hold no tensor (a shape is a tuple of ints: not walked).
_NO_TENSORS = (*_SCALARS, torch.Size)


def tensors_in(tree: Any) -> list[torch.Tensor]:
    """The tensors in ``tree``, in order: tuples, lists and dicts (and their subclasses, named
    tuples, ``torch.return_types``) walked directly, anything else by ``torch.utils._pytree``.

    Called on every operation of a traced forward: the direct walk costs a fraction of
    ``tree_leaves`` on the argument tuples torch functions receive.
    """
    if isinstance(tree, torch.Tensor):
        return [tree]
    found: list[torch.Tensor] = []
    _collect(tree, found)
    return found


def _argument_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """``tensors_in((args, kwargs))``, with the common case (tensors and scalars as arguments)
    unrolled."""
    found: list[torch.Tensor] = []
    for item in args:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif not isinstance(item, _SCALARS):
            _collect(item, found)
    if kwargs:
        for item in kwargs.values():
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif not isinstance(item, _SCALARS):
                _collect(item, found)
    return found


def _collect(tree: Any, found: list[torch.Tensor]) -> None:
    items = tree.values() if isinstance(tree, dict) else tree
    if not isinstance(items, (tuple, list, type({}.values()))):
        if not isinstance(tree, _SCALARS):
            found.extend(t for t in tree_leaves(tree) if isinstance(t, torch.Tensor))
        return
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif not isinstance(item, _SCALARS):
            _collect(item, found)


class BatchDataflow(TorchFunctionMode):
    """Marks every tensor of a forward as batched, independent (of the examples) or constant.

    Args:
        roots: the lot's tensors (inputs, targets): batched by definition.
        parameters: ``(name, parameter)`` of the trainable parameters: independent roots.
        copied_meetings: the parameter-name sets of meetings whose result the forward is to go
            on with a copy of (:class:`Meeting` ``parameters``): a meeting whose result a
            previous forward wrote in place (NF-ResNet's ``ReLU(inplace=True)`` after a
            ``ScaledStdConv2d``) keeps its result as recorded.

    While open (``with BatchDataflow(...):``), every torch operation is classified; modules
    with a fast-path handler bracket their batched calls with :meth:`enter_layer` /
    :meth:`exit_layer`, inside which their own use of their weights is not a meeting: the
    operations that take a trainable parameter there are recorded instead
    (:class:`OperationCall`, returned by :meth:`exit_layer`), so that a handler reads the
    operation itself, whichever module issued it.
    """

    def __init__(
        self,
        roots: Iterable[torch.Tensor],
        parameters: Sequence[tuple[str, torch.Tensor]],
        copied_meetings: frozenset[frozenset[str]] = frozenset(),
    ) -> None:
        super().__init__()
        self._batched = _Registry()
        self._sources = _Registry()  # independent tensor -> frozenset of parameter names
        self._expanded_from = _Registry()  # expansion result -> the tensor it expands
        #: embedding of constant indices -> (indices, weight, padding index, version)
        self._lookups = _Registry()
        self._frames: list[list[OperationCall]] = []  # one per open layer call
        self._copying: list[bool] = []  # per open layer call: its operations' results copied
        self._copied_meetings = copied_meetings
        self._parameters: dict[int, torch.Tensor] = {}
        #: batched tensor -> rows per example, where its first dimension holds each example's
        #: rows one after another (the lot's tokens flattened to (batch * T, d))
        self._flattened = _Registry()
        self.meetings: list[Meeting] = []
        roots = list(roots)
        #: the lot's size: the first dimension of its tensors (0: unknown, nothing is flattened)
        self._size = int(roots[0].shape[0]) if roots and roots[0].dim() > 0 else 0
        for tensor in roots:
            self._batched.put(tensor, 0)  # batch dimension (-1: not followed)
        for name, parameter in parameters:
            self._sources.put(parameter, frozenset({name}))
            self._parameters[id(parameter)] = parameter

    def is_batched(self, tensor: Any) -> bool:
        """Whether ``tensor`` was computed from the lot's examples."""
        return isinstance(tensor, torch.Tensor) and self._batched.get(tensor) is not None

    def batch_dim(self, tensor: Any) -> int | None:
        """The dimension of a batched ``tensor`` that indexes the examples, where its layout was
        followed from the lot's tensors (batch first) through operations whose layout is known
        (elementwise, per-position layers, transposes, permutes); else ``None``."""
        if not isinstance(tensor, torch.Tensor):
            return None
        found = self._batched.get(tensor)
        return None if found is None or found < 0 else int(found)

    def rows_per_example(self, tensor: Any) -> int:
        """How many rows of a batched ``tensor``'s first dimension each example owns, one
        example after another, where the data flow followed the lot's examples into a flattened
        first dimension (``x.reshape(-1, d)`` of a ``(batch, T, d)`` tensor: T); else 0."""
        if not isinstance(tensor, torch.Tensor):
            return 0
        found = self._flattened.get(tensor)
        return 0 if found is None else int(found)

    def _flattened_layout(
        self, func: Any, args: tuple[Any, ...], batched: list[torch.Tensor], result: torch.Tensor
    ) -> tuple[int, int]:
        """``(batch dimension, rows per example)`` of a batched ``result`` whose layout
        :meth:`_output_dim` could not follow, else ``(-1, 0)``.

        A regrouping (:data:`_RESHAPES`, row-major order kept) of a tensor whose examples own
        consecutive runs of its elements -- batch-first (followed there, or not followed but
        with the lot's size first: the batch-first reading the fast path checks for any layer
        input it could not follow), or already flattened -- gives a first dimension of
        ``rows * size`` in which each example owns ``rows`` consecutive rows (``x.reshape(-1,
        d)`` of ``(batch, T, d)``: T); at the lot's size it is batch-first again (followed only
        if it was). A same-layout operation on tensors flattened alike stays flattened. The
        trial lots prove the result, as for every layout.
        """
        size, first = self._size, int(result.shape[0]) if result.dim() > 0 else 0
        if not size or not first:
            return -1, 0
        if func in _RESHAPES:
            source = args[0] if args else None
            if not (
                isinstance(source, torch.Tensor) and len(batched) == 1 and batched[0] is source
            ):
                return -1, 0
            rows, dim = self.rows_per_example(source), self._batched.get(source)
            if source.dim() == 0 or not (
                int(source.shape[0]) == size * rows
                if rows
                else dim in (0, -1) and int(source.shape[0]) == size
            ):
                return -1, 0
            if first == size:
                return (0 if dim == 0 and not rows else -1), 0
            return (-1, first // size) if first % size == 0 else (-1, 0)
        if func in _SAME_LAYOUT and self._flattened._refs:  # else no operand is flattened
            found = {self.rows_per_example(t) for t in batched}
            if len(found) == 1 and all(
                t.dim() == result.dim() >= 2 and int(t.shape[0]) == first for t in batched
            ):
                (rows,) = found
                if rows > 1 and first == size * rows:
                    return -1, rows
        return -1, 0

    def sources(self, tensor: Any) -> frozenset[str]:
        """Trainable parameters an independent ``tensor`` is computed from (empty otherwise)."""
        if not isinstance(tensor, torch.Tensor):
            return frozenset()
        found = self._sources.get(tensor)
        return frozenset() if found is None else found

    def expanded_from(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The tensor that ``tensor`` is an ``expand``/``broadcast_to`` of, if recorded."""
        found = self._expanded_from.get(tensor)
        return None if found is None else found()

    def lookup(self, tensor: torch.Tensor) -> Lookup | None:
        """How ``tensor`` was computed if it is ``F.embedding(indices, weight)`` of constant
        indices (no example, no parameter in them) in a trainable ``weight``, with neither
        ``max_norm`` nor ``scale_grad_by_freq``, and not written in place since; else
        ``None``."""
        found = self._lookups.get(tensor)
        if found is None or tensor._version != found[3]:  # written in place since: not a lookup
            return None
        return Lookup(found[0](), found[1], found[2])

    def _record_lookup(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        names = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq")
        values = dict(zip(names, args, strict=False)) | kwargs
        indices, weight = values.get("input"), values.get("weight")
        if not (
            isinstance(result, torch.Tensor)
            and isinstance(indices, torch.Tensor)
            and isinstance(weight, torch.Tensor)
            and self._is_parameter(weight)
            and weight.dim() == 2
            and values.get("max_norm") is None
            and not values.get("scale_grad_by_freq", False)
            and self._batched.get(indices) is None
            and not self.sources(indices)
            and tuple(result.shape) == (*indices.shape, weight.shape[1])
        ):
            return
        padding = values.get("padding_idx")
        if padding is not None:
            padding = int(padding) % weight.shape[0]
        self._lookups.put(result, (weakref.ref(indices), weight, padding, result._version))

    def mark_batched(self, tensor: torch.Tensor) -> None:
        """Declare ``tensor`` batched (for tests and planted bugs that replay shape rules)."""
        self._batched.put(tensor, -1)
        self._sources.drop(tensor)

    def enter_layer(self, copy_results: bool = False) -> None:
        """A handled layer's batched call begins (its weights' use is recorded, not met).

        With ``copy_results``, each recorded operation's result is kept as recorded and the
        layer's own code goes on with a copy, so that an in-place write later in the same call
        (timm's ``GroupNormAct``: an in-place activation after ``F.group_norm``) lands on the
        copy and the recorded result stays the node whose gradient the handler reads.
        """
        self._frames.append([])
        self._copying.append(copy_results)

    def exit_layer(self) -> list[OperationCall]:
        """The innermost open layer call ends: the operations in it that took a parameter."""
        self._copying.pop()
        return self._frames.pop()

    def _is_parameter(self, tensor: torch.Tensor) -> bool:
        return self._parameters.get(id(tensor)) is tensor

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if (
            func is functional.multi_head_attention_forward
            and any(self.is_batched(t) for t in tensors_in((args[:3], kwargs)))
            and decomposable(args, kwargs)
        ):
            with self:  # its operations, one by one (this mode is off inside this method)
                output, weights = multi_head_attention(*args, **kwargs)
            # torch's layout: the output (L, N, E) and the weights (N, ...) by definition
            for tensor, dim in ((output, 1), (weights, 0)):
                if tensor is not None and self.is_batched(tensor):
                    self._batched.put(tensor, dim)
            return output, weights
        if func is functional.scaled_dot_product_attention and self._mask_from_parameters(
            args, kwargs
        ):
            with self:  # its operations, one by one: the mask meets the scores in an addition
                return scaled_dot_product_attention(*args, **kwargs)
        result = func(*args, **kwargs)
        if func in _CONSTANT_RESULTS:
            return result
        if isinstance(result, torch.Tensor):
            outputs = [result]
        else:
            outputs = [] if isinstance(result, _NO_TENSORS) else tensors_in(result)
            if not outputs and getattr(func, "__name__", None) == "__get__":
                return result  # an attribute read (a shape, dtype or flag)
        arguments = _argument_tensors(args, kwargs)
        copy = False  # hand the forward a copy of the result (set by the fast engine's reruns)
        if self._frames and outputs:  # not a shape, dtype or device read
            parameters = self._parameters
            if any(parameters.get(id(t)) is t for t in arguments):
                version = result._version if isinstance(result, torch.Tensor) else -1
                self._frames[-1].append(OperationCall(func, args, kwargs, result, version))
                copy = self._copying[-1]
        operands = tensors_in(args[:1]) if func in _SHAPE_ONLY_SECOND else arguments
        if not operands:
            return result
        # one pass over the operands: their batch dimensions and their sources (inlined
        # _Registry.get: this runs for every operation of every traced forward)
        batched_refs, source_refs = self._batched._refs, self._sources._refs
        batched: list[torch.Tensor] = []
        dims: set[int] = set()
        independent: list[torch.Tensor] = []
        for tensor in operands:
            entry = batched_refs.get(id(tensor))
            if entry is not None and entry[0]() is tensor:
                batched.append(tensor)
                dims.add(entry[1])
            entry = source_refs.get(id(tensor))
            if entry is not None and entry[1] and entry[0]() is tensor:
                independent.append(tensor)
        if func is T.__setitem__ and args and isinstance(args[0], torch.Tensor):
            outputs = [args[0]]  # in place: the target takes the value's dependence
        if batched:
            dim = self._output_dim(func, args, kwargs, batched, result, dims)
            rows = 0
            flattened = bool(self._flattened._refs)
            if dim < 0 and isinstance(result, torch.Tensor) and outputs[0] is result:
                dim, rows = self._flattened_layout(func, args, batched, result)
            for tensor in outputs:
                key = id(tensor)
                batched_refs[key] = (weakref.ref(tensor), dim)
                entry = source_refs.get(key)
                if entry is not None and entry[0]() is tensor:
                    del source_refs[key]
                if rows:
                    self._flattened.put(tensor, rows)
                elif flattened:  # (none recorded: nothing to drop)
                    self._flattened.drop(tensor)
            if independent and not self._frames:
                meeting = self._record(func, args, kwargs, result, independent)
                copy = meeting is not None and meeting.parameters in self._copied_meetings
            if copy and isinstance(result, torch.Tensor):
                return self._handed_copy(result)
        elif independent:
            sources = frozenset().union(*(self.sources(t) for t in independent))
            for tensor in outputs:
                self._sources.put(tensor, sources)
            if func in _EXPANSIONS and isinstance(result, torch.Tensor):
                self._expanded_from.put(result, weakref.ref(args[0]))
            elif func is functional.embedding:
                self._record_lookup(args, kwargs, result)
        return result

    def _mask_from_parameters(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether a ``scaled_dot_product_attention`` call on example data has an ``attn_mask``
        computed from trainable parameters (a relative position bias)."""
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        return (
            isinstance(mask, torch.Tensor)
            and mask.requires_grad
            and bool(self.sources(mask))
            and any(self.is_batched(t) for t in tensors_in((args[:3], kwargs)))
        )

    def _handed_copy(self, result: torch.Tensor) -> torch.Tensor:
        """A copy of a recorded ``result`` for the forward to go on with (batched like it).

        The copy is made where torch's own operations are not seen (in this mode's handler), so
        an in-place write to it later changes neither the recorded result nor its version.
        """
        copy = result.clone()
        self._batched.put(copy, self._batched.get(result))
        return copy

    def _output_dim(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        batched: list[torch.Tensor],
        result: Any,
        dims: set[int],
    ) -> int:
        """The batch dimension of ``func``'s result from its batched operands' (-1: unknown);
        ``dims`` holds those operands' batch dimensions."""
        if len(dims) != 1 or not isinstance(result, torch.Tensor):
            return -1
        dim = int(dims.pop())
        source = batched[0]
        if dim < 0 or result.dim() != source.dim():
            return -1
        rank = source.dim()
        if func in _TRANSPOSES:
            first = args[1] if len(args) > 1 else kwargs.get("dim0")
            second = args[2] if len(args) > 2 else kwargs.get("dim1")
            if not isinstance(first, int) or not isinstance(second, int):
                return -1
            swap = {first % rank: second % rank, second % rank: first % rank}
            return swap.get(dim, dim)
        if func in _PERMUTES:
            order = args[1:] if len(args) > 1 else (kwargs.get("dims"),)
            if len(order) == 1 and isinstance(order[0], (tuple, list)):
                order = tuple(order[0])
            if sorted(int(k) % rank for k in order) != list(range(rank)):
                return -1
            return [int(k) % rank for k in order].index(dim)
        if func in _SAME_LAYOUT and not (func in _LAST_DIM and dim == rank - 1):
            return dim
        return -1

    def _record(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        independent: list[torch.Tensor],
    ) -> Meeting | None:
        differentiable = [t for t in independent if t.requires_grad]
        if not differentiable:
            return None
        parameters = frozenset().union(*(self.sources(t) for t in differentiable))
        if func in CONCATENATE:
            listed = list(args[0]) if args else list(kwargs.get("tensors", ()))
        else:
            listed = list(args)
        positions = tuple(
            (k, item)
            for k, item in enumerate(listed)
            if isinstance(item, torch.Tensor) and any(item is t for t in differentiable)
        )
        supported = (
            isinstance(result, torch.Tensor)
            and len(positions) == len(differentiable)
            and not any(item is result for _, item in positions)  # in place on the table itself
            and (
                func in ADDITIVE
                or func in MULTIPLICATIVE
                or func in CONCATENATE
                or (func in WHERE and _where_meets(func, args, kwargs, positions))
                or (func in LINEAR and _layer_meets(args, positions, 2, None))
                or (func in CONVOLUTION and _layer_meets(args, positions, 3, func))
            )
        )
        output = result if isinstance(result, torch.Tensor) else torch.empty(0)
        meeting = Meeting(
            func,
            args,
            kwargs,
            output,
            positions,
            parameters,
            supported,
            output._version,
            self.batch_dim(output),
        )
        self.meetings.append(meeting)
        return meeting


def _where_meets(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    positions: tuple[tuple[int, torch.Tensor], ...],
) -> bool:
    """``torch.where(c, a, b)`` or ``a.where(c, b)`` with the three arguments positional, a
    boolean tensor ``c``, and the independent operands among ``a`` and ``b``."""
    condition_at = 0 if func is torch.where else 1
    if kwargs or len(args) != 3:
        return False
    condition = args[condition_at]
    if not isinstance(condition, torch.Tensor) or condition.dtype != torch.bool:
        return False
    return all(k != condition_at for k, _ in positions)


def _layer_meets(
    args: tuple[Any, ...],
    positions: tuple[tuple[int, torch.Tensor], ...],
    weight_dims: int,
    convolution: Any,
) -> bool:
    """``F.linear(x, w, b)`` (``convolution`` None) with batched ``x`` (>= 2-D) and a 2-D ``w``,
    or a convolution with a batched ``x`` of ``w.dim()`` dims; independent ``w`` and/or ``b``."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return False
    weight = args[1]
    if not isinstance(weight, torch.Tensor) or not all(k in (1, 2) for k, _ in positions):
        return False
    if convolution is None:
        return args[0].dim() >= 2 and weight.dim() == weight_dims
    spatial = 1 if convolution is functional.conv1d else 2
    return weight.dim() == 2 + spatial and args[0].dim() == 2 + spatial
