"""Exact per-example clipping in about the cost of one forward and backward: ghost norms + BK.

One forward records, for every supported layer, its input activations and output; one
``torch.autograd.grad`` of ``sum_i loss_i`` *with respect to the layer outputs only* gives the
backprops ``b_i`` (row i is the gradient of ``loss_i`` alone, since examples are independent) and
skips the weight-gradient GEMMs. Each layer's handler then computes the exact per-example squared
norms (ghost norms, Li, Tramèr, Liang, Hashimoto 2022; or materialised per-example gradients where
cheaper, "mixed ghost clipping") and, once the clip factors ``c_i = min(1, C / ||g_i||)`` are known,
``sum_i c_i g_i`` straight from the stored activations and backprops, without a second backward
(Bu, Mao, Zha, Karypis 2023, book-keeping (BK) DP). The per-layer rules are in
:mod:`dpcore.torch.per_example.layer_handlers`.

Which calls carry examples is decided from the data flow of every forward
(:mod:`dpcore.torch.per_example.dataflow`), never from a tensor's shape. Requirements: every
trainable parameter is used either through a module with a handler (Linear, Conv1d, Conv2d,
Embedding, LayerNorm, GroupNorm, RMSNorm and their subclasses, transformers' ``Conv1D``,
:class:`~dpcore.torch.layers.DPLSTM`) called on example data, which passes its parameters as they
are to the handled operation (``F.linear``, ``torch.addmm``, ``F.conv2d``, ``F.layer_norm``, ...),
or batch-independently and meeting the examples through ``+``, ``-``, ``*``, ``torch.cat`` or
``torch.where`` under a boolean mask (:mod:`dpcore.torch.per_example.independent`; an
``attn_mask`` of ``F.scaled_dot_product_attention`` computed from parameters is taken through
the attention's definition) or as the weight or bias of an
``F.linear`` or convolution call on example data, as they are or computed from parameters
(standardised, weight-normalised, LoRA-merged; a handled layer that computes its weight is
followed operation by operation) (:mod:`dpcore.torch.per_example.layer_meetings`), or several
of these (tied weights); layers called on example data are batch-first, or, for Linear and
LayerNorm/RMSNorm, have the examples along the dimension the data flow followed them to
(transposes, per-position operations: torch's sequence-first transformer layers) or flattened
with their tokens into the first dimension, each example's rows one after another
(``x.reshape(-1, d)`` of batch-first data: OPT's feed-forward block).
``nn.MultiheadAttention`` (and torch's transformer layers) is taken as its projections and the
parameter-free attention between them (:mod:`dpcore.torch.per_example.attention`); ``nn.LSTM``,
``nn.GRU`` and ``nn.RNN`` run step by step (:func:`~dpcore.torch.recurrent.decomposed_forward`:
the input projection of all steps, then the recurrent weight once a step, each a batch-first
``F.linear``; packed sequences and ``proj_size`` are refused). A layer
whose output or input the forward later writes in place (``nn.ReLU(inplace=True)``,
``x += shortcut``) keeps a copy of it; so does the result of a handled operation written in place
later in its layer's own call (timm's ``GroupNormAct``) or of an ``F.linear`` or convolution with
a computed weight written in place downstream (NF-ResNet's ``ScaledStdConv2d`` before an in-place
ReLU): the forward goes on with a copy. Anything else is refused with the parameter's name, and
``engine="auto"`` then trains on :class:`~dpcore.torch.per_example.vmap.VmapEngine`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dpcore.errors import DPCoreError, InvalidParameterError
from dpcore.torch.batches import Batch, batch_size, call_model, detached, tensors
from dpcore.torch.compat import check_independent_examples
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.layers import IdentityInputLSTM
from dpcore.torch.per_example.base import (
    ClippedBatch,
    LossFunction,
    NonFinitePolicy,
    PerExampleEngine,
    clip_factors,
    per_example_losses,
)
from dpcore.torch.per_example.combined_terms import combined_term
from dpcore.torch.per_example.dataflow import BatchDataflow, Meeting, OperationCall, tensors_in
from dpcore.torch.per_example.independent import independent_rows, refuse_unsupported
from dpcore.torch.per_example.layer_handlers import (
    AddmmHandler,
    ConvHandler,
    LayerCall,
    LayerHandler,
    LinearHandler,
    NormalizationHandler,
    NormStrategy,
    ParameterTerm,
    materialized_term,
)
from dpcore.torch.per_example.layer_meetings import layer_terms
from dpcore.torch.per_example.sequence_handlers import EmbeddingHandler, IdentityInputLSTMHandler
from dpcore.torch.per_example.trial import (
    autocast_dtype,
    close,
    compare_with_loop,
    eval_mode,
    full_precision,
    loop_gradients,
    mismatch,
)
from dpcore.torch.recurrent import decomposed_layers
from dpcore.torch.switches import switched

__all__ = [
    "HANDLERS",
    "NAMED_HANDLERS",
    "FastEngine",
    "fast_path_supports",
    "handler_for",
    "register_handler",
]

HANDLERS: dict[type[nn.Module], LayerHandler] = {
    nn.Linear: LinearHandler(),
    nn.Conv1d: ConvHandler(),
    nn.Conv2d: ConvHandler(),
    nn.Embedding: EmbeddingHandler(),
    nn.LayerNorm: NormalizationHandler(),
    nn.GroupNorm: NormalizationHandler(),
    nn.RMSNorm: NormalizationHandler(),
    IdentityInputLSTM: IdentityInputLSTMHandler(),
}
"""Handlers by module type, subclasses included: the handler reads the operation the module's
call issues (``F.linear``, ``F.conv2d``, ``F.layer_norm``, ...), not the module's ``forward``, and
refuses a call that uses a parameter any other way; the trial lots prove the result."""

NAMED_HANDLERS: dict[str, LayerHandler] = {
    # Hugging Face transformers' GPT-style projection, x @ W + b by torch.addmm, W of shape
    # (in, out); named, so that dpcore does not import transformers.
    "transformers.pytorch_utils.Conv1D": AddmmHandler(),
    "transformers.modeling_utils.Conv1D": AddmmHandler(),
}
"""Handlers of library layer classes by qualified name (``module.QualName``), subclasses too."""


def handler_for(module: nn.Module) -> LayerHandler | None:
    """The handler of ``type(module)`` or its nearest registered base class, or ``None``."""
    for cls in type(module).__mro__:
        found = HANDLERS.get(cls) or NAMED_HANDLERS.get(f"{cls.__module__}.{cls.__qualname__}")
        if found is not None:
            return found
    return None


def register_handler(module_type: type[nn.Module], handler: LayerHandler) -> None:
    """Register ``handler`` for ``module_type`` and its subclasses (replacing a previous one)."""
    HANDLERS[module_type] = handler


@dataclasses.dataclass
class _Layer:
    """A module with trainable parameters, its handler, and its batched calls in this forward."""

    path: str
    module: nn.Module
    handler: LayerHandler
    trainable: dict[str, nn.Parameter]
    calls: list[tuple[LayerCall, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    batched: list[bool] = dataclasses.field(default_factory=list)
    #: Set once a forward wrote in place to this layer's output (``nn.ReLU(inplace=True)``,
    #: ``x += shortcut``): the layer then hands a copy downstream, keeping its output intact.
    copy_output: bool = False
    #: Set once a forward wrote in place to a tensor this layer saved (its input): saved copies.
    copy_saved: bool = False
    #: Set once the layer's own call wrote in place to the result of its handled operation
    #: (timm's ``GroupNormAct``: an in-place activation after ``F.group_norm``): the call then
    #: goes on with a copy of that result (:meth:`BatchDataflow.enter_layer`).
    copy_result: bool = False
    #: Set once the layer's call used its parameters other than as they are in one call of its
    #: handler's operation (a weight computed from them: standardised, normalised, merged): the
    #: layer is then followed operation by operation like unhandled code, its computed weight
    #: meeting the examples in ``F.linear`` or a convolution
    #: (:mod:`~dpcore.torch.per_example.layer_meetings`), and anything else refused by name.
    traced: bool = False


class _RerunError(Exception):
    """A forward changed how layers are recorded (copies kept, a layer traced): run it again."""


def _plan(model: nn.Module) -> list[_Layer]:
    """The modules with a handler that own trainable parameters (checked for configuration).

    Parameters of other modules, or used outside their module, are not refused here: the forward's
    data flow decides whether they are used batch-independently (handled exactly) or not.

    Raises:
        IncompatibleModelError: a handled module's configuration is unsupported.
    """
    layers: list[_Layer] = []
    for path, module in model.named_modules(remove_duplicate=False):
        trainable = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
        handler = handler_for(module)
        if not trainable or handler is None or any(layer.module is module for layer in layers):
            continue
        where = path or "<root>"
        handler.check(module, where, set(trainable))
        layers.append(_Layer(where, module, handler, trainable))
    return layers


def _recurrent_layers(model: nn.Module) -> list[nn.RNNBase]:
    """The ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` layers without a handler of their own: the fast
    path runs them step by step (:func:`~dpcore.torch.recurrent.decomposed_forward`), so that
    their weights meet the examples in batch-first ``F.linear`` calls."""
    return [
        module
        for module in model.modules()
        if isinstance(module, nn.LSTM | nn.GRU | nn.RNN) and handler_for(module) is None
    ]


def fast_path_supports(model: nn.Module) -> bool:
    """Whether every trainable parameter belongs to a module with a fast-path handler, to an
    ``nn.MultiheadAttention`` or to an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` without
    ``proj_size`` (whose calls the fast path decomposes).

    A static hint only: the fast path also handles parameters used batch-independently
    (positions, CLS tokens) and weights computed from parameters, and whether a model is
    accepted is decided on trial lots (:meth:`FastEngine.prepare`).
    """
    try:
        check_independent_examples(model)
        layers = _plan(model)
    except IncompatibleModelError:
        return False
    handled = {id(p) for layer in layers for p in layer.trainable.values()}
    handled |= {
        id(p)
        for module in model.modules()
        if isinstance(module, nn.MultiheadAttention)
        for p in module.parameters(recurse=False)
    }
    handled |= {
        id(p)
        for module in _recurrent_layers(model)
        if not getattr(module, "proj_size", 0)
        for p in module.parameters(recurse=False)
    }
    return all(id(p) in handled for p in model.parameters() if p.requires_grad)


@contextlib.contextmanager
def _ieee_float32() -> Iterator[None]:
    """Full float32 (no TF32) for cuDNN convolutions and CUDA matmuls while open.

    cuDNN convolutions default to TF32 on Ampere and newer GPUs (10-bit mantissa): autograd's
    reference gradient of a large lot then drifts beyond the check's tolerance from our exact
    float32 sums (seen on an H100 at lot 262,144), which would refuse a correct model. Held
    through :func:`~dpcore.torch.switches.switched`, so overlapping blocks on threads restore
    the user's setting.
    """
    backends = [
        (name, backend)
        for name, backend in (
            ("cudnn.conv", getattr(torch.backends.cudnn, "conv", None)),
            ("cuda.matmul", getattr(torch.backends.cuda, "matmul", None)),
        )
        if backend is not None and hasattr(backend, "fp32_precision")
    ]
    with contextlib.ExitStack() as stack:
        for name, backend in backends:
            stack.enter_context(_precision_switch(name, backend))
        yield


def _precision_switch(name: str, backend: Any) -> contextlib.AbstractContextManager[None]:
    """``backend.fp32_precision`` held at "ieee" (:func:`~dpcore.torch.switches.switched`)."""

    def get() -> Any:
        return backend.fp32_precision

    def set_(value: Any) -> None:
        backend.fp32_precision = value

    return switched(f"{name}.fp32_precision", get, set_, "ieee")


def _operation(
    layer: _Layer, operations: list[OperationCall], dataflow: BatchDataflow
) -> OperationCall | None:
    """The one call of a handled operation that takes all of ``layer``'s trainable parameters
    as they are, and no other tensor computed from trainable parameters; else ``None`` (the
    layer uses them another way: a weight computed from a parameter, an operation without a
    rule, several calls).

    Args:
        layer: the layer whose call this was.
        operations: the operations of the call that took a trainable parameter.
        dataflow: the forward's data flow (which tensors are computed from parameters).
    """
    owned = {id(p) for p in layer.trainable.values()}
    using = [op for op in operations if any(id(t) in owned for t in op.operands())]
    if len(using) != 1 or using[0].func not in layer.handler.operations:
        return None
    operands = using[0].operands()
    taken = {id(t) for t in operands}
    computed = [t for t in operands if id(t) not in owned and dataflow.sources(t)]
    return using[0] if owned <= taken and not computed else None


def _versions(call: LayerCall) -> tuple[int, ...]:
    tensors = [call.target, *(s for s in call.saved if isinstance(s, torch.Tensor))]
    return tuple(t._version for t in tensors)


def _widened(tensor: Any, dtype: torch.dtype) -> Any:
    """A low-precision floating tensor (autocast's bf16/fp16) in ``dtype`` (the parameters').

    Norms and clipped sums then accumulate in the parameters' precision (float32), whatever
    precision the forward ran in.
    """
    if (
        isinstance(tensor, torch.Tensor)
        and tensor.is_floating_point()
        and tensor.dtype != dtype
        and torch.finfo(tensor.dtype).bits < torch.finfo(dtype).bits
    ):
        return tensor.to(dtype)
    return tensor


def _widened_call(call: LayerCall, dtype: torch.dtype) -> LayerCall:
    return dataclasses.replace(call, saved=tuple(_widened(s, dtype) for s in call.saved))


def _batch_first(backprop: torch.Tensor, call: LayerCall) -> torch.Tensor:
    """A call's backprop with the examples along its first dimension, as its saved input."""
    if call.rows_per_example > 1:
        return backprop.reshape(-1, call.rows_per_example, *backprop.shape[1:])
    return backprop.movedim(call.batch_dim, 0)


