"""Checks that a model treats examples independently, which per-example clipping assumes.

Per-example clipping bounds each example's contribution only if example i's loss depends on no
other example. Batch normalisation in training mode mixes the examples of a lot through the batch
statistics (and its running statistics are an unclipped, un-noised release), so it is rejected.
"""

from __future__ import annotations

from torch import nn

from dpcore.torch.errors import IncompatibleModelError

__all__ = ["check_independent_examples"]

_MIXING_LAYERS: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


def check_independent_examples(model: nn.Module) -> None:
    """Raise :class:`IncompatibleModelError` if any submodule mixes the examples of a lot.

    Args:
        model: the model to be trained with per-example clipping.

    Raises:
        IncompatibleModelError: naming the first offending module path, e.g. ``features.1``.
    """
    if not isinstance(model, nn.Module):
        raise IncompatibleModelError(f"Expected model to be a torch.nn.Module, got {model!r}.")
    for path, module in model.named_modules():
        if isinstance(module, _MIXING_LAYERS):
            where = path or "<root>"
            raise IncompatibleModelError(
                f"Module {where!r} is {type(module).__name__}, which mixes the examples of a lot "
                "(batch statistics), so per-example clipping would not bound one example's "
                "influence. Use nn.GroupNorm, nn.LayerNorm or nn.InstanceNorm without running "
                "statistics instead."
            )
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats:
            where = path or "<root>"
            raise IncompatibleModelError(
                f"Module {where!r} is {type(module).__name__} with track_running_stats=True: its "
                "running statistics are an unclipped, un-noised release of the data. Construct it "
                "with track_running_stats=False."
            )
