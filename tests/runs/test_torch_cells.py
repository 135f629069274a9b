"""dpcore.runs.torch_cells: the seeded random lots and the one-step closures of dpcore's methods
that the training benchmarks and the Bu et al. 2021 memory tables measure."""

from __future__ import annotations

import pytest
import torch

from dpcore.errors import InvalidParameterError
from dpcore.runs import torch_cells
from dpcore.runs.cells import Cell
from dpcore.torch.models import IMDB_SEQUENCE_LENGTH, tf_privacy_mnist_cnn


def test_random_lots_are_seeded_and_shaped_for_their_model() -> None:
    images, labels = torch_cells.random_lot("mnist_cnn", "cpu", 5)
    again, again_labels = torch_cells.random_lot("mnist_cnn", "cpu", 5)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    assert images.dtype == torch.float32 and tuple(images.shape) == (5, 1, 28, 28)
    assert float(images.min()) >= 0.0 and float(images.max()) < 1.0
    assert labels.dtype == torch.long and set(labels.tolist()) <= set(range(10))
    tokens, sentiment = torch_cells.random_lot("imdb_lstm", "cpu", 3)
    assert tuple(tokens.shape) == (3, IMDB_SEQUENCE_LENGTH) and int(tokens.max()) < 8000
    assert sentiment.dtype == torch.float32 and set(sentiment.tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize(
    ("model", "batch_size"), [("cifar_resnet", 4), ("mnist_cnn", 0), ("mnist_cnn", True)]
)
def test_bad_lots_are_refused(model: str, batch_size: int) -> None:
    with pytest.raises(InvalidParameterError):
        torch_cells.random_lot(model, "cpu", batch_size)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return tf_privacy_mnist_cnn(8)


def test_the_nonprivate_step_is_one_sgd_step_on_the_mean_loss() -> None:
    model = _model()
    inputs, targets = torch_cells.random_lot("mnist_cnn", "cpu", 4)
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    gradients = torch.autograd.grad(loss, list(model.parameters()))
    torch_cells.step_function(Cell("mnist_cnn", "nonprivate"), model, inputs, targets, 4)()
    for old, gradient, new in zip(before, gradients, model.parameters(), strict=True):
        expected = old - torch_cells.LEARNING_RATE * gradient
        assert torch.allclose(new.detach(), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("method", "r", "vmap_directions"),
    [
        ("dpsgd_exact", None, True),
        ("dpsgd_vmap", None, True),
        ("dpsgd_jl", 3, True),
        ("dpsgd_jl", 3, False),
    ],
)
def test_each_private_step_moves_every_parameter(
    method: str, r: int | None, vmap_directions: bool
) -> None:
    model = _model()
    inputs, targets = torch_cells.random_lot("mnist_cnn", "cpu", 4)
    before = [p.detach().clone() for p in model.parameters()]
    step = torch_cells.step_function(
        Cell("mnist_cnn", method, jl_dimension=r),
        model,
        inputs,
        targets,
        4,
        vmap_directions=vmap_directions,
    )
    step()
    # Gaussian noise of sigma * C / L on every coordinate: no parameter is left where it was
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    "cell",
    [
        Cell("mnist_cnn", "opacus_hooks"),
        Cell("mnist_cnn", "dpsgd_jl"),
        Cell("cifar_resnet", "nonprivate"),
    ],
)
def test_steps_it_does_not_build_are_refused(cell: Cell) -> None:
    model = _model()
    inputs, targets = torch_cells.random_lot("mnist_cnn", "cpu", 2)
    with pytest.raises(InvalidParameterError):
        torch_cells.step_function(cell, model, inputs, targets, 2)
