"""Opacus on the library models of :mod:`bench.models`: its training step, its per-example
gradients, and what ``ModuleValidator.fix`` does to a model's function.

- :func:`opacus_step`: ``PrivacyEngine.make_private`` (``poisson_sampling=False``: the fixed lot
  is fed to the wrapped model) with ``grad_sample_mode`` ``"hooks"`` or ``"ghost"``, then
  forward, loss, backward, ``optimizer.step()`` (ghost clipping: Opacus' loss wrapper, whose
  ``backward`` makes its two passes).
- :func:`opacus_gradients`: the per-example gradients Opacus' hooks record
  (``GradSampleModule``, what ``make_private`` wraps the model in, with
  ``loss_reduction="sum"``: ``grad_sample[i]`` is then example i's gradient).
- :func:`fix_difference`: the model before and after ``ModuleValidator.fix`` (the replacement
  Opacus asks users to make for the layers its hooks do not support), on the same lot: which
  layers were replaced and the largest difference of their outputs.
- :func:`exactly_fixed`: the fixed model where the fix leaves the outputs unchanged (``nn.GRU``
  by Opacus' ``DPGRU``), so that Opacus is measured on the model a user would train with it.

Opacus is imported inside these functions only.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.models_zoo import Criterion, per_example_loss
from dpcore.torch.batches import call_model

__all__ = [
    "FIX_TOLERANCE",
    "exactly_fixed",
    "fix_difference",
    "opacus_gradients",
    "opacus_step",
    "opacus_version",
]

#: The largest output difference (relative to the outputs' scale) at which a model fixed by
#: ``ModuleValidator.fix`` counts as the same model (float32 rounding of a re-implemented layer).
FIX_TOLERANCE = 1e-5


def opacus_version() -> str | None:
    """The installed Opacus version (read without importing it), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opacus")
    except PackageNotFoundError:
        return None


def opacus_step(
    mode: str,
    model: nn.Module,
    inputs: Any,
    targets: torch.Tensor,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    learning_rate: float,
) -> Callable[[], None]:
    """A closure doing one Opacus DP-SGD step of ``model`` on the fixed lot.

    Args:
        mode: Opacus' ``grad_sample_mode``, ``"hooks"`` or ``"ghost"``.
        model: the model (wrapped in place by Opacus; pass a copy).
        inputs, targets: the lot; ``inputs`` a tensor or a dict of keyword tensors.
        noise_multiplier, max_grad_norm, learning_rate: sigma, C and SGD's rate.

    Raises:
        whatever Opacus raises on a model it refuses (``make_private`` validates the model).
    """
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=learning_rate)
    # make_private reads the expected lot size off a loader; with poisson_sampling=False it is
    # not resampled, and the fixed lot is fed to the wrapped model directly.
    size = len(targets)
    loader = DataLoader(TensorDataset(torch.arange(size)), batch_size=size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            criterion=Criterion("mean"),
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
    wrapped, private = made[0], made[1]
    criterion = made[2] if mode == "ghost" else Criterion("mean")

    def step() -> None:
        private.zero_grad(set_to_none=True)
        criterion(call_model(wrapped, inputs), targets).backward()
        private.step()

    return step


def opacus_gradients(
    model: nn.Module, inputs: Any, targets: torch.Tensor
) -> dict[str, torch.Tensor | None]:
    """Per-example gradients recorded by Opacus' hooks, by trainable parameter name.

    ``model`` (wrapped in place; pass a copy) is run once on the lot under
    ``GradSampleModule(batch_first=True, loss_reduction="sum")`` and the summed per-example
    losses are backpropagated; each value is the parameter's ``grad_sample`` ``(batch, *shape)``,
    or None where Opacus recorded none.

    Raises:
        whatever Opacus raises while wrapping the model or in its hooks.
    """
    from opacus import GradSampleModule

    names = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = GradSampleModule(model, batch_first=True, loss_reduction="sum")
        per_example_loss(call_model(wrapped, inputs), targets).sum().backward()
    found: dict[str, torch.Tensor | None] = {}
    for name, parameter in names:
        sample = getattr(parameter, "grad_sample", None)
        found[name] = None if sample is None else sample.detach().clone()
    return found


def _outputs(outputs: Any) -> torch.Tensor:
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"expected logits as a tensor, got {type(logits).__name__}")
    return logits


def fix_difference(model: nn.Module, inputs: Any) -> dict[str, Any]:
    """What ``opacus.validators.ModuleValidator.fix`` changes in ``model`` and in its outputs.

    The fix runs on a copy, which is then cast to ``model``'s floating dtype (the replacement
    layers are built in torch's default dtype) and compared with ``model`` on ``inputs``.

    Returns:
        ``{"replaced": [layer types only in the original], "replaced_by": [types only in the
        fixed model], "max_abs_output_difference": float}`` (0.0 where nothing was replaced).

    Raises:
        whatever Opacus raises while fixing the model.
    """
    from opacus.validators import ModuleValidator

    dtype = next(model.parameters()).dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = ModuleValidator.fix(copy.deepcopy(model)).to(dtype)
    before = {type(m).__name__ for m in model.modules()}
    after = {type(m).__name__ for m in fixed.modules()}
    with torch.no_grad():
        original = _outputs(call_model(model, inputs))
        changed = _outputs(call_model(fixed, inputs))
    return {
        "replaced": sorted(before - after),
        "replaced_by": sorted(after - before),
        "max_abs_output_difference": float((original - changed).abs().max()),
    }


def exactly_fixed(model: nn.Module, inputs: Any) -> nn.Module | None:
    """``ModuleValidator.fix`` of a copy of ``model`` when it replaced a layer and the outputs
    on ``inputs`` stay within :data:`FIX_TOLERANCE` of the original's (relative to their
    largest magnitude); else None (nothing to fix, or the fix changes the model's function).
    """
    try:
        found = fix_difference(model, inputs)
    except Exception:  # the fix itself fails: Opacus is measured on the model as given
        return None
    if not found["replaced"]:
        return None
    with torch.no_grad():
        scale = float(_outputs(call_model(model, inputs)).abs().max()) or 1.0
    if found["max_abs_output_difference"] > FIX_TOLERANCE * scale:
        return None
    from opacus.validators import ModuleValidator

    dtype = next(model.parameters()).dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ModuleValidator.fix(copy.deepcopy(model)).to(dtype)  # type: ignore[no-any-return]
