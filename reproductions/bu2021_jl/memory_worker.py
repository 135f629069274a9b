"""Worker side of :mod:`reproductions.bu2021_jl.memory`: the models and one training step.

Each probe of the memory search runs ``python -m reproductions.bu2021_jl.memory_worker
--worker ...`` (:func:`dpcore.runs.cells.memory_worker`), which builds the model here and the
lot and step with :mod:`dpcore.runs.torch_cells` (the steps the memory benchmark measures).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from dpcore.runs import cells, torch_cells
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
    """``(model, step)`` of ``cell`` on a random lot (the worker's hook into the measurement).

    ``cell.variant`` holds the dense width (``hidden=N``) and, for JL, ``per_direction`` (its
    projections one at a time: ``vmap_directions=False``).
    """
    import torch

    from dpcore.torch.models import tf_privacy_mnist_cnn

    settings = dict(part.partition("=")[::2] for part in (cell.variant or "").split(","))
    torch.manual_seed(0)
    model = tf_privacy_mnist_cnn(int(settings.get("hidden") or SMALL_HIDDEN)).to(device)
    inputs, targets = torch_cells.random_lot("mnist_cnn", device, batch_size)
    step = torch_cells.step_function(
        cell, model, inputs, targets, batch_size, vmap_directions="per_direction" not in settings
    )
    return model, step


if __name__ == "__main__":
    sys.exit(cells.memory_worker(sys.argv[1:], build=build, module=MODULE))
