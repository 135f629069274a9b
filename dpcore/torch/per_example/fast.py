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

Requirements: every trainable parameter belongs to a module with a handler (Linear, Conv1d,
Conv2d, Embedding, LayerNorm, GroupNorm, RMSNorm, :class:`~dpcore.torch.layers.DPLSTM`), is used
only through that module's forward (not functionally by a parent), and is not tied to another
module; layers are batch-first; a supported layer's output is not modified in place. Models
outside this set use :class:`~dpcore.torch.per_example.vmap.VmapEngine`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
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
from dpcore.torch.per_example.layer_handlers import (
    ConvHandler,
    LayerCall,
    LayerHandler,
    LinearHandler,
    NormalizationHandler,
    NormStrategy,
    ParameterTerm,
)
from dpcore.torch.per_example.sequence_handlers import EmbeddingHandler, IdentityInputLSTMHandler

__all__ = ["HANDLERS", "FastEngine", "fast_path_supports", "handler_for", "register_handler"]

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
"""Handlers by exact module type (a subclass may override ``forward``, so it is not matched)."""


def handler_for(module: nn.Module) -> LayerHandler | None:
    """The handler registered for ``type(module)``, or ``None``."""
    return HANDLERS.get(type(module))


def register_handler(module_type: type[nn.Module], handler: LayerHandler) -> None:
    """Register ``handler`` for modules of exactly ``module_type`` (replacing any previous one)."""
    HANDLERS[module_type] = handler


@dataclasses.dataclass
class _Layer:
    """A module with trainable parameters, its handler, and its calls in the current forward."""

    path: str
    module: nn.Module
    handler: LayerHandler
    trainable: dict[str, nn.Parameter]
    calls: list[tuple[LayerCall, tuple[int, ...]]] = dataclasses.field(default_factory=list)


def _plan(model: nn.Module) -> list[_Layer]:
    """The supported layers owning the model's trainable parameters.

    Raises:
        IncompatibleModelError: a trainable parameter belongs to a module without a handler, or
            is shared by two modules (tied weights), or a module's configuration is unsupported.
    """
    owners: dict[int, str] = {}
    layers = []
    for path, module in model.named_modules():
        trainable = {n: p for n, p in module.named_parameters(recurse=False) if p.requires_grad}
        if not trainable:
            continue
        where = path or "<root>"
        for name, parameter in trainable.items():
            if id(parameter) in owners:
                raise IncompatibleModelError(
                    f"Parameter {where}.{name} is shared with module {owners[id(parameter)]!r} "
                    "(tied weights); the fast path cannot split its per-example gradient between "
                    "modules. Use VmapEngine (exact, any module) instead."
                )
            owners[id(parameter)] = where
        handler = handler_for(module)
        if handler is None:
            raise IncompatibleModelError(
                f"Module {where!r} ({type(module).__name__}) has trainable parameters "
                f"{sorted(trainable)}, which the exact fast path does not support (it handles "
                "Linear, Conv1d, Conv2d, Embedding, LayerNorm, GroupNorm, RMSNorm and DPLSTM). "
                "Use VmapEngine (exact, any module) instead, or build the layer from supported "
                "ones (e.g. attention from nn.Linear, dpcore.torch.layers.DPLSTM for nn.LSTM)."
            )
        handler.check(module, where, set(trainable))
        layers.append(_Layer(where, module, handler, trainable))
    return layers


def fast_path_supports(model: nn.Module) -> bool:
    """Whether :class:`FastEngine` accepts ``model`` (for an automatic choice of engine)."""
    try:
        check_independent_examples(model)
        _plan(model)
    except IncompatibleModelError:
        return False
    return True


