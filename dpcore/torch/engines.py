"""Choosing a per-example clipping engine by name; ``auto`` chooses on trial lots."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.errors import (
    EngineFallbackWarning,
    ExamplesInteractError,
    IncompatibleModelError,
    NoExactEngineError,
)
from dpcore.torch.noise import NoiseSource
from dpcore.torch.per_example.base import (
    ClippedBatch,
    LossFunction,
    NonFinitePolicy,
    PerExampleEngine,
)
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.per_example.vmap import VmapEngine

__all__ = ["ENGINE_NAMES", "AutoEngine", "make_engine"]

#: ``auto`` uses ``fast`` when the model passes the fast path's trial lots, else ``vmap``.
ENGINE_NAMES = ("auto", "fast", "vmap", "jl")


class AutoEngine(PerExampleEngine):
    """The fast engine where it is exact for the model, else the vmap engine.

    The choice is made once, by :meth:`prepare` (trial lots whose sizes differ from every
    dimension of the model, :mod:`dpcore.torch.per_example.trial`), so it does not depend on the
    lot size: a model accepted here trains at every lot size, empty lots included. When the
    fast path refuses the model, an :class:`~dpcore.torch.errors.EngineFallbackWarning` names the
    parameter that forced the vmap engine. A model whose examples interact raises
    :class:`~dpcore.torch.errors.ExamplesInteractError`; a model that both exact engines refuse
    (the fast path cannot attribute a parameter, and vmap cannot run the model, e.g. a Hugging
    Face text model whose attention-mask utilities branch on the data) raises one
    :class:`~dpcore.torch.errors.NoExactEngineError` listing each engine's reason.

    Not prepared explicitly, it prepares on its first non-empty lot (with that lot's examples).
    """

    def __init__(
        self, model: nn.Module, *, max_grad_norm: float, nonfinite: NonFinitePolicy = "raise"
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
        self.chosen: PerExampleEngine | None = None
        self.name = "auto"  # the chosen engine's name once chosen

    def prepare(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction) -> None:
        try:  # a handled layer's configuration (a sparse embedding) is refused at construction
            fast = FastEngine(
                self.model, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite
            )
            fast.prepare(inputs, targets, loss_fn)
            chosen: PerExampleEngine = fast
        except ExamplesInteractError:
            raise  # no engine can clip such a model
        except IncompatibleModelError as error:
            vmap = VmapEngine(
                self.model, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite
            )
            names = getattr(error, "parameters", None)
            try:
                vmap.prepare(inputs, targets, loss_fn)
            except ExamplesInteractError:
                raise
            except IncompatibleModelError as refused:
                reasons = {"fast": str(error), "vmap": str(refused)}
                raise NoExactEngineError(reasons, names) from refused
            culprit = f"parameter {names[0]!r}" if names else "this model"
            warnings.warn(
                f"engine='auto' trains this model with the vmap engine (exact, slower): the fast "
                f"path cannot attribute {culprit} to examples ({error})",
                EngineFallbackWarning,
                stacklevel=3,
            )
            chosen = vmap
        if not chosen.prepared:  # no finite example to try on yet
            return
        self.chosen = chosen
        self.name = chosen.name
        self.prepared = True

    def _clipped_sum(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction
    ) -> ClippedBatch:
        if self.chosen is None:
            raise IncompatibleModelError(
                "engine='auto' has not found an example with a finite loss to choose an engine "
                "on; the lot's losses are all NaN or infinite"
            )
        self.chosen.max_grad_norm = self.max_grad_norm
        return self.chosen.clipped_sum(inputs, targets, loss_fn)


def make_engine(
    model: nn.Module,
    *,
    engine: str = "auto",
    max_grad_norm: float,
    jl_dimension: int | None = None,
    directions: NoiseSource | None = None,
    nonfinite: NonFinitePolicy = "raise",
) -> PerExampleEngine:
    """Build the named engine for ``model``.

    Every engine checks the model on trial lots before its first lot
    (:meth:`~dpcore.torch.per_example.base.PerExampleEngine.prepare`; call it with a few
    training examples to have any refusal before training starts).

    Args:
        model: the model to train.
        engine: one of :data:`ENGINE_NAMES`.
        max_grad_norm: the clipping norm C > 0.
        jl_dimension: r >= 1, required for (and only for) ``engine="jl"``.
        directions: the JL engine's source of random directions.
        nonfinite: policy for NaN/inf per-example gradients.
    """
    if engine not in ENGINE_NAMES:
        raise InvalidParameterError("engine", f"in {ENGINE_NAMES}", engine)
    if (engine == "jl") != (jl_dimension is not None):
        raise InvalidParameterError(
            "jl_dimension", "to be given exactly when engine='jl'", jl_dimension
        )
    if engine == "jl" and jl_dimension is not None:
        return JLEngine(
            model,
            max_grad_norm=max_grad_norm,
            jl_dimension=jl_dimension,
            directions=directions,
            nonfinite=nonfinite,
        )
    if engine == "fast":
        return FastEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
    if engine == "vmap":
        return VmapEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
    return AutoEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
