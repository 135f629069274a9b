"""The audit task's model and loss built in torch, for adapters and hand-written loops.

:func:`torch_model` builds the task's :class:`~dpcore.auditing.models.ModelSpec` as an
``nn.Sequential`` of ``nn.Linear`` layers (and activations) at the task's initial parameters,
:func:`torch_loss` its per-example loss, :func:`torch_targets` the targets in the dtype that
loss takes, and :func:`parameters_of` reads a model's parameters back in the canonical order
(what :meth:`~dpcore.auditing.implementation.Observer.step` takes). Torch is imported here only,
so :mod:`dpcore.auditing` itself does not need it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dpcore.auditing.implementation import AuditTask


def torch_model(task: AuditTask) -> nn.Sequential:
    """The task's model (float32) at its initial parameters.

    Example:
        >>> from dpcore.auditing.implementation import make_mlp_task
        >>> task = make_mlp_task(real_records=4, real_features=2, hidden=2, classes=3,
        ...     canaries=[True], sampling_probability=0.5, noise_multiplier=1.0,
        ...     max_grad_norm=1.0, learning_rate=0.1, steps=1, delta=1e-5, seed=0)
        >>> torch_model(task)
        Sequential(
          (0): Linear(in_features=3, out_features=3, bias=True)
          (1): ReLU()
          (2): Linear(in_features=3, out_features=3, bias=True)
        )
    """
    spec = task.spec
    layers: list[nn.Module] = []
    pairs = list(zip(spec.layers[:-1], spec.layers[1:], strict=True))
    for index, (fan_in, fan_out) in enumerate(pairs):
        layers.append(nn.Linear(fan_in, fan_out, bias=spec.bias))
        if index < len(pairs) - 1:
            layers.append(
                {"relu": nn.ReLU, "tanh": nn.Tanh, "identity": nn.Identity}[spec.activation]()
            )
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for parameter, value in zip(model.parameters(), task.initial_parameters, strict=True):
            parameter.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))
    return model


def torch_loss(task: AuditTask) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-example loss ``loss(outputs, targets)`` of shape (batch,)."""
    if task.spec.loss == "squared":

        def squared(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return 0.5 * (outputs.reshape(-1) - targets.reshape(-1)) ** 2

        return squared

    def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets.reshape(-1).long(), reduction="none")

    return cross_entropy


def torch_targets(task: AuditTask) -> torch.Tensor:
    """The targets: float32 for the squared loss, int64 labels for cross-entropy."""
    if task.spec.loss == "squared":
        return torch.from_numpy(np.asarray(task.targets, dtype=np.float32))
    return torch.from_numpy(np.asarray(task.targets, dtype=np.int64))


def parameters_of(model: nn.Module) -> tuple[np.ndarray, ...]:
    """The model's parameters in the canonical order (float64 numpy copies)."""
    return tuple(p.detach().cpu().double().numpy().copy() for p in model.parameters())
