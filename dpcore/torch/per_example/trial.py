"""Trial lots: an engine earns a model by matching a one-example-at-a-time autograd loop.

Before an engine clips its first lot it is *prepared* on trial lots built from a few examples
(:meth:`~dpcore.torch.per_example.base.PerExampleEngine.prepare`). Their sizes are chosen by
:func:`trial_sizes` to differ from every dimension of every tensor the model computes on one
example, so that no tensor of the trial can pass for a lot by its shape; and there are two of
them, so that a dimension which grows with the lot (a flattened ``(n * T, d)``) shows too. On each
trial lot (model in eval mode, so dropout draws nothing):

- :func:`check_examples_independent`: every example's loss in the lot equals its loss alone
  (a model whose outputs for one example depend on another's, however written, is refused by
  every engine: per-example clipping could not bound one example's influence, and vmap would
  train a different function than the batched forward);
- engine-specific checks against :func:`loop_gradients` (the contract of "exact": equal, to
  float tolerance, to autograd on each example alone), naming the parameter that differs.

The trial uses examples only to exercise the model's computation; its outcome is a property of
that computation (identical for any examples, up to rounding), not a release of the data.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

from dpcore.errors import DPCoreError, InvalidParameterError
from dpcore.torch.batches import Batch, batch_size, call_model, flat_rows, take, tensors
from dpcore.torch.errors import ExamplesInteractError, IncompatibleModelError
from dpcore.torch.seeding import GLOBAL_GENERATOR

LossFunction = Callable[[Any, Any], torch.Tensor]
"""``loss_fn(outputs, targets)`` returning one loss per example, shape ``(batch,)``."""

__all__ = [
    "LossFunction",
    "autocast_dtype",
    "buffers_kept",
    "check_examples_independent",
    "check_examples_independent_in_training",
    "close",
    "compare_with_loop",
    "eval_mode",
    "finite_examples",
    "full_precision",
    "loop_gradients",
    "mismatch",
    "per_example_losses",
    "states_kept",
    "tolerance",
    "trial_lot",
    "trial_sizes",
]


def per_example_losses(
    loss_fn: LossFunction, outputs: Any, targets: Batch, size: int
) -> torch.Tensor:
    """Call ``loss_fn`` and check that it returns one loss per example (``reduction='none'``)."""
    losses = loss_fn(outputs, targets)
    if not isinstance(losses, torch.Tensor) or losses.shape != (size,):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else losses
        raise InvalidParameterError(
            "loss_fn",
            f"to return per-example losses of shape ({size},) (use reduction='none')",
            shape,
        )
    return losses


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` while open (no dropout draws), each module's mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def autocast_dtype() -> torch.dtype | None:
    """The dtype ``torch.autocast`` computes in now (CPU or CUDA), or ``None`` when it is off."""
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    return None


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """``torch.autocast`` off while open: the trial checks the model's computation, not the
    rounding of a bf16/fp16 forward (whose per-example results then differ at ~1e-2)."""
    with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        yield


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of a comparison in ``dtype`` (rounding of sums of many terms)."""
    if dtype == torch.float64:
        return 1e-9
    if dtype == torch.float32:
        return 1e-4
    return 2e-2


def close(
    found: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype,
    *,
    rtol: float | None = None,
    scale: float = 0.0,
) -> bool:
    """``||found - expected|| <= rtol * (||found|| + ||expected|| + scale)``.

    ``rtol`` defaults to :func:`tolerance` of ``dtype``; ``scale`` is the size of the whole
    quantity this is a part of (a parameter whose true gradient is zero, such as an attention
    key's bias, is then compared at the rounding of the whole gradient). NaN/inf must sit at the
    same places.
    """
    found, expected = found.detach().double(), expected.detach().double()
    if not bool((torch.isfinite(found) == torch.isfinite(expected)).all()):
        return False
    finite = torch.isfinite(expected)
    found, expected = found[finite], expected[finite]
    scale = float(found.norm()) + float(expected.norm()) + scale
    limit = tolerance(dtype) if rtol is None else rtol
    return float((found - expected).norm()) <= limit * scale + 1e-300


def mismatch(message: str, names: Sequence[str]) -> IncompatibleModelError:
    """An :class:`IncompatibleModelError` with ``parameters`` set to ``names``."""
    error = IncompatibleModelError(message)
    error.parameters = list(names)  # type: ignore[attr-defined]
    return error


