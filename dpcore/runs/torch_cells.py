"""torch measuring cells: a fixed random lot and one full optimizer step of a training method.

What torch timing and memory workers build, whatever study starts them (the training and memory
benchmarks, the Bu et al. 2021 memory tables): :func:`random_lot` makes a seeded lot of a
model's inputs, :func:`losses` its per-example and mean losses, and :func:`step_function` one
full optimizer step of a :class:`~dpcore.runs.cells.Cell`'s method with dpcore's engines
(``nonprivate``, ``dpsgd_exact``, ``dpsgd_vmap``, ``dpsgd_jl``), at the step settings below.
Studies measuring other libraries (Opacus) build those steps themselves.

Only the standard library is imported here; torch and :mod:`dpcore.torch` inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpcore.errors import InvalidParameterError
from dpcore.runs.cells import Cell

__all__ = [
    "DPCORE_METHODS",
    "LEARNING_RATE",
    "MAX_GRAD_NORM",
    "MODELS",
    "NOISE_MULTIPLIER",
    "losses",
    "random_lot",
    "step_function",
]

#: The noise multiplier, clipping norm and SGD learning rate of every step built here (timing
#: and memory do not depend on their values, but a result row records them).
NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
LEARNING_RATE = 0.05
#: The methods :func:`step_function` builds.
DPCORE_METHODS = ("nonprivate", "dpsgd_exact", "dpsgd_vmap", "dpsgd_jl")
#: The models :func:`random_lot` and :func:`losses` know: the TF Privacy MNIST CNN (any dense
#: width) and the IMDb LSTM of :mod:`dpcore.torch.models`.
MODELS = ("mnist_cnn", "imdb_lstm")


def _check_model(model: str) -> None:
    if model not in MODELS:
        raise InvalidParameterError("model", f"one of {MODELS}", model)


def random_lot(model: str, device: Any, batch_size: int) -> tuple[Any, Any]:
    """``(inputs, targets)``: a fixed random lot of ``batch_size`` for ``model``, on ``device``.

    ``mnist_cnn``: float32 ``(batch_size, 1, 28, 28)`` images uniform in [0, 1) and labels of
    10 classes; ``imdb_lstm``: ``(batch_size, 150)`` token ids below 8000 and float binary
    labels. Seeded: the same lot on every call (timing and memory do not depend on the values).

    Raises:
        InvalidParameterError: ``model`` is not one of :data:`MODELS`, or ``batch_size`` is not
            a positive int.

    Example:
        >>> inputs, targets = random_lot("mnist_cnn", "cpu", 3)
        >>> tuple(inputs.shape), tuple(targets.shape), bool(inputs.max() < 1)
        ((3, 1, 28, 28), (3,), True)
    """
    import torch

    from dpcore.torch.models import IMDB_SEQUENCE_LENGTH

    _check_model(model)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidParameterError("batch_size", "a positive int", batch_size)
    generator = torch.Generator().manual_seed(1)
    if model == "mnist_cnn":
        inputs = torch.rand(batch_size, 1, 28, 28, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
    else:
        inputs = torch.randint(0, 8000, (batch_size, IMDB_SEQUENCE_LENGTH), generator=generator)
        targets = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return inputs.to(device), targets.to(device)


def losses(model: str) -> tuple[Any, Any]:
    """``(per-example loss, mean loss)``: cross-entropy on MNIST, logistic on IMDb.

    Raises:
        InvalidParameterError: ``model`` is not one of :data:`MODELS`.
    """
    from torch import nn

    _check_model(model)
    if model == "mnist_cnn":
        return nn.CrossEntropyLoss(reduction="none"), nn.CrossEntropyLoss()
    return nn.BCEWithLogitsLoss(reduction="none"), nn.BCEWithLogitsLoss()


def step_function(
    cell: Cell,
    model: Any,
    inputs: Any,
    targets: Any,
    batch_size: int,
    *,
    vmap_directions: bool = True,
) -> Callable[[], None]:
    """A closure doing one full optimizer step of ``cell``'s method on the fixed lot.

    ``nonprivate``: forward, mean loss, backward, SGD step; ``dpsgd_exact`` / ``dpsgd_vmap`` /
    ``dpsgd_jl``: ``FastEngine`` / ``VmapEngine`` / ``JLEngine`` (r = ``cell.jl_dimension``;
    its r forward-mode projections in one vectorised pass, or one at a time with
    ``vmap_directions=False``) ``clipped_sum`` then ``DPOptimizer.step`` at
    :data:`NOISE_MULTIPLIER` and :data:`MAX_GRAD_NORM`. SGD at :data:`LEARNING_RATE`
    throughout. ``batch_size`` is the (expected) lot size the DP optimizer is told; it should
    match ``len(inputs)``.

    Args:
        cell: the method (one of :data:`DPCORE_METHODS`) and ``cell.model`` (its losses).
        model: the torch module to train, on the lot's device.
        inputs, targets: the lot (:func:`random_lot`).
        batch_size: the expected lot size.
        vmap_directions: JL only; False evaluates one direction at a time (less memory).

    Raises:
        InvalidParameterError: the method is not one of :data:`DPCORE_METHODS`, ``dpsgd_jl``
            has no ``jl_dimension``, or ``cell.model`` is not one of :data:`MODELS`.
    """
    import torch

    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.per_example.fast import FastEngine
    from dpcore.torch.per_example.jl import JLEngine
    from dpcore.torch.per_example.vmap import VmapEngine

    if cell.method not in DPCORE_METHODS:
        raise InvalidParameterError("cell.method", f"one of {DPCORE_METHODS}", cell.method)
    per_example, mean_loss = losses(cell.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    if cell.method == "nonprivate":

        def nonprivate() -> None:
            optimizer.zero_grad(set_to_none=True)
            mean_loss(model(inputs), targets).backward()
            optimizer.step()

        return nonprivate
    engine: Any
    if cell.method == "dpsgd_exact":
        engine = FastEngine(model, max_grad_norm=MAX_GRAD_NORM)
    elif cell.method == "dpsgd_vmap":
        engine = VmapEngine(model, max_grad_norm=MAX_GRAD_NORM)
    else:
        if cell.jl_dimension is None:
            raise InvalidParameterError("cell.jl_dimension", "an int for dpsgd_jl", None)
        engine = JLEngine(
            model,
            max_grad_norm=MAX_GRAD_NORM,
            jl_dimension=cell.jl_dimension,
            vmap_directions=vmap_directions,
        )
    private = DPOptimizer(
        optimizer,
        engine=engine,
        noise_multiplier=NOISE_MULTIPLIER,
        expected_batch_size=batch_size,
    )

    def dpsgd() -> None:
        private.step(engine.clipped_sum(inputs, targets, per_example))

    return dpsgd
