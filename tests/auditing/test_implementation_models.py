"""The declarative audit model: shapes, flattening, and numpy gradients equal to torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpcore.auditing.implementation import make_mlp_task, make_task
from dpcore.auditing.models import ModelSpec, clipped_sum, forward, per_example_gradients
from dpcore.auditing.torch_model import parameters_of, torch_loss, torch_model, torch_targets
from dpcore.errors import InvalidParameterError


def _tasks():  # type: ignore[no-untyped-def]
    common = dict(
        sampling_probability=0.2,
        noise_multiplier=1.0,
        max_grad_norm=2.0,
        learning_rate=0.05,
        steps=3,
        delta=1e-5,
        seed=3,
    )
    mlp = make_mlp_task(
        real_records=9, real_features=3, hidden=3, classes=3, canaries=[True, True], **common
    )
    linear = make_task(real_records=9, real_features=3, canaries=[True], **common)
    return [mlp, linear]


@pytest.mark.parametrize("index", [0, 1], ids=["mlp", "linear"])
def test_numpy_per_example_gradients_equal_torch(index: int) -> None:
    task = _tasks()[index]
    model, loss_fn = torch_model(task), torch_loss(task)
    x, y = torch.from_numpy(task.features), torch_targets(task)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return loss_fn(torch.func.functional_call(model, p, (xi[None],)), yi[None]).sum()

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    mine = per_example_gradients(task.spec, task.initial_parameters, task.features, task.targets)
    for theirs, ours in zip(grads.values(), mine, strict=True):
        assert np.allclose(theirs.double().numpy(), ours, rtol=1e-5, atol=1e-5)
    outputs = model(x).detach().double().numpy()
    assert np.allclose(
        forward(task.spec, task.initial_parameters, task.features), outputs, atol=1e-5
    )
    for built, given in zip(parameters_of(model), task.initial_parameters, strict=True):
        assert np.array_equal(built, given)


def test_clipping_is_over_all_tensors_together() -> None:
    task = _tasks()[0]
    summed = clipped_sum(
        task.spec, task.initial_parameters, task.features[:1], task.targets[:1], 1e-3
    )
    assert np.sqrt(sum(np.sum(s**2) for s in summed)) == pytest.approx(1e-3)
    empty = clipped_sum(task.spec, task.initial_parameters, task.features[:0], task.targets[:0], 1)
    assert all(np.all(s == 0) for s in empty)


def test_flatten_round_trips_and_checks_shapes() -> None:
    spec = ModelSpec((3, 2, 2), loss="cross_entropy")
    parameters = tuple(np.arange(np.prod(s), dtype=float).reshape(s) for s in spec.shapes)
    vector = spec.flatten(parameters)
    assert vector.size == spec.size == 3 * 2 + 2 + 2 * 2 + 2
    assert all(
        np.array_equal(a, b) for a, b in zip(spec.unflatten(vector), parameters, strict=True)
    )
    assert spec.groups == {"weights": (0, 2), "biases": (1, 3)}
    with pytest.raises(InvalidParameterError, match="b1"):
        spec.flatten([parameters[0], np.zeros(3), *parameters[2:]])
    with pytest.raises(InvalidParameterError, match="parameters"):
        spec.flatten(parameters[:2])


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"layers": (3,)}, "layers"),
        ({"layers": (3, 0)}, "layers"),
        ({"activation": "gelu"}, "activation"),
        ({"loss": "hinge"}, "loss"),
        ({"layers": (3, 2)}, "layers"),  # squared loss needs one output
    ],
)
def test_specs_are_validated(changes: dict[str, object], name: str) -> None:
    arguments: dict[str, object] = {"layers": (3, 1)}
    arguments.update(changes)
    with pytest.raises(InvalidParameterError, match=name):
        ModelSpec(**arguments)  # type: ignore[arg-type]