class _Dimensions(TorchFunctionMode):
    """Collects every dimension of every tensor produced while open."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: set[int] = set()

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor):
                self.sizes.update(int(s) for s in leaf.shape)
        return result


def trial_sizes(model: nn.Module, inputs: Batch, targets: Batch, loss_fn: Any) -> tuple[int, int]:
    """The two smallest lot sizes >= 2 that no tensor of a one-example forward has as a dimension.

    Parameter shapes and the example's own shape count too.
    """
    recorder = _Dimensions()
    with torch.no_grad(), eval_mode(model), recorder:
        loss_fn(call_model(model, take(inputs, slice(0, 1))), take(targets, slice(0, 1)))
    taken = set(recorder.sizes)
    for tensor in (*model.parameters(), *model.buffers(), *tensors(inputs), *tensors(targets)):
        taken.update(int(s) for s in tensor.shape)
    sizes: list[int] = []
    size = 2
    while len(sizes) < 2:
        if size not in taken:
            sizes.append(size)
        size += 1
    return sizes[0], sizes[1]


def trial_lot(inputs: Batch, targets: Batch, size: int) -> tuple[Batch, Batch]:
    """``size`` examples taken cyclically from ``inputs``/``targets``.

    Floating-point copies of an example (when there are fewer examples than ``size``) get a
    little seeded noise, so that a model mixing the lot's rows cannot hide behind equal rows.
    """
    pool = batch_size(inputs)
    index = torch.arange(size) % pool
    generator = torch.Generator().manual_seed(size)

    def jitter(lot: torch.Tensor) -> torch.Tensor:
        if size <= pool or not lot.is_floating_point():
            return lot
        noise = torch.randn(lot.shape, generator=generator, dtype=lot.dtype).to(lot.device)
        scale = lot.detach().std() if lot.numel() > 1 else lot.new_ones(())
        copies = (torch.arange(size, device=lot.device) >= pool).view(-1, *([1] * (lot.dim() - 1)))
        return torch.where(copies, lot + 0.1 * scale * noise, lot)

    return tree_map(jitter, take(inputs, index)), take(targets, index)


def _alone(model: nn.Module, loss_fn: Any, inputs: Batch, targets: Batch, i: int) -> torch.Tensor:
    """Example ``i``'s loss computed on that example alone (a lot of one).

    Raises:
        ExamplesInteractError: it fails alone although the whole lot runs (a loss over the lot,
            such as a contrastive loss whose targets index the other examples).
    """
    one = slice(i, i + 1)
    try:
        outputs = call_model(model, take(inputs, one))
        return per_example_losses(loss_fn, outputs, take(targets, one), 1)[0]
    except DPCoreError:
        raise
    except Exception as error:
        if not _lot_runs(model, loss_fn, inputs, targets):
            raise  # the model's or the loss's own error, whatever the lot
        reason = str(error).splitlines()[0] if str(error) else ""
        raise ExamplesInteractError(
            f"The model or loss fails on example {i} alone ({type(error).__name__}: {reason}) "
            f"although it runs on the lot of {batch_size(inputs)}: each example's loss must be "
            "computable from that example alone (a loss over the whole lot, such as a "
            "contrastive loss whose targets index the other examples, mixes them). Per-example "
            "clipping cannot bound one example's influence on such a model, and no engine "
            "accepts it."
        ) from error


def _lot_runs(model: nn.Module, loss_fn: Any, inputs: Batch, targets: Batch) -> bool:
    """Whether the model and the per-example loss run on the whole lot (no gradients)."""
    try:
        with torch.no_grad():
            per_example_losses(loss_fn, call_model(model, inputs), targets, batch_size(inputs))
    except Exception:
        return False
    return True


def finite_examples(model: nn.Module, inputs: Batch, targets: Batch, loss_fn: Any) -> list[int]:
    """Positions of the examples whose loss alone is finite (eval mode)."""
    with torch.no_grad(), eval_mode(model):
        return [
            i
            for i in range(batch_size(inputs))
            if bool(torch.isfinite(_alone(model, loss_fn, inputs, targets, i)))
        ]


def check_examples_independent(
    model: nn.Module, inputs: Batch, targets: Batch, loss_fn: Any
) -> None:
    """Refuse a model whose loss for one example depends on the other examples of the lot.

    Compares every example's loss in the lot with its loss alone (eval mode, float tolerance).

    Raises:
        ExamplesInteractError: naming the first example whose losses differ.
    """
    with torch.no_grad(), eval_mode(model):
        batched = per_example_losses(
            loss_fn, call_model(model, inputs), targets, batch_size(inputs)
        )
        alone = torch.stack(
            [_alone(model, loss_fn, inputs, targets, i) for i in range(batch_size(inputs))]
        )
    dtype = batched.dtype
    for i in range(batch_size(inputs)):
        if not close(batched[i : i + 1], alone[i : i + 1], dtype):
            raise ExamplesInteractError(
                f"The model's examples interact: in a trial lot of {batch_size(inputs)}, example "
                f"{i}'s loss is {float(batched[i])!r} but {float(alone[i])!r} when it is alone "
                "(an operation mixes the rows of the lot, such as a batch statistic). "
                "Per-example clipping cannot bound one example's influence on such a model, and "
                "no engine accepts it; compute every example's output from that example only."
            )


def check_examples_independent_in_training(
    model: nn.Module, inputs: Batch, targets: Batch, loss_fn: Any
) -> None:
    """Refuse a model whose examples interact in training mode only (nothing if it is in eval).

    :func:`check_examples_independent` runs in eval mode; a module can mix the lot's rows only
    while training (a batch statistic under ``if self.training``, such as timm's ``EvoNorm2dB0``
    or a hand-written batch normalisation). Here the lot runs twice in the model's own modes,
    from the same random states (torch's, Python's, NumPy's: dropout, layer drop and SpecAugment
    masks are drawn alike), the second time with example 0 replaced by another example of the
    lot: every other example's loss must be unchanged. The model's buffers (running statistics)
    and the random states are restored afterwards. A lot whose examples are all equal cannot show
    an interaction, and is not checked.

    Raises:
        ExamplesInteractError: naming the first example whose loss changed.
    """
    if not any(module.training for module in model.modules()):
        return
    size = batch_size(inputs)
    other = _differing_example(inputs)
    if other is None:
        return
    index = torch.arange(size)
    index[0] = other
    devices = sorted(
        {
            t.device.index or 0
            for t in (*tensors(inputs), *model.parameters())
            if t.device.type == "cuda"
        }
    )
    with torch.no_grad(), buffers_kept(model), _same_draws(devices) as reset:

        def losses(lot: Batch, lot_targets: Batch) -> torch.Tensor:
            reset()
            return per_example_losses(loss_fn, call_model(model, lot), lot_targets, size)

        first = losses(inputs, targets)
        second = losses(take(inputs, index), take(targets, index))
    for i in range(1, size):
        if not close(first[i : i + 1], second[i : i + 1], first.dtype):
            raise ExamplesInteractError(
                f"The model's examples interact in training mode: in a trial lot of {size}, "
                f"example {i}'s loss is {float(first[i])!r}, and {float(second[i])!r} when "
                f"example 0 is replaced by example {other} (same random draws); in eval mode "
                "they do not (an operation mixes the rows of the lot only while training, such "
                "as a batch statistic under `if self.training`). Per-example clipping cannot "
                "bound one example's influence on such a model, and no engine accepts it."
            )


def _differing_example(inputs: Batch) -> int | None:
    """The first example of the lot whose inputs differ from example 0's, or ``None``."""
    leaves = tensors(inputs)
    for k in range(1, batch_size(inputs)):
        if any(not torch.equal(leaf[0], leaf[k]) for leaf in leaves):
            return k
    return None


