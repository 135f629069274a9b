"""Worker side of :mod:`reproductions.bu2021_jl.memory`: the models and one training step.

Each probe of the memory search runs ``python -m reproductions.bu2021_jl.memory_worker
--worker ...`` (:func:`bench.cells.memory_worker`), which builds the model and the step here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch import nn

from bench import cells
from dpcore.runs.cells import Cell

MODULE = "reproductions.bu2021_jl.memory_worker"
#: Dense width of Table 4's "17M" model: the TF Privacy CNN with a 32,768-unit hidden layer has
#: exactly the paper's 17,146,938 parameters (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`).
WIDE_HIDDEN = 32_768
#: The tutorial's own dense width (Table 3's 26,010-parameter CNN).
SMALL_HIDDEN = 32


def _variant(hidden: int, per_direction: bool) -> str:
    return f"hidden={hidden}" + (",per_direction" if per_direction else "")


def build(cell: Cell, batch_size: int, device: str) -> tuple[Any, Callable[[], None]]:
    """``(model, step)`` of ``cell`` on a random lot (the worker's hook into the measurement)."""
    import torch

    from dpcore.torch.models import tf_privacy_mnist_cnn
    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.per_example.jl import JLEngine

    settings = dict(part.partition("=")[::2] for part in (cell.variant or "").split(","))
    torch.manual_seed(0)
    model = tf_privacy_mnist_cnn(int(settings.get("hidden") or SMALL_HIDDEN)).to(device)
    inputs, targets = cells.make_lot("mnist_cnn", device, batch_size)
    if "per_direction" not in settings:
        return model, cells.step_function(cell, model, inputs, targets, batch_size)
    assert cell.jl_dimension is not None
    engine = JLEngine(
        model,
        max_grad_norm=cells.MAX_GRAD_NORM,
        jl_dimension=cell.jl_dimension,
        vmap_directions=False,
    )
    private = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=cells.LEARNING_RATE),
        engine=engine,
        noise_multiplier=cells.NOISE_MULTIPLIER,
        expected_batch_size=batch_size,
    )
    loss_fn = nn.CrossEntropyLoss(reduction="none")

    def step() -> None:
        private.step(engine.clipped_sum(inputs, targets, loss_fn))

    return model, step


if __name__ == "__main__":
    sys.exit(cells.memory_worker(sys.argv[1:], build=build, module=MODULE))