@dataclasses.dataclass
class _Pass:
    """One forward and output-only backward: per-parameter terms, by parameter name."""

    outputs: Batch
    losses: torch.Tensor
    terms: dict[str, ParameterTerm]
    reference: list[torch.Tensor] | None


class FastEngine(PerExampleEngine):
    """Exact clipping from ghost norms and book-keeping: one forward, one output-only backward.

    Which layer calls carry the lot's examples is established from the forward's data flow
    (:mod:`~dpcore.torch.per_example.dataflow`), never from a shape: a call on example data uses
    its layer's handler; a parameter used batch-independently (a position table, a CLS token or
    prompt expanded over the lot, a table through a Linear) gets its exact per-example gradient
    from where it meets the examples (:mod:`~dpcore.torch.per_example.independent`); a parameter
    reached any other way is refused by name. A parameter used in several places (tied
    embeddings, a module called from two paths) has its per-example gradients materialised and
    summed, so its norm is the norm of its whole gradient.

    Args:
        model: the model; its examples must be independent.
        max_grad_norm: the clipping norm C > 0.
        nonfinite: ``"raise"`` (default) or ``"zero"`` for NaN/inf per-example gradients.
        norm_strategy: for sequence/convolution layers, ``"auto"`` (per layer, the cheaper of the
            Gram-matrix ghost norm and the materialised per-example gradient), ``"ghost"`` or
            ``"materialize"`` (forced; both exact).
        verify: on the first lot with finite gradients, check that the unclipped sum equals
            autograd's gradient of ``sum_i loss_i`` for every parameter, and that the per-example
            norms of three examples equal a batch-of-one autograd pass (eval mode), once. This
            backs up the trial lots of :meth:`prepare` on the lot size actually trained with.

    Raises:
        IncompatibleModelError: at :meth:`prepare` (or the first lot), naming the parameter:
            it is used in a way the fast path has no exact rule for, or the engine disagrees
            with a one-example-at-a-time autograd loop.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> engine = FastEngine(model, max_grad_norm=1.0)
        >>> lot = engine.clipped_sum(
        ...     torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]),
        ...     torch.nn.CrossEntropyLoss(reduction="none"))
        >>> bool((lot.norms * lot.clip_factors <= 1.0 + 1e-6).all())
        True
    """

    name = "fast"

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        nonfinite: NonFinitePolicy = "raise",
        norm_strategy: NormStrategy = "auto",
        verify: bool = True,
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
        if norm_strategy not in ("auto", "ghost", "materialize"):
            raise InvalidParameterError(
                "norm_strategy", "in {'auto', 'ghost', 'materialize'}", norm_strategy
            )
        self.norm_strategy: NormStrategy = norm_strategy
        self._layers = _plan(model)
        self._recurrent = _recurrent_layers(model)
        self._names = {id(p): n for n, p in self.named_parameters}  # parameter -> its name
        #: Meetings (by their parameters' names) whose result a forward wrote in place (an
        #: in-place activation after a convolution with a computed weight): later forwards go
        #: on with a copy of the result (:class:`BatchDataflow` ``copied_meetings``).
        self._copied_meetings: set[frozenset[str]] = set()
        self.verify = bool(verify)
        self._verified = not self.verify

    # -- the forward, with the data flow followed -------------------------------------------

    def _before(
        self, layer: _Layer, dataflow: BatchDataflow, module: nn.Module, args: Any, kwargs: Any
    ) -> Any:
        batched = not layer.traced and any(
            dataflow.is_batched(t) for t in tensors_in((args, kwargs))
        )
        layer.batched.append(batched)
        if not batched:
            return None
        dataflow.enter_layer(layer.copy_result)
        first = args[0] if args else None
        if (  # the handler's target (the input) must be a graph node
            layer.handler.target_is_input
            and isinstance(first, torch.Tensor)
            and not first.requires_grad
        ):
            return (first.detach().requires_grad_(), *args[1:]), kwargs
        return None

    def _after(
        self,
        layer: _Layer,
        dataflow: BatchDataflow,
        module: nn.Module,
        args: Any,
        kwargs: Any,
        output: Any,
    ) -> Any:
        if layer.batched.pop():
            operations = dataflow.exit_layer()
            if layer.handler.operations:
                operation = _operation(layer, operations, dataflow)
                if operation is None or not any(
                    dataflow.is_batched(t) for t in operation.operands()
                ):  # from now on, followed operation by operation: a weight computed from its
                    # parameters, or example data passed to the layer but not to its operation
                    # (a position embedding given the token ids for their shape only)
                    layer.traced = True
                    raise _RerunError
                result = operation.result
                if isinstance(result, torch.Tensor) and result._version != operation.version:
                    if not layer.copy_result:  # from now on, the call goes on with a copy
                        layer.copy_result = True
                        raise _RerunError
                    raise mismatch(
                        f"Module {layer.path!r} ({type(layer.module).__name__}) writes in place "
                        f"to the result of {operation.name} within its own call, so the gradient "
                        "of that result is lost. Use VmapEngine (exact, any module) instead.",
                        [self._names[id(p)] for p in layer.trainable.values()],
                    )
                call = layer.handler.capture_operation(module, operation, output)
                dim = dataflow.batch_dim(operation.argument(0, "input"))
                if dim:  # sequence-first data (nn.TransformerEncoderLayer(batch_first=False))
                    if not layer.handler.batch_dim_movable(call):
                        raise mismatch(
                            f"Module {layer.path!r} ({type(layer.module).__name__}) received "
                            f"the examples along dimension {dim}; its handler needs them "
                            "first. Use VmapEngine (exact, any module) instead.",
                            [self._names[id(p)] for p in layer.trainable.values()],
                        )
                    inputs = call.saved[0].movedim(dim, 0)
                    call = LayerCall((inputs, *call.saved[1:]), call.target, dim)
                rows = dataflow.rows_per_example(operation.argument(0, "input"))
                if rows > 1:  # tokens flattened to (batch * T, d): OPT's feed-forward layers
                    if not layer.handler.batch_dim_movable(call):
                        raise mismatch(
                            f"Module {layer.path!r} ({type(layer.module).__name__}) received "
                            "the examples' rows flattened into its first dimension; its "
                            "handler needs them batch-first. Use VmapEngine (exact, any module) "
                            "instead.",
                            [self._names[id(p)] for p in layer.trainable.values()],
                        )
                    inputs = call.saved[0].reshape(-1, rows, *call.saved[0].shape[1:])
                    call = LayerCall((inputs, *call.saved[1:]), call.target, 0, rows)
            else:
                call = layer.handler.capture(module, args, kwargs, output)
            if layer.copy_saved:
                copies = tuple(s.clone() if isinstance(s, torch.Tensor) else s for s in call.saved)
                call = dataclasses.replace(call, saved=copies)
            layer.calls.append((call, _versions(call)))
            if layer.copy_output and call.target is output:
                return output.clone()  # in-place writes downstream land on the copy
        return None

    def _forward(
        self, inputs: Batch, targets: Batch, loss_fn: LossFunction
    ) -> tuple[torch.Tensor, torch.Tensor, BatchDataflow]:
        dataflow = BatchDataflow(
            (*tensors(inputs), *tensors(targets)),
            self.named_parameters,
            frozenset(self._copied_meetings),
        )
        handles = []
        for layer in self._layers:
            layer.calls, layer.batched = [], []
            before = functools.partial(self._before, layer, dataflow)
            after = functools.partial(self._after, layer, dataflow)
            handles.append(layer.module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(layer.module.register_forward_hook(after, with_kwargs=True))
        try:
            with torch.enable_grad(), dataflow, decomposed_layers(self._recurrent):
                outputs = call_model(self.model, inputs)
                losses = per_example_losses(loss_fn, outputs, targets, batch_size(inputs))
        finally:
            for handle in handles:
                handle.remove()
        return outputs, losses, dataflow

    def _pass(
        self, inputs: Batch, targets: Batch, loss_fn: LossFunction, *, reference: bool
    ) -> _Pass:
        """Forward, one backward to the recorded tensors, and every parameter's term.

        A forward that writes in place to a recorded tensor (``nn.ReLU(inplace=True)`` after a
        layer, a residual ``x += shortcut``) sets the layer to keep a copy, and one whose layer
        computes its weight from its parameters sets that layer to be traced operation by
        operation; either runs again: once per layer and setting, usually on the first trial
        lot only.
        """
        # each re-run sets one more layer or meeting to copy or to follow operation by
        # operation, so a correct pass settles within this many; more is a loop, refused
        limit = 4 * len(self._layers) + 2 * len(self.named_parameters) + 8
        for _ in range(limit):
            try:
                return self._pass_once(inputs, targets, loss_fn, reference=reference)
            except _RerunError:
                continue
            except (DPCoreError, MemoryError, torch.OutOfMemoryError):
                raise
            except Exception as error:  # sorted: the model's error or the path's
                self._raise_path_failure(error, inputs, targets, loss_fn)
        raise IncompatibleModelError(
            f"The fast path's forward did not settle after {limit} re-runs (each should set one "
            "more layer to copy its tensors or to be followed operation by operation). Use "
            "VmapEngine (exact, any module) instead."
        )

    def _raise_path_failure(
        self, error: Exception, inputs: Batch, targets: Batch, loss_fn: LossFunction
    ) -> None:
        """Re-raise ``error`` if the model fails the same way without the fast path, else turn
        it into a typed refusal: the fast path's own computation failed on this model.

        The plain forward and per-example losses run once more, without the recording hooks and
        without gradients: an error there is the model's or the input's (raised unchanged); an
        error only with the hooks is the fast path's (an operation its handlers did not expect),
        so ``engine="auto"`` falls back to the vmap engine and ``engine="fast"`` refuses with an
        :class:`~dpcore.torch.errors.IncompatibleModelError` naming the original error.
        """
        try:
            with torch.no_grad():
                outputs = call_model(self.model, inputs)
                per_example_losses(loss_fn, outputs, targets, batch_size(inputs))
            plain_runs = True
        except Exception:  # the model's own error: the original is raised
            plain_runs = False
        if not plain_runs:
            raise error
        raise IncompatibleModelError(
            "the fast path's own computation failed on this model although its plain forward "
            f"runs ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from error

    def _pass_once(
        self, inputs: Batch, targets: Batch, loss_fn: LossFunction, *, reference: bool
    ) -> _Pass:
        size = batch_size(inputs)
        try:
            outputs, losses, dataflow = self._forward(inputs, targets, loss_fn)
            written = {
                meeting.parameters
                for meeting in dataflow.meetings
                if meeting.supported and meeting.output._version != meeting.version
            }
            if not written <= self._copied_meetings:  # once per meeting: copy, run again
                self._copied_meetings |= written
                raise _RerunError
            refuse_unsupported(dataflow.meetings, size)
            expected = self._reference_gradients(losses) if reference else None
            dtype = self.parameters[0].dtype
            backprops = {
                key: _widened(value, dtype)
                for key, value in self._backprops(losses, size, dataflow.meetings).items()
            }
            found: dict[str, list[ParameterTerm]] = {}
            for layer in self._layers:
                if layer.calls:
                    pairs = [
                        (
                            _widened_call(call, dtype),
                            _batch_first(backprops[id(call.target)], call),
                        )
                        for call, _ in layer.calls
                    ]
                    for term in layer.handler.terms(
                        layer.module,
                        pairs,
                        path=layer.path,
                        batch_size=size,
                        trainable=set(layer.trainable),
                        strategy=self.norm_strategy,
                    ):
                        name = self._names[id(layer.trainable[term.name])]
                        found.setdefault(name, []).append(term)
            parameters = dict(self.named_parameters)
            for name, listed in layer_terms(
                dataflow.meetings, backprops, dataflow, parameters, strategy=self.norm_strategy
            ).items():
                found.setdefault(name, []).extend(listed)
            for name, rows in independent_rows(
                dataflow.meetings, backprops, dataflow, parameters
            ).items():
                found.setdefault(name, []).append(
                    materialized_term(name, rows, parameters[name].shape)
                )
        finally:
            for layer in self._layers:
                layer.calls, layer.batched = [], []
        terms = {}
        for name, parameter in self.named_parameters:
            listed = found.get(name, [])
            if len(listed) == 1:
                terms[name] = listed[0]
            elif listed:  # used in several places: the norm is of the summed gradient
                terms[name] = combined_term(
                    name, listed, parameter.shape, strategy=self.norm_strategy
                )
        return _Pass(outputs, losses, terms, expected)

    def _clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        size = batch_size(inputs)
        first = not self._verified
        # In bf16/fp16 (parameters or autocast) autograd's own gradient of the summed loss is
        # rounded in that precision with cancellation across the lot's rows: against float64 it
        # lost 13 % of a LayerNorm bias's gradient at 64 token sequences and 64 % at 1,024 (the
        # fast path's sum: under 1 %), so comparing with it refused correct models. There the
        # first lot is checked by the per-example norms alone (:meth:`_check_norms`).
        low = self._low_precision()
        result = self._pass(inputs, targets, loss_fn, reference=first and low is None)
        dtype = self.parameters[0].dtype
        squared = torch.zeros(size, dtype=dtype, device=result.losses.device)
        each: ParameterTerm | None = None
        for each in result.terms.values():
            squared = squared + each.squared_norms.to(dtype)
        norms = squared.sqrt()
        factors = clip_factors(norms, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)
        keep = factors > 0
        mask = None if bool(keep.all()) else keep
        check_norms = (first and low is not None and bool(torch.isfinite(result.losses).all())) or (
            result.reference is not None and self._check_against(result.reference, result.terms)
        )
        summed = [
            torch.zeros_like(parameter)
            if name not in result.terms
            else result.terms[name].weighted_sum(factors, mask).to(parameter.dtype)
            for name, parameter in self.named_parameters
        ]
        batch = ClippedBatch(
            summed, norms.detach(), factors, result.losses.detach(), detached(result.outputs)
        )
        if check_norms:  # after this pass's activations are released: peak memory stays one pass
            del result, each
            self._check_norms(inputs, targets, loss_fn)
            self._verified = True
        return batch

    # -- checks ------------------------------------------------------------------------------

    def _check_trial(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Every parameter's per-example squared norms and clipped sum equal the loop's."""
        with eval_mode(self.model), _ieee_float32():
            terms = self._pass(inputs, targets, loss_fn, reference=False).terms
            compare_with_loop(
                self,
                inputs,
                targets,
                loss_fn,
                {name: term.squared_norms for name, term in terms.items()},
                lambda factors: {n: t.weighted_sum(factors, None) for n, t in terms.items()},
            )

    def _check_norms(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Per-example norms of three examples of this lot, and of its largest, equal
        batch-of-one autograd passes.

        The largest example sets the scale of the comparison: a well-fit example's gradient
        (its softmax probability within ~1e-4 of one) is rounded in float32 to about 1e-3 of
        itself, differently in a batch and alone, and was refused when the three fixed
        examples were all that well fit (a pre-trained CNN on 40 records).
        """
        size = batch_size(inputs)
        with eval_mode(self.model), _ieee_float32(), full_precision():
            result = self._pass(inputs, targets, loss_fn, reference=False)
            squared = sum(
                term.squared_norms.detach().double().cpu() for term in result.terms.values()
            )
            largest = int(torch.as_tensor(squared).nan_to_num(0.0, 0.0, 0.0).argmax())
            examples = sorted({0, size // 2, size - 1, largest})
            loop, _ = loop_gradients(
                self.model, inputs, targets, loss_fn, self.parameters, examples
            )
        dtype = self.parameters[0].dtype
        total = float(sum(g.double().square().sum() for row in loop for g in row))
        for j, (name, _) in enumerate(self.named_parameters):
            term = result.terms.get(name)
            found = (
                torch.zeros(len(examples), dtype=dtype)
                if term is None
                else term.squared_norms[examples].cpu()
            )
            expected = torch.stack([row[j].square().sum() for row in loop]).cpu()
            if not close(found, expected, dtype, scale=total):
                raise mismatch(
                    f"On this lot of {size}, the per-example gradient norms of parameter "
                    f"{name!r} differ from batch-of-one autograd passes (examples {examples}). "
                    "Use VmapEngine (exact, any module) instead.",
                    [name],
                )

    def _low_precision(self) -> torch.dtype | None:
        """bf16/fp16 when autocast is on or the parameters are such, else None."""
        dtype = self.parameters[0].dtype
        return autocast_dtype() or (dtype if torch.finfo(dtype).bits < 32 else None)

    def _reference_gradients(self, losses: torch.Tensor) -> list[torch.Tensor] | None:
        """Autograd's gradient of ``sum_i loss_i`` if the lot's losses are finite."""
        if not bool(torch.isfinite(losses).all()):
            return None
        with _ieee_float32():
            gradients = torch.autograd.grad(
                losses.sum(), self.parameters, retain_graph=True, allow_unused=True
            )
        return [
            torch.zeros_like(p) if g is None else g
            for p, g in zip(self.parameters, gradients, strict=True)
        ]

    def _check_against(
        self, reference: list[torch.Tensor], terms: dict[str, ParameterTerm]
    ) -> bool:
        """Raise if the unclipped sum misses part of autograd's gradient; False if not finite."""
        if not all(bool(torch.isfinite(g).all()) for g in reference):
            return False  # try again on a later lot
        dtype = self.parameters[0].dtype
        total = float(sum(g.double().square().sum() for g in reference)) ** 0.5
        for (name, parameter), expected in zip(self.named_parameters, reference, strict=True):
            term = terms.get(name)
            if term is None:
                found = torch.zeros_like(parameter)
            else:
                ones = torch.ones_like(term.squared_norms)
                found = term.weighted_sum(ones, None).to(expected.dtype)
            rtol = None if dtype == torch.float64 else 1e-3  # full precision here
            if not close(found, expected, dtype, rtol=rtol, scale=total):
                raise mismatch(
                    f"Parameter {name!r} receives gradient that the fast path does not see (an "
                    "operation it cannot follow, or a layer type subclassed with a different "
                    "forward), so it could not clip it. Use VmapEngine (exact, any module) "
                    "instead.",
                    [name],
                )
        return True

    def _backprops(
        self, losses: torch.Tensor, size: int, meetings: list[Meeting]
    ) -> dict[int, torch.Tensor]:
        """``d(sum_i loss_i) / d(target)`` for every recorded target, by one backward."""
        targets: dict[int, torch.Tensor] = {}
        for layer in self._layers:
            owned = [self._names[id(p)] for p in layer.trainable.values()]
            for call, versions in layer.calls:
                now = _versions(call)
                if now != versions:
                    output_written, saved_written = now[0] != versions[0], now[1:] != versions[1:]
                    if (output_written and not layer.copy_output) or (
                        saved_written and not layer.copy_saved
                    ):
                        layer.copy_output |= output_written
                        layer.copy_saved |= saved_written
                        raise _RerunError
                    raise mismatch(
                        f"A tensor of module {layer.path!r} ({type(layer.module).__name__}) was "
                        "modified in place after its forward, inside the module, where the fast "
                        "path cannot keep a copy, so its recorded activations or output gradient "
                        "would be wrong. Use VmapEngine instead.",
                        owned,
                    )
                if (
                    call.target.dim() <= call.batch_dim
                    or call.target.shape[call.batch_dim] != size * call.rows_per_example
                ):
                    raise mismatch(
                        f"Module {layer.path!r} ({type(layer.module).__name__}) produced a tensor "
                        f"of shape {tuple(call.target.shape)} from the lot's examples, whose first "
                        f"dimension is not the lot size {size}; the fast path needs "
                        "batch-first layers. Use VmapEngine instead.",
                        owned,
                    )
                targets[id(call.target)] = call.target
        for meeting in meetings:
            targets[id(meeting.output)] = meeting.output
        tensors = list(targets.values())
        needed = [t for t in tensors if t.requires_grad]
        # The graph is kept only for tensors computed from parameters that meet the examples, whose
        # per-example gradients are pulled back through it afterwards; otherwise its buffers are
        # freed now (peak memory).
        parameters = {id(p) for p in self.parameters}
        computed = any(id(t) not in parameters for m in meetings for _, t in m.operands)
        gradients = torch.autograd.grad(
            losses.sum(), needed, allow_unused=True, retain_graph=computed
        )
        found = {id(t): g for t, g in zip(needed, gradients, strict=True)}
        result = {}
        for tensor in tensors:  # an output the loss does not use has a zero gradient
            gradient = found.get(id(tensor))
            result[id(tensor)] = torch.zeros_like(tensor) if gradient is None else gradient
        return result