@contextlib.contextmanager
def _same_draws(devices: Sequence[int]) -> Iterator[Callable[[], None]]:
    """A function that resets every random state a forward may draw from to the state at entry
    (torch's CPU and the given CUDA devices', Python's ``random``, NumPy's global one: dropout,
    layer drop, SpecAugment masks); the states are restored when closed."""
    # no other thread seeds or restores the states meanwhile
    with GLOBAL_GENERATOR, _draws_reset(devices) as reset:
        yield reset


@contextlib.contextmanager
def _draws_reset(devices: Sequence[int]) -> Iterator[Callable[[], None]]:
    python_state, numpy_state = random.getstate(), numpy.random.get_state()
    with torch.random.fork_rng(devices=devices):
        cpu = torch.get_rng_state()
        cuda = [torch.cuda.get_rng_state(device) for device in devices]

        def reset() -> None:
            torch.set_rng_state(cpu)
            for device, state in zip(devices, cuda, strict=True):
                torch.cuda.set_rng_state(state, device)
            random.setstate(python_state)
            numpy.random.set_state(numpy_state)

        try:
            yield reset
        finally:
            random.setstate(python_state)
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def states_kept(model: nn.Module, inputs: Batch) -> Iterator[None]:
    """While open, the model may run in its own (training) mode: its buffers and every random
    state a forward draws from (torch's CPU and CUDA, Python's, NumPy's) are restored when
    closed, so a trial leaves no trace."""
    devices = sorted(
        {
            t.device.index or 0
            for t in (*tensors(inputs), *model.parameters())
            if t.device.type == "cuda"
        }
    )
    with buffers_kept(model), _same_draws(devices):
        yield


