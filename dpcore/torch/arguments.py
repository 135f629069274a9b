"""Validation of the arguments of the torch entry points (``make_private``, ``DPTrainer``).

Each check returns the value or raises :class:`~dpcore.errors.InvalidParameterError` naming the
parameter, the constraint and the value, so that a bad argument is refused before anything is
built (an engine, trial lots, an optimizer) instead of failing later with a raw
``AttributeError``, ``TypeError`` or ``ValueError`` from inside torch.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import NoiseSource
from dpcore.validation import SEED_LIMIT, check_allocation, check_non_negative, check_seed

__all__ = [
    "check_betas",
    "check_callable",
    "check_entry_arguments",
    "check_jl_memory",
    "check_model",
    "check_momentum",
    "check_torch_optimizer",
    "derived_seed",
]


def check_model(value: object) -> nn.Module:
    """``model`` must be a ``torch.nn.Module``."""
    if not isinstance(value, nn.Module):
        raise InvalidParameterError("model", "to be a torch.nn.Module", value)
    return value


def check_callable(name: str, value: object) -> Callable[..., Any]:
    """A callable (``loss_fn``, ``split``)."""
    if not callable(value):
        raise InvalidParameterError(name, "to be callable", value)
    return value


def check_torch_optimizer(value: object) -> torch.optim.Optimizer:
    """``optimizer`` must be a ``torch.optim.Optimizer`` (the DP optimizer wraps it)."""
    if not isinstance(value, torch.optim.Optimizer):
        raise InvalidParameterError("optimizer", "to be a torch.optim.Optimizer", value)
    if getattr(value, "is_private", False) is True:
        raise InvalidParameterError(
            "optimizer",
            "a plain torch optimizer (this one is already private: make_private wraps an "
            "optimizer once; its wrapped optimizer is .optimizer)",
            type(value).__name__,
        )
    return value


def check_momentum(value: object) -> float:
    """SGD momentum: a real number >= 0, finite (torch refuses < 0; NaN reached the weights)."""
    return check_non_negative("momentum", value)


def check_betas(value: object) -> tuple[float, float]:
    """Adam's ``(beta1, beta2)``: two real numbers, each in [0, 1) (NaN refused)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise InvalidParameterError("betas", "to be a pair (beta1, beta2) in [0, 1)", value)
    result = []
    for index, beta in enumerate(value):
        name = f"betas[{index}]"
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
            raise InvalidParameterError(name, "to be a real number in [0, 1)", beta)
        if not 0.0 <= float(beta) < 1.0:  # False for NaN too
            raise InvalidParameterError(name, "in [0, 1)", beta)
        result.append(float(beta))
    return result[0], result[1]


def check_jl_memory(model: nn.Module, jl_dimension: object) -> None:
    """The JL engine's r directions per lot (r times the trainable parameters, drawn in
    float64) must fit :data:`~dpcore.validation.MEMORY_LIMIT_BYTES`; a non-integer r is left to
    the engine's own check.

    Raises:
        ResourceLimitError: naming ``jl_dimension``, before anything is allocated (r = 10^18
            failed at the first step with torch's raw "Storage size calculation overflowed").
    """
    if isinstance(jl_dimension, bool) or not isinstance(jl_dimension, numbers.Integral):
        return
    size = sum(p.numel() for p in model.parameters() if p.requires_grad)
    check_allocation("jl_dimension", jl_dimension, elements=float(jl_dimension) * size)


def derived_seed(seed: int) -> int:
    """The seed of the JL directions, ``seed + 1`` wrapped into [0, 2**63) like every seed."""
    return (seed + 1) % SEED_LIMIT


def _check_seed_or_none(value: object) -> None:
    if value is not None:
        check_seed("seed", value)


def _check_noise_source(value: object) -> None:
    if value is not None and not isinstance(value, NoiseSource):
        raise InvalidParameterError(
            "noise", "to be a dpcore.torch.noise.NoiseSource (or None)", value
        )


#: The checks :func:`check_entry_arguments` applies, by argument name.
_CHECKS: dict[str, Callable[[object], object]] = {
    "model": check_model,
    "optimizer": check_torch_optimizer,
    "loss_fn": lambda value: check_callable("loss_fn", value),
    "split": lambda value: check_callable("split", value),
    "seed": _check_seed_or_none,
    "noise": _check_noise_source,
}


def check_entry_arguments(**arguments: object) -> None:
    """Check each given argument that an entry point shares (others are left to their owner).

    ``model`` a Module, ``optimizer`` a torch optimizer, ``loss_fn`` and ``split`` callable,
    ``seed`` ``None`` or an integer in [0, 2**63), ``noise`` ``None`` or a
    :class:`NoiseSource`; with ``model``, ``engine="jl"`` and ``jl_dimension`` also
    :func:`check_jl_memory`.

    Raises:
        InvalidParameterError: naming the first bad argument.
    """
    for name, value in arguments.items():
        check = _CHECKS.get(name)
        if check is not None:
            check(value)
    model = arguments.get("model")
    if arguments.get("engine") == "jl" and isinstance(model, nn.Module):
        check_jl_memory(model, arguments.get("jl_dimension"))
