"""Choosing a per-example clipping engine by name; ``auto`` chooses on trial lots."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.batches import Batch, take
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
from dpcore.torch.per_example.loop import LoopEngine
from dpcore.torch.per_example.vmap import VmapEngine

__all__ = ["ENGINE_NAMES", "AutoEngine", "make_engine"]

#: ``auto`` uses ``fast`` when the model passes the fast path's trial lots, else ``vmap``, else
#: ``loop``; ``jl`` estimates the norms (DP-SGD-JL).
ENGINE_NAMES = ("auto", "fast", "vmap", "loop", "jl")


class AutoEngine(PerExampleEngine):
    """The fast engine where it is exact for the model, else the vmap engine, else the loop.

    The choice is made once, by :meth:`prepare` (trial lots whose sizes differ from every
    dimension of the model, :mod:`dpcore.torch.per_example.trial`), so it does not depend on the
    lot size: a model accepted here trains at every lot size, empty lots included. When the
    fast path refuses the model, an :class:`~dpcore.torch.errors.EngineFallbackWarning` names the
    parameter that forced the vmap engine; when vmap cannot run it either (packed sequences, a
    model whose control flow branches on the data, routing that indexes the lot), the warning
    gives both reasons and the loop engine (:class:`~dpcore.torch.per_example.loop.LoopEngine`,
    one backward pass per example) trains it. A model whose examples interact raises
    :class:`~dpcore.torch.errors.ExamplesInteractError`; a model that all three exact engines
    refuse (an operation without a derivative) raises one
    :class:`~dpcore.torch.errors.NoExactEngineError` listing each engine's reason.

    Not prepared explicitly, it prepares on its first non-empty lot (with that lot's examples).
    """

    def __init__(
        self, model: nn.Module, *, max_grad_norm: float, nonfinite: NonFinitePolicy = "raise"
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
        self.chosen: PerExampleEngine | None = None
        self.name = "auto"  # the chosen engine's name once chosen
        self._lots = 0

    def _build(self, engine: type[PerExampleEngine]) -> PerExampleEngine:
        return engine(self.model, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)

    def prepare(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction) -> None:
        try:  # a handled layer's configuration (a sparse embedding) is refused at construction
            fast = self._build(FastEngine)
            fast.prepare(inputs, targets, loss_fn)
            chosen: PerExampleEngine = fast
        except ExamplesInteractError:
            raise  # no engine can clip such a model
        except IncompatibleModelError as error:
            chosen, _ = self._fallback(inputs, targets, loss_fn, error)
        if not chosen.prepared:  # no finite example to try on yet
            return
        self._choose(chosen)

    def _choose(self, chosen: PerExampleEngine) -> None:
        self.chosen = chosen
        self.name = chosen.name
        self.prepared = True
        self._lots = 0  # lots the chosen engine has clipped

    def _fallback(
        self,
        inputs: Batch,
        targets: Batch,
        loss_fn: LossFunction,
        error: IncompatibleModelError,
        lot: tuple[Batch, Batch] | None = None,
    ) -> tuple[PerExampleEngine, ClippedBatch | None]:
        """The vmap engine, else the loop engine, prepared on these examples, with an
        :class:`EngineFallbackWarning` giving the reasons; one :class:`NoExactEngineError` when
        neither takes the model. Given ``lot``, the engine also clips it (a path taken in
        training mode only must run there too), and that clipped lot is returned beside it."""
        names = getattr(error, "parameters", None)
        culprit = f"parameter {names[0]!r}" if names else "this model"
        batch = None
        try:
            vmap = self._build(VmapEngine)
            vmap.prepare(inputs, targets, loss_fn)
            if lot is not None:
                batch = vmap.clipped_sum(*lot, loss_fn)
            chosen = vmap
            message = (
                f"engine='auto' trains this model with the vmap engine (exact, slower): the "
                f"fast path cannot attribute {culprit} to examples ({error})"
            )
        except ExamplesInteractError:
            raise
        except IncompatibleModelError as refused:
            chosen = self._build(LoopEngine)
            try:
                chosen.prepare(inputs, targets, loss_fn)
                if lot is not None:
                    batch = chosen.clipped_sum(*lot, loss_fn)
            except ExamplesInteractError:
                raise
            except IncompatibleModelError as last:
                reasons = {"fast": str(error), "vmap": str(refused), "loop": str(last)}
                raise NoExactEngineError(reasons, names) from last
            message = (
                "engine='auto' trains this model with the loop engine (exact, one backward "
                f"pass per example): the fast path cannot attribute {culprit} to examples "
                f"({error}); and {refused}"
            )
        warnings.warn(message, EngineFallbackWarning, stacklevel=4)
        return chosen, batch

    def _clipped_sum(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction
    ) -> ClippedBatch:
        if self.chosen is None:
            raise IncompatibleModelError(
                "engine='auto' has not found an example with a finite loss to choose an engine "
                "on; the lot's losses are all NaN or infinite"
            )
        self.chosen.max_grad_norm = self.max_grad_norm
        try:
            batch = self.chosen.clipped_sum(inputs, targets, loss_fn)
        except ExamplesInteractError:
            raise
        except IncompatibleModelError as error:
            # The fast path's trials run in eval mode; a path the model takes in training mode
            # only (a parameter used under `if self.training`) shows on the first lot. Before
            # any lot has been clipped, the choice is made again on this lot (so the whole run
            # uses one engine, the one the ledger records); later, the typed error stands.
            if not isinstance(self.chosen, FastEngine) or self._lots:
                raise
            pool = slice(0, self.TRIAL_POOL)
            pool_inputs, pool_targets = take(inputs, pool), take(targets, pool)
            fallback, clipped = self._fallback(
                pool_inputs, pool_targets, loss_fn, error, lot=(inputs, targets)
            )
            self._choose(fallback)
            assert clipped is not None  # the lot was given
            batch = clipped
        self._lots += 1
        return batch


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
    if engine == "loop":
        return LoopEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
    return AutoEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
