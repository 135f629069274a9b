"""Choosing a per-example clipping engine by name."""

from __future__ import annotations

from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import NoiseSource
from dpcore.torch.per_example.base import NonFinitePolicy, PerExampleEngine
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.per_example.vmap import VmapEngine

__all__ = ["ENGINE_NAMES", "make_engine"]

#: ``auto`` picks ``fast`` when every trainable layer has a fast-path handler, else ``vmap``.
ENGINE_NAMES = ("auto", "fast", "vmap", "jl")


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

    Args:
        model: the model to train.
        engine: one of :data:`ENGINE_NAMES`.
        max_grad_norm: the clipping norm C > 0.
        jl_dimension: r >= 1, required for (and only for) ``engine="jl"``.
        directions: the JL engine's source of random directions.
        nonfinite: policy for NaN/inf per-example gradients.
    """
    from dpcore.torch.per_example.fast import FastEngine, fast_path_supports

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
    if engine == "fast" or (engine == "auto" and fast_path_supports(model)):
        return FastEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
    return VmapEngine(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