@contextlib.contextmanager
def _ieee_float32() -> Iterator[None]:
    """Full float32 (no TF32) for cuDNN convolutions and CUDA matmuls while open.

    cuDNN convolutions default to TF32 on Ampere and newer GPUs (10-bit mantissa): autograd's
    reference gradient of a large lot then drifts beyond the check's tolerance from our exact
    float32 sums (seen on an H100 at lot 262,144), which would refuse a correct model.
    """
    backends = [
        backend
        for backend in (
            getattr(torch.backends.cudnn, "conv", None),
            getattr(torch.backends.cuda, "matmul", None),
        )
        if backend is not None and hasattr(backend, "fp32_precision")
    ]
    previous = [backend.fp32_precision for backend in backends]
    for backend in backends:
        backend.fp32_precision = "ieee"
    try:
        yield
    finally:
        for backend, value in zip(backends, previous, strict=True):
            backend.fp32_precision = value


def _versions(call: LayerCall) -> tuple[int, ...]:
    tensors = [call.target, *(s for s in call.saved if isinstance(s, torch.Tensor))]
    return tuple(t._version for t in tensors)


class FastEngine(PerExampleEngine):
    """Exact clipping from ghost norms and book-keeping: one forward, one output-only backward.

    Args:
        model: a model whose trainable parameters all belong to supported layers (see the module
            docstring); checked at construction.
        max_grad_norm: the clipping norm C > 0.
        nonfinite: ``"raise"`` (default) or ``"zero"`` for NaN/inf per-example gradients.
        norm_strategy: for sequence/convolution layers, ``"auto"`` (per layer, the cheaper of the
            Gram-matrix ghost norm and the materialised per-example gradient), ``"ghost"`` or
            ``"materialize"`` (forced; both exact).
        verify: on the first lot with finite gradients, check that the handlers' unclipped sum
            equals autograd's gradient of ``sum_i loss_i`` for every parameter (one extra
            backward, once). This catches what hooks cannot see, such as a parent module using
            a child's weight directly, which would otherwise leave part of a gradient unclipped.

    Raises:
        IncompatibleModelError: a trainable parameter is in an unsupported module (the message
            names its path and type), or is tied between modules.

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
        self.verify = bool(verify)
        self._verified = not self.verify

    def _record(
        self, layer: _Layer, module: nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        call = layer.handler.capture(module, args, kwargs, output)
        layer.calls.append((call, _versions(call)))

    @staticmethod
    def _require_input_grad(module: nn.Module, args: Any, kwargs: Any) -> Any:
        """Make the module's input a graph leaf that requires grad if it does not already."""
        if args and isinstance(args[0], torch.Tensor) and not args[0].requires_grad:
            return (args[0].detach().requires_grad_(), *args[1:]), kwargs
        return None

    def _forward(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction
    ) -> tuple[torch.Tensor, torch.Tensor]:
        handles = []
        for layer in self._layers:
            layer.calls = []
            if layer.handler.target_is_input:
                handles.append(
                    layer.module.register_forward_pre_hook(
                        self._require_input_grad, with_kwargs=True
                    )
                )
            hook = functools.partial(self._record, layer)
            handles.append(layer.module.register_forward_hook(hook, with_kwargs=True))
        try:
            with torch.enable_grad():
                outputs = self.model(inputs)
                losses = per_example_losses(loss_fn, outputs, targets, inputs.shape[0])
        finally:
            for handle in handles:
                handle.remove()
        return outputs, losses

    def _clipped_sum(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction
    ) -> ClippedBatch:
        batch_size = inputs.shape[0]
        try:
            outputs, losses = self._forward(inputs, targets, loss_fn)
            reference = self._reference_gradients(losses)
            backprops = self._backprops(losses, batch_size)
            terms: dict[int, list[ParameterTerm]] = {}
            for layer in self._layers:
                if layer.calls:
                    pairs = [(call, backprops[id(call.target)]) for call, _ in layer.calls]
                    terms[id(layer)] = layer.handler.terms(
                        layer.module,
                        pairs,
                        path=layer.path,
                        batch_size=batch_size,
                        trainable=set(layer.trainable),
                        strategy=self.norm_strategy,
                    )
        finally:
            for layer in self._layers:
                layer.calls = []
        dtype = self.parameters[0].dtype
        squared = torch.zeros(batch_size, dtype=dtype, device=losses.device)
        for layer_terms in terms.values():
            for term in layer_terms:
                squared = squared + term.squared_norms.to(dtype)
        norms = squared.sqrt()
        factors = clip_factors(norms, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)
        keep = factors > 0
        mask = None if bool(keep.all()) else keep
        if reference is not None:
            self._check_against(reference, terms)
        summed = {id(p): torch.zeros_like(p) for p in self.parameters}
        for layer in self._layers:
            for term in terms.get(id(layer), []):
                parameter = layer.trainable[term.name]
                summed[id(parameter)] = term.weighted_sum(factors, mask).to(parameter.dtype)
        return ClippedBatch(
            [summed[id(p)] for p in self.parameters],
            norms.detach(),
            factors,
            losses.detach(),
            outputs.detach(),
        )

    def _reference_gradients(self, losses: torch.Tensor) -> list[torch.Tensor] | None:
        """Autograd's gradient of ``sum_i loss_i`` on the first finite lot if ``verify``."""
        if self._verified or not bool(torch.isfinite(losses).all()):
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
        self, reference: list[torch.Tensor], terms: dict[int, list[ParameterTerm]]
    ) -> None:
        """Raise if the handlers' unclipped sum misses part of autograd's gradient."""
        ours = {id(p): torch.zeros_like(p) for p in self.parameters}
        batch_size = None
        for layer in self._layers:
            for term in terms.get(id(layer), []):
                batch_size = term.squared_norms.shape[0]
                ones = torch.ones(
                    batch_size, dtype=term.squared_norms.dtype, device=term.squared_norms.device
                )
                ours[id(layer.trainable[term.name])] = term.weighted_sum(ones, None)
        if not all(bool(torch.isfinite(g).all()) for g in reference):
            return  # try again on a later lot
        tolerance = 1e-6 if self.parameters[0].dtype == torch.float64 else 1e-3
        for (name, parameter), expected in zip(self.named_parameters, reference, strict=True):
            found = ours[id(parameter)].to(expected.dtype)
            scale = float(expected.norm()) + float(found.norm())
            if float((found - expected).norm()) > tolerance * scale + 1e-12:
                raise IncompatibleModelError(
                    f"Parameter {name!r} receives gradient that its module's forward hooks do not "
                    "see (e.g. a parent module uses it functionally, or a layer type is "
                    "subclassed with a different forward), so the fast path could not clip it. "
                    "Use VmapEngine (exact, any module) instead."
                )
        self._verified = True

    def _backprops(self, losses: torch.Tensor, batch_size: int) -> dict[int, torch.Tensor]:
        """``d(sum_i loss_i) / d(target)`` for every recorded call's target, by one backward."""
        targets: dict[int, torch.Tensor] = {}
        for layer in self._layers:
            for call, versions in layer.calls:
                if _versions(call) != versions:
                    raise IncompatibleModelError(
                        f"A tensor of module {layer.path!r} ({type(layer.module).__name__}) was "
                        "modified in place after its forward (e.g. nn.ReLU(inplace=True)), so its "
                        "recorded activations or output gradient would be wrong. Use "
                        "inplace=False after supported layers, or VmapEngine."
                    )
                if call.target.dim() < 1 or call.target.shape[0] != batch_size:
                    raise IncompatibleModelError(
                        f"Module {layer.path!r} ({type(layer.module).__name__}) produced a tensor "
                        f"of shape {tuple(call.target.shape)}, whose first dimension is not the "
                        f"batch size {batch_size}; the fast path needs batch-first layers. Use "
                        "VmapEngine instead."
                    )
                targets[id(call.target)] = call.target
        tensors = list(targets.values())
        gradients = torch.autograd.grad(
            losses.sum(),
            [t for t in tensors if t.requires_grad],
            allow_unused=True,
        )
        found = {
            id(t): g
            for t, g in zip([t for t in tensors if t.requires_grad], gradients, strict=True)
        }
        result = {}
        for tensor in tensors:  # an output the loss does not use has a zero gradient
            gradient = found.get(id(tensor))
            result[id(tensor)] = torch.zeros_like(tensor) if gradient is None else gradient
        return result
