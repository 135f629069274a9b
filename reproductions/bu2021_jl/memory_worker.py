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
from bench.cells import Cell

MODULE = "reproductions.bu2021_jl.memory_worker"
#: Width multiplier of the wide CNN (about 17M parameters; see :func:`widened_mnist_cnn`).
WIDE_WIDTH = 26


def widened_mnist_cnn(width: int) -> nn.Sequential:
    """The TF Privacy MNIST CNN with 16w, 32w conv channels and a 32w hidden layer.

    ``width = 1`` is :func:`~dpcore.torch.models.tf_privacy_mnist_cnn` exactly; the parameter
    count is ``24,576 w^2 + 1,424 w + 10``.

    Example:
        >>> sum(p.numel() for p in widened_mnist_cnn(1).parameters())
        26010
        >>> sum(p.numel() for p in widened_mnist_cnn(WIDE_WIDTH).parameters())
        16650410
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        from dpcore.errors import InvalidParameterError

        raise InvalidParameterError("width", "an integer >= 1", width)
    c1, c2, hidden = 16 * width, 32 * width, 32 * width
    return nn.Sequential(
        nn.Conv2d(1, c1, 8, stride=2, padding=3),  # 28x28 -> 14x14
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 13x13
        nn.Conv2d(c1, c2, 4, stride=2),  # -> 5x5
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 4x4
        nn.Flatten(),
        nn.Linear(c2 * 4 * 4, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def _variant(width: int, per_direction: bool) -> str:
    return f"width={width}" + (",per_direction" if per_direction else "")


def build(cell: Cell, batch_size: int, device: str) -> tuple[Any, Callable[[], None]]:
    """``(model, step)`` of ``cell`` on a random lot (the worker's hook into the measurement)."""
    import torch

    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.per_example.jl import JLEngine

    settings = dict(part.partition("=")[::2] for part in (cell.variant or "").split(","))
    torch.manual_seed(0)
    model = widened_mnist_cnn(int(settings.get("width") or 1)).to(device)
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