@contextlib.contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """The model's buffers restored (values and objects) when closed."""
    saved = [
        (module, name, buffer, buffer.detach().clone())
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buffer, copy in saved:
                if not torch.equal(buffer, copy):  # only what changed: a buffer may be an
                    buffer.copy_(copy)  # expanded view, which cannot be written
                module._buffers[name] = buffer


def loop_gradients(
    model: nn.Module,
    inputs: Batch,
    targets: Batch,
    loss_fn: Any,
    parameters: Sequence[nn.Parameter],
    examples: Sequence[int] | None = None,
) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Each example's gradient by autograd on that example alone, and the losses.

    Returns ``(gradients, losses)``: ``gradients[k][j]`` is example ``examples[k]``'s gradient
    for ``parameters[j]`` (zeros where unused).
    """
    rows, losses = [], []
    for i in range(batch_size(inputs)) if examples is None else examples:
        with torch.enable_grad():
            loss = _alone(model, loss_fn, inputs, targets, i)
            grads = torch.autograd.grad(loss, list(parameters), allow_unused=True)
        rows.append(
            [
                torch.zeros_like(p) if g is None else g
                for p, g in zip(parameters, grads, strict=True)
            ]
        )
        losses.append(loss.detach())
    return rows, torch.stack(losses)


class _Engine(Protocol):
    name: str
    model: nn.Module
    named_parameters: list[tuple[str, nn.Parameter]]


def compare_with_loop(
    engine: _Engine,
    inputs: Batch,
    targets: Batch,
    loss_fn: Any,
    squared_norms: Mapping[str, torch.Tensor],
    weighted_sum: Callable[[torch.Tensor], Mapping[str, torch.Tensor]],
) -> None:
    """Raise unless an engine's per-parameter results on a lot equal the loop's.

    Args:
        engine: the engine (its name, model and trainable parameters).
        inputs, targets, loss_fn: the lot.
        squared_norms: per parameter name, the engine's ``(batch,)`` squared per-example norms
            (a missing name means zero).
        weighted_sum: clip factors ``(batch,)`` -> per parameter name, the engine's
            ``sum_i c_i g_i``; called with factors that clip about half of the examples.

    Raises:
        IncompatibleModelError: naming the first parameter that differs (``parameters`` set).
    """
    parameters = [p for _, p in engine.named_parameters]
    loop, _ = loop_gradients(engine.model, inputs, targets, loss_fn, parameters)
    dtype = parameters[0].dtype
    norms = torch.stack([sum(g.double().square().sum() for g in row) for row in loop]).sqrt()  # type: ignore[misc]
    bound = float(norms.median()) or 1.0
    total = float(norms.square().sum())
    factors = torch.clamp(bound / norms.clamp_min(1e-300), max=1.0)
    sums = weighted_sum(factors.to(dtype).to(parameters[0].device))
    instead = (
        "The vmap engine computes each example's gradient as a lot of one, so the model's "
        "forward differs between a lot and one example."
        if engine.name == "vmap"
        else "Use VmapEngine (exact, any module) instead."
    )
    for j, (name, parameter) in enumerate(engine.named_parameters):
        rows = torch.stack([row[j] for row in loop])
        squared = squared_norms.get(name)
        found_squared = torch.zeros(rows.shape[0]) if squared is None else squared.cpu()
        summed = sums.get(name)
        found_sum = torch.zeros_like(parameter) if summed is None else summed
        expected_sum = torch.tensordot(factors.to(rows.dtype), rows, dims=1)
        if not (
            close(found_squared, flat_rows(rows).square().sum(1).cpu(), dtype, scale=total)
            and close(found_sum, expected_sum, dtype, scale=bound * len(loop))
        ):
            raise mismatch(
                f"On a trial lot of {batch_size(inputs)}, the {engine.name} engine's per-example "
                f"gradients of parameter {name!r} differ from a one-example-at-a-time autograd "
                f"loop (the parameter is reached in a way this engine cannot attribute to "
                f"examples). {instead}",
                [name],
            )
